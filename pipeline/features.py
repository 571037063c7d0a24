"""The feature tensors every scorer reads: what one cache row turns into.

These dataclasses are the in-memory side of the cache contract (`pipeline.cache.schema`).
They hold torch tensors for a batch of B rows; dims are named once here:

* R  = number of patches (grid_h * grid_w), CLS excluded
* d_v = vision width, d_t = text width, D = joint (embedding) width
* C  = text context length
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class FeatureDims:
    """Widths and grid of one encoder, as recorded in its store."""

    grid: tuple[int, int]  # (grid_h, grid_w) patch grid
    d_v: int  # vision transformer width
    d_t: int  # text transformer width
    embed_dim: int  # joint embedding width D
    context_length: int  # text context C

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]


@dataclass
class Projections:
    """Frozen projection parameters of the encoder, stored once per store."""

    visual_proj: torch.Tensor  # [d_v, D]: final-layer (post ln_post) tokens -> joint space
    text_projection: torch.Tensor  # [d_t, D]: final (post ln_final) tokens -> joint space
    logit_scale: torch.Tensor  # [] CLIP temperature, already exponentiated (e.g. 100)


@dataclass
class ImageFeatures:
    """A batch of B images from the store (fp16 on disk, float32 here)."""

    early: torch.Tensor  # [B, R, d_v] early-layer grid, raw residual stream (pre-LN), CLS removed
    final: torch.Tensor  # [B, R, d_v] final-layer grid after ln_post, CLS removed
    cls: torch.Tensor  # [B, d_v] final CLS token after ln_post
    embed: torch.Tensor  # [B, D] pooled embedding (= cls @ visual_proj), not normalised

    def __len__(self) -> int:
        return self.embed.shape[0]

    def index(self, idx: torch.Tensor) -> ImageFeatures:
        return ImageFeatures(self.early[idx], self.final[idx], self.cls[idx], self.embed[idx])


@dataclass
class TextFeatures:
    """A batch of B captions from the store."""

    ids: torch.Tensor  # [B, C] int64 BPE ids (sot ... eot, 0-padded)
    mask: torch.Tensor  # [B, C] bool, True from sot through eot inclusive
    tokens: torch.Tensor  # [B, C, d_t] final-layer token states after ln_final
    embed: torch.Tensor  # [B, D] pooled embedding (eot state @ text_projection), not normalised

    def __len__(self) -> int:
        return self.embed.shape[0]

    def index(self, idx: torch.Tensor) -> TextFeatures:
        return TextFeatures(self.ids[idx], self.mask[idx], self.tokens[idx], self.embed[idx])

    @property
    def content_mask(self) -> torch.Tensor:
        """[B, C] bool: real word tokens only (sot and eot excluded)."""
        eot = self.mask.sum(-1, keepdim=True) - 1  # [B, 1] position of eot
        pos = torch.arange(self.mask.shape[1], device=self.mask.device)[None]
        return self.mask & (pos > 0) & (pos < eot)


def to_device(x: Any, device: str | torch.device) -> Any:
    """``x`` with every tensor moved to ``device``: tensors, and the tensors inside
    dataclasses (``ImageFeatures``, a family's training data), dicts, lists and tuples;
    anything else (a manifest, a number) is returned as it is. A no-op on ``x``'s device."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: to_device(getattr(x, f.name), device) for f in dataclasses.fields(x) if f.init})
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        moved = [to_device(v, device) for v in x]
        return type(x)(*moved) if hasattr(x, "_fields") else type(x)(moved)
    return x


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (CPU for a module without any)."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")
