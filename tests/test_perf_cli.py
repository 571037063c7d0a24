"""The cost of one `pipeline score` call: the weights hash is remembered by (path, size,
mtime), and scoring from the cache imports neither open_clip nor scipy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import pipeline.encoders.provenance as provenance
from pipeline.manifests import file_sha256

ROOT = Path(__file__).resolve().parents[1]


def test_weights_hash_is_remembered_by_path_size_and_mtime(tmp_path, monkeypatch):
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"\x01" * 1000)
    monkeypatch.setattr(provenance, "HASH_CACHE", tmp_path / "cache" / "sha256.json")
    calls = []
    monkeypatch.setattr(provenance, "file_sha256", lambda p: calls.append(p) or file_sha256(p))
    first = provenance.weights_sha256(weights)
    assert provenance.weights_sha256(weights) == first == file_sha256(weights) and len(calls) == 1
    weights.write_bytes(b"\x02" * 1000)  # rewritten in place: same size, new mtime
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    second = provenance.weights_sha256(weights)
    assert second == file_sha256(weights) != first and len(calls) == 2


def test_score_command_imports_neither_open_clip_nor_scipy(tmp_path):
    from pipeline.config import ExtractConfig
    from pipeline.extraction import extract
    from pipeline.perf.common import make_suite

    manifest = make_suite(tmp_path, 6, 56)
    ext = {
        "model": "tiny-vit", "pretrained": "none", "suites": ["shapes-sugarcrepe"], "manifests": {"shapes-sugarcrepe": str(manifest)},
        "image_roots": {"shapes-sugarcrepe": str(tmp_path / "images")}, "out": str(tmp_path / "features"), "batch_size": 4, "threads": 1,
    }  # fmt: skip
    extract(ExtractConfig(**ext), progress=False)
    score = {"variants": ["clip", "local-max"], "suites": ["shapes-sugarcrepe"], "encoder": "tiny-vit",
             "scores_out": str(tmp_path / "scores"), "metrics_out": str(tmp_path / "metrics")}  # fmt: skip
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"extract": ext, "score": score}))
    code = (
        "import sys\nfrom pipeline.cli import app\n"
        f"try:\n    app(['score', '--params', {str(params)!r}, '--quiet'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'open_clip', 'scipy', 'ot', 'distributed'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "metrics" / "local-max" / "shapes-sugarcrepe.json").is_file()


def test_bench_out_writes_where_the_report_reads_and_records_it(tmp_path, monkeypatch):
    """The real report reads its measurements from ``../reports/real/bench`` (its out
    folder): ``pipeline bench --out`` writes there and the file's command says so."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app

    monkeypatch.chdir(tmp_path)
    args = ["sinkhorn", "--problems", "2", "--rows", "3", "--cols", "4", "--pot-subset", "1"]
    result = CliRunner().invoke(app, ["bench", "--out", "real/bench", *args])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "real" / "bench" / "sinkhorn.json").read_text())
    assert data["command"].startswith("pipeline bench --out real/bench sinkhorn --problems 2")
    assert not (tmp_path / "reports").exists()
    assert CliRunner().invoke(app, ["bench", *args]).exit_code == 0  # the default folder again
    assert (tmp_path / "reports" / "bench" / "sinkhorn.json").is_file()


def test_concurrent_extracts_write_each_store_and_count_every_image(tmp_path):
    """The distributed bench's machine reference: two worker-like processes, each writing a
    complete store of the suite, their images counted over the span both encode in."""
    from dataclasses import replace

    import numpy as np
    import zarr
    from safetensors.torch import save_file

    from pipeline.cache import store_path
    from pipeline.perf.common import extract_cfg, make_suite, random_encoder
    from pipeline.perf.extract import concurrent_extracts, process_cfgs

    enc = random_encoder("toy")
    manifest = make_suite(tmp_path, 8, enc.preprocess_cfg["size"][0])
    save_file({k: v.contiguous() for k, v in enc.model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    cfg = replace(extract_cfg(tmp_path, manifest, "toy", 4), threads=1, checkpoint=str(tmp_path / "w.safetensors"))
    cfgs = process_cfgs(cfg, tmp_path / "processes", 2)
    out = concurrent_extracts(cfgs)
    assert out["processes"] == 2 and out["images"] == 16 and out["encode_s"] > 0  # both processes' 8 images each
    stores = [zarr.open_group(store_path(c), mode="r") for c in cfgs]
    assert len({str(store_path(c)) for c in cfgs}) == 2
    for store in stores:
        assert store["image/done"].shape == (8,) and store["image/done"][...].all()
    np.testing.assert_array_equal(stores[0]["image/embed"][...], stores[1]["image/embed"][...])


def test_a_bench_process_that_fails_before_encoding_releases_the_others(tmp_path):
    """One process of :func:`concurrent_extracts` failing while it plans (a manifest that is
    not there) breaks the start barrier: the call fails at once instead of hanging."""
    from dataclasses import replace

    from safetensors.torch import save_file

    from pipeline.perf.common import extract_cfg, make_suite, random_encoder
    from pipeline.perf.extract import concurrent_extracts, process_cfgs

    enc = random_encoder("toy")
    manifest = make_suite(tmp_path, 4, enc.preprocess_cfg["size"][0])
    save_file({k: v.contiguous() for k, v in enc.model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    cfg = replace(extract_cfg(tmp_path, manifest, "toy", 4), threads=1, checkpoint=str(tmp_path / "w.safetensors"))
    good = process_cfgs(cfg, tmp_path / "p", 2)
    bad = replace(good[1], manifests={"shapes-sugarcrepe": str(tmp_path / "absent.parquet")})
    with pytest.raises(Exception, match="absent.parquet"):
        concurrent_extracts([good[0], bad])


def test_cpu_shares_split_the_machines_time_into_busy_stolen_and_idle(monkeypatch):
    """The shares are the block's differences of the machine's CPU times over their total
    (guest time is inside user time and not counted twice), and are left empty where the
    system reports no steal time."""
    from collections import namedtuple

    import psutil

    from pipeline.perf.common import cpu_shares

    Linux = namedtuple("Linux", "user nice system idle iowait irq softirq steal guest guest_nice")
    times = iter([Linux(10, 0, 5, 100, 1, 0, 0, 2, 3, 0), Linux(16, 1, 7, 104, 2, 0, 1, 4, 9, 0)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(times))
    with cpu_shares() as shares:
        assert shares == {}
    # deltas: user 6, nice 1, system 2, idle 4, iowait 1, softirq 1, steal 2 -> total 17
    assert shares == {"busy": round(10 / 17, 3), "steal": round(2 / 17, 3), "idle": round(5 / 17, 3)}

    Mac = namedtuple("Mac", "user nice system idle")
    times = iter([Mac(1, 0, 1, 1), Mac(2, 0, 2, 2)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(times))
    with cpu_shares() as shares:
        pass
    assert shares == {}


def test_bench_fgw_writes_every_case_against_pots_solvers(tmp_path, monkeypatch):
    """``pipeline bench fgw``: every size (and the mixed, padded case) at every alpha, each
    with POT's exact loop and, for fixed sizes, POT's batched entropic solver; the command
    that made the file is in it."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "fgw", "--problems", "3", "--pot-batch-problems", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "reports" / "bench" / "fgw.json").read_text())
    assert data["command"] == "pipeline bench fgw --problems 3 --pot-batch-problems 2 --threads 2"
    cases = data["results"]["cases"]
    assert len(cases) == 5 * 4 and {(c["n"], c["m"]) for c in cases} == {(2, 2), (4, 4), (8, 8), (3, 7), ("2..8", "2..8")}
    assert all(c["max_abs_diff"] < 1e-9 for c in cases)
    assert all(c["pot_batch_problems_timed"] == 2 for c in cases if c["n"] != "2..8")
