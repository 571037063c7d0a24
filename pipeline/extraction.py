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
(:func:`pipeline.extract_pixels.crop_to_box`) and preprocessed like a whole image
(open_clip's eval transform: the shorter side resized to the input, then a centre crop, so
an elongated box loses the ends of its long side as an elongated image would), and the
crops are encoded in batches of ``batch_size``; only their pooled embeddings are kept
(``object/*``), keyed by the image's content and the box, so a crop shared by two suites is
encoded once too. The image and crop encoding lives in :mod:`pipeline.extract_pixels`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from tqdm import tqdm

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.retrieval import parse_boxes
from pipeline.cache import integrity, store_lock, store_path, writable_store_path, writer
from pipeline.cache.schema import image_key, object_key, text_key
from pipeline.config import ExtractConfig
from pipeline.encoders import Encoder, load_encoder
from pipeline.extract_pixels import _encode_images, _encode_objects, _Writer, as_stored, batch_size
from pipeline.manifests import (
    BadImageError,
    cells,
    file_sha256,
    read_image_bytes,
    read_manifest,
    resolve_source,
    without_skip_hint,
)

log = logging.getLogger(__name__)


@dataclass
class ExtractPlan:
    """What one extract encodes and indexes, decided before any encoding (picklable, so the
    distributed path ships ``todo`` blocks to workers).

    ``todo[modality]`` is ``(rows, sources)``: sorted store rows still to encode and, per
    row, what to encode (a caption's BPE tokens, :meth:`pipeline.encoders.Encoder.bpe`; an
    image's (root, rel path, crop); an object crop's (image source, image row, box)).
    """

    store: Path
    suite_cells: list[tuple[Any, dict[str, tuple[str, list[list[str | None]]]], str]]
    missing: dict[str, list[str]]  # suite -> image paths that could not be found
    row_of: dict[str, dict[str, int]]  # modality -> hex key -> store row
    images: dict[str, tuple[Path, str, Any]]  # hex key -> (root, rel path, crop)
    todo: dict[str, tuple[np.ndarray, list]] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)  # modality -> unique keys
    truncation: dict[str, dict[str, int]] = field(default_factory=dict)  # suite -> n_truncated, n_truncation_ties, n_identical_options
    repaired: dict[str, int] = field(default_factory=dict)  # array -> damaged rows found by --repair
    bad: dict[tuple[str, int], str] = field(default_factory=dict)  # (modality, row) -> why it cannot be decoded
    image_paths: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # suite -> hex key -> every path with that content


def extract(
    cfg: ExtractConfig,
    progress: bool = True,
    encoder: Encoder | None = None,
    repair: bool = False,
    break_lock: bool = False,
    overlap: bool = True,
) -> dict[str, Any]:
    """Extract features of ``cfg.suites`` into ``<cfg.out>/<cfg.model>.zarr``, holding the
    store's write lock throughout.

    Args:
        repair: decode every chunk of the store first and re-encode the rows of every
            damaged or missing chunk file (``pipeline extract --repair``).
        break_lock: take over a lock another host left (:func:`pipeline.cache.store_lock`).
        overlap: decode and write in helper threads beside the encoder (:func:`encode_rows`);
            False runs them in turn, as a distributed worker on the CPU does.

    Returns:
        A summary: rows encoded/reused per modality, seconds, store path.
    """
    torch.set_num_threads(cfg.threads)
    sources = suite_sources(cfg)  # before the model loads: a wrong suite, path or store address fails at once
    path = writable_store_path(cfg)
    with store_lock(path, break_lock, cfg.storage_options):  # a second writer is refused before its model loads
        enc = encoder or load_encoder(cfg.model, cfg.pretrained, cfg.checkpoint, cfg.device, cfg.init_seed)
        root, plan = prepare(cfg, enc, repair, progress, sources)
        return encode_plan(enc, root, plan, cfg, progress, overlap)


def encode_plan(enc: Encoder, root: zarr.Group, plan: ExtractPlan, cfg: ExtractConfig, progress: bool = False, overlap: bool = True) -> dict[str, Any]:
    """Encode every row :func:`prepare` left to do (:func:`encode_rows`, modality by
    modality) and :func:`finish` the store; returns extract's summary, whose ``seconds`` is
    the encoding alone."""
    t0 = time.perf_counter()
    for modality, (rows, what) in plan.todo.items():
        plan.bad.update(encode_rows(enc, root, modality, rows, what, cfg, progress, overlap))
    return finish(root, plan, cfg, time.perf_counter() - t0)


def suite_sources(cfg: ExtractConfig) -> list:
    """Each of ``cfg.suites``' manifest and image root (:func:`pipeline.manifests.resolve_source`).

    Raises:
        ValueError: no suite, or an unknown one (listing the valid ones).
        FileNotFoundError: a manifest the params name is not there.
    """
    if not cfg.suites:
        raise ValueError("extract.suites is empty: nothing to extract; name at least one suite (`pipeline suites` lists them)")
    for suite in cfg.suites:
        SUITES.get(suite)  # unknown suites fail before any work, listing the valid ones
    return [resolve_source(s, cfg.world, cfg.manifests, cfg.image_roots) for s in cfg.suites]


def prepare(cfg: ExtractConfig, enc: Encoder, repair: bool = False, progress: bool = False, sources: list | None = None) -> tuple[zarr.Group, ExtractPlan]:
    """Open (or create) the store, write the projections, read every suite's manifest
    (``sources``: :func:`suite_sources`, resolved here when None), and give every unique
    image, caption and object crop a store row.

    The row arrays' chunk inventory is checked and their keys decoded
    (:func:`pipeline.cache.integrity.key_inventory`); with ``repair`` every chunk is decoded too, and the rows of each damaged file are cleared
    (flags unset, keys restored from the suite indexes) so that they are encoded again. The
    projections and the indexes of the suites extracted are not checked: this extract rewrites
    them whole (the projections here, the indexes in :func:`finish`), which is what makes them
    whole again after the reader refused them.

    Raises:
        FileNotFoundError: images are missing and ``cfg.skip_missing`` is False (nothing is
            encoded yet).
        CorruptStoreError: the store is damaged and ``repair`` is False.
    """
    sources = sources if sources is not None else suite_sources(cfg)
    dims = asdict(enc.dims)
    fingerprint = {**enc.fingerprint(), **({"object_crops": True} if cfg.object_crops else {})}
    root = writer.open_for_writing(store_path(cfg), fingerprint, dims, cfg.replace_mismatch, cfg.storage_options)
    writer.write_params(
        root,
        {
            "visual_proj": enc.model.visual.proj.detach().cpu().numpy(),
            "text_projection": enc.model.text_projection.detach().cpu().numpy(),
            "logit_scale": enc.model.logit_scale.exp().detach().cpu().numpy(),
        },
    )

    damage = integrity.verify(root, progress) if repair else integrity.key_inventory(root)
    if damage and not repair:
        raise integrity.CorruptStoreError(integrity.describe(store_path(cfg), damage))
    lost_keys = writer.clear_damage(root, damage)  # modality -> rows whose keys were lost

    # 1. gather every image (path, crop) and caption of every suite, keyed by content
    images: dict[str, tuple[Path, str, Any]] = {}  # hex key -> (root, rel path, crop)
    captions: dict[str, str] = {}  # hex key -> text
    objects: dict[str, tuple[str, np.ndarray]] = {}  # hex key -> (hex image key, [4] box)
    suite_cells: list[tuple[Any, dict[str, tuple[str, list[list[str]]]], str]] = []
    missing: dict[str, list[str]] = {}  # suite -> image paths that could not be found
    image_paths: dict[str, dict[str, dict[str, None]]] = {}  # suite -> hex key -> its paths (ordered set)
    for src in sources:
        suite = SUITES.get(src.suite)
        df = read_manifest(src.manifest)
        suite.check_manifest(df, f"{src.suite} manifest {src.manifest}")
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
                    image_paths.setdefault(src.suite, {}).setdefault(k, {})[rel] = None
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

    roots = {src.suite: src.image_root for src, _, _ in suite_cells}
    listing = "; ".join(f"{suite}: {len(paths)} under {roots[suite]} ({', '.join(paths[:5])}{' ...' if len(paths) > 5 else ''})" for suite, paths in missing.items())
    if missing and not cfg.skip_missing:
        raise FileNotFoundError(
            f"{sum(map(len, missing.values()))} image(s) not found — {listing}. Fix the image root "
            f"(extract.image_roots) or set extract.skip_missing: true to score without those "
            f"items (they are counted and reported in every metrics file)"
        )
    if none := sorted(suite for suite in missing if suite not in image_paths):
        raise FileNotFoundError(
            f"no image of {', '.join(none)} was found, so nothing of it could be scored — {listing}. "
            f"Fix extract.image_roots.{none[0]} (the folder the manifest's image paths are relative to) "
            f"or remove {', '.join(none)} from extract.suites"
        )
    for suite, paths in missing.items():
        log.warning("%s: %d image(s) missing, their items will be reported as missing", suite, len(paths))

    # 2. rows for every key; what is new or unfinished is to encode
    plan = ExtractPlan(store_path(cfg), suite_cells, missing, {}, images)
    plan.image_paths = {suite: {k: list(paths) for k, paths in keyed.items()} for suite, keyed in image_paths.items()}
    plan.repaired = {d.array: d.hi - d.lo for d in damage}
    if any(len(r) for r in lost_keys.values()):
        _restore_keys(root, suite_cells, lost_keys)
    bpe = dict(zip(captions, enc.bpe(list(captions.values())), strict=True))  # each caption encoded once
    plan.truncation = _truncation(enc, suite_cells, bpe)
    plan.todo["text"] = _plan(root, plan, "text", captions, lambda k: bpe[k])
    plan.todo["image"] = _plan(root, plan, "image", images, lambda k: images[k])
    if cfg.object_crops:
        def crop_source(k: str) -> tuple[tuple[Path, str, Any], int, np.ndarray]:
            image, box = objects[k]
            return images[image], plan.row_of["image"][image], box

        plan.todo["object"] = _plan(root, plan, "object", objects, crop_source)
    return root, plan


def _plan(root: zarr.Group, plan: ExtractPlan, modality: str, keyed: dict[str, Any], source) -> tuple[np.ndarray, list]:
    """Store rows of ``keyed``'s keys (recorded in ``plan.row_of``) and the sorted rows still
    to encode with their sources."""
    keys = list(keyed)
    rows, todo = writer.plan_rows(root, modality, _keys(keys))
    plan.row_of[modality] = dict(zip(keys, rows.tolist(), strict=True))
    plan.totals[modality] = len(keys)
    key_of_row = {r: k for k, r in plan.row_of[modality].items()}
    todo = np.array([r for r in todo if r in key_of_row], dtype=np.int64)  # sorted
    return todo, [source(key_of_row[int(r)]) for r in todo]


def encode_rows(enc: Encoder, root: zarr.Group, modality: str, rows: np.ndarray, sources: list, cfg: ExtractConfig, progress: bool, overlap: bool = True) -> dict[tuple[str, int], str]:
    """Encode sorted store rows ``rows`` of ``modality`` from their ``sources`` (an entry of
    :attr:`ExtractPlan.todo`) and write them, flags last; decoding and writing run in helper
    threads beside the encoder when ``overlap``, else in this thread
    (:mod:`pipeline.extract_pixels`).

    Returns:
        ``{(modality, row): reason}`` of the rows whose image could not be decoded (written
        as zeros and left unflagged, so they are never read as data, and a rerun that tries
        them again writes the same bytes).
    """
    encode = {"text": _encode_texts, "image": _encode_images, "object": _encode_objects}[modality]
    return encode(enc, root, rows, sources, cfg, progress, overlap) or {}


def finish(root: zarr.Group, plan: ExtractPlan, cfg: ExtractConfig, seconds: float) -> dict[str, Any]:
    """Write every suite's item -> row index and, when rows that now hold data were written
    (or the store was never marked), mark the store updated; the summary. An extract that finds every row
    already encoded leaves the store's bytes as they were, so a DVC stage hashing the store
    sees no change and does not rerun what reads it.

    Rows in ``plan.bad`` (images that could not be decoded, and their object crops) are
    indexed as -1, like missing images, and listed per suite with the reason under every
    path of every image column that holds those bytes: images are keyed by content, so two
    files with the same bytes share one row, and each item is counted by its own path.

    Raises:
        BadImageError: some images could not be decoded and ``cfg.skip_bad_images`` is
            False (everything else is encoded and kept; no suite index is written).
    """
    bad_rows = {modality: {r for m, r in plan.bad if m == modality} for modality in plan.row_of}
    bad_images: dict[str, dict[str, str]] = {}  # suite -> {image path: reason}
    for suite, paths_of in plan.image_paths.items():
        for key, paths in paths_of.items():
            row = plan.row_of["image"][key]
            if row in bad_rows["image"]:
                bad_images.setdefault(suite, {}).update(dict.fromkeys(paths, plan.bad["image", row]))
    n_bad = len({p for v in bad_images.values() for p in v})
    # rows of undecodable images are tried again on every run but never flagged done: only
    # rows that now hold data change the store
    encoded = {m: int(len(rows)) - len(bad_rows.get(m, ())) for m, (rows, _) in plan.todo.items()}
    stamp = any(encoded.values()) or "updated" not in root.attrs
    if bad_images and not cfg.skip_bad_images:
        if stamp:  # the good rows this refused run wrote are kept: stamped, as after any write
            writer.finalize(root)
        for suite, paths in bad_images.items():
            for p, why in paths.items():
                log.error("%s: %s", suite, why if p in why else f"{p}: {why}")
        listing = "; ".join(
            f"{suite}: {len(paths)} ({', '.join(why if p in why else f'{p}: {why}' for p, why in list(paths.items())[:3])}"
            f"{' ...' if len(paths) > 3 else ''})"
            for suite, paths in bad_images.items()
        )
        raise BadImageError(
            f"{n_bad} image(s) cannot be decoded — {listing}{' (every one is logged above)' if n_bad > 3 else ''}. "
            f"Replace those files, or set extract.skip_bad_images: true to score without their items "
            f"(counted and reported in every metrics file); everything else is encoded and kept"
        )
    bad_images = {suite: {p: without_skip_hint(why) for p, why in paths.items()} for suite, paths in bad_images.items()}
    if n_bad:
        log.warning(
            "skipping %d undecodable image(s) (extract.skip_bad_images); each suite's record lists them with the "
            "reason, and every metrics file counts their items: %s",
            n_bad, "; ".join(f"{suite}: {', '.join(list(paths)[:3])}{' ...' if len(paths) > 3 else ''}"
                             for suite, paths in bad_images.items()),
        )  # fmt: skip
    for src, columns, sha in plan.suite_cells:
        index = {}
        for col, (modality, keyed) in columns.items():
            lookup = plan.row_of[modality]
            width = max((len(k) for k in keyed), default=0)
            rows = np.full((len(keyed), max(width, 1)), -1, dtype=np.int64)
            for i, ks in enumerate(keyed):
                found = [lookup[k] if k is not None else -1 for k in ks]
                rows[i, : len(ks)] = [r if r not in bad_rows[modality] else -1 for r in found]
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
                "missing_images": plan.missing.get(src.suite, []),
                "bad_images": bad_images.get(src.suite, {}),
                **plan.truncation.get(src.suite, {}),
            },
        )
    if stamp:
        writer.finalize(root)
    names = {"image": "images", "text": "captions", "object": "objects"}
    counts = {
        names[m]: {"total": plan.totals[m], "encoded": encoded[m]}
        for m in ("image", "text", "object") if m in plan.todo
    }
    skipped = {"missing": sum(map(len, plan.missing.values())), "bad": len(bad_rows["image"])}  # images, not their crops
    return {
        "store": str(plan.store), **counts, "skipped_images": skipped, "truncation": plan.truncation,
        **({"repaired": plan.repaired} if plan.repaired else {}), "seconds": round(seconds, 2),
    }  # fmt: skip


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



def _keys(hexes: list[str]) -> np.ndarray:
    if not hexes:
        return np.zeros((0, 16), dtype=np.uint8)
    return np.stack([np.frombuffer(bytes.fromhex(h), dtype=np.uint8) for h in hexes])


def _encode_texts(enc: Encoder, root, rows: np.ndarray, bpe: list[list[int]], cfg: ExtractConfig, progress: bool, overlap: bool = True) -> None:
    if len(rows) == 0:
        return
    order = np.argsort(rows)
    rows, bpe = rows[order], [bpe[i] for i in order]
    position = {int(r): i for i, r in enumerate(rows)}
    bar = tqdm(total=len(rows), desc="extract captions", unit="cap", disable=not progress)
    with _Writer(root, "text", overlap) as sink:
        for batch in writer.shard_batches(rows, batch_size(cfg, "text")):
            ids = enc.ids_from_bpe([bpe[position[int(r)]] for r in batch]).to(cfg.device)
            out = enc.encode_texts(ids)
            sink.put(
                batch,
                as_stored("text", {"ids": ids, "mask": out["mask"], "tokens": out["tokens"], "embed": out["embed"]}),
            )
            bar.update(len(batch))
    bar.close()


def _truncation(enc: Encoder, suite_cells: list, tokens: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    """Per suite, ``n_truncated``: captions longer than the context (cut to its first
    ``context_length - 2`` BPE tokens, eot kept); ``n_truncation_ties``: items with two
    captions in one column whose tokens differ but that the cut makes identical (their options
    score the same, whatever the scorer); and ``n_identical_options``: choice items two of whose
    options are one token sequence to begin with (the same caption, or one differing only in
    case, whitespace or characters the tokenizer drops), which tie without any cut. A tie
    counts as wrong under SugarCrepe's strict ``>`` and for the first option under ARO's
    argmax, so both kinds are reported rather than left to look like a scorer's error."""
    limit = enc.dims.context_length - 2  # sot and eot
    out = {}
    for src, columns, _ in suite_cells:
        keys = {k for modality, keyed in columns.values() if modality == "text" for ks in keyed for k in ks}
        n_long = sum(len(tokens[k]) > limit for k in keys)
        ties = 0
        for modality, keyed in columns.values():
            if modality != "text":
                continue
            for ks in keyed:
                cut = {tuple(tokens[k][:limit]) for k in set(ks)}
                ties += len(cut) < len({tuple(tokens[k]) for k in set(ks)})
        _, options = columns.get("captions", ("text", []))
        same = sum(len(ks) > 1 and len({tuple(tokens[k]) for k in ks}) < len(ks) for ks in options)
        out[src.suite] = {"n_truncated": int(n_long), "n_truncation_ties": int(ties), "n_identical_options": int(same)}
        if n_long:
            log.warning(
                "%s: %d caption(s) exceed the context of %d tokens and are cut (eot kept); %d item(s) tie because of it",
                src.suite, n_long, enc.dims.context_length, ties,
            )  # fmt: skip
        if same:
            log.warning(
                "%s: %d item(s) have two options with the same tokens; they tie whatever the scorer "
                "(n_identical_options in every metrics file); %s", src.suite, same, identical_options_advice(src.suite),
            )  # fmt: skip
    return out


def identical_options_advice(suite: str) -> str:
    """What to do about a suite's items with two identical options: nothing where its options
    are generated from the caption (``Suite.generated_options``, ARO Order), whose official
    perturbations can reproduce it; else fix the manifest's captions."""
    if suite in SUITES.names() and SUITES.get(suite).generated_options:
        return ("its options are generated from each caption, and a perturbation that reproduces the caption is part of the "
                "official benchmark: the tie is scored by the official rule, and there is nothing to fix")  # fmt: skip
    return "fix the manifest's captions"


def _restore_keys(root: zarr.Group, suite_cells: list, lost: dict[str, np.ndarray]) -> None:
    """Write back the content keys of rows whose key chunk was damaged, from the suite indexes
    of the suites being extracted (the store's index gives each item's rows, the manifest
    each item's keys); a row no current suite names keeps a zero key and is never matched.
    A damaged index is not used: its missing chunks would read as row 0 and give that row
    another row's key."""
    damaged = {d.array for d in integrity.whole_inventory(root)}
    for modality, rows in lost.items():
        wanted = set(rows.tolist())
        keys: dict[int, str] = {}
        for src, columns, sha in suite_cells:
            name = f"suites/{src.suite}"
            if name not in root or root[name].attrs.get("manifest_sha256") != sha:
                continue
            for col, (m, keyed) in columns.items():
                if m != modality or col not in root[name] or f"{name}/{col}" in damaged:
                    continue
                try:
                    index = root[name][col][...]  # [n_items, K]
                except Exception as e:  # noqa: BLE001 - a checksum failure: rewritten by finish
                    log.warning("%s/%s: not used to restore keys (%s: %s)", name, col, type(e).__name__, e)
                    continue
                for item_rows, ks in zip(index, keyed, strict=False):
                    keys.update({int(r): k for r, k in zip(item_rows, ks, strict=False) if k is not None and int(r) in wanted})
        if keys:
            found = np.array(sorted(keys), dtype=np.int64)
            values = np.stack([np.frombuffer(bytes.fromhex(keys[int(r)]), dtype=np.uint8) for r in found])
            root[f"{modality}/key"].set_orthogonal_selection((found,), values)
        unused = len(wanted) - len(keys)
        log.warning(
            "%s/key: restored %d of %d damaged keys from the suite indexes%s", modality, len(keys), len(wanted),
            f"; {unused} row(s) no intact index of the suites extracted names stay unused (a zero key matches no content; content they held gets a new row when extracted)" if unused else "",
        )
