"""SugarCrepe++ loader (official files in shared/), ITT metric and the TOT function."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

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


class TablePreference:
    """A pairwise scorer with given preferences: ``s(I_i, c_a, c_b) = table[i, a, b]``
    (antisymmetric), images and options passed as [B] index tensors."""

    pairwise = True

    def __init__(self, table: np.ndarray):
        self.table = torch.tensor(table, dtype=torch.float64)

    def score_pair(self, image, text_a, text_b):
        return self.table[image.embed, text_a, text_b]


class IndexImages:
    """[B] image indices standing in for ``ImageFeatures`` (``embed`` and ``len`` are read)."""

    def __init__(self, index: torch.Tensor):
        self.embed = index

    def __len__(self) -> int:
        return len(self.embed)


def _preferences(rows):
    """[n, 3, 3] antisymmetric table from ``(s(P1, N), s(P2, N), s(P1, P2))`` per item."""
    t = np.zeros((len(rows), 3, 3))
    for i, (p1n, p2n, p12) in enumerate(rows):
        t[i, 0, 2], t[i, 1, 2], t[i, 0, 1] = p1n, p2n, p12
    return t - t.transpose(0, 2, 1)


def test_itt_of_a_pairwise_scorer_is_the_official_test_not_the_mean_preference():
    from pipeline.scorers.base import option_scores

    table = _preferences(
        [
            (1.0, 0.5, -3.0),  # both positives beat N: right (the mean puts P1 below N)
            (0.4, -0.1, 0.0),  # P2 loses to N: wrong (the mean puts both above N)
            (0.0, 1.0, 0.0),  # P1 ties N: wrong, strict > (the mean puts both above N)
            (-0.1, 2.0, 1.0),  # P1 loses to N: wrong (the mean puts both above N)
        ]
    )
    scorer = TablePreference(table)
    image, options = IndexImages(torch.arange(4)), [torch.full((4,), k) for k in range(3)]
    m = pd.DataFrame({"category": ["swap-att"] * 4, "correct": 0})
    suite = SUITES.get("sugarcrepe-pp")
    assert suite.pairwise_reference == 2  # N

    scores = option_scores(scorer, image, options, reference=suite.pairwise_reference).numpy()
    assert scores == pytest.approx(
        np.array([[1.0, 0.5, 0], [0.4, -0.1, 0], [0, 1.0, 0], [-0.1, 2.0, 0]])
    )
    assert sugarcrepe_pp_units(m, scores)["swap-att"].values.tolist() == [1, 0, 0, 0]
    assert suite.metrics(m, scores)["swap-att"] == pytest.approx(1 / 4)
    # the mean preference over the other two options answers the opposite on every item:
    # item 0: P1 (-3 + 1) / 2 = -1 < N (-1 - 0.5) / 2 = -0.75; item 1: P2 (0 - 0.1) / 2 =
    # -0.05 > N (-0.4 + 0.1) / 2 = -0.15
    mean = option_scores(scorer, image, options).numpy()
    assert mean[0] == pytest.approx([-1.0, 1.75, -0.75])
    assert mean[1] == pytest.approx([0.2, -0.05, -0.15])
    assert sugarcrepe_pp_units(m, mean)["swap-att"].values.tolist() == [0, 1, 1, 1]
    with pytest.raises(ValueError, match="reference option 3"):
        option_scores(scorer, image, options, reference=3)


def test_reference_layout_in_score_choice(tiny_store):
    """``score_choice(reference=r)`` scores a pairwise scorer's options against option r
    (K = 2, r = 1: ``(s, 0)`` where the mean preference is ``(s, -s)``) and leaves a
    per-caption scorer's scores as they are."""
    from pipeline.scorers import create_scorer
    from pipeline.scoring import score_choice

    index = tiny_store.suite_index("shapes-dev")
    pairwise = create_scorer(
        "bindclip", dims=tiny_store.dims, proj=tiny_store.projections(), h=16, n_iters=8
    ).eval()
    assert pairwise.pairwise
    mean = score_choice(pairwise, tiny_store, index, 4)
    against = score_choice(pairwise, tiny_store, index, 4, reference=1)
    assert against[:, 0] == pytest.approx(mean[:, 0], abs=1e-6) and (against[:, 1] == 0).all()
    clip = create_scorer("clip", dims=tiny_store.dims, proj=tiny_store.projections())
    assert (
        score_choice(clip, tiny_store, index, 4, reference=1)
        == score_choice(clip, tiny_store, index, 4)
    ).all()


def test_tot_on_unit_embeddings():
    e = np.eye(3)
    p1 = np.array([e[0], e[0], e[0]])
    p2 = np.array([(e[0] + e[1]) / np.sqrt(2), e[1], e[1]])
    n = np.array([e[2], (e[0] + e[2]) / np.sqrt(2), e[1]])
    # item 0: cos(P1,P2)=.71 > 0, 0 -> right; item 1: cos(P1,P2)=0 < cos(P1,N)=.71 -> wrong;
    # item 2: P2 == N, cos(P1,P2) = cos(P1,N) = 0 -> tie, wrong
    assert tot_correct(p1, p2, n).tolist() == [True, False, False]
    assert tot_accuracy(p1, p2, n) == pytest.approx(1 / 3)
    # each of the two comparisons alone is not enough: P1 = e0, P2 = (e0 + e1)/sqrt2 (cos .71);
    # N near e1 beats P1-P2 from P2's side (cos(P2,N) = .83 > .71 > cos(P1,N) = .20), N near
    # e0 from P1's side (cos(P1,N) = .98 > .71 > cos(P2,N) = .55): both wrong
    both = np.array([(e[0] + e[1]) / np.sqrt(2)] * 2)
    near = np.array([0.2 * e[0] + e[1], e[0] - 0.2 * e[1]]) / np.sqrt(1.04)
    assert tot_correct(np.array([e[0], e[0]]), both, near).tolist() == [False, False]


def test_missing_files_raise_with_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="Sri-Harsha/scpp"):
        build_manifest(tmp_path)
