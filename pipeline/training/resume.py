"""Reading back ``resume.pt``, the periodic snapshot an interrupted training resumes from
(the scorers' loop and the toy CLIP's trainer alike).

The file is loaded with ``weights_only=True`` (tensors and plain containers only: a file in a
shared cache folder never runs code). One that is cut short, is not a torch file, or is not
the mapping its trainer writes cannot be resumed; it is reported and the run starts again at
step 0, as it does under another configuration, instead of stopping with a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


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
