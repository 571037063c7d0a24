r"""The six BindCLIP training objectives and their smooth worst-group aggregation.

Methods.md §1.6 (seed ``bindclip.txt`` §2.4). Every objective is a pure function of
pairwise scores ``s(I, A, B)`` (logits, antisymmetric in A, B) or of one explanation's
plan; it returns one loss per item (or per grounded token) so that the caller can
aggregate it over families with :func:`worst_group`:

.. math::
    \mathcal{L} = \tau \log \frac{1}{|F_b|} \sum_{f \in F_b} \exp(L_f / \tau),
    \qquad L_f = \operatorname{mean}_{i \in f} \ell_i,

over the families ``F_b`` present in the batch. ``tau -> 0`` gives the worst family's
mean loss, ``tau -> inf`` the plain mean over families.

1. caption preference ``softplus(-s(I, pos, neg))``;
2. correct-vs-mismatched image ``softplus(gamma - (s(I, pos, neg) - s(I', pos, neg)))``
   with I' the counterfactual render for which the negative is true *(ours: the logistic
   form of a margin; gamma = 0 by default, so the loss is the logistic loss of the
   margin's image interaction)*;
3. structural sufficiency ``softplus(-(s - g))``: the learned part alone must prefer the
   positive;
4. region grounding ``-log(m_in / r_i)``: ``m_in`` is token i's plan mass on the non-null
   cells (both depths) of the patches covered by its object's box, ``r_i`` its row mass,
   so mass parked on the null patch counts as outside *(ours: the spec says "token mass
   inside that object's box"; normalising by the row mass makes the loss zero only for a
   token that is fully grounded inside its box)*;
5. reflection consistency ``smooth_l1(s(flip I, flip A, flip B) - s(I, A, B))``;
6. paraphrase consistency ``smooth_l1(s(I, A', B) - s(I, A, B))``.

Objectives of ours, off unless ``params.yaml`` weighs them: ``binding``
(:func:`binding_contrast`) and ``null`` (:func:`null_grounding`).

Consistency losses (5, 6) are Huber (smooth L1, ``beta`` logits) on the score difference
*(ours)*: scores are logits whose frozen part alone has a spread of several units, and a
squared difference would let a few items dominate; ``kind="squared"`` is available.

Helpers map the world's ``ground_positions`` (word indices in ``pos.split()``) to BPE token
positions (:func:`word_token_positions`) and boxes to patch cells (:func:`box_cells`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

_TINY = 1e-12

# ---------------------------------------------------------------------------- aggregation


def worst_group(losses: torch.Tensor, groups: torch.Tensor, tau: float) -> torch.Tensor:
    r"""Smooth worst-group mean ``tau * log mean_f exp(L_f / tau)`` over present groups.

    Args:
        losses: [M] per-item (or per-token) losses.
        groups: [M] integer group id of each entry (e.g. the family index).
        tau: temperature; ``0`` gives the max over groups, ``inf`` the mean over groups.

    Returns:
        [] the aggregated loss (0 when ``losses`` is empty).
    """
    if losses.numel() == 0:
        return losses.sum()
    ids, inverse = torch.unique(groups, return_inverse=True)  # [G], [M]
    total = losses.new_zeros(len(ids)).index_add(0, inverse, losses)
    count = losses.new_zeros(len(ids)).index_add(0, inverse, torch.ones_like(losses))
    L = total / count  # [G] per-group mean loss
    if tau == 0:
        return L.max()
    if math.isinf(tau):
        return L.mean()
    if tau < 0:
        raise ValueError(f"group_tau must be >= 0 (0 = max, inf = mean), got {tau}")
    return tau * (torch.logsumexp(L / tau, 0) - math.log(len(ids)))


def group_means(losses: torch.Tensor, groups: torch.Tensor, n_groups: int) -> torch.Tensor:
    """[n_groups] per-group mean loss (NaN where a group is absent), for logging."""
    total = losses.new_zeros(n_groups).index_add(0, groups, losses.detach())
    count = losses.new_zeros(n_groups).index_add(0, groups, torch.ones_like(losses))
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, math.nan))


# ---------------------------------------------------------------------------- objectives


def caption_preference(s: torch.Tensor) -> torch.Tensor:
    """[B] ``softplus(-s(I, pos, neg))`` (objective 1)."""
    return F.softplus(-s)


def image_contrast(s: torch.Tensor, s_cf: torch.Tensor, gamma: float = 0.0) -> torch.Tensor:
    """[B] ``softplus(gamma - (s(I, pos, neg) - s(I', pos, neg)))`` (objective 2).

    Args:
        s: [B] scores on the true image I.
        s_cf: [B] scores of the same caption pair on the counterfactual image I' (for which
            the negative is true); entries may be NaN where no I' exists (then the loss is
            masked by the caller).
        gamma: margin in logits (0 = plain logistic loss of the difference).
    """
    return F.softplus(gamma - (s - s_cf))


def structural_sufficiency(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """[B] ``softplus(-(s - g))``: the learned part without the frozen margin g (objective 3)."""
    return F.softplus(-(s - g))


def consistency(
    s: torch.Tensor, s_ref: torch.Tensor, kind: str = "smooth_l1", beta: float = 1.0
) -> torch.Tensor:
    """[B] penalty on ``s - s_ref`` (objectives 5 and 6: reflection and paraphrase).

    Args:
        s: [B] scores of the transformed item (mirrored image and captions, or paraphrase).
        s_ref: [B] scores of the original item.
        kind: ``smooth_l1`` (Huber with threshold ``beta``) or ``squared``.
    """
    if kind == "smooth_l1":
        return F.smooth_l1_loss(s, s_ref, reduction="none", beta=beta)
    if kind == "squared":
        return (s - s_ref) ** 2
    raise ValueError(f"consistency kind must be 'smooth_l1' or 'squared', got {kind!r}")


def region_grounding(
    plan: torch.Tensor,
    r: torch.Tensor,
    item: torch.Tensor,
    row: torch.Tensor,
    cells: torch.Tensor,
    n_depths: int = 2,
    other: torch.Tensor | None = None,
) -> torch.Tensor:
    """[M] ``-log(token mass inside its object's box / token row mass)`` (objective 4).

    With ``other`` (the patches of the scene's other objects, :func:`object_cells`)
    a contrast term ``-log(m_in / (m_in + m_other))`` is added *(ours)*: the first term is
    also met by mass on any object (objectness), this one only by mass on the right one.

    Args:
        plan: [B, n_rows, L*R+1] plans (columns depth-major ``l*R + p``, last = null patch).
        r: [B, n_rows] row marginals.
        item: [M] batch index of each grounded token.
        row: [M] plan row of each grounded token (``position - 1`` for caption A's tokens).
        cells: [M, R] bool, patches covered by the token's object box (:func:`box_cells`).
        n_depths: L, the number of visual depths that share the patch axis.
        other: [M, R] bool or None, the distractor patches of each token.
    """
    P = plan[item, row, :-1]  # [M, L*R] non-null cells of the token's row
    inside = cells.repeat(1, n_depths).to(P.dtype)  # [M, L*R] the box at every depth
    m_in = (P * inside).sum(-1)  # [M]
    loss = -torch.log(m_in.clamp_min(_TINY) / r[item, row].clamp_min(_TINY))
    if other is not None:
        m_other = (P * other.repeat(1, n_depths).to(P.dtype)).sum(-1)  # [M]
        loss = loss - torch.log(m_in.clamp_min(_TINY) / (m_in + m_other).clamp_min(_TINY))
    return loss


def compatibility_contrast(
    S: torch.Tensor,
    item: torch.Tensor,
    row: torch.Tensor,
    own: torch.Tensor,
    other: torch.Tensor,
    temperature: float = 0.1,
    margin: float = 0.0,
) -> torch.Tensor:
    """[M] ``softplus((margin - (S_own - S_other)) / temperature)``, averaged over depths *(ours)*.

    A grounding term on the compatibility itself, before any plan: a grounded word's mean
    S over its object's visible patches must exceed its mean S over the patches of the
    scene's other objects. The plan-mass terms of :func:`region_grounding` are also met by
    a row that the marginals push onto the object; this one asks S to tell the objects
    apart (e.g. "red" higher on the red object than on the blue one). A token whose scene
    has no other visible object gets 0.

    Args:
        S: [B, n_rows, L, R] token-cell compatibilities (rows as in the plan).
        item, row: [M] batch index and row of each grounded token.
        own, other: [M, R] bool, the token's object's visible patches and the other objects'.
        temperature: the logistic's temperature (the Sinkhorn epsilon is a natural choice).
        margin: the gap asked for; at the Sinkhorn epsilon eps, a gap g makes the kernel
            exp(g / eps) times larger on the own object's patches than on the others'.
    """
    s = S[item, row].float()  # [M, L, R]
    gap = _mean_over_cells(s, own) - _mean_over_cells(s, other)  # [M, L]
    return F.softplus((margin - gap) / temperature).mean(-1) * other.any(-1).to(s.dtype)


def binding_contrast(
    S: torch.Tensor,
    item: torch.Tensor,
    pos_row: torch.Tensor,
    neg_row: torch.Tensor,
    cells: torch.Tensor,
    temperature: float = 0.1,
) -> torch.Tensor:
    """[K] ``softplus(-(S_pos - S_neg) / temperature)``, averaged over depths *(ours)*.

    The same word naming the same object in the true and in the false caption, after a
    different word ("circle" in "a red circle" vs "a blue circle", said of a red circle):
    its compatibility averaged over the object's patches must be higher in the true
    caption's context. A causal text tower writes the preceding attribute into the noun's
    state, so S can tell a bound noun from an unbound one.

    Args:
        S: [B, n_rows, L, R] compatibilities (rows as in the plan: pos block, then neg).
        item: [K] batch index; pos_row, neg_row: [K] rows of the word in each caption.
        cells: [K, R] bool, the object's patches.
    """
    gap = _mean_over_cells(S[item, pos_row].float(), cells) - _mean_over_cells(S[item, neg_row].float(), cells)
    return F.softplus(-gap / temperature).mean(-1)


def null_grounding(plan: torch.Tensor, r: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """[B] mean over each item's non-naming tokens of ``-log(P_{i,null patch} / r_i)`` *(ours)*.

    The complement of region grounding: a token whose word names no object ("the", "is",
    "of", "left") is pulled onto the null patch, so that the spatial energy's span centroids
    (grounded-mass-weighted means of the tokens before and after a token) are those of the
    words that name objects. Items without such tokens get 0.

    Args:
        plan: [B, n_rows, L*R+1] plans (last column = null patch).
        r: [B, n_rows] row marginals.
        words: [B, n_rows] bool, the rows to pull (False for the null row and padding).
    """
    share = plan[..., -1] / r.clamp_min(_TINY)  # [B, n_rows] share of the row on the null patch
    w = words.to(plan.dtype)
    loss = -torch.log(share.clamp_min(_TINY)) * w
    return loss.sum(-1) / w.sum(-1).clamp_min(1.0)


def _mean_over_cells(s: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """[M, L] mean of s [M, L, R] over each row's cells [M, R] (bool; 0 where none)."""
    w = cells[:, None].to(s.dtype)  # [M, 1, R]
    return (s * w).sum(-1) / w.sum(-1).clamp_min(1.0)


# ---------------------------------------------------------------------------- helpers


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
    cover = oy[:, :, None] * ox[:, None, :]  # [M, gh, gw] covered fraction of each patch
    cx = ((x0 + x1) / 2 * gw).long().clamp(0, gw - 1)
    cy = ((y0 + y1) / 2 * gh).long().clamp(0, gh - 1)
    cells = cover >= min_overlap
    cells[torch.arange(len(boxes)), cy, cx] = True
    return cells.reshape(len(boxes), gh * gw)


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


def _match_boxes(objects: Sequence[dict], boxes: torch.Tensor) -> list[int | None]:
    """Index of the scene object whose ``box`` each box is (None where none is)."""
    if not len(objects):
        return [None] * len(boxes)
    obj_boxes = torch.tensor([o["box"] for o in objects], dtype=torch.float32).reshape(-1, 4)
    dist = (boxes.float()[:, None] - obj_boxes[None]).abs().amax(-1)  # [M, n_objects]
    best = dist.argmin(-1)
    return [int(b) if float(d) <= 1e-4 else None for b, d in zip(best, dist.gather(1, best[:, None])[:, 0], strict=True)]


def object_cells(
    objects: Sequence[dict], boxes: torch.Tensor, grid: tuple[int, int], min_overlap: float = 0.25
) -> tuple[torch.Tensor, torch.Tensor]:
    """(visible cells, other objects' cells) of each box, [M, R] bool each, from one
    rasterisation of the scene (:func:`visible_cover`).

    * visible cells: the patches at least ``min_overlap`` covered by the visible part of
      the object the box belongs to -- a sharper grounding target than :func:`box_cells`,
      as a box also holds background and the parts of other objects that overlap it
      *(ours)*. The patch the visible part covers most always counts.
    * other objects' cells: the patches of every *other* object of the scene (visible part
      >= ``min_overlap``) that the box's own object covers less than ``min_overlap`` -- the
      distractors of :func:`region_grounding`'s contrast term.

    Each box is matched to the scene object with that ``box``; a box that matches none
    falls back to :func:`box_cells` and has no distractors.

    Args:
        boxes: [M, 4] normalised ``[x0, y0, x1, y1]``, as in :func:`box_cells`.
    """
    own = box_cells(boxes, grid, min_overlap)  # the fallback
    other = torch.zeros_like(own)
    if not len(objects):
        return own, other
    cover = visible_cover(objects, grid)  # [n_objects, R]
    covered = torch.from_numpy(cover >= min_overlap)  # [n_objects, R]
    for m, k in enumerate(_match_boxes(objects, boxes)):
        if k is not None:
            own[m] = covered[k]
            own[m, int(cover[k].argmax())] = True
            other[m] = torch.cat([covered[:k], covered[k + 1 :]]).any(0) & ~covered[k]
    return own, other


def word_token_positions(
    caption: str, words: Sequence[int], encode=None, max_tokens: int | None = None
) -> list[list[int]]:
    """BPE positions (sot = 0) of each word index in ``caption.split()``.

    Each word is encoded alone (open_clip's BPE splits on whitespace first, so the
    concatenation equals the caption's encoding); a word of several BPE pieces maps to all
    of them. Positions beyond ``max_tokens`` content tokens are dropped.

    Args:
        encode: ``str -> list[int]`` BPE encoder; default open_clip's ``_tokenizer.encode``.
    """
    if encode is None:
        from open_clip.tokenizer import _tokenizer

        encode = _tokenizer.encode
    starts, pos = [], 1
    for w in caption.split():
        starts.append((pos, len(encode(w))))
        pos += starts[-1][1]
    out = []
    for k in words:
        if not 0 <= int(k) < len(starts):
            raise ValueError(f"word index {k} out of range for caption {caption!r}")
        p0, n = starts[int(k)]
        out.append([p for p in range(p0, p0 + n) if max_tokens is None or p <= max_tokens])
    return out
