"""Bench: ``pipeline.world.training_batch``, the toy CLIP's training images and captions.

    .venv/bin/python scripts/bench_world.py                       # 200 images at 64 px
    .venv/bin/python scripts/bench_world.py --n 1000 --repeats 5 --out /tmp/world.json

A measurement, not a pass/fail. Times one warm-up
batch of 5 scenes, then ``--repeats`` batches of ``--n`` scenes (pool indices ``--start`` ..
``--start + n - 1``, ``--seed``, ``--image-size`` pixels), each generated and rendered with
``training_batch``. Prints one JSON line (``per_image_s`` is the median pass over ``n``;
``images_per_s`` its inverse) and, with ``--out``, appends the same line to that file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.world import training_batch  # noqa: E402


def bench(n: int, image_size: int, seed: int, start: int, repeats: int) -> dict:
    """Seconds per pass and per image of ``training_batch(seed, start..start+n-1, image_size)``."""
    if n < 1 or repeats < 1:
        raise ValueError(f"--n and --repeats must be >= 1, got {n} and {repeats}")
    training_batch(seed, np.arange(5), image_size)  # warm-up (imports, caches)
    indices = np.arange(start, start + n)
    passes = []
    for _ in range(repeats):
        t = time.perf_counter()
        images, captions = training_batch(seed, indices, image_size)
        passes.append(time.perf_counter() - t)
    assert images.shape == (n, image_size, image_size, 3) and len(captions) == n
    median = statistics.median(passes)
    return {
        "bench": "world.training_batch",
        "n": n,
        "image_size": image_size,
        "seed": seed,
        "start": start,
        "repeats": repeats,
        "pass_s": [round(p, 6) for p in passes],
        "median_pass_s": round(median, 6),
        "per_image_s": median / n,
        "images_per_s": n / median,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="scenes per timed batch (default 200)")
    ap.add_argument("--image-size", type=int, default=64, help="pixels per side (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    ap.add_argument("--start", type=int, default=100, help="first pool index (default 100)")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes; the median is reported")
    ap.add_argument("--out", type=Path, help="also append the JSON line to this file")
    args = ap.parse_args(argv)
    record = bench(args.n, args.image_size, args.seed, args.start, args.repeats)
    line = json.dumps(record)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(line + "\n")
    return record


if __name__ == "__main__":
    main()
