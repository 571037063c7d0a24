"""Wall time of scoring one suite from the cache, as the score stage does it.

    .venv/bin/python scripts/time_scoring.py VARIANT SUITE [--per-pair] [--full-path] [--params params.yaml]

Loads ``VARIANT`` from the pipeline's checkpoints (``score.checkpoints``; a variant without
a checkpoint is built untrained), scores every item of ``SUITE`` once as ``pipeline score``
does (``score_choice`` for choice suites, ``score_retrieval`` for retrieval suites) and
prints the seconds. ``--per-pair`` scores a retrieval suite a second time with the base
``Scorer.score_matrix`` (one gallery image at a time against every query) and prints both
times and the largest score difference; ``--full-path`` turns the scorer's exact shortcuts
off (``Scorer.full_path``, e.g. Flow-CLIP's skip of ICER while ``W = 0``). Needs the cache
that ``dvc repro`` leaves.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant")
    ap.add_argument("suite")
    ap.add_argument("--per-pair", action="store_true", help="also time the per-image score_matrix")
    ap.add_argument("--full-path", action="store_true", help="turn exact shortcuts off")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch

    from pipeline.benchmarks import SUITES
    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from pipeline.scorers.base import Scorer
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import score_choice, score_retrieval, suite_inputs

    torch.set_num_threads(args.threads)
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    score = load_config(ScoreConfig, args.params, "score")
    manifest, index = suite_inputs(store, args.suite)
    scorer = load_scorer(args.variant, store, score.checkpoints, options=score.options.get(args.variant))
    if args.full_path:
        scorer = scorer.full_path()
    retrieval = SUITES.get(args.suite).task == "retrieval"

    def run():
        start = time.perf_counter()
        if retrieval:
            out = score_retrieval(scorer, store, manifest, index, score.batch_size, suite=args.suite)
        else:
            out = score_choice(scorer, store, index, score.batch_size)
        return out, time.perf_counter() - start

    scores, seconds = run()
    line = f"{args.variant} on {args.suite} ({scores.shape[0]} rows): {seconds:.1f} s"
    if args.per_pair and retrieval:
        scorer.score_matrix = Scorer.score_matrix.__get__(scorer)  # the base class's loop
        reference, slow = run()
        line += f"; per-pair score_matrix {slow:.1f} s; max |diff| {np.nanmax(np.abs(scores - reference)):.2e}"
    print(line)


if __name__ == "__main__":
    main()
