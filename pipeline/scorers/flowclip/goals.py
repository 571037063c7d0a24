"""Flow-CLIP's goals (the Flow-CLIP issue's "what it must show"), checked on cached scores:
each goal with the measured value and a paired-bootstrap CI of the compared difference, a
verdict, and by how much an unmet goal is missed. Nothing is asserted; everything is
reported (the report's Flow-CLIP goals table renders :func:`goal_checks`).
"""

from __future__ import annotations

from typing import Any

from pipeline.report.compare import common_tasks, compare_mean
from pipeline.report.sections import bench_number
from pipeline.report.tasks import ALL_TASKS, ARO_TASKS, BINDING_TASKS, layout_for
from pipeline.scorers.flowclip.analysis import BASELINE, VARIANTS

SPEEDUP_GOALS = {"toy": 20.0, "ViT-L-14-336": 100.0}  # scoring from the cache vs re-encoding
_AT_BOUND = 1e-9  # accuracies are ratios of counts: a value exactly at a goal's bound meets it


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
    terms) and the numbers behind it (``value``, ``base``, ``diff``, ``lo``, ``hi``); a goal
    on scores also names the trained variants it ``compares``, whose scored checkpoints decide
    whether the verdict is the training's or the initialisation's (the report reads them).

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
    compares = ["global-m"]
    if c is None:
        checks.append(_check(goal, "not scored", None, compares=compares))
    else:
        met = c.diff >= -eps
        measured = f"{100 * c.value:.1f} vs {100 * c.base:.1f}: {_points(c)}{note}"
        short = f"{-100 * c.diff:.1f} points"
        checks.append(_check(goal, measured, met, short, compares=compares, **numbers(c)))

    goal = "`flowclip` >= `global-m` + 3 points on the binding mean"
    c, note = comparison(BINDING_TASKS, "flowclip", "global-m", "binding")
    compares = ["flowclip", "global-m"]
    if c is None:
        checks.append(_check(goal, "not scored", None, compares=compares))
    else:
        met = c.diff >= 0.03 - eps
        measured = f"{100 * c.value:.1f} vs {100 * c.base:.1f}: {_points(c)}{note}"
        short = f"{100 * (0.03 - c.diff):.1f} points"
        checks.append(_check(goal, measured, met, short, compares=compares, **numbers(c)))

    compares = ["flowclip", "flowclip-cimr"]  # a replaced-image run scores the variant's checkpoint
    for mode in modes:
        goal = f"under {mode}, `flowclip-cimr`'s ARO-style mean >= 10 points below `flowclip`'s"
        c, note = comparison(ARO_TASKS, f"flowclip@{mode}", f"flowclip-cimr@{mode}", "aro")
        if c is None:
            checks.append(_check(goal, "not scored", None, mode=mode, compares=compares))
            continue
        met = c.diff >= 0.10 - eps
        measured = (
            f"`flowclip` {100 * c.value:.1f}, `flowclip-cimr` {100 * c.base:.1f}: "
            f"`flowclip` − `flowclip-cimr` = {_points(c)}{note}"
        )
        checks.append(
            _check(
                goal, measured, met, f"{100 * (0.10 - c.diff):.1f} points", mode=mode,
                compares=compares, **numbers(c),
            )
        )

    goal = "own image: `flowclip-cimr`'s ARO-style mean within 2 points of `flowclip`'s"
    c, note = comparison(ARO_TASKS, "flowclip-cimr", "flowclip", "aro")
    compares = ["flowclip-cimr", "flowclip"]
    if c is None:
        checks.append(_check(goal, "not scored", None, compares=compares))
    else:
        met = abs(c.diff) <= 0.02 + eps
        measured = f"{100 * c.value:.1f} vs {100 * c.base:.1f}: {_points(c)}{note}"
        short = f"{100 * (abs(c.diff) - 0.02):.1f} points"
        checks.append(_check(goal, measured, met, short, compares=compares, **numbers(c)))

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
