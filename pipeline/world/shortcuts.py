"""Shortcut baselines on the shapes world: what a scorer could get without binding anything.

world.md asks that nothing be solvable by a fixed pixel lookup and that each family test
what it names; these baselines measure how far the built suites fall short of that, on the
suite's own official metrics:

* ``subject's half`` (shapes-whatsup): option "X <rel> Y" scores X's centre offset from the
  image centre in <rel>'s direction, Y ignored: relative geometry answered by absolute
  position; ``reference's half`` the same from Y's offset against <rel>'s direction, X
  ignored. A relation fixes the pair's offset, so the two cannot both be at chance; how far
  above chance they are is set by the pair's distance against the span of its placements.
* ``subject's half`` on two-option suites (:func:`subject_half`: shapes-sugarcrepe's
  replace-rel, the relative-geometry and vertical families of shapes-train / shapes-dev): the
  same rule where the options differ in the relation word.
* ``fixed-pixel lookup`` (shapes-whatsup): option "X <rel> Y" scores how close the pixel
  :data:`OFFSET` from the image centre in <rel>'s direction is to X's palette colour.
* ``depth phrase`` (shapes-sugarcrepe replace-rel, text only): prefer the caption stating a
  depth relation when exactly one does; the items it decides and its accuracy on them.
* ``object count`` (the negation family of shapes-train / shapes-dev): with 2 objects the
  "no" caption, with 4 the other, a coin flip with 3 (expected accuracy).

Pure functions of a manifest (and, for the pixel lookup, its images); the report's
``shortcuts`` section and ``scripts/world_shortcuts.py`` print them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from pipeline.benchmarks import SUITES
from pipeline.world.captions import REL_WORDS, relation_of
from pipeline.world.scenes import COLOURS, SIZES

OFFSET = 0.15  # the pixel lookup's distance from the image centre (normalised)
DIRECTION = {"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}  # y down, as the image


def _subject(caption: str, objects: list[dict]) -> dict:
    """The scene object a relation caption ("[a|the] [size] [colour] <shape> <relation> ...")
    is about: the one matching the words before its relation phrase."""
    text = f" {caption} "
    rel = relation_of(caption)
    cut = min(i for p in REL_WORDS[rel] if (i := text.find(f" {p} ")) >= 0)
    words = set(text[:cut].split())
    return next(
        o for o in objects
        if o["shape"] in words and (not words & set(COLOURS) or o["colour"] in words)
        and (not words & set(SIZES) or o["size"] in words)
    )  # fmt: skip


def _half_scores(captions, scene: str) -> list[float] | None:
    """Each caption's subject offset from the image centre in its relation's direction, or
    None unless every caption states a left/right/above/below relation."""
    if not all(relation_of(c) in DIRECTION for c in captions):
        return None
    objects = json.loads(scene)["objects"]
    out = []
    for c in captions:
        (dx, dy), subject = DIRECTION[relation_of(c)], _subject(c, objects)
        out.append(dx * (subject["x"] - 0.5) + dy * (subject["y"] - 0.5))
    return out


def subject_half(manifest: pd.DataFrame) -> dict[str, float]:
    """The subject's half on every row whose captions all state a left/right/above/below
    relation (the option whose subject sits furthest in its direction): the rows it answers
    and its accuracy on them."""
    right = []
    for caps, correct, scene in zip(manifest["captions"], manifest["correct"], manifest["scene"], strict=True):
        scores = _half_scores(caps, scene)
        if scores is not None:
            right.append(int(np.argmax(scores)) == int(correct))
    return {"items": len(right), "accuracy": float(np.mean(right)) if right else float("nan")}


def whatsup_shortcuts(manifest: pd.DataFrame, image_root: Path) -> dict[str, dict[str, float]]:
    """{baseline: shapes-whatsup's official metrics} for ``subject's half``, ``reference's half``
    and ``fixed-pixel lookup`` on ``manifest``'s items (images under ``image_root``)."""
    half = np.full((len(manifest), 4), np.nan)  # [n, K]
    ref_half = np.full((len(manifest), 4), np.nan)  # [n, K]
    pixel = np.full((len(manifest), 4), np.nan)  # [n, K]
    for i, row in enumerate(manifest.itertuples()):
        objects = json.loads(row.scene)["objects"]
        half[i] = _half_scores(row.captions, row.scene)
        img = np.asarray(Image.open(Path(image_root) / row.image).convert("RGB"), dtype=float)  # [H, W, 3]
        h, w = img.shape[:2]
        for k, caption in enumerate(row.captions):
            dx, dy = DIRECTION[relation_of(caption)]
            subject = _subject(caption, objects)
            reference = next(o for o in objects if o is not subject)
            ref_half[i, k] = -dx * (reference["x"] - 0.5) - dy * (reference["y"] - 0.5)
            spot = img[int((0.5 + dy * OFFSET) * h), int((0.5 + dx * OFFSET) * w)]
            pixel[i, k] = -np.linalg.norm(spot - COLOURS[subject["colour"]])
    suite = SUITES.get("shapes-whatsup")
    return {
        "subject's half": suite.metrics(manifest, half),
        "reference's half": suite.metrics(manifest, ref_half),
        "fixed-pixel lookup": suite.metrics(manifest, pixel),
    }


def depth_phrase(manifest: pd.DataFrame) -> dict[str, float]:
    """shapes-sugarcrepe's replace-rel items, how many the depth-phrase rule decides and its
    accuracy on them."""
    rows = manifest[manifest["category"] == "replace-rel"]
    depth = np.array([[relation_of(c) in ("front", "behind") for c in caps] for caps in rows["captions"]]).reshape(-1, 2)
    decided = depth.sum(1) == 1
    right = depth[np.arange(len(rows)), rows["correct"].to_numpy()][decided]
    return {"items": int(len(rows)), "decided": int(decided.sum()), "right when decided": float(right.mean()) if decided.any() else float("nan")}


def negation_count(manifest: pd.DataFrame) -> dict[str, float]:
    """The negation family's items and the object-count rule's expected accuracy."""
    rows = manifest[manifest["family"] == "negation"]
    n_objects = rows["scene"].map(lambda s: len(json.loads(s)["objects"])).to_numpy()
    no_true = np.array([" no " in f" {caps[c]} " for caps, c in zip(rows["captions"], rows["correct"], strict=True)], dtype=bool)
    right = np.where(n_objects == 2, no_true, np.where(n_objects >= 4, ~no_true, 0.5))
    return {"items": int(len(rows)), "object-count accuracy": float(right.mean()) if len(rows) else float("nan")}
