"""Stage `score`: evaluate scorers on suites straight from the feature cache.

Never loads the backbone: features come from the store (`pipeline.cache.FeatureStore`),
which is checked against the configured encoder (fingerprint) and each suite's manifest
(hash). Per-item scores go to Parquet under ``cache/scores``; metrics to
``reports/metrics/<variant>/<suite>.json`` (DVC metrics files).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import Suite, gallery_images
from pipeline.cache import FeatureStore
from pipeline.config import ExtractConfig, ScoreConfig
from pipeline.encoders import ENCODERS, resolve_pretrained
from pipeline.manifests import file_sha256, read_manifest
from pipeline.scorers import SCORERS, Scorer, create_scorer, option_scores
from stages.extract import store_path

log = logging.getLogger(__name__)


def expected_fingerprint(store: FeatureStore, extract: ExtractConfig) -> dict[str, Any]:
    """The store's fingerprint with the fields the current configuration determines
    recomputed (encoder, open_clip config and version, weights identity, early layer)."""
    import open_clip

    spec = ENCODERS.get(extract.model)
    fp = store.fingerprint
    fp.update(
        encoder=spec.name,
        open_clip_model=spec.open_clip_model,
        open_clip_version=open_clip.__version__,
        pretrained=resolve_pretrained(spec, extract.pretrained, extract.checkpoint),
        early_layer=spec.early_layer,
    )
    return fp


def open_store(extract: ExtractConfig) -> FeatureStore:
    """Open the configured encoder's store, refusing a stale or foreign one."""
    path = store_path(extract)
    store = FeatureStore.open(path)
    return FeatureStore.open(path, expect=expected_fingerprint(store, extract))


def checkpoint_dir(variant: str, cfg: ScoreConfig) -> Path:
    """Where a trained variant's weights live; ablations of a trained scorer (e.g.
    ``bindclip-lesion``) declare ``checkpoint_variant`` and share its locked parameters."""
    factory = SCORERS.get(variant)
    owner = getattr(factory, "checkpoint_variant", None) or variant
    return Path(cfg.checkpoints) / owner


def load_scorer(variant: str, store: FeatureStore, cfg: ScoreConfig, ckpt_dir: Path | None = None) -> Scorer:
    """Build ``variant`` for this store; trained scorers load their checkpoint and the
    scorer options chosen at training time (``config.json`` ``scorer_kwargs``, e.g. q0)."""
    scorer = create_scorer(variant, dims=store.dims, proj=store.projections())
    if not scorer.trainable:
        return scorer.eval()
    from safetensors.torch import load_file

    ckpt_dir = ckpt_dir or checkpoint_dir(variant, cfg)
    ckpt = ckpt_dir / "model.safetensors"
    if not ckpt.is_file():
        raise FileNotFoundError(
            f"{variant} is trained but {ckpt} does not exist; run `pipeline train --variant {ckpt_dir.name}`"
        )
    config = ckpt_dir / "config.json"
    kwargs = json.loads(config.read_text()).get("scorer_kwargs", {}) if config.is_file() else {}
    if kwargs:
        scorer = create_scorer(variant, dims=store.dims, proj=store.projections(), **kwargs)
    scorer.load_state_dict(load_file(ckpt))
    return scorer.eval()


def seed_checkpoints(variant: str, cfg: ScoreConfig) -> list[Path]:
    """Per-seed checkpoint folders of a trained variant (``<dir>/seed<k>/``)."""
    return sorted(p for p in checkpoint_dir(variant, cfg).glob("seed*") if (p / "model.safetensors").is_file())


def suite_inputs(store: FeatureStore, suite: str) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """A suite's manifest and its row index, refusing an index older than the manifest."""
    attrs = store.suite_attrs(suite) if suite in store.suites() else {}
    index = store.suite_index(suite)  # raises with "run extract" when the suite is absent
    manifest_path = Path(attrs["manifest"])
    if not manifest_path.is_file():
        raise FileNotFoundError(f"manifest of {suite} not found at {manifest_path}; run `pipeline world`")
    store.suite_index(suite, manifest_sha256=file_sha256(manifest_path))
    return read_manifest(manifest_path), index


def drop_missing(manifest: pd.DataFrame, index: dict[str, np.ndarray]) -> tuple[pd.DataFrame, dict[str, np.ndarray], int]:
    """Items whose image was missing at extract (row -1) are left out, and counted."""
    keep = (index["image"] >= 0).all(axis=1) if index["image"].ndim == 2 else index["image"] >= 0
    n_missing = int((~keep).sum())
    if n_missing == 0:
        return manifest, index, 0
    return manifest[keep].reset_index(drop=True), {k: v[keep] for k, v in index.items()}, n_missing


def choice_batches(store: FeatureStore, index: dict[str, np.ndarray], batch_size: int, grids: bool):
    """A choice suite read from the store in batches of items with the same option count:
    yields (item positions [b], image features, one text-feature batch per option)."""
    img_rows = index["image"][:, 0]  # [n]
    cap_rows = index["captions"]  # [n, K_max], -1 = pad
    n_opts = (cap_rows >= 0).sum(1)  # [n]
    for k in np.unique(n_opts):
        items = np.flatnonzero(n_opts == k)
        for start in range(0, len(items), batch_size):
            b = items[start : start + batch_size]
            yield b, store.images(img_rows[b], grids=grids), [store.texts(cap_rows[b, j], grids=grids) for j in range(k)]


@torch.no_grad()
def score_choice(scorer: Scorer, store: FeatureStore, index: dict[str, np.ndarray], batch_size: int, desc: str = "") -> np.ndarray:
    """[n, K_max] option scores (NaN pad) for a choice suite."""
    out = np.full(index["captions"].shape, np.nan, dtype=np.float64)
    if not scorer.uses_grids:  # pooled embeddings only: a few KiB per item, read in one go
        batch_size = max(batch_size, len(out))
    n_opts = (index["captions"] >= 0).sum(1)
    n_batches = sum(-(-int(c) // batch_size) for c in np.unique(n_opts, return_counts=True)[1])
    for b, image, options in tqdm(choice_batches(store, index, batch_size, scorer.uses_grids), total=n_batches, desc=desc, leave=False, disable=not desc):
        out[b, : len(options)] = option_scores(scorer, image, options).double().numpy()
    return out


@torch.no_grad()
def score_retrieval(scorer: Scorer, store: FeatureStore, manifest: pd.DataFrame, index: dict[str, np.ndarray], batch_size: int) -> np.ndarray:
    """[n_queries, n_gallery] scores; gallery order = `gallery_images(manifest)`."""
    first = {img: i for i, img in reversed(list(enumerate(manifest["image"])))}
    gallery_rows = np.array([index["image"][first[g], 0] for g in gallery_images(manifest)])
    query_rows = index["captions"][:, 0]
    if scorer.pairwise:
        raise ValueError(f"{type(scorer).__name__} is a pairwise caption scorer; it cannot rank images")
    gallery = store.images(gallery_rows, grids=scorer.uses_grids)
    blocks = []
    for start in range(0, len(query_rows), batch_size):
        texts = store.texts(query_rows[start : start + batch_size], grids=scorer.uses_grids)
        blocks.append(scorer.score_matrix(gallery, texts).T.double().numpy())  # [b, n_gallery]
    return np.concatenate(blocks)


def text_only_metrics(suite: Suite, store: FeatureStore, manifest: pd.DataFrame, index: dict[str, np.ndarray]) -> dict[str, float]:
    """A suite's text-only metrics (e.g. SugarCrepe++ TOT) from the cached pooled caption
    embeddings; they describe the frozen text encoder, so they are the same for every scorer."""
    if suite.text_units is None:
        return {}
    rows = index["captions"]  # [n, K]
    embeds = store.texts(rows.reshape(-1), grids=False).embed.reshape(*rows.shape, -1)  # [n, K, D]
    unit = torch.nn.functional.normalize(embeds, dim=-1).double().numpy()
    return {name: u.statistic() for name, u in suite.text_units(manifest, unit).items()}


def write_outputs(cfg: ScoreConfig, suite: Suite, variant: str, encoder: str, manifest: pd.DataFrame, scores: np.ndarray, n_missing: int = 0, extra: dict[str, float] | None = None) -> dict[str, Any]:
    """Per-item scores (Parquet) and the metrics file (JSON); returns the metrics record."""
    scores_path = Path(cfg.scores_out) / variant / f"{suite.name}.parquet"
    scores_path.parent.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(
        {
            "item_id": manifest["item_id"].astype(str).to_numpy(),
            "category": manifest["category"].astype(str).to_numpy(),
            "scores": [row[~np.isnan(row)].tolist() for row in scores],
        }
    )
    table.to_parquet(scores_path, index=False)
    record = {
        "suite": suite.name,
        "variant": variant,
        "encoder": encoder,
        "n_items": int(len(manifest)),
        "n_missing_images": n_missing,  # items left out because their image was missing
        "metrics": {k: round(float(v), 6) for k, v in {**suite.metrics(manifest, scores), **(extra or {})}.items()},
    }
    metrics_path = Path(cfg.metrics_out) / variant / f"{suite.name}.json"
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def load_scores(cfg: ScoreConfig, variant: str, suite: str) -> np.ndarray:
    """Read back ``[n, K_max]`` scores written by `write_outputs` (NaN pad)."""
    return scores_array(pd.read_parquet(Path(cfg.scores_out) / variant / f"{suite}.parquet"))


def scores_array(table: pd.DataFrame) -> np.ndarray:
    """``[n, K_max]`` float scores of a scores table's ``scores`` column, NaN-padded."""
    rows = [np.asarray(r, dtype=np.float64) for r in table["scores"]]
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def run(cfg: ScoreConfig, extract: ExtractConfig, progress: bool = True) -> list[dict[str, Any]]:
    """Score every (variant, suite) of ``cfg`` and write scores + metrics."""
    for variant in cfg.variants:
        SCORERS.get(variant)
    suites = [SUITES.get(s) for s in cfg.suites]
    store = open_store(extract)
    runs = [(v, v, None) for v in cfg.variants]  # (name in outputs, registry key, checkpoint)
    for variant in cfg.seed_variants:
        runs += [(f"{variant}@{d.name}", variant, d) for d in seed_checkpoints(variant, cfg)]
    records = []
    for name, variant, ckpt in runs:
        scorer = load_scorer(variant, store, cfg, ckpt)
        for suite in suites:
            manifest, index = suite_inputs(store, suite.name)
            manifest, index, n_missing = drop_missing(manifest, index)
            if n_missing:
                log.warning("%s: %d item(s) without an image are left out of every metric", suite.name, n_missing)
            if suite.task == "retrieval":
                if scorer.pairwise:
                    continue  # pairwise caption scorers do not rank images
                scores = score_retrieval(scorer, store, manifest, index, cfg.batch_size)
            else:
                desc = f"{name} {suite.name}" if progress else ""
                scores = score_choice(scorer, store, index, cfg.batch_size, desc)
            extra = text_only_metrics(suite, store, manifest, index)
            records.append(write_outputs(cfg, suite, name, extract.model, manifest, scores, n_missing, extra))
    return records
