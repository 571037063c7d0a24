"""The reranking cost of the geometry-aware variants (``pipeline bench rerank``).

Each variant reranks ``queries`` random queries at the toy's joint dimension (or any
``dim``), with what its ``prepare`` would leave planted in it: random object sets (the
gallery's through the variant's own object map), for ``ridge-fgw`` a random map of the
committed fit's shape (:data:`RIDGE_FIT`: the compared directions, the hub offset's reference
phrases and beta), for ``steer`` and ``steer-multi``
random steering directions. The timing is of ``rerank`` alone — the per-query work of
scoring (feature costs, structures, the batched FGW solve, the Hungarian matchings, the
steered cosines) — on shortlists of length K, in the score stage's batches
(``batch_size // K`` queries a call). Reported: milliseconds per query and queries per
second at K = 20 for every variant, how every variant grows with K and how the object
variants grow with the number of objects per set; and the FGW solver against POT on the
same problems, for the distance structures POT's ``fused_gromov_wasserstein2`` takes and
for the signed-offset structures the pipeline uses (:func:`offset_fgw_vs_emd`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.scorers.geometry.objects import ObjectSets

VARIANTS = ("fgw", "hungarian", "fgw-hungarian", "ridge-fgw", "steer", "steer-multi")
OBJECT_VARIANTS = VARIANTS[:4]  # the variants whose cost depends on the objects per set
RIDGE_FIT = {"rank": 0, "n_reference": 42, "beta": 100.0}  # what the committed `pipeline ridge` fit chose: every direction, shapes-train's 42 phrases


def random_sets(n_sets: int, n_objects: int, dim: int, gen: torch.Generator) -> ObjectSets:
    """``n_sets`` sets of ``n_objects`` unit-norm random objects at random positions."""
    embed = F.normalize(torch.randn(n_sets, n_objects, dim, generator=gen), dim=-1)
    return ObjectSets(embed, torch.ones(n_sets, n_objects, dtype=torch.bool), torch.rand(n_sets, n_objects, 2, generator=gen))


def plant(scorer, queries: int, gallery: int, objects: int, dim: int, gen: torch.Generator) -> None:
    """Leave in ``scorer`` what its ``prepare`` leaves on a suite of ``queries`` queries and
    ``gallery`` images: steering directions, or mapped query and gallery object sets
    (``ridge-fgw``'s map random, its whitening an orthonormal basis of its compared space,
    its reference phrases random unit vectors there)."""
    from pipeline.scorers.geometry.rerankers import RidgeFGWReranker
    from pipeline.scorers.geometry.steering import Steer

    if isinstance(scorer, Steer):
        scorer._directions = 0.1 * torch.randn(queries, dim, generator=gen)
        return
    if isinstance(scorer, RidgeFGWReranker):
        with torch.no_grad():
            scorer.weight.copy_(torch.randn(scorer.weight.shape, generator=gen) / dim**0.5)
            scorer.bias.copy_(0.1 * torch.randn(scorer.bias.shape, generator=gen))
            scorer.centre.copy_(0.1 * torch.randn(scorer.centre.shape, generator=gen))
            scorer.whiten.copy_(torch.linalg.qr(torch.randn(scorer.whiten.shape, generator=gen))[0])
            scorer.reference.copy_(F.normalize(torch.randn(scorer.reference.shape, generator=gen), dim=-1))
    scorer._queries = scorer.map_phrases(random_sets(queries, objects, dim, gen))
    scorer._gallery = scorer.map_objects(random_sets(gallery, objects, dim, gen))


def time_rerank(variant: str, queries: int, gallery: int, k: int, objects: int, dim: int, batch_size: int = 256, seed: int = 0) -> dict[str, Any]:
    """One variant's rerank time over ``queries`` queries with shortlists of ``k``."""
    from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
    from pipeline.scorers import create_scorer

    gen = torch.Generator().manual_seed(seed)
    dims = FeatureDims(grid=(8, 8), d_v=dim, d_t=dim, embed_dim=dim, context_length=32)
    proj = Projections(torch.eye(dim), torch.eye(dim), torch.tensor(100.0))
    scorer = create_scorer(variant, dims=dims, proj=proj, k=k, **(RIDGE_FIT if variant == "ridge-fgw" else {})).eval()
    plant(scorer, queries, gallery, objects, dim, gen)
    step = max(1, batch_size // k)
    query_embed = torch.randn(queries, dim, generator=gen)
    images = ImageFeatures(torch.zeros(gallery, 0, dim), torch.zeros(gallery, 0, dim), torch.zeros(gallery, dim), torch.randn(gallery, dim, generator=gen))
    shortlists = torch.stack([torch.randperm(gallery, generator=gen)[:k] for _ in range(queries)])  # [Q, k]

    def run(stop: int) -> None:
        with torch.no_grad():
            for start in range(0, stop, step):
                sl = shortlists[start : min(start + step, stop)]
                n = len(sl)
                texts = TextFeatures(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool), torch.zeros(n, 0, dim),
                                     query_embed[start : start + n])  # fmt: skip
                scorer.rerank(texts, images, sl, gallery=torch.arange(gallery), queries=torch.arange(start, start + n))

    run(min(step, queries))  # untimed: the solvers' lazy imports (scipy) and first allocations
    t0 = time.perf_counter()
    run(queries)
    seconds = time.perf_counter() - t0
    return {"variant": variant, "k": k, "objects": objects if variant in OBJECT_VARIANTS else None, "queries": queries,
            "ms_per_query": 1e3 * seconds / queries, "queries_per_s": queries / seconds}  # fmt: skip


def offset_fgw_vs_emd(n_problems: int, objects: int, dim: int, alpha: float = 0.5, seed: int = 0, repeats: int = 3) -> dict[str, Any]:
    r"""The rerankers' FGW problems (feature cost 1 − cos, signed offsets of random positions)
    solved by their solver, :func:`pipeline.ot.fused_gromov_wasserstein_offsets` (one exact
    OT), and by the general :func:`pipeline.ot.fused_gromov_wasserstein_batched` on the offset
    structures of :func:`pipeline.scorers.geometry.objects.structure`, against POT on the same
    problems. POT's ``fused_gromov_wasserstein2`` takes one structure matrix, not two offset
    channels; the problem is exact OT (:mod:`pipeline.ot.fgw`), so POT's per-problem
    reference is ``ot.emd2`` on :math:`(1-\alpha) M + 2\alpha \sum_c (x_{ic} - y_{jc})^2` less
    :math:`2\alpha \sum_c (p^\top x_c - q^\top y_c)^2`. Returns ms per problem of each (ours:
    the median of ``repeats`` calls), the speed-up of the rerankers' solver over POT's loop and
    the largest difference of either solver's values from POT's."""
    import numpy as np
    import ot

    from pipeline.ot import fused_gromov_wasserstein_batched, fused_gromov_wasserstein_offsets
    from pipeline.scorers.geometry.objects import feature_cost, offset_positions, structure

    gen = torch.Generator().manual_seed(seed)
    q, c = (random_sets(n_problems, objects, dim, gen) for _ in range(2))
    q, c = (ObjectSets(s.embed.double(), s.mask, s.pos.double()) for s in (q, c))
    M, X, Y = feature_cost(q, c), offset_positions(q), offset_positions(c)  # [B, n, m], [B, n, 2], [B, m, 2]

    def median_ms(solve) -> tuple[float, torch.Tensor]:
        solve(slice(0, 4))  # warm-up
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            value = solve(slice(None))
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3 / n_problems, value

    ours_ms, ours = median_ms(lambda b: fused_gromov_wasserstein_offsets(M[b], X[b], Y[b], alpha=alpha)[0])
    C1, C2 = structure(q), structure(c)
    general_ms, general = median_ms(lambda b: fused_gromov_wasserstein_batched(M[b], C1[b], C2[b], alpha=alpha)[0])
    x, y, Mn, w = X.numpy(), Y.numpy(), M.numpy(), np.full(objects, 1.0 / objects)
    t0 = time.perf_counter()
    ref = np.empty(n_problems)
    for b in range(n_problems):
        square = ((x[b][:, None, :] - y[b][None, :, :]) ** 2).sum(-1)
        ref[b] = ot.emd2(w, w, (1 - alpha) * Mn[b] + 2 * alpha * square) - 2 * alpha * (((w @ x[b]) - (w @ y[b])) ** 2).sum()
    pot_ms = (time.perf_counter() - t0) * 1e3 / n_problems
    return {"problems": n_problems, "n": objects, "m": objects, "alpha": alpha, "structure": "offset", "batched_ms": ours_ms,
            "general_batched_ms": general_ms, "loop_ms": pot_ms, "loop": "ot.emd2", "speedup": pot_ms / ours_ms,
            "max_abs_diff": float(np.abs(ours.numpy() - ref).max()), "general_max_abs_diff": float(np.abs(general.numpy() - ref).max())}  # fmt: skip


def bench_rerank(queries: int = 200, gallery: int = 1200, objects: int = 4, dim: int = 128, ks: tuple[int, ...] = (5, 10, 20, 50, 100),
                 object_counts: tuple[int, ...] = (2, 4, 8), threads: int = 2, fgw_problems: int = 2000) -> dict[str, Any]:  # fmt: skip
    """Every variant at K = 20, every variant over ``ks``, the object variants over
    ``object_counts``; then FGW batched against POT on the same problems: with distance
    structures against POT's exact ``fused_gromov_wasserstein2`` called per problem and its
    batched entropic ``ot.batch.solve_gromov_batch`` (:func:`pipeline.perf.fgw.bench_fgw`,
    ``n = m = objects``, α = 0.5), and with the pipeline's offset structures against
    ``ot.emd2`` per problem (:func:`offset_fgw_vs_emd`)."""
    from pipeline.perf.fgw import bench_fgw

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out: dict[str, Any] = {"setup": {"queries": queries, "gallery": gallery, "objects": objects, "dim": dim, "threads": threads,
                                         "ridge_fit": RIDGE_FIT}}  # fmt: skip
        out["variants"] = {v: time_rerank(v, queries, gallery, 20, objects, dim) for v in VARIANTS}
        out["scaling"] = [time_rerank(v, queries, gallery, k, objects, dim) for v in VARIANTS for k in ks if k != 20]
        out["scaling"] += [time_rerank(v, queries, gallery, 20, n, dim) for v in OBJECT_VARIANTS for n in object_counts if n != objects]
        case = bench_fgw(n_problems=fgw_problems, sizes=((objects, objects),), alphas=(0.5,), mixed=False, pot_batch=True, threads=threads)["cases"][0]
        out["fgw_batched_vs_loop"] = {"problems": fgw_problems, "n": objects, "m": objects, "alpha": 0.5, "structure": "distance",
                                      "batched_ms": case["ours_ms"], "loop_ms": case["pot_ms"], "speedup": case["speedup"],
                                      "max_abs_diff": case["max_abs_diff"], "pot_batch_ms": case.get("pot_batch_ms"),
                                      "pot_batch_max_abs_diff": case.get("pot_batch_max_abs_diff")}  # fmt: skip
        out["fgw_offset_vs_emd"] = offset_fgw_vs_emd(fgw_problems, objects, dim)
        return out
    finally:
        torch.set_num_threads(previous)
