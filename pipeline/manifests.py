"""Manifest intake: where a suite's manifest and images live, and safe image/caption reading.

Shapes suites live in the world folder (``<world>/manifests/<suite>.parquet``, images under
``<world>/images``). Real suites are built once with ``pipeline manifest`` and pointed to by
``extract.manifests[suite]`` / ``extract.image_roots[suite]`` in ``params.yaml``.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

SKIP_BAD = "skip it (extract.skip_bad_images: true)"  # the fix every skippable refusal ends with


class BadImageError(ValueError):
    """An image file that cannot be decoded: corrupt, truncated, not an image, or over PIL's
    decompression-bomb limit. The message names the file."""


def without_skip_hint(reason: str) -> str:
    """A :class:`BadImageError` message less its closing "or skip it (...)": the reason a
    store records for an image it skipped, where that advice is already taken."""
    return re.sub(r",? or " + re.escape(SKIP_BAD), "", reason)


@dataclass(frozen=True)
class SuiteSource:
    """Where one suite's manifest and images are."""

    suite: str
    manifest: Path  # Parquet manifest
    image_root: Path  # folder the manifest's image paths are relative to


def world_suite(suite: str) -> bool:
    """Whether ``suite`` is a shapes-world suite (``Suite.world``: ``pipeline world`` writes its
    manifest); an unregistered name is not."""
    from pipeline.benchmarks import SUITES

    return suite in SUITES.names() and SUITES.get(suite).world


def resolve_source(
    suite: str, world: str | Path, manifests: dict[str, str], image_roots: dict[str, str]
) -> SuiteSource:
    """The manifest/image root of ``suite`` (overrides first, then the shapes world).

    A missing manifest is named with the fix that writes that file: ``pipeline world`` for
    the world's own ``<world>/manifests/<suite>.parquet``; for a path that
    ``extract.manifests`` names, the params key to correct (``pipeline world`` never writes
    there) and, for a real suite, the ``pipeline manifest`` command that builds it.
    """
    own = Path(world) / "manifests" / f"{suite}.parquet"  # where `pipeline world` writes a shapes suite
    if suite in manifests:
        manifest = Path(manifests[suite])
        root = Path(image_roots.get(suite, manifest.parent))
    elif world_suite(suite):
        manifest = own
        root = Path(image_roots.get(suite, Path(world) / "images"))
    else:
        raise ValueError(
            f"suite {suite!r} has no manifest configured: build one with "
            f"`pipeline manifest --suite {suite} --root DIR --out FILE.parquet` and set "
            f"extract.manifests.{suite} (and extract.image_roots.{suite}) in params.yaml"
        )
    if not manifest.is_file():
        if world_suite(suite) and os.path.abspath(manifest) == os.path.abspath(own):
            raise FileNotFoundError(f"manifest of {suite} not found at {manifest}; run `pipeline world`")
        fix = (
            f"drop the key to read the shapes world's {own}"
            if world_suite(suite)
            else f"build the file with `pipeline manifest --suite {suite} --root DIR --out {manifest}`"
        )
        raise FileNotFoundError(
            f"manifest of {suite} not found at {manifest}, the file extract.manifests.{suite} names; "
            f"correct that path in the params file, or {fix}"
        )
    return SuiteSource(suite, manifest, root)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks (weights files are GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_hashes(root: Path, suffixes: tuple[str, ...] = (".json", ".jsonl", ".tsv", ".csv", ".txt")) -> dict[str, str]:
    """sha256 of every annotation file directly under ``root`` or its ``annotations/`` folder
    (COCO's layout), keyed by the path under ``root``: what a manifest is built from."""
    root = Path(root)
    files = [*root.iterdir(), *((root / "annotations").iterdir() if (root / "annotations").is_dir() else ())]
    return {
        p.relative_to(root).as_posix(): file_sha256(p)
        for p in sorted(files)
        if p.is_file() and p.suffix in suffixes
    }


def write_parquet_json(df: pd.DataFrame, out: str | Path, key: bytes, value: Any) -> Path:
    """Write ``df`` as Parquet with ``value`` (JSON, sorted keys) in the file metadata under
    ``key``: what a file was made from travels with it."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.files import write_atomically

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {**(table.schema.metadata or {}), key: json.dumps(value, sort_keys=True).encode()}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, lambda p: pq.write_table(table.replace_schema_metadata(meta), p))
    return out


def read_parquet_json(path: str | Path, key: bytes, default: Any = None) -> Any:
    """The JSON :func:`write_parquet_json` recorded under ``key``; ``default`` when none."""
    import json

    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[key]) if key in meta else default


def write_manifest(
    df: pd.DataFrame, out: str | Path, sources: dict[str, Any], categories: dict[str, list[str]] | None = None
) -> Path:
    """Write a manifest as Parquet, recording its source files' hashes (and how it was cut,
    e.g. ``disjoint_from``'s dropped rows) in the file metadata (so a changed annotation file
    changes the manifest's bytes, and extract re-indexes it). ``categories``, the
    categories present and missing when the suite has one file per category
    (:meth:`pipeline.benchmarks.base.Suite.category_coverage`), is recorded with them under
    ``categories``, so the score stage and the report can say that an aggregate pools fewer
    categories than the benchmark has.

    Raises:
        ValueError: two rows share an ``item_id`` (each would be counted; the source file
            is named by ``out``'s suite).
    """
    check_unique_ids(df, f"manifest {out}")
    if categories is not None:
        sources = {**sources, "categories": categories}
    return write_parquet_json(df, out, b"pipeline.sources", sources)


def manifest_sources(path: str | Path) -> dict[str, Any]:
    """The source hashes (and records) written by `write_manifest` ({} if none)."""
    return read_parquet_json(path, b"pipeline.sources", {})


def manifest_coverage(path: str | Path, suite: Any, manifest: pd.DataFrame) -> dict[str, list[str]] | None:
    """The categories present and missing (``{"present", "missing"}``) that `write_manifest`
    recorded in the manifest file at ``path``; for a file written without that record, the
    ``suite``'s :meth:`~pipeline.benchmarks.base.Suite.category_coverage` of its rows
    ``manifest`` (all of them, as read from the file); None for a suite without one file per
    category."""
    recorded = manifest_sources(path).get("categories")
    return recorded if isinstance(recorded, dict) else suite.category_coverage(manifest)


def check_unique_ids(df: pd.DataFrame, what: str) -> None:
    """Refuse a manifest whose ``item_id`` column holds a null or repeats a value: an item
    without an id is written to the scores without a name (and two of them would read as
    one repeated ``nan``), a repeated item would be scored and counted twice. Nulls are
    named by their row (counted from 0), since they have no id to name them by."""
    if "item_id" not in df:
        raise ValueError(f"{what}: no item_id column")
    null = np.flatnonzero(df["item_id"].isna().to_numpy())
    if len(null):
        shown = ", ".join(map(str, null[:5])) + (" ..." if len(null) > 5 else "")
        raise ValueError(
            f"{what}: {len(null)} row(s) have a null item_id (row {shown}, counted from 0); "
            f"give every item a unique item_id"
        )
    repeated = df["item_id"][df["item_id"].duplicated()].unique().tolist()
    if repeated:
        shown = ", ".join(map(str, repeated[:5])) + (" ..." if len(repeated) > 5 else "")
        raise ValueError(f"{what}: {len(repeated)} item_id(s) appear more than once ({shown}); each item must be listed once")


def read_manifest(path: str | Path) -> pd.DataFrame:
    """Read a Parquet manifest; list cells come back as Python lists. A file that is not
    Parquet (a YAML, a JSON annotation file given by mistake) is refused naming it."""
    import pyarrow

    try:
        df = pd.read_parquet(path)
    except (pyarrow.ArrowInvalid, OSError) as e:
        if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise ValueError(
            f"{path} is not a Parquet manifest ({' '.join(str(e).split())[:160]}); a suite's manifest "
            "(extract.manifests) is the .parquet file `pipeline manifest` or `pipeline world` writes"
        ) from None
    for col in df.columns:
        if len(df) and isinstance(df[col].iloc[0], np.ndarray):
            df[col] = df[col].map(lambda v: None if v is None else list(v))
    return df


def cells(values: Iterable[Any]) -> list[list[Any]]:
    """Normalise a manifest column to a list of lists (str cell -> [str], None -> [])."""
    out = []
    for v in values:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            out.append([])
        elif isinstance(v, (list, tuple, np.ndarray)):
            out.append(list(v))
        else:
            out.append([v])
    return out


def safe_image_path(root: Path, rel: str) -> Path:
    """``root / rel``, refusing paths that escape ``root`` (absolute or ``..``).

    The test is on the path as written (normalised, symlinks not followed): a manifest cannot
    climb out of the root, while a symlink the user put inside it (a mounted COCO folder)
    is theirs to follow."""
    rel_path = Path(rel)
    root_norm = os.path.normpath(os.path.abspath(root))
    full = os.path.normpath(os.path.join(root_norm, rel_path))
    if rel_path.is_absolute() or os.path.commonpath([root_norm, full]) != root_norm:
        raise ValueError(f"image path {rel!r} escapes the image root {root}")
    return Path(full)


def image_presence(root: Path, paths: Iterable[str]) -> dict[str, Any]:
    """Which images of ``paths`` (relative to ``root``) are files, by ``stat`` alone (none is
    opened): ``{"image_root", "images": distinct paths, "missing": sorted paths that are no
    file, "digest": sha256 of every present image's (path, size, mtime)}``. ``pipeline
    images`` writes it for DVC: an image that appears, goes or is rewritten changes the
    record, and extract, which depends on it, reruns."""
    named = sorted(set(paths))
    missing, lines = [], []
    for rel in named:
        path = safe_image_path(root, rel)
        if not path.is_file():
            missing.append(rel)
            continue
        st = path.stat()
        lines.append(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return {"image_root": str(root), "images": len(named), "missing": missing, "digest": digest}


def read_image_bytes(root: Path, rel: str) -> bytes:
    """The bytes of one image, with an error naming the file when missing."""
    path = safe_image_path(root, rel)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    return path.read_bytes()


def _without_buffer(reason: str) -> str:
    """``reason`` without the ``<_io.BytesIO object at 0x...>`` PIL puts in some messages:
    an address that changes every run and names nothing the user has."""
    return re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", reason).strip() or "unreadable"


MAX_ASPECT = 100  # longest side / shortest side of an image extract accepts


def decode_image(data: bytes, name: str, crop_box: Any = None) -> Image.Image:
    """Decode image bytes to RGB (cropped to ``crop_box`` if given, once
    :func:`checked_crop` accepts it).

    16-bit integer greyscale (``I;16*``) is scaled to 8 bits by its range (PIL's own
    conversion clips it, so a 16-bit PNG would turn white); 32-bit integer greyscale (``I``,
    e.g. a TIFF) by the range its values fit, 8, 16 or 32 bits, since 16-bit data is often
    stored in it; every other mode goes through ``convert("RGB")`` (palette and CMYK
    converted, alpha dropped). The conversion comes first and the crop after it, as ARO's
    official loader does (``Image.open(...).convert('RGB')``, then the crop); open_clip's
    transform converts after resizing and cropping instead. For RGB and greyscale images (the
    real suites' JPEGs) the two orders give the same tensor bit for bit; for alpha and palette
    images they differ (here alpha is dropped before resizing, where PIL resizes an RGBA image
    premultiplied and a palette image by its nearest pixel). A float image (``F``) has no
    range to scale by and is refused, as is an image more than :data:`MAX_ASPECT` times
    longer than wide (a thin strip passes the pixel limit but explodes when resized).

    Raises:
        BadImageError: the bytes are not a decodable image, it has more pixels than PIL's
            ``MAX_IMAGE_PIXELS`` (a decompression bomb), it is a float image or a thin strip,
            or its ``crop_box`` is not a box on it; the message names ``name``.
    """
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadImageError(
            f"{name}: refused as a decompression bomb ({e}); shrink the image or {SKIP_BAD}"
        ) from None
    except UnidentifiedImageError:
        # PIL's own message names the in-memory buffer (``<_io.BytesIO object at 0x...>``)
        raise BadImageError(f"corrupt or unreadable image: {name} (not a format PIL can identify)") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadImageError(f"corrupt or unreadable image: {name} ({_without_buffer(str(e))})") from None
    if img.mode == "F":
        raise BadImageError(
            f"{name}: a floating-point image (mode F) has no defined 8-bit range; convert it "
            f"to 8 or 16 bits, or {SKIP_BAD}"
        )
    w, h = img.size
    if max(w, h) > MAX_ASPECT * min(w, h):  # resized to the model's side, it would hold ~aspect x side^2 pixels
        raise BadImageError(
            f"{name}: {w}x{h} pixels, an aspect ratio over {MAX_ASPECT}:1, which resizing to the "
            f"model's input would blow up; crop it or {SKIP_BAD}"
        )
    if img.mode.startswith("I;16") or img.mode == "I":
        grey = np.asarray(img, dtype=np.float64)
        if img.mode.startswith("I;16"):
            top = 65535.0
        else:  # a 32-bit container: the largest value says which depth it holds
            peak = float(grey.max(initial=0.0))
            top = 255.0 if peak <= 255 else 65535.0 if peak <= 65535 else 4294967295.0
        img = Image.fromarray(np.clip(np.rint(grey * (255.0 / top)), 0, 255).astype(np.uint8), mode="L")
    img = img.convert("RGB")
    if crop_box is not None and len(crop_box):
        img = img.crop(checked_crop(crop_box, img.size, name))
    return img


def checked_crop(crop_box: Any, size: tuple[int, int], name: str) -> tuple[float, float, float, float]:
    """``crop_box`` as PIL's (left, top, right, bottom) once it is one: four finite numbers,
    right of left and below top, overlapping the ``size`` = (width, height) image (a box
    partly outside keeps PIL's black padding there, as the official crops do), and no larger
    than PIL's decompression-bomb limit.

    Raises:
        BadImageError: naming ``name``, the box and what is wrong with it (a bad box is the
            item's fault, skippable with ``extract.skip_bad_images`` as an undecodable image).
    """
    w, h = size
    fix = f"fix the item's crop_box or {SKIP_BAD}"
    try:
        box = tuple(float(v) for v in crop_box)
    except (TypeError, ValueError):
        box = ()
    if len(box) != 4 or not all(np.isfinite(box)):
        raise BadImageError(f"{name}: crop_box {list(crop_box)!r} is not four finite numbers [x0, y0, x1, y1]; {fix}")
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        raise BadImageError(f"{name}: crop_box {list(box)} is empty or reversed (x1 must exceed x0, y1 y0); {fix}")
    if x1 <= 0 or y1 <= 0 or x0 >= w or y0 >= h:
        raise BadImageError(f"{name}: crop_box {list(box)} lies outside the {w}x{h} image; {fix}")
    if (x1 - x0) * (y1 - y0) > (Image.MAX_IMAGE_PIXELS or float("inf")):
        raise BadImageError(f"{name}: crop_box {list(box)} is a decompression bomb (more pixels than PIL allows); {fix}")
    return box
