"""Geometry-aware retrieval's section of the report (registered as ``geometry``).

Shown when a geometry variant (``fgw``, ``hungarian``, ``fgw-hungarian``, ``ridge-fgw``,
``steer``, ``steer-multi``) was scored on a retrieval suite: every variant's R@1, R@5, R@10,
nDCG@10 and mean rank with 95% bootstrap CIs and Δ against ``clip``; the seed's
hard-versus-soft comparison (Hungarian against FGW, paired); the space ``ridge-fgw``'s map
compares in, as the held-out training images chose it (``pipeline ridge``'s record); the
steering tables, by slice and by strength (both steering variants re-scored from the store at
several β, locally and over the whole gallery, against one direction alone: where the sum
interferes); the reranking cost from ``pipeline bench rerank``; one query's phrases
matched to its top candidates' objects, drawn (:mod:`pipeline.scorers.geometry.figure`); and
the issue's goals as measured. The numbers also go to ``geometry.json``. The prose is
``report.md`` beside this file.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.retrieval import RETRIEVAL_METRICS, query_ranks
from pipeline.report import ReportContext, section
from pipeline.report.compare import task_units
from pipeline.report.inputs import read_json
from pipeline.report.markdown import md_table, metric_ci, metric_diff, metric_value, p_value
from pipeline.report.sections import read_bench
from pipeline.report.templates import Templates
from pipeline.scorers.geometry.diagnostics import BASELINE, EQUAL_LENGTH, STEERING, steering_slices
from pipeline.scorers.geometry.figure import matching_figure
from pipeline.scorers.geometry.rerankers import GeometryReranker
from pipeline.scorers.geometry.steering_report import steering_part, strength_part, strength_rows
from pipeline.stats import bootstrap_ci, units_bootstrap

TEXT = Templates("pipeline.scorers.geometry", "report.md")
RERANKERS = ("fgw", "hungarian", "fgw-hungarian", "ridge-fgw")
VARIANTS = (*RERANKERS, *STEERING)
RERANK_BENCH = "bench/rerank.json"  # `pipeline bench rerank`
PICTURED = ("shapes-multi", "ridge-fgw")  # the suite and variant of the matching picture
SHORTLIST_K = inspect.signature(GeometryReranker).parameters["k"].default  # the rerankers' default K
RIDGE_RECORD = "ridge-fgw/config.json"  # `pipeline ridge`'s record, under score.checkpoints


def retrieval_suites(ctx: ReportContext) -> list[str]:
    return [
        s
        for s, e in ctx.results.items()
        if SUITES.get(s).task == "retrieval" and any(v in e["scores"] for v in VARIANTS)
    ]


def metric_rows(
    ctx: ReportContext, suite: str, variants: list[str]
) -> tuple[list[list[str]], dict[str, Any]]:
    """Table rows (variant × metric cells) and their numbers for ``geometry.json``."""
    tasks = [(suite, m) for m in RETRIEVAL_METRICS]
    base = task_units(ctx.results, tasks, BASELINE)
    rows, numbers = [], {}
    for v in variants:
        units = task_units(ctx.results, tasks, v)
        if not units:
            continue
        cells, numbers[v] = [], {}
        for t in tasks:
            u = units.get(t)
            if u is None:
                cells.append("–")
                continue
            ci = bootstrap_ci(u.values, n_resamples=ctx.cfg.bootstrap, seed=ctx.cfg.seed)
            cell = metric_ci(t[1], ci.estimate, ci.lo, ci.hi)
            entry = {"value": ci.estimate, "lo": ci.lo, "hi": ci.hi}
            if v != BASELINE and t in base:
                r = units_bootstrap(u, base[t], n_resamples=ctx.cfg.bootstrap, seed=ctx.cfg.seed)
                cell += f"<br>Δ {metric_diff(t[1], r.diff, r.lo, r.hi)}"
                entry.update(diff=r.diff, diff_lo=r.lo, diff_hi=r.hi, p=r.p)
            cells.append(cell)
            numbers[v][t[1]] = entry
        rows.append([f"`{v}`", *cells])
    return rows, numbers


def shortlist_ceiling(ctx: ReportContext, suite: str, variant: str) -> dict[str, Any] | None:
    """CLIP's R@K on ``suite``, K the shortlist ``variant`` reranks (``score.options``, else
    the rerankers' default): reranking that shortlist cannot lift any R@k, k <= K, above it."""
    entry = ctx.results.get(suite)
    if not entry or BASELINE not in entry["scores"]:
        return None
    k = int(ctx.score.options.get(variant, {}).get("k", SHORTLIST_K))
    rank = query_ranks(entry["manifest"], entry["scores"][BASELINE])
    return {"k": k, "value": float((rank <= k).mean())}


def hard_vs_soft(ctx: ReportContext, suite: str) -> dict[str, Any] | None:
    """Hungarian minus FGW per metric (paired over queries), the seed's comparison."""
    tasks = [(suite, m) for m in RETRIEVAL_METRICS]
    h, f = task_units(ctx.results, tasks, "hungarian"), task_units(ctx.results, tasks, "fgw")
    if not h or not f:
        return None
    out = {}
    for t in tasks:
        r = units_bootstrap(h[t], f[t], n_resamples=ctx.cfg.bootstrap, seed=ctx.cfg.seed)
        out[t[1]] = {
            "hungarian": h[t].statistic(),
            "fgw": f[t].statistic(),
            "diff": r.diff,
            "lo": r.lo,
            "hi": r.hi,
            "p": r.p,
        }
    return out


def goals(
    numbers: dict[str, dict],
    soft: dict[str, Any],
    bench: dict[str, Any],
    ceilings: dict[str, Any] | None = None,
    strength: dict[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The issue's goals on the shapes world, each with its measured values and verdict;
    ``ceilings`` (reranker -> :func:`shortlist_ceiling` on shapes-multi) give what the best
    reranker's shortlist lets R@10 reach, and ``strength`` (suite -> its steering-strength
    rows) the weakest steering at which ``steer-multi`` falls below ``clip`` on shapes-multi."""
    checks = []

    def value(suite, v, m):
        return numbers.get(suite, {}).get(v, {}).get(m, {}).get("value")

    r1 = value("shapes-retrieval", "ridge-fgw", "R@1")
    if r1 is not None:
        checks.append(
            {
                "goal": "ridge-fgw R@1 >= 90% on shapes-retrieval",
                "unit": "%",
                "value": r1,
                "met": r1 >= 0.90,
                "by": r1 - 0.90,
                "clip": value("shapes-retrieval", BASELINE, "R@1"),
            }
        )
    clip10 = value("shapes-multi", BASELINE, "R@10")
    if clip10 is not None:
        measured = [(x, v) for v in RERANKERS if (x := value("shapes-multi", v, "R@10")) is not None]
        if measured:  # a reranker at 0 is the best one measured, and the goal missed, not left out
            best = max(measured)
            checks.append(
                {
                    "goal": "shapes-multi: best reranker R@10 >= 2 x clip",
                    "unit": "%",
                    "value": best[0],
                    "variant": best[1],
                    "clip": clip10,
                    "met": best[0] >= 2 * clip10,
                    "by": best[0] - 2 * clip10,
                    **({"ceiling": ceilings[best[1]]} if (ceilings or {}).get(best[1]) is not None else {}),
                }
            )
        sm = value("shapes-multi", "steer-multi", "R@10")
        if sm is not None:
            checks.append(
                {
                    "goal": "shapes-multi: steer-multi R@10 below clip",
                    "unit": "%",
                    "value": sm,
                    "clip": clip10,
                    "met": sm < clip10,
                    "by": clip10 - sm,
                    **below_from((strength or {}).get("shapes-multi", []), "R@10"),
                }
            )
    for suite, s in soft.items():
        if s:
            found = s["R@1"]["diff"] > 0 and all(
                s[m]["diff"] < 0 for m in ("R@5", "R@10", "nDCG@10")
            )
            checks.append(
                {
                    "goal": f"{suite}: Hungarian wins R@1, FGW wins R@5/R@10/nDCG@10",
                    "met": found,
                    "values": {m: s[m]["diff"] for m in ("R@1", "R@5", "R@10", "nDCG@10")},
                    # the paired 95% CI lies on the goal's side of 0
                    "significant": {
                        m: bool(s[m]["lo"] > 0) if m == "R@1" else bool(s[m]["hi"] < 0)
                        for m in ("R@1", "R@5", "R@10", "nDCG@10")
                    },
                }
            )
    ms = [
        r.get("ms_per_query")
        for r in bench.get("variants", {}).values()
        if isinstance(r, dict) and r.get("k") == 20
    ]
    if ms:
        checks.append(
            {
                "goal": "reranking at K = 20 <= 10 ms per query",
                "unit": "ms",
                "value": max(ms),
                "met": max(ms) <= 10.0,
            }
        )
    speed_goals = (
        ("fgw_batched_vs_loop", "FGW batched >= 10x the per-problem POT loop"),
        ("fgw_offset_vs_emd", "the same on the rerankers' signed-offset problems (POT's loop: ot.emd2)"),
    )
    for key, goal in speed_goals:
        found = bench.get(key, {})
        if isinstance(found, dict) and "speedup" in found:
            checks.append({"goal": goal, "unit": "x", "value": found["speedup"], "met": found["speedup"] >= 10})
    return checks


def below_from(rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """``{"below_from": {contrast: ...}}``: per steering contrast, the smallest β (the
    pipeline's shortlist before the whole gallery at equal β) at which ``steer-multi``'s
    ``metric`` falls below the baseline with its 95% CI, with its value and one direction's
    there and the sum's at one direction's length; a contrast where it never does is left
    out, and {} where none does."""
    out = {}
    for contrast in dict.fromkeys(r["contrast"] for r in rows):
        below = [r for r in rows if r["contrast"] == contrast and r[f"steer-multi {metric}"]["hi"] < 0]
        if below:
            r = min(below, key=lambda r: r["beta"])  # min keeps the first of equal β: the shortlist's scope
            one, multi = r[f"steer {metric}"]["value"], r[f"steer-multi {metric}"]["value"]
            equal = r[f"{EQUAL_LENGTH} {metric}"]["value"]
            out[contrast] = {"beta": r["beta"], "scope": r["scope"], "value": multi, "one_direction": one,
                             "equal_length": equal}  # fmt: skip
    return {"below_from": out} if out else {}


@section("geometry", order=60)
def geometry_section(ctx: ReportContext) -> list[str]:
    """Every geometry-aware analysis of the scored variants ([] without any)."""
    suites = retrieval_suites(ctx)
    if not suites:
        return []
    parts = ["## Geometry-aware retrieval", TEXT("intro")]
    numbers, soft = {}, {}
    for suite in suites:
        variants = [v for v in (BASELINE, *VARIANTS) if v in ctx.results[suite]["scores"]]
        rows, numbers[suite] = metric_rows(ctx, suite, variants)
        parts += [f"### {suite}", md_table(["variant", *RETRIEVAL_METRICS], rows)]
        soft[suite] = hard_vs_soft(ctx, suite)
    parts += ["### Hard (Hungarian) against soft (FGW) matching", TEXT("hard-vs-soft")]
    rows = [
        [
            s,
            m,
            metric_value(m, d["hungarian"]),
            metric_value(m, d["fgw"]),
            metric_diff(m, d["diff"], d["lo"], d["hi"]),
            p_value(d["p"], ctx.cfg.bootstrap),
        ]
        for s, x in soft.items()
        if x
        for m, d in x.items()
    ]
    parts.append(md_table(["suite", "metric", "hungarian", "fgw", "Δ hungarian − fgw", "p"], rows))
    ridge = ridge_record(ctx) if any("ridge-fgw" in by for by in numbers.values()) else None
    if ridge is not None:
        parts += ridge_space_part(ridge)
    rows = [
        [s, f"`{v}`", m, metric_diff(m, e["diff"], e["diff_lo"], e["diff_hi"])]
        for s, by in numbers.items()
        for v in STEERING
        if v in by
        for m, e in by[v].items()
        if "diff" in e
    ]
    steering: dict[str, Any] = {}
    strength: dict[str, Any] = {}
    if rows:  # steering is scored where `score.variants` names it
        parts += ["### Steering", TEXT("steering")]
        parts.append(md_table(["suite", "variant", "metric", f"Δ vs `{BASELINE}`"], rows))
        resampling = (ctx.cfg.bootstrap, ctx.cfg.seed)
        steering = {
            suite: steering_slices(ctx.results[suite], SUITES.get(suite).units, STEERING, BASELINE, *resampling)
            for suite in suites
        }
        parts += steering_part(steering)
        strength = {s: table for s in suites if (table := strength_rows(ctx, s))}
        parts += strength_part(ctx, strength)
    bench = read_bench(ctx.out / RERANK_BENCH)
    parts += ["### Reranking cost", *cost_part(bench, ctx.out / RERANK_BENCH, ctx.bench_command("rerank"))]
    parts += matching_part(ctx)
    ceilings = {v: shortlist_ceiling(ctx, "shapes-multi", v) for v in RERANKERS}
    checks = goals(numbers, soft, bench, ceilings, strength)
    ctx.json_files["geometry.json"] = {
        "metrics": numbers,
        "hard_vs_soft": soft,
        "ridge_map": ridge,
        "steering": steering,
        "steering_strength": strength,
        "goals": checks,
    }
    rows = [[c["goal"], _verdict(c), _goal_value(c)] for c in checks]
    parts += ["### Goals as measured", md_table(["goal", "verdict", "measured"], rows)]
    return parts


def ridge_record(ctx: ReportContext) -> dict[str, Any] | None:
    """What ``pipeline ridge`` chose and measured (``config.json``), or None without a fit."""
    path = Path(ctx.score.checkpoints) / RIDGE_RECORD
    if not path.is_file():
        return None
    record = read_json(path, "pipeline ridge")
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not the ridge stage's record; rerun `pipeline ridge` to rewrite it")
    aucs = record.get("heldout_auc", {})
    if not _nested_aucs(aucs):
        raise ValueError(
            f"{path} records its held-out AUCs in another form than the ridge stage writes (grid -> rank -> beta, "
            f"the same betas throughout): it is from older code or was edited; rerun `pipeline ridge` to rewrite it"
        )
    keys = ("ridge", "n_pairs", "train_r2", "layer", "rank", "beta", "objects", "heldout_auc")
    return {k: record[k] for k in keys if k in record}


def _nested_aucs(aucs: Any) -> bool:
    """Whether ``aucs`` is the ridge stage's table: grid -> rank -> beta -> AUC, every level
    filled, the same betas for every (grid, rank)."""
    if not isinstance(aucs, dict) or not all(isinstance(by_rank, dict) and by_rank for by_rank in aucs.values()):
        return False
    cells = [by_beta for by_rank in aucs.values() for by_beta in by_rank.values()]
    return all(isinstance(c, dict) and c for c in cells) and len({tuple(c) for c in cells}) <= 1


def ridge_space_part(record: dict[str, Any]) -> list[str]:
    """The held-out ranking AUC of every (grid, hub-offset beta, rank) the ridge stage tried,
    one row per grid and beta, its choice in bold."""
    aucs = record.get("heldout_auc") or {}
    if not aucs or "rank" not in record:
        return []
    beta = f"{record.get('beta', 0):g}"
    chosen = ("crops" if record.get("objects") == "crops" else record["layer"], str(record["rank"]), beta)
    ranks = list(next(iter(aucs.values())))
    rows = [
        [f"`{grid}`", b]
        + [f"**{by_rank[r][b]:.4f}**" if (grid, r, b) == chosen else f"{by_rank[r][b]:.4f}" for r in ranks]
        for grid, by_rank in aucs.items()
        for b in by_rank[ranks[0]]
    ]
    header = ["objects", "β", *("every direction" if r == "0" else f"r = {r}" for r in ranks)]
    cfg = record.get("ridge", {})
    text = TEXT(
        "ridge-space",
        suite=cfg.get("suite", "?"),
        n_pairs=record.get("n_pairs", 0),
        lam=cfg.get("lam", float("nan")),
        shrinkage=cfg.get("shrinkage", float("nan")),
        grid=chosen[0],
        rank="every direction" if chosen[1] == "0" else f"r = {chosen[1]}",
        beta=beta,
    )
    return ["### The ridge map's space", text, md_table(header, rows)]


def _verdict(c: dict[str, Any]) -> str:
    """met / **missed**; a comparison met on its point estimates whose CIs do not all
    exclude 0 says which do not."""
    if not c["met"]:
        return "**missed**"
    weak = [m for m, ok in c.get("significant", {}).items() if not ok]
    return f"met on the point estimates ({', '.join(weak)}: 95% CI includes 0)" if weak else "met"


def _goal_value(c: dict[str, Any]) -> str:
    if "values" in c:
        return (
            ", ".join(f"{m} {100 * d:+.1f}" for m, d in c["values"].items())
            + " (Hungarian − FGW, points)"
        )
    unit = c.get("unit")
    if unit == "%":  # fractions in the metrics files, % (and points) in the report
        text = f"{100 * c['value']:.1f}%"
        if c.get("clip") is not None:
            text += f" (clip {100 * c['clip']:.1f}%)"
        if "by" in c and not c["met"]:
            text += f", short by {100 * abs(c['by']):.1f} points"
        if "ceiling" in c:
            text += f"; the shortlist's ceiling, CLIP's R@{c['ceiling']['k']}, is {100 * c['ceiling']['value']:.1f}%"
        if "below_from" in c:
            text += "; below clip " + "; ".join(
                f"from β {b['beta']:g} ({contrast} contrast, {b['scope']}): {100 * b['value']:.1f}%, "
                f"one direction {100 * b['one_direction']:.1f}%, the sum at its length {100 * b['equal_length']:.1f}%"
                for contrast, b in c["below_from"].items()
            ) + " (the steering-strength table)"
        return text
    return f"{c['value']:.3g}" + {"ms": " ms", "x": "×"}.get(unit, "")


def cost_part(bench: dict[str, Any], path: Path, command: str) -> list[str]:
    """The reranking cost table from ``pipeline bench rerank``'s results, or where to get them."""
    if not bench:
        return [TEXT("no-rerank-bench", path=str(path), command=command)]
    rows = [
        [
            f"`{v}`",
            str(r["k"]),
            "–" if r.get("objects") is None else str(r["objects"]),  # steering reads no objects
            f"{r['ms_per_query']:.2f}",
            f"{r['queries_per_s']:,.0f}",
        ]
        for v, r in bench.get("variants", {}).items()
        if isinstance(r, dict)
    ]
    rows += [
        [
            f"`{r['variant']}`",
            str(r["k"]),
            "–" if r.get("objects") is None else str(r["objects"]),  # steering reads no objects
            f"{r['ms_per_query']:.2f}",
            f"{r['queries_per_s']:,.0f}",
        ]
        for r in bench.get("scaling", [])
    ]
    parts = [TEXT("cost"), md_table(["variant", "K", "objects", "ms / query", "queries / s"], rows)]
    speed = ("batched_ms", "loop_ms", "speedup", "max_abs_diff")
    fgw = bench.get("fgw_batched_vs_loop")
    if isinstance(fgw, dict) and fgw:
        setup = {"problems": fgw.get("problems", 0), "n": fgw.get("n", "–"), "m": fgw.get("m", "–")}
        parts.append(TEXT("fgw-speed", **setup, alpha=fgw.get("alpha", 0.5), **{k: fgw[k] for k in speed}))
        if fgw.get("pot_batch_ms") is not None:
            parts.append(TEXT("fgw-pot-batch", **{k: fgw[k] for k in ("pot_batch_ms", "pot_batch_max_abs_diff")}))
    offset = bench.get("fgw_offset_vs_emd")
    if isinstance(offset, dict) and offset:
        general = offset.get("general_batched_ms", float("nan"))
        parts.append(TEXT("fgw-offset", **{k: offset[k] for k in speed}, general_batched_ms=general))
    return parts


def matching_part(ctx: ReportContext) -> list[str]:
    """One query of ``PICTURED``: its phrases matched to the top candidates' objects."""
    suite, variant = PICTURED
    entry = ctx.results.get(suite)
    if entry is None or variant not in entry["scores"]:
        return []
    fig = matching_figure(ctx, suite, variant, BASELINE)
    if fig is None:
        return []
    return [
        "### One query, matched",
        TEXT("matching", suite=suite, variant=variant),
        f"![matching]({ctx.figure('geometry-matching.png', fig)})",
    ]
