"""Integrity of a feature store: missing chunk files, checksum failures, arrays that do not
match the store's dims.

    damage = inventory(root)          # at every open: chunk files the done flags require
    damage = verify(root)             # `pipeline extract --repair`: also decodes every chunk
    check_shapes(root)                # the arrays' shapes and dtypes against attrs["dims"]

Zarr reads a chunk file that does not exist as the fill value, so a deleted file of
``image/embed`` would score as zeros. Every array is written with ``write_empty_chunks``, so
each written chunk has a file, and ``done`` flags are set only after a row's data is written:
a row flagged done whose chunk (or shard) file is absent in any array of its modality is
damaged. Keys are written when rows are planned, so every key chunk up to the committed row
count (the modality's ``rows`` attribute) must exist. Every chunk carries a ``crc32c`` checksum (the shard indexes carry one too), so bytes
overwritten or cut off inside a file fail to decode; :func:`verify` decodes every chunk to
find them. A :class:`Damage` names the array and the rows the damaged file holds, and
:class:`CorruptStoreError` turns a list of them into one message with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

from pipeline.cache.schema import (
    ARRAYS,
    SCHEMA_VERSION,
    CacheError,
    resolve_tail,
)

REPAIR = "pipeline extract --repair"  # re-encodes exactly the damaged rows


class CorruptStoreError(CacheError):
    """A store's chunk files are missing or damaged, or its arrays contradict its dims."""


@dataclass(frozen=True)
class Damage:
    """One damaged chunk file: the array, the rows ``[lo, hi)`` it holds, and what is wrong."""

    array: str
    lo: int
    hi: int
    problem: str  # "missing" or the decoding error


def describe(path: Any, damage: list[Damage], fix: str = REPAIR) -> str:
    """One line naming the store, each damaged array with its rows, and the repair command."""
    by_array: dict[str, list[Damage]] = {}
    for d in damage:
        by_array.setdefault(d.array, []).append(d)
    parts = []
    for name, ds in by_array.items():
        spans = ", ".join(f"{d.lo}-{d.hi - 1}" for d in ds[:4]) + (" ..." if len(ds) > 4 else "")
        kinds = sorted({"missing chunk file" if d.problem == "missing" else "checksum/decode failure" for d in ds})
        parts.append(f"{name} rows {spans} ({', '.join(kinds)})")
    return f"{path} is damaged: {'; '.join(parts)}; run `{fix}` to re-encode those rows"


def file_rows(arr: zarr.Array) -> int:
    """Rows one chunk file of ``arr`` holds (its shard, or its chunk when unsharded)."""
    return int((arr.shards or arr.chunks)[0]) if arr.ndim else 1


def _stored_files(root: zarr.Group, name: str) -> set[int]:
    """Row indices of the chunk files of array ``name`` present in the store."""
    prefix = f"{root.path + '/' if root.path else ''}{name}/c/"

    async def listing() -> list[str]:
        return [k async for k in root.store.list_prefix(prefix)]

    first = (k[len(prefix):].split("/")[0] for k in sync(listing()))
    return {int(f) for f in first if f.isdigit()}  # a killed write's `*.partial` file is no chunk


def inventory(root: zarr.Group) -> list[Damage]:
    """Chunk files the store's keys and done flags require but that are absent (no data is
    decoded: this lists file names only)."""
    damage: list[Damage] = []
    for modality, specs in ARRAYS.items():
        if f"{modality}/done" not in root:
            continue
        n = int(root[modality].attrs.get("rows", 0))  # committed rows (a longer tail is an interrupted plan)
        done = root[f"{modality}/done"][:n].astype(bool)
        for spec in specs:
            arr = root[spec.name]
            per = file_rows(arr)
            present = _stored_files(root, spec.name)
            if spec.name.endswith("/done"):
                continue  # a lost flag chunk reads as "not done": the rows are re-encoded
            needed = range(-(-n // per)) if spec.name.endswith("/key") else np.unique(np.flatnonzero(done) // per)
            for i in needed:
                if int(i) not in present:
                    damage.append(Damage(spec.name, int(i) * per, min((int(i) + 1) * per, n), "missing"))
    return damage


def verify(root: zarr.Group, progress: bool = False) -> list[Damage]:
    """:func:`inventory` plus every chunk decoded (checksums checked), chunk by chunk, so a
    damaged file is pinned to the rows of its inner chunk."""
    from tqdm import tqdm

    damage = inventory(root)
    missing = {(d.array, d.lo) for d in damage}
    names = [spec.name for specs in ARRAYS.values() for spec in specs if spec.name in root]
    for name in tqdm(names, desc="verify store", unit="array", disable=not progress):
        arr = root[name]
        step = int(arr.chunks[0])
        per = file_rows(arr)
        for lo in range(0, arr.shape[0], step):
            if (name, (lo // per) * per) in missing:
                continue
            try:
                arr[lo : lo + step]
            except Exception as e:  # noqa: BLE001 - any codec failure is damage, named below
                damage.append(Damage(name, lo, min(lo + step, arr.shape[0]), f"{type(e).__name__}: {e}"))
    return damage


def check_shapes(root: zarr.Group, path: Any) -> None:
    """Refuse a store whose arrays' trailing shapes or dtypes differ from what its recorded
    dims and this schema give, or whose arrays of one modality differ in row count."""
    dims = root.attrs.get("dims") or {}
    problems = []
    for modality, specs in ARRAYS.items():
        if f"{modality}/done" not in root:
            continue
        counts = {}
        for spec in specs:
            if spec.name not in root:
                problems.append(f"{spec.name} is absent")
                continue
            arr = root[spec.name]
            counts[spec.name] = arr.shape[0]
            try:
                want = resolve_tail(spec, dims)
            except (KeyError, TypeError, IndexError) as e:
                problems.append(f"dims lacks {e}")
                continue
            if tuple(arr.shape[1:]) != want:
                problems.append(f"{spec.name} has rows of shape {tuple(arr.shape[1:])}, dims {dims} give {want}")
            if str(arr.dtype) != spec.dtype:
                problems.append(f"{spec.name} is {arr.dtype}, schema v{SCHEMA_VERSION} stores {spec.dtype}")
        if len(set(counts.values())) > 1:
            problems.append(f"{modality} arrays differ in rows ({', '.join(f'{k}: {v}' for k, v in counts.items())})")
    if problems:
        raise CorruptStoreError(
            f"{path} does not match its own dims/schema: {'; '.join(problems)}; its attributes or "
            f"arrays were edited — delete it and rerun `pipeline extract`"
        )
