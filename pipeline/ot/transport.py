r"""Batched exact optimal transport: a transportation simplex over many small problems, in torch.

Solves, independently for every item of a batch,
:math:`\min_{T \in \Pi(p, q)} \langle T, M \rangle` with
:math:`\Pi(p, q) = \{T \ge 0 : T \mathbf{1}_m = p, \; T^\top \mathbf{1}_n = q\}`, the value
``ot.emd2`` gives per problem. It is the linear step of the batched FGW solver
(:mod:`pipeline.ot.fgw`), which needs LP *vertices*: an entropic solve returns an interior
point, the conditional-gradient iterates would never reach the vertex POT's path reaches.

Each problem keeps a revised-simplex state: its basis (a spanning tree of n + m - 1 cells),
the basic values and the basis inverse [n + m - 1, n + m - 1]. The transportation matrix is
totally unimodular, so the inverse has entries 0 and ±1 and its rank-1 pivot updates are
exact in floating point; only the basic values round. The first solve starts from the
least-cost rule (a greedy feasible basis, batched over its n + m - 1 steps); a later solve on
the same marginals starts from the previous optimal basis, which stays feasible, and needs a
pivot or two. Pivots follow Dantzig's rule (most negative reduced cost) and switch to Bland's
rule after ``_BLAND_AFTER`` pivots of one solve, which cannot cycle on the degenerate vertices
that transport problems have. Problems that have finished drop out of the batch.

Padding: rows / columns of zero weight (``mask_rows`` / ``mask_cols`` False, or zero entries
of ``p`` / ``q``) never enter the basis and carry exactly zero mass.

Functions:
    emd_batched(M, p, q, ...): exact OT, value [B] and plan [B, n, m].

References:
    G. B. Dantzig, "Linear Programming and Extensions", 1963, ch. 17 (the transportation
    simplex); R. G. Bland, "New finite pivoting rules for the simplex method", 1977.
"""

from __future__ import annotations

import warnings

import torch

# Pivots of one LP solve under Dantzig's rule before switching to Bland's rule (anti-cycling).
_BLAND_AFTER = 64
# Hard cap on the pivots of one LP solve (Bland's rule terminates far below it).
_MAX_PIVOTS = 4096
# Optimality tolerance of the LP: reduced costs above -_LP_TOL * (1 + max |cost|) count as >= 0.
_LP_TOL = 1e-12


def unit_marginals(w, mask, k, B, dtype, device, name):
    """Marginal [B, k] of unit mass: ``w`` (rescaled) or uniform over ``mask``'s True entries."""
    if w is None:
        valid = (
            torch.ones(B, k, dtype=torch.bool, device=device) if mask is None else mask.expand(B, k)
        )
        w = valid.to(dtype)
    else:
        w = w.to(dtype=dtype, device=device).expand(B, k)
        if mask is not None:
            w = torch.where(mask.expand(B, k), w, torch.zeros_like(w))
        if (w < 0).any() or not torch.isfinite(w).all():
            raise ValueError(f"{name} must be finite and >= 0")
    total = w.sum(-1, keepdim=True)
    if (total <= 0).any():
        raise ValueError(
            f"every problem needs some positive weight in {name} (and unmasked entries)"
        )
    return w / total


def _transport_matrix(n: int, m: int, dtype, device) -> torch.Tensor:
    """[n + m - 1, n m] constraint matrix of Π(p, q): row sums, then all column sums but the
    last (implied by equal masses). Variable v = i m + j is cell (i, j)."""
    A = torch.zeros(n + m - 1, n, m, dtype=dtype, device=device)
    A[torch.arange(n), torch.arange(n)] = 1.0  # row i sums cells (i, :)
    A[n + torch.arange(m - 1), :, torch.arange(m - 1)] = 1.0  # row n + j sums cells (:, j)
    return A.reshape(n + m - 1, n * m)


def _least_cost_basis(p, q, cost, enter_ok):
    """A feasible starting basis by the least-cost rule: cells [B, R] and their values [B, R].

    Each of the R = n + m - 1 steps takes the cheapest cell among the remaining rows and
    columns (zero-weight cells last), gives it min(supply, demand), and removes its row if
    that row is used up and is not the last one, its column otherwise. Every removed line
    hangs on the remaining ones by exactly one cell, so the cells form a spanning tree of
    the bipartite graph, i.e. a basis, and the values are its basic solution. Batched over
    problems; a far better start than the north-west corner (fewer pivots)."""
    B, n = p.shape
    m = q.shape[-1]
    s, d = p.clone(), q.clone()
    rows = torch.arange(B, device=p.device)
    row_on = torch.ones(B, n, dtype=torch.bool, device=p.device)
    col_on = torch.ones(B, m, dtype=torch.bool, device=p.device)
    # zero-weight cells after every real one, removed lines never (+inf)
    key0 = torch.where(enter_ok, cost, torch.full_like(cost, torch.finfo(cost.dtype).max)).reshape(
        B, n, m
    )
    basis = torch.empty(B, n + m - 1, dtype=torch.long, device=p.device)
    x_B = torch.empty(B, n + m - 1, dtype=p.dtype, device=p.device)
    for step in range(n + m - 1):
        on = row_on[:, :, None] & col_on[:, None, :]  # [B, n, m]
        cell = (
            torch.where(on, key0, torch.full_like(key0, torch.inf)).reshape(B, n * m).argmin(-1)
        )  # [B]
        i, j = cell // m, cell % m
        si, dj = s[rows, i], d[rows, j]
        x = torch.minimum(si, dj).clamp_min(0.0)
        s[rows, i] -= x
        d[rows, j] -= x
        basis[:, step], x_B[:, step] = cell, x
        n_rows, n_cols = row_on.sum(-1), col_on.sum(-1)
        drop_row = (n_rows > 1) & ((si <= dj) | (n_cols == 1))
        row_on[rows[drop_row], i[drop_row]] = False
        col_on[rows[~drop_row], j[~drop_row]] = False
    return basis, x_B


def _simplex(cost, enter_ok, Binv, x_B, basis, n, m):
    """Revised simplex: pivot each problem to an optimal basis of min <cost, x> (in place).

    A cell (i, j) has constraint column e_i + e_{n+j} (no second entry for the last column),
    so the duals y = c_B^T B^{-1} give the reduced costs d_ij = c_ij - y_i - y_{n+j} and the
    entering column is B^{-1}[:, i] + B^{-1}[:, n+j]; the basis inverse of a transportation
    problem has entries 0 and ±1, so its rank-1 pivot updates are exact.

    Args:
        cost: [B, V] costs of the cells, V = n m.
        enter_ok: [B, V] bool, cells that may enter the basis (positive row and column weight).
        Binv: [B, R, R] basis inverse, R = n + m - 1; updated in place.
        x_B: [B, R] basic values; updated in place.
        basis: [B, R] basic cells; updated in place.

    Returns:
        [B] bool, True where the solve proved optimality within ``_MAX_PIVOTS``.
    """
    tol = _LP_TOL * (1.0 + cost.abs().amax(-1))  # [B]
    ids = torch.arange(cost.shape[0], device=cost.device)  # working set: unfinished problems
    c, ok, Bi, xw, bw, tw = cost, enter_ok, Binv, x_B, basis, tol
    optimal = torch.zeros(cost.shape[0], dtype=torch.bool, device=cost.device)

    def write_back():
        if Bi is not Binv:  # the working set is a compacted copy
            Binv[ids], x_B[ids], basis[ids] = Bi, xw, bw

    for pivot in range(_MAX_PIVOTS):
        y = torch.bmm(c.gather(1, bw)[:, None, :], Bi).squeeze(1)  # [w, R] duals
        u, v = y[:, :n], torch.nn.functional.pad(y[:, n:], (0, 1))  # [w, n], [w, m]
        d = (c.view(-1, n, m) - u[:, :, None] - v[:, None, :]).reshape(
            c.shape
        )  # [w, V] reduced costs
        improving = ok & (d < -tw[:, None])  # [w, V]
        active = improving.any(-1)  # [w]
        if not bool(active.any()):
            optimal[ids] = True
            break
        if int(active.sum()) <= len(ids) // 2:  # drop finished problems from the batch
            write_back()
            optimal[ids[~active]] = True
            ids, c, ok, Bi, xw, bw, tw = (x[active] for x in (ids, c, ok, Bi, xw, bw, tw))
            d, improving, active = d[active], improving[active], active[active]
        rw = torch.arange(len(ids), device=c.device)
        if pivot < _BLAND_AFTER:  # Dantzig: most negative reduced cost
            enter = torch.where(improving, d, torch.zeros_like(d)).argmin(-1)  # [w]
        else:  # Bland: first improving cell
            enter = improving.to(torch.int8).argmax(-1)
        i, j = enter // m, enter % m
        col = Bi[rw, :, i]  # [w, R] entering column B^{-1} A_e, entries 0, ±1
        col = col + torch.where(
            (j < m - 1)[:, None], Bi[rw, :, n + j.clamp(max=m - 2)], torch.zeros_like(col)
        )
        cand = col > 0.5
        xs = xw.clamp_min(0.0)  # rounding can leave basic values just below 0
        theta = torch.where(cand, xs, torch.full_like(xs, torch.inf)).amin(
            -1, keepdim=True
        )  # [w, 1]
        # ratio-test ties (degenerate vertices): the smallest basic cell leaves (Bland)
        ties = cand & (xs <= theta + 1e-14)
        leave = torch.where(ties, bw, torch.full_like(bw, n * m)).argmin(-1)  # [w]
        prow = Bi[rw, leave].clone()  # [w, R] pivot row (pivot element 1)
        factor = torch.where(active[:, None], col, torch.zeros_like(col))  # [w, R]
        factor[rw, leave] = 0.0
        Bi -= factor[..., None] * prow[:, None, :]  # rank-1 update, exact on 0 / ±1
        xw -= factor * theta
        xw[rw[active], leave[active]] = theta[active, 0]
        bw[rw[active], leave[active]] = enter[active]
    else:
        warnings.warn(
            f"the exact LP step (transportation simplex) did not finish within {_MAX_PIVOTS} "
            "pivots for some problems; their plans are feasible but may not be optimal "
            "(check the costs for NaN / inf).",
            stacklevel=3,
        )
    write_back()
    return optimal


class TransportSimplex:
    """Exact min <cost, S> over Π(p, q) for a batch, warm-started across calls.

    The first solve starts from the least-cost basis of its costs; later solves start from
    the previous optimal basis (still feasible: Π(p, q) does not change).

    Attributes:
        Binv: [B, R, R] basis inverses, R = n + m - 1 (None before the first solve).
        x_B: [B, R] basic values.
        basis: [B, R] basic cells.
        enter_ok: [B, n m] cells of positive row and column weight.
    """

    def __init__(self, p: torch.Tensor, q: torch.Tensor):
        self.p, self.q = p, q
        self.enter_ok = ((p[:, :, None] > 0) & (q[:, None, :] > 0)).reshape(p.shape[0], -1)
        self.Binv = self.x_B = self.basis = None

    def solve(self, cost: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Optimal vertex [B, n, m] of the costs [B, n, m], and [B] bool optimality proven."""
        B, n, m = cost.shape
        cost = cost.reshape(B, n * m)
        if self.basis is None:
            self.basis, self.x_B = _least_cost_basis(self.p, self.q, cost, self.enter_ok)
            A = _transport_matrix(n, m, cost.dtype, cost.device)
            self.Binv = torch.linalg.inv(
                A.T[self.basis].transpose(-1, -2)
            ).round()  # [B, R, R], 0 / ±1
        ok = _simplex(cost, self.enter_ok, self.Binv, self.x_B, self.basis, n, m)
        x = torch.zeros_like(cost).scatter_(1, self.basis, self.x_B.clamp_min(0.0))
        return (x * self.enter_ok).reshape(B, n, m), ok  # zero-weight cells hold only rounding

    def take(self, keep: torch.Tensor) -> None:
        """Keep only the problems ``keep`` (bool [B] or indices)."""
        self.p, self.q, self.enter_ok = self.p[keep], self.q[keep], self.enter_ok[keep]
        if self.basis is not None:
            self.Binv, self.x_B, self.basis = self.Binv[keep], self.x_B[keep], self.basis[keep]


def emd_batched(
    M: torch.Tensor,
    p: torch.Tensor | None = None,
    q: torch.Tensor | None = None,
    mask_rows: torch.Tensor | None = None,
    mask_cols: torch.Tensor | None = None,
    dtype: torch.dtype | None = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Exact optimal transport :math:`\min_{T \in \Pi(p, q)} \langle T, M \rangle`, batched.

    The linear step of :func:`fused_gromov_wasserstein_batched` on its own (a batched
    transportation simplex; see the module docstring), equal to ``ot.emd2`` per problem.

    Args:
        M: [B, n, m] (or [n, m]) cost matrices.
        p: [B, n] row weights; uniform over the valid rows if None; rescaled to unit mass.
        q: [B, m] column weights; uniform over the valid columns if None.
        mask_rows: [B, n] bool, False for padded rows (weight 0).
        mask_cols: [B, m] bool, False for padded columns.
        dtype: dtype the solver runs in and returns (None: M's).

    Returns:
        value: [B] optimal costs (differentiable w.r.t. M: the gradient is the plan).
        plan: [B, n, m] an optimal vertex plan, exact zeros on padded rows / columns.
    """
    squeeze = M.dim() == 2
    if squeeze:
        M, p, q, mask_rows, mask_cols = (
            None if x is None else x[None] for x in (M, p, q, mask_rows, mask_cols)
        )
    if M.dim() != 3:
        raise ValueError(f"M must be [B, n, m] or [n, m], got shape {tuple(M.shape)}")
    M = M.to(dtype or M.dtype)
    B, n, m = M.shape
    p = unit_marginals(p, mask_rows, n, B, M.dtype, M.device, "p")
    q = unit_marginals(q, mask_cols, m, B, M.dtype, M.device, "q")
    keep = (p[:, :, None] > 0) & (q[:, None, :] > 0)
    M = torch.where(keep, M, torch.zeros_like(M))
    with torch.no_grad():
        plan, _ = TransportSimplex(p, q).solve(M.detach())  # warns if a solve hit the pivot cap
    value = (M * plan).sum((-1, -2))
    return (value[0], plan[0]) if squeeze else (value, plan)
