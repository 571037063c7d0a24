"""Exact McNemar test of two systems' correctness on the same items.

The exact (binomial) version on the discordant pairs (McNemar, Psychometrika 1947;
Fagerland et al., BMC Med. Res. Methodol. 2013).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass(frozen=True)
class McNemarResult:
    """An exact McNemar test of two systems' correctness on the same items."""

    b01: int  # items system a gets wrong and system b gets right
    b10: int  # items system a gets right and system b gets wrong
    p: float  # two-sided exact binomial p-value; 1 when there are no discordant items


def _as_correct(x: np.ndarray, name: str) -> np.ndarray:
    """[n] bool copy of ``x``; accepts bool or 0/1 values."""
    v = np.asarray(x)
    if v.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-item correctness, got shape {v.shape}")
    if v.dtype != bool:
        if not (np.issubdtype(v.dtype, np.number) and np.isin(v, (0, 1)).all()):
            raise ValueError(f"{name} must be bool (or 0/1), got dtype {v.dtype}")
        v = v.astype(bool)
    return v


def mcnemar_exact(a_correct: np.ndarray, b_correct: np.ndarray) -> McNemarResult:
    """Exact McNemar test of two systems' correctness on the same items.

    With ``b01 = #(a wrong, b right)`` and ``b10 = #(a right, b wrong)``, under the null
    the discordant items split as ``X ~ Bin(b01 + b10, 1/2)`` and
    ``p = min(1, 2 * P[X <= min(b01, b10)])``.

    Args:
        a_correct: [n] bool, whether system a gets each item right.
        b_correct: [n] bool, the same for system b, items in the same order.

    Returns:
        The discordant counts and the two-sided exact p-value (1 with no discordant items).
    """
    ca, cb = _as_correct(a_correct, "a_correct"), _as_correct(b_correct, "b_correct")
    if ca.shape != cb.shape:
        raise ValueError(
            f"a_correct and b_correct must cover the same items: got {len(ca)} and {len(cb)}"
        )
    if ca.size == 0:
        raise ValueError("a_correct and b_correct are empty: McNemar needs at least one item")
    b01 = int(np.count_nonzero(~ca & cb))
    b10 = int(np.count_nonzero(ca & ~cb))
    n = b01 + b10
    p = 1.0 if n == 0 else min(1.0, 2.0 * float(sps.binom.cdf(min(b01, b10), n, 0.5)))
    return McNemarResult(b01=b01, b10=b10, p=p)
