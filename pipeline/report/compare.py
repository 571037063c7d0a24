"""Paired comparisons of two scored variants on cached scores (pure; any family uses them).

* ``compare``: one metric of ``variant`` against ``baseline`` (frozen CLIP by default), a
  paired bootstrap over the metric's units (95% CI, p).
* ``whatsup_mcnemar``: the What'sUp-style pair criterion, exact McNemar over pairs.
* ``family_table``: a suite's metrics per variant, one column each.

``results`` is the report stage's ``load_results``: ``{suite: {"manifest": df, "scores":
{variant: [n, K]}}}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.stats import mcnemar_exact, units_bootstrap


@dataclass
class Comparison:
    suite: str
    metric: str
    base: float  # the baseline's value
    value: float  # the variant's value
    diff: float  # value - base, paired over the metric's units
    lo: float  # 95% CI of diff
    hi: float
    p: float  # two-sided bootstrap p-value of diff = 0


def compare(
    results: dict,
    suite: str,
    metric: str,
    variant: str,
    baseline: str = "clip",
    n_resamples: int = 10_000,
    seed: int = 0,
) -> Comparison | None:
    """Paired bootstrap of ``variant`` vs ``baseline`` on one metric (None if unavailable)."""
    entry = results.get(suite)
    if not entry or variant not in entry["scores"] or baseline not in entry["scores"]:
        return None
    s = SUITES.get(suite)
    ua = s.units(entry["manifest"], entry["scores"][variant]).get(metric)
    ub = s.units(entry["manifest"], entry["scores"][baseline]).get(metric)
    if ua is None or ub is None or len(ua.values) == 0:
        return None
    r = units_bootstrap(ua, ub, n_resamples=n_resamples, seed=seed)
    return Comparison(suite, metric, ub.statistic(), ua.statistic(), r.diff, r.lo, r.hi, r.p)


def whatsup_mcnemar(results: dict, variant: str, baseline: str = "clip") -> dict | None:
    """Exact McNemar on What'sUp-style pair correctness (units = pairs)."""
    entry = results.get("shapes-whatsup")
    if not entry or variant not in entry["scores"] or baseline not in entry["scores"]:
        return None
    s = SUITES.get("shapes-whatsup")
    a = s.units(entry["manifest"], entry["scores"][variant])["pair"].values.astype(bool)
    b = s.units(entry["manifest"], entry["scores"][baseline])["pair"].values.astype(bool)
    r = mcnemar_exact(b, a)
    return {
        "pairs": len(a),
        "baseline_correct": int(b.sum()),
        "variant_correct": int(a.sum()),
        "b01": r.b01,
        "b10": r.b10,
        "p": r.p,
    }


def family_table(results: dict, variants: list[str], suite: str = "shapes-dev") -> pd.DataFrame:
    """Per-family accuracy (rows: families, columns: variants)."""
    entry = results.get(suite)
    if not entry:
        return pd.DataFrame()
    s = SUITES.get(suite)
    cols = {
        v: s.metrics(entry["manifest"], entry["scores"][v])
        for v in variants
        if v in entry["scores"]
    }
    return pd.DataFrame(cols)
