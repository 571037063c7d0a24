"""One training loop for every trainable scorer family, reading the feature cache only.

    from pipeline.training import train_variant
    summary = train_variant(cfg, store)           # cfg: TrainConfig, store: FeatureStore

The loop knows no family: the scorer's ``make_trainer(cfg.objective)`` returns a
:class:`~pipeline.training.trainer.FamilyTrainer` that loads the family's data, computes
one step's loss and scores the dev suite. The loop owns the rest:

* seeds: the scorer is initialised under ``torch.manual_seed(seed)`` and each step draws
  ``batch_size`` items without replacement from a ``torch.Generator`` seeded with ``seed``,
  so one seed gives one set of weights;
* AdamW on the parameters that require gradients, the learning rate set every step by
  ``cfg.lr_schedule`` (``constant``, or ``cosine``: linear warm-up over ``warmup`` steps,
  then cosine decay to 0 at the last step; :func:`pipeline.training.schedule.warmup_cosine`);
* selection: every ``eval_every`` steps, at step 0 and at the last step the dev suite is
  scored and the checkpoint with the best ``mean`` is kept (ties to the earlier step), then
  the family's optional post-training choice runs on dev (BindCLIP's q0);
* splits: ``train_suite`` and ``dev_suite`` are suite selections
  (:class:`~pipeline.benchmarks.base.SuiteSelection`), so one extracted suite can give
  both, e.g. ``coco-families[train]`` and ``coco-families[validation]`` (its image-disjoint
  ``split`` column). The family's ``load`` receives the selection; ``dev_metrics`` and
  ``select`` receive the suite's registry name, whose official metric scores the selected
  rows. Two selections of one suite must name different values of one column;
* caps: ``train_items`` / ``dev_items`` cut the training / dev selection to a seeded sample
  (``sample_seed``, the same sample for every seed), so a suite of 100k+ pairs trains in
  bounded memory and each dev evaluation takes bounded time; ``summary.json`` records the
  selections and how many items each held;
* resume: a periodic ``resume.pt`` (tensors and plain containers, loaded with
  ``weights_only=True``) holds model, optimiser, step, both RNG states, the log and the
  best checkpoint so far, so a crashed run resumes to the same weights if its fingerprint
  matches (the config with ``eval_every``, the seed, the store, the training and dev data:
  each suite's manifest hash and store index, and the package's source); it is removed at
  the end, and a seed finished under the same fingerprint (recorded in its ``config.json``)
  is kept by a rerun, so a run killed during its third seed trains only that one again
  (``dvc.yaml`` persists the checkpoints for this);
* device: the scorer and the family's training and dev data are moved to ``cfg.device``
  once (:func:`pipeline.features.to_device`); checkpoints are written from host copies;
* progress with the live loss; the log of every step (lr, each logged loss) and every dev
  evaluation in ``train_log.json``.

Layout under ``<cfg.out>/<variant>/``: ``seed<k>/{model.safetensors, config.json,
train_log.json}`` per seed; ``model.safetensors`` + ``config.json`` = the first seed's
selected model (what ``pipeline score`` loads); ``summary.json`` = per-seed dev metrics and
their spread, and the seeds scoring reads (a folder of a seed no longer configured is not). ``config.json["scorer_kwargs"]`` are the factory kwargs the scorer is rebuilt
with at scoring time (``cfg.scorer`` plus what the family chose on dev).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import shutil
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pipeline import code_identity
from pipeline.benchmarks.base import SuiteSelection
from pipeline.cache import FeatureStore
from pipeline.cache.schema import encoder_id
from pipeline.config import OptionsError, TrainConfig
from pipeline.features import to_device
from pipeline.files import write_atomically, write_json_atomically
from pipeline.scorers import Scorer, create_scorer
from pipeline.scorers.checkpoints import WEIGHTS_KEY, checkpoint_owner, weights_sha256_of
from pipeline.training.resume import read_finished, read_resume, write_finished
from pipeline.training.schedule import warmup_cosine
from pipeline.training.trainer import FamilyTrainer

log = logging.getLogger(__name__)
RESUME_KEYS = {"fingerprint", "step", "model", "optim", "generator", "torch_rng", "log", "best"}  # what resume.pt holds


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimiser step ``step`` under ``cfg.lr_schedule``."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        return warmup_cosine(step, cfg.lr, cfg.warmup, cfg.steps)
    raise ValueError(f"train.lr_schedule must be 'constant' or 'cosine', got {cfg.lr_schedule!r}")


def data_identity(store: FeatureStore, cfg: TrainConfig) -> dict[str, Any]:
    """What the training and dev data are made of: each suite's manifest hash and a hash of
    its store index (the rows it reads), so a rebuilt world or a re-extracted suite is new
    data even where the configuration is not."""
    out = {}
    for selection in (cfg.train_suite, cfg.dev_suite):
        suite = SuiteSelection.parse(selection).suite
        index = store.suite_index(suite)
        h = hashlib.sha256()
        for name in sorted(index):
            h.update(name.encode() + np.ascontiguousarray(index[name]).tobytes())
        out[suite] = [store.suite_attrs(suite).get("manifest_sha256"), h.hexdigest()[:16]]
    return out


def _fingerprint(cfg: TrainConfig, seed: int, store: FeatureStore, data: dict[str, Any]) -> str:
    """What a seed's training depends on: its configuration (``eval_every`` included, as it
    decides which checkpoints can be selected; not the thread count, device, output folder
    or other seeds), the seed, the feature store, the data (:func:`data_identity`) and the
    code (:func:`code_identity`)."""
    d = asdict(cfg)
    for k in ("seeds", "threads", "out", "device"):
        d.pop(k, None)
    d.update(seed=seed, store=store.root.attrs.get("fingerprint_id"), data=data, code=code_identity())
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _quiet_dev(trainer: FamilyTrainer, model: torch.nn.Module, dev: Any, suite: str) -> dict[str, float]:
    """Dev metrics in eval mode, solver warnings silenced (the training log records them)."""
    was = model.training
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        metrics = trainer.dev_metrics(model, dev, suite)
    model.train(was)
    return {k: round(float(v), 6) for k, v in metrics.items()}


def train_seed(
    cfg: TrainConfig,
    store: FeatureStore,
    trainer: FamilyTrainer,
    train: Any,
    dev: Any,
    seed: int,
    out: Path,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train one seed into ``out`` (``seed<k>/``); returns its config record.

    A seed already trained there under the same fingerprint (:func:`_fingerprint`, kept in
    its ``config.json``) is kept as it is; one interrupted under it resumes from
    ``resume.pt``; anything else starts at step 0. ``stop_after`` stops (without finishing)
    after that many steps, leaving ``resume.pt``: a simulated crash for tests.
    """
    out.mkdir(parents=True, exist_ok=True)
    fp = _fingerprint(cfg, seed, store, data_identity(store, cfg))
    record, unreadable = read_finished(out)
    if unreadable:
        log.warning("%s is unreadable (%s); seed %d is trained again", out / "config.json", unreadable, seed)
    if record is not None and record.get("fingerprint") == fp:
        if record.get(WEIGHTS_KEY) == weights_sha256_of(out):
            log.info("%s seed %d: already trained under this configuration and data (%s); kept", cfg.variant, seed, out)
            return record
        log.warning("%s is not the file its config.json records; seed %d is trained again", out / "model.safetensors", seed)
    torch.manual_seed(seed)
    model = build_model(cfg, store).to(cfg.device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    history: dict[str, Any] = {"steps": [], "dev": []}
    best: dict[str, Any] = {"metric": -math.inf, "step": 0, "state": _state(model), "dev": {}}
    step = 0
    n_items = trainer.n_items(train)
    resume = out / "resume.pt"
    ck, unreadable = read_resume(resume, RESUME_KEYS, cfg.device)
    if unreadable:
        log.warning("%s is unreadable (%s); seed %d starts again at step 0", resume, unreadable, seed)
    if ck is not None:
        if ck.get("fingerprint") == fp:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optim"])
            gen.set_state(ck["generator"].cpu())
            torch.set_rng_state(ck["torch_rng"].cpu())
            step, history, best = ck["step"], ck["log"], ck["best"]
        else:
            log.warning("%s: written under another configuration or other data; seed %d starts again at step 0", resume, seed)

    def save_resume() -> None:
        snapshot = {
            "fingerprint": fp,
            "step": step,
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "generator": gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "log": history,
            "best": best,
        }
        write_atomically(resume, lambda p: torch.save(snapshot, p))

    dev_suite = SuiteSelection.parse(cfg.dev_suite).suite  # the registry name scores the rows

    def evaluate() -> None:
        metrics = _quiet_dev(trainer, model, dev, dev_suite)
        history["dev"].append({"step": step, **metrics})
        if metrics["mean"] > best["metric"]:
            best.update(metric=metrics["mean"], step=step, state=_state(model), dev=metrics)

    if step == 0:
        evaluate()  # step 0 = the initialisation is a candidate too
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.variant} seed {seed}", disable=not progress)
    t0 = time.time()
    while step < cfg.steps:
        if stop_after is not None and step >= stop_after:
            bar.close()
            return {"stopped_at": step}
        batch = torch.randperm(n_items, generator=gen)[: cfg.batch_size]
        with warnings.catch_warnings():  # per-step solver convergence is the family's to log
            warnings.simplefilter("ignore", UserWarning)
            loss, logged = trainer.loss(model, train, batch)
        if not torch.isfinite(loss.detach()):  # a NaN step would poison every later weight, silently
            raise ValueError(
                f"train {cfg.variant} seed {seed}: the loss is {float(loss.detach())} at step {step + 1}; lower "
                f"train.{cfg.variant}.lr or check train.{cfg.variant}.scorer and objective (the last resume point "
                f"is kept in {out})"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lr = learning_rate(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        step += 1
        logged = {"total": float(loss.detach()), **logged}
        history["steps"].append({"step": step, "lr": lr, **{k: round(v, 6) for k, v in logged.items()}})
        bar.update(1)
        shown = {"loss": f"{logged['total']:.3f}", **({"acc": f"{logged['acc']:.2f}"} if "acc" in logged else {})}
        bar.set_postfix(shown)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluate()
            bar.set_postfix(loss=f"{logged['total']:.3f}", dev=f"{history['dev'][-1]['mean']:.3f}")
            if step < cfg.steps:
                save_resume()
    bar.close()
    train_seconds = time.time() - t0

    model.load_state_dict(best["state"])  # the selected checkpoint, then the family's choice
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        chosen = trainer.select(model.eval(), dev, dev_suite)
    final_dev = _quiet_dev(trainer, model, dev, dev_suite)

    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    record = {
        "variant": cfg.variant,
        "seed": seed,
        "selected_step": best["step"],
        "selection": "max dev mean (the dev suite's official metric), earliest step on ties",
        "chosen": chosen["record"],  # what the family chose on dev after selection (e.g. q0)
        "dev": final_dev,
        "scorer_kwargs": {**cfg.scorer, **chosen["scorer_kwargs"]},  # build the scorer with these
        "scorer": asdict(model.config) if dataclasses.is_dataclass(getattr(model, "config", None)) else {},
        "train": asdict(cfg),
        "store": str(store.path),
        "store_encoder": encoder_id(store.fingerprint),  # load_scorer refuses another encoder's store
        "fingerprint": fp,  # a rerun under the same one keeps this seed
        "train_seconds": round(train_seconds, 1),
    }

    def config_text() -> str:
        record[WEIGHTS_KEY] = weights_sha256_of(out)  # load_scorer refuses weights that are not these bytes
        return json.dumps(record, indent=2) + "\n"

    write_finished(out, weights, json.dumps(history) + "\n", config_text)
    if resume.is_file():
        resume.unlink()
    return record


def build_model(cfg: TrainConfig, store: FeatureStore) -> Scorer:
    """``cfg.variant``'s scorer at this store's dims, its ``train.<variant>.scorer`` options
    applied (a refused one named by that key), weights from the current torch seed."""
    return _named_options(cfg, "scorer", lambda: create_scorer(cfg.variant, dims=store.dims, proj=store.projections(), **cfg.scorer))


def _check(cfg: TrainConfig) -> None:
    """Refuse what the loop cannot run, named by its key ``train.<variant>.<key>``."""
    key = f"train.{cfg.variant}"
    owner = checkpoint_owner(cfg.variant)
    if owner != cfg.variant:
        raise ValueError(f"{cfg.variant} reuses the parameters of {owner!r}; train `pipeline train --variant {owner}`")
    if not cfg.seeds:
        raise ValueError(f"{key}.seeds is empty; give at least one seed")
    learning_rate(0, cfg)  # an unknown schedule fails here
    train, dev = SuiteSelection.parse(cfg.train_suite), SuiteSelection.parse(cfg.dev_suite)
    if train.suite == dev.suite and (train.column is None or train.column != dev.column or train.value == dev.value):
        raise ValueError(
            f"{key}.train_suite {cfg.train_suite!r} and {key}.dev_suite {cfg.dev_suite!r} select "
            f"overlapping rows of {train.suite}; name two values of one column, e.g. "
            f"{train.suite}[train] and {train.suite}[validation]"
        )
    if cfg.lr_schedule == "cosine" and cfg.steps == 0:
        raise ValueError(f"{key}.steps is 0 under lr_schedule cosine, which needs steps > warmup; lr_schedule: constant keeps the initial weights")
    if cfg.lr_schedule == "constant" and cfg.warmup:
        raise ValueError(f"{key}.warmup = {cfg.warmup} applies to lr_schedule cosine only; set lr_schedule: cosine, or drop warmup")
    if cfg.lr_schedule == "cosine" and not 0 <= cfg.warmup < cfg.steps:
        raise ValueError(f"{key}.warmup must be in [0, steps) = [0, {cfg.steps}), got {cfg.warmup}")


def _selections(cfg: TrainConfig) -> tuple[SuiteSelection, SuiteSelection]:
    """The training and dev selections, each cut to its seeded sample."""
    train = SuiteSelection.parse(cfg.train_suite).sampled(cfg.train_items, cfg.sample_seed)
    dev = SuiteSelection.parse(cfg.dev_suite).sampled(cfg.dev_items, cfg.sample_seed)
    return train, dev


def check_trainable(variant: str) -> None:
    """Refuse a variant the training loop does not train, before its params are read: an
    unknown name (the registry lists the valid ones), one fitted by a command of its own
    (``ridge-fgw``: ``pipeline ridge``), or one with nothing to train (frozen CLIP, the local
    baselines, an ablation loading another variant's weights)."""
    from pipeline.scorers import SCORERS

    factory = SCORERS.get(variant)
    if getattr(factory, "make_trainer", None) is not None:
        return
    fit = getattr(factory, "fit_command", None)
    if fit:
        raise ValueError(f"{variant} is fitted by `{fit}`, not by `pipeline train`")
    trainable = [name for name in SCORERS.names() if getattr(SCORERS.get(name), "make_trainer", None) is not None]
    raise ValueError(f"{variant} has no trainable parameters; nothing to train (trainable variants: {', '.join(trainable)})")


def make_trainer(cfg: TrainConfig) -> FamilyTrainer:
    """The variant's training hook, built from its ``objective`` options."""
    from pipeline.scorers import SCORERS

    check_trainable(cfg.variant)
    return SCORERS.get(cfg.variant).make_trainer(cfg.objective)


def _named_options(cfg: TrainConfig, key: str, build: Any) -> Any:
    """``build()``, an error in its options naming ``train.<variant>.<key>`` (the family's
    own message names the option)."""
    try:
        return build()
    except (OptionsError, TypeError) as e:
        raise OptionsError(f"train.{cfg.variant}.{key}: {e}") from None


def train_variant(
    cfg: TrainConfig, store: FeatureStore, progress: bool = True, stop_after: int | None = None
) -> dict[str, Any]:
    """Train ``cfg.variant`` for every seed of ``cfg.seeds``; write the checkpoint layout.

    The variant's own ``model.safetensors``, ``config.json`` and ``summary.json`` (the scored
    seed's copy and the seeds' record) are removed before the first seed trains and written
    after the last: a run that stops between leaves no top-level model for `pipeline score`
    to load beside seed folders of another training, so scoring asks for the training to
    finish instead of mixing two runs. Every option (the loop's, the objective's, the
    scorer's) is checked before they are removed, so a refused one leaves them as they were.

    Returns the summary written to ``<cfg.out>/<variant>/summary.json``.
    """
    _check(cfg)
    trainer = _named_options(cfg, "objective", lambda: make_trainer(cfg))  # before any data is loaded
    with torch.random.fork_rng(devices=[]):  # its scorer options too, before the last training's files are
        build_model(cfg, store)  # removed; the global RNG left as it was, so the run draws what it drew
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        train_sel, dev_sel = _selections(cfg)
        train = to_device(trainer.load(store, train_sel, train=True), cfg.device)
        dev = to_device(trainer.load(store, dev_sel, train=False), cfg.device)
        root = Path(cfg.out) / cfg.variant
        for name in ("model.safetensors", "config.json", "summary.json"):  # the last training's, no longer true
            (root / name).unlink(missing_ok=True)
        records = []
        for seed in cfg.seeds:
            rec = train_seed(cfg, store, trainer, train, dev, seed, root / f"seed{seed}", progress, stop_after)
            if "stopped_at" in rec:
                return rec
            records.append(rec)
    finally:
        torch.set_num_threads(threads)

    first = root / f"seed{cfg.seeds[0]}"
    shutil.copyfile(first / "model.safetensors", root / "model.safetensors")
    shutil.copyfile(first / "config.json", root / "config.json")
    spread = {}
    for k in records[0]["dev"]:
        v = np.array([r["dev"][k] for r in records], dtype=float)
        spread[k] = {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()), "max": float(v.max())}
    summary = {
        "variant": cfg.variant,
        "dev_suite": cfg.dev_suite,
        "train_items": {"selection": train_sel.describe(), "items": trainer.n_items(train)},
        "dev_items": {"selection": dev_sel.describe(), "items": trainer.n_items(dev)},
        "scored_seed": cfg.seeds[0],
        "seeds": {
            str(r["seed"]): {"dev": r["dev"], "selected_step": r["selected_step"], "chosen": r["chosen"]}
            for r in records
        },
        "spread": spread,
    }
    write_json_atomically(root / "summary.json", summary)
    return summary
