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

Consistency losses (5, 6) are Huber (smooth L1, ``beta`` logits) on the score difference
*(ours)*: scores are logits whose frozen part alone has a spread of several units, and a
squared difference would let a few items dominate; ``kind="squared"`` is available.

The word -> token and box -> patch maps the grounding objective reads are
:mod:`pipeline.world.grounding`'s.
"""

from __future__ import annotations

import math

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


def consistency(s: torch.Tensor, s_ref: torch.Tensor) -> torch.Tensor:
    """[B] the Huber penalty (threshold 1) on ``s - s_ref`` (objectives 5 and 6: reflection
    and paraphrase): quadratic for small differences, linear for large ones, so one
    transformed item far from its original does not dominate the batch.

    Args:
        s: [B] scores of the transformed item (mirrored image and captions, or paraphrase).
        s_ref: [B] scores of the original item.
    """
    return F.smooth_l1_loss(s, s_ref, reduction="none", beta=1.0)


def region_grounding(
    plan: torch.Tensor,
    r: torch.Tensor,
    item: torch.Tensor,
    row: torch.Tensor,
    cells: torch.Tensor,
    n_depths: int = 2,
) -> torch.Tensor:
    """[M] ``-log(token mass inside its object's box / token row mass)`` (objective 4).

    Args:
        plan: [B, n_rows, L*R+1] plans (columns depth-major ``l*R + p``, last = null patch).
        r: [B, n_rows] row marginals.
        item: [M] batch index of each grounded token.
        row: [M] plan row of each grounded token (``position - 1`` for caption A's tokens).
        cells: [M, R] bool, patches covered by the token's object box
            (:func:`pipeline.world.grounding.box_cells`).
        n_depths: L, the number of visual depths that share the patch axis.
    """
    P = plan[item, row, :-1]  # [M, L*R] non-null cells of the token's row
    inside = cells.repeat(1, n_depths).to(P.dtype)  # [M, L*R] the box at every depth
    m_in = (P * inside).sum(-1)  # [M]
    return -torch.log(m_in.clamp_min(_TINY) / r[item, row].clamp_min(_TINY))
