"""Published figures beside ours: the report section for the real benchmarks.

The seeds and the benchmark papers report numbers for OpenAI CLIP and for the three methods
on the official files (``design/benchmarks.md`` §5, ``design/methods.md`` §4). This section
puts each one next to the same metric as this pipeline measured it — computed by the suite's
own official metric (the function the metric tests pin), or for the pooled What'sUp pair
criterion by :func:`pipeline.benchmarks.whatsup.pooled_pair_metrics` with its exact McNemar
test — and names both encoders, since a published ViT-B/32 figure is not one ViT-L-14-336
can be held to. It shows only rows whose suite was scored; the shapes report gets one line.

Figures are percentages as published; ``ours`` is in the same unit.

The shapes report's ``failure-profile`` section (order 10) sets the toy CLIP's figures on
the shapes stand-ins beside the real ViT-L/14 figures of :data:`PUBLISHED` and beside chance,
and says on which the toy's 95% bootstrap CI lies above, around or below chance.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.sugarcrepe import CATEGORIES as SUGARCREPE_CATEGORIES
from pipeline.benchmarks.whatsup import POOLED_SUITES, pooled_pair_metrics
from pipeline.report import ReportContext, section
from pipeline.report.compare import pair_mcnemar, task_units
from pipeline.report.markdown import md_table, pct
from pipeline.report.tasks import Task
from pipeline.report.templates import Templates
from pipeline.stats import bootstrap_ci


@dataclass(frozen=True)
class Published:
    """One published figure: ``value`` (%) of ``variant`` on ``suite``'s ``metric``."""

    suite: str
    metric: str
    variant: str  # our registry name of the method the figure is for
    model: str  # the backbone it was published with
    value: float
    source: str


TEXT = Templates("pipeline.report", "templates/published.md")
_B32, _L14, _L336 = "ViT-B/32", "ViT-L/14", "ViT-L/14-336"
_BENCH = "benchmarks.md §5"
_SWAP_OBJ = "official, over 246 items; the file has 245 since sugar-crepe PR #6"
PUBLISHED: tuple[Published, ...] = (
    *(
        Published(suite, metric, "clip", model, value, f"{_BENCH} ({how})")
        for suite, metric, b32, l14, how in (
            ("aro-relation", "relation", 59.9, 61.52, "re-run; L/14 third-party"),
            ("aro-attribution", "attribution", 63.2, 61.86, "re-run; L/14 third-party"),
            ("aro-coco-order", "P@1", 47.4, 46.58, "re-run; L/14 third-party"),
            ("aro-flickr-order", "P@1", 58.8, 56.58, "re-run; L/14 third-party"),
            ("sugarcrepe", "replace-obj", 90.92, 94.07, "official"),
            ("sugarcrepe", "replace-att", 80.08, 79.19, "official"),
            ("sugarcrepe", "replace-rel", 69.20, 65.15, "official"),
            ("sugarcrepe", "swap-obj", 61.38, 60.16, _SWAP_OBJ),
            ("sugarcrepe", "swap-att", 63.96, 62.31, "official"),
            ("sugarcrepe", "add-obj", 77.21, 78.32, "official"),
            ("sugarcrepe", "add-att", 68.79, 71.53, "official"),
            ("whatsup-a", "individual", 30.58, 26.46, "third-party"),
            ("whatsup-b", "individual", 30.88, 25.25, "third-party"),
            ("whatsup-coco", "one-obj", 43.26, 48.82, "third-party"),
            ("whatsup-coco", "two-obj", 50.68, 49.77, "third-party"),
            ("whatsup-vg", "one-obj", 46.29, 45.52, "third-party"),
            ("whatsup-vg", "two-obj", 47.08, 48.11, "third-party"),
        )
        for model, value in ((_B32, b32), (_L14, l14))
    ),
    Published("whatsup-pooled", "pooled-pair", "clip", _L336, 100 * 4 / 410, "BindCLIP seed: 4 of 410 pairs"),
    Published("whatsup-pooled", "pooled-pair", "bindclip", _L336, 100 * 17 / 410, "BindCLIP seed: 17 of 410"),
    Published("vg-objects", "R@1", "clip", "CLIP", 9.1, "geometry seed: Visual Genome R@1 0.091"),
    Published("vg-objects", "R@1", "ridge-fgw", "CLIP", 72.5, "geometry seed: VG 0.091 → 0.725, its best reranker"),
)


# The shapes tasks of the toy CLIP's failure profile and the real tasks whose published OpenAI
# ViT-L/14 CLIP figures (:data:`PUBLISHED`) each mirrors, averaged where
# several do (shapes-aro's order stands for COCO- and Flickr-Order, its What'sUp for A and B).
PROFILE_TASKS: dict[Task, tuple[Task, ...]] = {
    **{("shapes-sugarcrepe", c): (("sugarcrepe", c),) for c in SUGARCREPE_CATEGORIES},
    ("shapes-aro", "relation"): (("aro-relation", "relation"),),
    ("shapes-aro", "attribution"): (("aro-attribution", "attribution"),),
    ("shapes-aro", "order"): (("aro-coco-order", "P@1"), ("aro-flickr-order", "P@1")),
    ("shapes-whatsup", "individual"): (("whatsup-a", "individual"), ("whatsup-b", "individual")),
}
PROFILE_MODEL = "ViT-L/14"


def real_clip_profile() -> dict[Task, tuple[float, str]]:
    """Each profile task's published real-CLIP value (a rate) and where it comes from: the real
    tasks it averages, each with its source (official, or a third party's re-run)."""
    published = {(p.suite, p.metric): p for p in PUBLISHED if p.variant == "clip" and p.model == PROFILE_MODEL}
    profile = {}
    for task, real in PROFILE_TASKS.items():
        rows = [published[r] for r in real]
        how = "; ".join(f"{r.suite} {r.metric}: {r.source}" for r in rows)
        profile[task] = (sum(r.value for r in rows) / len(rows) / 100, f"mean of {how}" if len(rows) > 1 else how)
    return profile


def profile_table(ctx: ReportContext) -> tuple[str, dict[str, list[str]]]:
    """The frozen encoder's failure profile: each profile task's ``clip`` figure, the real
    ViT-L/14 figure it stands for and chance; and the tasks whose 95% bootstrap CI lies
    above chance, contains it, or lies below it (``{"above": [...], "at": [...], "below":
    [...]}``)."""
    rows, sides = [], {"above": [], "at": [], "below": []}
    profile = real_clip_profile()
    units = task_units(ctx.results, list(profile), "clip")
    for task, (real, source) in profile.items():
        if task not in units:
            continue
        chance = ctx.layout.chance(task)
        ci = bootstrap_ci(units[task].values, units[task].groups, n_resamples=ctx.cfg.bootstrap, seed=ctx.cfg.seed)
        sides["above" if ci.lo > chance else "below" if ci.hi < chance else "at"].append(task[1])
        rows.append([*task, pct(ci.estimate), pct(real), pct(chance), source])
    model = ctx.extract.model
    header = ["suite", "metric", f"`{model}` (frozen, `clip`)", f"real CLIP {PROFILE_MODEL} (reported)", "chance"]
    return md_table([*header, "source"], rows), sides


@section("failure-profile", order=10)
def failure_profile(ctx: ReportContext) -> list[str]:
    """The toy CLIP against published ViT-L/14 and chance on the shapes world; on the real
    suites the published-figures section holds that comparison ([] there)."""
    if not ctx.layout.toy_world:
        return []
    table, sides = profile_table(ctx)
    named = {k: ", ".join(v) or "none" for k, v in sides.items()}
    title = f"## The frozen encoder's failure profile (`{ctx.extract.model}`)"
    return [title, TEXT("profile", **named), table]


def measured(ctx: ReportContext, row: Published) -> float | None:
    """Our value (%) of ``row``'s metric for its variant, or None if it was not scored."""
    if row.suite == "whatsup-pooled":
        scored = pooled_inputs(ctx, row.variant)
        return None if scored is None else 100 * pooled_pair_metrics(scored)["pooled-pair"]
    entry = ctx.results.get(row.suite)
    if entry is None or row.variant not in entry["scores"]:
        return None
    metrics = SUITES.get(row.suite).metrics(entry["manifest"], entry["scores"][row.variant])
    return 100 * float(metrics[row.metric]) if row.metric in metrics else None


def option_caveat(ctx: ReportContext, suite: str) -> str:
    """A note for ``ours`` when the suite's items are not the official ones: ARO Order's
    distractor captions made by the fallback tagger (``order_tagger`` other than
    ``official``: spaCy and nltk were not installed at manifest build), '' otherwise."""
    manifest = ctx.results[suite]["manifest"]
    if "order_tagger" not in manifest:
        return ""
    taggers = sorted(set(manifest["order_tagger"].astype(str)) - {"official"})
    return f" ({', '.join(taggers)}-tagger options, not the official ones)" if taggers else ""


def pooled_inputs(ctx: ReportContext, variant: str) -> list | None:
    """Each pooled What'sUp suite's ``(manifest, scores)`` for ``variant``; None unless all are scored."""
    entries = [ctx.results.get(s) for s in POOLED_SUITES]
    if any(e is None or variant not in e["scores"] for e in entries):
        return None
    return [(e["manifest"], e["scores"][variant]) for e in entries]


@section("published", order=80)
def published(ctx: ReportContext) -> list[str]:
    """The published-figures table for the scored real suites (one line for the shapes world)."""
    rows = []
    for row in PUBLISHED:
        ours = measured(ctx, row)
        if ours is None:
            continue
        caveat = "" if row.suite == "whatsup-pooled" else option_caveat(ctx, row.suite)
        cells = [row.suite, row.metric, row.variant, f"{row.value:.2f}", row.model, f"{ours:.2f}{caveat}"]
        rows.append([*cells, ctx.score.encoder, row.source])
    if not rows:
        return ["## Published figures beside ours", TEXT("published-none")]
    header = ["suite", "metric", "variant", "published", "published with", "ours", "ours with", "source"]
    parts = ["## Published figures beside ours", TEXT("published-intro"), md_table(header, rows)]
    clip, bind = pooled_inputs(ctx, "clip"), pooled_inputs(ctx, "bindclip")
    if clip is not None and bind is not None:
        t = pair_mcnemar(bind, clip)
        parts.append(
            TEXT(
                "published-pooled", suites=" + ".join(POOLED_SUITES), pairs=t["pairs"], clip=t["baseline_correct"],
                bindclip=t["variant_correct"], b01=t["b01"], b10=t["b10"], p=t["p"],
            )  # fmt: skip
        )
    return [*parts, TEXT("published-notes")]
