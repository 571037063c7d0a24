"""The cache contract: round trip = direct forward pass, dedup, resume, refusal of foreign stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.cache import FeatureStore, ForeignCacheError, StaleCacheError, store_path, writer
from pipeline.cache.schema import SCHEMA_VERSION
from pipeline.config import ExtractConfig
from pipeline.manifests import decode_image
from stages import extract as extract_stage
from tests.conftest import make_choice_manifest, make_images
from tests.stores import file_bytes


def _cfg(tmp_path, suites_manifests, batch_size=4):
    return ExtractConfig(
        model="tiny-test",
        suites=list(suites_manifests),
        manifests={s: str(p) for s, p in suites_manifests.items()},
        image_roots={s: str(tmp_path / "images") for s in suites_manifests},
        out=str(tmp_path / "features"),
        batch_size=batch_size,
    )


def as_aro(df):
    """A SugarCrepe-style manifest relabelled with shapes-aro's categories, so that it can be
    extracted as a second suite."""
    return df.assign(category=[("relation", "attribution")[i % 2] for i in range(len(df))])


@pytest.fixture
def tiny_suite(tmp_path):
    names = make_images(tmp_path / "images", 10)
    manifest = make_choice_manifest(tmp_path / "m" / "sc.parquet", names)
    return tmp_path / "m" / "sc.parquet", manifest


def test_round_trip_equals_direct_forward(tmp_path, tiny_encoder, tiny_suite):
    path, manifest = tiny_suite
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    summary = extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    assert summary["images"]["encoded"] == 10
    store = FeatureStore.open(store_path(cfg))
    index = store.suite_index("shapes-sugarcrepe")
    assert index["image"].shape == (10, 1) and index["captions"].shape == (10, 2)

    imgs = [decode_image((tmp_path / "images" / n).read_bytes(), n) for n in manifest["image"]]
    pixels = torch.stack([tiny_encoder.preprocess(im) for im in imgs])
    direct = tiny_encoder.encode_images(pixels)
    cached = store.images(index["image"][:, 0])
    # fp16 storage: compare at fp16 precision
    torch.testing.assert_close(cached.final, direct["final"][:, 1:].half().float())
    torch.testing.assert_close(cached.early, direct["early"][:, 1:].half().float())
    torch.testing.assert_close(cached.embed, direct["embed"], rtol=1e-5, atol=1e-5)
    # pooled embedding is the CLS token through the stored projection
    proj = store.projections()
    torch.testing.assert_close(cached.cls @ proj.visual_proj, cached.embed, rtol=2e-2, atol=2e-2)

    caps = [c[1] for c in manifest["captions"]]
    direct_t = tiny_encoder.encode_texts(tiny_encoder.tokenizer(caps))
    cached_t = store.texts(index["captions"][:, 1])
    torch.testing.assert_close(cached_t.embed, direct_t["embed"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached_t.tokens, direct_t["tokens"].half().float())
    assert torch.equal(cached_t.mask, direct_t["mask"])
    eot = cached_t.mask.sum(1) - 1
    pooled = cached_t.tokens[torch.arange(10), eot] @ proj.text_projection
    torch.testing.assert_close(pooled, cached_t.embed, rtol=2e-2, atol=2e-2)

    # embeddings-only reads (global scorers): same embeddings, no grids or token states
    slim, slim_t = store.images(index["image"][:, 0], grids=False), store.texts(index["captions"][:, 1], grids=False)
    assert torch.equal(slim.embed, cached.embed) and torch.equal(slim_t.embed, cached_t.embed)
    assert slim.final.shape == (10, 0, store.dims.d_v) and slim_t.tokens.shape == (10, 0, store.dims.d_t)
    assert torch.equal(slim_t.mask, cached_t.mask)


def test_a_crop_box_is_encoded_as_its_crop(tmp_path, tiny_encoder, tiny_suite):
    """ARO's VG items name a region of an image (``crop_box``): the store holds that region's
    features under its own key, not the whole image's, which another item of it keeps."""
    path, manifest = tiny_suite
    name = manifest["image"][0]
    cropped = manifest.assign(image=[name, name, *manifest["image"][2:]], crop_box=[None, [4, 8, 40, 30]] + [None] * 8)
    cropped.to_parquet(path)
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    store = FeatureStore.open(store_path(cfg))
    rows = store.suite_index("shapes-sugarcrepe")["image"][:2, 0]
    cached = store.images(rows, grids=False).embed
    data = (tmp_path / "images" / name).read_bytes()
    pixels = torch.stack([tiny_encoder.preprocess(decode_image(data, name, box)) for box in (None, [4, 8, 40, 30])])
    torch.testing.assert_close(cached, tiny_encoder.encode_images(pixels)["embed"], rtol=1e-5, atol=1e-5)
    assert rows[0] != rows[1] and not torch.allclose(cached[0], cached[1], atol=1e-3)


def test_dedup_across_suites_and_rerun_encodes_only_new(tmp_path, tiny_encoder, tiny_suite):
    path, manifest = tiny_suite
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    # a second suite sharing 5 images and all captions of the first, plus 3 new images
    more = make_images(tmp_path / "images" / "more", 3, seed=1)
    shared = manifest.iloc[:5].copy()
    extra = make_choice_manifest(tmp_path / "m" / "x.parquet", [f"more/{n}" for n in more], seed=9)
    import pandas as pd

    extra["item_id"] = [f"more-{i}" for i in extra["item_id"]]  # one id per item
    both = as_aro(pd.concat([shared, extra], ignore_index=True))
    both.to_parquet(tmp_path / "m" / "aro.parquet", index=False)
    cfg2 = _cfg(tmp_path, {"shapes-sugarcrepe": path, "shapes-aro": tmp_path / "m" / "aro.parquet"})
    summary = extract_stage.run(cfg2, progress=False, encoder=tiny_encoder)
    assert summary["images"] == {"total": 13, "encoded": 3}
    store = FeatureStore.open(store_path(cfg))
    a = store.suite_index("shapes-sugarcrepe")["image"][:5, 0]
    b = store.suite_index("shapes-aro")["image"][:5, 0]
    assert np.array_equal(a, b)  # same image -> same row
    # a third run with nothing new encodes nothing
    assert extract_stage.run(cfg2, progress=False, encoder=tiny_encoder)["images"]["encoded"] == 0


def test_an_extract_with_nothing_new_leaves_every_byte_of_the_store(tmp_path, tiny_encoder, tiny_suite, monkeypatch):
    """DVC hashes the store: a rerun of extract that encodes nothing (another batch size,
    an edit to the extract code) must not change it, or every stage after extract reruns.
    The rerun happens "a year later", so a timestamp written again would differ."""
    import datetime
    import hashlib
    from types import SimpleNamespace

    from pipeline.cache import writer

    def digest(folder):
        files = sorted(f for f in folder.rglob("*") if f.is_file())
        return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}

    path, _ = tiny_suite
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    before = digest(store_path(cfg))
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    monkeypatch.setattr(writer, "_dt", SimpleNamespace(UTC=datetime.UTC, datetime=SimpleNamespace(now=lambda tz=None: later)))
    summary = extract_stage.run(_cfg(tmp_path, {"shapes-sugarcrepe": path}, batch_size=3), progress=False, encoder=tiny_encoder)
    assert summary["images"]["encoded"] == 0 and summary["captions"]["encoded"] == 0
    assert digest(store_path(cfg)) == before


def test_resume_after_crash(tmp_path, tiny_encoder, tiny_suite, monkeypatch):
    path, _ = tiny_suite
    names = make_images(tmp_path / "images" / "big", 150, seed=3)
    from tests.conftest import make_choice_manifest as mk

    as_aro(mk(tmp_path / "m" / "big.parquet", [f"big/{n}" for n in names])).to_parquet(tmp_path / "m" / "big.parquet", index=False)
    cfg = _cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "big.parquet"}, batch_size=16)
    calls = {"n": 0}
    real = tiny_encoder.encode_images

    def crashing(pixels):
        calls["n"] += 1
        if calls["n"] == 6:  # dies inside the second shard
            raise KeyboardInterrupt("simulated crash")
        return real(pixels)

    monkeypatch.setattr(tiny_encoder, "encode_images", crashing)
    with pytest.raises(KeyboardInterrupt):
        extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    store = FeatureStore.open(store_path(cfg))
    done = store.root["image/done"][:]
    assert done.sum() == 64  # the first shard survived whole, nothing else is flagged
    monkeypatch.setattr(tiny_encoder, "encode_images", real)
    summary = extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    assert summary["images"]["encoded"] == 150 - 64
    store = FeatureStore.open(store_path(cfg))
    assert store.root["image/done"][:].all()
    # resumed rows equal a clean extraction
    clean = _cfg(tmp_path / "clean", {"shapes-aro": tmp_path / "m" / "big.parquet"}, batch_size=16)
    clean.image_roots = cfg.image_roots
    extract_stage.run(clean, progress=False, encoder=tiny_encoder)
    other = FeatureStore.open(store_path(clean))
    rows = store.suite_index("shapes-aro")["image"][:, 0]
    rows2 = other.suite_index("shapes-aro")["image"][:, 0]
    assert torch.equal(store.images(rows).final, other.images(rows2).final)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_failed_write_stops_extract_with_no_later_batch_flagged(tmp_path, tiny_encoder, monkeypatch, overlap):
    """A shard write that fails (a full disk) ends extract with that error, in the writer
    thread or in the calling one: the batch before it stays flagged, its own rows are not;
    in the calling thread no later batch is written either (the writer thread may already
    hold the next one, which is whole, flags after data)."""
    from pipeline.cache import writer
    from pipeline.extraction import extract

    names = make_images(tmp_path / "images", 150, seed=4)
    as_aro(make_choice_manifest(tmp_path / "m" / "big.parquet", names)).to_parquet(tmp_path / "m" / "big.parquet", index=False)
    cfg = _cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "big.parquet"}, batch_size=16)
    real, calls = writer.write_rows, []

    def failing(root, modality, rows, arrays, done=None, handles=None):
        calls.append(modality)
        if modality == "image" and calls.count("image") == 2:
            raise OSError(28, "No space left on device")
        return real(root, modality, rows, arrays, done, handles)

    monkeypatch.setattr(writer, "write_rows", failing)
    with pytest.raises(OSError, match="No space left"):
        extract(cfg, progress=False, encoder=tiny_encoder, overlap=overlap)
    done = FeatureStore.open(store_path(cfg)).root["image/done"][:]
    assert done[:64].all() and not done[64:128].any()  # the first shard batch whole, the failed one unflagged
    if not overlap:
        assert calls.count("image") == 2 and done.sum() == 64  # nothing written after the failure


def test_rows_left_between_others_are_written_on_a_later_extract(tmp_path, tiny_encoder, tiny_suite, monkeypatch):
    """Two images that cannot be decoded, not neighbours, leave two rows undone; every next
    extract tries exactly those rows again (a write of non-contiguous rows into the sharded
    grids) and, while they stay undecodable, leaves every byte of the store as it was (so
    DVC reruns nothing after extract); once the images are whole the store equals a clean
    extraction."""
    path, _ = tiny_suite
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    cfg.skip_bad_images = True
    images = tmp_path / "images"
    whole = {n: (images / n).read_bytes() for n in ("img002.png", "img005.png")}
    for n in whole:
        (images / n).write_bytes(f"not an image: {n}".encode())  # two rows (content-addressed)
    first = extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    assert first["images"]["encoded"] == 8 and first["skipped_images"]["bad"] == 2
    root = FeatureStore.open(store_path(cfg)).root
    undone = np.flatnonzero(~root["image/done"][:])
    assert len(undone) == 2  # zeros, unflagged: the same bytes whatever batch they were encoded in
    for name in ("final", "early", "embed"):
        assert not np.asarray(root[f"image/{name}"][:])[undone].any()
    files = file_bytes(store_path(cfg))
    stamps = []
    monkeypatch.setattr(writer, "finalize", stamps.append)
    again = extract_stage.run(cfg, progress=False, encoder=tiny_encoder)  # tried again, still bad
    assert again["images"]["encoded"] == 0 and again["skipped_images"]["bad"] == 2 and not stamps
    assert file_bytes(store_path(cfg)) == files
    monkeypatch.undo()
    for n, data in whole.items():
        (images / n).write_bytes(data)
    assert extract_stage.run(cfg, progress=False, encoder=tiny_encoder)["images"]["encoded"] == 2
    store = FeatureStore.open(store_path(cfg))  # the whole files' bytes are new keys, new rows
    assert store.root["image/done"][:][store.suite_index("shapes-sugarcrepe")["image"][:, 0]].all()
    clean = _cfg(tmp_path / "clean", {"shapes-sugarcrepe": path})
    clean.image_roots = cfg.image_roots
    extract_stage.run(clean, progress=False, encoder=tiny_encoder)
    other = FeatureStore.open(store_path(clean))
    rows, rows2 = (s.suite_index("shapes-sugarcrepe")["image"][:, 0] for s in (store, other))
    assert torch.equal(store.images(rows).final, other.images(rows2).final)
    assert torch.equal(store.images(rows).early, other.images(rows2).early)


def test_refuses_foreign_and_stale_stores(tmp_path, tiny_encoder, tiny_suite):
    path, _ = tiny_suite
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    spath = store_path(cfg)
    fp = FeatureStore.open(spath).fingerprint
    with pytest.raises(ForeignCacheError, match="pipeline extract"):
        FeatureStore.open(spath, expect={**fp, "pretrained": "openai"})
    FeatureStore.open(spath, expect=fp)  # the right encoder is accepted
    # a manifest edited after extraction is refused
    import pandas as pd

    df = pd.read_parquet(path)
    df.loc[0, "category"] = "edited"
    df.to_parquet(path, index=False)
    from pipeline.manifests import file_sha256

    with pytest.raises(StaleCacheError, match="rerun `pipeline extract`"):
        FeatureStore.open(spath).suite_index("shapes-sugarcrepe", file_sha256(path))
    # another schema version is refused
    import zarr

    root = zarr.open_group(spath, mode="r+")
    root.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(StaleCacheError, match="schema"):
        FeatureStore.open(spath)


def test_bad_inputs_fail_clearly(tmp_path, tiny_encoder, tiny_suite):
    path, manifest = tiny_suite
    # missing image named
    bad = as_aro(manifest)
    bad.loc[3, "image"] = "nope.png"
    bad.to_parquet(tmp_path / "m" / "bad.parquet", index=False)
    with pytest.raises(FileNotFoundError, match=r"1 image\(s\) not found .*nope.png"):
        extract_stage.run(_cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "bad.parquet"}), progress=False, encoder=tiny_encoder)
    # ... or, when asked, skipped: counted and recorded, never silently dropped
    skip = _cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "bad.parquet"})
    skip.skip_missing = True
    extract_stage.run(skip, progress=False, encoder=tiny_encoder)
    store = FeatureStore.open(store_path(skip))
    assert store.suite_attrs("shapes-aro")["missing_images"] == ["nope.png"]
    from pipeline.scoring import drop_missing

    index = store.suite_index("shapes-aro")
    assert index["image"][3, 0] == -1
    kept, kept_index, n_missing = drop_missing(bad, index)
    assert n_missing == 1 and len(kept) == 9 and "nope.png" not in set(kept["image"])
    # corrupt image named
    (tmp_path / "images" / "corrupt.png").write_bytes(b"not a png")
    bad.loc[3, "image"] = "corrupt.png"
    bad.to_parquet(tmp_path / "m" / "bad.parquet", index=False)
    with pytest.raises(ValueError, match="corrupt.png"):
        extract_stage.run(_cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "bad.parquet"}), progress=False, encoder=tiny_encoder)
    # escaping path refused
    bad.loc[3, "image"] = "../../etc/passwd"
    bad.to_parquet(tmp_path / "m" / "bad.parquet", index=False)
    with pytest.raises(ValueError, match="escapes"):
        extract_stage.run(_cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "bad.parquet"}), progress=False, encoder=tiny_encoder)
    # empty caption refused
    bad = as_aro(manifest)
    bad.at[2, "captions"] = ["a red circle", "  "]
    bad.to_parquet(tmp_path / "m" / "bad.parquet", index=False)
    with pytest.raises(ValueError, match="empty caption"):
        extract_stage.run(_cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "bad.parquet"}), progress=False, encoder=tiny_encoder)
    # a manifest given for a suite no suite has: refused by the config, naming it
    with pytest.raises(ValueError, match=r"manifests names unknown suite\(s\) no-such-suite"):
        _cfg(tmp_path, {"no-such-suite": path})


def test_long_caption_truncated_and_warned_once(tmp_path, tiny_encoder, tiny_suite, caplog):
    path, manifest = tiny_suite
    long = as_aro(manifest)
    long.at[0, "captions"] = [" ".join(["red circle"] * 40), "a blue square"]
    long.at[1, "captions"] = [" ".join(["blue star"] * 40), "a blue square"]
    long.to_parquet(tmp_path / "m" / "long.parquet", index=False)
    with caplog.at_level("WARNING"):
        extract_stage.run(_cfg(tmp_path, {"shapes-aro": tmp_path / "m" / "long.parquet"}), progress=False, encoder=tiny_encoder)
    msgs = [r.getMessage() for r in caplog.records if "exceed the context" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].startswith("shapes-aro: 2 caption(s)")
    store = FeatureStore.open(tmp_path / "features" / "tiny-test.zarr")
    rows = store.suite_index("shapes-aro")["captions"][0, :1]
    t = store.texts(rows)
    assert t.mask.all() and int(t.ids[0, -1]) == 49407  # full context, eot kept last


def test_chunk_rows_follow_the_row_size():
    from pipeline.cache.schema import (
        CHUNK_BYTES,
        IMAGE_ARRAYS,
        SHARD_ROWS,
        TEXT_ARRAYS,
        chunk_rows,
        resolve_tail,
    )

    grid = next(s for s in IMAGE_ARRAYS if s.name == "image/final")
    tokens = next(s for s in TEXT_ARRAYS if s.name == "text/tokens")
    vit_l = {"grid": [24, 24], "d_v": 1024, "d_t": 768, "embed_dim": 768, "context_length": 77}
    toy = {"grid": [8, 8], "d_v": 128, "d_t": 128, "embed_dim": 128, "context_length": 32}
    assert chunk_rows(grid, resolve_tail(grid, vit_l)) == 1  # 577 x 1024 fp16 = 1.2 MB a row
    assert chunk_rows(grid, resolve_tail(grid, toy)) == 16  # 65 x 128 fp16 = 16.6 kB a row
    assert chunk_rows(tokens, resolve_tail(tokens, toy)) == SHARD_ROWS  # 8 kB a row
    for dims in (vit_l, toy):
        for spec in (grid, tokens):
            rows = chunk_rows(spec, resolve_tail(spec, dims))
            assert SHARD_ROWS % rows == 0
            assert rows == 1 or rows * np.prod(resolve_tail(spec, dims)) * 2 <= CHUNK_BYTES


def test_truncation_counts_at_the_context_boundary():
    """A context of 10 holds 8 BPE tokens besides sot and eot: a caption of exactly 8 is
    whole, one of 9 is cut, and cut it equals the first, so their item ties."""
    from types import SimpleNamespace

    from open_clip.tokenizer import _tokenizer

    from pipeline.extraction import _truncation

    captions = {"k8": " ".join(["red"] * 8), "k9": " ".join(["red"] * 9)}
    tokens = {k: _tokenizer.encode(t) for k, t in captions.items()}
    assert [len(t) for t in tokens.values()] == [8, 9]
    enc = SimpleNamespace(dims=SimpleNamespace(context_length=10))
    cells = [(SimpleNamespace(suite="s"), {"captions": ("text", [["k8", "k9"]])}, None)]
    assert _truncation(enc, cells, tokens) == {"s": {"n_truncated": 1, "n_truncation_ties": 1, "n_identical_options": 0}}
    same = [(SimpleNamespace(suite="s"), {"captions": ("text", [["k8", "k8"], ["k8", "k9"], ["k8"]])}, None)]
    assert _truncation(enc, same, tokens)["s"]["n_identical_options"] == 1  # one caption twice; a query is one
    shared = [(SimpleNamespace(suite="s"), {"captions": ("text", [["k9", "k8"], ["k9", "k8"]]), "other": ("text", [["k9"], ["k9"]])}, None)]
    assert _truncation(enc, shared, tokens)["s"]["n_truncated"] == 1  # a caption, however many items name it


def test_encoder_outputs_are_cast_to_their_stored_dtypes_as_numpy_casts_them():
    """``as_stored`` casts with torch; the store's bytes are the ones numpy's cast gives
    (round to nearest even, overflow to inf, float16 subnormals), so moving the cast did not
    change a stored byte."""
    from pipeline.extract_pixels import as_stored

    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.standard_normal(4000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 4000),
        np.float32([65504.0, 65519.0, 65520.0, -7e4, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1 + 2.0**-11]),
    ]).reshape(1, -1, 2)  # fmt: skip
    ids = torch.tensor([[49406, 320, 49407, 0]])
    with np.errstate(over="ignore"):
        want = values.astype(np.float16)
    got = as_stored("text", {"tokens": torch.from_numpy(values), "ids": ids, "mask": ids > 0, "embed": torch.ones(1, 3, dtype=torch.float64)})
    assert got["tokens"].dtype == np.float16 and np.array_equal(got["tokens"].view(np.uint16), want.view(np.uint16))
    assert got["ids"].dtype == np.int32 and got["ids"].tolist() == ids.tolist()
    assert got["mask"].dtype == np.bool_ and got["embed"].dtype == np.float32


def test_finite_rows_reads_float16_bits_as_isfinite_does():
    grid = np.ones((6, 3, 4), dtype=np.float16)
    grid[1, 2, 3], grid[2, 0, 0], grid[3, 1, 1], grid[4] = np.inf, -np.inf, np.nan, 65504
    want = [True, False, False, False, True, True]
    assert writer.finite_rows(grid).tolist() == want
    assert writer.finite_rows(grid.astype(np.float32)).tolist() == want


def test_a_batch_of_zeros_still_writes_every_chunk_file(tmp_path):
    """Rows written as zeros (undecodable images) get their chunk files like any others: the
    handles :func:`writer.row_arrays` opens write empty chunks, which zarr's defaults (what an
    array opened by name writes with) skip, leaving no file."""
    from pipeline.cache.integrity import file_rows, row_file_key
    from pipeline.cache.schema import IMAGE_ARRAYS

    dims = {"grid": [2, 2], "d_v": 8, "d_t": 8, "embed_dim": 4, "context_length": 8}
    root = writer.open_for_writing(tmp_path / "s.zarr", {"model": "zeros"}, dims)
    keys = np.arange(16 * 300, dtype=np.int64).astype(np.uint8).reshape(300, 16)
    keys[:, 0], keys[:, 1] = np.arange(300) % 256, np.arange(300) // 256  # distinct keys
    _, todo = writer.plan_rows(root, "image", keys)
    arrays = {"early": np.zeros((300, 5, 8), np.float32), "final": np.zeros((300, 5, 8), np.float32), "embed": np.zeros((300, 4), np.float32)}
    writer.write_rows(root, "image", todo, arrays, done=np.zeros(300, dtype=bool))
    for spec in IMAGE_ARRAYS:
        arr = root[spec.name]
        for i in range(-(-300 // file_rows(arr))):
            assert (tmp_path / "s.zarr" / row_file_key(arr, i)).is_file(), (spec.name, i)


def test_open_store_reads_and_checks_the_store_once(tmp_path, tiny_encoder, tiny_suite, monkeypatch):
    """``open_store`` computes the expected fingerprint from the opened store's own record
    and checks it on that store (:meth:`FeatureStore.expect`), instead of opening and
    checking every chunk a second time; another encoder's fingerprint is still refused."""
    from pipeline.cache import open_store
    from pipeline.cache.open import expected_fingerprint

    path, _ = tiny_suite
    cfg = _cfg(tmp_path, {"shapes-sugarcrepe": path})
    cfg.pretrained = "none"  # the tiny encoder's random init, as its store records
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    checked = []
    inner = FeatureStore._checked_root
    monkeypatch.setattr(FeatureStore, "_checked_root", staticmethod(lambda *a: checked.append(a) or inner(*a)))
    store = open_store(cfg)
    assert len(checked) == 1 and store.fingerprint == expected_fingerprint(store, cfg)
    assert store.expect(store.fingerprint) is store
    with pytest.raises(ForeignCacheError, match=r"pretrained.*pipeline extract"):
        store.expect({**store.fingerprint, "pretrained": "openai"})
