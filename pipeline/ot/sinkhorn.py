r"""Batched, differentiable, log-domain Sinkhorn for balanced entropic optimal transport.

Solves, independently for every item of a batch,

.. math::
    P^\star = \arg\min_{P \ge 0} \; \langle P, C \rangle - \varepsilon H(P)
    \quad \text{s.t.} \quad P \mathbf{1}_m = a, \; P^\top \mathbf{1}_n = b,

with :math:`H(P) = -\sum_{ij} P_{ij} (\log P_{ij} - 1)`, by Sinkhorn's matrix scaling in the
log domain [Cuturi 2013; Peyré & Cuturi 2019, Sec. 4.4]. The plan is
:math:`P = \mathrm{diag}(e^{f}) K \mathrm{diag}(e^{g})` with log-kernel
:math:`\log K = -C / \varepsilon`; the dual potentials are updated in POT's order (columns,
then rows), so after the last iteration the row marginals hold to rounding and the column
marginals carry the remaining error. With the same number of iterations the plan equals
``ot.sinkhorn(a, b, C, reg=epsilon, method="sinkhorn_log", stopThr=0)`` item by item.

The potentials f, g always live in the log domain. By default the iterations run in blocks
on an *absorbed* kernel ``exp(log_K + f + g)`` (log-stabilised scaling, Schmitzer 2019):
each block costs one exp pass and batched mat-vecs instead of two logsumexps per iteration,
and a block whose denominators leave the normal float range is redone with exact
logsumexp iterations, so small epsilon stays safe. ``absorb_every=None`` forces the pure
log-domain recursion. Both are the same map in exact arithmetic.

Differentiation is plain autograd through the ``n_iters`` unrolled iterations (memory grows
as ``O(n_iters * B * (n + m) + n_iters / absorb_every * B * n * m)``; pure log domain
``O(n_iters * B * n * m)``). Padded rows / columns are declared with boolean masks: they
receive exactly zero mass and their marginal entries are treated as zero.

Functions:
    sinkhorn_log(C, a, b, epsilon, n_iters, ...): cost form.
    sinkhorn_log_kernel(log_K, a, b, n_iters, ...): log-kernel form (e.g. ``S / epsilon``
        for a compatibility / score matrix ``S``, which is the cost ``C = -S``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

# Finite stand-in for log(0): keeps padded entries out of every logsumexp without the NaN
# gradients that -inf produces in torch.where / logsumexp backward passes.
_LOG_ZERO = -1e30


@dataclass
class SinkhornLog:
    """Diagnostics of one batched solve.

    Attributes:
        err: [...] per-item max absolute marginal violation, max over rows and columns of
            ``|P 1 - a|`` and ``|P^T 1 - b|`` (detached).
        n_iters: iterations run (fixed; there is no early stopping, to keep autograd exact).
        f: [..., n] log row scaling (``log u``); padded rows hold a large negative value.
        g: [..., m] log column scaling (``log v``).
    """

    err: torch.Tensor
    n_iters: int
    f: torch.Tensor
    g: torch.Tensor


def _uniform(mask: torch.Tensor | None, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """Uniform marginal over the unmasked entries, [..., k]."""
    if mask is None:
        return torch.full(shape, 1.0 / shape[-1], dtype=like.dtype, device=like.device)
    w = mask.to(like.dtype).expand(shape)
    return w / w.sum(-1, keepdim=True).clamp_min(1.0)


def _masked_log(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log(x) with padded (or zero-mass) entries mapped to a finite log-zero."""
    valid = x > 0 if mask is None else mask & (x > 0)
    safe = torch.where(valid, x, torch.ones_like(x))  # no log(0) even in the unused branch
    return torch.where(valid, safe.log(), torch.full_like(x, _LOG_ZERO))


@dataclass
class _Workspace:
    """Storage reused by every block of a solve that autograd does not record.

    On CPU a fresh tensor of a few MiB costs its page faults on first touch, which for the
    absorbed iterations weighed as much as the iterations themselves; a recorded solve keeps
    every intermediate for the backward pass and cannot reuse storage.

    Attributes:
        K: [block, n, m] the absorbed kernel, and scratch for the log-domain updates.
        Kt: [block, m, n] its transpose, contiguous.
        log_K: [block, n, m] the block's masked log-kernel.
    """

    K: torch.Tensor
    Kt: torch.Tensor
    log_K: torch.Tensor

    def take(self, count: int) -> _Workspace:
        """The first ``count`` problems' storage (the last block may be smaller)."""
        return _Workspace(self.K[:count], self.Kt[:count], self.log_K[:count])


def _logsumexp_into(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``torch.logsumexp(x, dim)`` computed in x's storage (x is overwritten): the same steps
    as torch's own (max, with infinite maxima taken as 0; exp of the difference; sum; log)."""
    top = x.amax(dim, keepdim=True)
    top.masked_fill_(top.abs() == math.inf, 0.0)
    return x.sub_(top).exp_().sum(dim).log_().add_(top.squeeze(dim))


def _log_iterations(log_K, f, g, log_a, log_b, k, work=None):
    """k exact log-domain Sinkhorn iterations (column update, then row update)."""
    for _ in range(k):
        if work is None:
            g = log_b - torch.logsumexp(log_K + f[..., :, None], dim=-2)  # [..., m]
            f = log_a - torch.logsumexp(log_K + g[..., None, :], dim=-1)  # [..., n]
        else:
            g = log_b - _logsumexp_into(torch.add(log_K, f[..., :, None], out=work.K), -2)
            f = log_a - _logsumexp_into(torch.add(log_K, g[..., None, :], out=work.K), -1)
    return f, g


def _absorb(log_K: torch.Tensor, f: torch.Tensor, g: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """exp(log_K + f ⊕ g), [..., n, m], in a new tensor or in ``out`` (sum and exp in place)."""
    K = log_K + f[..., :, None] if out is None else torch.add(log_K, f[..., :, None], out=out)
    return K.add_(g[..., None, :]).exp_()


def _absorbed_iterations(log_K, f, g, a, b, k, valid_rows, valid_cols, work=None):
    """k Sinkhorn iterations in the scaling domain on the absorbed kernel exp(log_K + f + g).

    Equal to k log-domain iterations in exact arithmetic, but costs one exp pass plus 2k
    batched mat-vecs, and autograd stores one [..., n, m] tensor instead of 2k. Returns None
    if a denominator left the normal floating-point range (the caller then redoes the block
    in the log domain), so the result is never less accurate than the log-domain update.
    """
    K = _absorb(log_K, f, g, out=None if work is None else work.K)  # [..., n, m] absorbed kernel
    # both mat-vecs as row-vector @ matrix: on CPU, [1, m] @ [m, n] with K^T contiguous runs
    # faster than [n, m] @ [m, 1] (docs/trials.md)
    Kt = K.transpose(-1, -2)
    Kt = Kt.contiguous() if work is None else work.Kt.copy_(Kt)  # [..., m, n]
    tiny = torch.finfo(K.dtype).tiny / torch.finfo(K.dtype).eps  # well above subnormals
    big = 1.0 / tiny
    u = valid_rows.to(K.dtype)  # [..., n] scalings relative to the absorbed potentials
    v = valid_cols.to(K.dtype)  # [..., m]
    # the range checks keep running extremes (two cheap ops per half-step) and are read once
    # after the block: the small per-step ops, not the mat-vecs, dominated on CPU otherwise
    with torch.no_grad():
        min_Ktu = torch.full_like(v, math.inf)  # [..., m]
        min_Kv = torch.full_like(u, math.inf)  # [..., n]
        max_u = torch.zeros_like(u)
        max_v = torch.zeros_like(v)
    for _ in range(k):
        Ktu = torch.matmul(u[..., None, :], K).squeeze(-2)  # [..., m]
        v = b / Ktu.clamp_min(tiny)
        Kv = torch.matmul(v[..., None, :], Kt).squeeze(-2)  # [..., n]
        u = a / Kv.clamp_min(tiny)
        with torch.no_grad():
            torch.minimum(min_Ktu, Ktu, out=min_Ktu)
            torch.minimum(min_Kv, Kv, out=min_Kv)
            torch.maximum(max_u, u, out=max_u)
            torch.maximum(max_v, v, out=max_v)
    with torch.no_grad():
        ok = (
            ((min_Ktu > tiny) | ~valid_cols).all()
            & ((min_Kv > tiny) | ~valid_rows).all()
            & (max_u < big).all()
            & (max_v < big).all()
        )
    if not bool(ok):
        return None
    f = torch.where(valid_rows, f + _masked_log(u, valid_rows), f)
    g = torch.where(valid_cols, g + _masked_log(v, valid_cols), g)
    return f, g


def _solve(log_K, a, b, n_iters, absorb_every, work=None, out=None):
    """The iterations on prepared inputs (masked log-kernel, masked marginals): P, f, g.

    With a :class:`_Workspace` (solves autograd does not record) the kernels reuse its
    storage and the plan is written into ``out``; the numbers are the same either way."""
    log_a = _masked_log(a, None)  # [..., n] padded rows carry zero mass
    log_b = _masked_log(b, None)  # [..., m]
    # padded rows / columns start (and stay) at log-zero, so they never enter a column or
    # row sum: a start at 0 would add exp(log_K) = 1 per padded row to every column sum of
    # the first update, which a warm-started (absorbed) kernel of tiny entries cannot undo
    f = torch.where(log_a > _LOG_ZERO, torch.zeros_like(log_a), log_a)  # [..., n] log u
    g = torch.where(log_b > _LOG_ZERO, torch.zeros_like(log_b), log_b)  # [..., m] log v
    # one exact log-domain iteration first: afterwards exp(log_K + f + g) has row sums a, so
    # it can be absorbed as a kernel without overflow
    f, g = _log_iterations(log_K, f, g, log_a, log_b, min(n_iters, 1), work)
    done = min(n_iters, 1)
    while done < n_iters:
        k = n_iters - done if not absorb_every else min(absorb_every, n_iters - done)
        step = None
        if absorb_every:
            step = _absorbed_iterations(log_K, f, g, a, b, k, log_a > _LOG_ZERO, log_b > _LOG_ZERO, work)
        if step is None:  # pure log domain, or the absorbed block left the float range
            step = _log_iterations(log_K, f, g, log_a, log_b, k, work)
        f, g = step
        done += k
    return _absorb(log_K, f, g, out=out), f, g  # P: [..., n, m]


# On CPU the mat-vecs of a large batch stream the whole absorbed kernel from memory at every
# iteration, so the batch is solved in blocks of problems whose kernels fit in cache; when
# autograd does not record, the blocks reuse one storage, since the page faults of a fresh
# 8 MiB tensor per block cost about as much as its iterations. ``pipeline bench sinkhorn
# --batch-block 0`` times one block against the default (figures in docs/trials.md).
_CPU_BLOCK_BYTES = 8 << 20


def _batch_block(log_K: torch.Tensor, n_problems: int, batch_block: int | None) -> int:
    """Problems per block: ``batch_block``, or automatically ~8 MiB of kernel on CPU."""
    if batch_block is not None:
        if batch_block < 0:
            raise ValueError(f"batch_block must be >= 0 (0 = one block), got {batch_block}")
        return batch_block or n_problems
    if log_K.device.type != "cpu":
        return n_problems
    per_problem = log_K.shape[-2] * log_K.shape[-1] * log_K.element_size()
    return max(1, _CPU_BLOCK_BYTES // max(1, per_problem))


def sinkhorn_log_kernel(
    log_K: torch.Tensor,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    n_iters: int = 64,
    mask_rows: torch.Tensor | None = None,
    mask_cols: torch.Tensor | None = None,
    tol: float = 1e-3,
    warn: bool = True,
    absorb_every: int | None = 16,
    batch_block: int | None = None,
) -> tuple[torch.Tensor, SinkhornLog]:
    r"""Balanced entropic OT from a log-kernel :math:`\log K = -C/\varepsilon`.

    Args:
        log_K: [..., n, m] log-kernel (any leading batch dims; ``[B, n, m]`` typically).
        a: [..., n] row marginal (source histogram); uniform over valid rows if None.
        b: [..., m] column marginal (target histogram); uniform over valid columns if None.
            ``a`` and ``b`` must have equal total mass per item (balanced OT).
        n_iters: number of Sinkhorn iterations (each = one column and one row update).
        mask_rows: [..., n] bool, False for padded rows (zero mass, zero plan rows).
        mask_cols: [..., m] bool, False for padded columns.
        tol: marginal-violation tolerance used only for the convergence warning.
        warn: emit a ``UserWarning`` naming the knobs when ``err > tol`` for some item.
        absorb_every: run the iterations in blocks of this many scaling-domain steps on a
            kernel absorbed from the log-domain potentials (Schmitzer's log-stabilised
            scaling); None runs every iteration in the log domain. Same result either way
            (a block that under/overflows is redone in the log domain); absorption is several
            times faster and stores far less for autograd.
        batch_block: solve the (flattened) batch in blocks of this many problems; the
            problems are independent, so the result is the same. None: on CPU, blocks of
            about 8 MiB of kernel (cache-sized: faster for large batches), one block
            elsewhere; 0: one block.

    Returns:
        P: [..., n, m] transport plan (exact zeros on padded rows / columns).
        log: :class:`SinkhornLog` with per-item marginal error and the potentials.
    """
    return _sinkhorn(log_K, None, a, b, n_iters, mask_rows, mask_cols, tol, warn, absorb_every, batch_block)


def _log_kernel(scores, divisor, mask_rows, mask_cols, out=None):
    """The log-kernel ``scores / divisor`` (divisor None: ``scores`` is it) with padded
    entries set to 0 (drops infs / NaNs there), as a new tensor or written into ``out``."""
    if divisor is None and mask_rows is None and mask_cols is None:
        return scores
    if out is None:
        log_K = scores if divisor is None else scores / divisor
    else:
        log_K = out.copy_(scores) if divisor is None else torch.div(scores, divisor, out=out)
    if mask_rows is None and mask_cols is None:
        return log_K
    # in full, the mask has log_K's layout, so the log-kernel keeps the input's strides
    keep = torch.ones_like(log_K, dtype=torch.bool) if out is None else torch.ones((), dtype=torch.bool, device=scores.device)
    if mask_rows is not None:
        keep = keep & mask_rows[..., :, None]
    if mask_cols is not None:
        keep = keep & mask_cols[..., None, :]
    if out is None:
        return torch.where(keep, log_K, torch.zeros_like(log_K))
    return log_K.masked_fill_(~keep, 0.0)


def _sinkhorn(scores, divisor, a, b, n_iters, mask_rows, mask_cols, tol, warn, absorb_every, batch_block):
    """Both public forms; the log-kernel is ``scores / divisor`` (divisor None: ``scores``).

    A solve that autograd records builds the masked log-kernel in full and keeps every
    block's tensors; otherwise each block's log-kernel, kernels and plan are written into
    storage allocated once (:class:`_Workspace`). Both give the same numbers bitwise for
    contiguous inputs (what the scorers pass); a strided cost tensor is solved in the
    workspace's contiguous storage, which sums in another order: equal up to rounding.
    """
    if scores.dim() < 2:
        name = "log_K" if divisor is None else "C"
        raise ValueError(f"{name} must be [..., n, m], got shape {tuple(scores.shape)}")
    if divisor is not None and not scores.is_floating_point():
        scores = scores.to(torch.result_type(scores, divisor))  # integer costs
    n, m = scores.shape[-2:]
    batch = scores.shape[:-2]
    if a is None:
        a = _uniform(mask_rows, batch + (n,), scores)
    if b is None:
        b = _uniform(mask_cols, batch + (m,), scores)
    a = a.to(scores.dtype).expand(batch + (n,))
    b = b.to(scores.dtype).expand(batch + (m,))
    if mask_rows is not None:
        mask_rows = mask_rows.expand(batch + (n,))
        a = a * mask_rows
    if mask_cols is not None:
        mask_cols = mask_cols.expand(batch + (m,))
        b = b * mask_cols

    n_problems = math.prod(batch)
    block = _batch_block(scores, n_problems, batch_block)
    recorded = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (scores, a, b, divisor)
    )
    if block >= n_problems:
        P, f, g = _solve(_log_kernel(scores, divisor, mask_rows, mask_cols), a, b, n_iters, absorb_every)
    elif recorded:  # independent problems: the same plan, block by block
        log_K = _log_kernel(scores, divisor, mask_rows, mask_cols)
        parts = [
            _solve(k_, a_, b_, n_iters, absorb_every)
            for k_, a_, b_ in zip(
                log_K.reshape(-1, n, m).split(block), a.reshape(-1, n).split(block), b.reshape(-1, m).split(block), strict=True
            )
        ]
        P = torch.cat([x[0] for x in parts]).reshape(scores.shape)
        f = torch.cat([x[1] for x in parts]).reshape(a.shape)
        g = torch.cat([x[2] for x in parts]).reshape(b.shape)
    else:  # the same, each block prepared and solved in reused storage, the plan in place
        flat_S, flat_a, flat_b = scores.reshape(-1, n, m), a.reshape(-1, n), b.reshape(-1, m)
        flat_rows = None if mask_rows is None else mask_rows.reshape(-1, n)
        flat_cols = None if mask_cols is None else mask_cols.reshape(-1, m)
        P = flat_S.new_empty(flat_S.shape)  # contiguous, whatever the input's strides
        f, g = flat_a.new_empty(flat_a.shape), flat_b.new_empty(flat_b.shape)
        work = _Workspace(P.new_empty(block, n, m), P.new_empty(block, m, n), P.new_empty(block, n, m))
        for start in range(0, n_problems, block):
            rows = slice(start, min(start + block, n_problems))
            here = work.take(rows.stop - rows.start)
            log_K = _log_kernel(
                flat_S[rows], divisor,
                None if flat_rows is None else flat_rows[rows], None if flat_cols is None else flat_cols[rows],
                out=here.log_K,
            )  # fmt: skip
            _, f[rows], g[rows] = _solve(log_K, flat_a[rows], flat_b[rows], n_iters, absorb_every, work=here, out=P[rows])
        P, f, g = P.reshape(scores.shape), f.reshape(a.shape), g.reshape(b.shape)

    with torch.no_grad():
        err_rows = (P.sum(-1) - a).abs().amax(-1)
        err_cols = (P.sum(-2) - b).abs().amax(-1)
        err = torch.maximum(err_rows, err_cols)
    if warn and n_iters > 0 and err.numel() and float(err.max()) > tol:
        warnings.warn(
            f"sinkhorn_log did not converge: max marginal error {float(err.max()):.2e} > "
            f"tol={tol:.0e} after n_iters={n_iters}; increase n_iters or epsilon "
            "(a larger epsilon gives a blurrier plan but converges faster).",
            stacklevel=3,
        )
    return P, SinkhornLog(err=err, n_iters=n_iters, f=f, g=g)


def sinkhorn_log(
    C: torch.Tensor,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    epsilon: float = 0.1,
    n_iters: int = 64,
    mask_rows: torch.Tensor | None = None,
    mask_cols: torch.Tensor | None = None,
    tol: float = 1e-3,
    warn: bool = True,
    absorb_every: int | None = 16,
    batch_block: int | None = None,
) -> tuple[torch.Tensor, SinkhornLog]:
    r"""Balanced entropic OT, :math:`\min_P \langle P, C\rangle - \varepsilon H(P)`, ``P1=a``, ``P^T1=b``.

    Batched over any leading dims, log-domain, differentiable by autograd. For a score /
    compatibility matrix ``S`` (higher = better match) pass ``C = -S`` or call
    :func:`sinkhorn_log_kernel` with ``S / epsilon``; constant shifts of ``C`` per item do
    not change the balanced plan.

    Args:
        C: [..., n, m] cost matrix.
        a: [..., n] row marginal; uniform over valid rows if None.
        b: [..., m] column marginal; uniform over valid columns if None.
        epsilon: entropic regularisation (temperature) :math:`\varepsilon > 0`.
        n_iters: Sinkhorn iterations (fixed count; no early stopping).
        mask_rows: [..., n] bool, False for padded rows.
        mask_cols: [..., m] bool, False for padded columns.
        tol: marginal-violation tolerance for the convergence warning.
        warn: warn (naming ``n_iters`` / ``epsilon``) if some item violates ``tol``.
        absorb_every: block length of the absorbed scaling-domain iterations; None = every
            iteration in the log domain (see :func:`sinkhorn_log_kernel`).
        batch_block: problems per block (None: cache-sized blocks on CPU; 0: one block;
            see :func:`sinkhorn_log_kernel`).

    Returns:
        P: [..., n, m] plan; log: :class:`SinkhornLog`.

    References:
        M. Cuturi, "Sinkhorn distances: lightspeed computation of optimal transport",
        NeurIPS 2013. G. Peyré and M. Cuturi, "Computational Optimal Transport", 2019.
        B. Schmitzer, "Stabilized sparse scaling algorithms for entropy regularized
        transport problems", SIAM J. Sci. Comput. 2019.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    # log-kernel C / -epsilon (the same numbers as -C / epsilon), built block by block
    return _sinkhorn(C, -epsilon, a, b, n_iters, mask_rows, mask_cols, tol, warn, absorb_every, batch_block)
