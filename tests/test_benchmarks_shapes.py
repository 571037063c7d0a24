"""Shapes-world suites: manifests read from the world folder, scored by the official code."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.retrieval import retrieval_units, target_ranks
from pipeline.benchmarks.shapes import shapes_aro_units


def _write(root, suite, rows):
    (root / "manifests").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(root / "manifests" / f"{suite}.parquet", index=False)


def test_missing_world_manifest_names_the_stage(tmp_path):
    with pytest.raises(FileNotFoundError, match="pipeline world"):
        SUITES.get("shapes-whatsup").build_manifest(tmp_path)
    _write(
        tmp_path, "shapes-train", [{"item_id": "x1", "image": "../out.png", "captions": ["a", "b"]}]
    )
    with pytest.raises(ValueError, match="x1"):
        SUITES.get("shapes-train").build_manifest(tmp_path)


def test_whatsup_manifest_roundtrip_and_official_pair_metric(tmp_path):
    rows = [
        {"item_id": f"{k}-{a}", "image": f"{k}-{a}.png", "captions": ["t", "x", "y", "z"], "correct": 0,
         "category": a, "pair_key": k, "arrangement": a}
        for k in ("p0", "p1") for a in ("left", "right", "above", "below")
    ]  # fmt: skip
    _write(tmp_path, "shapes-whatsup", rows)
    m = SUITES.get("shapes-whatsup").build_manifest(tmp_path)
    assert isinstance(m["captions"].iloc[0], list) and len(m) == 8
    scores = np.tile([0.5, 0.1, 0.1, 0.1], (8, 1))
    scores[3, 2] = 0.9  # p0 "below" wrong: breaks the above/below pair of p0
    metrics = SUITES.get("shapes-whatsup").metrics(m, scores)
    assert metrics == {"individual": 7 / 8, "pair": 3 / 4, "set": 1 / 2}


def test_aro_categories_with_padded_scores():
    m = pd.DataFrame(
        {
            "category": ["relation"] * 3 + ["attribution"] * 2 + ["order"] * 2,
            "correct": [1, 1, 1, 1, 1, 0, 0],
            "relation_name": ["near", "near", "left of", None, None, None, None],
            "attr_pair": [None, None, None, "red_blue", "blue_red", None, None],
        }
    )
    nan = np.nan
    scores = np.array(
        [
            [0.1, 0.2, nan, nan, nan],  # near: right ("near" is not excluded in the world)
            [0.2, 0.2, nan, nan, nan],  # near: tie, wrong
            [0.1, 0.3, nan, nan, nan],  # left of: right
            [0.1, 0.3, nan, nan, nan],  # red_blue: right (a single item counts: min_count 1)
            [0.3, 0.1, nan, nan, nan],  # blue_red: wrong
            [0.2, 0.2, 0.2, 0.2, 0.2],  # order: tie, right
            [0.1, 0.2, 0.0, 0.0, 0.0],  # order: wrong
        ]
    )
    units = shapes_aro_units(m, scores)
    assert units["relation"].statistic() == pytest.approx((0.5 + 1.0) / 2)
    assert units["attribution"].statistic() == pytest.approx(0.5)
    assert units["order"].statistic() == pytest.approx(0.5)
    assert SUITES.get("shapes-aro").metrics(m, scores) == {
        k: u.statistic() for k, u in units.items()
    }


def test_sugarcrepe_and_family_suites_reuse_official_metrics():
    m = pd.DataFrame({"category": ["add-att", "add-att"], "correct": 0, "length_matched": [True, False],
                      "family": ["negation", "depth"]})  # fmt: skip
    scores = np.array([[0.2, 0.2], [0.3, 0.1]])
    assert SUITES.get("shapes-sugarcrepe").metrics(m, scores) == {
        "add-att": 0.5, "total": 0.5, "category-mean": 0.5, "length-matched": 0.0, "add-att-length-matched": 0.0,
    }  # fmt: skip
    assert SUITES.get("shapes-dev").metrics(m, scores) == {
        "negation": 0.0,
        "depth": 1.0,
        "mean": 0.5,
    }


def test_ranks_are_pessimistic_on_a_3x4_case():
    scores = np.array(
        [
            [0.9, 0.1, 0.2, 0.3],  # target 0 best: rank 1
            [0.5, 0.4, 0.4, 0.1],  # target 1: one above, one tie: rank 3
            [0.3, 0.3, 0.3, 0.3],  # target 3: all tie: rank 4
        ]
    )
    ranks = target_ranks(scores, np.array([0, 1, 3]))
    assert ranks.tolist() == [1, 3, 4]
    assert target_ranks(np.array([[np.nan, 0.0]]), np.array([0])).tolist() == [2]  # NaN ranks last


def _queries_ranking_their_image(wanted: list[int]) -> tuple[pd.DataFrame, np.ndarray]:
    """A manifest of ``len(wanted)`` queries, one per gallery image, and scores under which
    query q's own image ranks ``wanted[q]`` (ties pessimistic)."""
    n = len(wanted)
    m = pd.DataFrame({"image": [f"g{j}" for j in range(n)], "captions": [["q"]] * n, "group": 0})
    scores = np.zeros((n, n))
    for q, r in enumerate(wanted):
        others = [j for j in range(n) if j != q]
        scores[q, others] = np.arange(n - 1, 0, -1)  # 11, 10, ..., 1
        scores[q, q] = 100.0 if r == 1 else scores[q, others[r - 2]]  # tie with the (r-1)-th other
    return m, scores


def test_retrieval_metrics_on_ranks_with_exact_values():
    """Ranks 1 (six queries), 3, 3, 7, 7, 11 and 12: nDCG@10 terms 1, 1/log2(4) = 1/2,
    1/log2(8) = 1/3 and 0 past rank 10, so nDCG@10 = (6 + 2/2 + 2/3) / 12 = 23/36."""
    m, scores = _queries_ranking_their_image([1, 3, 12, 1, 3, 7, 1, 11, 1, 7, 1, 1])
    assert retrieval_units(m, scores)["R@1"].values.tolist() == [1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 1, 1]
    assert SUITES.get("shapes-retrieval").metrics(m, scores) == pytest.approx(
        {"R@1": 1 / 2, "R@5": 2 / 3, "R@10": 5 / 6, "nDCG@10": 23 / 36, "mean-rank": 49 / 12}
    )


def test_retrieval_metrics_by_hand():
    wanted = [1, 2, 5, 6, 10, 11, 12, 1, 1, 3, 1, 1]
    m, scores = _queries_ranking_their_image(wanted)
    units = retrieval_units(m, scores)
    assert units["R@1"].statistic() == pytest.approx(5 / 12)
    assert units["R@5"].statistic() == pytest.approx(8 / 12)
    assert units["R@10"].statistic() == pytest.approx(10 / 12)
    # nDCG@10 terms by rank: 1 -> 1 (five queries), 2 -> 0.6309298, 3 -> 0.5, 5 -> 0.3868528,
    # 6 -> 0.3562072, 10 -> 0.2890648, 11 and 12 -> 0 (past the cut-off)
    assert units["nDCG@10"].statistic() == pytest.approx((5.5 + 0.6309298 + 0.3868528 + 0.3562072 + 0.2890648) / 12, abs=1e-7)
    assert units["mean-rank"].statistic() == pytest.approx(54 / 12)  # sum of the wanted ranks / 12
    assert SUITES.get("shapes-retrieval").metrics(m, scores) == {
        k: u.statistic() for k, u in units.items()
    }
    with pytest.raises(ValueError, match="shape"):
        retrieval_units(m, scores[:3])


def test_family_names_match_the_world():
    """The families the shapes world generates (one proposer per family in
    ``pipeline.world.families.PROPOSERS``, which ``pair_item`` looks up by name) are the COCO
    families' list, name for name and in order, so shapes-dev and coco-families report the
    same metric names. (``families.FAMILIES`` is an import of the COCO tuple itself, so
    comparing it would compare the list with itself.)"""
    from pipeline.benchmarks.coco_families import FAMILIES
    from pipeline.world import families as world

    assert tuple(world.PROPOSERS) == FAMILIES
    assert all(callable(f) for f in world.PROPOSERS.values())
