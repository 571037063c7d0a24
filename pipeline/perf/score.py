"""Scoring from the cache against re-encoding every item, as CLIP_benchmark does."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.perf.common import extract_cfg, make_suite, random_encoder


def score_speedup(n_items: int, model: str = "toy") -> dict[str, Any]:
    """Frozen-CLIP scoring from the cache vs re-encoding image + both captions per item."""
    from pipeline.cache import FeatureStore, store_path
    from pipeline.extraction import extract
    from pipeline.manifests import decode_image, read_manifest
    from pipeline.scorers import create_scorer
    from pipeline.scoring import score_choice

    enc = random_encoder(model)
    size = enc.preprocess_cfg["size"][0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = make_suite(folder, n_items, size)
        cfg = extract_cfg(folder, manifest, model, 64)
        t0 = time.perf_counter()
        extract(cfg, progress=False, encoder=enc)
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
        store = FeatureStore.open(store_path(cfg))
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
