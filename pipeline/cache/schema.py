"""THE cache contract: names, dims, dtypes, chunks and version of a feature store.

One Zarr v3 store per encoder (``cache/features/<encoder>.zarr``)::

    /                       attrs: schema_version, fingerprint, fingerprint_id, dims, ...
    image/key               uint8  [N, 16]            content hash (sha256[:16]) of image bytes (+ crop)
    image/done              bool   [N]                row fully written (set last)
    image/early             f16    [N, 1+R, d_v]      early-layer grid, raw (CLS at token 0)
    image/final             f16    [N, 1+R, d_v]      final grid after ln_post (CLS at token 0)
    image/embed             f32    [N, D]             pooled embedding, not normalised
    text/key                uint8  [M, 16]            content hash of the caption text
    text/done               bool   [M]
    text/ids                i32    [M, C]             BPE ids
    text/mask               bool   [M, C]             sot..eot inclusive
    text/tokens             f16    [M, C, d_t]        final token states after ln_final
    text/embed              f32    [M, D]             pooled embedding, not normalised
    params/visual_proj      f32    [d_v, D]
    params/text_projection  f32    [d_t, D]
    params/logit_scale      f32    []                 exp(logit_scale)
    suites/<suite>/<column> i64    [n_items] or [n_items, K]   rows into image/* or text/*, -1 = pad
                            attrs: manifest_sha256, n_items, kinds {column: image|text|object}, image_root

With ``extract.object_crops: true`` (off by default) the store also holds one re-encoded
crop per annotated object box (manifest column ``object_boxes``, normalised to the row's
``image``), and its fingerprint records ``object_crops: true``::

    object/key              uint8  [O, 16]            sha256[:16] of the image's key and the box
    object/done             bool   [O]
    object/image            i64    [O]                image/* row the crop is cut from
    object/box              f32    [O, 4]             normalised (x0, y0, x1, y1)
    object/embed            f32    [O, D]             pooled embedding of the crop, not normalised
    suites/<suite>/object_crops  i64  [n_items, K]    rows into object/*, one per box of the
                                                      row's object_boxes, in order; -1 = pad

A crop is the box's pixels (outward-rounded, at least one pixel) put through the encoder's
own preprocessing, like a whole image, so the crop of the whole-image box is the image itself
and its embedding equals ``image/embed``. The crops are an additive part of the schema: a store
without them is byte for byte what it is without the option, and its fingerprint has no
``object_crops`` key (:data:`STORE_OPTIONS`), so switching the option on adds the ``object``
group to an existing store of the same encoder instead of replacing it.

Grids and token states are stored in shards of ``SHARD_ROWS`` rows (v3 sharding: one file
per shard) holding inner chunks of ``chunk_rows`` rows, a power of two sized to about
``CHUNK_BYTES`` (1 row for a ViT-L-14-336 grid, 16 for the toy's): small enough for cheap
random-row reads, large enough that per-chunk codec overhead does not dominate writes
(docs/trials.md, Cache, solvers and world). Writers write whole shards where they can.
Rows are content-addressed: each image and caption is encoded once across suites, and a
rerun with a new suite appends only what is new. ``done`` flags make an interrupted extract
resumable (LocalStore writes each shard file atomically, so no chunk is left half-written).
Every chunk ends in a ``crc32c`` checksum and every written chunk has a file, so damaged bytes
and deleted files are found (:mod:`pipeline.cache.integrity`) rather than read as zeros: every
open lists the files the row arrays' done flags require and every chunk file of the suite
indexes and the projections (a lost index chunk would point every item at row 0, a lost
projection chunk would score with zeros), and a chunk that fails its checksum is named when
it is read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

SCHEMA_VERSION = 3  # v3: crc32c on every chunk, a file for every chunk (v2: no checksums)
SHARD_ROWS = 64  # rows per shard for grids and token states
FLAT_CHUNK_ROWS = SHARD_ROWS * 4  # rows per chunk of the unsharded arrays (keys, flags, embeddings)
CHUNK_BYTES = 512 * 1024  # target size of an inner chunk (uncompressed)
KEY_BYTES = 16  # bytes of sha256 kept as a row key
GRID_DTYPE = "float16"
EMBED_DTYPE = "float32"


@dataclass(frozen=True)
class ArraySpec:
    """One array of the store: its name, dtype and how its shape follows from the dims."""

    name: str  # path inside the store
    dtype: str  # numpy dtype name
    tail: tuple[str, ...]  # symbolic trailing dims (resolved with `resolve_tail`)
    sharded: bool  # chunk_rows-row chunks inside SHARD_ROWS-row shards
    doc: str

    @property
    def field(self) -> str:
        """The array's name within its modality ("final" of "image/final"): the key of a
        batch's outputs and of the writer's handles."""
        return self.name.split("/", 1)[1]


IMAGE_ARRAYS = (
    ArraySpec("image/key", "uint8", ("key",), False, "sha256[:16] of image bytes (+crop box)"),
    ArraySpec("image/done", "bool", (), False, "row written"),
    ArraySpec("image/early", GRID_DTYPE, ("tokens_v", "d_v"), True, "early grid, raw"),
    ArraySpec("image/final", GRID_DTYPE, ("tokens_v", "d_v"), True, "final grid, after ln_post"),
    ArraySpec("image/embed", EMBED_DTYPE, ("D",), False, "pooled image embedding"),
)
TEXT_ARRAYS = (
    ArraySpec("text/key", "uint8", ("key",), False, "sha256[:16] of caption text"),
    ArraySpec("text/done", "bool", (), False, "row written"),
    ArraySpec("text/ids", "int32", ("C",), False, "BPE ids"),
    ArraySpec("text/mask", "bool", ("C",), False, "sot..eot inclusive"),
    ArraySpec("text/tokens", GRID_DTYPE, ("C", "d_t"), True, "final token states, after ln_final"),
    ArraySpec("text/embed", EMBED_DTYPE, ("D",), False, "pooled text embedding"),
)
OBJECT_ARRAYS = (
    ArraySpec("object/key", "uint8", ("key",), False, "sha256[:16] of the image key and the box"),
    ArraySpec("object/done", "bool", (), False, "row written"),
    ArraySpec("object/image", "int64", (), False, "image row the crop is cut from"),
    ArraySpec("object/box", EMBED_DTYPE, ("box",), False, "normalised (x0, y0, x1, y1)"),
    ArraySpec("object/embed", EMBED_DTYPE, ("D",), False, "pooled embedding of the re-encoded crop"),
)
PARAMS = ("visual_proj", "text_projection", "logit_scale")  # params/<name>: the frozen projections
ARRAYS = {"image": IMAGE_ARRAYS, "text": TEXT_ARRAYS, "object": OBJECT_ARRAYS}  # modality -> arrays
# Fingerprint keys that say what else a store holds, not which encoder wrote it: present only
# when true, and only ever added to a store (a writer without the option keeps them).
STORE_OPTIONS = ("object_crops",)
DIMS_KEYS = ("grid", "d_v", "d_t", "embed_dim", "context_length")  # attrs["dims"], also in the fingerprint


def fingerprint_differences(have: dict[str, Any], want: dict[str, Any]) -> str:
    """"key: store X, configured Y" for every field two fingerprints differ in, ``; ``-joined."""
    keys = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    return "; ".join(f"{k}: store {have.get(k)!r}, configured {want.get(k)!r}" for k in keys)


def resolve_tail(spec: ArraySpec, dims: dict[str, Any]) -> tuple[int, ...]:
    """Concrete trailing shape of ``spec`` for a store's dims."""
    table = {
        "key": KEY_BYTES,
        "tokens_v": dims["grid"][0] * dims["grid"][1] + 1,
        "d_v": dims["d_v"],
        "d_t": dims["d_t"],
        "D": dims["embed_dim"],
        "C": dims["context_length"],
        "box": 4,
    }
    return tuple(table[t] for t in spec.tail)


def chunk_rows(spec: ArraySpec, tail: tuple[int, ...]) -> int:
    """Rows per inner chunk of a sharded array: the largest power of two (1..SHARD_ROWS)
    whose chunk stays within ``CHUNK_BYTES``."""
    row_bytes = int(np.prod(tail, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    rows = 1
    while rows * 2 <= SHARD_ROWS and rows * 2 * row_bytes <= CHUNK_BYTES:
        rows *= 2
    return rows


def fingerprint_id(fingerprint: dict[str, Any]) -> str:
    """Short stable id of a fingerprint dict (sha256 of its canonical JSON)."""
    blob = json.dumps(fingerprint, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def without_options(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint less its :data:`STORE_OPTIONS`: what says which encoder wrote a store."""
    return {k: v for k, v in fingerprint.items() if k not in STORE_OPTIONS}


def encoder_id(fingerprint: dict[str, Any]) -> str:
    """:func:`fingerprint_id` of the fingerprint without its :data:`STORE_OPTIONS`: equal
    for two stores of the same encoder, weights, preprocessing and layers."""
    return fingerprint_id(without_options(fingerprint))


def object_key(image: np.ndarray | bytes, box: Any) -> np.ndarray:
    """[16] uint8 content key of one object crop: the image's content key and its box."""
    h = hashlib.sha256(bytes(image))  # the [16] uint8 key's bytes
    h.update(json.dumps([float(v) for v in box]).encode())
    return np.frombuffer(h.digest()[:KEY_BYTES], dtype=np.uint8)


def image_key(data: bytes, crop_box: Any = None) -> np.ndarray:
    """[16] uint8 content key of an image file's bytes, plus its crop box if any."""
    h = hashlib.sha256(data)
    if crop_box is not None:
        h.update(json.dumps([float(v) for v in crop_box]).encode())
    return np.frombuffer(h.digest()[:KEY_BYTES], dtype=np.uint8)


def text_key(caption: str) -> np.ndarray:
    """[16] uint8 content key of a caption (exact text, UTF-8)."""
    return np.frombuffer(hashlib.sha256(caption.encode()).digest()[:KEY_BYTES], dtype=np.uint8)


def keys_to_hex(keys: np.ndarray) -> list[str]:
    """[N, 16] uint8 keys -> hex strings (dictionary keys for lookups)."""
    return [bytes(k).hex() for k in np.asarray(keys, dtype=np.uint8)]


class CacheError(RuntimeError):
    """A store cannot be used; the message names the stage to rerun."""


class StaleCacheError(CacheError):
    """The store was written by another schema version or from other inputs."""


class ForeignCacheError(CacheError):
    """The store was written by another encoder, weights or preprocessing."""
