"""Stage `score`: evaluate scorers on suites straight from the feature cache.

I/O and orchestration only: the store is opened (and checked) by
:func:`pipeline.cache.open_store`, trained scorers are rebuilt by
:mod:`pipeline.scorers.checkpoints`, items are scored by :mod:`pipeline.scoring`. Per-item
scores go to Parquet under ``cache/scores``; metrics to
``reports/metrics/<variant>/<suite>.json`` (DVC metrics files).

``cfg.replacements`` (e.g. ``["shuffle", "fixed"]``, Flow-CLIP's image-replacement test)
also scores every choice suite with each item's image replaced
(:func:`pipeline.scoring.replacement_images`), written as variant ``<variant>@<mode>``;
``cfg.replacement_variants`` narrows which variants (default: all);
retrieval suites and the per-seed runs (``<variant>@seed<k>``) are not replaced. Retrieval
rerankers shortlist with their base scorer, loaded like any scored variant (a trained base
from its checkpoint).

``cfg.seed_variants`` are scored again per training seed (``<variant>@seed<k>``) on
``cfg.seed_suites`` (default: every suite), for the report's seed spreads. The main run's
checkpoint is the first seed's, so a seed folder with byte-identical weights and options
gets the main run's outputs copied under its name instead of a second, identical scoring.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import Suite
from pipeline.cache import StaleCacheError, open_store
from pipeline.config import ExtractConfig, ScoreConfig
from pipeline.files import write_json_atomically
from pipeline.manifests import file_sha256, manifest_coverage, resolve_source
from pipeline.scorers import SCORERS
from pipeline.scorers.checkpoints import build_scorer, checkpoint_dir, load_scorer, seed_checkpoints
from pipeline.scoring import (
    READ_CACHE_BYTES,
    REPLACEMENTS,
    drop_missing,
    replacement_images,
    score_choice,
    score_retrieval,
    skip_reasons,
    suite_inputs,
    text_only_metrics,
    write_scores,
)

log = logging.getLogger(__name__)


def write_outputs(cfg: ScoreConfig, suite: Suite, variant: str, encoder: str, manifest: pd.DataFrame, scores: np.ndarray, skipped: dict[str, int] | None = None, extra: dict[str, float] | None = None, truncation: dict[str, int] | None = None, store_id: str | None = None, manifest_sha256: str | None = None, categories: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Per-item scores (Parquet, recording the encoder, the store's ``fingerprint_id``
    ``store_id`` and the manifest's ``manifest_sha256`` they were scored from) and the metrics
    file (JSON); returns the metrics record.

    Args:
        skipped: items left out, per reason (:func:`pipeline.scoring.skip_reasons`).
        truncation: the suite's ``n_truncated`` captions, its ``n_truncation_ties`` items and
            its ``n_identical_options`` items (recorded at extract).
        categories: the categories present and missing of a suite with one file per category
            (:func:`pipeline.manifests.manifest_coverage`), written as ``categories_present`` and
            ``categories_missing``: its aggregates pool only the present ones.
    """
    skipped = skipped or {}
    scores_path = Path(cfg.scores_out) / variant / f"{suite.name}.parquet"
    table = pd.DataFrame(
        {
            "item_id": manifest["item_id"].astype(str).to_numpy(),
            "category": manifest["category"].astype(str).to_numpy(),
            "scores": [row[~np.isnan(row)].tolist() for row in scores],
        }
    )
    write_scores(table, scores_path, encoder, store_id, manifest_sha256)
    record = {
        "suite": suite.name,
        "variant": variant,
        "encoder": encoder,
        "n_items": int(len(manifest)),
        "n_skipped": int(sum(skipped.values())),  # items left out of every metric
        "skipped": skipped,  # ... per reason
        "n_missing_images": int(skipped.get("image_missing", 0)),  # items left out because their image was missing
        **{k: int(v) for k, v in (truncation or {}).items()},  # captions cut to the context, items tied by it
        **({f"categories_{k}": list(categories[k]) for k in ("present", "missing")} if categories else {}),
        "metrics": {k: round(float(v), 6) for k, v in {**suite.metrics(manifest, scores), **(extra or {})}.items()},
    }
    return write_metrics(cfg, record)


def write_metrics(cfg: ScoreConfig, record: dict[str, Any]) -> dict[str, Any]:
    """``<metrics_out>/<variant>/<suite>.json`` (a DVC metrics file) of one record; returns it."""
    path = Path(cfg.metrics_out) / record["variant"] / f"{record['suite']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, record)
    return record


def check_names(cfg: ScoreConfig, params: str | Path | None = None, variants_key: str | None = None) -> None:
    """Refuse a variant no scorer has: in ``variants`` (named ``variants_key``, e.g.
    ``--variant``, when they came from elsewhere than the params file), and in
    ``seed_variants``, ``replacement_variants`` or ``options``, where a typo would otherwise score
    nothing, or the wrong set, in silence; a key of the params file is named with ``params``
    when given."""
    where = f"{params}: " if params is not None else ""
    SCORERS.check_known(cfg.variants, variants_key or f"{where}score.variants")
    for key in ("seed_variants", "replacement_variants", "options"):
        SCORERS.check_known(getattr(cfg, key), f"{where}score.{key}")


def check_selection(cfg: ScoreConfig) -> None:
    """Refuse replacement or per-seed variants that ``score.variants`` lacks, and per-seed
    suites that ``score.suites`` lacks: each of those lists picks among what is scored (a
    per-seed run copies its variant's main scores where the weights are the same), so an
    entry outside it would be scored by one process and dropped by a cluster's tasks."""
    for key, names, within in (("replacement_variants", cfg.replaced, "variants"), ("seed_variants", cfg.seed_variants, "variants"),
                               ("seed_suites", cfg.seed_suites, "suites")):  # fmt: skip
        unknown = sorted(set(names) - set(getattr(cfg, within)))
        if unknown:
            raise ValueError(f"score.{key} {unknown} are not in score.{within}")


def refuse_own_training_items(variant: str, cfg: ScoreConfig) -> None:
    """Refuse to score a fitted map on the suite it was fitted on (the ``train_suite`` that
    ``pipeline ridge``'s record names): its retrieval figures there would be measured on its
    own training items. (A trained family may be scored on its training suite, as a diagnostic
    of the fit; its records keep the suite under ``train``.)"""
    record_path = checkpoint_dir(variant, cfg.checkpoints) / "config.json"
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):  # absent or damaged: load_scorer names it, if the variant is trained
        return
    if not isinstance(record, dict):
        return
    fitted = record.get("train_suite")
    if fitted in cfg.suites:
        raise ValueError(
            f"{variant} was fitted on {fitted} ({record_path}), which score.suites also scores: its figures there would "
            f"be on its own training items; drop {fitted} from score.suites, or refit {variant} on a training split"
        )


def seeds_to_score(variant: str, cfg: ScoreConfig, store) -> list[Path]:
    """The per-seed checkpoint folders of a ``score.seed_variants`` entry; a variant with none
    is refused (an untrained scorer has no seeds, a trained one has not been trained here), as
    it would otherwise add nothing to the seed spreads without a word."""
    folders = seed_checkpoints(variant, cfg.checkpoints)
    if folders:
        return folders
    scorer = build_scorer(variant, store, cfg.options.get(variant))
    if not scorer.trainable or scorer.fit_command is not None:  # untrained, or fitted once (`pipeline ridge`)
        raise ValueError(f"score.seed_variants lists {variant}, which is not trained per seed, so it has no per-seed scores; list variants `pipeline train` trains")
    how = f"pipeline train --variant {checkpoint_dir(variant, cfg.checkpoints).name}"
    raise ValueError(
        f"score.seed_variants lists {variant}, but {checkpoint_dir(variant, cfg.checkpoints)} holds no finished "
        f"training's per-seed checkpoints (summary.json and seed<k>/model.safetensors); run `{how}`, or drop "
        f"{variant} from score.seed_variants"
    )


def run(cfg: ScoreConfig, extract: ExtractConfig, progress: bool = True) -> list[dict[str, Any]]:
    """Score every (variant, suite) of ``cfg`` and write scores + metrics; with
    ``cfg.replacements``, every (variant, choice suite) again per replacement mode."""
    if not cfg.variants or not cfg.suites:
        raise ValueError("score.variants and score.suites must each name at least one entry; nothing to score")
    check_names(cfg)
    for variant in cfg.variants:
        refuse_own_training_items(variant, cfg)
    for mode in cfg.replacements:
        if mode not in REPLACEMENTS:
            raise ValueError(f"unknown score.replacements entry {mode!r}; valid: {', '.join(REPLACEMENTS)}")
    check_selection(cfg)
    replaced = set(cfg.replaced)
    suites = [SUITES.get(s) for s in cfg.suites]
    seed_suites = set(cfg.seed_suites or cfg.suites)
    store = open_store(extract).cache_reads(READ_CACHE_BYTES)  # every variant and mode rereads each suite
    for variant in sorted(set(cfg.options) - set(cfg.variants)):  # options kept for a later run: valid now too
        build_scorer(variant, store, cfg.options[variant])
    store_id = store.root.attrs.get("fingerprint_id")
    runs = [(v, v, None) for v in cfg.variants]  # (name in outputs, registry key, checkpoint)
    for variant in cfg.seed_variants:
        runs += [(f"{variant}@{d.name}", variant, d) for d in seeds_to_score(variant, cfg, store)]
    records = []
    scored: dict[str, list[dict[str, Any]]] = {}  # variant -> the records of its main run
    for name, variant, ckpt in runs:
        if ckpt is not None and variant in scored and same_weights(ckpt, checkpoint_dir(variant, cfg.checkpoints)):
            records += [copy_outputs(cfg, r, name) for r in scored[variant] if "@" not in r["variant"] and r["suite"] in seed_suites]
            continue  # the main checkpoint is this seed's (the first seed's): same scores
        scorer = load_scorer(variant, store, cfg.checkpoints, ckpt, options=cfg.options.get(variant))
        if not scorer.reranker:  # rerankers and their prepared objects stay on the host
            scorer.to(cfg.device)
        first = len(records)
        base = None  # a reranker's base scorer, loaded on its first retrieval suite
        for suite in suites:
            if (ckpt is not None and suite.name not in seed_suites) or not scorable(scorer, suite):
                continue
            source = resolve_source(suite.name, extract.world, extract.manifests, extract.image_roots)
            manifest, index = suite_inputs(store, suite.name, source.manifest)
            attrs = store.suite_attrs(suite.name)
            check_image_root(store, suite.name, attrs, source.image_root)
            skipped = skip_reasons(manifest, index, attrs, suite.image_columns)
            truncation = {k: attrs[k] for k in ("n_truncated", "n_truncation_ties", "n_identical_options") if k in attrs}
            extra = text_only_metrics(suite, store, manifest, index)  # captions only: every item
            categories = manifest_coverage(source.manifest, suite, manifest)  # before items are dropped
            manifest, index, n_missing = drop_missing(manifest, index)
            if manifest.empty:
                raise ValueError(
                    f"no item of {suite.name} can be scored: all {n_missing} lack a usable image at extract "
                    f"({', '.join(f'{k}: {v}' for k, v in skipped.items())}); fix the images under {source.image_root}"
                )
            if n_missing:
                log.warning("%s: %d item(s) without a usable image are left out of every metric (%s)", suite.name, n_missing, skipped)
            if suite.task == "retrieval":
                if scorer.reranker and base is None:
                    base = load_scorer(scorer.base, store, cfg.checkpoints).to(cfg.device)
                scores = score_retrieval(scorer, store, manifest, index, cfg.batch_size, base=base, suite=suite.name)
            else:
                desc = f"{name} {suite.name}" if progress else ""
                scores = score_choice(scorer, store, index, cfg.batch_size, desc, reference=suite.pairwise_reference)
            sha = attrs.get("manifest_sha256")  # the configured manifest's: suite_inputs refuses another
            records.append(write_outputs(cfg, suite, name, extract.model, manifest, scores, skipped, extra, truncation, store_id, sha, categories))
            if suite.task == "retrieval" or ckpt is not None or name not in replaced:
                continue  # image replacement: choice suites, the replaced variants (not per seed)
            for mode in cfg.replacements:
                images = replacement_images(index, mode, cfg.replacement_seed)
                desc = f"{name}@{mode} {suite.name}" if progress else ""
                scores = score_choice(scorer, store, index, cfg.batch_size, desc, images=images, reference=suite.pairwise_reference)
                records.append(write_outputs(cfg, suite, f"{name}@{mode}", extract.model, manifest, scores, skipped, extra, truncation, store_id, sha, categories))
        if ckpt is None and len(records) == first:  # never silent: say what it can score
            raise nothing_to_score(variant, scorer, cfg.suites)
        if ckpt is None:
            scored[variant] = records[first:]
    return records


def scorable(scorer, suite: Suite) -> bool:
    """Whether ``scorer`` gives ``suite`` scores: a retrieval suite needs a per-caption scorer
    (a pairwise caption scorer ranks no images), a choice suite one that scores options (the
    retrieval-only rerankers read object boxes and phrases that choice suites lack)."""
    return not scorer.pairwise if suite.task == "retrieval" else scorer.scores_choices


def nothing_to_score(variant: str, scorer, suites: list[str]) -> ValueError:
    """The refusal of a variant none of ``suites`` (``score.suites``) gives scores to."""
    can = "retrieval suites only" if not scorer.scores_choices else "choice suites only"
    return ValueError(f"{variant} scores {can}, and score.suites ({', '.join(suites)}) has none; add one or drop {variant} from score.variants")


def variant_suites(cfg: ScoreConfig, store) -> dict[str, list[str]]:
    """Each of ``cfg.variants``' suites of ``cfg.suites`` that it scores (:func:`scorable`),
    for a cluster's one task per (variant, suite); a variant with none is refused as
    :func:`run` refuses it."""
    plan = {}
    for variant in cfg.variants:
        scorer = build_scorer(variant, store, cfg.options.get(variant))
        plan[variant] = [s for s in cfg.suites if scorable(scorer, SUITES.get(s))]
        if not plan[variant]:
            raise nothing_to_score(variant, scorer, cfg.suites)
    return plan


def check_image_root(store, suite: str, attrs: dict[str, Any], configured: Path) -> None:
    """Refuse to score a suite whose store rows were encoded from another image folder than
    the one configured (``extract.image_roots``): the scores would be of those images."""
    recorded = attrs.get("image_root")
    if recorded is not None and Path(recorded).resolve() != Path(configured).resolve():
        raise StaleCacheError(
            f"{suite}: {store.path} was extracted from the images under {recorded}, but the "
            f"configuration names {configured}; rerun `pipeline extract` with this configuration"
        )


def same_weights(a: Path, b: Path) -> bool:
    """Whether two checkpoint folders hold byte-identical weights and scorer options."""
    for f in ("model.safetensors", "config.json"):
        fa, fb = Path(a) / f, Path(b) / f
        if fa.is_file() != fb.is_file() or (fa.is_file() and file_sha256(fa) != file_sha256(fb)):
            return False
    return (Path(a) / "model.safetensors").is_file()


def copy_outputs(cfg: ScoreConfig, record: dict[str, Any], name: str) -> dict[str, Any]:
    """Write one run's scores and metrics again under variant ``name`` (same weights)."""
    src = Path(cfg.scores_out) / record["variant"] / f"{record['suite']}.parquet"
    dst = Path(cfg.scores_out) / name / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return write_metrics(cfg, {**record, "variant": name})
