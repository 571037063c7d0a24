"""Shared fixtures: a tiny random-init open_clip CLIP (no download) and tiny suites on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

TINY = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 56, "layers": 3, "width": 64, "patch_size": 14, "head_width": 32},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory):
    """An `Encoder` around a tiny random-init open_clip model (4x4 grid, early layer 2)."""
    import open_clip
    import torch
    from open_clip.transform import PreprocessCfg, image_transform_v2

    from pipeline.encoders import Encoder, EncoderSpec
    from pipeline.features import FeatureDims

    cfg_dir = tmp_path_factory.mktemp("tiny_cfg")
    (cfg_dir / "tiny-vit-test.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(cfg_dir / "tiny-vit-test.json")
    torch.manual_seed(0)
    model = open_clip.create_model("tiny-vit-test", pretrained=None).eval().requires_grad_(False)
    from pipeline.encoders import ENCODERS

    spec = EncoderSpec("tiny-test", "tiny-vit-test", early_layer=2, default_pretrained="none")
    if "tiny-test" not in ENCODERS:
        ENCODERS.register("tiny-test", spec)  # so score-side fingerprint checks know it
    return Encoder(
        spec=spec,
        model=model,
        preprocess=image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False),
        tokenizer=open_clip.get_tokenizer("tiny-vit-test"),
        pretrained="random",
        dims=FeatureDims(grid=(4, 4), d_v=64, d_t=48, embed_dim=32, context_length=16),
        preprocess_cfg=dict(model.visual.preprocess_cfg),
    )


def make_images(folder: Path, n: int, size: int = 56, seed: int = 0) -> list[str]:
    """``n`` random RGB PNGs under ``folder``; returns their names."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        name = f"img{i:03d}.png"
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / name)
        names.append(name)
    return names


def make_choice_manifest(path: Path, images: list[str], seed: int = 0) -> pd.DataFrame:
    """A SugarCrepe-style manifest (pos/neg captions) over ``images``."""
    rng = np.random.default_rng(seed)
    colours = ["red", "green", "blue", "yellow"]
    shapes = ["circle", "square", "star", "cross"]
    rows = []
    for i, img in enumerate(images):
        c1, c2 = rng.choice(colours, 2, replace=False)
        s1, s2 = rng.choice(shapes, 2, replace=False)
        rows.append(
            {
                "item_id": f"it{i}",
                "image": img,
                "captions": [f"a {c1} {s1} and a {c2} {s2}", f"a {c2} {s1} and a {c1} {s2}"],
                "correct": 0,
                "category": ["swap-att", "replace-obj"][i % 2],
                "length_matched": True,
            }
        )
    df = pd.DataFrame(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return df
