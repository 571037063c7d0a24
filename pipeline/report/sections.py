"""The generic report sections: every scored variant, whatever its family.

* ``overview`` (order 0): the title, the encoder, the variants, how to read a cell and the
  ``@seed<k>`` / ``@<replacement>`` rows, and the terms the report uses (design notes, seeds,
  Flow-CLIP's parts).
* ``failure-profile`` (10, in :mod:`pipeline.report.published` beside the figures it reads):
  frozen CLIP on the shapes suites next to the figures reported for real ViT-L/14 and chance.
* ``shortcuts`` (15): baselines that bind nothing (the subject's half, a fixed-pixel lookup,
  a depth phrase, the object count) on the scored shapes suites; their rows also go to
  ``diagnostics.json`` (``shortcuts``).
* ``suites`` (20): per suite, each variant's metrics with 95% bootstrap CIs and, for the
  others, Δ against ``clip`` with a paired-bootstrap CI; chance levels; example images.
  The same numbers, one row per (suite, variant, metric), go to ``plots/metrics.csv``. Under
  a table, the categories its aggregates lack and its text-only metrics (SugarCrepe++'s TOT).
* ``head-to-head`` (45): the families side by side (``report.head_to_head``): every
  suite's headline metrics and the binding slices in one table, the same cells, then each
  variant's parameters and scoring speed from ``pipeline bench scoring``.
* ``image-replacement`` (46): each replaced variant on the ARO- and SugarCrepe-style
  tasks with its own image, under Shuffle and under Fixed (``score.replacements``), against
  chance: a scorer that reads the image falls toward chance when the image is replaced.
* ``encoder-comparison`` (47, in :mod:`pipeline.report.encoders`): ``pipeline
  compare-encoders``' summary when present.
* ``performance`` (90): the measurements that ``pipeline bench ...`` and ``pipeline
  probes`` left in the report folder.

Family sections (e.g. BindCLIP's, order 50) sit between these and the performance. The
sections name their tasks by role (:mod:`pipeline.report.tasks`) and render them in the
scored world's suites (``ctx.layout``), so one report serves the shapes world and the real
benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.benchmarks import SUITES, Units
from pipeline.config import ReportConfig
from pipeline.report import ReportContext, section
from pipeline.report.compare import common_tasks, compare_mean, mean_ci, task_units
from pipeline.report.figures import examples_figure
from pipeline.report.inputs import read_bench, read_measurement
from pipeline.report.markdown import md_table, metric_ci, metric_diff, pct, pct_ci, points_ci
from pipeline.report.tasks import (
    ARO_TASKS,
    RETRIEVAL,
    SUGARCREPE_TASKS,
    WHATSUP,
    Task,
    TaskLayout,
)
from pipeline.report.tasks import (
    label as task_label,
)
from pipeline.report.templates import Templates
from pipeline.stats import ConfidenceInterval, bootstrap_ci, units_bootstrap

TEXT = Templates("pipeline.report", "templates/sections.md")
BASELINE = "clip"  # every other variant's Δ is taken against frozen global CLIP
POOLED_METRICS = ("total", "category-mean", "TOT")  # the suites' aggregates over their categories

# The head-to-head rows, as roles (:mod:`pipeline.report.tasks`): every metric of these
# suites, then single tasks, then the binding slices not among them.
HEAD_TO_HEAD_SUITES = ("shapes-sugarcrepe", "shapes-aro")
HEAD_TO_HEAD_TASKS: tuple[Task, ...] = (*WHATSUP, *RETRIEVAL)
BINDING_SLICES: tuple[Task, ...] = (("shapes-whatsup", "pair"), ("shapes-whatsup", "set"))
SCORING_BENCH = "bench/scoring.json"  # `pipeline bench scoring`: parameters, pairs/s, speedup
BENCH_ENCODERS = ("toy", "ViT-L-14-336")  # always shown in the head-to-head ("–" if absent)
# What the measuring commands write under the report folder ({"command", "results"} JSON),
# shown in the performance section by file name.
MEASUREMENTS = ("bench/*.json", "probes.json")


def metric_cell(metric: str, u: Units, base: Units | None, cfg: ReportConfig) -> tuple[str, ConfidenceInterval]:
    """One table cell: ``metric`` in its unit (a rate in %, a rank as is) with its 95% bootstrap
    CI and, given the baseline's units for the same metric, ``<br>Δ`` against it with a
    paired-bootstrap CI; and the CI."""
    ci = bootstrap_ci(u.values, u.groups, n_resamples=cfg.bootstrap, seed=cfg.seed)
    cell = metric_ci(metric, ci.estimate, ci.lo, ci.hi)
    if base is not None:
        d = units_bootstrap(u, base, n_resamples=cfg.bootstrap, seed=cfg.seed)
        cell += f"<br>Δ {metric_diff(metric, d.diff, d.lo, d.hi)}"
    return cell, ci


def suite_table(
    suite_name: str, entry: dict[str, Any], cfg: ReportConfig, baseline: str = BASELINE
) -> tuple[str, list[dict]]:
    """Markdown table: variant x metric with 95% CIs, and Δ vs the baseline with paired CIs;
    and the long rows (suite, variant, metric, value, lo, hi) of ``plots/metrics.csv``."""
    suite = SUITES.get(suite_name)
    units_by_variant = {v: suite.units(entry["manifest"], s) for v, s in entry["scores"].items()}
    rows, long_rows = [], []
    for variant, units in units_by_variant.items():
        cells = []
        for name in suite.metric_names:
            u = units.get(name)
            if u is None or len(u.values) == 0:
                cells.append("–")
                continue
            compared = variant != baseline and baseline in units_by_variant
            cell, ci = metric_cell(name, u, units_by_variant[baseline][name] if compared else None, cfg)
            cells.append(cell)
            long_rows.append(
                {
                    "suite": suite_name,
                    "variant": variant,
                    "metric": name,
                    "value": ci.estimate,
                    "lo": ci.lo,
                    "hi": ci.hi,
                }
            )
        rows.append([variant, *cells])
    return md_table(["variant", *suite.metric_names], rows), long_rows


@section("overview", order=0)
def overview(ctx: ReportContext) -> list[str]:
    variants = ", ".join(f"`{v}`" for v in ctx.score.variants)
    intro = TEXT(
        "intro",
        encoder=ctx.extract.model,
        variants=variants,
        bootstrap=ctx.cfg.bootstrap,
        seed=ctx.cfg.seed,
    )
    unscored = [v for v in ctx.score.variants if not any(v in e["scores"] for e in ctx.results.values())]
    if unscored:
        intro += " " + TEXT("unscored", variants=", ".join(f"`{v}`" for v in unscored))
    empty = [s for s, e in ctx.results.items() if not e["scores"]]  # score.suites with no table at all
    if empty:
        intro += " " + TEXT("unscored-suites", suites=", ".join(f"`{s}`" for s in empty))
    if any("@seed" in v for v in ctx.scored):
        intro += " " + TEXT("seed-runs")
    modes = [m for m in replacement_modes(ctx) if any(v.endswith(f"@{m}") for v in ctx.scored)]
    if modes:
        intro += " " + TEXT("replaced-runs", modes=" or ".join(f"`<variant>@{m}`" for m in modes))
    return [f"# Compositionality report ({ctx.layout.world})", intro, TEXT("terms")]


@section("shortcuts", order=15)
def shortcuts(ctx: ReportContext) -> list[str]:
    """Baselines that bind nothing on the scored shapes suites (:mod:`pipeline.world.shortcuts`),
    so each suite's figures read against what position, pixels or counts alone give."""
    from pipeline.world.shortcuts import (
        OFFSET,
        depth_phrase,
        negation_count,
        subject_half,
        whatsup_shortcuts,
    )

    if not ctx.layout.toy_world:
        return []
    rows, records = [], []

    def add(suite: str, baseline: str, figure: str, **numbers: Any) -> None:
        """One table row, and its numbers (rates as fractions, None for none) as a record."""
        rows.append([suite, baseline, figure])
        ready = {k: v if isinstance(v, str) or np.isfinite(v) else None for k, v in numbers.items()}
        records.append({"suite": suite, "baseline": None if baseline == "–" else baseline, **ready})

    def world_entry(suite: str, *columns: str) -> dict | None:
        """The suite's results when its manifest has the world's columns the baselines read
        (a manifest made by hand may lack the scene), else None and a row saying so."""
        entry = ctx.results.get(suite)
        if entry is None:
            return None
        absent = [c for c in ("scene", *columns) if c not in entry["manifest"]]
        if absent:
            note = f"not computed: its manifest has no {', '.join(absent)} column"
            add(suite, "–", note, note=note)
            return None
        return entry

    if (entry := world_entry("shapes-whatsup")) is not None:
        for name, metrics in whatsup_shortcuts(entry["manifest"], entry["image_root"]).items():
            add("shapes-whatsup", name, ", ".join(f"{k} {pct(v)}" for k, v in metrics.items()), **metrics)
    if (entry := world_entry("shapes-sugarcrepe")) is not None:
        d = depth_phrase(entry["manifest"])
        figure = f"replace-rel: decides {d['decided']} of {d['items']}, right on {pct(d['right when decided'])}"
        add("shapes-sugarcrepe", "depth phrase (text only)", figure, slice="replace-rel", **d)
        h = subject_half(entry["manifest"][entry["manifest"]["category"] == "replace-rel"])
        figure = f"replace-rel: {pct(h['accuracy'])} of the {h['items']} spatial items"
        add("shapes-sugarcrepe", "subject's half", figure, slice="replace-rel", **h)
    if (entry := world_entry("shapes-dev", "family")) is not None:
        n = negation_count(entry["manifest"])
        figure = f"negation: {pct(n['object-count accuracy'])} of {n['items']}"
        add("shapes-dev", "object count", figure, slice="negation", **n)
        h = subject_half(entry["manifest"][entry["manifest"]["family"].isin(["relative-geometry", "vertical"])])
        figure = f"relative-geometry and vertical: {pct(h['accuracy'])} of {h['items']}"
        add("shapes-dev", "subject's half", figure, slice="relative-geometry and vertical", **h)
    if not rows:
        return []
    ctx.json_files.setdefault("diagnostics.json", {})["shortcuts"] = records
    table = md_table(["suite", "baseline", "figure"], rows)
    return ["## Shortcut baselines", TEXT("shortcuts", offset=f"{OFFSET:g}"), table]


@section("suites", order=20)
def suites(ctx: ReportContext) -> list[str]:
    parts: list[str] = []
    long_rows: list[dict] = []
    for suite_name, entry in ctx.results.items():
        if not entry["scores"]:
            continue
        table, rows = suite_table(suite_name, entry, ctx.cfg)
        long_rows += rows
        description = SUITES.get(suite_name).description.rstrip()
        description += "" if description.endswith((".", "!", "?")) else "."
        missing = entry.get("missing") or []
        left_out = (
            f" {len(missing)} item(s) left out, their image missing or undecodable at extract (each "
            "metrics file's `skipped` counts the two reasons): "
            + ", ".join(missing[:10]) + (" …" if len(missing) > 10 else "") + "."
        ) if missing else ""  # fmt: skip
        parts += [f"## {suite_name}", f"{len(entry['manifest'])} items. {description}{left_out}", table]
        parts += coverage_and_text_only(ctx, suite_name, entry)
        chance = ctx.layout.suite_chances.get(suite_name)
        if chance:
            parts.append("Chance: " + ", ".join(f"{k} {pct(v)}" for k, v in chance.items()) + ".")
        fig = examples_figure(entry, ctx.cfg.examples)
        if fig is not None:
            path = ctx.figure(f"examples-{suite_name}.png", fig)
            parts.append(f"![examples {suite_name}]({path})")
    ctx.tables["plots/metrics.csv"] = pd.DataFrame(long_rows)
    return parts


def coverage_and_text_only(ctx: ReportContext, suite_name: str, entry: dict[str, Any]) -> list[str]:
    """Under a suite's table: the categories its aggregates leave out, where the manifest
    records missing category files (``entry["categories"]``), and its text-only metrics
    (``entry["text_metrics"]``, SugarCrepe++'s TOT) as the metrics files record them."""
    parts, coverage, text = [], entry.get("categories") or {}, entry.get("text_metrics") or {}
    if coverage.get("missing"):
        names = [m for m in POOLED_METRICS if m in SUITES.get(suite_name).metric_names or m in text]
        present, missing = coverage.get("present", []), coverage["missing"]
        aggregates = " and ".join(f"`{m}`" for m in names) or "Every aggregate"
        parts.append(TEXT("categories-missing", aggregates=aggregates, present=len(present),
                          total=len(present) + len(missing), missing=", ".join(missing)))  # fmt: skip
    if text:
        path = Path(ctx.score.metrics_out) / "<variant>" / f"{suite_name}.json"
        n = len(entry["manifest"]) + len(entry.get("missing") or [])
        table = md_table(["text encoder", *text], [[f"frozen `{ctx.extract.model}`", *map(pct, text.values())]])
        parts += [TEXT("text-only", encoder=ctx.extract.model, n=n, path=str(path)), table]
    return parts


def head_to_head_tasks(layout: TaskLayout) -> list[Task]:
    """The head-to-head rows in ``layout``'s world: every metric of :data:`HEAD_TO_HEAD_SUITES`
    (as roles), every metric of the world's extra suites, then :data:`HEAD_TO_HEAD_TASKS` and
    :data:`BINDING_SLICES`."""
    roles = [(s, m) for s in HEAD_TO_HEAD_SUITES for m in SUITES.get(s).metric_names]
    extra = [(s, m) for s in layout.extra_head_to_head for m in SUITES.get(s).metric_names]
    rows = [*layout.tasks(roles), *extra, *layout.tasks([*HEAD_TO_HEAD_TASKS, *BINDING_SLICES])]
    return list(dict.fromkeys(rows))


def bench_entry(bench: dict[str, Any], encoder: str, variant: str) -> dict[str, Any]:
    """One variant's measurements at one encoder in ``pipeline bench scoring``'s results
    (``{encoder: {"variants": {variant: {...}}}}``, or without the ``variants`` level); {}
    where there are none."""
    entry = bench.get(encoder)
    entry = entry.get("variants", entry) if isinstance(entry, dict) else {}
    found = entry.get(variant) if isinstance(entry, dict) else None
    return found if isinstance(found, dict) else {}


def bench_number(bench: dict[str, Any], encoder: str, variant: str, key: str) -> float | None:
    """A number of :func:`bench_entry` (None when absent or not a number)."""
    x = bench_entry(bench, encoder, variant).get(key)
    return x if isinstance(x, int | float) and not isinstance(x, bool) else None


def bench_rows(bench: dict[str, Any], variants: list[str]) -> list[list[str]]:
    """Per encoder of ``pipeline bench scoring``'s results: each variant's trainable
    parameters, pairs per second from the cache and speedup against re-encoding ("–" where
    the bench has no number)."""
    rows = []
    for enc in dict.fromkeys([*BENCH_ENCODERS, *bench]):
        for key, label, fmt in (
            ("parameters", "trainable parameters", ","),
            ("pairs_per_s", "pairs/s from the cache", ",.0f"),
            ("speedup", "× faster than re-encoding", ".1f"),
        ):
            numbers = (bench_number(bench, enc, v, key) for v in variants)
            rows.append(
                [f"bench ({enc})", label, *("–" if x is None else format(x, fmt) for x in numbers)]
            )
    return rows


@section("head-to-head", order=45)
def head_to_head(ctx: ReportContext) -> list[str]:
    """The ``report.head_to_head`` variants that were scored, side by side on every suite's
    headline metrics and the binding slices, then their size and speed ([] for fewer than two)."""
    variants = [v for v in ctx.cfg.head_to_head if v in ctx.scored]
    if len(variants) < 2:
        return []
    tasks = head_to_head_tasks(ctx.layout)
    units = {v: task_units(ctx.results, tasks, v) for v in variants}
    rows = []
    for task in tasks:
        if not any(task in units[v] for v in variants):
            continue
        base = units.get(BASELINE, {}).get(task)
        cells = [
            metric_cell(task[1], units[v][task], base if v != BASELINE else None, ctx.cfg)[0]
            if task in units[v]
            else "–"
            for v in variants
        ]
        rows.append([*task, *cells])
    bench_file = ctx.out / SCORING_BENCH
    rows += bench_rows(read_bench(bench_file), variants)
    absent = TEXT("no-scoring-bench", path=str(bench_file), command=ctx.bench_command("scoring"))
    note = "" if bench_file.exists() else " " + absent
    return [
        "## Head to head",
        TEXT("head-to-head", baseline=BASELINE) + note,
        md_table(["suite", "metric", *(f"`{v}`" for v in variants)], rows),
    ]


def replacement_modes(ctx: ReportContext) -> list[str]:
    """The image replacements scored (``score.replacements``; ``true`` is the own image)."""
    return [m for m in ctx.score.replacements if m != "true"]


@section("image-replacement", order=46)
def image_replacement(ctx: ReportContext) -> list[str]:
    """Each variant with replacement runs (``<variant>@<mode>``) on the ARO-style tasks, their
    mean, the SugarCrepe-style mean and the What'sUp-style individual accuracy (each over the
    tasks every run was scored on, the count named when some are missing): own image, then
    each replacement with Δ against the own image; chance last."""
    modes = replacement_modes(ctx)
    variants = [
        v
        for v in dict.fromkeys([*ctx.score.variants, *sorted(ctx.scored)])
        if "@" not in v and any(f"{v}@{m}" in ctx.scored for m in modes)
    ]
    if not variants:
        return []
    layout = ctx.layout
    runs_of = {v: [v, *(f"{v}@{m}" for m in modes if f"{v}@{m}" in ctx.scored)] for v in variants}
    everyone = [r for runs in runs_of.values() for r in runs]

    def scored(roles: tuple[Task, ...]) -> tuple[Task, ...]:  # the tasks every run has
        return tuple(common_tasks(ctx.results, layout.tasks(roles), everyone))

    def named(name: str, roles: tuple[Task, ...], tasks: tuple[Task, ...]) -> str:
        n_all = len(layout.tasks(roles))
        return name if len(tasks) == n_all else f"{name} ({len(tasks)} of {n_all} tasks)"

    aro, sugarcrepe, whatsup = scored(ARO_TASKS), scored(SUGARCREPE_TASKS), scored(WHATSUP)
    columns: list[tuple[str, tuple[Task, ...]]] = [
        *((task_label(t, aro), (t,)) for t in aro),
        (named("ARO-style mean", ARO_TASKS, aro), aro),
        (named("SugarCrepe-style mean", SUGARCREPE_TASKS, sugarcrepe), sugarcrepe),
        (named("What'sUp-style individual", WHATSUP, whatsup), whatsup),  # a mean on the real suites
    ]
    columns = [(name, tasks) for name, tasks in columns if tasks]
    if not columns:
        return []
    n, seed = ctx.cfg.bootstrap, ctx.cfg.seed
    rows = []
    for v in variants:
        for run in runs_of[v]:
            cells = []
            for _, tasks in columns:  # each mean over the tasks every run was scored on
                ci = mean_ci(ctx.results, tasks, run, n, seed)
                d = compare_mean(ctx.results, tasks, run, v, n, seed) if run != v else None
                cell = "–" if ci is None else pct_ci(ci.estimate, ci.lo, ci.hi)
                cells.append(cell + (f"<br>Δ {points_ci(d.diff, d.lo, d.hi)}" if d else ""))
            condition = "own image" if run == v else run.split("@", 1)[1]
            rows.append([f"`{v}`", condition, *cells])
    chance = [pct(sum(layout.chance(t) for t in tasks) / len(tasks)) for _, tasks in columns]
    rows.append(["chance", "", *chance])
    header = ["variant", "image", *(name for name, _ in columns)]
    return [
        "## Image replacement",
        TEXT("image-replacement", modes=", ".join(modes)),
        md_table(header, rows),
    ]


@section("performance", order=90)
def performance(ctx: ReportContext) -> list[str]:
    """The measurement files (:data:`MEASUREMENTS`) by name, each with its command: its
    own table where its results carry one (``table_markdown``, e.g. ``scripts/real_cost.py``'s
    estimate, whose JSON runs to hundreds of lines), else its results as JSON. Each is read by
    :func:`pipeline.report.inputs.read_measurement`, which refuses one that is not a measurement."""
    files = sorted(
        (f for pattern in MEASUREMENTS for f in ctx.out.glob(pattern)), key=lambda f: f.stem
    )
    if not files:
        commands = {name: ctx.bench_command(name) for name in ("extract", "scoring", "memory")}
        return ["## Performance", TEXT("no-measurements", **commands)]
    parts = []
    for f in files:
        command, results = read_measurement(f)  # refuses a file that is not a measurement
        if isinstance(results.get("table_markdown"), str):
            body = f"{results['table_markdown']}\n\nEvery figure, count and note: `{f.relative_to(ctx.out)}`."
        else:
            body = f"```json\n{json.dumps(results, indent=1)}\n```"
        parts.append(f"**{f.stem}** (`{command}`)\n\n{body}")
    return ["## Performance", "\n\n".join(parts)]
