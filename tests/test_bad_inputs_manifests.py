"""Bad manifests and official annotation files, given to the real ``pipeline`` command: each
is refused with one ``error:`` line naming the file, the item (or row) and the fix, never
a silent drop of items from a metric, an output file that was never written, or a bare
``KeyError``. Helpers and fixtures are ``tests/test_bad_inputs.py``'s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.manifests import resolve_source
from tests import test_bad_inputs
from tests.test_bad_inputs import (
    ROOT,
    SUITE,
    cli,
    entry,
    item,
    manifest_cmd,
    official,
    ok,
    refused,
    with_image,
    write_manifest,
    write_params,
)

pytestmark = [
    pytest.mark.bad_input,
    pytest.mark.filterwarnings("ignore:SugarCrepe.*lacks:UserWarning"),  # a few category files of seven
]

images = test_bad_inputs.images  # the battery's module fixture: eight good 28-pixel images


def extract_with(tmp: Path, images: tuple[Path, list[str]], row: int, **edit: object) -> tuple[Path, Path]:
    """The eight good shapes-sugarcrepe items with ``edit`` applied to item ``row``, written
    as a manifest; its path and params."""
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[row].update(edit)
    manifest = write_manifest(tmp / "m.parquet", rows)
    return manifest, write_params(tmp, manifest, folder)


# ---------------------------------------------------------------- category (P6)


@pytest.mark.parametrize("value,shown", [(None, "it3: null"), ("swap-atr", "it3: 'swap-atr'")], ids=["null", "misspelt"])
def test_a_category_outside_the_suites_is_refused(tmp_path, images, value, shown):
    manifest, params = extract_with(tmp_path, images, 3, category=value)
    line = refused(cli("extract", "--params", params, "--quiet"), str(manifest), "1 item(s) have a category", shown, "fix the category column")
    assert "valid categories: replace-obj, replace-att, replace-rel, swap-obj, swap-att, add-obj, add-att" in line


def _minimal(suite_name: str, categories: tuple[str, ...]) -> pd.DataFrame:
    """A manifest with the columns check_manifest reads, one row per category of the suite."""
    retrieval = SUITES.get(suite_name).task == "retrieval"
    return pd.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(len(categories))],
            "image": [f"{k}.png" for k in range(len(categories))],
            "captions": [["q"] if retrieval else ["a", "b"] for _ in categories],
            "correct": 0,
            "category": list(categories),
        }
    )


@pytest.mark.parametrize("name", [n for n in SUITES.names() if getattr(SUITES.get(n), "categories", None) is not None])
def test_every_suite_with_fixed_categories_refuses_another(name):
    suite = SUITES.get(name)
    good = _minimal(name, suite.categories)
    suite.check_manifest(good, "m.parquet")  # each of its own categories is accepted
    for value in ("bogus", None):
        bad = good.copy()
        bad.loc[len(bad) - 1, "category"] = value
        with pytest.raises(ValueError, match=rf"m\.parquet: 1 item\(s\) have a category that is not one of {name}'s") as e:
            suite.check_manifest(bad, "m.parquet")
        assert f"i{len(bad) - 1}: {'null' if value is None else repr(value)}" in str(e.value) and ", ".join(suite.categories) in str(e.value)


def test_the_suites_with_category_metrics_have_fixed_categories():
    """The suites whose metrics or reports group items by ``category`` all declare them."""
    for name in ("sugarcrepe", "sugarcrepe-pp", "shapes-sugarcrepe", "shapes-aro", "whatsup-coco", "whatsup-vg"):
        assert getattr(SUITES.get(name), "categories", None), name


# ---------------------------------------------------------------- item_id and correct (P10)


def test_a_null_item_id_is_refused_naming_its_row(tmp_path, images):
    manifest, params = extract_with(tmp_path, images, 3, item_id=None)
    refused(cli("extract", "--params", params, "--quiet"), str(manifest), "1 row(s) have a null item_id (row 3, counted from 0)", "unique item_id")


def test_two_null_item_ids_are_named_as_nulls_not_a_repeated_nan(tmp_path, images):
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[2]["item_id"] = rows[5]["item_id"] = None
    manifest = write_manifest(tmp_path / "m.parquet", rows)
    line = refused(cli("extract", "--params", write_params(tmp_path, manifest, folder), "--quiet"), str(manifest), "2 row(s) have a null item_id (row 2, 5")
    assert "nan" not in line


def test_a_null_correct_names_its_own_item(tmp_path, images):
    manifest, params = extract_with(tmp_path, images, 3, correct=None)
    assert pd.read_parquet(manifest)["correct"].dtype == np.float64  # Parquet made the column float
    line = refused(cli("extract", "--params", params, "--quiet"), str(manifest), "item it3: correct is null", "(1 item(s) in all)")
    assert "it0" not in line


def test_a_float_correct_column_without_nulls_is_still_refused():
    df = _minimal("shapes-sugarcrepe", ("swap-att", "add-att"))
    df["correct"] = [0.0, 1.0]
    with pytest.raises(ValueError, match=r"item i0: correct must be an integer index into captions \(2 item"):
        SUITES.get("shapes-sugarcrepe").check_manifest(df, "m.parquet")


# ---------------------------------------------------------------- missing manifest (P10)


def test_a_missing_custom_manifest_names_the_params_key_not_pipeline_world(tmp_path, images):
    _, params = extract_with(tmp_path, images, 0)
    gone = tmp_path / "m.parquet"
    gone.unlink()
    line = refused(cli("extract", "--params", params, "--quiet"), f"manifest of {SUITE} not found at {gone}", f"extract.manifests.{SUITE}", "correct that path")
    assert "pipeline world`" not in line


def test_a_missing_world_manifest_still_says_run_pipeline_world(tmp_path):
    own = tmp_path / "world" / "manifests" / f"{SUITE}.parquet"
    with pytest.raises(FileNotFoundError, match="run `pipeline world`"):
        resolve_source(SUITE, tmp_path / "world", {}, {})
    with pytest.raises(FileNotFoundError, match="run `pipeline world`"):  # the same file named explicitly
        resolve_source(SUITE, tmp_path / "world", {SUITE: str(own)}, {})


def test_a_missing_real_manifest_names_the_build_command(tmp_path):
    gone = tmp_path / "sc.parquet"
    with pytest.raises(FileNotFoundError, match=r"extract\.manifests\.sugarcrepe names.*`pipeline manifest --suite sugarcrepe --root DIR"):
        resolve_source("sugarcrepe", tmp_path, {"sugarcrepe": str(gone)}, {})


# ---------------------------------------------------------------- images (P10)


def test_a_corrupt_image_is_named_without_a_buffer_address(tmp_path, images):
    params = with_image(tmp_path, images, "corrupt.png", b"GIF89a not really a gif")
    line = refused(cli("extract", "--params", params, "--quiet"), "1 image(s) cannot be decoded", str(tmp_path / "images" / "corrupt.png"), "extract.skip_bad_images: true")
    assert "BytesIO" not in line and " at 0x" not in line
    assert line.count("corrupt.png") == 1  # the reason names the file; the listing does not again


# ---------------------------------------------------------------- official files (P9, P10)


def test_an_empty_sugarcrepe_file_is_named(tmp_path):
    path = official(tmp_path / "sc", "{}")
    refused(manifest_cmd(tmp_path), str(path), "holds no item (an empty JSON object)", "RAIVNLab/sugar-crepe")
    assert not (tmp_path / "sc.parquet").exists()


def pp_entry(i: int, **fields: object) -> dict:
    base = {"id": i, "filename": "000000000139.jpg", "caption": "a red car", "caption2": "a car that is red", "negative_caption": "a blue car"}
    return {**base, **fields}


def pp_cmd(tmp: Path, entries: list[dict]) -> tuple[Path, object]:
    """``pipeline manifest --suite sugarcrepe-pp`` over ``pp/swap_att.json`` holding ``entries``."""
    (tmp / "pp").mkdir()
    path = tmp / "pp" / "swap_att.json"
    path.write_text(json.dumps(entries))
    return path, cli("manifest", "--suite", "sugarcrepe-pp", "--root", tmp / "pp", "--out", tmp / "pp.parquet")


def test_an_empty_sugarcrepe_pp_file_is_named_not_the_output(tmp_path):
    path, result = pp_cmd(tmp_path, [])
    line = refused(result, str(path), "holds no entry (an empty JSON list)", "Sri-Harsha/scpp")
    assert "pp.parquet" not in line


def test_a_repeated_sugarcrepe_pp_id_names_the_json_file_not_the_output(tmp_path):
    path, result = pp_cmd(tmp_path, [pp_entry(0), pp_entry(1), pp_entry(0, caption="a red bus")])
    line = refused(result, str(path), "1 id(s) appear in more than one entry (items swap-att/0)", "fix the file")
    assert "pp.parquet" not in line and not (tmp_path / "pp.parquet").exists()


@pytest.mark.parametrize(("value", "shown_as"), [(None, "null"), ([1], "[1]"), ("7", '"7"')])
def test_a_sugarcrepe_pp_id_that_is_not_an_integer_is_named(tmp_path, value, shown_as):
    """The item id is built from ``id``: null or a list would give ids such as
    ``swap-att/None``, so the entry is refused with the file and the value."""
    path, result = pp_cmd(tmp_path, [pp_entry(0), {**pp_entry(1), "id": value}])
    refused(result, str(path), f"entry 1: 'id' is {shown_as}; expected an integer id")


def test_a_field_missing_from_an_aro_file_names_the_file_and_the_field(tmp_path):
    (tmp_path / "aro").mkdir()
    path = tmp_path / "aro" / "visual_genome_relation.json"
    good = {"image_path": "1.jpg", "bbox_x": 0, "bbox_y": 0, "bbox_w": 5, "bbox_h": 5, "true_caption": "a on b", "false_caption": "b on a", "relation_name": "on"}
    path.write_text(json.dumps([good, {k: v for k, v in good.items() if k != "true_caption"}]))
    refused(cli("manifest", "--suite", "aro-relation", "--root", tmp_path / "aro", "--out", tmp_path / "r.parquet"), str(path), "entry 1: 'true_caption' is missing", "official file")


def test_an_image_share_that_keeps_no_item_is_refused(tmp_path):
    from pipeline.benchmarks.base import hash_unit

    (tmp_path / "aro").mkdir()
    entry = {"image_path": "1.jpg", "bbox_x": 0, "bbox_y": 0, "bbox_w": 5, "bbox_h": 5, "true_caption": "a on b", "false_caption": "b on a", "relation_name": "on"}
    (tmp_path / "aro" / "visual_genome_relation.json").write_text(json.dumps([entry]))
    share = hash_unit("1.jpg") / 2  # below the one image's hash: nothing kept
    params = tmp_path / "params.yaml"
    params.write_text(f"manifests:\n  out: {tmp_path / 'out'}\n  roots:\n    aro-relation: {tmp_path / 'aro'}\n  image_share:\n    aro-relation: {share}\n")
    refused(cli("manifests", "--params", params), "manifests.image_share.aro-relation", "keeps none of its 1 items")
    assert not (tmp_path / "out" / "aro-relation.parquet").exists()


def test_an_aro_entry_that_is_not_an_object_is_named(tmp_path):
    (tmp_path / "aro").mkdir()
    path = tmp_path / "aro" / "visual_genome_relation.json"
    path.write_text(json.dumps(["1.jpg"]))
    refused(cli("manifest", "--suite", "aro-relation", "--root", tmp_path / "aro", "--out", tmp_path / "r.parquet"), str(path), 'entry 0 is "1.jpg", not a JSON object')


def test_a_short_whatsup_qa_entry_is_named(tmp_path):
    (tmp_path / "wu").mkdir()
    (tmp_path / "wu" / "coco_qa_one_obj.json").write_text(json.dumps([[139, "a dog on the left", "a dog on the right"]]))
    two = tmp_path / "wu" / "coco_qa_two_obj.json"
    two.write_text(json.dumps([[139, "a dog left of a cat"]]))
    refused(cli("manifest", "--suite", "whatsup-coco", "--root", tmp_path / "wu", "--out", tmp_path / "w.parquet"), str(two), "entry 0", "not a list of 3 values")


# ---------------------------------------------------------------- warnings (P10)


def test_missing_category_files_are_reported_on_one_line_through_the_installed_command(tmp_path):
    official(tmp_path / "sc", f'{{"0": {entry()}}}')
    run = subprocess.run(
        [Path(sys.executable).parent / "pipeline", "manifest", "--suite", "sugarcrepe", "--root", tmp_path / "sc", "--out", tmp_path / "sc.parquet"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"warning: SugarCrepe: {tmp_path / 'sc'} lacks replace_obj.json, "), lines[0]
    assert "add_obj.json" in lines[0] and "those categories are skipped" in lines[0]
    assert "every aggregate covers only the 1 of 7 present" in lines[0]
    assert "cli.py" not in lines[0]


@pytest.mark.parametrize("suite,build", [("shapes-aro", "`pipeline world`"), ("sugarcrepe", "`pipeline manifest --suite sugarcrepe --root DIR --out ")])
def test_a_recorded_manifest_that_is_gone_names_the_command_that_builds_it(tmp_path, suite, build):
    """Scoring without a configured manifest reads the one the store recorded; when that
    file is gone the fix depends on the suite: the world writes shapes suites, `pipeline
    manifest` the real ones."""
    from types import SimpleNamespace

    from pipeline.scoring import suite_inputs

    gone = tmp_path / "gone.parquet"
    store = SimpleNamespace(suites=lambda: [suite], suite_attrs=lambda s: {"manifest": str(gone)}, suite_index=lambda s, **k: {})
    with pytest.raises(FileNotFoundError) as e:
        suite_inputs(store, suite)
    assert str(gone) in str(e.value) and build in str(e.value) and f"extract.manifests.{suite}" in str(e.value)


def test_a_missing_manifest_is_refused_before_the_model_loads_or_the_store_is_touched(tmp_path, monkeypatch):
    """The manifests are checked first: no model load (15 s for ViT-L-14-336), no store
    folder, no lock file, in one process and on a cluster."""
    import pipeline.extraction as extraction
    from pipeline.config import ExtractConfig
    from pipeline.distributed import extract_distributed

    monkeypatch.setattr(extraction, "load_encoder", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr("pipeline.encoders.load_encoder", lambda *a, **k: pytest.fail("the model loaded"))
    cfg = ExtractConfig(model="tiny-vit", pretrained="none", suites=[SUITE], manifests={SUITE: str(tmp_path / "gone.parquet")},
                        image_roots={SUITE: str(tmp_path)}, out=str(tmp_path / "features"))  # fmt: skip
    for run in (lambda: extraction.extract(cfg, progress=False), lambda: extract_distributed(cfg, "local:1", progress=False)):
        with pytest.raises(FileNotFoundError, match=f"manifest of {SUITE} not found at"):
            run()
        assert not (tmp_path / "features").exists()


@pytest.mark.parametrize(
    ("disjoint", "says"),
    [
        ("{aro-relation: [aro-relation]}", "manifests.disjoint_from.aro-relation names aro-relation itself"),
        ("{aro-relation: [coco-familes]}", "manifests.disjoint_from.aro-relation names unknown suite(s) coco-familes; valid suites:"),
        ("{aro-relaton: [coco-families]}", "manifests.disjoint_from.aro-relaton names unknown suite(s) aro-relaton; valid suites:"),
    ],
)
def test_a_disjoint_from_entry_naming_the_suite_itself_or_no_suite_is_refused(tmp_path, disjoint, says):
    """A ``manifests.disjoint_from`` entry that names its own suite is refused as such, and a
    misspelt suite on either side with the valid suites; neither is told to be added to
    manifests.roots."""
    params = tmp_path / "params.yaml"
    params.write_text(f"manifests:\n  out: {tmp_path / 'out'}\n  roots:\n    aro-relation: {tmp_path}\n  disjoint_from: {disjoint}\n")
    line = refused(cli("manifests", "--params", params), says)
    assert "add to manifests.roots" not in line


def test_manifest_out_as_a_folder_writes_the_suite_file_inside_and_an_empty_out_is_refused(tmp_path):
    """`manifest --out <folder>` (an existing folder, or a path ending in '/') writes
    ``<folder>/<suite>.parquet``; an empty --out is refused as empty."""
    root = tmp_path / "aro"
    root.mkdir()
    entry = {"image_path": "1.jpg", "bbox_x": 0, "bbox_y": 0, "bbox_w": 5, "bbox_h": 5, "true_caption": "a on b", "false_caption": "b on a", "relation_name": "on"}
    (root / "visual_genome_relation.json").write_text(json.dumps([entry]))
    (tmp_path / "out").mkdir()
    for out in (tmp_path / "out", f"{tmp_path / 'new'}/"):
        ok(cli("manifest", "--suite", "aro-relation", "--root", root, "--out", out))
        assert len(pd.read_parquet(Path(out) / "aro-relation.parquet")) == 1
    refused(cli("manifest", "--suite", "aro-relation", "--root", root, "--out", ""), "--out is empty")


def test_image_presence_stats_every_named_image_and_changes_when_one_does(tmp_path):
    """``pipeline images``' record: the missing paths, and a digest that moves when an image
    appears or is rewritten (extract's DVC dependency) and is the same for the same files."""
    import os

    from pipeline.manifests import image_presence

    (tmp_path / "a.jpg").write_bytes(b"a")
    (tmp_path / "sub").mkdir()
    names = ["b.jpg", "a.jpg", "sub", "a.jpg"]  # a folder is no image; repeats count once
    first = image_presence(tmp_path, names)
    assert first["images"] == 3 and first["missing"] == ["b.jpg", "sub"]
    assert image_presence(tmp_path, names) == first
    (tmp_path / "b.jpg").write_bytes(b"b")
    appeared = image_presence(tmp_path, names)
    assert appeared["missing"] == ["sub"] and appeared["digest"] != first["digest"]
    os.utime(tmp_path / "a.jpg", ns=(1, 1))  # rewritten in place: another mtime
    assert image_presence(tmp_path, names)["digest"] != appeared["digest"]
    with pytest.raises(ValueError, match="escapes the image root"):
        image_presence(tmp_path, ["../x.jpg"])
