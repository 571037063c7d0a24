"""Checks of the store's integrity and fingerprint helpers that the mutation audit found
unguarded: a shard file cut to its bare index, the rows named for a partial last file, the
trailing chunk of an index split into several chunks, the dtype and row-count checks, and
the fingerprint's canonical hash and difference listing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import zarr

from pipeline.cache import writer
from pipeline.cache.integrity import (
    MISSING,
    TRUNCATED,
    CorruptStoreError,
    Damage,
    check_shapes,
    min_file_bytes,
    row_file_key,
    row_inventory,
    whole_inventory,
)
from pipeline.cache.schema import KEY_BYTES, SHARD_ROWS, fingerprint_differences, fingerprint_id

DIMS = {"grid": [2, 2], "d_v": 8, "d_t": 8, "embed_dim": 4, "context_length": 4}
N_IMAGES = SHARD_ROWS + 9  # two shards of the grids, the second partial


@pytest.fixture
def store(tmp_path):
    """A small store written through the writer (images only), its path and its root."""
    rng = np.random.default_rng(0)
    tokens_v = DIMS["grid"][0] * DIMS["grid"][1] + 1
    arrays = {
        "early": rng.standard_normal((N_IMAGES, tokens_v, DIMS["d_v"])).astype(np.float16),
        "final": rng.standard_normal((N_IMAGES, tokens_v, DIMS["d_v"])).astype(np.float16),
        "embed": rng.standard_normal((N_IMAGES, DIMS["embed_dim"])).astype(np.float32),
    }
    keys = np.zeros((N_IMAGES, KEY_BYTES), dtype=np.uint8)
    keys[:, :8] = np.arange(N_IMAGES, dtype=">u8").view(np.uint8).reshape(N_IMAGES, 8)
    path = tmp_path / "store.zarr"
    root = writer.open_for_writing(path, {"encoder": "mutation-audit"}, DIMS)
    rows, _ = writer.plan_rows(root, "image", keys)
    writer.write_rows(root, "image", rows, arrays)
    writer.finalize(root)
    return path, zarr.open_group(path, mode="r+")


def _file(path, root, name: str, i: int):
    return path / row_file_key(root[name], i)


def test_min_file_bytes_of_a_shard_counts_both_checksums(store):
    """A shard file holds its index (16 bytes per inner chunk), the index's crc32c and at
    least one inner chunk with its crc32c: the floor is index + 2 checksums."""
    _, root = store
    arr = root["image/final"]
    inner = int(np.prod([s // c for s, c in zip(arr.shards, arr.chunks, strict=True)]))
    assert min_file_bytes(arr) == inner * 16 + 2 * 4
    assert min_file_bytes(root["image/embed"]) == 4  # unsharded: its checksum


def test_a_shard_cut_to_its_bare_index_is_truncated(store):
    """A shard file that keeps only its index and the index's checksum holds no chunk (its
    reads fail with an unrelated reshape error): the inventory, which reads only file sizes,
    names it truncated, with the rows it held."""
    path, root = store
    arr = root["image/final"]
    inner = int(np.prod([s // c for s, c in zip(arr.shards, arr.chunks, strict=True)]))
    f = _file(path, root, "image/final", 1)
    data = f.read_bytes()
    f.write_bytes(data[-(inner * 16 + 4) :])  # the trailing index + its crc32c only
    damage = row_inventory(zarr.open_group(path, mode="r"))
    assert Damage("image/final", SHARD_ROWS, N_IMAGES, TRUNCATED) in damage


def test_a_lost_partial_last_file_names_only_the_rows_it_held(store):
    """The last shard holds rows 64..72 of the 73 committed: its damage spans [64, 73), not
    the shard's nominal [64, 128)."""
    path, root = store
    _file(path, root, "image/early", 1).unlink()
    damage = row_inventory(zarr.open_group(path, mode="r"))
    assert damage == [Damage("image/early", SHARD_ROWS, N_IMAGES, MISSING)]


def test_the_trailing_partial_chunk_of_a_whole_array_is_required(tmp_path):
    """An index array longer than one chunk (large suites) needs every chunk of its grid,
    the partial last one included; its damage names the rows it held, clipped to the array."""
    root = zarr.open_group(tmp_path / "s.zarr", mode="w")
    group = root.require_group("suites/toy")
    arr = group.create_array(
        "rows", shape=(10,), chunks=(4,), dtype="int64", config={"write_empty_chunks": True}
    )
    arr[:] = np.arange(10)
    group.attrs["kinds"] = {"rows": "text"}
    assert whole_inventory(root) == []
    (tmp_path / "s.zarr" / "suites" / "toy" / "rows" / "c" / "2").unlink()
    assert whole_inventory(zarr.open_group(tmp_path / "s.zarr", mode="r")) == [
        Damage("suites/toy/rows", 8, 10, MISSING)
    ]


def test_check_shapes_refuses_another_dtype(store):
    """An array rewritten with another dtype (same shape) reads as other numbers: refused,
    naming the array and both dtypes."""
    path, root = store
    embed = root["image/embed"][:]
    root.create_array("image/embed", shape=embed.shape, dtype="float64", overwrite=True)[:] = embed
    with pytest.raises(CorruptStoreError, match="image/embed is float64.*float32"):
        check_shapes(zarr.open_group(path, mode="r"), path)


def test_check_shapes_refuses_arrays_of_one_modality_with_different_rows(store):
    """Row i of every image array is one image: an array cut shorter than the others
    misaligns them, so the store is refused naming the lengths."""
    path, root = store
    root["image/embed"].resize((N_IMAGES - 1, DIMS["embed_dim"]))
    with pytest.raises(CorruptStoreError, match="image arrays differ in rows"):
        check_shapes(zarr.open_group(path, mode="r"), path)
    check_shapes(zarr.open_group(path, mode="r"), path, counts=False)  # the caller may defer it


def test_fingerprint_id_is_the_hash_of_canonical_json():
    """The id is sha256[:16] of the key-sorted compact JSON, so key order never changes it."""
    a = {"model": "ViT-B-32", "dims": {"grid": [7, 7], "d_v": 768}, "layers": [4, 12]}
    b = {"layers": [4, 12], "dims": {"d_v": 768, "grid": [7, 7]}, "model": "ViT-B-32"}
    blob = b'{"dims":{"d_v":768,"grid":[7,7]},"layers":[4,12],"model":"ViT-B-32"}'
    assert fingerprint_id(a) == fingerprint_id(b) == hashlib.sha256(blob).hexdigest()[:16]


def test_fingerprint_differences_name_keys_present_on_one_side_only():
    """A field only the store or only the configuration has is a difference too (e.g. a
    newly added preprocessing key): it is listed with None for the missing side."""
    have = {"model": "a", "old": 1}
    want = {"model": "b", "new": 2}
    assert fingerprint_differences(have, want) == (
        "model: store 'a', configured 'b'; new: store None, configured 2; old: store 1, configured None"
    )
    assert fingerprint_differences(have, dict(have)) == ""
