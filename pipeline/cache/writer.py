"""Writing a feature store: create/open, append content-addressed rows, encode, index suites.

The writer never encodes a row twice: new images/captions are those whose content key is
not in the store yet, or whose ``done`` flag is still False after an interrupted run. Rows are
encoded in batches aligned to shard boundaries, the data arrays are written first and the
``done`` flags last, so a crash leaves at most a batch of rows to redo.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec

from pipeline.cache.integrity import CorruptStoreError, check_shapes, open_root, orphan_message
from pipeline.cache.location import StoreLocation
from pipeline.cache.schema import (
    ARRAYS,
    FLAT_CHUNK_ROWS,
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
    fingerprint_differences,
    fingerprint_id,
    keys_to_hex,
    resolve_tail,
    without_options,
)

log = logging.getLogger(__name__)
# Small arrays (keys, ids, embeddings) are compressed; fp16 grids and token states are not:
# they compress poorly and compressing them costs much of their write time (docs/trials.md).
COMPRESSOR = BloscCodec(cname="zstd", clevel=1, shuffle=BloscShuffle.shuffle)
CHECKSUM = Crc32cCodec()  # last codec of every chunk: damaged bytes fail to decode
# Every chunk gets a file, even one equal to the fill value, so an absent file is damage
# (pipeline.cache.integrity), never an all-zero chunk.
ARRAY_CONFIG = {"write_empty_chunks": True}


class NonFiniteFeaturesError(ValueError):
    """An encoder produced NaN or inf features."""


def open_for_writing(
    path: str | Path,
    fingerprint: dict[str, Any],
    dims: dict[str, Any],
    replace_mismatch: bool = False,
    storage_options: dict[str, Any] | None = None,
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
        storage_options: fsspec options when ``path`` is a URL (:mod:`pipeline.cache.location`).

    Raises:
        StaleCacheError / ForeignCacheError: an existing store has another schema version or
            fingerprint and ``replace_mismatch`` is False.
    """
    loc = StoreLocation.of(path, storage_options)
    if not loc.exists() and loc.has_content():
        raise CorruptStoreError(orphan_message(path))
    fid = fingerprint_id(fingerprint)
    if loc.exists() and _interrupted_layout(loc):
        log.warning("%s: a first layout was interrupted before its attributes were written; laid out afresh", path)
        loc.remove()
    if loc.exists() and replace_mismatch:
        _, attrs = open_root(loc, "r")
        same_encoder = encoder_id(attrs.get("fingerprint", {})) == encoder_id(fingerprint)
        if attrs.get("schema_version") != SCHEMA_VERSION or not same_encoder:
            log.warning("replacing %s: it was written by another encoder or schema", path)
            loc.remove()
    if loc.exists():
        root, _ = open_root(loc, "r+")
        version = root.attrs.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StaleCacheError(
                f"{path} has cache schema v{version}, this code writes v{SCHEMA_VERSION}; "
                f"delete it and rerun `pipeline extract`"
            )
        stored = dict(root.attrs.get("fingerprint", {}))
        if encoder_id(stored) != encoder_id(fingerprint):
            raise ForeignCacheError(
                f"{path} was written by another encoder configuration "
                f"({fingerprint_differences(without_options(stored), without_options(fingerprint))}); "
                f"delete it, set extract.replace_mismatch: true, or choose another extract.out, "
                f"then rerun `pipeline extract`"
            )
        adding = fingerprint.get("object_crops") and not stored.get("object_crops")
        if adding or stored.get("object_crops"):
            for spec in OBJECT_ARRAYS:
                if spec.name not in root:
                    _create(root, spec, resolve_tail(spec, dims))
        if adding:  # after the arrays: killed before this, the store reads as one without crops
            log.info("adding object crops to %s", path)
            stored["object_crops"] = True
            root.attrs.update(fingerprint=stored, fingerprint_id=fingerprint_id(stored))
        check_shapes(root, path, counts=False)  # an absent array or edited dims named, not a KeyError
        return root
    root = loc.open("w")
    crops = OBJECT_ARRAYS if fingerprint.get("object_crops") else ()
    for spec in IMAGE_ARRAYS + TEXT_ARRAYS + crops:
        _create(root, spec, resolve_tail(spec, dims))
    root.attrs.update(  # last: a root without them is an interrupted layout (_interrupted_layout)
        schema_version=SCHEMA_VERSION,
        fingerprint=fingerprint,
        fingerprint_id=fid,
        dims=dims,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )
    return root


def _interrupted_layout(loc: StoreLocation) -> bool:
    """Whether the group at ``loc`` is a first layout killed before its attributes, which
    :func:`open_for_writing` writes after every array: a root without attributes holding
    only (some of) the modality groups, so no row was ever written to it. Any other group
    (a store, or someone else's Zarr data) is left to the checks that name it."""
    try:
        root = loc.open("r")
        return not dict(root.attrs) and not list(root.array_keys()) and set(root.group_keys()) <= set(ARRAYS)
    except Exception:  # noqa: BLE001 - an unreadable root is named by open_root, not removed here
        return False


def _create(root: zarr.Group, spec: ArraySpec, tail: tuple[int, ...]) -> None:
    if spec.sharded:
        chunks, shards = (chunk_rows(spec, tail), *tail), (SHARD_ROWS, *tail)
    else:
        chunks, shards = (FLAT_CHUNK_ROWS, *tail), None
    root.create_array(
        spec.name,
        shape=(0, *tail),
        dtype=spec.dtype,
        chunks=chunks,
        shards=shards,
        compressors=(COMPRESSOR, CHECKSUM) if spec.dtype != "bool" and not spec.sharded else (CHECKSUM,),
        fill_value=0 if spec.dtype != "bool" else False,
        config=ARRAY_CONFIG,
    )


def write_params(root: zarr.Group, params: dict[str, np.ndarray]) -> None:
    """Store the frozen projection parameters (``params/<name>``), once."""
    for name, value in params.items():
        value = np.asarray(value, dtype=np.float32)
        arr = root.require_array(
            f"params/{name}", shape=value.shape, dtype="float32", compressors=(CHECKSUM,), config=ARRAY_CONFIG
        )
        arr[...] = value


def plan_rows(root: zarr.Group, modality: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map content keys to store rows, appending rows for unseen keys.

    Appending resizes every array of the modality, writes the new keys, and then records the
    new row count in the modality group's ``rows`` attribute. A run killed between those
    steps leaves arrays longer than ``rows``; the next call cuts them back to ``rows`` before
    planning, so the uncommitted tail is planned again exactly as the first time.

    Args:
        modality: ``image``, ``text`` or ``object``.
        keys: [n, 16] uint8 content keys (duplicates allowed).

    Returns:
        ``rows`` [n] int64 row of every key, and ``todo`` sorted unique rows whose ``done``
        flag is False (new rows and rows left unfinished by an interrupted run).
    """
    committed = int(root[modality].attrs.get("rows", 0))
    for spec in ARRAYS[modality]:
        arr = root[spec.name]
        if arr.shape[0] != committed:
            log.info("%s: dropping %d uncommitted rows of an interrupted run", spec.name, arr.shape[0] - committed)
            arr.resize((committed, *arr.shape[1:]))
    key_arr = root[f"{modality}/key"]
    existing = {k: i for i, k in enumerate(keys_to_hex(key_arr[:]))}
    hexes = keys_to_hex(keys)
    new = [h for h in dict.fromkeys(hexes) if h not in existing]
    if new:
        n_new = committed + len(new)
        for spec in ARRAYS[modality]:
            arr = root[spec.name]
            arr.resize((n_new, *arr.shape[1:]))
        new_keys = np.stack([np.frombuffer(bytes.fromhex(h), dtype=np.uint8) for h in new])
        append_keys(root, modality, committed, new_keys)
        root[modality].attrs["rows"] = n_new
        existing.update({h: committed + i for i, h in enumerate(new)})
    rows = np.array([existing[h] for h in hexes], dtype=np.int64)
    done = root[f"{modality}/done"][:]  # re-read: `resize` went through another handle
    todo = np.flatnonzero(~done.astype(bool))
    return rows, todo


def append_keys(root: zarr.Group, modality: str, start: int, keys: np.ndarray) -> None:
    """Write the keys of the rows appended at ``start`` (after every array was resized)."""
    root[f"{modality}/key"][start : start + len(keys)] = keys  # fresh handle: the old one predates resize


def batch_rows(batch_size: int) -> int:
    """The row span of one :func:`shard_batches` batch: ``batch_size`` rounded down to whole
    shards, at least one; batches are the rows inside aligned spans of this many."""
    return max(SHARD_ROWS, (batch_size // SHARD_ROWS) * SHARD_ROWS)


def shard_batches(rows: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    """Split sorted rows into batches that never straddle a shard boundary needlessly.

    Consecutive rows are grouped by shard; batches hold whole shards' worth of rows (at
    least ``batch_size`` rounded to shards), so concurrent or repeated writes touch whole
    shard files.
    """
    if len(rows) == 0:
        return
    shard_of = rows // batch_rows(batch_size)
    cuts = np.flatnonzero(np.diff(shard_of)) + 1
    yield from np.split(rows, cuts)


def task_blocks(rows: np.ndarray, block_rows: int) -> Iterator[np.ndarray]:
    """Split sorted rows into blocks no two of which share a chunk or shard file of any array.

    Every array's chunks and shards tile rows in multiples of ``FLAT_CHUNK_ROWS`` (the chunk
    of the unsharded arrays), so blocks of whole ``FLAT_CHUNK_ROWS`` spans, at least
    ``block_rows`` rows each, can be written by concurrent tasks without a read-modify-write
    of one file by two of them.
    """
    if len(rows) == 0:
        return
    per = max(FLAT_CHUNK_ROWS, -(-block_rows // FLAT_CHUNK_ROWS) * FLAT_CHUNK_ROWS)
    block_of = rows // per
    yield from np.split(rows, np.flatnonzero(np.diff(block_of)) + 1)


def row_arrays(root: zarr.Group, modality: str) -> dict[str, zarr.Array]:
    """``{name: array}`` of ``modality``'s row arrays (``image/final`` as ``final``), opened
    once for a run of :func:`write_rows` with :data:`ARRAY_CONFIG` (zarr keeps an array's
    config out of its metadata, so an array opened by name writes with the defaults). Open
    them after :func:`plan_rows`: a handle opened before a resize keeps the old shape."""
    return {spec.field: root[spec.name].with_config(ARRAY_CONFIG) for spec in ARRAYS[modality]}


def finite_rows(value: np.ndarray) -> np.ndarray:
    """[n] bool: which rows of a float array hold no NaN or inf. A float16 array is checked
    on its bits: NaN and inf are exactly the values whose exponent bits are all ones."""
    if value.dtype == np.float16:
        exponent = value.view(np.uint16) & 0x7C00
        return ~(exponent == 0x7C00).reshape(len(value), -1).any(axis=1)
    return np.isfinite(value.reshape(len(value), -1)).all(axis=1)


def write_rows(
    root: zarr.Group,
    modality: str,
    rows: np.ndarray,
    arrays: dict[str, np.ndarray],
    done: np.ndarray | None = None,
    handles: dict[str, zarr.Array] | None = None,
) -> None:
    """Write one batch of encoded rows (contiguous or not), then flag them done.

    Args:
        done: [len(rows)] bool, which rows to flag (None: all); a row left unflagged (its
            image could not be decoded) is encoded again by the next extract.
        handles: :func:`row_arrays` of ``modality`` (None: opened for this call).

    Raises:
        NonFiniteFeaturesError: a float array holds NaN or inf once cast to its stored
            dtype (a float32 value beyond float16's range is inf in a float16 grid; nothing
            of the batch is written).
    """
    handles = handles or row_arrays(root, modality)
    arrays = {name: value.astype(handles[name].dtype, copy=False) for name, value in arrays.items()}
    for name, value in arrays.items():
        if np.issubdtype(value.dtype, np.floating):
            bad = ~finite_rows(value)
            if done is not None:
                bad &= done
            if bad.any():
                raise NonFiniteFeaturesError(
                    f"the encoder produced NaN/inf {modality}/{name} features for store rows "
                    f"{rows[bad][:8].tolist()}{' ...' if bad.sum() > 8 else ''} (as stored, in {value.dtype}"
                    f"{': finite up to 65504' if value.dtype == np.float16 else ''}); nothing of that batch "
                    f"was written (check the weights and the inputs of those rows)"
                )
    ascending = bool(np.all(np.diff(rows) > 0))  # a batch's rows usually are: no reordering copy
    order = None if ascending else np.argsort(rows, kind="stable")
    sorted_rows = rows if order is None else rows[order]  # split into runs of neighbours: zarr
    starts = np.flatnonzero(np.diff(sorted_rows, prepend=sorted_rows[0] - 2) != 1)  # writes a sharded
    ends = np.append(starts[1:], len(rows))  # array's rows by slices, not by index lists
    for name, value in arrays.items():
        arr = handles[name]
        value = value if order is None else value[order]
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            arr[int(sorted_rows[a]) : int(sorted_rows[b - 1]) + 1] = value[a:b]
    flags = np.ones(len(rows), dtype=bool) if done is None else np.asarray(done, dtype=bool)
    handles["done"].set_orthogonal_selection((rows,), flags)


def clear_damage(root: zarr.Group, damage: list) -> dict[str, np.ndarray]:
    """Make every damaged chunk file of ``damage`` (:class:`pipeline.cache.integrity.Damage`)
    whole again and its rows due for encoding: the rows it holds are unflagged in their
    modality's ``done`` first, then the file is deleted and rewritten with zeros, so a repair
    killed midway leaves rows due for encoding, never zeros flagged as encoded.

    Returns:
        ``{modality: rows}`` whose keys were in a damaged file (zero now; the caller restores
        them from the suite indexes).
    """
    from zarr.core.sync import sync

    from pipeline.cache.integrity import file_rows, row_file_key

    lost: dict[str, list[np.ndarray]] = {}
    for d in damage:
        modality = d.array.split("/")[0]
        arr = root[d.array].with_config(ARRAY_CONFIG)  # the zeros get a file, like any write
        per = file_rows(arr)
        for i in range(d.lo // per, (d.hi - 1) // per + 1):
            lo, hi = i * per, min((i + 1) * per, arr.shape[0])
            root[f"{modality}/done"][lo:hi] = False
            sync(root.store.delete(row_file_key(arr, i)))
            arr[lo:hi] = np.zeros((hi - lo, *arr.shape[1:]), dtype=arr.dtype)
            if d.array.endswith("/key"):
                lost.setdefault(modality, []).append(np.arange(lo, hi))
        log.warning("%s: rows %d-%d cleared for re-encoding (%s)", d.array, d.lo, d.hi - 1, d.problem[:80])
    return {m: np.concatenate(r) for m, r in lost.items()}


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
        # the old hash goes before any column changes: a kill in between leaves an index no
        # manifest matches (a reader asks for the extract), never new rows under the old hash
        group.attrs["manifest_sha256"] = None
        for stale in sorted(set(group.array_keys()) - set(columns)):
            del group[stale]
        kinds = {}
    for column, (_, rows) in columns.items():
        group.create_array(
            column, data=np.asarray(rows, dtype=np.int64), overwrite=True,
            compressors=(COMPRESSOR, CHECKSUM), config=ARRAY_CONFIG,
        )  # fmt: skip
    kinds = {c: m for c, m in kinds.items() if c in set(group.array_keys())}
    group.attrs.update({**attrs, "kinds": {**kinds, **{c: m for c, (m, _) in columns.items()}}})


def finalize(root: zarr.Group) -> None:
    """Stamp the root with the time rows were last written (``updated``). Extraction calls it
    only when rows that now hold data were written (an undecodable image's row, retried by
    every run, is not one) or the stamp is absent, so a run with nothing new leaves the
    store's bytes as they were. Consolidated metadata is avoided: it goes stale on append."""
    root.attrs["updated"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
