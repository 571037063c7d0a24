"""Precompute-then-score feature cache pipeline for vision-language compositionality.

Layout (see ``docs/layout.md``): ``encoders`` load open_clip models and capture grids/tokens,
``cache`` is the Zarr feature-store contract, ``scorers`` and ``benchmarks`` are registries,
``ot`` holds the shared optimal-transport solvers, ``world`` is the offline shapes world.
"""

__version__ = "0.1.0"
