"""Stage `toyclip`: train the toy CLIP on shapes-world scenes."""

from __future__ import annotations

from typing import Any

from pipeline.config import ToyClipConfig


def run(cfg: ToyClipConfig, progress: bool = True) -> dict[str, Any]:
    from pipeline.encoders.toyclip import train_toyclip

    return train_toyclip(cfg, progress=progress)
