"""benchmarks/bindclip_trial.py: a trial's params redirect every output and apply overrides."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("bindclip_trial", ROOT / "benchmarks" / "bindclip_trial.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trial_params_redirect_outputs_and_apply_overrides(tmp_path):
    mod = _module()
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = mod.trial_params(base, "t1", tmp_path, ["train.steps=900", "train.scorer={relation_center: pair}", "train.weights.grounding=10"])
    assert p["train"]["out"] == str(tmp_path / "t1" / "checkpoints") and p["train"]["seeds"] == [0]
    assert p["score"]["checkpoints"] == p["train"]["out"]
    assert all(str(tmp_path) in p["score"][k] for k in ("scores_out", "metrics_out"))
    assert p["train"]["steps"] == 900 and p["train"]["scorer"] == {"relation_center": "pair"}
    assert p["train"]["weights"]["grounding"] == 10 and p["train"]["weights"]["reflection"] == base["train"]["weights"]["reflection"]
    assert p["extract"] == base["extract"] and base["train"]["out"] == "cache/checkpoints"  # base untouched
    with pytest.raises(SystemExit, match="section.key=YAML"):
        mod.trial_params(base, "t2", tmp_path, ["steps=3"])
