"""The accelerator path (``--device cuda``) against the CPU on the tiny store: extract writes
the same store, every scorer gives the same scores, every trainable variant trains through
the one loop and writes host checkpoints. Skipped where torch sees no CUDA device; run on a
GPU machine with ``pytest tests/test_device.py`` (``PIPELINE_TEST_DEVICE`` names another device,
``cpu`` runs the comparisons against the CPU itself)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("PIPELINE_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device"
)


def _close(a: np.ndarray, b: np.ndarray, rel: float) -> bool:
    """|a - b| within ``rel`` of the largest |a| (float32 on two devices, fp16 in the store)."""
    scale = max(float(np.nanmax(np.abs(a), initial=0.0)), 1e-12)
    return bool(np.nanmax(np.abs(a - b), initial=0.0) <= rel * scale) and np.array_equal(np.isnan(a), np.isnan(b))


def _device_parity():
    """``scripts/device_parity.py`` as a module: its store comparison."""
    spec = importlib.util.spec_from_file_location("device_parity", ROOT / "scripts" / "device_parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_extract_on_the_device_writes_the_cpu_store(tmp_path):
    from pipeline.cache import FeatureStore, store_path
    from pipeline.extraction import extract
    from pipeline.perf.common import extract_cfg, make_suite

    manifest = make_suite(tmp_path, 8, 64)
    paths = {}
    for device in ("cpu", DEVICE):
        cfg = extract_cfg(tmp_path, manifest, "tiny-vit", 4)
        cfg.pretrained, cfg.device, cfg.out = "none", device, str(tmp_path / f"features-{device}")
        extract(cfg, progress=False)
        paths[device] = store_path(cfg)
    arrays = _device_parity().compare_stores(paths["cpu"], paths[DEVICE])
    assert "image/final" in arrays and "text/tokens" in arrays
    for name, r in arrays.items():  # integers and booleans equal, floats within 1% of the largest value
        assert r["max_abs"] == 0 if r.get("exact") else r["max_rel"] <= 1e-2, (name, r)
    assert FeatureStore.open(paths["cpu"]).fingerprint == FeatureStore.open(paths[DEVICE]).fingerprint


def _scorers():
    from pipeline.scorers import SCORERS

    return SCORERS.names()


@pytest.mark.parametrize("name", _scorers())
def test_every_scorer_scores_the_same_on_the_device(name, tiny_store):
    from pipeline.scorers import create_scorer
    from pipeline.scoring import gallery_scores, score_choice

    def build(device):
        torch.manual_seed(0)
        s = create_scorer(name, dims=tiny_store.dims, proj=tiny_store.projections()).eval().full_path()
        return s if s.reranker else s.to(device)  # rerankers run on the host (score stage)

    cpu, dev = build("cpu"), build(DEVICE)
    if cpu.reranker:
        pytest.skip("rerankers stay on the host")
    index = tiny_store.suite_index("shapes-dev")
    if cpu.scores_choices:
        assert _close(score_choice(cpu, tiny_store, index, 4), score_choice(dev, tiny_store, index, 4), 1e-3)
    if not cpu.pairwise:
        images, texts = np.unique(index["image"][:, 0]), np.unique(index["captions"][:, 0])
        with torch.no_grad():  # as score_retrieval calls it
            a = gallery_scores(cpu, tiny_store, images, texts, 4)
            b = gallery_scores(dev, tiny_store, images, texts, 4)
        assert _close(a, b, 1e-3)


TRAINABLE = {
    "bindclip": {"scorer": {"h": 16, "n_iters": 16, "absorb_every": 8}, "objective": {"q0_grid": [0.5, 1.0]}},
    "global-m": {},
    "flowclip": {},
    "flowclip-cimr": {},
}


@pytest.mark.parametrize("variant", list(TRAINABLE))
def test_every_trainable_variant_trains_on_the_device(variant, tmp_path, tiny_store):
    from safetensors.torch import load_file

    from pipeline.config import TrainConfig
    from pipeline.training.loop import train_variant

    logs = {}
    for device in ("cpu", DEVICE):
        cfg = TrainConfig(variant=variant, seeds=[0], steps=4, batch_size=8, lr=1e-2, eval_every=2,
                          out=str(tmp_path / device), threads=1, device=device, **TRAINABLE[variant])  # fmt: skip
        train_variant(cfg, tiny_store, progress=False)
        root = tmp_path / device / variant
        weights = load_file(str(root / "model.safetensors"))
        assert weights and all(torch.isfinite(w.float()).all() for w in weights.values())
        logs[device] = json.loads((root / "seed0" / "train_log.json").read_text())
    # step 0 is the initialisation, the same weights on both devices: the same dev figure
    # up to one of the 8 dev items (scores agree to float error; a near tie may flip)
    dev0 = [logs[d]["dev"][0]["mean"] for d in ("cpu", DEVICE)]
    assert abs(dev0[0] - dev0[1]) <= 1 / 8 + 1e-9, dev0
    assert [s["step"] for s in logs[DEVICE]["steps"]] == [1, 2, 3, 4]
