"""How the size of ICER's passes sets the cost of scoring a gallery: Flow-CLIP's ``score_matrix``
over a retrieval suite at several ``pair_chunk`` values, from the cache.

    .venv/bin/python scripts/bench_icer_passes.py [--variant flowclip] [--suite shapes-multi] [--chunks 8192 2048 512 256]

Loads ``--variant`` from the pipeline's checkpoints, reads the suite's gallery and queries
from the store once, then times :func:`pipeline.scoring.gallery_scores` with the scorer's
``pair_chunk`` set to each value (best of ``--repeats`` runs; the first value's run is the
reference) and says whether every score equals the reference's bit for bit. Needs the
cache that ``dvc repro`` leaves.
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
    ap.add_argument("--variant", default="flowclip")
    ap.add_argument("--suite", default="shapes-multi")
    ap.add_argument("--chunks", type=int, nargs="+", default=[8192, 2048, 512, 256])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import gallery_scores, retrieval_rows, suite_inputs

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)  # scoring, as the score stage runs it
    score = load_config(ScoreConfig, args.params, "score")
    store = open_store(load_config(ExtractConfig, args.params, "extract")).cache_reads(1 << 32)
    manifest, index = suite_inputs(store, args.suite)
    gallery, queries = retrieval_rows(manifest, index)
    scorer = load_scorer(args.variant, store, score.checkpoints, options=score.options.get(args.variant))
    if scorer.icer is None:
        raise SystemExit(f"{args.variant} has no ICER branch; pass flowclip or flowclip-cimr")
    gallery_scores(scorer, store, gallery, queries, score.batch_size)  # warm-up: the store's reads
    print(f"{args.variant} on {args.suite}: {len(queries)} queries x {len(gallery)} images, {args.threads} threads")
    reference = None
    for chunk in args.chunks:
        scorer.config.pair_chunk = chunk
        best, scores = float("inf"), None
        for _ in range(args.repeats):
            t = time.perf_counter()
            scores = gallery_scores(scorer, store, gallery, queries, score.batch_size)
            best = min(best, time.perf_counter() - t)
        reference = scores if reference is None else reference
        same = "reference" if scores is reference else f"identical: {np.array_equal(scores, reference)}"
        pairs = len(queries) * len(gallery)
        print(f"pair_chunk {chunk:>6}: {best:7.2f} s ({best / pairs * 1e6:5.1f} us a pair); {same}")


if __name__ == "__main__":
    main()
