"""The steering parts of the geometry-aware retrieval section
(:mod:`pipeline.scorers.geometry.report`): where steering helps and hurts by slice of the
queries, and by strength — ``steer`` and ``steer-multi`` re-scored from the store at several
β, for each contrast of c- prompts the suite has, with the pipeline's shortlist and over the
whole gallery, each against the baseline and the sum against one direction, where the seed's
interference would show. The prose is ``report.md`` beside this file.
"""

from __future__ import annotations

from typing import Any

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.retrieval import STEERING_NEGATIVES
from pipeline.report import ReportContext
from pipeline.report.markdown import md_table, metric_diff, metric_value
from pipeline.report.templates import Templates
from pipeline.scorers.geometry.diagnostics import (
    BASELINE,
    EQUAL_LENGTH,
    EQUAL_VS_ONE,
    SLICE_METRICS,
    STEERING,
    STRENGTHS,
    SUM_VS_ONE,
    steering_strength,
)
from pipeline.scorers.geometry.steering import WHOLE_GALLERY

TEXT = Templates("pipeline.scorers.geometry", "report.md")


def steering_part(by_suite: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The steering-by-slice table and a sentence on where each steering variant helps
    (the slice's 95% CI above 0) and where it hurts (below 0)."""
    columns = [f"{v} {m}" for v in STEERING for m in SLICE_METRICS]
    rows, helps, hurts = [], {v: [] for v in STEERING}, {v: [] for v in STEERING}
    for suite, slices in by_suite.items():
        for row in slices:
            cells = []
            for c in columns:
                variant, metric = c.split()
                d = row.get(c)
                cells.append(metric_diff(metric, d["diff"], d["lo"], d["hi"]) if d else "–")
                where = f"{suite}, {row['slice']}: {metric} {100 * d['diff']:+.1f}" if d else ""
                if d and d["lo"] > 0:
                    helps[variant].append(where)
                elif d and d["hi"] < 0:
                    hurts[variant].append(where)
            rows.append([suite, row["slice"], str(row["queries"]), *cells])
    if not rows:
        return []

    def listed(found: list[str]) -> str:
        return "; ".join(found) if found else "no slice"

    fields = {
        f"{kind}_{v.replace('-', '_')}": listed(found[v])
        for kind, found in (("helps", helps), ("hurts", hurts))
        for v in STEERING
    }
    verdict = TEXT("steering-verdict", **fields)
    header = ["suite", "slice", "queries", *[f"Δ `{c.split()[0]}` {c.split()[1]}" for c in columns]]
    return [TEXT("steering-slices"), md_table(header, rows), verdict]


def strength_rows(ctx: ReportContext, suite: str) -> list[dict[str, Any]] | None:
    """``suite``'s steering-strength rows (:func:`~pipeline.scorers.geometry.diagnostics.steering_strength`),
    one set per steering contrast the suite has prompts for (each row's ``contrast``):
    ``steer`` and ``steer-multi`` re-scored from the store at each of :data:`STRENGTHS`, with
    the pipeline's shortlist (``score.options``) and over the whole gallery, against
    :data:`BASELINE` scored alike, on the items the score stage scores (those with their images);
    None where the store lacks the suite or the suite has no steering prompts."""
    from pipeline.manifests import resolve_source
    from pipeline.scorers.checkpoints import build_scorer
    from pipeline.scoring import drop_missing, score_retrieval, suite_inputs

    if suite not in ctx.store.suites():
        return None
    source = resolve_source(suite, ctx.extract.world, ctx.extract.manifests, ctx.extract.image_roots)
    manifest, index = suite_inputs(ctx.store, suite, source.manifest)
    manifest, index, _ = drop_missing(manifest, index)
    contrasts = [c for c, column in STEERING_NEGATIVES.items() if column in manifest and column in index]
    if "steer_pos" not in manifest or manifest.empty or not contrasts:
        return None
    options = dict(ctx.score.options.get("steer-multi") or ctx.score.options.get("steer") or {})
    shortlists = ctx.scorer(build_scorer("steer", ctx.store, options).base)

    def units(scorer) -> dict[str, Any]:
        scores = score_retrieval(scorer, ctx.store, manifest, index, ctx.score.batch_size, base=shortlists, suite=suite)
        return SUITES.get(suite).units(manifest, scores)

    k = int(options.get("k", WHOLE_GALLERY))
    scopes = ({f"local (K = {k})": k} if k < WHOLE_GALLERY else {}) | {"whole gallery": WHOLE_GALLERY}
    reference = units(ctx.scorer(BASELINE))
    rows = []
    for contrast in contrasts:

        def rescore(beta: float, variant: str, k: int, contrast: str = contrast) -> dict[str, Any]:
            name, length = ("steer-multi", "one") if variant == EQUAL_LENGTH else (variant, "sum")
            setting = {**options, "beta": beta, "k": k, "contrast": contrast, "length": length}
            return units(build_scorer(name, ctx.store, setting))

        table = steering_strength(rescore, reference, scopes, STRENGTHS, ctx.cfg.bootstrap, ctx.cfg.seed)
        rows += [{"contrast": contrast, **r} for r in table]
    return rows


def strength_metric(suite: str) -> str:
    """The metric the strength table and figure show for ``suite``: its headline where the
    rows hold it (R@1 on shapes-retrieval, R@10 on shapes-multi), else R@10."""
    headline = SUITES.get(suite).headline
    return headline if headline in SLICE_METRICS else SLICE_METRICS[-1]


def strength_part(ctx: ReportContext, by_suite: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The steering-strength table (each suite's headline metric), its figure and a sentence
    on where single-concept steering helps, where each variant falls below :data:`BASELINE`,
    where the sum falls below one direction (the seed's interference) and where it still does
    at one direction's length, each where the 95% CI excludes 0."""
    if not by_suite:
        return []
    keys = ("helps", "below_one", "below_sum", "interferes", "sum_better", "equal_interferes", "equal_better")
    rows, found = [], {key: {} for key in keys}
    for suite, table in by_suite.items():
        m = strength_metric(suite)
        for r in table:
            one, multi, both, equal = (r[f"{v} {m}"] for v in ("steer", "steer-multi", SUM_VS_ONE, EQUAL_VS_ONE))
            rows.append([
                suite, r["contrast"], r["scope"], f"{r['beta']:g}", m, metric_value(m, r[f"{BASELINE} {m}"]),
                *(metric_diff(m, d["diff"], d["lo"], d["hi"]) for d in (one, multi, both, equal)),
            ])  # fmt: skip
            where = f"{suite}, {r['contrast']} contrast, {r['scope']}"
            for key, hit in (("helps", one["lo"] > 0), ("below_one", one["hi"] < 0), ("below_sum", multi["hi"] < 0),
                             ("interferes", both["hi"] < 0), ("sum_better", both["lo"] > 0),
                             ("equal_interferes", equal["hi"] < 0), ("equal_better", equal["lo"] > 0)):  # fmt: skip
                if hit:
                    found[key].setdefault(where, []).append(f"{r['beta']:g}")

    def listed(at: dict[str, list[str]]) -> str:
        return "; ".join(f"{where} at β {', '.join(betas)}" for where, betas in at.items()) if at else "no setting"

    header = ["suite", "contrast", "scope", "β", "metric", f"`{BASELINE}`"]
    header += ["Δ `steer`", "Δ `steer-multi`", "Δ sum − one", "Δ sum − one, equal length"]
    fig = strength_figure(by_suite)
    return [
        "### Steering strength",
        TEXT("steering-strength", betas=", ".join(f"{b:g}" for b in STRENGTHS)),
        md_table(header, rows),
        TEXT("steering-strength-verdict", **{k: listed(v) for k, v in found.items()}),
        f"![steering strength]({ctx.figure('steering-strength.png', fig)})",
    ]


def strength_figure(by_suite: dict[str, list[dict[str, Any]]]):
    """One panel per suite and contrast: its headline metric against β for each steering
    variant and scope, :data:`BASELINE`'s as a horizontal line."""
    import matplotlib.pyplot as plt

    panels = [(suite, c, [r for r in table if r["contrast"] == c]) for suite, table in by_suite.items()
              for c in dict.fromkeys(r["contrast"] for r in table)]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (suite, contrast, table) in zip(axes[0], panels, strict=True):
        m = strength_metric(suite)
        for scope in dict.fromkeys(r["scope"] for r in table):
            part = [r for r in table if r["scope"] == scope]
            style = "-" if scope.startswith("local") else "--"
            for v, colour, marker in (("steer", "C0", "o"), ("steer-multi", "C3", "s"), (EQUAL_LENGTH, "C2", "^")):
                y = [100 * r[f"{v} {m}"]["value"] for r in part]
                ax.plot([r["beta"] for r in part], y, style, color=colour, marker=marker, label=f"{v}, {scope}")
        ax.axhline(100 * table[0][f"{BASELINE} {m}"], color="grey", lw=1, label=BASELINE)
        ax.set_xscale("log", base=2)
        ax.set_xticks(STRENGTHS, [f"{b:g}" for b in STRENGTHS])
        ax.set_xlabel("β")
        ax.set_ylabel(f"{m} (%)")
        ax.set_title(f"{suite}, {contrast} contrast", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # the legend's row below the panels, never over a line
    return fig
