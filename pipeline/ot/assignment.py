r"""Exact assignment (for geometry-aware reranking): the Hungarian method through scipy.

* :func:`hungarian` — one-to-one assignment :math:`\min_\sigma \sum_i C_{i\sigma(i)}`
  (``scipy.optimize.linear_sum_assignment``), a batch solved one problem at a time on numpy
  (the solver has no batched form); rectangular problems match ``min(n, m)`` pairs;
  padded rows / columns (masks) are never matched.

The Fused Gromov–Wasserstein problem the rerankers also solve is
:func:`pipeline.ot.fgw.fused_gromov_wasserstein_batched`.
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

