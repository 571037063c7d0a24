"""Checks of the bootstrap p-value that the mutation audit found unguarded: the cap at 1."""

from __future__ import annotations

import numpy as np

from pipeline.benchmarks.base import Units
from pipeline.stats import bootstrap_distribution, paired_bootstrap, units_mean_bootstrap

# per-unit differences with a positive mean (1/8) whose bootstrap distribution is right-skewed:
# 51.6 % of all resamples have a mean <= 0 (exact, by convolving the empirical distribution), so
# twice that share exceeds 1. Eight small integers: the weights 1/8 and every resampled mean
# are exact in floating point, so a mean of exactly 0 stays 0.
SKEWED = np.array([-4.0, -3.0, -3.0, -2.0, -1.0, 1.0, 3.0, 10.0])
SEED = 0


def test_skewed_differences_put_more_than_half_the_resamples_at_or_below_zero():
    """The example below is one where the uncapped p-value exceeds 1 (checked here so that
    the cap test cannot pass vacuously)."""
    assert SKEWED.mean() > 0
    dist = bootstrap_distribution(SKEWED, n_resamples=20_000, seed=SEED)
    assert np.mean(dist <= 0) > 0.5


def test_p_value_is_capped_at_one_on_either_side():
    """A two-sided p-value is a probability: twice the share of resamples on the far side of
    0 is capped at 1, whichever system is ahead, for one metric and for a mean of tasks."""
    zeros = np.zeros_like(SKEWED)
    for a, b in ((SKEWED, zeros), (zeros, SKEWED)):
        r = paired_bootstrap(a, b, n_resamples=20_000, seed=SEED)
        assert r.diff != 0
        assert r.p == 1.0
        m = units_mean_bootstrap([Units(a)], [Units(b)], n_resamples=20_000, seed=SEED)
        assert m.p == 1.0
