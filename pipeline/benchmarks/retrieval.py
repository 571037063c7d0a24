"""Text -> image retrieval: the metric every retrieval suite shares, and the object columns
the geometry-aware rerankers read.

Metric (single relevant image per query, binary relevance): ties are pessimistic,
``rank = 1 + #{gallery images other than the target scoring >= the target}``;
``R@k = [rank <= k]``, ``nDCG@10 = 1 / log2(1 + rank)`` if ``rank <= 10`` else 0 (the ideal
DCG is 1) and ``mean-rank`` the mean of ``rank`` (lower is better; 1 is perfect).

Object columns (optional; written by the shapes world and by the COCO / Visual Genome
loaders, read by :mod:`pipeline.scorers.geometry`):

* ``object_names`` (list[str]): one phrase per annotated object of the row's image, e.g.
  ``"red circle"``; a caption column, so extract encodes each name once;
* ``object_boxes`` (str): JSON ``[[x0, y0, x1, y1], ...]`` parallel to ``object_names``,
  normalised to [0, 1] with y down (the patch grid's orientation);
* ``phrases`` (list[str]): the query caption's object phrases, a caption column too;
* ``relations`` (str): JSON ``[[i, relation, j], ...]`` over ``phrases``: phrase i stands in
  ``relation`` to phrase j (``left``, ``right``, ``above``, ``below`` in the shapes world;
  the caption's own relation words on real data).
* ``steer_pos`` / ``steer_neg`` (list[str], optional): the query's steering prompts, one
  contrast c+ / c- per entry (:mod:`pipeline.scorers.geometry.steering`); caption columns.
  ``steer_neg_absent`` (optional) holds another c- per entry, the shapes world's ``absent``
  contrast (:data:`STEERING_NEGATIVES`).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import Units, gallery_images

RETRIEVAL_METRICS = ("R@1", "R@5", "R@10", "nDCG@10", "mean-rank")
OBJECT_COLUMNS = ("object_names", "object_boxes", "phrases", "relations")
OBJECT_CAPTION_COLUMNS = ("object_names", "phrases")  # encoded at extract like captions
STEERING_NEGATIVES = {"swap": "steer_neg", "absent": "steer_neg_absent"}  # steering's contrast -> its c- column
STEERING_COLUMNS = ("steer_pos", *STEERING_NEGATIVES.values())  # caption columns too, where a suite writes them
LOWER_IS_BETTER = frozenset({"mean-rank"})


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


def query_ranks(manifest: pd.DataFrame, scores: np.ndarray) -> np.ndarray:
    """[n_queries] the rank of each query's (row's) own image in ``scores``:
    [n_queries, n_gallery] over ``gallery_images(manifest)`` (:func:`target_ranks`)."""
    gallery = {img: j for j, img in enumerate(gallery_images(manifest))}
    if np.shape(scores) != (len(manifest), len(gallery)):
        raise ValueError(
            f"retrieval scores have shape {np.shape(scores)}, expected {(len(manifest), len(gallery))}"
        )
    return target_ranks(scores, np.array([gallery[img] for img in manifest["image"]]))


def retrieval_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """R@1, R@5, R@10, nDCG@10 and mean-rank, one unit per query (row); ``scores``:
    [n_queries, n_gallery] over ``gallery_images(manifest)``."""
    rank = query_ranks(manifest, scores)
    units = {f"R@{k}": Units((rank <= k).astype(float)) for k in (1, 5, 10)}
    units["nDCG@10"] = Units(np.where(rank <= 10, 1.0 / np.log2(1.0 + rank), 0.0))
    units["mean-rank"] = Units(rank.astype(float))
    return units


def parse_boxes(cell: str | None) -> np.ndarray:
    """[n, 4] float boxes of one ``object_boxes`` cell (empty [0, 4] for None/"")."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)) or cell == "":
        return np.zeros((0, 4))
    boxes = np.asarray(json.loads(cell), dtype=float).reshape(-1, 4)
    if ((boxes < -1e-6) | (boxes > 1 + 1e-6)).any() or (boxes[:, 2:] < boxes[:, :2]).any():
        raise ValueError(f"object_boxes must be normalised [x0, y0, x1, y1] with x0 <= x1, y0 <= y1: {cell[:80]}")
    return boxes


def parse_relations(cell: str | None, n_phrases: int) -> list[tuple[int, str, int]]:
    """``[(i, relation, j), ...]`` of one ``relations`` cell, indices checked against the
    row's ``n_phrases``."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)) or cell == "":
        return []
    out = []
    for i, rel, j in json.loads(cell):
        if not (0 <= int(i) < n_phrases and 0 <= int(j) < n_phrases) or int(i) == int(j):
            raise ValueError(f"relation {[i, rel, j]} does not join two of the row's {n_phrases} phrases")
        out.append((int(i), str(rel), int(j)))
    return out
