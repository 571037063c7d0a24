"""Flow-CLIP's analyses (seed ``flowclip.txt`` §4.3-4.7): pure functions of cached scores,
its report section renders them.

* :func:`ladder`: the ablation ladder ``clip`` → ``global-m`` → ``flowclip`` →
  ``flowclip-cimr`` on the all-task mean (:data:`~pipeline.report.tasks.ALL_TASKS`, the
  seed's "11-task mean", on the shapes suites or the real ones) and the binding mean
  (:data:`~pipeline.report.tasks.BINDING_TASKS`, its "binding mean"), each
  rung against the previous one and against ``clip`` with a paired bootstrap of the mean
  (each task's units resampled on their own: :func:`pipeline.stats.units_mean_bootstrap`).
* :func:`corrections`: which frozen-CLIP errors a variant corrects and which new ones it
  makes, per slice (:data:`CORRECTION_TASKS`), with an exact McNemar p (seed §4.7: "28
  repairs and no correct-to-incorrect reversals").
* :func:`seed_spread`: mean ± sd over the training seeds (``<variant>@seed<k>``).
* :func:`selected_steps`: the training step dev selection kept for each seed (the scored
  checkpoint's: :func:`pipeline.scorers.checkpoints.scored_steps`).

The issue's goals are :mod:`pipeline.scorers.flowclip.goals`'s; the patch-sensitivity
pictures :mod:`pipeline.scorers.flowclip.sensitivity`'s.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.report.compare import common_tasks, compare_mean, mean_ci, task_units
from pipeline.report.tasks import (
    ARO_TASKS,
    DEV_TASKS,
    SUGARCREPE_TASKS,
    WHATSUP,
    Task,
    layout_for,
)
from pipeline.stats import mcnemar_exact

BASELINE = "clip"
VARIANTS = ("global-m", "flowclip", "flowclip-cimr")  # the family's scored variants
LADDER = (BASELINE, *VARIANTS)  # each rung adds one thing: M, then ICER, then CIMR
# Every task list below names roles (:mod:`pipeline.report.tasks`); each function renders
# them in the scored world's suites (``layout_for(results)``).
# Slices of the corrections table (units = items): the test suites, then the dev families.
TEST_CORRECTION_TASKS: tuple[Task, ...] = (*SUGARCREPE_TASKS, *ARO_TASKS, *WHATSUP)
CORRECTION_TASKS: tuple[Task, ...] = (*TEST_CORRECTION_TASKS, *DEV_TASKS)
SEED_TASKS: tuple[Task, ...] = (  # headline tasks shown per training seed
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-aro", "relation"),
    ("shapes-whatsup", "individual"),
    ("shapes-retrieval", "R@1"),
)


def task_label(task: Task) -> str:
    """``"shapes-aro relation"``."""
    return " ".join(task)


def scored_variants(results: dict[str, Any], variants: tuple[str, ...]) -> list[str]:
    """The ``variants`` scored on at least one suite, in the given order."""
    scored = {v for entry in results.values() for v in entry["scores"]}
    return [v for v in variants if v in scored]


def task_mean(
    results: dict[str, Any], tasks: tuple[Task, ...] | list[Task], variant: str
) -> float | None:
    """``variant``'s mean over ``tasks`` (equal weights); None unless it has every task."""
    units = task_units(results, tasks, variant)
    if not tasks or len(units) < len(tasks):
        return None
    return float(np.mean([u.statistic() for u in units.values()]))


# ---------------------------------------------------------------- the ablation ladder


def _compared(
    results: dict[str, Any], tasks: list[Task], variant: str, base: str, **kw
) -> dict | None:
    """:func:`pipeline.report.compare.compare_mean` as a dict (None when there is none)."""
    c = compare_mean(results, tasks, variant, base, **kw)
    return asdict(c) if c is not None else None


def ladder(results: dict[str, Any], n_resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """The scored rungs of :data:`LADDER` on each mean of the scored world
    (:attr:`pipeline.report.tasks.TaskLayout.means`).

    Per mean: ``tasks``, the tasks every scored rung has (so every step compares the same
    tasks), ``missing``, those some rung lacks, and one row per rung with its mean and
    95% CI (``value``, ``lo``, ``hi``), ``vs_previous`` (against the rung before it) and
    ``vs_clip`` (against frozen CLIP), each a paired bootstrap of the mean
    (:func:`pipeline.report.compare.compare_mean` as a dict), None where there is none.
    """
    rungs = scored_variants(results, LADDER)
    out: dict[str, Any] = {"rungs": rungs}
    for name, tasks in layout_for(results).means.items():
        present = common_tasks(results, tasks, rungs) if rungs else []
        rows = []
        for k, v in enumerate(rungs if present else []):
            ci = mean_ci(results, present, v, n_resamples, seed)
            step = partial(
                _compared, results, present, v, n_resamples=n_resamples, seed=seed, name=name
            )
            rows.append(
                {
                    "variant": v,
                    "value": ci.estimate,
                    "lo": ci.lo,
                    "hi": ci.hi,
                    "previous": rungs[k - 1] if k else None,
                    "vs_previous": step(rungs[k - 1]) if k else None,
                    "vs_clip": step(BASELINE) if v != BASELINE and BASELINE in rungs else None,
                }
            )
        out[name] = {
            "tasks": [task_label(t) for t in present],
            "missing": [task_label(t) for t in tasks if t not in present],
            "rows": rows,
        }
    return out


# ---------------------------------------------------------------- corrected and new errors


def _mcnemar_row(base: np.ndarray, new: np.ndarray) -> dict[str, Any]:
    """Errors of ``base`` that ``new`` corrects, errors ``new`` adds, net and exact p."""
    r = mcnemar_exact(base, new)  # b01: base wrong, new right; b10: base right, new wrong
    return {"corrected": r.b01, "new": r.b10, "net": r.b01 - r.b10, "p": r.p}


def corrections(
    results: dict[str, Any], variants: list[str] | tuple[str, ...], baseline: str = BASELINE
) -> list[dict[str, Any]]:
    """Per slice of :data:`CORRECTION_TASKS` (units = items, correct or not): ``items``,
    the baseline's errors, and per variant the baseline errors it corrects, the new errors it
    makes, net and the exact McNemar p on those discordant items; then ``all test items``,
    the test-suite slices (not shapes-dev) pooled. Slices the baseline or a variant lacks are
    left out (a variant without a slice gets None there)."""
    layout = layout_for(results)
    slices, test_slices = layout.tasks(CORRECTION_TASKS), set(layout.tasks(TEST_CORRECTION_TASKS))
    base = task_units(results, slices, baseline)
    units = {v: task_units(results, slices, v) for v in variants}
    rows, pooled = [], {v: ([], []) for v in variants}
    for task in slices:
        if task not in base or not any(task in units[v] for v in variants):
            continue
        b = base[task].values.astype(bool)  # [n] the baseline right on each item
        row: dict[str, Any] = {
            "suite": task[0],
            "slice": task[1],
            "items": len(b),
            "baseline_errors": int((~b).sum()),
        }
        for v in variants:
            u = units[v].get(task)
            row[v] = _mcnemar_row(b, u.values.astype(bool)) if u is not None else None
            if u is not None and task in test_slices:
                pooled[v][0].append(b)
                pooled[v][1].append(u.values.astype(bool))
        rows.append(row)
    test = [r for r in rows if (r["suite"], r["slice"]) in test_slices]
    if test:
        row = {
            "suite": "all test items",
            "slice": "",
            "items": sum(r["items"] for r in test),
            "baseline_errors": sum(r["baseline_errors"] for r in test),
        }
        for v in variants:
            b, a = pooled[v]
            row[v] = _mcnemar_row(np.concatenate(b), np.concatenate(a)) if b else None
        rows.append(row)
    return rows


# ---------------------------------------------------------------- training seeds


def seed_names(results: dict[str, Any], variant: str) -> list[str]:
    """The per-seed runs ``<variant>@seed<k>`` scored on any suite, sorted."""
    names = {v for entry in results.values() for v in entry["scores"]}
    return sorted(n for n in names if n.startswith(f"{variant}@seed"))


def seed_spread(results: dict[str, Any], variants: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Per variant with per-seed runs: its ``seeds`` and, for each mean of the scored world
    (over the tasks every seed has) and each of :data:`SEED_TASKS`, the per-seed ``values``,
    their ``mean`` and ``sd`` (sample standard deviation; None with one seed)."""
    out: dict[str, Any] = {}
    layout = layout_for(results)
    for v in variants:
        seeds = seed_names(results, v)
        if not seeds:
            continue
        columns = {name: common_tasks(results, tasks, seeds) for name, tasks in layout.means.items()}
        shown = layout.tasks(SEED_TASKS)
        columns |= {task_label(t): [t] for t in shown if common_tasks(results, [t], seeds)}
        row: dict[str, Any] = {"seeds": seeds}
        for name, tasks in columns.items():
            if not tasks:
                continue
            vals = [task_mean(results, tasks, s) for s in seeds]
            row[name] = {
                "values": vals,
                "mean": float(np.mean(vals)),
                "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                "tasks": len(tasks),
            }
        out[v] = row
    return out


def selected_steps(checkpoints: Path, variants: list[str] | tuple[str, ...]) -> dict[str, dict[str, int]]:
    """``{variant: {seed: step}}``: the training step dev selection kept for each seed of each
    trained variant (its ``summary.json`` under ``checkpoints``; variants without one are
    left out). Step 0 is the initialisation (M = I, W = 0), which scores exactly as ``clip``."""
    out: dict[str, dict[str, int]] = {}
    for v in variants:
        path = Path(checkpoints) / v / "summary.json"
        if path.is_file():
            seeds = json.loads(path.read_text()).get("seeds", {})
            out[v] = {str(k): int(r["selected_step"]) for k, r in seeds.items()}
    return out


