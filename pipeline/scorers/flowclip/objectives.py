"""Flow-CLIP's training objectives (seed §3.3), as pure functions of scores.

* HNB, the bidirectional hard-negative contrastive loss. A batch has U distinct images
  (identities) and Nt captions: every item's true caption, its hard negative and, where
  present, its paraphrase. With logits ``z_uk = t · s(I_u, T_k)`` (t the logit scale) and
  the positive mask ``P`` (:func:`caption_positives`),

      L_i2t = mean_u  CE(softmax_k z_uk,  P_u· / |P_u·|)        every image, over all captions
      L_t2i = mean_k∈Q CE(softmax_u z_uk,  P_·k / |P_·k|)       positive captions Q as queries
      L_HNB = (L_i2t + L_t2i) / 2

  where CE(p, y) = -Σ y log p. Several positives share the target mass uniformly *(ours:
  the seed says only that shared identities give multiple positives)*; the two directions
  are averaged, as CLIP does *(ours)*.
* CIMR, cross-image margin regularisation: with ``m(I) = s(I, pos) - s(I, neg)`` and a donor
  image of a different identity scored on the same caption pair,

      L_CIMR = mean_b softplus(γ - (m(I_b) - m(I_donor(b))))

  Text-only terms of s cancel in each margin; the loss asks the matched image for the
  larger margin. The trainer passes margins in logit units, ``m = t · (s(I, pos) - s(I, neg))``
  (:mod:`pipeline.scorers.flowclip.training`), so γ is a margin in HNB's units *(ours)*.
  :func:`donor_index` picks the donor from the batch: the next item of another identity
  *(ours: the seed says only "a donor image of a different identity")*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_target_ce(z: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """Mean over rows with a positive of ``-Σ_k y_k log softmax(z)_k``, ``y`` uniform on positives.

    Args:
        z: [n, K] logits.
        positives: [n, K] bool targets; rows without one are left out (0 if none has one).
    """
    y = positives.to(z.dtype)  # [n, K]
    count = y.sum(-1)  # [n]
    ce = -(y * F.log_softmax(z, dim=-1)).sum(-1) / count.clamp_min(1.0)  # [n]
    has = count > 0  # [n]
    return (ce * has).sum() / has.sum().clamp_min(1)


def hnb(z: torch.Tensor, positives: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The HNB loss ``(L_i2t + L_t2i) / 2`` and its two directions.

    Args:
        z: [U, Nt] logits of every batch image against every batch caption.
        positives: [U, Nt] bool, caption k is true of image u.
        queries: [Nt] bool, caption k is a text→image query (true captions, paraphrases).
    """
    i2t = soft_target_ce(z, positives)  # images over all captions
    t2i = soft_target_ce(z[:, queries].T, positives[:, queries].T)  # [Q, U] queries over images
    return (i2t + t2i) / 2, {"i2t": i2t, "t2i": t2i}


def cimr(m: torch.Tensor, m_donor: torch.Tensor, gamma: float) -> torch.Tensor:
    """``mean softplus(γ - (m - m_donor))`` over [B] matched and [B] donor margins."""
    return F.softplus(gamma - (m - m_donor)).mean()


def caption_positives(
    image_identity: torch.Tensor,
    caption_identity: torch.Tensor,
    true_caption: torch.Tensor,
    caption_row: torch.Tensor,
) -> torch.Tensor:
    """[U, Nt] bool: caption k is a positive of image u.

    A caption is a positive of every batch image that shares its item's identity (all the
    true captions and paraphrases of one image are its positives), and a caption with the
    same text (same store row) as a positive is one too *(ours: one string, one label)*.

    Args:
        image_identity: [U] identity of each batch image (its image row).
        caption_identity: [Nt] identity of the image of each caption's item.
        true_caption: [Nt] bool, the caption is its item's true caption or paraphrase
            (False: a hard negative).
        caption_row: [Nt] text row of each caption.
    """
    own = (image_identity[:, None] == caption_identity[None, :]) & true_caption[None, :]  # [U, Nt]
    same_text = caption_row[:, None] == caption_row[None, :]  # [Nt, Nt]
    return (own.float() @ same_text.float()) > 0  # [U, Nt]


def donor_index(identity: torch.Tensor) -> torch.Tensor:
    """[B] donor item of each item: the next item (rolling by one, wrapping) whose
    identity differs; -1 where every other item shares the identity.

    Args:
        identity: [B] image identity of each item.
    """
    B, device = len(identity), identity.device
    if B < 2:
        return torch.full((B,), -1, dtype=torch.long, device=device)
    shift = torch.arange(1, B, device=device)  # [B-1]
    cand = (torch.arange(B, device=device)[:, None] + shift[None, :]) % B  # [B, B-1] items after b, wrapping
    ok = identity[cand] != identity[:, None]  # [B, B-1]
    first = ok.int().argmax(-1)  # [B] first differing candidate (0 if none)
    donor = cand.gather(1, first[:, None])[:, 0]  # [B]
    return torch.where(ok.any(-1), donor, torch.full_like(donor, -1))
