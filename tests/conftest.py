"""Shared fixtures: a tiny random-init open_clip CLIP (no download) and tiny suites on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks.coco_families import FAMILIES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

# ---------------------------------------------------------------- official files in ../shared

# The read-only folder beside the repository with the official benchmark annotation files.
SHARED_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


def running_in_ci() -> bool:
    """``CI`` is set to a true value (``true``/``1``/``yes``, any case), as CI runners do."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_shared(*parts: str, root: Path | None = None) -> Path:
    """``shared/benchmarks/<parts>``, checked to exist: the one place tests decide what a
    missing ``../shared`` means.

    Under CI (``CI=true``; CI always has ``../shared``) a missing path fails the test;
    only locally is it skipped. ``root`` replaces ``SHARED_BENCHMARKS`` (for testing this).
    """
    path = (SHARED_BENCHMARKS if root is None else Path(root)).joinpath(*parts)
    if not path.exists():
        msg = f"official benchmark files not found at {path}"
        if running_in_ci():
            pytest.fail(f"{msg}; CI=true and CI always has ../shared", pytrace=False)
        pytest.skip(f"{msg} (not under CI: skipped)")
    return path


@pytest.fixture(scope="session")
def shared_benchmarks() -> Path:
    """The ``shared/benchmarks`` folder (see :func:`require_shared`: fails under CI if
    absent, skips locally). Subfolders: ``shared_benchmarks / "sugarcrepe"`` etc."""
    return require_shared()


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


# ---------------------------------------------------------------- a tiny store of training pairs

FAMS = list(FAMILIES)  # item k belongs to FAMS[k % 8]
COLOURS, SHAPES = ["red", "green", "blue", "yellow"], ["circle", "square", "star", "cross"]


def _pairs_manifest(path, images, n, seed):
    """A shapes-train-style manifest: [pos, neg], cf/flip images, flip captions, paraphrase,
    grounding (two object words per item)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        c1, c2 = rng.choice(COLOURS, 2, replace=False)
        s1, s2 = rng.choice(SHAPES, 2, replace=False)
        rel, other = ("left", "right") if i % 2 else ("right", "left")
        pos, neg = f"a {c1} {s1} {rel} of a {c2} {s2}", f"a {c1} {s1} {other} of a {c2} {s2}"
        rows.append(
            {
                "item_id": f"it{i}",
                "image": images[i % len(images)],
                "captions": [pos, neg],
                "correct": 0,
                "category": FAMS[i % 8],
                "family": FAMS[i % 8],
                "cf_image": images[(i + 1) % len(images)],
                "flip_image": images[(i + 2) % len(images)],
                "flip_captions": [neg, pos],
                "paraphrase": f"a {c2} {s2} {other} of a {c1} {s1}",
                "ground_words": [s1, s2],
                "ground_boxes": [[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]],
                "ground_positions": [2, 7],
                "neg_ground_boxes": [[0.5, 0.0, 1.0, 0.5]],
                "neg_ground_positions": [1],  # c1 alone names one object
            }
        )
    df = pd.DataFrame(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return df


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory, tiny_encoder):
    """A tiny store with shapes-train (16 pairs) and shapes-dev (8 pairs) and every column."""
    return build_pair_store(tmp_path_factory.mktemp("train_store"), tiny_encoder)


def build_pair_store(tmp: Path, encoder, suites: tuple[str, ...] = ("shapes-train", "shapes-dev"), dev_reversed: bool = False):
    """The tiny pair store under ``tmp``, its suites extracted in the order ``suites``, which
    decides the store's row numbers: shapes-dev first, its images taken in reverse order
    (``dev_reversed``), numbers shapes-train's features otherwise, as a grown store would."""
    import dataclasses

    from pipeline.benchmarks import SUITES
    from pipeline.cache import FeatureStore, store_path
    from pipeline.config import ExtractConfig
    from stages import extract as extract_stage

    names = make_images(tmp / "images", 12)
    paths = {
        "shapes-train": tmp / "m" / "train.parquet",
        "shapes-dev": tmp / "m" / "dev.parquet",
    }
    _pairs_manifest(paths["shapes-train"], names, 16, seed=0)
    _pairs_manifest(paths["shapes-dev"], names[::-1] if dev_reversed else names, 8, seed=1)
    SUITES.names()
    saved = {s: SUITES._entries[s] for s in paths}
    for s in paths:  # encode the extra columns whatever shapes.py declares
        SUITES._entries[s] = dataclasses.replace(
            saved[s],
            image_columns=("image", "cf_image", "flip_image"),
            caption_columns=("captions", "flip_captions", "paraphrase"),
        )
    try:
        cfg = ExtractConfig(
            model="tiny-test",
            suites=list(suites),
            manifests={s: str(paths[s]) for s in suites},
            image_roots={s: str(tmp / "images") for s in suites},
            out=str(tmp / "features"),
            batch_size=16,
        )
        extract_stage.run(cfg, progress=False, encoder=encoder)
    finally:
        SUITES._entries.update(saved)
    return FeatureStore.open(store_path(cfg))


def extract_config_of(store, **kw):
    """The ExtractConfig whose manifests and image roots are the ones ``store`` indexed (the
    score stage reads the configured ones and refuses others)."""
    from pipeline.config import ExtractConfig

    manifests = {s: store.suite_attrs(s)["manifest"] for s in store.suites()}
    roots = {s: store.suite_attrs(s)["image_root"] for s in store.suites()}
    return ExtractConfig(model="tiny-test", manifests=manifests, image_roots=roots, **kw)


@pytest.fixture
def single_thread():
    """Tiny tensors: one intra-op thread is faster and immune to a loaded machine
    (test modules of tiny scorers and solvers opt in with ``pytest.mark.usefixtures``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
