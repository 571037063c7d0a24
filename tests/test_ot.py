"""Invariants of the shared OT solvers: marginals, POT parity, known solutions, masks."""

from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest
import torch

from pipeline.ot import hungarian, sinkhorn_log, sinkhorn_log_kernel

pytestmark = pytest.mark.usefixtures("single_thread")


def _problem(B=4, n=7, m=9, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    C = torch.rand(B, n, m, generator=g, dtype=dtype)
    a = torch.rand(B, n, generator=g, dtype=dtype) + 0.1
    b = torch.rand(B, m, generator=g, dtype=dtype) + 0.1
    return C, a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)


def test_marginals_within_tolerance():
    C, a, b = _problem()
    P, log = sinkhorn_log(C, a, b, epsilon=0.1, n_iters=200)
    assert P.shape == C.shape
    torch.testing.assert_close(P.sum(-1), a, atol=1e-8, rtol=0)
    torch.testing.assert_close(P.sum(-2), b, atol=1e-8, rtol=0)
    assert log.err.shape == (4,) and float(log.err.max()) < 1e-8


@pytest.mark.parametrize("absorb_every", [None, 1, 16])
def test_equals_pot_sinkhorn_log(absorb_every):
    C, a, b = _problem(B=3, n=6, m=11, seed=1)
    P, _ = sinkhorn_log(C, a, b, epsilon=0.05, n_iters=500, absorb_every=absorb_every)
    for k in range(3):
        ref = ot.sinkhorn(
            a[k].numpy(), b[k].numpy(), C[k].numpy(), 0.05,
            method="sinkhorn_log", numItermax=500, stopThr=0, warn=False,
        )  # fmt: skip
        np.testing.assert_allclose(P[k].numpy(), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("absorb_every", [None, 2])
def test_equals_pot_at_equal_unconverged_iterations(absorb_every):
    """Same update order as POT: equal plans even before convergence."""
    C, a, b = _problem(B=2, n=5, m=8, seed=2)
    P, _ = sinkhorn_log(C, a, b, epsilon=0.01, n_iters=5, warn=False, absorb_every=absorb_every)
    for k in range(2):
        ref = ot.sinkhorn(
            a[k].numpy(), b[k].numpy(), C[k].numpy(), 0.01,
            method="sinkhorn_log", numItermax=5, stopThr=0, warn=False,
        )  # fmt: skip
        np.testing.assert_allclose(P[k].numpy(), ref, atol=1e-12, rtol=0)


def test_absorbed_blocks_fall_back_to_log_domain_on_hard_problems(monkeypatch):
    """Tiny epsilon, wide costs: absorbed blocks underflow, are redone, and match POT."""
    import pipeline.ot.sinkhorn as sk

    calls = {"blocks": 0, "fallbacks": 0}
    absorbed = sk._absorbed_iterations

    def counting(*args):
        out = absorbed(*args)
        calls["blocks"] += 1
        calls["fallbacks"] += out is None
        return out

    monkeypatch.setattr(sk, "_absorbed_iterations", counting)
    g = torch.Generator().manual_seed(0)
    C = torch.rand(8, 6, 9, generator=g) ** 3 * 10  # float32: the absorbed kernel underflows
    a = torch.rand(8, 6, generator=g) + 0.01
    b = torch.rand(8, 9, generator=g) ** 4 + 1e-3
    a, b = a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)
    P, _ = sinkhorn_log(C, a, b, epsilon=1e-3, n_iters=300, warn=False)
    assert calls["fallbacks"] > 0 and torch.isfinite(P).all()
    P_log, _ = sinkhorn_log(C, a, b, epsilon=1e-3, n_iters=300, warn=False, absorb_every=None)
    torch.testing.assert_close(P, P_log, atol=1e-4, rtol=0)
    # in blocks with reused storage (the fallback writes its scratch there too): the same
    # plan as the same blocks recorded by autograd (fresh storage)
    fallbacks = calls["fallbacks"]
    P_blocks, _ = sinkhorn_log(C, a, b, epsilon=1e-3, n_iters=300, warn=False, batch_block=3)
    assert calls["fallbacks"] > fallbacks
    P_recorded, _ = sinkhorn_log(C.requires_grad_(True), a, b, epsilon=1e-3, n_iters=300, warn=False, batch_block=3)
    assert torch.equal(P_blocks, P_recorded.detach())


def test_absorbed_block_refuses_each_out_of_range_denominator():
    """One float32 problem of 1 row x 2 columns per case: a column whose kernel underflows
    (K^T u = 0) and a scaling that leaves the range (u >= 1 / tiny: unnormalised row mass
    1e16 multiplies u by 1e16 per iteration: 1e32 after two) each send the block back to the log domain."""
    import pipeline.ot.sinkhorn as sk

    f, g = torch.zeros(1, 1), torch.zeros(1, 2)
    rows, cols = torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool)
    b = torch.tensor([[0.5, 0.5]])
    fine = sk._absorbed_iterations(torch.zeros(1, 1, 2), f, g, torch.ones(1, 1), b, 3, rows, cols)
    assert fine is not None
    underflow = torch.tensor([[[0.0, -200.0]]])  # exp(-200) = 0 in float32
    assert sk._absorbed_iterations(underflow, f, g, torch.ones(1, 1), b, 1, rows, cols) is None
    assert sk._absorbed_iterations(torch.zeros(1, 1, 2), f, g, torch.full((1, 1), 1e16), b, 2, rows, cols) is None


def test_uniform_default_and_unbatched():
    C, _, _ = _problem(B=1)
    P, _ = sinkhorn_log(C[0], epsilon=0.2, n_iters=200)
    torch.testing.assert_close(P.sum(-1), torch.full((7,), 1 / 7, dtype=P.dtype))
    torch.testing.assert_close(P.sum(-2), torch.full((9,), 1 / 9, dtype=P.dtype))


def test_permutation_recovery_at_low_epsilon():
    g = torch.Generator().manual_seed(3)
    B, n = 5, 8
    x = torch.randn(B, n, 2, generator=g, dtype=torch.float64)
    perm = torch.stack([torch.randperm(n, generator=g) for _ in range(B)])  # [B, n]
    y = torch.gather(x, 1, perm[..., None].expand(-1, -1, 2)) + 0.01  # y[j] = x[perm[j]]
    C = torch.cdist(x, y) ** 2  # [B, n, n]
    P, log = sinkhorn_log(C, epsilon=1e-3, n_iters=2000)
    # row i goes to column j with perm[j] = i
    expected = torch.argsort(perm, dim=-1)
    assert torch.equal(P.argmax(-1), expected)
    assert float((P.amax(-1) * n).min()) > 0.99
    assert float(log.err.max()) < 1e-6


def test_masks_give_zero_mass_and_match_unpadded_problem():
    C, a, b = _problem(B=2, n=5, m=6, seed=4)
    # pad to 8 x 9 with garbage (including inf) in padded cells
    Cp = torch.full((2, 8, 9), float("inf"), dtype=C.dtype)
    Cp[:, :5, :6] = C
    g = torch.Generator().manual_seed(5)
    ap = torch.rand(2, 8, generator=g, dtype=C.dtype)  # nonzero garbage on padded rows and columns is ignored
    ap[:, :5] = a
    bp = torch.rand(2, 9, generator=g, dtype=C.dtype)
    bp[:, :6] = b
    mr = torch.arange(8) < 5
    mc = torch.arange(9) < 6
    Pp, log = sinkhorn_log(Cp, ap, bp, epsilon=0.1, n_iters=300, mask_rows=mr, mask_cols=mc)
    P, _ = sinkhorn_log(C, a, b, epsilon=0.1, n_iters=300)
    assert torch.isfinite(Pp).all()
    assert (Pp[:, 5:] == 0).all() and (Pp[:, :, 6:] == 0).all()
    torch.testing.assert_close(Pp[:, :5, :6], P, atol=1e-12, rtol=0)
    assert float(log.err.max()) < 1e-8


@pytest.mark.parametrize("absorb_every", [None, 16])
def test_padding_leaves_every_iterate_unchanged_and_warm_starts_continue(absorb_every):
    """Padded rows / columns never enter a sum, not even in the first update: a padded
    problem equals the unpadded one after any number of iterations, and a solve warm-started
    by absorbing another solve's potentials into the kernel (how BindCLIP's ``grad_iters``
    truncates backprop) continues it exactly. A peaked kernel (small plan entries) made the
    padded rows' start at 0 dominate the warm-started column sums."""
    C, a, b = _problem(B=3, n=5, m=6, seed=7)
    log_K = -C / 0.02  # peaked: kernel entries far below 1
    pad = torch.zeros(3, 8, 6, dtype=C.dtype)
    pad[:, :5] = log_K
    ap = torch.zeros(3, 8, dtype=C.dtype)
    ap[:, :5] = a
    rows = torch.arange(8) < 5
    opts = dict(warn=False, absorb_every=absorb_every)
    for n_iters in (1, 3, 10):
        P, _ = sinkhorn_log_kernel(log_K, a, b, n_iters, **opts)
        Pp, _ = sinkhorn_log_kernel(pad, ap, b, n_iters, mask_rows=rows, **opts)
        torch.testing.assert_close(Pp[:, :5], P, atol=1e-12, rtol=1e-9)
    full, _ = sinkhorn_log_kernel(pad, ap, b, 12, mask_rows=rows, **opts)
    _, warm = sinkhorn_log_kernel(pad, ap, b, 9, mask_rows=rows, **opts)
    absorbed = pad + warm.f[..., :, None] + warm.g[..., None, :]
    cont, _ = sinkhorn_log_kernel(absorbed, ap, b, 3, mask_rows=rows, **opts)
    torch.testing.assert_close(cont, full, atol=1e-12, rtol=1e-9)


def test_batch_blocks_solve_the_same_problems():
    """Blocks of the (flattened) batch are independent solves: every block size gives the
    same plan, potentials and errors as one block, with per-item masks, two leading batch
    dims, a block size that does not divide the batch, and gradients; the automatic block
    on CPU is a cache-sized count of problems."""
    from pipeline.ot.sinkhorn import _CPU_BLOCK_BYTES, _batch_block

    g = torch.Generator().manual_seed(11)
    C = torch.rand(2, 5, 6, 7, generator=g, dtype=torch.float64)  # batch [2, 5]
    rows = torch.rand(2, 5, 6, generator=g) < 0.8
    rows[..., 0] = True
    C.requires_grad_(True)
    W = torch.randn(2, 5, 6, 7, generator=g, dtype=torch.float64)
    out = {}
    for block in (0, 1, 3, 10):
        P, log = sinkhorn_log(C, epsilon=0.1, n_iters=20, mask_rows=rows, warn=False, batch_block=block)
        (grad,) = torch.autograd.grad((P * W).sum(), C)
        out[block] = (P, log.f, log.g, log.err, grad)
    for block in (1, 3, 10):
        for x, y in zip(out[block], out[0], strict=True):
            torch.testing.assert_close(x, y, atol=1e-14, rtol=0)
    with torch.no_grad():  # not recorded: blocks reuse one workspace and write P in place
        for block in (1, 3, 4):
            P, log = sinkhorn_log(C, epsilon=0.1, n_iters=20, mask_rows=rows, warn=False, batch_block=block)
            for x, y in zip((P, log.f, log.g, log.err), out[0][:4], strict=True):
                assert torch.equal(x, y)
    assert out[0][0].shape == C.shape and out[0][3].shape == (2, 5)
    assert _batch_block(torch.empty(4, 64, 1153), 4, None) == _CPU_BLOCK_BYTES // (64 * 1153 * 4)
    assert _batch_block(torch.empty(4, 64, 1153), 4, 0) == 4
    with pytest.raises(ValueError, match="batch_block"):
        sinkhorn_log(C.detach(), batch_block=-1)


def test_per_item_masks_and_uniform_default():
    C, _, _ = _problem(B=2, n=6, m=6, seed=5)
    mr = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    P, _ = sinkhorn_log(C, epsilon=0.1, n_iters=300, mask_rows=mr)
    torch.testing.assert_close(P[0].sum(-1)[:3], torch.full((3,), 1 / 3, dtype=P.dtype))
    assert (P[0, 3:] == 0).all()
    torch.testing.assert_close(P[1].sum(-1), torch.full((6,), 1 / 6, dtype=P.dtype))


def test_unrecorded_blocks_prepare_each_block_as_the_full_solve_does():
    """Blocks in the reused workspace build their own masked log-kernel: NaN / inf in
    padded rows and columns (masks per item and broadcast), the kernel form, integer costs
    and a transposed (strided) cost tensor all give the one-block plan."""
    g = torch.Generator().manual_seed(12)
    rows = torch.rand(3, 4, 6, generator=g) < 0.7
    cols = torch.rand(1, 4, 8, generator=g) < 0.7  # broadcast over the first batch dim
    rows[..., 0] = cols[..., 0] = True
    S = torch.randn(3, 4, 6, 8, generator=g, dtype=torch.float64)
    pad = ~(rows[..., :, None] & cols[..., None, :])
    S[pad] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=S.dtype)[torch.arange(int(pad.sum())) % 3]
    with torch.no_grad():
        for solve in (lambda **kw: sinkhorn_log(-S, epsilon=0.2, **kw), lambda **kw: sinkhorn_log_kernel(S / 0.2, **kw)):
            P1, log1 = solve(n_iters=30, mask_rows=rows, mask_cols=cols, warn=False, batch_block=0)
            assert torch.isfinite(P1).all() and (P1[pad.expand_as(P1)] == 0).all()
            for block in (1, 5):
                P, log = solve(n_iters=30, mask_rows=rows, mask_cols=cols, warn=False, batch_block=block)
                for x, y in zip((P, log.f, log.g, log.err), (P1, log1.f, log1.g, log1.err), strict=True):
                    assert torch.equal(x, y)
        C = torch.randint(0, 5, (7, 4, 6), generator=g)  # integer costs
        P1, _ = sinkhorn_log(C, epsilon=0.5, n_iters=20, warn=False, batch_block=0)
        P, _ = sinkhorn_log(C, epsilon=0.5, n_iters=20, warn=False, batch_block=3)
        assert P.dtype == torch.float32 and torch.equal(P, P1)
        Ct = torch.rand(7, 9, 8, generator=g, dtype=torch.float64).transpose(-1, -2)  # strided
        P1, _ = sinkhorn_log(Ct, epsilon=0.1, n_iters=20, warn=False, batch_block=0)
        P, _ = sinkhorn_log(Ct, epsilon=0.1, n_iters=20, warn=False, batch_block=3)
        assert P.is_contiguous()
        torch.testing.assert_close(P, P1, atol=1e-14, rtol=0)  # summed in another order


def test_warns_naming_the_knobs_when_not_converged():
    C, a, b = _problem(seed=6)
    with pytest.warns(UserWarning, match="n_iters.*epsilon") as record:
        sinkhorn_log(C * 10, a, b, epsilon=0.01, n_iters=2, tol=1e-6)
    assert record[0].filename == __file__  # points at the caller's line
    with pytest.warns(UserWarning, match="n_iters.*epsilon") as record:
        sinkhorn_log_kernel(-C * 10 / 0.01, a, b, n_iters=2, tol=1e-6)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sinkhorn_log(C, a, b, epsilon=0.1, n_iters=300, tol=1e-6)


def test_gradient_flows_and_matches_finite_differences():
    C, a, b = _problem(B=2, n=4, m=5, seed=7)
    C.requires_grad_(True)
    a.requires_grad_(True)
    W = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(9), dtype=C.dtype)

    def loss(C, a):
        P, _ = sinkhorn_log(C, a, b, epsilon=0.2, n_iters=50, warn=False)
        return (P * W).sum()

    loss(C, a).backward()
    assert C.grad is not None and torch.isfinite(C.grad).all() and C.grad.abs().sum() > 0
    assert a.grad is not None and torch.isfinite(a.grad).all()
    assert torch.autograd.gradcheck(lambda C: loss(C, a.detach()), (C.detach().requires_grad_(),))


def test_gradient_with_masks_is_finite():
    C, a, _ = _problem(B=2, n=5, m=6, seed=8, dtype=torch.float32)
    C.requires_grad_(True)
    mr = torch.arange(5) < 3
    P, _ = sinkhorn_log(C, mask_rows=mr, epsilon=0.1, n_iters=30, warn=False)
    (P * torch.randn(P.shape, generator=torch.Generator().manual_seed(10), dtype=P.dtype)).sum().backward()
    assert torch.isfinite(C.grad).all()
    assert (C.grad[:, 3:] == 0).all()


def test_kernel_form_equals_cost_form():
    C, a, b = _problem(seed=9)
    P1, _ = sinkhorn_log(C, a, b, epsilon=0.1, n_iters=40, warn=False)
    P2, _ = sinkhorn_log_kernel(-C / 0.1, a, b, n_iters=40, warn=False)
    torch.testing.assert_close(P1, P2, atol=0, rtol=0)


def test_epsilon_must_be_positive():
    C, a, b = _problem()
    with pytest.raises(ValueError, match="epsilon"):
        sinkhorn_log(C, a, b, epsilon=0.0)


def test_hungarian_equals_emd_on_square_uniform_problem():
    C, _, _ = _problem(B=3, n=6, m=6, seed=10)
    cols, cost = hungarian(C)
    for k in range(3):
        G = ot.emd(np.full(6, 1 / 6), np.full(6, 1 / 6), C[k].numpy())
        np.testing.assert_array_equal(cols[k], G.argmax(1))
        np.testing.assert_allclose(
            cost[k], ot.emd2(np.full(6, 1 / 6), np.full(6, 1 / 6), C[k].numpy())
        )


def test_bench_sinkhorn_reports_parity_and_extrapolation():
    from pipeline.perf.sinkhorn import bench_sinkhorn

    r = bench_sinkhorn(n_problems=6, n=5, m=7, n_iters=10, pot_subset=2, dtype="float64")
    assert r["pot_extrapolated"] and r["pot_problems_timed"] == 2
    assert r["pot_s"] == pytest.approx(r["pot_measured_s"] * 3)
    assert r["max_abs_diff"] < 1e-12 and r["speedup"] > 0
