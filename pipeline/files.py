"""Files written whole or not at all.

Every output a later command or stage reads (a checkpoint's files, a metrics record, the
report, a stage's record) is written into a sibling temporary file and moved onto its name
with one ``os.replace``, which is atomic on one file system: a reader, or a run killed
midway, finds the old file or the whole new one, never a truncated one that parses as
something else or stops the next stage with a decoding error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` into a sibling temporary file named after this process, then one
    ``os.replace`` onto ``path``; the temporary file is removed if ``write`` fails."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomically(path: str | Path, text: str) -> None:
    """``text`` into ``path`` through :func:`write_atomically`."""
    write_atomically(path, lambda p: p.write_text(text))


def write_json_atomically(path: str | Path, record: Any, indent: int = 2, sort_keys: bool = False) -> None:
    """``record`` as JSON (``indent``, a final newline) into ``path`` through
    :func:`write_atomically`."""
    write_text_atomically(path, json.dumps(record, indent=indent, sort_keys=sort_keys) + "\n")
