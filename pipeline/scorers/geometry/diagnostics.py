"""Where steering helps and where it hurts: each steering variant's difference from its
baseline over slices of a retrieval suite's queries (the report's steering table), and over
steering strengths (the report's strength table).

    slices = steering_slices(entry, suite.units, ("steer", "steer-multi"), "clip", 2000, 0)
    rows = steering_strength(rescore, clip_units, {"local (K = 20)": 20}, STRENGTHS, 2000, 0)

A slice is every query, the queries of one edit kind (the suite's ``variant`` column:
shapes-multi's near-duplicates differ from each query's image in one binding or one
relation) or the queries with one number of steering directions (``steer-multi`` sums one
per object phrase, so interference, if any, grows with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import Units
from pipeline.stats import paired_bootstrap

BASELINE = "clip"  # frozen CLIP: every geometry variant's Δ in the report is against it
STEERING = ("steer", "steer-multi")  # the steering variants, single-concept and summed
SLICE_METRICS = ("R@1", "R@10")
STRENGTHS = (0.25, 0.5, 1.0, 2.0, 4.0)  # the β the strength table re-scores steering at
SUM_VS_ONE = "sum - one"  # steer-multi minus steer: below 0, the sum hurts more than one direction
EQUAL_LENGTH = "equal-length sum"  # steer-multi with each query's sum rescaled to one direction's length
EQUAL_VS_ONE = "equal-length sum - one"  # below 0, the sum's direction hurts, not only its length


def query_slices(manifest: pd.DataFrame) -> list[tuple[str, np.ndarray]]:
    """(label, [n_queries] bool) of each slice: every query; each edit kind of the
    ``variant`` column; each number of ``steer_pos`` prompts. A slicing with one value only
    (shapes-retrieval's two objects a query) is left out."""
    out = [("every query", np.ones(len(manifest), dtype=bool))]
    if "variant" in manifest and manifest["variant"].nunique() > 1:
        kinds = manifest["variant"].astype(str).to_numpy()
        out += [(f"edit: {kind}", kinds == kind) for kind in sorted(set(kinds))]
    if "steer_pos" in manifest:
        counts = manifest["steer_pos"].map(len).to_numpy()
        if len(set(counts)) > 1:
            out += [(f"{n} directions", counts == n) for n in sorted(set(counts))]
    return out


def steering_slices(
    entry: dict[str, Any], units_of: Callable, variants: tuple[str, ...], baseline: str, n_resamples: int, seed: int
) -> list[dict[str, Any]]:
    """Per slice of :func:`query_slices`, each of ``variants`` minus ``baseline`` on
    :data:`SLICE_METRICS` (paired bootstrap over the slice's queries: diff, CI, p).

    Args:
        entry: the suite's results: ``manifest`` and ``scores`` (variant -> [Q, G]).
        units_of: the suite's official units, ``(manifest, scores) -> {metric: Units}``.
    """
    units = {v: units_of(entry["manifest"], entry["scores"][v]) for v in (baseline, *variants) if v in entry["scores"]}
    if baseline not in units:
        return []
    out = []
    for label, mask in query_slices(entry["manifest"]):
        row: dict[str, Any] = {"slice": label, "queries": int(mask.sum())}
        for v in variants:
            for m in SLICE_METRICS if v in units else ():
                a, b = units[v][m].values[mask], units[baseline][m].values[mask]
                r = paired_bootstrap(a, b, n_resamples=n_resamples, seed=seed)
                row[f"{v} {m}"] = {"diff": r.diff, "lo": r.lo, "hi": r.hi, "p": r.p}
        out.append(row)
    return out


def steering_strength(
    rescore: Callable[[float, str, int], dict[str, Units]],
    reference: dict[str, Units],
    scopes: dict[str, int],
    betas: tuple[float, ...],
    n_resamples: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Per scope and β: ``steer``, ``steer-multi`` and :data:`EQUAL_LENGTH` minus
    :data:`BASELINE`, and ``steer-multi`` minus ``steer`` (:data:`SUM_VS_ONE`) and
    :data:`EQUAL_LENGTH` minus ``steer`` (:data:`EQUAL_VS_ONE`), on :data:`SLICE_METRICS`, each
    paired over the queries.

    Naive multi-object steering interferes, as the seed reports, where the sum of a query's
    directions ranks worse than its first direction alone at the same strength; a sum that
    ranks worse than the baseline but better than one direction is over-steering, not
    interference. The sum is also longer than one direction, so it moves the query further
    at the same β: the equal-length sum (rescaled to the first direction's length) ranking
    like one direction says that the sum hurts by its length, not by where it points. Every
    variant is re-scored at every (scope, β), so the table does not depend on the β and K
    the pipeline scores them at.

    Args:
        rescore: ``(beta, variant, k) -> {metric: Units}`` of the suite's queries steered by
            ``variant`` (``steer``, ``steer-multi`` or :data:`EQUAL_LENGTH`) with strength
            ``beta``, CLIP's top ``k`` re-ranked.
        reference: ``{metric: Units}`` of :data:`BASELINE` on the same queries, in the same order.
        scopes: label -> shortlist length, e.g. ``{"local (K = 20)": 20, "whole gallery": 10**9}``.
    """
    rows = []
    for scope, k in scopes.items():
        for beta in betas:
            units = {v: rescore(beta, v, k) for v in (*STEERING, EQUAL_LENGTH)}
            row: dict[str, Any] = {"scope": scope, "k": int(k), "beta": float(beta)}
            for m in SLICE_METRICS:
                row[f"{BASELINE} {m}"] = reference[m].statistic()
                against_one = {SUM_VS_ONE: "steer-multi", EQUAL_VS_ONE: EQUAL_LENGTH}
                pairs = {v: (u[m], reference[m]) for v, u in units.items()}
                pairs |= {name: (units[v][m], units["steer"][m]) for name, v in against_one.items()}
                for name, (a, b) in pairs.items():
                    r = paired_bootstrap(a.values, b.values, n_resamples=n_resamples, seed=seed)
                    value = a.statistic() if name not in against_one else None
                    row[f"{name} {m}"] = {"value": value, "diff": r.diff, "lo": r.lo, "hi": r.hi, "p": r.p}
            rows.append(row)
    return rows
