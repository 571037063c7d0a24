"""``pipeline bench scoring``: the re-encode path computes what the cache path does, for
each kind of scorer, and the measurement file has its schema (on the tiny random-init CLIP)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from pipeline.perf import scoring
from pipeline.scorers import create_scorer

pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = {"bindclip": {"h": 16, "n_iters": 16}}  # a fast BindCLIP at the tiny encoder's dims
VARIANT_FIELDS = {
    "weights", "parameters", "parameter_breakdown", "pairs", "cache_s", "pairs_per_s",
    "reencode_s", "speedup", "max_abs_score_diff", "goal",
}  # fmt: skip
ENCODER_FIELDS = {"weights", "threads", "n_items", "batch_size", "one_time_extract_s", "variants"}  # and more


@pytest.fixture(scope="module")
def tiny_bench(tiny_encoder):
    """bench_encoder on 5 items: a global and a grid per-caption scorer and a pairwise one."""
    return scoring.bench_encoder(tiny_encoder, 5, ["clip", "flowclip", "bindclip"], SMALL, repeats=1)


@pytest.mark.parametrize("variant", ["clip", "flowclip", "bindclip"])
def test_reencode_scores_equal_the_cache_scores(tiny_encoder, tmp_path, variant):
    """Re-encoding the items through the backbone (batches smaller than the suite, so more
    than one) gives the option scores ``score_choice`` reads from the store."""
    from pipeline.cache import FeatureStore, store_path
    from pipeline.extraction import extract
    from pipeline.manifests import read_manifest
    from pipeline.perf.common import extract_cfg, make_suite

    manifest = make_suite(tmp_path, 5, tiny_encoder.preprocess_cfg["size"][0])
    cfg = extract_cfg(tmp_path, manifest, tiny_encoder.spec.name, 64)
    extract(cfg, progress=False, encoder=tiny_encoder)
    store = FeatureStore.open(store_path(cfg))
    scorer, _ = scoring.build_scorer(variant, store, SMALL.get(variant, {}))
    cached, seconds = scoring.cache_scores(scorer, store_path(cfg), 256, repeats=1)
    fresh = scoring.reencode_scores(scorer, tiny_encoder, read_manifest(manifest), tmp_path / "images", batch_size=2)
    assert cached.shape == fresh.shape == (5, 2) and np.isfinite(fresh).all() and seconds > 0
    assert np.abs(cached - fresh).max() <= 1e-4
    assert np.ptp(fresh) > 0  # real scores, not a constant


def test_bench_reports_agreement_for_every_variant(tiny_bench):
    for variant, row in tiny_bench["variants"].items():
        assert row["max_abs_score_diff"] <= 1e-4, variant
        assert row["pairs"] == 10  # 5 items x 2 captions
        assert row["speedup"] == pytest.approx(row["reencode_s"] / row["cache_s"], rel=0.05, abs=0.1)  # rounded


def test_parameters_are_the_scorers_trainable_parameters(tiny_bench, tiny_encoder):
    for variant, row in tiny_bench["variants"].items():
        scorer = create_scorer(variant, tiny_encoder.dims, _projections(tiny_encoder), **SMALL.get(variant, {}))
        expected = sum(p.numel() for p in scorer.parameters() if p.requires_grad)
        assert row["parameters"] == row["parameter_breakdown"]["total"] == expected, variant
    assert tiny_bench["variants"]["clip"]["parameters"] == 0
    assert tiny_bench["variants"]["bindclip"]["parameter_breakdown"]["phi_t.linear"] == 48 * 16 + 16


def test_bench_scoring_command_writes_the_schema(tmp_path, tiny_encoder, monkeypatch):
    """``pipeline bench scoring`` (both encoders replaced by the tiny one) writes the command
    and, per encoder, its fields and per variant the measurement; the toy loads a trained
    checkpoint that exists, the ViT-L-14-336 entry stays random init with the same options."""
    from safetensors.torch import save_file

    from pipeline.cli import app

    params = tmp_path / "params.yaml"
    checkpoints = tmp_path / "checkpoints"
    params.write_text(yaml.safe_dump({
        "train": {"variants": ["bindclip"], "bindclip": {"scorer": SMALL["bindclip"]}},
        "score": {"checkpoints": str(checkpoints), "batch_size": 3},
    }))  # fmt: skip
    torch.manual_seed(1)
    trained = create_scorer("bindclip", tiny_encoder.dims, _projections(tiny_encoder), **SMALL["bindclip"])
    (checkpoints / "bindclip").mkdir(parents=True)
    save_file(trained.state_dict(), checkpoints / "bindclip" / "model.safetensors")
    record = {  # as training writes it: fitted on another encoder's store and suite than the bench's
        "scorer_kwargs": SMALL["bindclip"], "store_encoder": "f04553fb065286f2", "train_suite": "shapes-train", "manifest_sha256": "0" * 64,
    }  # fmt: skip
    (checkpoints / "bindclip" / "config.json").write_text(json.dumps(record))
    monkeypatch.setattr(scoring, "random_encoder", lambda name: tiny_encoder)
    monkeypatch.chdir(tmp_path)
    args = ["bench", "scoring", "--params", str(params), "--items", "4", "--vit-items", "3", "--variants", "clip", "--variants", "bindclip", "--threads", "1", "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "reports" / "bench" / "scoring.json").read_text())
    assert data["command"] == f"pipeline bench scoring --params {params} --items 4 --vit-items 3 --variants clip --variants bindclip --threads 1"
    assert set(data["results"]) == {"toy", "ViT-L-14-336"}
    for model, goal, n in (("toy", "speedup >= 20", 4), ("ViT-L-14-336", "speedup >= 100", 3)):
        entry = data["results"][model]
        assert ENCODER_FIELDS <= set(entry) and entry["n_items"] == n and entry["batch_size"] == 64
        assert entry["threads"] == 1
        assert list(entry["variants"]) == ["clip", "bindclip"]
        for row in entry["variants"].values():
            assert set(row) == VARIANT_FIELDS and row["goal"] == goal and row["pairs"] == 2 * n
            assert row["max_abs_score_diff"] <= 1e-4
    toy, vit = (data["results"][m]["variants"]["bindclip"] for m in ("toy", "ViT-L-14-336"))
    assert toy["weights"].startswith("trained") and vit["weights"].startswith("random init")
    assert toy["parameter_breakdown"] == vit["parameter_breakdown"]  # same options, same dims here


def test_unknown_variant_fails_naming_the_valid_ones(tmp_path):
    from pipeline.cli import app

    (tmp_path / "empty.yaml").write_text("")
    args = ["bench", "scoring", "--params", str(tmp_path / "empty.yaml"), "--variants", "nope", "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "unknown scorer 'nope'" in result.output and "bindclip" in result.output


def _projections(enc):
    from pipeline.features import Projections

    return Projections(enc.model.visual.proj, enc.model.text_projection, enc.model.logit_scale.exp())


def test_a_reranker_is_refused_naming_the_bench_that_times_it(tmp_path, tiny_encoder, monkeypatch):
    """`bench scoring` times choice items; a retrieval reranker gets one line pointing to
    `bench rerank`. Without --params it reads ./params.yaml when present, like `pipeline
    score`, and every default when not."""
    from pipeline.cli import app

    monkeypatch.setattr(scoring, "random_encoder", lambda name: tiny_encoder)
    monkeypatch.chdir(tmp_path)  # no params.yaml here: every default
    result = CliRunner().invoke(app, ["bench", "scoring", "--variants", "fgw", "--items", "4", "--vit-items", "0", "--quiet"])
    assert result.exit_code == 1 and "fgw ranks retrieval suites only" in result.output
    assert "pipeline bench rerank" in result.output and "no such params file" not in result.output
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("args", [
    ["scoring", "--items", "0"], ["scoring", "--threads", "0"], ["rerank", "--queries", "0"],
    ["rerank", "--objects", "0"], ["rerank", "--dim", "0"], ["extract", "--toy-images", "0"],
    ["memory", "--sizes", "0"], ["cli", "--items", "0"], ["cli", "--repeats", "0"],
    ["sinkhorn", "--problems", "0"], ["sinkhorn", "--rows", "0"], ["sinkhorn", "--batch-block", "-2"],
])  # fmt: skip
def test_bench_counts_out_of_range_are_refused_in_one_line(args):
    from pipeline.cli import app

    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2 and f"Invalid value for '{args[1]}'" in result.output and "Traceback" not in result.output
