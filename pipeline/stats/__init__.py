"""Significance for benchmark metrics: the bootstrap (:mod:`.bootstrap`: paired comparisons,
CIs, means over tasks) and the exact McNemar test (:mod:`.mcnemar`)."""

from pipeline.stats.bootstrap import (
    BootstrapResult,
    ConfidenceInterval,
    bootstrap_ci,
    bootstrap_distribution,
    paired_bootstrap,
    resample_indices,
    units_bootstrap,
    units_mean_bootstrap,
    units_mean_ci,
)
from pipeline.stats.mcnemar import McNemarResult, mcnemar_exact

__all__ = [
    "BootstrapResult",
    "ConfidenceInterval",
    "McNemarResult",
    "bootstrap_ci",
    "bootstrap_distribution",
    "mcnemar_exact",
    "paired_bootstrap",
    "resample_indices",
    "units_bootstrap",
    "units_mean_bootstrap",
    "units_mean_ci",
]
