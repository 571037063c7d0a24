"""Measurements behind the figures in the README and the report (`pipeline bench ...`).

Each function returns a JSON-able dict; the CLI writes it to ``reports/bench/<name>.json``,
which the report stage renders. Nothing here is asserted by tests: these are measurements.

* ``extract_overhead``: extract wall time vs a bare forward pass (load + preprocess +
  encode, no store) of the same encoder over the same images and captions.
* ``score_speedup``: scoring frozen CLIP from the cache vs re-encoding the image and both
  captions for every item, as CLIP_benchmark's caption-selection tasks do.
* ``extract_memory``: peak RSS of extract runs over growing numbers of images (subprocesses).
* ``bindclip_speed``: BindCLIP's (true, negative) pairs per second scored from a cache
  against the backbone's images per second (a forward pass per image, as extract runs it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch


def _random_encoder(name: str):
    """An encoder with random weights (speed does not depend on the weights)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    from pipeline.encoders import ENCODERS, Encoder, create_model
    from pipeline.features import FeatureDims

    spec = ENCODERS.get(name)
    torch.manual_seed(0)
    model = create_model(spec.open_clip_model).eval().requires_grad_(False)
    grid = tuple(model.visual.grid_size)
    return Encoder(
        spec=spec,
        model=model,
        preprocess=image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False),
        tokenizer=open_clip.get_tokenizer(spec.open_clip_model),
        pretrained="random",
        dims=FeatureDims(
            grid=(int(grid[0]), int(grid[1])),
            d_v=int(model.visual.transformer.width),
            d_t=int(model.transformer.width),
            embed_dim=int(model.text_projection.shape[1]),
            context_length=int(model.context_length),
        ),
        preprocess_cfg=dict(model.visual.preprocess_cfg),
    )


def _make_suite(folder: Path, n: int, size: int, seed: int = 0) -> Path:
    """``n`` random PNG images and a 2-caption manifest; returns the manifest path."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    words = ["red", "blue", "green", "circle", "square", "star", "left", "of", "above", "a"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / "images" / f"{i}.png")
        caps = [" ".join(rng.choice(words, 8)) + f" {i}" for _ in range(2)]
        rows.append({"item_id": str(i), "image": f"{i}.png", "captions": caps, "correct": 0, "category": "bench"})
    path = folder / "manifest.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def _extract_cfg(folder: Path, manifest: Path, model: str, batch_size: int):
    from pipeline.config import ExtractConfig

    return ExtractConfig(
        model=model,
        suites=["shapes-sugarcrepe"],
        manifests={"shapes-sugarcrepe": str(manifest)},
        image_roots={"shapes-sugarcrepe": str(folder / "images")},
        out=str(folder / "features"),
        batch_size=batch_size,
        threads=torch.get_num_threads(),
    )


def bare_forward(enc, folder: Path, manifest: Path, batch_size: int) -> float:
    """Seconds to load, preprocess and encode every image and caption, storing nothing."""
    from pipeline.manifests import decode_image, read_manifest

    df = read_manifest(manifest)
    t0 = time.perf_counter()
    names = df["image"].tolist()
    for s in range(0, len(names), batch_size):
        imgs = [decode_image((folder / "images" / n).read_bytes(), n) for n in names[s : s + batch_size]]
        enc.encode_images(torch.stack([enc.preprocess(im) for im in imgs]))
    caps = [c for cs in df["captions"] for c in cs]
    for s in range(0, len(caps), batch_size * 4):
        enc.encode_texts(enc.tokenizer(caps[s : s + batch_size * 4]))
    return time.perf_counter() - t0


def extract_overhead(model: str, n_images: int, batch_size: int, repeats: int = 2) -> dict[str, Any]:
    """Extract vs bare forward on ``n_images`` random images (best of ``repeats``)."""
    from stages import extract as extract_stage

    enc = _random_encoder(model)
    size = enc.preprocess_cfg["size"][0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = _make_suite(folder, n_images, size)
        bare_forward(enc, folder, manifest, batch_size)  # warm-up (allocator, page cache)
        bare, ext = [], []
        for r in range(repeats):
            bare.append(bare_forward(enc, folder, manifest, batch_size))
            cfg = _extract_cfg(folder, manifest, model, batch_size)
            cfg.out = str(folder / f"features{r}")
            t0 = time.perf_counter()
            extract_stage.run(cfg, progress=False, encoder=enc)
            ext.append(time.perf_counter() - t0)
    return {
        "model": model,
        "weights": "random init",
        "n_images": n_images,
        "n_captions": 2 * n_images,
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "bare_forward_s": round(min(bare), 3),
        "extract_s": round(min(ext), 3),
        "ratio": round(min(ext) / min(bare), 3),
        "goal": "ratio <= 1.05",
    }


def score_speedup(n_items: int, model: str = "toy") -> dict[str, Any]:
    """Frozen-CLIP scoring from the cache vs re-encoding image + both captions per item."""
    from pipeline.cache import FeatureStore
    from pipeline.manifests import decode_image, read_manifest
    from pipeline.scorers import create_scorer
    from stages import extract as extract_stage
    from stages.score import score_choice

    enc = _random_encoder(model)
    size = enc.preprocess_cfg["size"][0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = _make_suite(folder, n_items, size)
        cfg = _extract_cfg(folder, manifest, model, 64)
        t0 = time.perf_counter()
        extract_stage.run(cfg, progress=False, encoder=enc)
        extract_s = time.perf_counter() - t0
        df = read_manifest(manifest)
        create_scorer("clip", dims=enc.dims, proj=None)  # import the scorer registry untimed
        # CLIP_benchmark style: every item re-encodes its image and its caption pair
        t0 = time.perf_counter()
        reencode = np.zeros((n_items, 2))
        for i, row in df.iterrows():
            img = decode_image((folder / "images" / row["image"]).read_bytes(), row["image"])
            e_i = enc.encode_images(enc.preprocess(img)[None])["embed"]
            e_t = enc.encode_texts(enc.tokenizer(list(row["captions"])))["embed"]
            reencode[i] = torch.nn.functional.cosine_similarity(e_i, e_t).numpy()
        reencode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        store = FeatureStore.open(extract_stage.store_path(cfg))
        scorer = create_scorer("clip", dims=store.dims, proj=store.projections())
        cached = score_choice(scorer, store, store.suite_index("shapes-sugarcrepe"), 256)
        cached_s = time.perf_counter() - t0
    return {
        "model": model,
        "weights": "random init",
        "threads": torch.get_num_threads(),
        "n_items": n_items,
        "reencode_s": round(reencode_s, 3),
        "cached_score_s": round(cached_s, 4),
        "speedup": round(reencode_s / cached_s, 1),
        "one_time_extract_s": round(extract_s, 3),
        "max_abs_score_diff": float(np.abs(cached - reencode).max()),
        "goal": "speedup >= 100",
    }


_MEMORY_CHILD = """
import json, resource, sys, tempfile, torch
from pathlib import Path
from pipeline import bench
from stages import extract as extract_stage
torch.set_num_threads(2)
n, model = int(sys.argv[1]), sys.argv[2]
enc = bench._random_encoder(model)
with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    manifest = bench._make_suite(folder, n, enc.preprocess_cfg["size"][0])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extract_stage.run(bench._extract_cfg(folder, manifest, model, 64), progress=False, encoder=enc)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"n_images": n, "peak_rss_mib_before_extract": before / 1024, "peak_rss_mib": after / 1024}))
"""


def extract_memory(sizes: list[int], model: str = "toy") -> dict[str, Any]:
    """Peak RSS of extract over growing image counts, each in a fresh process."""
    rows = []
    for n in sizes:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(n), model],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    peaks = [r["peak_rss_mib"] for r in rows]
    return {
        "model": model,
        "runs": rows,
        "growth_mib": round(peaks[-1] - peaks[0], 1),
        "growth_ratio": round(peaks[-1] / peaks[0], 3),
        "goal": "flat peak memory as images grow",
    }


def _pairs(index: dict[str, np.ndarray]) -> int:
    """(a, b) caption pairs a pairwise scorer evaluates on a choice suite: K(K-1)/2 per item."""
    k = (index["captions"] >= 0).sum(1)
    return int((k * (k - 1) // 2).sum())


def _images_per_second(enc, paths: list[Path], batch_size: int) -> float:
    """Decode, preprocess and encode ``paths`` in batches as extract does; images per second."""
    from pipeline.manifests import decode_image

    def run() -> float:
        t0 = time.perf_counter()
        for s in range(0, len(paths), batch_size):
            imgs = [decode_image(p.read_bytes(), p.name) for p in paths[s : s + batch_size]]
            enc.encode_images(torch.stack([enc.preprocess(im) for im in imgs]))
        return time.perf_counter() - t0

    run()  # warm-up (allocator, page cache)
    return len(paths) / run()


def _time_scoring(scorer, store, index: dict[str, np.ndarray], batch_size: int, repeats: int) -> float:
    """Median seconds of ``score_choice`` over a suite (after one untimed warm-up call)."""
    from stages.score import score_choice

    score_choice(scorer, store, index, batch_size)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        score_choice(scorer, store, index, batch_size)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _time_reads(store, index: dict[str, np.ndarray], batch_size: int, repeats: int) -> float:
    """Median seconds to read a suite's grids and token states as ``score_choice`` does."""
    from stages.score import choice_batches

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
    from pipeline.cache import FeatureStore
    from pipeline.config import ExtractConfig, ScoreConfig, TrainConfig, load_config
    from pipeline.scorers import create_scorer
    from pipeline.scorers.bindclip import parameter_breakdown
    from stages import extract as extract_stage
    from stages.score import load_scorer, open_store, suite_inputs

    extract_cfg = load_config(ExtractConfig, params, "extract")
    score_cfg = load_config(ScoreConfig, params, "score")
    train_cfg = load_config(TrainConfig, params, "train")
    store = open_store(extract_cfg)
    manifest, index = suite_inputs(store, suite)
    scorer = load_scorer("bindclip", store, score_cfg)
    with torch.no_grad():
        score_s = _time_scoring(scorer, store, index, score_cfg.batch_size, repeats)
    read_s = _time_reads(store, index, score_cfg.batch_size, repeats)
    from pipeline.manifests import resolve_source

    root = resolve_source(suite, extract_cfg.world, extract_cfg.manifests, extract_cfg.image_roots).image_root
    paths = [root / name for name in dict.fromkeys(manifest["image"])]
    images_s = _images_per_second(_random_encoder(extract_cfg.model), paths, extract_cfg.batch_size)
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
        enc = _random_encoder(model)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            vit_manifest = _make_suite(folder, vit_items, enc.preprocess_cfg["size"][0])
            cfg = _extract_cfg(folder, vit_manifest, model, 8)
            extract_stage.run(cfg, progress=False, encoder=enc)
            vit_store = FeatureStore.open(extract_stage.store_path(cfg))
            vit_index = vit_store.suite_index("shapes-sugarcrepe")
            torch.manual_seed(0)
            vit_scorer = create_scorer("bindclip", dims=vit_store.dims, proj=vit_store.projections(), **train_cfg.scorer).eval()
            with torch.no_grad():
                vit_score_s = _time_scoring(vit_scorer, vit_store, vit_index, score_cfg.batch_size, repeats)
            vit_images_s = _images_per_second(enc, sorted((folder / "images").glob("*.png")), 8)
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
