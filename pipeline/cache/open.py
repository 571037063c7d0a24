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

from pipeline.cache.location import StoreLocation, check_address, is_url
from pipeline.cache.reader import FeatureStore
from pipeline.cache.schema import ForeignCacheError
from pipeline.config import ExtractConfig


def store_path(cfg: ExtractConfig) -> Path | str:
    """``<cfg.out>/<cfg.model>.zarr``: one store per encoder (a URL when ``cfg.out`` is one),
    ``cfg.out`` checked first (:func:`pipeline.cache.location.check_address`)."""
    out = check_address(cfg.out, "extract.out")
    if is_url(out):
        return f"{str(out).rstrip('/')}/{cfg.model}.zarr"
    return Path(out) / f"{cfg.model}.zarr"


def writable_store_path(cfg: ExtractConfig) -> Path | str:
    """:func:`store_path`, refused before any model loads when a URL cannot take a store
    being written (:meth:`pipeline.cache.location.StoreLocation.check_writable`)."""
    path = store_path(cfg)
    StoreLocation.of(path, cfg.storage_options).check_writable("extract.out")
    return path


def expected_fingerprint(store: FeatureStore, extract: ExtractConfig) -> dict[str, Any]:
    """The store's fingerprint with the fields the current configuration determines
    recomputed (encoder, open_clip config and version, weights identity, early layer, and a
    random init's seed and config hash)."""
    from pipeline.encoders import ENCODERS, configured_identity, open_clip_version

    spec = ENCODERS.get(extract.model)
    fp = store.fingerprint
    for key in ("init_seed", "open_clip_config_sha256"):  # a random init's only, which the config decides
        fp.pop(key, None)
    fp.update(
        configured_identity(spec, extract.pretrained, extract.checkpoint, extract.init_seed),
        open_clip_version=open_clip_version(),
    )
    return fp


def open_store(extract: ExtractConfig) -> FeatureStore:
    """Open the configured encoder's store, refusing a stale or foreign one, and one without
    object crops when ``extract.object_crops`` asks for them (a store with crops serves a
    configuration without them: the crops are additive). An unknown encoder key is refused
    with the valid ones before any path is looked at."""
    from pipeline.encoders import ENCODERS

    ENCODERS.get(extract.model)
    path = store_path(extract)
    store = FeatureStore.open(path, storage_options=extract.storage_options)
    if extract.object_crops and not store.fingerprint.get("object_crops"):
        raise ForeignCacheError(
            f"{path} was extracted without object crops, which extract.object_crops: true asks "
            f"for; rerun `pipeline extract` with extract.object_crops: true (it adds them)"
        )
    return store.expect(expected_fingerprint(store, extract))
