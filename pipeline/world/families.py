"""shapes-train / shapes-dev: [pos, neg] caption pairs from the eight BindCLIP families.

Every pair comes with its *counterfactual* image: the same scene (same background, same
other objects) edited minimally so that the negative caption becomes true and the
positive false. Only a procedural world can render it.

=====================  ==========================================  ========================
family                 pos -> neg                                  counterfactual edit
=====================  ==========================================  ========================
entity                 a shape noun -> a shape absent from scene   that object's shape
attribute              a colour (or size) word -> another (half    recolour (resize)
                       the colour edits: another object's colour)
role-swap              ``A rel B`` -> ``B rel A``                  swap A and B (or depth)
negation               ``A and no B`` <-> ``A and B``              an object becomes B, or
                                                                   B another object
relative-geometry      ``A left of B`` -> ``A right of B``         swap the x of A and B
absolute-position      ``A on the left side`` -> ``right side``    mirror A's x
depth                  ``A in front of B`` -> ``A behind B``       swap the drawing order
vertical               ``A above B`` -> ``A below B``              swap the y of A and B
=====================  ==========================================  ========================

Each row also has ``flip_image`` (the horizontal mirror), ``flip_captions`` ([pos, neg]
with left/right exchanged: still true / false of the mirror), a ``paraphrase`` of pos
(another template or the converse relation) and ``ground_words``/``ground_boxes``
(``ground_positions``: word indices in pos) for the words of pos that name exactly one
object; ``neg_ground_boxes``/``neg_ground_positions`` the same for the words of neg that by
themselves name exactly one object of the (true) scene (:func:`pipeline.world.grounding.grounding` with ``by_word``: in a false
caption, where each word's referent is); ``cf_scene`` is the counterfactual's scene graph
(JSON, like ``scene``); ``object_names`` / ``object_boxes`` list the objects of ``image``'s
scene (:func:`pipeline.world.suites.object_columns`), for fitting phrase -> object maps on
the training split. Item ``k`` belongs to family ``FAMILIES[k % 8]`` (balanced);
shapes-train draws from the ``train`` hash buckets, shapes-dev from ``validation``. Every
item is checked with ``captions.truth`` on the scene, the counterfactual and the mirror.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd

from pipeline.benchmarks.coco_families import FAMILIES  # one list for real and shapes data
from pipeline.world.captions import (
    N_STYLES,
    Claim,
    Has,
    Ref,
    Rel,
    Side,
    caption,
    clear_sides,
    flip_claim,
    flip_text,
    paraphrase,
    ref_of,
    relation_of,
    say,
    truth,
)
from pipeline.world.grounding import grounding
from pipeline.world.sampling import make_obj, place_free, random_scene, sample_attributes
from pipeline.world.scenes import (
    AXIS,
    COLOURS,
    OPPOSITE,
    SHAPES,
    SIZES,
    Scene,
    scene_id_in_split,
    scene_ok,
    scene_rng,
)
from pipeline.world.suites import (
    MAX_TRIES,
    Item,
    base_row,
    object_columns,
    pair_relation,
    pair_scene,
    scene_json,
)

SUITE_SPLITS = {"shapes-train": "train", "shapes-dev": "validation"}

Proposal = tuple[Scene, Claim, Claim, Scene]  # scene, pos, neg, counterfactual scene

# attribute family: share of colour edits that take the colour of another object in the scene
# (when one can): "a red circle" -> "a blue circle" beside a blue square, a binding negative
# whose words are all in the picture (ours; otherwise the new colour is any free colour)
P_BOUND_COLOUR = 0.5


# ------------------------------------------------------------------------------ edits


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def _mentions(rng: np.random.Generator, scene: Scene) -> tuple[list[int], list[Ref]]:
    """1-2 object indices and refs naming them."""
    k = int(rng.integers(1, min(2, len(scene.objects)) + 1))
    idx = sorted(int(i) for i in rng.permutation(len(scene.objects))[:k])
    return idx, [ref_of(scene.objects[i], scene, rng) for i in idx]


def _swap(scene: Scene, i: int, j: int, *fields: str) -> Scene:
    a, b = scene.objects[i], scene.objects[j]
    out = scene.with_object(i, **{f: getattr(b, f) for f in fields})
    return out.with_object(j, **{f: getattr(a, f) for f in fields})


def _entity(rng: np.random.Generator, sid: str) -> Proposal | None:
    scene = random_scene(rng, sid, overlap_pair=rng.random() < 0.25)
    idx, rs = _mentions(rng, scene)
    k = int(rng.integers(len(idx)))
    new_shape = _pick(rng, [s for s in SHAPES if all(o.shape != s for o in scene.objects)])
    new = list(rs)
    new[k] = Ref(new_shape, rs[k].colour, rs[k].size)
    return scene, Has(tuple(rs)), Has(tuple(new)), scene.with_object(idx[k], shape=new_shape)


def _attribute(rng: np.random.Generator, sid: str) -> Proposal | None:
    scene = random_scene(rng, sid, overlap_pair=rng.random() < 0.25)
    idx, rs = _mentions(rng, scene)
    k = int(rng.integers(len(idx)))
    o = scene.objects[idx[k]]
    rs, new = list(rs), list(rs)
    if rng.random() < 0.65:  # colour
        free = [c for c in COLOURS if all((x.colour, x.shape) != (c, o.shape) for x in scene.objects)]
        taken = [c for c in free if any(x.colour == c for x in scene.objects)]  # on another object
        colour = _pick(rng, taken if taken and rng.random() < P_BOUND_COLOUR else free)
        rs[k] = Ref(o.shape, o.colour, rs[k].size)
        new[k] = Ref(o.shape, colour, rs[k].size)
        cf = scene.with_object(idx[k], colour=colour)
    else:  # size
        size = next(s for s in SIZES if s != o.size)
        rs[k] = Ref(o.shape, o.colour, o.size)
        new[k] = Ref(o.shape, o.colour, size)
        cf = scene.with_object(idx[k], size=size, r=float(rng.uniform(*SIZES[size])))
    return scene, Has(tuple(rs)), Has(tuple(new)), cf


def _relational(rng: np.random.Generator, sid: str, axis: str) -> tuple[Scene, str] | None:
    scene = pair_scene(rng, sid, axis, int(rng.integers(2, 5)))
    if scene is None:
        return None
    rel = pair_relation(scene, axis, rng)
    return None if rel is None else (scene, rel)


def _role_swap(rng: np.random.Generator, sid: str) -> Proposal | None:
    axis = _pick(rng, ["horizontal", "vertical", "depth"])
    made = _relational(rng, sid, axis)
    if made is None:
        return None
    scene, rel = made
    a, b = (ref_of(scene.objects[i], scene, rng) for i in (0, 1))
    cf = _swap(scene, 0, 1, "z") if axis == "depth" else _swap(scene, 0, 1, "x", "y")
    return scene, Rel(a, rel, b), Rel(b, rel, a), cf


def _geometry(rng: np.random.Generator, sid: str, axis: str) -> Proposal | None:
    made = _relational(rng, sid, axis)
    if made is None:
        return None
    scene, rel = made
    a, b = (ref_of(scene.objects[i], scene, rng) for i in (0, 1))
    field = {"horizontal": ("x",), "vertical": ("y",), "depth": ("z",)}[axis]
    return scene, Rel(a, rel, b), Rel(a, OPPOSITE[rel], b), _swap(scene, 0, 1, *field)


def _absolute(rng: np.random.Generator, sid: str) -> Proposal | None:
    scene = random_scene(rng, sid, overlap_pair=rng.random() < 0.25)
    sides = clear_sides(scene)
    if not sides:
        return None
    i, side = _pick(rng, sides)
    a = ref_of(scene.objects[i], scene, rng)
    other = OPPOSITE[side]
    return scene, Side(a, side), Side(a, other), scene.with_object(i, x=1.0 - scene.objects[i].x)


def _negation(rng: np.random.Generator, sid: str) -> Proposal | None:
    """"A and no B" against "A and B" on a scene of 2-4 objects either way; the counterfactual
    replaces one object (another object by B, or B by another), so that the number of objects
    in the image says nothing about which caption is true."""
    scene = random_scene(rng, sid)
    i, j = (int(v) for v in rng.permutation(len(scene.objects))[:2])
    a = ref_of(scene.objects[i], scene, rng)
    if rng.random() < 0.5:  # pos "A and no B", neg "A and B": object j becomes B
        shape = _pick(rng, list(SHAPES))
        colour = _pick(
            rng,
            [c for c in COLOURS if all((o.colour, o.shape) != (c, shape) for o in scene.objects)],
        )
        b = Ref(shape, colour)
        if rng.random() < 0.3 and all(o.shape != shape for o in scene.objects):
            b = Ref(shape)  # "no star" at all
        pos, neg, made = Has((a,), (b,)), Has((a, b)), (shape, colour)
    else:  # pos "A and B", neg "A and no B": B (object j) becomes another object
        o = scene.objects[j]
        b = Ref(o.shape, o.colour)
        taken = tuple((x.colour, x.shape) for x in scene.objects)
        (shape, colour, _), = sample_attributes(rng, 1, taken=taken)
        pos, neg, made = Has((a, b)), Has((a,), (b,)), (shape, colour)
    rest = scene.without(j)
    new = place_free(rng, make_obj(rng, *made, _pick(rng, list(SIZES))), list(rest.objects))
    if new is None:
        return None
    cf = replace(rest, objects=rest.objects + (replace(new, z=max(x.z for x in rest.objects) + 1),))
    return scene, pos, neg, cf


PROPOSERS = {
    "entity": _entity,
    "attribute": _attribute,
    "role-swap": _role_swap,
    "negation": _negation,
    "relative-geometry": lambda rng, sid: _geometry(rng, sid, "horizontal"),
    "absolute-position": _absolute,
    "depth": lambda rng, sid: _geometry(rng, sid, "depth"),
    "vertical": lambda rng, sid: _geometry(rng, sid, "vertical"),
}


# ------------------------------------------------------------------------------ items


def valid(scene: Scene, pos: Claim, neg: Claim, cf: Scene) -> bool:
    """pos true / neg false in the scene, the reverse in the counterfactual, and the
    left/right-exchanged claims true / false in the mirror."""
    flipped = scene.flipped()
    return (
        scene_ok(cf)
        and truth(pos, scene) is True
        and truth(neg, scene) is False
        and truth(pos, cf) is False
        and truth(neg, cf) is True
        and truth(flip_claim(pos), flipped) is True
        and truth(flip_claim(neg), flipped) is False
    )


def pair_item(seed: int, suite: str, index: int) -> Item:
    """Item ``index`` of shapes-train or shapes-dev (family ``FAMILIES[index % 8]``)."""
    if suite not in SUITE_SPLITS:
        raise ValueError(f"unknown pair suite {suite!r}; valid: {', '.join(SUITE_SPLITS)}")
    family = FAMILIES[index % len(FAMILIES)]
    sid, _ = scene_id_in_split(seed, f"pairs-{family}", index // len(FAMILIES), SUITE_SPLITS[suite])
    rng = scene_rng(seed, index // len(FAMILIES), f"pairs-{family}/{sid}")
    for _ in range(MAX_TRIES):
        made = PROPOSERS[family](rng, sid)
        if made is None or not valid(*made):
            continue
        scene, pos, neg, cf = made
        style = int(rng.integers(N_STYLES))
        cap = say(pos, style)
        texts = [cap.text, caption(neg, style)]
        flips = [flip_text(t) for t in texts]
        if flips != [caption(flip_claim(pos), style), caption(flip_claim(neg), style)]:
            continue  # never expected: flipping words must equal flipping the claim
        words, boxes, positions = grounding(pos, cap, scene)
        _, neg_boxes, neg_positions = grounding(neg, say(neg, style), scene, by_word=True)
        stem = f"{suite}/{family}/{sid}"
        image, cf_image, flip_image = f"{stem}.png", f"{stem}_cf.png", f"{stem}_flip.png"
        row = base_row(sid, image, texts, 0, family, scene)
        row["cf_scene"] = scene_json(cf)
        row.update(
            family=family,
            cf_image=cf_image,
            flip_image=flip_image,
            flip_captions=flips,
            paraphrase=paraphrase(pos, texts[0], rng),
            ground_words=words,
            ground_boxes=boxes,
            ground_positions=positions,
            neg_ground_boxes=neg_boxes,
            neg_ground_positions=neg_positions,
            **object_columns(scene),  # the image's objects (not the cf's or the mirror's)
        )
        images = [(image, scene, False), (cf_image, cf, False), (flip_image, scene, True)]
        extra = {"cf_scene": cf, "flip_scene": scene.flipped(), "pos": pos, "neg": neg}
        return Item(row, images, scene, [pos, neg], extra)
    raise RuntimeError(f"{family}: no valid pair for {sid} in {MAX_TRIES} proposals")


# ------------------------------------------------------------------------------ edit kinds

# What each family's edit asks of a scorer, finer than the family (for analyses such as the
# lesion): an argument swap is about the axis of its relation; an attribute edit is a size
# (a spread in the image), a colour another object of the scene has (binding), or a colour
# new to the scene; a negation's true caption is the one with 'no' or the one without.


def edit_kind(family: str, pos: str, scene: str, cf_scene: str) -> str:
    """``family`` or ``"family: kind"`` for one shapes-train / shapes-dev row: its true
    caption ``pos`` and the JSON ``scene`` / ``cf_scene`` columns."""
    if family == "role-swap":
        rel = relation_of(pos)
        if rel is None:
            raise ValueError(f"role-swap caption {pos!r} states no relation")
        return f"role-swap: {AXIS[rel]}"
    if family == "attribute":
        before, after = (json.loads(x)["objects"] for x in (scene, cf_scene))
        changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
        if len(changed) != 1:
            raise ValueError(f"attribute edit changes {len(changed)} objects, expected 1")
        a, b = changed[0]
        if a["size"] != b["size"]:
            return "attribute: size"
        others = {o["colour"] for o in before if o is not a}
        return "attribute: colour of another object" if b["colour"] in others else "attribute: new colour"
    if family == "negation":
        return "negation: 'no X' true" if " no " in f" {pos} " else "negation: 'no X' false"
    return family


def edit_kind_order(kind: str) -> tuple[int, str]:
    """Sort key of edit kinds: by family (``FAMILIES`` order), then by name."""
    return FAMILIES.index(kind.split(":")[0]), kind


def edit_kinds(manifest: pd.DataFrame) -> np.ndarray:
    """[n] :func:`edit_kind` of every row of a shapes-train / shapes-dev manifest."""
    missing = sorted({"family", "captions", "correct", "scene", "cf_scene"} - set(manifest.columns))
    if missing:
        raise ValueError(f"edit kinds need the shapes pair columns; the manifest lacks {missing}")
    columns = ("family", "captions", "correct", "scene", "cf_scene")
    return np.array(
        [edit_kind(f, c[int(k)], s, cf) for f, c, k, s, cf in zip(*(manifest[x] for x in columns), strict=True)],
        dtype=object,
    )
