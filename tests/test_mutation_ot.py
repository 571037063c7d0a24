"""Checks of the OT solvers that the mutation audit found unguarded: the convergence warning's
threshold, the Dantzig pricing rule of the transportation simplex on its own, and padded
costs that are not finite."""

from __future__ import annotations

import warnings

import ot
import pytest
import torch

from pipeline.ot import emd_batched, sinkhorn_log, transport
from pipeline.ot.transport import TransportSimplex

pytestmark = pytest.mark.usefixtures("single_thread")


def _problem(B=3, n=5, m=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = torch.rand(B, n, m, generator=g, dtype=torch.float64)
    a = torch.rand(B, n, generator=g, dtype=torch.float64) + 0.1
    b = torch.rand(B, m, generator=g, dtype=torch.float64) + 0.1
    return C, a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)


def test_warning_threshold_is_tol_itself():
    """The warning fires as soon as the reported error exceeds ``tol`` and not below it: a
    run whose error lies between tol and a few times tol must warn, or an unconverged plan
    passes silently."""
    C, a, b = _problem(seed=3)
    _, log = sinkhorn_log(C, a, b, epsilon=0.05, n_iters=3, warn=False)
    err = float(log.err.max())
    assert err > 0
    with pytest.warns(UserWarning, match="did not converge"):
        sinkhorn_log(C, a, b, epsilon=0.05, n_iters=3, tol=err / 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sinkhorn_log(C, a, b, epsilon=0.05, n_iters=3, tol=err * 1.01)


def test_dantzig_pricing_alone_reaches_the_pot_optimum(monkeypatch):
    """With Bland's fallback switched off, Dantzig's rule (enter the most negative reduced
    cost) must by itself pivot to the optimum and prove it: the Bland phase otherwise hides a
    pricing rule that enters non-improving cells."""
    monkeypatch.setattr(transport, "_BLAND_AFTER", transport._MAX_PIVOTS)
    C, p, q = _problem(B=4, n=5, m=6, seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pivot cap must not be reached
        plan, ok = TransportSimplex(p, q).solve(C)
    assert bool(ok.all())
    for k in range(4):
        ref = ot.emd2(p[k].numpy(), q[k].numpy(), C[k].numpy())
        assert float((plan[k] * C[k]).sum()) == pytest.approx(ref, abs=1e-12)
    torch.testing.assert_close(plan.sum(-1), p, atol=1e-12, rtol=0)
    torch.testing.assert_close(plan.sum(-2), q, atol=1e-12, rtol=0)


def test_emd_value_ignores_non_finite_costs_on_padding():
    """Padded rows / columns carry no mass, so a NaN or inf cost there (what an unused slot
    of a padded batch may hold) leaves the value and plan of the unpadded problem."""
    C, p, q = _problem(B=1, n=4, m=5, seed=5)
    ref_value, ref_plan = emd_batched(C[0], p[0], q[0])
    M = torch.zeros(6, 7, dtype=torch.float64)
    M[:4, :5] = C[0]
    M[4:, :] = float("nan")
    M[:, 5:] = float("inf")
    mask_rows = torch.tensor([True] * 4 + [False] * 2)
    mask_cols = torch.tensor([True] * 5 + [False] * 2)
    pp = torch.cat([p[0], torch.zeros(2, dtype=torch.float64)])
    qq = torch.cat([q[0], torch.zeros(2, dtype=torch.float64)])
    value, plan = emd_batched(M, pp, qq, mask_rows=mask_rows, mask_cols=mask_cols)
    assert torch.isfinite(value)
    assert float(value) == pytest.approx(float(ref_value), abs=1e-12)
    torch.testing.assert_close(plan[:4, :5], ref_plan, atol=1e-12, rtol=0)
    assert bool((plan[4:] == 0).all()) and bool((plan[:, 5:] == 0).all())
