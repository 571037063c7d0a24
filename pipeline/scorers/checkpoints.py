"""Loading trained scorers: where a variant's checkpoint lives and how it is rebuilt.

    from pipeline.scorers.checkpoints import load_scorer
    scorer = load_scorer("bindclip-lesion", store, "cache/checkpoints")

A trained variant's weights live under ``<checkpoints>/<owner>/`` (``model.safetensors`` +
``config.json``), where ``owner`` is the variant itself or, for an ablation that shares
the trained parameters (``bindclip-lesion``), the variant named by its factory's
``checkpoint_variant``. ``config.json["scorer_kwargs"]`` are the factory options chosen at
training time (e.g. BindCLIP's q0), so a scorer is rebuilt exactly as it was selected.
Per-seed models sit in ``seed<k>/`` beside the scored one; :func:`scored_steps` says which
training step each scored checkpoint kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.cache import FeatureStore
from pipeline.cache.schema import encoder_id
from pipeline.scorers.base import SCORERS, Scorer, create_scorer


def checkpoint_owner(variant: str) -> str:
    """The trained variant whose parameters ``variant`` loads (itself unless declared)."""
    return getattr(SCORERS.get(variant), "checkpoint_variant", None) or variant


def checkpoint_dir(variant: str, checkpoints: str | Path) -> Path:
    """Where a trained variant's weights live; ablations of a trained scorer (e.g.
    ``bindclip-lesion``) declare ``checkpoint_variant`` and share its locked parameters."""
    return Path(checkpoints) / checkpoint_owner(variant)


def build_scorer(variant: str, store: FeatureStore, options: dict | None = None) -> Scorer:
    """``variant``'s factory called with this store's dims and projections and ``options``
    (``score.options.<variant>``), its weights untrained; an option the factory does not take
    or a value it refuses is one ``ValueError`` naming ``score.options.<variant>``."""
    options = dict(options or {})
    try:
        scorer = create_scorer(variant, dims=store.dims, proj=store.projections(), **options)
        if scorer.reranker:
            check_base(scorer, store)
        return scorer
    except TypeError as e:  # an option its factory does not take: the user's typo, named
        raise ValueError(f"score.options.{variant} = {options}: {e}") from None
    except (ValueError, KeyError) as e:  # a value the factory refuses (k: -1), named by its key
        if not options:
            raise
        raise ValueError(f"score.options.{variant} = {options}: {e}") from None


def check_base(reranker: Scorer, store: FeatureStore) -> None:
    """Refuse a reranker whose ``base`` is not a registered per-caption scorer (an unknown
    name, a pairwise caption scorer, another reranker): the shortlist is the base's ranking
    of the whole gallery, which only a per-caption scorer gives."""
    base = create_scorer(reranker.base, dims=store.dims, proj=store.projections())
    if base.pairwise or base.reranker:
        kind = "a pairwise caption scorer" if base.pairwise else "a reranker"
        raise ValueError(f"base {reranker.base!r} is {kind}; the shortlist needs a per-caption scorer (e.g. clip)")


WEIGHTS_KEY = "weights_sha256"  # config.json: the sha256 of the model.safetensors beside it


def weights_sha256_of(folder: Path) -> str:
    """The sha256 of ``folder/model.safetensors``, recorded in its ``config.json`` when it is
    written: a checkpoint damaged later (flipped bits keep its size and header) is refused."""
    from pipeline.manifests import file_sha256

    return file_sha256(Path(folder) / "model.safetensors")


def load_scorer(
    variant: str, store: FeatureStore, checkpoints: str | Path, ckpt_dir: Path | None = None, options: dict | None = None,
    check_fitted_on: bool = True,
) -> Scorer:
    """Build ``variant`` for this store; ``options`` are its factory's keyword options
    (``score.options``); trained scorers load their checkpoint and the options chosen at
    training time (``config.json`` ``scorer_kwargs``, e.g. q0); an option that sets one of those
    to another value is refused, since it could not apply. A checkpoint fitted on features this
    store does not hold is refused (:func:`_check_fitted_on`), unless ``check_fitted_on`` is
    False: ``pipeline bench`` times the trained scorers on a stand-in store of random-init
    features, where only the time counts (the weights file is still checked)."""
    options = dict(options or {})
    scorer = build_scorer(variant, store, options)
    if not scorer.trainable:
        return scorer.eval()
    from safetensors.torch import load_file

    ckpt_dir = ckpt_dir or checkpoint_dir(variant, checkpoints)
    ckpt = ckpt_dir / "model.safetensors"
    how = scorer.fit_command or f"pipeline train --variant {ckpt_dir.name}"
    if not ckpt.is_file():
        raise FileNotFoundError(f"{variant} is trained but {ckpt} does not exist; run `{how}`")
    config = ckpt_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"{ckpt} ({variant}) has no {config.name} beside it: without its record of what it was fitted on "
            f"(store, suite, options) it cannot be checked against this store; rerun `{how}`"
        )
    try:
        record = json.loads(config.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{config} ({variant}) is damaged ({e}); rerun `{how}`") from None
    if not isinstance(record, dict):
        raise ValueError(f"{config} ({variant}) is damaged (not a JSON object); rerun `{how}`")
    if not isinstance(record.get("scorer_kwargs"), dict):  # every record training and `pipeline ridge` write has it
        raise ValueError(
            f"{config} ({variant}) records no scorer_kwargs (the options the scorer was selected with), so it "
            f"cannot be rebuilt as it was fitted: the record is incomplete or was replaced; rerun `{how}`"
        )
    if check_fitted_on:
        _check_fitted_on(record, store, ckpt, variant, how)
    recorded = record.get(WEIGHTS_KEY)  # a record written by hand (or by older code) has none: unchecked
    if recorded is not None and weights_sha256_of(ckpt_dir) != recorded:
        raise ValueError(
            f"{ckpt} ({variant}) is not the file its {config.name} records (sha256 {recorded[:16]}..., the file's "
            f"{weights_sha256_of(ckpt_dir)[:16]}...): it was damaged or replaced after training; rerun `{how}`"
        )
    kwargs = record["scorer_kwargs"]
    overridden = {k: (v, kwargs[k]) for k, v in options.items() if k in kwargs and kwargs[k] != v}
    if overridden:  # the fitted scorer keeps the options it was selected with: a score option would not apply
        said = "; ".join(f"{k} = {v!r} (fitted with {w!r})" for k, (v, w) in overridden.items())
        raise ValueError(
            f"score.options.{variant} sets {said}, but {ckpt_dir} keeps the options it was fitted with "
            f"({config.name} scorer_kwargs); drop them from score.options.{variant}, or refit with them (`{how}`)"
        )
    if kwargs:
        scorer = create_scorer(variant, dims=store.dims, proj=store.projections(), **{**options, **kwargs})
    try:  # a truncated file, or tensors of another shape or name than this scorer's
        scorer.load_state_dict(load_file(ckpt))
    except Exception as e:  # safetensors' SafetensorError derives from Exception only
        why = " ".join(str(e).split()) or type(e).__name__  # torch's list of mismatches, on one line
        why = why if len(why) <= 300 else why[:297] + "..."
        raise ValueError(f"{ckpt} ({variant}) cannot be loaded ({why}); rerun `{how}`") from None
    return scorer.eval()


def _check_fitted_on(record: dict, store: FeatureStore, ckpt: Path, variant: str, how: str) -> None:
    """Refuse a checkpoint fitted on features this store does not hold: ``store_encoder``
    (trained variants: their weights sit on this encoder's features and are combined with
    its frozen projections, so any store of the same encoder, weights and layers serves) or
    ``store_fingerprint`` (the ridge map: fitted on the store's object embeddings, which its
    options, e.g. re-encoded crops, change), and, where the record names its ``train_suite``,
    that suite's manifest as the store holds it now (``manifest_sha256``: a fit on rows the
    store no longer holds is stale); ``how`` is the command that refits it."""
    checks = (
        ("store_encoder", encoder_id(store.fingerprint), "features of another encoder"),
        ("store_fingerprint", store.root.attrs.get("fingerprint_id"), "another feature store"),
    )
    for key, have, what in checks:
        fitted_on = record.get(key)
        if fitted_on is not None and fitted_on != have:
            raise ValueError(
                f"{ckpt} ({variant}) was fitted on {what} ({key} {fitted_on}, this store's {have} at "
                f"{store.path}); rerun `{how}` on this store"
            )
    suite = record.get("train_suite")
    if suite is not None and record.get("manifest_sha256") is not None:
        have = store.suite_attrs(suite).get("manifest_sha256") if suite in store.suites() else None
        if have != record["manifest_sha256"]:
            now = f"this store's {suite} is manifest {have}" if have else f"this store no longer holds {suite}"
            raise ValueError(
                f"{ckpt} ({variant}) was fitted on another {suite} manifest ({record['manifest_sha256']}; {now} "
                f"at {store.path}); rerun `{how}`"
            )


def seed_checkpoints(variant: str, checkpoints: str | Path) -> list[Path]:
    """Per-seed checkpoint folders of a trained variant (``<dir>/seed<k>/``): the seeds its
    ``summary.json`` lists (the last training's), so a seed folder left by an earlier run
    with more seeds is not read as this one's; none without a summary, which training writes
    once every seed has finished (the folders of an unfinished training may mix two runs)."""
    root = checkpoint_dir(variant, checkpoints)
    summary = root / "summary.json"
    if not summary.is_file():
        return []
    try:
        seeds = json.loads(summary.read_text(encoding="utf-8")).get("seeds", {})
        if not isinstance(seeds, dict | list):
            raise ValueError(f"'seeds' is {type(seeds).__name__}, not the seeds")
    except (OSError, ValueError, AttributeError) as e:  # not JSON, or not training's summary
        raise ValueError(
            f"{summary} is not a training summary ({' '.join(str(e).split())}); rerun `pipeline train --variant {variant}`"
        ) from None
    folders = [root / f"seed{k}" for k in seeds]
    return sorted(p for p in folders if (p / "model.safetensors").is_file())


def scored_steps(checkpoints: str | Path, variants: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``{variant: {"seed": seed, "step": step}}``: the checkpoint each trained variant is
    scored with (``<variant>/config.json``, the record beside the weights the scorer loads;
    without its ``selected_step``, the ``summary.json`` entry for ``scored_seed``, the first
    seed listed when that is absent). Variants with neither are left out. Step 0 is the
    initialisation dev selection kept, so a report must not read that variant's rows as an
    effect of training (a Flow-CLIP variant at step 0 scores exactly as ``clip``)."""
    out: dict[str, dict[str, Any]] = {}
    for v in variants:
        config, summary = Path(checkpoints) / v / "config.json", Path(checkpoints) / v / "summary.json"
        record = json.loads(config.read_text()) if config.is_file() else {}
        if "selected_step" in record:
            out[v] = {"seed": str(record.get("seed", "")), "step": int(record["selected_step"])}
        elif summary.is_file():
            record = json.loads(summary.read_text())
            seeds = record.get("seeds", {})
            seed = str(record.get("scored_seed", next(iter(seeds), "")))
            if seed in seeds:
                out[v] = {"seed": seed, "step": int(seeds[seed]["selected_step"])}
    return out
