"""BindCLIP's section of the report (registered as ``bindclip``, after the suite tables).

Shown when ``bindclip`` was scored: the seed's Table-1 layout against frozen CLIP, the
lesion and consensus ablation by family and by edit kind, the local and additive
baselines, the training seeds, the coupling pictures and the score taken apart
(:mod:`.diagnostics`, run on the cached features with the trained checkpoint; its numbers
also go to ``diagnostics.json``), the parameter count against the paper's, and the
issue's goals as measured (:mod:`.analysis`). The prose is ``report.md`` beside this file.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.report import ReportContext, section
from pipeline.report.compare import family_table, whatsup_mcnemar
from pipeline.report.inputs import read_bench
from pipeline.report.markdown import df_markdown, md_table, p_value, pct, points_ci
from pipeline.report.tasks import DEV_SUITE
from pipeline.report.templates import Templates
from pipeline.scorers.bindclip import ENERGIES, analysis
from pipeline.training.resume import read_finished

TEXT = Templates("pipeline.scorers.bindclip", "report.md")
VARIANT = "bindclip"  # the scored checkpoint; its ablations are the other variants below
ABLATIONS = ("clip", "bindclip", "bindclip-lesion", "bindclip-noconsensus")
LOCAL_BASELINES = ("clip", "local-max", "local-softmax", "additive", "bindclip")
SEED_ROWS = analysis.HEADLINE_ROWS + (
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-whatsup", "individual"),
)
DIAGNOSED_SUITES = ("shapes-sugarcrepe", "shapes-aro", "shapes-whatsup")
# categories also shown by relation (None = all)
RELATION_SUITES = {
    "shapes-sugarcrepe": ("swap-att",),
    "shapes-aro": ("relation",),
    "shapes-whatsup": None,
}
COUPLING_CATEGORIES = ("swap-att", "swap-att", "swap-obj", "replace-rel")  # one picture row each
CATEGORY_MEAN = "category-mean"  # the SugarCrepe mean over categories; equal to `total` on equal-sized ones


@section("bindclip", order=50)
def bindclip_section(ctx: ReportContext) -> list[str]:
    """Every BindCLIP analysis for whichever of its variants were scored ([] without it)."""
    if VARIANT not in ctx.scored:
        return []
    return [
        *table_one(ctx),
        *ablation(ctx),
        *local_baselines(ctx),
        *training_seeds(ctx),
        *coupling(ctx),
        *diagnostics(ctx),
        *parameters(ctx.out / "bench" / "scoring.json"),
        *setting(Path(ctx.score.checkpoints) / VARIANT),
        *goals(ctx),
    ]


# ---------------------------------------------------------------- tables on cached scores


def same_as_total(ctx: ReportContext) -> str | None:
    """The scored SugarCrepe(-style) suite when its categories have equal numbers of items,
    where ``category-mean`` is ``total`` by construction (and this section leaves it out);
    else None."""
    name = ctx.layout.suite("shapes-sugarcrepe")
    entry = ctx.results.get(name) if name else None
    if not entry or "category" not in entry["manifest"]:
        return None
    return name if entry["manifest"]["category"].value_counts().nunique() == 1 else None


def table_one(ctx: ReportContext) -> list[str]:
    """The seed's Table-1 layout against frozen CLIP, and What'sUp's pair criterion."""
    n = ctx.cfg.bootstrap
    rows = analysis.binding_table(ctx.results, VARIANT, n, ctx.cfg.seed)
    equal = same_as_total(ctx)
    rows = [c for c in rows if not (equal and (c.suite, c.metric) == (equal, CATEGORY_MEAN))]
    cells = [
        [c.suite, c.metric, pct(c.base), pct(c.value), points_ci(c.diff, c.lo, c.hi), p_value(c.p, n)]
        for c in rows
    ]
    header = ["suite", "metric", "frozen CLIP", "BindCLIP", "Δ [95% CI]", "p"]
    note = " " + TEXT("same-as-total", suite=equal) if equal else ""
    parts = ["## BindCLIP (seed Table-1 layout)", TEXT("table-1") + note, md_table(header, cells)]
    if rows:
        parts.append(TEXT("robust", **robustness(rows)))
    mc = whatsup_mcnemar(ctx.results, VARIANT)
    if mc:
        parts.append(TEXT("mcnemar", **mc))
    return parts


def robustness(rows) -> dict[str, str]:
    """The Table-1 slices split by their paired CI: gains (CI above 0), losses (below 0), ties."""

    def names(keep) -> str:
        picked = [f"{c.metric} ({points_ci(c.diff, c.lo, c.hi)})" for c in rows if keep(c)]
        return ", ".join(picked) or "none"

    return {
        "gains": names(lambda c: c.lo > 0),
        "losses": names(lambda c: c.hi < 0),
        "ties": names(lambda c: c.lo <= 0 <= c.hi),
    }


def ablation(ctx: ReportContext) -> list[str]:
    """Lesion and consensus ablation by family; what the plan carries by family and kind."""
    parts = []
    dev = ctx.layout.suite(DEV_SUITE)
    fam = family_table(ctx.results, [v for v in ABLATIONS if v in ctx.scored])
    if not fam.empty:
        heading = f"### Lesion and consensus ablation by family ({dev})"
        parts += [heading, TEXT("lesion"), df_markdown(fam.map(pct))]
    n, seed = ctx.cfg.bootstrap, ctx.cfg.seed
    cost = analysis.lesion_costs(ctx.results, n_resamples=n, seed=seed)
    if not cost.empty:
        pairs = len(ctx.results[dev]["manifest"])
        families = len(cost.index.drop("mean", errors="ignore"))
        parts += [TEXT("lesion-costs", pairs=pairs, families=families), lesion_cost_markdown(cost, n)]
    by_kind = analysis.lesion_costs_by_kind(ctx.results, n_resamples=n, seed=seed)
    if not by_kind.empty:
        parts += [TEXT("lesion-kinds"), lesion_cost_markdown(by_kind, n)]
    return parts


def local_baselines(ctx: ReportContext) -> list[str]:
    """Local pooling and global + w·local on the SugarCrepe(-style) suite."""
    grid = analysis.additive_grid(ctx.results)
    if grid.empty:
        return []
    name = ctx.layout.suite("shapes-sugarcrepe")
    table = family_table(ctx.results, [v for v in LOCAL_BASELINES if v in ctx.scored], name)
    if same_as_total(ctx):
        table = table.drop(index=CATEGORY_MEAN, errors="ignore")
        grid = grid.drop(columns=CATEGORY_MEAN, errors="ignore")
    sc = ctx.results[name]["manifest"]
    adds = {c: sc["category"] == c for c in ("add-obj", "add-att")}
    matched = ", ".join(f"{int((m & sc['length_matched']).sum())} of {int(m.sum())} {c}" for c, m in adds.items())
    rates = {c: grid[c].map(pct) for c in grid.columns if c not in ("pooling", "w")}
    best_rows = grid.loc[grid.groupby("pooling", sort=False)["total"].idxmax()]  # the first w of equals
    best = "; ".join(f"{r.pooling} w = {r.w:g} (total {pct(r.total)})" for r in best_rows.itertuples())
    text = TEXT("local", length_matched=matched, best=best)
    if "additive" in ctx.scored:
        text += " " + TEXT("additive", **additive_options(ctx.score.options.get("additive", {})))
    tables = [df_markdown(table.map(pct)), df_markdown(grid.assign(**rates))]
    return [f"### Local and additive baselines ({name})", text, *tables]


def additive_options(options: dict[str, Any]) -> dict[str, Any]:
    """The pooling and w the ``additive`` variant scores with: ``score.options.additive`` over
    its factory's defaults (the tables show that w, the grid every w)."""
    from pipeline.scorers import SCORERS

    params = inspect.signature(SCORERS.get("additive")).parameters
    chosen = {k: options.get(k, params[k].default) for k in ("pooling", "w")}
    return {"pooling": f"local-{chosen['pooling']}", "w": str(float(chosen["w"]))}  # as the grid prints w


def training_seeds(ctx: ReportContext) -> list[str]:
    """The headline rows per training seed (``bindclip@seed<k>``; not the image-replacement
    runs) and their spread. Each value sits under its own seed; a seed not scored on a suite
    prints "–" and stays out of the spread."""
    seeds = sorted(v for v in ctx.scored if v.startswith(f"{VARIANT}@seed"))
    if not seeds:
        return []
    rows, left_out = {}, (same_as_total(ctx), CATEGORY_MEAN)
    for suite, metric in ctx.layout.tasks(SEED_ROWS):
        entry = ctx.results.get(suite)
        if not entry or (suite, metric) == left_out:
            continue
        s = SUITES.get(suite)
        vals = {
            v: s.metrics(entry["manifest"], entry["scores"][v]).get(metric)
            for v in seeds
            if v in entry["scores"]
        }
        present = [x for x in vals.values() if x is not None]
        spread = pct(max(present) - min(present)) if present else "–"
        rows[f"{suite} {metric}"] = {
            **{v: pct(vals.get(v)) for v in seeds},
            "spread (max−min)": spread,
        }
    if not rows:
        return []
    return ["### Training seeds", df_markdown(pd.DataFrame(rows).T)]


def lesion_cost_markdown(cost: pd.DataFrame, n_resamples: int) -> str:
    """A lesion-cost table (``analysis.lesion_costs`` or ``lesion_costs_by_kind``) in points:
    item counts when given, the scored checkpoint's difference with its CI and bootstrap p
    (over ``n_resamples`` resamples), then the per-seed columns."""
    seeds = [c for c in cost.columns if c.startswith("seed")]
    columns = {"items": [int(n) for n in cost["n"]]} if "n" in cost else {}
    columns["BindCLIP − lesion [95% CI]"] = [
        points_ci(d, lo, hi) for d, lo, hi in zip(cost["diff"], cost["lo"], cost["hi"], strict=True)
    ]
    columns["p"] = [p_value(p, n_resamples) for p in cost["p"]]
    columns |= {c: [f"{100 * x:+.1f}" for x in cost[c]] for c in seeds}
    return df_markdown(pd.DataFrame(columns, index=cost.index))


# ---------------------------------------------------------------- the trained scorer on the cache


def coupling(ctx: ReportContext) -> list[str]:
    """The coupling pictures of a few shapes-sugarcrepe items."""
    fig = coupling_figure(ctx.results, ctx.store, ctx.scorer(VARIANT))
    if fig is None:
        return []
    return [
        "### Coupling pictures",
        TEXT("coupling"),
        f"![coupling]({ctx.figure('coupling.png', fig)})",
    ]


def coupling_figure(results: dict[str, Any], store, scorer):
    """Each edited word's plan mass drawn over the image, for both captions of a few items.

    One row per item (the first items of :data:`COUPLING_CATEGORIES` on shapes-sugarcrepe):
    the true caption's edited words, then the negative's (at most two each, shape words
    first), each word's plan row over the patch grid (depths summed, normalised) with the
    box of the object the word alone names drawn in green
    (:func:`pipeline.scorers.bindclip.coupling.coupling_maps`). None without the suite.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from PIL import Image

    from pipeline.scorers.bindclip.coupling import coupling_maps
    from pipeline.scorers.bindclip.diagnostics import word_kind

    entry = results.get("shapes-sugarcrepe")
    if not entry:
        return None
    manifest = entry["manifest"]
    category = manifest["category"].to_numpy()
    picks: list[int] = []
    for cat in COUPLING_CATEGORIES:
        left = [int(i) for i in np.flatnonzero(category == cat) if int(i) not in picks]
        picks += left[:1]
    if not picks:
        return None
    maps = coupling_maps(scorer, store, manifest, store.suite_index("shapes-sugarcrepe"), picks)
    per_caption = 2
    fig = plt.figure(figsize=(2.3 * 2 * per_caption, 2.9 * len(maps)), layout="constrained")
    for item, sub in zip(maps, np.atleast_1d(fig.subfigures(len(maps), 1)), strict=True):
        img = np.asarray(Image.open(Path(entry["image_root"]) / item["image"]).convert("RGB"))
        h, w = img.shape[:2]
        true, negative = (c["text"] for c in item["captions"])
        title = f"{item['category']}:  ✓ {true}   ✗ {negative}   s = {item['score']:+.2f}"
        sub.suptitle(title, fontsize=7.5)
        axes = sub.subplots(1, 2 * per_caption)
        for x, cap in enumerate(item["captions"]):
            nouns_first = sorted(cap["words"], key=lambda m: word_kind(m["word"]) != "shape")
            shown = nouns_first[:per_caption]
            for k in range(per_caption):
                ax = axes[x * per_caption + k]
                ax.set_xticks([])
                ax.set_yticks([])
                if k >= len(shown):
                    ax.axis("off")
                    continue
                word = shown[k]
                ax.imshow(img)
                ax.imshow(
                    word["rho"],
                    cmap="magma",
                    alpha=0.6,
                    extent=(0, w, h, 0),
                    interpolation="nearest",
                )
                if word["box"] is not None:
                    x0, y0, x1, y1 = word["box"]
                    box = Rectangle(
                        (x0 * w, y0 * h),
                        (x1 - x0) * w,
                        (y1 - y0) * h,
                        fill=False,
                        ec="lime",
                        lw=1.2,
                    )
                    ax.add_patch(box)
                mark = "✓" if x == 0 else "✗"
                ax.set_title(
                    f"{mark} '{word['word']}' (grounded {word['grounded']:.2f})", fontsize=7
                )
    return fig


def diagnostics_tables(store, scorer) -> dict[str, Any]:
    """BindCLIP's score taken apart per slice (:mod:`.diagnostics`) on the diagnosed suites,
    by edit kind on the training and dev pairs, and its grounding precision on shapes-dev
    (a DataFrame; every other entry is JSON-ready)."""
    from pipeline.scorers.bindclip.diagnostics import (
        argument_swaps,
        attribute_binding,
        energy_breakdowns,
        grounding_precision,
    )
    from pipeline.scorers.bindclip.training import load_grounded
    from pipeline.scoring import suite_inputs
    from pipeline.world.families import edit_kind_order

    rows, by_relation = [], []
    binding: dict[str, Any] = {}
    swaps: list[dict[str, Any]] = []
    for suite in DIAGNOSED_SUITES:
        if suite not in store.suites():
            continue
        manifest, index = suite_inputs(store, suite)  # each suite read once for every diagnostic
        if suite == "shapes-sugarcrepe":
            binding = attribute_binding(scorer, store, manifest, index)
        if suite == "shapes-aro":
            swaps = argument_swaps(scorer, store, manifest, index)
        keys = ("category", "relation") if suite in RELATION_SUITES else ("category",)
        groups = energy_breakdowns(scorer, store, manifest, index, suite, keys)
        rows += groups["category"]
        allowed = RELATION_SUITES.get(suite)  # categories shown by relation (None = all)
        by_relation += [
            r
            for r in groups.get("relation", [])
            if allowed is None or r["category"].split(":")[0] in allowed
        ]
    by_kind = []  # the training pairs (what the scorer fits) next to the dev pairs (held out)
    for suite in ("shapes-train", "shapes-dev"):
        if suite in store.suites():
            manifest, index = suite_inputs(store, suite)
            if {"scene", "cf_scene"} <= set(manifest.columns):  # the shapes world's pairs
                kinds = energy_breakdowns(scorer, store, manifest, index, suite, ("edit_kind",))
                by_kind += kinds["edit_kind"]
    by_kind.sort(key=lambda r: (edit_kind_order(r["category"]), r["suite"] != "shapes-train"))
    if "shapes-dev" in store.suites():
        ground = grounding_precision(scorer, load_grounded(store, "shapes-dev"))
    else:
        ground = pd.DataFrame()
    return {
        "energy_breakdown": rows,
        "by_relation": by_relation,
        "by_edit_kind": by_kind,
        "grounding": ground,
        "attribute_binding": binding,
        "argument_swaps": swaps,
    }


def diagnostics(ctx: ReportContext) -> list[str]:
    """The diagnostics' tables; their numbers also go to ``diagnostics.json``."""
    d = diagnostics_tables(ctx.store, ctx.scorer(VARIANT))
    ground = d["grounding"]
    payload = ctx.json_files.setdefault("diagnostics.json", {})  # the shortcuts section's rows too
    payload.update({**d, "grounding": ground.reset_index().to_dict("records")})
    if not d["energy_breakdown"]:
        return []
    parts = [
        "### Why: the score taken apart (seed 0)",
        TEXT("why"),
        breakdown_table(d["energy_breakdown"], "category (true)"),
    ]
    if d["by_relation"]:
        parts += [TEXT("by-relation"), breakdown_table(d["by_relation"], "relation")]
    if d["by_edit_kind"]:
        parts += [TEXT("by-kind"), breakdown_table(d["by_edit_kind"], "edit kind")]
    if not ground.empty:
        parts += [TEXT("grounding"), df_markdown(ground.map(lambda x: pct(x) if isinstance(x, float) else x))]
    binding = d["attribute_binding"]
    if binding:
        shown = {k: v for k, v in binding.items() if k not in ("category", "items")}
        row = [share_or_weight(v, k.startswith("bc ")) for k, v in shown.items()]  # bc: an overlap
        parts += [
            TEXT("binding", category=binding["category"], items=binding["items"]),
            md_table(list(shown), [row]),
        ]
    if d["argument_swaps"]:
        swaps = pd.DataFrame(d["argument_swaps"]).set_index("relation")
        cells = {c: [share_or_weight(x, c.startswith("gate ")) for x in swaps[c]] for c in swaps}  # gates: weights
        parts += [TEXT("swaps"), df_markdown(pd.DataFrame(cells, index=swaps.index))]
    return parts


def share_or_weight(x: Any, weight: bool) -> str:
    """A diagnostics cell: a share or rate in % like every table of the report; a weight or
    coefficient from 0 to 1 (``weight``) with three decimals; a count as it is; "–" for none."""
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "–"
    if not isinstance(x, float):
        return str(x)
    return f"{x:.3f}" if weight else pct(x)


def breakdown_table(rows: list[dict], group: str) -> str:
    """Energy-breakdown rows: pairs, accuracies of s, g and s − g, and per energy its share
    pointing to the true caption / mean absolute size / accuracy of s without it."""
    header = ["suite", group, "pairs", "s", "g alone", "s − g", "mean abs g", *ENERGIES]
    cells = []
    for r in rows:
        energies = [
            f"{100 * r[f'{e}_share_true']:.0f}% / {r[f'{e}_mean_abs']:.3f} / {pct(r[f'{e}_acc_without'])}"
            for e in ENERGIES
        ]
        scores = [pct(r["acc_s"]), pct(r["acc_margin"]), pct(r["acc_learned"])]
        cells.append(
            [
                r["suite"],
                r["category"],
                str(r["pairs"]),
                *scores,
                f"{r['mean_abs_margin']:.3f}",
                *energies,
            ]
        )
    return md_table(header, cells)


# ---------------------------------------------------------------- measurements and goals


def parameters(bench: Path) -> list[str]:
    """The scorer's parameters per component at ViT-L-14-336 dimensions, from ``pipeline
    bench scoring``, against the paper's total (nothing when the bench has not run)."""
    vit = read_bench(bench).get("ViT-L-14-336", {})
    breakdown = vit.get("variants", {}).get(VARIANT, {}).get("parameter_breakdown")
    if breakdown is None:
        return []
    pc = analysis.parameter_comparison(breakdown)
    rows = [[k, f"{v:,}"] for k, v in pc["components"].items()]
    rows.append(["**total**", f"**{pc['total']:,}**"])
    ours = [k for k in ("span_gate",) if k in pc["components"]]
    text = TEXT(
        "parameters",
        total=pc["total"],
        share=100 * pc["share"],
        paper=pc["paper"],
        gap=pc["gap"],
        ours=f" or an option marked ours ({', '.join(ours)}). " if ours else ". ",
        larger_or_smaller="larger" if pc["gap"] > pc["text_projection"] else "smaller",
        text_projection=pc["text_projection"],
    )
    heading = "### Parameters at ViT-L-14-336 dimensions (h = 192)"
    return [heading, md_table(["component", "parameters"], rows), text]


def setting(checkpoint: Path) -> list[str]:
    """The scored checkpoint's setting against the values methods.md §1 states, and the
    options §1 does not describe (nothing without a finished checkpoint)."""
    record, _ = read_finished(checkpoint)
    if record is None:
        return []
    rows, extra = analysis.spec_setting(record)
    table = md_table(["setting", "methods.md §1", "scored checkpoint", ""], rows)
    text = TEXT("setting", checkpoint=checkpoint.as_posix(), extra="; ".join(extra) or "none")
    return ["### The trained setting against methods.md §1", table, text]


def goals(ctx: ReportContext) -> list[str]:
    """The issue's goals with measured values and verdicts (the solver-speed goal from
    ``pipeline bench sinkhorn``'s measurement, when it ran)."""
    checks = analysis.goal_checks(ctx.results, n_resamples=ctx.cfg.bootstrap, seed=ctx.cfg.seed)
    sinkhorn = ctx.out / "bench" / "sinkhorn.json"
    if sinkhorn.exists():
        try:
            checks.append(analysis.sinkhorn_goal(read_bench(sinkhorn)))
        except (KeyError, TypeError) as e:  # a measurement, but not this bench's
            raise ValueError(
                f"{sinkhorn} lacks the Sinkhorn bench's {e}; rerun `{ctx.bench_command('sinkhorn')}` to rewrite it"
            ) from None
    if not checks:
        return []
    rows = []
    for c in checks:
        frozen = (
            f" (frozen {pct(c['frozen'])} → {pct(c['value'])})" if c["frozen"] is not None else ""
        )
        rows.append(
            [
                c["goal"],
                c["measured"] + frozen,
                "yes" if c["met"] else "**no**",
                c["shortfall"] or "–",
            ]
        )
    table = md_table(["goal", "measured", "met", "short of the goal by"], rows)
    return ["### The issue's goals, as measured", table]
