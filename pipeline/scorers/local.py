"""Zero-parameter local-alignment baselines over BindCLIP's tensors (methods.md §1.7).

Seed: ``seeds/bindclip.txt`` §3.2 ("patch access is not the explanation"). Every caption
content token (final layer, after ``ln_final``, through ``text_projection``) is compared by
cosine with every final-layer patch (after ``ln_post``, through ``visual_proj``) in CLIP's
joint space; the cosines are pooled over patches and averaged over the caption's content
tokens (truncated to 32, as BindCLIP reads them):

* ``local-max``: ``l(I, T) = mean_i max_p cos(t_i, v_p)``;
* ``local-softmax``: ``l(I, T) = mean_i Σ_p softmax_p(cos / temperature) cos(t_i, v_p)``
  (temperature 0.05 by default *(ours)*);
* ``additive``: ``s(I, T) = logit_scale * (cos(e_I, e_T) + w * l(I, T))``, so the pairwise
  margin is the frozen CLIP logit margin ``g`` plus ``w`` times the local margin in the same
  logit units (kwargs ``pooling`` in {"max", "softmax"} and ``w``; the lead sweeps ``w``).

All are per-caption scorers (``pairwise = False``) without parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers.base import SCORERS, Scorer

POOLINGS = ("max", "softmax")
PAIR_CHUNK = 1 << 24  # token-patch cosines per block of score_matrix (64 MB in float32)


def pool_patches(cos: torch.Tensor, pooling: str, temperature: float) -> torch.Tensor:
    """[*, N] the token-patch cosines ``cos`` [*, N, R] pooled over patches: their max, or
    their mean weighted by a temperature softmax."""
    if pooling == "max":
        return cos.amax(-1)
    return (torch.softmax(cos / temperature, -1) * cos).sum(-1)


def token_mean(pooled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[*] the mean of ``pooled`` [*, N] over the valid tokens ``mask`` [*, N] (0 without any)."""
    m = mask.to(pooled.dtype)
    return (pooled * m).sum(-1) / m.sum(-1).clamp_min(1.0)


def local_alignment(
    tokens: torch.Tensor,
    mask: torch.Tensor,
    patches: torch.Tensor,
    pooling: str,
    temperature: float,
) -> torch.Tensor:
    """[B] mean over valid tokens of the patch-pooled token-patch cosine.

    Args:
        tokens: [B, N, D] caption tokens in the joint space.
        mask: [B, N] valid content tokens.
        patches: [B, R, D] patches in the joint space.
        pooling: "max" or "softmax" (temperature-softmax-weighted mean cosine).
        temperature: softmax temperature.
    """
    cos = torch.einsum("bnd,brd->bnr", F.normalize(tokens, dim=-1), F.normalize(patches, dim=-1))
    return token_mean(pool_patches(cos, pooling, temperature), mask)


def local_alignment_matrix(
    tokens: torch.Tensor,
    mask: torch.Tensor,
    patches: torch.Tensor,
    pooling: str,
    temperature: float,
    chunk: int = PAIR_CHUNK,
) -> torch.Tensor:
    """[Ni, Nt] :func:`local_alignment` of every image against every caption.

    One product of every valid caption token with every patch of a block of images
    (``[V, D] @ [D, g*R]``, V the tokens ``mask`` keeps), pooled in place, then put back at
    the tokens' places among zeros for the mean over tokens: padding is never multiplied, and
    the mean adds the same values, padding at 0, as it would over every token. Blocks hold
    ~``chunk`` token-patch cosines, so memory stays bounded for any gallery.

    Args:
        tokens: [Nt, N, D] caption tokens in the joint space.
        mask: [Nt, N] valid content tokens.
        patches: [Ni, R, D] patches in the joint space.
    """
    Nt, N, D = tokens.shape
    Ni, R, _ = patches.shape
    mask = mask.bool()
    t = F.normalize(tokens[mask], dim=-1)  # [V, D] the valid tokens, caption by caption
    p = F.normalize(patches, dim=-1)  # [Ni, R, D]
    step = max(1, chunk // max(len(t) * R, 1))
    rows = []
    for i in range(0, Ni, step):
        g = p[i : i + step]  # [g, R, D]
        cos = (t @ g.reshape(-1, D).T).view(len(t), len(g), R)  # [V, g, R]
        pooled = tokens.new_zeros(len(g), Nt, N)  # [g, Nt, N], 0 at padding
        pooled[:, mask] = pool_patches(cos, pooling, temperature).T
        rows.append(token_mean(pooled, mask[None]))  # [g, Nt]
    return torch.cat(rows) if rows else tokens.new_zeros(0, Nt)


class LocalAlignment(Scorer):
    """Local (token-patch) alignment, optionally added to the global CLIP logit."""

    def __init__(
        self,
        proj: Projections,
        pooling: str = "max",
        temperature: float = 0.05,
        w: float | None = None,
        max_tokens: int = 32,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.pooling, self.temperature = pooling, temperature
        self.w, self.max_tokens = w, max_tokens
        self.register_buffer("text_projection", proj.text_projection.float().clone())  # [d_t, D]
        self.register_buffer("visual_proj", proj.visual_proj.float().clone())  # [d_v, D]
        self.register_buffer("logit_scale", torch.as_tensor(proj.logit_scale).float().clone())

    def _joint(self, image: ImageFeatures, text: TextFeatures) -> tuple[torch.Tensor, ...]:
        """Caption tokens [Nt, N, D] (the first ``max_tokens`` after sot), their [Nt, N]
        mask and the patches [Ni, R, D], in the joint space."""
        sl = slice(1, 1 + self.max_tokens)  # content tokens start after sot
        tokens = text.tokens[:, sl].float() @ self.text_projection
        patches = image.final.float() @ self.visual_proj
        return tokens, text.content_mask[:, sl], patches

    def local(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[B] local alignment l(I, T) in cosine units."""
        tokens, mask, patches = self._joint(image, text)
        return local_alignment(tokens, mask, patches, self.pooling, self.temperature)

    def _with_global(self, loc: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
        """``loc``, or the additive logit ``logit_scale * (glob + w * loc)`` when ``w`` is set."""
        return loc if self.w is None else self.logit_scale * (glob + self.w * loc)

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[B] local alignment, or the additive logit when ``w`` is set."""
        glob = (F.normalize(image.embed.float(), dim=-1) * F.normalize(text.embed.float(), dim=-1)).sum(-1)
        return self._with_global(self.local(image, text), glob)

    def score_matrix(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[Ni, Nt] :meth:`score` of every image against every caption, batched
        (:func:`local_alignment_matrix`)."""
        tokens, mask, patches = self._joint(image, text)
        loc = local_alignment_matrix(tokens, mask, patches, self.pooling, self.temperature)
        glob = F.normalize(image.embed.float(), dim=-1) @ F.normalize(text.embed.float(), dim=-1).T
        return self._with_global(loc, glob)


@SCORERS.register("local-max")
def local_max(dims: FeatureDims, proj: Projections, **kwargs) -> LocalAlignment:
    """Local alignment: each caption token's best patch cosine, averaged over the tokens."""
    return LocalAlignment(proj, pooling="max", **kwargs)


@SCORERS.register("local-softmax")
def local_softmax(dims: FeatureDims, proj: Projections, **kwargs) -> LocalAlignment:
    """Local alignment: each caption token's softmax-weighted patch cosine, averaged over the tokens."""
    return LocalAlignment(proj, pooling="softmax", **kwargs)


@SCORERS.register("additive")
def additive(
    dims: FeatureDims, proj: Projections, pooling: str = "max", w: float = 1.0, **kwargs
) -> LocalAlignment:
    """Global plus local: CLIP's logit scale times (the global cosine + w * the local alignment)."""
    return LocalAlignment(proj, pooling=pooling, w=w, **kwargs)
