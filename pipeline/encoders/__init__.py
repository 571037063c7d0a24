"""Frozen open_clip encoders: loading (real weights, random init, or the toy CLIP) and the
one-pass capture of grids, token states and pooled embeddings.

Architectures are data (open_clip JSON configs), weights are a separate axis (``pretrained``):

* real models (``ViT-L-14-336``, ``ViT-L-14``, ``ViT-B-16``, ``ViT-B-32``): OpenAI weights need
  QuickGELU, so every real key resolves to open_clip's ``<name>-quickgelu`` config; after
  building, the activation is checked and a mismatch is refused (open_clip itself only warns).
  ``pretrained`` is ``openai`` (open_clip downloads/looks up the HF cache), a file path to a
  state dict, or ``none`` (random init: how the real architecture is tested offline).
* ``toy``: the shapes-world CLIP, config ``configs/toy-vit.json`` shipped here, weights from the
  ``toyclip`` stage's safetensors checkpoint; ``toy-small`` (``configs/toy-vit-small.json``:
  width 64, 3 + 2 layers, joint space 64) is the second encoder of ``pipeline
  compare-encoders``, trained the same way.

Layer convention (stored in every cache): ``early_layer = l`` is the output of the l-th
transformer block, 1-based, i.e. HF ``hidden_states[l]`` and open_clip block index ``l - 1``;
it is the raw residual stream (no LayerNorm). The final grid is the last block's output after
``ln_post`` (open_clip's ``output_tokens`` convention), so ``final @ visual.proj`` is CLIP's
joint space and ``final[:, 0] @ visual.proj`` equals ``encode_image``. Text token states are the
last block's output after ``ln_final``; ``tokens[eot] @ text_projection`` equals ``encode_text``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipeline.features import FeatureDims
from pipeline.manifests import file_sha256
from pipeline.registry import Registry

CONFIG_DIR = Path(__file__).parent / "configs"
LAYER_CONVENTION = (
    "early_layer l = output of the l-th transformer block (1-based; HF hidden_states[l]; "
    "open_clip block index l-1), raw residual stream before any LayerNorm. final = last block "
    "after ln_post (CLS at token 0). text tokens = last block after ln_final."
)


@dataclass(frozen=True)
class EncoderSpec:
    """A registered encoder: which open_clip config, which early layer, which weights."""

    name: str  # registry key (what `pipeline extract --model` takes)
    open_clip_model: str  # open_clip config name actually built
    early_layer: int  # 1-based block whose output is the early grid
    default_pretrained: str  # weights used when the caller says nothing
    weights_hint: str = ""  # what to download and where, for error messages
    toy: bool = False  # weights come from the toyclip stage checkpoint


ENCODERS: Registry[EncoderSpec] = Registry("encoder")


def _register_real(name: str, early_layer: int, hf_repo: str) -> None:
    ENCODERS.register(
        name,
        EncoderSpec(
            name=name,
            open_clip_model=f"{name}-quickgelu",
            early_layer=early_layer,
            default_pretrained="openai",
            weights_hint=(
                f"open_clip fetches the OpenAI weights from the Hugging Face Hub repo {hf_repo} "
                f"(file open_clip_pytorch_model.bin). Offline: download that file and pass "
                f"--pretrained /path/to/open_clip_pytorch_model.bin, or pre-populate HF_HUB_CACHE "
                f"and set HF_HUB_OFFLINE=1."
            ),
        ),
    )


_register_real("ViT-L-14-336", 5, "timm/vit_large_patch14_clip_336.openai")
_register_real("ViT-L-14", 5, "timm/vit_large_patch14_clip_224.openai")
_register_real("ViT-B-16", 3, "timm/vit_base_patch16_clip_224.openai")
_register_real("ViT-B-32", 3, "timm/vit_base_patch32_clip_224.openai")
def _register_toy(name: str, config: str, early_layer: int, weights_hint: str) -> None:
    ENCODERS.register(
        name,
        EncoderSpec(name, config, early_layer, default_pretrained="toyclip", weights_hint=weights_hint, toy=True),
    )


_register_toy("toy", "toy-vit", 2, "run `pipeline toyclip` (or `dvc repro toyclip`) to train the toy CLIP")
_register_toy("toy-small", "toy-vit-small", 1, "run `pipeline compare-encoders` (it trains the small toy CLIP first)")


class WeightsUnavailableError(RuntimeError):
    """Weights could not be loaded; the message says what to download and where."""


def register_toy_configs() -> None:
    """Make the shipped configs (``configs/*.json``) known to open_clip (idempotent)."""
    import open_clip

    if not {"toy-vit", "toy-vit-small"} <= set(open_clip.list_models()):
        open_clip.add_model_config(CONFIG_DIR)


def create_model(config_name: str, pretrained: str | None = None) -> Any:
    """``open_clip.create_model`` plus the toy config's convolutional stem (``stem.py``).

    Every place that builds a model from a config name goes through here, so training,
    extract and the benches build the same architecture.
    """
    import open_clip

    from pipeline.encoders.stem import install_stem

    register_toy_configs()
    return install_stem(open_clip.create_model(config_name, pretrained=pretrained), config_name)


@dataclass
class Encoder:
    """A loaded, frozen encoder and everything extract needs to use it."""

    spec: EncoderSpec
    model: Any  # open_clip.CLIP in eval mode
    preprocess: Any  # PIL image -> [3, H, W] tensor (open_clip's eval transform)
    tokenizer: Any  # list[str] -> [N, C] int64 ids
    pretrained: str  # resolved weights identity ("openai", "random", "sha256:...")
    dims: FeatureDims
    preprocess_cfg: dict = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return len(self.model.visual.transformer.resblocks)

    def fingerprint(self) -> dict[str, Any]:
        """What makes features from this encoder comparable (stored in the cache)."""
        import open_clip

        return encoder_fingerprint(
            self.spec, self.pretrained, self.preprocess_cfg, self.dims, self.n_layers,
            open_clip.__version__,
        )

    @torch.inference_mode()
    def encode_images(self, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
        """One forward pass over a batch of preprocessed images.

        Args:
            pixels: [B, 3, H, W] preprocessed images.

        Returns:
            ``early`` [B, 1+R, d_v] (raw block output), ``final`` [B, 1+R, d_v] (after
            ln_post), ``embed`` [B, D] (pooled, not normalised); CLS at token 0.
        """
        out = self.model.forward_intermediates(
            image=pixels,
            image_indices=[self.spec.early_layer - 1, self.n_layers - 1],
            normalize=False,
            image_output_fmt="NLC",
            image_output_extra_tokens=True,
        )
        grids = [
            torch.cat([cls, patches], dim=1)  # [B, 1+R, d_v]
            for cls, patches in zip(
                out["image_intermediates_prefix"], out["image_intermediates"], strict=True
            )
        ]
        return {
            "early": grids[0],
            "final": self.model.visual.ln_post(grids[1]),
            "embed": out["image_features"],
        }

    @torch.inference_mode()
    def encode_texts(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """One forward pass over a batch of token ids.

        Args:
            ids: [B, C] BPE ids from ``tokenizer``.

        Returns:
            ``tokens`` [B, C, d_t] (after ln_final), ``mask`` [B, C] (sot..eot inclusive),
            ``embed`` [B, D] (pooled, not normalised).
        """
        out = self.model.forward_intermediates(text=ids, text_indices=[-1], normalize=False)
        tokens = self.model.ln_final(out["text_intermediates"][-1])  # [B, C, d_t]
        pos = torch.arange(ids.shape[1], device=ids.device)[None]
        mask = pos <= ids.argmax(-1)[:, None]  # eot has the largest id
        return {"tokens": tokens, "mask": mask, "embed": out["text_features"]}


def encoder_fingerprint(
    spec: EncoderSpec,
    pretrained: str,
    preprocess_cfg: dict,
    dims: FeatureDims,
    n_layers: int,
    open_clip_version: str,
) -> dict[str, Any]:
    """The fingerprint dict of an encoder (identity of model, weights, preprocessing, layers)."""
    return {
        "encoder": spec.name,
        "open_clip_model": spec.open_clip_model,
        "pretrained": pretrained,
        "open_clip_version": open_clip_version,
        "preprocess": {k: list(v) if isinstance(v, tuple) else v for k, v in preprocess_cfg.items()},
        "early_layer": spec.early_layer,
        "final_layer": n_layers,
        "layer_convention": LAYER_CONVENTION,
        "grid": list(dims.grid),
        "d_v": dims.d_v,
        "d_t": dims.d_t,
        "embed_dim": dims.embed_dim,
        "context_length": dims.context_length,
    }


def resolve_pretrained(spec: EncoderSpec, pretrained: str | None, checkpoint: str | None) -> str:
    """The weights identity string for a spec, without loading anything.

    ``openai`` stays ``openai``; ``none`` becomes ``random``; a file path (and the toy
    checkpoint) becomes ``sha256:<hash of the file>`` so retrained weights change it.
    """
    if spec.toy:
        path = Path(checkpoint or "")
        if not path.is_file():
            raise WeightsUnavailableError(
                f"toy CLIP checkpoint not found at {str(path)!r}: {spec.weights_hint}"
            )
        return f"sha256:{file_sha256(path)}"
    tag = pretrained or spec.default_pretrained
    if tag.lower() in ("none", "random"):
        return "random"
    if Path(tag).is_file():
        return f"sha256:{file_sha256(tag)}"
    if tag != "openai":
        raise WeightsUnavailableError(
            f"pretrained {tag!r} for {spec.name} is neither 'openai', 'none' nor an existing "
            f"file. {spec.weights_hint}"
        )
    return "openai"


def load_encoder(
    name: str,
    pretrained: str | None = None,
    checkpoint: str | None = None,
    device: str = "cpu",
) -> Encoder:
    """Build a frozen encoder.

    Args:
        name: encoder key (``ENCODERS.names()``).
        pretrained: real models: ``openai``, a state-dict path or ``none``; ignored for toy.
        checkpoint: toy CLIP safetensors path.
        device: torch device.

    Raises:
        WeightsUnavailableError: weights missing; the message says what to download and where.
    """
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from safetensors.torch import load_file

    spec = ENCODERS.get(name)
    register_toy_configs()
    identity = resolve_pretrained(spec, pretrained, checkpoint)
    if spec.toy:
        model = create_model(spec.open_clip_model)
        model.load_state_dict(load_file(checkpoint))
    elif identity == "random":
        model = create_model(spec.open_clip_model)
    else:
        tag = pretrained or spec.default_pretrained
        try:
            model = create_model(spec.open_clip_model, pretrained=tag)
        except Exception as e:  # open_clip raises RuntimeError/FileNotFoundError/HF errors
            raise WeightsUnavailableError(
                f"could not load weights {tag!r} for {spec.name}: {e}\n{spec.weights_hint}"
            ) from e
    _check_activation(spec, model, identity)
    model = model.to(device).eval().requires_grad_(False)
    preprocess = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    grid = tuple(model.visual.grid_size)
    dims = FeatureDims(
        grid=(int(grid[0]), int(grid[1])),
        d_v=int(model.visual.transformer.width),
        d_t=int(model.transformer.width),
        embed_dim=int(model.text_projection.shape[1]),
        context_length=int(model.context_length),
    )
    return Encoder(
        spec=spec,
        model=model,
        preprocess=preprocess,
        tokenizer=open_clip.get_tokenizer(spec.open_clip_model),
        pretrained=identity,
        dims=dims,
        preprocess_cfg=dict(model.visual.preprocess_cfg),
    )


def _check_activation(spec: EncoderSpec, model: Any, identity: str) -> None:
    """Refuse a GELU model carrying OpenAI (QuickGELU) weights."""
    from open_clip.transformer import QuickGELU

    act = model.visual.transformer.resblocks[0].mlp.gelu
    if identity != "random" and not spec.toy and not isinstance(act, QuickGELU):
        raise ValueError(
            f"{spec.name}: OpenAI weights need QuickGELU but config {spec.open_clip_model!r} "
            f"built {type(act).__name__}; use the '-quickgelu' config"
        )

