"""Flow-CLIP's analyses (seed ``flowclip.txt`` §4.3-4.7): pure functions of cached scores,
and one of a trained scorer on cached features; its report section renders them.

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
* :func:`goal_checks`: the issue's goals, each with the measured value, a verdict and by
  how much it is missed; nothing is asserted, everything is reported.
* :func:`patch_sensitivity` / :func:`patch_maps`: the first-order change of the gold-minus-foil
  margin per patch of the final grid (seed §4.7, "first-order changes in gold–foil evidence
  increments along centered patch-feature directions").

Why centred directions: ICER reads a patch only through its unit key ``v_p =
normalise(P_v^T g_p)``, which does not change when ``g_p`` is scaled, so ``∂m/∂g_p · g_p = 0``
exactly for every patch. Along the centred direction ``g_p − ḡ`` (``ḡ`` the mean valid
patch) the change is what moving a patch toward or away from the image's average does to
the margin; the per-patch changes sum to the margin's directional derivative along the
whole centred grid.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.features import ImageFeatures, TextFeatures
from pipeline.report.compare import common_tasks, compare_mean, mean_ci, task_units
from pipeline.report.sections import bench_number
from pipeline.report.tasks import (
    ALL_TASKS,
    ARO_TASKS,
    BINDING_TASKS,
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
# Patch-sensitivity pictures: (suite, category or None for any) of the items drawn, in order.
SENSITIVITY_ITEMS = (
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-sugarcrepe", "swap-obj"),
    ("shapes-whatsup", None),
)
SPEEDUP_GOALS = {"toy": 20.0, "ViT-L-14-336": 100.0}  # scoring from the cache vs re-encoding
_AT_BOUND = 1e-9  # accuracies are ratios of counts: a value exactly at a goal's bound meets it


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


# ---------------------------------------------------------------- the goals


def _check(
    goal: str, measured: str, met: bool | None, shortfall: str = "", **numbers
) -> dict[str, Any]:
    """One goal row: ``met`` None when it could not be measured."""
    return {
        "goal": goal,
        "measured": measured,
        "met": met,
        "shortfall": "" if met else shortfall,
        **numbers,
    }


def _points(c) -> str:
    return f"{100 * c.diff:+.1f} [{100 * c.lo:+.1f}, {100 * c.hi:+.1f}] points"


def goal_checks(
    results: dict[str, Any],
    modes: list[str] | tuple[str, ...] = ("shuffle", "fixed"),
    bench: dict[str, Any] | None = None,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The Flow-CLIP issue's goals (bounds inclusive), each with ``measured`` (values and a
    paired-bootstrap CI of the compared difference), ``met`` (None: not measured, e.g. a
    variant not scored), ``shortfall`` (by how much an unmet goal is missed, in its own
    terms) and the numbers behind it (``value``, ``base``, ``diff``, ``lo``, ``hi``).

    Goals: ``global-m`` >= ``clip`` on the all-task mean; ``flowclip`` >= ``global-m`` + 3
    points on the binding mean; under each of ``modes``, ``flowclip-cimr``'s ARO-style mean
    >= 10 points below ``flowclip``'s; with the own image, ``flowclip-cimr``'s ARO-style
    mean within 2 points of ``flowclip``'s; and scoring from the cache >= 20x (toy) and
    >= 100x (ViT-L-14-336) faster than re-encoding for every Flow-CLIP variant in ``bench``
    (``pipeline bench scoring``'s ``results``).
    """
    eps = _AT_BOUND
    checks = []
    layout = layout_for(results)

    def comparison(roles, variant: str, base: str, name: str):
        """The paired comparison on the world's tasks of ``roles`` both have (None without
        any), and a note naming how many of them that is when some are missing."""
        tasks = layout.tasks(roles)
        present = common_tasks(results, tasks, [variant, base])
        c = (
            compare_mean(results, present, variant, base, n_resamples, seed, name)
            if present
            else None
        )
        note = f" (over {len(present)} of {len(tasks)} tasks)" if len(present) < len(tasks) else ""
        return c, note

    def numbers(c) -> dict[str, float]:
        return {"value": c.value, "base": c.base, "diff": c.diff, "lo": c.lo, "hi": c.hi}

    goal = "`global-m` >= `clip` on the all-task mean"
    c, note = comparison(ALL_TASKS, "global-m", BASELINE, "all-task")
    if c is None:
        checks.append(_check(goal, "not scored", None))
    else:
        met = c.diff >= -eps
        measured = f"{100 * c.value:.1f} vs {100 * c.base:.1f}: {_points(c)}{note}"
        checks.append(_check(goal, measured, met, f"{-100 * c.diff:.1f} points", **numbers(c)))

    goal = "`flowclip` >= `global-m` + 3 points on the binding mean"
    c, note = comparison(BINDING_TASKS, "flowclip", "global-m", "binding")
    if c is None:
        checks.append(_check(goal, "not scored", None))
    else:
        met = c.diff >= 0.03 - eps
        measured = f"{100 * c.value:.1f} vs {100 * c.base:.1f}: {_points(c)}{note}"
        checks.append(
            _check(goal, measured, met, f"{100 * (0.03 - c.diff):.1f} points", **numbers(c))
        )

    for mode in modes:
        goal = f"under {mode}, `flowclip-cimr`'s ARO-style mean >= 10 points below `flowclip`'s"
        c, note = comparison(ARO_TASKS, f"flowclip@{mode}", f"flowclip-cimr@{mode}", "aro")
        if c is None:
            checks.append(_check(goal, "not scored", None, mode=mode))
            continue
        met = c.diff >= 0.10 - eps
        measured = (
            f"`flowclip` {100 * c.value:.1f}, `flowclip-cimr` {100 * c.base:.1f}: "
            f"`flowclip` − `flowclip-cimr` = {_points(c)}{note}"
        )
        checks.append(
            _check(
                goal, measured, met, f"{100 * (0.10 - c.diff):.1f} points", mode=mode, **numbers(c)
            )
        )

    goal = "own image: `flowclip-cimr`'s ARO-style mean within 2 points of `flowclip`'s"
    c, note = comparison(ARO_TASKS, "flowclip-cimr", "flowclip", "aro")
    if c is None:
        checks.append(_check(goal, "not scored", None))
    else:
        met = abs(c.diff) <= 0.02 + eps
        measured = f"{100 * c.value:.1f} vs {100 * c.base:.1f}: {_points(c)}{note}"
        checks.append(
            _check(goal, measured, met, f"{100 * (abs(c.diff) - 0.02):.1f} points", **numbers(c))
        )

    checks += speedup_checks(bench or {})
    return checks


def speedup_checks(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Per encoder of :data:`SPEEDUP_GOALS`: every Flow-CLIP variant's speedup of scoring
    from the cache over re-encoding in ``bench`` (``pipeline bench scoring``'s results)
    against the goal; met only when every variant measured meets it."""
    checks = []
    for enc, bound in SPEEDUP_GOALS.items():
        goal = f"scoring from the cache >= {bound:.0f}x faster than re-encoding ({enc})"
        measured_by = {v: bench_number(bench, enc, v, "speedup") for v in VARIANTS}
        speed = {v: float(x) for v, x in measured_by.items() if x is not None}
        if not speed:
            checks.append(
                _check(goal, "not measured (`pipeline bench scoring`)", None, encoder=enc)
            )
            continue
        short = {v: x for v, x in speed.items() if x < bound - _AT_BOUND}
        measured = ", ".join(f"`{v}` {x:.1f}x" for v, x in speed.items())
        pairs = {bench_number(bench, enc, v, "pairs") for v in speed} - {None}
        if len(pairs) == 1:  # few pairs weigh fixed costs heavily: say how many were timed
            measured += f" ({int(pairs.pop()):,} pairs each)"
        shortfall = ", ".join(f"`{v}` {bound - x:.1f}x short" for v, x in short.items())
        checks.append(_check(goal, measured, not short, shortfall, encoder=enc, speedups=speed))
    return checks


# ---------------------------------------------------------------- patch sensitivity


def patch_sensitivity(
    scorer, image: ImageFeatures, gold: TextFeatures, foil: TextFeatures, centre: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-order change of the margin ``m = s(I, gold) − s(I, foil)`` per final-grid patch.

    ``Δ_p = ∂m/∂g_p · δ_p`` with ``δ_p = g_p − ḡ`` (``centre``; ``ḡ`` the mean valid patch
    of the image) or ``δ_p = g_p``, for the final-layer grid ``g`` (after ``ln_post``, CLS
    excluded). ``Σ_p Δ_p`` is the directional derivative ``d/dt m(g + t δ)`` at ``t = 0``.
    Without centring every ``Δ_p`` is 0 for Flow-CLIP (its patch keys are unit vectors:
    see the module docstring). Padded (all-zero) patches get 0.

    Args:
        scorer: a per-caption scorer (``score(image, text) -> [B]``), e.g. ``FlowClip``.
        image: B images (``final`` [B, R, d_v] is differentiated; nothing else is).
        gold: B true captions, one per image.
        foil: B negative captions, one per image.
        centre: use centred patch directions.

    Returns:
        [B, R] per-patch changes and [B] margins.
    """
    g = image.final.detach().float().clone().requires_grad_(True)  # [B, R, d_v]
    img = ImageFeatures(image.early, g, image.cls, image.embed)
    with torch.enable_grad():
        margin = scorer.score(img, gold) - scorer.score(img, foil)  # [B]
        (grad,) = torch.autograd.grad(margin.sum(), g)  # [B, R, d_v]; items are independent
    g = g.detach()
    valid = (g.abs().amax(-1) > 0).to(g.dtype)[..., None]  # [B, R, 1]
    mean = (g * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp_min(
        1.0
    )  # [B, 1, d_v]
    direction = (g - mean if centre else g) * valid  # [B, R, d_v]
    return (grad * direction).sum(-1), margin.detach()  # [B, R], [B]


def sensitivity_items(
    results: dict[str, Any], variant: str = "flowclip"
) -> list[tuple[str, int, int, int]]:
    """The items of the patch-sensitivity pictures: for each entry of
    :data:`SENSITIVITY_ITEMS`, the first item of that suite and category (manifest order) not
    yet taken, as ``(suite, item, gold option, foil option)``; the foil is ``variant``'s
    highest-scoring wrong option (the other caption of a two-way item)."""
    out: list[tuple[str, int, int, int]] = []
    layout = layout_for(results)
    for role, category in SENSITIVITY_ITEMS:
        suite = layout.suite(role)
        entry = results.get(suite) if suite else None
        if not entry or variant not in entry["scores"]:
            continue
        m = entry["manifest"]
        rows = (
            np.arange(len(m))
            if category is None
            else np.flatnonzero(m["category"].to_numpy() == category)
        )
        taken = {i for s, i, _, _ in out if s == suite}
        left = [int(i) for i in rows if int(i) not in taken]
        if not left:
            continue
        i = left[0]
        gold = int(m["correct"].iloc[i])
        s = np.array(entry["scores"][variant][i], dtype=float)  # [K]
        s[gold] = -np.inf
        s[np.isnan(s)] = -np.inf
        out.append((suite, i, gold, int(np.argmax(s))))
    return out


def patch_maps(
    scorer, store, results: dict[str, Any], items: list[tuple[str, int, int, int]]
) -> list[dict[str, Any]]:
    """:func:`patch_sensitivity` (centred) of ``items`` (:func:`sensitivity_items`), read from
    the store through each suite's index: per item its suite, row, image path, category, gold
    and foil captions, margin, ``map`` ([grid_h, grid_w] per-patch changes) and ``total``
    (their sum). Items of suites the store lacks are skipped."""
    from pipeline.scoring import item_image_rows

    gh, gw = store.dims.grid
    out = []
    for suite in dict.fromkeys(s for s, *_ in items):
        if suite not in store.suites():
            continue
        picked = [(i, a, b) for s, i, a, b in items if s == suite]
        index = store.suite_index(suite)
        rows = np.array([i for i, _, _ in picked])
        caps = index["captions"][rows]  # [b, K]
        k = np.arange(len(rows))
        gold_opt, foil_opt = (
            np.array([a for _, a, _ in picked]),
            np.array([b for _, _, b in picked]),
        )
        delta, margin = patch_sensitivity(
            scorer,
            store.images(item_image_rows(index)[rows]),
            store.texts(caps[k, gold_opt]),
            store.texts(caps[k, foil_opt]),
        )
        manifest: pd.DataFrame = results[suite]["manifest"]
        for j, (i, a, b) in enumerate(picked):
            row = manifest.iloc[i]
            out.append(
                {
                    "suite": suite,
                    "item": i,
                    "image": row["image"],
                    "category": str(row["category"]),
                    "gold": row["captions"][a],
                    "foil": row["captions"][b],
                    "margin": float(margin[j]),
                    "map": delta[j].reshape(gh, gw).numpy(),
                    "total": float(delta[j].sum()),
                }
            )
    order = {(s, i): n for n, (s, i, _, _) in enumerate(items)}
    return sorted(out, key=lambda r: order[(r["suite"], r["item"])])
