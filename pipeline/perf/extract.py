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

from pipeline.perf.common import bare_forward, extract_cfg, make_suite, random_encoder


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


def extract_scaling(n_images: int, schedulers: tuple[str, ...] = ("local:1", "local:2"), model: str = "toy", batch_size: int = 64) -> dict[str, Any]:
    """Distributed extract throughput on ``n_images`` random images per scheduler, against
    the single-process extract (2 torch threads), each into a fresh store; the stores are
    compared array by array.

    ``encode_s`` is the encoding phase (after planning, before the suite indexes: what more
    workers speed up); ``wall_s`` adds the cluster's start-up and the workers' model loads.
    A toy encoder runs random weights written to a checkpoint file in the bench's folder
    (every worker loads them from there; speed does not depend on the weights).

    ``single-1-thread`` is one process doing a CPU worker's work: one torch thread, decoding
    and writing in turn with the forward pass (``overlap=False``), so ``local:1`` against it is
    the cluster's own cost (tasks, scheduling, store opens); ``cores_used`` is process CPU time
    over wall time. ``processes`` runs that work in as many separate processes as the last
    scheduler has workers, at once and without dask, each into its own store: its throughput
    over ``single-1-thread``'s (``processes_speedup``) is what this machine gives that many
    workers before any cluster cost (shared caches and memory bandwidth, other load).
    """
    import os

    import numpy as np
    import zarr
    from safetensors.torch import save_file

    from pipeline.cache import store_path
    from pipeline.distributed import extract_distributed
    from pipeline.extraction import extract

    load = os.getloadavg()[0]
    torch_threads = torch.get_num_threads()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        enc = random_encoder(model)
        size = enc.preprocess_cfg["size"][0]
        manifest = make_suite(folder, n_images, size)
        checkpoint = folder / "random.safetensors"
        save_file({k: v.contiguous() for k, v in enc.model.state_dict().items()}, str(checkpoint))
        stores = {}
        for name in ("single", "single-1-thread", *schedulers):
            cfg = extract_cfg(folder, manifest, model, batch_size)
            cfg.threads, cfg.out = 1 if name == "single-1-thread" else 2, str(folder / name.replace(":", "-"))
            if enc.spec.toy:
                cfg.checkpoint = str(checkpoint)
            else:
                cfg.pretrained = "none"
            t0, cpu0 = time.perf_counter(), time.process_time()
            if name.startswith("single"):
                summary = extract(cfg, progress=False, overlap=name == "single")
            else:
                summary = extract_distributed(cfg, name, progress=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            runs[name] = {
                "encode_s": summary["seconds"], "wall_s": round(wall, 2),
                "images_per_s": round(n_images / summary["seconds"], 1),
                **({"workers": summary["workers"], "tasks": summary["tasks"]} if name in schedulers else {"cores_used": round(cpu / wall, 2)}),
            }  # fmt: skip
            torch.set_num_threads(torch_threads)
            stores[name] = zarr.open_group(store_path(cfg), mode="r")
        ref = stores["single"]
        for name in schedulers:
            same = all(
                np.array_equal(ref[k][...], stores[name][k][...])
                for k, node in ref.members(max_depth=None) if isinstance(node, zarr.Array)
            )  # fmt: skip
            runs[name]["identical_to_single"] = bool(same)
        first, last = schedulers[0], schedulers[-1]
        workers = int(last.split(":")[1]) if last.startswith("local:") else runs[last]["workers"]
        cfg = extract_cfg(folder, manifest, model, batch_size)
        cfg.threads = 1
        if enc.spec.toy:
            cfg.checkpoint = str(checkpoint)
        else:
            cfg.pretrained = "none"
        runs["processes"] = concurrent_extracts(cfg, folder / "processes", workers)
    return {
        "model": model, "n_images": n_images, "n_captions": 2 * n_images, "load_avg_1min": round(load, 2),
        "runs": runs,
        "speedup": round(runs[first]["encode_s"] / runs[last]["encode_s"], 2),
        "cores": os.cpu_count(),
        "processes_speedup": round(runs["processes"]["images_per_s"] / runs["single-1-thread"]["images_per_s"], 2),
        "goal": f"{last} >= 1.7x {first} (encode phase)",
    }  # fmt: skip


def concurrent_extracts(cfg, folder: Path, n: int) -> dict[str, Any]:
    """``n`` processes each extracting ``cfg``'s images into its own store under ``folder``
    at once (one torch thread, ``overlap=False``: a CPU worker's work, no cluster); each
    starts encoding after all have planned. ``images_per_s`` counts every process's images
    over the span from the first encode phase's start to the last one's end."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from dataclasses import replace

    context = mp.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(n, mp_context=context) as pool:
        barrier = manager.Barrier(n)
        spans = list(pool.map(_timed_extract, [replace(cfg, out=str(folder / str(i))) for i in range(n)], [barrier] * n))
    start, end = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    images = sum(k for _, _, k in spans)
    return {"processes": n, "images": images, "encode_s": round(end - start, 2), "images_per_s": round(images / (end - start), 1)}


def _timed_extract(cfg, barrier) -> tuple[float, float, int]:
    """(start, end, images encoded) of one process's encode phase of ``cfg``, in wall-clock
    seconds: extract's planning, encoding and finishing (:func:`pipeline.extraction.extract`
    without its lock), the encoding started once every process of ``barrier`` has planned."""
    from pipeline.encoders import load_encoder
    from pipeline.extraction import encode_rows, finish, prepare

    torch.set_num_threads(cfg.threads)
    enc = load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)
    root, plan = prepare(cfg, enc)
    barrier.wait()
    start = time.time()
    for modality, (rows, sources) in plan.todo.items():
        plan.bad.update(encode_rows(enc, root, modality, rows, sources, cfg, progress=False, overlap=False))
    end = time.time()
    finish(root, plan, cfg, end - start)
    return start, end, len(plan.todo["image"][0])
