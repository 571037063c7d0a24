r"""Batched exact Fused Gromov–Wasserstein by conditional gradient, in torch.

Solves, independently for every item of a batch of small problems,

.. math::
    \mathrm{FGW}_\alpha = \min_{T \in \Pi(p, q)} (1-\alpha) \langle T, M \rangle
    + \alpha \sum_{c} \sum_{ijkl} (C^{(1)}_{ikc} - C^{(2)}_{jlc})^2 \, T_{ij} T_{kl},
    \qquad \Pi(p, q) = \{T \ge 0 : T \mathbf{1}_m = p, \; T^\top \mathbf{1}_n = q\},

which for one channel is the objective of ``ot.gromov.fused_gromov_wasserstein2(M, C1, C2,
p, q, loss_fun="square_loss", alpha=alpha)`` [Vayer et al. 2019]. Several channels share one
plan and add their square-loss terms: signed 2-D offsets (channel x, channel y) tell
"A left of B" from "B left of A", which a distance matrix, invariant to reflections, cannot.
Structures need not be symmetric.

The solver is POT's conditional gradient (Frank–Wolfe, ``ot.optim.cg``) run on the whole
batch at once. From :math:`T_0 = p q^\top` each iteration

1. linearises: :math:`G = (1-\alpha) M + \alpha \nabla \mathrm{GW}(T)` with
   :math:`\nabla \mathrm{GW}(T) = c + c' - 2 (C^{(1)} T C^{(2)\top} + C^{(1)\top} T C^{(2)})`,
   :math:`c_{ij} = \sum_k C^{(1)2}_{ik} p_k + \sum_l C^{(2)2}_{jl} q_l` (and :math:`c'` of the
   transposed structures; channels summed);
2. solves the linear program :math:`S = \arg\min_{S \in \Pi(p, q)} \langle G, S \rangle` exactly;
3. takes the exact line search of the square loss: along :math:`T + t \Delta`,
   :math:`\Delta = S - T`, the objective changes by :math:`a t^2 + b t` with
   :math:`a = -2\alpha \langle C^{(1)} \Delta C^{(2)\top}, \Delta \rangle` and
   :math:`b = (1-\alpha)\langle M, \Delta\rangle - 2\alpha(\langle C^{(1)} \Delta C^{(2)\top}, T\rangle
   + \langle C^{(1)} T C^{(2)\top}, \Delta\rangle)` (the :math:`c` terms vanish: :math:`\Delta`
   has zero marginals), minimised over :math:`t \in [0, 1]` in closed form as
   ``ot.optim.solve_1d_linesearch_quad`` does (a concave quadratic takes t = 1 or t = 0);
4. stops a problem as POT does, when the objective moved by less than ``tol_abs`` or by
   less than ``tol_rel`` relative to its value.

**The linear step is an exact batched transportation simplex**, not an entropic solve:

(i) On these problems FW moves from LP vertex to LP vertex. For Euclidean distance
structures the GW term is concave on :math:`\Pi(p, q)`: a direction :math:`\Delta` with zero
marginals satisfies :math:`\Delta = J \Delta J` (:math:`J` the centring matrix) and
:math:`J C J \preceq 0` for a distance matrix (conditionally negative definite), so
:math:`\langle C^{(1)} \Delta C^{(2)}, \Delta\rangle \ge 0` and :math:`a \le 0`: every line
search takes t = 1 or stops. For signed offsets :math:`C_{ik} = x_k - x_i` the GW term is even
*linear* on :math:`\Pi(p, q)`, :math:`2 \sum_{ij} T_{ij} (x_i - y_j)^2 - 2 (p^\top x - q^\top y)^2`
per channel (a = 0), so FGW with offset channels is one exact OT problem on the cost
:math:`(1-\alpha) M + 2\alpha \sum_c (x_{ic} - y_{jc})^2`, globally solved by the first LP
step. POT's loop measured 2.0 iterations on average for n = m <= 8, 2.4–3.4 for 3 x 7.
An exact LP reproduces POT's path step by step (the LP optimum is unique for generic
costs), hence POT's local optimum where the GW term is non-convex.

(ii) An entropic LP returns an interior point: the iterates never reach the vertex, the
steps shrink, and in the non-convex case the path can enter another basin; rounding it
afterwards would be a heuristic of its own.

(iii) It is cheap and exact. Each problem keeps a revised-simplex state: its basis (a
spanning tree of n + m - 1 cells), the basic values and the basis inverse [n + m - 1,
n + m - 1]. The transportation matrix is totally unimodular, so the inverse has entries 0
and ±1 and its rank-1 pivot updates are exact in floating point; only the basic values
round. The first solve starts from the least-cost rule (a greedy feasible basis, batched
over its n + m - 1 steps); later solves start from the previous iteration's optimal basis,
which stays feasible because :math:`\Pi(p, q)` does not change, and need a pivot or two.
Pivots follow Dantzig's rule (most negative reduced cost) and switch to Bland's rule after
``_BLAND_AFTER`` pivots of one solve, which cannot cycle on the degenerate vertices that
transport problems have. Problems that have finished drop out of the batch, in the LP
and in the FW loop.

Structures that are neither (e.g. random non-metric matrices) can make the GW term convex
along some directions; FW then takes interior steps and converges sublinearly, in POT as
here (measured: hundreds of iterations, 2–35 ms per problem in POT at n = m = 4..8), and
the batch runs as long as its slowest problem.

Padding: rows / columns of zero weight (``mask_rows`` / ``mask_cols`` False, or zero entries
of ``p`` / ``q``) are never entered into the LP basis and carry exactly zero mass; their
entries of M, C1, C2 are ignored (set to zero), so padding changes nothing.

Gradients: the iterations run without autograd; the returned value is the objective at the
returned (detached) plan evaluated on the inputs, so autograd gives the envelope-theorem
gradients with respect to M, C1 and C2, the ones POT's ``fused_gromov_wasserstein2`` sets
(:math:`\partial/\partial M = (1-\alpha) T`, :math:`\partial/\partial C^{(1)} =
2\alpha (C^{(1)} \circ p p^\top - T C^{(2)} T^\top)` for one channel). There are none with
respect to p and q (POT takes those from the LP duals).

Agreement with POT (``tests/test_ot_fgw.py``, ``pipeline.perf.fgw.bench_fgw``): on random
rerank-like problems (M = 1 - cosine, distance structures, max-normalised; n = m in
{2, 4, 8}, 3 x 7, and mixed 2..8 padded to 8; alpha in {0, 0.3, 0.5, 0.9}; 4000 problems
per case) the values equal POT's exact ``fused_gromov_wasserstein2`` to <= 5e-16 and the
plans to 1e-10: both follow the same FW path from the same start. The GW term is not
convex, and the start matters: from another coupling ``G0`` both end elsewhere (values
moved by > 1e-3 in the tests), again in agreement with each other. Signed-offset
channels, where FGW is one exact OT problem (above), match that OT value to 1e-12.
POT's entropic ``ot.batch.solve_gromov_batch`` (reg = 1e-2) differs by 3e-3 to 0.2.

Functions:
    fused_gromov_wasserstein_batched(M, C1, C2, p, q, alpha, ...): value [B] and plan [B, n, m].
    emd_batched(M, p, q, ...): exact OT (the linear step alone), value [B] and plan [B, n, m].

References:
    T. Vayer, L. Chapel, R. Flamary, R. Tavenard and N. Courty, "Optimal transport for
    structured data with application on graphs", ICML 2019.
    G. Peyré, M. Cuturi and J. Solomon, "Gromov-Wasserstein averaging of kernel and distance
    matrices", ICML 2016 (the square-loss decomposition).
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


def _weights(w, mask, k, B, dtype, device, name):
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


class _TransportLP:
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
    p = _weights(p, mask_rows, n, B, M.dtype, M.device, "p")
    q = _weights(q, mask_cols, m, B, M.dtype, M.device, "q")
    keep = (p[:, :, None] > 0) & (q[:, None, :] > 0)
    M = torch.where(keep, M, torch.zeros_like(M))
    with torch.no_grad():
        plan, _ = _TransportLP(p, q).solve(M.detach())  # warns if a solve hit the pivot cap
    value = (M * plan).sum((-1, -2))
    return (value[0], plan[0]) if squeeze else (value, plan)


def _channels(C: torch.Tensor, k: int, B: int, name: str) -> torch.Tensor:
    """[B, c, k, k] structures from [B, k, k] or [B, k, k, c]."""
    if C.dim() == 3:
        C = C[..., None]
    if C.dim() != 4 or C.shape[1:3] != (k, k) or C.shape[0] not in (1, B):
        raise ValueError(
            f"{name} must be [B, {k}, {k}] or [B, {k}, {k}, c], got shape {tuple(C.shape)}"
        )
    return C.expand(B, -1, -1, -1).permute(0, 3, 1, 2)


def _cross(C1: torch.Tensor, T: torch.Tensor, C2: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_c C^{(1)}_c T C^{(2)\top}_c`, [B, n, m] from C1 [B, c, n, n], T [B, n, m], C2 [B, c, m, m]."""
    return torch.matmul(torch.matmul(C1, T[:, None]), C2.transpose(-1, -2)).sum(1)


def _constant(C1, C2, p, q):
    r"""[B, n, m] :math:`c_{ij} = \sum_c \sum_k C^{(1)2}_{ikc} p_k + \sum_c \sum_l C^{(2)2}_{jlc} q_l`."""
    r = torch.matmul(C1.square(), p[:, None, :, None]).sum(1)  # [B, n, 1]
    s = torch.matmul(C2.square(), q[:, None, :, None]).sum(1)  # [B, m, 1]
    return r + s.transpose(-1, -2)


def _objective(M, C1, C2, T, alpha):
    r"""[B] :math:`(1-\alpha)\langle T, M\rangle + \alpha \sum_c \sum_{ijkl} (C^{(1)}_{ikc} - C^{(2)}_{jlc})^2 T_{ij} T_{kl}`,
    exact for any T (the marginals are T's own), differentiable in M, C1, C2."""
    const = (_constant(C1, C2, T.sum(-1), T.sum(-2)) * T).sum((-1, -2))  # [B]
    cross = (_cross(C1, T, C2) * T).sum((-1, -2))  # [B]
    return (1.0 - alpha) * (M * T).sum((-1, -2)) + alpha * (const - 2.0 * cross)


def fused_gromov_wasserstein_batched(
    M: torch.Tensor,
    C1: torch.Tensor,
    C2: torch.Tensor,
    p: torch.Tensor | None = None,
    q: torch.Tensor | None = None,
    alpha: float = 0.5,
    mask_rows: torch.Tensor | None = None,
    mask_cols: torch.Tensor | None = None,
    G0: torch.Tensor | None = None,
    symmetric: bool | None = None,
    max_iter: int = 10_000,
    tol_rel: float = 1e-9,
    tol_abs: float = 1e-9,
    dtype: torch.dtype | None = torch.float64,
    warn: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Exact Fused Gromov–Wasserstein (square loss) for a batch of small problems.

    .. math::
        \min_{T \in \Pi(p, q)} (1-\alpha) \langle T, M \rangle
        + \alpha \sum_c \sum_{ijkl} (C^{(1)}_{ikc} - C^{(2)}_{jlc})^2 T_{ij} T_{kl}

    by conditional gradient with an exact LP step and exact line search (module docstring);
    per problem the same iterations as ``ot.gromov.fused_gromov_wasserstein2(M, C1, C2, p, q,
    loss_fun="square_loss", alpha=alpha)`` with its defaults. The GW term is non-convex, so
    the result is the local optimum reached from ``G0`` (default :math:`p q^\top`, as POT).

    Args:
        M: [B, n, m] (or [n, m]) feature cost, e.g. ``1 - cosine``.
        C1: [B, n, n] or [B, n, n, c] structure of the first set (channels share the plan and
            add their terms; c = 1 equals the 3-D form). Need not be symmetric.
        C2: [B, m, m] or [B, m, m, c] structure of the second set, same c as C1.
        p: [B, n] weights of the first set; uniform over the valid rows if None. Each
            problem's weights are rescaled to unit mass.
        q: [B, m] weights of the second set; uniform over the valid columns if None.
        alpha: weight of the structure term in [0, 1] (0: Wasserstein on M, 1: GW).
        mask_rows: [B, n] bool, False for padded rows (zero weight; any values there).
        mask_cols: [B, m] bool, False for padded columns.
        G0: [B, n, m] initial coupling in Π(p, q); :math:`p q^\top` if None.
        symmetric: whether C1 and C2 are symmetric (a cheaper gradient); tested if None.
        max_iter: maximum conditional-gradient iterations per problem.
        tol_rel: stop when the objective moves by less than this, relative to its value.
        tol_abs: stop when the objective moves by less than this.
        dtype: dtype the solver runs in and returns (None: M's). float64 by default: the
            LP's optimality test and POT parity need it.
        warn: warn (naming ``max_iter``) if a problem hits ``max_iter``.

    Returns:
        value: [B] FGW values, differentiable w.r.t. M, C1, C2 (envelope gradients at the plan).
        plan: [B, n, m] the couplings, exact zeros on padded rows / columns.
    """
    squeeze = M.dim() == 2
    if squeeze:
        M, C1, C2, p, q, mask_rows, mask_cols, G0 = (
            None if x is None else x[None] for x in (M, C1, C2, p, q, mask_rows, mask_cols, G0)
        )
    if M.dim() != 3:
        raise ValueError(f"M must be [B, n, m] or [n, m], got shape {tuple(M.shape)}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    alpha = float(alpha)
    dtype = dtype or M.dtype
    M = M.to(dtype)
    B, n, m = M.shape
    C1 = _channels(C1.to(dtype), n, B, "C1")  # [B, c, n, n]
    C2 = _channels(C2.to(dtype), m, B, "C2")  # [B, c, m, m]
    if C1.shape[1] != C2.shape[1]:
        raise ValueError(
            f"C1 and C2 need the same number of channels, got {C1.shape[1]} and {C2.shape[1]}"
        )
    p = _weights(p, mask_rows, n, B, dtype, M.device, "p")  # [B, n]
    q = _weights(q, mask_cols, m, B, dtype, M.device, "q")  # [B, m]
    # zero-weight entries carry no mass: zero them so that padding values (even NaN) are inert
    rp, rq = p > 0, q > 0
    M = torch.where(rp[:, :, None] & rq[:, None, :], M, torch.zeros_like(M))
    C1 = torch.where(rp[:, None, :, None] & rp[:, None, None, :], C1, torch.zeros_like(C1))
    C2 = torch.where(rq[:, None, :, None] & rq[:, None, None, :], C2, torch.zeros_like(C2))

    with torch.no_grad():
        plan, n_iter = _conditional_gradient(
            M.detach(),
            C1.detach(),
            C2.detach(),
            p,
            q,
            alpha,
            G0,
            symmetric,
            max_iter,
            tol_rel,
            tol_abs,
        )
    if warn and bool((n_iter >= max_iter).any()):
        warnings.warn(
            f"fused_gromov_wasserstein_batched: {int((n_iter >= max_iter).sum())} problem(s) hit "
            f"max_iter={max_iter} before the objective settled (tol_rel={tol_rel:.0e}, "
            f"tol_abs={tol_abs:.0e}); increase max_iter or loosen the tolerances.",
            stacklevel=2,
        )
    value = _objective(M, C1, C2, plan, alpha)
    return (value[0], plan[0]) if squeeze else (value, plan)


def _conditional_gradient(M, C1, C2, p, q, alpha, G0, symmetric, max_iter, tol_rel, tol_abs):
    """POT's ``cg`` with the square-loss line search, batched: plan [B, n, m], iterations [B]."""
    B = M.shape[0]
    if symmetric is None:
        symmetric = bool(
            torch.allclose(C1, C1.transpose(-1, -2), atol=1e-10)
            and torch.allclose(C2, C2.transpose(-1, -2), atol=1e-10)
        )
    G = p[:, :, None] * q[:, None, :] if G0 is None else G0.to(M).expand_as(M).clone()  # [B, n, m]
    Mlin = (1.0 - alpha) * M
    if not symmetric:
        C1t, C2t = C1.transpose(-1, -2), C2.transpose(-1, -2)
    # the constant part of grad GW on Π(p, q): c + c' (2 c when symmetric)
    const = _constant(C1, C2, p, q)  # [B, n, m]
    const = 2.0 * const if symmetric else const + _constant(C1t, C2t, p, q)
    lp = _TransportLP(p, q)
    plan = G.clone()
    n_iter = torch.zeros(B, dtype=torch.long, device=M.device)
    ids = torch.arange(B, device=M.device)  # working set: problems still iterating
    cost = _objective(M, C1, C2, G, alpha)  # [w] objective at the current plan
    cross = _cross(C1, G, C2)  # [w, n, m] sum_c C1 G C2^T
    for it in range(1, max_iter + 1):
        # linearisation: (1 - alpha) M + alpha * grad GW(G)
        grad = const - 4.0 * cross if symmetric else const - 2.0 * cross - 2.0 * _cross(C1t, G, C2t)
        S, _ = lp.solve(Mlin + alpha * grad)  # [w, n, m] exact LP vertex
        D = S - G
        cross_D = _cross(C1, D, C2)  # [w, n, m]
        a = -2.0 * alpha * (cross_D * D).sum((-1, -2))  # [w]
        b = (Mlin * D).sum((-1, -2)) - 2.0 * alpha * (
            (cross_D * G).sum((-1, -2)) + (cross * D).sum((-1, -2))
        )
        # argmin of a t^2 + b t on [0, 1] (solve_1d_linesearch_quad)
        t = torch.where(a > 0, (-b / (2.0 * a)).clamp(0.0, 1.0), (a + b < 0).to(a.dtype))
        G = G + t[:, None, None] * D
        new_cost = cost + a * t.square() + b * t
        delta = (new_cost - cost).abs()
        done = (
            (delta < tol_abs)
            | ((new_cost != 0) & (delta / new_cost.abs() < tol_rel))
            | (it >= max_iter)
        )
        cost = new_cost
        n_iter[ids] = it
        if bool(done.any()):
            plan[ids[done]] = G[done]
            if bool(done.all()):
                break
            keep = ~done
            ids, G, cost, Mlin, const = ids[keep], G[keep], cost[keep], Mlin[keep], const[keep]
            C1, C2 = C1[keep], C2[keep]
            if not symmetric:
                C1t, C2t = C1t[keep], C2t[keep]
            lp.take(keep)
        cross = _cross(C1, G, C2)
    return plan, n_iter
