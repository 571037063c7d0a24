"""Flow-CLIP (methods.md §2): the scorer's invariants, its objectives on hand-computed cases,
and training through the one loop on the tiny store.

The frozen ``clip`` scorer returns the *unscaled* cosine ``cos(e_I, e_T)`` (no logit scale),
and so does every Flow-CLIP variant at initialisation (M = I, W = 0): the two are compared
directly; the logit scale only enters HNB's logits in training.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers import SCORERS, create_scorer, option_scores
from pipeline.scorers.flowclip import model as fm
from pipeline.scorers.flowclip.objectives import (
    caption_positives,
    cimr,
    donor_index,
    hnb,
    soft_target_ce,
)
from pipeline.scorers.flowclip.training import FlowClipTrainer, hnb_batch, manifest_order
from pipeline.training.pairs import PairData

VARIANTS = ("global-m", "flowclip", "flowclip-cimr")
DIMS = FeatureDims(grid=(3, 4), d_v=16, d_t=12, embed_dim=8, context_length=10)


pytestmark = pytest.mark.usefixtures("single_thread")


def projections(seed: int = 0) -> Projections:
    g = torch.Generator().manual_seed(seed)
    return Projections(
        visual_proj=torch.randn(DIMS.d_v, DIMS.embed_dim, generator=g) / DIMS.d_v**0.5,
        text_projection=torch.randn(DIMS.d_t, DIMS.embed_dim, generator=g) / DIMS.d_t**0.5,
        logit_scale=torch.tensor(100.0),
    )


def images(B: int, seed: int = 0) -> ImageFeatures:
    g = torch.Generator().manual_seed(seed)
    R = DIMS.n_patches
    return ImageFeatures(
        early=torch.randn(B, R, DIMS.d_v, generator=g),
        final=torch.randn(B, R, DIMS.d_v, generator=g),
        cls=torch.randn(B, DIMS.d_v, generator=g),
        embed=torch.randn(B, DIMS.embed_dim, generator=g),
    )


def texts(lengths: list[int], seed: int = 0, context: int = DIMS.context_length) -> TextFeatures:
    """Captions with the given content lengths; padded positions carry random states, as the
    cache's do (the text transformer runs over padding too)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = torch.zeros(B, context, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, : n + 2] = True
    ids = torch.randint(1, 49000, (B, context), generator=g) * mask
    return TextFeatures(ids, mask, torch.randn(B, context, DIMS.d_t, generator=g), torch.randn(B, DIMS.embed_dim, generator=g))


def trained_like(name: str, seed: int = 1, **kwargs) -> fm.FlowClip:
    """A variant with every parameter moved off its initialisation."""
    model = create_scorer(name, dims=DIMS, proj=projections(), **kwargs)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


# ---------------------------------------------------------------------------- the scorer


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_is_frozen_clip_at_initialisation(name):
    proj = projections()
    model, clip = create_scorer(name, dims=DIMS, proj=proj), create_scorer("clip", dims=DIMS, proj=proj)
    image, text = images(4), texts([1, 3, 5, 8], seed=1)
    torch.testing.assert_close(model.score(image, text), clip.score(image, text), rtol=0, atol=1e-6)
    torch.testing.assert_close(model.score_matrix(image, text), clip.score_matrix(image, text), rtol=0, atol=1e-6)


def test_lambda_zero_gives_global_m_exactly():
    local = trained_like("flowclip", lam=0.0)
    glob = create_scorer("global-m", dims=DIMS, proj=projections())
    glob.gcc.load_state_dict(local.gcc.state_dict())
    image, text = images(4), texts([1, 3, 5, 8], seed=1)
    assert torch.equal(local.score(image, text), glob.score(image, text))
    assert torch.equal(local.score_matrix(image, text), glob.score_matrix(image, text))


def test_icer_is_exactly_zero_when_W_is_zero():
    model = trained_like("flowclip")
    with torch.no_grad():
        model.icer.W.zero_()
    image, text = images(4), texts([1, 3, 5, 8], seed=1)
    assert torch.equal(model.icer(image, text), torch.zeros(4))
    assert torch.equal(model.icer.matrix(image, text, pair_chunk=5), torch.zeros(4, 4))
    assert not model.icer.vanishes()  # with a gradient asked for, ICER is computed (W must learn)
    computed = (model.score(image, text).detach(), model.score_matrix(image, text).detach())
    with torch.no_grad():  # scoring skips the products and gives the same numbers, bit for bit
        assert model.icer.vanishes()
        assert torch.equal(model.score(image, text), computed[0])
        assert torch.equal(model.score_matrix(image, text), computed[1])
        assert torch.equal(model.full_path().score_matrix(image, text), computed[1])  # timed path
        assert not model.icer.vanishes()  # full_path computes ICER (what `pipeline bench` times)
        model.icer.W.normal_()
    assert model.icer(image, text).abs().min() > 0  # and not otherwise


def test_context_is_orthogonal_to_the_query_and_weights_are_normalised():
    g = torch.Generator().manual_seed(0)
    q_hat = torch.nn.functional.normalize(torch.randn(3, 5, 8, generator=g), dim=-1)  # [B, N, D]
    v = torch.nn.functional.normalize(torch.randn(3, 7, 8, generator=g), dim=-1)  # [B, R, D]
    patch_mask = torch.ones(3, 7, dtype=torch.bool)
    patch_mask[1, 4:] = False
    a = q_hat @ v.transpose(-1, -2)  # [B, N, R]
    w = fm.context_weights(a, patch_mask)
    assert (w >= 0).all() and (w[1, :, 4:] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 5))
    c_perp = fm.reject(w @ v, q_hat)
    torch.testing.assert_close((c_perp * q_hat).sum(-1), torch.zeros(3, 5), rtol=0, atol=1e-6)
    flat = torch.zeros(1, 2, 7)  # equal responses: no patch is above the mean, a row of zeros
    assert torch.equal(fm.context_weights(flat, torch.ones(1, 7, dtype=torch.bool)), flat)
    # by hand: responses .1 .2 .4 .5 on valid patches (mean .3; the padded 9.0 is not in it)
    # leave .1 and .2 above the mean on the last two: weights 1/3 and 2/3
    hand = fm.context_weights(torch.tensor([[[0.1, 0.2, 0.4, 0.5, 9.0]]]), torch.tensor([[True] * 4 + [False]]))
    torch.testing.assert_close(hand, torch.tensor([[[0.0, 0.0, 1 / 3, 2 / 3, 0.0]]]))


def test_pooled_evidence_lies_between_the_mean_and_the_max_response():
    a = torch.tensor([[[0.1, 0.5, -0.2, 0.3]]])  # [1, 1, R]
    mask = torch.tensor([[True, True, True, False]])
    for tau in (0.01, 0.05, 1.0, 100.0):
        e = fm.pooled_evidence(a, mask, tau)[0, 0]
        assert a[0, 0, :3].mean() - 1e-6 <= e <= 0.5 + 1e-6
    assert abs(float(fm.pooled_evidence(a, mask, 1e-3)) - 0.5) < 2e-3
    assert abs(float(fm.pooled_evidence(a, mask, 1e3)) - float(a[0, 0, :3].mean())) < 1e-3


def test_padded_tokens_and_padded_patches_change_nothing():
    model = trained_like("flowclip")
    image, text = images(3), texts([2, 4, 6], seed=1)
    base = model.score(image, text)
    longer = texts([2, 4, 6], seed=1, context=DIMS.context_length + 6)  # 6 more padded positions
    longer.tokens[:, : DIMS.context_length] = text.tokens
    longer.tokens[~longer.mask] = 50 * torch.randn(int((~longer.mask).sum()), DIMS.d_t)  # garbage there
    longer.ids[:, : DIMS.context_length], longer.embed = text.ids, text.embed
    assert torch.equal(model.score(image, longer), base)
    pad = torch.zeros(3, 5, DIMS.d_v)  # 5 padded patches (all-zero rows)
    padded = ImageFeatures(torch.cat([image.early, pad], 1), torch.cat([image.final, pad], 1), image.cls, image.embed)
    torch.testing.assert_close(model.score(padded, text), base, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.score_matrix(padded, longer), model.score_matrix(image, text), rtol=0, atol=1e-6)


def test_icer_reads_the_first_max_tokens_content_tokens():
    """methods.md truncates captions to 32 tokens: with ``max_tokens`` 3 a caption of 8
    content tokens scores as its first 3 followed by eot; with the default all 8 count."""
    long = texts([8], seed=1)
    short = texts([3], seed=1)
    short.tokens[:, :4], short.ids[:, :4], short.embed = long.tokens[:, :4], long.ids[:, :4], long.embed
    image = images(1)
    cut, full = trained_like("flowclip", max_tokens=3), trained_like("flowclip")
    torch.testing.assert_close(cut.score(image, long), full.score(image, short), rtol=0, atol=1e-6)
    torch.testing.assert_close(cut.score_matrix(image, long), full.score_matrix(image, short), rtol=0, atol=1e-6)
    assert not torch.allclose(full.score(image, long), full.score(image, short))
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        fm.FlowClipConfig(max_tokens=0)


def test_batch_neighbours_change_nothing_and_the_matrix_agrees_with_pairs():
    model = trained_like("flowclip-cimr")
    image, text = images(5), texts([1, 2, 3, 8, 4], seed=1)
    batch = model.score(image, text)
    for b in range(5):
        alone = model.score(image.index(torch.tensor([b])), text.index(torch.tensor([b])))
        torch.testing.assert_close(alone, batch[b : b + 1], rtol=0, atol=1e-6)
    S = model.score_matrix(image, text)  # [Ni, Nt]
    for i in range(5):
        row = model.score(image.index(torch.full((5,), i)), text)
        torch.testing.assert_close(S[i], row, rtol=0, atol=1e-6)
    for pair_chunk in (1, 3, 7, 25):  # one pair a pass; blocks of 3 captions; 5 captions x 1 image; x 5 images
        chunked = model.gcc.matrix(image.embed, text.embed) + model.icer.matrix(image, text, pair_chunk=pair_chunk)
        torch.testing.assert_close(chunked, S, rtol=0, atol=1e-6)
    assert model.icer.matrix(image.index(torch.tensor([], dtype=torch.long)), text, pair_chunk=3).shape == (0, 5)
    assert model.icer.matrix(image, text.index(torch.tensor([], dtype=torch.long)), pair_chunk=3).shape == (5, 0)


def test_the_mapped_query_correction_equals_the_per_pair_product_with_its_gradients():
    """``icer(..., mapped=(q̂Wᵀ, vWᵀ))`` (captions shared by every image) against the per-pair
    ``q + (c - <c, q̂> q̂) Wᵀ`` on each image's copy of the captions: values and gradients."""
    g = torch.Generator().manual_seed(3)
    G, K, N, R, D = 3, 4, 5, 7, 8
    q = torch.randn(K, N, D, generator=g)
    v = torch.nn.functional.normalize(torch.randn(G, R, D, generator=g), dim=-1)
    token_mask = torch.rand(K, N, generator=g) > 0.3
    patch_mask = torch.rand(G, R, generator=g) > 0.2
    W0 = 0.5 * torch.randn(D, D, generator=g)
    W1, W2 = W0.clone().requires_grad_(), W0.clone().requires_grad_()
    per_pair = fm.icer(q.expand(G, K, N, D), v, token_mask.expand(G, K, N), patch_mask, W1, 0.05)
    q_hat = torch.nn.functional.normalize(q, dim=-1)
    mapped = fm.icer(q[None], v, token_mask[None], patch_mask, W2, 0.05, mapped=((q_hat @ W2.T)[None], v @ W2.T))
    assert mapped.shape == (G, K) and per_pair.abs().min() > 0
    torch.testing.assert_close(mapped, per_pair, rtol=0, atol=1e-6)
    weights = torch.randn(G, K, generator=g)
    (per_pair * weights).sum().backward()
    (mapped * weights).sum().backward()
    torch.testing.assert_close(W2.grad, W1.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
def test_a_gradient_reaches_every_parameter(name):
    image, text = images(3), texts([2, 4, 6], seed=1)
    model = create_scorer(name, dims=DIMS, proj=projections())
    model.score(image, text).pow(2).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads["gcc.M"].abs().sum() > 0
    if name != "global-m":  # at init W learns; M_tok's gradient is 0 up to rounding (ICER ≡ 0 while W = 0)
        assert grads["icer.W"].abs().sum() > 0
        assert set(model.zero_grad_at_init) == {"icer.M_tok"}
        assert grads["icer.M_tok"].abs().max() < 1e-6 * grads["icer.W"].abs().max() + 1e-7
    moved = trained_like(name)
    moved.score(image, text).pow(2).sum().backward()
    for pname, p in moved.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


def test_the_registry_contract():
    proj = projections()
    counts = {}
    for name in VARIANTS:
        factory = SCORERS.get(name)
        model = create_scorer(name, dims=DIMS, proj=proj)
        assert isinstance(model, fm.FlowClip) and model.trainable and not model.pairwise
        assert callable(factory.make_trainer) and getattr(factory, "checkpoint_variant", None) is None  # each owns its checkpoint
        assert (factory.__doc__ or "").strip()
        assert model.uses_grids == (name != "global-m")
        counts[name] = sorted(model.state_dict())
        image, options = images(3), [texts([2, 3, 4], seed=s) for s in (1, 2, 3)]
        out = option_scores(model, image, options)  # [B, K = 3]
        assert out.shape == (3, 3)
        torch.testing.assert_close(out[:, 1], model.score(image, options[1]))
    assert counts["global-m"] == ["gcc.M", "logit_scale"]
    assert counts["flowclip"] == counts["flowclip-cimr"] == ["gcc.M", "icer.M_tok", "icer.W", "logit_scale"]
    with pytest.raises(TypeError, match="unknown Flow-CLIP options"):
        create_scorer("global-m", dims=DIMS, proj=proj, icer=True)
    with pytest.raises(ValueError, match="tau"):
        create_scorer("flowclip", dims=DIMS, proj=proj, tau=0.0)
    vitl = FeatureDims(grid=(24, 24), d_v=1024, d_t=768, embed_dim=768, context_length=77)
    assert fm.parameter_breakdown(vitl, "global-m") == {"gcc.M": 589_824, "total": 589_824}
    assert fm.parameter_breakdown(vitl, "flowclip") == {"gcc.M": 589_824, "icer.M_tok": 589_824, "icer.W": 589_824, "total": 1_769_472}


# ---------------------------------------------------------------------------- the objectives


def _ce(z: list[float], targets: list[int]) -> float:
    """-mean_{k in targets} log softmax(z)_k, by hand."""
    lse = math.log(sum(math.exp(x) for x in z))
    return -sum(z[k] - lse for k in targets) / len(targets)


def test_hnb_on_a_hand_computed_case():
    # captions [pos A, pos B, neg A, para B]; image 0 shows A, image 1 shows B
    z = torch.tensor([[2.0, 0.0, 1.0, -1.0], [0.5, 1.5, 0.0, 1.0]])
    P = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    Q = torch.tensor([True, True, False, True])
    loss, parts = hnb(z, P, Q)
    i2t = (_ce([2.0, 0.0, 1.0, -1.0], [0]) + _ce([0.5, 1.5, 0.0, 1.0], [1, 3])) / 2
    t2i = (_ce([2.0, 0.5], [0]) + _ce([0.0, 1.5], [1]) + _ce([-1.0, 1.0], [1])) / 3
    assert math.isclose(float(parts["i2t"]), i2t, rel_tol=1e-6)
    assert math.isclose(float(parts["t2i"]), t2i, rel_tol=1e-6)
    assert math.isclose(float(loss), (i2t + t2i) / 2, rel_tol=1e-6)
    assert float(soft_target_ce(z, torch.zeros_like(P))) == 0.0  # no positives: nothing to learn


def test_cimr_on_a_hand_computed_case():
    m, m_donor = torch.tensor([1.0, 0.5]), torch.tensor([0.2, 0.9])
    want = (math.log1p(math.exp(0.5 - 0.8)) + math.log1p(math.exp(0.5 + 0.4))) / 2
    assert math.isclose(float(cimr(m, m_donor, gamma=0.5)), want, rel_tol=1e-6)


def test_captions_of_one_identity_are_all_positives():
    # items 0 and 1 show image 7, item 2 image 9; captions [pos0, pos1, pos2, neg0, neg1, neg2]
    ident = torch.tensor([7, 7, 9])
    owner = torch.tensor([0, 1, 2, 0, 1, 2])
    true = torch.tensor([True, True, True, False, False, False])
    rows = torch.tensor([10, 11, 12, 13, 14, 15])
    P = caption_positives(torch.tensor([7, 9]), ident[owner], true, rows)
    assert P.tolist() == [[True, True, False, False, False, False], [False, False, True, False, False, False]]
    rows[5] = 10  # neg2 is pos0's text: it is true of image 7 as well
    P = caption_positives(torch.tensor([7, 9]), ident[owner], true, rows)
    assert P[0].tolist() == [True, True, False, False, False, True] and P[1].tolist()[5] is False


def test_the_donor_never_shares_the_items_identity():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        ident = torch.randint(0, 4, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
        donor = donor_index(ident)
        has = donor >= 0
        assert (ident[donor[has]] != ident[has]).all()
        assert torch.equal(has, torch.tensor([(ident != x).any().item() for x in ident], dtype=torch.bool))
    assert donor_index(torch.tensor([3, 3, 5, 3])).tolist() == [2, 2, 3, 2]  # rolled by one, same identity skipped
    assert donor_index(torch.tensor([1, 1])).tolist() == [-1, -1]


class _Fixed(torch.nn.Module):
    """A stand-in scorer whose score matrix is given: the trainer's arithmetic by hand."""

    def __init__(self, S: torch.Tensor, logit_scale: float) -> None:
        super().__init__()
        self.S = S
        self.register_buffer("logit_scale", torch.tensor(logit_scale))

    def score_matrix(self, image, text):
        assert (len(image), len(text)) == self.S.shape
        return self.S


def _pairs() -> PairData:
    """3 items: items 0 and 1 show image 0, item 2 image 1; only item 0 has a paraphrase."""
    img, txt = images(2), texts([2] * 7, seed=1)
    t = lambda *x: torch.tensor(x)  # noqa: E731
    return PairData(
        manifest=pd.DataFrame({"correct": [0, 1, 0]}), images=img, texts=txt,
        image=t(0, 0, 1), cf=t(-1, -1, -1), flip=t(-1, -1, -1), pos=t(0, 1, 2), neg=t(3, 4, 5),
        flip_pos=t(-1, -1, -1), flip_neg=t(-1, -1, -1), para=t(6, -1, -1), family=t(0, 1, 2),
    )  # fmt: skip


def test_the_trainer_reads_hnb_and_cimr_from_one_score_matrix():
    data = _pairs()
    hb = hnb_batch(data, torch.arange(3))
    assert hb.images.tolist() == [0, 1] and hb.item_image.tolist() == [0, 0, 1]
    assert hb.texts.tolist() == [0, 1, 2, 3, 4, 5, 6] and hb.donor.tolist() == [2, 2, 0]
    assert hb.positives.int().tolist() == [[1, 1, 0, 0, 0, 0, 1], [0, 0, 1, 0, 0, 0, 0]]
    assert hb.queries.tolist() == [True, True, True, False, False, False, True]
    S = torch.tensor([[0.3, 0.2, 0.0, 0.1, 0.25, 0.05, 0.2], [0.1, 0.0, 0.4, 0.3, 0.1, 0.35, 0.0]])
    t, gamma = 10.0, 0.5
    z = (t * S).tolist()
    i2t = (_ce(z[0], [0, 1, 6]) + _ce(z[1], [2])) / 2
    cols = [[z[0][k], z[1][k]] for k in range(7)]
    t2i = (_ce(cols[0], [0]) + _ce(cols[1], [0]) + _ce(cols[2], [1]) + _ce(cols[6], [0])) / 4
    m = [t * (S[0, 0] - S[0, 3]), t * (S[0, 1] - S[0, 4]), t * (S[1, 2] - S[1, 5])]  # matched images
    m_d = [t * (S[1, 0] - S[1, 3]), t * (S[1, 1] - S[1, 4]), t * (S[0, 2] - S[0, 5])]  # donors 2, 2, 0
    l_cimr = sum(math.log1p(math.exp(gamma - (float(a) - float(b)))) for a, b in zip(m, m_d, strict=True)) / 3

    loss, logged = FlowClipTrainer({}, cimr=False).loss(_Fixed(S, t), data, torch.arange(3))
    assert math.isclose(float(loss), (i2t + t2i) / 2, rel_tol=1e-5) and "cimr" not in logged
    assert math.isclose(logged["acc"], 2 / 3, rel_tol=1e-6)  # item 1's negative wins on image 0
    loss, logged = FlowClipTrainer({"gamma": gamma, "cimr_weight": 2.0}, cimr=True).loss(_Fixed(S, t), data, torch.arange(3))
    assert math.isclose(logged["cimr"], l_cimr, rel_tol=1e-5)
    assert math.isclose(float(loss), (i2t + t2i) / 2 + 2.0 * l_cimr, rel_tol=1e-5)
    no_para = hnb_batch(data, torch.arange(3), paraphrases=False)
    assert no_para.texts.tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="flowclip-cimr"):
        FlowClipTrainer({"gamma": 1.0}, cimr=False)


def test_a_paraphrase_at_text_row_0_is_a_paraphrase():
    """Only -1 marks an absent paraphrase: one stored at text row 0 joins the batch's texts
    as a positive query of its item."""
    data = dataclasses.replace(_pairs(), para=torch.tensor([-1, 0, -1]))
    hb = hnb_batch(data, torch.arange(3))
    assert hb.texts.tolist() == [0, 1, 2, 3, 4, 5, 0] and hb.queries.tolist()[-1]
    assert hb.positives[:, -1].tolist() == [True, False]  # item 1 shows image 0


def test_manifest_order_puts_each_score_on_its_caption():
    pos_neg = np.array([[1.0, 2.0], [3.0, 4.0]])
    out = manifest_order(pos_neg, pd.DataFrame({"correct": [0, 1]}))
    assert out.tolist() == [[1.0, 2.0], [4.0, 3.0]]


# ---------------------------------------------------------------------------- training on the cache


def _cfg(out, variant: str, **kw) -> TrainConfig:
    base = dict(variant=variant, seeds=[0], steps=20, batch_size=16, lr=1e-2, eval_every=10, out=str(out), threads=1)
    return TrainConfig(**{**base, **kw})


def test_identity_mask_on_the_tiny_store(tiny_store):
    from pipeline.training.pairs import load_pairs

    data = load_pairs(tiny_store, "shapes-train")  # 16 items over 12 images: items 0 and 12 share one
    assert data.image[0] == data.image[12] and data.image[0] != data.image[3]
    hb = hnb_batch(data, torch.tensor([0, 12, 3]))
    assert len(hb.images) == 2
    u = int(hb.item_image[0])
    assert hb.positives[u, :2].all() and not hb.positives[u, 2]  # pos0 and pos12, not pos3
    assert not hb.positives[:, 3:6].any()  # negatives are nobody's positive
    assert (data.image[torch.tensor([0, 12, 3])][hb.donor] != data.image[torch.tensor([0, 12, 3])]).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_reduces_the_loss_and_writes_the_layout(tmp_path, tiny_store, variant):
    from pipeline.benchmarks import SUITES
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import score_choice, suite_inputs
    from pipeline.training.loop import train_variant

    summary = train_variant(_cfg(tmp_path, variant), tiny_store, progress=False)
    root = tmp_path / variant
    for f in ("model.safetensors", "config.json", "summary.json", "seed0/model.safetensors", "seed0/config.json", "seed0/train_log.json"):
        assert (root / f).is_file(), f
    assert not (root / "seed0" / "resume.pt").exists() and "mean" in summary["spread"]
    log = json.loads((root / "seed0" / "train_log.json").read_text())
    first, last = log["steps"][0], log["steps"][-1]  # batch = all 16 items: one loss, falling
    assert last["total"] < first["total"] and ("cimr" in first) == (variant == "flowclip-cimr")

    manifest, index = suite_inputs(tiny_store, "shapes-dev")  # step 0 is frozen CLIP, on the official path
    clip = create_scorer("clip", dims=tiny_store.dims, proj=tiny_store.projections())
    frozen = SUITES.get("shapes-dev").metrics(manifest, score_choice(clip, tiny_store, index, 256))
    step0 = log["dev"][0]
    assert step0["step"] == 0 and step0 == {"step": 0, **{k: round(float(v), 6) for k, v in frozen.items()}}

    rec = json.loads((root / "config.json").read_text())
    assert rec["scorer"]["icer"] == (variant != "global-m")
    scorer = load_scorer(variant, tiny_store, tmp_path)
    assert isinstance(scorer, fm.FlowClip)
    dev = SUITES.get("shapes-dev").metrics(manifest, score_choice(scorer, tiny_store, index, 256))
    assert {k: round(float(v), 6) for k, v in dev.items()} == rec["dev"]  # the checkpoint scores as selected

    # the checkpoint names the encoder whose features it was fitted on; another one is refused
    seed0 = root / "seed0" / "config.json"
    assert json.loads(seed0.read_text())["store_encoder"] == rec["store_encoder"]
    (root / "config.json").write_text(json.dumps({**rec, "store_encoder": "another-encoder"}))
    with pytest.raises(ValueError, match="fitted on features of another encoder .*another-encoder"):
        load_scorer(variant, tiny_store, tmp_path)


def test_the_same_seed_gives_the_same_weights(tmp_path, tiny_store):
    from pipeline.training.loop import train_variant

    states = []
    for run in ("a", "b"):  # resume.pt holds the model at step 5 (the selected one may be step 0)
        cfg = _cfg(tmp_path / run, "flowclip-cimr", steps=10, eval_every=5, batch_size=8)
        assert train_variant(cfg, tiny_store, progress=False, stop_after=6) == {"stopped_at": 6}
        states.append(torch.load(tmp_path / run / "flowclip-cimr" / "seed0" / "resume.pt", weights_only=True)["model"])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert states[0]["icer.W"].abs().max() > 0  # it trained


def test_a_seed_with_the_main_weights_is_copied_not_rescored(tmp_path, tiny_store, monkeypatch):
    """`<variant>@seed0` holds the main checkpoint's weights: the score stage writes the main
    run's scores under its name without scoring again; a seed with other weights is scored;
    the seeds score `seed_suites` only, and an unknown one is refused."""
    from pipeline.config import ScoreConfig
    from pipeline.training.loop import train_variant
    from stages import score as score_stage
    from tests.conftest import extract_config_of

    train_variant(_cfg(tmp_path / "ckpt", "flowclip", seeds=[0, 1], steps=4, eval_every=2), tiny_store, progress=False)
    monkeypatch.setattr(score_stage, "open_store", lambda extract: tiny_store)
    loads = []
    real_load = score_stage.load_scorer
    monkeypatch.setattr(score_stage, "load_scorer", lambda *a, **k: loads.append(a[3]) or real_load(*a, **k))
    cfg = ScoreConfig(
        variants=["flowclip"], seed_variants=["flowclip"], suites=["shapes-dev", "shapes-train"], seed_suites=["shapes-dev"], encoder="tiny-test",
        checkpoints=str(tmp_path / "ckpt"), scores_out=str(tmp_path / "scores"), metrics_out=str(tmp_path / "metrics"),
    )
    runs = score_stage.run(cfg, extract_config_of(tiny_store), progress=False)
    assert sorted((r["variant"], r["suite"]) for r in runs) == [
        ("flowclip", "shapes-dev"), ("flowclip", "shapes-train"), ("flowclip@seed0", "shapes-dev"), ("flowclip@seed1", "shapes-dev")
    ]  # the seeds score seed_suites only
    records = {r["variant"]: r for r in runs if r["suite"] == "shapes-dev"}
    assert [None if p is None else p.name for p in loads] == [None, "seed1"]  # seed0 was not loaded
    main = pd.read_parquet(tmp_path / "scores" / "flowclip" / "shapes-dev.parquet")
    copy = pd.read_parquet(tmp_path / "scores" / "flowclip@seed0" / "shapes-dev.parquet")
    pd.testing.assert_frame_equal(main, copy)
    on_disk = json.loads((tmp_path / "metrics" / "flowclip@seed0" / "shapes-dev.json").read_text())
    assert on_disk == {**records["flowclip"], "variant": "flowclip@seed0"} == records["flowclip@seed0"]
    assert (tmp_path / "scores" / "flowclip@seed1" / "shapes-dev.parquet").is_file()
    with pytest.raises(ValueError, match="seed_suites"):
        score_stage.run(dataclasses.replace(cfg, seed_suites=["shapes-aro"]), extract_config_of(tiny_store), progress=False)
