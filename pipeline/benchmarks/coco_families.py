"""COCO hard-negative families (BindCLIP's training/development pairs), generated from the
COCO captions and instance annotations.

Files under ``root`` (COCO 2017 layout; configurable in ``CocoFamiliesConfig``):
``annotations/captions_train2017.json`` and ``annotations/instances_train2017.json``
(from cocodataset.org, "2017 Train/Val annotations"). The manifest ``image`` is
``train2017/<file_name>``, relative to the COCO root. No image is opened.

Each item is ``captions = [positive, negative]`` with ``correct = 0`` and a ``family``:

* ``entity``: a COCO caption that names a category present in the image; the
  negative names an absent category of the same supercategory instead;
* ``attribute``: a caption with a colour word; the negative has another colour;
* ``role-swap``: a caption naming two present categories joined by an asymmetric relation
  word (``on``, ``riding``, ``holding`` ...; none of ``and``/``with``/``next to`` between
  them); the negative swaps the two names, each place keeping its number ("two dogs chasing
  a cat" -> "two cats chasing a dog"), so that grammar gives no cue;
* ``negation``: "a photo of a A and no Bs" vs "a photo of a B and no As" (A the largest
  present category, B absent from the image);
* ``relative-geometry``: "a A to the left of a B" vs "... to the right of ...", for two
  single-instance objects whose boxes do not overlap horizontally;
* ``absolute-position``: "a A on the left side of the picture" vs "... right side ...", for
  a single-instance object whose box centre lies in the outer third of the frame;
* ``depth``: "a A in front of a B" vs "a A behind a B", by the **box-bottom heuristic**
  (on a ground plane the object whose box reaches lower in the frame is nearer the
  camera): bottoms differ by at least ``min_gap`` of the height, boxes overlap
  horizontally and overlap vertically (otherwise the pair is ``vertical``);
* ``vertical``: "a A above a B" vs "a A below a B", for horizontally overlapping boxes with
  A's bottom above B's top.

Geometric families use only categories with exactly one instance in the image, so each name
denotes one box, and give a ``paraphrase`` of the positive ("B to the right of A"). Every row
carries the shapes-train grounding columns ``ground_words`` / ``ground_boxes`` (normalised
x0, y0, x1, y1) / ``ground_positions`` (word indices in ``captions[0].split(" ")``) for the
mentions of single-instance categories in the positive, and ``image_size`` (``[width, height]``
in pixels), with which training maps those boxes onto the square crop the encoder sees
(:func:`pipeline.scorers.bindclip.training.view_grounding`). At most one item per image and
family; choices are deterministic (sha256 of the image path and family), never random.

Split: image-disjoint by ``hash_bucket(image)`` (sha256 mod 10): 0-2 ``train``, 3-4
``validation``, 5-9 ``holdout`` (column ``split``). Score the development diagnostic on
``validation`` rows. The rendered counterfactual and flipped images of the shapes world do not
exist for real photographs: ``cf_image``, ``flip_image`` and ``flip_captions`` are None.

Metric (shared with ``shapes-train`` / ``shapes-dev``): per-family accuracy with strict
``>`` (a tie is wrong), named by family, and ``mean``, the unweighted mean over families.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import SUITES, Suite, Units, bucket_split, choice_correct, hash_bucket
from pipeline.benchmarks.intake import (
    bbox_field,
    entry_list,
    id_index,
    integer_field,
    number_field,
    off_image,
    read_json_object,
    relative_image_path,
    report_off_image,
    require_file,
    text_field,
)

FAMILIES = (
    "entity",
    "attribute",
    "role-swap",
    "negation",
    "relative-geometry",
    "absolute-position",
    "depth",
    "vertical",
)
COCO_SOURCE = "download annotations_trainval2017.zip from cocodataset.org"
COLOURS = (
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "gray",
)
SPELLINGS = {"grey": "gray"}  # another spelling of a colour of COLOURS: matched, never drawn
ASYMMETRIC = (
    "on", "in", "inside", "under", "above", "below", "behind", "riding", "holding", "carrying",
    "eating", "pulling", "chasing", "on top of", "in front of", "sitting on", "standing on",
    "laying on", "lying on", "wearing", "watching", "looking at", "playing with", "inside of",
)  # fmt: skip
SYMMETRIC = ("and", "with", "next to", "near", "beside", "by", "or")


@dataclass
class CocoFamiliesConfig:
    """Where the COCO files are and how pairs are chosen."""

    captions: str = "annotations/captions_train2017.json"  # COCO captions file, under root
    instances: str = "annotations/instances_train2017.json"  # COCO instances file, under root
    image_dir: str = "train2017"  # image folder, relative to the image root
    min_area: float = 0.01  # smallest box area (fraction of the image) used by geometric families
    min_gap: float = 0.05  # smallest gap (fraction of width/height) for a spatial decision
    max_per_family: int | None = None  # keep at most this many items per family (image order)


# ---------------------------------------------------------------------------- text helpers


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _replace(text: str, start: int, end: int, new: str) -> str:
    """``text[start:end]`` -> ``new``, fixing a preceding indefinite article (a/an)."""
    head = text[:start]
    m = re.search(r"\b(a|an|A|An) $", head)
    if m:
        art = "an" if new[0].lower() in "aeiou" else "a"
        head = head[: m.start()] + (art.capitalize() if m.group(1)[0] == "A" else art) + " "
    return head + new + text[end:]


IRREGULAR_PLURALS = {"person": "people", "mouse": "mice", "knife": "knives"}
SAME_PLURAL = frozenset({"sheep", "broccoli", "skis", "scissors"})  # the plural is the name itself
ALWAYS_PLURAL = frozenset({"skis", "scissors"})  # plural-only nouns
SINGULAR_MARKERS = ("a", "an", "one", "this", "that", "each", "another", "every")


def plural(word: str) -> str:
    """English plural of a COCO category name (last word inflected)."""
    head, _, last = word.rpartition(" ")
    if last in SAME_PLURAL:
        out = last
    elif last in IRREGULAR_PLURALS:
        out = IRREGULAR_PLURALS[last]
    elif last.endswith(("s", "sh", "ch", "x")):
        out = last + "es"
    elif last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        out = last[:-1] + "ies"
    else:
        out = last + "s"
    return f"{head} {out}" if head else out


def _is_plural(low: str, start: int, name: str, matched_plural: bool) -> bool:
    """Whether the mention of ``name`` at ``start`` of the lower-cased caption ``low`` is plural:
    the form that matched, or for a name whose plural is itself ("sheep") its determiner
    ("a sheep" singular, "two sheep" plural; plural-only nouns such as "skis" always plural)."""
    last = name.rpartition(" ")[2]
    if last not in SAME_PLURAL:
        return matched_plural
    if last in ALWAYS_PLURAL:
        return True
    before = low[:start].split()
    return not (before and before[-1] in SINGULAR_MARKERS)


def _inflected(name: str, is_plural: bool, like: str) -> str:
    """``name`` in the number ``is_plural`` and with ``like``'s leading capital."""
    word = plural(name) if is_plural else name
    return word[0].upper() + word[1:] if like[:1].isupper() else word


def _pick(options: list[str], key: str) -> str:
    """A deterministic choice among sorted ``options`` keyed by ``key``."""
    opts = sorted(options)
    return opts[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(opts)]


def _mentions(caption: str, names: list[str]) -> list[tuple[int, int, str, bool]]:
    """Non-overlapping ``(start, end, category, is_plural)`` of category names in ``caption``."""
    found = []
    low = caption.lower()
    for name in sorted(names, key=len, reverse=True):
        for form, is_pl in ((plural(name), True), (name, False)):
            for m in re.finditer(rf"\b{re.escape(form)}\b", low):
                if all(m.end() <= s or m.start() >= e for s, e, _, _ in found):
                    found.append((m.start(), m.end(), name, _is_plural(low, m.start(), name, is_pl)))
    return sorted(found)


def ground(text: str, boxes_of: dict[str, list[float]]) -> dict[str, list]:
    """Grounding of ``text`` (the shapes-train columns): the words of every mention of a
    single-instance category, their boxes and their word indices in ``text.split()``, the
    words :func:`pipeline.world.grounding.word_token_positions` reads back (COCO captions may
    hold runs of spaces, tabs or newlines, which open_clip's tokenizer collapses)."""
    words, boxes, positions = [], [], []
    for start, end, name, _ in _mentions(text, sorted(boxes_of)):
        before = text[:start]
        # the mention starts a word unless it follows a non-space (``hot-dog``: inside one)
        first = len(before.split()) - (1 if before and not before[-1].isspace() else 0)
        for k, w in enumerate(text[start:end].split()):
            words.append(w)
            boxes.append(boxes_of[name])
            positions.append(first + k)
    return {"ground_words": words, "ground_boxes": boxes, "ground_positions": positions}


# ---------------------------------------------------------------------------- families


def _caption_items(
    captions: list[str], present: set[str], absent_by_super: dict, key: str, nouns: frozenset[str] = frozenset()
) -> dict:
    """Entity, attribute and role-swap pairs from the image's captions (first that fits);
    ``nouns`` are every category name in the annotations."""
    out: dict[str, tuple[str, str]] = {}
    for cap in captions:
        ments = _mentions(cap, sorted(present))
        if "entity" not in out:
            for s, e, name, is_pl in ments:
                pool = absent_by_super.get(name, [])
                if pool:
                    new = _pick(pool, key + cap)
                    out["entity"] = (
                        cap,
                        _replace(cap, s, e, _inflected(new, is_pl, cap[s:e])),
                    )
                    break
        if "attribute" not in out:
            # a colour word that is also a category ("an orange" is the fruit) is not swapped: without
            # a parser the noun and the adjective look alike; the new colour is none the caption has, so
            # "a black and white cat" never becomes the still-true "a white and white cat"
            found = list(re.finditer(rf"\b({'|'.join(COLOURS + tuple(SPELLINGS))})\b", cap, re.IGNORECASE))
            m = next((m for m in found if m.group(1).lower() not in nouns), None)
            had = {SPELLINGS.get(f.group(1).lower(), f.group(1).lower()) for f in found}
            pool = [c for c in COLOURS if c not in had]
            if m and pool:
                out["attribute"] = (cap, _replace(cap, m.start(), m.end(), _pick(pool, key + cap)))
        if "role-swap" not in out:
            for (s1, e1, n1, pl1), (s2, e2, n2, pl2) in pairwise(ments):
                between = f" {cap[e1:s2].lower().strip()} "
                if n1 == n2 or any(f" {w} " in between for w in SYMMETRIC):
                    continue
                if any(f" {w} " in between for w in ASYMMETRIC):
                    # each slot keeps its number ("two dogs chasing a cat" -> "two cats chasing
                    # a dog"), so the negative is as grammatical as the positive; the right
                    # span first, so that s1 and e1 stay valid
                    swapped = _replace(cap, s2, e2, _inflected(n1, pl2, cap[s2:e2]))
                    out["role-swap"] = (cap, _replace(swapped, s1, e1, _inflected(n2, pl1, cap[s1:e1])))
                    break
    return out


def _overlap(a0: float, a1: float, b0: float, b1: float) -> bool:
    return min(a1, b1) > max(a0, b0)


def _geometric_items(
    objs: list[tuple[str, list[float]]], cfg: CocoFamiliesConfig, key: str
) -> dict:
    """Spatial pairs from single-instance boxes ``(name, [x0, y0, x1, y1])`` normalised."""
    out: dict[str, dict] = {}
    g = cfg.min_gap
    by_area = sorted(objs, key=lambda o: -(o[1][2] - o[1][0]) * (o[1][3] - o[1][1]))
    for name, box in by_area:
        cx = (box[0] + box[2]) / 2
        if cx < 1 / 3 or cx > 2 / 3:
            side, other = ("left", "right") if cx < 1 / 3 else ("right", "left")
            a = _article(name)
            out["absolute-position"] = {
                "captions": [
                    f"{a} on the {side} side of the picture",
                    f"{a} on the {other} side of the picture",
                ],
                "paraphrase": f"the {side} side of the picture shows {a}",
            }
            break
    # which object of a pair is the subject: fixed per image by its hash (both orders occur)
    flip = int(hashlib.sha256((key + "subject").encode()).hexdigest(), 16) % 2 == 1
    for i, first in enumerate(by_area):
        for second in by_area[i + 1 :]:
            (na, ba), (nb, bb) = (second, first) if flip else (first, second)
            A, B = _article(na), _article(nb)
            if "relative-geometry" not in out and (ba[2] + g <= bb[0] or bb[2] + g <= ba[0]):
                pos, neg = ("left", "right") if ba[2] <= bb[0] else ("right", "left")
                out["relative-geometry"] = {
                    "captions": [f"{A} to the {pos} of {B}", f"{A} to the {neg} of {B}"],
                    "paraphrase": f"{B} to the {neg} of {A}",
                }
            x_overlap = _overlap(ba[0], ba[2], bb[0], bb[2])
            if "vertical" not in out and x_overlap and (ba[3] + g <= bb[1] or bb[3] + g <= ba[1]):
                pos, neg = ("above", "below") if ba[3] <= bb[1] else ("below", "above")
                out["vertical"] = {
                    "captions": [f"{A} {pos} {B}", f"{A} {neg} {B}"],
                    "paraphrase": f"{B} {neg} {A}",
                }
            if (
                "depth" not in out
                and x_overlap
                and _overlap(ba[1], ba[3], bb[1], bb[3])
                and abs(ba[3] - bb[3]) >= g
            ):
                pos, neg = ("in front of", "behind") if ba[3] > bb[3] else ("behind", "in front of")
                out["depth"] = {
                    "captions": [f"{A} {pos} {B}", f"{A} {neg} {B}"],
                    "paraphrase": f"{B} {neg} {A}",
                }
    return out


def build_families(root: Path, cfg: CocoFamiliesConfig | None = None) -> pd.DataFrame:
    """The family manifest from the COCO captions + instances files under ``root``."""
    cfg = cfg or CocoFamiliesConfig()
    cap_path = require_file(root, cfg.captions, COCO_SOURCE)
    inst_path = require_file(root, cfg.instances, COCO_SOURCE)
    cap_data = read_json_object(cap_path, COCO_SOURCE)
    inst = read_json_object(inst_path, COCO_SOURCE)
    cats = id_index(((c["id"], c) for c in entry_list(inst, "categories", inst_path)), f"{inst_path}: categories")
    for cid, c in cats.items():
        for key in ("name", "supercategory"):
            text_field(c, key, inst_path, f"category {cid}")
    super_of = {c["name"]: c["supercategory"] for c in cats.values()}
    nouns = frozenset(super_of)
    supers: dict[str, list[str]] = {}
    for c in cats.values():
        supers.setdefault(c["supercategory"], []).append(c["name"])
    images = {im["id"]: im for im in entry_list(inst, "images", inst_path)}
    if "images" in cap_data:
        images.update({im["id"]: im for im in entry_list(cap_data, "images", cap_path) if im["id"] not in images})
    caps: dict[int, list[tuple[int, str]]] = {}
    for a in entry_list(cap_data, "annotations", cap_path):
        caps.setdefault(a["image_id"], []).append((a["id"], text_field(a, "caption", cap_path, f"caption {a['id']}").strip()))
    anns: dict[int, list[dict]] = {}
    for a in entry_list(inst, "annotations", inst_path):
        where = f"annotation {integer_field(a, 'id', inst_path, 'an annotation')}"
        integer_field(a, "category_id", inst_path, where)
        a["area"] = number_field(a, "area", inst_path, where, minimum=0)
        if not a.get("iscrowd", 0):  # a crowd's box is not used
            a["bbox"] = bbox_field(a, "bbox", inst_path, where)
        anns.setdefault(integer_field(a, "image_id", inst_path, where), []).append(a)

    rows, counts, left_out = [], dict.fromkeys(FAMILIES, 0), []
    for image_id in sorted(images):
        im = images[image_id]
        image = relative_image_path(f"{cfg.image_dir}/{text_field(im, 'file_name', inst_path, f'image {image_id}')}", f"image {image_id}")
        w, h = (number_field(im, k, inst_path, f"image {image_id}", positive=True) for k in ("width", "height"))
        inst_list = anns.get(image_id, [])
        off = [a for a in inst_list if not a.get("iscrowd", 0) and off_image(a["bbox"], w, h)]
        left_out += [f"image {image_id}, annotation {a['id']}" for a in off]
        inst_list = [a for a in inst_list if not any(a is b for b in off)]  # not in the picture: not present
        names = [cats[a["category_id"]]["name"] for a in inst_list]
        present = set(names)
        absent_by_super = {n: [m for m in supers[super_of[n]] if m not in present] for n in present}
        # normalised [x0, y0, x1, y1] of every category with exactly one (non-crowd) instance
        boxes_of = {
            n: [b[0] / w, b[1] / h, (b[0] + b[2]) / w, (b[1] + b[3]) / h]
            for a, n in zip(inst_list, names, strict=True)
            if names.count(n) == 1 and not a.get("iscrowd", 0)
            for b in [a["bbox"]]
        }
        areas = {n: (b[2] - b[0]) * (b[3] - b[1]) for n, b in boxes_of.items()}
        single = [(n, b) for n, b in boxes_of.items() if areas[n] >= cfg.min_area]
        items: dict[str, dict] = {
            fam: {"captions": list(pair), "paraphrase": None}
            for fam, pair in _caption_items(
                [c for _, c in sorted(caps.get(image_id, []))], present, absent_by_super, image, nouns
            ).items()
        }
        if present:
            largest = max(inst_list, key=lambda a: a["area"])
            a_name = cats[largest["category_id"]]["name"]
            pool = [
                m for m in supers[cats[largest["category_id"]]["supercategory"]] if m not in present
            ]
            pool = pool or sorted({c["name"] for c in cats.values()} - present)
            if pool:
                b_name = _pick(pool, image + "negation")
                items["negation"] = {
                    "captions": [
                        f"a photo of {_article(a_name)} and no {plural(b_name)}",
                        f"a photo of {_article(b_name)} and no {plural(a_name)}",
                    ],
                    "paraphrase": None,
                }
        items.update(_geometric_items(single, cfg, image))
        bucket = hash_bucket(image)
        for fam in FAMILIES:
            if fam not in items or (
                cfg.max_per_family is not None and counts[fam] >= cfg.max_per_family
            ):
                continue
            counts[fam] += 1
            it = items[fam]
            rows.append(
                {
                    "item_id": f"{fam}/{image_id}",
                    "image": image,
                    "captions": it["captions"],
                    "correct": 0,
                    "category": fam,
                    "family": fam,
                    "split": bucket_split(bucket),
                    "bucket": bucket,
                    "paraphrase": it["paraphrase"],
                    "cf_image": None,
                    "flip_image": None,
                    "flip_captions": None,
                    "image_size": [w, h],
                    **ground(it["captions"][0], boxes_of),
                }
            )
    report_off_image(inst_path, left_out, "left out: those objects count as absent from their images")
    if not rows:
        raise ValueError(f"no family item could be generated from {root}")
    return pd.DataFrame(rows)


def build_manifest(root: Path) -> pd.DataFrame:
    """``build_families`` with the default ``CocoFamiliesConfig``."""
    return build_families(root)


def build_dev_manifest(root: Path) -> pd.DataFrame:
    """The ``validation`` rows of :func:`build_manifest` (BindCLIP's image-hash split): the
    dev families checkpoints are selected on (``coco-families[validation]``), as a suite of
    its own so that score and the report read it like any test suite.

    Raises:
        ValueError: when no item falls in the validation buckets.
    """
    df = build_manifest(root)
    dev = df[df["split"] == "validation"].reset_index(drop=True)
    if dev.empty:
        raise ValueError(f"no COCO family item of {root} falls in the validation split (buckets 3-4)")
    return dev


# ---------------------------------------------------------------------------- metric


def family_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """Per-family accuracy (strict ``>``) named by family and ``mean`` (unweighted over
    the families present). ``scores``: [n, 2] for [pos, neg]."""
    fam = manifest["family"].to_numpy()
    unknown = sorted(set(fam) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {unknown}; valid: {', '.join(FAMILIES)}")
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="wrong").astype(float)
    units = {f: Units(correct[fam == f]) for f in FAMILIES if (fam == f).any()}
    units["mean"] = Units(correct, groups=fam)
    return units


_ROOT_FILES = (
    "root = COCO 2017 root holding annotations/captions_train2017.json and "
    "instances_train2017.json; images under root/train2017/"
)
for _name, _build, _what in (
    ("coco-families", build_manifest, "COCO hard-negative families"),
    ("coco-families-dev", build_dev_manifest, "coco-families' validation split (the dev families)"),
):
    SUITES.register(
        _name,
        Suite(
            name=_name,
            task="choice",
            build_manifest=_build,
            units=family_units,
            metric_names=(*FAMILIES, "mean"),
            headline="mean",
            categories=FAMILIES,  # category = family
            caption_columns=("captions", "paraphrase"),  # paraphrases: BindCLIP's paraphrase objective
            description=f"{_what}: {_ROOT_FILES}",
        ),
    )
