"""Real benchmark suites through the same extract/score path, on the official annotation files
with stand-in images (the real images are downloads) and the tiny random-init CLIP."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.sugarcrepe_pp import tot_accuracy
from pipeline.config import ExtractConfig, ScoreConfig
from pipeline.manifests import write_manifest
from stages import extract as extract_stage
from stages import score as score_stage
from tests.conftest import make_images


def _stand_in_images(root: Path, names: list[str]) -> None:
    """Random images saved under the official file names."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(path, format="JPEG")


@pytest.fixture
def sc_pp(tmp_path, shared_benchmarks):
    df = SUITES.get("sugarcrepe-pp").build_manifest(shared_benchmarks / "sugarcrepe_pp")
    df = df.groupby("category").head(4).reset_index(drop=True)  # a few items per category
    manifest = write_manifest(df, tmp_path / "sc-pp.parquet", {})
    _stand_in_images(tmp_path / "coco", sorted(set(df["image"])))
    return df, manifest


def sc_pp_extract(tmp_path, manifest, **kw) -> ExtractConfig:
    """The tiny encoder's extract of the SugarCrepe++ sample over its stand-in images."""
    return ExtractConfig(model="tiny-test", pretrained="none", suites=["sugarcrepe-pp"],
                         manifests={"sugarcrepe-pp": str(manifest)}, image_roots={"sugarcrepe-pp": str(tmp_path / "coco")},
                         out=str(tmp_path / "features"), **kw)  # fmt: skip


def test_sugarcrepe_pp_itt_and_tot_from_the_cache(tmp_path, tiny_encoder, sc_pp):
    df, manifest = sc_pp
    ext = sc_pp_extract(tmp_path, manifest)
    extract_stage.run(ext, progress=False, encoder=tiny_encoder)
    cfg = ScoreConfig(
        variants=["clip"],
        suites=["sugarcrepe-pp"],
        encoder="tiny-test",
        scores_out=str(tmp_path / "scores"),
        metrics_out=str(tmp_path / "metrics"),
    )
    (record,) = score_stage.run(cfg, ext, progress=False)
    assert set(df["category"]) <= set(record["metrics"])  # ITT per category
    # TOT from the cache equals TOT from a direct forward pass of the text encoder
    caps = [c for cs in df["captions"] for c in cs]
    emb = tiny_encoder.encode_texts(tiny_encoder.tokenizer(caps))["embed"]
    emb = torch.nn.functional.normalize(emb, dim=-1).double().numpy().reshape(len(df), 3, -1)
    assert record["metrics"]["TOT"] == pytest.approx(tot_accuracy(emb[:, 0], emb[:, 1], emb[:, 2]), abs=1e-6)
    saved = json.loads((tmp_path / "metrics" / "clip" / "sugarcrepe-pp.json").read_text())
    assert saved["metrics"] == record["metrics"]


def test_real_suite_without_images_fails_clearly(tmp_path, tiny_encoder, shared_benchmarks):
    df = SUITES.get("sugarcrepe").build_manifest(shared_benchmarks / "sugarcrepe").head(30)
    manifest = write_manifest(df, tmp_path / "sc.parquet", {})
    make_images(tmp_path / "coco", 1)
    ext = ExtractConfig(
        model="tiny-test",
        suites=["sugarcrepe"],
        manifests={"sugarcrepe": str(manifest)},
        image_roots={"sugarcrepe": str(tmp_path / "coco")},
        out=str(tmp_path / "features"),
    )
    n = df["image"].nunique()
    with pytest.raises(FileNotFoundError, match=rf"{len(df)} image\(s\) not found .*sugarcrepe: {len(df)} under {tmp_path / 'coco'} \({df['image'].iloc[0]}"):
        extract_stage.run(ext, progress=False, encoder=tiny_encoder)
    assert n > 1


def test_sugarcrepe_pp_tot_counts_the_items_whose_image_is_missing(tmp_path, tiny_encoder, sc_pp, monkeypatch):
    """TOT reads captions only: the official script counts every item, so an item whose image
    could not be read leaves ITT but not TOT."""
    df, manifest = sc_pp
    (tmp_path / "coco" / df["image"][0]).unlink()
    ext = sc_pp_extract(tmp_path, manifest, skip_missing=True)
    extract_stage.run(ext, progress=False, encoder=tiny_encoder)
    seen = []
    real = score_stage.text_only_metrics

    def spy(suite, store, manifest, index):
        seen.append(manifest["item_id"].tolist())
        return real(suite, store, manifest, index)

    monkeypatch.setattr(score_stage, "text_only_metrics", spy)
    cfg = ScoreConfig(variants=["clip"], suites=["sugarcrepe-pp"], encoder="tiny-test",
                      scores_out=str(tmp_path / "scores"), metrics_out=str(tmp_path / "metrics"))
    (record,) = score_stage.run(cfg, ext, progress=False)
    assert record["n_items"] < len(df)  # ITT leaves the item out
    assert seen == [df["item_id"].tolist()]  # TOT does not


def test_the_categories_a_manifest_lacks_and_tot_reach_the_metrics_files_and_the_report(tmp_path, tiny_encoder, sc_pp):
    """The official folder here holds 2 of SugarCrepe++'s 5 category files. The manifest's record
    of them (not the categories its rows happen to hold: this one is cut to one category) goes
    into every metrics file; the report says over how many categories `total` and TOT are taken
    and shows TOT as the metrics files record it; a manifest without the record is read as its
    rows show."""
    from pipeline.config import ReportConfig
    from pipeline.manifests import manifest_coverage
    from pipeline.report import ReportContext
    from pipeline.report.sections import suites
    from stages.report import load_results

    df, _ = sc_pp
    coverage = SUITES.get("sugarcrepe-pp").category_coverage(df)
    assert coverage == {"present": ["replace-rel", "swap-att"], "missing": ["replace-obj", "replace-att", "swap-obj"]}
    cut = df[df["category"] == "replace-rel"].reset_index(drop=True)
    manifest = write_manifest(cut, tmp_path / "cut.parquet", {}, coverage)
    ext = sc_pp_extract(tmp_path, manifest)
    extract_stage.run(ext, progress=False, encoder=tiny_encoder)
    cfg = ScoreConfig(variants=["clip", "local-max"], suites=["sugarcrepe-pp"], encoder="tiny-test",
                      scores_out=str(tmp_path / "scores"), metrics_out=str(tmp_path / "metrics"))  # fmt: skip
    records = score_stage.run(cfg, ext, progress=False)
    for record in records:
        saved = json.loads((tmp_path / "metrics" / record["variant"] / "sugarcrepe-pp.json").read_text())
        assert saved["categories_present"] == ["replace-rel", "swap-att"]
        assert saved["categories_missing"] == ["replace-obj", "replace-att", "swap-obj"]
    results = load_results(cfg, ext)
    entry = results["sugarcrepe-pp"]
    assert entry["categories"] == coverage
    assert entry["text_metrics"] == {k: v for k, v in records[0]["metrics"].items() if k.startswith("TOT")}
    ctx = ReportContext(results, ReportConfig(out=str(tmp_path / "report"), bootstrap=100, examples=0), cfg, ext, tmp_path / "report")
    text = "\n\n".join(suites(ctx))
    assert "`total` and `TOT` over 2 of 5 categories (missing: replace-obj, replace-att, swap-obj" in text
    tot = records[0]["metrics"]["TOT"]
    assert f"| frozen `tiny-test` | {100 * records[0]['metrics']['TOT-replace-rel']:.1f} | {100 * tot:.1f} |" in text
    plain = write_manifest(cut, tmp_path / "plain.parquet", {})  # no record: the rows' categories
    assert manifest_coverage(plain, SUITES.get("sugarcrepe-pp"), cut)["missing"] == ["replace-obj", "replace-att", "swap-obj", "swap-att"]
