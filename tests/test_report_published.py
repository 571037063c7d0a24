"""The published-figures section: each published figure beside the same metric as measured,
computed by the suite's official metric, and the pooled What'sUp criterion with its McNemar
test; nothing for a report without real suites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
from pipeline.report import ReportContext
from pipeline.report.published import PUBLISHED, published
from tests.test_benchmarks_whatsup import _controlled, _pair_scores


def _ctx(tmp_path: Path, results: dict) -> ReportContext:
    score = ScoreConfig(variants=["clip", "bindclip"], suites=list(results), encoder="ViT-L-14-336")
    return ReportContext(results, ReportConfig(out=str(tmp_path), bootstrap=200), score, ExtractConfig(), tmp_path)


def test_pooled_whatsup_beside_the_seed_and_individual_beside_the_paper(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = _controlled(tmp_path / "a", "a", pairs=[(f"obj{i}", "plate") for i in range(5)])
    b = _controlled(tmp_path / "b", "b", pairs=[(f"cube{i}", "sphere") for i in range(5)])
    clip_pairs, bind_pairs = {0}, {0, 1, 2, 12}  # pooled pairs 0..9 in A, 10..19 in B
    results = {
        "whatsup-a": {"manifest": a, "scores": {"clip": _pair_scores(20, clip_pairs), "bindclip": _pair_scores(20, bind_pairs)}},
        "whatsup-b": {"manifest": b, "scores": {"clip": _pair_scores(20, clip_pairs, first=10), "bindclip": _pair_scores(20, bind_pairs, first=10)}},
    }
    text = "\n\n".join(published(_ctx(tmp_path, results)))
    rows = {tuple(c.strip() for c in line.strip("|").split("|")) for line in text.splitlines() if line.startswith("| whatsup")}
    # pooled pair: clip 1 of 20 = 5.00 %, bindclip 4 of 20 = 20.00 %, beside the seed's 4 and 17 of 410
    assert ("whatsup-pooled", "pooled-pair", "clip", f"{100 * 4 / 410:.2f}", "ViT-L/14-336", "5.00") == next(r for r in rows if r[:3] == ("whatsup-pooled", "pooled-pair", "clip"))[:6]
    assert next(r for r in rows if r[:3] == ("whatsup-pooled", "pooled-pair", "bindclip"))[5] == "20.00"
    # individual (the official metric): with both items of a right pair right, 2 of 20 items for clip
    individual = [r for r in rows if r[:3] == ("whatsup-a", "individual", "clip")]
    assert {r[4] for r in individual} == {"ViT-B/32", "ViT-L/14"} and {r[5] for r in individual} == {"10.00"}
    assert "clip 1 → bindclip 4, discordant 3 / 0" in text and "20 pairs" in text


def test_order_figures_from_the_fallback_tagger_are_marked(tmp_path):
    """ARO Order's options made without spaCy/nltk (``order_tagger`` heuristic) are not the
    official items: the measured P@1 beside the published one says so; official ones do not."""
    from pipeline.benchmarks.aro import build_order
    from tests.test_benchmarks_aro import _karpathy

    _karpathy(tmp_path)
    m = build_order(tmp_path / "coco_karpathy_test.json", tagger="heuristic")
    scores = np.tile([1.0, 0, 0, 0, 0], (len(m), 1))
    ours = lambda manifest: [  # noqa: E731
        line for line in "\n".join(published(_ctx(tmp_path, {"aro-coco-order": {"manifest": manifest, "scores": {"clip": scores}}}))).splitlines()
        if line.startswith("| aro-coco-order")
    ]
    rows = ours(m)
    assert len(rows) == 2 and all("100.00 (heuristic-tagger options, not the official ones)" in r for r in rows)
    rows = ours(m.assign(order_tagger="official"))
    assert len(rows) == 2 and not any("tagger" in r for r in rows)


def test_no_table_without_real_suites(tmp_path):
    results = {"shapes-whatsup": {"manifest": None, "scores": {"clip": np.zeros((4, 4))}}}
    blocks = published(_ctx(tmp_path, results))
    assert len(blocks) == 2 and "No real benchmark suite was scored in this run" in blocks[1]


@pytest.mark.parametrize("row", PUBLISHED, ids=lambda r: f"{r.suite}-{r.metric}-{r.variant}-{r.model}")
def test_every_published_metric_is_one_its_suite_reports(row):
    from pipeline.benchmarks import SUITES

    if row.suite == "whatsup-pooled":
        assert row.metric == "pooled-pair"
    else:
        assert row.metric in SUITES.get(row.suite).metric_names
    assert 0 < row.value <= 100
