"""Where extract's time beyond the bare forward goes on the CPU: process CPU seconds of the
bare forward, of a full extract, of an extract that finds every row done, and of the writes
alone, on the toy's random-image suite.

    .venv/bin/python scripts/extract_cpu.py [--images 2048] [--runs 4] [--threads 2]

``pipeline bench extract`` reports wall time, which on a 2-core virtual machine moves by
20% from run to run; CPU seconds (``getrusage``: every thread of the process) move less and
say what extract adds: the writes (timed alone through extract's own writer, the toy's array
shapes, no encoder), the per-run work an extract does whatever it encodes (manifests, image
content keys, BPE for truncation counts, planning, the key inventory, the suite indexes: the
extract that finds every row done), and what is left (helper threads and the forward's
threads contending for the same two cores). Each run is a fresh store; the last lines give
the median over ``--runs``. Needs no cache.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_s() -> float:
    """CPU seconds of every thread of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, *args, **kwargs) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn(*args, **kwargs)``."""
    c0, t0 = cpu_s(), time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0, cpu_s() - c0


def writes_alone(root_dir: Path, enc, n: int) -> float:
    """CPU seconds of writing ``n`` image rows and ``2n`` caption rows of ``enc``'s shapes
    through extract's writer (batches as extract makes them), into a fresh store."""
    import numpy as np

    from pipeline.cache import writer
    from pipeline.extract_pixels import _Writer

    d = enc.dims
    dims = {"grid": list(d.grid), "d_v": d.d_v, "d_t": d.d_t, "embed_dim": d.embed_dim, "context_length": d.context_length}
    rng = np.random.default_rng(0)
    tokens_v = d.grid[0] * d.grid[1] + 1
    grid = rng.standard_normal((64, tokens_v, d.d_v)).astype(np.float16)
    image = {"early": grid, "final": grid, "embed": rng.standard_normal((64, d.embed_dim)).astype(np.float32)}
    text = {
        "ids": rng.integers(1, 1000, (256, d.context_length)).astype(np.int32),
        "mask": np.ones((256, d.context_length), dtype=bool),
        "tokens": rng.standard_normal((256, d.context_length, d.d_t)).astype(np.float16),
        "embed": rng.standard_normal((256, d.embed_dim)).astype(np.float32),
    }
    root = writer.open_for_writing(root_dir, {"model": "writes-alone"}, dims)
    _, image_rows = writer.plan_rows(root, "image", rng.integers(0, 256, (n, 16), dtype=np.uint8))
    _, text_rows = writer.plan_rows(root, "text", rng.integers(0, 256, (2 * n, 16), dtype=np.uint8))

    def write() -> None:
        for modality, rows, arrays, per in (("image", image_rows, image, 64), ("text", text_rows, text, 256)):
            with _Writer(root, modality, overlap=False) as sink:
                for batch in writer.shard_batches(rows, per):
                    sink.put(batch, {k: v[: len(batch)] for k, v in arrays.items()})

    return timed(write)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from pipeline.extraction import extract
    from pipeline.perf.common import bare_forward, extract_cfg, make_suite, random_encoder

    torch.set_num_threads(args.threads)
    enc = random_encoder("toy")
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = make_suite(folder, args.images, enc.preprocess_cfg["size"][0])
        bare_forward(enc, folder, manifest, 64)  # warm-up (allocator, page cache)
        for run in range(args.runs):
            cfg = extract_cfg(folder, manifest, "toy", 64)
            shutil.rmtree(cfg.out, ignore_errors=True)
            bare_wall, bare_cpu = timed(bare_forward, enc, folder, manifest, 64)
            ext_wall, ext_cpu = timed(extract, cfg, progress=False, encoder=enc)
            _, noop_cpu = timed(extract, cfg, progress=False, encoder=enc)
            write_cpu = writes_alone(folder / f"writes{run}", enc, args.images)
            row = {
                "bare_wall_s": bare_wall, "extract_wall_s": ext_wall, "wall_ratio": ext_wall / bare_wall,
                "bare_cpu_s": bare_cpu, "extract_cpu_s": ext_cpu, "extra_cpu_s": ext_cpu - bare_cpu,
                "writes_cpu_s": write_cpu, "done_extract_cpu_s": noop_cpu,
            }  # fmt: skip
            rows.append(row)
            print(json.dumps({"run": run, **{k: round(v, 3) for k, v in row.items()}}), flush=True)
    median = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    print(json.dumps({"images": args.images, "captions": 2 * args.images, "threads": args.threads, "runs": args.runs, "median": median}))


if __name__ == "__main__":
    main()
