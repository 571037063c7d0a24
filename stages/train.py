"""Stage `train`: fit one trainable scorer variant on the cached training suite.

I/O and orchestration only: opens the configured encoder's store (checked like `score`
does) and runs :func:`pipeline.training.loop.train_variant`, which writes the checkpoints
under ``<cfg.out>/<variant>/`` (the first seed's selected model is the one `pipeline score`
loads). DVC runs one `train@<variant>` stage per entry of ``train.variants``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.config import ExtractConfig, TrainConfig


def run(cfg: TrainConfig, extract: ExtractConfig, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg.variant`` from the store of ``extract``; returns the training summary."""
    from pipeline.cache import open_store
    from pipeline.training.loop import train_variant

    if cfg.encoder != extract.model:
        extract = dataclasses.replace(extract, model=cfg.encoder)
    return train_variant(cfg, open_store(extract), progress=progress)
