"""SugarCrepe (Hsieh et al., NeurIPS 2023 D&B): loader and official metric.

Official files (github.com/RAIVNLab/sugar-crepe ``data/``, MIT): one JSON object per
category, ``<root>/{add_att,add_obj,replace_att,replace_obj,replace_rel,swap_att,swap_obj}.json``,
keyed by string indices, each value ``{"filename", "caption", "negative_caption"}``. Images
are COCO val2017: the manifest ``image`` is the official ``filename``, relative to the
val2017 image folder.

Official metric (``main_eval.py``): per category, the share of items whose positive caption
scores *strictly* higher than the negative (a tie is wrong); no aggregate. Ours, labelled
as such, since papers aggregate both ways: ``total`` (item-pooled over the categories
present: replace-obj and add-obj weigh 49% on the official files) and ``category-mean``
(the unweighted mean of the categories present); the length-matched slices
``add-obj-length-matched`` / ``add-att-length-matched`` (items whose two captions have the
same number of CLIP BPE tokens, the BindCLIP control; 28 and 7 items on the official files)
and ``length-matched``, the two pooled (the 35 items BindCLIP's seed reports on).

The metric functions here are shared with ``shapes-sugarcrepe`` (``pipeline.benchmarks.shapes``).
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import SUITES, Suite, Units, choice_correct
from pipeline.benchmarks.intake import nearby_root, read_json, relative_image_path, text_field

CATEGORIES = (
    "replace-obj",
    "replace-att",
    "replace-rel",
    "swap-obj",
    "swap-att",
    "add-obj",
    "add-att",
)
LENGTH_MATCHED = ("add-obj-length-matched", "add-att-length-matched")  # ours
METRIC_NAMES = (*CATEGORIES, "total", "category-mean", "length-matched", *LENGTH_MATCHED)
SOURCE = "download data/<category>.json from github.com/RAIVNLab/sugar-crepe"


def file_name(category: str) -> str:
    """``replace-obj`` -> ``replace_obj.json`` (the official file of a category)."""
    return category.replace("-", "_") + ".json"


# ---------------------------------------------------------------------------- tokens


@lru_cache(maxsize=1)
def _bpe():
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer()


def bpe_length(text: str) -> int:
    """Number of OpenAI CLIP BPE tokens of ``text`` without SOT/EOT (open_clip's
    ``SimpleTokenizer.encode``, which cleans and lowercases first)."""
    return len(_bpe().encode(text))


def length_matched(pos: list[str], neg: list[str]) -> np.ndarray:
    """[n] bool: positive and negative have the same BPE length."""
    return np.array([bpe_length(p) == bpe_length(q) for p, q in zip(pos, neg, strict=True)])


# ---------------------------------------------------------------------------- loader


def read_category(path: Path, category: str) -> pd.DataFrame:
    """One official category file -> manifest rows (JSON order).

    Raises:
        ValueError: naming ``path``: not a JSON object, no item in it (``{}``: a failed
            download would otherwise surface as a bare missing column), or an item without
            its ``filename``, ``caption`` or ``negative_caption``.
    """
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by index (SugarCrepe format)")
    if not data:
        raise ValueError(f"{path}: holds no item (an empty JSON object); replace it with the official file: {SOURCE}")
    rows = []
    for key, v in data.items():
        item = f"{category}/{key}"
        rows.append(
            {
                "item_id": item,
                "image": relative_image_path(text_field(v, "filename", path, f"item {item}"), item),
                "captions": [text_field(v, "caption", path, f"item {item}"), text_field(v, "negative_caption", path, f"item {item}")],
                "correct": 0,
                "category": category,
            }
        )
    return pd.DataFrame(rows)


def read_present_categories(
    root: Path, categories: tuple[str, ...], read, benchmark: str, source: str
) -> pd.DataFrame:
    """Concatenate ``read(path, category)`` over the official category files present under
    ``root``; warn about missing ones (the manifest records them:
    :meth:`~pipeline.benchmarks.base.Suite.category_coverage`), fail if none is there, naming
    the folder one level off ``root`` that holds them (:func:`nearby_root`) where there is one.

    The warning is attributed to ``root`` rather than to a line of code, so Python prints it
    as one line (``<root>:0: UserWarning: ...``) without echoing a source line: it is about
    the user's folder, and the ``pipeline manifest`` command shows it as it is.
    """
    root = Path(root)
    present = [c for c in categories if (root / file_name(c)).is_file()]
    missing = [file_name(c) for c in categories if c not in present]
    if not present:
        near = nearby_root(root, [file_name(c) for c in categories])
        hint = f"; they are under {near}: give that folder as the root" if near is not None else f"; {source}"
        raise FileNotFoundError(f"no {benchmark} file found directly in {root} (expected {', '.join(missing)}){hint}")
    if missing:
        warnings.warn(
            f"{benchmark}: {root} lacks {', '.join(missing)}; those categories are skipped, and every aggregate "
            f"covers only the {len(present)} of {len(categories)} present, as the manifest, every metrics file and "
            f"the report record ({source})",
            stacklevel=3,
        )
    return pd.concat([read(root / file_name(c), c) for c in present], ignore_index=True)


def build_manifest(root: Path, categories: tuple[str, ...] = CATEGORIES) -> pd.DataFrame:
    """All official category files present under ``root`` (warns about missing ones)."""
    m = read_present_categories(root, categories, read_category, "SugarCrepe", SOURCE)
    m["length_matched"] = length_matched(
        [c[0] for c in m["captions"]], [c[1] for c in m["captions"]]
    )
    return m


# ---------------------------------------------------------------------------- metric


def sugarcrepe_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """Per-category accuracy with strict ``>`` (official); the item-pooled ``total``, the
    unweighted ``category-mean`` and the length-matched slices (ours). ``scores``: [n, 2] for
    [pos, neg]."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="wrong").astype(float)
    cat = manifest["category"].to_numpy()
    units = {c: Units(correct[cat == c]) for c in CATEGORIES if (cat == c).any()}
    units["total"] = Units(correct)
    units["category-mean"] = Units(correct, groups=cat)
    if "length_matched" in manifest:
        lm = manifest["length_matched"].to_numpy(bool) & np.isin(cat, ("add-obj", "add-att"))
        if lm.any():  # an empty slice reports nothing rather than NaN
            units["length-matched"] = Units(correct[lm])
        for c in ("add-obj", "add-att"):
            if ((cat == c) & lm).any():
                units[f"{c}-length-matched"] = Units(correct[(cat == c) & lm])
    return units


SUITES.register(
    "sugarcrepe",
    Suite(
        name="sugarcrepe",
        task="choice",
        build_manifest=build_manifest,
        units=sugarcrepe_units,
        metric_names=METRIC_NAMES,
        headline="total",
        categories=CATEGORIES,
        category_files=True,  # a missing category file is skipped; the manifest records it
        description=(
            "SugarCrepe: root is the repository's data/ folder, holding {add_att,add_obj,replace_att,"
            "replace_obj,replace_rel,swap_att,swap_obj}.json; images = COCO val2017 folder"
        ),
    ),
)
