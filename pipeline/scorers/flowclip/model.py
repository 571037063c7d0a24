"""Flow-CLIP: image-conditioned residual scoring over a frozen CLIP (methods.md §2).

Seed: ``seeds/flowclip.txt`` §3. A per-caption scorer (``pairwise = False``), so
:func:`~pipeline.scorers.base.option_scores` scores any number of options:

    s(I, T) = GCC(I, T) + λ · ICER(I, T)

* GCC (seed §3.1): ``cos(e_I, M e_T)``, ``M ∈ R^{D×D}`` initialised to the identity.
* ICER (seed §3.2), for content token i of T and patch p of I (final layer, CLS excluded):

      q_i  = M_tok h_i                          token query; M_tok initialised to CLIP's text projection
      v_p  = normalise(P_v^T g_p)               patch key: ln_post'd patch through CLIP's visual projection
      a_ip = <q̂_i, v_p>                         response
      w_ip ∝ relu(a_ip - mean_p a_ip)           context weights (a row of zeros stays zero)
      c_i  = Σ_p w_ip v_p,   c⊥_i = c_i - <c_i, q̂_i> q̂_i
      q'_i = q_i + W c⊥_i                       W initialised to zero
      e(q) = τ log mean_p exp(<q̂, v_p> / τ)     pooled evidence
      ICER = mean_i [e(q'_i) - e(q_i)]          over content tokens (SOT, EOT, padding excluded)

At initialisation M = I and W = 0, so ``s = cos(e_I, e_T)``: the frozen ``clip`` scorer
(unscaled cosine; HNB applies the logit scale in training). Because ICER ≡ 0 for every
``M_tok`` while ``W = 0``, the gradient reaching ``M_tok`` at initialisation is zero in exact
arithmetic (rounding noise, ~1e-8, in float32); ``M_tok`` starts learning once the first step
moves ``W`` (:attr:`FlowClip.zero_grad_at_init`).

Choices the seed leaves open, marked *(ours)* in :class:`FlowClipConfig`:

* λ is a fixed config value (default 1), not a parameter: a learned λ has zero gradient at
  initialisation (ICER = 0) and duplicates the scale W already learns; λ = 0 gives
  ``global-m``'s score exactly, for the same M.
* e(q) is a log-*mean*-exp at temperature τ = 0.05 (the ``local-softmax`` temperature): a soft
  maximum between the mean and the max response; the ``log R`` cancels in e(q') - e(q).
* Padded patches are all-zero grid rows; they enter neither the mean response, the context
  nor e(q). ICER reads a caption's first 32 content tokens (``max_tokens``; methods.md's
  notation truncates every caption to 32, as BindCLIP and the local baselines read them);
  the token axis is trimmed to the batch's longest caption, which changes nothing (padding
  is masked).
* M, M_tok and W are linear maps without bias; P_v stays frozen (a non-persistent buffer).

Variants (each trained separately, each owns its checkpoint; state-dict names are shared,
so ``gcc.M`` means the same in all three): ``global-m`` (GCC, HNB), ``flowclip`` (GCC + ICER,
HNB) and ``flowclip-cimr`` (GCC + ICER, HNB + CIMR); the objectives are
:mod:`pipeline.scorers.flowclip.objectives`, the training hook
:mod:`pipeline.scorers.flowclip.training`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import family_options
from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers.base import SCORERS, Scorer

_MASKED = -1e9  # logit of a padded patch in the evidence log-sum-exp (finite: no NaN gradients)


@dataclass
class FlowClipConfig:
    icer: bool = True  # the local ICER branch; False = GCC only (`global-m`), no ICER parameters
    lam: float = 1.0  # λ in s = GCC + λ·ICER, fixed, not learned (ours; 0 recovers the global branch)
    tau: float = 0.05  # temperature τ of the pooled evidence e(q) over patches (ours)
    max_tokens: int = 32  # content tokens of a caption ICER reads (methods.md: captions truncated to 32)
    pair_chunk: int = 512  # (image, caption) pairs per ICER pass in score_matrix: passes this small stay in the CPU's cache

    def __post_init__(self) -> None:
        if not math.isfinite(self.lam):
            raise ValueError(f"lam must be finite, got {self.lam!r}")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau!r}")
        if self.pair_chunk < 1:
            raise ValueError(f"pair_chunk must be >= 1, got {self.pair_chunk!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens!r}")


# ---------------------------------------------------------------------------- building blocks


def gcc(e_I: torch.Tensor, e_T: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """Global compatibility ``cos(e_I, M e_T)`` (seed §3.1).

    Args:
        e_I: [*, D] pooled image embeddings.
        e_T: [*, D] pooled caption embeddings (broadcast against ``e_I``).
        M: [D, D] the calibration map.

    Returns:
        [*] cosines.
    """
    return (F.normalize(e_I, dim=-1) * F.normalize(e_T @ M.T, dim=-1)).sum(-1)


def patch_keys(grid: torch.Tensor, visual_proj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit patch keys ``v_p`` in the joint space and the valid-patch mask.

    Args:
        grid: [*, R, d_v] final-layer patches after ``ln_post`` (CLS excluded); all-zero
            rows are padding.
        visual_proj: [d_v, D] CLIP's visual projection.

    Returns:
        v: [*, R, D] unit keys (0 on padding), and mask: [*, R] bool valid patches.
    """
    mask = grid.abs().amax(-1) > 0  # [*, R]
    return F.normalize(grid @ visual_proj, dim=-1), mask  # [*, R, D]


def context_weights(a: torch.Tensor, patch_mask: torch.Tensor) -> torch.Tensor:
    """``w_ip ∝ relu(a_ip - mean_p a_ip)`` over valid patches; a row of zeros stays zero.

    Args:
        a: [*, N, R] responses ``<q̂_i, v_p>``.
        patch_mask: [*, R] valid patches (broadcast against ``a``'s leading dims).

    Returns:
        [*, N, R] weights; each row sums to 1, or is 0 where no response exceeds the mean.
    """
    m = patch_mask[..., None, :].to(a.dtype)  # [*, 1, R]
    mean = (a * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)  # [*, N, 1]
    r = F.relu(a - mean) * m  # [*, N, R]
    total = r.sum(-1, keepdim=True)  # [*, N, 1]
    return r / torch.where(total > 0, total, torch.ones_like(total))  # [*, N, R]


def reject(c: torch.Tensor, q_hat: torch.Tensor) -> torch.Tensor:
    """``c⊥ = c - <c, q̂> q̂``: the context with its component along the query removed.

    Args:
        c: [*, N, D] contexts.
        q_hat: [*, N, D] unit queries (a zero query leaves ``c`` unchanged).
    """
    return c - (c * q_hat).sum(-1, keepdim=True) * q_hat  # [*, N, D]


def pooled_evidence(a: torch.Tensor, patch_mask: torch.Tensor, tau: float) -> torch.Tensor:
    """``e = τ log mean_p exp(a_p / τ)`` over valid patches *(ours)*.

    Args:
        a: [*, N, R] responses of N queries to R patches.
        patch_mask: [*, R] valid patches.
        tau: temperature (→ 0: max response; → ∞: mean response).

    Returns:
        [*, N] pooled evidence.
    """
    m = patch_mask[..., None, :]  # [*, 1, R]
    z = (a / tau).masked_fill(~m, _MASKED)  # [*, N, R]
    n = m.sum(-1).clamp_min(1).to(a.dtype)  # [*, 1]
    return tau * (torch.logsumexp(z, -1) - n.log())  # [*, N]


def icer(
    q: torch.Tensor,
    v: torch.Tensor,
    token_mask: torch.Tensor,
    patch_mask: torch.Tensor,
    W: torch.Tensor,
    tau: float,
    mapped: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Image-conditioned evidence refinement: ``mean_i [e(q'_i) - e(q_i)]`` (seed §3.2).

    G images, each against K captions: matched pairs are ``G = B, K = 1``, all pairs
    ``G = Ni, K = Nt``. The K captions of an image share one batched product with its
    patches (``[K*N, D] @ [D, R]``); captions given once (leading dim 1) are shared by
    every image without a copy.

    The corrected query is ``q'_i = q_i + W c⊥_i``. Without ``mapped``, W multiplies each
    pair's rejected context (N·D² per pair). With ``mapped = (q̂ Wᵀ, v Wᵀ)``, computed
    once per caption and once per image, it is assembled as
    ``q_i + Σ_p w_ip (W v_p) - <c_i, q̂_i> W q̂_i`` with ``<c_i, q̂_i> = Σ_p w_ip a_ip``:
    the same vector (W is linear), without a D x D product per pair, which is what
    scoring many images against many captions wants (:meth:`EvidenceRefinement.matrix`).

    Args:
        q: [G or 1, K, N, D] token queries ``M_tok h_i``.
        v: [G, R, D] unit patch keys.
        token_mask: [G or 1, K, N] valid content tokens.
        patch_mask: [G, R] valid patches.
        W: [D, D] residual map.
        tau: evidence temperature.
        mapped: ``(q̂ Wᵀ [G or 1, K, N, D], v Wᵀ [G, R, D])``, q̂ the unit queries.

    Returns:
        [G, K] ICER; 0 for a caption without content tokens or an image without patches,
        and exactly 0 when ``W = 0``.
    """
    G, R, D = v.shape
    Gq, K, N = q.shape[:3]
    vt = v.transpose(1, 2)  # [G, D, R]
    pm = patch_mask[:, None]  # [G, 1, R] broadcast over the K captions
    q_hat = F.normalize(q, dim=-1)  # [Gq, K, N, D]
    a = (q_hat.reshape(Gq, K * N, D) @ vt).view(G, K, N, R)  # responses a_ip
    w = context_weights(a, pm)  # [G, K, N, R]
    if mapped is None:
        c = (w.reshape(G, K * N, R) @ v).view(G, K, N, D)  # context c_i
        q_new = q + reject(c, q_hat) @ W.T  # [G, K, N, D] corrected query q'_i = q_i + W c⊥_i
    else:
        qW, vW = mapped  # [Gq, K, N, D], [G, R, D]
        along = (w * a).sum(-1, keepdim=True)  # [G, K, N, 1] <c_i, q̂_i>
        q_new = q + (w.reshape(G, K * N, R) @ vW).view(G, K, N, D) - along * qW
    a_new = (F.normalize(q_new, dim=-1).reshape(G, K * N, D) @ vt).view(G, K, N, R)
    delta = pooled_evidence(a_new, pm, tau) - pooled_evidence(a, pm, tau)  # [G, K, N]
    m = token_mask.to(delta.dtype)  # [Gq, K, N]
    has_patches = patch_mask.any(-1, keepdim=True).to(delta.dtype)  # [G, 1]
    return (delta * m).sum(-1) / m.sum(-1).clamp_min(1.0) * has_patches  # [G, K]


def token_states(text: TextFeatures, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, d_t] token states and [B, N] content mask of each caption's first
    ``max_tokens`` content tokens; N = the longest caption (sot..eot), at most sot plus
    ``max_tokens``."""
    n = max(int(text.mask.sum(-1).max()), 1) if len(text) else 1
    n = min(n, 1 + max_tokens)  # content starts after sot
    return text.tokens[:, :n].float(), text.content_mask[:, :n]


# ---------------------------------------------------------------------------- the module


class GlobalCalibration(nn.Module):
    """GCC: ``cos(e_I, M e_T)`` with ``M`` initialised to the identity."""

    def __init__(self, D: int) -> None:
        super().__init__()
        self.M = nn.Parameter(torch.eye(D))  # [D, D]

    def forward(self, e_I: torch.Tensor, e_T: torch.Tensor) -> torch.Tensor:
        """[B] matched pairs' cosines from [B, D] embeddings."""
        return gcc(e_I.float(), e_T.float(), self.M)

    def matrix(self, e_I: torch.Tensor, e_T: torch.Tensor) -> torch.Tensor:
        """[Ni, Nt] every image against every caption."""
        return F.normalize(e_I.float(), dim=-1) @ F.normalize(e_T.float() @ self.M.T, dim=-1).T


class EvidenceRefinement(nn.Module):
    """ICER's parameters: ``M_tok`` (init: CLIP's text projection) and ``W`` (init: 0)."""

    def __init__(self, dims: FeatureDims, proj: Projections, tau: float, max_tokens: int = 32) -> None:
        super().__init__()
        D = dims.embed_dim
        text_projection = torch.as_tensor(proj.text_projection).float()  # [d_t, D]
        visual_proj = torch.as_tensor(proj.visual_proj).float()  # [d_v, D]
        for name, x, want in (("text_projection", text_projection, (dims.d_t, D)), ("visual_proj", visual_proj, (dims.d_v, D))):
            if tuple(x.shape) != want:
                raise ValueError(f"Projections.{name} has shape {tuple(x.shape)}; dims {dims} need {want}")
        self.M_tok = nn.Parameter(text_projection.T.clone())  # [D, d_t]: q_i = M_tok h_i
        self.W = nn.Parameter(torch.zeros(D, D))  # [D, D]: q'_i = q_i + W c⊥_i
        self.register_buffer("visual_proj", visual_proj.clone(), persistent=False)  # [d_v, D] frozen P_v
        self.tau, self.max_tokens = tau, max_tokens
        self.shortcut = True  # skip the products while ICER vanishes (see :meth:`vanishes`)

    def queries(self, text: TextFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, N, D] token queries ``q_i = M_tok h_i`` and their [B, N] content mask."""
        h, mask = token_states(text, self.max_tokens)  # [B, N, d_t], [B, N]
        return h @ self.M_tok.T, mask  # [B, N, D]

    def keys(self, image: ImageFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, R, D] unit patch keys and their [B, R] valid mask."""
        return patch_keys(image.final.float(), self.visual_proj)

    def vanishes(self) -> bool:
        """True when ICER is exactly 0 and nothing asks for its gradient: ``W = 0`` leaves every
        corrected query equal to its query, so scoring skips the token-patch products (a
        checkpoint selected at initialisation scores at the cost of ``global-m``)."""
        return self.shortcut and not torch.is_grad_enabled() and not bool(self.W.any())

    def forward(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[B] ICER of matched pairs."""
        if self.vanishes():
            return image.embed.new_zeros(len(text), dtype=torch.float32)
        q, token_mask = self.queries(text)  # [B, N, D], [B, N]
        v, patch_mask = self.keys(image)  # [B, R, D], [B, R]
        return icer(q[:, None], v, token_mask[:, None], patch_mask, self.W, self.tau)[:, 0]  # [B]

    def matrix(self, image: ImageFeatures, text: TextFeatures, pair_chunk: int) -> torch.Tensor:
        """[Ni, Nt] ICER of every image against every caption, at most ``pair_chunk`` pairs a pass.

        A pass is a block of images against a block of captions (``min(Nt, pair_chunk)``
        captions, as many images as fit). Small passes keep the [pairs, N, R] and [pairs, N, D]
        intermediates in the CPU's cache, which runs several times faster than passes of
        thousands of pairs (docs/trials.md), and bound the memory of large galleries at any
        encoder size. W meets each caption's unit queries and each image's keys once, before
        the passes (``mapped`` in :func:`icer`). Every pair's value comes from the same
        operations whatever the pass.
        """
        Ni, Nt = len(image), len(text)
        if self.vanishes() or not Ni or not Nt:
            return image.embed.new_zeros(Ni, Nt, dtype=torch.float32)
        q, token_mask = self.queries(text)  # [Nt, N, D], [Nt, N]
        v, patch_mask = self.keys(image)  # [Ni, R, D], [Ni, R]
        qW = F.normalize(q, dim=-1) @ self.W.T  # [Nt, N, D]
        vW = v @ self.W.T  # [Ni, R, D]
        cap_step = max(1, min(Nt, pair_chunk))
        img_step = max(1, pair_chunk // cap_step)
        rows = []
        for i in range(0, Ni, img_step):
            ii = slice(i, i + img_step)  # images in this pass
            cols = []
            for j in range(0, Nt, cap_step):
                jj = slice(j, j + cap_step)  # captions in this pass, shared by its images
                mapped = (qW[None, jj], vW[ii])
                cols.append(icer(q[None, jj], v[ii], token_mask[None, jj], patch_mask[ii], self.W, self.tau, mapped))  # [g, k]
            rows.append(torch.cat(cols, 1))  # [g, Nt]
        return torch.cat(rows)  # [Ni, Nt]


class FlowClip(Scorer):
    """``s(I, T) = GCC + λ·ICER`` over cached features (see the module docstring)."""

    trainable = True

    def __init__(self, dims: FeatureDims, proj: Projections, config: FlowClipConfig) -> None:
        super().__init__()
        self.config = config
        self.gcc = GlobalCalibration(dims.embed_dim)
        self.icer = EvidenceRefinement(dims, proj, config.tau, config.max_tokens) if config.icer else None
        self.register_buffer("logit_scale", torch.as_tensor(proj.logit_scale).float().clone())

    @property
    def uses_grids(self) -> bool:  # global-m reads the pooled embeddings only
        return self.icer is not None

    @property
    def zero_grad_at_init(self) -> tuple[str, ...]:
        """Parameters whose gradient at initialisation is 0 in exact arithmetic (float32
        rounding noise only): ``∂s/∂M_tok = 0`` while ``W = 0``, as ICER ≡ 0 for every ``M_tok``."""
        return ("icer.M_tok",) if self.icer is not None else ()

    def full_path(self) -> FlowClip:
        """Itself with ICER computed even while ``W = 0`` (for timing; same scores)."""
        if self.icer is not None:
            self.icer.shortcut = False
        return self

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[B] s(I_b, T_b)."""
        s = self.gcc(image.embed, text.embed)  # [B]
        if self.icer is None:
            return s
        return s + self.config.lam * self.icer(image, text)  # [B]

    def score_matrix(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        """[Ni, Nt] every image against every caption (HNB's logits, retrieval)."""
        s = self.gcc.matrix(image.embed, text.embed)  # [Ni, Nt]
        if self.icer is None:
            return s
        return s + self.config.lam * self.icer.matrix(image, text, self.config.pair_chunk)


def parameter_breakdown(dims: FeatureDims, variant: str = "flowclip", **kwargs) -> dict[str, int]:
    """Trainable parameters per component (and ``total``) of ``variant`` at ``dims``."""
    proj = Projections(torch.zeros(dims.d_v, dims.embed_dim), torch.zeros(dims.d_t, dims.embed_dim), torch.tensor(100.0))
    model = SCORERS.get(variant)(dims=dims, proj=proj, **kwargs)
    out = {name: p.numel() for name, p in model.named_parameters()}
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------- factory, variants


def _create(dims: FeatureDims, proj: Projections, icer_branch: bool, **kwargs) -> FlowClip:
    what = "Flow-CLIP options (the ICER branch is the variant: global-m without, flowclip / flowclip-cimr with)"
    return FlowClip(dims, proj, family_options(FlowClipConfig, kwargs, what, fixed={"icer": icer_branch}))


@SCORERS.register("global-m")
def global_m(dims: FeatureDims, proj: Projections, **kwargs) -> FlowClip:
    """Flow-CLIP's global branch: cos(e_I, M e_T), trained with HNB."""
    return _create(dims, proj, icer_branch=False, **kwargs)


@SCORERS.register("flowclip")
def flowclip(dims: FeatureDims, proj: Projections, **kwargs) -> FlowClip:
    """Flow-CLIP: GCC + λ·ICER, trained with HNB."""
    return _create(dims, proj, icer_branch=True, **kwargs)


@SCORERS.register("flowclip-cimr")
def flowclip_cimr(dims: FeatureDims, proj: Projections, **kwargs) -> FlowClip:
    """Flow-CLIP: GCC + λ·ICER, trained with HNB + CIMR."""
    return _create(dims, proj, icer_branch=True, **kwargs)
