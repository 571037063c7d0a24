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
  per-category accuracy with strict ``>``, ``total``, ``category-mean`` and the
  length-matched slices (ours; :mod:`pipeline.benchmarks.sugarcrepe`);
* ``shapes-retrieval``: one row per gallery image with ``captions = [query]`` and ``group``;
  scores ``[n_queries, n_gallery]`` over ``gallery_images(manifest)`` -> ``R@1``, ``R@5``,
  ``R@10``, ``nDCG@10``, ``mean-rank`` (:mod:`pipeline.benchmarks.retrieval`);
* ``shapes-multi``: the same rows and metrics over galleries of 27 near-duplicates of 3-5
  objects (``group``; ``variant`` base / colour-swap / colour-change / position-swap / move);
  headline ``R@10``;
* ``shapes-train`` / ``shapes-dev``: ``family`` (8 families), ``[pos, neg]`` -> per-family
  accuracy (strict ``>``) and ``mean`` (the COCO-families metric).

Object columns (:mod:`pipeline.benchmarks.retrieval`): ``object_names``, ``object_boxes``,
``phrases``, ``relations`` on shapes-retrieval and shapes-multi; ``object_names`` and
``object_boxes`` (of ``image``) on shapes-train and shapes-dev. ``object_names`` and
``phrases`` are caption columns, so extract encodes each phrase once.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.aro import attribution_units, order_units, relation_units
from pipeline.benchmarks.base import SUITES, Suite, Units
from pipeline.benchmarks.coco_families import FAMILIES, family_units
from pipeline.benchmarks.intake import relative_image_path
from pipeline.benchmarks.retrieval import (
    OBJECT_CAPTION_COLUMNS,
    RETRIEVAL_METRICS,
    STEERING_COLUMNS,
    retrieval_units,
)
from pipeline.benchmarks.sugarcrepe import CATEGORIES as SUGARCREPE_CATEGORIES
from pipeline.benchmarks.sugarcrepe import METRIC_NAMES as SUGARCREPE_METRICS
from pipeline.benchmarks.sugarcrepe import sugarcrepe_units
from pipeline.benchmarks.whatsup import CONTROLLED_METRICS, whatsup_units
from pipeline.manifests import read_manifest


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
    "shapes-multi": (
        "retrieval",
        retrieval_units,
        RETRIEVAL_METRICS,
        "R@10",
        "multi-object retrieval among near-duplicates",
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

# Training/dev pairs also carry the counterfactual and flipped images, the flipped captions,
# a paraphrase and the image's object names: extract encodes them so training reads
# everything from the cache. Retrieval suites add their object and query phrases.
_COLUMNS = {
    "shapes-retrieval": {"caption_columns": ("captions", *OBJECT_CAPTION_COLUMNS, *STEERING_COLUMNS)},
    "shapes-multi": {"caption_columns": ("captions", *OBJECT_CAPTION_COLUMNS, *STEERING_COLUMNS)},
    **{
        name: {
            "image_columns": ("image", "cf_image", "flip_image"),
            "caption_columns": ("captions", "flip_captions", "paraphrase", "object_names"),
        }
        for name in ("shapes-train", "shapes-dev")
    },
}

# The ``category`` values `pipeline world` writes (pipeline.world.suites / families /
# retrieval / multi): check_manifest refuses any other, which would leave its item out of
# the per-category metrics and reports.
_CATEGORIES = {
    "shapes-whatsup": ("left", "right", "above", "below"),  # the arrangement
    "shapes-aro": ("relation", "attribution", "order"),
    "shapes-sugarcrepe": SUGARCREPE_CATEGORIES,
    "shapes-retrieval": ("retrieval",),
    "shapes-multi": ("retrieval",),
    "shapes-train": FAMILIES,  # the family
    "shapes-dev": FAMILIES,
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
            categories=_CATEGORIES[_name],
            description=f"shapes world, {_what}: root = world folder (manifests/{_name}.parquet, images/)",
            world=True,
            **_COLUMNS.get(_name, {}),
        ),
    )
