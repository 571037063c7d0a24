"""The feature store: schema (the contract), writer, and lazy reader."""

from pipeline.cache.reader import FeatureStore
from pipeline.cache.schema import (
    SCHEMA_VERSION,
    CacheError,
    ForeignCacheError,
    StaleCacheError,
)

__all__ = ["SCHEMA_VERSION", "CacheError", "FeatureStore", "ForeignCacheError", "StaleCacheError"]
