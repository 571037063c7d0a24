"""Where a caption's words are in the picture: words to objects, objects to patches.

The shapes world knows every object, so a caption word that names exactly one object has
an exact referent; scorers read it through the patch grid and the BPE tokens:

* :func:`grounding`: the caption words that name exactly one scene object, with that
  object's box (``by_word=False``: as part of their noun phrase; ``by_word=True``: each
  word alone, which is where a false caption's words point);
* :func:`word_token_positions`: word indices to BPE token positions;
* :func:`view_boxes`: boxes on the whole image to boxes on the square view the encoder sees;
* :func:`box_cover`, :func:`box_cells`, :func:`box_weights`: boxes to the patches they cover
  (covered fractions; the patches at least a quarter covered; area weights of a box mean);
* :func:`visible_cover`: each object's visible part (minus what is drawn over it) per patch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from pipeline.world.captions import Caption, Claim, asserted, refs
from pipeline.world.scenes import Scene


def grounding(
    claim: Claim, cap: Caption, scene: Scene, by_word: bool = False
) -> tuple[list[str], list[list[float]], list[int]]:
    """``(words, boxes, positions)``: caption words that name exactly one scene object.

    A word of an asserted ref (not ``Has.absent``) counts when it names exactly one
    object; its box is that object's normalised box and its position the word index in
    ``cap.words``. ``by_word=False`` matches the word's whole ref (its noun phrase);
    ``by_word=True`` reads each word alone: a shape word counts when exactly one object
    has that shape, a colour (size) word when exactly one has that colour (size), whether
    or not the phrase is true -- in "a blue circle" said of a red circle and a blue
    square, "circle" names the circle and "blue" the square.
    """
    rs = refs(claim)
    n_asserted = len(asserted(claim))
    words, boxes, positions = [], [], []
    for k, (w, t) in enumerate(zip(cap.words, cap.tags, strict=True)):
        if t is None or t >= n_asserted:
            continue
        ref = rs[t]
        if by_word:
            attr = "shape" if w == ref.shape else "colour" if w == ref.colour else "size" if w == ref.size else None
            if attr is None:
                continue
            hits = [o for o in scene.objects if getattr(o, attr) == w]
        else:
            hits = [o for o in scene.objects if ref.matches(o)]
        if len(hits) == 1:
            words.append(w)
            boxes.append([round(c, 6) for c in hits[0].box()])
            positions.append(k)
    return words, boxes, positions



RESIZE_MODES = ("shortest", "longest", "squash")  # open_clip's PreprocessCfg.resize_mode


def view_boxes(
    boxes: np.ndarray, size: Sequence[float] | None, resize_mode: str = "shortest", clip: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes normalised to the whole image -> normalised to the square view the patch grid
    covers, and which boxes keep some area in it.

    open_clip's eval transform makes a non-square image square before the grid sees it, so a
    box normalised by the image's width and height lies elsewhere on the grid:

    * ``shortest`` (every OpenAI CLIP): the shortest side is resized to the model size and
      the centre square cropped, so the long side loses ``(L - S) / 2`` pixels at each end;
      ``u' = (u * L - (L - S) / 2) / S`` along it, clipped to [0, 1];
    * ``longest``: the longest side is resized and the short side padded equally at both
      ends; ``u' = (u * S + (L - S) / 2) / L`` along the short side;
    * ``squash``: both sides resized: the boxes are unchanged.

    A box that the crop cuts away entirely (no area left after clipping) is not visible.

    Args:
        boxes: [m, 4] ``[x0, y0, x1, y1]`` normalised by the image's width and height.
        size: the image's ``(width, height)`` in pixels; None = square (boxes unchanged,
            all visible): the shapes world.
        resize_mode: the store's ``preprocess.resize_mode``.
        clip: clip to the view (default); False keeps the mapped coordinates whole, for a
            position in the view's frame of an object the crop cuts away (re-encoded crops).

    Returns:
        ([m, 4] float64 boxes in the view, [m] bool visible).
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if resize_mode not in RESIZE_MODES:
        raise ValueError(f"resize_mode must be one of {', '.join(RESIZE_MODES)}, got {resize_mode!r}")
    if size is None or resize_mode == "squash":
        return b, np.ones(len(b), dtype=bool)
    w, h = (float(v) for v in size)
    if not (w > 0 and h > 0):
        raise ValueError(f"image size must be positive, got {tuple(size)}")
    short, long_ = min(w, h), max(w, h)
    if resize_mode == "shortest":  # the long axis is cropped
        scale, shift = long_ / short, (long_ - short) / 2 / short
        axis = 0 if w > h else 1  # 0: x cropped, 1: y cropped
    else:  # longest: the short axis is padded
        scale, shift = short / long_, -(long_ - short) / 2 / long_
        axis = 0 if w < h else 1
    out = b.copy()
    if w != h:
        cols = [axis, axis + 2]
        out[:, cols] = b[:, cols] * scale - shift
        if clip:
            out[:, cols] = np.clip(out[:, cols], 0.0, 1.0)
    visible = (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])
    return out, visible


def box_cover(boxes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[M, R] the fraction of each patch's area that each box covers.

    Args:
        boxes: [M, 4] normalised ``[x0, y0, x1, y1]`` (y down, like the patch grid).
        grid: (grid_h, grid_w); patches are row-major (``p = y * grid_w + x``).
    """
    gh, gw = grid
    x0, y0, x1, y1 = boxes.float().unbind(-1)  # [M] each
    ex = torch.arange(gw + 1, dtype=torch.float32) / gw  # [gw+1] patch edges
    ey = torch.arange(gh + 1, dtype=torch.float32) / gh
    ox = (
        torch.minimum(ex[None, 1:], x1[:, None]) - torch.maximum(ex[None, :-1], x0[:, None])
    ).clamp_min(0) * gw
    oy = (
        torch.minimum(ey[None, 1:], y1[:, None]) - torch.maximum(ey[None, :-1], y0[:, None])
    ).clamp_min(0) * gh
    return (oy[:, :, None] * ox[:, None, :]).reshape(len(boxes), gh * gw)  # [M, R]


def _centre_cells(boxes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[M, R] bool: the patch holding each box's centre."""
    gh, gw = grid
    x0, y0, x1, y1 = boxes.float().unbind(-1)
    cx = ((x0 + x1) / 2 * gw).long().clamp(0, gw - 1)
    cy = ((y0 + y1) / 2 * gh).long().clamp(0, gh - 1)
    out = torch.zeros(len(boxes), gh * gw, dtype=torch.bool)
    out[torch.arange(len(boxes)), cy * gw + cx] = True
    return out


def box_cells(
    boxes: torch.Tensor, grid: tuple[int, int], min_overlap: float = 0.25
) -> torch.Tensor:
    """[M, R] bool: patches whose area is at least ``min_overlap`` covered by each box.

    The patch holding the box centre always counts, so a box smaller than a patch still
    has one cell *(ours)*.

    Args:
        boxes: [M, 4] normalised ``[x0, y0, x1, y1]`` (y down, like the patch grid).
        grid: (grid_h, grid_w); patches are row-major (``p = y * grid_w + x``).
    """
    return (box_cover(boxes, grid) >= min_overlap) | _centre_cells(boxes, grid)


def box_weights(boxes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[M, R] area weights of a box mean: each patch weighted by the fraction of its area
    inside the box, so ``weights @ grid / weights.sum(1)`` is the mean over the box of the
    grid read as a piecewise-constant field; a box of zero area weights its centre's patch.

    Args:
        boxes: [M, 4] normalised ``[x0, y0, x1, y1]`` (y down, like the patch grid).
        grid: (grid_h, grid_w); patches are row-major (``p = y * grid_w + x``).
    """
    cover = box_cover(boxes, grid)  # [M, R]
    empty = cover.sum(1, keepdim=True) <= 0  # [M, 1]
    return torch.where(empty, _centre_cells(boxes, grid).float(), cover)


def visible_cover(objects: Sequence[dict], grid: tuple[int, int], supersample: int = 8) -> np.ndarray:
    """[n_objects, R] fraction of each patch covered by the *visible* part of each object:
    its polygon minus every object drawn over it (larger ``z``).

    ``objects``: a scene's objects as the manifests store them (``shape, x, y, r, z``,
    normalised, y down); the polygons are rasterised at ``supersample`` px per patch.
    """
    from PIL import Image, ImageDraw

    from pipeline.world.scenes import unit_vertices

    gh, gw = grid
    hp, wp = gh * supersample, gw * supersample
    masks = []
    for o in objects:
        im = Image.new("1", (wp, hp), 0)
        pts = unit_vertices(o["shape"]) * o["r"] + (o["x"], o["y"])  # [V, 2] normalised
        ImageDraw.Draw(im).polygon([(float(x) * wp, float(y) * hp) for x, y in pts], fill=1)
        masks.append(np.asarray(im, dtype=bool))
    out = np.zeros((len(objects), gh * gw))
    for k, o in enumerate(objects):
        vis = masks[k].copy()
        for j, other in enumerate(objects):
            if other["z"] > o["z"]:
                vis &= ~masks[j]
        out[k] = vis.reshape(gh, supersample, gw, supersample).mean((1, 3)).reshape(-1)
    return out


@functools.cache
def _bpe_pieces(word: str) -> int:
    """How many BPE pieces open_clip's tokenizer splits ``word`` into (memoized: captions
    repeat a small vocabulary, and the BPE is pure Python)."""
    from open_clip.tokenizer import _tokenizer

    return len(_tokenizer.encode(word))


def word_token_positions(
    caption: str, words: Sequence[int], encode=None, max_tokens: int | None = None
) -> list[list[int]]:
    """BPE positions (sot = 0) of each word index in ``caption.split()``.

    Each word is encoded alone (open_clip's BPE splits on whitespace first, so the
    concatenation equals the caption's encoding); a word of several BPE pieces maps to all
    of them. Positions beyond ``max_tokens`` content tokens are dropped.

    Args:
        encode: ``str -> list[int]`` BPE encoder; default open_clip's ``_tokenizer.encode``
            (each distinct word encoded once per process).
    """
    pieces = _bpe_pieces if encode is None else (lambda w: len(encode(w)))
    starts, pos = [], 1
    for w in caption.split():
        starts.append((pos, pieces(w)))
        pos += starts[-1][1]
    out = []
    for k in words:
        if not 0 <= int(k) < len(starts):
            raise ValueError(f"word index {k} out of range for caption {caption!r}")
        p0, n = starts[int(k)]
        out.append([p for p in range(p0, p0 + n) if max_tokens is None or p <= max_tokens])
    return out
