"""Stage `train`: fit a trainable scorer (BindCLIP) on the cached shapes-train features.

Reads the configured encoder's store (checked like `score` does), trains every seed of
``cfg.seeds`` with `pipeline.training.train_scorer` and writes the checkpoints under
``<cfg.out>/<variant>/`` (the first seed's selected model is the one `pipeline score`
loads).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.config import ExtractConfig, TrainConfig


def run(cfg: TrainConfig, extract: ExtractConfig, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg.variant`` from the store of ``extract``; returns the training summary."""
    from pipeline.training import train_scorer
    from stages.score import open_store

    if cfg.encoder != extract.model:
        extract = dataclasses.replace(extract, model=cfg.encoder)
    store = open_store(extract)
    return train_scorer(cfg, store, progress=progress)
