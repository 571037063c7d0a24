"""ARO (Yuksekgonul et al., ICLR 2023): VG-Relation, VG-Attribution, COCO- and Flickr30k-Order.

Official code: github.com/mertyg/vision-language-models-are-bows (``dataset_zoo/``, MIT).
Expected files under ``root``:

* ``aro-relation``: ``visual_genome_relation.json`` (gdown id ``1kX2iCHEv0CADL8dSO1nMdW-V0NqIAiP3``);
* ``aro-attribution``: ``visual_genome_attribution.json`` (gdown id ``13tWvOrNOLHxl3Rm9cR3geAdHx2qR3-Tw``).
  Both: a list of ``{"image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption",
  "false_caption", "relation_name" | "attributes"}``. ``image`` is the official
  ``image_path``, relative to ``<root>/images/`` (``vgr_vga_images.zip``, gdown id
  ``1qaPlrwhGNMrR3a11iopZUT_GPP_LrgP9``); ``crop_box = [x, y, x+w, y+h]`` is applied
  before preprocessing. Options are ``[false, true]``, so ``correct = 1``. Column ``split``
  is BindCLIP's image-disjoint split of the ARO image paths (``hash_bucket(image)``: 0-2
  train, 3-4 validation, 5-9 holdout); recompute the macro metrics on a split's rows.
* ``aro-coco-order``: BLIP's ``coco_karpathy_test.json``; ``aro-flickr-order``: BLIP's
  ``flickr30k_test.json`` (both from storage.googleapis.com/sfr-vision-language-research/datasets/).
  Entries ``{"image", "caption": [str, ...]}``; ``image`` (``val2014/COCO_val2014_...jpg``,
  ``flickr30k-images/<id>.jpg``) is relative to the COCO-2014 / Flickr30k root.

Official metrics (``np.argmax``: the first maximum wins):

* ``relation``: macro accuracy over ``relation_name`` after dropping the 157 names of the
  notebook's ``symmetric`` list (``data/vgr_excluded_relations.json``); a tie picks the
  false caption (index 0) and counts wrong. ``relation-micro`` (all items) is ours.
* ``attribution``: macro accuracy over ``f"{attributes[0]}_{attributes[1]}"`` keys with at
  least 25 items (``min_count``, 1 for the shapes world); ``attribution-micro`` is ours.
* ``relation-<split>`` / ``attribution-<split>`` (``train``, ``validation``, ``holdout``):
  the same macro metric recomputed on one split's rows, the exclusion list and the
  ``min_count`` filter applied within the split (so a relation or attribute pair may drop
  out of a split, and a split with no group left has no figure), for BindCLIP's
  development/holdout figures. Ours; the official code scores the whole file.
* ``P@1`` (Order): share of items whose original caption (index 0) wins; a tie counts right.
  The Order files are the Karpathy / Flickr30k *test* splits only, so Order has no split
  figures.

Order options: ``[pre(c), pre(p1(c)), pre(p2(c)), pre(p3(c)), pre(p4(c))]`` with BLIP's
``pre_caption(·, 30)`` and the four ``TextShuffler`` perturbations (nouns+adjectives
shuffled; everything else shuffled; words shuffled within trigrams; trigrams shuffled),
seeded as ``main_aro.py`` (``seed_all(1)``: numpy's and Python's RNGs, here local instances
that draw the same streams), captions in JSON order. They are generated once by
``build_manifest`` and frozen in the manifest (column ``order_tagger`` names the tagger).

The perturbations and their POS taggers live in :mod:`pipeline.benchmarks.order_text`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import (
    SPLITS,
    SUITES,
    Suite,
    Units,
    bucket_split,
    choice_correct,
    hash_bucket,
)
from pipeline.benchmarks.intake import (
    field_error,
    number_field,
    read_json_list,
    relative_image_path,
    require_file,
    string_list_field,
    text_field,
)
from pipeline.benchmarks.order_text import OrderTagger, TextShuffler, resolve_tagger

VG_SOURCE = "download it with gdown as in dataset_zoo/aro_datasets.py of github.com/mertyg/vision-language-models-are-bows"
BLIP_SOURCE = "download it from storage.googleapis.com/sfr-vision-language-research/datasets/ (BLIP annotations)"


@lru_cache(maxsize=1)
def excluded_relations() -> frozenset[str]:
    """The 157 relation names the official notebook drops before macro-averaging VG-R."""
    text = (
        resources.files("pipeline.benchmarks")
        .joinpath("data/vgr_excluded_relations.json")
        .read_text()
    )
    return frozenset(json.loads(text)["excluded_relations"])


# ---------------------------------------------------------------------------- VG loaders


def _vg_row(d: dict, i: int, path: Path, category: str) -> dict:
    """One VG-Relation / VG-Attribution entry ``i`` of ``path`` -> its manifest row, every
    field checked against the official format (a ``null`` or text box coordinate, a negative
    box size, a caption that is not a string) with the file, the entry and the field named."""
    where, item = f"entry {i}", f"{category}/{i}"
    x, y = (number_field(d, k, path, where) for k in ("bbox_x", "bbox_y"))
    w, h = (number_field(d, k, path, where, minimum=0) for k in ("bbox_w", "bbox_h"))
    image = relative_image_path(text_field(d, "image_path", path, where), item)
    return {
        "item_id": item,
        "image": image,
        "crop_box": [x, y, x + w, y + h],
        "captions": [text_field(d, k, path, where) for k in ("false_caption", "true_caption")],
        "correct": 1,
        "category": category,
        "split": bucket_split(hash_bucket(image)),
    }


def build_relation(root: Path) -> pd.DataFrame:
    """VG-Relation manifest from ``root/visual_genome_relation.json``; ``relation_name`` must
    be a non-empty string (it is the macro's group key)."""
    path = require_file(root, "visual_genome_relation.json", VG_SOURCE)
    rows = [
        {**_vg_row(d, i, path, "relation"), "relation_name": text_field(d, "relation_name", path, f"entry {i}")}
        for i, d in enumerate(read_json_list(path, source=VG_SOURCE))
    ]
    return pd.DataFrame(rows)


def build_attribution(root: Path) -> pd.DataFrame:
    """VG-Attribution manifest from ``root/visual_genome_attribution.json``; ``attributes``
    must be the official list of two non-empty strings, joined into the macro's group key."""
    path = require_file(root, "visual_genome_attribution.json", VG_SOURCE)
    rows = [
        {
            **_vg_row(d, i, path, "attribution"),
            "attr_pair": "_".join(string_list_field(d, "attributes", path, f"entry {i}", length=2)),
        }
        for i, d in enumerate(read_json_list(path, source=VG_SOURCE))
    ]
    return pd.DataFrame(rows)


def build_order(
    path: Path, tagger: str | OrderTagger = "auto", seed: int = 1, max_words: int = 30
) -> pd.DataFrame:
    """Order manifest from a BLIP annotation file: one row per (image, caption), 5 options."""
    data = read_json_list(path, source=BLIP_SOURCE)
    tg = resolve_tagger(tagger)
    shuffler = TextShuffler(tg, seed)
    rows = []
    for i, ann in enumerate(data):
        where = f"entry {i}"
        captions = (
            [text_field(ann, "caption", path, where)]
            if isinstance(ann.get("caption"), str)
            else string_list_field(ann, "caption", path, where)
        )
        if not captions:  # the image would add no item, without a word
            raise field_error(ann, "caption", [], path, where, "a caption or a non-empty list of captions")
        image = text_field(ann, "image", path, where)
        for j, caption in enumerate(captions):
            item = f"order/{i}/{j}"
            rows.append(
                {
                    "item_id": item,
                    "image": relative_image_path(image, item),
                    "captions": shuffler.options(caption, max_words),
                    "correct": 0,
                    "category": "order",
                    "order_tagger": tg.name,
                }
            )
    return pd.DataFrame(rows)


def _order_suite(file: str):
    def build_manifest(root: Path) -> pd.DataFrame:
        return build_order(require_file(root, file, BLIP_SOURCE))

    return build_manifest


# ---------------------------------------------------------------------------- metrics


def _split_rows(manifest: pd.DataFrame) -> dict[str, np.ndarray]:
    """``{split: [n] bool}`` for each of :data:`~pipeline.benchmarks.base.SPLITS` that has
    rows in the manifest's ``split`` column (none without the column)."""
    if "split" not in manifest:
        return {}
    split = manifest["split"].astype(str).to_numpy()
    return {s: split == s for s in SPLITS if (split == s).any()}


def _macro(correct: np.ndarray, group: np.ndarray, keep: np.ndarray) -> Units:
    """Units of the macro accuracy over ``group`` on the rows ``keep``."""
    return Units(correct[keep], groups=group[keep])


def relation_units(
    manifest: pd.DataFrame, scores: np.ndarray, excluded: frozenset[str] | None = None
) -> dict[str, Units]:
    """``relation`` (macro over relation names not in ``excluded``; default the official
    list), ``relation-micro`` (ours, all items) and ``relation-<split>`` (the macro on each
    split present); argmax-first, so a tie is wrong."""
    excluded = excluded_relations() if excluded is None else excluded
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    rel = manifest["relation_name"].to_numpy()
    keep = ~np.isin(rel, list(excluded))
    units = {"relation": _macro(correct, rel, keep), "relation-micro": Units(correct)}
    for split, rows in _split_rows(manifest).items():
        if (keep & rows).any():
            units[f"relation-{split}"] = _macro(correct, rel, keep & rows)
    return units


def _frequent(keys: np.ndarray, min_count: int) -> np.ndarray:
    """[n] bool: rows whose key occurs at least ``min_count`` times among ``keys``."""
    counts = pd.Series(keys).value_counts()
    return np.isin(keys, counts.index[counts >= min_count].to_numpy())


def attribution_units(
    manifest: pd.DataFrame, scores: np.ndarray, min_count: int = 25
) -> dict[str, Units]:
    """``attribution`` (macro over attribute pairs with at least ``min_count`` items),
    ``attribution-micro`` (ours, all items) and ``attribution-<split>`` (the macro on each
    split present, over the pairs with ``min_count`` items *in the split*); argmax-first,
    so a tie is wrong."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    pair = manifest["attr_pair"].to_numpy()
    units = {
        "attribution": _macro(correct, pair, _frequent(pair, min_count)),
        "attribution-micro": Units(correct),
    }
    for split, rows in _split_rows(manifest).items():
        keep = np.zeros(len(pair), dtype=bool)
        keep[rows] = _frequent(pair[rows], min_count)
        if keep.any():
            units[f"attribution-{split}"] = _macro(correct, pair, keep)
    return units


def order_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """``P@1``: the original caption (index 0) wins by argmax-first, so a tie is right."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    return {"P@1": Units(correct)}


# ---------------------------------------------------------------------------- registration

SUITES.register(
    "aro-relation",
    Suite(
        name="aro-relation",
        task="choice",
        build_manifest=build_relation,
        units=relation_units,
        metric_names=("relation", "relation-micro", *(f"relation-{s}" for s in SPLITS)),
        headline="relation",
        categories=("relation",),
        description="ARO VG-Relation: root holds visual_genome_relation.json; image root = root/images/ (the cropped VG images)",
    ),
)
SUITES.register(
    "aro-attribution",
    Suite(
        name="aro-attribution",
        task="choice",
        build_manifest=build_attribution,
        units=attribution_units,
        metric_names=("attribution", "attribution-micro", *(f"attribution-{s}" for s in SPLITS)),
        headline="attribution",
        categories=("attribution",),
        description="ARO VG-Attribution: root holds visual_genome_attribution.json; image root = root/images/ (the cropped VG images)",
    ),
)
for _name, _file, _images in (
    ("aro-coco-order", "coco_karpathy_test.json", "COCO 2014 root (val2014/...)"),
    ("aro-flickr-order", "flickr30k_test.json", "Flickr30k root (flickr30k-images/...)"),
):
    SUITES.register(
        _name,
        Suite(
            name=_name,
            task="choice",
            build_manifest=_order_suite(_file),
            units=order_units,
            metric_names=("P@1",),
            headline="P@1",
            categories=("order",),
            generated_options=True,  # the official perturbations, which can reproduce the caption
            description=f"ARO {_name.split('-')[1].capitalize()}-Order: root holds BLIP's {_file}; images = {_images}",
        ),
    )
