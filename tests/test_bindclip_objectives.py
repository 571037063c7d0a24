"""BindCLIP's objectives on hand-computed cases (methods.md §1.6)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.scorers.bindclip.objectives import (
    caption_preference,
    consistency,
    image_contrast,
    region_grounding,
    structural_sufficiency,
    worst_group,
)


def test_worst_group_limits_and_hand_value():
    losses = torch.tensor([1.0, 3.0, 2.0, 6.0, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 4])  # group means 2, 4, 0.5
    means = torch.tensor([2.0, 4.0, 0.5])
    torch.testing.assert_close(worst_group(losses, groups, 0.0), means.max())
    torch.testing.assert_close(worst_group(losses, groups, math.inf), means.mean())
    torch.testing.assert_close(worst_group(losses, groups, 1e-3), means.max(), atol=2e-3, rtol=0)
    big = worst_group(losses.double(), groups, 1e4)  # float64: tau*log-mean-exp cancels
    assert float(big) == pytest.approx(float(means.mean()), abs=1e-3)
    want = 1.0 * math.log((math.exp(2) + math.exp(4) + math.exp(0.5)) / 3)
    assert float(worst_group(losses, groups, 1.0)) == pytest.approx(want, rel=1e-6)
    # absent groups do not count; a single group is its own mean at any tau
    assert float(worst_group(torch.tensor([3.0, 5.0]), torch.tensor([7, 7]), 0.3)) == pytest.approx(
        4.0
    )
    assert float(worst_group(torch.zeros(0), torch.zeros(0, dtype=torch.long), 1.0)) == 0.0
    with pytest.raises(ValueError, match="group_tau"):
        worst_group(losses, groups, -1.0)


def test_score_objectives_hand_values():
    s = torch.tensor([0.0, 2.0, -1.0])
    torch.testing.assert_close(caption_preference(s), torch.log1p(torch.exp(-s)))
    assert float(caption_preference(torch.tensor([0.0]))) == pytest.approx(math.log(2))
    # image interaction: only the difference of margins matters
    torch.testing.assert_close(image_contrast(s, s), torch.full((3,), math.log(2)))
    torch.testing.assert_close(image_contrast(s + 5, s - 5), F.softplus(torch.full((3,), -10.0)))
    torch.testing.assert_close(image_contrast(s, s, gamma=1.0), F.softplus(torch.ones(3)))
    # sufficiency ignores the frozen margin g
    torch.testing.assert_close(
        structural_sufficiency(s + 7.0, torch.full((3,), 7.0)), caption_preference(s)
    )
    # consistency: zero on equal scores, Huber (threshold 1) otherwise, symmetric
    torch.testing.assert_close(consistency(s, s), torch.zeros(3))
    torch.testing.assert_close(
        consistency(torch.tensor([0.5, 3.0]), torch.zeros(2)), torch.tensor([0.125, 2.5])
    )
    torch.testing.assert_close(consistency(torch.zeros(2), torch.tensor([-0.5, 3.0])), torch.tensor([0.125, 2.5]))


def test_region_grounding_hand_cases():
    # one item, rows [tok0, tok1, null], cells 2 depths x 4 patches + null
    R = 4
    cells = torch.tensor([[True, True, False, False], [False, False, False, True]])  # [M=2, R]
    plan = torch.zeros(1, 3, 2 * R + 1)
    plan[0, 0, [0, 1, R + 0]] = torch.tensor([0.1, 0.1, 0.1])  # all of tok0 in its box
    plan[0, 1, [3, R + 2, 2 * R]] = torch.tensor([0.1, 0.1, 0.2])  # tok1: 0.1 in, 0.1 out, 0.2 null
    r = plan.sum(-1)
    loss = region_grounding(plan, r, torch.tensor([0, 0]), torch.tensor([0, 1]), cells)
    torch.testing.assert_close(loss, torch.tensor([0.0, -math.log(0.1 / 0.4)]))
