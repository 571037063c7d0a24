"""Store reads return exactly what was written, for any rows: unsorted, repeated, sparse."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.cache import FeatureStore, StaleCacheError, writer
from pipeline.cache.schema import KEY_BYTES, SHARD_ROWS

DIMS = {"grid": [4, 4], "d_v": 64, "d_t": 48, "embed_dim": 32, "context_length": 16}
N_IMAGES, N_TEXTS = 3 * SHARD_ROWS + 9, 5 * SHARD_ROWS + 3  # several shards, a partial last one


def _keys(n: int, salt: int) -> np.ndarray:
    keys = np.full((n, KEY_BYTES), salt, dtype=np.uint8)
    keys[:, :8] = np.arange(n, dtype=">u8").view(np.uint8).reshape(n, 8)
    return keys


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A store written through the writer from known arrays, and those arrays."""
    rng = np.random.default_rng(0)
    d_v, d_t, D, C = DIMS["d_v"], DIMS["d_t"], DIMS["embed_dim"], DIMS["context_length"]
    tokens_v = DIMS["grid"][0] * DIMS["grid"][1] + 1
    lengths = rng.integers(2, C + 1, N_TEXTS)
    mask = np.arange(C)[None] < lengths[:, None]
    data = {
        "image": {
            "early": rng.standard_normal((N_IMAGES, tokens_v, d_v)).astype(np.float16),
            "final": rng.standard_normal((N_IMAGES, tokens_v, d_v)).astype(np.float16),
            "embed": rng.standard_normal((N_IMAGES, D)).astype(np.float32),
        },
        "text": {
            "ids": np.where(mask, rng.integers(1, 49408, (N_TEXTS, C)), 0).astype(np.int32),
            "mask": mask,
            "tokens": rng.standard_normal((N_TEXTS, C, d_t)).astype(np.float16),
            "embed": rng.standard_normal((N_TEXTS, D)).astype(np.float32),
        },
    }
    path = tmp_path_factory.mktemp("reads") / "store.zarr"
    root = writer.open_for_writing(path, {"encoder": "test-reads"}, DIMS)
    for salt, (modality, arrays) in enumerate(data.items()):
        n = len(next(iter(arrays.values())))
        rows, todo = writer.plan_rows(root, modality, _keys(n, salt))
        assert np.array_equal(rows, np.arange(n)) and np.array_equal(todo, rows)
        for batch in writer.shard_batches(rows, 2 * SHARD_ROWS):
            writer.write_rows(root, modality, batch, {k: v[batch] for k, v in arrays.items()})
    writer.finalize(root)
    return FeatureStore.open(path), data


def _row_sets(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [
        rng.integers(0, n, 300),  # unsorted, with repeats, over every shard
        rng.choice(n, 7, replace=False),  # a few rows far apart
        np.array([n - 1, 0, n - 1, 5, 5, SHARD_ROWS, SHARD_ROWS - 1]),  # shard edges, repeats
        np.arange(n)[::-1],  # every row, reversed
        rng.permutation(n)[: n // 2],
    ]


def test_image_reads_equal_written(written):
    store, data = written
    img = data["image"]
    for rows in _row_sets(N_IMAGES, np.random.default_rng(1)):
        got = store.images(rows)
        assert torch.equal(got.early, torch.from_numpy(img["early"][rows, 1:].astype(np.float32)))
        assert torch.equal(got.final, torch.from_numpy(img["final"][rows, 1:].astype(np.float32)))
        assert torch.equal(got.cls, torch.from_numpy(img["final"][rows, 0].astype(np.float32)))
        assert torch.equal(got.embed, torch.from_numpy(img["embed"][rows]))
        slim = store.images(rows, grids=False)
        assert torch.equal(slim.embed, got.embed)
        assert slim.final.shape == (len(rows), 0, DIMS["d_v"])


def test_text_reads_equal_written(written):
    store, data = written
    txt = data["text"]
    for rows in _row_sets(N_TEXTS, np.random.default_rng(2)):
        got = store.texts(rows)
        assert torch.equal(got.ids, torch.from_numpy(txt["ids"][rows].astype(np.int64)))
        assert torch.equal(got.mask, torch.from_numpy(txt["mask"][rows]))
        assert torch.equal(got.tokens, torch.from_numpy(txt["tokens"][rows].astype(np.float32)))
        assert torch.equal(got.embed, torch.from_numpy(txt["embed"][rows]))
        slim = store.texts(rows, grids=False)
        assert torch.equal(slim.ids, got.ids)
        assert slim.tokens.shape == (len(rows), 0, DIMS["d_t"])


def test_gather_edge_cases(written):
    store, data = written
    final = data["image"]["final"]
    assert store._gather("image/final", np.array([], dtype=np.int64)).shape == (0, *final.shape[1:])
    assert np.array_equal(store._gather("image/final", np.array([-1, 0])), final[[-1, 0]])
    with pytest.raises(IndexError):
        store._gather("image/final", np.array([0, N_IMAGES]))


@pytest.mark.parametrize("read", ["images", "texts"])
def test_a_missing_item_marker_is_refused_not_read_as_the_last_row(written, read):
    """-1 marks an item without a usable image (or a padded slot) in a suite index: a feature
    read refuses it, naming the marker and the fix, instead of serving the store's last row."""
    store, _ = written
    with pytest.raises(IndexError, match=r"row -1 asked for; a suite index marks an item without a usable image.*drop_missing"):
        getattr(store, read)(np.array([0, -1, 2]))


def test_unwritten_rows_are_refused(tmp_path):
    root = writer.open_for_writing(tmp_path / "s.zarr", {"encoder": "test-reads"}, DIMS)
    writer.plan_rows(root, "image", _keys(3, 0))  # rows planned, never written
    with pytest.raises(StaleCacheError, match="not marked done"):
        FeatureStore.open(tmp_path / "s.zarr").images(np.array([0, 2]))


def test_plan_rows_cuts_an_uncommitted_tail_back_before_planning(tmp_path):
    """A run killed after resizing the arrays and writing new keys, but before committing the
    row count, leaves a longer tail; the next plan cuts it back and plans anew, so a key of
    that tail and a new key never share a row, and each row holds its own key."""
    root = writer.open_for_writing(tmp_path / "s.zarr", {"encoder": "test-reads"}, DIMS)
    old = _keys(3, 0)
    writer.plan_rows(root, "image", old)  # 3 rows committed
    tail = _keys(2, 7)  # the killed run's two new keys: arrays resized, keys written, not committed
    for spec in writer.ARRAYS["image"]:
        arr = root[spec.name]
        arr.resize((5, *arr.shape[1:]))
    writer.append_keys(root, "image", 3, tail)
    assert root["image"].attrs["rows"] == 3
    keys = np.concatenate([old, tail[:1], _keys(1, 9)])  # one key of the tail, one never seen
    rows, todo = writer.plan_rows(root, "image", keys)
    assert rows.tolist() == [0, 1, 2, 3, 4] and todo.tolist() == [0, 1, 2, 3, 4]  # none written yet
    assert root["image"].attrs["rows"] == 5 and root["image/early"].shape[0] == 5
    assert np.array_equal(root["image/key"][:], keys)


@pytest.mark.parametrize("budget", [1 << 30, 300_000])  # everything kept; two grid blocks (evicting)
def test_cached_reads_equal_written(written, budget):
    plain, data = written
    store = FeatureStore.open(plain.path).cache_reads(budget)
    img, txt = data["image"], data["text"]
    for _ in range(2):  # the second pass reads from the cache
        for rows in _row_sets(N_IMAGES, np.random.default_rng(1)):
            got = store.images(rows)
            assert torch.equal(got.final, torch.from_numpy(img["final"][rows, 1:].astype(np.float32)))
            assert torch.equal(got.early, torch.from_numpy(img["early"][rows, 1:].astype(np.float32)))
            assert torch.equal(got.embed, torch.from_numpy(img["embed"][rows]))
        for rows in _row_sets(N_TEXTS, np.random.default_rng(2)):
            got = store.texts(rows)
            assert torch.equal(got.tokens, torch.from_numpy(txt["tokens"][rows].astype(np.float32)))
            assert torch.equal(got.mask, torch.from_numpy(txt["mask"][rows]))
        assert 0 < store._blocks.used <= budget
    assert np.array_equal(store._gather("image/final", np.array([-1, 0])), img["final"][[-1, 0]])
    assert store._gather("text/tokens", np.array([], dtype=np.int64)).shape == (0, *txt["tokens"].shape[1:])
    with pytest.raises(IndexError):
        store._gather("image/final", np.array([0, N_IMAGES]))


def test_block_cache_reads_each_block_once(written, monkeypatch):
    plain, data = written
    store = FeatureStore.open(plain.path).cache_reads(1 << 30)
    spans = []
    read = FeatureStore._slice
    monkeypatch.setattr(FeatureStore, "_slice", lambda self, name, arr, a, b: spans.append((name, a, b)) or read(self, name, arr, a, b))
    rows = np.array([3, SHARD_ROWS + 1, 3, 3 * SHARD_ROWS + 2, 0])  # blocks 0, 1 (one run) and 3
    store._gather("image/final", rows)
    assert spans == [("image/final", 0, 2 * SHARD_ROWS), ("image/final", 3 * SHARD_ROWS, N_IMAGES)]
    assert np.array_equal(store._gather("image/final", rows[::-1]), data["image"]["final"][rows[::-1]])
    assert len(spans) == 2  # every block was held
    store._gather("image/final", np.array([2 * SHARD_ROWS]))  # block 2 was never read
    assert spans[-1] == ("image/final", 2 * SHARD_ROWS, 3 * SHARD_ROWS)


def test_block_cache_budget():
    from pipeline.cache.reader import BlockCache

    cache = BlockCache(100)
    a, b, c = np.zeros(40, np.uint8), np.ones(40, np.uint8), np.full(40, 2, np.uint8)
    cache.put(("x", 0), a)
    cache.put(("x", 1), b)
    assert cache.get(("x", 0)) is a  # now the most recently used
    cache.put(("x", 2), c)  # 120 > 100: the least recently used block (1) goes
    assert cache.get(("x", 1)) is None and cache.get(("x", 0)) is a and cache.get(("x", 2)) is c
    assert cache.used == 80
    cache.put(("x", 3), np.zeros(101, np.uint8))  # larger than the whole budget: not kept
    assert cache.get(("x", 3)) is None and cache.used == 80
    cache.put(("x", 4), np.zeros(90, np.uint8))  # 170 > 100: both old blocks go, not just one
    assert cache.get(("x", 0)) is None and cache.get(("x", 2)) is None and cache.used == 90


def test_image_keys_tell_crops_of_one_image_apart():
    """ARO's VG items crop one image file to different boxes: each crop is its own row."""
    from pipeline.cache.schema import image_key

    data = b"the same image file"
    keys = [image_key(data).tobytes(), image_key(data, [0, 0, 10, 10]).tobytes(), image_key(data, [5, 5, 20, 20]).tobytes()]
    assert len(set(keys)) == 3
    assert image_key(data, [0, 0, 10, 10]).tobytes() == keys[1]  # the same crop, the same row


def test_cache_reads_budget_is_checked(written):
    store = FeatureStore.open(written[0].path)
    assert store.cache_reads(0)._blocks is None  # 0 turns it off
    with pytest.raises(ValueError, match="budget_bytes"):
        store.cache_reads(-1)
