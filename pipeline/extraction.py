"""Running a frozen encoder once over every unique image and caption of a set of suites.

    from pipeline.extraction import extract
    summary = extract(cfg)          # cfg: ExtractConfig -> <cfg.out>/<cfg.model>.zarr

Images and captions are keyed by content (``pipeline.cache.schema.image_key`` /
``text_key``), so a suite shared by two runs, or an image shared by two suites, is encoded
once; rows whose ``done`` flag is set are reused, so an interrupted run resumes. Missing
images are listed and counted (``skip_missing``) rather than dropped from a denominator.
The contract is :mod:`pipeline.cache.schema`; the encoder capture is
:class:`pipeline.encoders.Encoder`.

With ``object_crops`` the frozen image tower also encodes every annotated object of the
suites that carry ``object_boxes``: each box is cut out of its row's image
(:func:`crop_to_box`) and preprocessed like a whole image (open_clip's eval transform: the
shorter side resized to the input, then a centre crop, so an elongated box loses the ends of
its long side as an elongated image would), and the crops are encoded in batches of
``batch_size``; only their pooled embeddings are kept (``object/*``), keyed by the image's
content and the box, so a crop shared by two suites is encoded once too.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.retrieval import parse_boxes
from pipeline.cache import store_path, writer
from pipeline.cache.schema import image_key, object_key, text_key
from pipeline.config import ExtractConfig
from pipeline.encoders import Encoder, load_encoder
from pipeline.manifests import (
    cells,
    decode_image,
    file_sha256,
    read_image_bytes,
    read_manifest,
    resolve_source,
)

log = logging.getLogger(__name__)


def extract(cfg: ExtractConfig, progress: bool = True, encoder: Encoder | None = None) -> dict[str, Any]:
    """Extract features of ``cfg.suites`` into ``<cfg.out>/<cfg.model>.zarr``.

    Returns:
        A summary: rows encoded/reused per modality, seconds, store path.
    """
    torch.set_num_threads(cfg.threads)
    for suite in cfg.suites:
        SUITES.get(suite)  # unknown suites fail before any work, listing the valid ones
    sources = [resolve_source(s, cfg.world, cfg.manifests, cfg.image_roots) for s in cfg.suites]
    enc = encoder or load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)
    dims = asdict(enc.dims)
    fingerprint = {**enc.fingerprint(), **({"object_crops": True} if cfg.object_crops else {})}
    root = writer.open_for_writing(store_path(cfg), fingerprint, dims, cfg.replace_mismatch)
    writer.write_params(
        root,
        {
            "visual_proj": enc.model.visual.proj.detach().cpu().numpy(),
            "text_projection": enc.model.text_projection.detach().cpu().numpy(),
            "logit_scale": enc.model.logit_scale.exp().detach().cpu().numpy(),
        },
    )

    # 1. gather every image (path, crop) and caption of every suite, keyed by content
    images: dict[str, tuple[Path, str, Any]] = {}  # hex key -> (root, rel path, crop)
    captions: dict[str, str] = {}  # hex key -> text
    objects: dict[str, tuple[str, np.ndarray]] = {}  # hex key -> (hex image key, [4] box)
    suite_cells: list[tuple[Any, dict[str, tuple[str, list[list[str]]]], str]] = []
    missing: dict[str, list[str]] = {}  # suite -> image paths that could not be found
    for src in sources:
        suite = SUITES.get(src.suite)
        df = read_manifest(src.manifest)
        columns: dict[str, tuple[str, list[list[str]]]] = {}
        crops = df["crop_box"].tolist() if "crop_box" in df else [None] * len(df)
        for col in suite.image_columns:
            keyed = []
            for item_cells, crop in zip(cells(df[col]), crops, strict=True):
                row_keys = []
                for rel in item_cells:
                    try:
                        data = read_image_bytes(src.image_root, rel)
                    except FileNotFoundError:
                        missing.setdefault(src.suite, []).append(rel)
                        row_keys.append(None)
                        continue
                    k = bytes(image_key(data, crop if col == "image" else None)).hex()
                    images.setdefault(k, (src.image_root, rel, crop if col == "image" else None))
                    row_keys.append(k)
                keyed.append(row_keys)
            columns[col] = ("image", keyed)
        for col in suite.caption_columns:
            keyed = []
            for item_id, item_cells in zip(df["item_id"], cells(df[col]), strict=True):
                row_keys = []
                for text in item_cells:
                    if not isinstance(text, str) or not text.strip():
                        raise ValueError(f"{src.suite} item {item_id}: empty caption in {col!r}")
                    k = bytes(text_key(text)).hex()
                    captions.setdefault(k, text)
                    row_keys.append(k)
                keyed.append(row_keys)
            columns[col] = ("text", keyed)
        if cfg.object_crops and "object_boxes" in df and "image" in columns:
            columns["object_crops"] = ("object", _object_cells(df["object_boxes"], columns["image"][1], objects))
        suite_cells.append((src, columns, file_sha256(src.manifest)))

    if missing and not cfg.skip_missing:
        listing = "; ".join(f"{suite}: {len(paths)} ({', '.join(paths[:5])}{' ...' if len(paths) > 5 else ''})" for suite, paths in missing.items())
        raise FileNotFoundError(
            f"{sum(map(len, missing.values()))} image(s) not found — {listing}. Fix the image root "
            f"(extract.image_roots) or set extract.skip_missing: true to score without those "
            f"items (they are counted and reported in every metrics file)"
        )
    for suite, paths in missing.items():
        log.warning("%s: %d image(s) missing, their items will be reported as missing", suite, len(paths))

    # 2. rows for every key; encode what is new or unfinished
    t0 = time.perf_counter()
    image_keys = list(images)
    text_keys = list(captions)
    img_rows, img_todo = writer.plan_rows(root, "image", _keys(image_keys))
    txt_rows, txt_todo = writer.plan_rows(root, "text", _keys(text_keys))
    row_of_image = dict(zip(image_keys, img_rows.tolist(), strict=True))
    row_of_text = dict(zip(text_keys, txt_rows.tolist(), strict=True))
    key_of_image_row = {r: k for k, r in row_of_image.items()}
    key_of_text_row = {r: k for k, r in row_of_text.items()}
    img_todo = np.array([r for r in img_todo if r in key_of_image_row], dtype=np.int64)
    txt_todo = np.array([r for r in txt_todo if r in key_of_text_row], dtype=np.int64)

    _encode_texts(enc, root, txt_todo, [captions[key_of_text_row[r]] for r in txt_todo], cfg, progress)
    _encode_images(enc, root, img_todo, [images[key_of_image_row[r]] for r in img_todo], cfg, progress)
    row_of_object: dict[str, int] = {}
    obj_todo = np.zeros(0, dtype=np.int64)
    if cfg.object_crops:
        object_keys = list(objects)
        obj_rows, obj_todo = writer.plan_rows(root, "object", _keys(object_keys))
        row_of_object = dict(zip(object_keys, obj_rows.tolist(), strict=True))
        key_of_object_row = {r: k for k, r in row_of_object.items()}
        obj_todo = np.array([r for r in obj_todo if r in key_of_object_row], dtype=np.int64)
        crops = []  # (image source, image row, box) of each crop to encode
        for r in obj_todo:
            image, box = objects[key_of_object_row[r]]
            crops.append((images[image], row_of_image[image], box))
        _encode_objects(enc, root, obj_todo, crops, cfg, progress)

    # 3. per-suite index arrays (items -> rows)
    lookups = {"image": row_of_image, "text": row_of_text, "object": row_of_object}
    for src, columns, sha in suite_cells:
        index = {}
        for col, (modality, keyed) in columns.items():
            lookup = lookups[modality]
            width = max((len(k) for k in keyed), default=0)
            rows = np.full((len(keyed), max(width, 1)), -1, dtype=np.int64)
            for i, ks in enumerate(keyed):
                rows[i, : len(ks)] = [lookup[k] if k is not None else -1 for k in ks]
            index[col] = (modality, rows)
        writer.write_suite_index(
            root,
            src.suite,
            index,
            {
                "manifest": str(src.manifest),
                "manifest_sha256": sha,
                "image_root": str(src.image_root),
                "n_items": len(next(iter(columns.values()))[1]) if columns else 0,
                "missing_images": missing.get(src.suite, []),
            },
        )
    writer.finalize(root)
    return {
        "store": str(store_path(cfg)),
        "images": {"total": len(image_keys), "encoded": int(len(img_todo))},
        "captions": {"total": len(text_keys), "encoded": int(len(txt_todo))},
        **({"objects": {"total": len(objects), "encoded": int(len(obj_todo))}} if cfg.object_crops else {}),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _object_cells(boxes_column, image_cells: list[list[str | None]], objects: dict[str, tuple[str, np.ndarray]]) -> list[list[str | None]]:
    """Per item, the content key of each box of its ``object_boxes`` cell (None where the
    item's image is missing), registering each new crop in ``objects``."""
    keyed = []
    for cell, image_keys in zip(boxes_column, image_cells, strict=True):
        boxes = parse_boxes(cell)  # [m, 4]
        k = image_keys[0] if image_keys else None
        if k is None:
            keyed.append([None] * len(boxes))
            continue
        row_keys = []
        for box in boxes:
            ok = bytes(object_key(bytes.fromhex(k), box)).hex()
            objects.setdefault(ok, (k, box))
            row_keys.append(ok)
        keyed.append(row_keys)
    return keyed


def crop_to_box(img: Image.Image, box: Any) -> Image.Image:
    """The pixels of ``img`` inside the normalised box ``(x0, y0, x1, y1)``, rounded outwards
    to whole pixels and at least one pixel wide and high (the box ``(0, 0, 1, 1)`` is the
    whole image)."""
    w, h = img.size
    x0, y0, x1, y1 = (float(v) for v in box)
    left, top = min(int(np.floor(x0 * w)), w - 1), min(int(np.floor(y0 * h)), h - 1)
    right, bottom = max(int(np.ceil(x1 * w)), left + 1), max(int(np.ceil(y1 * h)), top + 1)
    return img.crop((max(left, 0), max(top, 0), min(right, w), min(bottom, h)))


def _keys(hexes: list[str]) -> np.ndarray:
    if not hexes:
        return np.zeros((0, 16), dtype=np.uint8)
    return np.stack([np.frombuffer(bytes.fromhex(h), dtype=np.uint8) for h in hexes])


def _encode_texts(enc: Encoder, root, rows: np.ndarray, texts: list[str], cfg: ExtractConfig, progress: bool) -> None:
    if len(rows) == 0:
        return
    order = np.argsort(rows)
    rows, texts = rows[order], [texts[i] for i in order]
    position = {int(r): i for i, r in enumerate(rows)}
    n_long = _count_truncated(enc, texts)
    if n_long:
        log.warning(
            "%d caption(s) exceed the context of %d tokens and were truncated (eot kept)",
            n_long,
            enc.dims.context_length,
        )
    bar = tqdm(total=len(rows), desc="extract captions", unit="cap", disable=not progress)
    with _Writer(root, "text") as sink:
        for batch in writer.shard_batches(rows, cfg.batch_size * 4):
            ids = enc.tokenizer([texts[position[int(r)]] for r in batch]).to(cfg.device)
            out = enc.encode_texts(ids)
            sink.put(
                batch,
                {
                    "ids": ids.cpu().numpy(),
                    "mask": out["mask"].cpu().numpy(),
                    "tokens": out["tokens"].float().cpu().numpy(),
                    "embed": out["embed"].float().cpu().numpy(),
                },
            )
            bar.update(len(batch))
    bar.close()


def _count_truncated(enc: Encoder, texts: list[str]) -> int:
    from open_clip.tokenizer import _tokenizer

    limit = enc.dims.context_length - 2  # sot and eot
    return sum(len(_tokenizer.encode(t)) > limit for t in texts)


def _by_row(rows: np.ndarray, sources: list) -> tuple[np.ndarray, list, dict[int, int]]:
    """Rows sorted ascending (writes go shard by shard), their sources in the same order,
    and each row's position in that order."""
    order = np.argsort(rows)
    rows = rows[order]
    return rows, [sources[i] for i in order], {int(r): i for i, r in enumerate(rows)}


def _encode_images(enc: Encoder, root, rows: np.ndarray, sources: list[tuple[Path, str, Any]], cfg: ExtractConfig, progress: bool) -> None:
    if len(rows) == 0:
        return
    rows, sources, position = _by_row(rows, sources)

    def load(micro: np.ndarray) -> torch.Tensor:
        return torch.stack([_load(enc, *sources[position[int(r)]]) for r in micro])  # [b, 3, H, W]

    def keep(out: dict[str, torch.Tensor], micro: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v.float().cpu().numpy() for k, v in out.items()}

    _encode_pixels(enc, root, "image", rows, load, keep, cfg, progress, "extract images")


def _encode_objects(enc: Encoder, root, rows: np.ndarray, sources: list[tuple[tuple[Path, str, Any], int, np.ndarray]], cfg: ExtractConfig, progress: bool) -> None:
    """Encode object crops ``rows`` (store rows into ``object/*``); ``sources[i]`` is the
    crop's image (root, path, crop), its image row and its normalised box [4]."""
    if len(rows) == 0:
        return
    rows, sources, position = _by_row(rows, sources)

    def load(micro: np.ndarray) -> torch.Tensor:
        decoded: dict[int, Image.Image] = {}  # image row -> decoded image, once per micro-batch
        crops = []
        for r in micro:
            (root_, rel, crop), image_row, box = sources[position[int(r)]]
            if image_row not in decoded:
                decoded[image_row] = decode_image(read_image_bytes(root_, rel), str(root_ / rel), crop)
            crops.append(enc.preprocess(crop_to_box(decoded[image_row], box)))
        return torch.stack(crops)  # [b, 3, H, W]

    def keep(out: dict[str, torch.Tensor], micro: np.ndarray) -> dict[str, np.ndarray]:
        picked = [sources[position[int(r)]] for r in micro]
        return {
            "embed": out["embed"].float().cpu().numpy(),  # [b, D]
            "image": np.array([image_row for _, image_row, _ in picked], dtype=np.int64),  # [b]
            "box": np.stack([box for _, _, box in picked]).astype(np.float32),  # [b, 4]
        }

    _encode_pixels(enc, root, "object", rows, load, keep, cfg, progress, "extract object crops")


def _encode_pixels(enc: Encoder, root, modality: str, rows: np.ndarray, load, keep, cfg: ExtractConfig, progress: bool, desc: str) -> None:
    """Encode sorted store rows ``rows`` of ``modality`` in micro-batches of ``batch_size``:
    ``load(micro)`` gives their [b, 3, H, W] pixels, ``keep(out, micro)`` the arrays to store
    from the encoder's outputs; each shard batch is written once all its micro-batches ran."""
    bar = tqdm(total=len(rows), desc=desc, unit="img", disable=not progress)
    batches = list(writer.shard_batches(rows, cfg.batch_size))
    micro_batches = [
        (i, micro)
        for i, batch in enumerate(batches)
        for micro in np.array_split(batch, -(-len(batch) // cfg.batch_size))
    ]

    # decode/preprocess the next micro-batch and write the previous shard batch while the
    # encoder runs on the current one (a 1-thread loader and a 1-thread ordered writer)
    with ThreadPoolExecutor(1) as loader, _Writer(root, modality) as sink:
        pending = loader.submit(load, micro_batches[0][1])
        parts: list[dict[str, np.ndarray]] = []
        for j, (i, micro) in enumerate(micro_batches):
            pixels = pending.result().to(cfg.device)
            if j + 1 < len(micro_batches):
                pending = loader.submit(load, micro_batches[j + 1][1])
            parts.append(keep(enc.encode_images(pixels), micro))
            bar.update(len(micro))
            if j + 1 == len(micro_batches) or micro_batches[j + 1][0] != i:
                sink.put(batches[i], {k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
                parts = []
    bar.close()


class _Writer:
    """Writes encoded batches in a background thread, in submission order.

    ``put`` blocks while two writes are pending (bounded memory); leaving the context waits
    for every write and re-raises the first failure, so a crash never skips a ``done`` flag
    ordering: each batch's data is written before its flags (`writer.write_rows`).
    """

    def __init__(self, root, modality: str) -> None:
        self.root, self.modality = root, modality
        self.pool = ThreadPoolExecutor(1)
        self.pending: list = []

    def __enter__(self) -> _Writer:
        return self

    def put(self, rows: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
        while self.pending and (len(self.pending) >= 2 or self.pending[0].done()):
            self.pending.pop(0).result()  # re-raises a failed write
        self.pending.append(self.pool.submit(writer.write_rows, self.root, self.modality, rows, arrays))

    def __exit__(self, *exc) -> None:
        try:
            for f in self.pending:
                f.result()
        finally:
            self.pool.shutdown(wait=True)


def _load(enc: Encoder, root: Path, rel: str, crop: Any) -> torch.Tensor:
    data = read_image_bytes(root, rel)
    return enc.preprocess(decode_image(data, str(root / rel), crop))
