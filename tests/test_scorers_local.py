"""The local-alignment baselines (``local-max``, ``local-softmax``, ``additive``) against
scores computed by hand on one image of 3 patches and one caption of 2 content tokens.

Joint space R^3 with identity projections. The patches lie along the axes (lengths 2, 3, 4,
so only cosines give the numbers below); the caption's content tokens are ``5 e0`` and
``-e2``, so their patch cosines are ``(1, 0, 0)`` and ``(0, 0, -1)``. The sot and eot tokens
lie along ``e1`` and would raise every pooled cosine if they were read.

* max pooling: token maxima 1 and 0, so ``local-max = (1 + 0) / 2 = 0.5``;
* softmax pooling at temperature ``1 / ln 2``: the weights are proportional to ``2 ** cos``,
  i.e. ``(2, 1, 1) / 4`` for the first token (pooled ``2/4 * 1 = 0.5``) and ``(1, 1, 1/2) /
  2.5`` for the second (pooled ``0.2 * -1 = -0.2``), so ``local-softmax = (0.5 - 0.2) / 2 =
  0.15``;
* additive: the global cosine of the embeddings ``e0`` and ``(3, 4, 0)`` is 0.6; with
  ``logit_scale`` 10 and ``w = 0.5``, ``10 * (0.6 + 0.5 * 0.5) = 8.5`` (max pooling) and
  ``10 * (0.6 + 0.5 * 0.15) = 6.75`` (softmax pooling).

A mean over patches instead of the max would give ``(1/3 - 1/3) / 2 = 0``; a subtracted
local term ``10 * (0.6 - 0.25) = 3.5``.
"""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers import create_scorer

DIMS = FeatureDims(grid=(1, 3), d_v=3, d_t=3, embed_dim=3, context_length=6)
PROJ = Projections(visual_proj=torch.eye(3), text_projection=torch.eye(3), logit_scale=torch.tensor(10.0))
TEMPERATURE = 1 / math.log(2)  # softmax weights proportional to 2 ** cosine


def _image() -> ImageFeatures:
    final = torch.tensor([[[2.0, 0, 0], [0, 3.0, 0], [0, 0, 4.0]]])  # [1, 3 patches, 3]
    return ImageFeatures(early=torch.zeros(1, 3, 3), final=final, cls=torch.zeros(1, 3), embed=torch.tensor([[1.0, 0, 0]]))


def _caption() -> TextFeatures:
    """sot, two content tokens, eot, then two padded positions."""
    tokens = torch.tensor([[[0, 7.0, 0], [5.0, 0, 0], [0, 0, -1.0], [0, 7.0, 0], [0, 0, 0], [0, 0, 0]]])
    mask = torch.tensor([[True, True, True, True, False, False]])
    ids = torch.tensor([[49406, 320, 321, 49407, 0, 0]])
    return TextFeatures(ids=ids, mask=mask, tokens=tokens, embed=torch.tensor([[3.0, 4.0, 0]]))


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("local-max", {}, 0.5),
        ("local-softmax", {"temperature": TEMPERATURE}, 0.15),
        ("additive", {"w": 0.5}, 8.5),
        ("additive", {"w": 0.5, "pooling": "softmax", "temperature": TEMPERATURE}, 6.75),
    ],
    ids=["local-max", "local-softmax", "additive-max", "additive-softmax"],
)
def test_local_baselines_give_the_hand_computed_score(name, kwargs, expected):
    scorer = create_scorer(name, dims=DIMS, proj=PROJ, **kwargs)
    assert not scorer.pairwise and not scorer.trainable
    image, text = _image(), _caption()
    with torch.no_grad():
        score, matrix = scorer.score(image, text), scorer.score_matrix(image, text)
    assert score.shape == (1,) and matrix.shape == (1, 1)
    assert score.item() == pytest.approx(expected, abs=1e-6)
    assert matrix.item() == pytest.approx(expected, abs=1e-6)  # the batched path, the same number


def test_additive_defaults_to_max_pooling_and_unit_weight():
    """``additive`` without options: ``10 * (0.6 + 1 * 0.5) = 11``."""
    scorer = create_scorer("additive", dims=DIMS, proj=PROJ)
    with torch.no_grad():
        assert scorer.score(_image(), _caption()).item() == pytest.approx(11.0, abs=1e-5)


def test_an_unknown_pooling_is_refused():
    with pytest.raises(ValueError, match=r"pooling must be one of \('max', 'softmax'\), got 'mean'"):
        create_scorer("additive", dims=DIMS, proj=PROJ, pooling="mean")


@pytest.mark.parametrize("pooling", ["max", "softmax"])
def test_the_alignment_matrix_equals_each_pair_and_never_reads_padding(pooling):
    """Every (image, caption) cell of the batched matrix, over several blocks, equals the
    per-pair alignment; the padding tokens' values change nothing (here NaN, which any
    product with them would spread), and a caption with no valid token scores 0."""
    from pipeline.scorers.local import local_alignment, local_alignment_matrix

    g = torch.Generator().manual_seed(0)
    tokens, patches = torch.randn(5, 4, 8, generator=g), torch.randn(3, 6, 8, generator=g)  # Nt 5, N 4; Ni 3, R 6
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]], dtype=torch.bool)
    want = torch.stack([local_alignment(tokens, mask, patches[i : i + 1].expand(5, -1, -1), pooling, 0.1) for i in range(3)])
    padded = tokens.masked_fill(~mask[..., None], float("nan"))
    got = local_alignment_matrix(padded, mask, patches, pooling, 0.1, chunk=2 * 8 * 6)  # 2 images a block
    assert torch.allclose(got, want, atol=1e-6) and torch.equal(got[:, 3], torch.zeros(3))
