"""SugarCrepe++ (Dumpala et al., NeurIPS 2024 D&B): loader and official metrics.

Official files (github.com/Sri-Harsha/scpp ``data/``, CC BY 4.0): one JSON *list* per
category, ``<root>/{replace_att,replace_obj,replace_rel,swap_att,swap_obj}.json`` (no add_*
categories), each entry ``{"id", "filename", "caption", "caption2", "negative_caption"}``.
Images are COCO val2017 (``filename`` relative to that folder). The manifest's ``captions``
are ``[P1, P2, N]`` (``correct`` = 0, the first positive).

Official metrics (``VLMs/test_Variants_CLIP.py``, ``evaluate_ulms.py``), strict ``>``,
per category, no aggregate:

* ITT (image-to-text, the headline): ``s(I,P1) > s(I,N)  and  s(I,P2) > s(I,N)``;
* TOT (text-only): ``cos(P1,P2) > cos(P1,N)  and  cos(P1,P2) > cos(P2,N)``.

The suite's ``units`` computes ITT from the ``[n, 3]`` option scores. A per-caption
scorer's are ``s(I, P1), s(I, P2), s(I, N)``. A pairwise scorer's are its preferences over
N, ``s(I, P1, N), s(I, P2, N), 0`` (``pairwise_reference = 2``:
:func:`pipeline.scorers.base.option_scores`), so the same test is the official one for it,
``s(I, P1, N) > 0 and s(I, P2, N) > 0``, and not a comparison of mean preferences (in which
``s(I, P2, P1)`` would enter). TOT needs caption-caption similarities, which the scorer
interface does not produce: the score stage supplies the unit text embeddings of P1, P2
and N to ``tot_accuracy`` / ``tot_units``. ``total`` (item-pooled ITT over the categories
present) is ours.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import SUITES, Suite, Units
from pipeline.benchmarks.intake import integer_field, read_json, relative_image_path, text_field
from pipeline.benchmarks.sugarcrepe import read_present_categories

CATEGORIES = ("replace-obj", "replace-att", "replace-rel", "swap-obj", "swap-att")
METRIC_NAMES = (*CATEGORIES, "total")
SOURCE = "download data/<category>.json from github.com/Sri-Harsha/scpp"


def read_category(path: Path, category: str) -> pd.DataFrame:
    """One official category file -> manifest rows (list order).

    Raises:
        ValueError: naming ``path``: not a JSON list, no entry in it (``[]``), an entry
            without one of its fields, an ``id`` that is not a JSON integer, or two entries
            with one ``id`` (the item id is built from it, so the manifest would list one
            item twice).
    """
    data = read_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list (SugarCrepe++ format)")
    if not data:
        raise ValueError(f"{path}: holds no entry (an empty JSON list); replace it with the official file: {SOURCE}")
    rows = []
    for i, v in enumerate(data):
        ident = integer_field(v, "id", path, f"entry {i}") if isinstance(v, dict) and "id" in v else i
        item = f"{category}/{ident}"
        rows.append(
            {
                "item_id": item,
                "image": relative_image_path(text_field(v, "filename", path, f"item {item}"), item),
                "captions": [text_field(v, k, path, f"item {item}") for k in ("caption", "caption2", "negative_caption")],
                "correct": 0,
                "category": category,
            }
        )
    df = pd.DataFrame(rows)
    repeated = df["item_id"][df["item_id"].duplicated()].unique().tolist()
    if repeated:
        shown = ", ".join(map(str, repeated[:5])) + (" ..." if len(repeated) > 5 else "")
        raise ValueError(
            f"{path}: {len(repeated)} id(s) appear in more than one entry (items {shown}); "
            f"each entry needs its own id, or the manifest would list one item twice: fix the file"
        )
    return df


def build_manifest(root: Path, categories: tuple[str, ...] = CATEGORIES) -> pd.DataFrame:
    """All official category files present under ``root`` (warns about missing ones)."""
    return read_present_categories(root, categories, read_category, "SugarCrepe++", SOURCE)


# ---------------------------------------------------------------------------- metrics


def itt_correct(scores: np.ndarray) -> np.ndarray:
    """[n] bool, ITT: both positives strictly beat the negative. ``scores``: [n, 3] = (P1, P2, N),
    per-caption scores or a pairwise scorer's ``(s(I, P1, N), s(I, P2, N), 0)``."""
    return (scores[:, 0] > scores[:, 2]) & (scores[:, 1] > scores[:, 2])


def tot_correct(p1: np.ndarray, p2: np.ndarray, n: np.ndarray) -> np.ndarray:
    """[n] bool, TOT: ``cos(P1,P2)`` strictly beats ``cos(P1,N)`` and ``cos(P2,N)``.

    Args:
        p1, p2, n: [n_items, D] unit-normalised text embeddings of P1, P2 and N.
    """
    s12 = np.sum(p1 * p2, axis=1)  # [n_items]
    s1n = np.sum(p1 * n, axis=1)
    s2n = np.sum(p2 * n, axis=1)
    return (s12 > s1n) & (s12 > s2n)


def tot_units(p1: np.ndarray, p2: np.ndarray, n: np.ndarray) -> Units:
    """TOT as units (one per item); slice the rows by category for per-category TOT."""
    return Units(tot_correct(p1, p2, n).astype(float))


def tot_accuracy(p1: np.ndarray, p2: np.ndarray, n: np.ndarray) -> float:
    """Official text-only (TOT) accuracy on unit text embeddings [n_items, D] each."""
    return tot_units(p1, p2, n).statistic()


def sugarcrepe_pp_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """ITT per category (official) and item-pooled ``total`` (ours); ``scores``: [n, 3]."""
    correct = itt_correct(np.asarray(scores, dtype=float)).astype(float)
    cat = manifest["category"].to_numpy()
    units = {c: Units(correct[cat == c]) for c in CATEGORIES if (cat == c).any()}
    units["total"] = Units(correct)
    return units


def sugarcrepe_pp_text_units(manifest: pd.DataFrame, text: np.ndarray) -> dict[str, Units]:
    """TOT per category (``TOT-<category>``) and pooled (``TOT``) from unit caption
    embeddings ``text`` [n, 3, D] ordered (P1, P2, N)."""
    correct = tot_correct(text[:, 0], text[:, 1], text[:, 2]).astype(float)
    cat = manifest["category"].to_numpy()
    units = {f"TOT-{c}": Units(correct[cat == c]) for c in CATEGORIES if (cat == c).any()}
    units["TOT"] = Units(correct)
    return units


SUITES.register(
    "sugarcrepe-pp",
    Suite(
        name="sugarcrepe-pp",
        task="choice",
        build_manifest=build_manifest,
        units=sugarcrepe_pp_units,
        text_units=sugarcrepe_pp_text_units,
        pairwise_reference=2,  # a pairwise scorer's P1 and P2 are each compared with N
        metric_names=METRIC_NAMES,
        headline="total",
        categories=CATEGORIES,
        category_files=True,  # a missing category file is skipped; the manifest records it
        description=(
            "SugarCrepe++ (ITT): root is the repository's data/ folder, holding {replace_att,"
            "replace_obj,replace_rel,swap_att,swap_obj}.json; images = COCO val2017 folder"
        ),
    ),
)
