"""The toy CLIP: a small open_clip model trained contrastively on shapes-world scenes.

Method (CLIP, Radford et al. 2021): an image tower and a text tower map a batch of B
(scene, caption) pairs to unit vectors; the loss is the symmetric InfoNCE over the B x B
cosine-similarity matrix scaled by a learnable temperature ``exp(t)`` (clamped at 100):

    L = 1/2 [CE(s * I T^T, diag) + CE(s * T I^T, diag)],   s = exp(t).

Positive captions and in-batch negatives only (no hard negatives), like CLIP itself: the model
learns what is present and stays weak on what binds to what, real CLIP's failure profile.

Seed: ``seed`` fixes the initialisation, the pool of training scenes (train hash buckets only,
one positive caption each) and the batch order (epoch ``e`` visits the pool in the order
``default_rng([seed, e]).permutation``), so one config gives one set of weights and a resumed
run equals an uninterrupted one.

Where it departs from CLIP, and why:

* Text tower: CLIP's causal transformer (config ``toy-vit``), its positional embedding frozen
  at a small random init (``text_position_std``); its token states localise words as real
  CLIP's do, which the token-level scorers need.
* Vision tower: a convolutional patch stem (``pipeline/encoders/stem.py``) instead of the
  linear patch embedding, and a colourless warm-up: the first ``colourless_steps`` steps draw
  the same scenes with every object white and shapes named bare. The linear embedding of
  objects that straddle patch borders does not learn shape, and since colour alone separates
  most of a batch, neither tower gets a gradient for shape without the warm-up. The stem keeps
  the 8x8 grid and everything extract reads; the warm-up keeps in-batch negatives only.
* The 49k-row token embedding (6.3 M of the text parameters, ~60 rows ever used) is frozen at
  its seeded N(0, 0.02) init, sparing AdamW the dense update of rows no caption uses.
* Images are rendered at the model resolution, so :func:`pixels_from_uint8` is the exact tensor
  equivalent of open_clip's eval transform (identity resize/crop, /255, mean/std).

Outputs in ``cfg.out``: ``model.safetensors`` (what ``load_encoder("toy", checkpoint=...)``
loads), ``config.json`` (resolved config + open_clip model config + identity hash),
``train_log.json`` (loss per logged step, wall time) and, while running, ``resume.pt`` (model
+ optimiser + step, every ``checkpoint_every`` steps; deleted at the end). Both are used only
under the same identity (the config but paths and threads, and the package's code): a rerun
resumes ``resume.pt``, or keeps a finished model whose ``config.json`` records that identity,
and otherwise trains afresh, so the folder can persist across ``dvc repro`` runs.
``resume.pt`` holds only tensors and plain containers (dicts, lists, numbers, strings), so it
is read with ``torch.load(..., weights_only=True)`` and never unpickles arbitrary objects.
Trial history: ``docs/trials.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.config import ToyClipConfig
from pipeline.encoders.stem import VISION_STEMS
from pipeline.files import write_atomically
from pipeline.training.resume import read_finished, read_resume, write_finished
from pipeline.training.schedule import warmup_cosine

BatchFn = Callable[[int, np.ndarray, int], tuple[np.ndarray, list[str]]]

# ------------------------------------------------------------------------------ building blocks


def pixels_from_uint8(
    images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """open_clip's eval transform for images already at the model resolution.

    Args:
        images: [n, H, W, 3] uint8 RGB.
        mean, std: per-channel normalisation (``model.visual.preprocess_cfg``).

    Returns:
        [n, 3, H, W] float32, ``(x / 255 - mean) / std``.
    """
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)  # [n, 3, H, W]
    x = x.float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - m) / s


def clip_loss(img: torch.Tensor, txt: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE with in-batch negatives.

    Args:
        img: [B, D] unit image embeddings.
        txt: [B, D] unit text embeddings (row i is the caption of image i).
        logit_scale: [] log temperature ``t``; logits are ``exp(t) * img @ txt.T``.
    """
    logits = logit_scale.exp() * img @ txt.T  # [B, B]
    labels = torch.arange(img.shape[0])
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def learning_rate(step: int, cfg: ToyClipConfig) -> float:
    """Linear warm-up to ``cfg.lr`` over ``cfg.warmup`` steps, then cosine decay to 0."""
    return warmup_cosine(step, cfg.lr, cfg.warmup, cfg.steps)


def batch_indices(step: int, batch_size: int, pool_size: int, seed: int) -> np.ndarray:
    """Pool rows of batch ``step``: epoch ``e`` visits ``default_rng([seed, e]).permutation``.

    A pure function of its arguments, so a resumed run draws the same batches.
    """
    pos = np.arange(step * batch_size, (step + 1) * batch_size)  # [B] global sample positions
    epochs, offsets = pos // pool_size, pos % pool_size
    out = np.empty(batch_size, dtype=np.int64)
    for e in np.unique(epochs):
        perm = np.random.default_rng([seed, int(e)]).permutation(pool_size)
        out[epochs == e] = perm[offsets[epochs == e]]
    return out


def build_model(cfg: ToyClipConfig) -> torch.nn.Module:
    """The seeded, initialised open_clip model with the frozen parts set (see docstring)."""
    from pipeline.encoders import create_model

    torch.manual_seed(cfg.seed)
    model = create_model(cfg.model)
    with torch.no_grad():
        # frozen positional jitter: a near-bag-of-words text tower (std 0 = exact bag)
        model.positional_embedding.normal_(0.0, cfg.text_position_std)
        model.logit_scale.fill_(math.log(cfg.logit_scale_init))
    model.positional_embedding.requires_grad_(False)
    model.token_embedding.requires_grad_(False)
    return model


def make_optimizers(model: torch.nn.Module, cfg: ToyClipConfig) -> list[torch.optim.Optimizer]:
    """AdamW over the trainable parameters, weight decay on matrices only (as CLIP); a list,
    the shape ``resume.pt`` stores."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 and "embedding" not in name else no_decay).append(p)
    return [torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6,
    )]  # fmt: skip


def _identity(cfg: ToyClipConfig) -> dict[str, Any]:
    """What must match for ``resume.pt`` to be resumed, or a finished model kept: the config
    but paths and threads, the open_clip model config, and the ``pipeline`` package's code
    (:func:`pipeline.code_identity`), which renders the training scenes."""
    import open_clip

    from pipeline import code_identity
    from pipeline.encoders import register_toy_configs

    register_toy_configs()
    d = {k: v for k, v in asdict(cfg).items() if k not in ("out", "threads")}
    d["open_clip_config"] = open_clip.get_model_config(cfg.model)
    d["vision_stem"] = list(VISION_STEMS.get(cfg.model, ()))
    d["code"] = code_identity()
    return d


def _identity_sha256(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def finished_model(out: Path, identity: dict[str, Any]) -> Path | None:
    """``out/model.safetensors`` when it was trained under ``identity`` (its ``config.json``
    records the identity's hash), so a rerun with nothing changed keeps it; else None."""
    record, _ = read_finished(out)  # an unreadable config.json: trained again
    if record is None or record.get("identity_sha256") != _identity_sha256(identity):
        return None
    return out / "model.safetensors"


def _render_pool(
    cfg: ToyClipConfig, image_size: int, batch_fn: BatchFn, progress: bool, desc: str
) -> tuple[np.ndarray, list[str]]:
    """The training pool: [P, H, W, 3] uint8 images and P captions, rendered in chunks."""
    from tqdm.auto import tqdm

    images, captions = [], []
    chunk = 1000
    for start in tqdm(range(0, cfg.pool_size, chunk), desc=desc,
                      disable=not progress, unit_scale=chunk):  # fmt: skip
        idx = np.arange(start, min(start + chunk, cfg.pool_size))
        im, cap = batch_fn(cfg.seed, idx, image_size)
        if im.shape[1:] != (image_size, image_size, 3):
            raise ValueError(
                f"training_batch returned images of shape {im.shape[1:]}, expected "
                f"({image_size}, {image_size}, 3) for model {cfg.model!r}"
            )
        images.append(im)
        captions.extend(cap)
    return np.concatenate(images), captions


# ------------------------------------------------------------------------------ training


def train_toyclip(
    cfg: ToyClipConfig,
    progress: bool = True,
    *,
    batch_fn: BatchFn | None = None,
    colourless_batch_fn: BatchFn | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train the toy CLIP; write ``model.safetensors``, ``config.json``, ``train_log.json``.

    Args:
        cfg: the training config.
        progress: show tqdm bars (rendering, then steps with the running loss).
        batch_fn: ``(seed, indices, image_size) -> (uint8 [n, H, W, 3], captions)``; default
            ``pipeline.world.training_batch``. Tests pass a tiny synthetic world.
        colourless_batch_fn: the same for the first ``cfg.colourless_steps`` steps; default
            ``pipeline.world.colourless_training_batch``.
        stop_after: stop (as a crash would) after this many steps in total, leaving
            ``resume.pt`` and no final outputs; for testing resumption.

    Returns:
        A summary: output paths, steps run, final loss, wall time, whether it resumed.
    """
    import open_clip
    from tqdm.auto import tqdm

    if batch_fn is None:
        from pipeline.world import training_batch as batch_fn
    if colourless_batch_fn is None:
        from pipeline.world import colourless_training_batch as colourless_batch_fn
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    resume_path = out / "resume.pt"
    identity = _identity(cfg)
    kept = finished_model(out, identity)
    if kept is not None and not (out / "resume.pt").exists():
        if progress:
            print(f"toyclip: {kept} was trained with this config and code; kept "
                  f"(delete {out} to train again)")  # fmt: skip
        try:  # informational: a damaged log costs the kept model nothing
            log = json.loads((out / "train_log.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log = {}
        log = log if isinstance(log, dict) else {}
        return {"model": str(kept), "steps": cfg.steps, "kept": True,
                "wall_time_s": log.get("wall_time_s"), "resumed_from": log.get("resumed_from")}  # fmt: skip
    t0 = time.perf_counter()

    model = build_model(cfg).train()
    opts = make_optimizers(model, cfg)
    start, log, elapsed, resumed = 0, [], 0.0, None
    state, unreadable = read_resume(resume_path, {"identity", "step", "model", "optimizers", "log", "elapsed"})
    if unreadable and progress:
        print(f"toyclip: {resume_path} is unreadable ({unreadable}); starting afresh")
    if state is not None:
        if state["identity"] == identity:
            model.load_state_dict(state["model"])
            for opt, opt_state in zip(opts, state["optimizers"], strict=True):
                opt.load_state_dict(opt_state)
            start, log, elapsed, resumed = (
                state["step"],
                state["log"],
                state["elapsed"],
                state["step"],
            )
        elif progress:
            print(f"toyclip: {resume_path} was made with another config; starting afresh")

    pcfg = model.visual.preprocess_cfg
    image_size = int(pcfg["size"][0] if isinstance(pcfg["size"], tuple | list) else pcfg["size"])
    tokenizer = open_clip.get_tokenizer(cfg.model)
    pools = {"full": (batch_fn, "toyclip: render scenes")}
    if cfg.colourless_steps > start:
        pools["colourless"] = (colourless_batch_fn, "toyclip: render colourless scenes")
    images, ids = {}, {}
    for name, (fn, desc) in pools.items():
        images[name], captions = _render_pool(cfg, image_size, fn, progress, desc)
        ids[name] = tokenizer(captions)  # [P, C] int64
        n_tok = (ids[name] != 0).sum(1)
        if int((ids[name][:, -1] != 0).sum()):
            raise ValueError(
                f"captions longer than the context ({ids[name].shape[1]} tokens, max needed "
                f"{int(n_tok.max())}); raise text_cfg.context_length in {cfg.model}"
            )
    n_tok = (ids["full"] != 0).sum(1)

    def save_resume(step: int) -> None:
        snapshot = {"identity": identity, "step": step, "model": model.state_dict(),
                    "optimizers": [o.state_dict() for o in opts], "log": log,
                    "elapsed": elapsed + time.perf_counter() - t0}  # fmt: skip
        write_atomically(resume_path, lambda p: torch.save(snapshot, p))

    bar = tqdm(range(start, cfg.steps), desc="toyclip: train", initial=start, total=cfg.steps,
               disable=not progress)  # fmt: skip
    running = None
    loss = torch.tensor(float("nan"))
    for step in bar:
        for opt in opts:
            for g in opt.param_groups:
                g["lr"] = learning_rate(step, cfg)
        pool = "colourless" if step < cfg.colourless_steps else "full"
        rows = batch_indices(step, cfg.batch_size, cfg.pool_size, cfg.seed)  # [B]
        pixels = pixels_from_uint8(images[pool][rows], pcfg["mean"], pcfg["std"])  # [B, 3, H, W]
        img = model.encode_image(pixels, normalize=True)  # [B, D]
        txt = model.encode_text(ids[pool][rows], normalize=True)  # [B, D]
        loss = clip_loss(img, txt, model.logit_scale)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in opts:
            opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0.0, math.log(100.0))
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        bar.set_postfix(loss=f"{running:.3f}", T=f"{model.logit_scale.detach().exp().item():.1f}")
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            log.append({"step": done, "loss": value, "lr": learning_rate(step, cfg),
                        "logit_scale": model.logit_scale.detach().exp().item()})  # fmt: skip
        if stop_after is not None and done >= stop_after:
            save_resume(done)
            return {"stopped_at": done, "resume": str(resume_path)}
        if done % cfg.checkpoint_every == 0 and done < cfg.steps:
            save_resume(done)
    bar.close()

    wall = elapsed + time.perf_counter() - t0
    model_path = out / "model.safetensors"
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    config = json.dumps(
        {"toyclip": asdict(cfg), "open_clip_model": cfg.model,
         "identity_sha256": _identity_sha256(identity), "code": identity["code"],
         "open_clip_config": identity["open_clip_config"], "vision_stem": identity["vision_stem"],
         "open_clip_version": open_clip.__version__, "torch_version": torch.__version__},
        indent=2)  # fmt: skip
    train_log = json.dumps(
        {"log": log, "wall_time_s": wall, "steps": cfg.steps, "resumed_from": resumed,
         "pool_size": len(ids["full"]), "max_caption_tokens": int(n_tok.max())}, indent=2)  # fmt: skip
    write_finished(out, state, train_log, lambda: config)
    resume_path.unlink(missing_ok=True)
    return {"model": str(model_path), "steps": cfg.steps, "final_loss": loss.item(),
            "wall_time_s": wall, "resumed_from": resumed}  # fmt: skip
