"""Crash safety: an extract SIGKILLed at each named point, then resumed, leaves exactly the
store an uninterrupted run writes (every array's values, every done flag, every index)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_choice_manifest, make_images
from tests.stores import assert_same_store

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[1]
N_IMAGES = 300  # five 64-row shard batches of images and two 256-row task blocks


def _params(tmp: Path, out: Path) -> Path:
    manifest = tmp / "m" / "sc.parquet"
    if not manifest.exists():
        make_choice_manifest(manifest, make_images(tmp / "images", N_IMAGES))
    extract = {
        "model": "tiny-vit", "pretrained": "none", "init_seed": 0, "suites": ["shapes-sugarcrepe"],
        "manifests": {"shapes-sugarcrepe": str(manifest)}, "image_roots": {"shapes-sugarcrepe": str(tmp / "images")},
        "out": str(out), "batch_size": 16, "threads": 1,
    }  # fmt: skip
    path = tmp / f"params-{out.name}.yaml"
    path.write_text(yaml.safe_dump({"extract": extract}))
    return path


def _run(params: Path, point: str = "none", n: int = 1, scheduler: str | None = None) -> int:
    cmd = [sys.executable, "-m", "tests.crash_driver", str(params), point, str(n)]
    cmd += ["--scheduler", scheduler] if scheduler else []
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300).returncode


def build_reference(tmp_path_factory, name: str) -> tuple[Path, Path]:
    """A fresh folder and the store one uninterrupted single-process extract writes there
    (``N_IMAGES`` images, tiny-vit): what every resumed or distributed run must equal."""
    tmp = tmp_path_factory.mktemp(name)
    assert _run(_params(tmp, tmp / "ref")) == 0
    return tmp, tmp / "ref" / "tiny-vit.zarr"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return build_reference(tmp_path_factory, "crash")


@pytest.mark.parametrize(
    "point,n",
    [("plan", 2), ("encode", 3), ("between_writes", 2), ("during_write", 3), ("index", 1), ("finalize", 1)],
)
def test_killed_then_resumed_store_is_identical(reference, point, n):
    tmp, ref = reference
    params = _params(tmp, tmp / point)
    assert _run(params, point, n) == -signal.SIGKILL  # it died where it was told to
    assert _run(params) == 0  # the resume (the stale lock of the dead run is reclaimed)
    assert_same_store(tmp / point / "tiny-vit.zarr", ref)


def test_killed_twice_at_different_points(reference):
    tmp, ref = reference
    params = _params(tmp, tmp / "twice")
    assert _run(params, "between_writes", 1) == -signal.SIGKILL
    assert _run(params, "during_write", 2) == -signal.SIGKILL
    assert _run(params) == 0
    assert_same_store(tmp / "twice" / "tiny-vit.zarr", ref)
