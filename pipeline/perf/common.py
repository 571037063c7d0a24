"""Shared fixtures of the measurements: random-init encoders and random-image suites.

Speed does not depend on the weights, so every bench builds its backbone with random
weights (:func:`random_encoder`) and its suite from random images (:func:`make_suite`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.files import write_json_atomically


def random_encoder(name: str):
    """An encoder with random weights (speed does not depend on the weights)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    from pipeline.encoders import ENCODERS, Encoder, create_model, open_clip_config
    from pipeline.features import FeatureDims

    spec = ENCODERS.get(name)
    config = open_clip_config(spec, spec.default_pretrained)  # the config the pipeline runs
    torch.manual_seed(0)
    model = create_model(config).eval().requires_grad_(False)
    grid = tuple(model.visual.grid_size)
    return Encoder(
        spec=spec,
        model=model,
        preprocess=image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False),
        tokenizer=open_clip.get_tokenizer(config),
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


def make_suite(folder: Path, n: int, size: int, seed: int = 0) -> Path:
    """``n`` random PNG images and a 2-caption manifest; returns the manifest path."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    words = ["red", "blue", "green", "circle", "square", "star", "left", "of", "above", "a"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / "images" / f"{i}.png")
        caps = [" ".join(rng.choice(words, 8)) + f" {i}" for _ in range(2)]
        rows.append({"item_id": str(i), "image": f"{i}.png", "captions": caps, "correct": 0, "category": "swap-att"})  # a shapes-sugarcrepe category
    path = folder / "manifest.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def extract_cfg(folder: Path, manifest: Path, model: str, batch_size: int):
    """The ``ExtractConfig`` that extracts :func:`make_suite`'s suite in ``folder`` (as
    ``shapes-sugarcrepe``) into ``folder/features``, at the current torch threads."""
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


def load_pixels(enc, root: Path, names: list[str], crops: list | None = None) -> torch.Tensor:
    """[b, 3, H, W] the images ``names`` under ``root`` read, decoded (cropped) and
    preprocessed by extract's own loader, so a bench pays what extract pays."""
    from pipeline.extract_pixels import _load

    bad: dict[int, str] = {}
    pixels = torch.stack([_load(enc, root, name, crop, bad, i) for i, (name, crop) in enumerate(zip(names, crops or [None] * len(names), strict=True))])
    if bad:
        raise ValueError(f"undecodable bench image(s): {'; '.join(bad.values())}")
    return pixels


def bare_forward(enc, folder: Path, manifest: Path, batch_size: int) -> float:
    """Seconds to load, preprocess and encode every image and caption, storing nothing
    (captions in batches of ``4 * batch_size``, as extract takes them)."""
    from pipeline.manifests import read_manifest

    df = read_manifest(manifest)
    t0 = time.perf_counter()
    names = df["image"].tolist()
    for s in range(0, len(names), batch_size):
        enc.encode_images(load_pixels(enc, folder / "images", names[s : s + batch_size]))
    caps = [c for cs in df["captions"] for c in cs]
    for s in range(0, len(caps), batch_size * 4):
        enc.encode_texts(enc.tokenizer(caps[s : s + batch_size * 4]))
    return time.perf_counter() - t0


@contextmanager
def cpu_shares() -> Iterator[dict[str, float]]:
    """The machine's CPU time over the block, as shares of all its cores' time, filled in
    when the block ends: ``busy`` (user, system and interrupt time of every process),
    ``steal`` (time the hypervisor gave other guests while this virtual machine had work
    for its cores: cores a run had but could not use) and ``idle`` (idle and I/O wait).
    Speed-ups measured on a virtual machine read with them: a run on two cores loses what
    the hypervisor steals, a run on one core of two barely any. Empty where the system
    reports no steal time (only Linux does)."""
    import psutil

    shares: dict[str, float] = {}
    before = psutil.cpu_times()
    yield shares
    after = psutil.cpu_times()
    if not hasattr(after, "steal"):
        return
    delta = {f: getattr(after, f) - getattr(before, f) for f in after._fields if f not in ("guest", "guest_nice")}
    total = sum(delta.values())  # guest time is already counted in user time
    if total <= 0:
        return
    idle = delta["idle"] + delta.get("iowait", 0.0)
    shares.update({
        "busy": round((total - idle - delta["steal"]) / total, 3),
        "steal": round(delta["steal"] / total, 3),
        "idle": round(idle / total, 3),
    })  # fmt: skip


def write_bench(name: str, command: str, results: dict, folder: str | Path = "reports/bench") -> Path:
    """Write ``{"command", "results"}`` to ``<folder>/<name>.json``, the shape the report's
    performance section reads; returns the path."""
    out = Path(folder) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out, {"command": command, "results": results})
    return out
