"""Encoding images and object crops into a feature store: the pixel half of
:func:`pipeline.extraction.extract`, kept apart from its planning and indexing.

Rows arrive sorted by store row with their sources (an entry of
:attr:`pipeline.extraction.ExtractPlan.todo`). Each micro-batch of ``batch_size`` images is
read, decoded (and cropped) and preprocessed in a one-thread loader while the encoder runs on
the previous one, and each shard batch is written by a one-thread ordered writer, data before
flags, so decoding, encoding and writing overlap and a crash never leaves a ``done`` flag
ahead of its data. With ``overlap=False`` the loader and the writer run in the calling thread
instead, one after the other, in the same order and with the same results: a dask worker on
the CPU has one core (its one thread), and helper threads would take the cores the machine's
other workers encode on. An image that cannot be decoded is encoded as a blank image (the batch
keeps its shape) and its row written as zeros and left unflagged, so it is reported, never read
as data, and written with the same bytes by every run that tries it again. An object crop is cut out of its
row's image (decoded once per micro-batch), and only its pooled embedding is kept.

Functions:
    crop_to_box(img, box): the pixels of an image inside a normalised box.
    _encode_images / _encode_objects(enc, root, rows, sources, cfg, progress, overlap): encode
        and write image / object-crop rows; ``{(modality, row): reason}`` of undecodable ones.
    helper(overlap): a one-thread executor, or one that runs each call at once.
    _load(enc, root, rel, crop, bad, row): one image's preprocessed pixels (extract's loader,
        also timed by the benches).
    _Writer(root, modality, overlap): the ordered writer (captions use it too).
    as_stored(modality, out): encoder outputs as host arrays of their stored dtypes.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from pipeline.cache import writer
from pipeline.cache.schema import ARRAYS
from pipeline.config import ExtractConfig
from pipeline.encoders import Encoder
from pipeline.manifests import BadImageError, decode_image, read_image_bytes


def crop_to_box(img: Image.Image, box: Any) -> Image.Image:
    """The pixels of ``img`` inside the normalised box ``(x0, y0, x1, y1)``, rounded outwards
    to whole pixels and at least one pixel wide and high (the box ``(0, 0, 1, 1)`` is the
    whole image)."""
    w, h = img.size
    x0, y0, x1, y1 = (float(v) for v in box)
    left, top = min(int(np.floor(x0 * w)), w - 1), min(int(np.floor(y0 * h)), h - 1)
    right, bottom = max(int(np.ceil(x1 * w)), left + 1), max(int(np.ceil(y1 * h)), top + 1)
    return img.crop((max(left, 0), max(top, 0), min(right, w), min(bottom, h)))


class _InCaller(Executor):
    """An executor that runs each submitted call at once, in the caller's thread, and hands
    back its finished future. An ``Exception`` is kept in the future and raised by its
    ``result()``, where a thread pool's would be; ``KeyboardInterrupt`` and ``SystemExit``
    propagate at once, as they do in the thread they reach. A call after ``shutdown`` is
    refused, as a pool refuses it."""

    def __init__(self) -> None:
        self.closed = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self.closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - raised by future.result(), as a pool's
            future.set_exception(e)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.closed = True


def as_stored(modality: str, out: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """``out`` (``{"final": tensor, ...}``) as host arrays of the dtypes the store keeps them
    in (grids and token states float16, embeddings float32, ids int32), cast by torch where
    the encoder ran: from a GPU half the bytes cross to the host, and on the CPU the cast
    runs in the encoding thread rather than the writer's."""
    dtypes = {spec.field: getattr(torch, spec.dtype) for spec in ARRAYS[modality]}
    return {k: v.to(dtypes[k]).cpu().numpy() for k, v in out.items()}


def helper(overlap: bool) -> Executor:
    """Where extract's loading and writing run: one background thread when ``overlap``, so
    they overlap the encoder, else the calling thread."""
    return ThreadPoolExecutor(1) if overlap else _InCaller()


def _by_row(rows: np.ndarray, sources: list) -> tuple[np.ndarray, list, dict[int, int]]:
    """Rows sorted ascending (writes go shard by shard), their sources in the same order,
    and each row's position in that order."""
    order = np.argsort(rows)
    rows = rows[order]
    return rows, [sources[i] for i in order], {int(r): i for i, r in enumerate(rows)}


def _encode_images(enc: Encoder, root, rows: np.ndarray, sources: list[tuple[Path, str, Any]], cfg: ExtractConfig, progress: bool, overlap: bool = True) -> dict[tuple[str, int], str]:
    if len(rows) == 0:
        return {}
    rows, sources, position = _by_row(rows, sources)

    def load(micro: np.ndarray, bad: dict[int, str]) -> torch.Tensor:
        return torch.stack([_load(enc, *sources[position[int(r)]], bad, int(r)) for r in micro])  # [b, 3, H, W]

    def keep(out: dict[str, torch.Tensor], micro: np.ndarray) -> dict[str, np.ndarray]:
        return as_stored("image", out)

    return _encode_pixels(enc, root, "image", rows, load, keep, cfg, progress, "extract images", overlap)


def _encode_objects(enc: Encoder, root, rows: np.ndarray, sources: list[tuple[tuple[Path, str, Any], int, np.ndarray]], cfg: ExtractConfig, progress: bool, overlap: bool = True) -> dict[tuple[str, int], str]:
    """Encode object crops ``rows`` (store rows into ``object/*``); ``sources[i]`` is the
    crop's image (root, path, crop), its image row and its normalised box [4]."""
    if len(rows) == 0:
        return {}
    rows, sources, position = _by_row(rows, sources)

    def load(micro: np.ndarray, bad: dict[int, str]) -> torch.Tensor:
        decoded: dict[int, Image.Image | None] = {}  # image row -> decoded image, once per micro-batch
        crops = []
        for r in micro:
            (root_, rel, crop), image_row, box = sources[position[int(r)]]
            if image_row not in decoded:
                try:
                    decoded[image_row] = decode_image(read_image_bytes(root_, rel), str(root_ / rel), crop)
                except BadImageError as e:
                    decoded[image_row] = None
                    bad[int(r)] = str(e)
            if decoded[image_row] is None:
                bad[int(r)] = bad.get(int(r)) or f"its image {root_ / rel} cannot be decoded"
                crops.append(_blank(enc))
            else:
                crops.append(enc.preprocess(crop_to_box(decoded[image_row], box)))
        return torch.stack(crops)  # [b, 3, H, W]

    def keep(out: dict[str, torch.Tensor], micro: np.ndarray) -> dict[str, np.ndarray]:
        picked = [sources[position[int(r)]] for r in micro]
        return {
            **as_stored("object", {"embed": out["embed"]}),  # [b, D]
            "image": np.array([image_row for _, image_row, _ in picked], dtype=np.int64),  # [b]
            "box": np.stack([box for _, _, box in picked]).astype(np.float32),  # [b, 4]
        }

    return _encode_pixels(enc, root, "object", rows, load, keep, cfg, progress, "extract object crops", overlap)


def batch_size(cfg: ExtractConfig, modality: str) -> int:
    """The ``batch_size`` :func:`pipeline.extraction.encode_rows` groups ``modality``'s rows by
    (:func:`pipeline.cache.writer.shard_batches`): ``extract.batch_size`` images or crops, four
    times as many captions (a caption's forward pass is far cheaper)."""
    return cfg.batch_size * (4 if modality == "text" else 1)


def _encode_pixels(enc: Encoder, root, modality: str, rows: np.ndarray, load, keep, cfg: ExtractConfig, progress: bool, desc: str, overlap: bool) -> dict[tuple[str, int], str]:
    """Encode sorted store rows ``rows`` of ``modality`` in micro-batches of :func:`batch_size`:
    ``load(micro, bad)`` gives their [b, 3, H, W] pixels (a blank image for each row it
    records in ``bad`` with the reason), ``keep(out, micro)`` the arrays to store from the
    encoder's outputs; each shard batch is written once all its micro-batches ran, with the
    ``bad`` rows zeroed and left unflagged; ``overlap`` as the module says. Returns
    ``{(modality, row): reason}`` of the bad rows."""
    bar = tqdm(total=len(rows), desc=desc, unit="img", disable=not progress)
    size = batch_size(cfg, modality)
    batches = list(writer.shard_batches(rows, size))
    micro_batches = [
        (i, micro)
        for i, batch in enumerate(batches)
        for micro in np.array_split(batch, -(-len(batch) // size))
    ]
    bad: dict[int, str] = {}  # row -> reason, filled by the loader

    # overlapped: the next micro-batch is decoded and the previous shard batch written while
    # the encoder runs on the current one (a 1-thread loader and a 1-thread ordered writer);
    # in turn: load the next micro-batch, encode the current one, write a finished shard batch
    with helper(overlap) as loader, _Writer(root, modality, overlap) as sink:
        pending = loader.submit(load, micro_batches[0][1], bad)
        parts: list[dict[str, np.ndarray]] = []
        for j, (i, micro) in enumerate(micro_batches):
            pixels = pending.result().to(cfg.device)
            if j + 1 < len(micro_batches):
                pending = loader.submit(load, micro_batches[j + 1][1], bad)
            parts.append(keep(enc.encode_images(pixels), micro))
            bar.update(len(micro))
            if j + 1 == len(micro_batches) or micro_batches[j + 1][0] != i:
                done = np.array([int(r) not in bad for r in batches[i]])
                arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
                for a in arrays.values():  # a bad row holds zeros, not the blank image's features: the
                    a[~done] = 0  # same bytes whatever batch it was encoded in, so a rerun changes nothing
                sink.put(batches[i], arrays, done)
                parts = []
    bar.close()
    return {(modality, r): why for r, why in bad.items()}


class _Writer:
    """Writes encoded batches in submission order: in a background thread when ``overlap``,
    else at once in the caller's.

    Overlapped, ``put`` blocks while two writes are pending (bounded memory). A failed write
    is raised by the next ``put`` or on leaving the context, which waits for every write;
    each batch's data is written before its flags (:func:`pipeline.cache.writer.write_rows`),
    so a crash never leaves a ``done`` flag ahead of its data.
    """

    def __init__(self, root, modality: str, overlap: bool = True) -> None:
        self.root, self.modality = root, modality
        self.handles = writer.row_arrays(root, modality)  # opened once, not per batch
        self.pool = helper(overlap)
        self.pending: list = []

    def __enter__(self) -> _Writer:
        return self

    def put(self, rows: np.ndarray, arrays: dict[str, np.ndarray], done: np.ndarray | None = None) -> None:
        while self.pending and (len(self.pending) >= 2 or self.pending[0].done()):
            self.pending.pop(0).result()  # re-raises a failed write
        self.pending.append(self.pool.submit(writer.write_rows, self.root, self.modality, rows, arrays, done, self.handles))

    def __exit__(self, *exc) -> None:
        try:
            for f in self.pending:
                f.result()
        finally:
            self.pool.shutdown(wait=True)


def _load(enc: Encoder, root: Path, rel: str, crop: Any, bad: dict[int, str], row: int) -> torch.Tensor:
    """One image's pixels; a blank image, with the reason recorded in ``bad[row]``, when it
    cannot be decoded."""
    try:
        return enc.preprocess(decode_image(read_image_bytes(root, rel), str(root / rel), crop))
    except BadImageError as e:
        bad[row] = str(e)
        return _blank(enc)


def _blank(enc: Encoder) -> torch.Tensor:
    """[3, H, W] preprocessed black image: the stand-in encoded for an undecodable one."""
    size = enc.preprocess_cfg["size"]
    side = (size, size) if isinstance(size, int) else tuple(size)
    return enc.preprocess(Image.new("RGB", side[::-1]))
