"""The reranking cost of the geometry-aware variants (``pipeline bench rerank``).

Each variant reranks ``queries`` random queries over random object sets at the toy's joint
dimension (or any ``dim``): the suite's object sets are planted in the reranker as its
``prepare`` would leave them, so the timing is of ``rerank`` alone — the per-query work of
scoring (feature costs, structures, the batched FGW solve, the Hungarian matchings) — on
shortlists of length K, in the score stage's batches (``batch_size // K`` queries a call).
Reported: milliseconds per query and queries per second at K = 20 for every variant, and
how ``fgw`` and ``hungarian`` grow with K and with the number of objects per set.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.scorers.geometry.objects import ObjectSets

VARIANTS = ("fgw", "hungarian", "fgw-hungarian", "ridge-fgw")


def random_sets(n_sets: int, n_objects: int, dim: int, gen: torch.Generator) -> ObjectSets:
    """``n_sets`` sets of ``n_objects`` unit-norm random objects at random positions."""
    embed = F.normalize(torch.randn(n_sets, n_objects, dim, generator=gen), dim=-1)
    return ObjectSets(embed, torch.ones(n_sets, n_objects, dtype=torch.bool), torch.rand(n_sets, n_objects, 2, generator=gen))


def time_rerank(variant: str, queries: int, gallery: int, k: int, objects: int, dim: int, batch_size: int = 256, seed: int = 0) -> dict[str, Any]:
    """One variant's rerank time over ``queries`` queries with shortlists of ``k``."""
    from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
    from pipeline.scorers import create_scorer

    gen = torch.Generator().manual_seed(seed)
    dims = FeatureDims(grid=(8, 8), d_v=dim, d_t=dim, embed_dim=dim, context_length=32)
    proj = Projections(torch.eye(dim), torch.eye(dim), torch.tensor(100.0))
    scorer = create_scorer(variant, dims=dims, proj=proj, k=k).eval()
    queries_sets, gallery_sets = random_sets(queries, objects, dim, gen), random_sets(gallery, objects, dim, gen)
    scorer._queries, scorer._gallery = scorer.map_phrases(queries_sets), gallery_sets
    step = max(1, batch_size // k)
    empty_t = TextFeatures(torch.zeros(step, 1, dtype=torch.long), torch.ones(step, 1, dtype=torch.bool), torch.zeros(step, 0, dim), torch.zeros(step, dim))
    empty_i = ImageFeatures(torch.zeros(1, 0, dim), torch.zeros(1, 0, dim), torch.zeros(1, 0), torch.zeros(1, dim))
    shortlists = torch.stack([torch.randperm(gallery, generator=gen)[:k] for _ in range(queries)])  # [Q, k]

    def run(stop: int) -> None:
        with torch.no_grad():
            for start in range(0, stop, step):
                sl = shortlists[start : min(start + step, stop)]
                scorer.rerank(empty_t, empty_i, sl, gallery=torch.arange(gallery), queries=torch.arange(start, start + len(sl)))

    run(min(step, queries))  # untimed: the solvers' lazy imports (scipy) and first allocations
    t0 = time.perf_counter()
    run(queries)
    seconds = time.perf_counter() - t0
    return {"variant": variant, "k": k, "objects": objects, "queries": queries, "ms_per_query": 1e3 * seconds / queries, "queries_per_s": queries / seconds}


def bench_rerank(queries: int = 200, gallery: int = 1200, objects: int = 4, dim: int = 128, ks: tuple[int, ...] = (5, 10, 20, 50, 100),
                 object_counts: tuple[int, ...] = (2, 4, 8), threads: int = 2, fgw_problems: int = 2000) -> dict[str, Any]:  # fmt: skip
    """Every variant at K = 20, then ``fgw``/``hungarian`` over ``ks`` and ``object_counts``,
    then batched FGW against POT's per-problem loop on the same problems
    (:func:`pipeline.perf.fgw.bench_fgw`, ``n = m = objects``, α = 0.5)."""
    from pipeline.perf.fgw import bench_fgw

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out: dict[str, Any] = {"setup": {"queries": queries, "gallery": gallery, "objects": objects, "dim": dim, "threads": threads}}
        out["variants"] = {v: time_rerank(v, queries, gallery, 20, objects, dim) for v in VARIANTS}
        out["scaling"] = [time_rerank(v, queries, gallery, k, objects, dim) for v in ("fgw", "hungarian") for k in ks if k != 20]
        out["scaling"] += [time_rerank(v, queries, gallery, 20, n, dim) for v in ("fgw", "hungarian") for n in object_counts if n != objects]
        cases = bench_fgw(n_problems=fgw_problems, sizes=((objects, objects),), alphas=(0.5,), mixed=False, pot_batch=False, threads=threads)["cases"]
        case = cases[0]
        out["fgw_batched_vs_loop"] = {"problems": fgw_problems, "n": objects, "m": objects, "alpha": 0.5, "batched_ms": case["ours_ms"],
                                      "loop_ms": case["pot_ms"], "speedup": case["speedup"], "max_abs_diff": case["max_abs_diff"]}  # fmt: skip
        return out
    finally:
        torch.set_num_threads(previous)
