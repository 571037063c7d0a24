"""Stage `ridge`: fit ``ridge-fgw``'s phrase -> object map on the training split.

I/O and orchestration only: opens the encoder's store (checked like `score` does), reads
the training suite's manifest and index, and runs :func:`pipeline.scorers.geometry.ridge.fit`,
which writes ``<cfg.out>/ridge-fgw/``. DVC reruns it only when its code, its ``ridge``
parameters or the features change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.config import ExtractConfig, RidgeConfig


def run(cfg: RidgeConfig, extract: ExtractConfig) -> dict[str, Any]:
    """Fit on ``cfg.suite`` of the store of ``extract``; returns the checkpoint's record."""
    from pipeline.cache import open_store
    from pipeline.manifests import file_sha256
    from pipeline.scorers.geometry.ridge import fit
    from pipeline.scoring import drop_missing, suite_inputs

    if cfg.encoder != extract.model:
        extract = dataclasses.replace(extract, model=cfg.encoder)
    store = open_store(extract)
    manifest, index = suite_inputs(store, cfg.suite)
    manifest, index, _ = drop_missing(manifest, index)
    sha = file_sha256(Path(store.suite_attrs(cfg.suite)["manifest"]))
    return fit(cfg, store, manifest, index, sha)
