"""Tests for pipeline.stats: hand-computed McNemar cases and bootstrap invariants."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from pipeline.benchmarks.base import Units
from pipeline.stats import bootstrap as stats
from pipeline.stats import (
    bootstrap_ci,
    bootstrap_distribution,
    mcnemar_exact,
    paired_bootstrap,
    resample_indices,
    units_bootstrap,
    units_mean_bootstrap,
    units_mean_ci,
)

# ------------------------------------------------------------------------------ McNemar


def _pairs(n00: int, n01: int, n10: int, n11: int) -> tuple[np.ndarray, np.ndarray]:
    """Correctness arrays with ``nXY`` items where a is X and b is Y (1 = right)."""
    a = np.array([0] * n00 + [0] * n01 + [1] * n10 + [1] * n11, dtype=bool)
    b = np.array([0] * n00 + [1] * n01 + [0] * n10 + [1] * n11, dtype=bool)
    return a, b


def test_mcnemar_hand_computed():
    a, b = _pairs(n00=5, n01=1, n10=9, n11=20)
    r = mcnemar_exact(a, b)
    assert (r.b01, r.b10) == (1, 9)
    expected = 2 * (comb(10, 0) + comb(10, 1)) / 2**10  # = 22 / 1024
    assert r.p == pytest.approx(expected, rel=1e-12)
    assert r.p == pytest.approx(0.021484375, rel=1e-12)


def test_mcnemar_balanced_discordance_caps_at_one():
    a, b = _pairs(n00=0, n01=3, n10=3, n11=4)
    assert mcnemar_exact(a, b).p == 1.0  # 2 * P[X <= 3], X ~ Bin(6, 1/2) = 2 * 42/64 > 1


def test_mcnemar_all_agree_is_one():
    a, b = _pairs(n00=4, n01=0, n10=0, n11=7)
    r = mcnemar_exact(a, b)
    assert (r.b01, r.b10, r.p) == (0, 0, 1.0)


def test_mcnemar_symmetric():
    a, b = _pairs(n00=2, n01=3, n10=11, n11=6)
    ab, ba = mcnemar_exact(a, b), mcnemar_exact(b, a)
    assert (ab.b01, ab.b10) == (ba.b10, ba.b01)
    assert ab.p == ba.p


def test_mcnemar_accepts_zero_one_ints():
    a, b = _pairs(n00=1, n01=1, n10=9, n11=1)
    assert mcnemar_exact(a.astype(int), b.astype(int)) == mcnemar_exact(a, b)


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (np.ones(3, bool), np.ones(4, bool), "same items"),
        (np.array([], bool), np.array([], bool), "empty"),
        (np.array([0, 2]), np.array([0, 1]), "bool"),
        (np.ones((2, 2), bool), np.ones((2, 2), bool), "1-D"),
    ],
)
def test_mcnemar_validation(a, b, match):
    with pytest.raises(ValueError, match=match):
        mcnemar_exact(a, b)


# ---------------------------------------------------------------------------- bootstrap


def test_identical_systems_zero_diff():
    a = np.random.default_rng(1).integers(0, 2, 50).astype(float)
    r = paired_bootstrap(a, a.copy(), n_resamples=500)
    assert (r.diff, r.lo, r.hi, r.p) == (0.0, 0.0, 0.0, 1.0)
    assert (r.n_units, r.n_resamples) == (50, 500)


def test_constant_shift_is_exact():
    b = np.random.default_rng(2).normal(size=40)
    a = b + 1.0
    r = paired_bootstrap(a, b, n_resamples=500)
    assert r.diff == pytest.approx(1.0, abs=1e-12)
    assert r.lo == pytest.approx(1.0, abs=1e-12)
    assert r.hi == pytest.approx(1.0, abs=1e-12)
    assert r.p == 0.0  # every resampled difference is > 0


def test_antisymmetric_in_systems():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 80), rng.integers(0, 2, 80)
    ab, ba = paired_bootstrap(a, b, n_resamples=1000), paired_bootstrap(b, a, n_resamples=1000)
    assert ab.diff == -ba.diff
    assert ab.lo == pytest.approx(-ba.hi, abs=1e-12)
    assert ab.hi == pytest.approx(-ba.lo, abs=1e-12)
    assert ab.p == ba.p


def test_deterministic_under_seed():
    rng = np.random.default_rng(4)
    a, b = rng.random(60), rng.random(60)
    g = rng.integers(0, 3, 60)
    assert paired_bootstrap(a, b, g, n_resamples=300, seed=7) == paired_bootstrap(
        a, b, g, n_resamples=300, seed=7
    )
    assert paired_bootstrap(a, b, n_resamples=300, seed=7) != paired_bootstrap(
        a, b, n_resamples=300, seed=8
    )


def test_bernoulli_ci_contains_truth_with_normal_width():
    n, p = 400, 0.3
    a = np.zeros(n)
    a[: int(n * p)] = 1.0  # sample mean is exactly p
    r = bootstrap_ci(a, n_resamples=4000, seed=0)
    assert r.estimate == pytest.approx(p)
    assert r.lo < p < r.hi
    normal_width = 2 * 1.959964 * np.sqrt(p * (1 - p) / n)  # ≈ 0.0898
    assert r.hi - r.lo == pytest.approx(normal_width, rel=0.1)
    assert (r.n_units, r.n_resamples) == (n, 4000)


def test_clear_difference_is_significant_and_ci_excludes_zero():
    rng = np.random.default_rng(5)
    b = (rng.random(300) < 0.5).astype(float)
    a = np.maximum(b, rng.random(300) < 0.3)  # a is right wherever b is, and more
    r = paired_bootstrap(a, b, n_resamples=2000)
    assert r.diff > 0 and r.lo > 0 and r.p < 0.01


def test_distribution_matches_explicit_resamples():
    rng = np.random.default_rng(6)
    v = rng.random(23)
    idx = resample_indices(23, n_resamples=50, seed=3)
    assert idx.shape == (50, 23) and idx.min() >= 0 and idx.max() < 23
    dist = bootstrap_distribution(v, n_resamples=50, seed=3)
    np.testing.assert_allclose(dist, v[idx].mean(axis=1), rtol=1e-12)


def test_chunking_covers_all_resamples(monkeypatch):
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", 40)  # 40 // 13 = 3 rows per chunk
    v = np.random.default_rng(7).random(13)
    idx = resample_indices(13, n_resamples=10, seed=1)
    assert idx.shape == (10, 13)
    np.testing.assert_allclose(
        bootstrap_distribution(v, n_resamples=10, seed=1), v[idx].mean(axis=1), rtol=1e-12
    )


# ------------------------------------------------------------------ stratified / macro


def _grouped(seed: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    groups = np.array(["x"] * 3 + ["y"] * 5 + ["z"] * 12)
    rng.shuffle(groups)
    a = rng.integers(0, 2, len(groups)).astype(float)
    b = rng.integers(0, 2, len(groups)).astype(float)
    return a, b, groups


def test_stratified_resamples_keep_group_sizes():
    _, _, groups = _grouped()
    idx = resample_indices(len(groups), groups, n_resamples=200, seed=0)
    assert (groups[idx] == groups[None, :]).all()  # every unit replaced within its group
    for k in range(len(idx)):
        labels, counts = np.unique(groups[idx[k]], return_counts=True)
        assert dict(zip(labels.tolist(), counts.tolist(), strict=True)) == {
            "x": 3,
            "y": 5,
            "z": 12,
        }
    # draws actually vary within groups (not the identity)
    assert len(np.unique(idx[:, groups == "z"])) == 12


def test_macro_diff_matches_units_statistic():
    a, b, groups = _grouped()
    r = paired_bootstrap(a, b, groups, n_resamples=300)
    expected = Units(a, groups).statistic() - Units(b, groups).statistic()
    assert r.diff == pytest.approx(expected, abs=1e-12)
    micro = a.mean() - b.mean()
    assert abs(expected - micro) > 1e-3  # the case tells macro from micro apart


def test_macro_distribution_matches_units_statistic_per_resample():
    a, b, groups = _grouped()
    idx = resample_indices(len(groups), groups, n_resamples=20, seed=5)
    dist = bootstrap_distribution(a - b, groups, n_resamples=20, seed=5)
    expected = [
        Units(a[i], groups[i]).statistic() - Units(b[i], groups[i]).statistic() for i in idx
    ]
    np.testing.assert_allclose(dist, expected, atol=1e-12)


def test_bootstrap_ci_macro_estimate():
    a, _, groups = _grouped()
    r = bootstrap_ci(a, groups, n_resamples=300)
    assert r.estimate == pytest.approx(Units(a, groups).statistic(), abs=1e-12)
    assert r.lo <= r.estimate <= r.hi


def test_units_bootstrap_equals_paired_bootstrap():
    a, b, groups = _grouped()
    r = units_bootstrap(Units(a, groups), Units(b, groups.copy()), n_resamples=300, seed=2)
    assert r == paired_bootstrap(a, b, groups, n_resamples=300, seed=2)


def test_units_bootstrap_rejects_different_groups():
    a, b, groups = _grouped()
    with pytest.raises(ValueError, match="different groups"):
        units_bootstrap(Units(a, groups), Units(b, groups[::-1].copy()))
    with pytest.raises(ValueError, match="both have groups"):
        units_bootstrap(Units(a, groups), Units(b))


# -------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"a": np.ones(3), "b": np.ones(4)}, "same units"),
        ({"a": np.array([]), "b": np.array([])}, "empty"),
        ({"a": np.array([1.0, np.nan]), "b": np.ones(2)}, "non-finite"),
        ({"a": np.ones((2, 2)), "b": np.ones((2, 2))}, "1-D"),
        ({"a": np.ones(3), "b": np.ones(3), "groups": np.zeros(2)}, "groups must have shape"),
        ({"a": np.ones(2), "b": np.ones(2), "groups": np.array([0.0, np.nan])}, "NaN"),
        ({"a": np.ones(3), "b": np.ones(3), "n_resamples": 0}, "n_resamples"),
        ({"a": np.ones(3), "b": np.ones(3), "ci": 1.5}, "ci must be"),
    ],
)
def test_bootstrap_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(**kwargs)


# ------------------------------------------------------------- a mean of task metrics


def _tasks(seed: int = 11) -> tuple[list[Units], list[Units]]:
    """Two systems on three tasks of different sizes, the second task grouped (macro)."""
    rng = np.random.default_rng(seed)
    sizes, out_a, out_b = (9, 14, 6), [], []
    for t, n in enumerate(sizes):
        groups = np.array(["p", "q"] * (n // 2))[:n] if t == 1 else None
        a, b = rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float)
        out_a.append(Units(a, groups))
        out_b.append(Units(b, None if groups is None else groups.copy()))
    return out_a, out_b


def test_one_task_mean_is_units_bootstrap_number_for_number():
    a, b, groups = _grouped()
    ua, ub = Units(a, groups), Units(b, groups.copy())
    r = units_mean_bootstrap([ua], [ub], n_resamples=300, seed=4)
    assert r == units_bootstrap(ua, ub, n_resamples=300, seed=4)
    ci = units_mean_ci([ua], n_resamples=300, seed=4)
    assert ci == bootstrap_ci(a, groups, n_resamples=300, seed=4)


def test_constant_differences_give_a_zero_width_interval():
    """a − b is the constant c_t on every unit of task t: every resample's mean difference
    is mean_t c_t, so the interval has zero width and the p-value is its resolution."""
    rng = np.random.default_rng(3)
    shifts = (0.1, 0.3, -0.1)
    groups = np.array(["x"] * 4 + ["y"] * 9)
    tasks_b = [Units(rng.random(7)), Units(rng.random(13), groups), Units(rng.random(5))]
    tasks_a = [Units(u.values + c, u.groups) for u, c in zip(tasks_b, shifts, strict=True)]
    r = units_mean_bootstrap(tasks_a, tasks_b, n_resamples=500, seed=0)
    assert r.diff == pytest.approx(0.1, abs=1e-12)  # (0.1 + 0.3 - 0.1) / 3
    assert r.lo == pytest.approx(0.1, abs=1e-12) and r.hi == pytest.approx(0.1, abs=1e-12)
    assert r.p == 0.0 and r.n_units == 7 + 13 + 5 and r.n_resamples == 500


def test_the_mean_resamples_each_task_independently_from_one_generator():
    """Hand-built resamples: the tasks draw in turn from one ``default_rng(seed)``, each
    from its own units; a resample's difference is the mean of the per-task ones."""
    a, b = _tasks()
    a, b = [Units(u.values) for u in a], [Units(u.values) for u in b]  # no groups: plain draws
    R, seed = 400, 9
    rng = np.random.default_rng(seed)
    per_task = []
    for ua, ub in zip(a, b, strict=True):
        d = ua.values - ub.values
        per_task.append(d[rng.integers(0, len(d), size=(R, len(d)))].mean(axis=1))  # [R]
    dist = np.mean(per_task, axis=0)
    r = units_mean_bootstrap(a, b, n_resamples=R, seed=seed)
    lo, hi = np.quantile(dist, [0.025, 0.975])
    assert (r.lo, r.hi) == pytest.approx((lo, hi), abs=1e-12)
    diff = np.mean([ua.values.mean() - ub.values.mean() for ua, ub in zip(a, b, strict=True)])
    assert r.diff == pytest.approx(diff, abs=1e-12)
    side = np.mean(dist <= 0) if diff > 0 else np.mean(dist >= 0)
    assert r.p == pytest.approx(min(1.0, 2 * side), abs=1e-12)
    ci = units_mean_ci(a, n_resamples=R, seed=seed)
    rng = np.random.default_rng(seed)
    dist_a = np.mean(
        [u.values[rng.integers(0, len(u.values), size=(R, len(u.values)))].mean(1) for u in a],
        axis=0,
    )
    assert (ci.lo, ci.hi) == pytest.approx(tuple(np.quantile(dist_a, [0.025, 0.975])), abs=1e-12)
    assert ci.estimate == pytest.approx(np.mean([u.values.mean() for u in a]), abs=1e-12)


def test_the_mean_of_grouped_tasks_is_the_mean_of_their_statistics():
    a, b = _tasks()
    r = units_mean_bootstrap(a, b, n_resamples=300, seed=1)
    expected = np.mean([ua.statistic() - ub.statistic() for ua, ub in zip(a, b, strict=True)])
    assert r.diff == pytest.approx(expected, abs=1e-12) and r.lo <= r.diff <= r.hi
    assert r == units_mean_bootstrap(a, b, n_resamples=300, seed=1)  # deterministic
    assert r != units_mean_bootstrap(a, b, n_resamples=300, seed=2)
    ci = units_mean_ci(a, n_resamples=300, seed=1)
    assert ci.estimate == pytest.approx(np.mean([u.statistic() for u in a]), abs=1e-12)
    assert ci.lo <= ci.estimate <= ci.hi and ci.n_units == 9 + 14 + 6


def test_the_mean_refuses_mismatched_tasks():
    a, b = _tasks()
    with pytest.raises(ValueError, match="same tasks"):
        units_mean_bootstrap(a, b[:2])
    with pytest.raises(ValueError, match="same tasks"):
        units_mean_bootstrap([], [])
    with pytest.raises(ValueError, match="task 0"):
        units_mean_bootstrap([Units(np.ones(3))], [Units(np.ones(4))])
    with pytest.raises(ValueError, match="different groups"):
        units_mean_bootstrap([a[1]], [Units(b[1].values, b[1].groups[::-1].copy())])
    with pytest.raises(ValueError, match="tasks is empty"):
        units_mean_ci([])


def test_goal_checks_bounds_are_inclusive():
    """96.0 -> 94.0 on replace-obj is a loss of exactly 2 points: met (float 0.94 - 0.96 is
    -0.0200000000000000018); 93.0 is not."""
    import pandas as pd

    from pipeline.scorers.bindclip.analysis import goal_checks

    n = 100
    manifest = pd.DataFrame({"category": ["replace-obj"] * n, "correct": [0] * n})

    def scores(n_right: int) -> np.ndarray:
        s = np.zeros((n, 2))
        s[:n_right, 0] = 1.0  # pos preferred on the first n_right items, tie (wrong) after
        return s

    for suite in ("shapes-sugarcrepe", "sugarcrepe"):  # the real benchmark's goal is named by it, not dropped
        for n_right, met in ((94, True), (93, False)):
            results = {suite: {"manifest": manifest, "scores": {"clip": scores(96), "bindclip": scores(n_right)}}}
            (check,) = [c for c in goal_checks(results) if "replace-obj" in c["goal"]]
            assert check["goal"] == f"{suite} replace-obj loses <= 2 points" and check["met"] is met, check
            assert check["shortfall"] == ("" if met else "1.0 points")  # 93.0 loses 3: one over the bound


def test_goal_checks_say_by_how_much_a_goal_is_missed():
    """swap-att frozen 40 -> 65 of 100: half the errors removed needs 70.0, so 5.0 points
    short; 75 meets it; 40 (no change) is 30.0 short and its CI does not exclude 0."""
    import pandas as pd

    from pipeline.scorers.bindclip.analysis import goal_checks

    n = 100

    def scores(n_right: int) -> np.ndarray:
        s = np.zeros((n, 2))
        s[:n_right, 0] = 1.0
        return s

    swap = pd.DataFrame({"category": ["swap-att"] * n, "correct": [0] * n})
    for n_right, short in ((65, "5.0 points (needs 70.0)"), (75, "")):
        results = {"shapes-sugarcrepe": {"manifest": swap, "scores": {"clip": scores(40), "bindclip": scores(n_right)}}}
        (check,) = [c for c in goal_checks(results) if c["goal"].startswith("shapes-sugarcrepe swap-att")]
        assert check["shortfall"] == short and check["met"] is (not short)
    results = {"shapes-sugarcrepe": {"manifest": swap, "scores": {"clip": scores(40), "bindclip": scores(40)}}}
    (check,) = [c for c in goal_checks(results) if c["goal"].startswith("shapes-sugarcrepe swap-att")]
    assert check["shortfall"] == "30.0 points (needs 70.0); the CI includes 0"


def test_lesion_costs_per_family_with_ci_and_seeds():
    """BindCLIP − lesion per shapes-dev family, hand-counted: on 10 attribute pairs the
    scorer is right on 8 and its lesion on 5 (+30 points); on 10 entity pairs both on 7.
    Seeds: seed0 the same, seed1 attribute 6 vs 6 and entity 9 vs 7."""
    import pandas as pd

    from pipeline.scorers.bindclip.analysis import goal_checks, lesion_costs

    manifest = pd.DataFrame({"family": ["attribute"] * 10 + ["entity"] * 10, "correct": [0] * 20})

    def scores(n_attribute: int, n_entity: int) -> np.ndarray:
        s = np.zeros((20, 2))
        s[:n_attribute, 0] = 1.0  # pos preferred on the first n, tie (wrong) after
        s[10 : 10 + n_entity, 0] = 1.0
        return s

    runs = {
        "bindclip": scores(8, 7), "bindclip-lesion": scores(5, 7),
        "bindclip@seed0": scores(8, 7), "bindclip-lesion@seed0": scores(5, 7),
        "bindclip@seed1": scores(6, 9), "bindclip-lesion@seed1": scores(6, 7),
    }
    results = {"shapes-dev": {"manifest": manifest, "scores": runs}}
    cost = lesion_costs(results, n_resamples=2000)
    assert list(cost.index) == ["entity", "attribute", "mean"]
    assert cost.loc["attribute", "diff"] == pytest.approx(0.3)
    assert cost.loc["entity", "diff"] == pytest.approx(0.0)
    assert cost.loc["mean", "diff"] == pytest.approx(0.15)
    assert cost.loc["attribute", "lo"] <= 0.3 <= cost.loc["attribute", "hi"]
    assert cost.loc["entity", "lo"] == cost.loc["entity", "hi"] == 0.0  # identical correctness
    assert cost.loc["attribute", "seed1"] == pytest.approx(0.0)
    assert cost.loc["entity", "seed1"] == pytest.approx(0.2)
    assert cost.loc["attribute", "seed mean"] == pytest.approx(0.15)
    assert cost.loc["entity", "seed mean"] == pytest.approx(0.1)
    (check,) = [c for c in goal_checks(results) if c["goal"].startswith("lesion loses <= 3")]
    assert check["met"] is False  # attribute +30
    assert check["shortfall"] == "attribute 27.0 points over"
    assert "attribute +30.0" in check["measured"] and "mean of 2 training seeds" in check["measured"]
    del runs["bindclip-lesion"]
    assert lesion_costs(results).empty


def test_lesion_costs_by_edit_kind_hand_counted():
    """Per edit kind: 4 vertical role swaps (scorer right on 4, lesion on 1: +75 points),
    4 horizontal ones (2 vs 2), 4 entity pairs (3 vs 3); seed1 vertical 3 vs 0, horizontal
    1 vs 2, entity 0 vs 1."""
    import json

    import pandas as pd

    from pipeline.scorers.bindclip.analysis import lesion_costs_by_kind

    scene = json.dumps({"objects": []})
    captions = [["a star above a cross", "a cross above a star"]] * 4 + [
        ["a star to the left of a cross", "a cross to the left of a star"]
    ] * 4 + [["a star", "a circle"]] * 4
    manifest = pd.DataFrame(
        {"family": ["role-swap"] * 8 + ["entity"] * 4, "correct": [0] * 12, "captions": captions, "scene": scene, "cf_scene": scene}
    )

    def scores(right: list[int]) -> np.ndarray:
        s = np.zeros((12, 2))
        s[right, 0] = 1.0  # pos preferred on these items, a tie (wrong) on the rest
        return s

    runs = {
        "bindclip": scores([0, 1, 2, 3, 4, 5, 8, 9, 10]),
        "bindclip-lesion": scores([0, 4, 6, 8, 9, 10]),
        "bindclip@seed1": scores([0, 1, 2, 4]),
        "bindclip-lesion@seed1": scores([4, 5, 8]),
    }
    results = {"shapes-dev": {"manifest": manifest, "scores": runs}}
    cost = lesion_costs_by_kind(results, n_resamples=2000)
    assert list(cost.index) == ["entity", "role-swap: horizontal", "role-swap: vertical"]
    assert list(cost["n"]) == [4, 4, 4]
    assert cost.loc["role-swap: vertical", "diff"] == pytest.approx(0.75)
    assert cost.loc["role-swap: horizontal", "diff"] == pytest.approx(0.0)
    assert cost.loc["entity", "lo"] == cost.loc["entity", "hi"] == 0.0
    assert cost.loc["role-swap: vertical", "seed1"] == pytest.approx(0.75)
    assert cost.loc["role-swap: horizontal", "seed1"] == pytest.approx(-0.25)
    assert cost.loc["entity", "seed1"] == pytest.approx(-0.25)
    assert list(cost["seed mean"]) == pytest.approx([-0.25, -0.25, 0.75])
    assert lesion_costs_by_kind(
        {"shapes-dev": {"manifest": manifest.drop(columns=["scene", "cf_scene"]), "scores": runs}}
    ).empty  # real COCO pairs have no scenes
    del runs["bindclip-lesion"]
    assert lesion_costs_by_kind(results).empty


def test_sinkhorn_goal_needs_the_size_the_speed_and_equal_plans():
    from pipeline.scorers.bindclip.analysis import sinkhorn_goal

    bench = {
        "n_problems": 256, "n": 64, "m": 1153, "dtype": "float32", "device": "cpu", "ours_s": 0.25,
        "pot_s": 9.0, "pot_problems_timed": 256, "pot_extrapolated": False, "speedup": 36.0, "max_abs_diff": 3e-9,
    }  # fmt: skip
    check = sinkhorn_goal(bench)
    assert check["met"] is True and check["measured"].startswith("36.0x") and "256 of 256" in check["measured"]
    assert sinkhorn_goal({**bench, "speedup": 29.9})["met"] is False
    assert sinkhorn_goal({**bench, "speedup": 29.9})["shortfall"] == "0.1x short of 30x"
    assert check["shortfall"] == ""
    assert sinkhorn_goal({**bench, "max_abs_diff": 1e-3})["met"] is False  # not the same plans
    assert sinkhorn_goal({**bench, "n_problems": 32})["met"] is False  # not the size
    assert "extrapolated" in sinkhorn_goal({**bench, "pot_problems_timed": 32, "pot_extrapolated": True})["measured"]


def test_parameter_comparison_against_the_papers_total():
    from pipeline.scorers.bindclip.analysis import PAPER_PARAMETERS, parameter_comparison

    parts = {"phi_t.layernorm": 1536, "phi_t.linear": 147648, "phi_v.linear": 196800, "scale_logits": 4}
    pc = parameter_comparison({**parts, "total": 345988})
    assert PAPER_PARAMETERS == 521475
    assert pc["components"] == parts and pc["total"] == 345988
    assert pc["gap"] == 521475 - 345988 and pc["share"] == pytest.approx(345988 / 521475)
    assert pc["text_projection"] == 1536 + 147648


def test_a_reused_draw_equals_a_fresh_one_and_leaves_the_generator_where_a_fresh_one_would(monkeypatch):
    groups = np.repeat([0, 1, 2], [5, 7, 3])
    v = np.random.default_rng(3).random(15)
    monkeypatch.setattr(stats, "_draw_cache", stats.OrderedDict())
    fresh_rng, cached_rng = np.random.default_rng(11), np.random.default_rng(11)
    monkeypatch.setattr(stats, "_DRAW_CACHE_BYTES", 0)  # nothing kept: every draw is fresh
    fresh = [stats._distribution(v, groups, 300, fresh_rng) for _ in range(2)]
    fresh_next = fresh_rng.random()
    monkeypatch.setattr(stats, "_DRAW_CACHE_BYTES", 2**27)
    first = stats._distribution(v, groups, 300, np.random.default_rng(11))  # fills the cache
    assert len(stats._draw_cache) == 1
    cached = [stats._distribution(v, groups, 300, cached_rng) for _ in range(2)]  # a hit, then a new state
    assert len(stats._draw_cache) == 2
    np.testing.assert_array_equal(first, fresh[0])
    for a, b in zip(cached, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert cached_rng.random() == fresh_next  # the hit moved the generator past its draw
    other = stats._distribution(v, np.repeat([0, 1], [8, 7]), 300, np.random.default_rng(11))  # other groups: a miss
    assert len(stats._draw_cache) == 3 and not np.array_equal(other, first)
    monkeypatch.setattr(stats, "_DRAW_CACHE_BYTES", 2 * 300 * 15 * 8)  # room for two draws
    stats._distribution(v, None, 300, np.random.default_rng(12))
    assert len(stats._draw_cache) == 2  # least recently used entries dropped


def test_every_interval_is_the_percentile_interval_at_its_level():
    """The ``ci`` argument sets the quantiles: (1 - ci) / 2 and (1 + ci) / 2 of the resamples."""
    rng = np.random.default_rng(11)
    a, b = rng.random(40), rng.random(40)
    for level in (0.5, 0.9, 0.95):
        q = [(1 - level) / 2, (1 + level) / 2]
        one = bootstrap_ci(a, n_resamples=400, seed=2, ci=level)
        np.testing.assert_allclose((one.lo, one.hi), np.quantile(bootstrap_distribution(a, n_resamples=400, seed=2), q))
        diff = paired_bootstrap(a, b, n_resamples=400, seed=2, ci=level)
        dist = bootstrap_distribution(a - b, n_resamples=400, seed=2)  # the paired resamples draw the same rows
        np.testing.assert_allclose((diff.lo, diff.hi), np.quantile(dist, q))
    narrow, wide = (bootstrap_ci(a, n_resamples=400, seed=2, ci=c) for c in (0.5, 0.95))
    assert wide.lo < narrow.lo < narrow.hi < wide.hi


@pytest.mark.parametrize("grouped", [False, True])
def test_resamples_whose_exact_difference_is_zero_count_as_ties(grouped):
    """The p-value counts the resamples whose difference is exactly 0 as ties. With weights
    1/n the float statistic of a zero-sum resample comes out as +-1e-17 (410 pairs: about
    half of the zero resamples), and the p-value dropped below its definition. The expected
    p is counted here in integers: each resample's difference times G * lcm(group sizes)."""
    rng = np.random.default_rng(3)
    n = 410
    a = (rng.random(n) < 0.6).astype(float)
    b = (rng.random(n) < 0.58).astype(float)
    groups = np.arange(n) % 2 if grouped else None  # two strata of 205
    got = stats.paired_bootstrap(a, b, groups=groups, n_resamples=10_000, seed=0)
    idx = stats.resample_indices(n, groups, 10_000, 0)
    d = (a - b).astype(np.int64)
    codes = np.zeros(n, dtype=np.int64) if groups is None else groups
    sizes = np.bincount(codes)
    scale = np.lcm.reduce(sizes) // sizes[codes]  # [n] integer weight of each unit
    sums = (d[idx] * scale).sum(axis=1)  # [R] the statistic times G * lcm, exactly
    observed = int((d * scale).sum())
    assert observed != 0 and (sums == 0).sum() > 100  # a case with many exact ties
    want = min(1.0, 2 * np.mean(sums <= 0) if observed > 0 else 2 * np.mean(sums >= 0))
    assert got.p == want


def test_tasks_whose_differences_cancel_exactly_count_as_ties():
    """A mean over tasks: two tasks of 300 pairs whose resampled differences cancel (+k/300
    and -k/300) summed to +-1e-17 and left the ties; the expected p is counted in integers."""
    rng = np.random.default_rng(5)
    n, tasks_a, tasks_b = 300, [], []
    for _ in range(2):  # the systems disagree on 20 items a task, so many resamples tie
        a = (rng.random(n) < 0.6).astype(float)
        b = a.copy()
        flips = rng.choice(n, 20, replace=False)
        b[flips[:12]], a[flips[:12]] = 0.0, 1.0
        b[flips[12:]], a[flips[12:]] = 1.0, 0.0
        tasks_a.append(Units(a))
        tasks_b.append(Units(b))
    got = units_mean_bootstrap(tasks_a, tasks_b, n_resamples=10_000, seed=0)
    rng_draw = np.random.default_rng(0)  # the tasks draw from one generator in turn
    sums = np.zeros(10_000, dtype=np.int64)
    for ua, ub in zip(tasks_a, tasks_b, strict=True):
        idx = np.concatenate(list(stats._index_chunks(np.zeros(n, dtype=np.int64), 1, 10_000, rng_draw)))
        sums += (ua.values - ub.values).astype(np.int64)[idx].sum(axis=1)
    observed = sum(int((ua.values - ub.values).sum()) for ua, ub in zip(tasks_a, tasks_b, strict=True))
    assert observed != 0 and (sums == 0).sum() > 100
    want = min(1.0, 2 * np.mean(sums <= 0) if observed > 0 else 2 * np.mean(sums >= 0))
    assert got.p == want
