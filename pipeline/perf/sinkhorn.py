"""Speed bench: our batched log-domain Sinkhorn against POT's per-problem loop.

Both solve identical random problems (BindCLIP's shape by default: n = 2·32 + 1 token rows,
m = 2·24·24 + 1 patch-depth columns) with the same number of iterations; POT runs with
``stopThr=0`` so it never stops early, i.e. both do equal work (POT additionally evaluates its
marginal error every 10th iteration, as it always does). POT's loop can take minutes on a
CPU, so ``pot_subset`` times it on the first k problems and extrapolates linearly to all of
them; the result says so (``pot_extrapolated``).

    from pipeline.perf.sinkhorn import bench_sinkhorn
    bench_sinkhorn(n_problems=256, n=64, m=1153, pot_subset=16)
"""

from __future__ import annotations

import os
import time
import warnings

import numpy as np
import ot
import torch

from pipeline.ot import sinkhorn_log


def bench_sinkhorn(
    n_problems: int = 256,
    n: int = 64,
    m: int = 1153,
    epsilon: float = 0.1,
    n_iters: int = 64,
    seed: int = 0,
    pot_subset: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    absorb_every: int | None = 16,
    batch_block: int | None = None,
    repeats: int = 5,
) -> dict:
    """Time ``pipeline.ot.sinkhorn_log`` (one batched call) vs ``ot.sinkhorn`` per problem.

    Args:
        n_problems: number of independent OT problems B.
        n: rows per problem; m: columns per problem.
        epsilon: entropic regularisation (``reg`` in POT).
        n_iters: iterations for both solvers (POT: ``numItermax``, ``stopThr=0``).
        seed: RNG seed of the random costs (cosine-like scores in [-1, 1]) and marginals.
        pot_subset: time POT on only the first k problems and extrapolate to n_problems.
        dtype: dtype of our solver ("float32" or "float64"); POT always runs float64 numpy.
        device: torch device of our solver ("cpu", "cuda").
        absorb_every: our solver's absorption block (None = pure log-domain recursion,
            two logsumexps per iteration like POT; see ``pipeline.ot.sinkhorn``).
        batch_block: our solver's problems per block (None: cache-sized blocks on CPU,
            0: the whole batch in one block; see ``pipeline.ot.sinkhorn``).
        repeats: timed calls of our solver; ``ours_s`` is their median (one call takes
            well under a second, so a single timing is at the mercy of the machine's load).

    Returns:
        dict with the setup, ``ours_s`` (median of ``ours_times_s``), ``pot_s`` (extrapolated if ``pot_subset``),
        ``pot_measured_s``, ``pot_problems_timed``, ``pot_extrapolated``, ``speedup``
        (pot_s / ours_s) and ``max_abs_diff`` = max |P_ours - P_pot| over the timed problems.
    """
    g = torch.Generator().manual_seed(seed)
    C = 1.0 - 2.0 * torch.rand(n_problems, n, m, generator=g, dtype=torch.float64)  # [B, n, m]
    a = torch.rand(n_problems, n, generator=g, dtype=torch.float64) + 0.1
    b = torch.rand(n_problems, m, generator=g, dtype=torch.float64) + 0.1
    a, b = a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True)

    tdtype = getattr(torch, dtype)
    Ct, at, bt = (x.to(device=device, dtype=tdtype) for x in (C, a, b))
    with torch.no_grad():
        sinkhorn_log(Ct[:2], at[:2], bt[:2], epsilon=epsilon, n_iters=2, warn=False)  # warm-up
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            P, log = sinkhorn_log(
                Ct, at, bt, epsilon=epsilon, n_iters=n_iters, warn=False,
                absorb_every=absorb_every, batch_block=batch_block,
            )  # fmt: skip
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        ours_s = float(np.median(times))
    P = P.double().cpu().numpy()

    k = n_problems if pot_subset is None else max(1, min(pot_subset, n_problems))
    Cn, an, bn = C.numpy(), a.numpy(), b.numpy()
    diff = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # POT warns "did not converge" with stopThr=0
        t0 = time.perf_counter()
        plans = [
            ot.sinkhorn(an[i], bn[i], Cn[i], epsilon, method="sinkhorn_log",
                        numItermax=n_iters, stopThr=0)
            for i in range(k)
        ]  # fmt: skip
        pot_measured_s = time.perf_counter() - t0
    for i, Pi in enumerate(plans):
        diff = max(diff, float(np.abs(P[i] - Pi).max()))
    pot_s = pot_measured_s * n_problems / k
    return {
        "n_problems": n_problems,
        "n": n,
        "m": m,
        "epsilon": epsilon,
        "n_iters": n_iters,
        "dtype": dtype,
        "device": device,
        "absorb_every": absorb_every,
        "batch_block": batch_block if batch_block is not None else "auto",
        "torch_threads": torch.get_num_threads(),
        "load_avg_1min": os.getloadavg()[0],  # other processes on the machine skew timings
        "ours_s": ours_s,
        "ours_times_s": times,
        "pot_s": pot_s,
        "pot_measured_s": pot_measured_s,
        "pot_problems_timed": k,
        "pot_extrapolated": k < n_problems,
        "speedup": pot_s / ours_s,
        "max_abs_diff": diff,
        "max_plan_entry": float(P.max()),
        "ours_max_marginal_err": float(log.err.max()),
    }


if __name__ == "__main__":
    import json
    import sys

    subset = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    print(json.dumps(bench_sinkhorn(pot_subset=subset), indent=2))
