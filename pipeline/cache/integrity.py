"""Integrity of a feature store: missing chunk files, checksum failures, unreadable metadata,
arrays that do not match the store's dims.

    damage = inventory(root)          # at every open: chunk files the done flags, the suite
                                      # indexes and the projections require
    damage = key_inventory(root)      # at every extract: the row arrays' part of it, keys decoded
    damage = verify(root)             # `pipeline extract --repair`: also decodes every row chunk
    check_shapes(root)                # the arrays' shapes and dtypes against attrs["dims"]
    root, attrs = open_root(loc, "r")  # refuses a root or group zarr.json that does not parse

Zarr reads a chunk file that does not exist as the fill value, so a deleted file of
``image/embed`` would score as zeros, and a deleted file of a suite index would point every
item at row 0. Every array is written with ``write_empty_chunks``, so each written chunk has a
file. The row arrays (``image/*``, ``text/*``, ``object/*``) are written a batch at a time and
their ``done`` flags only after a row's data: a row flagged done whose chunk (or shard) file
is absent in any array of its modality is damaged. Keys are written when rows are planned, so
every key chunk up to the committed row count (the modality's ``rows`` attribute) must exist.
The suite indexes (``suites/<suite>/<column>``, every column its ``kinds`` attribute names) and
the projections (``params/*``) are written whole, so every chunk of their chunk grid must
exist and their metadata must read. A file shorter than its chunk can be (a shard shorter
than its index reads as a shard without chunks, i.e. as zeros) is damaged like an absent one.
Every chunk carries a ``crc32c`` checksum (the shard
indexes carry one too), so bytes overwritten or cut off inside a file fail to decode;
:func:`verify` decodes every row chunk to find them, and the reader names a failure of the
others when it reads them. A :class:`Damage` names the array and the rows the damaged file
holds, and :func:`describe` turns a list of them into one message with each array's fix: the
row arrays are re-encoded by ``pipeline extract --repair``, the projections are rewritten by
every ``pipeline extract`` and a suite's index by every extract of that suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

from pipeline.cache.schema import (
    ARRAYS,
    DIMS_KEYS,
    PARAMS,
    SCHEMA_VERSION,
    CacheError,
    resolve_tail,
)

REPAIR = "pipeline extract --repair"  # re-encodes exactly the damaged rows
MISSING = "missing"  # Damage.problem of an absent chunk file
TRUNCATED = "truncated"  # Damage.problem of a chunk file too short to hold its chunk(s)
CHECKSUM_BYTES = 4  # the crc32c every chunk, and every shard index, ends in
INDEX_ENTRY_BYTES = 16  # a shard index's (offset, length) pair per inner chunk, two uint64
METADATA = "metadata: "  # Damage.problem prefix of an array whose zarr.json is absent or unreadable
BYTE_ORDER = "declares byte order "  # after METADATA: a zarr.json edited to another byte order


class CorruptStoreError(CacheError):
    """A store's chunk files are missing or damaged, or its arrays contradict its dims."""


@dataclass(frozen=True)
class Damage:
    """One damaged chunk file or array: the array, the rows ``[lo, hi)`` it holds, and what
    is wrong (:data:`MISSING`, :data:`TRUNCATED`, :data:`METADATA` and the error, or the
    decoding error)."""

    array: str
    lo: int
    hi: int
    problem: str


def fix(path: Any, array: str, problem: str = MISSING) -> str:
    """The command that makes ``array`` (or group) of the store at ``path`` whole again.

    The row arrays are re-encoded row by row (``pipeline extract --repair``). The projections
    are rewritten by every extract, and a suite's index by every extract of that suite, even
    when all its rows are done; an unreadable ``zarr.json`` of a suite group or of ``params``
    stops that rewrite, so a metadata problem is fixed by deleting the group first.
    """
    group, *rest = array.split("/")
    metadata = problem.startswith(METADATA)
    if group == "suites" and not rest:
        return f"delete {path}/suites and rerun `pipeline extract` to rewrite the indexes"
    if group == "suites":
        again = f"`pipeline extract --suite {rest[0]}` to rewrite its index"
        return f"delete {path}/suites/{rest[0]} and rerun {again}" if metadata else f"rerun {again}"
    if group == "params":
        again = "`pipeline extract` to rewrite the projections"
        return f"delete {path}/params and rerun {again}" if metadata else f"rerun {again}"
    if metadata:
        return "delete the store and rerun `pipeline extract`"  # a row array cannot be recreated in place
    return f"run `{REPAIR}` to re-encode those rows"


def orphan_message(path: Any) -> str:
    """The refusal of a location that holds files but no root ``zarr.json``: a store whose
    root metadata is lost (it holds the fingerprint and dims, so it cannot be rebuilt in
    place) or a folder that is not a store; an extract into it would delete those files."""
    return (
        f"{path} holds files but no zarr.json: a feature store whose root metadata is lost, or "
        f"a folder that is not a store; nothing is written there — delete or move it (an "
        f"extract then re-encodes every row), or set extract.out to another path"
    )


def describe(path: Any, damage: list[Damage]) -> str:
    """One line naming the store, each damaged array with its rows, and each fix."""
    by_array: dict[str, list[Damage]] = {}
    for d in damage:
        by_array.setdefault(d.array, []).append(d)
    parts, fixes = [], {}
    for name, ds in by_array.items():
        kinds = sorted({_kind(d.problem) for d in ds})
        spans = ", ".join(f"{d.lo}-{d.hi - 1}" for d in ds[:4]) + (" ..." if len(ds) > 4 else "")
        rows = "" if name.startswith("params") or ds[0].problem.startswith(METADATA) else f" rows {spans}"
        parts.append(f"{name}{rows} ({', '.join(kinds)})")
        fixes.setdefault(fix(path, name, ds[0].problem), None)
    return f"{path} is damaged: {'; '.join(parts)}; {'; '.join(fixes)}"


def _kind(problem: str) -> str:
    """What a :attr:`Damage.problem` is, in the words of the message."""
    if problem == MISSING:
        return "missing chunk file"
    if problem == TRUNCATED:
        return "truncated chunk file"
    if problem.startswith(METADATA + BYTE_ORDER):
        return f"zarr.json {problem.removeprefix(METADATA)}; extract writes little-endian"
    return "missing or unreadable metadata (zarr.json)" if problem.startswith(METADATA) else "checksum/decode failure"


def file_rows(arr: zarr.Array) -> int:
    """Rows one chunk file of ``arr`` holds (its shard, or its chunk when unsharded)."""
    return int((arr.shards or arr.chunks)[0]) if arr.ndim else 1


def file_key(arr: zarr.Array, coords: tuple[int, ...]) -> str:
    """Store key of the chunk (or shard) file at grid position ``coords`` of ``arr`` (``c`` for
    a 0-d array), as the array's chunk key encoding writes it."""
    prefix = f"{arr.path}/" if arr.path else ""
    return prefix + arr.metadata.chunk_key_encoding.encode_chunk_key(tuple(int(c) for c in coords))


def row_file_key(arr: zarr.Array, i: int) -> str:
    """Store key of the file holding row block ``i`` of a row array (one file spans every
    trailing dim)."""
    return file_key(arr, (i, *[0] * (arr.ndim - 1)))


def _stored_keys(arr: zarr.Array) -> set[str]:
    """Store keys under ``arr`` (its chunk files and its zarr.json), listed once."""
    prefix = f"{arr.path}/" if arr.path else ""

    async def listing() -> list[str]:
        return [k async for k in arr.store.list_prefix(prefix)]

    return set(sync(listing()))  # a killed write's `*.partial` file matches no chunk key


def min_file_bytes(arr: zarr.Array) -> int:
    """The fewest bytes a whole chunk file of ``arr`` can have: a shard holds its index (an
    entry per inner chunk and a checksum) and at least one inner chunk with its checksum; an
    unsharded chunk at least its checksum. Zarr reads a shard file shorter than its index as
    a shard without chunks, i.e. as the fill value, so a file cut to nothing (a full disk,
    an interrupted copy) would otherwise read as zeros."""
    if arr.shards is None:
        return CHECKSUM_BYTES
    inner = int(np.prod([s // c for s, c in zip(arr.shards, arr.chunks, strict=True)]))
    return inner * INDEX_ENTRY_BYTES + 2 * CHECKSUM_BYTES


def file_problems(arr: zarr.Array, keys: list[str]) -> dict[str, str]:
    """``{key: MISSING or TRUNCATED}`` for those of ``keys`` (chunk files ``arr`` requires)
    that are absent or shorter than :func:`min_file_bytes`: the store's listing and file
    sizes only, no data is decoded."""
    import asyncio

    present = _stored_keys(arr)
    stored = [k for k in keys if k in present]
    floor = min_file_bytes(arr)

    async def sizes() -> list[int]:
        return await asyncio.gather(*(arr.store.getsize(k) for k in stored))

    short = {k for k, size in zip(stored, sync(sizes()), strict=True) if size < floor}
    return {k: MISSING if k not in present else TRUNCATED for k in keys if k not in present or k in short}


def _flags(name: str, arr: zarr.Array, n: int, damage: list[Damage]) -> np.ndarray:
    """The first ``n`` done flags of ``arr`` (array ``name``); a chunk that fails to decode
    is recorded in ``damage`` and its rows count as not done (``--repair`` rewrites it and
    re-encodes them)."""
    try:
        return arr[:n].astype(bool)
    except Exception:  # noqa: BLE001 - find the failing chunk(s) below
        pass
    flags = np.zeros(n, dtype=bool)
    step = int(arr.chunks[0])
    for lo in range(0, n, step):
        try:
            flags[lo : lo + step] = arr[lo : min(lo + step, n)]
        except Exception as e:  # noqa: BLE001
            damage.append(Damage(name, lo, min(lo + step, arr.shape[0]), f"{type(e).__name__}: {e}"))
    return flags


def modalities(root: zarr.Group) -> dict[str, tuple]:
    """The row arrays of each modality the store's fingerprint records: images and texts,
    and the object crops only once ``object_crops`` is in it. An extract adding crops creates
    their arrays before it records them, so one killed in between leaves a store that reads
    as it did before (its next run with crops finishes the arrays)."""
    crops = bool(dict(root.attrs.get("fingerprint") or {}).get("object_crops"))
    return {m: specs for m, specs in ARRAYS.items() if m != "object" or crops}


def row_inventory(root: zarr.Group) -> list[Damage]:
    """Chunk files of the row arrays that the store's keys and done flags require but that
    are absent or too short to hold their chunks (:func:`min_file_bytes`; no data but the
    done flags is decoded: this lists file names and sizes only)."""
    damage: list[Damage] = []
    for modality, specs in modalities(root).items():
        if f"{modality}/done" not in root:
            continue
        n = int(root[modality].attrs.get("rows", 0))  # committed rows (a longer tail is an interrupted plan)
        done = _flags(f"{modality}/done", root[f"{modality}/done"], n, damage)
        for spec in specs:
            if spec.name.endswith("/done"):
                continue  # a lost flag chunk reads as "not done": the rows are re-encoded
            arr = root[spec.name]
            per = file_rows(arr)
            needed = range(-(-n // per)) if spec.name.endswith("/key") else np.unique(np.flatnonzero(done) // per)
            keys = {int(i): row_file_key(arr, int(i)) for i in needed}
            problems = file_problems(arr, list(keys.values()))
            damage += [Damage(spec.name, i * per, min((i + 1) * per, n), problems[k]) for i, k in keys.items() if k in problems]
    return damage


def _children(root: zarr.Group, path: str) -> list[str]:
    """Names of the nodes under ``path`` as the store lists them (a node whose zarr.json is
    lost or unreadable is still listed, so it can be named; zarr's own listing skips or
    fails on it)."""
    prefix = f"{root.path}/{path}/" if root.path else f"{path}/"

    async def listing() -> list[str]:
        return [k async for k in root.store.list_dir(prefix)]

    return sorted(k for k in sync(listing()) if k != "zarr.json")


def _metadata(name: str, error: Exception) -> Damage:
    """The damage of a node whose zarr.json is absent or does not parse."""
    return Damage(name, 0, 0, f"{METADATA}{type(error).__name__}: {error}")


def suite_columns(root: zarr.Group, suite: str) -> list[str]:
    """Columns of a suite's index: the column arrays its group holds and those its ``kinds``
    attribute names (a column whose files are all gone is still named by ``kinds``)."""
    kinds = root[f"suites/{suite}"].attrs.get("kinds", {})
    return list(dict.fromkeys([*_children(root, f"suites/{suite}"), *kinds]))


def whole_arrays(root: zarr.Group) -> tuple[dict[str, zarr.Array], list[Damage]]:
    """The arrays written whole by name (every ``params/*`` array and every column of every
    suite index), and the damage of the groups and arrays whose metadata is absent or
    unreadable. A store with nothing under ``params`` or ``suites`` (the writer's own tests
    write none; an extract writes the projections first) has nothing of that group to check:
    :meth:`pipeline.cache.FeatureStore.projections` names the lack when it is read."""
    names: list[str] = []
    damage: list[Damage] = []
    for group in ("params", "suites"):
        if not _children(root, group):
            continue
        try:
            if not isinstance(root[group], zarr.Group):
                raise TypeError(f"{group} is an array, not a group")
        except KeyError:
            damage.append(_metadata(group, KeyError(f"{group}/zarr.json is absent")))
        except Exception as e:  # noqa: BLE001 - a zarr.json that does not parse
            damage.append(_metadata(group, e))
        if group == "params":
            names += [f"params/{p}" for p in PARAMS]
    for suite in _children(root, "suites"):
        try:
            names += [f"suites/{suite}/{c}" for c in suite_columns(root, suite)]
        except Exception as e:  # noqa: BLE001
            damage.append(_metadata(f"suites/{suite}", e))
    arrays = {}
    for name in names:
        try:
            arrays[name] = open_array(root, name)
        except Exception as e:  # noqa: BLE001
            damage.append(_metadata(name, e))
    return arrays, damage


def open_root(loc: Any, mode: str) -> tuple[zarr.Group, dict[str, Any]]:
    """The store's root group at ``loc`` (a :class:`pipeline.cache.location.StoreLocation`)
    and its attributes, and each modality group's metadata read once, so that a hand-edited
    or truncated ``zarr.json`` is refused here, naming the file, rather than surfacing as a
    JSON error in the middle of a read or an extract.

    Raises:
        CorruptStoreError: the root's or a modality group's metadata does not parse. The
            root holds the fingerprint and dims and each group its committed row count, so
            the fix is a fresh extract.
    """
    try:
        root = loc.open(mode)
        attrs = dict(root.attrs)
    except Exception as e:  # noqa: BLE001 - an empty or hand-edited zarr.json: any parse error
        raise CorruptStoreError(
            f"{loc.path}: its root metadata (zarr.json) is unreadable ({type(e).__name__}: {e}); it "
            f"holds the fingerprint and dims, so delete the store and rerun `pipeline extract`"
        ) from None
    crops = bool(dict(attrs.get("fingerprint") or {}).get("object_crops"))
    for modality in ARRAYS:
        if modality == "object" and not crops:
            continue  # the object group exists only in stores extracted with crops
        try:
            root[modality].attrs.get("rows")
            continue
        except KeyError:
            problem = "is missing"
        except Exception as e:  # noqa: BLE001
            problem = f"is unreadable ({type(e).__name__}: {e})"
        raise CorruptStoreError(
            f"{loc.path}: the metadata of its {modality} group ({modality}/zarr.json) {problem}; it "
            f"records the committed rows, so delete the store and rerun `pipeline extract`"
        )
    return root, attrs


def open_array(root: zarr.Group, name: str) -> zarr.Array:
    """The array ``name`` of ``root``; a missing or unreadable zarr.json, or a group where an
    array belongs, raises (zarr reports these as KeyError, JSON or type errors)."""
    arr = root[name]
    if not isinstance(arr, zarr.Array):
        raise TypeError(f"{name} is a group, not an array")
    return arr


def whole_inventory(root: zarr.Group) -> list[Damage]:
    """Chunk files absent from the arrays written whole (:func:`whole_arrays`), or too short
    to hold their chunk: every chunk of their chunk grid must exist (only metadata is read,
    file names listed and sizes looked up)."""
    arrays, damage = whole_arrays(root)
    for name, arr in arrays.items():
        orders = byte_orders(arr.metadata.codecs)
        if arr.dtype.itemsize > 1 and orders != {"little"}:  # another byte order reads every value as garbage
            damage.append(Damage(name, 0, 0, f"{METADATA}{BYTE_ORDER}{', '.join(sorted(orders)) or 'none'}"))
        grid = arr.shards or arr.chunks
        per = file_rows(arr)
        files = {c: file_key(arr, c) for c in np.ndindex(*(-(-s // c) for s, c in zip(arr.shape, grid, strict=True)))}
        problems = file_problems(arr, list(files.values()))
        for coords, key in files.items():
            if key in problems:
                lo = coords[0] * per if coords else 0
                damage.append(Damage(name, lo, min(lo + per, arr.shape[0]) if coords else 1, problems[key]))
    return damage


def inventory(root: zarr.Group) -> list[Damage]:
    """Every chunk file and array metadata the store requires but lacks: the row arrays'
    (:func:`row_inventory`), the suite indexes' and the projections' (:func:`whole_inventory`)."""
    return row_inventory(root) + whole_inventory(root)


def decode_failures(root: zarr.Group, names: list[str], skip: set[tuple[str, int]] = frozenset(), progress: bool = False) -> list[Damage]:
    """Every chunk of the row arrays ``names`` decoded (checksums checked), chunk by chunk,
    so a damaged file is pinned to the rows of its inner chunk; files in ``skip`` (array,
    first row of the file) are not read."""
    from tqdm import tqdm

    damage = []
    for name in tqdm(names, desc="verify store", unit="array", disable=not progress):
        arr = root[name]
        files = {lo for array, lo in skip if array == name}
        damage += [Damage(name, lo, hi, problem) for lo, hi, problem in chunk_failures(arr, 0, arr.shape[0], files)]
    return damage


def chunk_failures(arr: zarr.Array, start: int, stop: int, skip_files: set[int] = frozenset()) -> list[tuple[int, int, str]]:
    """``(lo, hi, problem)`` of every inner chunk of ``arr`` overlapping rows
    ``[start, stop)`` that fails to decode, each decoded on its own (clipped to the range);
    chunks of the files in ``skip_files`` (their first rows) are not read."""
    step, per = int(arr.chunks[0]), file_rows(arr)
    failures = []
    for lo in range(start - start % step, stop, step):
        if (lo // per) * per in skip_files:
            continue
        try:
            arr[lo : lo + step]
        except Exception as e:  # noqa: BLE001 - any codec failure is damage, named by the caller
            failures.append((max(lo, start), min(lo + step, stop, arr.shape[0]), f"{type(e).__name__}: {e}"))
    return failures


def verify(root: zarr.Group, progress: bool = False) -> list[Damage]:
    """:func:`row_inventory` plus every row chunk decoded (:func:`decode_failures`). The
    projections and suite indexes are not decoded: the extract that repairs rewrites them
    whole."""
    damage = row_inventory(root)
    names = [spec.name for specs in ARRAYS.values() for spec in specs if spec.name in root]
    return damage + decode_failures(root, names, {(d.array, d.lo) for d in damage}, progress)


def key_inventory(root: zarr.Group) -> list[Damage]:
    """:func:`row_inventory` plus the key arrays decoded: every extract reads every key to
    plan its rows, so a key chunk that fails its checksum is named (with its repair) before
    planning rather than failing inside it."""
    damage = row_inventory(root)
    names = [f"{modality}/key" for modality in ARRAYS if f"{modality}/key" in root]
    return damage + decode_failures(root, names, {(d.array, d.lo) for d in damage})


def byte_orders(codecs: Any) -> set[str]:
    """The byte orders the ``bytes`` codecs of an array's codec chain declare (inside a
    sharding codec too: its inner and index chains)."""
    from zarr.codecs import BytesCodec, ShardingCodec

    found: set[str] = set()
    for codec in codecs:
        if isinstance(codec, ShardingCodec):
            found |= byte_orders(codec.codecs) | byte_orders(codec.index_codecs)
        elif isinstance(codec, BytesCodec) and codec.endian is not None:
            found.add(codec.endian.value)
    return found


def check_shapes(root: zarr.Group, path: Any, counts: bool = True) -> None:
    """Refuse a store whose recorded dims differ from its fingerprint's (an edited grid that
    keeps the patch count would lay the patches out wrongly), whose arrays' trailing shapes
    or dtypes differ from what its dims and this schema give, whose arrays of one modality
    differ in row count (unless ``counts`` is False: an extract checks the rest before it
    cuts an interrupted plan's longer arrays back), or whose row arrays' metadata is absent
    or unreadable. Arrays longer than the committed rows and nothing else wrong are what an
    extract killed while adding rows leaves: refused with a plain extract as the fix. The
    arrays checked are :func:`modalities`'."""
    dims = root.attrs.get("dims") or {}
    fingerprint = root.attrs.get("fingerprint") or {}
    problems = [
        f"dims {key} {dims.get(key)!r} differs from the fingerprint's {fingerprint[key]!r}"
        for key in sorted(set(dims) | set(fingerprint))
        if key in fingerprint and key in DIMS_KEYS and dims.get(key) != fingerprint[key]
    ]  # the fingerprint is hashed (fingerprint_id), so it is the record to trust
    laying_out: list[str] = []
    for modality, specs in modalities(root).items():
        lengths = {}
        for spec in specs:
            try:
                arr = open_array(root, spec.name)
            except KeyError:
                problems.append(f"{spec.name} is absent")
                continue
            except Exception as e:  # noqa: BLE001 - a zarr.json that does not parse
                problems.append(f"{spec.name} has unreadable metadata ({type(e).__name__}: {e})")
                continue
            lengths[spec.name] = arr.shape[0]
            try:
                want = resolve_tail(spec, dims)
            except (KeyError, TypeError, IndexError) as e:
                problems.append(f"dims lacks {e}")
                continue
            if tuple(arr.shape[1:]) != want:
                problems.append(f"{spec.name} has rows of shape {tuple(arr.shape[1:])}, dims {dims} give {want}")
            if str(arr.dtype) != spec.dtype:
                problems.append(f"{spec.name} is {arr.dtype}, schema v{SCHEMA_VERSION} stores {spec.dtype}")
            orders = byte_orders(arr.metadata.codecs)
            if arr.dtype.itemsize > 1 and orders != {"little"}:  # another byte order reads every value as garbage
                problems.append(f"{spec.name} {BYTE_ORDER}{', '.join(sorted(orders)) or 'none'}; extract writes little-endian")
        if counts and len(set(lengths.values())) > 1:
            committed = root[modality].attrs.get("rows")
            if isinstance(committed, int) and min(lengths.values()) >= committed:
                laying_out.append(f"{modality} arrays hold rows beyond the {committed} committed ({', '.join(f'{k}: {v}' for k, v in lengths.items())})")
            else:
                problems.append(f"{modality} arrays differ in rows ({', '.join(f'{k}: {v}' for k, v in lengths.items())})")
    if laying_out and not problems:  # what an extract killed while adding rows leaves; its next run drops them
        raise CorruptStoreError(
            f"{path}: {'; '.join(laying_out)}: an extract stopped while adding rows; rerun `pipeline extract`, "
            f"which drops the uncommitted rows and encodes them again"
        )
    if problems:
        problems = list(dict.fromkeys(problems))  # a lost dims key fails every array alike
        raise CorruptStoreError(
            f"{path} does not match its own dims/schema: {'; '.join(problems)}; its attributes or "
            f"arrays were edited, which --repair cannot undo — delete the whole store ({path}) and rerun `pipeline extract`"
        )
