"""Benchmark (suite) registry: one module per benchmark = loader + official metric.

    from pipeline.benchmarks import SUITES
    suite = SUITES.get("shapes-sugarcrepe")
    manifest = suite.build_manifest(root)          # one row per item (pandas)
    metrics = suite.metrics(manifest, scores)      # {name: value}
"""

from pipeline.benchmarks.base import SUITES, Suite, Units

__all__ = ["SUITES", "Suite", "Units"]
