"""Bad inputs found by the sixth new-user trial (issue 24): the lock taken before the model
loads, undecodable images skipped or refused with every file named, the toy model's
misleading open_clip warning, and every missing manifest root named at once."""

from __future__ import annotations

import logging
import shutil

import pytest

from pipeline.cache import FeatureStore, store_lock, store_path
from pipeline.config import ExtractConfig, ManifestsConfig, load_config
from tests import test_bad_inputs
from tests.stores import file_bytes
from tests.test_bad_inputs import (
    SUITE,
    bomb_png,
    cli,
    extract_and_score,
    item,
    ok,
    refused,
    with_image,
    write_manifest,
    write_params,
)

pytestmark = pytest.mark.bad_input
good = test_bad_inputs.good  # the battery's fixtures: a clean eight-item manifest and its params,
images = test_bad_inputs.images  # and its eight good 28-pixel images


def test_a_second_extract_is_refused_before_its_model_loads(good, monkeypatch):
    """The second writer loaded its encoder (minutes for ViT-L-14-336) before the lock
    refused it."""
    import pipeline.extraction as extraction

    _, params = good
    monkeypatch.setattr(extraction, "load_encoder", lambda *a, **k: pytest.fail("the model loaded before the lock"))
    with store_lock(store_path(load_config(ExtractConfig, params, "extract"))):
        refused(cli("extract", "--params", params, "--quiet"), "is being written by pid")


def test_a_skipped_image_is_named_and_recorded_without_the_advice_to_skip_it(tmp_path, images, caplog):
    """With extract.skip_bad_images on, the screen named no skipped file, and the reason the
    store recorded still said "or skip it (extract.skip_bad_images: true)"."""
    params = with_image(tmp_path, images, "bomb.png", bomb_png(), skip_bad_images=True)
    with caplog.at_level(logging.WARNING):
        m = extract_and_score(params)
    assert m["skipped"] == {"image_missing": 0, "image_undecodable": 1}
    assert f"skipping 1 undecodable image(s) (extract.skip_bad_images); each suite's record lists them with the reason, and every metrics file counts their items: {SUITE}: bomb.png" in caplog.text
    store = FeatureStore.open(store_path(load_config(ExtractConfig, params, "extract")))
    (reason,) = store.suite_attrs(SUITE)["bad_images"].values()
    assert "decompression bomb" in reason and reason.endswith("; shrink the image")


def test_a_refusal_of_many_bad_images_logs_every_one(tmp_path, images, caplog):
    """The refusal's one line lists three files and "..."; the others were named nowhere."""
    folder = tmp_path / "images"
    shutil.copytree(images[0], folder)
    bad = [f"bad{i}.png" for i in range(5)]
    for i, name in enumerate(bad):
        (folder / name).write_bytes(b"not an image %d" % i)
    rows = [item(i, n) for i, n in enumerate(images[1] + bad)]
    params = write_params(tmp_path, write_manifest(tmp_path / "m.parquet", rows), folder)
    with caplog.at_level(logging.ERROR):
        refused(cli("extract", "--params", params, "--quiet"), "5 image(s) cannot be decoded", " ...) (every one is logged above)")
    for name in bad:
        assert f"{SUITE}: corrupt or unreadable image: {folder / name}" in caplog.text


def test_a_rerun_over_a_skipped_image_changes_no_byte_of_the_store(tmp_path, images, monkeypatch):
    """Every rerun encoded the undecodable image again in a batch of its own, wrote its blank
    image's features (other floats than the first run's batch gave) and marked the store
    updated, so `dvc repro` reran every stage after extract."""
    from pipeline.cache import writer

    params = with_image(tmp_path, images, "cut.png", b"\x89PNG\r\n\x1a\n cut", skip_bad_images=True)
    ok(cli("extract", "--params", params, "--quiet"))
    store = store_path(load_config(ExtractConfig, params, "extract"))
    before = file_bytes(store)
    stamps = []
    monkeypatch.setattr(writer, "finalize", stamps.append)  # the stamp has one-second resolution
    ok(cli("extract", "--params", params, "--quiet"))
    assert not stamps
    assert file_bytes(store) == before


def test_toy_and_seeded_random_models_do_not_repeat_open_clip_s_random_init_warning(caplog):
    """Every toy command logged open_clip's "No pretrained weights loaded ... initialized
    randomly" although the toy checkpoint loads right after; the filter is gone afterwards."""
    import open_clip

    from pipeline.encoders import create_model

    with caplog.at_level(logging.WARNING):
        create_model("tiny-vit")
        assert "No pretrained weights loaded" not in caplog.text
        open_clip.create_model("tiny-vit")  # the message the filter drops, as open_clip words it
        assert "No pretrained weights loaded for model 'tiny-vit'" in caplog.text
        logging.getLogger().warning("No pretrained weights loaded for model 'x'")
    assert "No pretrained weights loaded for model 'x'" in caplog.text


def test_every_missing_manifest_root_is_named_at_once(tmp_path):
    """A first real run without data named only the first of up to fourteen roots."""
    from stages import manifests as stage

    cfg = ManifestsConfig(roots={"aro-relation": str(tmp_path / "aro"), "whatsup-a": str(tmp_path / "whatsup"), "sugarcrepe": str(tmp_path)}, out=str(tmp_path / "m"))
    with pytest.raises(FileNotFoundError, match=rf"2 folders of manifests.roots do not exist: aro-relation \({tmp_path}/aro\), whatsup-a \({tmp_path}/whatsup\); "):
        stage.run(cfg)
