"""Learning-rate schedules shared by the toy CLIP's training and the scorers' training."""

from __future__ import annotations

import math


def warmup_cosine(step: int, peak: float, warmup: int, total: int) -> float:
    """Learning rate of optimiser step ``step`` (0-based): linear warm-up to ``peak`` over
    ``warmup`` steps, then cosine decay to 0 at ``total``. A function of the step alone, so a
    resumed run continues on the same curve."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * peak * (1.0 + math.cos(math.pi * progress))
