"""Stage `world`: render the shapes world and write its suite manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import WorldConfig


def run(cfg: WorldConfig, progress: bool = True) -> dict[str, Any]:
    from pipeline.world import build_world

    paths = build_world(cfg, Path(cfg.out), progress=progress)
    return {suite: str(p) for suite, p in paths.items()}
