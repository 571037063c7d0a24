"""Manifest intake: where a suite's manifest and images live, and safe image/caption reading.

Shapes suites live in the world folder (``<world>/manifests/<suite>.parquet``, images under
``<world>/images``). Real suites are built once with ``pipeline manifest`` and pointed to by
``extract.manifests[suite]`` / ``extract.image_roots[suite]`` in ``params.yaml``.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError


class BadImageError(ValueError):
    """An image file that cannot be decoded: corrupt, truncated, not an image, or over PIL's
    decompression-bomb limit. The message names the file."""


@dataclass(frozen=True)
class SuiteSource:
    """Where one suite's manifest and images are."""

    suite: str
    manifest: Path  # Parquet manifest
    image_root: Path  # folder the manifest's image paths are relative to


def resolve_source(
    suite: str, world: str | Path, manifests: dict[str, str], image_roots: dict[str, str]
) -> SuiteSource:
    """The manifest/image root of ``suite`` (overrides first, then the shapes world)."""
    if suite in manifests:
        manifest = Path(manifests[suite])
        root = Path(image_roots.get(suite, manifest.parent))
    elif suite.startswith("shapes-"):
        manifest = Path(world) / "manifests" / f"{suite}.parquet"
        root = Path(image_roots.get(suite, Path(world) / "images"))
    else:
        raise ValueError(
            f"suite {suite!r} has no manifest configured: build one with "
            f"`pipeline manifest --suite {suite} --root DIR --out FILE.parquet` and set "
            f"extract.manifests.{suite} (and extract.image_roots.{suite}) in params.yaml"
        )
    if not manifest.is_file():
        hint = "run `pipeline world`" if suite.startswith("shapes-") else "run `pipeline manifest`"
        raise FileNotFoundError(f"manifest of {suite} not found at {manifest}; {hint}")
    return SuiteSource(suite, manifest, root)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks (weights files are GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_hashes(root: Path, suffixes: tuple[str, ...] = (".json", ".jsonl", ".tsv", ".csv", ".txt")) -> dict[str, str]:
    """sha256 of every annotation file directly under ``root`` (what a manifest is built from)."""
    root = Path(root)
    return {
        p.name: file_sha256(p)
        for p in sorted(root.iterdir())
        if p.is_file() and p.suffix in suffixes
    }


def write_manifest(df: pd.DataFrame, out: str | Path, sources: dict[str, str]) -> Path:
    """Write a manifest as Parquet, recording its source files' hashes in the file metadata
    (so a changed annotation file changes the manifest's bytes, and extract re-indexes it).

    Raises:
        ValueError: two rows share an ``item_id`` (each would be counted; the source file
            is named by ``out``'s suite).
    """
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    check_unique_ids(df, f"manifest {out}")
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"pipeline.sources"] = json.dumps(sources, sort_keys=True).encode()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(meta), out)
    return out


def manifest_sources(path: str | Path) -> dict[str, str]:
    """The source hashes recorded by `write_manifest` ({} if none)."""
    import json

    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta.get(b"pipeline.sources", b"{}"))


def check_unique_ids(df: pd.DataFrame, what: str) -> None:
    """Refuse a manifest whose ``item_id`` column repeats a value: a repeated item would be
    scored and counted twice."""
    if "item_id" not in df:
        raise ValueError(f"{what}: no item_id column")
    repeated = df["item_id"][df["item_id"].duplicated()].unique().tolist()
    if repeated:
        shown = ", ".join(map(str, repeated[:5])) + (" ..." if len(repeated) > 5 else "")
        raise ValueError(f"{what}: {len(repeated)} item_id(s) appear more than once ({shown}); each item must be listed once")


def read_manifest(path: str | Path) -> pd.DataFrame:
    """Read a Parquet manifest; list cells come back as Python lists."""
    df = pd.read_parquet(path)
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
    """``root / rel``, refusing paths that escape ``root`` (absolute or ``..``)."""
    rel_path = Path(rel)
    full = (root / rel_path).resolve()
    if rel_path.is_absolute() or not full.is_relative_to(root.resolve()):
        raise ValueError(f"image path {rel!r} escapes the image root {root}")
    return full


def read_image_bytes(root: Path, rel: str) -> bytes:
    """The bytes of one image, with an error naming the file when missing."""
    path = safe_image_path(root, rel)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    return path.read_bytes()


def decode_image(data: bytes, name: str, crop_box: Any = None) -> Image.Image:
    """Decode image bytes to RGB (cropped to ``crop_box`` if given).

    16-bit and 32-bit integer greyscale (``I;16*``, ``I``) is scaled to 8 bits by its
    mode's range (PIL's own conversion clips it, so a 16-bit PNG would turn white); every
    other mode goes through ``convert("RGB")`` as open_clip's transform does (palette and
    CMYK converted, alpha dropped).

    Raises:
        BadImageError: the bytes are not a decodable image, or it has more pixels than PIL's
            ``MAX_IMAGE_PIXELS`` (a decompression bomb); the message names ``name``.
    """
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadImageError(
            f"{name}: refused as a decompression bomb ({e}); shrink the image or skip it "
            f"(extract.skip_bad_images: true)"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise BadImageError(f"corrupt or unreadable image: {name} ({e})") from None
    if img.mode.startswith("I;16") or img.mode == "I":
        top = 65535.0 if img.mode.startswith("I;16") else 4294967295.0
        grey = np.asarray(img, dtype=np.float64) * (255.0 / top)
        img = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), mode="L")
    img = img.convert("RGB")
    if crop_box is not None and len(crop_box):
        img = img.crop(tuple(float(v) for v in crop_box))
    return img
