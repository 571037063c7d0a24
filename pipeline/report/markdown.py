"""Markdown building blocks of the report: percentages and CIs, p-values, tables, a DataFrame as a table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.benchmarks.retrieval import LOWER_IS_BETTER


def pct(x: float | None) -> str:
    """A rate in percent with one decimal ("–" for None, NaN or inf)."""
    return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def pct_ci(x: float, lo: float, hi: float) -> str:
    """A rate and its CI in percent: ``61.2 [58.1, 64.3]``."""
    return f"{pct(x)} [{pct(lo)}, {pct(hi)}]"


def points_ci(diff: float, lo: float, hi: float) -> str:
    """A difference of rates and its CI in signed points: ``+1.2 [-0.4, +2.8]``."""
    return f"{100 * diff:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def p_value(p: float, n_resamples: int) -> str:
    """A bootstrap p-value at the resolution its resamples give: the two-sided p is twice a
    share of ``n_resamples``, so it moves in steps of 2 / ``n_resamples`` and p = 0 (no
    resample crossed 0) prints as ``< 2/n_resamples`` (``< 0.001`` at 2000); any other p
    with the decimals that resolution needs."""
    if p == 0:
        return f"< {2 / n_resamples:.2g}"
    return f"{p:.{max(1, math.ceil(math.log10(n_resamples)))}f}"


def metric_value(metric: str, x: float | None) -> str:
    """A metric's value as the report prints it: a rate in percent, a rank
    (:data:`~pipeline.benchmarks.retrieval.LOWER_IS_BETTER`) with two decimals."""
    if metric in LOWER_IS_BETTER:
        return "–" if x is None or not np.isfinite(x) else f"{x:.2f}"
    return pct(x)


def metric_ci(metric: str, x: float, lo: float, hi: float) -> str:
    """A metric and its CI in the metric's unit (:func:`metric_value`)."""
    return f"{metric_value(metric, x)} [{metric_value(metric, lo)}, {metric_value(metric, hi)}]"


def metric_diff(metric: str, diff: float, lo: float, hi: float) -> str:
    """A difference of a metric and its CI: signed points for rates, signed ranks otherwise."""
    if metric in LOWER_IS_BETTER:
        return f"{diff:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return points_ci(diff, lo, hi)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A pipe table: ``header`` cells, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def df_markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a pipe table: an unnamed index column, then its columns as they print.
    A default index (row numbers 0, 1, ...) names nothing, so it is left out."""
    cols = [str(c) for c in df.columns]
    if isinstance(df.index, pd.RangeIndex) and df.index.name is None and df.index.start == 0:
        return md_table(cols, [[str(v) for v in row.tolist()] for _, row in df.iterrows()])
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for idx, row in df.iterrows():
        lines.append(f"| {idx} | " + " | ".join(str(v) for v in row.tolist()) + " |")
    return "\n".join(lines)
