"""Each scorer from the cache against re-encoding, batched as CLIP_benchmark does.

    from pipeline.perf.scoring import bench_scoring
    results = bench_scoring(Path("params.yaml"), items=500, vit_items=8)

For one encoder, :func:`bench_encoder` writes a random-image suite (:func:`make_suite`),
extracts it once, and for every variant times two ways of scoring the same items:

* **cache**: ``score_choice`` over the store (store opened and read inside the timing), the
  median of ``repeats`` passes after a warm-up pass;
* **re-encode**: what a user without a cache pays per evaluation, as CLIP_benchmark
  evaluates (``DataLoader`` batches of 64): images read, decoded and preprocessed by extract's
  own loader and encoded 64 at a time, each batch's caption sets tokenised and encoded
  together, then the same scorer applied to the fresh features (:func:`reencode_scores`).

Both give one score per option; their largest difference (``max_abs_score_diff``) shows
that the re-encode path computes what the cache path does. The fresh grids and token states
are rounded to the store's dtypes (``GRID_DTYPE``, fp16) first, as extract writes them, so
the two paths see identical features; without that, fp16 storage alone differs by ~1e-3.

Speed does not depend on the weights: the backbones are random init
(:func:`~pipeline.perf.common.random_encoder`). Scorers at the toy's dimensions load the
pipeline's trained checkpoints when they exist; everything else is random init with seed 0
and the scorer options of ``params.yaml`` (``train.<variant>.scorer``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from pipeline.cache.schema import EMBED_DTYPE, GRID_DTYPE
from pipeline.features import FeatureDims, ImageFeatures, TextFeatures
from pipeline.perf.common import extract_cfg, load_pixels, make_suite, random_encoder
from pipeline.scorers import SCORERS, Scorer, create_scorer, option_scores

VARIANTS = ("clip", "bindclip", "global-m", "flowclip", "flowclip-cimr")  # the default --variants
BATCH_SIZE = 64  # images (and caption sets) per re-encode batch: CLIP_benchmark's default
GOALS = {"toy": 20, "ViT-L-14-336": 100}  # speedup goal per encoder (reencode_s / cache_s)
SUITE = "shapes-sugarcrepe"  # the choice suite make_suite's manifest is extracted as
SEED = 0  # torch seed of every random-init scorer


# ---------------------------------------------------------------- scorers


def scorer_options(variant: str, params: Path | None, checkpoints: Path | None = None) -> dict[str, Any]:
    """The factory options ``variant`` is built with: its checkpoint's ``scorer_kwargs``
    (chosen at training time) when one exists under ``checkpoints``, else
    ``train.<owner>.scorer`` of ``params`` for a trainable variant, else none."""
    from pipeline.config import load_train_config, train_variants
    from pipeline.scorers.checkpoints import checkpoint_dir, checkpoint_owner

    config = checkpoint_dir(variant, checkpoints) / "config.json" if checkpoints else None
    if config is not None and config.is_file():
        return dict(json.loads(config.read_text()).get("scorer_kwargs", {}))
    owner = checkpoint_owner(variant)
    return dict(load_train_config(params, owner).scorer) if owner in train_variants(params) else {}


def build_scorer(variant: str, store, options: dict[str, Any], checkpoints: Path | None = None) -> tuple[Scorer, str]:
    """``variant`` for ``store``'s encoder and a description of its weights: the trained
    checkpoint under ``checkpoints`` when there is one (``load_scorer``), else random init
    (seed :data:`SEED`) with ``options``; its exact shortcuts off (``Scorer.full_path``), so
    the time is the method's, not its weights'."""
    from pipeline.scorers.checkpoints import checkpoint_dir, load_scorer

    folder = checkpoint_dir(variant, checkpoints) if checkpoints else None
    if folder is not None and (folder / "model.safetensors").is_file():
        scorer = load_scorer(variant, store, checkpoints, check_fitted_on=False).full_path()
        weights = f"trained ({folder}; timed on the bench's random-init features)"
    else:
        torch.manual_seed(SEED)
        scorer = create_scorer(variant, dims=store.dims, proj=store.projections(), **options).eval().full_path()
        weights = f"random init (seed {SEED})" if scorer.trainable else "none (no trainable parameters)"
    if not scorer.scores_choices:
        raise ValueError(f"{variant} ranks retrieval suites only, and this bench times choice items; `pipeline bench rerank` times the rerankers")
    return scorer, weights


def trainable_parameters(scorer: Scorer) -> int:
    """Number of parameters that ``pipeline train`` would fit."""
    return sum(p.numel() for p in scorer.parameters() if p.requires_grad)


def parameter_breakdown(variant: str, dims: FeatureDims, options: dict[str, Any]) -> dict[str, int]:
    """Trainable parameters per component and ``total``, as the variant's family counts
    them (its package's ``parameter_breakdown``, e.g. BindCLIP's, which its report section
    reads); per named parameter for a family without one."""
    family = importlib.import_module(SCORERS.get(variant).__module__.rpartition(".")[0])
    count = getattr(family, "parameter_breakdown", None)
    if count is not None:
        extra = {"variant": variant} if "variant" in inspect.signature(count).parameters else {}
        return count(dims, **extra, **options)
    from pipeline.features import Projections

    proj = Projections(torch.zeros(dims.d_v, dims.embed_dim), torch.zeros(dims.d_t, dims.embed_dim), torch.tensor(100.0))
    scorer = create_scorer(variant, dims=dims, proj=proj, **options)
    out = {name: p.numel() for name, p in scorer.named_parameters() if p.requires_grad}
    return {**out, "total": sum(out.values())}


# ---------------------------------------------------------------- the two paths


def _as_stored(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """``x`` rounded to the store's dtype and back to float32, as a store read returns it."""
    return x.to(getattr(torch, dtype)).float()


def fresh_image_features(out: dict[str, torch.Tensor]) -> ImageFeatures:
    """``Encoder.encode_images`` output as the store would return it (``FeatureStore.images``)."""
    final = _as_stored(out["final"], GRID_DTYPE)  # [B, 1+R, d_v], CLS at token 0
    return ImageFeatures(
        early=_as_stored(out["early"], GRID_DTYPE)[:, 1:],  # [B, R, d_v]
        final=final[:, 1:],  # [B, R, d_v]
        cls=final[:, 0],  # [B, d_v]
        embed=_as_stored(out["embed"], EMBED_DTYPE),  # [B, D]
    )


def fresh_text_features(ids: torch.Tensor, out: dict[str, torch.Tensor]) -> TextFeatures:
    """``Encoder.encode_texts`` output as the store would return it (``FeatureStore.texts``)."""
    return TextFeatures(
        ids=ids.long(),  # [B, C]
        mask=out["mask"],  # [B, C]
        tokens=_as_stored(out["tokens"], GRID_DTYPE),  # [B, C, d_t]
        embed=_as_stored(out["embed"], EMBED_DTYPE),  # [B, D]
    )


@torch.no_grad()
def reencode_scores(scorer: Scorer, enc, manifest: pd.DataFrame, image_root: Path, batch_size: int = BATCH_SIZE, desc: str = "") -> np.ndarray:
    """[n, K_max] option scores (NaN pad) of a choice manifest, re-encoding every item.

    Items with the same number of options are taken ``batch_size`` at a time: their images
    are loaded by extract's loader and encoded as one batch, their ``b * K`` captions
    tokenised and encoded as one batch, and ``scorer`` scores the fresh features.
    """
    captions = [list(c) for c in manifest["captions"]]
    crops = manifest["crop_box"].tolist() if "crop_box" in manifest else [None] * len(manifest)
    n_opts = np.array([len(c) for c in captions])  # [n]
    out = np.full((len(manifest), int(n_opts.max(initial=0))), np.nan)
    bar = tqdm(total=len(manifest), desc=desc, unit="item", leave=False, disable=not desc)
    for k in np.unique(n_opts):
        items = np.flatnonzero(n_opts == k)
        for start in range(0, len(items), batch_size):
            b = items[start : start + batch_size]  # [b] item positions
            pixels = load_pixels(enc, image_root, [manifest["image"].iloc[i] for i in b], [crops[i] for i in b])
            image = fresh_image_features(enc.encode_images(pixels))
            ids = enc.tokenizer([c for i in b for c in captions[i]])  # [b * k, C], item-major
            text = fresh_text_features(ids, enc.encode_texts(ids))
            options = [text.index(torch.arange(j, len(b) * k, k)) for j in range(k)]  # k x [b]
            out[b, :k] = option_scores(scorer, image, options).double().numpy()
            bar.update(len(b))
    bar.close()
    return out


def cache_scores(scorer: Scorer, store_dir: Path, batch_size: int, repeats: int = 3) -> tuple[np.ndarray, float]:
    """[n, K_max] ``score_choice`` scores of :data:`SUITE` from the store at ``store_dir``
    and the median seconds of ``repeats`` passes (store opened and read inside each, after
    one untimed warm-up pass)."""
    from pipeline.cache import FeatureStore
    from pipeline.scoring import score_choice

    def run() -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        store = FeatureStore.open(store_dir)
        scores = score_choice(scorer, store, store.suite_index(SUITE), batch_size)
        return scores, time.perf_counter() - t0

    scores, _ = run()
    return scores, float(np.median([run()[1] for _ in range(max(1, repeats))]))


# ---------------------------------------------------------------- the bench


def bench_encoder(
    enc,
    n_items: int,
    variants: list[str],
    options: dict[str, dict[str, Any]] | None = None,
    checkpoints: Path | None = None,
    goal: float | None = None,
    cache_batch_size: int = 256,
    repeats: int = 3,
    progress: bool = False,
) -> dict[str, Any]:
    """Cache against re-encode for every variant on ``n_items`` random images of ``enc``.

    Args:
        enc: the backbone (:class:`pipeline.encoders.Encoder`).
        n_items: items of the suite, each an image and two captions (:func:`make_suite`).
        variants: scorer registry keys.
        options: factory options per variant (missing: none).
        checkpoints: trained checkpoints to load (``<checkpoints>/<variant>/``); None:
            random init everywhere.
        goal: the speedup goal recorded with each variant (None: no goal).
        cache_batch_size: items per ``score_choice`` batch (``score.batch_size``).
        repeats: timed cache passes (their median is ``cache_s``).
        progress: progress bars for extract and each re-encode.

    Returns:
        The encoder-level fields and ``variants``: per variant its ``weights``,
        ``parameters``, ``parameter_breakdown``, ``pairs`` (image-caption pairs), ``cache_s``,
        ``pairs_per_s``, ``reencode_s``, ``speedup``, ``max_abs_score_diff`` and ``goal``.
    """
    from pipeline.cache import FeatureStore, store_path
    from pipeline.extraction import extract
    from pipeline.manifests import read_manifest

    for v in variants:
        SCORERS.get(v)  # an unknown variant fails before any work, listing the valid ones
    options = options or {}
    load = os.getloadavg()[0]  # other processes on the machine skew every timing
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest_path = make_suite(folder, n_items, enc.preprocess_cfg["size"][0])
        cfg = extract_cfg(folder, manifest_path, enc.spec.name, BATCH_SIZE)
        t0 = time.perf_counter()
        extract(cfg, progress=progress, encoder=enc)
        extract_s = time.perf_counter() - t0
        manifest = read_manifest(manifest_path)
        store = FeatureStore.open(store_path(cfg))
        pairs = int((store.suite_index(SUITE)["captions"] >= 0).sum())
        rows = {}
        for v in variants:
            scorer, weights = build_scorer(v, store, options.get(v, {}), checkpoints)
            cached, cache_s = cache_scores(scorer, store_path(cfg), cache_batch_size, repeats)
            t0 = time.perf_counter()
            fresh = reencode_scores(scorer, enc, manifest, folder / "images", desc=f"re-encode {v}" if progress else "")
            reencode_s = time.perf_counter() - t0
            rows[v] = {
                "weights": weights,
                "parameters": trainable_parameters(scorer),
                "parameter_breakdown": parameter_breakdown(v, store.dims, options.get(v, {})),
                "pairs": pairs,
                "cache_s": round(cache_s, 4),
                "pairs_per_s": round(pairs / cache_s, 1),
                "reencode_s": round(reencode_s, 4),
                "speedup": round(reencode_s / cache_s, 1),
                "max_abs_score_diff": float(np.nanmax(np.abs(cached - fresh))),
                "goal": f"speedup >= {goal}" if goal is not None else None,
            }
    return {
        "weights": "random init",  # the backbone's
        "threads": torch.get_num_threads(),
        "load_avg_1min": round(load, 2),
        "n_items": n_items,
        "batch_size": BATCH_SIZE,
        "cache_batch_size": cache_batch_size,
        "grid": list(enc.dims.grid),
        "one_time_extract_s": round(extract_s, 3),
        "variants": rows,
    }


def bench_scoring(
    params: Path | None,
    items: int = 500,
    vit_items: int = 8,
    variants: list[str] | tuple[str, ...] = VARIANTS,
    threads: int = 2,
    repeats: int = 3,
    progress: bool = True,
) -> dict[str, Any]:
    """``pipeline bench scoring``: :func:`bench_encoder` on the toy (``items`` items; the
    trained checkpoints of ``params``' ``score.checkpoints`` where they exist) and at
    ViT-L-14-336 (``vit_items`` items, random init throughout; 0 skips it), with ``threads``
    torch threads (more threads than free cores make both paths several times slower).

    ``params`` gives ``score.batch_size``, the checkpoints folder and the scorer options
    (:func:`scorer_options`); the suite itself never comes from the pipeline's cache.
    """
    from pipeline.config import ScoreConfig, load_config

    torch.set_num_threads(threads)
    score_cfg = load_config(ScoreConfig, params, "score")
    checkpoints = Path(score_cfg.checkpoints)
    options = {v: scorer_options(v, params, checkpoints) for v in variants}
    runs = {"toy": (items, checkpoints), "ViT-L-14-336": (vit_items, None)}
    results = {}
    for model, (n, ckpts) in runs.items():
        if n:
            results[model] = bench_encoder(
                random_encoder(model), n, list(variants), options, ckpts, GOALS[model],
                score_cfg.batch_size, repeats, progress,
            )  # fmt: skip
    return results
