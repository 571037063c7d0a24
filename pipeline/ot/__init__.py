"""Shared optimal-transport solvers, POT style: pure functions named after the math.

    from pipeline.ot import sinkhorn_log
    P, log = sinkhorn_log(C, a, b, epsilon=0.1, n_iters=64, mask_rows=..., mask_cols=...)

* ``sinkhorn`` — batched, differentiable log-domain Sinkhorn (balanced entropic OT).
* ``fgw`` — batched exact Fused Gromov–Wasserstein (conditional gradient; one exact OT
  for signed-offset structures).
* ``transport`` — batched exact OT (a transportation simplex), FGW's linear step.
* ``assignment`` — Hungarian assignment (scipy).
"""

from pipeline.ot.assignment import hungarian
from pipeline.ot.fgw import fused_gromov_wasserstein_batched, fused_gromov_wasserstein_offsets
from pipeline.ot.sinkhorn import SinkhornLog, sinkhorn_log, sinkhorn_log_kernel
from pipeline.ot.transport import emd_batched

__all__ = [
    "SinkhornLog",
    "emd_batched",
    "fused_gromov_wasserstein_batched",
    "fused_gromov_wasserstein_offsets",
    "hungarian",
    "sinkhorn_log",
    "sinkhorn_log_kernel",
]
