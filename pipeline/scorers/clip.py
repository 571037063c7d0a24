"""Frozen global CLIP: the cosine between pooled image and caption embeddings.

This is how every official benchmark scores CLIP (unit-normalised dot product, no
temperature); it is the baseline every other scorer is compared against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers.base import SCORERS, Scorer


class GlobalClip(Scorer):
    """``s(I, T) = <e_I / |e_I|, e_T / |e_T|>``; no parameters."""

    uses_grids = False

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        return (F.normalize(image.embed, dim=-1) * F.normalize(text.embed, dim=-1)).sum(-1)

    def score_matrix(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[Ni, Nt] all image-caption cosines at once."""
        return F.normalize(image.embed, dim=-1) @ F.normalize(text.embed, dim=-1).T


@SCORERS.register("clip")
def clip(dims: FeatureDims, proj: Projections) -> GlobalClip:
    """Frozen global CLIP margin (the baseline)."""
    return GlobalClip()
