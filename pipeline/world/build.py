"""Writing the shapes world: images, one Parquet manifest per suite, ``world.json``.

``build_world(cfg)`` is the thin I/O shell around the pure item generators of
``suites`` and ``families``::

    <out>/images/<suite>/...png          every image, paths in the manifests are relative
                                         to <out>/images (they start with <suite>/)
    <out>/manifests/<suite>.parquet      one row per item (pipeline/benchmarks/base.py)
    <out>/world.json                     resolved config, per-suite row and image counts

A suite's image folder is emptied before it is written, so no stale image survives a
rebuild with smaller counts. Items are generated and rendered in blocks of units by a pool
of worker processes (one per available core); every unit is a pure function of the seed
and its index, and the blocks' rows are joined in unit order, so the images and manifests
are the same bytes whatever the number of workers.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from pipeline.config import MAX_WORLD_IMAGE_SIZE, SHAPES_SUITES, WorldConfig
from pipeline.files import write_atomically, write_json_atomically
from pipeline.world.families import pair_item
from pipeline.world.multi import multi_items
from pipeline.world.render import mirror, render, save_png
from pipeline.world.retrieval import retrieval_combos, retrieval_items
from pipeline.world.scenes import COLOURS, RELATIONS, SHAPES, SIZES, SPLITS
from pipeline.world.suites import (
    ARO_CATEGORIES,
    SUGARCREPE_CATEGORIES,
    Item,
    aro_item,
    sugarcrepe_item,
    whatsup_items,
)

log = logging.getLogger(__name__)

WORLD_VERSION = 5  # bump when a change alters any image or manifest (2: length-matched add-* items;
# 3: object columns on shapes-retrieval / -train / -dev, the shapes-multi suite; 4: steer_neg_absent;
# 5: no depth between two shapes of one colour, no ARO order shuffle that means the caption)

# suite -> (config field with its count, units of work for that count, items of one unit)
SuiteSpec = tuple[str, Callable[[int], int], Callable[[int, int], list[Item]]]
SUITE_SPECS: dict[str, SuiteSpec] = {
    "shapes-whatsup": ("n_whatsup", lambda n: n, lambda seed, k: whatsup_items(seed, k)),
    "shapes-aro": (
        "n_aro",
        lambda n: n * len(ARO_CATEGORIES),
        lambda seed, k: [aro_item(seed, ARO_CATEGORIES[k % 3], k // 3)],
    ),
    "shapes-sugarcrepe": (
        "n_sugarcrepe",
        lambda n: n * len(SUGARCREPE_CATEGORIES),
        lambda seed, k: [sugarcrepe_item(seed, SUGARCREPE_CATEGORIES[k % 7], k // 7)],
    ),
    "shapes-retrieval": (
        "n_retrieval_groups",
        lambda n: n,
        lambda seed, k: retrieval_items(seed, k),
    ),
    "shapes-multi": ("n_multi_groups", lambda n: n, lambda seed, k: multi_items(seed, k)),
    "shapes-train": ("n_train", lambda n: n, lambda seed, k: [pair_item(seed, "shapes-train", k)]),
    "shapes-dev": ("n_dev", lambda n: n, lambda seed, k: [pair_item(seed, "shapes-dev", k)]),
}
assert set(SUITE_SPECS) == set(SHAPES_SUITES), "every shapes suite needs a builder"


def validate(cfg: WorldConfig) -> None:
    """Raise ``ValueError`` naming the bad value (and the valid ones) for a bad config."""
    unknown = [s for s in cfg.suites if s not in SUITE_SPECS]
    if unknown:
        raise ValueError(f"unknown world suite(s) {unknown}; valid: {', '.join(SUITE_SPECS)}")
    if not cfg.suites:
        raise ValueError(f"world.suites is empty; choose from: {', '.join(SUITE_SPECS)}")
    if len(set(cfg.suites)) != len(cfg.suites):
        raise ValueError(f"world.suites lists a suite twice: {cfg.suites}")
    for suite in cfg.suites:
        name = SUITE_SPECS[suite][0]
        n = getattr(cfg, name)
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"world.{name} must be a positive integer (suite {suite}), got {n!r}")
    if not isinstance(cfg.image_size, int) or not 16 <= cfg.image_size <= MAX_WORLD_IMAGE_SIZE:
        raise ValueError(f"world.image_size must be an integer in [16, {MAX_WORLD_IMAGE_SIZE}], got {cfg.image_size!r}")
    if not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ValueError(f"world.seed must be a non-negative integer, got {cfg.seed!r}")
    combos = len(retrieval_combos(cfg.seed))
    if "shapes-retrieval" in cfg.suites and cfg.n_retrieval_groups > combos:
        raise ValueError(
            f"world.n_retrieval_groups is {cfg.n_retrieval_groups}, but only {combos} (shape pair, colour pair) "
            f"combinations exist: a group past them would repeat one, and its queries would be true of two groups' images"
        )


def suite_items(cfg: WorldConfig, suite: str) -> Iterator[Item]:
    """Every item of ``suite`` in manifest order (pure; nothing is written)."""
    name, units, make = SUITE_SPECS[suite]
    for k in range(units(getattr(cfg, name))):
        yield from make(cfg.seed, k)


def write_items(items: list[Item], root: Path, image_size: int) -> int:
    """Render and save every image of ``items`` under ``root``; the number written."""
    n = 0
    for item in items:
        rendered: dict[int, object] = {}  # id(scene) -> image, so the mirror reuses it
        for rel, scene, mirrored in item.images:
            if id(scene) not in rendered:
                rendered[id(scene)] = render(scene, image_size)
            image = rendered[id(scene)]
            save_png(mirror(image) if mirrored else image, root / rel)
            n += 1
    return n


UNITS_PER_TASK = 50  # units of work a worker renders per task (progress granularity)


def write_units(suite: str, seed: int, lo: int, hi: int, root: Path, image_size: int) -> tuple[list[dict], int]:
    """Units ``[lo, hi)`` of ``suite``: their manifest rows, in order, and how many images
    were written under ``root``."""
    make = SUITE_SPECS[suite][2]
    rows, n_images = [], 0
    for k in range(lo, hi):
        items = make(seed, k)
        n_images += write_items(items, root, image_size)
        rows.extend(item.row for item in items)
    return rows, n_images


def default_workers() -> int:
    """Worker processes for rendering: the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_world(
    cfg: WorldConfig, out: Path | None = None, progress: bool = True, workers: int | None = None
) -> dict[str, Path]:
    """Write the suites of ``cfg`` under ``out`` (default ``cfg.out``).

    Args:
        workers: rendering processes (default: :func:`default_workers`); 1 renders in this
            process. The output is the same for any number.

    Returns:
        ``{suite: manifest path}``.
    """
    validate(cfg)
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out = Path(out if out is not None else cfg.out)
    (out / "manifests").mkdir(parents=True, exist_ok=True)
    total = sum(SUITE_SPECS[s][1](getattr(cfg, SUITE_SPECS[s][0])) for s in cfg.suites)
    bar = tqdm(total=total, desc="world", unit="item", disable=not progress)
    pool: Executor | None = None
    if workers > 1:  # spawned, not forked: the parent may hold torch's thread pool
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    paths, rows_per_suite, images_per_suite = {}, {}, {}
    try:
        for suite in cfg.suites:
            shutil.rmtree(out / "images" / suite, ignore_errors=True)
            name, units, _ = SUITE_SPECS[suite]
            n = units(getattr(cfg, name))
            bar.set_postfix_str(suite)
            blocks = [(lo, min(lo + UNITS_PER_TASK, n)) for lo in range(0, n, UNITS_PER_TASK)]
            args = [(suite, cfg.seed, lo, hi, out / "images", cfg.image_size) for lo, hi in blocks]
            done = pool.map(write_units, *zip(*args, strict=True)) if pool else (write_units(*a) for a in args)
            rows, n_images = [], 0
            for (lo, hi), (block_rows, block_images) in zip(blocks, done, strict=True):
                rows.extend(block_rows)
                n_images += block_images
                bar.update(hi - lo)
            path = out / "manifests" / f"{suite}.parquet"
            write_atomically(path, partial(pd.DataFrame(rows).to_parquet, index=False))
            paths[suite], rows_per_suite[suite], images_per_suite[suite] = path, len(rows), n_images
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    bar.close()
    meta = {
        "version": WORLD_VERSION,
        "config": {**asdict(cfg), "out": str(out)},
        "counts": rows_per_suite,
        "images": images_per_suite,
        "splits": {k: list(v) for k, v in SPLITS.items()},
        "vocabulary": {
            "shapes": list(SHAPES),
            "colours": list(COLOURS),
            "sizes": list(SIZES),
            "relations": list(RELATIONS),
        },
    }
    _merge_or_clear_others(out, cfg, meta)
    write_json_atomically(out / "world.json", meta)
    return paths


def _merge_or_clear_others(out: Path, cfg: WorldConfig, meta: dict) -> None:
    """Suites under ``out`` that this build did not write: kept, and added to ``meta``, when
    the world there was built with the same settings (another subset of one world); else
    deleted, manifests and images, so no suite of another seed or size is left beside this
    world's (an extract of them then names the command that builds them)."""
    def settings(config: dict) -> dict:
        return {k: v for k, v in config.items() if k not in ("suites", "out")}

    previous = json.loads((out / "world.json").read_text()) if (out / "world.json").is_file() else {}
    same = previous.get("version") == WORLD_VERSION and settings(previous.get("config", {})) == settings(meta["config"])
    for path in sorted((out / "manifests").glob("*.parquet")):
        suite = path.stem
        if suite in cfg.suites:
            continue
        if same and suite in previous.get("counts", {}):
            meta["counts"][suite] = previous["counts"][suite]
            meta["images"][suite] = previous["images"][suite]
            meta["config"]["suites"] = [*meta["config"]["suites"], suite]
        else:
            path.unlink()
            shutil.rmtree(out / "images" / suite, ignore_errors=True)
            log.warning("%s: %s was built by another world configuration; deleted", out, suite)
