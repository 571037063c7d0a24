"""BindCLIP's training hook: its data, its six objectives per step, q0 chosen on dev.

The loop (:mod:`pipeline.training.loop`) calls :class:`BindClipTrainer`. A step scores, in
one batched forward pass,

* ``(I, pos, neg)``                -> caption preference, structural sufficiency, grounding;
* ``(I', pos, neg)``               -> correct-vs-mismatched image (I' = counterfactual render;
  on a suite with none rendered, real photographs, the next batch item's image: methods.md
  §1.6's donor "a different image");
* ``(flip I, flip pos, flip neg)`` -> reflection consistency against ``(I, pos, neg)``;
* ``(I, paraphrase, neg)``         -> paraphrase consistency against ``(I, pos, neg)``,

and minimises ``sum_k w_k * worst_group_tau(L_k)`` over the eight families
(:mod:`pipeline.scorers.bindclip.objectives`; ``w_k = weights.get(k, 1)``). The two
consistency objectives score an extra copy of only the first ``consistency_items`` items
of each batch, to bound the step's cost; an objective with weight 0 is not computed.

Grounding reads the manifest's ``ground_positions`` / ``ground_boxes`` (words of the true
caption that name exactly one object, :func:`pipeline.world.grounding.grounding`) and,
with ``ground_negatives``, ``neg_ground_*`` (words of the negative that alone name one
object: on a false caption each word is still pulled to its own referent). Where the
manifest records each image's ``image_size`` (COCO families), the boxes are first mapped
onto the square view the encoder saw (:func:`view_grounding`).
``image_per_caption`` adds to the image objective the same logistic loss on each
caption's own learned part: the pairwise margin only constrains the difference of the
two captions (e.g. d(left) - d(right)); this constrains each (the sign of d(left)). It
needs the counterfactual (the negative is true of it), so a donor image takes the margin
loss only. Reflection needs flipped renders: on a suite without them it is not computed,
and :meth:`BindClipTrainer.load` says so.

After checkpoint selection, consensus ``q0`` is chosen on dev only from ``q0_grid``
(ties to the value listed first).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import SuiteSelection
from pipeline.cache import FeatureStore
from pipeline.config import family_options
from pipeline.scorers.bindclip.model import BindClip
from pipeline.scorers.bindclip.objectives import (
    caption_preference,
    consistency,
    image_contrast,
    region_grounding,
    structural_sufficiency,
    worst_group,
)
from pipeline.training.pairs import PairData, load_pairs, pair_decisions
from pipeline.training.trainer import FamilyTrainer
from pipeline.world.grounding import box_cells, view_boxes, word_token_positions

log = logging.getLogger(__name__)

OBJECTIVES = ("preference", "image", "sufficiency", "grounding", "reflection", "paraphrase")
EVAL_BATCH = 256  # dev items per scoring forward pass


@dataclass
class BindClipObjective:
    """BindCLIP's objective options (``train.bindclip.objective`` in ``params.yaml``)."""

    weights: dict[str, float] = field(default_factory=dict)  # per-objective loss weight (1 each by default)
    group_tau: float = 1.0  # smooth worst-group temperature: tau * log mean_f exp(L_f / tau)
    ground_negatives: bool = False  # region grounding also on neg's words that alone name one object
    image_per_caption: bool = False  # image objective also on each caption's learned part (I vs I')
    consistency_items: int | None = 16  # items per batch that also get the mirrored / paraphrased forward (None = all)
    q0_grid: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])  # consensus q0 candidates, chosen on dev

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(OBJECTIVES))
        if unknown:
            raise ValueError(f"unknown objective weight(s) {unknown}; valid: {', '.join(OBJECTIVES)}")
        bad = {k: w for k, w in self.weights.items() if not 0 <= w < float("inf")}
        if bad:  # a negative weight maximises its loss
            raise ValueError(f"objective weights must be finite and >= 0, got {bad}")
        if not self.group_tau > 0:
            raise ValueError(f"group_tau must be > 0, got {self.group_tau!r}")
        if not all(q > 0 for q in self.q0_grid):  # [] keeps the scorer's own q0
            raise ValueError(f"q0_grid must list q0 values > 0 (or be [] to keep the scorer's q0), got {self.q0_grid!r}")
        if self.consistency_items is not None and self.consistency_items < 1:
            raise ValueError(f"consistency_items must be >= 1 or null (every item), got {self.consistency_items!r}")

    def weight(self, name: str) -> float:
        return float(self.weights.get(name, 1.0))


@dataclass
class GroundingMap:
    """CSR map of each item's grounded tokens: plan rows and the patches of their box."""

    offsets: np.ndarray  # [n+1] entries of item i: offsets[i]:offsets[i+1]
    row: torch.Tensor  # [E] plan row of the token (content position - 1 in its caption)
    cells: torch.Tensor  # [E, R] bool, patches of the token's object box


@dataclass
class BindClipData:
    pairs: PairData
    pos: GroundingMap | None = None  # words of the true caption
    neg: GroundingMap | None = None  # words of the negative that alone name one object


def grounding_map(
    captions: list[str], positions: list, boxes: list, ids: torch.Tensor, grid: tuple[int, int]
) -> GroundingMap:
    """The grounding map of one caption per item.

    ``positions[i]``: word indices in ``captions[i].split()``; ``boxes[i]``: one box per
    word; ``ids``: [n, C] the stored BPE ids of the captions. A word of several BPE pieces
    gives one row per piece; pieces beyond the stored caption are dropped.
    """
    max_tok = ids.shape[1] - 2
    offsets, rows, out_boxes = [0], [], []
    for i, cap in enumerate(captions):
        words = list(positions[i] if positions[i] is not None else [])
        item_boxes = list(boxes[i] if boxes[i] is not None else [])
        for toks, box in zip(word_token_positions(cap, words, max_tokens=max_tok), item_boxes, strict=True):
            for p in toks:
                if int(ids[i, p]) == 0:  # beyond the stored caption (truncated)
                    continue
                rows.append(p - 1)
                out_boxes.append(list(box))
        offsets.append(len(rows))
    cells = box_cells(torch.tensor(out_boxes, dtype=torch.float32).reshape(-1, 4), grid)
    return GroundingMap(np.asarray(offsets, dtype=np.int64), torch.tensor(rows, dtype=torch.long), cells)


def view_grounding(positions: list, boxes: list, sizes: list, fingerprint: dict) -> tuple[list, list]:
    """Each item's grounded words and boxes with the boxes mapped onto the square view of the
    store's ``preprocess.resize_mode`` (:func:`pipeline.world.grounding.view_boxes`); a word
    whose object the crop cut away is not grounded."""
    mode = fingerprint.get("preprocess", {}).get("resize_mode", "shortest")
    out_pos, out_box = [], []
    for words, item_boxes, size in zip(positions, boxes, sizes, strict=True):
        words = list(words if words is not None else [])
        b = np.asarray(list(item_boxes if item_boxes is not None else []), dtype=np.float64).reshape(-1, 4)
        view, seen = view_boxes(b, size, mode)
        out_pos.append([w for w, keep in zip(words, seen, strict=True) if keep])
        out_box.append(view[seen].tolist())
    return out_pos, out_box


def load_grounded(store: FeatureStore, suite: str | SuiteSelection, negatives: bool = False) -> BindClipData:
    """A pair suite with the grounding maps of its true captions (and, with ``negatives``,
    of its negatives' words that alone name one object), where the manifest has them."""
    pairs = load_pairs(store, suite)
    data = BindClipData(pairs)
    m = pairs.manifest
    if "ground_positions" not in m:
        return data
    correct = m["correct"].to_numpy().astype(np.int64)

    def caption_map(which: np.ndarray, rows: torch.Tensor, positions: str, boxes: str) -> GroundingMap:
        captions = [c[which[i]] for i, c in enumerate(m["captions"])]
        words, cells = list(m[positions]), list(m[boxes])
        if "image_size" in m:  # boxes on the whole image -> on the view the grid covers
            words, cells = view_grounding(words, cells, list(m["image_size"]), store.fingerprint)
        return grounding_map(captions, words, cells, pairs.texts.ids[rows], store.dims.grid)

    data.pos = caption_map(correct, pairs.pos, "ground_positions", "ground_boxes")
    if negatives and "neg_ground_positions" in m:
        data.neg = caption_map(1 - correct, pairs.neg, "neg_ground_positions", "neg_ground_boxes")
    return data


def _batch_entries(offsets: np.ndarray, batch: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR entries of the batch's items (``batch`` on the host), in batch order, on
    ``device``: (entry indices [M], position of each entry's item within the batch [M])."""
    lo, hi = offsets[batch.numpy()], offsets[batch.numpy() + 1]
    n = hi - lo  # [b] entries per item
    item = np.repeat(np.arange(len(batch)), n)  # [M]
    ent = lo[item] + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # [M] lo_i, lo_i + 1, ...
    return torch.from_numpy(ent).long().to(device), torch.from_numpy(item).to(device)


@torch.no_grad()
def pair_scores(model: BindClip, data: PairData, batch_size: int = EVAL_BATCH) -> np.ndarray:
    """[n] s(I, pos, neg) for every item."""
    out = []
    for start in range(0, len(data), batch_size):
        sl = slice(start, start + batch_size)
        img, a, b = data.images.index(data.image[sl]), data.texts.index(data.pos[sl]), data.texts.index(data.neg[sl])
        out.append(model.score_pair(img, a, b).double())
    return torch.cat(out).cpu().numpy()


class BindClipTrainer(FamilyTrainer):
    """The six objectives of methods.md §1.6 on a pair suite, and q0 chosen on dev."""

    def __init__(self, objective: dict[str, Any]) -> None:
        self.cfg = family_options(BindClipObjective, objective, "BindCLIP objective options")

    def load(self, store: FeatureStore, suite: SuiteSelection, train: bool) -> BindClipData:
        """The suite's pairs (with grounding maps when the grounding objective is on); for
        training, a warning names the objectives the suite's data changes: the image
        objective's donor where no counterfactual is rendered, reflection without flips."""
        if train and self.cfg.weight("grounding") != 0:
            data = load_grounded(store, suite, negatives=self.cfg.ground_negatives)
        else:
            data = BindClipData(load_pairs(store, suite))
        d = data.pairs
        if train and self.cfg.weight("image") != 0 and bool((d.cf < 0).all()):
            log.warning("%s has no counterfactual images: the image objective contrasts each item's image with the "
                        "next batch item's (methods.md 1.6: a donor, a different image)%s", suite,
                        "; image_per_caption needs the counterfactual and is not applied" if self.cfg.image_per_caption else "")  # fmt: skip
        if train and self.cfg.weight("reflection") != 0 and bool((d.flip < 0).all()):
            log.warning("%s has no flipped images: the reflection objective is not computed (weight %s)", suite, self.cfg.weight("reflection"))
        return data

    def n_items(self, data: BindClipData) -> int:
        return len(data.pairs)

    def loss(self, model: BindClip, data: BindClipData, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Total loss of the items ``batch`` [B] and each objective's aggregated value."""
        cfg, d = self.cfg, data.pairs
        on = {k: cfg.weight(k) for k in OBJECTIVES}
        fam = d.family[batch]  # [B] group of each item
        chunks = [(d.image[batch], d.pos[batch], d.neg[batch])]
        sel: dict[str, torch.Tensor] = {}
        donor = bool((d.cf < 0).all())  # no counterfactual rendered (real photographs)
        own = d.image[batch]  # [B]
        mismatched = torch.where(own.roll(1) != own, own.roll(1), -1) if donor else d.cf[batch]  # [B] I'
        copies = {"image": (mismatched, d.pos[batch], d.neg[batch]), "reflection": (d.flip[batch], d.flip_pos[batch], d.flip_neg[batch]),
                  "paraphrase": (own, d.para[batch], d.neg[batch])}  # fmt: skip
        for name, (img, a, b) in copies.items():
            if on[name] == 0:
                continue
            ok = ((img >= 0) & (a >= 0) & (b >= 0)).cpu()  # [B] on the host, as ``batch``
            if name != "image" and cfg.consistency_items is not None:
                ok[cfg.consistency_items :] = False
            if ok.any():
                sel[name] = torch.nonzero(ok).squeeze(1)
                keep = ok.to(img.device)
                chunks.append((img[keep], a[keep], b[keep]))
        image = d.images.index(torch.cat([c[0] for c in chunks]))
        text_a = d.texts.index(torch.cat([c[1] for c in chunks]))
        text_b = d.texts.index(torch.cat([c[2] for c in chunks]))
        e = model.explain(image, text_a, text_b)  # one forward over every chunk
        B = len(batch)
        n_tok = (e.plan.shape[1] - 1) // 2  # plan rows [pos (N); neg (N); null]
        s0, g0 = e.score[:B], e.margin[:B]

        per: dict[str, tuple[torch.Tensor, torch.Tensor]] = {"sufficiency": (structural_sufficiency(s0, g0), fam)}
        start = B
        for name in ("image", "reflection", "paraphrase"):
            if name not in sel:
                continue
            idx = sel[name]
            rows = slice(start, start + len(idx))  # this copy's rows of the forward pass
            s = e.score[rows]
            start += len(idx)
            if name == "image":
                loss = image_contrast(s0[idx], s)
                if cfg.image_per_caption and not donor:  # each caption's learned part prefers the image it is true of
                    on_cf = (e.energies[rows] * e.scales).sum(-1)  # [n, 2] (pos, neg) on I'
                    on_true = (e.energies[idx] * e.scales).sum(-1)  # [n, 2] on I
                    loss = loss + image_contrast(on_true[:, 0], on_cf[:, 0]) + image_contrast(on_cf[:, 1], on_true[:, 1])
                per[name] = (loss, fam[idx])
            else:
                per[name] = (consistency(s, s0[idx]), fam[idx])
        per["preference"] = (caption_preference(s0), fam)
        if on["grounding"] != 0 and data.pos is not None:
            maps = [(data.pos, 0)] + ([(data.neg, n_tok)] if data.neg is not None else [])
            item, row, cells = [], [], []
            for gmap, shift in maps:
                ent, of_item = _batch_entries(gmap.offsets, batch, gmap.row.device)
                keep = gmap.row[ent] < n_tok  # a token beyond the scorer's truncation has no row
                item.append(of_item[keep])
                row.append(gmap.row[ent][keep] + shift)
                cells.append(gmap.cells[ent][keep])
            item = torch.cat(item)
            if len(item):
                loss = region_grounding(e.plan[:B], e.r[:B], item, torch.cat(row), torch.cat(cells))
                per["grounding"] = (loss, fam[item])

        total = s0.new_zeros(())
        logged = {}
        for name, (loss, groups) in per.items():
            if on[name] == 0:
                continue
            agg = worst_group(loss, groups, cfg.group_tau)
            total = total + on[name] * agg
            logged[name] = float(agg.detach())
        logged["acc"] = float((s0.detach() > 0).float().mean())
        logged["sinkhorn_err"] = float(e.marginal_err.max())
        return total, logged

    def dev_metrics(self, model: BindClip, data: BindClipData, suite: str) -> dict[str, float]:
        """The suite's official metrics (per family + ``mean``) of ``s(I, pos, neg)``."""
        m = data.pairs.manifest
        return SUITES.get(suite).metrics(m, pair_decisions(pair_scores(model, data.pairs), m))

    def select(self, model: BindClip, data: BindClipData, suite: str) -> dict[str, Any]:
        """Consensus ``q0`` chosen on dev from ``q0_grid`` (ties to the first listed)."""
        grid = [float(q) for q in self.cfg.q0_grid]
        if not (model.config.consensus and grid):
            return {"scorer_kwargs": {"q0": model.config.q0}, "record": {"q0": model.config.q0}}
        dev_mean = {}
        for q in grid:
            model.config = dataclasses.replace(model.config, q0=q)
            dev_mean[str(q)] = round(float(self.dev_metrics(model, data, suite)["mean"]), 6)
        chosen = max(grid, key=lambda q: (dev_mean[str(q)], -grid.index(q)))
        model.config = dataclasses.replace(model.config, q0=chosen)
        return {"scorer_kwargs": {"q0": chosen}, "record": {"q0": chosen, "q0_dev_mean": dev_mean}}
