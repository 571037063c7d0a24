"""A training folder's files on disk, for the scorers' loop and the toy CLIP's trainer alike:
``resume.pt``, the periodic snapshot an interrupted training resumes from, and the finished
model (``model.safetensors``, ``train_log.json``, ``config.json``).

``resume.pt`` is loaded with ``weights_only=True`` (tensors and plain containers only: a file
in a shared cache folder never runs code). One that is cut short, is not a torch file, or is
not the mapping its trainer writes cannot be resumed; it is reported and the run starts again
at step 0, as it does under another configuration, instead of stopping with a traceback.

``config.json`` is the marker a rerun keeps a finished model by (its trainer compares the
configuration it records). :func:`write_finished` removes it before anything else is
written and writes it last, every file through a rename, so a run killed at any point
leaves either the previous finished model whole or a folder no rerun keeps: never new
weights beside an old configuration, nor a log of another run. A ``config.json`` that cannot
be read is reported by :func:`read_finished` and the model is trained again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.files import write_atomically

MARKER = "config.json"


def read_resume(path: Path, keys: set[str], device: str = "cpu") -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a readable snapshot holding every key of ``keys``; ``(None,
    reason)`` for one that cannot be resumed, the reason in a few words; ``(None, None)`` when
    there is no file."""
    if not Path(path).is_file():
        return None, None
    try:
        record = torch.load(path, weights_only=True, map_location=device)
    except Exception as e:  # noqa: BLE001 - pickle, zip and EOF errors alike: the file is unusable
        return None, " ".join(str(e).split())[:160] or type(e).__name__
    if not isinstance(record, dict) or not keys <= set(record):
        return None, "not a resume record"
    return record, None


def write_finished(out: Path, weights: dict[str, torch.Tensor], log_text: str, config_text: Callable[[], str]) -> None:
    """Write a finished model into ``out``: the marker ``config.json`` is removed first, then
    ``model.safetensors`` and ``train_log.json`` are written, and ``config.json`` last, from
    ``config_text()`` (called once the weights are on disk, so that it may hash them)."""
    from safetensors.torch import save_file

    (out / MARKER).unlink(missing_ok=True)
    write_atomically(out / "model.safetensors", lambda p: save_file(weights, str(p)))
    write_atomically(out / "train_log.json", lambda p: p.write_text(log_text))
    write_atomically(out / MARKER, lambda p: p.write_text(config_text()))


def read_finished(out: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a folder holding ``model.safetensors`` and a readable
    ``config.json`` (a JSON object); ``(None, reason)`` for a ``config.json`` that cannot be
    read (cut short, not JSON, not an object); ``(None, None)`` when there is no finished
    model."""
    marker = out / MARKER
    if not (marker.is_file() and (out / "model.safetensors").is_file()):
        return None, None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # JSON and UTF-8 errors alike: the record is unusable
        return None, " ".join(str(e).split())[:160] or type(e).__name__
    if not isinstance(record, dict):
        return None, "not a JSON object"
    return record, None
