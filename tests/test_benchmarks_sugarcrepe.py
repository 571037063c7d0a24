"""SugarCrepe loader (on the official files in shared/) and its official metric."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.sugarcrepe import CATEGORIES, bpe_length, build_manifest, sugarcrepe_units


@pytest.fixture(scope="module")
def official(shared_benchmarks) -> pd.DataFrame:
    with pytest.warns(UserWarning, match="add_obj.json"):
        return build_manifest(shared_benchmarks / "sugarcrepe")


def test_official_files_counts_fields_and_length_matched(official):
    counts = official["category"].value_counts().to_dict()
    assert counts == {"add-att": 692, "replace-rel": 1406, "swap-att": 666}  # published counts
    lm = official.groupby("category")["length_matched"].sum().to_dict()
    assert lm == {"add-att": 7, "replace-rel": 590, "swap-att": 499}  # benchmarks.md §2.6
    assert official["item_id"].is_unique
    assert (official["correct"] == 0).all()
    assert official["captions"].map(len).eq(2).all()
    assert official["image"].str.fullmatch(r"\d{12}\.jpg").all()
    first = official.set_index("item_id").loc["add-att/0"]
    assert first["image"] == "000000085329.jpg"
    assert first["captions"][0] == "A drawing of a young woman with many facial piercings."


def test_bpe_length_is_lowercased_without_sot_eot():
    assert bpe_length("A Dog") == bpe_length("a dog") == 2


def _manifest(cats, lm=None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(len(cats))],
            "image": [f"{k}.jpg" for k in range(len(cats))],
            "captions": [["p", "n"]] * len(cats),
            "correct": 0,
            "category": cats,
            "length_matched": lm if lm is not None else [False] * len(cats),
        }
    )


def test_metric_strict_greater_tie_is_wrong_and_pooled_total():
    m = _manifest(["add-att", "add-att", "add-att", "swap-obj"], lm=[True, True, False, False])
    # right, tie, wrong, right
    scores = np.array([[0.3, 0.2], [0.25, 0.25], [0.1, 0.2], [0.5, 0.4]])
    units = sugarcrepe_units(m, scores)
    assert units["add-att"].statistic() == pytest.approx(1 / 3)  # the tie counts wrong
    assert units["swap-obj"].statistic() == 1.0
    assert units["total"].statistic() == pytest.approx(2 / 4)  # item-pooled, not (1/3 + 1)/2
    assert units["category-mean"].statistic() == pytest.approx((1 / 3 + 1) / 2)  # unweighted
    assert units["add-att-length-matched"].statistic() == pytest.approx(1 / 2)
    assert "replace-obj" not in units and "add-obj-length-matched" not in units
    metrics = SUITES.get("sugarcrepe").metrics(m, scores)
    assert metrics == {name: units[name].statistic() for name in metrics}
    assert set(metrics) == {"add-att", "swap-obj", "total", "category-mean", "length-matched", "add-att-length-matched"}


def test_length_matched_pools_the_add_slices_only():
    cats = ["add-obj", "add-obj", "add-att", "swap-obj", "add-att"]
    m = _manifest(cats, lm=[True, False, True, True, False])  # a swap-obj flag is not an add-* item
    scores = np.array([[0.3, 0.2], [0.3, 0.2], [0.1, 0.2], [0.5, 0.4], [0.5, 0.4]])  # R R W R R
    units = sugarcrepe_units(m, scores)
    assert units["length-matched"].values.tolist() == [1.0, 0.0]
    assert units["add-obj-length-matched"].statistic() == 1.0
    assert units["add-att-length-matched"].statistic() == 0.0


def test_missing_files_raise_with_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="RAIVNLab/sugar-crepe"):
        build_manifest(tmp_path)


def test_a_root_holding_the_data_folder_names_that_folder(tmp_path):
    """`pipeline suites` names the repository's data/ folder; a root one level above it used
    to get only the download advice."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "swap_obj.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"they are under {tmp_path / 'data'}: give that folder as the root"):
        build_manifest(tmp_path)


def test_escaping_image_path_is_refused(tmp_path):
    data = {"0": {"filename": "../../etc/x.jpg", "caption": "a", "negative_caption": "b"}}
    (tmp_path / "swap_obj.json").write_text(json.dumps(data))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="swap-obj/0"):
        build_manifest(tmp_path)
    assert set(CATEGORIES) == {
        "replace-obj",
        "replace-att",
        "replace-rel",
        "swap-obj",
        "swap-att",
        "add-obj",
        "add-att",
    }


def test_the_manifest_records_the_categories_present_and_missing(tmp_path, shared_benchmarks):
    """The official folder here holds 3 of the 7 category files: both manifest writers record
    which, so the score stage and the report can say what `total` pools."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.config import ManifestsConfig
    from pipeline.manifests import manifest_sources
    from stages import manifests as manifests_stage

    expected = {
        "present": ["replace-rel", "swap-att", "add-att"],
        "missing": ["replace-obj", "replace-att", "swap-obj", "add-obj"],
    }
    with pytest.warns(UserWarning, match="the manifest, every metrics file and the report record"):
        manifests_stage.run(ManifestsConfig(roots={"sugarcrepe": str(shared_benchmarks / "sugarcrepe")}, out=str(tmp_path)))
    sources = manifest_sources(tmp_path / "sugarcrepe.parquet")
    assert sources["categories"] == expected
    assert "swap_att.json" in sources  # the files' hashes stay recorded beside it
    out = tmp_path / "cli.parquet"
    result = CliRunner().invoke(app, ["manifest", "--suite", "sugarcrepe", "--root", str(shared_benchmarks / "sugarcrepe"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert manifest_sources(out)["categories"] == expected


def test_only_suites_of_one_file_per_category_record_their_coverage(official):
    assert SUITES.get("sugarcrepe").category_coverage(official)["missing"] == ["replace-obj", "replace-att", "swap-obj", "add-obj"]
    assert SUITES.get("sugarcrepe-pp").category_files
    assert SUITES.get("shapes-sugarcrepe").category_coverage(official) is None  # the world writes every category
