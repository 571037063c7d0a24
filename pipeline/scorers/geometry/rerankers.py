r"""The geometry-aware rerankers (methods.md §3): a global-CLIP shortlist of ``k`` gallery
images per query, reordered by how well the query's object phrases align with each
candidate's annotated objects.

For a query with phrases :math:`P = (p_i)` laid out by its relations and a candidate with
objects :math:`O = (o_j)` at their box centres (:mod:`pipeline.scorers.geometry.objects`):

* ``fgw``: :math:`-\mathrm{FGW}_\alpha(M, C^P, C^O)` with feature cost
  :math:`M_{ij} = 1 - \cos(p_i, o_j)`, the structures :math:`C^P, C^O` of ``structure``
  (signed offsets by default) and uniform weights on both sets; ``alpha`` weighs the
  structure term, as in POT (0 for a query without directional relations, whose structure
  is all zero: ``GeometryReranker._solve``).
* ``hungarian``: minus the mean feature cost, over the query's phrases, of the best
  one-to-one matching of phrases to objects (``scipy.optimize.linear_sum_assignment``), a
  phrase left without an object costing the most a match can (:func:`matched_cost`); blind
  to the structure.
* ``fgw-hungarian``: the ``fgw`` order, except that among its ``top`` best candidates the
  one with the best Hungarian matching goes first (the paper's "Hungarian on the FGW
  shortlist": hard assignment for rank 1, the soft order for the rest). *(ours:* "the FGW
  shortlist" is read as FGW's ``top`` best, 5 in ``params.yaml``; with ``top`` = K the pick
  is Hungarian's best of the whole shortlist and R@1 is ``hungarian``'s*)*.
* ``ridge-fgw``: ``fgw`` with every phrase embedding first mapped into the image-object
  space by the ridge regression of :mod:`pipeline.scorers.geometry.ridge` (fitted on the
  training split by ``pipeline ridge``), and phrases and objects compared in the fit's
  centred, whitened space: :math:`p_i \mapsto \mathrm{normalise}((p_i W + b - \mu) T)`,
  :math:`o_j \mapsto \mathrm{normalise}((o_j - \mu) T)`; the object embeddings read the grid
  the fit held out best (its checkpoint's ``layer``), or the re-encoded crops when the map
  was fitted on crops (``ridge.objects: crops``); each object's feature cost carries its hub
  offset, the inverted softmax over the training phrases at the fit's ``beta``
  (:meth:`pipeline.scorers.geometry.ridge.RidgeMap.hub_offset`), which charges each candidate
  :math:`1 - \alpha` times its objects' mean offset and leaves the coupling unchanged.

Every reranker's image objects are box means of the cached grid by default (``objects:
box-mean``) or the crops re-encoded at extract (``objects: crops``, which needs
``extract.object_crops: true``): :data:`pipeline.scorers.geometry.objects.OBJECT_SOURCES`.

A candidate without objects ranks below every candidate with some, and such candidates keep
the shortlist's order among themselves; a query without phrases keeps the shortlist's order
(:func:`rerank_scores`).

Only the shortlist reaches the solvers (:class:`pipeline.scorers.base.Reranker`): ``Q·k``
small problems per suite, solved batched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from pipeline.benchmarks.base import gallery_images
from pipeline.config import family_options
from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.ot.assignment import hungarian
from pipeline.ot.fgw import fused_gromov_wasserstein_batched, fused_gromov_wasserstein_offsets
from pipeline.scorers.base import SCORERS, Reranker
from pipeline.scorers.geometry.objects import (
    OBJECT_LAYERS,
    ObjectSets,
    check_source,
    feature_cost,
    object_dim,
    offset_positions,
    structure,
    suite_objects,
)
from pipeline.scorers.geometry.ridge import RidgeMap

PAD_COST = 1e6  # cost of matching a phrase to a padded object (never chosen while a real one is free)
UNMATCHED_COST = 2.0  # a phrase left without an object costs the most a match can: 1 - cos = 2


def matched_cost(cost: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """[B] mean over each problem's valid rows of its cost in the optimal one-to-one
    matching of the valid rows to the valid columns of ``cost`` [B, n, m] (``rows`` [B, n],
    ``cols`` [B, m] validity); a row left unmatched (fewer columns than rows, or none)
    costs :data:`UNMATCHED_COST`, so an image that lacks some of the query's objects never
    matches better for it; 0 for a problem without rows."""
    padded = torch.where(rows[:, :, None] & cols[:, None, :], cost, PAD_COST)
    match, _ = hungarian(padded)  # [B, n] column of each row (-1 unmatched)
    match = torch.from_numpy(match)
    ok = rows & (match >= 0)
    ok &= cols.gather(1, match.clamp_min(0))  # a real row matched to a real column
    picked = cost.gather(2, match.clamp_min(0)[:, :, None])[..., 0]  # [B, n]
    per_row = torch.where(ok, picked, torch.as_tensor(UNMATCHED_COST, dtype=cost.dtype))
    return torch.where(rows, per_row, 0.0).sum(1) / rows.sum(1).clamp_min(1)


def rerank_scores(cost: torch.Tensor, queries: ObjectSets, candidates: ObjectSets, shape: tuple[int, int]) -> torch.Tensor:
    """[Q, K] rerank scores from the [Q * K] costs of the aligned pairs: minus the cost, with
    every candidate whose cost says nothing (it has no objects, or an infinite cost) below
    every other candidate and in the shortlist's order (the base order, gallery order among
    exact base ties): tied, they would rank a target among them last. A query without
    phrases keeps the whole shortlist's order. Ties between real costs stay ties."""
    score = -cost.reshape(shape)
    empty = ~candidates.mask.any(1).reshape(shape) | ~torch.isfinite(score)  # [Q, K]
    empty |= ~queries.mask.any(1).reshape(shape)[:, :1]  # a query without phrases
    floor = torch.where(empty, float("inf"), score).amin(1, keepdim=True)  # [Q, 1] the lowest real score
    floor = torch.where(torch.isfinite(floor), floor, 0.0)
    keep = floor - 1 - torch.arange(shape[1], dtype=score.dtype)  # [Q, K] below it, in shortlist order
    return torch.where(empty, keep, score)


@dataclass(frozen=True)
class RerankOptions:
    """The geometry rerankers' options (``score.options.<variant>``; the attributes of
    :class:`GeometryReranker`), their ranges checked here; the factories also check their
    types strictly (:func:`pipeline.config.family_options`), so a ``k`` of 2.5 or ``'20'`` is
    refused rather than truncated or compared as text."""

    k: int = 20
    alpha: float = 0.5
    structure: str = "offset"
    base: str = "clip"
    top: int = 5
    layer: str = "final"
    objects: str = "box-mean"

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")
        if int(self.k) < 1 or int(self.top) < 1:
            raise ValueError(f"k and top must be >= 1, got k={self.k}, top={self.top}")
        if self.structure not in ("offset", "distance"):
            raise ValueError(f"structure must be 'offset' or 'distance', got {self.structure!r}")
        if self.layer not in OBJECT_LAYERS:
            raise ValueError(f"layer must be one of {', '.join(OBJECT_LAYERS)}, got {self.layer!r}")
        check_source(self.objects, self.layer)


class GeometryReranker(Reranker):
    """Shared machinery: the suite's object sets (``prepare``) and the shortlist's problems.

    Attributes:
        k: shortlist length (K).
        alpha: FGW's structure weight in [0, 1].
        structure: ``offset`` or ``distance`` (:func:`pipeline.scorers.geometry.objects.structure`).
        layer: the grid the object embeddings read (``final`` in the joint space unless a
            fitted map compares phrases with another: :data:`...objects.OBJECT_LAYERS`).
        objects: ``box-mean`` (means of that grid inside each box) or ``crops`` (the
            re-encoded crops of ``extract.object_crops``): :data:`...objects.OBJECT_SOURCES`.
    """

    uses_grids = False  # the object sets are built once per suite in `prepare`
    scores_choices: ClassVar[bool] = False

    def __init__(self, k: int = 20, alpha: float = 0.5, structure: str = "offset", base: str = "clip", top: int = 5, layer: str = "final", objects: str = "box-mean") -> None:
        super().__init__()
        o = RerankOptions(k, alpha, structure, base, top, layer, objects)
        self.k, self.alpha, self.structure, self.base, self.top = int(o.k), float(o.alpha), o.structure, o.base, int(o.top)
        self.layer, self.objects = o.layer, o.objects
        self._queries: ObjectSets | None = None
        self._gallery: ObjectSets | None = None

    def map_phrases(self, phrases: ObjectSets) -> ObjectSets:
        """Phrase embeddings as the feature cost sees them (identity; ridge-fgw maps them)."""
        return phrases

    def map_objects(self, objects: ObjectSets) -> ObjectSets:
        """Image objects as the feature cost sees them (identity; ridge-fgw whitens them)."""
        return objects

    def prepare(self, store, manifest, index, suite: str = "") -> None:
        queries, images = suite_objects(store, manifest, index, gallery_images(manifest), suite, self.layer, self.objects)
        self._queries, self._gallery = self.map_phrases(queries), self.map_objects(images)

    def pairs(self, shortlist: torch.Tensor, gallery: torch.Tensor, queries: torch.Tensor) -> tuple[ObjectSets, ObjectSets]:
        """(query sets, candidate sets), both [Q * K], aligned pair by pair."""
        if self._queries is None or gallery is None or queries is None:
            raise RuntimeError(f"{type(self).__name__} reranks retrieval suites only, after prepare()")
        Q, K = shortlist.shape
        q = self._queries.index(queries.repeat_interleave(K))
        c = self._gallery.index(gallery[shortlist.reshape(-1)])
        return q, c

    def _solve(self, q: ObjectSets, c: ObjectSets) -> tuple[torch.Tensor, torch.Tensor]:
        """FGW values [B] and plans [B, n, m] of the aligned pairs (uniform weights on the
        real objects). A pair whose query has no phrases or whose candidate has no objects is
        not a transport problem: value inf, plan 0. A query whose structure is all zero (one
        phrase, phrases joined by no directional relation, or groups of phrases no relation
        places relative to each other: :func:`~pipeline.scorers.geometry.objects.relation_positions`)
        says nothing about layout, and
        comparing that with the image's structure would only penalise images whose objects
        are spread out, so its pairs are solved with ``alpha = 0``. Signed offsets make the
        structure term linear, so those problems are one exact OT on the objects' positions
        (:func:`pipeline.ot.fgw.fused_gromov_wasserstein_offsets`); distances take the
        conditional gradient."""
        B, n, m = len(q), q.embed.shape[1], c.embed.shape[1]
        value = torch.full((B,), float("inf"), dtype=torch.float64)
        plan = torch.zeros(B, n, m, dtype=torch.float64)
        Cq = structure(q, self.structure).double()
        solvable = q.mask.any(1) & c.mask.any(1)  # [B]
        flat = Cq.flatten(1).abs().amax(1) == 0  # [B] the query has no structure
        for alpha, group in ((self.alpha, solvable & ~flat), (0.0, solvable & flat)):
            idx = torch.nonzero(group)[:, 0]
            if len(idx) == 0:
                continue
            qi, ci = q.index(idx), c.index(idx)
            p = qi.mask.double() / qi.mask.sum(1, keepdim=True)
            w = ci.mask.double() / ci.mask.sum(1, keepdim=True)
            M = feature_cost(qi, ci).double()
            if self.structure == "offset":  # the structure term is linear: one exact OT problem
                X, Y = offset_positions(qi).double(), offset_positions(ci).double()
                value[idx], plan[idx] = fused_gromov_wasserstein_offsets(M, X, Y, p, w, alpha=alpha)
            else:
                Cc = structure(ci, self.structure).double()
                value[idx], plan[idx] = fused_gromov_wasserstein_batched(M, Cq[idx], Cc, p, w, alpha=alpha)
        return value, plan

    def fgw(self, q: ObjectSets, c: ObjectSets) -> torch.Tensor:
        """[B] FGW value of each aligned pair (uniform weights on the real objects; inf where
        the query has no phrases or the candidate no objects)."""
        return self._solve(q, c)[0]

    def plans(self, q: ObjectSets, c: ObjectSets) -> torch.Tensor:
        """[B, n, m] FGW transport plans of the aligned pairs (the report's picture)."""
        return self._solve(q, c)[1]

    def hungarian(self, q: ObjectSets, c: ObjectSets) -> torch.Tensor:
        """[B] mean matched feature cost of each aligned pair (:func:`matched_cost`)."""
        return matched_cost(feature_cost(q, c).double(), q.mask, c.mask)


class FGWReranker(GeometryReranker):
    """Rerank the shortlist by minus the Fused Gromov–Wasserstein distance."""

    def rerank(self, query: TextFeatures, candidates: ImageFeatures, shortlist: torch.Tensor, gallery=None, queries=None) -> torch.Tensor:
        q, c = self.pairs(shortlist, gallery, queries)
        return rerank_scores(self.fgw(q, c), q, c, shortlist.shape)


class HungarianReranker(GeometryReranker):
    """Rerank the shortlist by minus the mean cost of the best one-to-one matching."""

    def rerank(self, query: TextFeatures, candidates: ImageFeatures, shortlist: torch.Tensor, gallery=None, queries=None) -> torch.Tensor:
        q, c = self.pairs(shortlist, gallery, queries)
        return rerank_scores(self.hungarian(q, c), q, c, shortlist.shape)


class FGWHungarianReranker(GeometryReranker):
    """The FGW order with the Hungarian best of FGW's ``top`` candidates moved first."""

    def rerank(self, query: TextFeatures, candidates: ImageFeatures, shortlist: torch.Tensor, gallery=None, queries=None) -> torch.Tensor:
        q, c = self.pairs(shortlist, gallery, queries)
        score = rerank_scores(self.fgw(q, c), q, c, shortlist.shape)  # [Q, K]
        match = rerank_scores(self.hungarian(q, c), q, c, shortlist.shape)
        top = min(self.top, shortlist.shape[1])
        best = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :top]  # [Q, top]
        pick = best.gather(1, match.gather(1, best).argmax(1, keepdim=True))  # [Q, 1]
        return score.scatter(1, pick, score.amax(1, keepdim=True) + 1.0)


class RidgeFGWReranker(FGWReranker):
    """``fgw`` on phrases mapped into the image-object space by a fitted ridge regression,
    both sides compared in the fit's centred, whitened space, restricted to the map's top
    ``rank`` directions (0: all), each object's cost offset by its hub offset over the
    ``n_reference`` reference phrases at ``beta``. Unfitted (identity map and whitening, zero
    bias and centre, every direction, no reference phrase) it equals ``fgw``."""

    trainable = True  # its weights come from `pipeline ridge`, loaded like a checkpoint
    fit_command = "pipeline ridge"

    def __init__(self, dim: int, out_dim: int | None = None, rank: int = 0, beta: float = 0.0, n_reference: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        out_dim = dim if out_dim is None else out_dim
        if not 0 <= rank <= out_dim:
            raise ValueError(f"ridge-fgw rank must lie in [0, {out_dim}] (0: every direction), got {rank}")
        if not (beta >= 0 and math.isfinite(beta)) or n_reference < 0:
            raise ValueError(f"ridge-fgw beta must be finite and >= 0 and n_reference >= 0, got {beta} and {n_reference}")
        self.beta = float(beta)
        self.weight = nn.Parameter(torch.eye(dim, out_dim), requires_grad=False)  # [D, D_o]
        self.bias = nn.Parameter(torch.zeros(out_dim), requires_grad=False)  # [D_o]
        self.centre = nn.Parameter(torch.zeros(out_dim), requires_grad=False)  # [D_o]
        self.whiten = nn.Parameter(torch.eye(out_dim, rank or out_dim), requires_grad=False)  # [D_o, r]
        self.reference = nn.Parameter(torch.zeros(n_reference, rank or out_dim), requires_grad=False)  # [V, r]

    def fitted(self) -> RidgeMap:
        return RidgeMap(self.weight, self.bias, self.centre, self.whiten, self.reference)

    def map_phrases(self, phrases: ObjectSets) -> ObjectSets:
        return phrases.with_embed(self.fitted().phrases(phrases.embed))

    def map_objects(self, objects: ObjectSets) -> ObjectSets:
        fitted = self.fitted()
        mapped = fitted.objects(objects.embed)
        offset = torch.zeros(objects.mask.shape, dtype=mapped.dtype)
        offset[objects.mask] = fitted.hub_offset(mapped[objects.mask], self.beta)  # the real objects only
        return objects.with_embed(mapped, offset)


def _options(kwargs: dict) -> dict:
    """The rerankers' factory options (``score.options.<variant>``), checked by
    :class:`RerankOptions`: an unknown one (a typo), a value of the wrong type or out of range
    is refused."""
    return vars(family_options(RerankOptions, kwargs, "reranker options"))


@SCORERS.register("fgw")
def fgw(dims: FeatureDims, proj: Projections, **kwargs) -> FGWReranker:
    """Shortlist by CLIP, rerank by per-object Fused Gromov-Wasserstein."""
    return FGWReranker(**_options(kwargs))


@SCORERS.register("hungarian")
def hungarian_(dims: FeatureDims, proj: Projections, **kwargs) -> HungarianReranker:
    """Shortlist by CLIP, rerank by the best one-to-one phrase-object matching."""
    return HungarianReranker(**_options(kwargs))


@SCORERS.register("fgw-hungarian")
def fgw_hungarian(dims: FeatureDims, proj: Projections, **kwargs) -> FGWHungarianReranker:
    """FGW order with Hungarian's pick among FGW's top candidates first."""
    return FGWHungarianReranker(**_options(kwargs))


@SCORERS.register("ridge-fgw")
def ridge_fgw(dims: FeatureDims, proj: Projections, rank: int = 0, beta: float = 0.0, n_reference: int = 0, **kwargs) -> RidgeFGWReranker:
    """FGW on phrases mapped to object embeddings by a ridge regression (pipeline ridge).

    ``rank``: the width of the compared space; ``beta`` and ``n_reference``: the hub offset's
    inverse temperature and reference phrases (each set by the fit's ``scorer_kwargs``)."""
    options = _options(kwargs)
    return RidgeFGWReranker(dims.embed_dim, object_dim(dims, options["layer"]), rank=rank, beta=beta, n_reference=n_reference, **options)


ridge_fgw.fit_command = RidgeFGWReranker.fit_command  # fitted by its own command, not by the training loop
