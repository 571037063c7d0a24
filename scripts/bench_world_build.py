"""Bench: ``pipeline world`` (:func:`pipeline.world.build_world`) at several worker counts.

    .venv/bin/python scripts/bench_world_build.py                  # workers 1 and 2, params.yaml's world
    .venv/bin/python scripts/bench_world_build.py --workers 1 2 4 --params params.yaml

Builds the configured world once per ``--workers`` value into a temporary folder, prints
each build's wall time and whether every image and manifest is byte-identical to the first
build's (``world.json`` aside, as it records the output folder), then deletes the folders.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` but ``world.json``, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "world.json"
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = ap.parse_args()

    from pipeline.config import WorldConfig, load_config
    from pipeline.world import build_world

    cfg = load_config(WorldConfig, args.params, "world")
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for workers in args.workers:
            out = Path(tmp) / f"world-{workers}"
            t = time.perf_counter()
            build_world(cfg, out=out, progress=False, workers=workers)
            wall = time.perf_counter() - t
            hashes = file_hashes(out)
            reference = hashes if reference is None else reference
            same = "reference" if hashes is reference else f"byte-identical: {hashes == reference}"
            print(f"workers {workers}: {wall:6.1f} s, {len(hashes)} files; {same}", flush=True)
            if hashes is not reference:
                shutil.rmtree(out)


if __name__ == "__main__":
    main()
