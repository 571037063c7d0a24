"""The suite registry contract and the shared intake helpers (pipeline.benchmarks.base, pipeline.benchmarks.intake)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import Units, choice_correct
from pipeline.benchmarks.intake import relative_image_path, require_file
from pipeline.benchmarks.retrieval import RETRIEVAL_METRICS, retrieval_units

REAL = ["aro-relation", "aro-attribution", "aro-coco-order", "aro-flickr-order", "sugarcrepe", "sugarcrepe-pp",
        "whatsup-a", "whatsup-b", "whatsup-coco", "whatsup-vg", "coco-families", "coco-families-dev"]  # fmt: skip
SHAPES = [
    "shapes-whatsup",
    "shapes-aro",
    "shapes-sugarcrepe",
    "shapes-retrieval",
    "shapes-multi",
    "shapes-train",
    "shapes-dev",
]
# text -> image retrieval suites: the shapes world's two, COCO and Visual Genome objects
RETRIEVAL = {"shapes-retrieval", "shapes-multi", "coco-objects", "coco-objects-train", "vg-objects", "vg-objects-5k"}


def test_every_required_suite_is_registered():
    assert set(REAL + SHAPES) | RETRIEVAL <= set(SUITES.names())


@pytest.mark.parametrize("name", SUITES.names())  # names() imports every suite module first
def test_suite_contract(name, tmp_path):
    suite = SUITES.get(name)
    assert suite.name == name and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    assert suite.task == ("retrieval" if name in RETRIEVAL else "choice")
    assert suite.headline in suite.metric_names and len(set(suite.metric_names)) == len(
        suite.metric_names
    )
    assert suite.description
    assert suite.world == name.startswith("shapes-")
    assert "image" in suite.image_columns and "captions" in suite.caption_columns
    if suite.task == "retrieval":  # the shared retrieval metric over [n_queries, n_gallery] scores
        assert suite.metric_names == RETRIEVAL_METRICS and suite.units is retrieval_units
        assert suite.categories == ("retrieval",) and suite.pairwise_reference is None
        rows = pd.DataFrame({"item_id": ["q0", "q1"], "image": ["a.jpg", "b.jpg"], "captions": [["a"], ["b"]], "category": "retrieval"})
        suite.check_manifest(rows, "m.parquet")  # one query per row, no `correct` column
        assert suite.metrics(rows, np.array([[0.9, 0.1], [0.8, 0.2]]))["R@1"] == 0.5  # q1 ranks b.jpg second
    # an empty root names the missing file and how to get it: `pipeline world` builds the
    # shapes world's manifests, real data is downloaded
    with pytest.raises(FileNotFoundError, match=r"not found|no .* file found") as e:
        suite.build_manifest(tmp_path)
    assert re.search(r"\w\.(json|parquet)\b", str(e.value)), str(e.value)
    assert ("`pipeline world`" if suite.world else "download") in str(e.value)


def test_relative_image_path_refuses_escapes():
    assert (
        relative_image_path("data/controlled_images/a_on_b.jpeg", "x")
        == "data/controlled_images/a_on_b.jpeg"
    )
    assert relative_image_path("val2017\\000000000001.jpg", "x") == "val2017/000000000001.jpg"
    for bad in ("/etc/passwd", "../x.jpg", "a/../../x.jpg", "C:/x.jpg", ""):
        with pytest.raises(ValueError, match="item it7"):
            relative_image_path(bad, "it7")


def test_require_file_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="f.json not found.*get it here"):
        require_file(tmp_path, "f.json", "get it here")


def test_units_statistic_micro_and_macro():
    assert Units(np.array([1.0, 0.0, 1.0])).statistic() == pytest.approx(2 / 3)
    assert Units(np.array([1.0, 0.0, 1.0]), np.array(["a", "a", "b"])).statistic() == pytest.approx(
        0.75
    )
    assert np.isnan(Units(np.array([])).statistic())


def test_choice_correct_tie_rules():
    s = np.array([[0.2, 0.2], [0.1, 0.3], [0.3, np.nan]])
    assert choice_correct(s, np.array([0, 1, 0]), "first").tolist() == [True, True, True]
    assert choice_correct(s, np.array([0, 1, 0]), "wrong").tolist() == [False, True, True]
    assert choice_correct(s, np.array([1, 0, 0]), "first").tolist() == [False, False, True]
    for ties in ("first", "wrong"):  # a suite with no item scored: an empty table, no error
        assert choice_correct(np.zeros((0, 0)), np.zeros(0, dtype=int), ties).shape == (0,)


def test_coco_image_ids_name_one_photograph_under_both_releases():
    from pipeline.benchmarks.base import coco_image_id, coco_image_ids, coco_overlap_mask

    assert coco_image_id("val2014/COCO_val2014_000000391895.jpg") == 391895
    assert coco_image_id("train2017/000000391895.jpg") == 391895
    assert coco_image_id("flickr30k-images/1000092795.jpg") is None  # Flickr30k: 10 digits
    assert coco_image_id("2315000.jpg") is None  # Visual Genome
    order = pd.DataFrame({"image": ["val2014/COCO_val2014_000000000007.jpg", "flickr30k-images/1000092795.jpg"]})
    held = coco_image_ids(order, ("image",))
    assert held == {7}
    train = pd.DataFrame({"image": ["train2017/000000000007.jpg", "train2017/000000000008.jpg"]})
    assert coco_overlap_mask(train, held).tolist() == [True, False]
