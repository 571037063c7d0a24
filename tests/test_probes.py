"""The linear probe behind `pipeline bench probes` on synthetic data."""

from __future__ import annotations

import numpy as np

from pipeline.probes import LinearProbe


def test_linear_probe_separates_a_linear_rule_and_gives_log_probabilities():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 8))
    y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0).astype(int)  # four classes, linear
    probe = LinearProbe(l2=1e-4).fit(X[:400], y[:400])
    assert probe.accuracy(X[400:], y[400:]) > 0.9
    lp = probe.log_proba(X[400:])
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=1e-5)


def test_linear_probe_is_at_chance_on_unrelated_labels():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(800, 8)), rng.integers(0, 2, size=800)
    probe = LinearProbe().fit(X[:400], y[:400])
    assert 0.35 < probe.accuracy(X[400:], y[400:]) < 0.65
