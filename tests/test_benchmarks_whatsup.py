"""What'sUp loaders (hand-made files in the official formats) and official metrics."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.whatsup import (
    POOLED_SUITES,
    parse_controlled_name,
    pooled_pair_metrics,
    pooled_pair_units,
    qa_units,
    whatsup_units,
)
from pipeline.report.compare import WHATSUP_POOLED, pair_mcnemar, whatsup_mcnemar

PREP = {"on": "on", "under": "under", "left_of": "to the left of", "right_of": "to the right of"}


def _controlled(tmp_path, subset="a", pairs=(("mug", "plate"), ("beer-bottle", "armchair"))):
    arrangements = (
        ["left_of", "right_of", "on", "under"]
        if subset == "a"
        else ["left_of", "right_of", "in-front_of", "behind"]
    )
    folder = "controlled_images" if subset == "a" else "controlled_clevr"
    data = []
    for obj, ref in pairs:
        for arr in arrangements:
            others = [a for a in arrangements if a != arr]
            data.append(
                {
                    "image_path": f"data/{folder}/{obj}_{arr}_{ref}.jpeg",
                    "caption_options": [
                        f"A {obj} {PREP.get(a, a)} a {ref}" for a in [arr, *others]
                    ],
                }
            )
    name = "controlled_images_dataset.json" if subset == "a" else "controlled_clevr_dataset.json"
    (tmp_path / name).write_text(json.dumps(data))
    return SUITES.get(f"whatsup-{subset}").build_manifest(tmp_path)


def test_parse_official_file_names():
    assert parse_controlled_name("data/controlled_images/beer-bottle_on_armchair.jpeg") == (
        "beer-bottle|armchair",
        "on",
    )
    assert parse_controlled_name("data/controlled_clevr/cube_in-front_of_sphere.jpeg") == (
        "cube|sphere",
        "in-front",
    )
    assert parse_controlled_name("data/controlled_images/mug_left_of_plate.jpeg") == (
        "mug|plate",
        "left",
    )


def test_controlled_loader_keeps_official_paths_and_groups(tmp_path):
    m = _controlled(tmp_path)
    assert len(m) == 8 and (m["correct"] == 0).all()
    # verbatim, relative to the official working directory
    assert m["image"].iloc[0] == "data/controlled_images/mug_left_of_plate.jpeg"
    assert m["arrangement"].tolist()[:4] == ["left", "right", "on", "under"]
    assert m["category"].tolist()[:4] == ["left_of", "right_of", "on", "under"]
    assert m["pair_key"].nunique() == 2 and m["captions"].map(len).eq(4).all()


def _scores(correct_mask):
    """[n, 4] scores where item i picks option 0 iff correct_mask[i]."""
    s = np.tile([0.5, 0.1, 0.1, 0.1], (len(correct_mask), 1))
    s[~np.asarray(correct_mask), 1] = 0.9
    return s


def test_pair_set_individual_with_official_denominators(tmp_path):
    m = _controlled(tmp_path)
    mask = np.ones(8, bool)
    mask[1] = False  # mug right_of wrong: breaks the left/right pair of mug, not on/under
    units = whatsup_units(m, _scores(mask))
    assert units["individual"].statistic() == pytest.approx(7 / 8)
    assert units["pair"].statistic() == pytest.approx(3 / (8 / 2))  # pair_correct / (N/2)
    assert units["set"].statistic() == pytest.approx(1 / (8 / 4))
    assert len(units["pair"].values) == 4 and len(units["set"].values) == 2
    assert SUITES.get("whatsup-a").metrics(m, _scores(mask)) == {
        k: units[k].statistic() for k in ("individual", "pair", "set")
    }


def test_tie_counts_right_argmax_first(tmp_path):
    m = _controlled(tmp_path)
    units = whatsup_units(m, np.zeros((8, 4)))
    assert units["individual"].statistic() == 1.0 and units["set"].statistic() == 1.0


def test_subset_b_axes_and_pooled_410_criterion(tmp_path):
    a = _controlled(tmp_path)
    b = _controlled(tmp_path, "b", pairs=(("cube", "sphere"),))
    assert set(b["arrangement"]) == {"left", "right", "in-front", "behind"}
    mask_a = np.ones(8, bool)
    mask_a[[1, 6]] = False  # two pairs broken in A: 2 of 4 right
    mask_b = np.ones(4, bool)
    mask_b[3] = False  # behind wrong: 1 of 2 pairs right
    ua, ub = whatsup_units(a, _scores(mask_a)), whatsup_units(b, _scores(mask_b))
    assert ua["pair"].statistic() == 0.5 and ub["pair"].statistic() == 0.5
    # (pair_correct_A + pair_correct_B) / (N_A/2 + N_B/2) = (2 + 1) / (4 + 2)
    assert pooled_pair_units(ua, ub).statistic() == pytest.approx(3 / 6)
    assert len(pooled_pair_units(ua["pair"], ub["pair"]).values) == 6


def _pair_scores(n_items: int, correct_pairs: set[int], first: int = 0) -> np.ndarray:
    """[n, 4] scores of a Controlled suite built by ``_controlled`` (per key: left, right,
    then the other axis) where pooled pair ``first + j`` (items 2j, 2j+1) is right iff it
    is in ``correct_pairs``, and every other pair has both items wrong."""
    mask = np.zeros(n_items, bool)
    for j in range(n_items // 2):
        mask[[2 * j, 2 * j + 1]] = (first + j) in correct_pairs
    return _scores(mask)


def test_pooled_410_pairs_and_exact_mcnemar_reproduce_the_seed(tmp_path):
    """The pooled metric (whatsup.py) and its McNemar test (the report's pair_mcnemar) at
    the official sizes (103 + 102 keys: 206 + 204 = 410 pairs); frozen CLIP right on 4
    pairs, the variant on 17 (the seed's 4 -> 17). Discordant: b01 = 15 (CLIP wrong,
    variant right), b10 = 2, so p = 2 * P[Bin(17, 1/2) <= 2] = 2 * (1 + 17 + 136) / 2**17."""
    a = _controlled(tmp_path, "a", pairs=[(f"obj{i}", "plate") for i in range(103)])
    b = _controlled(tmp_path, "b", pairs=[(f"cube{i}", "sphere") for i in range(102)])
    assert (len(a), len(b)) == (412, 408)
    clip_pairs = {0, 1, 300, 301}  # 2 in A, 2 in B (B's pairs are 206..409)
    variant_pairs = {0, 1, *range(10, 18), *range(220, 227)}  # 2 shared + 8 in A + 7 in B
    assert len(variant_pairs) == 17

    def scored(pairs):
        return [(a, _pair_scores(412, pairs)), (b, _pair_scores(408, pairs, first=206))]

    metrics = pooled_pair_metrics(scored(variant_pairs))
    assert metrics == {"pooled-pair": pytest.approx(17 / 410), "pairs": 410, "pair-correct": 17}
    pair_a = whatsup_units(*scored(variant_pairs)[0])["pair"].statistic()
    pair_b = whatsup_units(*scored(variant_pairs)[1])["pair"].statistic()
    assert (pair_a, pair_b) == (pytest.approx(10 / 206), pytest.approx(7 / 204))
    assert metrics["pooled-pair"] != pytest.approx((pair_a + pair_b) / 2)  # pooled, not the mean
    assert pooled_pair_metrics(scored(clip_pairs))["pair-correct"] == 4

    test = pair_mcnemar(scored(variant_pairs), scored(clip_pairs))
    assert test == {
        "pairs": 410,
        "baseline_correct": 4,
        "variant_correct": 17,
        "b01": 15,
        "b10": 2,
        "p": pytest.approx(2 * (1 + 17 + 136) / 2**17),
    }
    assert round(test["p"], 3) == 0.002  # the seed's "exact McNemar p = 0.002"


def test_report_pools_the_real_suites_and_needs_both(tmp_path):
    assert WHATSUP_POOLED == POOLED_SUITES == ("whatsup-a", "whatsup-b")
    a = _controlled(tmp_path, "a")  # 2 keys: pairs 0-3
    b = _controlled(tmp_path, "b", pairs=(("cube", "sphere"),))  # 1 key: pairs 4-5
    results = {
        "whatsup-a": {
            "manifest": a,
            "scores": {"clip": _pair_scores(8, {0}), "v": _pair_scores(8, {0, 1, 2})},
        },
        "whatsup-b": {
            "manifest": b,
            "scores": {"clip": _pair_scores(4, {5}, 4), "v": _pair_scores(4, {4}, 4)},
        },
    }
    mc = whatsup_mcnemar(results, "v", suites=WHATSUP_POOLED)
    assert {k: mc[k] for k in ("pairs", "baseline_correct", "variant_correct", "b01", "b10")} == {
        "pairs": 6, "baseline_correct": 2, "variant_correct": 4, "b01": 3, "b10": 1,
    }  # fmt: skip
    assert mc["p"] == pytest.approx(2 * (1 + 4) / 2**4)  # 2 * P[Bin(4, 1/2) <= 1]
    assert whatsup_mcnemar({"whatsup-a": results["whatsup-a"]}, "v", suites=WHATSUP_POOLED) is None
    assert whatsup_mcnemar(results, "v") == mc  # on real suites the default pools A + B
    shapes = {"shapes-whatsup": results["whatsup-a"], **results}
    assert whatsup_mcnemar(shapes, "v")["pairs"] == 4  # on the shapes world: shapes-whatsup
    with pytest.raises(ValueError, match="same suites"):
        pair_mcnemar([(a, _pair_scores(8, {0}))], [(b, _pair_scores(4, {4}, 4))])


def test_incomplete_sets_warn_and_missing_arrangement_is_wrong(tmp_path):
    m = _controlled(tmp_path).iloc[:7].reset_index(drop=True)  # beer-bottle lacks "under"
    with pytest.warns(UserWarning, match="7 items over 2 keys, 1 of them not a complete set of 4;"):
        units = whatsup_units(m, _scores(np.ones(7, bool)))
    assert units["pair"].values.tolist() == [1, 1, 1, 0] and units["set"].values.tolist() == [1, 0]


@pytest.mark.parametrize("subset", ["a", "b"])
def test_sets_without_their_second_axis_are_wrong_not_left_right_only(tmp_path, subset):
    """Every on/under (in-front/behind) item gone, e.g. its images skipped at extract: a set
    still needs four arrangements, so none is correct (official: 0 of N/4), with a warning;
    the subset's missing pairs count as wrong (official: of N/2), as one missing image does."""
    m = _controlled(tmp_path, subset)
    lr = m[m["arrangement"].isin(["left", "right"])].reset_index(drop=True)
    with pytest.warns(UserWarning, match="not a complete set of 4"):
        units = whatsup_units(lr, _scores(np.ones(len(lr), bool)))
    assert units["individual"].statistic() == 1.0 and units["pair"].values.tolist() == [1, 0, 1, 0]
    assert units["set"].values.tolist() == [0, 0]


def test_escaping_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="controlled_images_dataset.json.*whatsup_vlms"):
        SUITES.get("whatsup-a").build_manifest(tmp_path)
    bad = [{"image_path": "/abs/mug_left_of_plate.jpeg", "caption_options": ["a", "b", "c", "d"]}]
    (tmp_path / "controlled_images_dataset.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="a/0"):
        SUITES.get("whatsup-a").build_manifest(tmp_path)


def _qa(tmp_path, dataset):
    one = [
        [42, "A dog on the left", "A dog on the right"],
        [7, "A cat on the top", "A cat on the bottom"],
    ]
    two = [
        [42, "A dog to the left of a cat", "A dog to the right of a cat"],
        [8, "A cup above a table", "A cup below a table"],
        [9, "A man in front of a car", "A man behind a car"],
    ]
    (tmp_path / f"{dataset}_qa_one_obj.json").write_text(json.dumps(one))
    (tmp_path / f"{dataset}_qa_two_obj.json").write_text(json.dumps(two))
    return SUITES.get(f"whatsup-{dataset}").build_manifest(tmp_path)


def test_qa_loaders_paths_and_labels(tmp_path):
    coco = _qa(tmp_path, "coco")
    assert coco["image"].tolist()[:2] == ["val2017/000000000042.jpg", "val2017/000000000007.jpg"]
    assert coco["category"].tolist() == ["one-obj"] * 2 + ["two-obj"] * 3
    assert coco["preposition"].tolist() == ["left", "top", "left", "above", "below"]
    vg = _qa(tmp_path, "vg")
    assert vg["image"].iloc[0] == "vg_images/42.jpg"
    assert vg["preposition"].tolist() == ["left", "top", "left", "top", "front"]


def test_qa_entries_longer_than_three_use_their_first_three(tmp_path):
    """The official loader reads ``d[0], d[1], d[2]``: extra values do not refuse the file."""
    plain = _qa(tmp_path, "coco")
    for name in ("coco_qa_one_obj.json", "coco_qa_two_obj.json"):
        path = tmp_path / name
        path.write_text(json.dumps([[*d, {"extra": 1}] for d in json.loads(path.read_text())]))
    pd.testing.assert_frame_equal(SUITES.get("whatsup-coco").build_manifest(tmp_path), plain)


def test_qa_individual_is_mean_of_subset_accuracies(tmp_path):
    m = _qa(tmp_path, "coco")
    # one-obj: right, tie (counts right); two-obj: all wrong
    scores = np.array([[0.5, 0.1], [0.5, 0.5], [0.1, 0.5], [0.1, 0.5], [0.1, 0.5]])
    units = qa_units(m, scores)
    assert units["one-obj"].statistic() == 1.0 and units["two-obj"].statistic() == 0.0
    assert units["individual"].statistic() == 0.5  # not the pooled 2/5
    assert SUITES.get("whatsup-coco").metrics(m, scores)["individual"] == 0.5


@pytest.mark.parametrize(("subset", "file", "arrangement"), [
    ("a", "controlled_images_dataset.json", "above"), ("a", "controlled_images_dataset.json", "behind"),
    ("b", "controlled_clevr_dataset.json", "on"),
])  # fmt: skip
def test_an_arrangement_of_another_subset_is_refused_at_manifest_time(tmp_path, subset, file, arrangement):
    """Controlled A holds left/right and on/under, B left/right and in-front/behind: another
    arrangement is refused naming the entry, not scored as an item of no pair."""
    entry = {"image_path": f"data/x/mug_{arrangement}_plate.jpeg", "caption_options": ["a", "b", "c", "d"]}
    (tmp_path / file).write_text(json.dumps([entry]))
    with pytest.raises(ValueError, match=rf"entry 0 \(item {subset}/0\): arrangement '{arrangement}' .* not one of Controlled {subset.upper()}'s"):
        SUITES.get(f"whatsup-{subset}").build_manifest(tmp_path)
