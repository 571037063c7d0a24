"""Stage `extract`: run the frozen encoder once over every unique image and caption.

I/O and orchestration only: the work is :func:`pipeline.extraction.extract`, the contract
is :mod:`pipeline.cache.schema`.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import ExtractConfig
from pipeline.encoders import Encoder


def run(cfg: ExtractConfig, progress: bool = True, encoder: Encoder | None = None) -> dict[str, Any]:
    """Extract features of ``cfg.suites`` into ``<cfg.out>/<cfg.model>.zarr``; returns the
    summary (rows encoded/reused per modality, seconds, store path)."""
    from pipeline.extraction import extract

    return extract(cfg, progress=progress, encoder=encoder)
