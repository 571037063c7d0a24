"""BindCLIP's scoring speed from the cache against the backbone's images per second."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.perf.common import images_per_second, make_suite, random_encoder


def _pairs(index: dict[str, np.ndarray]) -> int:
    """(a, b) caption pairs a pairwise scorer evaluates on a choice suite: K(K-1)/2 per item."""
    k = (index["captions"] >= 0).sum(1)
    return int((k * (k - 1) // 2).sum())


def _time_scoring(scorer, store, index: dict[str, np.ndarray], batch_size: int, repeats: int) -> float:
    """Median seconds of ``score_choice`` over a suite (after one untimed warm-up call)."""
    from pipeline.scoring import score_choice

    score_choice(scorer, store, index, batch_size)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        score_choice(scorer, store, index, batch_size)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _time_reads(store, index: dict[str, np.ndarray], batch_size: int, repeats: int) -> float:
    """Median seconds to read a suite's grids and token states as ``score_choice`` does."""
    from pipeline.scoring import choice_batches

    times = []
    for _ in range(max(1, repeats) + 1):  # the first pass is a warm-up
        t0 = time.perf_counter()
        for _batch in choice_batches(store, index, batch_size, grids=True):
            pass
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def bindclip_speed(params: Path, suite: str = "shapes-sugarcrepe", vit_items: int = 16, repeats: int = 3) -> dict[str, Any]:
    """BindCLIP pairs per second from the cache against the backbone's images per second.

    toy: the pipeline's trained BindCLIP on its cache (``params``: extract / score / train
    sections), every pair of ``suite``; the toy backbone's images per second on the same
    suite's images. ViT-L-14-336 (``vit_items`` > 0): a BindCLIP with the trained scorer's
    options but random weights (speed does not depend on them) on a temporary cache of
    random images extracted by a random-init ViT-L-14-336, that backbone's images per
    second, and the scorer's trainable parameters at its dimensions, per component
    (:func:`pipeline.scorers.bindclip.parameter_breakdown`). Each scoring time is the median of ``repeats`` passes over the items, store
    reads included; ``store_read_s`` times the reads alone (toy).
    """
    from pipeline.cache import FeatureStore, open_store, store_path
    from pipeline.config import ExtractConfig, ScoreConfig, load_config, load_train_config
    from pipeline.extraction import extract
    from pipeline.scorers import create_scorer
    from pipeline.scorers.bindclip import parameter_breakdown
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import suite_inputs

    extract_cfg = load_config(ExtractConfig, params, "extract")
    score_cfg = load_config(ScoreConfig, params, "score")
    train_cfg = load_train_config(params, "bindclip")
    store = open_store(extract_cfg)
    manifest, index = suite_inputs(store, suite)
    scorer = load_scorer("bindclip", store, score_cfg.checkpoints)
    with torch.no_grad():
        score_s = _time_scoring(scorer, store, index, score_cfg.batch_size, repeats)
    read_s = _time_reads(store, index, score_cfg.batch_size, repeats)
    from pipeline.manifests import resolve_source

    root = resolve_source(suite, extract_cfg.world, extract_cfg.manifests, extract_cfg.image_roots).image_root
    paths = [root / name for name in dict.fromkeys(manifest["image"])]
    images_s = images_per_second(random_encoder(extract_cfg.model), paths, extract_cfg.batch_size)
    pairs = _pairs(index)
    results: dict[str, Any] = {
        "toy": {
            "suite": suite,
            "weights": "trained BindCLIP (pipeline checkpoint); backbone speed with random init",
            "threads": torch.get_num_threads(),
            "pairs": pairs,
            "score_s": round(score_s, 4),
            "store_read_s": round(read_s, 4),  # of score_s: reading the grids and token states
            "pairs_per_s": round(pairs / score_s, 1),
            "backbone_images": len(paths),
            "backbone_images_per_s": round(images_s, 1),
            "pairs_per_backbone_image": round(pairs / score_s / images_s, 2),
        }
    }
    if vit_items:
        model = "ViT-L-14-336"
        enc = random_encoder(model)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            vit_manifest = make_suite(folder, vit_items, enc.preprocess_cfg["size"][0])
            cfg = extract_cfg(folder, vit_manifest, model, 8)
            extract(cfg, progress=False, encoder=enc)
            vit_store = FeatureStore.open(store_path(cfg))
            vit_index = vit_store.suite_index("shapes-sugarcrepe")
            torch.manual_seed(0)
            vit_scorer = create_scorer("bindclip", dims=vit_store.dims, proj=vit_store.projections(), **train_cfg.scorer).eval()
            with torch.no_grad():
                vit_score_s = _time_scoring(vit_scorer, vit_store, vit_index, score_cfg.batch_size, repeats)
            vit_images_s = images_per_second(enc, sorted((folder / "images").glob("*.png")), 8)
            vit_pairs = _pairs(vit_index)
        results[model] = {
            "weights": "random init (scorer and backbone)",
            "threads": torch.get_num_threads(),
            "grid": list(vit_store.dims.grid),
            "pairs": vit_pairs,
            "score_s": round(vit_score_s, 4),
            "pairs_per_s": round(vit_pairs / vit_score_s, 1),
            "backbone_images": vit_items,
            "backbone_images_per_s": round(vit_images_s, 2),
            "pairs_per_backbone_image": round(vit_pairs / vit_score_s / vit_images_s, 1),
            "parameters": parameter_breakdown(vit_store.dims, **train_cfg.scorer),  # the paper's total: 521,475
        }
    return results
