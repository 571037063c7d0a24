"""End to end: world -> toyclip -> extract -> score -> report through the CLI on a tiny world,
plus one CliRunner test per command (listings, manifest, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()

TINY_PARAMS = {
    "world": {
        "seed": 0,
        "image_size": 64,
        "out": "cache/world",
        "n_whatsup": 4,
        "n_aro": 6,
        "n_sugarcrepe": 4,
        "n_retrieval_groups": 2,
        "n_train": 16,
        "n_dev": 16,
    },
    "toyclip": {"seed": 0, "out": "cache/toyclip", "steps": 3, "batch_size": 16, "pool_size": 64, "warmup": 1},
    "extract": {
        "model": "toy",
        "checkpoint": "cache/toyclip/model.safetensors",
        "world": "cache/world",
        "out": "cache/features",
        "batch_size": 32,
        "replace_mismatch": True,
    },
    "score": {
        "encoder": "toy",
        "variants": ["clip"],
        "suites": ["shapes-whatsup", "shapes-aro", "shapes-sugarcrepe", "shapes-retrieval", "shapes-dev"],
    },
    "report": {"out": "reports", "bootstrap": 200, "examples": 2},
}


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
    return result


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The whole pipeline once, in a fresh folder."""
    import os

    root = tmp_path_factory.mktemp("e2e")
    (root / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS))
    old = os.getcwd()
    os.chdir(root)
    try:
        for stage in ("world", "toyclip", "extract", "score", "report"):
            args = [stage, "--params", "params.yaml"]
            if stage != "report":
                args.append("--quiet")
            invoke(*args)
        yield root
    finally:
        os.chdir(old)


def test_pipeline_writes_contract_metrics(tiny_run):
    expected = {
        "shapes-sugarcrepe": {"replace-obj", "replace-att", "replace-rel", "swap-obj", "swap-att", "add-obj", "add-att"},
        "shapes-aro": {"relation", "attribution", "order"},
        "shapes-whatsup": {"individual", "pair", "set"},
        "shapes-retrieval": {"R@1", "R@5", "R@10", "nDCG@10"},
    }
    for suite, names in expected.items():
        record = json.loads((tiny_run / "reports" / "metrics" / "clip" / f"{suite}.json").read_text())
        assert record["suite"] == suite and record["variant"] == "clip" and record["encoder"] == "toy"
        assert names <= set(record["metrics"]), (suite, record["metrics"])
        assert record["n_items"] > 0
        assert all(0.0 <= v <= 1.0 for v in record["metrics"].values())
    report = (tiny_run / "reports" / "report.md").read_text()
    assert "## shapes-sugarcrepe" in report and "failure profile" in report
    assert list((tiny_run / "reports" / "figures").glob("examples-*.png"))


def test_scores_from_cache_match_a_direct_forward(tiny_run):
    """The score stage's clip scores equal cosines from a fresh forward pass of the toy CLIP."""
    import pandas as pd
    import torch
    from PIL import Image

    from pipeline.encoders import load_encoder

    enc = load_encoder("toy", checkpoint=str(tiny_run / "cache/toyclip/model.safetensors"))
    manifest = pd.read_parquet(tiny_run / "cache/world/manifests/shapes-sugarcrepe.parquet")
    scores = pd.read_parquet(tiny_run / "cache/scores/clip/shapes-sugarcrepe.parquet")
    row = manifest.iloc[0]
    img = enc.preprocess(Image.open(tiny_run / "cache/world/images" / row["image"]).convert("RGB"))[None]
    e_i = enc.encode_images(img)["embed"]
    e_t = enc.encode_texts(enc.tokenizer(list(row["captions"])))["embed"]
    direct = torch.nn.functional.cosine_similarity(e_i, e_t).numpy()
    np.testing.assert_allclose(np.asarray(scores["scores"].iloc[0]), direct, atol=1e-5)


def test_rescoring_reads_the_cache_not_the_backbone(tiny_run, monkeypatch):
    import pipeline.encoders as encoders

    def forbidden(*a, **k):
        raise AssertionError("score must not load the backbone")

    monkeypatch.setattr(encoders, "load_encoder", forbidden)
    monkeypatch.chdir(tiny_run)
    invoke("score", "--params", "params.yaml", "--quiet", "--suite", "shapes-aro")


def test_score_refuses_a_store_from_other_weights(tiny_run, monkeypatch):
    monkeypatch.chdir(tiny_run)
    ckpt = Path("cache/toyclip/model.safetensors")
    original = ckpt.read_bytes()
    try:
        ckpt.write_bytes(original + b"\0")  # "retrained" weights
        result = runner.invoke(app, ["score", "--params", "params.yaml", "--quiet"])
        assert result.exit_code == 1
        assert "rerun `pipeline extract`" in result.output
    finally:
        ckpt.write_bytes(original)


def test_unknown_names_list_the_valid_ones(tiny_run, monkeypatch):
    monkeypatch.chdir(tiny_run)
    result = runner.invoke(app, ["score", "--params", "params.yaml", "--variant", "nope"])
    assert result.exit_code == 1 and "valid scorers" in result.output and "clip" in result.output
    result = runner.invoke(app, ["score", "--params", "params.yaml", "--suite", "nope"])
    assert result.exit_code == 1 and "valid suites" in result.output
    result = runner.invoke(app, ["extract", "--params", "params.yaml", "--model", "nope"])
    assert result.exit_code == 1 and "valid encoders" in result.output and "ViT-L-14-336" in result.output


def test_listings():
    out = invoke("suites").output
    for name in ("shapes-whatsup", "sugarcrepe", "aro-relation", "whatsup-a", "coco-families"):
        assert name in out
    assert "clip" in invoke("variants").output
    assert "ViT-L-14-336" in invoke("encoders").output


def test_manifest_command_on_official_files(tmp_path):
    shared = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "sugarcrepe"
    if not shared.is_dir():
        pytest.skip("shared benchmark files not present")
    out = tmp_path / "sc.parquet"
    result = invoke("manifest", "--suite", "sugarcrepe", "--root", str(shared), "--out", str(out))
    assert "items" in result.output
    import pandas as pd

    df = pd.read_parquet(out)
    assert {"item_id", "image", "captions", "correct", "category", "length_matched"} <= set(df.columns)
    from pipeline.manifests import file_sha256, manifest_sources

    sources = manifest_sources(out)
    assert sources["swap_att.json"] == file_sha256(shared / "swap_att.json")

