"""Speed bench: our batched exact FGW against POT's per-problem loop (and POT's batch solver).

All solvers get identical random rerank-like problems: per problem a feature cost
``M = 1 - cosine`` of random unit vectors and two distance structures of random 2-D object
positions, each normalised to max 1, at fixed object counts (n, m) or, for the ``mixed``
case, n and m drawn from 2..8 per problem and padded to 8 (POT then gets each problem
unpadded). Timed per case (n, m, alpha):

(a) ``pipeline.ot.fused_gromov_wasserstein_batched`` on the whole batch (median of
    ``repeats`` calls, after a warm-up call);
(b) a Python loop of POT's exact ``ot.gromov.fused_gromov_wasserstein2`` (numpy, defaults),
    the reference: ``max_abs_diff`` is max |value (a) - value (b)|;
(c) ``ot.batch.solve_gromov_batch`` (POT's batched proximal/entropic solver, ``reg``),
    on at most ``pot_batch_subset`` problems; fixed sizes only (it has no padding: zero
    weights give NaN), and its values are entropic, so they differ from (b) by more.

``pipeline bench fgw`` runs :func:`bench_fgw` with its defaults and writes
``reports/bench/fgw.json``.
"""

from __future__ import annotations

import os
import time
import warnings

import numpy as np
import torch

from pipeline.ot.fgw import fused_gromov_wasserstein_batched


def random_problems(
    n_problems: int, n: int | None, m: int | None, seed: int = 0, sizes=(2, 8)
) -> dict:
    """Rerank-like FGW problems, padded to a common size.

    Args:
        n_problems: number of problems B.
        n, m: object counts of every problem; None draws each problem's count from
            ``sizes`` (inclusive range) and pads to its maximum.
        seed: RNG seed.
        sizes: (low, high) object counts for the drawn sizes.

    Returns:
        dict with ``M`` [B, N, K] (1 - cosine, max 1 per problem), ``C1`` [B, N, N], ``C2``
        [B, K, K] (distances of 2-D positions, max 1), ``mask_rows`` [B, N], ``mask_cols``
        [B, K] (float64 torch, padding zero) and ``n``, ``m`` [B] the true counts.
    """
    g = torch.Generator().manual_seed(seed)
    lo, hi = sizes

    def counts(k):
        if k is not None:
            return torch.full((n_problems,), k, dtype=torch.long)
        return torch.randint(lo, hi + 1, (n_problems,), generator=g)

    ns, ms = counts(n), counts(m)
    N, K = int(ns.max()), int(ms.max())
    mask_rows = torch.arange(N)[None] < ns[:, None]  # [B, N]
    mask_cols = torch.arange(K)[None] < ms[:, None]  # [B, K]
    x = torch.nn.functional.normalize(
        torch.randn(n_problems, N, 16, generator=g, dtype=torch.float64), dim=-1
    )
    y = torch.nn.functional.normalize(
        torch.randn(n_problems, K, 16, generator=g, dtype=torch.float64), dim=-1
    )
    valid = mask_rows[:, :, None] & mask_cols[:, None, :]
    M = torch.where(valid, 1.0 - x @ y.transpose(1, 2), 0.0)  # [B, N, K] in [0, 2]
    M = M / M.amax((1, 2), keepdim=True)

    def structure(k, mask):
        pos = torch.rand(n_problems, k, 2, generator=g, dtype=torch.float64)
        C = torch.where(
            mask[:, :, None] & mask[:, None, :], torch.cdist(pos, pos), 0.0
        )  # [B, k, k]
        return C / C.amax((1, 2), keepdim=True)

    return {
        "M": M, "C1": structure(N, mask_rows), "C2": structure(K, mask_cols),
        "mask_rows": mask_rows, "mask_cols": mask_cols, "n": ns, "m": ms,
    }  # fmt: skip


def _pot_loop(P: dict, alpha: float, k: int) -> tuple[np.ndarray, float]:
    """Values of POT's exact FGW on the first k problems (unpadded) and the seconds taken."""
    import ot

    M, C1, C2 = P["M"].numpy(), P["C1"].numpy(), P["C2"].numpy()
    ns, ms = P["n"].tolist(), P["m"].tolist()
    values = np.empty(k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # alpha = 0: POT divides its GW log term by alpha
        t0 = time.perf_counter()
        for i in range(k):
            a, b = ns[i], ms[i]
            values[i] = ot.gromov.fused_gromov_wasserstein2(
                M[i, :a, :b], C1[i, :a, :a], C2[i, :b, :b], alpha=alpha
            )
        seconds = time.perf_counter() - t0
    return values, seconds


def bench_fgw(
    n_problems: int = 4000,
    sizes: tuple = ((2, 2), (4, 4), (8, 8), (3, 7)),
    alphas: tuple = (0.0, 0.3, 0.5, 0.9),
    mixed: bool = True,
    seed: int = 0,
    pot_subset: int | None = None,
    pot_batch: bool = True,
    pot_batch_subset: int | None = 1000,
    reg: float = 1e-2,
    threads: int = 2,
    repeats: int = 3,
) -> dict:
    """Per-problem milliseconds and agreement of batched FGW (a) vs POT's loop (b) and batch (c).

    Args:
        n_problems: problems per case B.
        sizes: (n, m) object counts of the fixed-size cases.
        alphas: structure weights; every size runs every alpha.
        mixed: add the case of per-problem n, m drawn from 2..8, padded to 8 x 8.
        seed: RNG seed of the problems (each case gets ``seed`` plus its index).
        pot_subset: time POT's loop on only the first k problems (per-problem time is what
            is reported; ``max_abs_diff`` is over those k).
        pot_batch: also time ``ot.batch.solve_gromov_batch`` (fixed sizes only).
        pot_batch_subset: problems given to ``solve_gromov_batch`` (None: all).
        reg: ``solve_gromov_batch``'s entropic / proximal regularisation.
        threads: torch intra-op threads for the run (restored afterwards).
        repeats: timed calls of our solver; ``ours_ms`` is from their median.

    Returns:
        dict with the setup and ``cases``: one dict per (n, m, alpha) with ``ours_ms``,
        ``pot_ms`` (per problem), ``speedup`` (pot_ms / ours_ms), ``max_abs_diff`` (max
        |ours - POT exact|), and, where run, ``pot_batch_ms`` and ``pot_batch_max_abs_diff``.
    """
    import ot

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cases = [(n, m) for n, m in sizes] + ([(None, None)] if mixed else [])
        out = []
        for ci, (n, m) in enumerate(cases):
            P = random_problems(n_problems, n, m, seed=seed + ci)
            args = (P["M"], P["C1"], P["C2"])
            masks = {"mask_rows": P["mask_rows"], "mask_cols": P["mask_cols"]}
            fused_gromov_wasserstein_batched(
                *(x[:4] for x in args), **{k: v[:4] for k, v in masks.items()}
            )  # warm-up
            for alpha in alphas:
                times = []
                for _ in range(max(1, repeats)):
                    t0 = time.perf_counter()
                    value, _ = fused_gromov_wasserstein_batched(*args, alpha=alpha, **masks)
                    times.append(time.perf_counter() - t0)
                ours_ms = float(np.median(times)) * 1e3 / n_problems
                k = n_problems if pot_subset is None else max(1, min(pot_subset, n_problems))
                ref, pot_s = _pot_loop(P, alpha, k)
                pot_ms = pot_s * 1e3 / k
                row = {
                    "n": "2..8" if n is None else n,
                    "m": "2..8" if m is None else m,
                    "alpha": alpha,
                    "ours_ms": ours_ms,
                    "pot_ms": pot_ms,
                    "speedup": pot_ms / ours_ms,
                    "max_abs_diff": float(np.abs(value[:k].numpy() - ref).max()),
                    "pot_problems_timed": k,
                }
                if pot_batch and n is not None and hasattr(ot, "batch"):
                    kb = (
                        n_problems
                        if pot_batch_subset is None
                        else max(1, min(pot_batch_subset, n_problems))
                    )
                    bargs = dict(
                        reg=reg, M=P["M"][:kb], alpha=alpha, loss="sqeuclidean", symmetric=True
                    )
                    ot.batch.solve_gromov_batch(
                        P["C1"][:2], P["C2"][:2], **{**bargs, "M": P["M"][:2]}
                    )  # warm-up
                    t0 = time.perf_counter()
                    res = ot.batch.solve_gromov_batch(P["C1"][:kb], P["C2"][:kb], **bargs)
                    row["pot_batch_ms"] = (time.perf_counter() - t0) * 1e3 / kb
                    kk = min(k, kb)
                    row["pot_batch_max_abs_diff"] = float(
                        np.abs(res.value[:kk].numpy() - ref[:kk]).max()
                    )
                    row["pot_batch_problems_timed"] = kb
                out.append(row)
        return {
            "n_problems": n_problems,
            "seed": seed,
            "torch_threads": torch.get_num_threads(),
            "load_avg_1min": os.getloadavg()[0],  # other processes on the machine skew timings
            "reg": reg,
            "cases": out,
        }
    finally:
        torch.set_num_threads(previous)

