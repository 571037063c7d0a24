"""Bench: the score and train stages' feature-store reads: zarr selections against dask.

    .venv/bin/python scripts/bench_reads.py --out /tmp/reads.json          # builds a store
    .venv/bin/python scripts/bench_reads.py --store cache/features/toy.zarr --suite shapes-train

Patterns timed (one warm-up pass of each method, then ``--repeats`` rounds running each
method once in turn; median seconds per pass and MB/s of the arrays returned, at their
stored dtypes):

* ``score_batches_*``: the score stage's ``choice_batches`` (``pipeline/scoring.py``): items in
  manifest order, batches of ``--batch-size`` with the same option count, each batch reading
  image/early, image/final, image/embed for its images and text/tokens, ids, mask, embed for
  each option's captions (``grids=True``, the grid scorers). ``ordered`` is the suite as
  extract writes it (item i -> image row i, captions 2i and 2i+1); ``shuffled`` is the same
  suite with its items permuted, so each batch touches rows in every shard (as scoring with
  ``replacement_images`` does).
* ``train_one_shot``: training's ``load_pairs`` (``pipeline/training/pairs.py``): every image and
  text column's sorted unique rows, each array read once.

Methods, each over the same rows, checked to return the same arrays:

* ``zarr_orthogonal``: zarr's integer (orthogonal) selection of the sorted unique rows (the
  baseline);
* ``dask_threads2`` / ``dask_sync``: a dask view of the array (``da.from_zarr``, one chunk
  per shard; built once, outside the timing) indexed with the rows and ``.compute()``-d
  under the threaded scheduler with 2 workers, or single-threaded;
* ``gather``: ``FeatureStore._gather``, the store's reader (one slice per run of nearby rows);
* ``features``: the whole ``store.images`` / ``store.texts`` call (done check, float32 and
  torch conversion), for scale.

Without ``--store`` the store is built with random features at the toy encoder's dims (8x8
grid, widths 128, context 32) through ``pipeline.cache.writer``: the layout (shards, inner
chunks, codecs) is the real one; the values are not (compressed arrays - embeddings, ids -
compress differently; the grids and token states are stored raw). The store sits in the page
cache after it is written, so the figures are decode and bookkeeping costs, not disk reads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.cache import FeatureStore, writer  # noqa: E402
from pipeline.cache.schema import (  # noqa: E402
    IMAGE_ARRAYS,
    KEY_BYTES,
    SHARD_ROWS,
    TEXT_ARRAYS,
    chunk_rows,
    resolve_tail,
)
from pipeline.scoring import choice_batch_rows  # noqa: E402

IMAGE_GRID_ARRAYS = ("image/early", "image/final", "image/embed")  # store.images(grids=True)
TEXT_GRID_ARRAYS = ("text/tokens", "text/ids", "text/mask", "text/embed")  # store.texts(grids=True)
METHODS = ("zarr_orthogonal", "dask_threads2", "dask_sync", "gather")  # the first is the baseline
TOY_DIMS = {"d_v": 128, "d_t": 128, "embed_dim": 128, "context_length": 32}


# ---------------------------------------------------------------- building a store


def build_store(path: Path, n_images: int, grid: int, seed: int = 0) -> None:
    """A store of ``n_images`` images and ``2 * n_images`` captions of random features, with
    suites ``bench-ordered`` (item i: image i, captions 2i, 2i+1) and ``bench-shuffled``
    (the same items, permuted)."""
    rng = np.random.default_rng(seed)
    dims = {"grid": [grid, grid], **TOY_DIMS}
    fingerprint = {"encoder": "bench-random", "grid": [grid, grid], "seed": seed}
    root = writer.open_for_writing(path, fingerprint, dims)
    d_v, d_t, D, C = dims["d_v"], dims["d_t"], dims["embed_dim"], dims["context_length"]
    writer.write_params(
        root,
        {
            "visual_proj": rng.standard_normal((d_v, D)),
            "text_projection": rng.standard_normal((d_t, D)),
            "logit_scale": np.float32(100.0),
        },
    )
    tokens_v = grid * grid + 1
    img_rows, _ = writer.plan_rows(root, "image", _keys(rng, n_images))
    for rows in writer.shard_batches(img_rows, 4 * SHARD_ROWS):
        b = len(rows)
        writer.write_rows(
            root,
            "image",
            rows,
            {
                "early": rng.standard_normal((b, tokens_v, d_v), dtype=np.float32),
                "final": rng.standard_normal((b, tokens_v, d_v), dtype=np.float32),
                "embed": rng.standard_normal((b, D), dtype=np.float32),
            },
        )
    txt_rows, _ = writer.plan_rows(root, "text", _keys(rng, 2 * n_images))
    for rows in writer.shard_batches(txt_rows, 4 * SHARD_ROWS):
        b = len(rows)
        length = rng.integers(4, C + 1, b)
        mask = np.arange(C)[None] < length[:, None]
        writer.write_rows(
            root,
            "text",
            rows,
            {
                "ids": np.where(mask, rng.integers(1, 49408, (b, C)), 0),
                "mask": mask,
                "tokens": rng.standard_normal((b, C, d_t), dtype=np.float32),
                "embed": rng.standard_normal((b, D), dtype=np.float32),
            },
        )
    images = img_rows[:, None]  # [n, 1]
    captions = txt_rows.reshape(n_images, 2)  # [n, 2]
    perm = rng.permutation(n_images)
    for suite, order in (("bench-ordered", np.arange(n_images)), ("bench-shuffled", perm)):
        writer.write_suite_index(
            root,
            suite,
            {"image": ("image", images[order]), "captions": ("text", captions[order])},
            {"manifest_sha256": "bench", "n_items": n_images},
        )
    writer.finalize(root)


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    keys = rng.integers(0, 256, (n, KEY_BYTES), dtype=np.uint8)
    keys[:, :8] = np.arange(n, dtype=">u8").view(np.uint8).reshape(n, 8)  # unique
    return keys


# ---------------------------------------------------------------- the stages' read patterns


def score_batches(
    index: dict[str, np.ndarray], batch_size: int
) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """(image rows, [caption rows per option]) per batch: the score stage's batches
    (:func:`pipeline.scoring.choice_batch_rows`)."""
    return [(img, caps) for _, img, caps in choice_batch_rows(index, batch_size)]


def train_rows(
    store: FeatureStore, suite: str, index: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique rows >= 0 of every image and every text column, as ``load_pairs``."""
    kinds = store.suite_attrs(suite).get("kinds", {})
    rows = {"image": [], "text": []}
    for column, values in index.items():
        rows[kinds.get(column, "image" if "image" in column else "text")].append(values.ravel())
    img, txt = (
        np.unique(np.concatenate(rows[m] or [np.zeros(0, np.int64)])) for m in ("image", "text")
    )
    return img[img >= 0], txt[txt >= 0]


# ---------------------------------------------------------------- read methods


def dask_views(store: FeatureStore) -> dict[str, da.Array]:
    """One dask array per data array, one chunk per shard."""
    views = {}
    for name in IMAGE_GRID_ARRAYS + TEXT_GRID_ARRAYS:
        arr = store.root[name]
        rows = SHARD_ROWS if arr.shards is not None else arr.chunks[0]
        views[name] = da.from_zarr(arr, chunks=(rows, *arr.shape[1:]))
    return views


def orthogonal_gather(arr: zarr.Array, rows: np.ndarray) -> np.ndarray:
    """Zarr's integer (orthogonal) selection of the sorted unique rows, then the caller's
    order in memory."""
    uniq, inverse = np.unique(np.asarray(rows, dtype=np.int64), return_inverse=True)
    return arr.get_orthogonal_selection((uniq,))[inverse]


def reader(
    store: FeatureStore, method: str, views: dict[str, da.Array]
) -> Callable[[str, np.ndarray], np.ndarray]:
    if method == "zarr_orthogonal":
        return lambda name, rows: orthogonal_gather(store.root[name], rows)
    if method == "gather":
        return store._gather
    if method == "dask_threads2":
        return lambda name, rows: views[name][rows].compute(scheduler="threads", num_workers=2)
    if method == "dask_sync":
        return lambda name, rows: views[name][rows].compute(scheduler="synchronous")
    raise ValueError(method)


def read_batches(read, batches) -> tuple[int, list[np.ndarray]]:
    """One pass: every batch's image and option arrays; returns bytes read and the arrays."""
    got = []
    for img, options in batches:
        for name in IMAGE_GRID_ARRAYS:
            got.append(read(name, img))
        for cap in options:
            for name in TEXT_GRID_ARRAYS:
                got.append(read(name, cap))
    n = sum(a.nbytes for a in got)
    return n, got


def read_features(store: FeatureStore, batches) -> int:
    n = 0
    for img, options in batches:
        im = store.images(img)
        n += sum(t.numel() * t.element_size() for t in (im.early, im.final, im.cls, im.embed))
        for cap in options:
            tx = store.texts(cap)
            n += sum(t.numel() * t.element_size() for t in (tx.tokens, tx.ids, tx.mask, tx.embed))
    return n


def time_all(fns: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict]:
    """One warm-up pass of each, then ``repeats`` rounds running each once in turn (the
    machine is shared: interleaving spreads any load over every method alike)."""
    times: dict[str, list[float]] = {m: [] for m in fns}
    nbytes = {m: fn() for m, fn in fns.items()}
    for _ in range(repeats):
        for m, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[m].append(time.perf_counter() - t0)
    out = {}
    for m, ts in times.items():
        med = statistics.median(ts)
        out[m] = {
            "median_s": round(med, 4),
            "MB_per_s": round(nbytes[m] / 1e6 / med, 1),
            "MB": round(nbytes[m] / 1e6, 2),
            "runs_s": [round(t, 4) for t in ts],
        }
    return out


def bench_pattern(store: FeatureStore, views, batches, repeats: int) -> dict:
    """Every method over the same batches, after checking that they return the same arrays."""
    ref = read_batches(reader(store, METHODS[0], views), batches)[1]
    fns = {}
    for method in METHODS:
        read = reader(store, method, views)
        got = read_batches(read, batches)[1]
        assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True)), method
        fns[method] = lambda read=read: read_batches(read, batches)[0]
    fns["features"] = lambda: read_features(store, batches)
    out = {"n_batches": len(batches), "n_reads": len(ref), "methods": time_all(fns, repeats)}
    base = out["methods"][METHODS[0]]["median_s"]
    out[f"speedup_over_{METHODS[0]}"] = {
        m: round(base / out["methods"][m]["median_s"], 2) for m in METHODS[1:]
    }
    out["gather_speedup_over_dask"] = {
        m: round(out["methods"][m]["median_s"] / out["methods"]["gather"]["median_s"], 2)
        for m in ("dask_threads2", "dask_sync")
    }
    return out


def store_info(store: FeatureStore) -> dict:
    info = {
        "n_images": store.root["image/done"].shape[0],
        "n_texts": store.root["text/done"].shape[0],
    }
    info["dims"] = dict(store.root.attrs["dims"])
    info["shard_rows"] = SHARD_ROWS
    info["chunk_rows"] = {
        s.name: chunk_rows(s, resolve_tail(s, info["dims"]))
        for s in IMAGE_ARRAYS + TEXT_ARRAYS
        if s.sharded
    }
    info["MB_on_disk"] = round(
        sum(f.stat().st_size for f in Path(store.path).rglob("*") if f.is_file()) / 1e6, 1
    )
    return info


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, help="an existing store (default: build one)")
    p.add_argument(
        "--suite",
        action="append",
        help="suite(s) to read (default: bench-ordered and bench-shuffled; first suite with image+captions for --store)",
    )
    p.add_argument("--n-images", type=int, default=4096)
    p.add_argument(
        "--grid", type=int, default=8, help="patch grid side of the built store (toy: 8)"
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("reports/bench/reads.json"))
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_reads_") as tmp:
        if args.store is None:
            path = Path(tmp) / "bench.zarr"
            t0 = time.perf_counter()
            build_store(path, args.n_images, args.grid, args.seed)
            build_s = time.perf_counter() - t0
        else:
            path, build_s = args.store, None
        store = FeatureStore.open(path)
        suites = args.suite or (
            ["bench-ordered", "bench-shuffled"]
            if args.store is None
            else [
                next(
                    s for s in store.suites() if {"image", "captions"} <= set(store.suite_index(s))
                )
            ]
        )
        views = dask_views(store)
        report = {
            "bench": "feature-store reads: zarr orthogonal selection, dask, slice runs (FeatureStore._gather)",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "store": {
                "path": None if args.store is None else str(args.store),
                "built_s": None if build_s is None else round(build_s, 1),
                **store_info(store),
            },
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "numpy": np.__version__,
                "zarr": zarr.__version__,
                "dask": dask.__version__,
                "zarr_async_concurrency": zarr.config.get("async.concurrency"),
                "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            },
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "patterns": {},
        }
        for suite in suites:
            index = store.suite_index(suite)
            tag = suite.removeprefix("bench-")
            report["patterns"][f"score_batches_{tag}"] = bench_pattern(
                store, views, score_batches(index, args.batch_size), args.repeats
            )
        img, txt = train_rows(store, suites[0], store.suite_index(suites[0]))
        one_shot = [(img, [txt])]
        report["patterns"]["train_one_shot"] = {
            "suite": suites[0],
            "n_image_rows": len(img),
            "n_text_rows": len(txt),
            **bench_pattern(store, views, one_shot, args.repeats),
        }

    text = json.dumps(report, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
