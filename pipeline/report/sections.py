"""The generic report sections: every scored variant, whatever its family.

* ``overview`` (order 0): the title, the encoder, the variants and how to read a cell.
* ``failure-profile`` (10): frozen CLIP on the shapes suites next to real ViT-L/14's
  published numbers.
* ``suites`` (20): per suite, each variant's metrics with 95% bootstrap CIs and, for the
  others, Δ against ``clip`` with a paired-bootstrap CI; chance levels; example images.
  The same numbers, one row per (suite, variant, metric), go to ``plots/metrics.csv``.
* ``performance`` (90): the measurements that ``pipeline bench ...`` and ``pipeline
  probes`` left in the report folder.

Family sections (e.g. BindCLIP's, order 50) sit between the suites and the performance.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.config import ReportConfig
from pipeline.report import ReportContext, section
from pipeline.report.figures import examples_figure
from pipeline.report.markdown import md_table, pct
from pipeline.report.templates import Templates
from pipeline.stats import bootstrap_ci, units_bootstrap

TEXT = Templates("pipeline.report", "templates/sections.md")
BASELINE = "clip"  # every other variant's Δ is taken against frozen global CLIP

# Published frozen-CLIP ViT-L/14 (OpenAI) numbers the toy CLIP's profile is compared with
# (SugarCrepe paper table; What'sUp/ARO via vl_compo; see shared/design/benchmarks.md §5).
REAL_CLIP_PROFILE = {
    ("shapes-sugarcrepe", "replace-obj"): 0.9407,
    ("shapes-sugarcrepe", "replace-att"): 0.7919,
    ("shapes-sugarcrepe", "replace-rel"): 0.6515,
    ("shapes-sugarcrepe", "swap-obj"): 0.6016,
    ("shapes-sugarcrepe", "swap-att"): 0.6231,
    ("shapes-sugarcrepe", "add-obj"): 0.7832,
    ("shapes-sugarcrepe", "add-att"): 0.7153,
    ("shapes-aro", "relation"): 0.6152,
    ("shapes-aro", "attribution"): 0.6186,
    ("shapes-aro", "order"): 0.4658,
    ("shapes-whatsup", "individual"): (0.2646 + 0.2525) / 2,
}
CHANCE = {"shapes-whatsup": {"individual": 0.25, "pair": 1 / 16, "set": 1 / 256}}
# What the measuring commands write under the report folder ({"command", "results"} JSON),
# shown in the performance section by file name.
MEASUREMENTS = ("bench/*.json", "probes.json")


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
            ci = bootstrap_ci(u.values, u.groups, n_resamples=cfg.bootstrap, seed=cfg.seed)
            cell = f"{pct(ci.estimate)} [{pct(ci.lo)}, {pct(ci.hi)}]"
            if variant != baseline and baseline in units_by_variant:
                base = units_by_variant[baseline][name]
                d = units_bootstrap(u, base, n_resamples=cfg.bootstrap, seed=cfg.seed)
                cell += f"<br>Δ {100 * d.diff:+.1f} [{100 * d.lo:+.1f}, {100 * d.hi:+.1f}]"
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


def profile_table(results: dict[str, Any]) -> str:
    """The toy CLIP's failure profile next to real ViT-L/14's published one."""
    rows = []
    for (suite_name, metric), real in REAL_CLIP_PROFILE.items():
        entry = results.get(suite_name)
        if not entry or BASELINE not in entry["scores"]:
            continue
        suite = SUITES.get(suite_name)
        value = suite.metrics(entry["manifest"], entry["scores"][BASELINE]).get(metric)
        rows.append([suite_name, metric, pct(value), pct(real)])
    header = ["suite", "metric", "toy CLIP (frozen, `clip`)", "real CLIP ViT-L/14 (published)"]
    return md_table(header, rows)


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
    return ["# Compositionality report (shapes world)", intro]


@section("failure-profile", order=10)
def failure_profile(ctx: ReportContext) -> list[str]:
    return ["## The toy CLIP's failure profile", TEXT("profile"), profile_table(ctx.results)]


@section("suites", order=20)
def suites(ctx: ReportContext) -> list[str]:
    parts: list[str] = []
    long_rows: list[dict] = []
    for suite_name, entry in ctx.results.items():
        if not entry["scores"]:
            continue
        table, rows = suite_table(suite_name, entry, ctx.cfg)
        long_rows += rows
        description = SUITES.get(suite_name).description
        parts += [f"## {suite_name}", f"{len(entry['manifest'])} items. {description}", table]
        chance = CHANCE.get(suite_name)
        if chance:
            parts.append("Chance: " + ", ".join(f"{k} {pct(v)}" for k, v in chance.items()) + ".")
        fig = examples_figure(entry, ctx.cfg.examples)
        if fig is not None:
            path = ctx.figure(f"examples-{suite_name}.png", fig)
            parts.append(f"![examples {suite_name}]({path})")
    ctx.tables["plots/metrics.csv"] = pd.DataFrame(long_rows)
    return parts


@section("performance", order=90)
def performance(ctx: ReportContext) -> list[str]:
    """The measurement files (:data:`MEASUREMENTS`) by name, each with its command."""
    files = sorted(
        (f for pattern in MEASUREMENTS for f in ctx.out.glob(pattern)), key=lambda f: f.stem
    )
    if not files:
        return ["## Performance", TEXT("no-measurements")]
    parts = []
    for f in files:
        data = json.loads(f.read_text())
        body = json.dumps(data.get("results", data), indent=1)
        parts.append(f"**{f.stem}** (`{data.get('command', '')}`)\n\n```json\n{body}\n```")
    return ["## Performance", "\n\n".join(parts)]
