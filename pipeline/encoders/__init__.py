"""Frozen open_clip encoders: loading (real weights, random init, or the toy CLIP) and the
one-pass capture of grids, token states and pooled embeddings.

Architectures are data (open_clip JSON configs), weights are a separate axis (``pretrained``):

* real models (``ViT-L-14-336``, ``ViT-L-14``, ``ViT-B-16``, ``ViT-B-32``, each also as
  ``<name>-quickgelu``): the activation follows open_clip's names and pretrained tags. OpenAI
  weights were trained with QuickGELU, so ``pretrained: openai`` builds open_clip's
  ``<name>-quickgelu`` config whichever of the two keys is given (the plain config would load
  them into a GELU model with only a warning). A state-dict file, or ``none``, runs under the
  activation the key names: the plain key builds the GELU config (LAION/DataComp weights),
  ``<name>-quickgelu`` the QuickGELU one. A weights path that names an open_clip pretrained
  entry (its tag, Hugging Face repo or file name) whose activation differs is refused, and so
  is a built model whose activation differs from its config; a file runs under the named
  entry's preprocessing (mean, std, resize), and one of another architecture or image size
  (its position embeddings' shapes) is refused. ``none`` is a random init seeded
  by ``init_seed`` (recorded in the fingerprint with a hash of the open_clip config it builds,
  so an edited shipped config is another store): how the real architecture is tested offline.
* ``toy``: the shapes-world CLIP, config ``configs/toy-vit.json`` shipped here, weights from the
  ``toyclip`` stage's safetensors checkpoint; ``toy-small`` (``configs/toy-vit-small.json``:
  width 64, 3 + 2 layers, joint space 64) is the second encoder of ``pipeline
  compare-encoders``, trained the same way.
* ``tiny-vit``: a tiny open_clip ViT (``configs/tiny-vit.json``: 56 px, 4 × 4 grid, width 64,
  3 + 2 layers, 77-token context), random init only: the backbone of the real path's end-to-end
  test on the official annotation files, where the real weights cannot be had.

Layer convention (stored in every cache): ``early_layer = l`` is the output of the l-th
transformer block, 1-based, i.e. HF ``hidden_states[l]`` and open_clip block index ``l - 1``;
it is the raw residual stream (no LayerNorm). The final grid is the last block's output after
``ln_post`` (open_clip's ``output_tokens`` convention), so ``final @ visual.proj`` is CLIP's
joint space and ``final[:, 0] @ visual.proj`` equals ``encode_image``. Text token states are the
last block's output after ``ln_final``; ``tokens[eot] @ text_projection`` equals ``encode_text``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# the weights checks and identity live in provenance.py; the two public ones are re-exported
# here, where callers import them (patch HASH_CACHE and file_sha256 there, not here)
from pipeline.encoders.provenance import (  # noqa: F401  (config_uses_quick_gelu, weights_provenance re-exported)
    _check_activation,
    _check_weights_file,
    _one_line,
    config_uses_quick_gelu,
    open_clip_version,
    weights_provenance,
    weights_sha256,
)
from pipeline.features import FeatureDims
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
    openai_model: str = ""  # config `pretrained: openai` builds (QuickGELU); "" = open_clip_model


ENCODERS: Registry[EncoderSpec] = Registry("encoder")


def _register_real(name: str, early_layer: int, hf_repo: str) -> None:
    """``name`` (GELU for weights files and random init) and ``name-quickgelu``; both build
    ``name-quickgelu`` for the OpenAI weights."""
    for key in (name, f"{name}-quickgelu"):
        ENCODERS.register(
            key,
            EncoderSpec(
                name=key,
                open_clip_model=key,
                early_layer=early_layer,
                default_pretrained="openai",
                openai_model=f"{name}-quickgelu",
                weights_hint=(
                    f"open_clip fetches the OpenAI weights from the Hugging Face Hub repo {hf_repo} "
                    f"(file open_clip_pytorch_model.bin). Offline: download that file and pass "
                    f"--model {name}-quickgelu --pretrained /path/to/open_clip_pytorch_model.bin "
                    f"(a weights file runs under the activation the key names), or pre-populate "
                    f"HF_HUB_CACHE and set HF_HUB_OFFLINE=1."
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
ENCODERS.register(  # the real path's stand-in backbone: a tiny open_clip ViT, random init only
    "tiny-vit",
    EncoderSpec(
        "tiny-vit",
        "tiny-vit",
        2,
        default_pretrained="none",
        weights_hint="tiny-vit has no trained weights: it is a random init (pretrained: none, init_seed)",
    ),
)


class WeightsUnavailableError(RuntimeError):
    """Weights could not be loaded; the message says what to download and where."""


def register_toy_configs() -> None:
    """Make the shipped configs (``configs/*.json``) known to open_clip (idempotent)."""
    import open_clip

    if not {"toy-vit", "toy-vit-small", "tiny-vit"} <= set(open_clip.list_models()):
        open_clip.add_model_config(CONFIG_DIR)


def create_model(config_name: str, pretrained: str | None = None, force_preprocess_cfg: dict | None = None) -> Any:
    """``open_clip.create_model`` plus the toy config's convolutional stem (``stem.py``).

    Every place that builds a model from a config name goes through here, so training,
    extract and the benches build the same architecture. Without ``pretrained`` open_clip
    warns that the model is initialised randomly; that warning is dropped here, since the
    caller loads its weights next (a toy checkpoint) or chose a seeded random init and says so.
    ``force_preprocess_cfg`` overrides the model's preprocessing (a weights file's entry's).
    """
    import open_clip

    from pipeline.encoders.stem import install_stem

    register_toy_configs()
    quiet = _DropRandomInitWarning()
    logging.getLogger().addFilter(quiet)
    try:
        model = open_clip.create_model(config_name, pretrained=pretrained, force_preprocess_cfg=force_preprocess_cfg)
    finally:
        logging.getLogger().removeFilter(quiet)
    return install_stem(model, config_name)


class _DropRandomInitWarning(logging.Filter):
    """Drops open_clip's "No pretrained weights loaded ... initialized randomly" record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No pretrained weights loaded")


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
    open_clip_model: str = ""  # open_clip config built ("" = spec.open_clip_model)
    init_seed: int = 0  # seed of a random init (fingerprinted when pretrained is "random")

    @property
    def n_layers(self) -> int:
        return len(self.model.visual.transformer.resblocks)

    def fingerprint(self) -> dict[str, Any]:
        """What makes features from this encoder comparable (stored in the cache)."""
        return encoder_fingerprint(
            self.spec,
            self.pretrained,
            self.preprocess_cfg,
            self.dims,
            self.n_layers,
            open_clip_version(),
            open_clip_model=self.open_clip_model or None,
            init_seed=self.init_seed,
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

    def bpe(self, texts: list[str]) -> list[list[int]]:
        """Each text's BPE tokens as ``tokenizer`` encodes them, before it adds sot and eot
        and cuts to the context (extract measures truncation on them and builds the ids
        from them, so each caption is encoded once)."""
        return [self.tokenizer.encode(t) for t in texts]

    def ids_from_bpe(self, bpe: list[list[int]]) -> torch.Tensor:
        """[N, C] the ids ``tokenizer`` gives for the texts whose :meth:`bpe` tokens are
        ``bpe``: sot, the tokens and eot, cut to the context length with eot kept last, zero
        padded (open_clip's ``SimpleTokenizer`` truncation)."""
        tok = self.tokenizer
        if getattr(tok, "reduction_fn", None) is not None:
            raise ValueError(f"{self.spec.name}: its tokenizer reduces long texts instead of cutting them; encode texts with `tokenizer`")
        context = self.dims.context_length
        out = torch.zeros(len(bpe), context, dtype=torch.long)
        for i, tokens in enumerate(bpe):
            row = [tok.sot_token_id, *tokens[: context - 2], tok.eot_token_id]
            out[i, : len(row)] = torch.tensor(row)
        return out

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
    open_clip_model: str | None = None,
    init_seed: int = 0,
) -> dict[str, Any]:
    """The fingerprint dict of an encoder (identity of model, weights, preprocessing, layers).

    ``open_clip_model`` is the config actually built (default ``spec.open_clip_model``); a
    random init (``pretrained == "random"``) also records ``init_seed`` and the config's hash
    (:func:`model_config_sha256`), so two seeds or two versions of a config are two
    fingerprints while every other store's fingerprint keeps its fields.
    """
    fp = {
        "encoder": spec.name,
        "open_clip_model": open_clip_model or spec.open_clip_model,
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
    if pretrained == "random":
        fp["init_seed"] = int(init_seed)
        fp["open_clip_config_sha256"] = model_config_sha256(fp["open_clip_model"])
    return fp


def model_config_sha256(config: str) -> str:
    """The sha256 of open_clip's config ``config`` (JSON, keys sorted). A random init's
    fingerprint records it: the reader can then refuse a store of an edited config (its
    grid, layers or preprocessing) without building the model, as the writer does.

    The config is read from its file, as open_clip reads it (the shipped ``configs/``, then
    open_clip's ``model_configs/``), so that checking a store does not import open_clip; a
    name with no file there is asked of open_clip."""
    import importlib.util

    folders = [CONFIG_DIR, *(Path(p) / "model_configs" for p in importlib.util.find_spec("open_clip").submodule_search_locations)]
    file = next((f / f"{config}.json" for f in folders if (f / f"{config}.json").is_file()), None)
    if file is not None:
        resolved = json.loads(file.read_text(encoding="utf-8"))
    else:
        import open_clip

        register_toy_configs()
        resolved = open_clip.get_model_config(config)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()


def configured_identity(
    spec: EncoderSpec, pretrained: str | None, checkpoint: str | None, init_seed: int = 0
) -> dict[str, Any]:
    """The fingerprint fields a configuration determines without loading anything: encoder,
    open_clip config, weights identity, early layer and (random init only) ``init_seed`` and
    the config's hash.

    The reader's expectation (``pipeline.cache.expected_fingerprint``) takes these fields
    from here; they equal what :meth:`Encoder.fingerprint` records for the encoder
    :func:`load_encoder` builds from the same arguments.
    """
    check_toy_options(spec, pretrained, init_seed, checkpoint)
    identity = resolve_pretrained(spec, pretrained, checkpoint)
    fields: dict[str, Any] = {
        "encoder": spec.name,
        "open_clip_model": open_clip_config(spec, pretrained),
        "pretrained": identity,
        "early_layer": spec.early_layer,
    }
    if identity == "random":
        fields["init_seed"] = int(init_seed)
        fields["open_clip_config_sha256"] = model_config_sha256(fields["open_clip_model"])
    return fields


def check_toy_options(spec: EncoderSpec, pretrained: str | None, init_seed: int, checkpoint: str | None) -> None:
    """Refuse weights options a toy encoder would ignore: it always loads its trained
    checkpoint, so ``pretrained`` other than the default (``openai``, the real models' tag)
    or its own ``toyclip``, or an ``init_seed``, would silently give the trained model."""
    if spec.toy and (pretrained not in (None, "openai", spec.default_pretrained) or int(init_seed) != 0):
        raise ValueError(
            f"model {spec.name} is a toy CLIP: it loads the trained weights at extract.checkpoint ({checkpoint}); "
            f"pretrained ({pretrained!r}) and init_seed ({init_seed}) choose a real model's weights: leave them out, "
            "or name a real model"
        )


def open_clip_config(spec: EncoderSpec, pretrained: str | None) -> str:
    """The open_clip config a key builds with these weights.

    The ``openai`` tag builds ``spec.openai_model`` (the QuickGELU config the OpenAI weights
    were trained with); a weights file and ``none`` build the config the key names.
    """
    tag = pretrained or spec.default_pretrained
    if not spec.toy and tag == "openai" and spec.openai_model:
        return spec.openai_model
    return spec.open_clip_model


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
        return f"sha256:{weights_sha256(path)}"
    tag = pretrained or spec.default_pretrained
    if tag.lower() in ("none", "random"):
        return "random"
    if Path(tag).is_file():
        return f"sha256:{weights_sha256(tag)}"
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
    init_seed: int = 0,
    warn_random: bool = True,
) -> Encoder:
    """Build a frozen encoder.

    Args:
        name: encoder key (``ENCODERS.names()``).
        pretrained: real models: ``openai``, a state-dict path or ``none``; ignored for toy.
        checkpoint: toy CLIP safetensors path.
        device: torch device.
        init_seed: seed of the random init (``pretrained: none``), drawn in a forked RNG so
            the caller's random state is untouched; ignored when weights are loaded.
        warn_random: log a warning that the weights are random; a distributed extract's
            workers pass False, since the client has said it once for the run.

    Raises:
        WeightsUnavailableError: weights missing, or a file that is not ``name``'s weights (a
            TorchScript archive, another architecture's or image size's; see
            :func:`provenance._check_weights_file`); the message says what to use instead.
        ValueError: the weights' activation differs from the config's (see
            :func:`weights_provenance`), or the built model's from its config's.
    """
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from safetensors.torch import load_file

    spec = ENCODERS.get(name)
    register_toy_configs()
    check_toy_options(spec, pretrained, init_seed, checkpoint)
    identity = resolve_pretrained(spec, pretrained, checkpoint)
    config = open_clip_config(spec, pretrained)
    tag = pretrained or spec.default_pretrained
    if spec.toy:
        model = create_model(config)
        try:
            model.load_state_dict(load_file(checkpoint))
        except Exception as e:  # noqa: BLE001 - safetensors' header errors, torch's size mismatches alike
            raise WeightsUnavailableError(
                f"could not load the toy CLIP checkpoint {checkpoint} for {spec.name}: {_one_line(e)}; it is not "
                f"a checkpoint of {spec.name} ({config}): check --model and extract.checkpoint. {spec.weights_hint}"
            ) from None
    elif identity == "random":
        with torch.random.fork_rng(devices=[]):  # built on the CPU; the caller's RNG untouched
            torch.manual_seed(init_seed)
            model = create_model(config)
        if warn_random:
            logging.getLogger(__name__).warning("%s: random weights, seed %d (pretrained: none)", spec.name, init_seed)
    else:
        preprocess = _check_weights_file(spec, config, tag) if identity.startswith("sha256:") else None
        logging.disable(logging.ERROR)  # open_clip logs a failed tag itself; the error below says it once
        try:
            model = create_model(config, pretrained=tag, force_preprocess_cfg=preprocess)
        except Exception as e:  # open_clip raises RuntimeError/FileNotFoundError/HF errors
            why = _one_line(e)
            fix = (
                f"the file is not an open_clip state dict of {spec.name}: check the path and --model"
                if Path(tag).is_file()
                else spec.weights_hint
            )
            raise WeightsUnavailableError(f"could not load weights {tag!r} for {spec.name}: {why}; {fix}") from None
        finally:
            logging.disable(logging.NOTSET)
    _check_activation(spec, model, config, identity)
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
        tokenizer=open_clip.get_tokenizer(config),
        pretrained=identity,
        dims=dims,
        preprocess_cfg=dict(model.visual.preprocess_cfg),
        open_clip_model=config,
        init_seed=int(init_seed),
    )
