"""Bench: training's pair loader (``pipeline.training.pairs.load_pairs``) on the configured store.

    .venv/bin/python scripts/bench_pair_loader.py                      # shapes-train, shapes-dev
    .venv/bin/python scripts/bench_pair_loader.py --suite shapes-train --params params.yaml

Times ``load_pairs`` for each suite as the train stage calls it (rows read in ascending store
order, block by block), then the same reads with the blocks taken in the rows' first-appearance
order (each block scattered over the whole store), and checks that both return the same
features. Each figure is one cold-process pass; the store is whatever the page cache holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def first_appearance_blocks(pairs):
    """A ``_read_half`` that reads ``READ_BLOCK`` rows at a time in the order given."""

    def read_half(read, rows):
        parts = [pairs._half(read(rows[i : i + pairs.READ_BLOCK])) for i in range(0, max(len(rows), 1), pairs.READ_BLOCK)]
        cls = type(parts[0])
        return cls(**{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(cls)})

    return read_half


def features(data) -> dict[str, torch.Tensor]:
    return {f"{kind}.{f.name}": getattr(getattr(data, kind), f.name)
            for kind in ("images", "texts") for f in dataclasses.fields(getattr(data, kind))}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", action="append", help="pair suite (repeatable; default shapes-train, shapes-dev)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = ap.parse_args()

    from pipeline.cache.open import open_store
    from pipeline.config import ExtractConfig, load_config
    from pipeline.training import pairs

    extract = load_config(ExtractConfig, args.params, "extract")
    ascending = pairs._read_half
    for suite in args.suite or ["shapes-train", "shapes-dev"]:
        got = {}
        for name, read_half in (("ascending", ascending), ("first-appearance", first_appearance_blocks(pairs))):
            pairs._read_half = read_half
            store = open_store(extract)  # a fresh reader: nothing cached from the other pass
            t0 = time.perf_counter()
            got[name] = features(pairs.load_pairs(store, suite))
            print(f"{suite}: {name} blocks {time.perf_counter() - t0:.1f} s", flush=True)
        pairs._read_half = ascending
        same = all(torch.equal(got["ascending"][k], got["first-appearance"][k]) for k in got["ascending"])
        n = {k: int(np.prod(v.shape[:1])) for k, v in got["ascending"].items() if k.endswith("embed")}
        print(f"{suite}: {n['images.embed']} images, {n['texts.embed']} captions; identical features: {same}")


if __name__ == "__main__":
    main()
