"""The evaluation suites of the shapes world, item by item (pure: no files are written).

Each ``*_items(seed, index)`` function returns the manifest rows of one base scene (a
What'sUp pair gives four, a retrieval group five) as ``Item`` objects that carry the
row, the scenes to render and the claims behind the captions, so that tests can check
every caption against its scene. All evaluation scenes come from the ``holdout`` hash
buckets (5-9). Every item is built by proposing at random (from its own seeded
generator) and keeping the first proposal whose positives are true and negatives false
under ``captions.truth``; a proposal that is ambiguous is redrawn.

* shapes-whatsup (What'sUp Controlled): two objects of distinct shape and colour in four
  arrangements (object left of / right of / above / below the reference), both small; each
  arrangement places the pair anywhere in frame (:func:`_whatsup_midpoint`), so that no
  object's absolute position, and no fixed pixel, answers the relation by itself.
  Options: the true preposition first, then the others.
* shapes-aro: ``relation`` ([false, true], the arguments swapped, as VG-Relation),
  ``attribution`` ([false, true], colours swapped between the shapes, as
  VG-Attribution), ``order`` ([true, 4 ARO shuffles], as COCO/Flickr-Order).
* shapes-sugarcrepe: the seven SugarCrepe categories, [pos, neg]; ``length_matched``
  says whether pos and neg have equally many BPE tokens (by construction for about
  ``P_ADD_LENGTH_MATCHED`` of the add-* items, which are otherwise one or more tokens longer).
* shapes-retrieval: groups of five scenes with the same two shapes and two colours in
  other bindings and arrangements; each scene's caption is true of it and false of the
  other four. Groups use distinct (shape pair, colour pair) combinations (315 exist: 15
  shape pairs by 21 colour pairs), so every query has exactly one true image in the gallery;
  ``world.n_retrieval_groups`` above 315 is refused.
  (its builder is :mod:`pipeline.world.retrieval`; shapes-multi, galleries of near-duplicates
  of 3-5 objects, is :mod:`pipeline.world.multi`.)

Object columns (the contract of :mod:`pipeline.benchmarks.retrieval`, :func:`object_columns`):
``object_names`` / ``object_boxes`` list the row image's scene objects in scene order, each
named ``"<colour> <shape>"`` (unique in every scene; no caption needs the size to tell two
objects apart) with its exact ``Obj.box()``; ``phrases`` / ``relations`` are read from the
claim behind the query caption, not from its text: its asserted refs in the order the caption
names them, and ``[i, rel, j]`` for each relation it states (the world's relation names,
which are already the contract's words: left/right/above/below, front/behind).
``steer_pos`` / ``steer_neg`` / ``steer_neg_absent`` are the query's steering prompts, c+ and
the two contrasts' c- (:func:`steering_prompts`).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field, replace

import numpy as np

from pipeline.benchmarks.sugarcrepe import CATEGORIES as SUGARCREPE_METRIC_CATEGORIES
from pipeline.world.captions import (
    HAS_TEMPLATES,
    N_STYLES,
    RELATION_NAMES,
    And,
    Claim,
    Has,
    Ref,
    Rel,
    asserted,
    bpe_len,
    caption,
    clear_relations,
    equivalents,
    order_options,
    ref_of,
    truth,
)
from pipeline.world.sampling import (
    fill_scene,
    make_obj,
    place_pair,
    random_scene,
    sample_attributes,
    sample_background,
)
from pipeline.world.scenes import (
    AXIS,
    CLEAR,
    COLOURS,
    MARGIN,
    OPPOSITE,
    RELATIONS,
    SHAPES,
    SIZES,
    Obj,
    Scene,
    scene_id_in_split,
    scene_ok,
    scene_rng,
)

WHATSUP_ARRANGEMENTS = ("left", "right", "above", "below")
ARO_CATEGORIES = ("relation", "attribution", "order")
SUGARCREPE_CATEGORIES = SUGARCREPE_METRIC_CATEGORIES  # the benchmark's own list, one home
MAX_TRIES = 200  # proposals per item before giving up (never reached in practice)
# SugarCrepe's add-* negatives append a phrase: the negative is longer in 2,710 of its 2,754
# pairs and only 35 have equally many BPE tokens (benchmarks.md §2.6), so length alone is a
# cue. A share of ours are length-matched (ours, so that the length-matched slice of
# methods.md §1.7 exists): the positive says "a picture of ...", the negative "there is ..."
# (add-att, one added word) or nothing (add-obj, the added object named by its shape alone,
# "and a cross"). That trades the length cue for a template one: every length-matched
# positive, and no negative of those items, starts "a picture of".
P_ADD_LENGTH_MATCHED = 0.3
_HAS_STYLE = {plain: k for k, (plain, _) in enumerate(HAS_TEMPLATES)}  # template -> style


@dataclass
class Item:
    """One manifest row with what it is made of.

    Attributes:
        row: the manifest row (image paths relative to ``<out>/images``).
        images: ``(relative path, scene, mirrored)`` for every image file of the row.
        scene: the scene shown by ``row["image"]``.
        claims: the claim of each caption in ``row["captions"]`` (None where a caption
            is a word shuffle rather than a claim).
        extra: further scenes and claims (counterfactual, flipped) for the tests.
    """

    row: dict
    images: list[tuple[str, Scene, bool]]
    scene: Scene
    claims: list[Claim | None]
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------ shared helpers


def scene_json(scene: Scene) -> str:
    """The scene graph as compact JSON (objects with boxes), for the ``scene`` column."""
    return json.dumps(scene.to_dict(), separators=(",", ":"))


def object_name(o: Obj) -> str:
    """The phrase captions use for ``o``: ``"<colour> <shape>"``."""
    return f"{o.colour} {o.shape}"


def claim_phrases(claim: Claim) -> tuple[list[str], list[list]]:
    """``(phrases, relations)`` of a claim: its asserted refs' words in caption order and
    ``[i, rel, j]`` (phrase i stands in ``rel`` to phrase j) for each relation it states."""
    rs = asserted(claim)
    index = {r: k for k, r in enumerate(rs)}
    parts = claim.parts if isinstance(claim, And) else (claim,) if isinstance(claim, Rel) else ()
    return [" ".join(r.words()) for r in rs], [[index[p.a], p.rel, index[p.b]] for p in parts]


def steering_prompts(claim: Claim) -> tuple[list[str], list[str], list[str]]:
    """``(steer_pos, steer_neg, steer_neg_absent)`` of a claim, one contrast per asserted ref
    that has a colour and a ref of another colour to swap with: c+ the ref's own words ("red
    circle"); c- in ``steer_neg`` the same shape with the colour of the next ref (cyclically)
    whose colour differs ("blue circle"), the binding CLIP confuses, so the query's colours
    enter as c+ and c- alike; c- in ``steer_neg_absent`` the same shape with a colour that no
    asserted ref has ("white circle"), drawn per prompt by a generator seeded with the c+
    prompts' words (a pure function of the claim), so the directions share no concept."""
    rs = asserted(claim)
    pos, neg, absent = [], [], []
    used = {r.colour for r in rs if r.colour is not None}
    free = [c for c in COLOURS if c not in used]
    for k, r in enumerate(rs):
        others = [o for o in rs[k + 1 :] + rs[:k] if o.colour is not None and o.colour != r.colour]
        if r.colour is not None and others:
            pos.append(" ".join(r.words()))
            neg.append(" ".join(replace(r, colour=others[0].colour).words()))
            absent.append(r)
    if absent and not free:
        raise ValueError(f"the claim uses every colour ({sorted(used)}): no absent colour to steer away from")
    rng = np.random.default_rng(zlib.crc32("|".join(pos).encode()))
    return pos, neg, [" ".join(replace(r, colour=free[int(rng.integers(len(free)))]).words()) for r in absent]


def object_columns(scene: Scene, claim: Claim | None = None) -> dict:
    """``object_names`` and ``object_boxes`` (JSON, exact ``Obj.box()``) of ``scene``'s
    objects; with ``claim``, also the query caption's ``phrases`` and ``relations`` (JSON)
    and its steering prompts ``steer_pos`` / ``steer_neg``."""
    cols = {
        "object_names": [object_name(o) for o in scene.objects],
        "object_boxes": json.dumps([list(o.box()) for o in scene.objects]),
    }
    if claim is not None:
        phrases, relations = claim_phrases(claim)
        steer_pos, steer_neg, steer_neg_absent = steering_prompts(claim)
        cols.update(phrases=phrases, relations=json.dumps(relations), steer_pos=steer_pos, steer_neg=steer_neg,
                    steer_neg_absent=steer_neg_absent)
    return cols


def base_row(
    item_id: str, image: str, captions: list[str], correct: int, category: str, scene: Scene
) -> dict:
    return {
        "item_id": item_id,
        "image": image,
        "captions": captions,
        "correct": int(correct),
        "category": category,
        "scene_id": scene.scene_id,
        "scene": scene_json(scene),
    }


def holdout(seed: int, kind: str, index: int) -> tuple[str, np.random.Generator]:
    """The holdout scene id of ``(kind, index)`` and its generator."""
    sid, _ = scene_id_in_split(seed, kind, index, "holdout")
    return sid, scene_rng(seed, index, f"{kind}/{sid}")


def pair_scene(
    rng: np.random.Generator,
    sid: str,
    axis: str,
    n_total: int,
    distinct: bool = False,
    across_max: float | None = None,
) -> Scene | None:
    """A scene whose objects 0 and 1 stand in a clear relation along ``axis``.

    ``distinct``: the two differ in shape and in colour, and the colour-swapped pairs
    are absent from the scene (for attribute swaps).
    """
    (s1, c1, z1), (s2, c2, z2) = sample_attributes(rng, 2, distinct, distinct)
    pair = place_pair(rng, make_obj(rng, s1, c1, z1), make_obj(rng, s2, c2, z2), axis, across_max)
    if pair is None:
        return None
    avoid = ((c2, s1), (c1, s2)) if distinct else ()
    return fill_scene(rng, sid, list(pair), n_total, avoid=avoid)


def colour_ref(o: Obj, size: bool = False) -> Ref:
    return Ref(o.shape, o.colour, o.size if size else None)


def pair_relation(scene: Scene, axis: str, rng: np.random.Generator) -> str | None:
    """A clear relation of object 0 to object 1 along ``axis`` (random among those)."""
    rels = [r for i, r, j in clear_relations(scene) if (i, j) == (0, 1) and AXIS[r] == axis]
    return rels[int(rng.integers(len(rels)))] if rels else None


def check(claims: list[Claim], scene: Scene, correct: int | list[bool]) -> bool:
    """Whether claim k is true in ``scene`` exactly for the correct option(s)."""
    want = correct if isinstance(correct, list) else [k == correct for k in range(len(claims))]
    return all(truth(c, scene) is w for c, w in zip(claims, want, strict=True))


def give_up(kind: str, sid: str) -> RuntimeError:
    return RuntimeError(f"{kind}: no valid item for {sid} in {MAX_TRIES} proposals")


# ------------------------------------------------------------------------------ shapes-whatsup


def _whatsup_midpoint(rng: np.random.Generator, d: np.ndarray, dist: float, r: float) -> np.ndarray:
    """The midpoint of a What'sUp-style pair ``dist`` apart along unit axis ``d``: uniform over
    every position that keeps both shapes (circumradius up to ``r``) in frame, drawn afresh for
    each arrangement, so that where one object sits says as little as the geometry allows about
    the relation (the subject's offset from the centre predicts it only through ``dist`` against
    the span of midpoints)."""
    pad = r + MARGIN + 0.005
    half = np.abs(d) * dist / 2  # [2]
    return rng.uniform(pad + half, 1.0 - pad - half)  # [2]


def whatsup_items(seed: int, index: int, suite: str = "shapes-whatsup") -> list[Item]:
    """The four arrangements of object pair ``index`` (one row each)."""
    sid, rng = holdout(seed, "whatsup", index)
    for _ in range(MAX_TRIES):
        (s1, c1, _), (s2, c2, _) = sample_attributes(rng, 2, True, True)
        obj, ref = make_obj(rng, s1, c1, "small", z=1), make_obj(rng, s2, c2, "small", z=0)
        bg = sample_background(rng)
        dist = max(CLEAR + 0.02, obj.r + ref.r + rng.uniform(0.03, 0.09))
        claims = {a: Rel(colour_ref(obj), a, colour_ref(ref)) for a in WHATSUP_ARRANGEMENTS}
        items = []
        for arr in WHATSUP_ARRANGEMENTS:
            d = np.array({"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}[arr])
            m = _whatsup_midpoint(rng, d, dist, max(obj.r, ref.r))
            (ox, oy), (rx, ry) = m + d * dist / 2, m - d * dist / 2
            objs = (replace(obj, x=float(ox), y=float(oy)), replace(ref, x=float(rx), y=float(ry)))
            scene = Scene(sid, objs, bg)
            order = [arr] + [a for a in WHATSUP_ARRANGEMENTS if a != arr]
            opts = [claims[a] for a in order]
            if not (scene_ok(scene) and check(opts, scene, 0)):
                break
            name = f"{c1}-{s1}_{arr}{'_of' if arr in ('left', 'right') else ''}_{c2}-{s2}.png"
            image = f"{suite}/{sid}/{name}"
            row = base_row(f"{sid}/{arr}", image, [caption(c) for c in opts], 0, arr, scene)
            row.update(pair_key=sid, arrangement=arr)
            items.append(Item(row, [(image, scene, False)], scene, opts))
        if len(items) == 4:
            return items
    raise give_up("whatsup", sid)


# ------------------------------------------------------------------------------ shapes-aro


def aro_item(seed: int, category: str, index: int, suite: str = "shapes-aro") -> Item:
    """One ARO-style item of ``category`` (relation, attribution or order)."""
    sid, rng = holdout(seed, f"aro-{category}", index)
    image = f"{suite}/{category}/{sid}.png"
    for _ in range(MAX_TRIES):
        n = int(rng.integers(2, 5))
        extra = {"relation_name": "", "attr_pair": ""}
        if category == "relation":
            rel = RELATIONS[index % len(RELATIONS)]
            scene = pair_scene(rng, sid, AXIS[rel], n)
            if scene is None:
                continue
            a, b = scene.objects[0], scene.objects[1]
            if truth(Rel(colour_ref(a), rel, colour_ref(b)), scene) is not True:
                a, b = b, a
            true, false = (
                Rel(colour_ref(a), rel, colour_ref(b)),
                Rel(colour_ref(b), rel, colour_ref(a)),
            )
            claims: list[Claim | None] = [false, true]
            texts, correct = [caption(false, 2), caption(true, 2)], 1
            extra["relation_name"] = RELATION_NAMES[rel]
            ok = check([false, true], scene, 1)
        elif category == "attribution":
            scene = pair_scene(rng, sid, ("horizontal", "vertical")[int(rng.integers(2))], n, True)
            if scene is None:
                continue
            a, b = scene.objects[0], scene.objects[1]
            true = Has((Ref(a.shape, a.colour), Ref(b.shape, b.colour)))
            false = Has((Ref(a.shape, b.colour), Ref(b.shape, a.colour)))
            claims, texts, correct = [false, true], [caption(false, 4), caption(true, 4)], 1
            extra["attr_pair"] = f"{a.colour}_{b.colour}"
            ok = check([false, true], scene, 1)
        else:
            axis = ("horizontal", "vertical", "depth")[int(rng.integers(3))]
            scene = pair_scene(rng, sid, axis, n)
            if scene is None:
                continue
            a, b = scene.objects[0], scene.objects[1]
            rel = pair_relation(scene, axis, rng)
            if rng.random() < 0.6 and rel is not None:
                claim: Claim = Rel(colour_ref(a, True), rel, colour_ref(b, True))
            else:
                claim = Has((colour_ref(a, True), colour_ref(b, True)))
            text = caption(claim, int(rng.integers(N_STYLES)))
            texts, correct = order_options(text, rng), 0
            claims = [claim, None, None, None, None]
            # a shuffle that moves whole noun phrases ("the small yellow square and the large
            # purple triangle") says what the caption says: no such option is a negative
            same = {caption(c, s) for c in equivalents(claim) for s in range(N_STYLES)}
            ok = truth(claim, scene) is True and not same & set(texts[1:])
        if ok:
            row = base_row(sid, image, texts, correct, category, scene)
            row.update(extra)
            return Item(row, [(image, scene, False)], scene, claims)
    raise give_up(f"aro-{category}", sid)


# ------------------------------------------------------------------------------ shapes-sugarcrepe


def _swap_ref(claim: Claim, k: int, new: Ref) -> Claim:
    """``claim`` with its k-th asserted ref replaced by ``new``."""
    if isinstance(claim, Has):
        present = list(claim.present)
        present[k] = new
        return Has(tuple(present), claim.absent)
    assert isinstance(claim, Rel)
    return Rel(new, claim.rel, claim.b) if k == 0 else Rel(claim.a, claim.rel, new)


def _has_or_rel(
    rng: np.random.Generator, sid: str, p_rel: float, distinct: bool = False, size: bool = False
) -> tuple[Scene, Claim, list[Obj]] | None:
    """A scene and a true claim about its objects 0 and 1 (an object list or a relation)."""
    axis = ("horizontal", "vertical", "depth")[int(rng.integers(3))]
    scene = pair_scene(rng, sid, axis, int(rng.integers(2, 5)), distinct)
    if scene is None:
        return None
    a, b = scene.objects[0], scene.objects[1]
    rel = pair_relation(scene, axis, rng)
    if rel is not None and rng.random() < p_rel:
        return scene, Rel(ref_of(a, scene, rng), rel, ref_of(b, scene, rng)), [a, b]
    mention = [a, b] if rng.random() < 0.7 else [a]
    return (
        scene,
        Has(tuple(ref_of(o, scene, rng, p_size=0.35 if size else 0.0) for o in mention)),
        mention,
    )


def sugarcrepe_item(seed: int, category: str, index: int, suite: str = "shapes-sugarcrepe") -> Item:
    """One SugarCrepe-style [pos, neg] item of ``category``."""
    sid, rng = holdout(seed, f"sugarcrepe-{category}", index)
    image = f"{suite}/{category}/{sid}.png"
    for _ in range(MAX_TRIES):
        style = int(rng.integers(N_STYLES))
        styles = (style, style)  # of pos and neg
        if category in ("replace-obj", "replace-att"):
            made = _has_or_rel(rng, sid, p_rel=0.4, size=True)
            if made is None:
                continue
            scene, pos, mention = made
            k = int(rng.integers(len(mention)))
            r = pos.present[k] if isinstance(pos, Has) else (pos.a, pos.b)[k]
            o = mention[k]
            if r.colour is None:  # name the colour, so that there is one to replace
                r = Ref(r.shape, o.colour, r.size)
                pos = _swap_ref(pos, k, r)
            if category == "replace-obj":
                free = [s for s in SHAPES if all(x.shape != s for x in scene.objects)]
                new = Ref(free[int(rng.integers(len(free)))], r.colour, r.size)
            else:
                free = [
                    c
                    for c in COLOURS
                    if all((x.colour, x.shape) != (c, o.shape) for x in scene.objects)
                ]
                new = Ref(r.shape, free[int(rng.integers(len(free)))], r.size)
            neg = _swap_ref(pos, k, new)
        elif category in ("replace-rel", "swap-obj"):
            made = _has_or_rel(rng, sid, p_rel=1.0)
            if made is None or not isinstance(made[1], Rel):
                continue
            scene, pos, _ = made
            if category == "swap-obj":
                neg = Rel(pos.b, pos.rel, pos.a)
            else:
                depth = AXIS[pos.rel] == "depth"  # a depth phrase in one option only would decide
                wrong = [
                    r
                    for r in RELATIONS
                    if r != pos.rel
                    and (AXIS[r] == "depth") == depth
                    and truth(Rel(pos.a, r, pos.b), scene) is False
                ]
                if not wrong:
                    continue
                opposite = OPPOSITE[pos.rel]
                r = (
                    opposite
                    if opposite in wrong and rng.random() < 0.6
                    else wrong[int(rng.integers(len(wrong)))]
                )
                neg = Rel(pos.a, r, pos.b)
        elif category == "swap-att":
            made = _has_or_rel(rng, sid, p_rel=0.3, distinct=True)
            if made is None or len(made[2]) < 2:
                continue
            scene, pos, (a, b) = made
            ra, rb = Ref(a.shape, a.colour), Ref(b.shape, b.colour)
            sa, sb = Ref(a.shape, b.colour), Ref(b.shape, a.colour)
            if isinstance(pos, Rel):
                pos, neg = Rel(ra, pos.rel, rb), Rel(sa, pos.rel, sb)
            else:
                pos, neg = Has((ra, rb)), Has((sa, sb))
        elif category == "add-obj":
            scene = random_scene(rng, sid)
            mention = list(rng.permutation(len(scene.objects))[: int(rng.integers(1, 3))])
            pos = Has(tuple(ref_of(scene.objects[i], scene, rng) for i in sorted(mention)))
            free = [s for s in SHAPES if all(x.shape != s for x in scene.objects)]
            new = Ref(
                free[int(rng.integers(len(free)))], list(COLOURS)[int(rng.integers(len(COLOURS)))]
            )
            if rng.random() < P_ADD_LENGTH_MATCHED:  # "a picture of X" vs "X and a cross"
                new, styles = Ref(new.shape), (_HAS_STYLE["a picture of {P}"], _HAS_STYLE["{P}"])
            at = int(rng.integers(len(pos.present) + 1))
            neg = Has(pos.present[:at] + (new,) + pos.present[at:])
        elif category == "add-att":
            scene = random_scene(rng, sid)
            objs = scene.objects
            t = int(rng.integers(len(objs)))
            o = objs[t]
            unique_shape = sum(x.shape == o.shape for x in objs) == 1
            if unique_shape and rng.random() < 0.5:  # "a circle" -> "a green circle"
                target = Ref(o.shape)
                wrong = [
                    c for c in COLOURS if all((x.colour, x.shape) != (c, o.shape) for x in objs)
                ]
                added = Ref(o.shape, wrong[int(rng.integers(len(wrong)))])
            else:  # "a red circle" -> "a large red circle"
                target = Ref(o.shape, o.colour)
                added = Ref(o.shape, o.colour, next(s for s in SIZES if s != o.size))
            others = [ref_of(x, scene, rng, p_size=0.0) for i, x in enumerate(objs) if i != t]
            pre = others[: int(rng.integers(0, min(1, len(others)) + 1))]
            pos, neg = Has((target, *pre)), Has((added, *pre))
            if rng.random() < P_ADD_LENGTH_MATCHED:  # "a picture of a red X" vs "there is a large red X"
                styles = (_HAS_STYLE["a picture of {P}"], _HAS_STYLE["there is {P}"])
        else:
            raise ValueError(
                f"unknown sugarcrepe category {category!r}; valid: {', '.join(SUGARCREPE_CATEGORIES)}"
            )
        if not check([pos, neg], scene, 0):
            continue
        texts = [caption(pos, styles[0]), caption(neg, styles[1])]
        row = base_row(sid, image, texts, 0, category, scene)
        row["length_matched"] = bpe_len(texts[0]) == bpe_len(texts[1])
        return Item(row, [(image, scene, False)], scene, [pos, neg])
    raise give_up(f"sugarcrepe-{category}", sid)
