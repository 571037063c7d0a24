"""Where a configured encoder's store lives, and opening it with its fingerprint checked.

    from pipeline.cache import open_store
    store = open_store(extract_cfg)     # refuses a stale or foreign store, naming the fix

Every reader of the cache (train, score, report, the benches) opens it here, so a store
written by another encoder, weights file, open_clip version or early layer is refused the
same way everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.cache.reader import FeatureStore
from pipeline.config import ExtractConfig


def store_path(cfg: ExtractConfig) -> Path:
    """``<cfg.out>/<cfg.model>.zarr``: one store per encoder."""
    return Path(cfg.out) / f"{cfg.model}.zarr"


def expected_fingerprint(store: FeatureStore, extract: ExtractConfig) -> dict[str, Any]:
    """The store's fingerprint with the fields the current configuration determines
    recomputed (encoder, open_clip config and version, weights identity, early layer)."""
    import open_clip

    from pipeline.encoders import ENCODERS, resolve_pretrained

    spec = ENCODERS.get(extract.model)
    fp = store.fingerprint
    fp.update(
        encoder=spec.name,
        open_clip_model=spec.open_clip_model,
        open_clip_version=open_clip.__version__,
        pretrained=resolve_pretrained(spec, extract.pretrained, extract.checkpoint),
        early_layer=spec.early_layer,
    )
    return fp


def open_store(extract: ExtractConfig) -> FeatureStore:
    """Open the configured encoder's store, refusing a stale or foreign one."""
    path = store_path(extract)
    store = FeatureStore.open(path)
    return FeatureStore.open(path, expect=expected_fingerprint(store, extract))
