"""Audit of Flow-CLIP against methods.md §2: a literal, loop-based float64 reference of
s(I, T) = GCC + λ·ICER, and the initialisation equalities, which the existing tests
check only through the implementation's own functions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.scorers import create_scorer
from tests.test_flowclip import DIMS, images, projections, texts, trained_like

pytestmark = pytest.mark.usefixtures("single_thread")


def evidence(x, v, tau):
    """e(q) = τ log mean_p exp(<q̂, v_p>/τ): a temperature log-(mean-)exp over patches (ours)."""
    return tau * (torch.logsumexp((v @ (x / x.norm())) / tau, 0) - math.log(len(v)))


def reference_score(model, image, text, lam=1.0, tau=0.05, max_tokens=32):
    """methods.md §2, clause by clause, one (image, caption) pair at a time, float64."""
    M = model.gcc.M.detach().double()
    M_tok = model.icer.M_tok.detach().double()  # q_i = M_tok h_i
    W = model.icer.W.detach().double()
    P_v = model.icer.visual_proj.double()
    out = []
    for b in range(len(text)):
        e_I, e_T = image.embed[b].double(), text.embed[b].double()
        gcc = F.cosine_similarity(e_I, M @ e_T, dim=0)  # cos(e_I, M e_T)
        valid_p = image.final[b].abs().amax(-1) > 0
        v = F.normalize(
            image.final[b][valid_p].double() @ P_v, dim=-1
        )  # final-layer patches, joint space, unit
        L = int(text.mask[b].sum())  # sot .. eot
        content = list(range(1, L - 1))[:max_tokens]  # SOT, EOT, padding excluded; first 32
        deltas = []
        for i in content:
            q = M_tok @ text.tokens[b, i].double()
            qh = q / q.norm()
            a = v @ qh  # a_ip
            r = torch.relu(a - a.mean())
            w = r / r.sum() if r.sum() > 0 else r  # w_ip ∝ relu(a_ip − mean_p a_ip)
            c = w @ v
            c_perp = c - (c @ qh) * qh
            q2 = q + W @ c_perp  # q'_i = q_i + W c⊥_i

            deltas.append(evidence(q2, v, tau) - evidence(q, v, tau))  # signed change e(q') − e(q)
        icer = torch.stack(deltas).mean() if deltas else torch.zeros((), dtype=torch.float64)
        out.append(gcc + lam * icer)
    return torch.stack(out)


@pytest.mark.parametrize("name", ["flowclip", "flowclip-cimr"])
def test_score_equals_the_literal_spec(name):
    model = trained_like(name)
    image, text = images(4), texts([1, 3, 5, 8], seed=1)
    want = reference_score(model, image, text)
    torch.testing.assert_close(model.score(image, text).double(), want, rtol=0, atol=1e-5)
    S = model.score_matrix(image, text)
    for i in range(4):
        row = reference_score(model, image.index(torch.full((4,), i)), text)
        torch.testing.assert_close(S[i].double(), row, rtol=0, atol=1e-5)


def test_icer_is_not_a_negligible_term_in_the_reference_case():
    """Guard: the reference comparison above is not passing because ICER is ~0."""
    model = trained_like("flowclip")
    image, text = images(4), texts([1, 3, 5, 8], seed=1)
    assert (model.icer(image, text).abs() > 1e-3).all()


def test_m_tok_is_initialised_to_clips_text_projection():
    proj = projections()
    model = create_scorer("flowclip", dims=DIMS, proj=proj)
    text = texts([3, 5], seed=1)
    q, _ = model.icer.queries(text)  # [B, N, D]
    n = q.shape[1]
    torch.testing.assert_close(q, text.tokens[:, :n] @ proj.text_projection, rtol=0, atol=1e-6)
    assert torch.equal(model.gcc.M, torch.eye(DIMS.embed_dim)) and not model.icer.W.any()


def test_icer_reads_the_final_grid_not_the_early_one():
    model = trained_like("flowclip")
    image, text = images(3), texts([2, 4, 6], seed=1)
    base = model.score(image, text)
    other_early = type(image)(torch.randn_like(image.early), image.final, image.cls, image.embed)
    assert torch.equal(model.score(other_early, text), base)
    other_final = type(image)(image.early, torch.randn_like(image.final), image.cls, image.embed)
    assert not torch.allclose(model.score(other_final, text), base)


def test_defaults_read_32_content_tokens_at_tau_005():
    """A 40-token caption: ICER averages its first 32 content tokens, at τ = 0.05 (the
    config's defaults, which params.yaml leaves in force: `scorer: {}`)."""
    model = trained_like("flowclip")
    image = images(2)
    text = texts([40, 5], seed=2, context=48)
    want = reference_score(model, image, text, lam=1.0, tau=0.05, max_tokens=32)
    torch.testing.assert_close(model.score(image, text).double(), want, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------- objectives


def _literal_loss(S, hb, t, gamma, weight, cimr_on):
    """HNB (+ CIMR) from the [U, Nt] score matrix, written out without the code's helpers."""
    U, Nt = S.shape
    z = t * S
    P = hb.positives.double()
    i2t = torch.stack(
        [-(P[u] / P[u].sum() * torch.log_softmax(z[u], 0)).sum() for u in range(U)]
    ).mean()
    q = [k for k in range(Nt) if hb.queries[k]]
    t2i = torch.stack(
        [-(P[:, k] / P[:, k].sum() * torch.log_softmax(z[:, k], 0)).sum() for k in q]
    ).mean()
    loss = (i2t + t2i) / 2
    if cimr_on:
        B = hb.n_items
        terms = []
        for b in range(B):
            d = int(hb.donor[b])
            if d < 0:
                continue
            u, ud = int(hb.item_image[b]), int(hb.item_image[d])
            m = t * (S[u, b] - S[u, B + b])  # m(I) = s(I, pos) − s(I, neg), logit units (ours)
            md = t * (S[ud, b] - S[ud, B + b])  # same captions on the donor image
            terms.append(F.softplus(gamma - (m - md)))
        loss = loss + weight * torch.stack(terms).mean()
    return loss


class _Fixed(torch.nn.Module):
    def __init__(self, S, t):
        super().__init__()
        self.S = S
        self.register_buffer("logit_scale", torch.tensor(t, dtype=S.dtype))

    def score_matrix(self, image, text):
        return self.S


@pytest.mark.parametrize("cimr_on", [False, True])
def test_objective_values_and_gradients_equal_the_literal_spec(cimr_on):
    """Values AND gradients w.r.t. every score (donor margins included: nothing is
    detached), with the default objective (cimr_weight 1, γ 1: total = HNB + CIMR)."""
    from pipeline.scorers.flowclip.training import FlowClipTrainer, hnb_batch
    from tests.test_flowclip import _pairs

    data = _pairs()
    hb = hnb_batch(data, torch.arange(3))
    g = torch.Generator().manual_seed(0)
    S0 = torch.rand(2, 7, generator=g, dtype=torch.float64)
    S1, S2 = S0.clone().requires_grad_(), S0.clone().requires_grad_()
    loss, _ = FlowClipTrainer({}, cimr=cimr_on).loss(_Fixed(S1, 10.0), data, torch.arange(3))
    want = _literal_loss(S2, hb, 10.0, 1.0, 1.0, cimr_on)
    torch.testing.assert_close(loss, want)
    loss.backward()
    want.backward()
    torch.testing.assert_close(S1.grad, S2.grad)


def test_cimr_margins_are_in_logit_units_not_the_specs_score_units():
    """The documented departure (the report's Flow-CLIP intro): CIMR reads t·(s(I, pos) −
    s(I, neg)), which differs from methods.md's unscaled s(I, pos) − s(I, neg) at γ = 1."""
    from pipeline.scorers.flowclip.training import FlowClipTrainer, hnb_batch
    from tests.test_flowclip import _pairs

    data = _pairs()
    hb = hnb_batch(data, torch.arange(3))
    S = torch.rand(2, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    t = 14.82  # the toy store's logit scale
    _, logged = FlowClipTrainer({}, cimr=True).loss(_Fixed(S, t), data, torch.arange(3))
    hnb_only = _literal_loss(S, hb, t, 1.0, 0.0, True)
    literal = float(_literal_loss(S, hb, t, 1.0, 1.0, True) - hnb_only)  # t inside the margin
    B = 3
    unscaled = []
    for b in range(B):
        u, ud = int(hb.item_image[b]), int(hb.item_image[int(hb.donor[b])])
        m, md = S[u, b] - S[u, B + b], S[ud, b] - S[ud, B + b]
        unscaled.append(F.softplus(1.0 - (m - md)))
    assert math.isclose(literal, logged["cimr"], rel_tol=1e-6)
    assert not math.isclose(logged["cimr"], float(torch.stack(unscaled).mean()), rel_tol=1e-2)
