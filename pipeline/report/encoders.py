"""The encoder-comparison section (order 47): ``pipeline compare-encoders``' summary when
present (``report.encoders``): each compared variant's all-task and binding means on every
encoder, with CIs and the paired difference to ``clip`` on the same encoder and tasks, and
the trained variants each encoder scored at their initialisation (step 0), whose rows are
``clip``'s by construction. The prose is ``templates/encoders.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.report import ReportContext, section
from pipeline.report.inputs import read_summary
from pipeline.report.markdown import md_table, pct, pct_ci, points_ci
from pipeline.report.sections import BASELINE
from pipeline.report.templates import Templates

TEXT = Templates("pipeline.report", "templates/encoders.md")


def mean_cell(entry: dict | None, diff: bool = False, base: dict | None = None) -> str:
    """One mean of ``variant_means`` as "value [lo, hi]" (or its difference to the baseline).
    A difference taken over other tasks than the baseline's own mean (``base``) names the
    baseline's mean over the variant's tasks (value − diff), so it reads off the cells."""
    if not entry or (diff and "diff" not in entry):
        return "–"
    if diff:
        cell = points_ci(entry["diff"], entry["diff_lo"], entry["diff_hi"])
        tasks = entry.get("tasks")
        if base and tasks and tasks != base.get("tasks"):
            cell += f"<br>`{BASELINE}` {pct(entry['value'] - entry['diff'])} on these {len(tasks)} tasks"
        return cell
    return pct_ci(entry["value"], entry["lo"], entry["hi"])


def current_means(ctx: ReportContext, summary: dict[str, Any]) -> dict[str, dict]:
    """``variant_means`` of the comparison's variants on its suites, from the scores this
    report reads (the pipeline's own encoder, whose scores ``dvc repro`` may have redone since
    ``pipeline compare-encoders`` ran), with the comparison's bootstrap settings."""
    from pipeline.report.compare import variant_means

    config = summary.get("config", {})
    results = {s: e for s, e in ctx.results.items() if s in summary.get("suites", ctx.results)}
    return variant_means(
        results, summary.get("variants", []), n_resamples=int(config.get("bootstrap", ctx.cfg.bootstrap)),
        seed=int(config.get("seed", ctx.cfg.seed)),
    )  # fmt: skip


def stale_suites(ctx: ReportContext, summary: dict[str, Any]) -> str:
    """The compared suites whose manifest this report reads is not the one ``pipeline
    compare-encoders`` scored (its ``manifests``: suite -> sha256), comma-separated; every
    compared suite when the summary records no manifests. A comparison of another world's
    suites would otherwise stand beside this world's figures."""
    recorded = summary.get("manifests")
    if recorded is None:
        return ", ".join(summary.get("suites", [])) or "(no suites recorded)"
    results = getattr(ctx, "results", {})
    return ", ".join(s for s, sha in recorded.items() if s in results and results[s].get("manifest_sha256") != sha)


@section("encoder-comparison", order=47)
def encoder_comparison(ctx: ReportContext) -> list[str]:
    """``pipeline compare-encoders``' summary (``report.encoders``): each variant's all-task
    and binding means per encoder, with CIs and the paired difference to ``clip`` on the
    same encoder and tasks (naming ``clip``'s mean over them where they are fewer than its
    own, :func:`mean_cell`); a pointer to the command when it has not been run, or when it ran on other
    manifests than the report's (:func:`stale_suites`). A summary file that is there but not
    one is refused (:func:`pipeline.report.inputs.read_summary`), never shown as absent."""
    if not ctx.layout.toy_world:  # the comparison trains toy encoders on the shapes world
        return []
    path = Path(ctx.cfg.encoders)
    summary = read_summary(path)  # refuses a file that is there but not the summary
    if summary is None:
        return ["## Encoder comparison", TEXT("no-encoder-comparison", path=str(path))]
    encoders = summary["encoders"]
    stale = stale_suites(ctx, summary)
    if stale:
        return ["## Encoder comparison", TEXT("stale-encoder-comparison", path=str(path), suites=stale)]
    for enc, e in encoders.items():  # the pipeline's own scores: read now, never a stale copy
        if e.get("reused_pipeline_scores") and enc == ctx.extract.model:
            e["variants"] = current_means(ctx, summary)
    rows = []
    for variant in summary.get("variants", []):
        for name in ("all-task", "binding"):
            cells = []
            for enc in encoders.values():
                entry, base = (enc["variants"].get(v, {}).get("means", {}).get(name) for v in (variant, BASELINE))
                cells += [mean_cell(entry), mean_cell(entry, diff=True, base=base)]
            rows.append([f"`{variant}`", name, *cells])
    header = ["variant", "mean"]
    for enc, e in encoders.items():
        header += [f"{enc} ({e['open_clip_model']})", f"Δ vs `{BASELINE}`"]
    return [
        "## Encoder comparison",
        TEXT(
            "encoder-comparison", path=str(path), encoders=", ".join(f"`{e}`" for e in encoders),
            n_all=len(ctx.layout.means["all-task"]),
            resamples=f"{int(summary.get('config', {}).get('bootstrap', ctx.cfg.bootstrap)):,}",
        ),  # fmt: skip
        md_table(header, rows),
        *([TEXT("encoder-comparison-step-zero", runs=runs)] if (runs := step_zero_runs(ctx, summary)) else []),
    ]


def step_zero_runs(ctx: ReportContext, summary: dict[str, Any]) -> str:
    """The trained variants each encoder scored at step 0 ("`global-m`, `flowclip` on `toy`;
    ..."): the pipeline's own encoder from the checkpoints this report reads (as its means
    are), every other from the summary's ``selected_steps``; "" when there is none, or the
    summary predates that record."""
    from pipeline.scorers.checkpoints import scored_steps

    parts = []
    for enc, e in summary["encoders"].items():
        if e.get("reused_pipeline_scores") and enc == ctx.extract.model:
            steps = {v: s["step"] for v, s in scored_steps(ctx.score.checkpoints, summary.get("variants", [])).items()}
        else:
            steps = e.get("selected_steps", {})
        zero = [f"`{v}`" for v, step in steps.items() if step == 0]
        if zero:
            parts.append(f"{', '.join(zero)} on `{enc}`")
    return "; ".join(parts)
