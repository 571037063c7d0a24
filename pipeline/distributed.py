"""Extract on a dask.distributed cluster: the single-process extract's plan, encoded by
workers block by block.

    summary = extract_distributed(cfg, "local:2")            # a LocalCluster of 2 workers
    summary = extract_distributed(cfg, "tcp://10.0.0.5:8786") # a running scheduler

The client holds the store's lock, plans every row (:func:`pipeline.extraction.prepare`),
and writes the suite indexes at the end (:func:`pipeline.extraction.finish`), exactly as one
process does. In between, each task encodes one block of rows from
:func:`pipeline.cache.writer.task_blocks`: blocks never share a chunk or shard file of any
array, so concurrent tasks never read-modify-write one file, and a retried task (a worker
lost mid-block) rewrites only its own files with the same bytes. Tasks are submitted with
``pure=False``. Every worker loads the encoder once, before the first task is submitted
(a worker that joins later, on its first task), and keeps it for the next ones
(:func:`worker_encoder`). Workers open the store themselves: it must be on a path
or URL every worker sees (a shared disk, or an fsspec URL with ``extract.storage_options``).

The DVC stage does not use this module: ``pipeline extract`` imports it only with
``--scheduler``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from pipeline.config import ExtractConfig

# dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in every worker it spawns; any fixed value
# turns off glibc's adaptive mmap threshold, so each large tensor of the forward pass is
# mmapped and unmapped again, and the toy's encoder ran 2.3x slower in a worker than in
# one process (`pipeline bench extract --scheduler ...`). Our local workers keep glibc's
# default; `dask worker --no-nanny` does the same for workers started by hand.
NANNY_MALLOC = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
BLOCK_ROWS = {"text": 256, "image": 256, "object": 256}  # rows per task: one chunk of the unsharded arrays
_ENCODERS: dict[tuple, Any] = {}  # per worker process: encoder arguments -> Encoder
_LOADS = {"n": 0}  # encoders this process has loaded (the once-per-worker test reads it)


@contextmanager
def cluster(scheduler: str) -> Iterator[Any]:
    """A ``distributed.Client`` for ``scheduler``: ``local:N`` starts (and afterwards stops)
    a ``LocalCluster`` of N single-threaded worker processes; anything else is a scheduler
    address to connect to."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler.startswith("local:"):
        count = scheduler.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--scheduler {scheduler}: local:N needs a worker count N of at least 1 (e.g. local:2)")
        n = int(count)
        with (
            dask.config.set({NANNY_MALLOC: None}),
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None) as lc,
            Client(lc) as client,
        ):
            yield client
        return
    try:
        client = Client(scheduler, timeout="20s")
    except (OSError, ValueError, TypeError) as e:  # unreachable, or not an address at all
        raise OSError(
            f"--scheduler {scheduler}: cannot reach a dask scheduler there ({e}); give a scheduler's "
            f"address (tcp://HOST:PORT, started with `dask scheduler`) or local:N for N local workers"
        ) from None
    with client:
        yield client


def worker_encoder(cfg: ExtractConfig):
    """The encoder of ``cfg``, loaded once per worker process and reused by its tasks."""
    import torch

    from pipeline.encoders import load_encoder

    key = (cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)
    if key not in _ENCODERS:
        torch.set_num_threads(1)  # single-threaded workers: one core each
        _ENCODERS[key] = load_encoder(*key)
        _LOADS["n"] += 1
    return _ENCODERS[key]


def preload(cfg: ExtractConfig) -> int:
    """Load this worker's encoder (``Client.run`` on every worker); returns the count of
    encoders it has loaded, not the encoder (which would travel back to the client)."""
    worker_encoder(cfg)
    return _LOADS["n"]


def encode_block(cfg: ExtractConfig, modality: str, rows: np.ndarray, sources: list) -> dict[str, Any]:
    """One task: encode ``rows`` of ``modality`` into the store of ``cfg`` (opened here).

    Returns the block's undecodable rows (as ``[modality, row, reason]``), this worker's pid
    and how many encoders it has loaded so far."""
    from pipeline.cache import store_path
    from pipeline.cache.location import StoreLocation
    from pipeline.extraction import encode_rows

    enc = worker_encoder(cfg)
    root = StoreLocation.of(store_path(cfg), cfg.storage_options).open("r+")
    bad = encode_rows(enc, root, modality, rows, sources, cfg, progress=False)
    return {"bad": [[m, int(r), why] for (m, r), why in bad.items()], "pid": os.getpid(), "loads": _LOADS["n"]}


def extract_distributed(
    cfg: ExtractConfig, scheduler: str, progress: bool = True, repair: bool = False, break_lock: bool = False
) -> dict[str, Any]:
    """:func:`pipeline.extraction.extract` with the encoding spread over a dask cluster.

    Returns extract's summary plus ``scheduler``, ``workers`` (worker processes that ran a
    task), ``tasks`` and ``encoder_loads`` (encoders loaded, summed over workers: one per
    worker when each loaded once).
    """
    import torch
    from distributed import as_completed
    from tqdm import tqdm

    from pipeline.cache import store_lock, store_path, writer
    from pipeline.encoders import load_encoder
    from pipeline.extraction import finish, prepare

    torch.set_num_threads(cfg.threads)
    enc = load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)  # fingerprint, dims, projections
    with store_lock(store_path(cfg), break_lock, cfg.storage_options), cluster(scheduler) as client:
        root, plan = prepare(cfg, enc, repair, progress)
        if any(len(rows) for rows, _ in plan.todo.values()):
            client.run(preload, cfg)  # every worker loads the model now, in parallel, and fails early
        t0 = time.perf_counter()
        futures, sizes = [], {}
        for modality, (rows, sources) in plan.todo.items():
            position = {int(r): i for i, r in enumerate(rows)}
            for block in writer.task_blocks(rows, BLOCK_ROWS[modality]):
                picked = [sources[position[int(r)]] for r in block]
                key = f"encode-{modality}-{int(block[0])}-{int(block[-1])}-{os.getpid()}-{time.time_ns()}"
                futures.append(client.submit(encode_block, cfg, modality, block, picked, pure=False, key=key))
                sizes[key] = len(block)
        total = sum(len(rows) for rows, _ in plan.todo.values())
        bar = tqdm(total=total, desc=f"extract on {scheduler}", unit="row", disable=not progress)
        results = []
        for future in as_completed(futures):
            out = future.result()
            results.append(out)
            bar.update(sizes[future.key])
        bar.close()
        for out in results:
            plan.bad.update({(m, r): why for m, r, why in out["bad"]})
        summary = finish(root, plan, cfg, time.perf_counter() - t0)
    loads = {}
    for out in results:
        loads[out["pid"]] = max(loads.get(out["pid"], 0), out["loads"])
    return {**summary, "scheduler": scheduler, "workers": len(loads), "tasks": len(futures),
            "encoder_loads": int(sum(loads.values()))}  # fmt: skip
