"""Reading the official annotation files strictly: every failure names the file and the fix.

The loaders of :mod:`pipeline.benchmarks` read their inputs through these helpers: a file that
is absent names where to get it (:func:`require_file`); JSON is read with duplicate-key,
UTF-8 and syntax errors raised as one ValueError naming the file and the place
(:func:`read_json`, :func:`read_json_list`); an entry's missing field or an undefined id names
the file and the field (:class:`MissingFieldError`, :class:`IdIndex`); captions must be
non-empty strings (:func:`text_field`); and image paths must stay under the image root
(:func:`relative_image_path`).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any


def require_file(root: Path, name: str, how_to_get: str) -> Path:
    """``root / name``, or a FileNotFoundError that names the file and where to get it."""
    path = Path(root) / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} not found under {Path(root)}; {how_to_get}")
    return path


class MissingFieldError(KeyError, ValueError):
    """A field an official annotation file's entry lacks; the message names the file and the
    field (a plain KeyError would print as the bare key)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _Entry(dict):
    """One JSON object of an official file: a missing key raises :class:`MissingFieldError`
    naming the file, the key and the keys the object has."""

    __slots__ = ("_path",)

    def __missing__(self, key: Any) -> Any:
        have = ", ".join(map(repr, list(self)[:8])) + (" ..." if len(self) > 8 else "") or "none"
        raise MissingFieldError(
            f"{self._path}: an entry has no {key!r} field (its fields: {have}); the file is not "
            f"in the official format, replace it with the official file"
        )


class IdIndex(dict):
    """One section of an official file keyed by id (COCO's categories, images): an id that an
    entry references but the section does not define raises a ValueError naming the file and
    the section (a plain dict would print the bare id)."""

    __slots__ = ("_where",)

    def __missing__(self, key: Any) -> Any:
        raise ValueError(
            f"{self._where} defines no id {key!r}, which an entry references; the file is cut "
            f"short or not in the official format, replace it with the official file"
        )


def id_index(pairs: Any, where: str) -> IdIndex:
    """An :class:`IdIndex` of ``(id, entry)`` pairs; ``where`` names the file and section.

    Raises:
        ValueError: an id appears twice (a plain dict would keep the last entry and lose the
            first), naming ``where`` and the id.
    """
    index = IdIndex()
    index._where = where
    for key, entry in pairs:
        if key in index:
            raise ValueError(f"{where}: id {key!r} appears twice (an entry would be lost); replace it with the official file")
        index[key] = entry
    return index


def read_json(path: Path) -> Any:
    """An official annotation file's JSON, read strictly.

    Python's ``json`` keeps the last of two equal keys in one object, which silently drops an
    item of a file keyed by index (SugarCrepe); here a duplicated key, invalid UTF-8 and a
    syntax error each raise one ValueError naming the file and the place. Objects come back
    as dicts whose missing keys raise :class:`MissingFieldError` naming the file and the
    field, so every loader's ``entry["field"]`` fails with the file named.
    """

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen = _Entry()
        seen._path = path
        for key, value in pairs:
            if key in seen:
                raise ValueError(f"{path}: key {key!r} appears twice in one JSON object (an item would be lost); fix the file")
            seen[key] = value
        return seen

    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark some editors write is not JSON, but harmless
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}: invalid UTF-8 at byte {e.start} (line {line}); re-save the file as UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested deeper than Python can read; this is not an official annotation file") from None
    except ValueError as e:  # e.g. an integer past Python's digit limit
        raise ValueError(f"{path}: unreadable JSON ({e}); this is not an official annotation file") from None


def read_json_list(path: Path, length: int | None = None) -> list:
    """An official file holding a JSON list of entries: objects, or lists of at least
    ``length`` values when ``length`` is given (What'sUp's ``[image_id, correct, wrong]``;
    the official loader reads the first three, so a longer entry is accepted).

    Raises:
        ValueError: naming ``path`` and the first entry (by index) that has another shape,
            which would otherwise fail inside a loader with a bare TypeError or unpacking
            error.
    """
    data = read_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list, got a JSON {type(data).__name__}")
    if length is None:
        wrong = [i for i, d in enumerate(data) if not isinstance(d, dict)]
        shape = "a JSON object"
    else:
        wrong = [i for i, d in enumerate(data) if not (isinstance(d, list) and len(d) >= length)]
        shape = f"a list of {length} values"
    if wrong:
        raise ValueError(
            f"{path}: entry {wrong[0]} is {json.dumps(data[wrong[0]])[:80]}, not {shape} "
            f"({len(wrong)} entry(ies) in all); replace it with the official file"
        )
    return data


def text_field(record: Any, key: str, path: Path, item: str) -> str:
    """``record[key]`` as a non-empty string, or a ValueError naming the file, the item and
    the key (a missing key, ``null`` or an empty caption)."""
    value = record.get(key) if isinstance(record, dict) else None
    if not isinstance(value, str) or not value.strip():
        got = "missing" if not isinstance(record, dict) or key not in record else repr(value)
        raise ValueError(f"{path}: item {item}: {key!r} is {got}; expected a non-empty string")
    return value


def relative_image_path(path: str, item: str) -> str:
    """``path`` (with ``/`` separators) if it is relative and stays under the image root.

    Raises:
        ValueError: naming ``item`` when ``path`` is empty, absolute (POSIX or Windows) or
            contains a ``..`` component.
    """
    p = str(path).replace("\\", "/")
    if not p or PurePosixPath(p).is_absolute() or PureWindowsPath(p).drive or ".." in p.split("/"):
        raise ValueError(
            f"item {item}: image path {path!r} escapes the image root "
            "(absolute paths and '..' are refused)"
        )
    return p
