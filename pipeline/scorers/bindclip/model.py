"""BindCLIP: one balanced token-patch-depth coupling read as energies (methods.md §1).

Seed: ``seeds/bindclip.txt``. Pairwise and exactly antisymmetric, ``s(I, A, B) = -s(I, B, A)``:
every term is the same function of A and of B, the marginals are built symmetrically, and
swapping the captions only permutes the plan's rows. For B items (N content tokens a caption,
L = 2 depths (early, final), R patches, width h):

1. Rows ``[A's tokens (N); B's tokens (N); null]``, columns ``[R*L cells (c = l*R + p); null]``;
   ``S = cos(phi_t(H), phi_v(G) + offset_l)``, 0 on the null row and column (§1.1-1.2).
2. Marginals (§1.2): the cross-caption residual ``u`` (soft match against the other caption
   plus a null option) splits ``(1 - nu_t)/2`` per caption ``∝ max(u, floor)``, null row
   ``nu_t``; the cells share ``1 - nu_v`` by accumulated token evidence, null column ``nu_v``.
3. Plan (§1.3): balanced entropic OT on the cost ``-S`` (``pipeline.ot``, eps = 0.1, K = 64);
   the lesion variant (§1.7) uses ``r ⊗ c``.
4. Energies (§1.4): semantic, entity, order (Bhattacharyya overlap of adjacent rows), spatial
   (relation head U on span centroids / spreads, plus an absolute-frame term).
5. Consensus (§1.5): per-depth moves, agreement ``q``, quartic contraction;
   ``s = g + sum_k exp(lambda_k) move_k``, ``g`` the frozen CLIP logit margin.

Choices the spec leaves open, marked *(ours)* in ``BindClipConfig``:

* The depth offset follows phi_v's Linear; its one LayerNorm serves the raw early grid and the
  ln_post'd final grid. Column evidence (``tau``) is a softmax over all R*L cells (the depths
  compete); the cross-caption match uses phi_t cosines (``tau_x``), the null at cosine 0.
* Linear per-depth readouts average to the depth-summed ones (``E_sem^l``, ``g_i^l`` carry a
  factor L); order and spatial normalise ``rho`` per depth. Order pairs weigh ``r_i r_{i+1}``;
  a spread is ``0.5 log(var + var_floor)``; the relative term needs a token before and after;
  ``d'_k`` are 2 more outputs of U. Energies stay mass-weighted means (no gain by length).
* Consensus uses the population std over depths; ``q0`` is chosen on dev after training.
* ``text_center``: subtract each caption's mean token state before phi_t, so that a context
  component shared by every token cannot make all rows, residuals and moves alike.
* ``span_gate``: a learned weight ``floor + (1 - floor) sigmoid(a . phi_t(H_k) + b)``
  (zero-initialised, h + 1 parameters) on each token's mass in the spatial span means, so
  words that name no object ("the", "of") stop pulling the argument centroids; the floor
  (``span_gate_floor``) keeps every span weighted.
* ``grad_iters = k``: the first K - k Sinkhorn iterations run without autograd and warm-start
  the last k (same plan, gradients through k only), for training speed.

Variants ``bindclip``, ``bindclip-lesion`` and ``bindclip-noconsensus`` share one checkpoint;
:func:`parameter_breakdown` counts parameters per component. Trial history: ``docs/trials.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import family_options
from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.ot import sinkhorn_log_kernel
from pipeline.scorers.base import SCORERS, Scorer

ENERGIES = ("semantic", "entity", "order", "spatial")
_TINY = 1e-12


@dataclass
class BindClipConfig:
    h: int = 192  # projected width of phi_t / phi_v (paper: 192)
    epsilon: float = 0.1  # Sinkhorn temperature eps (paper: 0.1)
    n_iters: int = 64  # Sinkhorn iterations K (paper: 64)
    nu_t: float = 0.25  # null-token row mass (paper: 0.25)
    nu_v: float = 0.50  # null-patch column mass (paper: 0.50; params.yaml sets the dev choice)
    floor: float = 0.1  # residual floor of the row mass, keeps shared anchors (ours)
    tau_x: float = 0.1  # temperature of the cross-caption soft match (ours)
    tau: float = 0.1  # temperature of the column-evidence softmax over cells (ours; params.yaml sets the dev choice)
    q0: float = 0.5  # consensus contraction midpoint q_0 (ours; tune on dev only)
    uncertainty_floor: float = 0.05  # floor in q_k = |mean| / (std + floor) (paper: 0.05)
    consensus: bool = True  # consensus co-transport (§1.5); False for the ablation
    plan: str = "sinkhorn"  # "sinkhorn" | "outer" (lesion: P = r ⊗ c, §1.7)
    max_tokens: int = 32  # caption truncation in content tokens (paper: 32)
    scale_init: float | list[float] = 10.0  # initial exp(lambda_k): one for every energy, or 4 in ENERGIES order (world.md pitfall)
    var_floor: float = 1e-4  # added to a token's spatial variance before the log (ours)
    sinkhorn_tol: float = 1e-3  # max abs marginal error (total mass 1) before the solver warns
    absorb_every: int | None = 16  # Sinkhorn absorption block (None = pure log domain)
    text_center: bool = False  # subtract each caption's mean token state before phi_t (ours)
    span_gate: bool = False  # a learned per-token gate weights the span means (ours)
    span_gate_floor: float = 0.1  # the gate is floor + (1 - floor) sigmoid(a . phi_t(H_k) + b) (ours)
    grad_iters: int | None = None  # backprop through only the last k Sinkhorn iterations
    #   (the first K - k run without autograd and warm-start the rest; same plan). None = all K

    def __post_init__(self) -> None:
        if self.plan not in ("sinkhorn", "outer"):
            raise ValueError(f"plan must be 'sinkhorn' or 'outer', got {self.plan!r}")
        init = list(self.scale_init) if isinstance(self.scale_init, (list, tuple)) else [self.scale_init]
        if len(init) not in (1, len(ENERGIES)) or min(init) <= 0:
            raise ValueError(f"scale_init must be one positive value or one per energy {ENERGIES}, got {self.scale_init!r}")
        if not 0.0 < self.span_gate_floor <= 1.0:
            raise ValueError(f"span_gate_floor must be in (0, 1], got {self.span_gate_floor!r}")
        for name in ("h", "epsilon", "n_iters", "tau_x", "tau", "q0", "uncertainty_floor", "max_tokens", "sinkhorn_tol"):
            if not getattr(self, name) > 0:  # a temperature, width or count of 0 gives NaN or nothing
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("nu_t", "nu_v"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} (the null row's / column's share of the mass) must be in [0, 1), got {getattr(self, name)!r}")
        for name in ("floor", "var_floor"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.absorb_every is not None and self.absorb_every < 1:
            raise ValueError(f"absorb_every must be >= 1 or null (pure log domain), got {self.absorb_every!r}")
        if self.grad_iters is not None and not 1 <= self.grad_iters <= self.n_iters:
            raise ValueError(f"grad_iters must be in [1, n_iters = {self.n_iters}] or null (every iteration), got {self.grad_iters!r}")


@dataclass
class BindClipExplanation:
    """Everything one forward pass computed, for pictures and analysis (batch of B)."""

    score: torch.Tensor  # [B] s(I, A, B)
    margin: torch.Tensor  # [B] frozen CLIP logit margin g
    moves: torch.Tensor  # [B, 4] move per energy (after consensus if on), ENERGIES order
    scales: torch.Tensor  # [4] exp(lambda_k)
    plan: torch.Tensor  # [B, 2N+1, L*R+1] rows [A; B; null], cols [cells (l*R+p); null]
    r: torch.Tensor  # [B, 2N+1] row marginal
    c: torch.Tensor  # [B, L*R+1] column marginal
    S: torch.Tensor  # [B, 2N, L, R] token-cell compatibility
    u: torch.Tensor  # [B, 2, N] cross-caption residual (caption axis: A, B)
    token_mask: torch.Tensor  # [B, 2, N] valid content tokens
    ids: torch.Tensor  # [B, 2, N] BPE ids of the rows (0 on padding)
    energies: torch.Tensor  # [B, 2, 4] depth-summed readouts E_k(A), E_k(B)
    energies_depth: torch.Tensor  # [B, 2, L, 4] per-depth readouts E_k^l(X)
    agreement: torch.Tensor  # [B, 4] q_k (computed even when consensus is off)
    contraction: torch.Tensor  # [B, 4] applied gamma_k (ones when consensus is off)
    marginal_err: torch.Tensor  # [B] Sinkhorn max marginal violation (0 for the lesion)
    relation: torch.Tensor | None = None  # [B, 2, N, 5] relation head output d (as read out)
    span_gate: torch.Tensor | None = None  # [B, 2, N] each token's weight in the span means (span_gate on)
    grid: tuple[int, int] = (0, 0)  # (grid_h, grid_w) of the patch axis R


# ---------------------------------------------------------------------------- building blocks


def content_tokens(
    text_a: TextFeatures, text_b: TextFeatures, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Content rows of both captions (SOT/EOT/padding excluded), truncated to max_tokens.

    N is the longest content length of either caption in the batch (<= max_tokens), so the
    layout is symmetric in (A, B). Returns tokens [B, 2, N, d_t], mask [B, 2, N], ids [B, 2, N].
    """
    lens = torch.cat([text_a.content_mask.sum(-1), text_b.content_mask.sum(-1)])
    n = max(1, min(max_tokens, int(lens.max())))
    sl = slice(1, 1 + n)  # content starts right after sot
    return (
        torch.stack([text_a.tokens[:, sl], text_b.tokens[:, sl]], 1),
        torch.stack([text_a.content_mask[:, sl], text_b.content_mask[:, sl]], 1),
        torch.stack([text_a.ids[:, sl], text_b.ids[:, sl]], 1),
    )


def cross_caption_residual(
    t_x: torch.Tensor, t_y: torch.Tensor, m_x: torch.Tensor, m_y: torch.Tensor, tau_x: float
) -> torch.Tensor:
    """[B, N] residual u_i = clip(1 - E_w[cos], 0, 1) of tokens of X against Y plus a null.

    ``t_x``, ``t_y``: [B, N, h] unit-norm token embeddings; the null option has cosine 0.
    """
    cos = torch.einsum("bnh,bmh->bnm", t_x, t_y)  # [B, N, M]
    null = torch.zeros_like(cos[..., :1])  # [B, N, 1]
    cos = torch.cat([cos, null], -1)  # [B, N, M+1]
    valid = torch.cat([m_y, torch.ones_like(m_y[:, :1])], -1)[:, None, :]  # [B, 1, M+1]
    w = torch.softmax((cos / tau_x).masked_fill(~valid, -math.inf), -1)
    return (1.0 - (w * cos).sum(-1)).clamp(0.0, 1.0) * m_x


def row_marginal(u: torch.Tensor, mask: torch.Tensor, nu_t: float, floor: float) -> torch.Tensor:
    """[B, 2, N] token masses: (1 - nu_t)/2 per caption, split ∝ max(u, floor)."""
    w = u.clamp_min(floor) * mask
    return 0.5 * (1.0 - nu_t) * w / w.sum(-1, keepdim=True).clamp_min(_TINY)


def column_marginal(S: torch.Tensor, r: torch.Tensor, nu_v: float, tau: float) -> torch.Tensor:
    """[B, L*R] cell masses (1 - nu_v) ∝ Σ_i r_i softmax_c(S_ic / tau). S: [B, 2N, L*R]."""
    evidence = torch.einsum("bn,bnc->bc", r, torch.softmax(S / tau, -1))  # [B, L*R]
    return (1.0 - nu_v) * evidence / evidence.sum(-1, keepdim=True).clamp_min(_TINY)


def _span_mean(z: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Weighted means over tokens before k, after k, and all but k. z: [..., N, F], w: [..., N]."""
    wz = w[..., None] * z
    cz, cw = wz.cumsum(-2), w.cumsum(-1)
    tz, tw = cz[..., -1:, :], cw[..., -1:]
    before = (cz - wz) / (cw - w).clamp_min(_TINY)[..., None]
    after = (tz - cz) / (tw - cw).clamp_min(_TINY)[..., None]
    others = (tz - wz) / (tw - w).clamp_min(_TINY)[..., None]
    return before, after, others


def readouts(
    Q: torch.Tensor,
    r: torch.Tensor,
    mask: torch.Tensor,
    d: torch.Tensor,
    coords: torch.Tensor,
    var_floor: float,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Order and spatial energies from token-patch mass Q: [B, 2, N, V, R] (V views).

    ``d``: [B, 2, N, 5] relation head output (3 relative + 2 absolute); ``coords``: [R, 2].
    With ``gate`` ([B, 2, N] in (0, 1)) a token counts in the span means (before, after,
    all others) with its grounded mass times its gate (``span_gate``).
    Returns E_ord, E_sp: [B, 2, V].
    """
    w = Q.sum(-1)  # [B, 2, N, V] grounded mass of each token in the view
    rho = Q / w.clamp_min(_TINY)[..., None]  # [B, 2, N, V, R]
    valid = mask[..., None].to(Q.dtype)  # [B, 2, N, 1]

    # order: mass-weighted Bhattacharyya overlap of adjacent tokens
    bc = torch.sqrt((rho[:, :, 1:] * rho[:, :, :-1]).clamp_min(1e-30)).sum(-1)  # [B,2,N-1,V]
    pw = (r[:, :, 1:] * r[:, :, :-1])[..., None]  # [B, 2, N-1, 1]
    e_ord = (pw * bc).sum(2) / pw.sum(2).clamp_min(_TINY)  # [B, 2, V]

    # spatial: centroid, log-spread, span contrasts read by the relation head
    mu = torch.einsum("bxnvr,rk->bxnvk", rho, coords)  # [B, 2, N, V, 2]
    sq = torch.einsum("bxnvr,r->bxnv", rho, (coords**2).sum(-1))  # [B, 2, N, V]
    var = (sq - (mu**2).sum(-1)).clamp_min(0.0)
    z = torch.cat([mu, 0.5 * torch.log(var + var_floor)[..., None]], -1)  # [B, 2, N, V, 3]
    ws = w if gate is None else w * gate[..., None]  # [B, 2, N, V] span weights
    zt, wt = z.movedim(3, 2), ws.movedim(3, 2)  # [B, 2, V, N, 3], [B, 2, V, N]
    before, after, others = _span_mean(zt, wt)
    cnt = mask.to(Q.dtype).cumsum(-1)  # [B, 2, N]
    both = ((cnt - mask.to(Q.dtype)) > 0) & ((cnt[..., -1:] - cnt) > 0)  # before and after
    has_other = (cnt[..., -1:] - mask.to(Q.dtype)) > 0
    rel = torch.einsum("bxvnk,bxnk->bxnv", after - before, d[..., :3]) * both[..., None]
    absolute = torch.einsum("bxvnk,bxnk->bxnv", others[..., :2] - 0.5, d[..., 3:])
    absolute = absolute * has_other[..., None]
    rw = r[..., None] * valid  # [B, 2, N, 1]
    e_sp = (rw * (rel + absolute)).sum(2) / rw.sum(2).clamp_min(_TINY)  # [B, 2, V]
    return e_ord, e_sp


def consensus(delta: torch.Tensor, floor: float, q0: float) -> tuple[torch.Tensor, ...]:
    """Refined moves from per-depth moves delta: [B, L, K] -> (move, q, gamma) each [B, K]."""
    mean = delta.mean(1)
    std = torch.sqrt(delta.var(1, unbiased=False) + 1e-12)
    q = mean.abs() / (std + floor)
    gamma = q**4 / (q**4 + q0**4)
    return gamma * mean, q, gamma


def patch_coords(grid: tuple[int, int]) -> torch.Tensor:
    """[R, 2] patch-centre (x, y) in [0, 1], row-major over the grid (y down)."""
    gh, gw = grid
    y, x = torch.meshgrid(
        (torch.arange(gh) + 0.5) / gh, (torch.arange(gw) + 0.5) / gw, indexing="ij"
    )
    return torch.stack([x.flatten(), y.flatten()], -1)


# ---------------------------------------------------------------------------- the module


class BindClip(Scorer):
    """BindCLIP pairwise scorer over cached features (see module docstring)."""

    pairwise = True
    trainable = True
    checkpoint_variant = "bindclip"  # every variant (lesion, noconsensus) loads bindclip's weights

    def __init__(self, dims: FeatureDims, proj: Projections, config: BindClipConfig) -> None:
        super().__init__()
        self.config, self.grid, h = config, tuple(dims.grid), config.h
        self.phi_t = nn.Sequential(nn.LayerNorm(dims.d_t), nn.Linear(dims.d_t, h))
        self.phi_v = nn.Sequential(nn.LayerNorm(dims.d_v), nn.Linear(dims.d_v, h))
        self.depth_offset = nn.Parameter(torch.zeros(2, h))  # [L, h] (early, final)
        self.relation = nn.Linear(h, 5)  # U: 3 relative (dx, dy, dspread) + 2 absolute
        init = torch.as_tensor(config.scale_init, dtype=torch.float32).expand(len(ENERGIES)).clone()
        self.scale_logits = nn.Parameter(init.log())
        if config.span_gate:  # zero init: every gate 1/2, the plain grounded-mass spans
            self.span_gate = nn.Linear(h, 1)
            nn.init.zeros_(self.span_gate.weight)
            nn.init.zeros_(self.span_gate.bias)
        self.register_buffer("logit_scale", torch.as_tensor(proj.logit_scale).float().clone())
        self.register_buffer("coords", patch_coords(dims.grid))  # [R, 2]

    def explain(
        self, image: ImageFeatures, text_a: TextFeatures, text_b: TextFeatures
    ) -> BindClipExplanation:
        """Score plus the plan, marginals and energy breakdown for every item."""
        cfg = self.config
        H, mask, ids = content_tokens(text_a, text_b, cfg.max_tokens)  # [B, 2, N, d_t], [B, 2, N]
        B, n, R, L = H.shape[0], H.shape[2], self.coords.shape[0], 2
        ma, mb = mask[:, 0], mask[:, 1]

        # 1. compatibility
        H = H.float()
        if cfg.text_center:  # remove the caption's shared context, keep what each token adds
            w = mask[..., None].float()  # [B, 2, N, 1]
            H = H - (w * H).sum(2, keepdim=True) / w.sum(2, keepdim=True).clamp_min(1.0)
        pt = self.phi_t(H)  # [B, 2, N, h]
        t = F.normalize(pt, dim=-1)
        G = torch.stack([image.early, image.final], 1).float()  # [B, L, R, d_v]
        v = F.normalize(self.phi_v(G) + self.depth_offset[:, None], dim=-1)  # [B, L, R, h]
        S = torch.einsum("bxnh,blrh->bxnlr", t, v).reshape(B, 2 * n, L, R)  # [B, 2N, L, R]

        # 2. marginals
        u_a = cross_caption_residual(t[:, 0], t[:, 1], ma, mb, cfg.tau_x)  # [B, N]
        u_b = cross_caption_residual(t[:, 1], t[:, 0], mb, ma, cfg.tau_x)  # same function
        u = torch.stack([u_a, u_b], 1)  # [B, 2, N]
        r_tok = row_marginal(u, mask, cfg.nu_t, cfg.floor)  # [B, 2, N]
        S_rows = S.reshape(B, 2 * n, L * R)  # [B, 2N, L*R]
        c_cell = column_marginal(S_rows, r_tok.reshape(B, 2 * n), cfg.nu_v, cfg.tau)
        r = torch.cat([r_tok.reshape(B, 2 * n), r_tok.new_full((B, 1), cfg.nu_t)], -1)
        c = torch.cat([c_cell, c_cell.new_full((B, 1), cfg.nu_v)], -1)  # [B, L*R+1]

        # 3. plan
        if cfg.plan == "outer":
            P = r[:, :, None] * c[:, None, :]  # [B, 2N+1, L*R+1]
            err = torch.zeros(B, device=P.device)
        else:
            S_full = F.pad(S_rows, (0, 1, 0, 1))  # [B, 2N+1, L*R+1], null compatibility 0
            rows = torch.cat([mask.reshape(B, 2 * n), mask.new_ones(B, 1)], -1)
            P, err = self._plan(S_full / cfg.epsilon, r, c, rows)  # log-kernel of the cost -S

        # 4. energies, per depth (views = L) and depth-summed (views = 1)
        Q = P[:, : 2 * n, : L * R].reshape(B, 2, n, L, R)  # [B, 2, N, L, R]
        Sx = S.reshape(B, 2, n, L, R)
        rsum = r_tok.sum(-1, keepdim=True).clamp_min(_TINY)  # [B, 2, 1]
        e_sem = L * (Q * Sx).sum((2, 4)) / rsum  # [B, 2, L]
        g_frac = L * Q.sum(-1) / r_tok.clamp_min(_TINY)[..., None]  # [B, 2, N, L]
        e_ent = (u[..., None] * g_frac).sum(2) / u.sum(-1, keepdim=True).clamp_min(1e-6)
        d = self.relation(pt)  # [B, 2, N, 5]
        gate = None
        floor = cfg.span_gate_floor  # gates in [floor, 1]: a span never loses all its weight, which keeps training stable
        if cfg.span_gate:
            gate = floor + (1.0 - floor) * torch.sigmoid(self.span_gate(pt))[..., 0]  # [B, 2, N]
        e_ord, e_sp = readouts(Q, r_tok, mask, d, self.coords, cfg.var_floor, gate)  # [B, 2, L]
        per_depth = torch.stack([e_sem, e_ent, e_ord, e_sp], -1)  # [B, 2, L, 4]
        Q1 = Q.sum(3, keepdim=True)  # [B, 2, N, 1, R] depths summed
        e_ord1, e_sp1 = readouts(Q1, r_tok, mask, d, self.coords, cfg.var_floor, gate)  # [B, 2, 1]
        summed = torch.stack([e_sem.mean(-1), e_ent.mean(-1), e_ord1[..., 0], e_sp1[..., 0]], -1)

        # 5. consensus and score
        delta = per_depth[:, 0] - per_depth[:, 1]  # [B, L, 4] per-depth moves
        moves, q, gamma = consensus(delta, cfg.uncertainty_floor, cfg.q0)  # [B, 4] each
        if not cfg.consensus:
            moves = summed[:, 0] - summed[:, 1]  # [B, 4] depth-summed moves, uncontracted
            gamma = torch.ones_like(moves)
        ea = F.normalize(image.embed.float(), dim=-1)
        margin = self.logit_scale * (
            (ea * F.normalize(text_a.embed.float(), dim=-1)).sum(-1)
            - (ea * F.normalize(text_b.embed.float(), dim=-1)).sum(-1)
        )  # [B]
        scales = self.scale_logits.exp()
        score = margin + (moves * scales).sum(-1)
        return BindClipExplanation(
            score=score,
            margin=margin,
            moves=moves,
            scales=scales,
            plan=P,
            r=r,
            c=c,
            S=S,
            u=u,
            token_mask=mask,
            ids=ids,
            energies=summed,
            energies_depth=per_depth,
            agreement=q,
            contraction=gamma,
            marginal_err=err,
            relation=d,
            span_gate=gate,
            grid=self.grid,
        )

    def _plan(
        self, log_K: torch.Tensor, r: torch.Tensor, c: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Balanced plan [B, n, m] and its marginal error [B] (Sinkhorn, K iterations).

        With ``grad_iters = k`` and autograd on, the first K - k iterations run without
        autograd and their potentials (f, g) are absorbed into the kernel,
        ``log_K + f ⊕ g``, on which the last k iterations run differentiably: the same K
        iterations (diagonal scalings of the kernel leave the Sinkhorn map unchanged), with
        gradients truncated to the last k (ours; a training-speed option).
        """
        cfg = self.config
        k, n_iters = cfg.grad_iters, cfg.n_iters
        opts = dict(mask_rows=rows, tol=cfg.sinkhorn_tol, absorb_every=cfg.absorb_every)
        if k is not None and 0 < k < n_iters and torch.is_grad_enabled():
            with torch.no_grad():
                _, warm = sinkhorn_log_kernel(log_K, r, c, n_iters - k, warn=False, **opts)
            log_K = log_K + (warm.f[..., :, None] + warm.g[..., None, :])  # padded rows: masked
            n_iters = k
        P, log = sinkhorn_log_kernel(log_K, r, c, n_iters, **opts)
        return P, log.err

    def score_pair(
        self, image: ImageFeatures, text_a: TextFeatures, text_b: TextFeatures
    ) -> torch.Tensor:
        """[B] s(I, A, B) = g + Σ_k exp(lambda_k) move_k; antisymmetric in (A, B)."""
        return self.explain(image, text_a, text_b).score


def parameter_breakdown(dims: FeatureDims, **kwargs) -> dict[str, int]:
    """Trainable parameters per component (and ``total``) for an encoder with ``dims``."""
    proj = Projections(torch.empty(0), torch.empty(0), torch.tensor(100.0))
    model = _create(dims, proj, **kwargs)
    out = {
        "phi_t.layernorm": model.phi_t[0],
        "phi_t.linear": model.phi_t[1],
        "phi_v.layernorm": model.phi_v[0],
        "phi_v.linear": model.phi_v[1],
        "relation_head_U": model.relation,
    }
    if model.config.span_gate:
        out["span_gate"] = model.span_gate
    out = {k: sum(p.numel() for p in m.parameters()) for k, m in out.items()}
    out["phi_v.depth_offset"] = model.depth_offset.numel()
    out["scale_logits"] = model.scale_logits.numel()
    out["total"] = sum(p.numel() for p in model.parameters())
    return out


# ---------------------------------------------------------------------------- factory, variants


def _create(dims: FeatureDims, proj: Projections, **kwargs) -> BindClip:
    return BindClip(dims, proj, family_options(BindClipConfig, kwargs, "BindClip options"))


@SCORERS.register("bindclip")
def bindclip(dims: FeatureDims, proj: Projections, **kwargs) -> BindClip:
    """BindCLIP: one balanced token-patch-depth OT coupling read as binding energies (pairwise)."""
    return _create(dims, proj, **kwargs)


@SCORERS.register("bindclip-lesion")
def bindclip_lesion(dims: FeatureDims, proj: Projections, **kwargs) -> BindClip:
    """BindCLIP's lesion: the plan replaced by the product of its marginals (bindclip's weights)."""
    return _create(dims, proj, **{"plan": "outer", **kwargs})


@SCORERS.register("bindclip-noconsensus")
def bindclip_noconsensus(dims: FeatureDims, proj: Projections, **kwargs) -> BindClip:
    """BindCLIP without the cross-depth consensus contraction (bindclip's weights)."""
    return _create(dims, proj, **{"consensus": False, **kwargs})


for _factory in (bindclip, bindclip_lesion, bindclip_noconsensus):
    _factory.checkpoint_variant = "bindclip"  # trained once, as `bindclip` (same locked parameters)
