"""The scorer contract and its registry.

A scorer reads cached features only (`pipeline.features`), never the backbone.
Three kinds exist:

* per-caption scorers (``pairwise = False``) implement ``score(image, text) -> [B]``;
* pairwise scorers (``pairwise = True``, e.g. BindCLIP) implement
  ``score_pair(image, text_a, text_b) -> [B]`` with ``s(I, A, B) = -s(I, B, A)``;
* retrieval rerankers (``reranker = True``, subclasses of :class:`Reranker`, the shape of
  the geometry-aware rerankers, methods.md §3) implement
  ``rerank(query, candidates, shortlist) -> [Q, K]``: a cheap registered ``base`` scorer
  shortlists each query's top ``k`` gallery images and only those reach the reranker
  (:func:`pipeline.scoring.score_retrieval`). On choice items a reranker scores each
  caption against its own image as a one-image shortlist.

``option_scores`` turns either kind into one score per caption option for K-way items,
so every benchmark is evaluated the same way. A factory is registered with
``@SCORERS.register("name")`` and called as ``factory(dims=..., proj=..., **kwargs)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.registry import Registry

ScorerFactory = Callable[..., "Scorer"]
SCORERS: Registry[ScorerFactory] = Registry("scorer", "pipeline.scorers")


class Scorer(nn.Module):
    """Base class of all scorers.

    Attributes:
        pairwise: True if the scorer compares two captions (``score_pair``).
        trainable: True if it has parameters that ``pipeline train`` fits.
        fit_command: the command that writes a trainable scorer's checkpoint (None:
            ``pipeline train --variant <variant>``), named when the checkpoint is missing.
        uses_grids: False if it reads the pooled embeddings only (the store then skips the
            patch grids and token states: ``FeatureStore.images(rows, grids=False)``).
        reranker: True for retrieval rerankers (:class:`Reranker`).
        scores_choices: False for scorers of retrieval suites only (the geometry-aware
            rerankers read object boxes and phrases that choice items do not carry); the
            score stage skips choice suites for them.

    Every score is a number: the metrics read NaN as an absent option, so the score stage
    refuses a NaN score (:func:`pipeline.scoring.refuse_nan`).
    """

    pairwise: ClassVar[bool] = False
    reranker: ClassVar[bool] = False
    scores_choices: ClassVar[bool] = True
    trainable: ClassVar[bool] = False
    fit_command: ClassVar[str | None] = None
    uses_grids: ClassVar[bool] = True

    def full_path(self) -> Scorer:
        """This scorer with every exact shortcut turned off (e.g. Flow-CLIP skipping ICER
        while ``W = 0``), so that ``pipeline bench`` times the computation the method
        defines whatever its weights are; the scores do not change. Returns ``self``."""
        return self

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[B] score of caption b for image b (per-caption scorers)."""
        raise NotImplementedError(f"{type(self).__name__} is pairwise; use score_pair")

    def score_pair(
        self, image: ImageFeatures, text_a: TextFeatures, text_b: TextFeatures
    ) -> torch.Tensor:
        """[B] preference of caption A over caption B for image b; antisymmetric."""
        return self.score(image, text_a) - self.score(image, text_b)

    def score_matrix(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[Ni, Nt] scores of every image against every caption (retrieval).

        The default scores one image against all captions at a time; scorers with a
        closed form (e.g. global CLIP) override it.
        """
        n_t = len(text)
        rows = [
            self.score(image.index(torch.full((n_t,), i, dtype=torch.long)), text)
            for i in range(len(image))
        ]
        return torch.stack(rows)


class Reranker(Scorer):
    """Base class of retrieval rerankers: shortlist with ``base``, rerank the shortlist.

    Text -> image retrieval scores every gallery image with the registered per-caption
    scorer ``base`` (``score_matrix``), keeps each query's ``k`` best (ties by gallery
    order) and asks ``rerank`` to order only those, so an expensive structural score (FGW,
    assignment) is evaluated on ``Q * k`` pairs, never on the whole gallery. How the two
    are merged into one ``[n_queries, n_gallery]`` ranking is
    :func:`pipeline.scoring.merge_reranked`.

    Attributes:
        base: registered per-caption scorer that shortlists (not pairwise, not a reranker).
        k: shortlist length per query; a gallery of ``k`` images or fewer is reranked whole.
    """

    reranker: ClassVar[bool] = True
    base: str = "clip"
    k: int = 20

    def prepare(self, store, manifest, index: dict, suite: str = "") -> None:
        """Called once per retrieval suite before any ``rerank`` (``store``: the feature
        store; ``manifest`` and ``index`` as ``pipeline.scoring.suite_inputs`` returns
        them): rerankers that read per-query or per-image annotations (object boxes,
        phrases) build them here. The default does nothing."""

    def rerank(
        self,
        query: TextFeatures,
        candidates: ImageFeatures,
        shortlist: torch.Tensor,
        gallery: torch.Tensor | None = None,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[Q, K] score of query q against its k-th shortlisted image (higher = better).

        Args:
            query: Q query captions.
            candidates: the U distinct images of this batch's shortlists (U <= Q * K),
                each read once however many queries shortlisted it.
            shortlist: [Q, K] int64 row of ``candidates`` holding query q's k-th
                shortlisted image, best base score first; e.g.
                ``candidates.index(shortlist.reshape(-1))`` gives the Q * K pairs flat.
            gallery: [U] int64 gallery position of each candidate row (the order of
                ``gallery_images(manifest)``), for rerankers that read per-image
                annotations such as object boxes; None when scoring choice items.
                Implementations accept it and may ignore it.
            queries: [Q] int64 manifest row of each query (the order ``prepare`` saw);
                None when scoring choice items. Accepted, and may be ignored, likewise.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement rerank")

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[B] caption b against image b: each caption reranks a one-image shortlist."""
        own = torch.arange(len(text))[:, None]  # [B, 1] caption b's only candidate is image b
        return self.rerank(text, image, own)[:, 0]


def create_scorer(name: str, dims: FeatureDims, proj: Projections, **kwargs) -> Scorer:
    """Build the registered scorer ``name`` for an encoder with ``dims``/``proj``."""
    return SCORERS.get(name)(dims=dims, proj=proj, **kwargs)


def option_scores(
    scorer: Scorer, image: ImageFeatures, options: list[TextFeatures], reference: int | None = None
) -> torch.Tensor:
    """[B, K] one score per caption option.

    Per-caption scorers score each option directly (``reference`` does not change them).
    Pairwise scorers give option k the mean preference over the other options,
    ``mean_{j != k} s(I, c_k, c_j)``; for K = 2 this is ``(s, -s)``, so the decision equals
    the sign of ``s``. Antisymmetry means only the K(K-1)/2 pairs j > k are evaluated.

    With ``reference = r`` a pairwise scorer's option k scores ``s(I, c_k, c_r)`` and
    option r scores ``s(I, c_r, c_r) = 0``, so "option k beats option r" reads the one
    preference ``s(I, c_k, c_r) > 0`` (K - 1 calls). This is the layout of a suite whose
    official test compares each option with one of them (SugarCrepe++ ITT:
    ``s(I, P1, N) > 0`` and ``s(I, P2, N) > 0``), which the mean preference is not:
    ``P1`` may beat ``N`` and still lose the mean to it through a large ``s(I, P2, P1)``.
    """
    k = len(options)
    if not scorer.pairwise:
        return torch.stack([scorer.score(image, t) for t in options], dim=1)  # [B, K]
    if reference is not None:
        if not 0 <= reference < k:
            raise ValueError(f"reference option {reference} is not one of the {k} options")
        out = torch.zeros(len(image), k, dtype=torch.float32, device=image.embed.device)  # [B, K], the reference stays 0
        for a in range(k):
            if a != reference:
                out[:, a] = scorer.score_pair(image, options[a], options[reference]).float()
        return out
    out = torch.zeros(len(image), k, dtype=torch.float32, device=image.embed.device)
    for a in range(k):
        for b in range(a + 1, k):
            s = scorer.score_pair(image, options[a], options[b]).float()  # [B]
            out[:, a] += s
            out[:, b] -= s
    return out / max(k - 1, 1)
