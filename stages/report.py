"""Stage `report`: tables with bootstrap CIs, differences against frozen CLIP, the toy CLIP's
failure profile, example images with their captions and scores, and measured performance.

Reads the score stage's outputs (``cache/scores``, ``reports/metrics``), the manifests
and images, and the JSON files that ``pipeline bench ...`` commands leave in
``reports/bench``; for the BindCLIP coupling pictures and diagnostics it also runs the
trained scorer on cached features (``cache/features``, ``cache/checkpoints``). Writes
``reports/report.md``, ``reports/figures/*.png``, ``reports/diagnostics.json`` and
``reports/plots/metrics.csv`` (a long table for ``dvc plots``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig, WorldConfig
from pipeline.manifests import read_manifest, resolve_source
from pipeline.stats import bootstrap_ci, units_bootstrap

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


def _fmt(x: float) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def load_results(score: ScoreConfig, extract: ExtractConfig, world: WorldConfig) -> dict[str, Any]:
    """{suite: {"manifest": df, "scores": {variant: array}}} for what the score stage wrote."""
    from stages.score import load_scores

    out: dict[str, Any] = {}
    for suite in score.suites:
        src = resolve_source(suite, world.out, extract.manifests, extract.image_roots)
        entry = {"manifest": read_manifest(src.manifest), "image_root": src.image_root, "scores": {}}
        names = list(score.variants)
        for variant in score.seed_variants:
            names += sorted(p.name for p in Path(score.scores_out).glob(f"{variant}@seed*"))
        for name in names:
            path = Path(score.scores_out) / name / f"{suite}.parquet"
            if path.is_file():
                entry["scores"][name] = load_scores(score, name, suite)
        out[suite] = entry
    return out


def suite_table(suite_name: str, entry: dict[str, Any], cfg: ReportConfig, baseline: str = "clip") -> tuple[str, list[dict]]:
    """Markdown table: variant x metric with 95% CIs, and Δ vs the baseline with paired CIs."""
    suite = SUITES.get(suite_name)
    manifest = entry["manifest"]
    units_by_variant = {v: suite.units(manifest, s) for v, s in entry["scores"].items()}
    lines = [
        "| variant | " + " | ".join(suite.metric_names) + " |",
        "|---|" + "---|" * len(suite.metric_names),
    ]
    long_rows = []
    for variant, units in units_by_variant.items():
        cells = []
        for name in suite.metric_names:
            u = units.get(name)
            if u is None or len(u.values) == 0:
                cells.append("–")
                continue
            ci = bootstrap_ci(u.values, u.groups, n_resamples=cfg.bootstrap, seed=cfg.seed)
            cell = f"{_fmt(ci.estimate)} [{_fmt(ci.lo)}, {_fmt(ci.hi)}]"
            if variant != baseline and baseline in units_by_variant:
                d = units_bootstrap(u, units_by_variant[baseline][name], n_resamples=cfg.bootstrap, seed=cfg.seed)
                cell += f"<br>Δ {100 * d.diff:+.1f} [{100 * d.lo:+.1f}, {100 * d.hi:+.1f}]"
            cells.append(cell)
            long_rows.append(
                {"suite": suite_name, "variant": variant, "metric": name, "value": ci.estimate, "lo": ci.lo, "hi": ci.hi}
            )
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines), long_rows


def profile_table(results: dict[str, Any]) -> str:
    """The toy CLIP's failure profile next to real ViT-L/14's published one."""
    lines = ["| suite | metric | toy CLIP (frozen, `clip`) | real CLIP ViT-L/14 (published) |", "|---|---|---|---|"]
    for (suite_name, metric), real in REAL_CLIP_PROFILE.items():
        entry = results.get(suite_name)
        if not entry or "clip" not in entry["scores"]:
            continue
        value = SUITES.get(suite_name).metrics(entry["manifest"], entry["scores"]["clip"]).get(metric)
        lines.append(f"| {suite_name} | {metric} | {_fmt(value)} | {_fmt(real)} |")
    return "\n".join(lines)


def examples_figure(suite_name: str, entry: dict[str, Any], out: Path, n: int) -> Path | None:
    """A figure of ``n`` items: image, caption options and each variant's scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    manifest = entry["manifest"]
    if not entry["scores"] or len(manifest) == 0:
        return None
    rng = np.random.default_rng(0)
    picks = rng.choice(len(manifest), size=min(n, len(manifest)), replace=False)
    fig, axes = plt.subplots(1, len(picks), figsize=(3.4 * len(picks), 4.2))
    axes = np.atleast_1d(axes)
    for ax, i in zip(axes, picks, strict=True):
        row = manifest.iloc[int(i)]
        ax.imshow(Image.open(Path(entry["image_root"]) / row["image"]).convert("RGB"))
        ax.set_xticks([])
        ax.set_yticks([])
        caps = list(row["captions"])[:5]
        text = []
        for k, cap in enumerate(caps):
            mark = "✓" if k == int(row["correct"]) else " "
            scores = " ".join(f"{v}:{entry['scores'][v][i, k]:.3f}" for v in entry["scores"] if k < entry["scores"][v].shape[1])
            text.append(f"{mark} {cap[:38]}\n    {scores}")
        ax.set_title(str(row["category"]), fontsize=9)
        ax.set_xlabel("\n".join(text), fontsize=6.5, loc="left")
    fig.tight_layout()
    path = out / "figures" / f"examples-{suite_name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bench_section(out: Path) -> str:
    """Tables of the measurements `pipeline bench ...` wrote to reports/bench/*.json."""
    files = sorted((out / "bench").glob("*.json"))
    if not files:
        return "_No measurements yet: run `pipeline bench extract`, `pipeline bench score`, `pipeline bench memory`._"
    parts = []
    for f in files:
        data = json.loads(f.read_text())
        parts.append(f"**{f.stem}** (`{data.get('command', '')}`)\n\n```json\n{json.dumps(data.get('results', data), indent=1)}\n```")
    return "\n\n".join(parts)


def _pct(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def bindclip_sections(results: dict[str, Any], cfg: ReportConfig, score: ScoreConfig, extract: ExtractConfig, out: Path) -> list[str]:
    """The BindCLIP analyses (seed Table 1, lesion by family, local/additive, statistics,
    seeds, coupling pictures, goals) for whichever of its variants were scored."""
    from pipeline import analysis

    scored = {v for e in results.values() for v in e["scores"]}
    if "bindclip" not in scored:
        return []
    parts = ["## BindCLIP (seed Table-1 layout)", "Headline metric per suite, then the binding slices; Δ = BindCLIP − frozen CLIP with a paired-bootstrap 95% CI and p-value."]
    rows = analysis.binding_table(results, "bindclip", cfg.bootstrap, cfg.seed)
    lines = ["| suite | metric | frozen CLIP | BindCLIP | Δ [95% CI] | p |", "|---|---|---|---|---|---|"]
    for c in rows:
        lines.append(f"| {c.suite} | {c.metric} | {_pct(c.base)} | {_pct(c.value)} | {100 * c.diff:+.1f} [{100 * c.lo:+.1f}, {100 * c.hi:+.1f}] | {c.p:.4f} |")
    parts.append("\n".join(lines))
    mc = analysis.whatsup_mcnemar(results, "bindclip")
    if mc:
        parts.append(
            f"What'sUp-style pair criterion: frozen CLIP {mc['baseline_correct']}/{mc['pairs']} pairs, "
            f"BindCLIP {mc['variant_correct']}/{mc['pairs']}; exact McNemar on the discordant pairs "
            f"(b01 = {mc['b01']}, b10 = {mc['b10']}): p = {mc['p']:.3g}."
        )
    variants = [v for v in ("clip", "bindclip", "bindclip-lesion", "bindclip-noconsensus") if v in scored]
    fam = analysis.family_table(results, variants)
    if not fam.empty:
        parts += ["### Lesion and consensus ablation by family (shapes-dev)", "The lesion keeps every locked parameter and replaces only the plan by the outer product of its own marginals.", _df_markdown(fam.map(_pct))]
    cost = analysis.lesion_costs(results, n_resamples=cfg.bootstrap, seed=cfg.seed)
    if not cost.empty:
        parts += [
            f"What the plan carries, per family: BindCLIP − lesion in points, the scored checkpoint with a paired-bootstrap 95% CI over items ({len(results['shapes-dev']['manifest'])} pairs over {len(cost.index.drop('mean', errors='ignore'))} families), then every training seed (its own checkpoint, with and without its plan) and their mean.",
            _lesion_cost_markdown(cost),
        ]
    by_kind = analysis.lesion_costs_by_kind(results, n_resamples=cfg.bootstrap, seed=cfg.seed)
    if not by_kind.empty:
        parts += [
            "The same by edit kind (`pipeline.world.families.edit_kind`): in the shapes world a role swap is an argument swap of a spatial relation (split by its axis), an attribute edit changes a size, or a colour to one another object of the scene has (a binding negative), or to a colour new to the scene; a negation's true caption is the one that says \"no X\" or the other. Small groups: read the intervals.",
            _lesion_cost_markdown(by_kind),
        ]
    grid = analysis.additive_grid(results)
    if not grid.empty:
        local = [v for v in ("clip", "local-max", "local-softmax", "additive", "bindclip") if v in scored]
        table = analysis.family_table(results, local, "shapes-sugarcrepe")
        sc = results["shapes-sugarcrepe"]["manifest"]
        adds = {c: (int(((sc["category"] == c) & sc["length_matched"]).sum()), int((sc["category"] == c).sum())) for c in ("add-obj", "add-att")}
        parts += [
            "### Local and additive baselines (shapes-sugarcrepe)",
            "Zero-parameter local alignment (caption tokens vs final patches in CLIP's joint space) pooled by max or softmax, and global + w·local for every w of the grid (computed exactly from the cached option scores). "
            "The length-matched columns keep the add-* items whose two captions have equally many BPE tokens, where the negative's extra phrase gives no length cue: "
            + ", ".join(f"{m} of {n} {c}" for c, (m, n) in adds.items())
            + " (built so, `pipeline.world.suites.P_ADD_LENGTH_MATCHED`; SugarCrepe itself has 35 of 2,754). Each of their positives says \"a picture of ...\" and none of their negatives does: a template cue in place of the length one.",
            _df_markdown(table.map(_pct)),
            _df_markdown(grid.assign(**{c: grid[c].map(_pct) for c in grid.columns if c not in ("pooling", "w")})),
        ]
    seeds = sorted(v for v in scored if v.startswith("bindclip@"))
    if seeds:
        seed_rows = {}
        for suite, metric in analysis.HEADLINE_ROWS + (("shapes-sugarcrepe", "swap-att"), ("shapes-whatsup", "individual")):
            entry = results.get(suite)
            if not entry:
                continue
            vals = [SUITES.get(suite).metrics(entry["manifest"], entry["scores"][v]).get(metric) for v in seeds if v in entry["scores"]]
            seed_rows[f"{suite} {metric}"] = {**{v: _pct(x) for v, x in zip(seeds, vals, strict=False)}, "spread (max−min)": _pct(max(vals) - min(vals)) if vals else "–"}
        parts += ["### Training seeds", _df_markdown(pd.DataFrame(seed_rows).T)]
    from stages.score import load_scorer, open_store

    store = open_store(extract)  # the trained scorer on cached features: pictures and diagnostics
    scorer = load_scorer("bindclip", store, score)
    fig = coupling_figure(results, store, scorer, out)
    if fig:
        parts += ["### Coupling pictures", "Each edited word's plan mass over the image (its row of the plan, both depths summed, normalised over the patches; 'grounded' is the row's share off the null patch), for both captions of a few shapes-sugarcrepe items: on the left the true caption's edited words (✓), on the right the negative's (✗). The edited words are the word-level diff of the two captions (`pipeline.diagnostics.edited_words`); the green box is the object the word alone names, where one object does. On an attribute swap each colour word names the same object in both captions; the order energy reads whether it sits where the noun after it does.", f"![coupling](figures/{fig.name})"]
    parts += diagnostics_section(store, scorer, out)
    parts += parameter_section(out / "bench" / "bindclip.json")
    checks = analysis.goal_checks(results)
    sinkhorn_bench = out / "bench" / "sinkhorn.json"  # `pipeline bench sinkhorn`
    if sinkhorn_bench.exists():
        checks.append(analysis.sinkhorn_goal(json.loads(sinkhorn_bench.read_text())["results"]))
    if checks:
        lines = ["| goal | measured | met | short of the goal by |", "|---|---|---|---|"]
        for c in checks:
            frozen = f" (frozen {_pct(c['frozen'])} → {_pct(c['value'])})" if c["frozen"] is not None else ""
            lines.append(f"| {c['goal']} | {c['measured']}{frozen} | {'yes' if c['met'] else '**no**'} | {c['shortfall'] or '–'} |")
        parts += ["### The issue's goals, as measured", "\n".join(lines)]
    return parts


DIAGNOSED_SUITES = ("shapes-sugarcrepe", "shapes-aro", "shapes-whatsup")
RELATION_SUITES = {"shapes-sugarcrepe": ("swap-att",), "shapes-aro": ("relation",), "shapes-whatsup": None}  # categories (None = all) also shown by relation


def parameter_section(bench: Path) -> list[str]:
    """The scorer's parameters per component at ViT-L-14-336 dimensions, from ``pipeline
    bench bindclip``, against the paper's total (nothing when the bench has not run)."""
    from pipeline import analysis

    vit = json.loads(bench.read_text())["results"].get("ViT-L-14-336", {}) if bench.exists() else {}
    if "parameters" not in vit:
        return []
    pc = analysis.parameter_comparison(vit["parameters"])
    rows = ["| component | parameters |", "|---|---|"] + [f"| {k} | {v:,} |" for k, v in pc["components"].items()]
    rows.append(f"| **total** | **{pc['total']:,}** |")
    ours = [k for k in ("span_gate", "order_gate") if k in pc["components"]]
    return [
        "### Parameters at ViT-L-14-336 dimensions (h = 192)",
        "\n".join(rows),
        f"{pc['total']:,} trainable parameters, {100 * pc['share']:.0f}% of the paper's {pc['paper']:,} ({pc['gap']:,} fewer; `pipeline bench bindclip`). "
        "The seed gives only the total and names as learned only the shared projections and the relation and semantic scale logits; every component here is one that methods.md §1.1 and §1.4 describe"
        + (f" or an option marked ours ({', '.join(ours)}). " if ours else ". ")
        + f"The gap is {'larger' if pc['gap'] > pc['text_projection'] else 'smaller'} than one more h-wide block, e.g. a second LayerNorm + Linear(768 → 192) text projection "
        f"({pc['text_projection']:,}); the spec describes no such block, so none was added (`pipeline/scorers/bindclip.py`).",
    ]


def diagnostics_section(store, scorer, out: Path) -> list[str]:
    """BindCLIP's score taken apart per slice, and its grounding precision on shapes-dev
    (:mod:`pipeline.diagnostics`); the numbers also go to ``<out>/diagnostics.json``."""
    from pipeline.diagnostics import (
        argument_swaps,
        attribute_binding,
        energy_breakdowns,
        grounding_precision,
    )
    from pipeline.training import load_pairs
    from pipeline.world.families import edit_kind_order
    from stages.score import suite_inputs

    rows = []
    by_relation = []
    binding: dict[str, Any] = {}
    swaps: list[dict[str, Any]] = []
    for suite in DIAGNOSED_SUITES:
        if suite in store.suites():
            manifest, index = suite_inputs(store, suite)  # each suite read once for every diagnostic
            if suite == "shapes-sugarcrepe":
                binding = attribute_binding(scorer, store, manifest, index)
            if suite == "shapes-aro":
                swaps = argument_swaps(scorer, store, manifest, index)
            keys = ("category", "relation") if suite in RELATION_SUITES else ("category",)
            groups = energy_breakdowns(scorer, store, manifest, index, suite, keys)
            rows += groups["category"]
            allowed = RELATION_SUITES.get(suite)  # categories shown by relation (None = all)
            by_relation += [r for r in groups.get("relation", []) if allowed is None or r["category"].split(":")[0] in allowed]
    by_kind = []  # the training pairs (what the scorer fits) next to the dev pairs (held out)
    for suite in ("shapes-train", "shapes-dev"):
        if suite in store.suites():
            manifest, index = suite_inputs(store, suite)
            if {"scene", "cf_scene"} <= set(manifest.columns):  # the shapes world's pairs
                by_kind += energy_breakdowns(scorer, store, manifest, index, suite, ("edit_kind",))["edit_kind"]
    by_kind.sort(key=lambda r: (edit_kind_order(r["category"]), r["suite"] != "shapes-train"))
    ground = grounding_precision(scorer, load_pairs(store, "shapes-dev", grounding=True)) if "shapes-dev" in store.suites() else pd.DataFrame()
    (out / "diagnostics.json").write_text(json.dumps({"energy_breakdown": rows, "by_relation": by_relation, "by_edit_kind": by_kind, "grounding": ground.reset_index().to_dict("records"), "attribute_binding": binding, "argument_swaps": swaps}, indent=1) + "\n")
    if not rows:
        return []
    parts = [
        "### Why: the score taken apart (seed 0)",
        "Every (true, negative) pair of a choice suite: how often the score s, the frozen margin g alone and the learned part s − g prefer the true caption, and per energy "
        "the share of pairs where its contribution exp(λ_k)·move_k points to the true caption / its mean absolute size in logits / the accuracy of s with that contribution removed. "
        "An energy near 50% with a large size adds noise; the third number is what the slice would score without it. "
        "What'sUp rows are grouped by the true arrangement. Also in `reports/diagnostics.json` (`pipeline.diagnostics`).",
        _breakdown_table(rows, "category (true)"),
    ]
    if by_relation:
        parts += [
            "The same by the relation each caption states: SugarCrepe attribute swaps by their relation word (plain `swap-att`: captions without one, e.g. \"a yellow circle and an orange cross\"), ARO argument swaps by their relation word, What'sUp pairs by true vs negative arrangement.",
            _breakdown_table(by_relation, "relation"),
        ]
    if by_kind:
        parts += [
            "By edit kind (the kinds of the lesion table), on the training pairs (shapes-train: what the scorer fits) and on the held-out dev pairs: the score, the frozen margin and the learned part, and each energy, per kind. "
            "A kind the learned part gets wrong on its own training pairs is not fitted, so more pairs or regularisation cannot fix it there; one it fits on train but not on dev does not generalise.",
            _breakdown_table(by_kind, "edit kind"),
        ]
    if not ground.empty:
        parts += [
            "Region grounding on shapes-dev: for each word that names exactly one object, the share of its plan mass (non-null cells) inside that object's box, and how often its most compatible patch (argmax of S) is inside, per depth.",
            _df_markdown(ground.map(lambda x: f"{x:.3f}" if isinstance(x, float) else x)),
        ]
    if binding:
        parts += [
            f"Attribute binding on shapes-sugarcrepe {binding['category']} ({binding['items']} items, `pipeline.diagnostics.attribute_binding`): the share of a colour / shape word's plan mass "
            "(depths summed) on its referent's visible patches, for the true caption and for the negative (whose colour words name the other object); the Bhattacharyya overlap of "
            "adjacent colour–shape rows; and how often the true caption wins on those overlaps alone (`acc_bc`), on the order energy over every adjacent pair (`acc_order`), "
            "and on S read over each word's *true* referent patches (`acc_S_referent`: the same words on the same objects, only their context in the caption differs). "
            "A linear probe of the patch grids reads the same items from the *true* visible masks: `reports/bench/probes.json` (`pipeline bench probes`).",
            "| " + " | ".join(k for k in binding if k not in ("category", "items")) + " |\n|" + "---|" * (len(binding) - 2) + "\n| "
            + " | ".join(f"{v:.3f}" for k, v in binding.items() if k not in ("category", "items")) + " |",
        ]
    if swaps:
        parts += [
            "Argument swaps on shapes-aro relation, the planar relations (`pipeline.diagnostics.argument_swaps`): how often the true caption is picked by the plan centroids of its two shape words "
            "(subject against object along the relation's axis, in both captions: what a relation reader with this plan could get), by the centroids of the tokens before and after the relation word "
            "(each weighted by its mass off the null patch, times its span gate: what the spatial energy's relative term reads for that word), by the learned part s − g, and by s. "
            "The gate columns are the true captions' mean span gate (`span_gate`, ours: each token's learned weight in the span means) of their colour, shape and size words, their relation word and their other words.",
            _df_markdown(pd.DataFrame(swaps).set_index("relation").map(lambda x: "–" if pd.isna(x) else f"{x:.3f}" if isinstance(x, float) else x)),
        ]
    return parts


def _breakdown_table(rows: list[dict], group: str) -> str:
    from pipeline.scorers.bindclip import ENERGIES

    lines = [f"| suite | {group} | pairs | s | g alone | s − g | mean abs g | " + " | ".join(ENERGIES) + " |", "|---|---|---|---|---|---|---|" + "---|" * len(ENERGIES)]
    for r in rows:
        cells = " | ".join(f"{100 * r[f'{e}_share_true']:.0f}% / {r[f'{e}_mean_abs']:.3f} / {_pct(r[f'{e}_acc_without'])}" for e in ENERGIES)
        lines.append(f"| {r['suite']} | {r['category']} | {r['pairs']} | {_pct(r['acc_s'])} | {_pct(r['acc_margin'])} | {_pct(r['acc_learned'])} | {r['mean_abs_margin']:.3f} | {cells} |")
    return "\n".join(lines)


def _lesion_cost_markdown(cost: pd.DataFrame) -> str:
    """A lesion-cost table (``analysis.lesion_costs`` or ``lesion_costs_by_kind``) in points:
    item counts when given, the scored checkpoint's difference with its CI and p, then the
    per-seed columns."""
    seeds = [c for c in cost.columns if c.startswith("seed")]
    columns = {"items": [int(n) for n in cost["n"]]} if "n" in cost else {}
    columns["BindCLIP − lesion [95% CI]"] = [f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" for d, lo, hi in zip(cost["diff"], cost["lo"], cost["hi"], strict=True)]
    columns["p"] = [f"{p:.4f}" for p in cost["p"]]
    columns |= {c: [f"{100 * x:+.1f}" for x in cost[c]] for c in seeds}
    return _df_markdown(pd.DataFrame(columns, index=cost.index))


def _df_markdown(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for idx, row in df.iterrows():
        lines.append(f"| {idx} | " + " | ".join(str(v) for v in row.tolist()) + " |")
    return "\n".join(lines)


COUPLING_CATEGORIES = ("swap-att", "swap-att", "swap-obj", "replace-rel")  # one picture row each


def coupling_figure(results: dict[str, Any], store, scorer, out: Path) -> Path | None:
    """Each edited word's plan mass drawn over the image, for both captions of a few items.

    One row per item (the first items of :data:`COUPLING_CATEGORIES` on shapes-sugarcrepe):
    the true caption's edited words, then the negative's (at most two each, shape words
    first), each word's
    plan row over the patch grid (depths summed, normalised) with the box of the object the
    word alone names drawn in green (:func:`pipeline.diagnostics.coupling_maps`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from PIL import Image

    from pipeline.diagnostics import coupling_maps, word_kind

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
        sub.suptitle(f"{item['category']}:  ✓ {true}   ✗ {negative}   s = {item['score']:+.2f}", fontsize=7.5)
        axes = sub.subplots(1, 2 * per_caption)
        for x, cap in enumerate(item["captions"]):
            shown = sorted(cap["words"], key=lambda m: word_kind(m["word"]) != "shape")[:per_caption]  # nouns first
            for k in range(per_caption):
                ax = axes[x * per_caption + k]
                ax.set_xticks([])
                ax.set_yticks([])
                if k >= len(shown):
                    ax.axis("off")
                    continue
                word = shown[k]
                ax.imshow(img)
                ax.imshow(word["rho"], cmap="magma", alpha=0.6, extent=(0, w, h, 0), interpolation="nearest")
                if word["box"] is not None:
                    x0, y0, x1, y1 = word["box"]
                    ax.add_patch(Rectangle((x0 * w, y0 * h), (x1 - x0) * w, (y1 - y0) * h, fill=False, ec="lime", lw=1.2))
                mark = "✓" if x == 0 else "✗"
                ax.set_title(f"{mark} '{word['word']}' (grounded {word['grounded']:.2f})", fontsize=7)
    path = out / "figures" / "coupling.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(cfg: ReportConfig, score: ScoreConfig, extract: ExtractConfig, world: WorldConfig) -> Path:
    out = Path(cfg.out)
    results = load_results(score, extract, world)
    sections = [
        "# Compositionality report (shapes world)",
        f"Encoder `{extract.model}`; variants {', '.join(f'`{v}`' for v in score.variants)}. "
        f"Every number is recomputed by `dvc repro` (or `pipeline report`) from the cached scores. "
        f"Cells: metric in % with a 95% bootstrap CI ({cfg.bootstrap} resamples, seed {cfg.seed}); "
        f"for variants other than `clip`, Δ against `clip` with a paired-bootstrap 95% CI.",
        "## The toy CLIP's failure profile",
        "Frozen global CLIP on the shapes suites next to real ViT-L/14's published numbers "
        "(SugarCrepe paper; ARO and What'sUp via vl_compo). The toy should be strong on "
        "replacements and weak on swaps and spatial relations, like the real one.",
        profile_table(results),
    ]
    long_rows: list[dict] = []
    for suite_name, entry in results.items():
        if not entry["scores"]:
            continue
        table, rows = suite_table(suite_name, entry, cfg)
        long_rows += rows
        sections += [f"## {suite_name}", f"{len(entry['manifest'])} items. {SUITES.get(suite_name).description}", table]
        chance = CHANCE.get(suite_name)
        if chance:
            sections.append("Chance: " + ", ".join(f"{k} {_fmt(v)}" for k, v in chance.items()) + ".")
        fig = examples_figure(suite_name, entry, out, cfg.examples)
        if fig is not None:
            sections.append(f"![examples {suite_name}](figures/{fig.name})")
    sections += bindclip_sections(results, cfg, score, extract, out)
    sections += ["## Performance", bench_section(out)]
    (out / "plots").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(long_rows).to_csv(out / "plots" / "metrics.csv", index=False)
    path = out / "report.md"
    path.write_text("\n\n".join(sections) + "\n")
    return path
