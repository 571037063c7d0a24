"""Where scoring from the cache spends its time: cProfile of ``score_choice`` on one suite.

    .venv/bin/python scripts/profile_scoring.py [--variant flowclip] [--suite shapes-sugarcrepe] [--items 500]

Loads ``--variant`` from the pipeline's checkpoints (``cache/checkpoints``), scores the first
``--items`` items of ``--suite`` once untimed (warm-up), then once under cProfile, and prints
the total time, the time inside the store's reads (``FeatureStore.texts`` / ``images``) and
the top functions by cumulative time. Needs the cache that ``dvc repro`` leaves.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="flowclip")
    ap.add_argument("--suite", default="shapes-sugarcrepe")
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import score_choice, suite_inputs

    torch.set_num_threads(args.threads)
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    _, index = suite_inputs(store, args.suite)
    index = {k: v[: args.items] for k, v in index.items()}
    scorer = load_scorer(args.variant, store, load_config(ScoreConfig, args.params, "score").checkpoints)
    score_choice(scorer, store, index, 256)  # warm-up: imports, first reads
    prof = cProfile.Profile()
    prof.runcall(score_choice, scorer, store, index, 256)
    stats = pstats.Stats(prof)
    reads = {f"{fn[2]}": v[3] for fn, v in stats.stats.items() if fn[0].endswith("cache/reader.py") and fn[2] in ("texts", "images")}
    total = sum(v[2] for fn, v in stats.stats.items())  # tottime over every function
    print(f"{args.variant} on {args.items} items of {args.suite}: {total:.3f} s; store reads: "
          + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(reads.items())))
    stats.sort_stats("cumulative").print_stats(12)


if __name__ == "__main__":
    main()
