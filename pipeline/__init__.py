"""Precompute-then-score feature cache pipeline for vision-language compositionality.

Layout (see ``docs/layout.md``): ``encoders`` load open_clip models and capture grids/tokens,
``cache`` is the Zarr feature-store contract, ``scorers`` and ``benchmarks`` are registries,
``ot`` holds the shared optimal-transport solvers, ``world`` is the offline shapes world.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__version__ = "0.1.0"

PACKAGE = Path(__file__).resolve().parent  # pipeline/


def code_identity(root: Path = PACKAGE) -> str:
    """A hash of every Python source under ``root`` (the ``pipeline`` package): an artifact
    kept or resumed by a rerun (a toy CLIP, a scorer's seed) was made by this code, whatever
    module an edit touched, as DVC reruns it."""
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
