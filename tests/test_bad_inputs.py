"""The bad-input battery: one bad input each, given to the real ``pipeline`` command, is
either refused with one clear line (naming the input and the fix, a non-zero exit, no
traceback) or skipped, counted and reported (``n_skipped`` and ``skipped`` in the metrics
file ``pipeline score`` writes).

Everything runs on ``tiny-vit`` at random init (``pretrained: none``) over a few generated
28-pixel images; damaged stores, NaN features and the write lock are
``tests/test_integrity.py``'s.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner, Result

from pipeline.cli import app
from pipeline.manifests import decode_image
from tests.conftest import make_images

pytestmark = [
    pytest.mark.bad_input,
    pytest.mark.filterwarnings("ignore:SugarCrepe.*lacks:UserWarning"),  # one category file of seven
]

ROOT = Path(__file__).resolve().parents[1]
SUITE = "shapes-sugarcrepe"
runner = CliRunner()


# ---------------------------------------------------------------- helpers


def cli(*args: object) -> Result:
    """``pipeline ARGS`` in this process (click's runner: stdout and stderr both in ``output``)."""
    return runner.invoke(app, [str(a) for a in args])


def refused(result: Result, *names: str) -> str:
    """The one ``error:`` line of a refused command, checked: exit 1 through the CLI's own
    handler (an uncaught exception is a bug), no traceback, the whole message on that line
    (the last of stderr), and every ``names`` in it."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    assert result.stderr.splitlines()[-1] == lines[0], result.stderr
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    return lines[0]


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result


def item(i: int, image: str, captions: list[str] | None = None) -> dict:
    """One shapes-sugarcrepe manifest row."""
    colours, shapes = ["red", "green", "blue", "yellow"], ["circle", "square", "star", "cross"]
    c1, c2, s1, s2 = colours[i % 4], colours[(i + 1) % 4], shapes[i % 4], shapes[(i + 2) % 4]
    return {
        "item_id": f"it{i}",
        "image": image,
        "captions": captions or [f"a {c1} {s1} and a {c2} {s2}", f"a {c2} {s1} and a {c1} {s2}"],
        "correct": 0,
        "category": ["swap-att", "replace-obj"][i % 2],
        "length_matched": True,
    }


def write_manifest(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def write_params(tmp: Path, manifest: Path, images: Path, name: str = "params", **extract: object) -> Path:
    """A params.yaml whose extract (tiny-vit, random init) and score (clip) sections read
    ``manifest`` over ``images`` and write under ``tmp``."""
    doc = {
        "extract": {
            "model": "tiny-vit", "pretrained": "none", "init_seed": 0, "suites": [SUITE],
            "manifests": {SUITE: str(manifest)}, "image_roots": {SUITE: str(images)},
            "out": str(tmp / "features"), "batch_size": 16, "threads": 1, **extract,
        },
        "score": {
            "encoder": "tiny-vit", "variants": ["clip"], "suites": [SUITE],
            "scores_out": str(tmp / "scores"), "metrics_out": str(tmp / "metrics"),
        },
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def metrics_of(tmp: Path) -> dict:
    return json.loads((tmp / "metrics" / "clip" / f"{SUITE}.json").read_text())


def extract_and_score(params: Path) -> dict:
    """``pipeline extract`` then ``pipeline score`` on ``params``; the metrics record."""
    ok(cli("extract", "--params", params, "--quiet"))
    ok(cli("score", "--params", params, "--quiet"))
    return metrics_of(params.parent)


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[Path, list[str]]:
    """A folder of eight good 28-pixel images and their names."""
    folder = tmp_path_factory.mktemp("images")
    return folder, make_images(folder, 8, size=28)


@pytest.fixture
def good(tmp_path, images) -> tuple[Path, Path]:
    """A clean eight-item manifest and its params (nothing extracted yet)."""
    folder, names = images
    manifest = write_manifest(tmp_path / "m.parquet", [item(i, n) for i, n in enumerate(names)])
    return manifest, write_params(tmp_path, manifest, folder)


def edited(params: Path, section: str, **values: object) -> Path:
    """``params`` rewritten with ``values`` set in its ``section``."""
    doc = yaml.safe_load(params.read_text())
    doc[section].update(values)
    params.write_text(yaml.safe_dump(doc))
    return params


# ---------------------------------------------------------------- params


@pytest.mark.parametrize(
    "text,needles",
    [
        ("  batch_size: eight\n", ["extract.batch_size", "'eight'", "expected a valid integer"]),
        ("  batch_size: 0\n", ["extract.batch_size = 0", "expected greater than 0"]),
        ("  skip_missing: 'no'\n", ["extract.skip_missing", "'no'", "expected a valid boolean"]),
        ("  suites: sugarcrepe\n", ["extract.suites", "'sugarcrepe'", "expected a valid array"]),
        ("  batch_sise: 8\n", ["unknown key extract.batch_sise", "batch_size"]),
    ],
    ids=["batch_size-eight", "batch_size-zero", "skip_missing-quoted-no", "suites-string", "typo-key"],
)
def test_bad_params_value_is_named(tmp_path, text, needles):
    params = tmp_path / "params.yaml"
    params.write_text("extract:\n  model: tiny-vit\n  pretrained: none\n" + text)
    refused(cli("extract", "--params", params, "--quiet"), str(params), *needles)


@pytest.mark.parametrize(
    "text,needles",
    [
        ("extract:\n  model: tiny-vit\n  batch_size: 8\n  batch_size: 9\n", ["key 'batch_size' is written twice", "line 4"]),
        ("extrct:\n  model: tiny-vit\n", ["unknown section extrct", "valid: world"]),
        ("extract:\n  model: tiny-vit\n  manifests: {sugarcrep: m.parquet}\n", ["extract.manifests names unknown suite(s) sugarcrep", "pipeline suites"]),
        ("extract:\n  model: tiny-vit\n  image_roots: {sugarcrep: images}\n", ["image_roots names unknown suite(s) sugarcrep"]),
        ("extract:\n  model: tiny-vit\n  batch_size: 99999999999999999999\n", ["extract.batch_size", "expected less than or equal to 1048576"]),
        ("extract:\n  model: tiny-vit\n  suites: [shapes-aro, shapes-aro]\n", ["extract.suites: lists shapes-aro more than once"]),
    ],
    ids=["duplicate-key", "misspelled-section", "unknown-manifest-suite", "unknown-image-root-suite", "huge-batch", "suite-twice"],
)
def test_params_that_would_silently_run_something_else_are_refused(tmp_path, text, needles):
    params = tmp_path / "params.yaml"
    params.write_text(text)
    refused(cli("extract", "--params", params, "--quiet"), str(params), *needles)


@pytest.mark.parametrize(
    ("section", "cls", "text", "needle"),
    [
        ("score", "ScoreConfig", "variants: [clip, clip]", "score.variants: lists clip more than once"),
        ("train", "TrainConfig", "seeds: [0, 0]", "train.seeds: lists 0 more than once"),
        ("compare", "CompareConfig", "encoders: [toy, toy]", "compare.encoders: lists toy more than once"),
    ],
)
def test_an_entry_given_twice_is_refused(tmp_path, section, cls, text, needle):
    import pipeline.config as config

    params = tmp_path / "params.yaml"
    params.write_text(f"{section}:\n  {text}\n")
    with pytest.raises(config.ParamsError, match=needle):
        config.load_config(getattr(config, cls), params, section)


@pytest.mark.parametrize(
    "section,text,needle",
    [
        ("ridge", "shrinkage: 0", "ridge.shrinkage = 0: expected greater than 0"),
        ("ridge", "shrinkage: 1.5", "ridge.shrinkage = 1.5: expected less than or equal to 1"),
        ("ridge", "ranks: []", "ridge.ranks"),
        ("ridge", "ranks: [8, -1]", "ridge.ranks.1 = -1: expected greater than or equal to 0"),
        ("manifests", "image_share: {coco-families: 0}", "expected greater than 0"),
        ("manifests", "image_share: {coco-families: 1.5}", "expected less than or equal to 1"),
    ],
    ids=["shrinkage-0", "shrinkage-1.5", "ranks-empty", "ranks-negative", "share-0", "share-1.5"],
)
def test_out_of_range_values_are_refused_at_load(tmp_path, section, text, needle):
    """Bounds are checked when params load, naming the key and the bound, not later inside
    the stage that uses the value."""
    from pipeline.config import ManifestsConfig, ParamsError, RidgeConfig, load_config

    params = tmp_path / "params.yaml"
    params.write_text(f"{section}:\n  {text}\n")
    cls = {"ridge": RidgeConfig, "manifests": ManifestsConfig}[section]
    with pytest.raises(ParamsError, match=re.escape(needle)):
        load_config(cls, params, section)


def test_a_yaml_merge_may_override_what_it_brings(tmp_path):
    from pipeline.config import load_train_config

    params = tmp_path / "params.yaml"
    params.write_text("train:\n  a: &base {steps: 3, lr: 0.1}\n  bindclip:\n    <<: *base\n    lr: 0.2\n")
    cfg = load_train_config(params, "bindclip")
    assert (cfg.steps, cfg.lr) == (3, 0.2)


def test_infinite_learning_rate_is_refused(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  variants: [global-m]\n  global-m:\n    lr: .inf\n")
    refused(cli("train", "--params", params, "--variant", "global-m", "--quiet"), "train.global-m.lr = inf", "expected a finite number")


def test_negative_batch_size_on_the_command_line(good):
    _, params = good
    refused(cli("extract", "--params", params, "--batch-size", "-3", "--quiet"), "the command line: extract.batch_size = -3", "expected greater than 0")


@pytest.mark.parametrize(
    "args, names",
    [
        (["extract", "--batch-size", "abc"], ["'--batch-size'", "valid integer", "given: 'abc'", "`pipeline extract --help`"]),
        (["extract", "--batch-size=abc"], ["'--batch-size'", "given: 'abc'"]),
        (["extract", "--bogus"], ["No such option: --bogus", "`pipeline extract --help`"]),
        (["extarct"], ["No such command 'extarct'", "`pipeline --help`"]),
        (["extract", "--out"], ["Option '--out' requires an argument", "`pipeline extract --help`"]),
        (["bench", "extract", "--toy-images"], ["Option '--toy-images' requires an argument", "`pipeline bench extract --help`"]),
    ],
    ids=["batch-size-word", "batch-size-equals-word", "unknown-option", "unknown-command", "no-value", "bench-no-value"],
)
def test_command_line_mistakes_are_one_line(args, names, capsys):
    """The installed ``pipeline`` entry point (``cli.run``): a usage mistake is one
    ``error:`` line naming the option, the value and the help, exit 2, no boxed block."""
    from pipeline.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "╭" not in err and "Traceback" not in err
    for name in names:
        assert name in err, f"{name!r} not in {err!r}"


def test_the_entry_point_runs_commands_and_prints_help(capsys):
    """``cli.run`` passes a good command line through (exit 0) and, given nothing, prints
    the help as ``pipeline`` always did."""
    from pipeline.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(["suites"])
    assert exit_info.value.code == 0
    assert "shapes-retrieval" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        run([])
    printed = capsys.readouterr()
    assert exit_info.value.code == 2 and "Usage: pipeline" in printed.out + printed.err


def test_section_written_as_a_list(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("extract:\n  - model\n  - tiny-vit\n")
    refused(cli("extract", "--params", params), str(params), "section `extract` must be a mapping", "got a list")


def test_malformed_yaml_names_the_line(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("extract:\n  model: [tiny-vit\n  out: x\n")
    refused(cli("extract", "--params", params), str(params), "malformed YAML at line 3")


def test_missing_params_file(tmp_path):
    params = tmp_path / "nope.yaml"
    refused(cli("score", "--params", params), str(params), "no such params file", "--params")


def test_params_file_not_utf8_through_the_installed_command(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(b"extract:\n  model: tiny-vit\n  out: caf\xe9\n")
    run = subprocess.run([Path(sys.executable).parent / "pipeline", "extract", "--params", params], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.splitlines() == [f"error: {params}: not UTF-8 text (invalid continuation byte at byte 37)"]


def test_unknown_variant_lists_the_valid_ones(good):
    _, params = good
    refused(cli("score", "--params", params, "--variant", "clipp", "--quiet"), "--variant names unknown scorer(s) clipp", "valid scorers", "clip")
    edited(params, "score", variants=["clip", "clipp"])
    refused(cli("score", "--params", params, "--quiet"), f"{params}: score.variants names unknown scorer(s) clipp", "valid scorers")


def test_unknown_suite_lists_the_valid_ones(good):
    _, params = good
    refused(cli("extract", "--params", params, "--suite", "sugarcreep", "--quiet"), "unknown suite 'sugarcreep'", "valid suites", "sugarcrepe")


def test_unknown_model_lists_the_valid_ones(good):
    _, params = good
    refused(cli("extract", "--params", params, "--model", "ViT-Q-99", "--quiet"), "--model names unknown encoder(s) ViT-Q-99", "valid encoders", "tiny-vit")
    edited(params, "extract", model="ViT-Q-99")
    refused(cli("extract", "--params", params, "--quiet"), f"{params}: extract.model names unknown encoder(s) ViT-Q-99", "valid encoders")


def test_options_of_an_unknown_variant_are_refused(good):
    _, params = good
    edited(params, "score", options={"clipp": {}})
    ok(cli("extract", "--params", params, "--quiet"))
    refused(cli("score", "--params", params, "--quiet"), f"{params}: score.options names unknown scorer(s) clipp", "valid scorers", "local-max")


def test_unknown_score_encoder_lists_the_valid_ones(good):
    _, params = good
    edited(params, "score", encoder="tiny-vitt")
    refused(cli("score", "--params", params, "--quiet"), f"{params}: score.encoder names unknown encoder(s) tiny-vitt", "valid encoders", "tiny-vit")


def test_empty_extract_suites_is_refused(good):
    _, params = good
    edited(params, "extract", suites=[])
    refused(cli("extract", "--params", params, "--quiet"), "extract.suites is empty", "`pipeline suites`")


@pytest.mark.parametrize("scheduler,needles", [("bogus", ["--scheduler bogus", "tcp://HOST:PORT", "local:N"]), ("local:two", ["--scheduler local:two", "local:N"])])
def test_a_scheduler_that_is_no_address_names_the_option(good, scheduler, needles):
    _, params = good
    refused(cli("extract", "--params", params, "--scheduler", scheduler, "--quiet"), *needles)


def test_a_params_folder_and_an_output_under_a_file_are_one_line_with_the_fix(good, tmp_path):
    _, params = good
    refused(cli("extract", "--params", tmp_path, "--quiet"), "a folder, not a params file", str(tmp_path / "params.yaml"))
    (tmp_path / "plain").write_text("")
    edited(params, "extract", out=str(tmp_path / "plain" / "features"))
    refused(cli("extract", "--params", params, "--quiet"), str(tmp_path / "plain"), "a file stands where a folder is needed")


def test_a_memory_store_is_refused_by_the_command(good):
    """memory:// lives inside one process: a command would write it and lose it."""
    _, params = good
    refused(cli("extract", "--params", params, "--out", "memory://features", "--quiet"), "extract.out = 'memory://features'", "one process")


def test_weights_a_random_init_model_lacks_are_one_line(good, caplog):
    _, params = good
    edited(params, "extract", pretrained="openai")
    refused(cli("extract", "--params", params, "--quiet"), "could not load weights 'openai' for tiny-vit", "pretrained: none")
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # open_clip's own line of the same failure


def test_a_file_that_is_not_weights_is_one_line_naming_it(good, tmp_path):
    _, params = good
    (tmp_path / "notes.pt").write_text("not a state dict\n" * 50)
    edited(params, "extract", pretrained=str(tmp_path / "notes.pt"))
    line = refused(cli("extract", "--params", params, "--quiet"), "notes.pt", "is not an open_clip state dict of tiny-vit")
    assert "random init" not in line  # not the hint for a model without weights
    assert "weights_only" not in line  # torch's advice to unpickle arbitrary code is not repeated
    assert "could not load weights" in line and "Error: " in line  # the failure's kind, with its reason


# ---------------------------------------------------------------- official annotation files


def official(root: Path, text: str | bytes) -> Path:
    """``root/swap_att.json`` (SugarCrepe's file name) holding ``text`` as given."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "swap_att.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def entry(**fields: object) -> str:
    base = {"filename": "000000000139.jpg", "caption": "a red car and a blue bus", "negative_caption": "a blue car and a red bus"}
    return json.dumps({k: v for k, v in {**base, **fields}.items() if v is not ...})


def manifest_cmd(tmp: Path) -> Result:
    return cli("manifest", "--suite", "sugarcrepe", "--root", tmp / "sc", "--out", tmp / "sc.parquet")


def test_official_file_with_a_duplicated_key(tmp_path):
    path = official(tmp_path / "sc", f'{{"0": {entry()}, "1": {entry()}, "0": {entry(caption="a cat")}}}')
    refused(manifest_cmd(tmp_path), str(path), "key '0' appears twice", "fix the file")
    assert not (tmp_path / "sc.parquet").exists()


def test_official_file_with_invalid_utf8(tmp_path):
    text = f'{{"0": {entry()},\n "1": {entry(caption="a red caf@")}}}'.encode().replace(b"@", b"\xe9")
    path = official(tmp_path / "sc", text)
    refused(manifest_cmd(tmp_path), str(path), "invalid UTF-8", "(line 2)", "re-save the file as UTF-8")


def test_official_file_with_a_null_caption(tmp_path):
    path = official(tmp_path / "sc", f'{{"0": {entry()}, "1": {entry(caption=None)}}}')
    refused(manifest_cmd(tmp_path), str(path), "item swap-att/1", "'caption' is null", "expected a non-empty string")


def test_official_file_without_negative_caption(tmp_path):
    path = official(tmp_path / "sc", f'{{"0": {entry(negative_caption=...)}}}')
    refused(manifest_cmd(tmp_path), str(path), "item swap-att/0", "'negative_caption' is missing")


def test_official_file_with_a_path_escaping_the_root(tmp_path):
    official(tmp_path / "sc", f'{{"0": {entry()}, "1": {entry(filename="../x.jpg")}}}')
    refused(manifest_cmd(tmp_path), "item swap-att/1", "'../x.jpg' escapes the image root", "'..' are refused")


def test_duplicated_item_id_in_a_manifest_given_to_extract(tmp_path, images):
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[5]["item_id"] = rows[2]["item_id"]
    manifest = write_manifest(tmp_path / "m.parquet", rows)
    params = write_params(tmp_path, manifest, folder)
    refused(cli("extract", "--params", params, "--quiet"), str(manifest), "1 item_id(s) appear more than once (it2)", "each item must be listed once")


@pytest.mark.parametrize(
    "edit,needles",
    [
        ({"captions": "a red circle and a blue square"}, ["item it0: captions must be a list"]),
        ({"captions": ["a red circle"]}, ["item it3: captions must hold at least two options"]),
        ({"correct": -1}, ["item it3: correct must index its captions"]),
        ({"correct": 5}, ["item it3: correct must index its captions"]),
        ({"image": None}, ["item it3: image must be a non-empty path"]),
    ],
    ids=["captions-string", "one-caption", "correct-negative", "correct-too-large", "null-image"],
)
def test_a_manifest_the_suite_cannot_score_is_refused_at_extract(tmp_path, images, edit, needles):
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[3].update(edit)
    if isinstance(edit.get("captions"), str):  # Parquet keeps a column one type: every row a string
        for r in rows:
            r["captions"] = r["captions"] if isinstance(r["captions"], str) else " / ".join(r["captions"])
    manifest = write_manifest(tmp_path / "m.parquet", rows)
    params = write_params(tmp_path, manifest, folder)
    refused(cli("extract", "--params", params, "--quiet"), str(manifest), *needles)


def test_a_manifest_without_a_column_names_it(tmp_path, images):
    folder, names = images
    manifest = write_manifest(tmp_path / "m.parquet", [{k: v for k, v in item(i, n).items() if k != "correct"} for i, n in enumerate(names)])
    refused(cli("extract", "--params", write_params(tmp_path, manifest, folder), "--quiet"), "no column correct", "needs item_id, image, captions")


# ---------------------------------------------------------------- images at extract


def with_image(tmp: Path, images: tuple[Path, list[str]], name: str, data: bytes | None, **extract: object) -> Path:
    """Params over the eight good items plus ``it8`` whose image is ``name`` (written into a
    copy of the image folder with ``data``; None leaves it missing)."""
    folder = tmp / "images"
    shutil.copytree(images[0], folder)
    if data is not None:
        (folder / name).write_bytes(data)
    rows = [item(i, n) for i, n in enumerate(images[1])] + [item(8, name)]
    return write_params(tmp, write_manifest(tmp / "m.parquet", rows), folder, **extract)


def truncated_png() -> bytes:
    data = png_bytes(Image.fromarray(np.random.default_rng(1).integers(0, 255, (28, 28, 3), dtype=np.uint8)))
    return data[: len(data) // 2]


def test_missing_image_is_refused_naming_it(tmp_path, images):
    params = with_image(tmp_path, images, "gone.png", None)
    refused(cli("extract", "--params", params, "--quiet"), "1 image(s) not found", f"{SUITE}: 1 under {tmp_path / 'images'} (gone.png)", "extract.skip_missing: true")


def test_missing_image_skipped_is_counted_in_the_metrics(tmp_path, images):
    params = with_image(tmp_path, images, "gone.png", None, skip_missing=True)
    m = extract_and_score(params)
    assert m["n_items"] == 8 and m["n_skipped"] == 1
    assert m["skipped"] == {"image_missing": 1, "image_undecodable": 0}


def test_a_suite_with_no_image_found_is_refused_even_when_skipping(tmp_path, images):
    """Every image missing is a wrong image root, not items to skip: nothing could be scored."""
    params = with_image(tmp_path, images, "gone.png", None, skip_missing=True)
    for f in (tmp_path / "images").iterdir():
        f.unlink()
    refused(cli("extract", "--params", params, "--quiet"), f"no image of {SUITE} was found", f"under {tmp_path / 'images'}", f"extract.image_roots.{SUITE}")


def test_truncated_image_is_refused_naming_the_file(tmp_path, images):
    params = with_image(tmp_path, images, "cut.png", truncated_png())
    line = refused(cli("extract", "--params", params, "--quiet"), "1 image(s) cannot be decoded", str(tmp_path / "images" / "cut.png"), "extract.skip_bad_images: true")
    assert "truncated" in line


def test_corrupt_image_skipped_is_counted_in_the_metrics(tmp_path, images):
    params = with_image(tmp_path, images, "corrupt.png", b"\x89PNG\r\n\x1a\n not a png", skip_bad_images=True)
    m = extract_and_score(params)
    assert m["n_items"] == 8 and m["n_skipped"] == 1
    assert m["skipped"] == {"image_missing": 0, "image_undecodable": 1}


def bomb_png(side: int = 30000) -> bytes:
    """A 60-byte PNG declaring ``side`` x ``side`` greyscale pixels (900 megapixels at the
    default: over twice PIL's ``MAX_IMAGE_PIXELS``, refused when the header is read)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_decompression_bomb_is_refused_naming_the_file(tmp_path, images):
    params = with_image(tmp_path, images, "bomb.png", bomb_png())
    refused(cli("extract", "--params", params, "--quiet"), str(tmp_path / "images" / "bomb.png"), "decompression bomb", "900000000 pixels", "extract.skip_bad_images: true")


# ---------------------------------------------------------------- image modes decode to the right RGB


def _grey16() -> tuple[Image.Image, np.ndarray]:
    raw = np.zeros((28, 28), dtype=np.uint16)
    raw[:14, :14], raw[:14, 14:], raw[14:, :14] = 65535, 32768, 1000
    expected = np.zeros((28, 28), dtype=np.uint8)
    expected[:14, :14], expected[:14, 14:], expected[14:, :14] = 255, 128, 4  # v * 255 / 65535, rounded
    return Image.fromarray(raw), np.repeat(expected[..., None], 3, axis=2)


def _grey32() -> tuple[Image.Image, np.ndarray]:
    """16-bit values in a 32-bit integer TIFF (mode I), as scanners and microscopes write them."""
    img, expected = _grey16()
    return Image.fromarray(np.asarray(img).astype(np.int32), mode="I"), expected


def _palette() -> tuple[Image.Image, np.ndarray]:
    colours = np.array([[200, 30, 40], [10, 160, 90], [250, 250, 0], [5, 5, 120]], dtype=np.uint8)
    idx = (np.arange(28)[:, None] // 7 + np.arange(28)[None, :] // 14) % 4
    img = Image.fromarray(idx.astype(np.uint8), mode="P")
    img.putpalette(colours.reshape(-1).tolist())
    return img, colours[idx]


def _cmyk() -> tuple[Image.Image, np.ndarray]:
    cmyk = np.zeros((28, 28, 4), dtype=np.uint8)
    cmyk[:14, :, 0] = 255  # cyan
    cmyk[14:, :, 1:3] = 255  # magenta + yellow: red
    cmyk[:, 21:, 3] = 128  # half black
    expected = np.zeros((28, 28, 3), dtype=np.uint8)
    expected[:14], expected[14:] = [0, 255, 255], [255, 0, 0]
    expected[:, 21:] = (expected[:, 21:].astype(int) * 127 // 255).astype(np.uint8)
    return Image.fromarray(cmyk, mode="CMYK"), expected


def _rgba() -> tuple[Image.Image, np.ndarray]:
    rgba = np.random.default_rng(3).integers(0, 256, (28, 28, 4), dtype=np.uint8)
    rgba[::2, :, 3] = 0  # fully transparent rows keep their colour: alpha is dropped
    return Image.fromarray(rgba, mode="RGBA"), rgba[..., :3].copy()


MODES = {  # name -> (file name, image in the odd mode, the RGB it must decode to, PIL format)
    "grey16": ("grey16.png", _grey16, "PNG"),
    "grey32": ("grey32.tif", _grey32, "TIFF"),
    "palette": ("palette.png", _palette, "PNG"),
    "cmyk": ("cmyk.jpg", _cmyk, "JPEG"),
    "rgba": ("rgba.png", _rgba, "PNG"),
}


@pytest.fixture(scope="module")
def decoded(tmp_path_factory, images):
    """One extract over the eight good items, each odd-mode image and an 8-bit RGB PNG of
    the RGB it must decode to; per mode, the bytes, the expected RGB and both images' pooled
    features from the store."""
    from pipeline.cache import FeatureStore

    tmp = tmp_path_factory.mktemp("modes")
    folder = tmp / "images"
    folder.mkdir()
    rows = [item(i, n) for i, n in enumerate(images[1])]
    for name in images[1]:
        (folder / name).write_bytes((images[0] / name).read_bytes())
    files = {}
    for mode, (name, make, fmt) in MODES.items():
        img, expected = make()
        buf = io.BytesIO()
        img.save(buf, fmt, **({"quality": 100} if fmt == "JPEG" else {}))
        (folder / name).write_bytes(buf.getvalue())
        (folder / f"ref-{mode}.png").write_bytes(png_bytes(Image.fromarray(expected)))
        rows += [item(len(rows), name), item(len(rows) + 1, f"ref-{mode}.png")]
        files[mode] = (buf.getvalue(), expected)
    params = write_params(tmp, write_manifest(tmp / "m.parquet", rows), folder)
    ok(cli("extract", "--params", params, "--quiet"))
    store = FeatureStore.open(tmp / "features" / "tiny-vit.zarr")
    index = store.suite_index(SUITE)["image"][:, 0]
    embed = store.images(index, grids=False).embed.numpy()
    by_image = {r["image"]: embed[i] for i, r in enumerate(rows)}
    return {m: (*files[m], by_image[MODES[m][0]], by_image[f"ref-{m}.png"]) for m in MODES}


@pytest.mark.parametrize("mode", list(MODES))
def test_image_mode_is_decoded_to_the_right_rgb(decoded, mode):
    data, expected, features, reference = decoded[mode]
    rgb = np.asarray(decode_image(data, MODES[mode][0]))
    assert rgb.shape == expected.shape and rgb.dtype == np.uint8
    tolerance = 2 if mode == "cmyk" else 0  # JPEG is lossy
    assert np.abs(rgb.astype(int) - expected).max() <= tolerance
    np.testing.assert_allclose(features, reference, atol=1e-5)  # extract saw exactly that RGB


@pytest.mark.parametrize(("peak", "peak_out", "mid_out"), [(255, 255, 128), (256, 1, 0), (65535, 255, 0), (65536, 0, 0)])
def test_a_32_bit_image_is_scaled_by_the_depth_its_largest_value_says(peak, peak_out, mid_out):
    """Mode I holds 8-, 16- or 32-bit values: a peak of 255 keeps 8-bit values as they are
    (128 stays 128), one above it scales from 16 bits (256 -> 1), one above 65535 from 32."""
    raw = np.zeros((28, 28), dtype=np.int32)
    raw[:14], raw[14:, :14] = peak, 128
    buf = io.BytesIO()
    Image.fromarray(raw, mode="I").save(buf, "TIFF")
    rgb = np.asarray(decode_image(buf.getvalue(), "i.tif"))
    expected = np.zeros((28, 28), dtype=np.uint8)
    expected[:14], expected[14:, :14] = peak_out, mid_out
    np.testing.assert_array_equal(rgb, np.repeat(expected[..., None], 3, axis=2))


def test_a_float_image_is_refused_naming_the_file():
    from pipeline.manifests import BadImageError

    buf = io.BytesIO()
    Image.fromarray(np.full((28, 28), 0.5, dtype=np.float32), mode="F").save(buf, "TIFF")
    with pytest.raises(BadImageError, match=r"f\.tif: a floating-point image \(mode F\)"):
        decode_image(buf.getvalue(), "f.tif")


def test_a_thin_strip_is_refused_before_resizing_blows_it_up(tmp_path, images):
    strip = png_bytes(Image.fromarray(np.zeros((1, 30_000), dtype=np.uint8)))  # 196 bytes, 30k pixels
    params = with_image(tmp_path, images, "strip.png", strip)
    refused(cli("extract", "--params", params, "--quiet"), "strip.png: 30000x1 pixels, an aspect ratio over 100:1", "extract.skip_bad_images: true")


# ---------------------------------------------------------------- measuring commands


def test_bench_commands_refuse_in_one_line(tmp_path):
    refused(cli("bench", "--out", tmp_path / "b", "cli", "--model", "nosuch"), "unknown encoder 'nosuch'", "valid encoders")
    (tmp_path / "file").write_text("")
    refused(cli("bench", "--out", tmp_path / "file", "sinkhorn", "--problems", 2, "--rows", 2, "--cols", 3), "File exists", str(tmp_path / "file"))


def test_a_suite_with_no_item_is_refused(tmp_path, images):
    folder, _ = images
    empty = write_manifest(tmp_path / "m.parquet", [item(0, "x.png")]).with_name("empty.parquet")
    pd.read_parquet(tmp_path / "m.parquet").iloc[:0].to_parquet(empty)
    refused(cli("extract", "--params", write_params(tmp_path, empty, folder), "--quiet"), "empty.parquet", "the manifest has no items")


# ---------------------------------------------------------------- captions over the context


PREFIX = " ".join(["a small red circle beside a large blue square"] * 9)  # 81 BPE tokens


def test_caption_over_the_context_is_counted(tmp_path, images):
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[3]["captions"] = [PREFIX, "a green star"]
    params = write_params(tmp_path, write_manifest(tmp_path / "m.parquet", rows), folder)
    m = extract_and_score(params)
    assert m["n_truncated"] == 1 and m["n_truncation_ties"] == 0
    assert m["n_items"] == 8 and m["n_skipped"] == 0


def test_captions_equal_up_to_the_cut_are_counted_as_ties(tmp_path, images):
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[3]["captions"] = [PREFIX + " and a green star", PREFIX + " and a yellow cross"]
    params = write_params(tmp_path, write_manifest(tmp_path / "m.parquet", rows), folder)
    m = extract_and_score(params)
    assert m["n_truncated"] == 2 and m["n_truncation_ties"] == 1
    scores = pd.read_parquet(tmp_path / "scores" / "clip" / f"{SUITE}.parquet")
    assert scores["scores"][3][0] == scores["scores"][3][1]  # the cut makes the two options one


def test_captions_the_tokenizer_makes_equal_are_not_truncation_ties(tmp_path, images):
    """Options that differ only in case or in a character the tokenizer drops (a NUL) are one
    token sequence without any cut: they tie, but not because of truncation."""
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[3]["captions"] = ["a green star", "A Green\x00 star"]
    params = write_params(tmp_path, write_manifest(tmp_path / "m.parquet", rows), folder)
    m = extract_and_score(params)
    assert m["n_truncated"] == 0 and m["n_truncation_ties"] == 0
    assert m["n_identical_options"] == 1  # they tie all the same, and are counted as such


def test_an_option_equal_to_the_true_caption_is_counted(tmp_path, images):
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)]
    rows[2]["captions"] = ["a green star", "a green star"]
    params = write_params(tmp_path, write_manifest(tmp_path / "m.parquet", rows), folder)
    m = extract_and_score(params)
    assert m["n_identical_options"] == 1 and m["n_truncation_ties"] == 0 and m["n_items"] == 8


# ---------------------------------------------------------------- the store


def test_score_before_extract_names_the_command_to_run(good, tmp_path):
    _, params = good
    refused(cli("score", "--params", params, "--quiet"), f"no feature store at {tmp_path / 'features' / 'tiny-vit.zarr'}", "run `pipeline extract` first")


def test_score_of_another_model_key_names_the_stores_beside_it(good, tmp_path):
    """A store extracted under another model key (``-quickgelu`` in extract.model only) is
    named, with the key to set, rather than only "run pipeline extract"."""
    _, params = good
    (tmp_path / "features" / "ViT-B-32-quickgelu.zarr").mkdir(parents=True)
    refused(cli("score", "--params", params, "--quiet"), "no feature store at", "its folder holds ViT-B-32-quickgelu.zarr", "set this stage's encoder")


def test_score_with_another_manifest_than_the_store_was_extracted_from(good, images, tmp_path):
    manifest, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    folder, names = images
    other = write_manifest(tmp_path / "other.parquet", [item(i, n) for i, n in enumerate(names[:6])])
    edited(params, "extract", manifests={SUITE: str(other)})
    refused(cli("score", "--params", params, "--quiet"), f"configured manifest {other}", f"extracted from ({manifest}", "rerun `pipeline extract`")


def test_score_with_another_image_folder_than_the_store_was_extracted_from(good, images, tmp_path):
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    other = tmp_path / "elsewhere"
    shutil.copytree(images[0], other)
    edited(params, "extract", image_roots={SUITE: str(other)})
    refused(cli("score", "--params", params, "--quiet"), f"extracted from the images under {images[0]}", str(other), "rerun `pipeline extract`")


def test_a_variant_that_can_score_none_of_the_suites_is_refused(good):
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    edited(params, "score", variants=["fgw"])
    refused(cli("score", "--params", params, "--quiet"), "fgw scores retrieval suites only", "score.suites (shapes-sugarcrepe) has none")


def test_an_option_the_scorer_does_not_take_is_refused(good):
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    edited(params, "score", options={"clip": {"foo": 1}})
    refused(cli("score", "--params", params, "--quiet"), "score.options.clip", "foo")


def test_options_of_a_variant_not_scored_are_checked_too(good):
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    edited(params, "score", options={"fgw": {"k": -1}})
    refused(cli("score", "--params", params, "--quiet"), "score.options.fgw = {'k': -1}", "k=-1")


def test_an_option_value_the_scorer_refuses_is_named_by_its_key(tiny_store):
    from pipeline.scorers.checkpoints import load_scorer

    with pytest.raises(ValueError, match=r"score.options.fgw = \{'k': -1\}: .*k=-1"):
        load_scorer("fgw", tiny_store, "none", options={"k": -1})


@pytest.mark.parametrize(
    ("variant", "options", "says"),
    [
        ("fgw-hungarian", {"k": 2.5}, r"k = 2.5: Input should be a valid integer"),
        ("hungarian", {"k": "3"}, r"k = '3': Input should be a valid integer"),
        ("ridge-fgw", {"top": True}, r"top = True: Input should be a valid integer"),
        ("fgw", {"base": "foo"}, r"unknown scorer 'foo'; valid scorers: .*clip"),
        ("fgw", {"base": "bindclip"}, r"base 'bindclip' is a pairwise caption scorer"),
        ("steer", {"base": "fgw"}, r"base 'fgw' is a reranker"),
    ],
)
def test_a_reranker_option_of_the_wrong_type_or_base_is_refused_by_its_key(tiny_store, variant, options, says):
    """A shortlist length that is not an integer (2.5, '3', True) and an unknown, pairwise or
    reranker ``base`` are refused when the scorer is built, naming the option's key."""
    from pipeline.scorers.checkpoints import build_scorer

    with pytest.raises(ValueError, match=rf"score.options.{variant} = .*{says}"):
        build_scorer(variant, tiny_store, options)


def test_nothing_to_score_is_refused(good):
    _, params = good
    refused(cli("score", "--params", edited(params, "score", variants=[]), "--quiet"), "score.variants and score.suites must each name at least one entry")


def test_a_device_name_torch_does_not_know_is_refused_before_any_work(good, tmp_path):
    _, params = good
    refused(cli("extract", "--params", params, "--device", "gpu", "--quiet"), "device 'gpu' is not usable here", "--device cpu")
    assert not (tmp_path / "features").exists()


def test_the_meta_device_which_computes_no_values_is_refused(good, tmp_path):
    """``--device meta`` allocates without error but computes no values: the device check
    refuses it before any work."""
    _, params = good
    refused(cli("extract", "--params", params, "--device", "meta", "--quiet"), "device 'meta' is not usable here", "holds tensors' shapes")
    assert not (tmp_path / "features").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this host has CUDA")
def test_cuda_on_a_host_without_it_is_refused_naming_the_fix(good):
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    refused(cli("score", "--params", params, "--device", "cuda", "--quiet"), "device 'cuda' is not usable here", "--device cpu")


def test_a_narrowed_score_call_scores_only_what_it_names(good, tmp_path):
    """``--variant`` narrows the params' per-seed and replacement lists too: scoring only
    ``clip`` from a params file whose replacements and seeds name another variant runs, and
    writes ``clip`` alone; the other variant's own call is refused for its (untrained) seeds."""
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    edited(params, "score", variants=["clip", "local-max"], replacements=["shuffle"], replacement_variants=["local-max"],
           seed_variants=["local-max"])  # fmt: skip
    ok(cli("score", "--params", params, "--variant", "clip", "--quiet"))
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == ["clip"]
    refused(cli("score", "--params", params, "--variant", "local-max", "--quiet"), "seed_variants lists local-max", "not trained per seed")
    edited(params, "score", seed_variants=[])
    ok(cli("score", "--params", params, "--variant", "local-max", "--quiet"))
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == ["clip", "local-max", "local-max@shuffle"]


def test_probes_without_the_shapes_suites_name_what_is_missing(good):
    _, params = good
    ok(cli("extract", "--params", params, "--quiet"))
    refused(cli("probes", "--params", params), "shapes-train, shapes-aro", "run `pipeline extract --suite shapes-train --suite shapes-aro`")


def test_a_symlinked_image_folder_inside_the_root_is_followed(tmp_path, images):
    folder, names = images
    root = tmp_path / "root"
    root.mkdir()
    (root / "val").symlink_to(folder, target_is_directory=True)  # a mounted image folder
    manifest = write_manifest(tmp_path / "m.parquet", [item(i, f"val/{n}") for i, n in enumerate(names)])
    m = extract_and_score(write_params(tmp_path, manifest, root))
    assert m["n_items"] == 8 and m["n_skipped"] == 0


# ---------------------------------------------------------------- bad items = clean items + reported skips


def test_bad_items_score_as_the_clean_items_plus_the_reported_skips(tmp_path, images):
    folder = tmp_path / "images"
    shutil.copytree(images[0], folder)
    (folder / "bad1.png").write_bytes(b"not an image at all")
    (folder / "bad2.png").write_bytes(b"not an image at all")  # same bytes: one store row, two items
    clean = [item(i, n) for i, n in enumerate(images[1])]
    bad = clean[:3] + [item(20, "bad1.png")] + clean[3:6] + [item(21, "bad2.png")] + clean[6:]
    (tmp_path / "clean").mkdir()
    (tmp_path / "bad").mkdir()
    m_clean = extract_and_score(write_params(tmp_path / "clean", write_manifest(tmp_path / "clean.parquet", clean), folder))
    m_bad = extract_and_score(write_params(tmp_path / "bad", write_manifest(tmp_path / "bad.parquet", bad), folder, skip_bad_images=True))
    assert m_bad["n_skipped"] == 2 and m_bad["skipped"] == {"image_missing": 0, "image_undecodable": 2}
    assert m_clean["n_skipped"] == 0
    assert m_bad["metrics"] == m_clean["metrics"] and m_bad["n_items"] == m_clean["n_items"] == 8
    s_clean = pd.read_parquet(tmp_path / "clean" / "scores" / "clip" / f"{SUITE}.parquet")
    s_bad = pd.read_parquet(tmp_path / "bad" / "scores" / "clip" / f"{SUITE}.parquet")
    assert s_bad["item_id"].tolist() == s_clean["item_id"].tolist()
    np.testing.assert_allclose(np.stack(s_bad["scores"]), np.stack(s_clean["scores"]), rtol=1e-6)


@pytest.mark.parametrize(
    ("section", "cls", "key", "text", "hint", "value"),
    [("ridge", "RidgeConfig", "lam", "1e-3", "write it with a dot and a signed exponent, e.g. 1.0e-3", 1e-3),
     ("ridge", "RidgeConfig", "lam", "1.0e2", "write it with a dot and a signed exponent, e.g. 1.0e+2", 100.0),
     ("report", "ReportConfig", "bootstrap", "1e4", "write the integer, 10000", 10000)],
)
def test_a_number_yaml_reads_as_text_is_named_with_the_form_it_reads(tmp_path, section, cls, key, text, hint, value):
    """PyYAML (YAML 1.1) reads an exponent as a number only after a dot and with its sign:
    1e-3, 1.0e2 and 1e4 are strings. The hint names a form it reads, which then loads."""
    import pipeline.config as config

    params = tmp_path / "params.yaml"
    params.write_text(f"{section}:\n  {key}: {text}\n")
    with pytest.raises(config.ParamsError, match=re.escape(f"{section}.{key} = '{text}': expected ") + r".*" + re.escape(f"(YAML reads {text} as text: {hint})")):
        config.load_config(getattr(config, cls), params, section)
    params.write_text(f"{section}:\n  {key}: {hint.rsplit(' ', 1)[-1]}\n")
    assert getattr(config.load_config(getattr(config, cls), params, section), key) == value


def test_a_random_init_store_of_an_edited_shipped_config_is_refused_at_read(tmp_path, images, monkeypatch):
    """A random init's weights are "random" whatever its config: the store records the
    config's hash, so after ``configs/tiny-vit.json`` is edited (another depth) the reader
    refuses the store, as the writer does, instead of serving the old architecture's
    features."""
    import pipeline.encoders as encoders
    from pipeline.cache import ForeignCacheError, open_store
    from pipeline.config import ExtractConfig, load_config

    folder, names = images
    params = write_params(tmp_path, write_manifest(tmp_path / "m.parquet", [item(i, n) for i, n in enumerate(names)]), folder)
    ok(cli("extract", "--params", params, "--quiet"))
    extract = load_config(ExtractConfig, params, "extract")
    open_store(extract)
    config = json.loads((encoders.CONFIG_DIR / "tiny-vit.json").read_text())
    config["vision_cfg"]["layers"] += 1
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny-vit.json").write_text(json.dumps(config))
    monkeypatch.setattr(encoders, "CONFIG_DIR", tmp_path / "configs")
    with pytest.raises(ForeignCacheError, match="open_clip_config_sha256"):
        open_store(extract)
