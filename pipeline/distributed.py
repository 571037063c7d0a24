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
The client makes every relative path absolute first (:func:`for_workers`), and each task
checks that the rows it writes hold the keys the client planned (:func:`encode_block`), so
a worker that sees another store at that address fails instead of writing into it.

The DVC stage does not use this module: ``pipeline extract`` imports it only with
``--scheduler``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import stat
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import ExtractConfig

# dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in every worker it spawns; any fixed value
# turns off glibc's adaptive mmap threshold, so each large tensor of the forward pass is
# mmapped and unmapped again, and the encoder runs far slower in a worker than in one
# process (`pipeline bench extract --scheduler ...`; docs/trials.md). Our local workers keep
# glibc's default; `dask worker --no-nanny` does the same for workers started by hand.
NANNY_MALLOC = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
BLOCK_ROWS = {"text": 256, "image": 256, "object": 256}  # least rows per task (:func:`task_plan`): a chunk of the unsharded arrays
_ENCODERS: dict[tuple, Any] = {}  # per worker process: encoder arguments -> Encoder
_LOADS: dict[tuple, int] = {}  # per worker process: encoder arguments -> times loaded (the once-per-worker test reads it)
CONNECT_SECONDS = 20  # how long the client waits for a scheduler to answer
PATH_FIELDS = ("checkpoint", "world", "out", "manifests", "image_roots", "checkpoints", "scores_out", "metrics_out")
NO_WORKER_SECONDS = 30  # a cluster without workers this long is reported (the run waits for one)
POLL_SECONDS = 2  # how often the client asks the scheduler for its workers


def for_workers(cfg: Any) -> Any:
    """``cfg`` (an extract or score config) with every relative local path made absolute
    against this process's working directory, and ``pretrained`` too when it names a file
    here: a worker started elsewhere (``dask worker`` in another folder) would resolve a
    relative path against its own folder and read or write another store. URLs stay as
    they are."""
    from pipeline.cache.location import is_url

    def absolute(value: str) -> str:
        return value if is_url(value) or Path(value).is_absolute() else str(Path(value).resolve())

    changes: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in PATH_FIELDS and isinstance(value, str):
            changes[f.name] = absolute(value)
        elif f.name in PATH_FIELDS and isinstance(value, dict):
            changes[f.name] = {k: absolute(v) for k, v in value.items()}
    pretrained = getattr(cfg, "pretrained", None)
    if isinstance(pretrained, str) and Path(pretrained).is_file():
        changes["pretrained"] = str(Path(pretrained).resolve())
    return dataclasses.replace(cfg, **changes)


def _refuse(scheduler: str, reason: str) -> OSError:
    return OSError(
        f"--scheduler {scheduler}: {reason}; give a dask scheduler's address (tcp://HOST:PORT, "
        f"started with `dask scheduler`; 8786 by default, not the dashboard's 8787) or local:N for N local workers"
    )


def _probe(scheduler: str) -> None:
    """Fail at once when nothing listens at a ``tcp://`` address (dask's own client retries
    a refused connection until its timeout)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(scheduler)
        if scheme != "tcp":
            return
        host, port = parse_host_port(location)
    except ValueError as e:
        raise _refuse(scheduler, f"not an address ({e})") from None
    if not 0 < port < 65536:
        raise _refuse(scheduler, f"port {port} is outside 1-65535")
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise _refuse(scheduler, f"nothing answers there ({e.strerror or e})") from None


def _connect(scheduler: str):
    """``Client(scheduler)``, given up after :data:`CONNECT_SECONDS` even where dask's own
    timeout does not end the wait (a port that accepts the connection but is not a
    scheduler, e.g. the dashboard's HTTP port, leaves the handshake waiting forever)."""
    from distributed import Client

    _probe(scheduler)
    done: dict[str, Any] = {}

    def connect() -> None:
        try:
            done["client"] = Client(scheduler, timeout=f"{CONNECT_SECONDS}s")
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            done["error"] = e

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(CONNECT_SECONDS + 5)
    if thread.is_alive():
        raise _refuse(scheduler, f"no dask scheduler answered within {CONNECT_SECONDS + 5} s")
    if "error" in done:
        e = done["error"]
        if isinstance(e, (OSError, ValueError, TypeError, MemoryError, TimeoutError)):
            reason = "not a dask scheduler's reply" if isinstance(e, MemoryError) else f"cannot reach a dask scheduler there ({e})"
            raise _refuse(scheduler, reason) from None
        raise e
    return done["client"]


def local_worker_cap() -> int:
    """The most local workers ``local:N`` starts: four per core (at least 8). Past the cores
    they only queue for them, and each holds a model; ``local:99999`` would spend minutes
    starting processes before failing for memory."""
    return max(8, 4 * (os.cpu_count() or 1))


@contextmanager
def cluster(scheduler: str, quiet: bool = False) -> Iterator[Any]:
    """A ``distributed.Client`` for ``scheduler``: ``local:N`` starts (and afterwards stops)
    a ``LocalCluster`` of N single-threaded worker processes; anything else is a scheduler
    address to connect to (refused in one line when nothing there answers as a scheduler).
    ``quiet`` keeps dask's own INFO logging off the terminal."""
    import dask
    from distributed import Client, LocalCluster

    if quiet:
        logging.getLogger("distributed").setLevel(logging.WARNING)
    scheduler = scheduler.strip()  # a pasted address's trailing space or newline
    if not scheduler:
        raise _refuse(repr(scheduler), "empty")
    if scheduler.lower().startswith("local:") and not scheduler.startswith("local:"):
        raise _refuse(scheduler, "write local:N in lower case")
    if scheduler.startswith("local:"):
        count = scheduler.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--scheduler {scheduler}: local:N needs a worker count N of at least 1 (e.g. local:2)")
        n, most = int(count), local_worker_cap()
        if n > most:
            raise ValueError(
                f"--scheduler {scheduler}: local:N starts N worker processes here, each with the model loaded, and "
                f"this machine has {os.cpu_count()} cores: give N <= {most}, or a scheduler's address for more"
            )
        with (
            dask.config.set({NANNY_MALLOC: None}),
            # the workers' own logs stay quiet: a failed task reaches the client, which names it in one line
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.CRITICAL) as lc,
            Client(lc) as client,
        ):
            yield client
        return
    with _connect(scheduler) as client:
        yield client


@contextmanager
def worker_watch(client: Any, scheduler: str) -> Iterator[None]:
    """While the block runs, warn (once per outage) when the cluster has had no worker for
    :data:`NO_WORKER_SECONDS`: its tasks then wait for a worker to join, and the user is
    told so instead of watching a frozen progress bar. The watcher has ended when the block
    has, so it never polls a client its caller then closes."""
    stop = threading.Event()

    def watch() -> None:
        since, told = None, False
        while not stop.wait(POLL_SECONDS):
            try:
                n = len(client.scheduler_info().get("workers", {}))
            except Exception:  # noqa: BLE001 - the client is closing
                return
            if n:
                since, told = None, False
            elif since is None:
                since = time.monotonic()
            elif not told and time.monotonic() - since >= NO_WORKER_SECONDS:
                warnings.warn(
                    f"{scheduler} has had no worker for {NO_WORKER_SECONDS} s; the tasks wait for one to "
                    "join (start `dask worker`), or stop this run: the store resumes where it stopped",
                    stacklevel=1,
                )
                told = True

    thread = threading.Thread(target=watch, name="worker-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(CONNECT_SECONDS)  # a poll under way ends first (bounded: a stuck client never hangs the run)


def worker_encoder(cfg: ExtractConfig):
    """The encoder of ``cfg``, loaded once per worker process and reused by its tasks (its
    random-weights warning left to the client, which loads it too)."""
    import torch

    from pipeline.encoders import load_encoder

    key = encoder_key(cfg)
    if key not in _ENCODERS:
        torch.set_num_threads(1)  # single-threaded workers: one core each
        _ENCODERS[key] = load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed, warn_random=False)
        _LOADS[key] = _LOADS.get(key, 0) + 1
    return _ENCODERS[key]


def _file_stamp(path: str | None) -> tuple[int, int] | None:
    """(size, mtime in ns) of ``path`` where it names a local file, else None."""
    try:
        st = os.stat(path) if path else None
    except (OSError, ValueError):
        return None
    return (st.st_size, st.st_mtime_ns) if st is not None and stat.S_ISREG(st.st_mode) else None


def encoder_key(cfg: ExtractConfig) -> tuple:
    """Which encoder a worker holds for ``cfg``: the loading arguments, and the size and
    modification time of the checkpoint and weights files, so a long-lived worker loads a
    file rewritten at the same path again instead of serving its old weights."""
    files = (_file_stamp(cfg.checkpoint), _file_stamp(cfg.pretrained))
    return (cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed, files)


def preload(cfg: ExtractConfig) -> int:
    """Load this worker's encoder (``Client.run`` on every worker); returns how often this
    process has loaded it, not the encoder (which would travel back to the client)."""
    worker_encoder(cfg)
    return _LOADS[encoder_key(cfg)]


def task_plan(cfg: ExtractConfig, modality: str, rows: np.ndarray) -> list[np.ndarray]:
    """The tasks' blocks of sorted ``rows``: at least :data:`BLOCK_ROWS`, each a whole number
    of the spans one forward pass covers in a single process, so every task batches its rows
    as that process would (the same rows in each forward pass, so the same bits stored)."""
    from pipeline.cache import writer
    from pipeline.extraction import batch_size

    span = math.lcm(BLOCK_ROWS[modality], writer.batch_rows(batch_size(cfg, modality)))
    return list(writer.task_blocks(rows, span))


def encode_block(cfg: ExtractConfig, modality: str, rows: np.ndarray, sources: list, keys: np.ndarray) -> dict[str, Any]:
    """One task: encode ``rows`` of ``modality`` into the store of ``cfg`` (opened here).

    ``keys`` ([b, 16] uint8) are the content keys the client planned at those rows; a store
    that holds other keys there is not the client's (another store at the same address as
    this worker sees it) and is refused before anything is written.

    Returns the block's undecodable rows (as ``[modality, row, reason]``), this worker's pid
    and how often it has loaded this encoder."""
    from pipeline.cache import store_path
    from pipeline.cache.location import StoreLocation
    from pipeline.extraction import encode_rows

    enc = worker_encoder(cfg)
    path = store_path(cfg)
    root = StoreLocation.of(path, cfg.storage_options).open("r+")
    stored = root[f"{modality}/key"]
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi > stored.shape[0] or not np.array_equal(stored[lo:hi][rows - lo], keys):
        raise ValueError(
            f"{path} on worker {socket.gethostname()} (pid {os.getpid()}) is not the store the client planned: its "
            f"{modality} rows {lo}-{hi - 1} hold other content; give extract.out as a path or URL that names one "
            "store on every machine (a shared disk or an fsspec URL)"
        )
    # a CPU worker has one core: decoding and writing take turns with the forward pass rather
    # than competing for the cores the machine's other workers encode on
    bad = encode_rows(enc, root, modality, rows, sources, cfg, progress=False, overlap=cfg.device != "cpu")
    return {"bad": [[m, int(r), why] for (m, r), why in bad.items()], "pid": os.getpid(), "loads": _LOADS[encoder_key(cfg)]}


def extract_distributed(
    cfg: ExtractConfig, scheduler: str, progress: bool = True, repair: bool = False, break_lock: bool = False
) -> dict[str, Any]:
    """:func:`pipeline.extraction.extract` with the encoding spread over a dask cluster.

    Returns extract's summary plus ``scheduler``, ``workers`` (worker processes that ran a
    task), ``tasks`` and ``encoder_loads`` (loads of this run's encoder, summed over those
    workers: one per worker when each loaded it once; encoders a long-lived worker loaded for
    other runs do not count).
    """
    import torch
    from distributed import as_completed
    from tqdm import tqdm

    from pipeline.cache import store_lock, writable_store_path
    from pipeline.encoders import load_encoder
    from pipeline.extraction import finish, prepare, suite_sources

    cfg = for_workers(cfg)
    torch.set_num_threads(cfg.threads)
    sources = suite_sources(cfg)  # a wrong suite or path fails before the lock, the cluster and the model
    # the lock first: a store another process writes is refused before any cluster starts
    with store_lock(writable_store_path(cfg), break_lock, cfg.storage_options), cluster(scheduler, quiet=not progress) as client:
        enc = load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)  # fingerprint, dims, projections
        root, plan = prepare(cfg, enc, repair, progress, sources)
        if any(len(rows) for rows, _ in plan.todo.values()):
            client.run(preload, cfg)  # every worker loads the model now, in parallel, and fails early
        t0 = time.perf_counter()
        futures, sizes = [], {}
        # the heaviest blocks first (pixels before captions), so the cheap caption blocks fill
        # the workers' tails instead of one worker finishing an image block alone
        for modality in sorted(plan.todo, key=lambda m: m == "text"):
            rows, sources = plan.todo[modality]
            position = {int(r): i for i, r in enumerate(rows)}
            key_of_row = {r: k for k, r in plan.row_of.get(modality, {}).items()}
            for block in task_plan(cfg, modality, rows):
                picked = [sources[position[int(r)]] for r in block]
                keys = np.frombuffer(b"".join(bytes.fromhex(key_of_row[int(r)]) for r in block), dtype=np.uint8).reshape(len(block), -1)
                key = f"encode-{modality}-{int(block[0])}-{int(block[-1])}-{os.getpid()}-{time.time_ns()}"
                futures.append(client.submit(encode_block, cfg, modality, block, picked, keys, pure=False, key=key))
                sizes[key] = len(block)
        total = sum(len(rows) for rows, _ in plan.todo.values())
        bar = tqdm(total=total, desc=f"extract on {scheduler}", unit="row", disable=not progress)
        results = []
        with worker_watch(client, scheduler):
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
