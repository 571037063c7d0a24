"""The feature store: schema (the contract), writer, reader, and opening a configured store."""

from pipeline.cache.integrity import CorruptStoreError
from pipeline.cache.lock import StoreLockedError, store_lock
from pipeline.cache.open import expected_fingerprint, open_store, store_path, writable_store_path
from pipeline.cache.reader import FeatureStore, distinct_rows
from pipeline.cache.schema import (
    SCHEMA_VERSION,
    CacheError,
    ForeignCacheError,
    StaleCacheError,
)

__all__ = [
    "SCHEMA_VERSION",
    "CacheError",
    "CorruptStoreError",
    "StoreLockedError",
    "FeatureStore",
    "ForeignCacheError",
    "StaleCacheError",
    "expected_fingerprint",
    "open_store",
    "store_lock",
    "store_path",
    "writable_store_path",
    "distinct_rows",
]
