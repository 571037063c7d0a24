"""Damaged stores are named, never read as zeros; `extract --repair` re-encodes exactly the
damaged rows; the fingerprint and dims are checked against the arrays; one writer at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from pipeline.cache import (
    CorruptStoreError,
    FeatureStore,
    ForeignCacheError,
    StaleCacheError,
    StoreLockedError,
    store_lock,
    store_path,
)
from pipeline.cache.integrity import inventory, verify
from pipeline.cache.lock import lock_path
from pipeline.config import ExtractConfig
from pipeline.extraction import extract
from tests.conftest import make_choice_manifest, make_images
from tests.stores import assert_same_store

pytestmark = pytest.mark.bad_input
N = 300  # two 256-row chunks of the unsharded arrays, five 64-row shards of the grids


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("integrity")
    make_choice_manifest(tmp / "sc.parquet", make_images(tmp / "images", N, size=28))
    return tmp


def _cfg(world: Path, out: Path) -> ExtractConfig:
    return ExtractConfig(
        model="tiny-test", suites=["shapes-sugarcrepe"], manifests={"shapes-sugarcrepe": str(world / "sc.parquet")},
        image_roots={"shapes-sugarcrepe": str(world / "images")}, out=str(out), batch_size=32,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(world, tiny_encoder):
    cfg = _cfg(world, world / "ref")
    extract(cfg, progress=False, encoder=tiny_encoder)
    return store_path(cfg)


@pytest.fixture
def damaged(world, reference, tmp_path):
    """A fresh copy of the reference store to damage."""
    import shutil

    out = tmp_path / "features"
    shutil.copytree(reference.parent, out)
    return _cfg(world, out), store_path(_cfg(world, out))


def _file(store: Path, array: str, i: int) -> Path:
    arr = zarr.open_group(store, mode="r")[array]
    return store / array / "c" / "/".join([str(i), *["0"] * (arr.ndim - 1)])


def _flip(path: Path, at: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("array,i", [("image/embed", 1), ("text/embed", 0), ("image/final", 2), ("text/tokens", 0)])
def test_deleted_chunk_file_is_refused_naming_array_rows_and_fix(damaged, array, i):
    _, store = damaged
    _file(store, array, i).unlink()
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    msg = str(e.value)
    assert array in msg and str(store) in msg and "pipeline extract --repair" in msg
    per = 256 if array.endswith("embed") else 64
    assert f"rows {i * per}-" in msg


@pytest.mark.parametrize("cache", [0, 1 << 30])  # plain reads; the score stage's block cache
def test_overwritten_bytes_inside_a_shard_fail_their_checksum(damaged, cache):
    _, store = damaged
    _flip(_file(store, "image/final", 1), at=100)
    fs = FeatureStore.open(store).cache_reads(cache)  # every file is present: the inventory passes
    with pytest.raises(CorruptStoreError, match=r"image/final rows .*--repair"):
        fs.images(np.arange(64, 128))
    assert any(d.array == "image/final" for d in verify(fs.root))


def test_a_failed_read_names_the_rows_of_the_failing_chunk_not_the_read(damaged):
    """A read of 300 rows over a shard whose first inner chunk (rows 0-63) fails its
    checksum names those 64 rows, not the whole read."""
    _, store = damaged
    _flip(_file(store, "image/early", 0), at=200)
    with pytest.raises(CorruptStoreError, match=r"image/early rows 0-63 \(checksum"):
        FeatureStore.open(store).images(np.arange(N))


def test_truncated_chunk_is_named_not_a_blosc_error(damaged):
    _, store = damaged
    path = _file(store, "text/embed", 0)
    path.write_bytes(path.read_bytes()[:50])
    fs = FeatureStore.open(store)
    with pytest.raises(CorruptStoreError, match=r"text/embed rows 0-.*pipeline extract --repair"):
        fs.texts(np.arange(5), grids=False)


@pytest.mark.parametrize("array,i", [("image/final", 1), ("text/tokens", 0), ("image/embed", 0), ("text/key", 0)])
def test_a_chunk_file_cut_to_nothing_is_refused_not_read_as_zeros(damaged, reference, tiny_encoder, array, i):
    """Zarr reads a shard file shorter than its index as a shard without chunks (zeros): the
    open names it like an absent file, and `extract --repair` re-encodes its rows."""
    cfg, store = damaged
    _file(store, array, i).write_bytes(b"")
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    per = 256 if array.endswith(("embed", "key")) else 64
    assert f"{array} rows {i * per}-" in str(e.value) and "truncated chunk file" in str(e.value)
    assert "pipeline extract --repair" in str(e.value)
    extract(cfg, progress=False, encoder=tiny_encoder, repair=True)
    assert inventory(zarr.open_group(store, mode="r")) == []
    assert_same_store(store, reference)


SUITE = "suites/shapes-sugarcrepe"


@pytest.mark.parametrize(
    "array,chunk",
    [(f"{SUITE}/image", "c/0/0"), (f"{SUITE}/captions", "c/0/0"), ("params/text_projection", "c/0/0"), ("params/logit_scale", "c")],
)
def test_deleted_index_or_projection_chunk_is_refused_and_a_plain_extract_rewrites_it(damaged, reference, tiny_encoder, array, chunk):
    cfg, store = damaged
    (store / array / chunk).unlink()  # zarr would read it as zeros: every item at row 0, zero projections
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    msg = str(e.value)
    fix = "pipeline extract --suite shapes-sugarcrepe" if array.startswith("suites/") else "rerun `pipeline extract`"
    assert f"{array} " in msg and "missing chunk file" in msg and str(store) in msg and fix in msg and "--repair" not in msg
    summary = extract(cfg, progress=False, encoder=tiny_encoder)  # the fix the message names
    assert summary["images"]["encoded"] == 0 and summary["captions"]["encoded"] == 0
    FeatureStore.open(store)
    assert_same_store(store, reference)


@pytest.mark.parametrize("array", [f"{SUITE}/image", f"{SUITE}/captions", "params/visual_proj", "params/logit_scale"])
def test_flipped_byte_in_an_index_or_projection_is_named_with_its_fix(damaged, array):
    _, store = damaged
    _flip(store / array / ("c" if array.endswith("logit_scale") else "c/0/0"), at=1 if array.endswith("logit_scale") else 20)
    fs = FeatureStore.open(store)  # every file is present: the inventory passes
    with pytest.raises(CorruptStoreError) as e:
        fs.suite_index("shapes-sugarcrepe") if array.startswith("suites/") else fs.projections()
    msg = str(e.value)
    assert f"{array} " in msg and "checksum/decode failure" in msg and str(store) in msg and "rerun `pipeline extract" in msg


@pytest.mark.parametrize(
    "array,group,fix", [(f"{SUITE}/image", SUITE, "extract --suite shapes-sugarcrepe"), ("params/logit_scale", "params", "extract")]
)
def test_an_index_or_projection_edited_to_another_byte_order_is_refused_and_its_fix_works(
    damaged, reference, tiny_encoder, array, group, fix
):
    """Read as big-endian, logit_scale 100 would be 7e-41 and an index's rows garbage: refused
    at open like a row array's byte order, with the metadata's fix, which restores the store."""
    import shutil

    cfg, store = damaged
    meta = store / array / "zarr.json"
    meta.write_text(meta.read_text().replace('"endian": "little"', '"endian": "big"'))
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    msg = str(e.value)
    assert f"{array} (zarr.json declares byte order big; extract writes little-endian)" in msg
    assert f"delete {store}/{group} and rerun `pipeline {fix}" in msg
    shutil.rmtree(store / group)
    extract(cfg, progress=False, encoder=tiny_encoder)  # every suite's index and the projections rewritten
    FeatureStore.open(store)
    assert_same_store(store, reference)


def test_rows_an_extract_was_adding_when_killed_are_named_with_a_plain_extract(damaged, reference, tiny_encoder):
    """Killed while resizing the arrays for new rows, an extract leaves some arrays longer
    than the committed rows: the reader names a plain extract (which drops them), not a
    fresh store."""
    cfg, store = damaged
    key = zarr.open_group(store, mode="r+")["image/key"]
    key.resize((N + 5, *key.shape[1:]))
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    msg = str(e.value)
    assert f"image arrays hold rows beyond the {N} committed" in msg and "image/key: 305" in msg
    assert "rerun `pipeline extract`" in msg and "delete" not in msg
    summary = extract(cfg, progress=False, encoder=tiny_encoder)
    assert summary["images"]["encoded"] == 0
    assert_same_store(store, reference)


def test_an_index_rewritten_for_a_new_manifest_drops_the_old_hash_first(damaged, monkeypatch):
    """A kill between an index's new rows and its new manifest hash leaves an index that no
    manifest matches, never the new rows under the old manifest's hash."""
    from zarr.core.attributes import Attributes

    from pipeline.cache.writer import write_suite_index

    _, store = damaged
    old = FeatureStore.open(store).suite_attrs("shapes-sugarcrepe")["manifest_sha256"]
    root = zarr.open_group(store, mode="r+")
    rows = np.arange(3, dtype=np.int64)
    real = Attributes.update

    def killed_at_the_new_hash(self, *args, **kwargs):
        if "kinds" in dict(*args, **kwargs):
            raise KeyboardInterrupt("simulated kill")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Attributes, "update", killed_at_the_new_hash)
    with pytest.raises(KeyboardInterrupt):
        write_suite_index(root, "shapes-sugarcrepe", {"image": ("image", rows), "captions": ("text", rows[:, None])}, {"manifest_sha256": "new"})
    monkeypatch.setattr(Attributes, "update", real)
    with pytest.raises(StaleCacheError, match="manifest of shapes-sugarcrepe changed"):
        FeatureStore.open(store).suite_index("shapes-sugarcrepe", manifest_sha256=old)


@pytest.mark.parametrize(
    "damage,named,fix",
    [
        (f"{SUITE}/image/zarr.json", f"{SUITE}/image ", "/suites/shapes-sugarcrepe and rerun `pipeline extract --suite"),
        (f"{SUITE}/zarr.json", f"{SUITE} ", "/suites/shapes-sugarcrepe and rerun `pipeline extract --suite"),
        ("params/text_projection/zarr.json", "params/text_projection ", "/params and rerun `pipeline extract`"),
        ("text/done/zarr.json", "text/done ", "which --repair cannot undo — delete the whole store (/"),
        ("zarr.json", "root metadata (zarr.json)", "delete the store and rerun `pipeline extract`"),
        ("image/zarr.json", "its image group (image/zarr.json)", "delete the store and rerun `pipeline extract`"),
        ("text/zarr.json", "its text group (text/zarr.json)", "delete the store and rerun `pipeline extract`"),
    ],
)
@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_lost_or_broken_metadata_is_refused_at_open_naming_the_array(damaged, damage, named, fix, how):
    _, store = damaged
    if how == "deleted" and damage != "zarr.json":  # without its root zarr.json there is no store: CacheError
        (store / damage).unlink()
    else:
        (store / damage).write_text("")
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    msg = str(e.value)
    assert named in msg and str(store) in msg and fix in msg


@pytest.mark.parametrize("damage,named", [("zarr.json", "root metadata (zarr.json) is unreadable"), ("image/zarr.json", "its image group (image/zarr.json) is unreadable")])
def test_extract_into_a_store_with_broken_metadata_names_it(damaged, tiny_encoder, damage, named):
    """Extract refuses a root or group zarr.json that does not parse with the reader's own
    message (not a bare JSON error), before it plans or writes a row."""
    cfg, store = damaged
    (store / damage).write_text('{"zarr_format": 3, "node_t')
    with pytest.raises(CorruptStoreError) as e:
        extract(cfg, progress=False, encoder=tiny_encoder)
    assert named in str(e.value) and str(store) in str(e.value) and "delete the store and rerun `pipeline extract`" in str(e.value)


@pytest.mark.parametrize("array", ["image/final", "text/done"])
def test_extract_into_a_store_that_lost_an_array_names_it(damaged, tiny_encoder, array):
    cfg, store = damaged
    (store / array / "zarr.json").unlink()
    with pytest.raises(CorruptStoreError) as e:
        extract(cfg, progress=False, encoder=tiny_encoder)
    assert f"{array} is absent" in str(e.value) and str(store) in str(e.value) and "rerun `pipeline extract`" in str(e.value)


@pytest.mark.parametrize("array", ["text/key", "image/key"])
def test_extract_names_a_key_chunk_that_fails_its_checksum_and_repair_restores_it(damaged, reference, tiny_encoder, array):
    """Every extract reads every key to plan its rows: a damaged key chunk is named with its
    repair before planning (not a bare checksum error), and `--repair` restores it."""
    cfg, store = damaged
    _flip(_file(store, array, 0), at=30)
    with pytest.raises(CorruptStoreError) as e:
        extract(cfg, progress=False, encoder=tiny_encoder)
    assert f"{array} rows 0-" in str(e.value) and "pipeline extract --repair" in str(e.value) and str(store) in str(e.value)
    extract(cfg, progress=False, encoder=tiny_encoder, repair=True)
    assert_same_store(store, reference)


def test_repair_names_the_rows_whose_keys_no_intact_index_restores(damaged, reference, tiny_encoder, caplog):
    """A key chunk and the only suite index that names its rows both lost: those rows keep a
    zero key and stay unused, which --repair says; their captions get new rows, and the
    suite reads the same features as the uninterrupted store."""
    cfg, store = damaged
    _flip(_file(store, "text/key", 0), at=30)
    _file(store, "suites/shapes-sugarcrepe/captions", 0).unlink()
    with caplog.at_level("WARNING"):
        extract(cfg, progress=False, encoder=tiny_encoder, repair=True)
    said = [r.getMessage() for r in caplog.records if "text/key: restored" in r.getMessage()]
    assert len(said) == 1 and "restored 0 of " in said[0] and "row(s) no intact index of the suites extracted names stay unused" in said[0]
    fixed, ref = FeatureStore.open(store), FeatureStore.open(reference)
    rows, ref_rows = fixed.suite_index("shapes-sugarcrepe")["captions"], ref.suite_index("shapes-sugarcrepe")["captions"]
    assert fixed.root["text/key"].shape[0] > ref.root["text/key"].shape[0]  # the captions were given new rows
    got, want = fixed.texts(rows.ravel(), grids=False), ref.texts(ref_rows.ravel(), grids=False)
    torch.testing.assert_close(got.embed, want.embed, rtol=0, atol=0)


def test_clean_store_opens_with_its_indexes_and_projections(reference):
    fs = FeatureStore.open(reference)
    assert inventory(fs.root) == []
    index = fs.suite_index("shapes-sugarcrepe")
    assert set(index) == {"image", "captions"} and index["image"].min() >= 0
    assert fs.projections().text_projection.abs().sum() > 0


def test_repair_reencodes_exactly_the_damaged_rows(damaged, reference, tiny_encoder):
    cfg, store = damaged
    _file(store, "image/embed", 1).unlink()  # rows 256-299
    _flip(_file(store, "image/early", 0), at=200)  # rows 0-63 (an inner chunk of shard 0)
    _flip(_file(store, "text/key", 0), at=30)  # keys restored from the suite index
    with pytest.raises(CorruptStoreError):
        extract(cfg, progress=False, encoder=tiny_encoder)  # refused without --repair
    summary = extract(cfg, progress=False, encoder=tiny_encoder, repair=True)
    assert summary["images"]["encoded"] == 64 + (N - 256)  # shard 0's rows and the lost chunk's
    assert set(summary["repaired"]) == {"image/embed", "image/early", "text/key"}
    assert inventory(zarr.open_group(store, mode="r")) == [] and verify(zarr.open_group(store, mode="r")) == []
    assert_same_store(store, reference)


def test_a_repair_killed_after_writing_its_zeros_leaves_the_rows_due(damaged, reference, tiny_encoder, monkeypatch):
    """`--repair` unflags a damaged file's rows before it rewrites the file with zeros: killed
    right after the zeros are written, the store holds no zeros flagged as encoded (a valid
    file of zeros that every later check would pass), and the next run re-encodes them."""
    cfg, store = damaged
    _flip(_file(store, "image/embed", 0), at=30)
    write = zarr.Array.__setitem__

    def killed_after_the_zeros(self, selection, value):
        write(self, selection, value)
        if self.path == "image/embed":
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(zarr.Array, "__setitem__", killed_after_the_zeros)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg, progress=False, encoder=tiny_encoder, repair=True)
    monkeypatch.setattr(zarr.Array, "__setitem__", write)
    assert not zarr.open_group(store, mode="r")["image/done"][:256].any()
    summary = extract(cfg, progress=False, encoder=tiny_encoder, repair=True)
    assert summary["images"]["encoded"] == 256
    assert_same_store(store, reference)


def test_a_first_layout_killed_midway_is_laid_out_afresh(world, reference, tiny_encoder, tmp_path, monkeypatch):
    """The root's attributes are written after every array: a first extract killed while it
    lays the store out leaves a root without them and holding no row, which the next extract
    lays out afresh (it refused it before, naming a missing group), while a foreign Zarr
    group at the path is left alone."""
    from pipeline.cache import writer

    cfg = _cfg(world, tmp_path / "out")
    create, calls = writer._create, []

    def killed_at_the_fourth_array(*args):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt("killed")
        create(*args)

    monkeypatch.setattr(writer, "_create", killed_at_the_fourth_array)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg, progress=False, encoder=tiny_encoder)
    monkeypatch.setattr(writer, "_create", create)
    store = store_path(cfg)
    assert not dict(zarr.open_group(store, mode="r").attrs)
    extract(cfg, progress=False, encoder=tiny_encoder)
    assert_same_store(store, reference)

    other = _cfg(world, tmp_path / "foreign")
    foreign = zarr.open_group(store_path(other), mode="w")
    foreign.create_array("data", shape=(3,), dtype="f4")
    with pytest.raises(CorruptStoreError):
        extract(other, progress=False, encoder=tiny_encoder)
    assert "data" in zarr.open_group(store_path(other), mode="r")


def test_a_lost_done_chunk_is_named_at_read_and_plain_extract_restores_the_store(damaged, reference, tiny_encoder):
    """A complete store that loses a chunk of its done flags reads those rows as not done:
    the reader refuses them (naming both causes and the command), and a plain extract
    re-encodes exactly those rows, giving the uninterrupted store back."""
    cfg, store = damaged
    _file(store, "image/done", 1).unlink()  # rows 256-299
    with pytest.raises(StaleCacheError) as e:
        FeatureStore.open(store).images(np.arange(N), grids=False)
    assert f"{N - 256} image rows are not marked done" in str(e.value) and "image/done" in str(e.value)
    assert "rerun `pipeline extract`" in str(e.value) and str(store) in str(e.value)
    summary = extract(cfg, progress=False, encoder=tiny_encoder)
    assert summary["images"]["encoded"] == N - 256
    assert_same_store(store, reference)


def _edit_attributes(store: Path, edit) -> None:
    """Rewrite the store's root zarr.json with ``edit(attributes)`` applied in place."""
    meta = store / "zarr.json"
    doc = json.loads(meta.read_text())
    edit(doc["attributes"])
    meta.write_text(json.dumps(doc))


def test_edited_dims_are_checked_against_the_arrays(damaged):
    _, store = damaged
    _edit_attributes(store, lambda a: a["dims"].update(d_v=a["dims"]["d_v"] + 8))
    with pytest.raises(CorruptStoreError, match=r"image/early has rows of shape .* give"):
        FeatureStore.open(store)


def test_edited_fingerprint_is_named_not_an_empty_difference(damaged):
    _, store = damaged
    _edit_attributes(store, lambda a: a.update(fingerprint_id="0" * 16))
    with pytest.raises(CorruptStoreError, match="attributes were edited"):
        FeatureStore.open(store)


def test_refused_fingerprint_lists_each_field_with_both_values(reference):
    fp = FeatureStore.open(reference).fingerprint
    with pytest.raises(ForeignCacheError) as e:
        FeatureStore.open(reference, expect={**fp, "early_layer": 7})
    assert f"early_layer: store {fp['early_layer']!r}, configured 7" in str(e.value)


def test_an_edited_grid_that_keeps_the_patch_count_is_refused(damaged):
    """The arrays cannot tell an 8 x 8 grid from a 4 x 16 one (same patch count): the dims
    are checked against the fingerprint, whose hash the store also records."""
    _, store = damaged
    h, w = json.loads((store / "zarr.json").read_text())["attributes"]["dims"]["grid"]
    _edit_attributes(store, lambda a: a["dims"].update(grid=[1, h * w]))
    with pytest.raises(CorruptStoreError, match=rf"dims grid \[1, {h * w}\] differs from the fingerprint's \[{h}, {w}\]"):
        FeatureStore.open(store)


def test_a_lost_dims_key_is_named_once(damaged):
    _, store = damaged
    _edit_attributes(store, lambda a: a["dims"].pop("d_t"))
    with pytest.raises(CorruptStoreError) as e:
        FeatureStore.open(store)
    assert str(e.value).count("dims lacks 'd_t'") == 1


def test_an_extract_refused_for_its_fingerprint_names_each_differing_field(damaged, tiny_encoder):
    from pipeline.cache.writer import open_for_writing

    _, store = damaged
    fs = FeatureStore.open(store)
    with pytest.raises(ForeignCacheError) as e:
        open_for_writing(store, {**fs.fingerprint, "early_layer": 7}, dict(fs.root.attrs["dims"]))
    assert f"early_layer: store {fs.fingerprint['early_layer']!r}, configured 7" in str(e.value)
    assert "replace_mismatch" in str(e.value)


def test_replace_mismatch_starts_afresh_for_another_encoder_only(damaged, tiny_encoder):
    """``replace_mismatch`` (the DVC pipeline's) deletes a store of other weights and writes a
    new one; a store of the same encoder keeps its rows."""
    from pipeline.cache.schema import fingerprint_id
    from pipeline.cache.writer import open_for_writing

    _, store = damaged
    fs = FeatureStore.open(store)
    fp, dims, n = dict(fs.fingerprint), dict(fs.root.attrs["dims"]), fs.root["image/embed"].shape[0]
    assert n > 0
    kept = open_for_writing(store, fp, dims, replace_mismatch=True)
    assert kept["image/embed"].shape[0] == n and kept.attrs["fingerprint_id"] == fingerprint_id(fp)
    other = {**fp, "early_layer": 7}
    fresh = open_for_writing(store, other, dims, replace_mismatch=True)
    assert fresh.attrs["fingerprint_id"] == fingerprint_id(other) and fresh["image/embed"].shape[0] == 0


@pytest.mark.parametrize("what", ["root metadata lost", "a folder of other files"])
def test_a_location_with_files_but_no_store_is_never_wiped(damaged, tiny_encoder, what):
    """A store whose root zarr.json is lost is not 'no store': score names it, and extract
    refuses to write there rather than delete every row (or a user's files) and start afresh."""
    cfg, store = damaged
    if what == "root metadata lost":
        (store / "zarr.json").unlink()
    else:
        import shutil

        shutil.rmtree(store)
        store.mkdir()
        (store / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    with pytest.raises(CorruptStoreError, match="holds files but no zarr.json"):
        FeatureStore.open(store)
    with pytest.raises(CorruptStoreError, match="holds files but no zarr.json.*extract.out"):
        extract(cfg, progress=False, encoder=tiny_encoder)
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_nan_features_are_refused_at_write(world, tiny_encoder, tmp_path, monkeypatch):
    import torch

    original = tiny_encoder.encode_images

    def poisoned(pixels):
        out = {k: v.clone() for k, v in original(pixels).items()}
        out["embed"][0, 0] = torch.nan
        return out

    monkeypatch.setattr(tiny_encoder, "encode_images", poisoned)
    with pytest.raises(ValueError, match=r"NaN/inf image/embed features for store rows \[0, 32"):
        extract(_cfg(world, tmp_path / "nan"), progress=False, encoder=tiny_encoder)


def test_features_beyond_float16_are_refused_at_write(world, tiny_encoder, tmp_path, monkeypatch):
    """A float32 value beyond float16's range is finite where the encoder made it and inf in
    the float16 grid: the check runs on the stored values."""
    original = tiny_encoder.encode_images

    def too_large(pixels):
        out = {k: v.clone() for k, v in original(pixels).items()}
        out["early"][1, 0, 0] = 7e4
        return out

    monkeypatch.setattr(tiny_encoder, "encode_images", too_large)
    with pytest.raises(ValueError, match=r"NaN/inf image/early features for store rows \[1, 33\] \(as stored, in float16: finite up to 65504\)"):
        extract(_cfg(world, tmp_path / "big"), progress=False, encoder=tiny_encoder)


# ---------------------------------------------------------------- one writer at a time


def hold_lock(store: Path) -> subprocess.Popen:
    """Another process holding the store's write lock (it has taken it when this returns)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pipeline.cache import store_lock\nimport time\nwith store_lock({str(store)!r}):\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    if holder.stdout.readline().strip() != "held":
        holder.kill()
        pytest.fail("the lock holder did not start")
    return holder


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    store = tmp_path / "x.zarr"
    holder = hold_lock(store)
    try:
        with pytest.raises(StoreLockedError) as e, store_lock(store):
            pass
        assert f"pid {holder.pid} on {os.uname().nodename}" in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    with store_lock(store) as me:  # the dead holder's lock is stale: reclaimed
        assert me["pid"] == os.getpid()
    assert lock_path(store).read_text() == ""  # released cleanly


def test_a_reader_missing_a_suite_says_an_extract_is_writing_it(damaged):
    """While an extract holds the store's lock, a suite it has not indexed yet is reported as
    being written (the usual fix, another extract, would be refused); afterwards the fix is
    that extract."""
    from pipeline.cache import CacheError
    from pipeline.cache.lock import running_writer

    _, store = damaged
    assert running_writer(store) is None
    holder = hold_lock(store)
    try:
        assert running_writer(store)["pid"] == holder.pid
        with pytest.raises(CacheError, match=rf"an extract \(pid {holder.pid} on .*\) is writing the store now"):
            FeatureStore.open(store).suite_index("shapes-aro")
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(CacheError, match=r"run `pipeline extract --suite shapes-aro`"):
        FeatureStore.open(store).suite_index("shapes-aro")


def test_lock_of_another_host_needs_break_lock(tmp_path):
    store = tmp_path / "y.zarr"
    lock_path(store).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "2026-01-01T00:00:00+00:00"}))
    with pytest.raises(StoreLockedError, match="--break-lock"), store_lock(store):
        pass
    with store_lock(store, break_lock=True) as me:
        assert me["host"] == os.uname().nodename
