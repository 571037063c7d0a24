"""Where an encoder's weights come from and which activation they need: the checks and
the weights identity behind :func:`pipeline.encoders.load_encoder` and every store's
fingerprint.

OpenAI's CLIP weights were trained with QuickGELU and LAION/DataComp's with GELU, and
open_clip loads either into either architecture with at most a warning, so a wrong pairing
gives plausible but wrong features. A weights path that names an open_clip pretrained entry
(its tag, Hugging Face repo or file name) is matched to that entry's activation before any
model is built, and every built model's activation is checked against its config's. open_clip
also loads a file of another image size, interpolating its position embedding, and gives a
file open_clip's default preprocessing whatever entry it holds; so a file's position
embeddings are checked against the config's shapes before the model is built, a path naming
another architecture's repo is refused, and a path naming an entry gets that entry's mean,
std and resizing. A TorchScript archive is refused unread: loading one runs its code. A
weights file's identity is its sha256, remembered by (real path, size, mtime) in
:data:`HASH_CACHE` (``$PIPELINE_HASH_CACHE``), because every command that checks a store's
fingerprint resolves it and hashing a large file takes seconds.

Functions:
    config_uses_quick_gelu(config): whether an open_clip config builds QuickGELU.
    weights_provenance(config, path): the open_clip entry a weights path names, and its
        activation.
    other_architecture(config, path): another architecture's entry a path names by its repo.
    entry_preprocess(config, path): the preprocessing of the entry a path names.
    open_clip_version(): the installed open_clip's version, from package metadata.
    weights_sha256(path): a weights file's sha256, cached.
    _check_weights_file / _check_provenance / _check_activation: the refusals
        :func:`load_encoder` raises.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from pipeline.files import write_text_atomically
from pipeline.manifests import file_sha256

if TYPE_CHECKING:
    from pipeline.encoders import EncoderSpec


def config_uses_quick_gelu(config: str) -> bool:
    """Whether open_clip's config ``config`` builds QuickGELU (its ``quick_gelu`` field)."""
    import open_clip

    from pipeline.encoders import register_toy_configs

    register_toy_configs()
    return bool((open_clip.get_model_config(config) or {}).get("quick_gelu", False))


def _norm(text: str) -> str:
    return text.lower().replace("-", "_")


def _needles(model: str, tag: str, specific: bool = False) -> set[str]:
    """How a path can name open_clip's entry ``model:tag`` (normalised by :func:`_norm`): its
    Hugging Face repo, also as the hub cache's ``models--org--name`` folder and without the
    org; unless ``specific``, also its tag and its download file names. (open_clip's
    ``hf_hub`` is ``org/name/`` or ``org/name/<file>``.)"""
    import open_clip

    pcfg = open_clip.get_pretrained_cfg(model, tag)
    repo, hub_file = pcfg.get("hf_hub", "").rpartition("/")[::2]
    found = {repo, repo.replace("/", "--"), repo.rpartition("/")[2]}
    if not specific:
        found |= {tag, hub_file, Path(pcfg.get("url", "")).name}
    return set(filter(None, map(_norm, found)))


def _longest(text: str, needles: set[str]) -> int:
    """The length of the longest needle that ``text`` holds as a whole word, 0 if none."""
    hits = (len(n) for n in needles if re.search(rf"(?<![a-z0-9]){re.escape(n)}(?![a-z0-9])", text))
    return max(hits, default=0)


def weights_provenance(config: str, path: str | Path) -> tuple[str, bool] | None:
    """The open_clip pretrained entry a weights path names, if any, and its activation.

    Looks for each pretrained entry of the architecture (``config`` without ``-quickgelu``) in
    the path: its tag (``openai``, ``laion2b_s34b_b79k``), its Hugging Face repo (also as the
    hub cache's ``models--org--name`` folder) and its download file name; case, ``-`` and
    ``_`` are not distinguished, and the longest match wins.

    Returns:
        ``("<model>:<tag>", quick_gelu)`` (whether that entry was trained with QuickGELU,
        from open_clip's pretrained table), or None when the path names no entry.
    """
    import open_clip

    base = config.removesuffix("-quickgelu")
    text = _norm(str(path))
    best: tuple[int, str, bool] | None = None
    for tag in open_clip.list_pretrained_tags_by_model(base):
        length = _longest(text, _needles(base, tag))
        if length and (best is None or length > best[0]):
            best = (length, f"{base}:{tag}", bool(open_clip.get_pretrained_cfg(base, tag).get("quick_gelu", False)))
    return None if best is None else best[1:]


def other_architecture(config: str, path: str | Path) -> tuple[str, bool] | None:
    """The open_clip entry of another architecture that a weights path names by its Hugging
    Face repo (or the hub cache's folder of it) more specifically than it names any entry of
    ``config``'s own, and that entry's activation; None when there is none.

    ``models--timm--vit_large_patch14_clip_224.openai`` holds ``openai``, a tag of
    ViT-L-14-336 too, but it is ViT-L-14's repo: such a file is another architecture's."""
    import open_clip

    base = config.removesuffix("-quickgelu")
    text = _norm(str(path))
    best = (max((_longest(text, _needles(base, t)) for t in open_clip.list_pretrained_tags_by_model(base)), default=0), None)
    for model, tag in open_clip.list_pretrained():
        if model.removesuffix("-quickgelu") != base and (length := _longest(text, _needles(model, tag, specific=True))) > best[0]:
            best = (length, (f"{model}:{tag}", bool(open_clip.get_pretrained_cfg(model, tag).get("quick_gelu", False))))
    return best[1]


def entry_preprocess(config: str, path: str | Path) -> dict[str, Any]:
    """The preprocessing of the open_clip entry a weights path names (:func:`weights_provenance`):
    the fields of open_clip's ``PreprocessCfg`` its pretrained table gives (mean, std,
    interpolation, resize_mode) but the image size, which the model's config decides; {} when
    the path names no entry. open_clip merges them for a pretrained tag but not for a file,
    which would run LAION's ViT-L-14 laion2b_s32b_b82k (mean and std 0.5) under OpenAI's."""
    import dataclasses

    import open_clip
    from open_clip.transform import PreprocessCfg

    found = weights_provenance(config, path)
    if found is None:
        return {}
    pcfg = open_clip.get_pretrained_cfg(*found[0].split(":", 1))
    keys = {f.name for f in dataclasses.fields(PreprocessCfg)} - {"size"}
    return {k: v for k, v in pcfg.items() if k in keys and v is not None}


def open_clip_version() -> str:
    """The installed open_clip's version, read from its package metadata: every store's
    fingerprint records it, and importing open_clip to ask takes seconds of each command
    that only opens a store."""
    from importlib.metadata import version

    return version("open_clip_torch")


HASH_CACHE = Path(os.environ.get("PIPELINE_HASH_CACHE", Path.home() / ".cache" / "pipeline" / "sha256.json"))


def weights_sha256(path: str | Path) -> str:
    """sha256 of a weights file, remembered by (real path, size, mtime) in :data:`HASH_CACHE`.

    Every command that checks a store's fingerprint resolves the weights identity; hashing a
    605 MB ViT-B-32 file took seconds of each call. A file rewritten in place changes its
    mtime (or size), which misses the cache and hashes it again.
    """
    st = Path(path).stat()
    key = f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        cache = json.loads(HASH_CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache = {k: v for k, v in cache.items() if not k.startswith(f"{Path(path).resolve()}|")}
        cache[key] = file_sha256(path)
        try:
            HASH_CACHE.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomically(HASH_CACHE, json.dumps(cache))  # concurrent commands never read half a file
        except OSError:
            pass  # a read-only home: hash every time
    return cache[key]


def _activation_name(quick_gelu: bool) -> str:
    return "QuickGELU" if quick_gelu else "GELU"


def _twin_key(spec: EncoderSpec) -> str:
    """The key with the other activation (``ViT-B-32`` <-> ``ViT-B-32-quickgelu``), if any."""
    from pipeline.encoders import ENCODERS

    base = spec.name.removesuffix("-quickgelu")
    twin = base if base != spec.name else f"{spec.name}-quickgelu"
    return twin if twin in ENCODERS else ""


def _check_provenance(spec: EncoderSpec, config: str, path: str) -> None:
    """Refuse a weights file whose path names another architecture's open_clip entry
    (:func:`other_architecture`) or an entry trained with the other activation, or, under a
    GELU config, a file that names no entry where every entry of the architecture is
    QuickGELU-trained (ViT-L-14-336's only weights are OpenAI's; the hub's file name,
    ``open_clip_pytorch_model.bin``, names none). Checked before anything is built."""
    import open_clip

    from pipeline.encoders import ENCODERS, WeightsUnavailableError

    base = config.removesuffix("-quickgelu")
    other = other_architecture(config, path)
    if other is not None:
        key = other[0].split(":")[0].removesuffix("-quickgelu") + ("-quickgelu" if other[1] else "")
        raise WeightsUnavailableError(
            f"{spec.name}: weights {path!r} name open_clip's {other[0]}, another architecture than {base}; "
            + (f"use --model {key}" if key in ENCODERS else f"pass weights of {base}")
        )
    found = weights_provenance(config, path)
    quick = config_uses_quick_gelu(config)
    tags = open_clip.list_pretrained_tags_by_model(base)
    if found is None and not quick and tags and all(open_clip.get_pretrained_cfg(base, t).get("quick_gelu") for t in tags):
        twin = _twin_key(spec)
        raise ValueError(
            f"{spec.name}: every open_clip weights of {base} ({', '.join(tags)}) are QuickGELU-trained, but config "
            f"{config!r} builds GELU for the weights file {path!r}; {f'use --model {twin}' if twin else 'use a QuickGELU key'}"
        )
    if found is not None and found[1] != quick:
        entry, trained = found
        twin = _twin_key(spec)
        fix = f"use --model {twin}" if twin else "use a key with the weights' activation"
        raise ValueError(
            f"{spec.name}: weights {path!r} name open_clip's {entry} "
            f"({_activation_name(trained)}-trained) but config {config!r} builds "
            f"{_activation_name(quick)}; {fix}"
        )


def _check_activation(spec: EncoderSpec, model: Any, config: str, identity: str) -> None:
    """Refuse a built model whose activation differs from its config's, or a GELU model
    carrying OpenAI (QuickGELU) weights."""
    from open_clip.transformer import QuickGELU

    act = model.visual.transformer.resblocks[0].mlp.gelu
    built = isinstance(act, QuickGELU)
    wanted = config_uses_quick_gelu(config) or identity == "openai"
    if built != wanted:
        why, fix = (
            ("OpenAI weights need QuickGELU", "; use the '-quickgelu' config")
            if identity == "openai"
            else (f"config {config!r} names {_activation_name(wanted)}", "")
        )
        raise ValueError(f"{spec.name}: {why} but config {config!r} built {type(act).__name__}{fix}")


def _one_line(e: Exception) -> str:
    """A loading error in one line of at most ~300 characters: torch's multi-line messages
    (unpickling, missing keys, hundreds of size mismatches) would bury the fix."""
    why = " ".join(str(e).split())
    if "weights_only" in why:  # torch's advice to unpickle arbitrary code is not ours to give
        why = "torch refuses to unpickle it as a state dict"
    return f"{type(e).__name__}: {why if len(why) <= 300 else why[:297] + '...'}"


def _is_torchscript(path: str | Path) -> bool:
    """Whether ``path`` is a TorchScript archive (``torch.jit.save``'s zip, as OpenAI's own
    ``ViT-L-14-336px.pt``): it holds the model's code (``<name>/code/``) and
    ``<name>/constants.pkl``, which ``torch.save``'s zip of a state dict never does."""
    try:
        with zipfile.ZipFile(path) as archive:
            inner = [name.split("/", 1)[-1] for name in archive.namelist()]
    except (OSError, zipfile.BadZipFile):
        return False
    return any(name == "constants.pkl" or name.startswith("code/") for name in inner)


def _position_shapes(state: Any) -> dict[str, tuple[int, ...]]:
    """The image and text position embeddings' shapes in a state dict, under open_clip's
    ``load_state_dict`` conventions (a top-level ``state_dict``, a ``module.`` prefix, the
    text tower's ``positional_embedding`` at the top or under ``text.``)."""
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    names = {"visual.positional_embedding": "image", "positional_embedding": "text", "text.positional_embedding": "text"}
    shapes = {}
    for key, value in state.items() if isinstance(state, dict) else ():
        if key.removeprefix("module.") in names and hasattr(value, "shape"):
            shapes[names[key.removeprefix("module.")]] = tuple(value.shape)
    return shapes


def _file_position_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """:func:`_position_shapes` of a weights file, read as open_clip reads it (safetensors by
    the file name, else torch's format) without reading the tensors: safetensors' header, or
    torch's zip memory-mapped (a file of torch's pre-zip format is read whole); {} when it
    cannot be read (open_clip's load then says why)."""
    try:
        if str(path).endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                return _position_shapes({k: SimpleNamespace(shape=f.get_slice(k).get_shape()) for k in f.keys()})
        return _position_shapes(torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path)))
    except Exception:  # noqa: BLE001 - not weights at all: open_clip's own error names it
        return {}


_CONFIG_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {}  # by the config's name and content


def _config_position_shapes(config: str) -> dict[str, tuple[int, ...]]:
    """:func:`_position_shapes` of the model open_clip builds from ``config``, built on the
    meta device (no memory, no initialisation: a fraction of a second for ViT-L) once per
    config; a refusal compares the file with every registered key's."""
    import open_clip

    from pipeline.encoders import _DropRandomInitWarning, register_toy_configs

    register_toy_configs()
    key = json.dumps([config, open_clip.get_model_config(config)], sort_keys=True, default=str)
    if key not in _CONFIG_SHAPES:
        quiet = _DropRandomInitWarning()
        logging.getLogger().addFilter(quiet)
        try:
            with torch.device("meta"):
                _CONFIG_SHAPES[key] = _position_shapes(open_clip.create_model(config, device="meta").state_dict())
        finally:
            logging.getLogger().removeFilter(quiet)
    return _CONFIG_SHAPES[key]


def _check_weights_file(spec: EncoderSpec, config: str, path: str) -> dict[str, Any]:
    """Refuse a weights file that would not load as ``config``'s weights, before anything is
    built, and return the preprocessing of the open_clip entry its path names
    (:func:`entry_preprocess`).

    Refused: a TorchScript archive (loading one runs code from the file, so it is not read),
    a path that names another architecture or activation (:func:`_check_provenance`), and a
    file whose image or text position embedding has another shape than the config builds
    (open_clip's ``load_checkpoint`` would interpolate it to fit: ViT-L-14's 16 x 16 grid
    loads into ViT-L-14-336's 24 x 24 without an error, and every feature is wrong).
    """
    from pipeline.encoders import ENCODERS, WeightsUnavailableError

    if _is_torchscript(path):
        raise WeightsUnavailableError(
            f"{spec.name}: {path!r} is a TorchScript archive (as OpenAI's own ViT-L-14-336px.pt), which is not read "
            f"since loading one runs code from the file; use open_clip's state dict of the weights instead. {spec.weights_hint}"
        )
    _check_provenance(spec, config, path)
    held, built = _file_position_shapes(path), _config_position_shapes(config)
    for part in sorted(held.keys() & built.keys()):
        if held[part] != built[part]:
            quick = config_uses_quick_gelu(config)
            shapes = {key: _config_position_shapes(ENCODERS.get(key).open_clip_model) for key in ENCODERS.names() if not ENCODERS.get(key).toy}
            fits = [key for key, has in shapes.items() if all(has.get(p) == held[p] for p in held)]
            fits.sort(key=lambda key: config_uses_quick_gelu(ENCODERS.get(key).open_clip_model) != quick)
            raise WeightsUnavailableError(
                f"{spec.name}: the {part} position embedding in weights {path!r} has shape {held[part]}, but config "
                f"{config!r} builds {built[part]}: a file of another image size or architecture (open_clip would "
                f"resize it and load it without an error); {f'use --model {fits[0]}' if fits else f'pass weights of {config}'}"
            )
    return entry_preprocess(config, path)
