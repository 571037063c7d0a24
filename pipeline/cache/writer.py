"""Writing a feature store: create/open, append content-addressed rows, encode, index suites.

The writer never encodes a row twice: new images/captions are those whose content key is
not in the store yet, or whose ``done`` flag is still False after an interrupted run. Rows are
encoded in batches aligned to shard boundaries, the data arrays are written first and the
``done`` flags last, so a crash leaves at most a batch of rows to redo.
"""

from __future__ import annotations

import datetime as _dt
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle

from pipeline.cache.schema import (
    ARRAYS,
    IMAGE_ARRAYS,
    OBJECT_ARRAYS,
    SCHEMA_VERSION,
    SHARD_ROWS,
    TEXT_ARRAYS,
    ArraySpec,
    ForeignCacheError,
    StaleCacheError,
    chunk_rows,
    encoder_id,
    fingerprint_id,
    keys_to_hex,
    resolve_tail,
)

log = logging.getLogger(__name__)
# Small arrays (keys, ids, embeddings) are compressed; fp16 grids and token states are not:
# zstd+shuffle saved only 6% on toy grids (157 vs 167 MiB) and 15% on token states, while
# compression was ~40% of the time to write them.
COMPRESSOR = BloscCodec(cname="zstd", clevel=1, shuffle=BloscShuffle.shuffle)


def open_for_writing(
    path: str | Path, fingerprint: dict[str, Any], dims: dict[str, Any], replace_mismatch: bool = False
) -> zarr.Group:
    """Open (or create) the store at ``path`` for this encoder.

    Stores of the same encoder that differ only in their ``STORE_OPTIONS`` are the same
    store: a fingerprint with ``object_crops: true`` adds the ``object`` arrays (and the key)
    to a store without them, and a fingerprint without it keeps a store's crops.

    Args:
        fingerprint: the encoder's fingerprint, plus ``object_crops: True`` when the object
            crops are extracted.
        replace_mismatch: delete an existing store of another schema version or fingerprint
            and start afresh (the DVC pipeline retrains the toy CLIP, which makes its old
            features worthless) instead of refusing it.

    Raises:
        StaleCacheError / ForeignCacheError: an existing store has another schema version or
            fingerprint and ``replace_mismatch`` is False.
    """
    path = Path(path)
    fid = fingerprint_id(fingerprint)
    if (path / "zarr.json").exists() and replace_mismatch:
        attrs = zarr.open_group(path, mode="r").attrs
        same_encoder = encoder_id(attrs.get("fingerprint", {})) == encoder_id(fingerprint)
        if attrs.get("schema_version") != SCHEMA_VERSION or not same_encoder:
            log.warning("replacing %s: it was written by another encoder or schema", path)
            shutil.rmtree(path)
    if (path / "zarr.json").exists():
        root = zarr.open_group(path, mode="r+")
        version = root.attrs.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StaleCacheError(
                f"{path} has cache schema v{version}, this code writes v{SCHEMA_VERSION}; "
                f"delete it and rerun `pipeline extract`"
            )
        stored = dict(root.attrs.get("fingerprint", {}))
        if encoder_id(stored) != encoder_id(fingerprint):
            raise ForeignCacheError(
                f"{path} was written by another encoder/weights "
                f"({_describe(stored)}) than the one configured "
                f"({_describe(fingerprint)}); delete it or choose another extract.out, then "
                f"rerun `pipeline extract`"
            )
        if fingerprint.get("object_crops") and not stored.get("object_crops"):
            log.info("adding object crops to %s", path)
            stored["object_crops"] = True
            root.attrs.update(fingerprint=stored, fingerprint_id=fingerprint_id(stored))
        if stored.get("object_crops"):
            for spec in OBJECT_ARRAYS:
                if spec.name not in root:
                    _create(root, spec, resolve_tail(spec, dims))
        return root
    root = zarr.open_group(path, mode="w")
    root.attrs.update(
        schema_version=SCHEMA_VERSION,
        fingerprint=fingerprint,
        fingerprint_id=fid,
        dims=dims,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )
    crops = OBJECT_ARRAYS if fingerprint.get("object_crops") else ()
    for spec in IMAGE_ARRAYS + TEXT_ARRAYS + crops:
        _create(root, spec, resolve_tail(spec, dims))
    return root


def _create(root: zarr.Group, spec: ArraySpec, tail: tuple[int, ...]) -> None:
    if spec.sharded:
        chunks, shards = (chunk_rows(spec, tail), *tail), (SHARD_ROWS, *tail)
    else:
        chunks, shards = (max(SHARD_ROWS * 4, 1), *tail), None
    root.create_array(
        spec.name,
        shape=(0, *tail),
        dtype=spec.dtype,
        chunks=chunks,
        shards=shards,
        compressors=COMPRESSOR if spec.dtype != "bool" and not spec.sharded else None,
        fill_value=0 if spec.dtype != "bool" else False,
    )


def write_params(root: zarr.Group, params: dict[str, np.ndarray]) -> None:
    """Store the frozen projection parameters (``params/<name>``), once."""
    for name, value in params.items():
        value = np.asarray(value, dtype=np.float32)
        arr = root.require_array(f"params/{name}", shape=value.shape, dtype="float32")
        arr[...] = value


def plan_rows(root: zarr.Group, modality: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map content keys to store rows, appending rows for unseen keys.

    Args:
        modality: ``image``, ``text`` or ``object``.
        keys: [n, 16] uint8 content keys (duplicates allowed).

    Returns:
        ``rows`` [n] int64 row of every key, and ``todo`` sorted unique rows whose ``done``
        flag is False (new rows and rows left unfinished by an interrupted run).
    """
    key_arr = root[f"{modality}/key"]
    existing = {k: i for i, k in enumerate(keys_to_hex(key_arr[:]))}
    hexes = keys_to_hex(keys)
    new = [h for h in dict.fromkeys(hexes) if h not in existing]
    n_old = key_arr.shape[0]
    if new:
        n_new = n_old + len(new)
        for spec in ARRAYS[modality]:
            arr = root[spec.name]
            arr.resize((n_new, *arr.shape[1:]))
        new_keys = np.stack([np.frombuffer(bytes.fromhex(h), dtype=np.uint8) for h in new])
        root[f"{modality}/key"][n_old:n_new] = new_keys  # fresh handle: the old one predates resize
        existing.update({h: n_old + i for i, h in enumerate(new)})
    rows = np.array([existing[h] for h in hexes], dtype=np.int64)
    done = root[f"{modality}/done"][:]  # re-read: `resize` went through another handle
    todo = np.flatnonzero(~done.astype(bool))
    return rows, todo


def shard_batches(rows: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    """Split sorted rows into batches that never straddle a shard boundary needlessly.

    Consecutive rows are grouped by shard; batches hold whole shards' worth of rows (at
    least ``batch_size`` rounded to shards), so concurrent or repeated writes touch whole
    shard files.
    """
    if len(rows) == 0:
        return
    per = max(SHARD_ROWS, (batch_size // SHARD_ROWS) * SHARD_ROWS)
    shard_of = rows // per
    cuts = np.flatnonzero(np.diff(shard_of)) + 1
    yield from np.split(rows, cuts)


def write_rows(root: zarr.Group, modality: str, rows: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
    """Write one batch of encoded rows (contiguous or not), then flag them done."""
    lo, hi = int(rows.min()), int(rows.max()) + 1
    contiguous = hi - lo == len(rows) and np.all(np.diff(rows) == 1)
    for name, value in arrays.items():
        arr = root[f"{modality}/{name}"]
        value = value.astype(arr.dtype, copy=False)
        if contiguous:
            arr[lo:hi] = value
        else:
            arr.set_orthogonal_selection((rows,), value)
    root[f"{modality}/done"].set_orthogonal_selection((rows,), np.ones(len(rows), dtype=bool))


def write_suite_index(
    root: zarr.Group,
    suite: str,
    columns: dict[str, tuple[str, np.ndarray]],
    attrs: dict[str, Any],
) -> None:
    """Store a suite's item -> row index arrays (replacing an older index of that suite).

    Columns of the older index that ``columns`` lacks are kept while the manifest is the same
    (the crop index an extract with ``object_crops`` wrote stays valid: rows are
    content-addressed) and deleted once it changed, so no index of an older manifest is left.

    Args:
        columns: ``{column: (modality, rows)}`` with rows [n] or [n, K] (-1 = pad).
        attrs: manifest hash, image root, item count ...
    """
    group = root.require_group(f"suites/{suite}")
    kinds = dict(group.attrs.get("kinds", {}))
    if group.attrs.get("manifest_sha256") != attrs.get("manifest_sha256"):
        for stale in sorted(set(group.array_keys()) - set(columns)):
            del group[stale]
        kinds = {}
    for column, (_, rows) in columns.items():
        group.create_array(column, data=np.asarray(rows, dtype=np.int64), overwrite=True)
    kinds = {c: m for c, m in kinds.items() if c in set(group.array_keys())}
    group.attrs.update({**attrs, "kinds": {**kinds, **{c: m for c, (m, _) in columns.items()}}})


def finalize(root: zarr.Group) -> None:
    """Record completion time (consolidated metadata is avoided: it goes stale on append)."""
    root.attrs["updated"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _describe(fp: dict[str, Any]) -> str:
    return f"{fp.get('encoder')}/{fp.get('open_clip_model')}, weights {str(fp.get('pretrained'))[:23]}"

