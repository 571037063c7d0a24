"""Stage `extract`: run the frozen encoder once over every unique image and caption.

I/O and orchestration only: the work is :func:`pipeline.extraction.extract`, the contract
is :mod:`pipeline.cache.schema`.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import ExtractConfig
from pipeline.encoders import Encoder


def run(cfg: ExtractConfig, progress: bool = True, encoder: Encoder | None = None, repair: bool = False, break_lock: bool = False) -> dict[str, Any]:
    """Extract features of ``cfg.suites`` into ``<cfg.out>/<cfg.model>.zarr``; returns the
    summary (rows encoded/reused per modality, seconds, store path). ``repair`` and
    ``break_lock`` are :func:`pipeline.extraction.extract`'s."""
    from pipeline.extraction import extract

    return extract(cfg, progress=progress, encoder=encoder, repair=repair, break_lock=break_lock)
