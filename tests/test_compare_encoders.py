"""`pipeline compare-encoders` end to end on two tiny random-init encoders: a tiny world,
each encoder extracted into its own store, a trainable variant trained on each, every
variant scored, the summary written and shown by the report section."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app

SUITES = ["shapes-whatsup", "shapes-aro", "shapes-sugarcrepe", "shapes-retrieval", "shapes-train", "shapes-dev"]
PARAMS = {
    "world": {"seed": 0, "n_whatsup": 3, "n_aro": 4, "n_sugarcrepe": 3, "n_retrieval_groups": 2, "n_train": 16, "n_dev": 16, "suites": SUITES},
    "extract": {"world": "cache/world", "out": "cache/features", "batch_size": 32, "suites": SUITES},
    "train": {
        "variants": ["global-m"],
        "global-m": {"steps": 4, "batch_size": 8, "eval_every": 2, "seeds": [0], "lr": 1e-3},
    },
    "score": {"variants": ["clip", "global-m"], "suites": SUITES[:4] + ["shapes-dev"], "seed_suites": ["shapes-dev"]},
    "compare": {
        "encoders": ["tiny-a", "tiny-b"],
        "variants": ["clip", "global-m"],
        "suites": SUITES[:4],
        "pretrained": {"tiny-a": "none", "tiny-b": "none"},
        "bootstrap": 200,
    },
}
TINY = {  # the toy's input size and context length, far narrower
    "embed_dim": 24,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 32, "patch_size": 16, "head_width": 16},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    import open_clip

    from pipeline.encoders import ENCODERS, EncoderSpec

    root = tmp_path_factory.mktemp("compare")
    for name, layers in (("tiny-a", 2), ("tiny-b", 3)):  # two architectures, random init
        cfg = {**TINY, "vision_cfg": {**TINY["vision_cfg"], "layers": layers}}
        (root / f"{name}-vit.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(root / f"{name}-vit.json")
        if name not in ENCODERS:
            ENCODERS.register(name, EncoderSpec(name, f"{name}-vit", early_layer=1, default_pretrained="none"))
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    runner = CliRunner()
    old = os.getcwd()
    os.chdir(root)
    try:
        for args in (["world", "--quiet"], ["compare-encoders", "--quiet"]):
            result = runner.invoke(app, [*args, "--params", "params.yaml"])
            assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
        yield root
    finally:
        os.chdir(old)


def test_each_encoder_gets_its_own_store_checkpoints_and_metrics(compared):
    summary = json.loads((compared / "reports/encoders/summary.json").read_text())
    assert list(summary["encoders"]) == ["tiny-a", "tiny-b"]
    for enc in ("tiny-a", "tiny-b"):
        assert (compared / f"cache/encoders/{enc}/features/{enc}.zarr").is_dir()
        assert not (compared / f"cache/features/{enc}.zarr").exists()  # not the extract stage's output
        assert (compared / f"cache/encoders/{enc}/checkpoints/global-m/model.safetensors").is_file()
        for variant in ("clip", "global-m"):
            record = json.loads((compared / f"reports/encoders/{enc}/{variant}/shapes-aro.json").read_text())
            assert record["encoder"] == enc and record["variant"] == variant
        means = summary["encoders"][enc]["variants"]
        assert set(means) == {"clip", "global-m"}
        for name in ("all-task", "binding"):
            m = means["global-m"]["means"][name]
            assert m["lo"] <= m["value"] <= m["hi"] and m["diff_lo"] <= m["diff"] <= m["diff_hi"]
        assert "diff" not in means["clip"]["means"]["all-task"]  # the baseline has no Δ to itself
    a, b = (summary["encoders"][e]["variants"]["clip"]["tasks"] for e in ("tiny-a", "tiny-b"))
    assert a.keys() == b.keys() and a != b  # two encoders, two sets of numbers


def test_the_report_section_shows_every_encoder(compared):
    from pipeline.config import ReportConfig
    from pipeline.report.encoders import encoder_comparison
    from pipeline.report.tasks import REAL, SHAPES

    class Ctx:
        cfg = ReportConfig(encoders=str(compared / "reports/encoders/summary.json"))
        layout = SHAPES

    text = "\n".join(encoder_comparison(Ctx()))
    assert "tiny-a (tiny-a-vit)" in text and "tiny-b (tiny-b-vit)" in text and "`global-m` | binding" in text
    Ctx.layout = REAL  # the comparison trains toy encoders: the real report leaves it out
    assert encoder_comparison(Ctx()) == []
    Ctx.cfg, Ctx.layout = ReportConfig(encoders=str(compared / "absent.json")), SHAPES
    assert "pipeline compare-encoders" in "\n".join(encoder_comparison(Ctx()))


def test_the_pipelines_own_encoder_is_read_from_its_current_scores(compared):
    """A column that reused the pipeline's scores is recomputed from the scores the report
    reads, so a later `dvc repro` never leaves a stale copy in the table."""
    from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
    from pipeline.report.encoders import encoder_comparison
    from pipeline.report.tasks import SHAPES
    from stages.report import load_results

    summary = json.loads((compared / "reports/encoders/summary.json").read_text())
    stale = json.loads(json.dumps(summary))
    stale["encoders"]["tiny-a"]["reused_pipeline_scores"] = True
    for record in stale["encoders"]["tiny-a"]["variants"].values():
        for m in record["means"].values():
            m.update(value=0.0, lo=0.0, hi=0.0)  # a stale copy: 0.0 [0.0, 0.0]
    path = compared / "stale.json"
    path.write_text(json.dumps(stale))
    score = ScoreConfig(variants=["clip", "global-m"], suites=SUITES[:4], encoder="tiny-a",
                        scores_out=str(compared / "cache/encoders/tiny-a/scores"))  # fmt: skip
    extract = ExtractConfig(model="tiny-a", world=str(compared / "cache/world"))
    results = load_results(score, extract)

    class Ctx:
        cfg = ReportConfig(encoders=str(path))
        layout = SHAPES

    Ctx.extract, Ctx.results, Ctx.score = extract, results, score
    text = "\n".join(encoder_comparison(Ctx()))
    assert "0.0 [0.0, 0.0]" not in text
    fresh = summary["encoders"]["tiny-a"]["variants"]["clip"]["means"]["all-task"]
    assert f"{100 * fresh['value']:.1f} [{100 * fresh['lo']:.1f}, {100 * fresh['hi']:.1f}]" in text


def test_the_section_names_the_variants_each_encoder_scored_at_step_0(compared, tmp_path):
    """The summary records the step each trained variant's scored checkpoint kept; a variant
    kept at step 0 (its initialisation: a Flow-CLIP variant then scores as `clip`) is named
    under the table, so its +0.0 rows do not read as an effect of training."""
    from pipeline.config import ReportConfig
    from pipeline.report.encoders import encoder_comparison
    from pipeline.report.tasks import SHAPES

    summary = json.loads((compared / "reports/encoders/summary.json").read_text())
    for enc in ("tiny-a", "tiny-b"):
        steps = summary["encoders"][enc]["selected_steps"]
        assert set(steps) == {"global-m"} and isinstance(steps["global-m"], int)
    summary["encoders"]["tiny-a"]["selected_steps"] = {"global-m": 0}
    summary["encoders"]["tiny-b"]["selected_steps"] = {"global-m": 4}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))

    class Ctx:
        cfg = ReportConfig(encoders=str(path))
        layout = SHAPES

    text = "\n".join(encoder_comparison(Ctx()))
    assert "Scored at step 0" in text and "`global-m` on `tiny-a`." in text and "on `tiny-b`" not in text
    summary["encoders"]["tiny-a"]["selected_steps"] = {"global-m": 2}
    path.write_text(json.dumps(summary))
    assert "Scored at step 0" not in "\n".join(encoder_comparison(Ctx()))
    for e in summary["encoders"].values():  # a summary written before the record: no sentence
        del e["selected_steps"]
    path.write_text(json.dumps(summary))
    assert "Scored at step 0" not in "\n".join(encoder_comparison(Ctx()))


def test_a_comparison_of_other_manifests_is_not_shown(compared, tmp_path):
    """The summary records each compared suite's manifest hash; when the report reads another
    manifest of a suite (the world was rebuilt since), or the summary records none, the
    section names the suites and the command instead of the table."""
    from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
    from pipeline.manifests import file_sha256
    from pipeline.report.encoders import encoder_comparison
    from pipeline.report.tasks import SHAPES
    from stages.report import load_results

    summary = json.loads((compared / "reports/encoders/summary.json").read_text())
    world = compared / "cache/world"
    assert summary["manifests"] == {s: file_sha256(world / "manifests" / f"{s}.parquet") for s in SUITES[:4]}
    score = ScoreConfig(variants=["clip", "global-m"], suites=SUITES[:4], encoder="tiny-a",
                        scores_out=str(compared / "cache/encoders/tiny-a/scores"))  # fmt: skip

    class Ctx:
        cfg = ReportConfig(encoders=str(compared / "reports/encoders/summary.json"))
        layout = SHAPES
        extract = ExtractConfig(model="tiny-a", world=str(world))
        results = load_results(score, extract)

    assert "| `global-m` | binding |" in "\n".join(encoder_comparison(Ctx()))
    Ctx.results["shapes-aro"]["manifest_sha256"] = "0" * 64  # the world rebuilt since
    text = "\n".join(encoder_comparison(Ctx()))
    assert "other manifests of shapes-aro than" in text and "rerun `pipeline compare-encoders`" in text
    assert "| `global-m` |" not in text
    del summary["manifests"]  # a summary of an older pipeline: nothing to check it by
    (tmp_path / "old.json").write_text(json.dumps(summary))
    Ctx.cfg = ReportConfig(encoders=str(tmp_path / "old.json"))
    assert "other manifests of shapes-whatsup, shapes-aro, shapes-sugarcrepe, shapes-retrieval" in "\n".join(
        encoder_comparison(Ctx())
    )


def test_one_encoder_is_refused(tmp_path):
    from pipeline.config import (
        CompareConfig,
        ExtractConfig,
        ScoreConfig,
        ToyClipConfig,
    )
    from stages import compare

    with pytest.raises(ValueError, match="at least two distinct encoders"):
        compare.run(CompareConfig(encoders=["toy", "toy"]), ToyClipConfig(), ExtractConfig(), {}, ScoreConfig())


def test_each_encoder_column_holds_its_own_mean_and_difference(tmp_path):
    """A hand-made summary with a different number in every field: each row prints encoder
    A's mean and Δ, then encoder B's, under their headers; the baseline has no Δ."""
    from pipeline.config import ReportConfig
    from pipeline.report.encoders import encoder_comparison
    from pipeline.report.tasks import SHAPES

    def means(k: float, diff: bool) -> dict:
        m = {"value": k, "lo": k - 0.01, "hi": k + 0.01}
        return {**m, "diff": k / 10, "diff_lo": k / 10 - 0.001, "diff_hi": k / 10 + 0.001} if diff else m

    encoders = {
        enc: {"open_clip_model": f"{enc}-vit", "variants": {
            v: {"means": {"all-task": means(base + 0.1 * j, v != "clip"), "binding": means(base + 0.1 * j + 0.05, v != "clip")}}
            for j, v in enumerate(("clip", "global-m"))
        }}  # fmt: skip
        for enc, base in (("enc-a", 0.2), ("enc-b", 0.6))
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"encoders": encoders, "variants": ["clip", "global-m"], "manifests": {}}))

    class Ctx:
        cfg = ReportConfig(encoders=str(path))
        layout = SHAPES

    table = [[c.strip() for c in line.strip("|").split("|")] for line in encoder_comparison(Ctx())[-1].splitlines()]
    assert table[0] == ["variant", "mean", "enc-a (enc-a-vit)", "Δ vs `clip`", "enc-b (enc-b-vit)", "Δ vs `clip`"]
    rows = {(r[0], r[1]): r[2:] for r in table[2:]}
    assert rows["`clip`", "all-task"] == ["20.0 [19.0, 21.0]", "–", "60.0 [59.0, 61.0]", "–"]
    assert rows["`global-m`", "binding"] == ["35.0 [34.0, 36.0]", "+3.5 [+3.4, +3.6]", "75.0 [74.0, 76.0]", "+7.5 [+7.4, +7.6]"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"pretrained": {"toyy": "none"}}, r"compare.pretrained names \['toyy'\], not among compare.encoders \(toy, toy-small\)"),
        ({"suites": []}, r"compare.variants and compare.suites must each name at least one entry"),
        ({"variants": []}, r"compare.variants and compare.suites must each name at least one entry"),
    ],
)
def test_a_comparison_that_would_silently_run_something_else_is_refused(change, needle):
    from pipeline.config import (
        CompareConfig,
        ExtractConfig,
        ScoreConfig,
        ToyClipConfig,
    )
    from stages import compare

    with pytest.raises(ValueError, match=needle):
        compare.run(CompareConfig(**change), ToyClipConfig(), ExtractConfig(), {}, ScoreConfig(), progress=False)


def test_a_toy_encoder_trained_by_other_code_is_trained_again(tmp_path, monkeypatch):
    """The comparison keeps a toy encoder's weights by the toy trainer's own record (its
    configuration, open_clip config and code, which renders the scenes it learns from), as
    the ``toyclip`` stage does: the same settings under edited code train it again instead
    of comparing a model of another world."""
    from pathlib import Path

    import pipeline
    import pipeline.world
    from pipeline.config import CompareConfig
    from stages.compare import toy_weights
    from tests.test_toyclip import tiny_cfg, tiny_world

    rendered: list[int] = []

    def world(seed, indices, image_size):
        rendered.append(len(indices))
        return tiny_world(seed, indices, image_size)

    monkeypatch.setattr(pipeline.world, "training_batch", world)
    cfg, toy = CompareConfig(out=str(tmp_path / "encoders")), tiny_cfg(tmp_path)
    path = toy_weights(cfg, toy, "toy-small", "toy-vit-small", progress=False)
    assert rendered and path == str(tmp_path / "encoders" / "toy-small" / "toyclip" / "model.safetensors")
    weights, rendered[:] = Path(path).read_bytes(), []
    assert toy_weights(cfg, toy, "toy-small", "toy-vit-small", progress=False) == path
    assert rendered == [] and Path(path).read_bytes() == weights  # the same code: kept
    monkeypatch.setattr(pipeline, "code_identity", lambda: "another world's scenes")
    toy_weights(cfg, toy, "toy-small", "toy-vit-small", progress=False)
    assert rendered  # trained again
