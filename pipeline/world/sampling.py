"""Drawing random scenes: backgrounds, attributes, objects placed free of each other or as a
related pair, whole scenes.

Every draw takes a seeded ``numpy.random.Generator`` (:func:`pipeline.world.scenes.scene_rng`),
so a scene is a pure function of its seed; placement rejects what :mod:`pipeline.world.scenes`'
geometry calls ambiguous (objects too close, relations that hold only barely).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.world.scenes import (
    CLEAR,
    COLOURS,
    DEPTH_OVERLAP,
    GAP,
    MARGIN,
    SHAPES,
    SIZES,
    Background,
    Obj,
    Scene,
    in_frame,
    overlap,
    scene_ok,
)


def sample_background(rng: np.random.Generator) -> Background:
    return Background(
        grey=int(rng.integers(58, 92)),
        tint=tuple(int(t) for t in rng.integers(-6, 7, size=3)),
        grad=(float(rng.uniform(-14, 14)), float(rng.uniform(-14, 14))),
        blob=float(rng.uniform(2.0, 6.0)),
        noise=float(rng.uniform(2.0, 5.0)),
        seed=int(rng.integers(0, 2**31 - 1)),
    )


def sample_attributes(
    rng: np.random.Generator,
    n: int,
    distinct_shapes: bool = False,
    distinct_colours: bool = False,
    taken: tuple[tuple[str, str], ...] = (),
) -> list[tuple[str, str, str]]:
    """``n`` (shape, colour, size) triples; (colour, shape) is unique in the scene."""
    out: list[tuple[str, str, str]] = []
    used = set(taken)
    while len(out) < n:
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        size = list(SIZES)[int(rng.integers(len(SIZES)))]
        if (colour, shape) in used:
            continue
        if distinct_shapes and any(s == shape for s, _, _ in out):
            continue
        if distinct_colours and any(c == colour for _, c, _ in out):
            continue
        used.add((colour, shape))
        out.append((shape, colour, size))
    return out


def make_obj(
    rng: np.random.Generator,
    shape: str,
    colour: str,
    size: str,
    x: float = 0.5,
    y: float = 0.5,
    z: int = 0,
) -> Obj:
    lo, hi = SIZES[size]
    jitter = tuple(int(j) for j in rng.integers(-10, 11, size=3))
    return Obj(shape, colour, size, float(x), float(y), float(rng.uniform(lo, hi)), z, jitter)


def place_free(rng: np.random.Generator, o: Obj, others: list[Obj], tries: int = 60) -> Obj | None:
    """``o`` moved to a uniform position that keeps a gap to ``others``, or None."""
    lo, hi = o.r + MARGIN + 0.01, 1.0 - o.r - MARGIN - 0.01
    for _ in range(tries):
        x, y = rng.uniform(lo, hi, size=2)
        if all((x - p.x) ** 2 + (y - p.y) ** 2 >= (o.r + p.r + GAP) ** 2 for p in others):
            cand = replace(o, x=float(x), y=float(y))
            if in_frame(cand):
                return cand
    return None


def place_pair(
    rng: np.random.Generator,
    a: Obj,
    b: Obj,
    axis: str,
    across_max: float | None = None,
    tries: int = 60,
) -> tuple[Obj, Obj] | None:
    """``a`` and ``b`` placed in a clear ``horizontal``/``vertical``/``depth`` relation.

    Horizontal: ``|dx| >= CLEAR`` and ``|dy| <= 0.3 |dx|`` (or ``<= across_max``), the
    sign random; vertical the same with axes exchanged; depth: the shapes overlap by a
    visible amount, random ``z`` order. Returns None if no placement was found.
    """
    for _ in range(tries):
        if axis == "depth":
            ang = rng.uniform(0, 2 * np.pi)
            d = rng.uniform(0.5, 0.85) * (a.r + b.r)
            off = np.array([np.cos(ang), np.sin(ang)]) * d
        else:
            along = rng.uniform(max(CLEAR, a.r + b.r + GAP), 0.58) * rng.choice([-1.0, 1.0])
            lim = 0.3 * abs(along) if across_max is None else across_max
            across = rng.uniform(-lim, lim)
            off = np.array([along, across] if axis == "horizontal" else [across, along])
        # a uniform position for a that keeps both shapes in frame
        m = MARGIN
        lo = np.maximum([a.r + m, a.r + m], [b.r + m - off[0], b.r + m - off[1]])
        hi = np.minimum([1 - a.r - m, 1 - a.r - m], [1 - b.r - m - off[0], 1 - b.r - m - off[1]])
        if np.any(lo >= hi):
            continue
        xa, ya = (float(v) for v in rng.uniform(lo, hi))
        za, zb = (1, 0) if rng.random() < 0.5 else (0, 1)
        pa = replace(a, x=xa, y=ya, z=za)
        pb = replace(b, x=float(xa + off[0]), y=float(ya + off[1]), z=zb)
        if not (in_frame(pa) and in_frame(pb)):
            continue
        if axis == "depth":
            frac, visible = overlap(pa, pb)
            if frac < 3 * DEPTH_OVERLAP or visible < 0.6:
                continue
        return pa, pb
    return None


def fill_scene(
    rng: np.random.Generator,
    scene_id: str,
    fixed: list[Obj],
    n_total: int,
    avoid: tuple[tuple[str, str], ...] = (),
    background: Background | None = None,
) -> Scene | None:
    """A scene of ``fixed`` objects plus random others up to ``n_total``; z re-numbered.

    The fixed objects keep their relative drawing order and indices; added objects go
    behind or in front at random and avoid the (colour, shape) pairs in ``avoid``.
    Returns None if the extra objects found no free place.
    """
    taken = tuple((o.colour, o.shape) for o in fixed) + tuple(avoid)
    objs = list(fixed)
    for shape, colour, size in sample_attributes(rng, n_total - len(fixed), taken=taken):
        o = place_free(rng, make_obj(rng, shape, colour, size), objs)
        if o is None:
            return None
        objs.append(replace(o, z=int(rng.integers(-5, 6)) * 10 + 5))
    order = sorted(range(len(objs)), key=lambda i: (objs[i].z, i))
    ranks = {i: k for k, i in enumerate(order)}
    objs = [replace(o, z=ranks[i]) for i, o in enumerate(objs)]
    bg = background if background is not None else sample_background(rng)
    scene = Scene(scene_id, tuple(objs), bg)
    return scene if scene_ok(scene) else None


def random_scene(
    rng: np.random.Generator,
    scene_id: str,
    n_objects: int | None = None,
    overlap_pair: bool = False,
) -> Scene:
    """A random scene of 2-4 objects; ``overlap_pair`` makes the first two overlap."""
    for _ in range(100):
        n = int(n_objects if n_objects is not None else rng.integers(2, 5))
        fixed: list[Obj] = []
        if overlap_pair:
            (s1, c1, z1), (s2, c2, z2) = sample_attributes(rng, 2)
            pair = place_pair(rng, make_obj(rng, s1, c1, z1), make_obj(rng, s2, c2, z2), "depth")
            if pair is None:
                continue
            fixed = list(pair)
        scene = fill_scene(rng, scene_id, fixed, n)
        if scene is not None:
            return scene
    raise RuntimeError(f"could not place {scene_id}")  # never seen; raise rather than loop
