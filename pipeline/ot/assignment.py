r"""Exact assignment and Fused Gromov–Wasserstein wrappers (for geometry-aware reranking).

Thin, math-named wrappers over scipy and POT, batched by a loop over items (the solvers run
on numpy per problem; at the sizes of a rerank shortlist, n <= ~20 objects, the per-item
loop is as fast as POT's batched proximal solver on a CPU, see ``stack.md`` §4).

* :func:`hungarian` — one-to-one assignment :math:`\min_\sigma \sum_i C_{i\sigma(i)}`
  (``scipy.optimize.linear_sum_assignment``); rectangular problems match ``min(n, m)`` pairs;
  padded rows / columns (masks) are never matched.
* :func:`fused_gromov_wasserstein` — the FGW distance [Vayer et al. 2019]

  .. math::
      \min_{T \in \Pi(p, q)} (1-\alpha) \langle T, M \rangle
      + \alpha \sum_{ijkl} (C^{(1)}_{ik} - C^{(2)}_{jl})^2 T_{ij} T_{kl},

  ``alpha = 0`` is plain Wasserstein on ``M``, ``alpha = 1`` plain Gromov–Wasserstein.
  :func:`pipeline.ot.fgw.fused_gromov_wasserstein_batched` solves the same problem batched
  in torch (same iterations, padded batches, multi-channel structures).
"""

from __future__ import annotations

import numpy as np
import torch


def _np(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def hungarian(
    C: torch.Tensor | np.ndarray,
    mask_rows: torch.Tensor | np.ndarray | None = None,
    mask_cols: torch.Tensor | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Batched exact assignment, padding-aware.

    Each problem is solved on its valid rows and columns only, so padded entries (any
    values, NaN included) are never matched.

    Args:
        C: [B, n, m] (or [n, m]) cost matrices.
        mask_rows: [B, n] (or [n]) bool, False for padded rows; all valid if None.
        mask_cols: [B, m] (or [m]) bool, False for padded columns; all valid if None.

    Returns:
        cols: [B, n] int column matched to each row (-1 for padded rows and for rows left
        unmatched when there are more valid rows than columns);
        cost: [B] mean matched cost over the ``min(n_valid, m_valid)`` matched pairs
        (NaN for a problem with no valid row or column).
    """
    from scipy.optimize import linear_sum_assignment  # lazy: scipy adds ~1 s to each command

    C = _np(C)
    squeeze = C.ndim == 2
    C = C[None] if squeeze else C
    B, n, m = C.shape
    rows_ok = (
        np.ones((B, n), dtype=bool)
        if mask_rows is None
        else np.broadcast_to(_np(mask_rows).astype(bool), (B, n))
    )
    cols_ok = (
        np.ones((B, m), dtype=bool)
        if mask_cols is None
        else np.broadcast_to(_np(mask_cols).astype(bool), (B, m))
    )
    cols = np.full((B, n), -1, dtype=np.int64)
    cost = np.full(B, np.nan)
    for k in range(B):
        ri, ci = np.flatnonzero(rows_ok[k]), np.flatnonzero(cols_ok[k])
        if len(ri) == 0 or len(ci) == 0:
            continue
        r, c = linear_sum_assignment(C[k][np.ix_(ri, ci)])
        cols[k, ri[r]] = ci[c]
        cost[k] = C[k, ri[r], ci[c]].mean()
    return (cols[0], cost[0]) if squeeze else (cols, cost)


def fused_gromov_wasserstein(
    M: torch.Tensor | np.ndarray,
    C1: torch.Tensor | np.ndarray,
    C2: torch.Tensor | np.ndarray,
    p: torch.Tensor | np.ndarray | None = None,
    q: torch.Tensor | np.ndarray | None = None,
    alpha: float = 0.5,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Batched exact FGW (POT conditional gradient), one problem per item.

    Args:
        M: [B, n, m] feature cost between the two sets.
        C1: [B, n, n] structure matrix of the first set (e.g. pairwise distances).
        C2: [B, m, m] structure matrix of the second set.
        p: [B, n] weights of the first set; uniform if None.
        q: [B, m] weights of the second set; uniform if None.
        alpha: weight of the structure term (0 = Wasserstein on M, 1 = GW).

    Returns:
        dist: [B] FGW distances; plans: list of B [n, m] plans.
    """
    import ot  # POT takes ~0.85 s to import; only FGW needs it

    M, C1, C2 = _np(M), _np(C1), _np(C2)
    dist = np.zeros(M.shape[0])
    plans = []
    for k in range(M.shape[0]):
        pk = None if p is None else _np(p)[k]
        qk = None if q is None else _np(q)[k]
        T, log = ot.gromov.fused_gromov_wasserstein(
            M[k], C1[k], C2[k], pk, qk, loss_fun="square_loss", alpha=alpha, log=True
        )
        dist[k] = float(log["fgw_dist"])
        plans.append(T)
    return dist, plans
