r"""Batched exact Fused Gromov–Wasserstein by conditional gradient, in torch.

Solves, independently for every item of a batch of small problems,

.. math::
    \mathrm{FGW}_\alpha = \min_{T \in \Pi(p, q)} (1-\alpha) \langle T, M \rangle
    + \alpha \sum_{c} \sum_{ijkl} (C^{(1)}_{ikc} - C^{(2)}_{jlc})^2 \, T_{ij} T_{kl},

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
2. solves the linear program :math:`S = \arg\min_{S \in \Pi(p, q)} \langle G, S \rangle`
   exactly, by the batched transportation simplex of :mod:`pipeline.ot.transport`;
3. takes the exact line search of the square loss along :math:`T + t (S - T)`, a quadratic
   :math:`a t^2 + b t` minimised over :math:`t \in [0, 1]` in closed form as
   ``ot.optim.solve_1d_linesearch_quad`` does;
4. stops a problem as POT does, when the objective moved by less than ``tol_abs`` or by
   less than ``tol_rel`` relative to its value.

Why an exact LP step: an exact LP reproduces POT's path step by step (the LP optimum is
unique for generic costs; tied costs give several, and the two may part), hence POT's
local optimum where the GW term is non-convex. On these problems FW moves from vertex to
vertex: for Euclidean distance structures the GW term is concave on :math:`\Pi(p, q)`
(:math:`J C J \preceq 0` for a distance matrix, so :math:`a \le 0`: every line search
takes t = 1 or stops); for signed offsets :math:`C_{ik} = x_k - x_i` it is linear,
:math:`2 \sum_{ij} T_{ij} (x_i - y_j)^2 - 2 (p^\top x - q^\top y)^2` per channel, so FGW
with offset channels is one exact OT problem on the cost :math:`(1-\alpha) M + 2\alpha
\sum_c (x_{ic} - y_{jc})^2`, solved by the first LP step (:func:`fused_gromov_wasserstein_offsets`
solves that LP alone, from the positions). Other structures can make FW take interior steps
and converge sublinearly, in POT as here; the batch then runs as long as its slowest problem.

Padding: rows / columns of zero weight carry exactly zero mass, and their entries of M, C1,
C2 are ignored, so padding changes nothing.

Gradients: the iterations run without autograd; the returned value is the objective at the
returned (detached) plan evaluated on the inputs, so autograd gives the envelope-theorem
gradients with respect to M, C1 and C2, the ones POT's ``fused_gromov_wasserstein2`` sets.
There are none with respect to p and q.

Functions:
    fused_gromov_wasserstein_batched(M, C1, C2, p, q, alpha, ...): value [B] and plan [B, n, m].
    fused_gromov_wasserstein_offsets(M, X, Y, p, q, alpha, ...): the same for signed-offset
        structures built from positions X, Y, solved as the one exact OT problem it is.

References:
    T. Vayer, L. Chapel, R. Flamary, R. Tavenard and N. Courty, "Optimal transport for
    structured data with application on graphs", ICML 2019.
    G. Peyré, M. Cuturi and J. Solomon, "Gromov-Wasserstein averaging of kernel and distance
    matrices", ICML 2016 (the square-loss decomposition).
"""

from __future__ import annotations

import warnings

import torch

from pipeline.ot.transport import TransportSimplex, emd_batched, unit_marginals


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
    p = unit_marginals(p, mask_rows, n, B, dtype, M.device, "p")  # [B, n]
    q = unit_marginals(q, mask_cols, m, B, dtype, M.device, "q")  # [B, m]
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


def fused_gromov_wasserstein_offsets(
    M: torch.Tensor,
    X: torch.Tensor,
    Y: torch.Tensor,
    p: torch.Tensor | None = None,
    q: torch.Tensor | None = None,
    alpha: float = 0.5,
    mask_rows: torch.Tensor | None = None,
    mask_cols: torch.Tensor | None = None,
    dtype: torch.dtype | None = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""FGW whose structures are signed offsets of positions, solved by one exact OT.

    With :math:`C^{(1)}_{ikc} = X_{kc} - X_{ic}` and :math:`C^{(2)}_{jlc} = Y_{lc} - Y_{jc}`
    the structure term is linear on :math:`\Pi(p, q)` (module docstring), so

    .. math::
        \mathrm{FGW}_\alpha = \min_{T \in \Pi(p, q)} \langle T, (1-\alpha) M
        + 2\alpha D \rangle - 2\alpha \sum_c (p^\top X_c - q^\top Y_c)^2,
        \qquad D_{ij} = \sum_c (X_{ic} - Y_{jc})^2,

    one linear program (:func:`pipeline.ot.transport.emd_batched`). Both sets are first
    centred on their weighted means (the offsets do not see a translation), so the last term
    is 0 and the cost stays on the offsets' scale wherever the positions lie: far from the
    origin, the cost's magnitude, and the LP's tolerance with it, would be the positions'.
    On the offset structures :func:`fused_gromov_wasserstein_batched` spends two
    conditional-gradient steps (an LP each) on the same optimum: the values agree to
    rounding, and so do the plans wherever the optimum is unique.

    Args:
        M: [B, n, m] feature cost.
        X: [B, n, c] positions of the first set's objects (c channels, e.g. x and y).
        Y: [B, m, c] positions of the second set's objects.
        p, q, mask_rows, mask_cols, dtype: as :func:`fused_gromov_wasserstein_batched`.
        alpha: weight of the structure term in [0, 1].

    Returns:
        value: [B] FGW values (differentiable w.r.t. M, X and Y at the plan).
        plan: [B, n, m] optimal couplings, exact zeros on padded rows / columns.
    """
    if M.dim() != 3 or X.dim() != 3 or Y.dim() != 3:
        raise ValueError(f"M, X and Y must be [B, n, m], [B, n, c], [B, m, c], got {tuple(M.shape)}, {tuple(X.shape)}, {tuple(Y.shape)}")
    B, n, m = M.shape
    if X.shape[:2] != (B, n) or Y.shape[:2] != (B, m) or X.shape[2] != Y.shape[2]:
        raise ValueError(f"X must be [{B}, {n}, c] and Y [{B}, {m}, c] with one c, got {tuple(X.shape)} and {tuple(Y.shape)}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    alpha = float(alpha)
    dtype = dtype or M.dtype
    M, X, Y = M.to(dtype), X.to(dtype), Y.to(dtype)
    p = unit_marginals(p, mask_rows, n, B, dtype, M.device, "p")  # [B, n]
    q = unit_marginals(q, mask_cols, m, B, dtype, M.device, "q")  # [B, m]
    # zero-weight entries carry no mass: zero them so that padding values (even NaN) are inert
    X, Y = torch.where(p[..., None] > 0, X, 0.0), torch.where(q[..., None] > 0, Y, 0.0)
    X = torch.where(p[..., None] > 0, X - torch.einsum("bn,bnc->bc", p, X)[:, None, :], 0.0)  # p^T X = 0
    Y = torch.where(q[..., None] > 0, Y - torch.einsum("bm,bmc->bc", q, Y)[:, None, :], 0.0)  # q^T Y = 0
    M = torch.where((p[:, :, None] > 0) & (q[:, None, :] > 0), M, 0.0)
    cost = (1.0 - alpha) * M + 2.0 * alpha * (X[:, :, None, :] - Y[:, None, :, :]).square().sum(-1)  # [B, n, m]
    return emd_batched(cost, p, q, dtype=dtype)


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
    lp = TransportSimplex(p, q)
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
