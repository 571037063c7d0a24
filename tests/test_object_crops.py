"""Re-encoded object crops (``extract.object_crops``): the ``object/*`` arrays and their
suite index, their parity with a direct forward pass, the store with the option off, and
the geometry rerankers and ridge map reading them (``objects: crops``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from pipeline.benchmarks import SUITES, Suite
from pipeline.benchmarks.retrieval import RETRIEVAL_METRICS, retrieval_units
from pipeline.cache import (
    CacheError,
    FeatureStore,
    ForeignCacheError,
    StaleCacheError,
    open_store,
    store_path,
)
from pipeline.cache.schema import (
    IMAGE_ARRAYS,
    OBJECT_ARRAYS,
    TEXT_ARRAYS,
    encoder_id,
    fingerprint_id,
)
from pipeline.config import ExtractConfig, RidgeConfig
from pipeline.extract_pixels import crop_to_box
from pipeline.manifests import decode_image
from pipeline.scorers import create_scorer
from pipeline.scorers.geometry.objects import check_source, item_objects
from pipeline.scorers.geometry.ridge import fit, training_pairs
from pipeline.scoring import score_retrieval, suite_inputs
from stages import extract as extract_stage
from tests.conftest import make_images

pytestmark = pytest.mark.usefixtures("single_thread")

SUITE = "crops-test"
N = 24  # images = queries; 3 objects each: 72 crops, more than one 64-row shard
WHOLE = [0.0, 0.0, 1.0, 1.0]  # item 0's first box: the whole image
COLOURS = ["red", "green", "blue", "yellow"]
SHAPES = ["circle", "square", "star", "cross"]


def _manifest(names: list[str]) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for i, img in enumerate(names):
        words = [f"{c} {s}" for c, s in zip(rng.choice(COLOURS, 3), rng.choice(SHAPES, 3, replace=False), strict=True)]
        x = rng.uniform(0.05, 0.2)
        boxes = [[x, 0.3, x + 0.2, 0.5], [x + 0.3, 0.4, x + 0.5, 0.7], [x + 0.6, 0.1, x + 0.75, 0.3]]
        if i == 0:
            boxes[0] = WHOLE
        rows.append({
            "item_id": f"q{i}", "image": img, "captions": [f"a {words[0]} left of a {words[1]}"],
            "correct": 0, "category": "retrieval", "object_names": words,
            "object_boxes": json.dumps(boxes), "phrases": words[:2], "relations": json.dumps([[0, "left", 1]]),
        })  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """(folder, manifest path) of a retrieval suite with object columns, registered as SUITE."""
    tmp = tmp_path_factory.mktemp("crops")
    _manifest(make_images(tmp / "images", N)).to_parquet(tmp / "m.parquet", index=False)
    SUITES.names()
    SUITES.register(SUITE, Suite(
        name=SUITE, task="retrieval", build_manifest=lambda root: pd.read_parquet(root),
        units=retrieval_units, metric_names=RETRIEVAL_METRICS, headline="R@1",
        caption_columns=("captions", "object_names", "phrases"),
    ))  # fmt: skip
    yield tmp, tmp / "m.parquet"
    SUITES._entries.pop(SUITE)


def _cfg(suite, out, crops: bool, batch_size: int = 16) -> ExtractConfig:
    tmp, manifest = suite
    return ExtractConfig(model="tiny-test", suites=[SUITE], manifests={SUITE: str(manifest)},
                         image_roots={SUITE: str(tmp / "images")}, out=str(out), batch_size=batch_size,
                         pretrained="none", object_crops=crops)  # fmt: skip


@pytest.fixture(scope="module")
def crops_store(suite, tiny_encoder, tmp_path_factory):
    """(cfg, extract summary, store) of SUITE extracted with object crops."""
    cfg = _cfg(suite, tmp_path_factory.mktemp("on") / "features", crops=True)
    summary = extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    return cfg, summary, FeatureStore.open(store_path(cfg))


@pytest.fixture(scope="module")
def plain_store(suite, tiny_encoder, tmp_path_factory):
    """(cfg, store) of SUITE extracted with the option off (the default)."""
    cfg = _cfg(suite, tmp_path_factory.mktemp("off") / "features", crops=False)
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    return cfg, FeatureStore.open(store_path(cfg))


def _arrays(store: FeatureStore) -> set[str]:
    return {name for name, member in store.root.members(max_depth=None) if hasattr(member, "dtype")}


def test_crops_are_written_one_row_per_object_with_its_index(crops_store):
    _, summary, store = crops_store
    manifest, index = suite_inputs(store, SUITE)
    boxes = [np.array(json.loads(b)) for b in manifest["object_boxes"]]
    assert summary["objects"] == {"total": 3 * N, "encoded": 3 * N}
    assert store.has_object_crops and store.fingerprint["object_crops"] is True
    assert store.suite_attrs(SUITE)["kinds"]["object_crops"] == "object"
    rows = index["object_crops"]  # [n_items, K]
    assert rows.shape == (N, 3) and (rows >= 0).all()
    assert len(np.unique(rows)) == 3 * N == store.root["object/embed"].shape[0]
    assert store.root["object/done"][:].all()
    # each row records the image it was cut from and its box, in object_boxes order
    np.testing.assert_array_equal(store.root["object/image"][:][rows], np.repeat(index["image"][:, :1], 3, axis=1))
    np.testing.assert_allclose(store.root["object/box"][:][rows], np.stack(boxes), rtol=0, atol=1e-6)
    assert store.objects(rows[:, 0]).shape == (N, store.dims.embed_dim)


def test_a_whole_image_crop_is_the_image_itself(crops_store):
    _, _, store = crops_store
    _, index = suite_inputs(store, SUITE)
    whole = store.objects(index["object_crops"][:1, 0])  # item 0's first box is (0, 0, 1, 1)
    image = store.images(index["image"][:1, 0], grids=False).embed
    torch.testing.assert_close(whole, image, rtol=1e-5, atol=1e-5)


def test_stored_crops_equal_encoding_the_crops_directly(crops_store, tiny_encoder):
    cfg, _, store = crops_store
    manifest, index = suite_inputs(store, SUITE)
    root = Path(cfg.image_roots[SUITE])
    crops, want_rows = [], []
    for i in (1, 7, N - 1):
        img = decode_image((root / manifest["image"][i]).read_bytes(), manifest["image"][i])
        for j, box in enumerate(json.loads(manifest["object_boxes"][i])):
            crops.append(tiny_encoder.preprocess(crop_to_box(img, box)))
            want_rows.append(index["object_crops"][i, j])
    direct = tiny_encoder.encode_images(torch.stack(crops))["embed"]  # [9, D]
    torch.testing.assert_close(store.objects(np.array(want_rows)), direct, rtol=1e-5, atol=1e-5)


def test_decoding_and_writing_in_turn_write_the_same_store(crops_store, suite, tiny_encoder, tmp_path):
    """A CPU worker's extract (``overlap=False``: loader and writer in the calling thread)
    writes every array (images, crops, captions, done flags) as the overlapped one does."""
    from pipeline.extraction import extract

    cfg = _cfg(suite, tmp_path / "features", crops=True)
    summary = extract(cfg, progress=False, encoder=tiny_encoder, overlap=False)
    assert summary["objects"]["encoded"] == 3 * N
    ref, serial = crops_store[2].root, FeatureStore.open(store_path(cfg)).root
    names = sorted(_arrays(crops_store[2]))
    assert {"image/done", "object/done", "text/done"} <= set(names) and names == sorted(_arrays(FeatureStore.open(store_path(cfg))))
    for name in names:
        np.testing.assert_array_equal(serial[name][...], ref[name][...], err_msg=name)


def test_in_caller_helper_runs_at_once_and_keeps_a_failure_for_result():
    from pipeline.extract_pixels import helper

    ran = []
    with helper(False) as pool:
        done = pool.submit(ran.append, 1)
        assert ran == [1] and done.done() and done.result() is None
        failed = pool.submit(lambda: 1 / 0)
        assert failed.done()
        with pytest.raises(ZeroDivisionError):
            failed.result()

        def interrupted():
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):  # a Ctrl-C in the calling thread stops it at once
            pool.submit(interrupted)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(ran.append, 2)
    assert ran == [1]


def test_crop_to_box_rounds_outwards_and_keeps_a_pixel():
    from PIL import Image

    img = Image.new("RGB", (56, 40))
    assert crop_to_box(img, WHOLE).size == (56, 40)
    assert crop_to_box(img, [0.1, 0.1, 0.2, 0.2]).size == (12 - 5, 8 - 4)  # floor(5.6)..ceil(11.2)
    assert crop_to_box(img, [0.5, 0.5, 0.5, 0.5]).size == (1, 1)  # a degenerate box: one pixel
    assert crop_to_box(img, [1.0, 1.0, 1.0, 1.0]).size == (1, 1)  # ... inside the image


def test_option_off_leaves_the_store_as_it_was(crops_store, plain_store, tiny_encoder):
    _, _, on = crops_store
    _, off = plain_store
    specs = {s.name for s in IMAGE_ARRAYS + TEXT_ARRAYS}
    assert _arrays(off) - specs == {f"params/{n}" for n in ("visual_proj", "text_projection", "logit_scale")} | {
        f"suites/{SUITE}/{c}" for c in ("image", "captions", "object_names", "phrases")
    }  # fmt: skip
    assert _arrays(on) - _arrays(off) == {s.name for s in OBJECT_ARRAYS} | {f"suites/{SUITE}/object_crops"}
    assert "object_crops" not in off.fingerprint and not off.has_object_crops
    assert off.fingerprint == tiny_encoder.fingerprint()  # the encoder's, nothing added
    assert off.root.attrs["fingerprint_id"] == fingerprint_id(tiny_encoder.fingerprint())
    assert on.fingerprint == {**off.fingerprint, "object_crops": True}
    for name in sorted(specs - {"image/key", "text/key"}):
        np.testing.assert_array_equal(on.root[name][:], off.root[name][:])


def test_switching_crops_on_adds_them_and_switching_off_keeps_them(suite, tiny_encoder, tmp_path):
    off = _cfg(suite, tmp_path / "features", crops=False)
    extract_stage.run(off, progress=False, encoder=tiny_encoder)
    with pytest.raises(ForeignCacheError, match="extract.object_crops: true"):
        open_store(_cfg(suite, tmp_path / "features", crops=True))  # asked for, absent
    on = _cfg(suite, tmp_path / "features", crops=True)
    summary = extract_stage.run(on, progress=False, encoder=tiny_encoder)
    assert summary["images"]["encoded"] == 0 and summary["objects"]["encoded"] == 3 * N
    store = open_store(on)
    assert store.has_object_crops and encoder_id(store.fingerprint) == fingerprint_id(tiny_encoder.fingerprint())
    before = suite_inputs(store, SUITE)[1]["object_crops"]
    # an extract without the option keeps the crops and, for the same manifest, their index
    assert "objects" not in extract_stage.run(off, progress=False, encoder=tiny_encoder)
    store = open_store(off)  # a store with crops serves a configuration without them
    np.testing.assert_array_equal(suite_inputs(store, SUITE)[1]["object_crops"], before)
    assert store.suite_attrs(SUITE)["kinds"]["object_crops"] == "object"
    # ... and drops it once the manifest changed (its rows would describe the old boxes)
    manifest = pd.read_parquet(suite[1])
    manifest.loc[0, "category"] = "edited"
    changed = tmp_path / "changed.parquet"
    manifest.to_parquet(changed, index=False)
    off.manifests = {SUITE: str(changed)}
    extract_stage.run(off, progress=False, encoder=tiny_encoder)
    store = open_store(off)
    assert "object_crops" not in suite_inputs(store, SUITE)[1]
    assert "object_crops" not in store.suite_attrs(SUITE)["kinds"]


def test_switching_crops_on_killed_before_they_are_recorded_leaves_a_store_that_reads_and_resumes(
    suite, tiny_encoder, tmp_path, monkeypatch, crops_store
):
    """The object arrays are created before the fingerprint records them: an extract killed
    in between leaves the store it found (readable, no crops), and its next run finishes."""
    import pipeline.cache.writer as writer

    off, on = (_cfg(suite, tmp_path / "features", crops=c) for c in (False, True))
    extract_stage.run(off, progress=False, encoder=tiny_encoder)
    real, made = writer._create, []

    def killed_at_the_second_object_array(root, spec, tail):
        if spec.name.startswith("object/") and made:
            raise KeyboardInterrupt("simulated kill")
        made.append(spec.name)
        return real(root, spec, tail)

    monkeypatch.setattr(writer, "_create", killed_at_the_second_object_array)
    with pytest.raises(KeyboardInterrupt):
        extract_stage.run(on, progress=False, encoder=tiny_encoder)
    monkeypatch.setattr(writer, "_create", real)
    store = open_store(off)  # the half-made object group is not the store's yet
    assert not store.has_object_crops and len(made) == 1
    assert extract_stage.run(on, progress=False, encoder=tiny_encoder)["objects"]["encoded"] == 3 * N
    store, (_, _, clean) = open_store(on), crops_store
    rows, clean_rows = suite_inputs(store, SUITE)[1]["object_crops"], suite_inputs(clean, SUITE)[1]["object_crops"]
    torch.testing.assert_close(store.objects(rows.reshape(-1)), clean.objects(clean_rows.reshape(-1)))


def test_an_undecodable_image_counts_once_and_leaves_its_crops_unindexed(suite, tiny_encoder, tmp_path):
    """skip_bad_images with crops on: the summary counts the one bad image (not its three
    crops too), and the item's crop cells are -1 like its image cell."""
    import shutil

    folder = tmp_path / "images"
    shutil.copytree(suite[0] / "images", folder)
    name = pd.read_parquet(suite[1])["image"][0]
    (folder / name).write_bytes(b"\x89PNG\r\n\x1a\n not a png")
    cfg = _cfg(suite, tmp_path / "features", crops=True)
    cfg.image_roots, cfg.skip_bad_images = {SUITE: str(folder)}, True
    summary = extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    assert summary["skipped_images"] == {"missing": 0, "bad": 1}
    index = suite_inputs(open_store(cfg), SUITE)[1]
    assert (index["image"][0] == -1).all() and (index["object_crops"][0] == -1).all()
    assert (index["object_crops"][1:] >= 0).all()


def test_an_interrupted_crop_extract_resumes(suite, tiny_encoder, tmp_path, monkeypatch, crops_store):
    import pipeline.extract_pixels as extract_pixels

    cfg = _cfg(suite, tmp_path / "features", crops=True)
    calls = {"n": 0}
    real = extract_pixels.crop_to_box

    def crashing(img, box):
        calls["n"] += 1
        if calls["n"] == 70:  # inside the second 64-row shard
            raise KeyboardInterrupt("simulated crash")
        return real(img, box)

    monkeypatch.setattr(extract_pixels, "crop_to_box", crashing)
    with pytest.raises(KeyboardInterrupt):
        extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    store = FeatureStore.open(store_path(cfg))
    assert store.root["object/done"][:].sum() == 64  # the first shard survived whole
    with pytest.raises(StaleCacheError, match="interrupted"):
        store.objects(np.arange(3 * N))
    monkeypatch.setattr(extract_pixels, "crop_to_box", real)
    assert extract_stage.run(cfg, progress=False, encoder=tiny_encoder)["objects"]["encoded"] == 3 * N - 64
    store, (_, _, clean) = FeatureStore.open(store_path(cfg)), crops_store
    rows, clean_rows = suite_inputs(store, SUITE)[1]["object_crops"], suite_inputs(clean, SUITE)[1]["object_crops"]
    torch.testing.assert_close(store.objects(rows.reshape(-1)), clean.objects(clean_rows.reshape(-1)))


def _scorer(name, store, **kw):
    return create_scorer(name, dims=store.dims, proj=store.projections(), **kw).eval()


def test_rerankers_with_objects_crops_read_the_crops(crops_store):
    _, _, store = crops_store
    manifest, index = suite_inputs(store, SUITE)
    crops = _scorer("fgw", store, k=8, objects="crops")
    scores = score_retrieval(crops, store, manifest, index, 256, suite=SUITE)
    want = F.normalize(store.objects(index["object_crops"].reshape(-1)), dim=-1).reshape(N, 3, -1)
    torch.testing.assert_close(crops._gallery.embed, want)  # one gallery image per row, in order
    assert crops._gallery.mask.all()
    box = _scorer("fgw", store, k=8)
    boxed = score_retrieval(box, store, manifest, index, 256, suite=SUITE)
    torch.testing.assert_close(crops._gallery.pos, box._gallery.pos)  # positions: box centres
    assert np.isfinite(scores).all() and not np.allclose(scores, boxed)
    # the ridge map fits on the crops and ridge-fgw then reads them
    _, obj, _ = training_pairs(store, manifest, index, SUITE, objects="crops")
    torch.testing.assert_close(obj, want.reshape(3 * N, -1))


def test_crops_are_placed_in_the_box_means_frame_on_a_wide_image(crops_store):
    """On a 2:1 image (``image_size``) the grid sees the centre square: box means place their
    objects in that view, and the crops, which keep every object, are placed in the same
    frame (unclipped), not at centres normalised by width and height apart, which would
    halve every horizontal offset against the vertical ones."""
    _, _, store = crops_store
    manifest, index = suite_inputs(store, SUITE)
    wide = manifest.assign(image_size=[(800, 400)] * len(manifest))
    rows = np.arange(len(wide))
    crops = item_objects(store, wide, index, rows, SUITE, objects="crops")
    boxed = item_objects(store, wide, index, rows, SUITE)
    for g in rows:
        raw = np.array(json.loads(wide["object_boxes"].iloc[g]))
        centres = (raw[:, :2] + raw[:, 2:]) / 2
        want = np.stack([centres[:, 0] * 2 - 0.5, centres[:, 1]], axis=1)  # x: the centre 400 px of 800
        torch.testing.assert_close(crops.pos[g, :3], torch.tensor(want, dtype=torch.float32))
        seen = (raw[:, 2] * 2 - 0.5 > 0) & (raw[:, 0] * 2 - 0.5 < 1)  # some area inside the view
        shown = int(boxed.mask[g].sum())
        assert shown == seen.sum() and 0 < shown
        inside = (raw[seen, 0] * 2 - 0.5 >= 0) & (raw[seen, 2] * 2 - 0.5 <= 1)  # whole in the view: same centre
        torch.testing.assert_close(boxed.pos[g, :shown][inside], crops.pos[g, :3][seen][inside])


def test_the_ridge_stage_fits_on_crops_and_scoring_reads_them(crops_store, tmp_path):
    from pipeline.scorers.checkpoints import load_scorer

    _, _, store = crops_store
    manifest, index = suite_inputs(store, SUITE)
    record = fit(RidgeConfig(suite=SUITE, out=str(tmp_path), objects="crops"), store, manifest, index, store.suite_attrs(SUITE)["manifest_sha256"])
    assert record["objects"] == "crops" and set(record["heldout_auc"]) == {"crops"}
    width = min(record["rank"] or store.dims.embed_dim, store.dims.embed_dim)
    assert record["scorer_kwargs"] == {"layer": "final", "rank": width, "beta": record["beta"], "n_reference": record["scorer_kwargs"]["n_reference"], "objects": "crops"}
    assert record["scorer_kwargs"]["n_reference"] > 0
    scorer = load_scorer("ridge-fgw", store, tmp_path)
    assert scorer.objects == "crops" and scorer.weight.shape == (store.dims.embed_dim, store.dims.embed_dim)
    assert np.isfinite(score_retrieval(scorer, store, manifest, index, 256, suite=SUITE)).all()


def test_missing_crops_name_the_option(plain_store, crops_store):
    _, store = plain_store
    manifest, index = suite_inputs(store, SUITE)
    with pytest.raises(CacheError, match="extract.object_crops: true"):
        score_retrieval(_scorer("fgw", store, objects="crops"), store, manifest, index, 256, suite=SUITE)
    with pytest.raises(CacheError, match="extract.object_crops: true"):
        training_pairs(store, manifest, index, SUITE, objects="crops")
    with pytest.raises(CacheError, match="extract.object_crops: true"):
        store.objects(np.arange(3))
    # a store with crops whose suite index has none (a suite extracted before the option)
    _, _, with_crops = crops_store
    manifest, index = suite_inputs(with_crops, SUITE)
    no_index = {k: v for k, v in index.items() if k != "object_crops"}
    with pytest.raises(CacheError, match=f"index of {SUITE} has none.*extract.object_crops: true"):
        item_objects(with_crops, manifest, no_index, np.arange(2), SUITE, objects="crops")
    rolled = {**index, "object_crops": np.roll(index["object_crops"], 1, axis=0)}  # another image's crops
    with pytest.raises(StaleCacheError, match="do not match their object_boxes"):
        item_objects(with_crops, manifest, rolled, np.arange(N), SUITE, objects="crops")
    with pytest.raises(ValueError, match="valid: box-mean, crops"):
        check_source("patches")
    with pytest.raises(ValueError, match="box means only"):
        _scorer("fgw", with_crops, objects="crops", layer="early")
