"""Coupling pictures: which words an edit touches, and where each one's plan row sits.

* :func:`edited_words`: the content words the edit from one caption to the other touches
  (moved words for a swap, the word-level diff otherwise);
* :func:`coupling_maps`: each edited word's plan row over the patches, in both captions of
  an item, with the object the word alone names -- what the report's coupling figure draws.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.scorers.bindclip.diagnostics import (
    explain_true_vs_negative,
    patch_distribution,
    unique_referent,
    word_kind,
    word_row,
)

GRAMMAR_WORDS = frozenset({"a", "an", "the", "there", "is", "are", "of", "in", "to", "and", "with", "by", "than"})  # never "edited"


def edited_words(a: str, b: str) -> tuple[list[int], list[int]]:
    """Indices (in ``str.split()``) of the content words that the edit from caption ``a`` to ``b`` touches.

    A *swap* (both captions hold the same words, "a" / "an" aside) moves words without
    changing them. The moved words are found among the attribute and object words
    (:func:`word_kind` other than ``other``; every word outside :data:`GRAMMAR_WORDS` when
    the captions have none), compared in their order: "a red circle and a blue square" ->
    "a blue circle and a red square" gives ``red``, ``blue`` in each caption, and "a small
    purple diamond left of a yellow square" -> "a yellow square left of a small purple
    diamond" every word of both noun phrases, not ``left``. Any other edit is read from the
    word-level diff (:class:`difflib.SequenceMatcher`): a replacement touches the replaced
    words, an addition the added ones ("a picture of a red circle" -> "a red circle and a
    star": ``picture`` and ``star``). Words of :data:`GRAMMAR_WORDS` are never edited.
    """
    wa, wb = a.split(), b.split()
    if sorted("a" if w == "an" else w for w in wa) == sorted("a" if w == "an" else w for w in wb):

        def slots(ws: list[str]) -> list[int]:
            named = [i for i, w in enumerate(ws) if word_kind(w) != "other"]
            return named or [i for i, w in enumerate(ws) if w not in GRAMMAR_WORDS]

        moved = [(i, j) for i, j in zip(slots(wa), slots(wb), strict=True) if wa[i] != wb[j]]
        return [i for i, _ in moved], [j for _, j in moved]
    ea, eb = [], []
    for op, i0, i1, j0, j1 in difflib.SequenceMatcher(a=wa, b=wb, autojunk=False).get_opcodes():
        if op != "equal":
            ea += range(i0, i1)
            eb += range(j0, j1)
    return [i for i in ea if wa[i] not in GRAMMAR_WORDS], [j for j in eb if wb[j] not in GRAMMAR_WORDS]


@torch.no_grad()
def coupling_maps(scorer, store, manifest: pd.DataFrame, index: dict[str, np.ndarray], items) -> list[dict[str, Any]]:
    """Each edited word's plan row over the patch grid, in both captions of each item.

    ``items``: row numbers of a two-caption choice suite (``manifest`` / ``index``). Every
    item is scored once as ``s(I, true, negative)`` with ``BindClip.explain``; for each
    caption (true first) and each of its :func:`edited_words`, the word's first BPE row of
    the plan over the non-null cells, depths summed, is returned as ``rho`` ([grid_h,
    grid_w], normalised to sum 1) with ``grounded``, the share of the row's mass off the
    null patch, and ``box``, the box (x0, y0, x1, y1 in [0, 1]) of the one object of the
    scene the word alone names (its colour, shape or size; ``None`` when no single object
    does, or without a ``scene`` column).
    """
    items = np.asarray(items, dtype=np.int64)
    if not len(items):
        return []
    correct, ex = explain_true_vs_negative(scorer, store, manifest, index, items)
    n, (gh, gw) = ex.token_mask.shape[2], tuple(ex.grid)
    out = []
    for j, i in enumerate(items):
        row = manifest.iloc[int(i)]
        texts = [row["captions"][correct[j]], row["captions"][1 - correct[j]]]
        objects = json.loads(row["scene"])["objects"] if "scene" in manifest else []
        captions = []
        for x, (text, words) in enumerate(zip(texts, edited_words(*texts), strict=True)):
            split = text.split()
            maps = []
            for w in words:
                r = word_row(ex, j, x * n, text, w)
                if r is None:  # truncated away
                    continue
                ref = unique_referent(objects, split[w])
                maps.append({
                    "word": split[w],
                    "position": w,
                    "rho": patch_distribution(ex, j, r).reshape(gh, gw).numpy(),
                    "grounded": float(ex.plan[j, r, :-1].sum() / ex.plan[j, r].sum().clamp_min(1e-12)),
                    "box": tuple(objects[ref]["box"]) if ref is not None else None,
                })
            captions.append({"text": text, "words": maps})
        out.append({"item": int(i), "image": row["image"], "category": row.get("category"), "score": float(ex.score[j]), "captions": captions})
    return out
