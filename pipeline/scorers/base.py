"""The scorer contract and its registry.

A scorer reads cached features only (`pipeline.features`), never the backbone.
Two kinds exist:

* per-caption scorers (``pairwise = False``) implement ``score(image, text) -> [B]``;
* pairwise scorers (``pairwise = True``, e.g. BindCLIP) implement
  ``score_pair(image, text_a, text_b) -> [B]`` with ``s(I, A, B) = -s(I, B, A)``.

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
        uses_grids: False if it reads the pooled embeddings only (the store then skips the
            patch grids and token states: ``FeatureStore.images(rows, grids=False)``).
    """

    pairwise: ClassVar[bool] = False
    trainable: ClassVar[bool] = False
    uses_grids: ClassVar[bool] = True

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


def create_scorer(name: str, dims: FeatureDims, proj: Projections, **kwargs) -> Scorer:
    """Build the registered scorer ``name`` for an encoder with ``dims``/``proj``."""
    return SCORERS.get(name)(dims=dims, proj=proj, **kwargs)


def option_scores(
    scorer: Scorer, image: ImageFeatures, options: list[TextFeatures]
) -> torch.Tensor:
    """[B, K] one score per caption option.

    Per-caption scorers score each option directly. Pairwise scorers give option k the
    mean preference over the other options, ``mean_{j != k} s(I, c_k, c_j)``; for K = 2
    this is ``(s, -s)``, so the decision equals the sign of ``s``. Antisymmetry means
    only the K(K-1)/2 pairs j > k are evaluated.
    """
    k = len(options)
    if not scorer.pairwise:
        return torch.stack([scorer.score(image, t) for t in options], dim=1)  # [B, K]
    out = torch.zeros(len(image), k, dtype=torch.float32)
    for a in range(k):
        for b in range(a + 1, k):
            s = scorer.score_pair(image, options[a], options[b]).float()  # [B]
            out[:, a] += s
            out[:, b] -= s
    return out / max(k - 1, 1)
