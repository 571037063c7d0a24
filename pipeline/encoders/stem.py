"""Convolutional patch stem for the toy CLIP's ViT (Xiao et al. 2021, "Early Convolutions
Help Transformers See Better").

open_clip's ViT embeds each ``p x p`` patch with one linear map (``visual.conv1``, kernel =
stride = p). At 64 px / patch 8 the shapes world's objects (10-25 px) straddle patch borders
at random offsets, and a linear patch embedding does not learn *which shape* is in a scene
(the measurement is in ``docs/trials.md``). The stem replaces ``conv1``
by ``log2(p)`` stride-2 3x3 convolutions (BatchNorm, ReLU) and a 1x1 projection to the
width, so the token grid, the transformer and everything extract reads are unchanged.

Only the toy config uses it; real models (ViT-L-14-336, ...) keep open_clip's linear stem.
"""

from __future__ import annotations

import torch
from torch import nn

# open_clip config name -> output channels of the stride-2 3x3 convolutions (one per halving
# of the patch size: 2 ** len == patch_size)
VISION_STEMS: dict[str, tuple[int, ...]] = {"toy-vit": (32, 64, 128), "toy-vit-small": (16, 32, 64)}


class ConvStem(nn.Module):
    """[B, 3, H, W] -> [B, width, H / 2**k, W / 2**k], k = len(channels)."""

    def __init__(self, channels: tuple[int, ...], width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c_out in channels:
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]  # fmt: skip
            c_in = c_out
        layers.append(nn.Conv2d(c_in, width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def install_stem(model: nn.Module, config_name: str) -> nn.Module:
    """Replace ``model.visual.conv1`` by the config's :class:`ConvStem` (no-op if it has none).

    Raises:
        ValueError: the stem's total stride differs from the config's patch size.
    """
    channels = VISION_STEMS.get(config_name)
    if channels is None:
        return model
    visual = model.visual
    patch = visual.conv1.kernel_size[0]
    if 2 ** len(channels) != patch:
        raise ValueError(
            f"{config_name}: a stem of {len(channels)} stride-2 convolutions has stride "
            f"{2 ** len(channels)}, but the patch size is {patch}"
        )
    visual.conv1 = ConvStem(channels, int(visual.transformer.width))
    return model
