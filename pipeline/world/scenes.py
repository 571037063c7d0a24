"""Scene graphs of the shapes world: vocabulary, seeding, splits, geometry.

Random scenes are drawn by :mod:`pipeline.world.sampling`.

A scene is 2-4 objects on a textured grey background. Each object has a shape, a colour,
a size (small / large), a centre ``(x, y)`` in normalised image coordinates (0..1, y
pointing down), a circumradius ``r`` and a drawing order ``z`` (larger = drawn later = in
front). Every shape is drawn upright and is mirror-symmetric about its vertical axis, so
the horizontal mirror of a rendered scene is the rendering of the mirrored scene.

Seeding. Every random draw comes from a ``numpy.random.Generator`` seeded by
``np.random.SeedSequence([seed, index, code(purpose)])`` (:func:`scene_rng`); there is no
global RNG, so a scene is a pure function of ``(seed, kind, index)``.

Splits. A scene id names one base scene (``whatsup-s0-000012``). Its split is
``int(sha256(scene_id)) % 10``: buckets 0-2 ``train``, 3-4 ``validation``, 5-9
``holdout`` (:func:`split_of`), as the BindCLIP paper split ARO. A suite that needs item
``index`` of some ``kind`` in some split takes the first of ``<kind>-s<seed>-<index>``,
``...r1``, ``...r2`` ... whose bucket is in that split (:func:`scene_id_in_split`), so
ids are unique per index and no index is skipped. Images derived from a base scene
(counterfactual, mirror, the four What'sUp arrangements) carry the base id, hence its
bucket.

Relations are three-valued (True / False / None = ambiguous) so that captions used as
positives are clearly true and negatives clearly false (:func:`relation_value`):

* ``left``: ``b.x - a.x >= HOLD`` is True, ``b.x - a.x <= NOT`` is False (same column or
  the other side); ``right``, ``above``, ``below`` likewise (``above`` = smaller y).
* ``front`` / ``behind``: defined only where the two shapes visibly overlap (pixel
  overlap >= ``DEPTH_OVERLAP`` of the smaller shape) and differ in colour; then decided by
  ``z``. Two shapes of one colour draw one silhouette whichever is in front (only their
  ±10 colour jitter tells them apart), so their depth is not shown.
* ``side`` of the picture: ``left`` is True for ``x <= 0.4``, False for ``x >= 0.5``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import cache, lru_cache

import numpy as np
from PIL import Image, ImageDraw

# ------------------------------------------------------------------------------ vocabulary

# Six shapes that stay distinct at 64 px (a hexagon or pentagon is a few pixels from a
# circle at this resolution).
SHAPES = ("circle", "square", "triangle", "star", "cross", "diamond")
COLOURS: dict[str, tuple[int, int, int]] = {  # saturated or bright; all far from the grey
    "red": (222, 44, 44),
    "green": (46, 184, 72),
    "blue": (52, 104, 240),
    "yellow": (238, 214, 38),
    "purple": (156, 70, 214),
    "orange": (246, 138, 28),
    "white": (242, 242, 242),
}
SIZES: dict[str, tuple[float, float]] = {  # circumradius range (normalised) per size word
    "small": (0.085, 0.10),
    "large": (0.14, 0.16),
}
RELATIONS = ("left", "right", "above", "below", "front", "behind")
OPPOSITE = {
    "left": "right",
    "right": "left",
    "above": "below",
    "below": "above",
    "front": "behind",
    "behind": "front",
}
AXIS = {
    "left": "horizontal",
    "right": "horizontal",
    "above": "vertical",
    "below": "vertical",
    "front": "depth",
    "behind": "depth",
}

HOLD = 0.10  # centre offset along the axis for a spatial relation to hold
NOT = 0.03  # at most this offset (or the other way round) makes it false
CLEAR = 0.18  # offset used when a relation is the subject of a positive caption
SIDE_HOLD, SIDE_NOT = 0.40, 0.50  # "left side of the picture": x <= 0.40 True, x >= 0.50 False
DEPTH_OVERLAP = 0.05  # pixel overlap / smaller area above which front/behind is defined
MARGIN = 0.015  # minimal distance of every shape from the image border
GAP = 0.025  # minimal gap between circumcircles of objects that do not overlap

# ------------------------------------------------------------------------------ seeding, splits

SPLITS: dict[str, tuple[int, ...]] = {
    "train": (0, 1, 2),
    "validation": (3, 4),
    "holdout": (5, 6, 7, 8, 9),
}


def _code(text: str) -> int:
    """A stable 64-bit integer for a string (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def scene_rng(seed: int, index: int, purpose: str) -> np.random.Generator:
    """The generator for one ``(seed, index, purpose)``; ``purpose`` names kind and use."""
    return np.random.default_rng(np.random.SeedSequence([seed, index, _code(purpose)]))


def bucket_of(scene_id: str) -> int:
    """The hash bucket 0-9 of a scene id: ``int(sha256(scene_id)) % 10``."""
    return int(hashlib.sha256(scene_id.encode()).hexdigest(), 16) % 10


def split_of(scene_id: str) -> str:
    """``train`` (buckets 0-2), ``validation`` (3-4) or ``holdout`` (5-9)."""
    b = bucket_of(scene_id)
    return next(name for name, buckets in SPLITS.items() if b in buckets)


def scene_id_in_split(seed: int, kind: str, index: int, split: str) -> tuple[str, int]:
    """``(scene_id, attempt)``: the first id for ``(kind, index)`` that falls in ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    base = f"{kind}-s{seed}-{index:06d}"
    for attempt in range(1000):
        sid = base if attempt == 0 else f"{base}r{attempt}"
        if bucket_of(sid) in SPLITS[split]:
            return sid, attempt
    raise RuntimeError(f"no id in split {split!r} for {base}")  # p = 0.5**1000


# ------------------------------------------------------------------------------ scene graph


@dataclass(frozen=True)
class Obj:
    """One object. Coordinates are normalised to the image side (0..1, y down)."""

    shape: str  # one of SHAPES
    colour: str  # one of COLOURS
    size: str  # one of SIZES
    x: float  # centre, left -> right
    y: float  # centre, top -> bottom
    r: float  # circumradius
    z: int  # drawing order; larger is drawn later (in front)
    jitter: tuple[int, int, int] = (0, 0, 0)  # per-object RGB offset from the colour

    @property
    def rgb(self) -> tuple[int, int, int]:
        base = COLOURS[self.colour]
        return tuple(int(min(255, max(0, c + j))) for c, j in zip(base, self.jitter, strict=True))

    def box(self) -> tuple[float, float, float, float]:
        """Exact normalised ``(x0, y0, x1, y1)`` of the drawn shape."""
        x0, y0, x1, y1 = unit_extent(self.shape)
        return (
            self.x + self.r * x0,
            self.y + self.r * y0,
            self.x + self.r * x1,
            self.y + self.r * y1,
        )


@dataclass(frozen=True)
class Background:
    """Texture parameters; the texture itself is drawn from ``seed`` at render time."""

    grey: int  # mean grey level (dark-mid grey keeps every colour distinguishable)
    tint: tuple[int, int, int]  # small per-channel offset
    grad: tuple[float, float]  # linear ramp amplitude along x and y (grey levels)
    blob: float  # amplitude of the low-frequency texture
    noise: float  # amplitude of the per-pixel noise
    seed: int  # texture seed


@dataclass(frozen=True)
class Scene:
    """A scene graph: objects (any order; drawn by ``z``) and a background."""

    scene_id: str
    objects: tuple[Obj, ...]
    background: Background

    def with_object(self, i: int, **changes) -> Scene:
        objs = list(self.objects)
        objs[i] = replace(objs[i], **changes)
        return replace(self, objects=tuple(objs))

    def without(self, i: int) -> Scene:
        return replace(self, objects=self.objects[:i] + self.objects[i + 1 :])

    def flipped(self) -> Scene:
        """The horizontal mirror (shapes are mirror-symmetric, so only ``x`` changes)."""
        return replace(self, objects=tuple(replace(o, x=1.0 - o.x) for o in self.objects))

    def to_dict(self) -> dict:
        return {
            "scene_id": self.scene_id,
            "objects": [
                {
                    "shape": o.shape,
                    "colour": o.colour,
                    "size": o.size,
                    "x": round(o.x, 6),
                    "y": round(o.y, 6),
                    "r": round(o.r, 6),
                    "z": o.z,
                    "jitter": list(o.jitter),
                    "box": [round(c, 6) for c in o.box()],
                }
                for o in self.objects
            ],
            "background": {
                **self.background.__dict__,
                "tint": list(self.background.tint),
                "grad": list(self.background.grad),
            },
        }

    @classmethod
    def from_dict(cls, d: dict) -> Scene:
        objs = tuple(
            Obj(
                o["shape"],
                o["colour"],
                o["size"],
                o["x"],
                o["y"],
                o["r"],
                o["z"],
                tuple(o["jitter"]),
            )
            for o in d["objects"]
        )
        b = d["background"]
        bg = Background(
            b["grey"], tuple(b["tint"]), tuple(b["grad"]), b["blob"], b["noise"], b["seed"]
        )
        return cls(d["scene_id"], objs, bg)


# ------------------------------------------------------------------------------ geometry


@cache
def unit_vertices(shape: str) -> np.ndarray:
    """[V, 2] polygon of ``shape`` with circumradius 1, centred at 0, y down, upright."""

    def ring(n: int, start: float = -90.0) -> np.ndarray:
        a = np.deg2rad(start + 360.0 * np.arange(n) / n)
        return np.stack([np.cos(a), np.sin(a)], axis=1)

    if shape == "circle":
        v = ring(48, 0.0)
    elif shape == "square":
        s = 0.78
        v = np.array([[-s, -s], [s, -s], [s, s], [-s, s]])
    elif shape == "triangle":
        v = ring(3) + np.array([0.0, 0.18])  # lower the centroid a little: visually centred
    elif shape == "star":
        v = ring(10) * np.where(np.arange(10) % 2 == 0, 1.0, 0.45)[:, None]
    elif shape == "hexagon":
        v = ring(6, 0.0)
    elif shape == "pentagon":
        v = ring(5)
    elif shape == "cross":
        w = 0.34
        v = np.array(
            [
                [-w, -1],
                [w, -1],
                [w, -w],
                [1, -w],
                [1, w],
                [w, w],
                [w, 1],
                [-w, 1],
                [-w, w],
                [-1, w],
                [-1, -w],
                [-w, -w],
            ],
            dtype=float,
        )
    elif shape == "diamond":
        v = np.array([[0, -1], [0.68, 0], [0, 1], [-0.68, 0]], dtype=float)
    else:
        raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
    v = np.asarray(v, dtype=np.float64)
    v = v / np.linalg.norm(v, axis=1).max()  # every vertex within the unit circle
    v.setflags(write=False)
    return v


@cache
def unit_extent(shape: str) -> tuple[float, float, float, float]:
    """``(x0, y0, x1, y1)`` of the unit polygon of ``shape``."""
    v = unit_vertices(shape)
    return float(v[:, 0].min()), float(v[:, 1].min()), float(v[:, 0].max()), float(v[:, 1].max())


def in_frame(o: Obj) -> bool:
    x0, y0, x1, y1 = o.box()
    return x0 >= MARGIN and y0 >= MARGIN and x1 <= 1 - MARGIN and y1 <= 1 - MARGIN


def _mask(o: Obj, n: int) -> np.ndarray:
    im = Image.new("1", (n, n), 0)
    pts = [(float(px), float(py)) for px, py in (unit_vertices(o.shape) * o.r + (o.x, o.y)) * n]
    ImageDraw.Draw(im).polygon(pts, fill=1)
    return np.asarray(im, dtype=bool)  # [n, n]


@lru_cache(maxsize=4096)
def overlap(a: Obj, b: Obj, n: int = 96) -> tuple[float, float]:
    """``(inter / smaller area, visible fraction of the back object)`` on an n-px raster."""
    if (a.x - b.x) ** 2 + (a.y - b.y) ** 2 >= (a.r + b.r) ** 2:
        return 0.0, 1.0
    ma, mb = _mask(a, n), _mask(b, n)
    inter = float((ma & mb).sum())
    sa, sb = float(ma.sum()), float(mb.sum())
    back = sb if a.z > b.z else sa
    return inter / max(1.0, min(sa, sb)), 1.0 - inter / max(1.0, back)


def relation_value(a: Obj, b: Obj, rel: str) -> bool | None:
    """Whether ``a <rel> b`` holds: True, False, or None where the picture is ambiguous."""
    if rel in ("front", "behind"):
        if a.colour == b.colour:
            return None  # one silhouette: which is in front is not in the picture
        frac, _ = overlap(a, b)
        if frac < DEPTH_OVERLAP:
            return None
        return (a.z > b.z) == (rel == "front")
    d = {"left": b.x - a.x, "right": a.x - b.x, "above": b.y - a.y, "below": a.y - b.y}[rel]
    if d >= HOLD:
        return True
    if d <= NOT:
        return False
    return None


def relation_clear(a: Obj, b: Obj, rel: str) -> bool:
    """A relation fit for a positive caption: offset >= CLEAR and along the dominant axis."""
    if rel in ("front", "behind"):
        return relation_value(a, b, rel) is True
    dx, dy = b.x - a.x, b.y - a.y
    along, across = {"left": (dx, dy), "right": (-dx, dy), "above": (dy, dx), "below": (-dy, dx)}[
        rel
    ]
    return along >= CLEAR and abs(across) <= 0.6 * along


def side_value(a: Obj, side: str) -> bool | None:
    """Whether ``a`` is on the ``left``/``right`` side of the picture (three-valued)."""
    x = a.x if side == "left" else 1.0 - a.x
    return True if x <= SIDE_HOLD else False if x >= SIDE_NOT else None


def scene_ok(scene: Scene) -> bool:
    """Every shape in frame; every two shapes apart, or overlapping clearly and visibly."""
    objs = scene.objects
    if not all(in_frame(o) for o in objs):
        return False
    for i in range(len(objs)):
        for j in range(i + 1, len(objs)):
            a, b = objs[i], objs[j]
            if a.z == b.z:
                return False
            if (a.x - b.x) ** 2 + (a.y - b.y) ** 2 >= (a.r + b.r + GAP) ** 2:
                continue
            frac, visible = overlap(a, b)
            if frac == 0.0:
                continue
            if frac < 2 * DEPTH_OVERLAP or visible < 0.55:
                return False
    return True
