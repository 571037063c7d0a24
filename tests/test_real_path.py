"""The real configuration end to end: ``real/dvc.yaml`` — the pipeline definition a user with
the weights and data runs — reproduced by DVC on stand-in data.

The official annotation formats (SugarCrepe and SugarCrepe++ cut from the official files in
``../shared/benchmarks/``; ARO, What'sUp and COCO in their official formats,
:mod:`tests.real_standin`), random images under the file names the annotations expect, and
``tiny-vit`` (a tiny random-init open_clip ViT) in place of ViT-L-14-336. The test copies
``real/dvc.yaml`` unchanged into a fresh git + DVC project, writes a ``params.yaml`` that is
``real/params.yaml`` with the data folders, the encoder and the step counts replaced, and
runs ``dvc repro``: manifests -> extract -> train (every method, a few steps) -> ridge ->
score -> report (and the images stage before extract). Run it alone with ``pytest -m real_path``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.benchmarks import SUITES
from pipeline.manifests import read_manifest
from tests.real_standin import write_real_standin

pytestmark = [pytest.mark.real_path, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
MISSING = {"sugarcrepe": 1}  # images left out: listed and counted, never dropped silently
EXPECTED = {  # suite -> metrics every scored variant must report on the stand-in data
    "aro-relation": {"relation", "relation-micro"},
    "aro-attribution": {"attribution", "attribution-micro"},
    "aro-coco-order": {"P@1"},
    "sugarcrepe": {"add-att", "replace-rel", "swap-att", "total"},
    "sugarcrepe-pp": {"replace-rel", "swap-att", "total", "TOT"},
    "whatsup-a": {"individual", "pair", "set"},
    "whatsup-b": {"individual", "pair", "set"},
    "coco-families-dev": {"entity", "mean"},
    "coco-objects": {"R@1", "R@5", "R@10", "nDCG@10", "mean-rank"},
}
RETRIEVAL_ONLY = {"fgw", "hungarian", "fgw-hungarian", "ridge-fgw"}  # rerankers: retrieval suites only
CHOICE_ONLY = {"bindclip", "bindclip-lesion"}  # pairwise caption scorers do not rank images


def _params(real: dict, roots: dict[str, tuple[Path, Path]], data: Path) -> dict:
    """``real/params.yaml`` with the stand-in folders (``data`` in place of ``/data``, checked
    to be where the params file points), tiny-vit on the CPU and a few steps."""
    p = json.loads(json.dumps(real))  # a deep copy
    suites = [s for s in p["extract"]["suites"] if s in roots]
    for s in suites:  # the stand-in is laid out as the params file expects the official files under /data
        expected = (p["manifests"]["roots"][s], p["extract"]["image_roots"][s])
        assert tuple(data / Path(e).relative_to("/data") for e in expected) == tuple(map(Path, roots[s])), s
    p["manifests"]["roots"] = {s: str(roots[s][0]) for s in suites}
    p["manifests"]["image_share"] = {s: 0.6 for s in p["manifests"]["image_share"]}  # 15 of 24 images
    p["extract"].update(
        model="tiny-vit", pretrained="none", device="cpu", batch_size=16, skip_missing=True, suites=suites,
        manifests={s: p["extract"]["manifests"][s] for s in suites},
        image_roots={s: str(roots[s][1]) for s in suites},
    )  # fmt: skip
    for v in p["train"]["variants"]:
        p["train"][v].update(encoder="tiny-vit", device="cpu", seeds=[0, 1], steps=4, eval_every=2, batch_size=8,
                             train_items=16, dev_items=10)  # fmt: skip
        if "warmup" in p["train"][v]:
            p["train"][v]["warmup"] = 1
    p["ridge"]["encoder"] = "tiny-vit"
    p["score"].update(encoder="tiny-vit", device="cpu", suites=[s for s in p["score"]["suites"] if s in roots])
    p["report"]["bootstrap"] = 200
    return p


def test_real_params_follow_extract_model_and_device_through_anchors():
    """docs/real.md has a user change ``extract.model`` (e.g. to ``-quickgelu`` for a weights
    file) and ``extract.device``: train, ridge and score must read the same store and device."""
    text = (ROOT / "real" / "params.yaml").read_text()
    p = yaml.safe_load(text)
    encoders = [p["train"][v]["encoder"] for v in p["train"]["variants"]] + [p["ridge"]["encoder"], p["score"]["encoder"]]
    devices = [p["train"][v]["device"] for v in p["train"]["variants"]] + [p["score"]["device"]]
    assert set(encoders) == {p["extract"]["model"]} and set(devices) == {p["extract"]["device"]}
    edited = yaml.safe_load(text.replace("&encoder ViT-L-14-336", "&encoder ViT-L-14-336-quickgelu").replace("&device cuda", "&device cpu"))
    assert {edited["train"][v]["encoder"] for v in p["train"]["variants"]} | {edited["ridge"]["encoder"], edited["score"]["encoder"]} == {"ViT-L-14-336-quickgelu"}
    assert {edited["train"][v]["device"] for v in p["train"]["variants"]} | {edited["score"]["device"]} == {"cpu"}


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, shared_benchmarks):
    """``dvc repro`` of real/dvc.yaml in a fresh project on the stand-in data."""
    project = tmp_path_factory.mktemp("real_project")
    for pkg in ("pipeline", "stages"):  # the code the stages list as deps
        shutil.copytree(ROOT / pkg, project / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "real").mkdir()
    shutil.copyfile(ROOT / "real" / "dvc.yaml", project / "real" / "dvc.yaml")
    roots = write_real_standin(project / "data", shared_benchmarks, missing=MISSING)
    params = _params(yaml.safe_load((ROOT / "real" / "params.yaml").read_text()), roots, project / "data")
    (project / "real" / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run(["git", "init", "-q"], project)
    _run(["dvc", "init", "-q", "--subdir"], project / "real")
    repro = _run(["dvc", "repro"], project / "real")
    return project, params, repro


def test_every_stage_ran_and_a_second_repro_reruns_nothing_but_the_manifests(real_run):
    project, params, repro = real_run
    for stage in ("manifests", "images", "extract", *(f"train@{v}" for v in params["train"]["variants"]), "ridge", "score", "report"):
        assert f"Running stage '{stage}'" in repro.stdout, stage
    again = _run(["dvc", "repro"], project / "real").stdout
    assert "Running stage 'manifests'" in again and "Running stage 'images'" in again  # always_changed: folders outside the repo
    for stage in ("extract", "ridge", "score", "report"):
        assert f"Running stage '{stage}'" not in again, (stage, again)  # same manifests: nothing else


def test_training_suites_hold_no_photograph_of_aro_coco_order(real_run):
    """train2017 re-splits COCO 2014, so the Karpathy-test photographs COCO-Order scores are
    train2017 images: ``manifests.disjoint_from`` drops them from the training families."""
    import pyarrow.parquet as pq

    from pipeline.benchmarks.base import coco_image_id

    project, params, _ = real_run
    out = project / "real" / params["manifests"]["out"]
    order = {coco_image_id(p) for p in read_manifest(out / "aro-coco-order.parquet")["image"]}
    dropped = {}
    for suite in ("coco-families", "coco-families-dev"):
        ids = {coco_image_id(p) for p in read_manifest(out / f"{suite}.parquet")["image"]}
        assert ids and not ids & order, suite
        note = json.loads(pq.read_schema(out / f"{suite}.parquet").metadata[b"pipeline.sources"])["disjoint_from"]
        assert note["suites"] == ["aro-coco-order"], note
        dropped[suite] = note["items_dropped"]
    assert dropped["coco-families"] > 0  # id 3's rows (its validation rows, if any, in coco-families-dev too)


def test_every_suite_has_every_metric_for_every_method(real_run):
    project, params, _ = real_run
    metrics_out = project / "real" / params["score"]["metrics_out"]
    for variant in params["score"]["variants"]:
        for suite, names in EXPECTED.items():
            path = metrics_out / variant / f"{suite}.json"
            retrieval = SUITES.get(suite).task == "retrieval"
            if (variant in RETRIEVAL_ONLY and not retrieval) or (variant in CHOICE_ONLY and retrieval):
                assert not path.exists(), path
                continue
            record = json.loads(path.read_text())
            assert names <= set(record["metrics"]), (variant, suite, sorted(record["metrics"]))
            assert record["encoder"] == "tiny-vit" and record["n_items"] > 0
    for variant in params["score"]["replacement_variants"]:
        for mode in params["score"]["replacements"]:
            assert (metrics_out / f"{variant}@{mode}" / "sugarcrepe.json").is_file()
    for variant in params["score"]["seed_variants"]:
        assert (metrics_out / f"{variant}@seed1" / "aro-relation.json").is_file()


def test_missing_images_are_counted_not_dropped(real_run):
    project, params, _ = real_run
    record = json.loads((project / "real" / params["score"]["metrics_out"] / "clip" / "sugarcrepe.json").read_text())
    assert record["n_missing_images"] >= MISSING["sugarcrepe"]
    manifest_items = len(pd.read_parquet(project / "real" / params["extract"]["manifests"]["sugarcrepe"]))
    assert record["n_items"] + record["n_missing_images"] == manifest_items


def test_trained_on_the_image_disjoint_coco_split(real_run):
    project, params, _ = real_run
    # the image share keeps 15 of the 24 train2017 images, alike in both suites, and
    # disjoint_from drops the one of them (id 3) that ARO COCO-Order shows
    manifests = {s: pd.read_parquet(project / "real" / params["extract"]["manifests"][s]) for s in ("coco-families", "coco-families-dev")}
    families, dev = manifests["coco-families"], manifests["coco-families-dev"]
    assert families["image"].nunique() == 14
    n_train = int((families["split"] == "train").sum())
    for variant in params["train"]["variants"]:
        record = json.loads((project / "real" / params["train"][variant]["out"] / variant / "config.json").read_text())
        assert record["train"]["train_suite"] == "coco-families[train]"
        assert record["train"]["dev_suite"] == "coco-families[validation]"
        summary = json.loads((project / "real" / params["train"][variant]["out"] / variant / "summary.json").read_text())
        assert (summary["train_items"]["items"], summary["dev_items"]["items"]) == (min(16, n_train), 10)  # the seeded samples
    assert dev["item_id"].tolist() == families[families["split"] == "validation"]["item_id"].tolist()


def test_the_report_renders_the_real_suites(real_run):
    project, params, _ = real_run
    report = (project / "real" / params["report"]["out"] / "report.md").read_text()
    for suite in EXPECTED:
        assert f"## {suite}" in report, suite
    assert "## Published figures beside ours" in report and "| whatsup-pooled | pooled-pair | bindclip |" in report
    assert "item(s) left out, their image missing or undecodable at extract" in report  # the missing image is named
    assert report.startswith("# Compositionality report (real benchmarks)")
    assert "failure profile" not in report and "\n| |  |\n" not in report  # no shapes-only or empty tables
    assert "| | bindclip@seed0 | bindclip@seed1 | spread (max−min) |" in report  # training seeds only
    number = r" [0-9.]+ \[[0-9.]+, [0-9.]+\]"  # a filled cell after its "|": value [lo, hi]
    for row in (  # the family tables, on the real suites
        r"\| sugarcrepe \| swap-att \|" + number,  # head to head
        r"\| sugarcrepe-pp \| swap-att \|" + number,
        r"\| `clip` \| own image \|" + number,  # image replacement: relation, attribution, ...
        r"\| `flowclip-cimr` \| fixed \|" + number,
        r"\| aro-relation \| relation \| [0-9.]+ \| [0-9.]+ \|",  # BindCLIP Table 1
        r"\| `global-m` \|" + number,  # the ablation ladder
        r"\| whatsup-a \| individual \| [0-9]+ \| [0-9]+ \|",  # errors corrected and made
    ):
        assert re.search(row, report), row
    assert "aro-coco-order P@1" in report and "### Ablation ladder" in report
    assert "### Lesion and consensus ablation by family (coco-families-dev)" in report


def test_an_image_that_appears_reruns_extract(real_run):
    """The images stage records which images are present; an image that appears after an
    extract skipped it changes that record, and DVC then reruns extract (and only then)."""
    project, params, _ = real_run
    real = project / "real"
    record_file = real / "../cache/real/images.json"
    before = record_file.read_bytes()
    missing = json.loads(before)["suites"]["sugarcrepe"]
    assert len(missing["missing"]) == MISSING["sugarcrepe"]
    image = Path(missing["image_root"]) / missing["missing"][0]
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(image, format="JPEG")
    try:
        _run(["dvc", "repro", "images"], real)
        assert json.loads(record_file.read_bytes())["suites"]["sugarcrepe"]["missing"] == []
        status = _run(["dvc", "status", "extract"], real).stdout
        assert "images.json" in status and "modified" in status, status
    finally:  # the other tests read the run as it was: the image missing again, the record as before
        image.unlink()
        _run(["dvc", "repro", "images"], real)
    assert record_file.read_bytes() == before
    assert "extract" not in _run(["dvc", "status", "extract"], real).stdout
