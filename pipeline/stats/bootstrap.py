"""Bootstrap significance for benchmark metrics: paired bootstrap and bootstrap CIs.

A metric is the statistic of per-unit values (``pipeline.benchmarks.Units``): the mean of
the values, or, with ``groups``, the macro mean over groups of the per-group means. Both
are linear in the values, ``stat(v) = v @ w`` with ``w_j = 1 / n`` (plain mean) or
``w_j = 1 / (G * n_{g(j)})`` (macro mean over ``G`` groups), which is what lets the
bootstrap below run as one gather and one matrix-vector product per chunk of resamples.

Resampling (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13 and 16):

* units are drawn with replacement, ``n_resamples`` times; with ``groups`` the draw is
  stratified: every unit is replaced by a unit of its own group, so group sizes (and the
  weights ``w``) are the same in every resample;
* the paired bootstrap uses one index set for both systems, i.e. it resamples the
  per-unit differences ``d = a - b`` and ``stat(a*) - stat(b*) = stat(d*)``;
* intervals are percentile intervals; the two-sided p-value is twice the fraction of
  resampled differences on the other side of 0 from the observed one (ties count: a
  resampled statistic within the dot product's rounding bound of 0 is 0), capped at 1. It moves in steps of ``2 / n_resamples``: ``p = 0`` means ``p < 2/n_resamples``.

A mean of several task metrics (e.g. Flow-CLIP's all-task mean over suites) is bootstrapped
task by task: each task's units are resampled independently (stratified by its own groups),
the per-task statistics of one resample are averaged, and the tasks draw from one generator
in turn, so one task gives exactly the single-metric numbers (:func:`units_mean_bootstrap`,
:func:`units_mean_ci`). Tasks from different suites have disjoint units, which is what
makes independent resampling the paired bootstrap of the mean.

Determinism: the same ``seed`` gives the same numbers. Resamples are drawn in chunks of
about ``_CHUNK_ELEMENTS`` indices (to bound memory); the chunk size depends only on the
number of units, so results do not depend on the machine.

A report bootstraps many systems on the same units with the same seed, so the same index
draws recur. Recent draws, ``_DRAW_CACHE_BYTES`` of them at most, are kept in a
least-recently used cache keyed by the groups, the number of resamples and the generator's
state before the draw; a hit returns the stored indices and moves the generator to the
state the draw left, so every number equals a fresh draw's.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.benchmarks.base import Units

# About this many resample indices are held in memory at once (int64: 32 MiB).
_CHUNK_ELEMENTS = 2**22
# Recent index draws kept for reuse, this many bytes in all (see the module docstring).
_DRAW_CACHE_BYTES = 2**30
_draw_cache: OrderedDict[tuple, tuple[list[np.ndarray], dict]] = OrderedDict()


@dataclass(frozen=True)
class BootstrapResult:
    """A paired bootstrap comparison of two systems on the same units."""

    diff: float  # stat(a) - stat(b) on the full data
    lo: float  # lower end of the percentile CI of the difference
    hi: float  # upper end of the percentile CI of the difference
    p: float  # two-sided bootstrap p-value for "no difference" (steps of 2/n_resamples)
    n_units: int  # number of paired units
    n_resamples: int  # number of bootstrap resamples


@dataclass(frozen=True)
class ConfidenceInterval:
    """A bootstrap percentile CI of one system's metric."""

    estimate: float  # stat(a) on the full data
    lo: float  # lower end of the percentile CI
    hi: float  # upper end of the percentile CI
    n_units: int  # number of units
    n_resamples: int  # number of bootstrap resamples


# --------------------------------------------------------------------------- validation


def _as_values(x: np.ndarray, name: str) -> np.ndarray:
    """[n] float copy of ``x``; raises on non-1-D, empty or non-finite input."""
    v = np.asarray(x)
    if v.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-unit values, got shape {v.shape}")
    if v.size == 0:
        raise ValueError(f"{name} is empty: a bootstrap needs at least one unit")
    if not (np.issubdtype(v.dtype, np.number) or v.dtype == bool):
        raise ValueError(f"{name} must be numeric or bool, got dtype {v.dtype}")
    v = v.astype(np.float64)
    if not np.all(np.isfinite(v)):
        bad = np.flatnonzero(~np.isfinite(v))
        raise ValueError(f"{name} has non-finite values at units {bad[:5].tolist()}")
    return v


def _group_codes(groups: np.ndarray | None, n: int) -> tuple[np.ndarray, int]:
    """([n] int group code per unit in 0..G-1, G); one group when ``groups`` is None."""
    if groups is None:
        return np.zeros(n, dtype=np.int64), 1
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ValueError(f"groups must have shape ({n},) to match the values, got {g.shape}")
    if g.dtype.kind == "f" and np.isnan(g).any():
        raise ValueError("groups contains NaN; give every unit a group label")
    try:
        labels, codes = np.unique(g, return_inverse=True)
    except TypeError as e:  # e.g. mixed str / None labels in an object array
        raise ValueError(f"groups labels must be mutually comparable: {e}") from None
    return codes.reshape(n).astype(np.int64), len(labels)


def _check_options(n_resamples: int, ci: float | None = None) -> None:
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if ci is not None and not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), e.g. 0.95, got {ci!r}")


# ------------------------------------------------------------------------ building blocks


def _weights(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """[n] weights ``w`` with ``stat(v) = v @ w`` (macro mean of per-group means)."""
    counts = np.bincount(codes, minlength=n_groups)  # [G]
    return 1.0 / (n_groups * counts[codes])  # [n]


def _statistic(v: np.ndarray, codes: np.ndarray, n_groups: int) -> float:
    """Macro mean over groups of per-group means (the plain mean for one group)."""
    counts = np.bincount(codes, minlength=n_groups)  # [G]
    means = np.bincount(codes, weights=v, minlength=n_groups) / counts  # [G]
    return float(means.mean())


def _index_chunks(
    codes: np.ndarray, n_groups: int, n_resamples: int, rng: np.random.Generator
) -> Iterator[np.ndarray] | list[np.ndarray]:
    """[r, n] resample index chunks (r rows each, ``n_resamples`` rows in all), reusing a
    cached draw when the same groups meet the same generator state (module docstring).

    Column ``j`` of every row holds a unit drawn uniformly with replacement from unit
    ``j``'s group, so each resample keeps every group's size.
    """
    if n_resamples * len(codes) * 8 > _DRAW_CACHE_BYTES:
        return _draw_index_chunks(codes, n_groups, n_resamples, rng)
    digest = hashlib.sha1(np.ascontiguousarray(codes, dtype=np.int64).tobytes()).hexdigest()
    key = (digest, n_groups, n_resamples, repr(rng.bit_generator.state))
    if key in _draw_cache:
        chunks, state = _draw_cache[key]
        _draw_cache.move_to_end(key)
        rng.bit_generator.state = state
        return chunks
    chunks = list(_draw_index_chunks(codes, n_groups, n_resamples, rng))
    for c in chunks:
        c.setflags(write=False)  # shared by every later hit
    _draw_cache[key] = (chunks, rng.bit_generator.state)
    while sum(c.nbytes for chunks, _ in _draw_cache.values() for c in chunks) > _DRAW_CACHE_BYTES:
        _draw_cache.popitem(last=False)
    return chunks


def _draw_index_chunks(
    codes: np.ndarray, n_groups: int, n_resamples: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Draw the chunks of :func:`_index_chunks` from ``rng``, one chunk at a time."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")  # [n] unit ids sorted by group
    counts = np.bincount(codes, minlength=n_groups)  # [G]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])  # [G] offset of group in order
    size_col = counts[codes]  # [n] size of unit j's group
    start_col = starts[codes]  # [n]
    high = n if n_groups == 1 else size_col
    rows = max(1, _CHUNK_ELEMENTS // n)
    for r0 in range(0, n_resamples, rows):
        r = min(rows, n_resamples - r0)
        offset = rng.integers(0, high, size=(r, n))  # [r, n] position within the group
        yield order[start_col + offset]  # [r, n] unit ids


def resample_indices(
    n_units: int, groups: np.ndarray | None = None, n_resamples: int = 10_000, seed: int = 0
) -> np.ndarray:
    """The bootstrap resamples used by this module, as unit indices.

    Args:
        n_units: number of units ``n``.
        groups: optional [n] group label per unit; resampling is then stratified and
            ``groups[idx[k]] == groups`` for every resample ``k``.
        n_resamples: number of resamples ``R``.
        seed: seed of ``numpy.random.default_rng``; the same seed gives the resamples that
            :func:`bootstrap_distribution` and :func:`paired_bootstrap` use.

    Returns:
        [R, n] int array; row ``k`` lists the units of resample ``k``. Holds ``R * n``
        integers: for large problems use the chunked functions instead.
    """
    _check_options(n_resamples)
    if n_units < 1:
        raise ValueError(f"n_units must be positive, got {n_units}")
    codes, n_groups = _group_codes(groups, n_units)
    rng = np.random.default_rng(seed)
    return np.concatenate(list(_index_chunks(codes, n_groups, n_resamples, rng)))


def bootstrap_distribution(
    values: np.ndarray, groups: np.ndarray | None = None, n_resamples: int = 10_000, seed: int = 0
) -> np.ndarray:
    """The statistic of ``values`` on each bootstrap resample.

    Args:
        values: [n] per-unit values.
        groups: optional [n] group labels: stratified resampling and the macro mean over
            groups of per-group means (``Units.statistic``).
        n_resamples: number of resamples ``R``.
        seed: seed of ``numpy.random.default_rng``.

    Returns:
        [R] float array, ``stat(values[idx[k]])`` for the resamples of
        :func:`resample_indices` with the same arguments.
    """
    _check_options(n_resamples)
    v = _as_values(values, "values")
    return _distribution(v, groups, n_resamples, np.random.default_rng(seed))


def _distribution(
    v: np.ndarray, groups: np.ndarray | None, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """[R] statistic of validated values ``v`` on ``n_resamples`` resamples drawn from ``rng``."""
    codes, n_groups = _group_codes(groups, len(v))
    w = _weights(codes, n_groups)  # [n], fixed across resamples (group sizes are fixed)
    chunks = [v[idx] @ w for idx in _index_chunks(codes, n_groups, n_resamples, rng)]
    return _snapped(np.concatenate(chunks), _rounding_bound(v))  # [R]


def _rounding_bound(v: np.ndarray) -> float:
    """Bound on the float error of ``v[idx] @ w`` (weights summing to 1): n * eps * max|v|."""
    return len(v) * np.finfo(np.float64).eps * float(np.abs(v).max())


def _snapped(dist: np.ndarray, bound: float) -> np.ndarray:
    """``dist`` with every value within ``bound`` of 0 set to 0. The resampled statistics
    round: one whose exact value is 0 (a paired difference of accuracies summing to 0 over
    weights 1/n) comes out as +-1e-17 and would leave the p-value's ties."""
    dist[np.abs(dist) <= bound] = 0.0
    return dist


def _tasks_distribution(
    tasks: Sequence[tuple[np.ndarray, np.ndarray | None]], n_resamples: int, seed: int
) -> np.ndarray:
    """[R] mean over tasks of each task's statistic, its units resampled independently.

    ``tasks``: (values [n_t], groups [n_t] or None) per task. The tasks draw from one
    generator in turn, so the first task's resamples are those of
    :func:`bootstrap_distribution` with the same seed.
    """
    rng = np.random.default_rng(seed)
    total = np.zeros(n_resamples)  # [R]
    for v, groups in tasks:
        total += _distribution(v, groups, n_resamples, rng)
    if len(tasks) == 1:
        return total
    # each task's rounding and the sum's: tasks whose statistics cancel exactly are a tie
    eps = np.finfo(np.float64).eps
    bound = sum(_rounding_bound(v) + len(tasks) * eps * float(np.abs(v).max()) for v, _ in tasks)
    return _snapped(total, bound) / len(tasks)


def _percentile_ci(dist: np.ndarray, ci: float) -> tuple[float, float]:
    lo, hi = np.quantile(dist, [(1.0 - ci) / 2.0, (1.0 + ci) / 2.0])
    return float(lo), float(hi)


def _two_sided_p(diff: float, dist: np.ndarray) -> float:
    """Twice the share of resampled differences on the other side of 0 (ties count), <= 1."""
    if diff > 0:
        p = 2.0 * np.mean(dist <= 0)
    elif diff < 0:
        p = 2.0 * np.mean(dist >= 0)
    else:
        p = 1.0
    return float(min(1.0, p))


# ------------------------------------------------------------------------------ the tests


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    groups: np.ndarray | None = None,
    n_resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> BootstrapResult:
    """Paired bootstrap of the difference ``stat(a) - stat(b)`` between two systems.

    Args:
        a: [n] per-unit values of system a (0/1 for accuracies).
        b: [n] per-unit values of system b on the same units, in the same order.
        groups: optional [n] group labels: stratified resampling (group sizes fixed) and
            the macro mean over groups of per-group means, as ``Units.statistic``.
        n_resamples: number of resamples.
        seed: seed of ``numpy.random.default_rng``; the same seed gives the same result.
        ci: coverage of the percentile interval.

    Returns:
        The observed difference, its percentile CI and the two-sided bootstrap p-value.
    """
    _check_options(n_resamples, ci)
    va, vb = _as_values(a, "a"), _as_values(b, "b")
    if va.shape != vb.shape:
        raise ValueError(f"a and b must hold the same units: got {len(va)} and {len(vb)} values")
    codes, n_groups = _group_codes(groups, len(va))
    diff = _statistic(va, codes, n_groups) - _statistic(vb, codes, n_groups)
    dist = bootstrap_distribution(va - vb, groups, n_resamples, seed)  # [R]
    lo, hi = _percentile_ci(dist, ci)
    return BootstrapResult(
        diff=float(diff),
        lo=lo,
        hi=hi,
        p=_two_sided_p(diff, dist),
        n_units=len(va),
        n_resamples=int(n_resamples),
    )


def bootstrap_ci(
    a: np.ndarray,
    groups: np.ndarray | None = None,
    n_resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> ConfidenceInterval:
    """Bootstrap percentile CI of one system's metric ``stat(a)``.

    Args:
        a: [n] per-unit values (0/1 for accuracies).
        groups: optional [n] group labels, as in :func:`paired_bootstrap`.
        n_resamples: number of resamples.
        seed: seed of ``numpy.random.default_rng``; the same seed gives the same result.
        ci: coverage of the percentile interval.

    Returns:
        The metric on the full data and its percentile CI.
    """
    _check_options(n_resamples, ci)
    va = _as_values(a, "a")
    codes, n_groups = _group_codes(groups, len(va))
    lo, hi = _percentile_ci(bootstrap_distribution(va, groups, n_resamples, seed), ci)
    return ConfidenceInterval(
        estimate=_statistic(va, codes, n_groups),
        lo=lo,
        hi=hi,
        n_units=len(va),
        n_resamples=int(n_resamples),
    )


def _same_units(units_a: Units, units_b: Units) -> None:
    """Raises unless the two systems' units carry the same groups (or both none)."""
    ga, gb = units_a.groups, units_b.groups
    if (ga is None) != (gb is None):
        raise ValueError(
            "units_a and units_b must both have groups or both have none "
            f"(a: {'groups' if ga is not None else 'None'}, "
            f"b: {'groups' if gb is not None else 'None'})"
        )
    if ga is not None and not np.array_equal(np.asarray(ga), np.asarray(gb)):
        raise ValueError("units_a and units_b have different groups: they are not the same units")


def units_bootstrap(units_a: Units, units_b: Units, **kw) -> BootstrapResult:
    """:func:`paired_bootstrap` of two systems' ``Units`` for the same metric.

    Args:
        units_a: system a's units.
        units_b: system b's units; must have the same groups as ``units_a``.
        **kw: ``n_resamples``, ``seed``, ``ci`` of :func:`paired_bootstrap`.

    Returns:
        The paired bootstrap result of ``units_a.statistic() - units_b.statistic()``.
    """
    _same_units(units_a, units_b)
    return paired_bootstrap(units_a.values, units_b.values, groups=units_a.groups, **kw)


def units_mean_bootstrap(
    tasks_a: Sequence[Units],
    tasks_b: Sequence[Units],
    n_resamples: int = 10_000,
    seed: int = 0,
    ci: float = 0.95,
) -> BootstrapResult:
    """Paired bootstrap of a mean of T task metrics, ``mean_t stat(a_t) - mean_t stat(b_t)``.

    Each task's units are resampled independently of the other tasks' (stratified by its
    groups; both systems share the draw, as in :func:`paired_bootstrap`), and each resample's
    difference is the mean over tasks of the per-task differences. With one task this is
    :func:`units_bootstrap` with the same seed, number for number.

    Args:
        tasks_a: system a's units, one ``Units`` per task (tasks may come from different
            suites: their units are disjoint).
        tasks_b: system b's units for the same tasks, in the same order.
        n_resamples: number of resamples.
        seed: seed of ``numpy.random.default_rng``; the same seed gives the same result.
        ci: coverage of the percentile interval.

    Returns:
        The observed difference of the means, its percentile CI and the two-sided bootstrap
        p-value; ``n_units`` counts the units of every task.
    """
    _check_options(n_resamples, ci)
    if len(tasks_a) != len(tasks_b) or not tasks_a:
        raise ValueError(
            f"tasks_a and tasks_b must list the same tasks, at least one: got {len(tasks_a)} "
            f"and {len(tasks_b)}"
        )
    diffs, observed = [], []  # (per-unit differences, groups) and stat(a) - stat(b) per task
    for t, (ua, ub) in enumerate(zip(tasks_a, tasks_b, strict=True)):
        _same_units(ua, ub)
        va, vb = _as_values(ua.values, f"tasks_a[{t}]"), _as_values(ub.values, f"tasks_b[{t}]")
        if va.shape != vb.shape:
            raise ValueError(f"task {t}: a and b hold {len(va)} and {len(vb)} units")
        codes, n_groups = _group_codes(ua.groups, len(va))
        observed.append(_statistic(va, codes, n_groups) - _statistic(vb, codes, n_groups))
        diffs.append((va - vb, ua.groups))
    diff = float(np.mean(observed))
    dist = _tasks_distribution(diffs, n_resamples, seed)  # [R]
    lo, hi = _percentile_ci(dist, ci)
    return BootstrapResult(
        diff=diff,
        lo=lo,
        hi=hi,
        p=_two_sided_p(diff, dist),
        n_units=sum(len(v) for v, _ in diffs),
        n_resamples=int(n_resamples),
    )


def units_mean_ci(
    tasks: Sequence[Units], n_resamples: int = 10_000, seed: int = 0, ci: float = 0.95
) -> ConfidenceInterval:
    """Bootstrap percentile CI of one system's mean of T task metrics, ``mean_t stat(a_t)``.

    The resampling of :func:`units_mean_bootstrap` (each task independently, stratified by
    its groups); with one task this is :func:`bootstrap_ci` with the same seed.

    Args:
        tasks: the system's units, one ``Units`` per task.
        n_resamples: number of resamples.
        seed: seed of ``numpy.random.default_rng``; the same seed gives the same result.
        ci: coverage of the percentile interval.

    Returns:
        The mean on the full data and its percentile CI; ``n_units`` counts every task's units.
    """
    _check_options(n_resamples, ci)
    if not tasks:
        raise ValueError("tasks is empty: a mean needs at least one task")
    values = [(_as_values(u.values, f"tasks[{t}]"), u.groups) for t, u in enumerate(tasks)]
    per_task = [_statistic(v, *_group_codes(g, len(v))) for v, g in values]
    lo, hi = _percentile_ci(_tasks_distribution(values, n_resamples, seed), ci)
    return ConfidenceInterval(
        estimate=float(np.mean(per_task)),
        lo=lo,
        hi=hi,
        n_units=sum(len(v) for v, _ in values),
        n_resamples=int(n_resamples),
    )
