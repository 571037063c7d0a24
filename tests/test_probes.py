"""The linear probe behind `pipeline probes` on synthetic data."""

from __future__ import annotations

import numpy as np

from pipeline.scorers.bindclip.probes import LinearProbe


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


def test_text_probe_finds_every_colour_shape_bigram(tiny_store):
    """Every tiny caption ("a c1 s1 rel of a c2 s2", paraphrase "a c2 s2 ...") has two shape
    words right after a colour word; the probe reads all of them, holds out the last 20%
    of captions, and names its labels' chance level. The tiny encoder is random: its
    accuracies are only bounded, not judged."""
    from pipeline.scorers.bindclip.probes import text_probe

    index = tiny_store.suite_index("shapes-train")
    rows = np.unique(np.asarray(index["captions"]).reshape(-1))
    out = text_probe(tiny_store)
    assert out["train_nouns"] + out["heldout_nouns"] == 2 * len(rows[rows >= 0])
    assert 0 < out["heldout_nouns"] < out["train_nouns"]
    for name in ("preceding_colour", "own_shape"):
        assert 0.0 <= out[name]["accuracy"] <= 1.0 and 0.0 < out[name]["chance"] <= 1.0


def test_text_probe_does_not_depend_on_the_stores_row_layout(tiny_store):
    """A store grown suite by suite and a fresh one hold the same captions in other rows:
    the probe samples and splits captions in the manifest's order, so relabelling every
    text row gives the same figures."""
    from pipeline.scorers.bindclip.probes import text_probe

    n = int(np.asarray(tiny_store.suite_index("shapes-train")["captions"]).max()) + 1
    perm = np.random.default_rng(3).permutation(n)  # new row k holds old row perm[k]
    inv = np.argsort(perm)

    class Relabelled:
        def __getattr__(self, name):
            return getattr(tiny_store, name)

        def suite_index(self, suite):
            index = dict(tiny_store.suite_index(suite))
            caps = np.asarray(index["captions"])
            index["captions"] = np.where(caps >= 0, inv[np.clip(caps, 0, n - 1)], caps)
            return index

        def texts(self, rows, grids=True):
            return tiny_store.texts(perm[np.asarray(rows)], grids=grids)

    assert text_probe(Relabelled(), max_captions=10) == text_probe(tiny_store, max_captions=10)


def test_a_world_without_front_behind_items_is_refused_in_one_line(monkeypatch):
    """A world too small to hold a depth item gave numpy's "need at least one array to stack"."""
    from types import SimpleNamespace

    import pandas as pd
    import pytest

    import pipeline.scorers.bindclip.probes as probes

    manifest = pd.DataFrame({"family": ["colour"], "scene": ["{}"], "cf_scene": ["{}"]})
    monkeypatch.setattr(probes, "_suite", lambda store, suite: (manifest, {"image": np.zeros((1, 1), int), "cf_image": np.zeros((1, 1), int)}))
    store = SimpleNamespace(dims=SimpleNamespace(grid=(2, 2)))
    with pytest.raises(ValueError, match=r"front/behind probe has no training item: shapes-train's depth family .* build a larger one"):
        probes.depth_probe(store)
