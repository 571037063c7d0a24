"""`scripts/compare_runs.py`: two runs' outputs compared file by file, and stores by content key."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"


def _module():
    spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(root: Path, relation: float, weight: float) -> Path:
    (root / "reports/metrics/clip").mkdir(parents=True)
    (root / "reports/metrics/clip/shapes-aro.json").write_text(json.dumps({"metrics": {"relation": relation, "order": 0.5}}))
    (root / "cache/checkpoints/bindclip").mkdir(parents=True)
    save_file({"w": torch.tensor([1.0, weight])}, str(root / "cache/checkpoints/bindclip/model.safetensors"))
    (root / "reports/report.md").write_text("# report\n")
    return root


def test_identical_runs_pass_and_differences_are_named_and_sized(tmp_path, capsys):
    compare = _module()
    a, b, c = _run(tmp_path / "a", 0.5, 2.0), _run(tmp_path / "b", 0.5, 2.0), _run(tmp_path / "c", 0.75, 2.5)
    assert compare.compare_files(a, b) == 0
    assert "3 of 3 files the same bytes" in capsys.readouterr().out
    assert compare.compare_files(a, c) == 2
    out = capsys.readouterr().out
    assert "differs: reports/metrics/clip/shapes-aro.json (relation 0.5 → 0.75)" in out
    assert "differs: cache/checkpoints/bindclip/model.safetensors (max |Δ| 0.5)" in out
    (c / "reports/report.md").unlink()
    assert compare.compare_files(a, c) == 3 and f"only in {a}: reports/report.md" in capsys.readouterr().out


def test_two_stores_numbering_the_same_features_otherwise_differ_only_in_the_reordered_manifest(tmp_path, tiny_encoder, capsys):
    from tests.conftest import build_pair_store

    compare = _module()
    build_pair_store(tmp_path / "a" / "cache", tiny_encoder)
    build_pair_store(tmp_path / "b" / "cache", tiny_encoder, suites=("shapes-dev", "shapes-train"), dev_reversed=True)
    assert compare.compare_stores(tmp_path / "a", tmp_path / "b") == 1  # shapes-dev's manifest: its items reversed
    out = capsys.readouterr().out
    assert "image: 12 rows in both, 0 only in" in out and "image/final: 0 of 12 shared rows differ" in out
    assert "suites/shapes-dev: extracted from other manifests" in out and "suites/shapes-train/image: 0 of 16 items differ" in out


def test_stores_differing_in_a_suite_index_a_done_flag_or_a_projection_are_named(tmp_path, tiny_encoder, capsys):
    """The comparison read only the image and text rows: a suite index pointing two items at
    each other's features, a lost done flag or another projection passed as equal."""
    import numpy as np
    import zarr

    from tests.conftest import build_pair_store

    compare = _module()
    build_pair_store(tmp_path / "a" / "cache", tiny_encoder)
    build_pair_store(tmp_path / "b" / "cache", tiny_encoder, suites=("shapes-dev", "shapes-train"), dev_reversed=True)
    (store,) = (tmp_path / "b" / "cache" / "features").glob("*.zarr")
    root = zarr.open_group(str(store), mode="r+")
    column = root["suites/shapes-train/image"]
    rows = np.asarray(column[:])
    rows[[0, 1]] = rows[[1, 0]]
    column[:] = rows
    assert compare.compare_stores(tmp_path / "a", tmp_path / "b") == 1 + 2  # shapes-dev's manifest, two items
    assert "suites/shapes-train/image: 2 of 16 items differ" in capsys.readouterr().out
    column[:] = np.asarray(column[:])[[1, 0, *range(2, 16)]]  # restored
    done = np.asarray(root["text/done"][:])
    done[3] = False
    root["text/done"][:] = done
    name = sorted(root["params"].array_keys())[0]
    root[f"params/{name}"][...] = np.asarray(root[f"params/{name}"][...]) + 1
    assert compare.compare_stores(tmp_path / "a", tmp_path / "b") == 1 + 2
    out = capsys.readouterr().out
    assert "text/done: 1 of" in out and f"params/{name}: differs" in out
