"""Bad inputs a new user found by hand (the second new-user trial of issue 24): each is
refused with one line naming the input and the fix, never run as something else."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.cache import CacheError, FeatureStore
from pipeline.cache.lock import (
    StoreLockedError,
    describe_holder,
    lock_path,
    read_holder,
    store_lock,
)
from pipeline.config import MAX_THREADS, ExtractConfig, ParamsError, ScoreConfig, load_config
from tests.test_bad_inputs import (  # noqa: F401  (good, images: fixtures)
    cli,
    good,
    images,
    item,
    metrics_of,
    ok,
    png_bytes,
    refused,
    write_manifest,
    write_params,
)
from tests.test_integrity import damaged, hold_lock, reference, world  # noqa: F401  (fixtures)

pytestmark = pytest.mark.bad_input


def params(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("extra,named", [("pretrained: none", "pretrained ('none')"), ("init_seed: 3", "init_seed (3)"),
                                          ("pretrained: /no/such/weights.bin", "pretrained ('/no/such/weights.bin')")])  # fmt: skip
def test_a_toy_model_refuses_real_models_weights_options(good, extra, named):  # noqa: F811 - the fixture
    """The toy CLIP always loads its trained checkpoint: a random-init or another weights file
    asked of it would silently give the trained model."""
    from pipeline.encoders import ENCODERS, check_toy_options
    from tests.test_bad_inputs import edited

    toy, options = ENCODERS.get("toy"), {"pretrained": "openai", "init_seed": 0, **yaml.safe_load(extra)}
    with pytest.raises(ValueError, match="toy CLIP: it loads the trained weights at extract.checkpoint") as e:
        check_toy_options(toy, options["pretrained"], options["init_seed"], "ck")
    assert named in str(e.value) and "leave them out" in str(e.value)
    _, params = good  # a suite of its own: the refusal comes before any checkpoint or world is needed
    refused(cli("extract", "--params", edited(params, "extract", model="toy", **options)), "toy CLIP", named)
    for default in (None, "openai", "toyclip"):  # the config's default and the toy's own tag stay accepted
        check_toy_options(toy, default, 0, "ck")


def test_more_threads_than_the_machine_can_use_are_refused(tmp_path):
    with pytest.raises(ParamsError, match=rf"threads = 100000.*less than or equal to {MAX_THREADS}"):
        load_config(ExtractConfig, params(tmp_path, "extract:\n  threads: 100000\n"), "extract")
    assert load_config(ExtractConfig, params(tmp_path, f"extract:\n  threads: {MAX_THREADS}\n"), "extract").threads == MAX_THREADS


def test_an_empty_store_folder_is_refused(tmp_path):
    refused(cli("extract", "--params", params(tmp_path, "extract:\n  model: toy\n"), "--out", ""), "out is empty")


def test_an_empty_report_folder_is_refused(tmp_path):
    """``report.out: ""`` would write report.md, figures/ and plots/ into the working folder."""
    refused(cli("report", "--params", params(tmp_path, "report:\n  out: ''\n")), "report.out", "out is empty")


def test_an_image_replacement_listed_twice_is_refused(tmp_path):
    with pytest.raises(ParamsError, match="shuffle more than once"):
        load_config(ScoreConfig, params(tmp_path, "score:\n  replacements: [shuffle, shuffle]\n"), "score")


@pytest.mark.parametrize("key", ["seed_variants", "replacement_variants"])
def test_a_misspelt_variant_in_a_score_list_names_the_params_file_and_key(tmp_path, key):
    path = params(tmp_path, f"score:\n  variants: [clip]\n  {key}: [clipp]\n")
    refused(cli("score", "--params", path, "--quiet"), f"error: {path}: score.{key} names unknown scorer(s) clipp; valid scorers: ", "bindclip")


@pytest.mark.parametrize("variant,named", [("clip", "not trained per seed"), ("ridge-fgw", "not trained per seed"),
                                            ("bindclip", "holds no finished training.s per-seed checkpoints .*run `pipeline train --variant bindclip`")])  # fmt: skip
def test_a_seed_variant_without_seeds_is_refused_not_skipped(tiny_store, tmp_path, monkeypatch, variant, named):
    """A ``score.seed_variants`` entry that is not trained per seed (clip, ridge-fgw) or has no
    finished per-seed checkpoints (bindclip) is refused before anything is scored."""
    from stages import score as score_stage

    monkeypatch.setattr(score_stage, "open_store", lambda extract: tiny_store)
    cfg = ScoreConfig(variants=list(dict.fromkeys(["clip", variant])), suites=["shapes-dev"], seed_variants=[variant], checkpoints=str(tmp_path / "ck"),
                      scores_out=str(tmp_path / "scores"), metrics_out=str(tmp_path / "metrics"))  # fmt: skip
    with pytest.raises(ValueError, match=f"score.seed_variants lists {variant}.*{named}"):
        score_stage.run(cfg, ExtractConfig(out=str(tmp_path / "store")), progress=False)
    assert not (tmp_path / "scores").exists()  # refused before anything is scored


@pytest.mark.parametrize("text", ["extract:\n", "extract: null\nscore:\n  device: cpu\n"])
def test_a_section_left_empty_is_refused_not_run_with_its_defaults(tmp_path, text):
    with pytest.raises(ParamsError, match=r"section `extract` is empty \(null\); give its keys, or delete the line"):
        load_config(ExtractConfig, params(tmp_path, text), "extract")


@pytest.mark.parametrize("content", [b"null", b"[1]", b'"x"', b"\xff\xfe not utf-8", b"{not json"])
def test_a_lock_file_holding_no_record_is_named_and_reclaimed(tmp_path, content):
    store = tmp_path / "x.zarr"
    lock_path(store).write_bytes(content)
    holder = read_holder(store)
    assert holder == {"unreadable": str(lock_path(store))}
    assert describe_holder(holder) == f"an unknown process (its lock file {lock_path(store)} holds no lock record)"
    with store_lock(store) as me:  # nobody holds the flock: the unreadable lock is stale and reclaimed
        assert me["pid"] == os.getpid()


def test_a_folder_where_the_lock_file_belongs_is_named_with_its_fix(tmp_path):
    store = tmp_path / "x.zarr"
    lock_path(store).mkdir()
    with pytest.raises(StoreLockedError, match=r"is a folder where the store's lock file belongs: remove that folder"), store_lock(store):
        pass


def test_a_store_an_extract_is_still_laying_out_is_reported_as_being_written(damaged):  # noqa: F811 (the fixture)
    """A fresh extract holds the lock while its arrays are being created: a reader meets a
    half-made store and is told an extract is writing it, not to delete it."""
    _, store = damaged
    shutil.rmtree(store / "text")  # the text arrays are not created yet
    holder = hold_lock(store)
    try:
        with pytest.raises(CacheError, match=rf"an extract \(pid {holder.pid} on .*\) is writing {store} now .* score once it finishes") as e:
            FeatureStore.open(store)
        assert "delete" not in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(CacheError, match="delete the store and rerun"):  # with no writer: the damage and its fix
        FeatureStore.open(store)


@pytest.mark.parametrize(
    "box,named",
    [([50.0, 50.0, 60.0, 60.0], "lies outside the 28x28 image"), ([0.0, 0.0, 0.0, 0.0], "empty or reversed"),
     ([5.0, 5.0, 2.0, 9.0], "empty or reversed"), ([1.0, 2.0, 3.0], "is not four finite numbers"),
     ([0.0, float("nan"), 5.0, 5.0], "is not four finite numbers"), ([0.0, 0.0, 1e9, 1e9], "decompression bomb")],
)  # fmt: skip
def test_a_bad_crop_box_is_refused_naming_the_image_or_skipped_and_counted(tmp_path, images, box, named):  # noqa: F811 - the fixture
    """A crop that is no box on its image would be encoded as black padding (or crash the
    resize): it is the item's fault, refused naming the image, or skipped and counted."""
    folder, names = images
    rows = [dict(item(i, n), crop_box=[0.0, 0.0, 20.0, 20.0]) for i, n in enumerate(names)]
    rows[3]["crop_box"] = box
    manifest = write_manifest(tmp_path / "m.parquet", rows)
    line = refused(cli("extract", "--params", write_params(tmp_path, manifest, folder), "--quiet"), "cannot be decoded", names[3], named)
    assert "crop_box" in line and "extract.skip_bad_images: true" in line
    skipping = write_params(tmp_path, manifest, folder, name="skip", skip_bad_images=True)
    ok(cli("extract", "--params", skipping, "--quiet"))
    ok(cli("score", "--params", skipping, "--quiet"))
    m = metrics_of(tmp_path)
    assert m["n_items"] == 7 and m["n_skipped"] == 1 and m["skipped"]["image_undecodable"] == 1


def test_a_crop_partly_outside_its_image_keeps_pils_padding():
    """The official crops (ARO's boxes) may run past the image's edge: PIL pads them black,
    as the benchmark's own code does, and the box is accepted."""
    from PIL import Image

    from pipeline.manifests import checked_crop, decode_image

    data = png_bytes(Image.new("RGB", (28, 28), (255, 0, 0)))
    img = decode_image(data, "red.png", [20.0, 20.0, 36.0, 36.0])
    assert img.size == (16, 16) and img.getpixel((2, 2)) == (255, 0, 0) and img.getpixel((12, 12)) == (0, 0, 0)
    assert checked_crop([0, 0, 28, 28], (28, 28), "x") == (0.0, 0.0, 28.0, 28.0)


def test_a_checkpoint_damaged_after_training_is_refused_naming_it(tiny_store, tmp_path):
    """Flipped bytes inside a tensor keep the file's size and header, so it loads; the sha256
    its config.json records when it is written does not match, and the scorer is refused."""
    from safetensors.torch import save_file

    from pipeline.scorers import create_scorer
    from pipeline.scorers.checkpoints import WEIGHTS_KEY, load_scorer, weights_sha256_of

    folder = tmp_path / "global-m"
    folder.mkdir()
    scorer = create_scorer("global-m", dims=tiny_store.dims, proj=tiny_store.projections())
    save_file({k: v.contiguous() for k, v in scorer.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"scorer_kwargs": {}, WEIGHTS_KEY: weights_sha256_of(folder)}))
    load_scorer("global-m", tiny_store, tmp_path)  # sound
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])  # the last tensor's last bytes
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors \(global-m\) is not the file its config\.json records .* rerun `pipeline train --variant global-m`"):
        load_scorer("global-m", tiny_store, tmp_path)


@pytest.mark.parametrize("text,named", [("[" * 100_000 + "]" * 100_000, "nested deeper than Python can read"),
                                        ('{"0": ' + "9" * 5000 + "}", "unreadable JSON")])  # fmt: skip
def test_pathological_json_names_the_file(tmp_path, text, named):
    from pipeline.benchmarks.intake import read_json

    path = tmp_path / "ann.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: .*{named}"):
        read_json(path)


def test_a_byte_order_mark_before_official_json_is_read(tmp_path):
    from pipeline.benchmarks.intake import read_json

    path = tmp_path / "ann.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"0": {"caption": "a cat"}}')
    assert read_json(path)["0"]["caption"] == "a cat"


def test_a_manifest_that_is_not_parquet_names_the_file_and_what_it_must_be(tmp_path):
    from pipeline.manifests import read_manifest

    path = tmp_path / "params.yaml"
    path.write_text("extract: {}\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not a Parquet manifest .*extract\.manifests"):
        read_manifest(path)


@pytest.mark.parametrize("array", ["image/embed", "image/final"])
def test_an_edited_byte_order_is_refused_at_open(damaged, array):  # noqa: F811 - the fixture
    """A zarr.json edited to another byte order would read every value as garbage (NaN
    scores or, worse, finite wrong ones): refused at open, naming the array."""
    from pipeline.cache.integrity import CorruptStoreError

    _, store = damaged
    meta = store / array / "zarr.json"
    text = meta.read_text()
    assert '"endian": "little"' in text
    meta.write_text(text.replace('"endian": "little"', '"endian": "big"'))
    with pytest.raises(CorruptStoreError, match=rf"{array} declares byte order big; extract writes little-endian"):
        FeatureStore.open(store)


def test_score_on_a_cluster_refuses_a_missing_store_before_any_worker_starts(good, monkeypatch):  # noqa: F811 - the fixture
    """The store is checked on the client: no cluster starts, so no worker logs a traceback
    before the one line."""
    import pipeline.distributed

    monkeypatch.setattr(pipeline.distributed, "cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    _, params = good
    refused(cli("score", "--params", params, "--scheduler", "local:2", "--quiet"), "no feature store at", "pipeline extract")


@pytest.mark.parametrize("where", ["app", "command"])
def test_ctrl_c_prints_how_to_resume_and_exits_130(monkeypatch, capsys, tmp_path, where):
    """A Ctrl-C around the app or inside a real command (which the installed typer may catch
    itself and turn into exit code 130) prints how to resume and exits 130."""
    import pipeline.cli
    import stages.extract

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.cli, "app", interrupted) if where == "app" else monkeypatch.setattr(stages.extract, "run", interrupted)
    params = tmp_path / "params.yaml"
    params.write_text("extract:\n  model: tiny-vit\n  pretrained: none\n")
    with pytest.raises(SystemExit) as e:
        pipeline.cli.run(["extract", "--params", str(params), "--quiet"])
    assert e.value.code == 130
    assert "interrupted: rerun the same command; an extract resumes where it stopped" in capsys.readouterr().err
