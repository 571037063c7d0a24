"""Reading a feature store: row gathers into float32 features, refusing stale or foreign stores.

    store = FeatureStore.open("cache/features/toy.zarr", expect=fingerprint)
    store.dims, store.projections()             # FeatureDims, Projections
    img = store.images(rows)                    # ImageFeatures for those rows (float32 torch)
    txt = store.texts(rows, grids=False)        # TextFeatures, pooled embeddings only
    obj = store.objects(rows)                   # [B, D] re-encoded object crops (extract.object_crops)
    idx = store.suite_index("shapes-aro", manifest_path)   # {column: rows}, checks the hash

Every reader (score batches, training's one-shot load, probes, diagnostics) asks for a set
of rows, in any order and with repeats. ``_gather`` reads each run of nearby rows (gaps up
to ``GAP_BYTES`` are read through) as one slice and picks the rows in memory: zarr's integer
(orthogonal) selection on these sharded arrays is the slow path, far behind slices on the
stages' read patterns. Reads go straight to zarr, without dask: a dask view is slower than
these slices, and its threaded scheduler gains nothing over one thread, so there is no
parallel reading to gain. ``scripts/bench_reads.py`` measures this (figures in
docs/trials.md).

A reader that comes back to the same rows many times (the score stage reads every suite
once per variant and replacement mode) turns on a block cache with
:meth:`FeatureStore.cache_reads`: ``_gather`` then reads whole row blocks (one chunk: the inner
chunk of a sharded array, so no read decodes more than the rows' own chunks), keeps them as stored (fp16 grids) in a least-recently
used cache up to a byte budget, and picks the rows from there; the rows it returns are the
same bytes. Without it (the default) nothing is kept, which suits one-pass readers such as
training's load.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from pipeline.cache.integrity import (
    METADATA,
    CorruptStoreError,
    Damage,
    check_shapes,
    chunk_failures,
    describe,
    inventory,
    open_array,
    open_root,
    orphan_message,
    suite_columns,
)
from pipeline.cache.location import StoreLocation
from pipeline.cache.lock import describe_holder, running_writer
from pipeline.cache.schema import (
    SCHEMA_VERSION,
    CacheError,
    ForeignCacheError,
    StaleCacheError,
    fingerprint_differences,
    fingerprint_id,
)
from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct [U], position [...]): the distinct store rows among ``rows`` (any shape; -1,
    a skipped item, left out) in order of first appearance, and each entry's position among
    them (-1 where the row is -1). A store's row numbers are its history (rows are appended as
    suites are extracted, and a grown store keeps its old ones), so anything ordered by them —
    a batch's images, a seeded draw over a suite's images — would differ between a fresh store
    and a grown one holding the same features; first appearance in the manifest does not."""
    rows = np.asarray(rows, dtype=np.int64)
    flat = rows.reshape(-1)
    valid = flat >= 0
    values, first, inverse = np.unique(flat[valid], return_index=True, return_inverse=True)  # [V], [V], [n_valid]
    order = np.argsort(first)  # [V] the values by first appearance
    rank = np.empty(len(values), dtype=np.int64)
    rank[order] = np.arange(len(values))
    position = np.full(flat.shape, -1, dtype=np.int64)
    position[valid] = rank[inverse.reshape(-1)]
    return values[order], position.reshape(rows.shape)


GAP_BYTES = 1 << 20  # a gap between wanted rows up to this size is read through, not skipped



def refuse_foreign(path: str | Path, have: dict[str, Any], expect: dict[str, Any]) -> None:
    """Raise :class:`ForeignCacheError`, naming the fields that differ, when the store at
    ``path`` records fingerprint ``have`` and the caller is configured for ``expect``."""
    if fingerprint_id(have) != fingerprint_id(expect):
        raise ForeignCacheError(
            f"{path} was extracted with a different encoder configuration "
            f"({fingerprint_differences(have, expect)}); re-extract it with the configured "
            f"encoder (`pipeline extract` with extract.replace_mismatch: true, or delete the "
            f"store first), or configure the encoder it was extracted with"
        )

class BlockCache:
    """Least-recently used row blocks of a store's arrays, up to a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self.blocks: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def get(self, key: tuple[str, int]) -> np.ndarray | None:
        value = self.blocks.get(key)
        if value is not None:
            self.blocks.move_to_end(key)
        return value

    def put(self, key: tuple[str, int], value: np.ndarray) -> None:
        """Keep ``value``, dropping the least recently used blocks to stay within the budget
        (a block larger than the whole budget is not kept)."""
        if value.nbytes > self.budget or key in self.blocks:
            return
        while self.used + value.nbytes > self.budget:
            _, old = self.blocks.popitem(last=False)
            self.used -= old.nbytes
        self.blocks[key] = value
        self.used += value.nbytes


class FeatureStore:
    """Read-only view of one encoder's store."""

    def __init__(self, path: Path | str, root: zarr.Group) -> None:
        self.path = path
        self.root = root
        self._done: dict[str, np.ndarray] = {}  # modality -> [N] bool, read once (read-only)
        self._blocks: BlockCache | None = None  # see cache_reads
        self._arrays: dict[str, zarr.Array] = {}  # name -> opened array (metadata read once)

    def cache_reads(self, budget_bytes: int) -> FeatureStore:
        """Keep up to ``budget_bytes`` of read row blocks in memory (0 turns the cache off);
        returns the store. For readers that read the same rows again and again."""
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self._blocks = BlockCache(budget_bytes) if budget_bytes else None
        return self

    @classmethod
    def open(cls, path: str | Path, expect: dict[str, Any] | None = None, storage_options: dict[str, Any] | None = None) -> FeatureStore:
        """Open ``path`` read-only and check its schema version, fingerprint, shapes and
        chunk inventory.

        Args:
            expect: the fingerprint of the encoder the caller is configured for; None skips
                the fingerprint check (version is always checked).
            storage_options: fsspec options when ``path`` is a URL.

        Raises:
            CacheError: no store at ``path``.
            StaleCacheError: written by another schema version.
            ForeignCacheError: written by another encoder/weights/preprocessing.
            CorruptStoreError: chunk files missing (of the row arrays, the suite indexes or
                the projections), metadata unreadable, arrays contradicting the dims, or
                attributes edited (:mod:`pipeline.cache.integrity`).
        """
        loc = StoreLocation.of(path, storage_options)
        path = loc.path
        if not loc.exists():
            if loc.has_content():
                raise CorruptStoreError(orphan_message(path))
            others = [] if loc.remote else sorted(p.name for p in Path(path).parent.glob("*.zarr") if p.is_dir())
            beside = (f"; its folder holds {', '.join(others)}: if one was extracted for this run, set this stage's "
                      f"encoder to its name (extract.model names the store)") if others else ""  # fmt: skip
            where = "" if loc.remote or Path(path).is_absolute() else f" ({Path(path).absolute()}: relative paths in the params are read from the current folder)"
            raise CacheError(f"no feature store at {path}{where}; run `pipeline extract` first{beside}")
        try:
            return cls(path, cls._checked_root(loc, path, expect))
        except CacheError:
            holder = running_writer(path)
            if holder is None or holder.get("pid") == os.getpid():  # no writer, or this very process
                raise
            raise CacheError(
                f"an extract ({describe_holder(holder)}) is writing {path} now and has not finished laying it out: "
                "score once it finishes"
            ) from None

    @staticmethod
    def _checked_root(loc: StoreLocation, path: str, expect: dict[str, Any] | None):
        """The store's root group once its version, fingerprint, shapes and chunk inventory
        pass (:meth:`open`'s checks)."""
        root, attrs = open_root(loc, "r")
        version = attrs.get("schema_version")
        if version is None:
            raise CorruptStoreError(
                f"{path}: its root metadata (zarr.json) records no schema_version: it is empty or "
                f"was edited, and it holds the fingerprint and dims, so delete the store and rerun "
                f"`pipeline extract`"
            )
        if version != SCHEMA_VERSION:
            raise StaleCacheError(
                f"{path} has cache schema v{version}, this code reads v{SCHEMA_VERSION}; "
                f"rerun `pipeline extract`"
            )
        have = dict(attrs.get("fingerprint", {}))
        if attrs.get("fingerprint_id") != fingerprint_id(have):
            raise CorruptStoreError(
                f"{path}: its fingerprint_id {attrs.get('fingerprint_id')} is not the hash of its "
                f"recorded fingerprint ({fingerprint_id(have)}): its attributes were edited; delete the "
                f"whole store ({path}) and rerun `pipeline extract`"
            )
        if expect is not None:
            refuse_foreign(path, have, expect)
        check_shapes(root, path)
        damage = inventory(root)
        if damage:
            raise CorruptStoreError(describe(path, damage))
        return root

    @property
    def fingerprint(self) -> dict[str, Any]:
        return dict(self.root.attrs["fingerprint"])

    def expect(self, fingerprint: dict[str, Any]) -> FeatureStore:
        """Refuse this open store unless it was extracted with ``fingerprint`` (what
        :meth:`open`'s ``expect`` checks, for a caller whose expectation is computed from the
        store's own record); returns the store."""
        refuse_foreign(self.path, self.fingerprint, fingerprint)
        return self

    @cached_property
    def dims(self) -> FeatureDims:
        d = self.root.attrs["dims"]
        return FeatureDims(
            grid=tuple(d["grid"]),
            d_v=d["d_v"],
            d_t=d["d_t"],
            embed_dim=d["embed_dim"],
            context_length=d["context_length"],
        )

    def projections(self) -> Projections:
        return Projections(
            visual_proj=torch.from_numpy(self._whole("params/visual_proj")),
            text_projection=torch.from_numpy(self._whole("params/text_projection")),
            logit_scale=torch.tensor(float(self._whole("params/logit_scale"))),
        )

    def _refuse(self, name: str, lo: int, hi: int, error: Exception, metadata: bool = False) -> CorruptStoreError:
        """The error a failed read of rows ``[lo, hi)`` of ``name`` raises: the store, the
        array, its rows and its fix (:func:`pipeline.cache.integrity.describe`), then the
        codec's or zarr's own words."""
        problem = f"{METADATA if metadata else ''}{type(error).__name__}: {error}"
        return CorruptStoreError(f"{describe(self.path, [Damage(name, lo, hi, problem)])} ({type(error).__name__}: {error})")

    def _array(self, name: str) -> zarr.Array:
        """The array ``name``, opened once per reader rather than on every gather (the view is
        read-only, so its metadata stays valid); a lost or unreadable zarr.json is damage,
        named with its fix."""
        arr = self._arrays.get(name)
        if arr is None:
            try:
                arr = open_array(self.root, name)
            except Exception as e:  # noqa: BLE001
                raise self._refuse(name, 0, 0, e, metadata=True) from None
            self._arrays[name] = arr
        return arr

    def _whole(self, name: str) -> np.ndarray:
        """All of array ``name`` (a suite index, a projection, a done flag array); a codec
        failure is damage, named with its fix."""
        arr = self._array(name)
        try:
            return arr[...]
        except Exception as e:  # noqa: BLE001
            raise self._refuse(name, 0, arr.shape[0] if arr.ndim else 1, e) from None

    def _gather(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows of one array, in the given order (duplicates allowed; negative rows count
        from the end, as in zarr)."""
        arr = self._array(name)
        n = arr.shape[0]
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < -n or rows.max() >= n):
            bad = rows[(rows < -n) | (rows >= n)][0]
            raise IndexError(f"{self.path}/{name}: row {bad} is out of range for {n} rows")
        uniq, inverse = np.unique(np.where(rows < 0, rows + n, rows), return_inverse=True)
        if len(uniq) == 0:
            return np.empty((0, *arr.shape[1:]), dtype=arr.dtype)
        if self._blocks is not None:
            return self._cached_rows(name, arr, uniq)[inverse]
        row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
        max_gap = max(1, GAP_BYTES // max(row_bytes, 1))  # rows
        runs = np.split(uniq, np.flatnonzero(np.diff(uniq) > max_gap) + 1)
        parts = [self._slice(name, arr, int(r[0]), int(r[-1]) + 1)[r - r[0]] for r in runs]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts))[inverse]

    def _slice(self, name: str, arr: zarr.Array, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``arr``; a codec failure is damage: named, with the fix,
        and pinned to the rows of the inner chunks that fail (each chunk of the read is
        decoded again on its own, on this error path only)."""
        try:
            return arr[start:stop]
        except Exception as e:  # noqa: BLE001
            failing = chunk_failures(arr, start, stop)
            lo, hi = (failing[0][0], failing[-1][1]) if failing else (start, stop)
            raise self._refuse(name, lo, hi, e) from None

    def _cached_rows(self, name: str, arr: zarr.Array, uniq: np.ndarray) -> np.ndarray:
        """Sorted unique rows ``uniq`` of ``arr`` through the block cache: the blocks not held
        are read in runs of consecutive blocks, then every row is picked from its block."""
        size = int(arr.chunks[0])  # rows per block: one (inner) chunk, the smallest unit zarr decodes
        n = arr.shape[0]
        block = uniq // size  # [U] sorted
        need = np.unique(block)  # [K]
        got = {int(b): self._blocks.get((name, int(b))) for b in need}
        missing = np.array([b for b, v in got.items() if v is None], dtype=np.int64)
        for run in np.split(missing, np.flatnonzero(np.diff(missing) > 1) + 1) if len(missing) else []:
            data = self._slice(name, arr, int(run[0]) * size, min(int(run[-1] + 1) * size, n))
            for b in run:
                got[int(b)] = data[(b - run[0]) * size : (b - run[0] + 1) * size].copy()
        out = np.empty((len(uniq), *arr.shape[1:]), dtype=arr.dtype)
        bounds = np.append(np.searchsorted(block, need), len(uniq))  # [K+1] each block's rows in uniq
        for k, b in enumerate(need):
            lo, hi = bounds[k], bounds[k + 1]
            out[lo:hi] = got[int(b)][uniq[lo:hi] - b * size]
        for b in missing:
            self._blocks.put((name, int(b)), got[int(b)])
        return out

    def _check_done(self, modality: str, rows: np.ndarray) -> None:
        """Refuse rows a feature read must not serve: a negative row (a suite index marks an
        item without a usable image, or a padded slot, with -1, which would otherwise read
        the last row, another item's features) and rows not marked done."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and rows.min() < 0:
            raise IndexError(
                f"{self.path}: {modality} row {int(rows.min())} asked for; a suite index marks an item without a "
                f"usable image, or a padded slot, with -1: leave such items out (pipeline.scoring.drop_missing) "
                f"or mask the slots before reading features"
            )
        if modality not in self._done:
            self._done[modality] = self._whole(f"{modality}/done").astype(bool)
        done = self._done[modality][rows]
        if not done.all():
            raise StaleCacheError(
                f"{self.path}: {int((~done).sum())} {modality} rows are not marked done (an "
                f"interrupted extract, or a lost chunk of {modality}/done); rerun `pipeline extract`, "
                f"which re-encodes exactly those rows"
            )

    def images(self, rows: np.ndarray, grids: bool = True) -> ImageFeatures:
        """ImageFeatures (float32) for store rows ``rows`` [B].

        ``grids=False`` reads the pooled embeddings only (what global scorers need): early,
        final and cls are then empty along their token/width axis ([B, 0, d_v], [B, 0]).
        """
        self._check_done("image", rows)
        if not grids:
            embed = torch.from_numpy(self._gather("image/embed", rows).astype(np.float32))
            d_v = self.dims.d_v
            return ImageFeatures(early=embed.new_empty(len(embed), 0, d_v),
                                 final=embed.new_empty(len(embed), 0, d_v),
                                 cls=embed.new_empty(len(embed), 0), embed=embed)  # fmt: skip
        early = self._gather("image/early", rows)  # [B, 1+R, d_v]
        final = self._gather("image/final", rows)  # [B, 1+R, d_v]
        embed = self._gather("image/embed", rows)  # [B, D]
        return ImageFeatures(
            early=torch.from_numpy(early[:, 1:].astype(np.float32)),
            final=torch.from_numpy(final[:, 1:].astype(np.float32)),
            cls=torch.from_numpy(final[:, 0].astype(np.float32)),
            embed=torch.from_numpy(embed.astype(np.float32)),
        )

    def texts(self, rows: np.ndarray, grids: bool = True) -> TextFeatures:
        """TextFeatures (float32) for store rows ``rows`` [B]; ``grids=False`` leaves the
        token states out (``tokens`` is [B, 0, d_t])."""
        self._check_done("text", rows)
        if grids:
            tokens = torch.from_numpy(self._gather("text/tokens", rows).astype(np.float32))
        else:
            tokens = torch.empty(len(np.asarray(rows)), 0, self.dims.d_t)
        return TextFeatures(
            ids=torch.from_numpy(self._gather("text/ids", rows).astype(np.int64)),
            mask=torch.from_numpy(self._gather("text/mask", rows).astype(bool)),
            tokens=tokens,
            embed=torch.from_numpy(self._gather("text/embed", rows).astype(np.float32)),
        )

    @property
    def has_object_crops(self) -> bool:
        """Whether the store holds re-encoded object crops (``extract.object_crops: true``)."""
        return bool(self.fingerprint.get("object_crops")) and "object" in self.root

    def objects(self, rows: np.ndarray) -> torch.Tensor:
        """[B, D] float32 pooled embeddings (not normalised) of the object crops at store rows
        ``rows`` [B] (a suite's ``object_crops`` index).

        Raises:
            CacheError: the store holds no object crops (the message names the option).
            StaleCacheError: some rows are not marked done (an interrupted extract, or a
                lost chunk of the done flags).
        """
        if not self.has_object_crops:
            raise CacheError(
                f"{self.path} holds no object crops: set extract.object_crops: true and rerun "
                f"`pipeline extract` (it adds them to this store)"
            )
        self._check_done("object", rows)
        return torch.from_numpy(self._gather("object/embed", rows).astype(np.float32))

    def object_images(self, rows: np.ndarray) -> np.ndarray:
        """[B] int64 image row each object crop at ``rows`` [B] was cut from."""
        self.objects(np.zeros(0, dtype=np.int64))  # refuses a store without crops
        self._check_done("object", rows)
        return self._gather("object/image", rows).astype(np.int64)

    def suites(self) -> list[str]:
        return sorted(self.root["suites"].group_keys()) if "suites" in self.root else []

    def suite_index(self, suite: str, manifest_sha256: str | None = None) -> dict[str, np.ndarray]:
        """``{column: rows}`` of ``suite``; with a manifest hash, refuse a stale index. A column
        whose chunk fails its checksum, or whose metadata is lost, is refused naming the fix."""
        if suite not in self.suites():
            holder = running_writer(self.path)
            fix = (
                f"an extract ({describe_holder(holder)}) is writing the store now: score once it finishes"
                if holder is not None else f"run `pipeline extract --suite {suite}`"
            )  # fmt: skip
            raise CacheError(f"suite {suite!r} is not in {self.path} (has: {', '.join(self.suites()) or 'none'}); {fix}")
        group = self.root[f"suites/{suite}"]
        have = group.attrs.get("manifest_sha256")
        if manifest_sha256 is not None and have != manifest_sha256:
            raise StaleCacheError(
                f"the manifest of {suite} changed since it was extracted into {self.path}; "
                f"rerun `pipeline extract`"
            )
        return {name: self._whole(f"suites/{suite}/{name}") for name in suite_columns(self.root, suite)}

    def suite_attrs(self, suite: str) -> dict[str, Any]:
        return dict(self.root[f"suites/{suite}"].attrs)
