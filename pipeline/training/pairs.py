"""A pair suite's features in memory: what every family's training step gathers from.

    from pipeline.training.pairs import load_pairs
    train = load_pairs(store, "shapes-train")     # PairData: [n] item arrays, fp16 features

A pair suite (shapes-train / shapes-dev, the COCO 8-family builder) has one true and one
hard-negative caption per item, and optionally a counterfactual image for which the
negative is true, a mirrored image with mirrored captions, and a paraphrase of the true
caption. Its frozen features are read from the store ONCE (sorted unique rows, in blocks
converted to fp16 one at a time) and kept in memory in fp16, so a step is a gather, not a
store read. A seeded sample of the selected rows (``SuiteSelection.sampled``; the training
loop's ``train_items`` / ``dev_items``) bounds that memory on a large suite. The store keeps
the pooled embeddings in float32, so the dev figures a checkpoint is selected on
(``config.json``'s ``dev``) can differ by an item or so from the score stage's metrics of
the same suite, which read them as stored.

The suite may be a selection of its rows by a manifest column
(:class:`~pipeline.benchmarks.base.SuiteSelection`): ``coco-families[train]`` and
``coco-families[validation]`` are the image-disjoint training and development pairs of
one extracted suite (its ``split`` column is a hash of the image path), so no image is
read by both. Only the selected rows' features are read.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.benchmarks.base import SuiteSelection, extracted_items
from pipeline.benchmarks.coco_families import FAMILIES
from pipeline.cache import FeatureStore, distinct_rows
from pipeline.features import ImageFeatures, TextFeatures
from pipeline.manifests import file_sha256, read_manifest


@dataclass
class PairData:
    """One suite's [pos, neg] pairs with their features, in memory (fp16).

    Item arrays index into ``images`` / ``texts`` (the suite's distinct store rows, in order of
    first appearance); -1 marks a missing column value (e.g. no paraphrase).
    """

    manifest: Any  # pandas DataFrame of the suite
    images: ImageFeatures  # [U_i] unique images
    texts: TextFeatures  # [U_t] unique captions
    image: torch.Tensor  # [n] I
    cf: torch.Tensor  # [n] I' (counterfactual, the negative is true)
    flip: torch.Tensor  # [n] mirrored I
    pos: torch.Tensor  # [n]
    neg: torch.Tensor  # [n]
    flip_pos: torch.Tensor  # [n]
    flip_neg: torch.Tensor  # [n]
    para: torch.Tensor  # [n] paraphrase of pos
    family: torch.Tensor  # [n] index into FAMILIES

    def __len__(self) -> int:
        return len(self.image)


READ_BLOCK = 512  # store rows converted to fp16 at a time (ViT-L-14-336: ~2.4 GB of float32 image grids)


def _half(x: ImageFeatures | TextFeatures):
    cls = type(x)
    return cls(
        **{
            f.name: (v.half() if v.is_floating_point() else v)
            for f in dataclasses.fields(x)
            for v in [getattr(x, f.name)]
        }
    )


def _column(index: dict[str, np.ndarray], name: str, n: int, width: int = 1) -> np.ndarray:
    """[n, width] store rows of a suite column, -1 where absent."""
    if name not in index:
        return np.full((n, width), -1, dtype=np.int64)
    rows = np.asarray(index[name], dtype=np.int64)
    return rows.reshape(n, -1)


def _read_half(read, rows: np.ndarray):
    """``read(rows)`` (``store.images`` / ``store.texts``) in fp16, in ``rows``' order.

    The rows are read in ascending store order, :data:`READ_BLOCK` at a time, and each block
    is put back at its rows' positions: a block then spans one stretch of the store, which
    the reader fetches in a few contiguous slices (blocks in the rows' own order scatter over
    the whole store and re-read its chunks), and the float32 copy the store returns never
    exceeds one block. The values do not depend on the order they are read in.
    """
    rows = np.asarray(rows, dtype=np.int64)
    order = np.argsort(rows, kind="stable")  # [U] positions of rows in ascending store order
    out: dict[str, torch.Tensor] = {}
    cls = None
    for i in range(0, max(len(rows), 1), READ_BLOCK):
        at = torch.from_numpy(order[i : i + READ_BLOCK])
        part = _half(read(rows[order[i : i + READ_BLOCK]]))
        cls = type(part)
        for f in dataclasses.fields(part):
            v = getattr(part, f.name)
            if f.name not in out:
                out[f.name] = v.new_empty((len(rows), *v.shape[1:]))
            out[f.name][at] = v
    return cls(**out)


def load_pairs(store: FeatureStore, suite: str | SuiteSelection) -> PairData:
    """Read every feature of ``suite``'s pairs, each distinct image and caption once, in order
    of first appearance (:func:`~pipeline.cache.distinct_rows`).

    ``suite`` is a suite name or a selection of its rows (``coco-families[train]``,
    ``suite[column=value]``, possibly cut to a seeded sample;
    :class:`~pipeline.benchmarks.base.SuiteSelection`); the manifest of the result holds
    the selected rows only, renumbered from 0. Pairs whose image was skipped at extract
    (missing or unreadable; row -1) are left out with a warning counting them: a pair is
    trained and selected on with its own image or not at all.

    Refuses a suite whose index is older than its manifest, one without a ``family``
    column, one with families outside :data:`~pipeline.benchmarks.coco_families.FAMILIES`
    and a selection whose column or value the manifest lacks.
    """
    selection = SuiteSelection.parse(suite)
    suite = selection.suite
    attrs = store.suite_attrs(suite) if suite in store.suites() else {}
    index = store.suite_index(suite)  # raises naming the extract command when absent
    path = Path(attrs.get("manifest", ""))
    if not path.is_file():
        raise FileNotFoundError(
            f"manifest of {suite} not found at {str(path)!r}; run `pipeline world`"
        )
    store.suite_index(suite, manifest_sha256=file_sha256(path))  # refuse a stale index
    m = read_manifest(path)
    keep = selection.mask(m)  # [n_all] the selected rows
    without_image = keep & ~extracted_items(index)
    if without_image.any():  # skipped at extract: no image to train or select on
        warnings.warn(
            f"{suite}: {int(without_image.sum())} of {int(keep.sum())} pairs have no image (skipped at "
            "extract) and are left out of training and dev selection",
            stacklevel=2,
        )
        keep &= ~without_image
        if not keep.any():
            raise ValueError(f"{suite}: no pair has an extracted image; rerun `pipeline extract`")
    index = {k: np.asarray(v)[keep] for k, v in index.items()}  # every column is per item
    m = m[keep].reset_index(drop=True)
    n = len(m)
    if "family" not in m:
        raise ValueError(
            f"{suite} has no `family` column; train on shapes-train / coco-families style suites"
        )
    unknown = sorted(set(m["family"]) - set(FAMILIES))
    if unknown:
        raise ValueError(f"{suite}: unknown families {unknown}; valid: {', '.join(FAMILIES)}")

    correct = m["correct"].to_numpy().astype(np.int64)  # [n]
    caps = _column(index, "captions", n)  # [n, 2]
    pos, neg = caps[np.arange(n), correct], caps[np.arange(n), 1 - correct]
    fcaps = _column(index, "flip_captions", n, 2)
    fpos, fneg = fcaps[np.arange(n), correct], fcaps[np.arange(n), 1 - correct]
    img_cols = {c: _column(index, c, n)[:, 0] for c in ("image", "cf_image", "flip_image")}
    para = _column(index, "paraphrase", n)[:, 0]

    # local indices in order of first appearance, not of store rows (distinct_rows): a batch's
    # images and captions, and so every float sum over them, are the same in a fresh store and a grown one
    img_rows, img_local = distinct_rows(np.stack([img_cols["image"], img_cols["cf_image"], img_cols["flip_image"]]))
    txt_rows, txt_local = distinct_rows(np.stack([pos, neg, fpos, fneg, para]))
    local = torch.from_numpy
    return PairData(
        manifest=m,
        images=_read_half(store.images, img_rows),
        texts=_read_half(store.texts, txt_rows),
        image=local(img_local[0]),
        cf=local(img_local[1]),
        flip=local(img_local[2]),
        pos=local(txt_local[0]),
        neg=local(txt_local[1]),
        flip_pos=local(txt_local[2]),
        flip_neg=local(txt_local[3]),
        para=local(txt_local[4]),
        family=torch.tensor([FAMILIES.index(f) for f in m["family"]], dtype=torch.long),
    )


def pair_decisions(s: np.ndarray, manifest) -> np.ndarray:
    """``[n, 2]`` option scores ``(s, -s)`` in the manifest's caption order, from the
    pairwise preferences ``s = s(I, pos, neg)``: what the suite's official metric takes."""
    correct = manifest["correct"].to_numpy()
    return np.where(correct[:, None] == 0, np.stack([s, -s], 1), np.stack([-s, s], 1))
