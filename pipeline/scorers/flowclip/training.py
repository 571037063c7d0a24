"""Flow-CLIP's training hook: HNB (and, for ``flowclip-cimr``, CIMR) on a cached pair suite.

The loop (:mod:`pipeline.training.loop`) calls :class:`FlowClipTrainer`. A step of B items
(:func:`hnb_batch`) gathers the batch's U distinct images (identity = the item's image row;
items showing one image share one softmax candidate, not several *(ours)*) and its Nt captions ``[pos (B); neg (B); paraphrases (P)]`` from the in-memory
:class:`~pipeline.training.pairs.PairData`, scores every image against every caption in
one ``score_matrix`` pass and reads both objectives from that one [U, Nt] matrix
(:mod:`pipeline.scorers.flowclip.objectives`):

* HNB on the logits ``t · S``; t is CLIP's own logit scale (``Projections.logit_scale``,
  the model's ``logit_scale`` buffer), fixed, unless ``logit_scale`` is given *(ours: a
  learned temperature could shrink every margin at no cost to the ranking)*;
* CIMR on ``m = t · (S[I, pos] - S[I, neg])`` against the same captions on the donor (the
  next batch item of another identity): margins in the same logit units as HNB, so that
  γ is one logit-scale margin and softplus saturates *(ours)*.

``total = HNB + cimr_weight · CIMR`` (CIMR only for ``flowclip-cimr``). The dev metric scores
both captions of every dev item per caption (``score``) in the manifest's caption order
and hands ``[n, 2]`` to the suite's official metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import SuiteSelection
from pipeline.cache import FeatureStore
from pipeline.config import family_options
from pipeline.scorers.base import option_scores
from pipeline.scorers.flowclip.model import FlowClip
from pipeline.scorers.flowclip.objectives import caption_positives, cimr, donor_index, hnb
from pipeline.training.pairs import PairData, load_pairs
from pipeline.training.trainer import FamilyTrainer

EVAL_BATCH = 256  # dev items per scoring forward pass
CIMR_OPTIONS = ("cimr_weight", "gamma")


@dataclass
class FlowClipObjective:
    """Flow-CLIP's objective options (``train.<variant>.objective`` in ``params.yaml``)."""

    logit_scale: float | None = None  # HNB/CIMR logit scale t on scores; None = CLIP's own (fixed; ours)
    paraphrases: bool = True  # each item's paraphrase joins the batch captions as an extra positive (ours: the seed's several positives per identity)
    cimr_weight: float = 1.0  # weight of CIMR in the total (flowclip-cimr only)
    gamma: float = 1.0  # CIMR margin γ in logit units (ours)

    def __post_init__(self) -> None:
        if self.logit_scale is not None and not self.logit_scale > 0:
            raise ValueError(f"logit_scale must be > 0 or None (CLIP's own), got {self.logit_scale!r}")
        if not self.cimr_weight >= 0:
            raise ValueError(f"cimr_weight must be >= 0, got {self.cimr_weight!r}")
        if not math.isfinite(self.gamma):
            raise ValueError(f"gamma must be finite, got {self.gamma!r}")


@dataclass
class HnbBatch:
    """One step's images, captions and masks, as indices into a :class:`PairData`."""

    images: torch.Tensor  # [U] distinct image indices (identities), sorted
    item_image: torch.Tensor  # [B] row of `images` holding item b's image
    texts: torch.Tensor  # [Nt] text indices: pos (B), neg (B), paraphrases (P)
    positives: torch.Tensor  # [U, Nt] bool, caption k is true of image u
    queries: torch.Tensor  # [Nt] bool, text->image queries (pos and paraphrases)
    donor: torch.Tensor  # [B] donor item of each item (another identity), -1 if none

    @property
    def n_items(self) -> int:
        return len(self.item_image)


def hnb_batch(data: PairData, batch: torch.Tensor, paraphrases: bool = True) -> HnbBatch:
    """The HNB/CIMR layout of the items ``batch`` [B] (see the module docstring), on the
    device of ``data``'s index tensors (the loop moves them with the features)."""
    B = len(batch)
    identity = data.image[batch]  # [B] the item's image row is its identity
    dev = identity.device
    images, item_image = torch.unique(identity, return_inverse=True)  # [U], [B]
    para = data.para[batch]  # [B], -1 where absent
    with_para = torch.nonzero(para >= 0).squeeze(1) if paraphrases else torch.zeros(0, dtype=torch.long, device=dev)  # [P]
    texts = torch.cat([data.pos[batch], data.neg[batch], para[with_para]])  # [Nt]
    items = torch.arange(B, device=dev)
    owner = torch.cat([items, items, with_para])  # [Nt] item of each caption
    true = torch.cat([torch.ones(B, dtype=torch.bool, device=dev), torch.zeros(B, dtype=torch.bool, device=dev),
                      torch.ones(len(with_para), dtype=torch.bool, device=dev)])  # fmt: skip
    return HnbBatch(
        images=images,
        item_image=item_image,
        texts=texts,
        positives=caption_positives(images, identity[owner], true, texts),
        queries=true,
        donor=donor_index(identity),
    )


@torch.no_grad()
def caption_scores(model: FlowClip, data: PairData, batch_size: int = EVAL_BATCH) -> np.ndarray:
    """[n, 2] per-caption scores (s(I, pos), s(I, neg)) of every item."""
    out = []
    for start in range(0, len(data), batch_size):
        sl = slice(start, start + batch_size)
        image = data.images.index(data.image[sl])
        options = [data.texts.index(data.pos[sl]), data.texts.index(data.neg[sl])]
        out.append(option_scores(model, image, options).double())  # [b, 2]
    return torch.cat(out).cpu().numpy()


def manifest_order(pos_neg: np.ndarray, manifest) -> np.ndarray:
    """[n, 2] option scores in the manifest's caption order, from [n, 2] (pos, neg) scores."""
    correct = manifest["correct"].to_numpy()[:, None]  # [n, 1]
    return np.where(correct == 0, pos_neg, pos_neg[:, ::-1])


class FlowClipTrainer(FamilyTrainer):
    """HNB (+ CIMR with ``cimr``) on a pair suite; the dev suite's official metric."""

    def __init__(self, objective: dict[str, Any], cimr: bool) -> None:
        given = sorted(set(objective) & set(CIMR_OPTIONS))
        if given and not cimr:
            raise ValueError(f"objective options {given} belong to CIMR; train `flowclip-cimr` for HNB + CIMR")
        self.cfg = family_options(FlowClipObjective, objective, "Flow-CLIP objective options")
        self.cimr = cimr

    def load(self, store: FeatureStore, suite: SuiteSelection, train: bool) -> PairData:
        return load_pairs(store, suite)

    def n_items(self, data: PairData) -> int:
        return len(data)

    def loss(self, model: FlowClip, data: PairData, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Total loss of the items ``batch`` [B] and each objective's value."""
        hb = hnb_batch(data, batch, self.cfg.paraphrases)
        S = model.score_matrix(data.images.index(hb.images), data.texts.index(hb.texts))  # [U, Nt]
        t = self.cfg.logit_scale if self.cfg.logit_scale is not None else model.logit_scale
        total, parts = hnb(t * S, hb.positives, hb.queries)
        logged = {"hnb": float(total.detach()), **{k: float(v.detach()) for k, v in parts.items()}}

        B = hb.n_items
        pos = torch.arange(B, device=S.device)  # [B] column of each item's positive caption
        neg = B + pos  # [B] and of its negative

        def margin(rows: torch.Tensor) -> torch.Tensor:
            return t * (S[rows, pos] - S[rows, neg])  # [B] item b's caption pair on image rows[b]

        m = margin(hb.item_image)  # [B] on the matched image
        if self.cimr:
            ok = hb.donor >= 0  # [B]
            m_donor = margin(hb.item_image[hb.donor.clamp_min(0)])  # [B] on the donor image
            l_cimr = cimr(m[ok], m_donor[ok], self.cfg.gamma) if ok.any() else S.new_zeros(())
            total = total + self.cfg.cimr_weight * l_cimr
            logged["cimr"] = float(l_cimr.detach())
        logged["acc"] = float((m.detach() > 0).float().mean())
        return total, logged

    def dev_metrics(self, model: FlowClip, data: PairData, suite: str) -> dict[str, float]:
        """The suite's official metrics of per-caption scores; ``mean`` (or the headline)."""
        m = data.manifest
        metrics = SUITES.get(suite).metrics(m, manifest_order(caption_scores(model, data), m))
        if "mean" not in metrics:
            metrics["mean"] = metrics[SUITES.get(suite).headline]
        return metrics
