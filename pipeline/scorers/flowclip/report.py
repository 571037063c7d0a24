"""Flow-CLIP's section of the report (registered as ``flowclip``, after BindCLIP's).

Shown when one of ``global-m``, ``flowclip``, ``flowclip-cimr`` was scored: the ablation
ladder on the all-task and binding means, the frozen-CLIP errors each variant corrects and
the new ones it makes, the patch-sensitivity pictures, the spread over the training seeds,
and the issue's goals as measured (:mod:`.analysis`). The numbers of the tables also go to
``flowclip.json``. The prose is ``report.md`` beside this file; the cross-family table and
the image-replacement table are the generic sections ``head-to-head`` and
``image-replacement``.

The tables read the scored checkpoints (:func:`pipeline.scorers.checkpoints.scored_steps`). One whose dev
selection kept step 0 is the initialisation (M = I, W = 0), which scores exactly as
``clip``: the ladder and the corrections table say so for those variants, and a goal's
verdict says "untrained" when a variant it compares is one. The pictures need ICER's
weight W ≠ 0 (with W = 0 every patch's change is 0): they show the scored ``flowclip``
when its W is nonzero, else the first training seed that left step 0 with W ≠ 0, named
in the prose, and are left out, with the reason, when no checkpoint has W ≠ 0.
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
from pipeline.scorers.checkpoints import scored_steps
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
    at_init = _at_init(scored_steps(Path(ctx.score.checkpoints), variants))
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
        *ladder_part(steps, n, at_init),
        *corrections_part(fixes, variants, at_init),
        *sensitivity_part(ctx, selected.get(PICTURED, {})),
        *seeds_part(seeds, selected),
        *goals_part(checks, at_init),
    ]


def _at_init(scored: dict[str, dict[str, Any]]) -> dict[str, str]:
    """``{variant: seed}`` of the variants whose scored checkpoint kept step 0 (the
    initialisation, which scores exactly as ``clip``)."""
    return {v: r["seed"] for v, r in scored.items() if r["step"] == 0}


def _runs(at_init: dict[str, str], variants) -> str:
    """The ``variants`` in ``at_init``, in their order, each in backticks with its scored seed
    ("`flowclip` (seed 0)"), comma-separated."""
    return ", ".join(
        f"`{v}`" + (f" (seed {at_init[v]})" if at_init[v] else "") for v in variants if v in at_init
    )


def _step(c: dict | None, n_resamples: int) -> str:
    """A paired comparison (``compare_mean`` as a dict) in signed points with its bootstrap
    p (:func:`~pipeline.report.markdown.p_value`: ``p < 2/n_resamples`` when no resample
    crosses 0)."""
    if c is None:
        return "–"
    return f"{points_ci(c['diff'], c['lo'], c['hi'])}<br>p {p_value(c['p'], n_resamples)}"


def ladder_part(
    steps: dict[str, Any], n_resamples: int, at_init: dict[str, str] | None = None
) -> list[str]:
    """One table: per rung, each mean with its CI, the step from the rung before and the
    difference from frozen CLIP; before it, a sentence naming the rungs whose scored
    checkpoint kept step 0 (``at_init``, :func:`_at_init`), whose rows are ``clip``'s."""
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
    runs = _runs(at_init or {}, steps["rungs"])
    return [
        "### Ablation ladder",
        TEXT("ladder", tasks="; ".join(notes) + "."),
        *([TEXT("ladder-step-zero", runs=runs)] if runs else []),
        md_table(header, rows),
    ]


def corrections_part(
    rows: list[dict[str, Any]], variants: list[str], at_init: dict[str, str] | None = None
) -> list[str]:
    """Per slice: items, frozen CLIP's errors, and per variant corrected / new / net (p);
    a sentence names the variants whose scored checkpoint kept step 0 (``at_init``)."""
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
    runs = _runs(at_init or {}, variants)
    note = [TEXT("corrections-step-zero", runs=runs)] if runs else []
    return ["### Errors corrected and errors made", TEXT("corrections"), *note, md_table(header, table)]


def sensitivity_part(ctx: ReportContext, seed_steps: dict[str, int]) -> list[str]:
    """The patch-sensitivity pictures of ``flowclip`` (nothing unless it was scored on the
    suites drawn and they are in the store), of the checkpoint :func:`pictured` picks; a
    sentence instead when no checkpoint has ICER's W ≠ 0. ``seed_steps``: the step each
    training seed kept (:func:`.analysis.selected_steps`)."""
    items = sensitivity.sensitivity_items(ctx.results, PICTURED)
    if not [it for it in items if it[0] in ctx.store.suites()]:
        return []
    choice = pictured(ctx, seed_steps)
    if choice is None:
        steps = ", ".join(f"{k}: {s}" for k, s in seed_steps.items()) or "none listed"
        return ["### Patch sensitivity", TEXT("sensitivity-blank", variant=PICTURED, steps=steps)]
    scorer, name, note = choice
    rater = name if sensitivity.sensitivity_items(ctx.results, name) else PICTURED
    items = [it for it in sensitivity.sensitivity_items(ctx.results, rater) if it[0] in ctx.store.suites()]
    maps = sensitivity.patch_maps(scorer, ctx.store, ctx.results, items)
    fig = sensitivity_figure(maps, ctx.results, title=f"{name}: ∂m/∂g_p · (g_p − ḡ)")
    return [
        "### Patch sensitivity",
        *note,
        TEXT("sensitivity", variant=name, rater=rater),
        f"![patch sensitivity]({ctx.figure('flowclip-sensitivity.png', fig)})",
    ]


def pictured(ctx: ReportContext, seed_steps: dict[str, int]) -> tuple[Any, str, list[str]] | None:
    """The checkpoint whose patch sensitivity is drawn, its run name and the prose saying why:
    the scored ``flowclip`` when its ICER weight W is nonzero; else the first training seed
    (``seed<k>/`` beside it) whose dev selection left step 0 and whose W is nonzero; None when
    there is none (with W = 0 ICER is identically 0, so every patch's change would be 0)."""
    from pipeline.scorers import checkpoints

    scored = ctx.scorer(PICTURED)
    if not sensitivity.icer_is_zero(scored):
        return scored, PICTURED, []
    for seed, step in seed_steps.items():
        folder = checkpoints.checkpoint_dir(PICTURED, ctx.score.checkpoints) / f"seed{seed}"
        if step <= 0 or not (folder / "model.safetensors").is_file():
            continue
        options = ctx.score.options.get(PICTURED)
        scorer = checkpoints.load_scorer(PICTURED, ctx.store, ctx.score.checkpoints, folder, options)
        if not sensitivity.icer_is_zero(scorer):
            name = f"{PICTURED}@seed{seed}"
            why = TEXT("sensitivity-seed", variant=PICTURED, run=name, seed=seed, step=step, folder=folder)
            return scorer, name, [why]
    return None


def sensitivity_figure(maps: list[dict[str, Any]], results: dict[str, Any], title: str = ""):
    """One row per item: the image with its captions, and the per-patch change of the margin
    over it (red: the patch's centred feature raises gold − foil; blue: lowers it; a
    symmetric colour scale per item); ``title`` names the pictured checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, axes = plt.subplots(
        len(maps), 2, figsize=(5.6, 2.8 * len(maps)), squeeze=False, layout="constrained"
    )
    if title:
        fig.suptitle(title, fontsize=8)
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


def _verdict(check: dict[str, Any], at_init: dict[str, str]) -> str:
    """yes / **no** / – ; a measured goal on scores says when a variant it ``compares`` was
    scored at step 0 (``at_init``), i.e. is the initialisation: "trivially: untrained" (met)
    or "untrained" (missed) when every one is, naming them when some are. Speed goals
    compare no variant's scores (the time does not depend on the weights)."""
    verdict = {True: "yes", False: "**no**", None: "–"}[check["met"]]
    compared = check.get("compares", [])
    untrained = [v for v in compared if v in at_init]
    if check["met"] is None or not untrained:
        return verdict
    if len(untrained) == len(compared):
        return "yes (trivially: untrained)" if check["met"] else "**no** (untrained)"
    return f"{verdict} ({', '.join(f'`{v}`' for v in untrained)} untrained)"


def goals_part(checks: list[dict[str, Any]], at_init: dict[str, str]) -> list[str]:
    """The issue's goals: measured, met (:func:`_verdict`), shortfall; a sentence on what
    "untrained" means when a verdict says it."""
    rows = [[c["goal"], c["measured"], _verdict(c, at_init), c["shortfall"] or "–"] for c in checks]
    table = md_table(["goal", "measured", "met", "short of the goal by"], rows)
    measured = {v for c in checks if c["met"] is not None for v in c.get("compares", [])}
    runs = _runs(at_init, [v for v in analysis.VARIANTS if v in measured])
    note = [TEXT("goals-step-zero", runs=runs)] if runs else []
    return ["### The issue's goals, as measured", TEXT("goals"), *note, table]
