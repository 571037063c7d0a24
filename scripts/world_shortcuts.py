"""Shortcut baselines on the built shapes world: what a scorer could get without binding.

    .venv/bin/python scripts/world_shortcuts.py [--world cache/world]

* **fixed-pixel lookup** (shapes-whatsup): option "X <rel> Y" scores how close the pixel
  0.15 from the image centre in <rel>'s direction is to X's palette colour (its caption's
  first colour word); world.md asks that nothing be solvable so. Scored by the suite's
  official metrics (individual, pair, set).
* **subject's half** (shapes-whatsup): option "X <rel> Y" scores X's centre offset from the
  image centre in <rel>'s direction, ignoring Y: relative geometry answered by absolute
  position.
* **depth phrase** (shapes-sugarcrepe replace-rel): prefer the caption that states a depth
  relation (front / behind) when exactly one does, text only; the items it decides and its
  accuracy on them.
* **object count** (the negation family of shapes-train / shapes-dev): with 2 objects pick
  the "no" caption, with 4 the other, a coin flip with 3 (expected accuracy).

Reads the manifests and images ``pipeline world`` wrote; writes nothing; prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.benchmarks import SUITES
from pipeline.manifests import read_manifest
from pipeline.world.captions import relation_of
from pipeline.world.scenes import COLOURS

OFFSET = 0.15  # the lookup's distance from the image centre
DIRECTION = {"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}  # y down, as the grid


def first_colour(caption: str) -> tuple[int, int, int]:
    return COLOURS[next(w for w in caption.split() if w in COLOURS)]


def whatsup_baselines(world: Path) -> dict[str, dict[str, float]]:
    manifest = read_manifest(world / "manifests" / "shapes-whatsup.parquet")
    pixel = np.full((len(manifest), 4), np.nan)
    half = np.full((len(manifest), 4), np.nan)
    for i, row in enumerate(manifest.itertuples()):
        img = np.asarray(Image.open(world / "images" / row.image).convert("RGB"), dtype=float)  # [H, W, 3]
        h, w = img.shape[:2]
        subject = json.loads(row.scene)["objects"]
        for k, caption in enumerate(row.captions):
            dx, dy = DIRECTION[relation_of(caption)]
            x, y = 0.5 + dx * OFFSET, 0.5 + dy * OFFSET
            pixel[i, k] = -np.linalg.norm(img[int(y * h), int(x * w)] - first_colour(caption))
            colour = caption.split()[1]  # "a <colour> <shape> ..."
            obj = next(o for o in subject if o["colour"] == colour and o["shape"] == caption.split()[2])
            half[i, k] = dx * (obj["x"] - 0.5) + dy * (obj["y"] - 0.5)
    suite = SUITES.get("shapes-whatsup")
    return {"fixed-pixel lookup": suite.metrics(manifest, pixel), "subject's half": suite.metrics(manifest, half)}


def depth_phrase(world: Path) -> dict[str, float]:
    manifest = read_manifest(world / "manifests" / "shapes-sugarcrepe.parquet")
    rows = manifest[manifest["category"] == "replace-rel"]
    depth = np.array([[relation_of(c) in ("front", "behind") for c in caps] for caps in rows["captions"]])  # [n, 2]
    decided = depth.sum(1) == 1
    right = depth[np.arange(len(rows)), rows["correct"].to_numpy()][decided]
    return {"items": int(len(rows)), "decided": int(decided.sum()), "right when decided": float(right.mean()) if decided.any() else float("nan")}


def negation_count(world: Path, suite: str) -> dict[str, float]:
    manifest = read_manifest(world / "manifests" / f"{suite}.parquet")
    rows = manifest[manifest["family"] == "negation"]
    n_objects = rows["scene"].map(lambda s: len(json.loads(s)["objects"])).to_numpy()
    no_true = np.array([" no " in f" {caps[c]} " for caps, c in zip(rows["captions"], rows["correct"], strict=True)])
    right = np.where(n_objects == 2, no_true, np.where(n_objects >= 4, ~no_true, 0.5))  # 3 objects: a coin flip
    return {"items": int(len(rows)), "object-count accuracy": float(right.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=Path, default=Path("cache/world"))
    args = parser.parse_args()
    out = {"shapes-whatsup": whatsup_baselines(args.world), "shapes-sugarcrepe replace-rel": depth_phrase(args.world)}
    out.update({f"{s} negation": negation_count(args.world, s) for s in ("shapes-train", "shapes-dev")})
    print(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
