"""Rendering scene graphs with Pillow: textured background, anti-aliased shapes, PNG bytes.

The background is drawn at the output resolution from the scene's ``Background`` (its
own seeded generator: grey level, tint, linear ramp, low-frequency blobs, pixel grain).
The shapes are drawn in ``z`` order at ``SUPERSAMPLE`` (4) times the output side, twice:
in colour on black and as a coverage mask. Both are reduced with an exact area (box)
filter, which is 4 x 4 supersampling, and composited over the background
(``out = bg * (1 - alpha) + colour``, the colour being premultiplied by construction).

Departure from the brief's example (4x then LANCZOS): the box filter gives the exact
pixel coverage without LANCZOS's ringing halos around bright shapes, and costs less. The
same scene always gives the same pixels, hence the same PNG bytes (Pillow writes no
timestamps).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pipeline.world.scenes import Background, Scene, unit_vertices

SUPERSAMPLE = 4  # shapes are drawn at SUPERSAMPLE x the output side, then area-averaged


def background(bg: Background, size: int) -> np.ndarray:
    """[size, size, 3] float32 texture of one background (grey levels 0..255)."""
    g = np.random.default_rng(bg.seed)
    t = (np.arange(size, dtype=np.float32) + 0.5) / size - 0.5  # [S]
    ramp = bg.grad[0] * t[None, :] + bg.grad[1] * t[:, None]  # [S, S]
    coarse = Image.fromarray(g.standard_normal((6, 6)).astype(np.float32), mode="F")
    blobs = np.asarray(coarse.resize((size, size), Image.BICUBIC))  # [S, S]
    luma = g.standard_normal((size, size), dtype=np.float32)  # [S, S] grain
    chroma = g.random((size, size, 3), dtype=np.float32) - 0.5  # [S, S, 3] colour grain
    grey = bg.grey + ramp + bg.blob * blobs + bg.noise * luma  # [S, S]
    return grey[:, :, None] + np.asarray(bg.tint, np.float32) + bg.noise * chroma  # [S, S, 3]


def render(scene: Scene, size: int = 64) -> np.ndarray:
    """[size, size, 3] uint8 image of ``scene``."""
    big = size * SUPERSAMPLE
    paint, cover = Image.new("RGB", (big, big)), Image.new("L", (big, big))
    draw_paint, draw_cover = ImageDraw.Draw(paint), ImageDraw.Draw(cover)
    for o in sorted(scene.objects, key=lambda o: o.z):
        cx, cy, r = o.x * big, o.y * big, o.r * big
        if o.shape == "circle":
            bbox = (cx - r, cy - r, cx + r, cy + r)
            draw_paint.ellipse(bbox, fill=o.rgb)
            draw_cover.ellipse(bbox, fill=255)
        else:
            pts = unit_vertices(o.shape) * r + (cx, cy)  # [V, 2] pixels
            xy = [(float(px), float(py)) for px, py in pts]
            draw_paint.polygon(xy, fill=o.rgb)
            draw_cover.polygon(xy, fill=255)
    colour = np.asarray(paint.reduce(SUPERSAMPLE), dtype=np.float32)  # [S, S, 3] premultiplied
    alpha = np.asarray(cover.reduce(SUPERSAMPLE), dtype=np.float32)[:, :, None] / 255  # [S, S, 1]
    out = background(scene.background, size) * (1 - alpha) + colour  # [S, S, 3]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """PNG encoding of an [H, W, 3] uint8 array (deterministic; fast zlib level)."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def save_png(image: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(image))


def mirror(image: np.ndarray) -> np.ndarray:
    """The horizontal mirror of an [H, W, 3] image."""
    return np.ascontiguousarray(image[:, ::-1])
