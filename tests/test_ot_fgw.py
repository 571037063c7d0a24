"""Invariants of the batched exact FGW: POT parity (values, plans, gradients), exact OT at
alpha = 0, marginals, padding, channels, known solutions, and the padding-aware Hungarian."""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from pipeline.ot import (
    emd_batched,
    fused_gromov_wasserstein_batched,
    fused_gromov_wasserstein_offsets,
    hungarian,
)

pytestmark = pytest.mark.usefixtures("single_thread")

ALPHAS = [0.0, 0.3, 0.5, 0.9]


def _unit(g, *shape):
    return torch.nn.functional.normalize(
        torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1
    )


def _problems(B=24, seed=0, sizes=(2, 8), offsets=False):
    """Rerank-like problems of mixed sizes, padded: M = 1 - cosine and structures of random
    2-D positions (distances, or signed x / y offsets as 2 channels), max-normalised."""
    g = torch.Generator().manual_seed(seed)
    ns = torch.randint(sizes[0], sizes[1] + 1, (B,), generator=g)
    ms = torch.randint(sizes[0], sizes[1] + 1, (B,), generator=g)
    N, K = int(ns.max()), int(ms.max())
    M = 1.0 - _unit(g, B, N, 16) @ _unit(g, B, K, 16).transpose(1, 2)  # [B, N, K] in [0, 2]
    M = M / M.amax((1, 2), keepdim=True)

    def structure(k):
        pos = torch.rand(B, k, 2, generator=g, dtype=torch.float64)
        if offsets:
            return _offsets(pos)  # [B, k, k, 2]
        return torch.cdist(pos, pos)

    return {
        "M": M, "C1": structure(N), "C2": structure(K), "n": ns.tolist(), "m": ms.tolist(),
        "mask_rows": torch.arange(N)[None] < ns[:, None], "mask_cols": torch.arange(K)[None] < ms[:, None],
    }  # fmt: skip


def _pot(M, C1, C2, alpha, p=None, q=None):
    """POT's exact FGW value and plan for one unpadded problem."""
    T, log = ot.gromov.fused_gromov_wasserstein(
        M, C1, C2, p, q, loss_fun="square_loss", alpha=alpha, log=True
    )
    return float(log["fgw_dist"]), T


def _offsets(pos):
    """[..., k, k, 2] signed offsets: entry (i, l) is the position of object l minus that of i."""
    return pos[..., None, :, :] - pos[..., :, None, :]


def _brute_force(M, C1, C2, T, alpha):
    """The objective by its 4-index definition (C1 [n, n, c], C2 [m, m, c])."""
    # [n, m, n, m] over (i, j, k, l): sum_c (C1_ikc - C2_jlc)^2
    L = ((C1[:, None, :, None, :] - C2[None, :, None, :, :]) ** 2).sum(-1)
    return (1 - alpha) * (M * T).sum() + alpha * np.einsum("ijkl,ij,kl->", L, T, T)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_values_and_plans_equal_pot_on_padded_mixed_batch(alpha):
    P = _problems(seed=1)
    value, plan = fused_gromov_wasserstein_batched(
        P["M"], P["C1"], P["C2"], alpha=alpha, mask_rows=P["mask_rows"], mask_cols=P["mask_cols"]
    )
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        v, T = _pot(
            P["M"][b, :n, :m].numpy(), P["C1"][b, :n, :n].numpy(), P["C2"][b, :m, :m].numpy(), alpha
        )
        assert abs(float(value[b]) - v) < 1e-10
        np.testing.assert_allclose(plan[b, :n, :m].numpy(), T, atol=1e-10)


def test_equals_pot_with_weights_and_asymmetric_structures():
    P = _problems(B=12, seed=2, offsets=True)
    g = torch.Generator().manual_seed(3)
    p = torch.rand(P["M"].shape[:2], generator=g, dtype=torch.float64) + 0.1
    q = torch.rand(P["M"].shape[0], P["M"].shape[2], generator=g, dtype=torch.float64) + 0.1
    p, q = p * P["mask_rows"], q * P["mask_cols"]
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    C1, C2 = P["C1"][..., 0], P["C2"][..., 0]  # signed x offsets: antisymmetric
    value, _ = fused_gromov_wasserstein_batched(P["M"], C1, C2, p, q, alpha=0.5)
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        v, _ = _pot(P["M"][b, :n, :m].numpy(), C1[b, :n, :n].numpy(), C2[b, :m, :m].numpy(), 0.5,
                    p[b, :n].numpy(), q[b, :m].numpy())  # fmt: skip
        assert abs(float(value[b]) - v) < 1e-10


def test_equals_pot_with_general_asymmetric_structures():
    """Structures neither symmetric nor antisymmetric (random entries): the gradient's two
    cross terms C1 G C2^T and C1^T G C2 differ, and both must be there."""
    P = _problems(B=12, seed=5)
    g = torch.Generator().manual_seed(6)
    C1 = torch.rand(P["C1"].shape, generator=g, dtype=torch.float64)
    C2 = torch.rand(P["C2"].shape, generator=g, dtype=torch.float64)
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    value, plan = fused_gromov_wasserstein_batched(P["M"], C1, C2, alpha=0.5, **masks)
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        v, T = _pot(P["M"][b, :n, :m].numpy(), C1[b, :n, :n].numpy(), C2[b, :m, :m].numpy(), 0.5)
        assert abs(float(value[b]) - v) < 1e-10
        np.testing.assert_allclose(plan[b, :n, :m].numpy(), T, atol=1e-10)


def test_alpha_zero_is_exact_ot():
    P = _problems(seed=4)
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    value, _ = fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C2"], alpha=0.0, **masks)
    w, plan = emd_batched(P["M"], **masks)
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        ref = ot.emd2(np.full(n, 1 / n), np.full(m, 1 / m), P["M"][b, :n, :m].numpy())
        assert abs(float(value[b]) - ref) < 1e-12
        assert abs(float(w[b]) - ref) < 1e-12
    rows = P["mask_rows"].double()
    torch.testing.assert_close(plan.sum(-1), rows / rows.sum(-1, keepdim=True), atol=1e-14, rtol=0)


@pytest.mark.parametrize("alpha", [0.3, 0.9])
def test_plan_marginals_equal_p_and_q(alpha):
    P = _problems(seed=5, offsets=True)
    g = torch.Generator().manual_seed(6)
    p = (torch.rand(P["M"].shape[:2], generator=g, dtype=torch.float64) + 0.1) * P["mask_rows"]
    q = (torch.rand(P["M"].shape[0], P["M"].shape[2], generator=g, dtype=torch.float64) + 0.1) * P[
        "mask_cols"
    ]
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    _, plan = fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C2"], p, q, alpha=alpha)
    assert (plan >= 0).all()
    torch.testing.assert_close(plan.sum(-1), p, atol=1e-13, rtol=0)
    torch.testing.assert_close(plan.sum(-2), q, atol=1e-13, rtol=0)


def test_padding_changes_nothing():
    P = _problems(B=6, seed=7, sizes=(3, 5))
    n, m = P["n"][0], P["m"][0]
    M, C1, C2 = P["M"][:1, :n, :m], P["C1"][:1, :n, :n], P["C2"][:1, :m, :m]
    v0, T0 = fused_gromov_wasserstein_batched(M, C1, C2, alpha=0.5)
    # pad to 7 x 8 with garbage (NaN / large) in every padded entry, interleaved with the real ones
    rows, cols = torch.tensor([1, 3, 4, 6][:n]), torch.tensor([0, 2, 5, 6, 7][:m])
    Mp = torch.full((1, 7, 8), math.nan, dtype=torch.float64)
    Mp[:, rows[:, None], cols] = M
    C1p = torch.full((1, 7, 7), 1e6, dtype=torch.float64)
    C1p[:, rows[:, None], rows] = C1
    C2p = torch.full((1, 8, 8), math.nan, dtype=torch.float64)
    C2p[:, cols[:, None], cols] = C2
    mr = torch.zeros(1, 7, dtype=torch.bool)
    mr[:, rows] = True
    mc = torch.zeros(1, 8, dtype=torch.bool)
    mc[:, cols] = True
    for kw in ({"mask_rows": mr, "mask_cols": mc}, {"p": mr / mr.sum(), "q": mc / mc.sum()}):
        v, T = fused_gromov_wasserstein_batched(Mp, C1p, C2p, alpha=0.5, **kw)
        assert abs(float(v[0] - v0[0])) < 1e-14
        torch.testing.assert_close(T[:, rows[:, None], cols], T0, atol=1e-15, rtol=0)
        assert (
            T.sum() == pytest.approx(1.0)
            and (T[:, ~mr[0]] == 0).all()
            and (T[:, :, ~mc[0]] == 0).all()
        )


def test_one_channel_equals_the_plain_form():
    P = _problems(seed=8)
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    v3, T3 = fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C2"], alpha=0.5, **masks)
    v4, T4 = fused_gromov_wasserstein_batched(
        P["M"], P["C1"][..., None], P["C2"][..., None], alpha=0.5, **masks
    )
    torch.testing.assert_close(v4, v3, atol=1e-15, rtol=0)
    torch.testing.assert_close(T4, T3, atol=1e-15, rtol=0)


def test_channels_sum_their_square_loss_terms_with_one_plan():
    P = _problems(B=10, seed=9, offsets=True)
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    value, plan = fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C2"], alpha=0.5, **masks)
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        args = (P["M"][b, :n, :m].numpy(), P["C1"][b, :n, :n].numpy(), P["C2"][b, :m, :m].numpy())
        assert float(value[b]) == pytest.approx(
            _brute_force(*args, plan[b, :n, :m].numpy(), 0.5), abs=1e-13
        )
    # two identical channels equal one channel with structures scaled by sqrt(2): POT parity
    Cx1, Cx2 = P["C1"][..., :1], P["C2"][..., :1]
    v2, _ = fused_gromov_wasserstein_batched(
        P["M"], Cx1.expand(-1, -1, -1, 2), Cx2.expand(-1, -1, -1, 2), alpha=0.5, **masks
    )
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        ref, _ = _pot(P["M"][b, :n, :m].numpy(), math.sqrt(2) * Cx1[b, :n, :n, 0].numpy(),
                      math.sqrt(2) * Cx2[b, :m, :m, 0].numpy(), 0.5)  # fmt: skip
        assert abs(float(v2[b]) - ref) < 1e-10
    # a channel that is zero on both sides adds nothing
    zero1, zero2 = torch.zeros_like(Cx1), torch.zeros_like(Cx2)
    v1, _ = fused_gromov_wasserstein_batched(P["M"], Cx1, Cx2, alpha=0.5, **masks)
    vz, _ = fused_gromov_wasserstein_batched(
        P["M"], torch.cat([Cx1, zero1], -1), torch.cat([Cx2, zero2], -1), alpha=0.5, **masks
    )
    torch.testing.assert_close(vz, v1, atol=1e-15, rtol=0)


@pytest.mark.parametrize("alpha", [0.3, 0.9])
def test_offset_channels_are_exact_ot_on_a_shifted_cost(alpha):
    # with C_ik = x_k - x_i per channel the GW term is linear on the couplings:
    # 2 sum_ij T_ij (x_i - y_j)^2 - 2 (p.x - q.y)^2, so FGW is one exact OT problem
    g = torch.Generator().manual_seed(15)
    B, n, m = 6, 5, 7
    x = torch.rand(B, n, 2, generator=g, dtype=torch.float64)
    y = torch.rand(B, m, 2, generator=g, dtype=torch.float64)
    M = torch.rand(B, n, m, generator=g, dtype=torch.float64)
    p = torch.rand(B, n, generator=g, dtype=torch.float64) + 0.1
    q = torch.rand(B, m, generator=g, dtype=torch.float64) + 0.1
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    value, _ = fused_gromov_wasserstein_batched(M, _offsets(x), _offsets(y), p, q, alpha=alpha)
    for b in range(B):
        shift = ((x[b, :, None, :] - y[b, None, :, :]) ** 2).sum(-1)  # [n, m]
        cost = ((1 - alpha) * M[b] + 2 * alpha * shift).numpy()
        const = 2 * alpha * ((p[b] @ x[b] - q[b] @ y[b]) ** 2).sum()
        assert (
            abs(float(value[b]) - (ot.emd2(p[b].numpy(), q[b].numpy(), cost) - float(const)))
            < 1e-12
        )


@pytest.mark.parametrize("alpha", [*ALPHAS, 1.0])
def test_offsets_solver_equals_fgw_on_the_offset_structures(alpha):
    """One exact OT on the shifted cost gives the conditional gradient's FGW value on the
    same signed offsets (padded, mixed sizes, random weights), the plan inside the
    marginals and carrying that value; padding positions (NaN) change nothing."""
    P = _problems(B=30, seed=21, sizes=(1, 7))
    g = torch.Generator().manual_seed(22)
    x = torch.rand(*P["mask_rows"].shape, 2, generator=g, dtype=torch.float64)
    y = torch.rand(*P["mask_cols"].shape, 2, generator=g, dtype=torch.float64)
    p = torch.rand(P["mask_rows"].shape, generator=g, dtype=torch.float64) * P["mask_rows"]
    q = torch.rand(P["mask_cols"].shape, generator=g, dtype=torch.float64) * P["mask_cols"]
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    want, _ = fused_gromov_wasserstein_batched(P["M"], _offsets(x), _offsets(y), p, q, alpha=alpha, **masks)
    x_pad = torch.where(P["mask_rows"][..., None], x, float("nan"))
    value, plan = fused_gromov_wasserstein_offsets(P["M"], x_pad, y, p, q, alpha=alpha, **masks)
    torch.testing.assert_close(value, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(plan.sum(-1), p / p.sum(-1, keepdim=True), atol=1e-12, rtol=0)
    torch.testing.assert_close(plan.sum(-2), q / q.sum(-1, keepdim=True), atol=1e-12, rtol=0)
    assert (plan[~P["mask_rows"]] == 0).all() and (plan >= 0).all()
    T = plan.numpy()
    for b in range(5):  # the plan's own objective, by the 4-index definition
        n, m = P["n"][b], P["m"][b]
        C1, C2 = _offsets(x[b, :n]).numpy(), _offsets(y[b, :m]).numpy()
        assert abs(_brute_force(P["M"][b, :n, :m].numpy(), C1, C2, T[b, :n, :m], alpha) - float(value[b])) < 1e-12


def test_offsets_solver_does_not_see_where_the_sets_lie():
    """Translating either set changes nothing, even far from the origin, where the folded
    cost would be on the positions' scale (1e12 here) and the LP's tolerance with it."""
    P = _problems(B=20, seed=23, sizes=(1, 6))
    g = torch.Generator().manual_seed(24)
    x = torch.rand(*P["mask_rows"].shape, 2, generator=g, dtype=torch.float64)
    y = torch.rand(*P["mask_cols"].shape, 2, generator=g, dtype=torch.float64)
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    want, _ = fused_gromov_wasserstein_batched(P["M"], _offsets(x), _offsets(y), alpha=0.5, **masks)
    far, _ = fused_gromov_wasserstein_offsets(P["M"], x + 1e6, y - torch.tensor([3e5, 7e5]), alpha=0.5, **masks)
    torch.testing.assert_close(far, want, atol=1e-9, rtol=0)  # 1e6 holds positions to ~1e-10


def test_offsets_solver_refuses_mismatched_shapes():
    M = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"X must be \[2, 3, c\] and Y \[2, 4, c\]"):
        fused_gromov_wasserstein_offsets(M, torch.zeros(2, 3, 2), torch.zeros(2, 4, 1))
    with pytest.raises(ValueError, match="alpha must be in"):
        fused_gromov_wasserstein_offsets(M, torch.zeros(2, 3, 2), torch.zeros(2, 4, 2), alpha=1.5)


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_equals_pot_from_the_same_initial_plan(alpha):
    P = _problems(B=12, seed=16, sizes=(4, 8))
    masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
    g = torch.Generator().manual_seed(17)
    _, vertex = emd_batched(torch.rand(P["M"].shape, generator=g, dtype=torch.float64), **masks)
    rows, cols = P["mask_rows"].double(), P["mask_cols"].double()
    p, q = rows / rows.sum(-1, keepdim=True), cols / cols.sum(-1, keepdim=True)
    G0 = 0.5 * vertex + 0.5 * p[:, :, None] * q[:, None, :]  # a coupling off POT's default start
    value, _ = fused_gromov_wasserstein_batched(
        P["M"], P["C1"], P["C2"], alpha=alpha, G0=G0, **masks
    )
    for b, (n, m) in enumerate(zip(P["n"], P["m"], strict=True)):
        v = ot.gromov.fused_gromov_wasserstein2(
            P["M"][b, :n, :m].numpy(), P["C1"][b, :n, :n].numpy(), P["C2"][b, :m, :m].numpy(),
            alpha=alpha, G0=G0[b, :n, :m].numpy(),
        )  # fmt: skip
        assert abs(float(value[b]) - float(v)) < 1e-10


def test_signed_offsets_tell_left_from_right_where_distances_cannot():
    # query "A left of B"; image 1 has A left of B, image 2 the mirror image (A right of B)
    M = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64).expand(2, 2, 2)  # A~A, B~B
    pos_q = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    pos_i = torch.stack([pos_q, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)])
    d1, d2 = torch.cdist(pos_q, pos_q).expand(2, 2, 2), torch.cdist(pos_i, pos_i)
    v_dist, _ = fused_gromov_wasserstein_batched(M, d1, d2, alpha=0.5)
    assert float(v_dist[0]) == pytest.approx(float(v_dist[1]), abs=1e-15)  # blind to the mirror
    v_off, _ = fused_gromov_wasserstein_batched(
        M, _offsets(pos_q).expand(2, 2, 2, 2), _offsets(pos_i), alpha=0.5
    )
    assert float(v_off[0]) == pytest.approx(0.0, abs=1e-15) and float(v_off[1]) > 0.2


def test_identical_structures_and_zero_cost_give_zero():
    P = _problems(B=8, seed=10, sizes=(2, 8))
    C, mask = P["C1"], P["mask_rows"]
    M = torch.zeros(8, C.shape[1], C.shape[1], dtype=torch.float64)
    v, _ = fused_gromov_wasserstein_batched(M, C, C, alpha=0.5, mask_rows=mask, mask_cols=mask)
    torch.testing.assert_close(v, torch.zeros(8, dtype=torch.float64), atol=1e-15, rtol=0)


def test_gradients_equal_pot_envelope_gradients():
    P = _problems(B=3, seed=11, sizes=(3, 6))
    for b in range(3):
        n, m = P["n"][b], P["m"][b]
        M = P["M"][b : b + 1, :n, :m].clone().requires_grad_(True)
        C1 = P["C1"][b : b + 1, :n, :n].clone().requires_grad_(True)
        C2 = P["C2"][b : b + 1, :m, :m].clone().requires_grad_(True)
        value, _ = fused_gromov_wasserstein_batched(M, C1, C2, alpha=0.3)
        value.sum().backward()
        refs = [x.detach()[0].clone().requires_grad_(True) for x in (M, C1, C2)]
        ot.gromov.fused_gromov_wasserstein2(*refs, alpha=0.3).backward()
        for x, r in zip((M, C1, C2), refs, strict=True):
            torch.testing.assert_close(x.grad[0], r.grad, atol=1e-12, rtol=0)


def test_unbatched_input_and_float32():
    P = _problems(B=1, seed=12, sizes=(4, 4))
    v, T = fused_gromov_wasserstein_batched(P["M"][0], P["C1"][0], P["C2"][0], alpha=0.5)
    ref, _ = _pot(P["M"][0].numpy(), P["C1"][0].numpy(), P["C2"][0].numpy(), 0.5)
    assert v.shape == () and T.shape == (4, 4) and v.dtype == torch.float64
    assert abs(float(v) - ref) < 1e-12
    v32, _ = fused_gromov_wasserstein_batched(
        P["M"][0].float(), P["C1"][0].float(), P["C2"][0].float(), alpha=0.5
    )
    assert v32.dtype == torch.float64 and abs(float(v32) - ref) < 1e-6


def test_bad_arguments_raise():
    P = _problems(B=2, seed=13, sizes=(3, 3))
    with pytest.raises(ValueError, match="alpha"):
        fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C2"], alpha=1.5)
    with pytest.raises(ValueError, match="channels"):
        fused_gromov_wasserstein_batched(
            P["M"], P["C1"][..., None].expand(-1, -1, -1, 2), P["C2"][..., None]
        )
    with pytest.raises(ValueError, match="C2"):
        fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C1"][:, :2, :2])
    for bad in (-1.0, float("nan"), float("inf")):  # a negative or non-finite weight
        p = torch.full((2, 3), 1 / 3, dtype=torch.float64)
        p[0, 1] = bad
        with pytest.raises(ValueError, match="p must be finite and >= 0"):
            fused_gromov_wasserstein_batched(P["M"], P["C1"], P["C2"], p=p)
        with pytest.raises(ValueError, match="q must be finite and >= 0"):
            emd_batched(P["M"], q=p)


def test_hungarian_recovers_a_planted_permutation_and_never_matches_padding():
    rng = np.random.default_rng(14)
    B, N, K = 16, 7, 9
    C = rng.random((B, N, K)) + 1.0
    mask_rows, mask_cols = np.zeros((B, N), bool), np.zeros((B, K), bool)
    planted = np.full((B, N), -1)
    for b in range(B):
        n = rng.integers(2, N + 1)
        rows = np.sort(rng.choice(N, n, replace=False))
        cols = np.sort(rng.choice(K, rng.integers(n, K + 1), replace=False))
        mask_rows[b, rows], mask_cols[b, cols] = True, True
        planted[b, rows] = rng.permutation(cols)[:n]
        C[b, rows, planted[b, rows]] = 0.0  # the strongly preferred matching
        C[b, ~mask_rows[b]] = -10.0  # padding is the "cheapest": it must still never be matched
        C[b, :, ~mask_cols[b]] = -10.0
    cols_out, cost = hungarian(torch.tensor(C), torch.tensor(mask_rows), torch.tensor(mask_cols))
    np.testing.assert_array_equal(cols_out, planted)
    np.testing.assert_allclose(cost, 0.0)
    # without masks: scipy on the whole matrix, as before
    cols_all, cost_all = hungarian(C[0])
    r, c = linear_sum_assignment(C[0])
    np.testing.assert_array_equal(cols_all[r], c)
    assert cost_all == pytest.approx(C[0, r, c].mean())


def test_bench_fgw_reports_speed_and_parity():
    from pipeline.perf.fgw import bench_fgw

    r = bench_fgw(
        n_problems=8, sizes=((3, 4),), alphas=(0.5,), pot_batch_subset=4, repeats=1, threads=1
    )
    assert [(c["n"], c["m"]) for c in r["cases"]] == [(3, 4), ("2..8", "2..8")]
    for c in r["cases"]:
        assert c["max_abs_diff"] < 1e-10 and c["ours_ms"] > 0 and c["speedup"] > 0
    assert "pot_batch_ms" in r["cases"][0] and "pot_batch_ms" not in r["cases"][1]
