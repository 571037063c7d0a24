"""Scoring suites from the feature cache: reading a suite's items and turning a scorer's
outputs into the ``[n, K]`` score arrays the official metrics take.

    from pipeline.scoring import suite_inputs, score_choice, score_retrieval
    manifest, index = suite_inputs(store, "shapes-aro")
    scores = score_choice(scorer, store, index, batch_size=256)   # [n, K_max], NaN pad
    shuffled = score_choice(scorer, store, index, 256, images=replacement_images(index, "shuffle"))

Never loads the backbone: every feature comes from the store. Features are read on the host
and each batch is moved to the scorer's device (:func:`pipeline.features.module_device`), so a
scorer moved to a GPU scores there; rerankers and their shortlists stay on the host. A suite's index is refused
when it is older than its manifest (hash), and items whose image was missing at extract
are left out and counted, never silently dropped from a denominator.

Two hooks serve the methods of methods.md §2-3:

* image replacement (Flow-CLIP's Shuffle / Fixed test): :func:`replacement_images` gives
  the image row each item is scored with instead of its own, and ``score_choice(...,
  images=rows)`` scores with them; a scorer that reads the image drops toward chance.
* retrieval rerankers (the geometry-aware rerankers): :func:`score_retrieval` shortlists
  each query's top-K gallery images with the reranker's base scorer, reranks only those,
  and merges both into one ranking (:func:`merge_reranked`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import Suite, extracted_items, gallery_images
from pipeline.cache import FeatureStore, StaleCacheError, distinct_rows
from pipeline.features import module_device, to_device
from pipeline.manifests import (
    cells,
    file_sha256,
    read_manifest,
    read_parquet_json,
    world_suite,
    write_parquet_json,
)
from pipeline.scorers import Scorer, create_scorer, option_scores
from pipeline.scorers.base import Reranker

REPLACEMENTS = ("true", "shuffle", "fixed")  # image-replacement modes of `replacement_images`
READ_CACHE_BYTES = 4 << 30  # store row blocks the score stage keeps across variants (the toy's whole store: ~1.4 GB)


def suite_inputs(store: FeatureStore, suite: str, manifest: str | Path | None = None) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """A suite's manifest and its row index, refusing an index older than the manifest.

    Args:
        manifest: the manifest the configuration names (``extract.manifests``, or the shapes
            world's); it must be the one the store indexed (same bytes), else the store is
            refused. None reads the manifest the store recorded.
    """
    attrs = store.suite_attrs(suite) if suite in store.suites() else {}
    index = store.suite_index(suite)  # raises with "run extract" when the suite is absent
    manifest_path = Path(manifest if manifest is not None else attrs["manifest"])
    if not manifest_path.is_file():
        build = "`pipeline world`" if world_suite(suite) else f"`pipeline manifest --suite {suite} --root DIR --out {manifest_path}`"
        raise FileNotFoundError(
            f"manifest of {suite} not found at {manifest_path}; rebuild it with {build}, or set "
            f"extract.manifests.{suite} to where it is now"
        )
    sha = file_sha256(manifest_path)
    if manifest is not None and sha != attrs.get("manifest_sha256"):
        raise StaleCacheError(
            f"{suite}: the configured manifest {manifest_path} is not the one {store.path} was "
            f"extracted from ({attrs.get('manifest')}, other bytes); rerun `pipeline extract` "
            f"with this configuration"
        )
    store.suite_index(suite, manifest_sha256=sha)
    df = read_manifest(manifest_path)
    SUITES.get(suite).check_manifest(df, f"{suite} manifest {manifest_path}")
    return df, index


def skip_reasons(manifest: pd.DataFrame, index: dict[str, np.ndarray], attrs: dict[str, Any], image_columns: tuple[str, ...]) -> dict[str, int]:
    """Why the items :func:`drop_missing` leaves out are left out: ``image_missing`` (no
    file at extract) or ``image_undecodable`` (corrupt, truncated, over the decompression
    limit: ``extract.skip_bad_images``), counted per item from the suite's extract record."""
    rows = index["image"] if index["image"].ndim == 2 else index["image"][:, None]
    dropped = np.flatnonzero((rows < 0).any(axis=1))
    bad = set(attrs.get("bad_images") or {})
    counts = {"image_missing": 0, "image_undecodable": 0}
    columns = [c for c in image_columns if c in manifest]
    for i in dropped:
        paths = {p for c in columns for p in cells([manifest[c].iloc[i]])[0]}
        counts["image_undecodable" if paths & bad else "image_missing"] += 1
    return counts


def drop_missing(manifest: pd.DataFrame, index: dict[str, np.ndarray]) -> tuple[pd.DataFrame, dict[str, np.ndarray], int]:
    """Items whose image was missing at extract (row -1) are left out, and counted."""
    keep = extracted_items(index)
    n_missing = int((~keep).sum())
    if n_missing == 0:
        return manifest, index, 0
    return manifest[keep].reset_index(drop=True), {k: v[keep] for k, v in index.items()}, n_missing


def item_image_rows(index: dict[str, np.ndarray]) -> np.ndarray:
    """[n] the store row of each item's own image (the suite's first image column)."""
    return index["image"][:, 0] if index["image"].ndim == 2 else index["image"]


def replacement_images(index: dict[str, np.ndarray], mode: str, seed: int = 0) -> np.ndarray:
    """[n] the image row each item is scored with under image replacement (Flow-CLIP).

    * ``true``: the item's own image.
    * ``shuffle``: the suite's own image rows, permuted (each image is used as often as
      before) so that no item keeps its own image row. Rows are content-addressed, so
      items that share an image, or whose images have the same content, share a row, and
      none of them receives it. The permutation is seeded: items are put in a random
      order, grouped by image (groups in a random order), and each takes the image ``m``
      places further round the circle, ``m`` the largest group; every group is then
      shifted past itself, which is possible exactly when no image is shared by more
      than half the items. With no shared images this is a uniformly random n-cycle.
    * ``fixed``: one image of the suite, drawn with ``seed``, for every item (the items
      whose own image it is keep it, as in Flow-CLIP's Fixed setting).

    Both draws run over the suite's images in order of first appearance
    (:func:`~pipeline.cache.distinct_rows`), so a fresh store and a grown one, whose row
    numbers differ, replace every item by the same image.

    Raises:
        ValueError: for an unknown ``mode`` (naming the valid ones), an item without an
            image (row -1; see :func:`drop_missing`), or a shuffle that cannot avoid every
            item's own image.
    """
    if mode not in REPLACEMENTS:
        raise ValueError(f"unknown image replacement {mode!r}; valid: {', '.join(REPLACEMENTS)}")
    own = np.asarray(item_image_rows(index), dtype=np.int64)  # [n]
    if (own < 0).any():
        raise ValueError(
            f"{int((own < 0).sum())} item(s) have no image (row -1); leave them out first (drop_missing)"
        )
    if mode == "true" or len(own) == 0:
        return own.copy()
    rng = np.random.default_rng(seed)
    images, image_of = distinct_rows(own)  # [U] by first appearance, [n] each item's: never by row number
    counts = np.bincount(image_of)  # [U]
    if mode == "fixed":
        return np.full(len(own), images[rng.integers(len(images))], dtype=np.int64)
    m = int(counts.max())
    if 2 * m > len(own):
        raise ValueError(
            f"shuffle cannot give every item another image: image row {int(images[counts.argmax()])} "
            f"is shared by {m} of {len(own)} items (more than half); use 'fixed' for this suite"
        )
    group = rng.permutation(len(images))[image_of]  # [n] random group label
    order = np.lexsort((rng.permutation(len(own)), group))  # [n] items by group, random within
    out = np.empty_like(own)
    out[order] = own[np.roll(order, -m)]  # circle position j takes position j + m's image
    return out


def choice_batch_rows(index: dict[str, np.ndarray], batch_size: int, images: np.ndarray | None = None):
    """A choice suite's store rows in batches of items with the same option count: yields
    (item positions [b], image rows [b], one caption-row array [b] per option). ``images``
    [n] replaces each item's own image row (see :func:`replacement_images`)."""
    img_rows = index["image"][:, 0] if images is None else np.asarray(images, dtype=np.int64)  # [n]
    cap_rows = index["captions"]  # [n, K_max], -1 = pad
    n_opts = (cap_rows >= 0).sum(1)  # [n]
    for k in np.unique(n_opts):
        items = np.flatnonzero(n_opts == k)
        for start in range(0, len(items), batch_size):
            b = items[start : start + batch_size]
            yield b, img_rows[b], [cap_rows[b, j] for j in range(k)]


def choice_batches(store: FeatureStore, index: dict[str, np.ndarray], batch_size: int, grids: bool, images: np.ndarray | None = None):
    """A choice suite read from the store in the batches of :func:`choice_batch_rows`:
    yields (item positions [b], image features, one text-feature batch per option)."""
    for b, img_rows, cap_rows in choice_batch_rows(index, batch_size, images):
        yield b, store.images(img_rows, grids=grids), [store.texts(rows, grids=grids) for rows in cap_rows]


@torch.no_grad()
def score_choice(scorer: Scorer, store: FeatureStore, index: dict[str, np.ndarray], batch_size: int, desc: str = "", images: np.ndarray | None = None, reference: int | None = None) -> np.ndarray:
    """[n, K_max] option scores (NaN pad) for a choice suite.

    ``images`` [n] scores item i with store image row ``images[i]`` instead of its own
    (image replacement: :func:`replacement_images`); None scores every item with its own.
    ``reference`` is the suite's ``Suite.pairwise_reference``: a pairwise scorer's option
    k then scores ``s(I, c_k, c_reference)`` (the layout its official test reads, e.g.
    SugarCrepe++ ITT), else the mean preference (:func:`pipeline.scorers.option_scores`).

    Options that are one caption (one store row: an ARO Order shuffle that reproduces the
    true caption) take the first such option's score, so they tie exactly as the official
    code's identical embeddings do; a pairwise scorer's mean preference would otherwise
    sum their terms in another float order and break the tie by rounding.
    """
    out = np.full(index["captions"].shape, np.nan, dtype=np.float64)
    if images is not None and np.shape(images) != (len(out),):
        raise ValueError(f"images must hold one image row per item, shape {(len(out),)}; got {np.shape(images)}")
    if not scorer.uses_grids:  # pooled embeddings only: a few KiB per item, read in one go
        batch_size = max(batch_size, len(out))
    n_opts = (index["captions"] >= 0).sum(1)
    n_batches = sum(-(-int(c) // batch_size) for c in np.unique(n_opts, return_counts=True)[1])
    device = module_device(scorer)
    for b, image, options in tqdm(choice_batches(store, index, batch_size, scorer.uses_grids, images), total=n_batches, desc=desc, leave=False, disable=not desc):
        image, options = to_device(image, device), to_device(options, device)
        scores = option_scores(scorer, image, options, reference).double().cpu().numpy()  # [b, k]
        refuse_nan(scores, f"{type(scorer).__name__}.option_scores", "item(s)", b)
        rows = index["captions"][b, : len(options)]  # [b, k]
        first = (rows[:, :, None] == rows[:, None, :]).argmax(2)  # [b, k] the first option of each caption
        out[b, : len(options)] = np.take_along_axis(scores, first, 1)
    return out


def retrieval_rows(manifest: pd.DataFrame, index: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Store rows of the gallery [n_gallery] (order of `gallery_images(manifest)`) and of
    the queries [n_queries] (each item's ``captions[0]``)."""
    first = {img: i for i, img in reversed(list(enumerate(manifest["image"])))}
    gallery_rows = np.array([index["image"][first[g], 0] for g in gallery_images(manifest)])
    return gallery_rows, index["captions"][:, 0]


GALLERY_BYTES = 4 << 30  # float32 gallery grids a grid scorer holds at once (ViT-L-14-336: ~900 images)


def gallery_block(store: FeatureStore, budget: int = GALLERY_BYTES) -> int:
    """How many gallery images' float32 grids (early and final) fit in ``budget`` bytes."""
    d = store.dims
    return max(1, budget // (4 * 2 * (d.grid[0] * d.grid[1] + 1) * d.d_v))


def gallery_scores(scorer: Scorer, store: FeatureStore, gallery_rows: np.ndarray, query_rows: np.ndarray, batch_size: int, budget: int = GALLERY_BYTES) -> np.ndarray:
    """[n_queries, n_gallery] ``score_matrix`` of every query against the whole gallery.

    A grid scorer reads the gallery in blocks of at most ``budget`` bytes
    (:func:`gallery_block`) and scores every query batch against each block, so its memory
    stays bounded on a 5,000-image ViT-L gallery; a pooled scorer's gallery (a few KiB an
    image) and a gallery that fits (the toy's) are one block. Every score is the same
    pairwise ``score_matrix`` entry either way.
    """
    device = module_device(scorer)
    block = gallery_block(store, budget) if scorer.uses_grids else max(len(gallery_rows), 1)
    out = np.empty((len(query_rows), len(gallery_rows)), dtype=np.float64)
    for g in range(0, len(gallery_rows), block):
        gallery = to_device(store.images(gallery_rows[g : g + block], grids=scorer.uses_grids), device)
        for start in range(0, len(query_rows), batch_size):
            texts = to_device(store.texts(query_rows[start : start + batch_size], grids=scorer.uses_grids), device)
            scores = scorer.score_matrix(gallery, texts).T.double().cpu().numpy()  # [b, block]
            refuse_nan(scores, f"{type(scorer).__name__}.score_matrix", "query(s)", np.arange(start, start + len(scores)))
            out[start : start + batch_size, g : g + block] = scores
    return out


def refuse_nan(scores: np.ndarray, source: str, what: str, positions: np.ndarray) -> None:
    """Raise when a scorer's ``scores`` [b, ...] hold NaN. The metrics read NaN as an absent
    option, ranked below every score, so a NaN on a wrong option or a distractor image would
    count the scorer's failure as a win; ``positions`` [b] are the rows' item or query
    positions in the suite, the first of which the message names."""
    bad = np.isnan(scores.reshape(len(scores), -1)).any(axis=1)
    if bad.any():
        raise ValueError(
            f"{source} returned NaN scores for {int(bad.sum())} {what} (the first at position "
            f"{int(positions[np.flatnonzero(bad)[0]])} of the suite); a scorer must give every option a number"
        )


def stable_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[Q, k] gallery positions of each row's k highest scores, best first.

    Ties keep gallery order (a stable sort); NaN sorts below every number, as the
    retrieval metric ranks it last. ``scores``: [Q, G].
    """
    s = torch.where(torch.isnan(scores), float("-inf"), scores)  # [Q, G]
    return torch.sort(s, dim=1, descending=True, stable=True).indices[:, :k]


def dense_rank(x: torch.Tensor) -> torch.Tensor:
    """[Q, K] float rank of each entry within its row, 0 = smallest; ties share a rank and
    the ranks are consecutive, so ``dense_rank`` is an exact, tie-preserving, strictly
    increasing transform of each row's values."""
    values, order = torch.sort(x, dim=1, stable=True)  # [Q, K]
    step = torch.zeros_like(values)
    step[:, 1:] = (values[:, 1:] != values[:, :-1]).to(values.dtype)
    return torch.empty_like(values).scatter_(1, order, step.cumsum(1))


def merge_reranked(base: torch.Tensor, shortlist: torch.Tensor, rerank: torch.Tensor) -> torch.Tensor:
    """[Q, G] one ranking: the shortlist in the reranker's order, above the rest in the
    base order.

    With ``o_q`` the largest finite base score of query q's non-shortlisted images (0 when
    there is none):

        final[q, j] = base[q, j]                                  j not shortlisted
        final[q, shortlist[q, k]] = o_q + 1 + dense_rank(rerank[q])[k]

    so every shortlisted image scores at least ``o_q + 1`` (above all the rest), the
    shortlist is ordered by the rerank scores with their ties kept as ties (the retrieval
    metric breaks ties pessimistically either way), and the rest keep their base scores.
    The shortlisted values are exact small integers above ``o_q``: only their order is
    meaningful, not their scale. An image whose base score ties exactly with the
    shortlist's last one but that :func:`stable_top_k` left out (gallery order decides)
    ranks below the whole shortlist, not tied with it: float cosines tie exactly only
    between identical images, and the shapes suites' CLIP scores have no such tie at the
    K = 20 boundary.

    Args:
        base: [Q, G] float64 base scores of every gallery image.
        shortlist: [Q, K] int64 gallery positions of each query's shortlist.
        rerank: [Q, K] rerank scores of the shortlisted images.
    """
    listed = torch.zeros_like(base, dtype=torch.bool).scatter_(1, shortlist, True)  # [Q, G]
    rest = torch.where(listed | ~torch.isfinite(base), float("-inf"), base)  # [Q, G]
    offset = rest.amax(1, keepdim=True) if base.shape[1] else base.new_zeros(len(base), 1)  # [Q, 1]
    offset = torch.where(torch.isfinite(offset), offset, 0.0)
    level = offset + 1.0 + dense_rank(rerank.to(base.dtype))  # [Q, K]
    return base.clone().scatter_(1, shortlist, level)


def base_scorer(reranker: Reranker, store: FeatureStore) -> Scorer:
    """The reranker's base scorer, built for ``store`` (untrained scorers only)."""
    base = create_scorer(reranker.base, dims=store.dims, proj=store.projections())
    if base.trainable:
        raise ValueError(
            f"{type(reranker).__name__}.base {reranker.base!r} is trained; pass "
            f"base=load_scorer({reranker.base!r}, store, checkpoints) to score_retrieval"
        )
    return base.eval()


@torch.no_grad()
def score_reranked(reranker: Reranker, base: Scorer, store: FeatureStore, gallery_rows: np.ndarray, query_rows: np.ndarray, batch_size: int) -> np.ndarray:
    """[n_queries, n_gallery] scores of a reranker over its base scorer's shortlists.

    The base scores the whole gallery; each query's top ``k`` (ties by gallery order) go
    to ``rerank``, in batches of ``max(1, batch_size // k)`` queries so that one call
    sees about ``batch_size`` (query, image) pairs; :func:`merge_reranked` merges them.
    A reranker that reads no grids gets its candidates and queries from the gallery's and
    the queries' pooled rows, read from the store once (a whole-gallery shortlist would
    otherwise read every gallery image again for each query); one that reads grids gets
    each batch's rows read for that batch only.
    """
    name = type(reranker).__name__
    if base.pairwise or base.reranker:
        raise ValueError(
            f"{name}.base {reranker.base!r} must be a per-caption scorer that ranks images, "
            f"not a {'pairwise scorer' if base.pairwise else 'reranker'}"
        )
    if isinstance(reranker.k, bool) or not isinstance(reranker.k, int) or reranker.k < 1:
        raise ValueError(f"{name}.k must be a positive int (shortlist length), got {reranker.k!r}")
    base_s = torch.from_numpy(gallery_scores(base, store, gallery_rows, query_rows, batch_size))  # [Q, G]
    k = min(reranker.k, len(gallery_rows))
    shortlist = stable_top_k(base_s, k)  # [Q, k] gallery positions
    reranked = torch.empty(shortlist.shape, dtype=torch.float64)  # [Q, k]
    step = max(1, batch_size // k)
    pooled = None if reranker.uses_grids else (store.images(gallery_rows, grids=False), store.texts(query_rows, grids=False))
    for start in range(0, len(query_rows), step):
        listed = shortlist[start : start + step]  # [b, k]
        ids, rows = torch.unique(listed, return_inverse=True)  # [U] gallery positions, [b, k] rows of ids
        if pooled is None:
            candidates = store.images(gallery_rows[ids.numpy()], grids=True)  # U images
            query = store.texts(query_rows[start : start + step], grids=True)
        else:
            candidates, query = pooled[0].index(ids), pooled[1].index(torch.arange(start, start + len(listed)))
        r = reranker.rerank(query, candidates, rows, gallery=ids, queries=torch.arange(start, start + len(listed)))
        if tuple(r.shape) != tuple(listed.shape):
            raise ValueError(f"{name}.rerank returned shape {tuple(r.shape)}, expected [Q, K] = {tuple(listed.shape)}")
        r = r.double().cpu()
        refuse_nan(r.numpy(), f"{name}.rerank", "query(s)", np.arange(start, start + len(listed)))
        reranked[start : start + len(listed)] = r
    return merge_reranked(base_s, shortlist, reranked).numpy()


@torch.no_grad()
def score_retrieval(scorer: Scorer, store: FeatureStore, manifest: pd.DataFrame, index: dict[str, np.ndarray], batch_size: int, base: Scorer | None = None, suite: str = "") -> np.ndarray:
    """[n_queries, n_gallery] scores; gallery order = `gallery_images(manifest)`.

    A per-caption scorer scores the whole gallery (``score_matrix``). A reranker
    (``scorer.reranker``) reranks the shortlists of its base scorer (:func:`score_reranked`);
    ``base`` is that scorer already built (e.g. a trained one from ``load_scorer``), else
    ``scorer.base`` is built from the registry; the reranker's ``prepare`` sees the suite
    (``suite`` names it in messages) before the first shortlist.
    """
    gallery_rows, query_rows = retrieval_rows(manifest, index)
    if scorer.pairwise:
        raise ValueError(f"{type(scorer).__name__} is a pairwise caption scorer; it cannot rank images")
    if scorer.reranker:
        base = base if base is not None else base_scorer(scorer, store)
        scorer.prepare(store, manifest, index, suite)
        return score_reranked(scorer, base, store, gallery_rows, query_rows, batch_size)
    return gallery_scores(scorer, store, gallery_rows, query_rows, batch_size)


def text_only_metrics(suite: Suite, store: FeatureStore, manifest: pd.DataFrame, index: dict[str, np.ndarray]) -> dict[str, float]:
    """A suite's text-only metrics (e.g. SugarCrepe++ TOT) from the cached pooled caption
    embeddings; they describe the frozen text encoder, so they are the same for every scorer."""
    if suite.text_units is None:
        return {}
    rows = index["captions"]  # [n, K]
    embeds = store.texts(rows.reshape(-1), grids=False).embed.reshape(*rows.shape, -1)  # [n, K, D]
    unit = torch.nn.functional.normalize(embeds, dim=-1).double().numpy()
    return {name: u.statistic() for name, u in suite.text_units(manifest, unit).items()}


def scores_array(table: pd.DataFrame) -> np.ndarray:
    """``[n, K_max]`` float scores of a scores table's ``scores`` column, NaN-padded."""
    rows = list(table["scores"])
    n = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))  # [rows] scores per row
    out = np.full((len(rows), int(n.max(initial=0))), np.nan)
    if n.sum():
        col = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # each score's place in its row
        out[np.repeat(np.arange(len(rows)), n), col] = np.concatenate(rows).astype(np.float64)
    return out


ORIGIN_KEY = b"pipeline.scored_from"  # the scores table's Parquet metadata: {"encoder", "store", "manifest_sha256"}


def write_scores(table: pd.DataFrame, path: Path, encoder: str, store_id: str | None, manifest_sha256: str | None = None) -> None:
    """Write a scores table as Parquet recording what it was scored from (the encoder key,
    the store's ``fingerprint_id`` and the sha256 of the suite's manifest file), so the report
    can refuse tables of mixed stores or of another manifest than the one it reads."""
    origin = {"encoder": encoder, "store": store_id, "manifest_sha256": manifest_sha256}
    write_parquet_json(table, path, ORIGIN_KEY, origin)


def scores_origin(path: str | Path) -> dict[str, Any] | None:
    """What a scores table was scored from (:func:`write_scores`); None when it records nothing."""
    return read_parquet_json(path, ORIGIN_KEY)


def load_scores(scores_out: str | Path, variant: str, suite: str) -> np.ndarray:
    """Read back the ``[n, K_max]`` scores the score stage wrote (NaN pad)."""
    return scores_array(pd.read_parquet(Path(scores_out) / variant / f"{suite}.parquet"))
