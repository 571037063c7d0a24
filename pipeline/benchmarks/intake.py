"""Reading the official annotation files strictly: every failure names the file and the fix.

The loaders of :mod:`pipeline.benchmarks` read their inputs through these helpers: a file that
is absent names the folder one level off the root that holds it, or else where to get it
(:func:`require_file`, :func:`nearby_root`); JSON is read with duplicate-key,
UTF-8 and syntax errors raised as one ValueError naming the file and the place
(:func:`read_json`); a file or section that must hold a list of entries, or one object, is
refused as one line when it holds something else or no entry (:func:`read_json_list`,
:func:`read_json_object`, :func:`entry_list`); an entry's missing field or an undefined id
names the file and the field (:class:`MissingFieldError`, :class:`IdIndex`); a field's value
is checked against the type the official format gives it, naming the file, the entry, the
field, the value found and the one expected (:func:`text_field`, :func:`number_field`,
:func:`integer_field`, :func:`string_list_field`, :func:`bbox_field`), so that a string where
a list belongs is not read character by character and a ``null`` number is not a bare
TypeError; and image paths must stay under the image root (:func:`relative_image_path`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

log = logging.getLogger(__name__)


def nearby_root(root: Path, names: Iterable[str]) -> Path | None:
    """The folder one level off ``root`` that holds one of ``names`` (paths under a root):
    ``root/data`` (a repository's ``data/`` folder), ``root``'s parent (an image folder given
    for its annotation folder), or another subfolder of ``root``, in that order; None when
    none does. A root given one level off is then named with the folder meant, rather than
    sent to download files that are there."""
    root, names = Path(root), list(names)
    subfolders = sorted(p for p in root.iterdir() if p.is_dir() and p.name != "data") if root.is_dir() else []
    parent = [root.parent] if root.parent != root else []
    for folder in (root / "data", *parent, *subfolders):
        if any((folder / name).is_file() for name in names):
            return folder
    return None


def require_file(root: Path, name: str, how_to_get: str) -> Path:
    """``root / name``, or a FileNotFoundError that names the file and either the folder one
    level off ``root`` that holds it (:func:`nearby_root`) or where to get it."""
    path = Path(root) / name
    if not path.is_file():
        near = nearby_root(root, [name])
        hint = f"it is under {near}: give that folder as the root" if near is not None else how_to_get
        raise FileNotFoundError(f"{name} not found under {Path(root)}; {hint}")
    return path


class MissingFieldError(KeyError, ValueError):
    """A field an official annotation file's entry lacks; the message names the file and the
    field (a plain KeyError would print as the bare key)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _fields_of(record: dict) -> str:
    """The first keys of ``record``, for naming what an entry has instead of a missing field."""
    return ", ".join(map(repr, list(record)[:8])) + (" ..." if len(record) > 8 else "") or "none"


class _Entry(dict):
    """One JSON object of an official file: a missing key raises :class:`MissingFieldError`
    naming the file, the key and the keys the object has."""

    __slots__ = ("_path",)

    def __missing__(self, key: Any) -> Any:
        have = _fields_of(self)
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


OFFICIAL = "replace it with the official file"


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (``an object``, ``a list``, ``a string``,
    ``a number``, ``a boolean``, ``null``), for messages that must not name Python classes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in ((dict, "an object"), (list, "a list"), (str, "a string"), ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as JSON text (``null``, ``"abc"``, ``[1, 2]``), cut to ``limit`` characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_entries(data: Any, where: str, length: int | None, source: str | None) -> list:
    """``data`` if it is a non-empty list of JSON objects (of lists of at least ``length``
    values when ``length`` is given), else a ValueError naming ``where`` and the first
    entry (by index) of another shape."""
    fix = f"{OFFICIAL}: {source}" if source else OFFICIAL
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a JSON list of entries, got {json_kind(data)}; {fix}")
    if not data:
        raise ValueError(f"{where}: holds no entry (an empty JSON list); {fix}")
    if length is None:
        wrong = [i for i, d in enumerate(data) if not isinstance(d, dict)]
        shape = "a JSON object"
    else:
        wrong = [i for i, d in enumerate(data) if not (isinstance(d, list) and len(d) >= length)]
        shape = f"a list of {length} values"
    if wrong:
        raise ValueError(
            f"{where}: entry {wrong[0]} is {shown(data[wrong[0]])}, not {shape} "
            f"({len(wrong)} entry(ies) in all); {fix}"
        )
    return data


def read_json_list(path: Path, length: int | None = None, source: str | None = None) -> list:
    """An official file holding a JSON list of entries: objects, or lists of at least
    ``length`` values when ``length`` is given (What'sUp's ``[image_id, correct, wrong]``;
    the official loader reads the first three, so a longer entry is accepted).

    Raises:
        ValueError: naming ``path`` (and ``source``, where the official file comes from)
            when the file is not a JSON list, is an empty one (the manifest would have no
            item and fail later naming its output) or has an entry of another shape, named
            by index, which would otherwise fail inside a loader with a bare TypeError.
    """
    return _check_entries(read_json(path), str(path), length, source)


def read_json_object(path: Path, source: str | None = None) -> dict:
    """An official file holding one JSON object (COCO's ``{"images", "annotations", ...}``).

    Raises:
        ValueError: naming ``path`` when it holds anything else (a list around the object
            would fail in the loader as a bare TypeError).
    """
    data = read_json(path)
    if not isinstance(data, dict):
        fix = f"{OFFICIAL}: {source}" if source else OFFICIAL
        raise ValueError(f"{path}: expected a JSON object, got {json_kind(data)}; {fix}")
    return data


def entry_list(record: dict, key: str, path: Path) -> list:
    """``record[key]`` as a list of JSON objects (a COCO file's ``images`` or
    ``annotations``; it may be empty), or a ValueError naming ``path``, the section and its
    first entry of another shape."""
    value = _value(record, key, path, "the file")
    if value is _ABSENT:
        raise field_error(record, key, value, path, "the file's object", "a JSON list of objects")
    if isinstance(value, list) and not value:
        return value
    return _check_entries(value, f"{path}: {key!r}", None, None)


_ABSENT = object()


def _value(record: Any, key: str, path: Path, where: str) -> Any:
    """``record[key]``, or :data:`_ABSENT` when ``record`` is an object without ``key``;
    a ValueError when ``record`` is not an object at all."""
    if not isinstance(record, dict):
        raise ValueError(f"{path}: {where} is {shown(record)}, not a JSON object; {OFFICIAL}")
    return record.get(key, _ABSENT)


def field_error(record: dict, key: str, value: Any, path: Path, where: str, expected: str) -> ValueError:
    """The one-line error of a field whose value is not what the official format holds:
    ``<file>: <entry>: '<field>' is <value found>; expected <what>; replace it ...``. A
    missing field is named with the fields the entry has (a misspelt key shows there)."""
    got = f"missing (its fields: {_fields_of(record)})" if value is _ABSENT else shown(value)
    return ValueError(f"{path}: {where}: {key!r} is {got}; expected {expected}; {OFFICIAL}")


def text_field(record: Any, key: str, path: Path, where: str) -> str:
    """``record[key]`` as a non-empty string, or a ValueError naming the file, the entry
    ``where`` (``item swap-att/3``, ``entry 3``) and the key: a missing key, ``null``, a
    number or an empty caption."""
    value = _value(record, key, path, where)
    if not isinstance(value, str) or not value.strip():
        raise field_error(record, key, value, path, where, "a non-empty string")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number_field(record: Any, key: str, path: Path, where: str, minimum: float | None = None, positive: bool = False) -> float:
    """``record[key]`` as a float: a finite JSON number (not a string of digits, a boolean or
    ``null``), at least ``minimum`` when given and above 0 when ``positive``; otherwise a
    ValueError naming the file, the entry ``where`` and the key."""
    value = _value(record, key, path, where)
    ok = _is_number(value) and (minimum is None or value >= minimum) and (not positive or value > 0)
    if not ok:
        bound = " > 0" if positive else f" >= {minimum:g}" if minimum is not None else ""
        raise field_error(record, key, value, path, where, f"a number{bound}")
    return float(value)


def integer_field(record: Any, key: str, path: Path, where: str) -> int:
    """``record[key]`` as an int (an id): a JSON integer, else a ValueError naming the file,
    the entry ``where`` and the key."""
    value = _value(record, key, path, where)
    if not isinstance(value, int) or isinstance(value, bool):
        raise field_error(record, key, value, path, where, "an integer id")
    return value


def string_list_field(
    record: Any,
    key: str,
    path: Path,
    where: str,
    length: int | None = None,
    blank_ok: bool = False,
) -> list[str]:
    """``record[key]`` as a list of strings, of exactly ``length`` when given, each
    non-empty unless ``blank_ok``.

    Raises:
        ValueError: naming the file, the entry ``where`` and the key. A string there is
            refused, not taken as the list of its characters (``"white"`` would be read as
            ``["w", "h", ...]`` by indexing).
    """
    value = _value(record, key, path, where)
    ok = isinstance(value, list) and all(isinstance(v, str) and (blank_ok or v.strip()) for v in value)
    if not ok or (length is not None and len(value) != length):
        kind = "strings" if blank_ok else "non-empty strings"
        raise field_error(record, key, value, path, where, f"a list of {f'{length} ' if length else ''}{kind}")
    return value


def bbox_field(record: Any, key: str, path: Path, where: str) -> list[float]:
    """``record[key]`` as a pixel box ``[x, y, width, height]`` of four finite numbers with
    ``width, height >= 0`` (COCO's ``bbox``), or a ValueError naming the file, the entry
    ``where`` and the box."""
    bbox = _value(record, key, path, where)
    ok = isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)
    if not ok or bbox[2] < 0 or bbox[3] < 0:
        shown_box = "missing" if bbox is _ABSENT else shown(bbox)
        raise ValueError(
            f"{path}: {where}: {key} {shown_box} is not [x, y, width, height] with width, height >= 0; {OFFICIAL}"
        )
    return [float(v) for v in bbox]


def off_image(box: list[float] | tuple[float, ...], width: float, height: float) -> bool:
    """Whether a pixel box ``[x, y, w, h]`` lies wholly outside its ``width`` x ``height``
    image: clipped to the image it would be a box of no area on the image's edge, an object
    that is not in the picture. The loaders leave such objects out and say how many (an
    official file cannot be fixed by its user)."""
    x, y, w, h = box
    return x >= width or y >= height or x + w <= 0 or y + h <= 0


def report_off_image(path: Path, left_out: list[str], what: str) -> None:
    """One warning for the objects of ``path`` that :func:`off_image` left out (``left_out``:
    where each was, e.g. ``image 1, annotation 5``), and what leaving them out meant."""
    if left_out:
        log.warning(
            "%s: %d object box(es) lie wholly outside their images and are %s (first: %s)",
            path, len(left_out), what, "; ".join(left_out[:3]),
        )  # fmt: skip


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
