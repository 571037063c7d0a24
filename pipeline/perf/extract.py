"""Extract's cost: wall time against a bare forward pass, and peak memory as images grow.

* :func:`extract_overhead`: extract wall time vs a bare forward pass (load + preprocess +
  encode, no store) of the same encoder over the same images and captions.
* :func:`extract_memory`: peak RSS of extract runs over growing numbers of images, each in
  a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.perf.common import bare_forward, cpu_shares, extract_cfg, make_suite, random_encoder


def extract_overhead(model: str, n_images: int, batch_size: int, repeats: int = 2) -> dict[str, Any]:
    """Extract vs bare forward on ``n_images`` random images (best of ``repeats``)."""
    from pipeline.extraction import extract

    enc = random_encoder(model)
    size = enc.preprocess_cfg["size"][0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = make_suite(folder, n_images, size)
        bare_forward(enc, folder, manifest, batch_size)  # warm-up (allocator, page cache)
        bare, ext = [], []
        for r in range(repeats):
            bare.append(bare_forward(enc, folder, manifest, batch_size))
            cfg = extract_cfg(folder, manifest, model, batch_size)
            cfg.out = str(folder / f"features{r}")
            t0 = time.perf_counter()
            extract(cfg, progress=False, encoder=enc)
            ext.append(time.perf_counter() - t0)
    return {
        "model": model,
        "weights": "random init",
        "n_images": n_images,
        "n_captions": 2 * n_images,
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "bare_forward_s": round(min(bare), 3),
        "extract_s": round(min(ext), 3),
        "ratio": round(min(ext) / min(bare), 3),
        "goal": "ratio <= 1.10",
    }


_MEMORY_CHILD = """
import json, resource, sys, tempfile, torch
from pathlib import Path
from pipeline.extraction import extract
from pipeline.perf import common
torch.set_num_threads(2)
n, model = int(sys.argv[1]), sys.argv[2]
enc = common.random_encoder(model)
with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    manifest = common.make_suite(folder, n, enc.preprocess_cfg["size"][0])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extract(common.extract_cfg(folder, manifest, model, 64), progress=False, encoder=enc)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"n_images": n, "peak_rss_mib_before_extract": before / 1024, "peak_rss_mib": after / 1024}))
"""


def extract_memory(sizes: list[int], model: str = "toy") -> dict[str, Any]:
    """Peak RSS of extract over growing image counts, each in a fresh process."""
    rows = []
    for n in sizes:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(n), model],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    peaks = [r["peak_rss_mib"] for r in rows]
    return {
        "model": model,
        "runs": rows,
        "growth_mib": round(peaks[-1] - peaks[0], 1),
        "growth_ratio": round(peaks[-1] / peaks[0], 3),
        "goal": "flat peak memory as images grow",
    }


def extract_scaling(n_images: int, schedulers: tuple[str, ...] = ("local:1", "local:2"), model: str = "toy", batch_size: int = 64, repeats: int = 3) -> dict[str, Any]:
    """Distributed extract throughput on ``n_images`` random images per scheduler, against
    one process and against the same work in plain processes; every run writes a fresh store,
    compared array by array with the single process's (``identical_to_single``).

    ``encode_s`` is the encoding phase (after planning, before the suite indexes: what more
    workers speed up); ``wall_s`` adds the cluster's start-up and the workers' model loads.
    A toy encoder runs random weights written to a checkpoint file in the bench's folder
    (every worker loads them from there; speed does not depend on the weights). The runs:

    * ``single``: one process at 2 torch threads, loading and writing beside the encoder;
    * ``single-1-thread``: one process doing a CPU worker's work (one torch thread, loading
      and writing in turn: ``overlap=False``); ``cores_used`` is its CPU time over wall time;
    * each scheduler, ``repeats`` times in turn (the machine's other load moves one run by
      several percent);
    * ``processes:1`` and ``processes:N`` (N: the last scheduler's workers), with each
      repeat: a worker's work in 1 and in N spawned processes at once, no dask
      (:func:`concurrent_extracts`): what this machine gives N workers before any cluster cost.

    ``speedups`` are, per repeat, the first scheduler's encode time over the last's, and
    ``processes_speedups`` ``processes:N``'s throughput over ``processes:1``'s; ``speedup``
    and ``processes_speedup`` are their medians. Every run records ``machine_cpu``, the
    machine's busy, stolen and idle shares of CPU time over the whole run
    (:func:`pipeline.perf.common.cpu_shares`), and ``median_steal`` gives each scheduler's
    and process count's median stolen share: on a virtual machine, what the hypervisor takes
    from runs that keep every core busy.
    """
    import os
    import shutil
    from dataclasses import replace

    import numpy as np
    from safetensors.torch import save_file

    from pipeline.cache import store_path
    from pipeline.distributed import extract_distributed
    from pipeline.extraction import extract

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    load = os.getloadavg()[0]
    torch_threads = torch.get_num_threads()
    runs: dict[str, Any] = {}
    last = schedulers[-1]
    workers = int(last.split(":")[1]) if last.startswith("local:") else None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        enc = random_encoder(model)
        manifest = make_suite(folder, n_images, enc.preprocess_cfg["size"][0])
        checkpoint = folder / "random.safetensors"
        save_file({k: v.contiguous() for k, v in enc.model.state_dict().items()}, str(checkpoint))
        base = extract_cfg(folder, manifest, model, batch_size)
        base = replace(base, checkpoint=str(checkpoint)) if enc.spec.toy else replace(base, pretrained="none")
        ref = store_path(replace(base, out=str(folder / "single")))

        def check(paths: list[Path]) -> bool:
            """Whether every store of ``paths`` equals the single process's; they are removed."""
            same = all(_same_store(ref, path) for path in paths)
            for path in paths:
                shutil.rmtree(path.parent)
            return same

        for name in ("single", "single-1-thread"):
            cfg = replace(base, threads=2 if name == "single" else 1, out=str(folder / name))
            t0, cpu0 = time.perf_counter(), time.process_time()
            with cpu_shares() as machine:
                summary = extract(cfg, progress=False, overlap=name == "single")
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            torch.set_num_threads(torch_threads)
            runs[name] = {
                "encode_s": summary["seconds"], "wall_s": round(wall, 2),
                "images_per_s": round(n_images / summary["seconds"], 1), "cores_used": round(cpu / wall, 2),
                "machine_cpu": machine,
            }  # fmt: skip
            if name != "single":
                runs[name]["identical_to_single"] = check([store_path(cfg)])
        for r in range(repeats):
            for name in schedulers:
                cfg = replace(base, threads=2, out=str(folder / f"{name.replace(':', '-')}-{r}"))
                t0 = time.perf_counter()
                with cpu_shares() as machine:
                    summary = extract_distributed(cfg, name, progress=False)
                torch.set_num_threads(torch_threads)
                runs.setdefault(name, []).append({
                    "encode_s": summary["seconds"], "wall_s": round(time.perf_counter() - t0, 2),
                    "images_per_s": round(n_images / summary["seconds"], 1), "workers": summary["workers"],
                    "tasks": summary["tasks"], "machine_cpu": machine, "identical_to_single": check([store_path(cfg)]),
                })  # fmt: skip
            workers = workers or runs[last][0]["workers"]  # a scheduler's address: the workers that ran
            for n in dict.fromkeys((1, workers)):
                cfgs = process_cfgs(replace(base, threads=1), folder / f"processes-{n}-{r}", n)
                with cpu_shares() as machine:
                    run = concurrent_extracts(cfgs)
                runs.setdefault(f"processes:{n}", []).append(
                    {**run, "machine_cpu": machine, "identical_to_single": check([store_path(c) for c in cfgs])}
                )
    speedups = [a["encode_s"] / b["encode_s"] for a, b in zip(runs[schedulers[0]], runs[last], strict=True)]
    steal = {name: float(np.median([run["machine_cpu"]["steal"] for run in runs[name]]))
             for name in (*schedulers, "processes:1", f"processes:{workers}") if all(run["machine_cpu"] for run in runs[name])}  # fmt: skip
    processes = [b["images_per_s"] / a["images_per_s"] for a, b in zip(runs["processes:1"], runs[f"processes:{workers}"], strict=True)]
    return {
        "model": model, "n_images": n_images, "n_captions": 2 * n_images, "load_avg_1min": round(load, 2),
        "repeats": repeats, "runs": runs,
        "speedups": [round(x, 2) for x in speedups], "speedup": round(float(np.median(speedups)), 2),
        "processes_speedups": [round(x, 2) for x in processes], "processes_speedup": round(float(np.median(processes)), 2),
        "median_steal": steal,
        "cores": os.cpu_count(),
        "goal": f"{last} >= 1.7x {schedulers[0]} (encode phase)",
    }  # fmt: skip


def _same_store(a: Path, b: Path) -> bool:
    """Whether the stores at ``a`` and ``b`` hold the same arrays with equal contents."""
    import numpy as np
    import zarr

    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    names = {k for k, node in ga.members(max_depth=None) if isinstance(node, zarr.Array)}
    if names != {k for k, node in gb.members(max_depth=None) if isinstance(node, zarr.Array)}:
        return False
    return all(np.array_equal(ga[k][...], gb[k][...]) for k in sorted(names))


def process_cfgs(cfg, folder: Path, n: int) -> list:
    """``n`` copies of ``cfg``, each writing its own store under ``folder`` (``folder/<i>``)."""
    from dataclasses import replace

    return [replace(cfg, out=str(folder / str(i))) for i in range(n)]


def concurrent_extracts(cfgs: list) -> dict[str, Any]:
    """Extract each config of ``cfgs`` in its own spawned process, all at once (one torch
    thread each, ``overlap=False``: a CPU worker's work, no cluster); every process plans
    first and they start encoding together. ``images_per_s`` counts every process's images
    over the span from the first encode phase's start to the last one's end."""
    import multiprocessing as mp
    import threading
    from concurrent.futures import ProcessPoolExecutor

    n = len(cfgs)
    context = mp.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(n)
        with ProcessPoolExecutor(n, mp_context=context) as pool:
            futures = [pool.submit(_timed_extract, cfg, barrier) for cfg in cfgs]
            errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:  # the failure itself, not the broken barrier it left the others
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    spans = [f.result() for f in futures]
    start, end = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    images = sum(k for _, _, k in spans)
    return {"processes": n, "images": images, "encode_s": round(end - start, 2), "images_per_s": round(images / (end - start), 1)}


BARRIER_SECONDS = 600  # how long a bench process waits for the others to finish planning


def _timed_extract(cfg, barrier) -> tuple[float, float, int]:
    """(start, end, images encoded) of one process's encode phase of ``cfg`` (monotonic
    seconds, one clock for every process on the machine): extract without its lock
    (:func:`pipeline.extraction.prepare`, then :func:`pipeline.extraction.encode_plan`), the
    encoding started once every process of ``barrier`` has planned. A process that fails
    before then breaks the barrier, so the others fail too instead of waiting for it."""
    from pipeline.encoders import load_encoder
    from pipeline.extraction import encode_plan, prepare

    try:
        torch.set_num_threads(cfg.threads)
        enc = load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)
        root, plan = prepare(cfg, enc)
    except BaseException:
        barrier.abort()
        raise
    barrier.wait(BARRIER_SECONDS)
    start = time.monotonic()
    summary = encode_plan(enc, root, plan, cfg, overlap=False)
    return start, start + summary["seconds"], summary["images"]["encoded"]
