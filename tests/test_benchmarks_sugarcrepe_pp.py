"""SugarCrepe++ loader (official files in shared/), ITT metric and the TOT function."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.sugarcrepe_pp import (
    build_manifest,
    sugarcrepe_pp_units,
    tot_accuracy,
    tot_correct,
)


def test_official_files_counts_fields_and_alignment(shared_benchmarks):
    with pytest.warns(UserWarning, match="replace_obj.json"):
        m = build_manifest(shared_benchmarks / "sugarcrepe_pp")
    assert m["category"].value_counts().to_dict() == {"replace-rel": 1406, "swap-att": 666}
    assert m["captions"].map(len).eq(3).all() and (m["correct"] == 0).all()
    assert m["item_id"].is_unique
    first = m.set_index("item_id").loc["swap-att/0"]
    assert first["captions"] == [
        "Blue bathroom with two white towels hanging by the shower.",
        "The bathroom is blue and has two white towels hanging by the shower.",
        "White bathroom with two blue towels hanging by the shower.",
    ]
    # index-wise aligned with SugarCrepe: same image at every index (benchmarks.md §4.2)
    for cat in ("swap_att", "replace_rel"):
        sc = json.loads((shared_benchmarks / "sugarcrepe" / f"{cat}.json").read_text())
        ours = m[m["category"] == cat.replace("_", "-")]["image"].tolist()
        assert ours == [sc[k]["filename"] for k in sorted(sc, key=int)]


def test_itt_needs_both_positives_strictly_above_the_negative():
    m = pd.DataFrame({"category": ["swap-att"] * 4 + ["replace-obj"], "correct": 0})
    scores = np.array(
        [
            [0.3, 0.3, 0.2],  # both beat N: right
            [0.3, 0.2, 0.25],  # P2 loses: wrong
            [0.3, 0.2, 0.2],  # P2 ties N: wrong (strict >)
            [0.1, 0.4, 0.2],  # P1 loses: wrong
            [0.9, 0.8, 0.1],
        ]
    )
    units = sugarcrepe_pp_units(m, scores)
    assert units["swap-att"].statistic() == pytest.approx(0.25)
    assert units["replace-obj"].statistic() == 1.0
    assert units["total"].statistic() == pytest.approx(2 / 5)
    assert SUITES.get("sugarcrepe-pp").metrics(m, scores) == {
        k: u.statistic() for k, u in units.items()
    }


def test_tot_on_unit_embeddings():
    e = np.eye(3)
    p1 = np.array([e[0], e[0], e[0]])
    p2 = np.array([(e[0] + e[1]) / np.sqrt(2), e[1], e[1]])
    n = np.array([e[2], (e[0] + e[2]) / np.sqrt(2), e[1]])
    # item 0: cos(P1,P2)=.71 > 0, 0 -> right; item 1: cos(P1,P2)=0 < cos(P1,N)=.71 -> wrong;
    # item 2: P2 == N, cos(P1,P2) = cos(P1,N) = 0 -> tie, wrong
    assert tot_correct(p1, p2, n).tolist() == [True, False, False]
    assert tot_accuracy(p1, p2, n) == pytest.approx(1 / 3)


def test_missing_files_raise_with_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="Sri-Harsha/scpp"):
        build_manifest(tmp_path)
