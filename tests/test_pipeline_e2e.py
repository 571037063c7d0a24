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
        "shapes-retrieval": {"R@1", "R@5", "R@10", "nDCG@10", "mean-rank"},
    }
    for suite, names in expected.items():
        record = json.loads((tiny_run / "reports" / "metrics" / "clip" / f"{suite}.json").read_text())
        assert record["suite"] == suite and record["variant"] == "clip" and record["encoder"] == "toy"
        assert names <= set(record["metrics"]), (suite, record["metrics"])
        assert record["n_items"] > 0
        rates = {k: v for k, v in record["metrics"].items() if k != "mean-rank"}
        assert all(0.0 <= v <= 1.0 for v in rates.values())
        if "mean-rank" in record["metrics"]:  # 1 (perfect) .. the gallery size
            assert 1.0 <= record["metrics"]["mean-rank"] <= record["n_items"]
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


class BackboneLoaded(AssertionError):
    """Raised by every backbone entry point while :func:`forbid_backbone` is active."""


def _backbone_entry_points() -> list[tuple[object, str]]:
    """(owner, attribute) of every function or constructor through which a CLIP backbone
    gets built or its weights loaded: open_clip's factory (package and ``factory`` module
    names), the OpenAI loader, checkpoint loading, the model classes' and towers' own
    constructors (so a route that calls none of the factories is caught too), and the
    project's loaders at their definition site (``pipeline.encoders.load_encoder`` /
    ``create_model``, ``pipeline.encoders.toyclip.build_model``)."""
    import open_clip
    import open_clip.coca_model
    import open_clip.factory
    import open_clip.model
    import open_clip.openai
    import open_clip.transformer

    import pipeline.encoders as encoders
    import pipeline.encoders.toyclip as toyclip

    functions = [
        (module, name)
        for module in (open_clip, open_clip.factory)
        for name in (
            "create_model",
            "create_model_and_transforms",
            "create_model_from_pretrained",
            "load_checkpoint",
        )
    ] + [
        (open_clip, "load_openai_model"),
        (open_clip.openai, "load_openai_model"),
        (encoders, "load_encoder"),
        (encoders, "create_model"),
        (toyclip, "build_model"),
    ]
    classes = (
        open_clip.model.CLIP,
        open_clip.model.CustomTextCLIP,
        open_clip.coca_model.CoCa,
        open_clip.transformer.VisionTransformer,
        open_clip.transformer.TextTransformer,
    )
    return functions + [(cls, "__init__") for cls in classes]


def _rebindings(originals: dict[int, str]) -> list[tuple[object, str]]:
    """(module, attribute) of every imported module's global bound to one of ``originals``
    (by identity): ``from pipeline.encoders import load_encoder`` in a stage, ``from
    open_clip import create_model`` ..."""
    import sys

    found = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            found += [(module, k) for k, v in list(namespace.items()) if id(v) in originals]
    return found


def forbid_backbone(monkeypatch) -> list[str]:
    """Make every backbone entry point raise :class:`BackboneLoaded` and record its name in
    the returned list (so a caller that swallows the error is still caught). The entry
    points are patched where they are defined and wherever an imported module holds its
    own reference to them, so the guard does not depend on which module the score stage
    imports its helpers from."""
    calls: list[str] = []

    def guard(name: str):
        def forbidden(*args, **kwargs):
            calls.append(name)
            raise BackboneLoaded(f"score must not load the backbone: {name} called")

        return forbidden

    originals: dict[int, str] = {}  # id(function) -> a name for it
    for owner, attr in _backbone_entry_points():
        originals.setdefault(id(getattr(owner, attr)), f"{owner.__name__}.{attr}")
    guards = {fid: guard(name) for fid, name in originals.items()}
    targets = _rebindings(originals) + _backbone_entry_points()
    for owner, attr in targets:
        original = getattr(owner, attr)
        if id(original) in guards:
            monkeypatch.setattr(owner, attr, guards[id(original)])
    return calls


def test_rescoring_reads_the_cache_not_the_backbone(tiny_run, monkeypatch):
    """Score with every route to a backbone forbidden: it succeeds from the cache alone and
    gives the metrics the pipeline run wrote."""
    monkeypatch.chdir(tiny_run)
    metrics = tiny_run / "reports" / "metrics" / "clip" / "shapes-aro.json"
    before = json.loads(metrics.read_text())
    metrics.unlink()  # so the file checked below is this run's
    calls = forbid_backbone(monkeypatch)
    result = invoke("score", "--params", "params.yaml", "--quiet", "--suite", "shapes-aro")
    assert calls == []
    records = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [(r["suite"], r["variant"]) for r in records] == [("shapes-aro", "clip")]
    assert {"relation", "attribution", "order"} <= set(records[0]["metrics"])
    assert records[0]["n_items"] > 0
    assert json.loads(metrics.read_text())["metrics"] == records[0]["metrics"] == before["metrics"]


def _routes(ckpt: str, plain_weights: str) -> dict:
    """Ways of building the toy CLIP; ``plain_weights``: an open_clip ``toy-vit`` state
    dict without the project's stem (what open_clip's own loaders accept)."""
    import open_clip

    import pipeline.encoders as encoders
    import pipeline.encoders.toyclip as toyclip
    from pipeline.config import ToyClipConfig

    encoders.register_toy_configs()
    config = open_clip.get_model_config("toy-vit")
    return {
        "load_encoder": lambda: encoders.load_encoder("toy", checkpoint=ckpt),
        "create_model": lambda: encoders.create_model("toy-vit"),
        "toyclip.build_model": lambda: toyclip.build_model(ToyClipConfig()),
        "open_clip.create_model": lambda: open_clip.create_model("toy-vit"),
        "open_clip.create_model_and_transforms": lambda: open_clip.create_model_and_transforms(
            "toy-vit"
        ),
        "open_clip.create_model_from_pretrained": lambda: open_clip.create_model_from_pretrained(
            "toy-vit", pretrained=plain_weights
        ),
        "open_clip.CLIP": lambda: open_clip.CLIP(**config),
        "open_clip VisionTransformer": lambda: open_clip.transformer.VisionTransformer(
            image_size=32, patch_size=16, width=64, layers=1, heads=2, mlp_ratio=4.0
        ),
    }


ROUTES = [
    "load_encoder",
    "create_model",
    "toyclip.build_model",
    "open_clip.create_model",
    "open_clip.create_model_and_transforms",
    "open_clip.create_model_from_pretrained",
    "open_clip.CLIP",
    "open_clip VisionTransformer",
]


@pytest.fixture(scope="module")
def plain_toy_weights(tmp_path_factory) -> str:
    import open_clip
    import torch

    from pipeline.encoders import register_toy_configs

    register_toy_configs()
    path = tmp_path_factory.mktemp("plain") / "toy-vit.pt"
    torch.save(open_clip.create_model("toy-vit").state_dict(), path)
    return str(path)


@pytest.mark.parametrize("route", ROUTES)
def test_the_backbone_guard_raises_on_every_route(tiny_run, plain_toy_weights, monkeypatch, route):
    """The guard of the test above can fail: under the same patches, building the toy CLIP
    by each route raises and is recorded (and without the patches the same call builds it)."""
    routes = _routes(str(tiny_run / "cache/toyclip/model.safetensors"), plain_toy_weights)
    assert list(routes) == ROUTES
    build = routes[route]
    with monkeypatch.context() as m:
        calls = forbid_backbone(m)
        with pytest.raises(BackboneLoaded, match="must not load the backbone"):
            build()
        assert len(calls) == 1
    assert build() is not None  # patches undone: the route really builds a model


def test_the_backbone_guard_covers_names_bound_elsewhere(tiny_run, monkeypatch):
    """Modules that hold their own reference to a loader (``from pipeline.encoders import
    load_encoder``, as extract does) get the guard too, so a backbone load through them
    raises: a stand-in module with such references, and every real one (``tiny_run`` has
    imported every module the pipeline's commands use)."""
    import sys
    import types

    import open_clip

    import pipeline.encoders as encoders

    stand_in = types.ModuleType("stand_in_stage")
    stand_in.load_encoder, stand_in.build = encoders.load_encoder, open_clip.create_model
    monkeypatch.setitem(sys.modules, stand_in.__name__, stand_in)
    originals = {id(getattr(o, a)): a for o, a in _backbone_entry_points()}
    bound = _rebindings(originals)
    assert {(stand_in, "load_encoder"), (stand_in, "build")} <= set(bound)
    calls = forbid_backbone(monkeypatch)
    for module, attr in bound:
        with pytest.raises(BackboneLoaded):
            getattr(module, attr)()
    assert len(calls) == len(bound)


@pytest.mark.distributed
def test_score_on_a_cluster_skips_the_pairs_a_variant_does_not_score(tiny_run, monkeypatch):
    """A retrieval-only reranker beside a choice suite: the cluster makes no task for the pair
    it does not score (fgw, shapes-aro), and writes the single process's metrics files."""
    monkeypatch.chdir(tiny_run)
    outs = {}
    for name, extra in (("single", []), ("cluster", ["--scheduler", "local:2"])):
        params = {**TINY_PARAMS, "score": {**TINY_PARAMS["score"], "variants": ["clip", "fgw"], "suites": ["shapes-aro", "shapes-retrieval"],
                                           "metrics_out": f"metrics-{name}", "scores_out": f"scores-{name}"}}  # fmt: skip
        Path(f"score-{name}.yaml").write_text(yaml.safe_dump(params))
        invoke("score", "--params", f"score-{name}.yaml", "--quiet", *extra)
        outs[name] = {p.relative_to(f"metrics-{name}"): json.loads(p.read_text()) for p in Path(f"metrics-{name}").rglob("*.json")}
    assert sorted(map(str, outs["single"])) == ["clip/shapes-aro.json", "clip/shapes-retrieval.json", "fgw/shapes-retrieval.json"]
    assert outs["cluster"] == outs["single"]


def test_a_variant_that_scores_none_of_the_suites_is_refused_on_a_cluster_too(tiny_run, monkeypatch):
    monkeypatch.chdir(tiny_run)
    import pipeline.distributed

    monkeypatch.setattr(pipeline.distributed, "cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    for extra in ([], ["--scheduler", "local:2"]):
        result = runner.invoke(app, ["score", "--params", "params.yaml", "--quiet", "--variant", "fgw", "--suite", "shapes-aro", *extra])
        assert result.exit_code == 1 and "fgw scores retrieval suites only, and score.suites (shapes-aro) has none" in result.output, result.output


def test_score_refuses_a_store_from_other_weights(tiny_run, monkeypatch):
    monkeypatch.chdir(tiny_run)
    ckpt = Path("cache/toyclip/model.safetensors")
    original = ckpt.read_bytes()
    try:
        ckpt.write_bytes(original + b"\0")  # "retrained" weights
        result = runner.invoke(app, ["score", "--params", "params.yaml", "--quiet"])
        assert result.exit_code == 1
        assert "pretrained: store 'sha256:" in result.output  # the differing field, both values
        assert "`pipeline extract` with extract.replace_mismatch: true" in result.output
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


def test_manifest_command_on_official_files(tmp_path, shared_benchmarks):
    shared = shared_benchmarks / "sugarcrepe"  # absent: fails under CI, skipped locally
    out = tmp_path / "sc.parquet"
    result = invoke("manifest", "--suite", "sugarcrepe", "--root", str(shared), "--out", str(out))
    assert "items" in result.output
    import pandas as pd

    df = pd.read_parquet(out)
    assert {"item_id", "image", "captions", "correct", "category", "length_matched"} <= set(df.columns)
    from pipeline.manifests import file_sha256, manifest_sources

    sources = manifest_sources(out)
    assert sources["swap_att.json"] == file_sha256(shared / "swap_att.json")


def test_source_hashes_cover_cocos_annotations_folder(tmp_path):
    """COCO keeps its files in ``<root>/annotations/``: they are hashed under that path, with
    the root's own files, and images or other suffixes are not."""
    from pipeline.manifests import file_sha256, source_hashes

    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "instances_train2017.json").write_text("{}")
    (tmp_path / "top.json").write_text("[]")
    (tmp_path / "annotations" / "x.jpg").write_bytes(b"img")
    got = source_hashes(tmp_path)
    assert got == {"annotations/instances_train2017.json": file_sha256(tmp_path / "annotations" / "instances_train2017.json"),
                   "top.json": file_sha256(tmp_path / "top.json")}  # fmt: skip


@pytest.mark.parametrize("ci", ["true", "TRUE", "1", "", "false", None])
def test_missing_shared_fails_under_ci_and_skips_locally(tmp_path, monkeypatch, ci):
    """The conftest guard behind ``shared_benchmarks``: a missing ``../shared`` is a failure
    under CI (``CI=true``), a skip only locally."""
    from tests.conftest import require_shared

    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    missing = tmp_path / "no-shared" / "benchmarks"
    expected = pytest.fail.Exception if ci in ("true", "TRUE", "1") else pytest.skip.Exception
    with pytest.raises(expected, match="official benchmark files not found"):
        require_shared("sugarcrepe", root=missing)
    (missing / "sugarcrepe").mkdir(parents=True)
    assert require_shared("sugarcrepe", root=missing) == missing / "sugarcrepe"
