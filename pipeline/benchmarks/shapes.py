"""The shapes-world suites: manifests written by ``pipeline world``, scored by the official
metric code of the benchmark each one mirrors (never a copy of it).

``build_manifest(root)`` reads ``<root>/manifests/<suite>.parquet`` (``root`` = the world
folder; images are relative to ``<root>/images``). Columns beyond the common
``item_id, image, captions, correct, category``:

* ``shapes-whatsup``: ``pair_key``, ``arrangement`` (left/right/above/below); 4 options,
  the true one at index 0 -> What'sUp ``individual``/``pair``/``set`` (argmax-first ties);
* ``shapes-aro``: ``category`` relation/attribution/order, ``relation_name``, ``attr_pair``;
  VG-style ``[false, true]`` (correct 1) or 5 Order options (correct 0) -> ``relation``
  (macro over relation names, no exclusion list), ``attribution`` (macro over attribute
  pairs, ``min_count`` 1), ``order`` (P@1);
* ``shapes-sugarcrepe``: the 7 SugarCrepe categories, ``[pos, neg]``, ``length_matched`` ->
  per-category accuracy with strict ``>``, ``total`` and the length-matched slices (ours);
* ``shapes-retrieval``: one row per gallery image with ``captions = [query]`` and ``group``;
  scores ``[n_queries, n_gallery]`` over ``gallery_images(manifest)`` -> ``R@1``, ``R@5``,
  ``R@10``, ``nDCG@10``;
* ``shapes-train`` / ``shapes-dev``: ``family`` (8 families), ``[pos, neg]`` -> per-family
  accuracy (strict ``>``) and ``mean`` (the COCO-families metric).

Retrieval (ours, single relevant image per query, binary relevance): ties are pessimistic,
``rank = 1 + #{gallery images other than the target scoring >= the target}``;
``R@k = [rank <= k]`` and ``nDCG@10 = 1 / log2(1 + rank)`` if ``rank <= 10`` else 0 (the
ideal DCG is 1).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.aro import attribution_units, order_units, relation_units
from pipeline.benchmarks.base import SUITES, Suite, Units, gallery_images, relative_image_path
from pipeline.benchmarks.coco_families import FAMILIES, family_units
from pipeline.benchmarks.sugarcrepe import METRIC_NAMES as SUGARCREPE_METRICS
from pipeline.benchmarks.sugarcrepe import sugarcrepe_units
from pipeline.benchmarks.whatsup import CONTROLLED_METRICS, whatsup_units
from pipeline.manifests import read_manifest

RETRIEVAL_METRICS = ("R@1", "R@5", "R@10", "nDCG@10")


def read_world_manifest(root: Path, suite: str) -> pd.DataFrame:
    """``<root>/manifests/<suite>.parquet`` with list cells as Python lists."""
    path = Path(root) / "manifests" / f"{suite}.parquet"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: build the shapes world first with `pipeline world`"
        )
    m = read_manifest(path)
    for col in ("image", "cf_image", "flip_image"):
        if col in m:
            for item, img in zip(m["item_id"], m[col], strict=True):
                if img is not None:
                    relative_image_path(img, item)  # raises for paths escaping the image root
    return m


# ---------------------------------------------------------------------------- metrics


def target_ranks(scores: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[n_queries] 1-based rank of each query's target, ties pessimistic:
    ``rank = 1 + #{j != target : scores[q, j] >= scores[q, target]}``; NaN ranks last.

    Args:
        scores: [n_queries, n_gallery] query-image scores.
        target: [n_queries] gallery index of each query's relevant image.
    """
    scores = np.asarray(scores, dtype=float)
    scores = np.where(np.isnan(scores), -np.inf, scores)
    t = scores[np.arange(len(target)), target][:, None]  # [n_queries, 1]
    return (scores >= t).sum(axis=1)  # the target itself supplies the 1


def retrieval_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """R@1, R@5, R@10 and nDCG@10, one unit per query (row); ``scores``: [n_queries,
    n_gallery] over ``gallery_images(manifest)``."""
    gallery = {img: j for j, img in enumerate(gallery_images(manifest))}
    if np.shape(scores) != (len(manifest), len(gallery)):
        raise ValueError(
            f"retrieval scores have shape {np.shape(scores)}, expected {(len(manifest), len(gallery))}"
        )
    rank = target_ranks(scores, np.array([gallery[img] for img in manifest["image"]]))
    units = {f"R@{k}": Units((rank <= k).astype(float)) for k in (1, 5, 10)}
    units["nDCG@10"] = Units(np.where(rank <= 10, 1.0 / np.log2(1.0 + rank), 0.0))
    return units


def shapes_aro_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """ARO metrics per category rows: relation (no exclusions), attribution (min 1), order."""
    cat = manifest["category"].to_numpy()
    units: dict[str, Units] = {}
    for name, fn in (
        ("relation", partial(relation_units, excluded=frozenset())),
        ("attribution", partial(attribution_units, min_count=1)),
        ("order", order_units),
    ):
        rows = cat == name
        if rows.any():
            sub = fn(manifest[rows].reset_index(drop=True), np.asarray(scores)[rows])
            units[name] = sub["P@1" if name == "order" else name]
    return units


# ---------------------------------------------------------------------------- registration

_SPECS = {
    "shapes-whatsup": (
        "choice",
        whatsup_units,
        CONTROLLED_METRICS,
        "pair",
        "What'sUp-style arrangements",
    ),
    "shapes-aro": (
        "choice",
        shapes_aro_units,
        ("relation", "attribution", "order"),
        "relation",
        "ARO-style items",
    ),
    "shapes-sugarcrepe": (
        "choice",
        sugarcrepe_units,
        SUGARCREPE_METRICS,
        "total",
        "SugarCrepe-style categories",
    ),
    "shapes-retrieval": (
        "retrieval",
        retrieval_units,
        RETRIEVAL_METRICS,
        "R@1",
        "text-to-image retrieval",
    ),
    "shapes-train": (
        "choice",
        family_units,
        (*FAMILIES, "mean"),
        "mean",
        "training pairs, 8 families",
    ),
    "shapes-dev": (
        "choice",
        family_units,
        (*FAMILIES, "mean"),
        "mean",
        "development pairs, 8 families",
    ),
}

# Training/dev pairs also carry the counterfactual and flipped images, the flipped captions
# and a paraphrase: extract encodes them so training reads everything from the cache.
_PAIR_COLUMNS = {
    "image_columns": ("image", "cf_image", "flip_image"),
    "caption_columns": ("captions", "flip_captions", "paraphrase"),
}

for _name, (_task, _units, _metrics, _headline, _what) in _SPECS.items():
    SUITES.register(
        _name,
        Suite(
            name=_name,
            task=_task,
            build_manifest=partial(read_world_manifest, suite=_name),
            units=_units,
            metric_names=_metrics,
            headline=_headline,
            description=f"shapes world, {_what}: root = world folder (manifests/{_name}.parquet, images/)",
            **(_PAIR_COLUMNS if _name in ("shapes-train", "shapes-dev") else {}),
        ),
    )
