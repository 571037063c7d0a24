"""Extract on dask.distributed: a LocalCluster and a real `dask scheduler` with two `dask
worker` processes each write the store one process writes; the model is loaded once per
worker; a client killed mid-run resumes to the same store."""

from __future__ import annotations

import dataclasses
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.cache import store_path
from pipeline.config import ExtractConfig, load_config
from pipeline.distributed import extract_distributed
from tests.stores import assert_same_store
from tests.test_crash import _params, _run, build_reference

pytestmark = pytest.mark.distributed
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return build_reference(tmp_path_factory, "dist")


def _cfg(tmp: Path, name: str) -> ExtractConfig:
    return load_config(ExtractConfig, _params(tmp, tmp / name), "extract")


def test_local_cluster_store_identical_model_loaded_once_per_worker(reference):
    tmp, ref = reference
    cfg = _cfg(tmp, "local2")
    summary = extract_distributed(cfg, "local:2", progress=False)
    assert summary["tasks"] >= 3 and summary["images"]["encoded"] == 300
    assert summary["encoder_loads"] == summary["workers"] <= 2  # once per worker, not per task
    assert_same_store(store_path(cfg), ref)
    again = extract_distributed(cfg, "local:1", progress=False)  # resumed: nothing left
    assert again["tasks"] == 0 and again["images"]["encoded"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_scheduler_and_two_workers(reference, monkeypatch):
    """Workers started in another folder than the client's, the store named by a relative
    path: the client makes it absolute, so the workers write the client's store."""
    tmp, ref = reference
    (tmp / "workers-cwd").mkdir(exist_ok=True)
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]  # fmt: skip
    try:
        time.sleep(2)
        for _ in range(2):
            procs.append(subprocess.Popen([BIN / "dask", "worker", address, "--nthreads", "1", "--no-dashboard", "--nworkers", "1"],
                                          cwd=tmp / "workers-cwd",
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        monkeypatch.chdir(tmp)
        cfg = dataclasses.replace(_cfg(tmp, "real"), out="real")  # relative to the client's folder
        summary = extract_distributed(cfg, address, progress=False)
        assert summary["workers"] == 2 and summary["encoder_loads"] == 2
        assert_same_store(tmp / "real" / "tiny-vit.zarr", ref)
        assert not (tmp / "workers-cwd" / "real").exists()
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.crash
@pytest.mark.parametrize("point,n", [("plan", 2), ("first_task", 1), ("index", 1), ("finalize", 1)])
def test_client_killed_then_resumed_store_is_identical(reference, point, n):
    tmp, ref = reference
    params = _params(tmp, tmp / f"dist-{point}")
    assert _run(params, point, n, scheduler="local:2") == -signal.SIGKILL
    assert _run(params, scheduler="local:2") == 0
    assert_same_store(tmp / f"dist-{point}" / "tiny-vit.zarr", ref)


def test_score_on_a_cluster_writes_the_single_process_metrics(reference):
    import json

    import yaml

    tmp, _ = reference
    params = yaml.safe_load(_params(tmp, tmp / "ref").read_text())
    outs = {}
    for name, extra in (("single", []), ("cluster", ["--scheduler", "local:2"])):
        params["score"] = {
            "variants": ["clip", "local-max", "additive"], "suites": ["shapes-sugarcrepe"], "encoder": "tiny-vit",
            "metrics_out": str(tmp / f"metrics-{name}"), "scores_out": str(tmp / f"scores-{name}"),
            "checkpoints": str(tmp / "no-checkpoints"),
        }  # fmt: skip
        path = tmp / f"score-{name}.yaml"
        path.write_text(yaml.safe_dump(params))
        done = subprocess.run([BIN / "pipeline", "score", "--params", str(path), "--quiet", *extra],
                              cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        outs[name] = {p.relative_to(tmp / f"metrics-{name}"): json.loads(p.read_text()) for p in (tmp / f"metrics-{name}").rglob("*.json")}
    assert len(outs["single"]) == 3 and outs["single"] == outs["cluster"]


def _worker_malloc_env():
    import os

    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_local_workers_keep_glibcs_adaptive_malloc(monkeypatch):
    """dask's nanny would set MALLOC_TRIM_THRESHOLD_ in each worker, which fixes glibc's mmap
    threshold and made the toy's forward pass 2.3x slower there; local:N workers run without it."""
    from pipeline.distributed import cluster

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # the nanny copies it from the parent too
    with cluster("local:1") as client:
        assert client.submit(_worker_malloc_env, pure=False).result() is None


def test_a_task_refuses_a_store_that_is_not_the_planned_one(reference):
    """A worker that sees another store at the client's address (a relative path resolved
    in another folder, another mount) is refused before it writes: the rows' keys differ."""
    import numpy as np

    from pipeline.distributed import encode_block

    tmp, ref = reference
    cfg = dataclasses.replace(_cfg(tmp, "ref"), out=str(ref.parent))
    rows = np.arange(4)
    with pytest.raises(ValueError, match="is not the store the client planned: its image rows 0-3 hold other content"):
        encode_block(cfg, "image", rows, [], np.zeros((4, 16), np.uint8))
    import zarr

    assert zarr.open_group(str(ref), mode="r")["image/done"][:4].all()  # nothing was touched


@pytest.mark.parametrize(("device", "overlap"), [("cpu", False), ("cuda", True)])
def test_a_cpu_worker_loads_and_writes_in_turn_a_gpu_worker_beside_the_encoder(reference, monkeypatch, device, overlap):
    """A task on a CPU worker (one core) runs extract's loading and writing in its own
    thread; one whose encoder runs on a GPU keeps them in helper threads beside it."""
    import numpy as np
    import zarr

    import pipeline.distributed as dist
    import pipeline.extraction as extraction

    tmp, ref = reference
    cfg = dataclasses.replace(_cfg(tmp, "ref"), out=str(ref.parent), device=device)
    seen = {}
    monkeypatch.setattr(dist, "worker_encoder", lambda cfg: object())
    monkeypatch.setattr(dist, "_LOADS", {dist.encoder_key(cfg): 1})
    monkeypatch.setattr(extraction, "encode_rows", lambda *a, **k: seen.update(k) or {})
    rows = np.arange(4)
    keys = zarr.open_group(str(ref), mode="r")["image/key"][:4]
    dist.encode_block(cfg, "image", rows, [], keys)
    assert seen["overlap"] is overlap


def _listener(reply: bytes | None) -> tuple[socket.socket, int]:
    """A TCP port that accepts and then says ``reply`` (or nothing, ever): not a scheduler."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if reply:
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("reply", [None, b"SSH-2.0-OpenSSH_9.6\r\n" * 64], ids=["silent", "talks-first"])
def test_a_port_that_is_no_scheduler_is_refused_in_time(monkeypatch, reply):
    import pipeline.distributed as dist

    monkeypatch.setattr(dist, "CONNECT_SECONDS", 3)
    server, port = _listener(reply)
    t0 = time.monotonic()
    try:
        with pytest.raises(OSError, match=rf"--scheduler tcp://127.0.0.1:{port}: .*not the dashboard's 8787"), dist.cluster(f"tcp://127.0.0.1:{port}"):
            pass
    finally:
        server.close()
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("scheduler,reason", [("tcp://127.0.0.1:{port}", "nothing answers there"), ("", "empty"), ("LOCAL:2", "lower case")])
def test_an_unusable_scheduler_is_refused_at_once(scheduler, reason):
    from pipeline.distributed import cluster

    t0 = time.monotonic()
    with pytest.raises(OSError, match=reason), cluster(scheduler.format(port=_free_port())):
        pass
    assert time.monotonic() - t0 < 6


def test_a_cluster_without_workers_is_reported(monkeypatch):
    from distributed import Client, LocalCluster

    import pipeline.distributed as dist

    monkeypatch.setattr(dist, "NO_WORKER_SECONDS", 1)
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as lc, Client(lc) as client:
        with pytest.warns(UserWarning, match="has had no worker for 1 s; the tasks wait"), dist.worker_watch(client, "here"):
            time.sleep(5)


def test_encoder_loads_count_this_runs_encoder_only(reference, monkeypatch):
    """A long-lived worker that loaded another model for an earlier run does not count it
    as a second load of this run's encoder."""
    import pipeline.distributed as dist

    tmp, _ = reference
    monkeypatch.setattr(dist, "_ENCODERS", {})
    monkeypatch.setattr(dist, "_LOADS", {})
    first = _cfg(tmp, "ref")
    other = dataclasses.replace(first, init_seed=1)
    assert dist.preload(first) == 1 and dist.preload(other) == 1 and dist.preload(first) == 1


def test_a_rewritten_checkpoint_or_another_seed_is_loaded_anew(tmp_path, monkeypatch):
    """A long-lived worker keys its encoders by the loading arguments and the checkpoint
    file's size and time: another init seed, or weights rewritten at the same path, load
    again; the same file is served from memory."""
    import os

    import pipeline.distributed as dist
    import pipeline.encoders

    loads = []
    monkeypatch.setattr(pipeline.encoders, "load_encoder", lambda *a, **kw: loads.append((a, kw)) or object())
    monkeypatch.setattr(dist, "_ENCODERS", {})
    monkeypatch.setattr(dist, "_LOADS", {})
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"first")
    cfg = ExtractConfig(model="tiny-test", pretrained=str(weights), checkpoint=str(weights))  # a real model's weights file
    a = dist.worker_encoder(cfg)
    assert dist.worker_encoder(cfg) is a and len(loads) == 1
    assert loads[0][1] == {"warn_random": False}  # the client has said the weights are random, if they are
    seeded = dist.worker_encoder(dataclasses.replace(cfg, init_seed=1))
    assert seeded is not a and loads[-1][0][-1] == 1
    weights.write_bytes(b"second")
    os.utime(weights, ns=(time.time_ns() + 10**9,) * 2)
    assert dist.worker_encoder(cfg) is not a and len(loads) == 3


def test_workers_get_absolute_local_paths_and_urls_as_given(tmp_path, monkeypatch):
    from pipeline.config import ScoreConfig
    from pipeline.distributed import for_workers

    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.safetensors").write_bytes(b"")
    cfg = ExtractConfig(model="ViT-B-32", out="features", manifests={"shapes-dev": "m/sc.parquet", "shapes-aro": "gs://b/m.parquet"},
                        image_roots={"shapes-dev": "images"}, pretrained="w.safetensors", checkpoint="ck/model.safetensors")  # fmt: skip
    got = for_workers(cfg)
    assert got.out == str(tmp_path / "features") and got.checkpoint == str(tmp_path / "ck/model.safetensors")
    assert got.manifests == {"shapes-dev": str(tmp_path / "m/sc.parquet"), "shapes-aro": "gs://b/m.parquet"}
    assert got.image_roots == {"shapes-dev": str(tmp_path / "images")} and got.pretrained == str(tmp_path / "w.safetensors")
    assert for_workers(dataclasses.replace(cfg, pretrained="none", out="s3://b/x")).pretrained == "none"
    assert for_workers(dataclasses.replace(cfg, out="s3://b/x")).out == "s3://b/x"
    score = for_workers(ScoreConfig(scores_out="s", metrics_out="m", checkpoints="c"))
    assert (score.scores_out, score.metrics_out, score.checkpoints) == tuple(str(tmp_path / n) for n in "smc")


def test_local_0_is_refused():
    from pipeline.distributed import cluster

    with pytest.raises(ValueError, match="at least 1"), cluster("local:0"):
        pass


def test_more_local_workers_than_the_cap_are_refused_before_any_starts():
    from pipeline.distributed import cluster, local_worker_cap

    with pytest.raises(ValueError, match=rf"local:99999: .* give N <= {local_worker_cap()},"), cluster("local:99999"):
        pass


def test_a_distributed_extract_into_a_locked_store_is_refused_before_a_cluster_starts(reference, monkeypatch):
    import pipeline.distributed as dist
    from pipeline.cache import store_lock
    from pipeline.cache.lock import StoreLockedError

    tmp, _ = reference
    cfg = _cfg(tmp, "ref")
    monkeypatch.setattr(dist, "cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    with store_lock(store_path(cfg)), pytest.raises(StoreLockedError):
        extract_distributed(cfg, "local:1")


def test_an_undecodable_image_is_refused_and_skipped_as_in_one_process(tmp_path):
    """A cut-off image: the distributed run refuses it, naming it, as one process does; with
    skip_bad_images both count it and write the same store."""
    from pipeline.extraction import extract
    from pipeline.manifests import BadImageError

    cfg = _cfg(tmp_path, "dist")
    cut = sorted((tmp_path / "images").iterdir())[0]
    cut.write_bytes(cut.read_bytes()[:100])
    one = dataclasses.replace(cfg, out=str(tmp_path / "one"))
    refusal = rf"1 image\(s\) cannot be decoded — .*{cut.name}"
    with pytest.raises(BadImageError, match=refusal):
        extract_distributed(cfg, "local:1", progress=False)
    with pytest.raises(BadImageError, match=refusal):
        extract(one, progress=False)
    got = extract_distributed(dataclasses.replace(cfg, skip_bad_images=True), "local:1", progress=False)
    want = extract(dataclasses.replace(one, skip_bad_images=True), progress=False)
    assert got["skipped_images"] == want["skipped_images"] == {"missing": 0, "bad": 1}
    assert_same_store(store_path(cfg), store_path(one))


def test_rows_left_undone_inside_a_block_are_resumed(reference, tmp_path):
    """A copy of the reference store with image rows 1 and 3 no longer marked done: the
    distributed run re-encodes those two (a block with gaps, its keys checked row by row)
    and gives the reference store back: every array bit for bit but the float32 pooled
    embeddings, which a batch of 2 rather than 16 changes in float rounding (as one process)."""
    import shutil

    import zarr

    tmp, ref = reference
    cfg = dataclasses.replace(_cfg(tmp, "ref"), out=str(tmp_path / "copy"))
    shutil.copytree(ref, store_path(cfg))
    done = zarr.open_group(str(store_path(cfg)), mode="r+")["image/done"]
    done[[1, 3]] = False
    summary = extract_distributed(cfg, "local:1", progress=False)
    assert summary["images"]["encoded"] == 2 and summary["tasks"] == 1
    assert_same_store(store_path(cfg), ref, rounding={"image/embed": 1e-6})


def test_workers_preload_before_the_first_task_and_task_keys_never_repeat(reference, tmp_path, monkeypatch):
    """Every worker loads the model (``Client.run(preload)``) before any task is submitted,
    a resumed run with nothing left loads nothing, and two runs with the same blocks submit
    tasks under different keys (one scheduler shared by two clients never merges them)."""
    from distributed import Client

    import pipeline.distributed as dist

    calls: list[tuple[str, str]] = []
    run, submit = Client.run, Client.submit
    monkeypatch.setattr(Client, "run", lambda self, f, *a, **k: calls.append(("run", f.__name__)) or run(self, f, *a, **k))
    monkeypatch.setattr(Client, "submit", lambda self, f, *a, **k: calls.append(("submit", k["key"])) or submit(self, f, *a, **k))
    tmp, _ = reference
    keys = []
    for name in ("first", "second"):
        calls.clear()
        dist.extract_distributed(dataclasses.replace(_cfg(tmp, "ref"), out=str(tmp_path / name)), "local:1", progress=False)
        assert calls[0] == ("run", "preload") and all(kind == "submit" for kind, _ in calls[1:]) and len(calls) > 2
        modalities = [key.split("-")[1] for _, key in calls[1:]]
        assert {"image", "text"} <= set(modalities) and modalities == sorted(modalities, key=lambda m: m == "text")  # pixels first
        keys.append({key for _, key in calls[1:]})
    assert not keys[0] & keys[1]
    calls.clear()
    assert dist.extract_distributed(dataclasses.replace(_cfg(tmp, "ref"), out=str(tmp_path / "first")), "local:1", progress=False)["tasks"] == 0
    assert calls == []


class _ScriptedClient:
    """A client whose scheduler reports the scripted worker counts, one per poll, then 1."""

    def __init__(self, counts: list[int]) -> None:
        self.counts, self.polls = list(counts), 0

    def scheduler_info(self) -> dict:
        self.polls += 1
        n = self.counts.pop(0) if self.counts else 1
        return {"workers": dict.fromkeys(range(n))}


@pytest.mark.parametrize(("counts", "seconds", "warned"), [
    ([0, 0, 0, 1, 0, 0], 0, 2),  # once per outage: told again after a worker came and went
    ([0, 0, 1, 1], 30, 0),  # workers joining within NO_WORKER_SECONDS: no warning
])  # fmt: skip
def test_the_no_worker_warning_comes_once_per_outage_and_only_after_its_wait(monkeypatch, counts, seconds, warned):
    import warnings

    import pipeline.distributed as dist

    monkeypatch.setattr(dist, "POLL_SECONDS", 0.005)
    monkeypatch.setattr(dist, "NO_WORKER_SECONDS", seconds)
    client = _ScriptedClient(counts)
    with warnings.catch_warnings(record=True) as caught, dist.worker_watch(client, "here"):
        warnings.simplefilter("always")
        while client.polls < len(counts) + 3:
            time.sleep(0.005)
    assert sum("has had no worker" in str(w.message) for w in caught) == warned


def test_the_worker_watch_stops_polling_when_its_block_ends(monkeypatch):
    """The watcher thread ends with its block: no poll of a client the caller has closed."""
    import pipeline.distributed as dist

    monkeypatch.setattr(dist, "POLL_SECONDS", 0.005)
    client = _ScriptedClient([])
    with dist.worker_watch(client, "here"):
        while client.polls < 2:
            time.sleep(0.005)
    polls = client.polls
    time.sleep(0.1)
    assert client.polls == polls
    assert not any(t.name == "worker-watch" for t in threading.enumerate())


def test_the_scaling_bench_runs_every_row_and_compares_every_store():
    """``pipeline bench extract --scheduler``'s measurement at its smallest: every row ran,
    every store equals the single process's, and the speed-ups are the rows' ratios."""
    from pipeline.perf.extract import extract_scaling

    out = extract_scaling(64, ("local:1", "local:2"), batch_size=16, repeats=1)
    runs = out["runs"]
    assert set(runs) == {"single", "single-1-thread", "local:1", "local:2", "processes:1", "processes:2"}
    assert runs["single-1-thread"]["identical_to_single"]
    for name in ("local:1", "local:2", "processes:1", "processes:2"):
        assert len(runs[name]) == 1 and runs[name][0]["identical_to_single"], name
    assert runs["processes:2"][0]["images"] == 128 and runs["local:2"][0]["workers"] <= 2
    assert out["speedups"] == [round(runs["local:1"][0]["encode_s"] / runs["local:2"][0]["encode_s"], 2)] and out["speedup"] == out["speedups"][0]
    assert out["processes_speedup"] == round(runs["processes:2"][0]["images_per_s"] / runs["processes:1"][0]["images_per_s"], 2)
    for name in ("local:1", "local:2", "processes:1", "processes:2"):
        shares = runs[name][0]["machine_cpu"]
        assert abs(sum(shares.values()) - 1) <= 0.002 and out["median_steal"][name] == shares["steal"], name


@pytest.mark.parametrize("batch", [4, 16, 64, 100, 192, 256, 320, 512])
@pytest.mark.parametrize("modality", ["image", "text", "object"])
def test_tasks_batch_their_rows_as_one_process_does(batch, modality):
    """Each forward pass's rows decide the last bits of its pooled embeddings, so a task
    block holds whole spans of the single-process batches: split by tasks, the rows fall into
    the same batches (192 images a batch against 256-row tasks once split one batch in two)."""
    import numpy as np

    from pipeline.cache.writer import shard_batches
    from pipeline.distributed import task_plan
    from pipeline.extraction import batch_size

    cfg = ExtractConfig(batch_size=batch)
    rows = np.flatnonzero(np.random.default_rng(batch).random(3000) < 0.8)  # rows left to encode, with gaps
    one = [b.tolist() for b in shard_batches(rows, batch_size(cfg, modality))]
    tasks = task_plan(cfg, modality, rows)
    assert [b.tolist() for block in tasks for b in shard_batches(block, batch_size(cfg, modality))] == one
    assert np.array_equal(np.concatenate(tasks), rows)
