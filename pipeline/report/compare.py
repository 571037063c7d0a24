"""Paired comparisons of two scored variants on cached scores (pure; any family uses them).

* ``compare``: one metric of ``variant`` against ``baseline`` (frozen CLIP by default), a
  paired bootstrap over the metric's units (95% CI, p).
* ``compare_mean`` / ``mean_ci``: the same for a mean of several task metrics (tasks may
  come from different suites), each task's units resampled independently
  (:func:`pipeline.stats.units_mean_bootstrap`); ``task_units`` / ``common_tasks`` say which
  tasks a variant has.
* ``whatsup_mcnemar`` / ``pair_mcnemar``: the What'sUp pair criterion, exact McNemar over
  pairs, the pairs of one suite (``shapes-whatsup``) or of several pooled
  (:data:`WHATSUP_POOLED`: whatsup-a + whatsup-b, the 410-pair criterion;
  :func:`pipeline.benchmarks.whatsup.pooled_pairs`).
* ``family_table``: a suite's metrics per variant, one column each.
* ``variant_means``: each variant's all-task and binding means (the scored world's
  :data:`pipeline.report.tasks.MEANS`) with CIs and its paired difference to the baseline, the numbers
  ``pipeline compare-encoders`` keeps per encoder.

``results`` is the report stage's ``load_results``: ``{suite: {"manifest": df, "scores":
{variant: [n, K]}}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from pipeline.benchmarks import SUITES, Units
from pipeline.benchmarks.whatsup import POOLED_SUITES, Scored, pooled_pairs
from pipeline.report.tasks import DEV_SUITE, WHATSUP_SUITE, Task, layout_for
from pipeline.stats import (
    ConfidenceInterval,
    mcnemar_exact,
    units_bootstrap,
    units_mean_bootstrap,
    units_mean_ci,
)

WHATSUP_POOLED: tuple[str, ...] = POOLED_SUITES  # the real suites of the 410-pair criterion


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


def task_units(results: dict, tasks: Sequence[Task], variant: str) -> dict[Task, Units]:
    """The units of each of ``tasks`` that ``variant`` was scored on, in ``tasks`` order
    (each suite's units computed once); a task without scores or units is left out."""
    found: dict[Task, Units] = {}
    for suite in dict.fromkeys(s for s, _ in tasks):
        entry = results.get(suite)
        if not entry or variant not in entry["scores"]:
            continue
        units = SUITES.get(suite).units(entry["manifest"], entry["scores"][variant])
        for s, metric in tasks:
            if s == suite and metric in units and len(units[metric].values):
                found[(s, metric)] = units[metric]
    return {t: found[t] for t in tasks if t in found}


def common_tasks(results: dict, tasks: Sequence[Task], variants: Sequence[str]) -> list[Task]:
    """The tasks every one of ``variants`` was scored on, in ``tasks`` order."""
    have = [set(task_units(results, tasks, v)) for v in variants]
    return [t for t in tasks if all(t in h for h in have)]


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
    task = (suite, metric)
    ua = task_units(results, [task], variant).get(task)
    ub = task_units(results, [task], baseline).get(task)
    if ua is None or ub is None:
        return None
    r = units_bootstrap(ua, ub, n_resamples=n_resamples, seed=seed)
    return Comparison(suite, metric, ub.statistic(), ua.statistic(), r.diff, r.lo, r.hi, r.p)


def compare_mean(
    results: dict,
    tasks: Sequence[Task],
    variant: str,
    baseline: str = "clip",
    n_resamples: int = 10_000,
    seed: int = 0,
    name: str = "mean",
) -> Comparison | None:
    """Paired bootstrap of ``variant`` vs ``baseline`` on the mean of ``tasks`` (each task's
    units resampled independently); None unless both have every task. The comparison's
    ``suite`` is ``"mean"`` and its ``metric`` is ``name``."""
    ua, ub = task_units(results, tasks, variant), task_units(results, tasks, baseline)
    if not tasks or len(ua) < len(tasks) or len(ub) < len(tasks):
        return None
    a, b = [ua[t] for t in tasks], [ub[t] for t in tasks]
    r = units_mean_bootstrap(a, b, n_resamples=n_resamples, seed=seed)
    value, base = (sum(u.statistic() for u in x) / len(tasks) for x in (a, b))
    return Comparison("mean", name, base, value, r.diff, r.lo, r.hi, r.p)


def mean_ci(
    results: dict, tasks: Sequence[Task], variant: str, n_resamples: int = 10_000, seed: int = 0
) -> ConfidenceInterval | None:
    """Bootstrap CI of ``variant``'s mean over ``tasks``; None unless it has every task."""
    units = task_units(results, tasks, variant)
    if not tasks or len(units) < len(tasks):
        return None
    return units_mean_ci([units[t] for t in tasks], n_resamples=n_resamples, seed=seed)


def pair_mcnemar(variant: Sequence[Scored], baseline: Sequence[Scored]) -> dict:
    """Exact McNemar test of ``variant`` against ``baseline`` on the pooled What'sUp pairs.

    Args:
        variant: each pooled suite's ``(manifest, scores)`` for the variant.
        baseline: the same suites, in the same order, for the baseline (frozen CLIP).

    Returns:
        ``pairs``, ``baseline_correct``, ``variant_correct``, the discordant counts ``b01``
        (baseline wrong, variant right) and ``b10`` (baseline right, variant wrong) and the
        two-sided exact ``p`` (:func:`pipeline.stats.mcnemar_exact`).

    Raises:
        ValueError: when the two do not cover the same items of the same suites.
    """
    if len(variant) != len(baseline) or any(
        not mv["item_id"].equals(mb["item_id"]) for (mv, _), (mb, _) in zip(variant, baseline, strict=True)
    ):
        raise ValueError("variant and baseline must be scored on the same suites' items, in the same order")
    a = pooled_pairs(variant).values.astype(bool)  # [n_pairs]
    b = pooled_pairs(baseline).values.astype(bool)
    r = mcnemar_exact(b, a)
    return {
        "pairs": len(a),
        "baseline_correct": int(b.sum()),
        "variant_correct": int(a.sum()),
        "b01": r.b01,
        "b10": r.b10,
        "p": r.p,
    }


def whatsup_mcnemar(
    results: dict, variant: str, baseline: str = "clip", suites: Sequence[str] | None = None
) -> dict | None:
    """Exact McNemar on What'sUp pair correctness (units = pairs), the pairs of ``suites``
    pooled in order; by default the What'sUp suites of the scored world
    (:func:`pipeline.report.tasks.layout_for`): ``shapes-whatsup``, or on the real suites
    :data:`WHATSUP_POOLED`, the 410-pair criterion. None unless both were scored on every
    suite of ``suites``. The record is :func:`pair_mcnemar`'s."""
    if suites is None:
        suites = layout_for(results).suites_of(WHATSUP_SUITE)
    entries = [results.get(s) for s in suites]
    if not entries or not all(e and variant in e["scores"] and baseline in e["scores"] for e in entries):
        return None
    return pair_mcnemar(
        [(e["manifest"], e["scores"][variant]) for e in entries],
        [(e["manifest"], e["scores"][baseline]) for e in entries],
    )


def family_table(results: dict, variants: list[str], suite: str = DEV_SUITE) -> pd.DataFrame:
    """Per-family accuracy (rows: families, columns: variants) on ``suite``, a role suite
    (:mod:`pipeline.report.tasks`: the dev families by default) or a suite of the scored world."""
    suite = layout_for(results).suite(suite)
    entry = results.get(suite) if suite else None
    if not entry:
        return pd.DataFrame()
    s = SUITES.get(suite)
    cols = {
        v: s.metrics(entry["manifest"], entry["scores"][v])
        for v in variants
        if v in entry["scores"]
    }
    return pd.DataFrame(cols)


def variant_means(
    results: dict, variants: Sequence[str], baseline: str = "clip", n_resamples: int = 10_000, seed: int = 0
) -> dict[str, dict]:
    """Per scored variant: each mean of the scored world's layout
    (:attr:`pipeline.report.tasks.TaskLayout.means`) over the tasks it shares with ``baseline``
    (a pairwise scorer has no retrieval task), its value with a 95% CI and, for the other
    variants, the paired difference to ``baseline`` on the same tasks; plus every task's
    value. ``{variant: {"means": {name: {...}}, "tasks": {"suite/metric": value}}}``."""
    out: dict[str, dict] = {}
    layout_means = layout_for(results).means
    for v in variants:
        units = task_units(results, layout_means["all-task"], v)
        if not units:
            continue
        means = {}
        for name, tasks in layout_means.items():
            shared = common_tasks(results, tasks, [v, baseline])
            ci = mean_ci(results, shared, v, n_resamples, seed)
            if ci is None:
                continue
            entry = {"value": ci.estimate, "lo": ci.lo, "hi": ci.hi, "tasks": ["/".join(t) for t in shared]}
            c = None if v == baseline else compare_mean(results, shared, v, baseline, n_resamples, seed, name)
            if c is not None:
                entry.update(diff=c.diff, diff_lo=c.lo, diff_hi=c.hi, p=c.p)
            means[name] = entry
        out[v] = {"means": means, "tasks": {"/".join(t): u.statistic() for t, u in units.items()}}
    return out
