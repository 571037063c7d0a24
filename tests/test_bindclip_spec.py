"""BindCLIP against methods.md §1, term by term: the §1.2 marginals and §1.4 energies recomputed
from one explanation by a loop-by-loop transcription of the spec, the §1.5 consensus moves, the
score's composition, the plan's Gibbs form and iteration count, the gradient through every path
(finite differences), and the invariants under params.yaml's scorer options as well as the
dataclass defaults."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.config import read_params
from pipeline.features import TextFeatures
from pipeline.ot import sinkhorn_log_kernel
from tests.test_bindclip import _batch, _model
from tests.test_scorers_contract import DIMS

ROOT = Path(__file__).resolve().parents[1]
PARAMS_SCORER = read_params(ROOT / "params.yaml")["train"]["bindclip"]["scorer"]
CONFIGS = {"defaults": {}, "params.yaml": PARAMS_SCORER, "var_floor": {"var_floor": 1e-2}}
L = 2  # visual depths (early, final)

pytestmark = pytest.mark.usefixtures("single_thread")


def _edited_batch():
    """B = A with content token 2 replaced (and a slightly different global embedding): the
    shared tokens' residuals fall below the floor, so r ∝ max(u, floor) is not ∝ u."""
    image, a, _ = _batch()
    b = TextFeatures(a.ids.clone(), a.mask.clone(), a.tokens.clone(), a.embed.clone())
    g = torch.Generator().manual_seed(5)
    edited = a.content_mask[:, 3]  # content token 2 (position 3) where the caption has one
    b.tokens[edited, 3] = torch.randn(int(edited.sum()), DIMS.d_t, generator=g)
    b.embed = b.embed + 0.1 * torch.randn(b.embed.shape, generator=g)
    return image, a, b


BATCHES = {"random": _batch, "one-token-edit": _edited_batch}


def _spec_energies(P, r, S, u, toks, d, gate, coords, var_floor, scale):
    """methods.md §1.4 for one caption in one view, in float64 with Python loops.

    ``P``, ``S``: {token: [V, R]} plan mass and compatibility on the view's cells (V depths);
    ``r``, ``u``: {token: float}; ``d``: {token: [5]} relation head; ``gate``: {token: float};
    ``scale``: L for a single depth (the linear readouts of one depth carry a factor L), 1 for
    the depths summed. Returns (semantic, entity, order, spatial).
    """
    r_sum = sum(r[i] for i in toks)
    sem = scale * sum(float((P[i] * S[i]).sum()) for i in toks) / r_sum
    grounded = {i: scale * float(P[i].sum()) / r[i] for i in toks}  # g_i = 1 - P_{i,null} / r_i
    ent = sum(u[i] * grounded[i] for i in toks) / max(sum(u[i] for i in toks), 1e-6)
    rho = {i: P[i].sum(0) / P[i].sum() for i in toks}  # distribution over patches
    num = den = 0.0
    for i in toks:  # adjacent pairs, weighted by their row masses
        if i + 1 in rho:
            num += r[i] * r[i + 1] * float(torch.sqrt(rho[i] * rho[i + 1]).sum())
            den += r[i] * r[i + 1]
    order = num / den if den else 0.0
    z, mass = {}, {}
    for i in toks:  # centroid, log-spread; span weight = grounded mass (times the gate)
        mu = (rho[i][:, None] * coords).sum(0)
        var = float((rho[i] * ((coords - mu) ** 2).sum(-1)).sum())
        z[i] = torch.cat([mu, torch.tensor([0.5 * math.log(var + var_floor)], dtype=torch.float64)])
        mass[i] = float(P[i].sum()) * gate[i]

    def span(ids):
        return sum(mass[i] * z[i] for i in ids) / sum(mass[i] for i in ids)

    spatial = 0.0
    for k in toks:
        before, after = [i for i in toks if i < k], [i for i in toks if i > k]
        others = [i for i in toks if i != k]
        term = 0.0
        if before and after:
            term += float((d[k][:3] * (span(after) - span(before))).sum())
        if others:
            term += float((d[k][3:] * (span(others)[:2] - 0.5)).sum())
        spatial += r[k] * term
    return sem, ent, order, spatial / r_sum


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_marginals_and_energies_follow_the_spec(config, batch):
    """§1.2 and §1.4 recomputed from the explanation's plan, S, u and relation head with a
    transcription of the spec: row mass (1 - nu_t)/2 per caption ∝ max(u, floor); cells share
    1 - nu_v ∝ Σ_i r_i softmax_c(S_ic / tau); semantic Σ P S / Σ r; entity u-weighted grounded
    fraction; order r_i r_{i+1}-weighted Bhattacharyya overlap; spatial r-weighted relation
    reading of grounded-mass span means. Depths summed and each depth on its own."""
    m = _model(**config)
    cfg = m.config
    image, a, b = batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    n, R = e.u.shape[-1], m.coords.shape[0]
    S_rows = e.S.reshape(-1, 2 * n, L * R).double()
    r_rows = e.r[:, : 2 * n].double()
    evidence = torch.zeros(S_rows.shape[0], L * R, dtype=torch.float64)
    for i in range(2 * n):
        evidence += r_rows[:, i, None] * torch.softmax(S_rows[:, i] / cfg.tau, -1)
    want_c = (1 - cfg.nu_v) * evidence / evidence.sum(-1, keepdim=True)
    torch.testing.assert_close(e.c[:, :-1].double(), want_c, atol=1e-6, rtol=1e-4)

    coords = m.coords.double()
    for item in range(e.score.shape[0]):
        for x in range(2):
            toks = [i for i in range(n) if e.token_mask[item, x, i]]
            u = {i: float(e.u[item, x, i]) for i in toks}
            w = {i: max(u[i], cfg.floor) for i in toks}
            got_r = {i: float(e.r[item, x * n + i]) for i in toks}
            for i in toks:
                want = 0.5 * (1 - cfg.nu_t) * w[i] / sum(w.values())
                assert got_r[i] == pytest.approx(want, rel=1e-4, abs=1e-7), ("r", item, x, i)
            P = {i: e.plan[item, x * n + i, :-1].double().reshape(L, R) for i in toks}
            S = {i: S_rows[item, x * n + i].reshape(L, R) for i in toks}
            d = {i: e.relation[item, x, i].double() for i in toks}
            gate = {i: float(e.span_gate[item, x, i]) if e.span_gate is not None else 1.0 for i in toks}
            views = [(slice(None), 1, e.energies[item, x])]  # depths summed
            views += [(slice(k, k + 1), L, e.energies_depth[item, x, k]) for k in range(L)]  # each depth
            for cols, scale, got in views:
                want = _spec_energies(
                    {i: P[i][cols] for i in toks}, got_r, {i: S[i][cols] for i in toks}, u,
                    toks, d, gate, coords, cfg.var_floor, scale,
                )  # fmt: skip
                for k, name in enumerate(("semantic", "entity", "order", "spatial")):
                    assert float(got[k]) == pytest.approx(want[k], rel=2e-3, abs=2e-5), (name, item, x, cols)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_consensus_moves_are_gamma_times_the_mean_per_depth_move_of_a_minus_b(config):
    """§1.5: δ_k^l = E_k^l(A) - E_k^l(B); q_k = |mean_l δ| / (std_l δ + floor) with the
    population std; γ_k = q⁴ / (q⁴ + q0⁴); the refined move is γ_k mean_l δ_k^l (A minus B,
    so that a move towards A raises s)."""
    m = _model(**config)
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    delta = e.energies_depth[:, 0] - e.energies_depth[:, 1]  # [B, L, 4]
    q = delta.mean(1).abs() / (delta.std(1, unbiased=False) + m.config.uncertainty_floor)
    torch.testing.assert_close(e.agreement, q, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(e.contraction, q**4 / (q**4 + m.config.q0**4), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(e.moves, e.contraction * delta.mean(1), atol=1e-6, rtol=1e-5)
    assert (e.moves.abs() > 1e-6).any(), "the check needs non-zero moves"


@pytest.mark.parametrize("name", ["bindclip", "bindclip-noconsensus"])
def test_score_is_clip_margin_of_a_over_b_plus_scaled_moves(name):
    """§1.4: s = g + Σ_k exp(λ_k) move_k with g = τ_CLIP (⟨e_I, e_A⟩ - ⟨e_I, e_B⟩), CLIP's own
    logit margin with A first. Antisymmetry alone cannot pin either sign: -g or -Σ would stay
    antisymmetric."""
    m = _model(name)
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    e_i = F.normalize(image.embed, dim=-1)
    cos_a = (e_i * F.normalize(a.embed, dim=-1)).sum(-1)
    cos_b = (e_i * F.normalize(b.embed, dim=-1)).sum(-1)
    g = m.logit_scale * (cos_a - cos_b)
    torch.testing.assert_close(e.margin, g)
    scales = m.scale_logits.detach().exp()
    torch.testing.assert_close(e.scales, scales)
    torch.testing.assert_close(e.score, g + (e.moves * scales).sum(-1), atol=1e-5, rtol=1e-5)
    assert float((e.moves * scales).sum(-1).abs().max()) > 0.1, "the check needs a learned part"


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_plan_has_the_gibbs_form_of_cost_minus_s_at_epsilon(config):
    """§1.3: the entropic plan for the cost -S at temperature ε is a diagonal scaling of
    exp(S / ε): log P_ic - S_ic / ε = f_i + g_c (null row and column at S = 0), after any
    number of Sinkhorn iterations. Double-centring log P - S/ε over valid rows and all columns
    leaves nothing; a flipped cost sign or another ε leaves ~S/ε."""
    m = _model(**config)
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    B, n = e.score.shape[0], e.u.shape[-1]
    S_full = F.pad(e.S.reshape(B, 2 * n, -1), (0, 1, 0, 1)).double()  # null row / column: 0
    valid = torch.cat([e.token_mask.reshape(B, 2 * n), torch.ones(B, 1, dtype=torch.bool)], -1)
    for item in range(B):
        G = e.plan[item][valid[item]].double().log() - S_full[item][valid[item]] / m.config.epsilon
        G = G - G.mean(-1, keepdim=True) - G.mean(-2, keepdim=True) + G.mean()
        assert float(G.abs().max()) < 1e-3, item


@pytest.mark.filterwarnings("ignore:sinkhorn_log did not converge")
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_plan_is_the_k_iteration_solve_of_the_stated_kernel(config, grad):
    """§1.3: the plan is K = n_iters Sinkhorn iterations on exp(S / ε) with marginals (r, c),
    padded rows masked; with grad_iters under autograd, still the same K iterations. At a small
    ε the solve is far from converged after K iterations, so fewer iterations give another
    plan."""
    m = _model(**{**config, "epsilon": 0.01, "n_iters": 24})
    image, a, b = _batch()
    with torch.set_grad_enabled(grad):
        e = m.explain(image, a, b)
    B, n = e.score.shape[0], e.u.shape[-1]
    S_full = F.pad(e.S.detach().reshape(B, 2 * n, -1), (0, 1, 0, 1))
    rows = torch.cat([e.token_mask.reshape(B, 2 * n), torch.ones(B, 1, dtype=torch.bool)], -1)
    r, c = e.r.detach(), e.c.detach()
    with torch.no_grad():
        want, log = sinkhorn_log_kernel(S_full / 0.01, r, c, 24, mask_rows=rows, warn=False)
        fewer, _ = sinkhorn_log_kernel(S_full / 0.01, r, c, 12, mask_rows=rows, warn=False)
    assert float((fewer - want).abs().max()) > 1e-4  # the iteration count shows in the plan
    torch.testing.assert_close(e.plan.detach(), want, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(e.marginal_err, log.err, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_gradient_matches_finite_differences_along_every_parameter(config):
    """§1.3 asks for a differentiable plan, and r, c, u and γ are functions of the parameters
    too: autograd's directional derivative of Σ s along a random direction of each parameter
    tensor matches a central finite difference (10% + 0.01; float32 noise is ~0.004). A detached
    residual, column marginal or contraction drops a term of the exact gradient.
    grad_iters (truncated backprop) is off here: it changes the gradient by design."""
    m = _model(**{**config, "grad_iters": None})
    image, a, b = _batch()
    params = dict(m.named_parameters())
    grads = torch.autograd.grad(m.score_pair(image, a, b).sum(), list(params.values()))
    g = torch.Generator().manual_seed(0)
    h = 1e-2
    for (name, p), grad in zip(params.items(), grads, strict=True):
        v = torch.randn(p.shape, generator=g)
        v = v / v.norm()
        with torch.no_grad():
            p.add_(h * v)
            up = m.score_pair(image, a, b).sum()
            p.sub_(2 * h * v)
            down = m.score_pair(image, a, b).sum()
            p.add_(h * v)
        fd, ad = float((up - down) / (2 * h)), float((grad * v).sum())
        assert abs(fd - ad) < 0.1 * abs(fd) + 0.01, (name, fd, ad)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_invariants_hold_under_the_trained_options(config):
    """The scorer as trained (params.yaml's train.bindclip.scorer: text_center, span_gate,
    nu_v, tau, ...) keeps §1's invariants, as the defaults do: exact antisymmetry, zero for
    identical captions, an item's score independent of its batch neighbours (padding must not
    enter text_center's caption mean), and the plan's marginals r and c."""
    m = _model(**config)
    for key, value in config.items():
        assert getattr(m.config, key) == value
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
        s_ba = m.score_pair(image, b, a)
        same = m.score_pair(image, a, a)
        idx = torch.tensor([3])  # the item with a 1-token caption, padded to 9 in the batch
        alone = m.score_pair(image.index(idx), a.index(idx), b.index(idx))
    torch.testing.assert_close(s_ba, -e.score, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(same, torch.zeros(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(alone, e.score[idx], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(e.plan.sum(-1), e.r, atol=1e-6, rtol=0)
    torch.testing.assert_close(e.plan.sum(-2), e.c, atol=1e-6, rtol=0)


def test_span_gate_stays_above_its_floor():
    """span_gate (params.yaml turns it on): gate = floor + (1 - floor) σ(a·φ_t(H) + b), so
    a zero-initialised gate is floor + (1 - floor)/2 and a gate driven to σ = 0 is exactly the
    floor: a span never loses all its weight."""
    m = _model(span_gate=True)
    floor = m.config.span_gate_floor
    image, a, b = _batch()
    with torch.no_grad():
        torch.nn.init.zeros_(m.span_gate.weight)
        torch.nn.init.zeros_(m.span_gate.bias)
        mid = m.explain(image, a, b)
        m.span_gate.bias.fill_(-60.0)
        low = m.explain(image, a, b)
    valid = mid.token_mask
    torch.testing.assert_close(mid.span_gate[valid], torch.full_like(mid.span_gate[valid], floor + (1 - floor) / 2))
    torch.testing.assert_close(low.span_gate[valid], torch.full_like(low.span_gate[valid], floor))
