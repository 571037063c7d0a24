"""Where an encoder's weights come from and which activation they need: the checks and
the weights identity behind :func:`pipeline.encoders.load_encoder` and every store's
fingerprint.

OpenAI's CLIP weights were trained with QuickGELU and LAION/DataComp's with GELU, and
open_clip loads either into either architecture with at most a warning, so a wrong pairing
gives plausible but wrong features. A weights path that names an open_clip pretrained entry
(its tag, Hugging Face repo or file name) is matched to that entry's activation before any
model is built, and every built model's activation is checked against its config's. A
weights file's identity is its sha256, remembered by (real path, size, mtime) in
:data:`HASH_CACHE` (``$PIPELINE_HASH_CACHE``), because every command that checks a store's
fingerprint resolves it and hashing a large file takes seconds.

Functions:
    config_uses_quick_gelu(config): whether an open_clip config builds QuickGELU.
    weights_provenance(config, path): the open_clip entry a weights path names, and its
        activation.
    open_clip_version(): the installed open_clip's version, from package metadata.
    weights_sha256(path): a weights file's sha256, cached.
    _check_provenance / _check_activation: the refusals :func:`load_encoder` raises.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.manifests import file_sha256

if TYPE_CHECKING:
    from pipeline.encoders import EncoderSpec


def config_uses_quick_gelu(config: str) -> bool:
    """Whether open_clip's config ``config`` builds QuickGELU (its ``quick_gelu`` field)."""
    import open_clip

    from pipeline.encoders import register_toy_configs

    register_toy_configs()
    return bool((open_clip.get_model_config(config) or {}).get("quick_gelu", False))


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

    def norm(text: str) -> str:
        return text.lower().replace("-", "_")

    base = config.removesuffix("-quickgelu")
    text = norm(str(path))
    best: tuple[int, str, bool] | None = None
    for tag in open_clip.list_pretrained_tags_by_model(base):
        pcfg = open_clip.get_pretrained_cfg(base, tag)
        hub = pcfg.get("hf_hub", "").strip("/")
        url_file = Path(pcfg.get("url", "")).name
        needles = {tag, hub, hub.replace("/", "--"), hub.rsplit("/", 1)[-1], url_file}
        for needle in filter(None, map(norm, needles)):
            found = re.search(rf"(?<![a-z0-9]){re.escape(needle)}(?![a-z0-9])", text)
            if found and (best is None or len(needle) > best[0]):
                best = (len(needle), f"{base}:{tag}", bool(pcfg.get("quick_gelu", False)))
    return None if best is None else best[1:]


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
            tmp = HASH_CACHE.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache))
            tmp.replace(HASH_CACHE)  # atomic: concurrent commands never read half a file
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
    """Refuse a weights file whose path names an open_clip entry trained with the other
    activation, or, under a GELU config, a file that names no entry where every entry of the
    architecture is QuickGELU-trained (ViT-L-14-336's only weights are OpenAI's; the hub's
    file name, ``open_clip_pytorch_model.bin``, names none). Checked before anything is built."""
    import open_clip

    found = weights_provenance(config, path)
    quick = config_uses_quick_gelu(config)
    base = config.removesuffix("-quickgelu")
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
