"""Stage-like command `compare-encoders`: the same scorer variants on several encoders.

Orchestration only. For each encoder of ``compare.encoders``: a toy encoder's weights are
trained first (:func:`pipeline.encoders.toyclip.train_toyclip`, the ``toyclip`` section with
the encoder's own open_clip config) unless its checkpoint already holds that config; its
features are extracted into its own store under ``<out>/<encoder>/features`` (outside
``extract.out``, which is the ``extract`` stage's output); every trainable variant is trained on them
through the one training loop (``train.<variant>`` with ``compare.seeds``); every variant is
scored; then :func:`pipeline.report.compare.variant_means` summarises each encoder's
variants into ``<metrics_out>/summary.json`` (with the training step each scored checkpoint
kept, ``selected_steps``), with the sha256 of each compared suite's
manifest, which the report's encoder-comparison section shows only while the manifests it
reads are those. With ``reuse_pipeline`` the pipeline's own encoder (``extract.model``) is read from
what ``dvc repro`` scored, whose first training seed is the same model a one-seed run trains.
``compare.toyclip`` (overrides of the ``toyclip`` section) is checked against the ``toyclip``
section's own schema before the first encoder starts (:func:`toy_settings`), so a bad value
is one line rather than a toy trained with it, or a failure after an earlier encoder's work.
Not a DVC stage: a second toy CLIP would push the default ``dvc repro`` past its time budget.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from pipeline.config import (
    CompareConfig,
    ExtractConfig,
    ParamsError,
    ScoreConfig,
    ToyClipConfig,
    TrainConfig,
    _build,
)
from pipeline.files import write_json_atomically

# The toyclip keys the comparison sets for each toy encoder itself: its open_clip config and
# its checkpoint folder under <compare.out>/<encoder>/toyclip.
PER_ENCODER = ("model", "out")


def toy_settings(cfg: CompareConfig, toyclip: ToyClipConfig) -> ToyClipConfig:
    """The ``toyclip`` section with ``compare.toyclip``'s overrides, validated by the section's
    own schema (strict types and ranges, no unknown key).

    Raises :class:`ParamsError` (one line naming ``compare.toyclip.<key>``, the value and what
    is expected) on an override the ``toyclip`` section would refuse, and on ``model`` or
    ``out``, which the comparison sets per encoder. The ``toyclip`` section itself was checked
    when it was loaded, so every error here is an override's."""
    fixed = [k for k in PER_ENCODER if k in cfg.toyclip]
    if fixed:
        key = fixed[0]
        raise ParamsError(
            f"compare.toyclip.{key} = {cfg.toyclip[key]!r}: set per encoder by the comparison (model: the encoder's "
            "open_clip config, out: <compare.out>/<encoder>/toyclip); remove it"
        )
    valid = [f.name for f in fields(ToyClipConfig) if f.name not in PER_ENCODER]
    unknown = [str(k) for k in cfg.toyclip if k not in valid]
    if unknown:
        raise ParamsError(f"unknown key compare.toyclip.{unknown[0]} (valid: {', '.join(valid)})")
    try:
        return _build(ToyClipConfig, {**asdict(toyclip), **cfg.toyclip}, "compare.toyclip")
    except ParamsError as e:  # _build blames "the command line"; the values are compare.toyclip's
        raise ParamsError(str(e).removeprefix("the command line: ")) from None


def toy_weights(cfg: CompareConfig, toyclip: ToyClipConfig, encoder: str, open_clip_model: str, progress: bool) -> str:
    """The toy encoder's checkpoint under ``<cfg.out>/<encoder>/toyclip``, through
    :func:`pipeline.encoders.toyclip.train_toyclip`, which keeps the model there when it was
    trained with this configuration, open_clip config and code (the scenes it renders
    included) and trains it again otherwise, as the ``toyclip`` stage does.

    Args:
        toyclip: the settings :func:`toy_settings` resolved (``compare.toyclip`` applied).
    """
    from pipeline.encoders.toyclip import train_toyclip

    tcfg = replace(toyclip, model=open_clip_model, out=str(Path(cfg.out) / encoder / "toyclip"))
    train_toyclip(tcfg, progress=progress)
    return str(Path(tcfg.out) / "model.safetensors")


def run(
    cfg: CompareConfig,
    toyclip: ToyClipConfig,
    extract: ExtractConfig,
    train: dict[str, TrainConfig],
    score: ScoreConfig,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the comparison; returns (and writes) the summary.

    Args:
        train: the ``train.<variant>`` configs of the trainable variants among ``cfg.variants``.
    """
    from pipeline.encoders import ENCODERS
    from pipeline.report.compare import variant_means
    from pipeline.scorers import SCORERS
    from pipeline.scorers.checkpoints import scored_steps
    from stages import extract as extract_stage
    from stages import score as score_stage
    from stages import train as train_stage
    from stages.report import load_results

    if len(cfg.encoders) < 2 or len(set(cfg.encoders)) != len(cfg.encoders):
        raise ValueError(f"compare.encoders needs at least two distinct encoders, got {cfg.encoders}")
    specs = {e: ENCODERS.get(e) for e in cfg.encoders}
    for v in cfg.variants:
        SCORERS.get(v)
    if not cfg.variants or not cfg.suites:
        raise ValueError("compare.variants and compare.suites must each name at least one entry; nothing to compare")
    unknown = sorted(set(cfg.suites) - set(score.suites) - set(extract.suites))
    if unknown:
        raise ValueError(f"compare.suites {unknown} are neither extracted nor scored by the pipeline")
    unknown = sorted(set(cfg.pretrained) - set(cfg.encoders))
    if unknown:  # a misspelt encoder's weights would silently not apply
        raise ValueError(f"compare.pretrained names {unknown}, not among compare.encoders ({', '.join(cfg.encoders)})")
    toy = toy_settings(cfg, toyclip)  # checked before any encoder's work starts
    summary: dict[str, Any] = {"variants": list(cfg.variants), "suites": list(cfg.suites), "encoders": {}}
    for enc, spec in specs.items():
        t0 = time.perf_counter()
        sc = replace(
            score,
            encoder=enc,
            variants=list(cfg.variants),
            suites=list(cfg.suites),
            seed_variants=[],
            seed_suites=[],  # no per-seed runs here; the pipeline's own may name other suites
            replacements=[],
            replacement_variants=[],
            checkpoints=str(Path(cfg.out) / enc / "checkpoints"),
            scores_out=str(Path(cfg.out) / enc / "scores"),
            metrics_out=str(Path(cfg.metrics_out) / enc),
        )
        reused = cfg.reuse_pipeline and enc == extract.model
        if reused:
            ext = extract
            sc = replace(sc, checkpoints=score.checkpoints, scores_out=score.scores_out, metrics_out=score.metrics_out)
        else:
            features = str(Path(cfg.out) / enc / "features")  # never inside the pipeline's own store folder
            if spec.toy:
                ckpt = toy_weights(cfg, toy, enc, spec.open_clip_model, progress)
                ext = replace(extract, model=enc, checkpoint=ckpt, out=features)
            else:
                ext = replace(extract, model=enc, pretrained=cfg.pretrained.get(enc, extract.pretrained), out=features)
            extract_stage.run(ext, progress=progress)
            for variant in cfg.variants:
                if variant in train:
                    tc = replace(train[variant], encoder=enc, seeds=list(cfg.seeds), out=sc.checkpoints)
                    train_stage.run(tc, ext, progress=progress)
            score_stage.run(sc, ext, progress=progress)
        results = load_results(sc, ext)
        summary["encoders"][enc] = {
            "open_clip_model": spec.open_clip_model,
            "reused_pipeline_scores": reused,
            "scores": sc.scores_out,
            "metrics": sc.metrics_out,
            "seconds": round(time.perf_counter() - t0, 1),
            "variants": variant_means(results, cfg.variants, n_resamples=cfg.bootstrap, seed=cfg.seed),
            "selected_steps": {v: s["step"] for v, s in scored_steps(sc.checkpoints, [v for v in cfg.variants if v in train]).items()},
        }
    summary["manifests"] = {s: e["manifest_sha256"] for s, e in results.items() if s in cfg.suites}  # one world for all
    out = Path(cfg.metrics_out) / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    summary["config"] = dataclasses.asdict(cfg)
    write_json_atomically(out, summary, indent=1)
    return summary
