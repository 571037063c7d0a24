"""Where the score stage spends its time: the whole stage under cProfile, outputs away from the pipeline's.

    .venv/bin/python scripts/profile_score_stage.py [--no-cache] [--out DIR] [--top 25]

Runs ``stages.score.run`` with ``params.yaml``'s score section, its scores and metrics
written under ``--out`` (default ``/tmp/score-stage-profile``; the pipeline's own outputs are
never touched), and prints the stage's wall time, the time inside the store's row reads
(``FeatureStore._gather``), the (variant, suite) runs that took longest and the top
functions by own time. ``--no-cache`` turns off the block cache the stage keeps across
variants (``pipeline.scoring.READ_CACHE_BYTES``), to measure what it saves; the metrics
files of both runs can be compared with ``diff -r``. Needs the cache ``dvc repro`` leaves.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-cache", action="store_true", help="read every batch from the store (no block cache)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/score-stage-profile"))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    args = ap.parse_args()

    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from stages import score as stage

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the cache's paths are relative to the repo
    params = yaml.safe_load(args.params.read_text())
    params["score"].update(scores_out=str(out / "scores"), metrics_out=str(out / "metrics"))
    path = out / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    if args.no_cache:
        stage.READ_CACHE_BYTES = 0

    runs: dict[str, float] = collections.defaultdict(float)

    def timed(fn, desc_at: int | None = None):
        def call(*a, **k):
            t = time.perf_counter()
            result = fn(*a, **k)
            desc = a[desc_at] if desc_at is not None and len(a) > desc_at else k.get("desc")
            runs[desc or k.get("suite") or fn.__name__] += time.perf_counter() - t
            return result

        return call

    stage.score_choice = timed(stage.score_choice, desc_at=4)  # desc (5th argument) = "<variant> <suite>"
    stage.score_retrieval = timed(stage.score_retrieval)  # suite = the retrieval suite
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(stage.run, load_config(ScoreConfig, path, "score"), load_config(ExtractConfig, path, "extract"), True)
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    reads = sum(v[3] for fn, v in stats.stats.items() if fn[0].endswith("cache/reader.py") and fn[2] == "_gather")
    print(f"\nscore stage: {wall:.1f} s ({'no block cache' if args.no_cache else 'block cache on'}); "
          f"store row reads (FeatureStore._gather): {reads:.1f} s; metrics in {out / 'metrics'}")  # fmt: skip
    for name, seconds in sorted(runs.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f} s  {name}")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
