"""Flow-CLIP's section of the report (registered as ``flowclip``, after BindCLIP's).

Shown when one of ``global-m``, ``flowclip``, ``flowclip-cimr`` was scored: the ablation
ladder on the all-task and binding means, the frozen-CLIP errors each variant corrects and
the new ones it makes, the patch-sensitivity pictures (the trained ``flowclip`` on the
cached features), the spread over the training seeds, and the issue's goals as measured
(:mod:`.analysis`). The numbers of the tables also go to ``flowclip.json``. The prose is
``report.md`` beside this file; the cross-family table and the image-replacement table are
the generic sections ``head-to-head`` and ``image-replacement``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.report import ReportContext, section
from pipeline.report.markdown import md_table, p_value, pct, pct_ci, points_ci
from pipeline.report.sections import SCORING_BENCH, read_bench, replacement_modes
from pipeline.report.tasks import MEANS
from pipeline.report.templates import Templates
from pipeline.scorers.flowclip import analysis, goals, sensitivity

TEXT = Templates("pipeline.scorers.flowclip", "report.md")
PICTURED = "flowclip"  # the variant whose patch sensitivity is drawn


@section("flowclip", order=55)
def flowclip_section(ctx: ReportContext) -> list[str]:
    """Every Flow-CLIP analysis for whichever of its variants were scored ([] without any)."""
    variants = analysis.scored_variants(ctx.results, analysis.VARIANTS)
    if not variants:
        return []
    n, seed = ctx.cfg.bootstrap, ctx.cfg.seed
    steps = analysis.ladder(ctx.results, n, seed)
    fixes = analysis.corrections(ctx.results, variants)
    seeds = analysis.seed_spread(ctx.results, variants)
    selected = analysis.selected_steps(Path(ctx.score.checkpoints), variants)
    bench = read_bench(ctx.out / SCORING_BENCH)
    checks = goals.goal_checks(
        ctx.results, replacement_modes(ctx) or ("shuffle", "fixed"), bench, n, seed
    )
    ctx.json_files["flowclip.json"] = {
        "tasks": {
            name: [analysis.task_label(t) for t in tasks] for name, tasks in ctx.layout.means.items()
        },
        "ladder": steps,
        "corrections": fixes,
        "seeds": seeds,
        "selected_steps": selected,
        "goals": checks,
    }
    return [
        "## Flow-CLIP",
        TEXT("intro", variants=", ".join(f"`{v}`" for v in variants)),
        *ladder_part(steps, n),
        *corrections_part(fixes, variants),
        *sensitivity_part(ctx),
        *seeds_part(seeds, selected),
        *goals_part(checks, selected),
    ]


def _step(c: dict | None, n_resamples: int) -> str:
    """A paired comparison (``compare_mean`` as a dict) in signed points with its bootstrap
    p (:func:`~pipeline.report.markdown.p_value`: ``p < 2/n_resamples`` when no resample
    crosses 0)."""
    if c is None:
        return "–"
    return f"{points_ci(c['diff'], c['lo'], c['hi'])}<br>p {p_value(c['p'], n_resamples)}"


def ladder_part(steps: dict[str, Any], n_resamples: int) -> list[str]:
    """One table: per rung, each mean with its CI, the step from the rung before and the
    difference from frozen CLIP."""
    means = [name for name in MEANS if steps[name]["rows"]]
    if not means:
        return []
    header = ["rung"]
    for name in means:
        header += [f"{name} mean", "Δ vs previous rung", "Δ vs `clip`"]
    rows = []
    for k, v in enumerate(steps["rungs"]):
        cells = [f"`{v}`"]
        for name in means:
            r = steps[name]["rows"][k]
            cells += [
                pct_ci(r["value"], r["lo"], r["hi"]),
                _step(r["vs_previous"], n_resamples),
                _step(r["vs_clip"], n_resamples),
            ]
        rows.append(cells)
    notes = []
    for name in means:
        tasks, missing = steps[name]["tasks"], steps[name]["missing"]
        notes.append(
            f"{name} mean: {len(tasks)} tasks ({', '.join(tasks)})"
            + (f"; not scored for every rung, left out: {', '.join(missing)}" if missing else "")
        )
    return [
        "### Ablation ladder",
        TEXT("ladder", tasks="; ".join(notes) + "."),
        md_table(header, rows),
    ]


def corrections_part(rows: list[dict[str, Any]], variants: list[str]) -> list[str]:
    """Per slice: items, frozen CLIP's errors, and per variant corrected / new / net (p)."""
    if not rows:
        return []

    def cell(r: dict | None) -> str:
        if r is None:
            return "–"
        return f"{r['corrected']} / {r['new']} / {r['net']:+d}<br>p {r['p']:.3g}"

    table = [
        [
            r["suite"],
            r["slice"],
            str(r["items"]),
            str(r["baseline_errors"]),
            *(cell(r[v]) for v in variants),
        ]
        for r in rows
    ]
    header = ["suite", "slice", "items", "`clip` errors"]
    header += [f"`{v}`: corrected / new / net (McNemar p)" for v in variants]
    return ["### Errors corrected and errors made", TEXT("corrections"), md_table(header, table)]


def sensitivity_part(ctx: ReportContext) -> list[str]:
    """The patch-sensitivity pictures of ``flowclip`` (nothing unless it was scored on the
    suites drawn and they are in the store)."""
    items = sensitivity.sensitivity_items(ctx.results, PICTURED)
    if not items:
        return []
    items = [it for it in items if it[0] in ctx.store.suites()]
    if not items:
        return []
    maps = sensitivity.patch_maps(ctx.scorer(PICTURED), ctx.store, ctx.results, items)
    fig = sensitivity_figure(maps, ctx.results)
    return [
        "### Patch sensitivity",
        TEXT("sensitivity", variant=PICTURED),
        f"![patch sensitivity]({ctx.figure('flowclip-sensitivity.png', fig)})",
    ]


def sensitivity_figure(maps: list[dict[str, Any]], results: dict[str, Any]):
    """One row per item: the image with its captions, and the per-patch change of the margin
    over it (red: the patch's centred feature raises gold − foil; blue: lowers it; a
    symmetric colour scale per item)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, axes = plt.subplots(
        len(maps), 2, figsize=(5.6, 2.8 * len(maps)), squeeze=False, layout="constrained"
    )
    for (ax_img, ax_map), m in zip(axes, maps, strict=True):
        img = np.asarray(
            Image.open(Path(results[m["suite"]]["image_root"]) / m["image"]).convert("RGB")
        )
        h, w = img.shape[:2]
        lim = float(np.abs(m["map"]).max()) or 1.0
        ax_img.imshow(img)
        ax_img.set_title(f"{m['suite']} {m['category']}", fontsize=7)
        ax_img.set_xlabel(f"✓ {m['gold']}\n✗ {m['foil']}", fontsize=6.5)
        ax_map.imshow(img)
        shown = ax_map.imshow(
            m["map"],
            cmap="RdBu_r",
            vmin=-lim,
            vmax=lim,
            alpha=0.65,
            extent=(0, w, h, 0),
            interpolation="nearest",
        )
        ax_map.set_title(f"margin {m['margin']:+.3f}, Σ patches {m['total']:+.3f}", fontsize=7)
        fig.colorbar(shown, ax=ax_map, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
        for ax in (ax_img, ax_map):
            ax.set_xticks([])
            ax.set_yticks([])
    return fig


def untrained(selected: dict[str, dict[str, int]]) -> bool:
    """Whether dev selection kept the initialisation for every seed of every trained variant."""
    return bool(selected) and all(step == 0 for seeds in selected.values() for step in seeds.values())


def seeds_part(seeds: dict[str, Any], selected: dict[str, dict[str, int]]) -> list[str]:
    """Per variant with per-seed runs: mean ± sd over seeds of each mean and headline task,
    and the training step dev selection kept for each seed."""
    if not seeds:
        return []
    columns = list(dict.fromkeys(k for row in seeds.values() for k in row if k != "seeds"))

    def cell(x: dict | None) -> str:
        if x is None:
            return "–"
        sd = "–" if x["sd"] is None else f"{100 * x['sd']:.1f}"
        return f"{pct(x['mean'])} ± {sd}"

    def steps(v: str) -> str:
        return ", ".join(f"{k}: {s}" for k, s in selected.get(v, {}).items()) or "–"

    rows = [
        [f"`{v}`", str(len(row["seeds"])), steps(v), *(cell(row.get(c)) for c in columns)]
        for v, row in seeds.items()
    ]
    header = ["variant", "seeds", "selected step (seed: step)", *(f"{c} mean" if c in MEANS else c for c in columns)]
    if untrained(selected):
        note = [TEXT("untrained")]
    else:  # some seeds kept the initialisation: their rows are `clip`'s
        kept = [f"`{v}@seed{k}`" for v, by in selected.items() for k, step in by.items() if step == 0]
        note = [TEXT("step-zero", runs=", ".join(kept))] if kept else []
    counts = sorted({len(row["seeds"]) for row in seeds.values()})
    n_seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return ["### Training seeds", TEXT("seeds", n_seeds=n_seeds), *note, md_table(header, rows)]


def _verdict(check: dict[str, Any], trivial: bool) -> str:
    """yes / **no** / – ; a met goal of the trained variants (not a speed goal, which is
    measured on the scorer, trained or not) reads "trivially" when none was trained."""
    if check["met"] and trivial and "encoder" not in check:
        return "yes (trivially: untrained)"
    return {True: "yes", False: "**no**", None: "–"}[check["met"]]


def goals_part(checks: list[dict[str, Any]], selected: dict[str, dict[str, int]]) -> list[str]:
    """The issue's goals: measured, met, shortfall (:func:`_verdict`)."""
    trivial = untrained(selected)
    rows = [[c["goal"], c["measured"], _verdict(c, trivial), c["shortfall"] or "–"] for c in checks]
    table = md_table(["goal", "measured", "met", "short of the goal by"], rows)
    return ["### The issue's goals, as measured", TEXT("goals"), table]
