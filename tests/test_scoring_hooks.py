"""The score stage's two hooks (pipeline.scoring): retrieval rerankers over a base scorer's
shortlist, and image replacement (true / shuffle / fixed), each checked with small dummy
scorers for the invariants the methods rely on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.benchmarks import SUITES
from pipeline.config import ExtractConfig, ScoreConfig
from pipeline.features import ImageFeatures, TextFeatures
from pipeline.scorers import SCORERS, Scorer, create_scorer
from pipeline.scorers.base import Reranker
from pipeline.scorers.clip import GlobalClip
from pipeline.scoring import (
    REPLACEMENTS,
    load_scores,
    merge_reranked,
    replacement_images,
    retrieval_rows,
    score_choice,
    score_retrieval,
    stable_top_k,
    suite_inputs,
)
from tests.conftest import extract_config_of

# ------------------------------------------------------------------------ dummy scorers


class ReverseReranker(Reranker):
    """Reverses its shortlist (the base's k-th best becomes best) and records every call."""

    uses_grids = False

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.k = k
        self.calls: list[dict] = []

    def rerank(self, query, candidates, shortlist, gallery=None, queries=None):
        self.calls.append({"n_query": len(query), "n_candidates": len(candidates), "shortlist": shortlist.clone(),
                           "gallery": gallery, "embed": candidates.embed.clone(), "final": candidates.final.clone(),
                           "tokens": query.tokens.clone(), "query_embed": query.embed.clone()})  # fmt: skip
        Q, K = shortlist.shape
        return torch.arange(K, dtype=torch.float32).expand(Q, K)  # [Q, K] last shortlisted first


class TableReranker(Reranker):
    """Rerank scores planted in a [n_queries, n_gallery] table; queries are named by their
    first token id, candidates by their gallery position."""

    uses_grids = False

    def __init__(self, table: np.ndarray, k: int) -> None:
        super().__init__()
        self.table, self.k = torch.as_tensor(table, dtype=torch.float64), k

    def rerank(self, query, candidates, shortlist, gallery=None, queries=None):
        q = query.ids[:, 0]  # [Q]
        return self.table[q[:, None], gallery[shortlist]]  # [Q, K]


class TextOnly(Scorer):
    """A per-caption scorer that ignores the image."""

    uses_grids = False

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        return text.embed.sum(-1)


class ImageProbe(Scorer):
    """A per-caption scorer that reads only the image: the first embedding coordinate."""

    uses_grids = False

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        return image.embed[:, 0] + 0 * text.embed[:, 0]


@pytest.fixture
def registered_reverse():
    """``reverse-test`` in the scorer registry for this test only."""
    SCORERS.names()
    SCORERS.register("reverse-test", lambda dims, proj, **kw: ReverseReranker(**kw))
    yield "reverse-test"
    SCORERS._entries.pop("reverse-test")


def _clip(store) -> Scorer:
    return create_scorer("clip", dims=store.dims, proj=store.projections()).eval()


def _ranking(scores: np.ndarray) -> np.ndarray:
    """[Q, G] gallery positions best first, ties by gallery order."""
    return np.argsort(-scores, axis=1, kind="stable")


# ------------------------------------------------------------------------ rerankers


@pytest.fixture(scope="module")
def retrieval_case(tiny_store):
    """shapes-train read as a retrieval suite: 16 queries over a 12-image gallery."""
    manifest, index = suite_inputs(tiny_store, "shapes-train")
    return tiny_store, manifest, index


@pytest.mark.parametrize("variant", ["clip", "local-max"])
def test_gallery_blocks_give_every_pair_its_one_block_score(retrieval_case, variant):
    from pipeline.scoring import gallery_block, gallery_scores

    store, manifest, index = retrieval_case
    gallery_rows, query_rows = retrieval_rows(manifest, index)
    scorer = create_scorer(variant, dims=store.dims, proj=store.projections()).eval()
    assert gallery_block(store) >= len(gallery_rows)  # the toy's gallery is one block
    d = store.dims
    row = 4 * 2 * (d.grid[0] * d.grid[1] + 1) * d.d_v  # float32 early + final grids
    assert gallery_block(store, budget=5 * row) == gallery_block(store, budget=6 * row - 1) == 5
    one = gallery_scores(scorer, store, gallery_rows, query_rows, batch_size=6)
    blocks = gallery_scores(scorer, store, gallery_rows, query_rows, batch_size=6, budget=5 * row)  # grids: 5 + 5 + 2
    assert one.shape == (len(query_rows), len(gallery_rows))
    np.testing.assert_allclose(blocks, one, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("batch_size", [4, 12, 256])
def test_reranker_reorders_the_shortlist_and_keeps_the_rest(retrieval_case, batch_size):
    store, manifest, index = retrieval_case
    k = 5
    base = score_retrieval(_clip(store), store, manifest, index, batch_size)  # [16, 12]
    reranker = ReverseReranker(k=k)
    final = score_retrieval(reranker, store, manifest, index, batch_size)
    assert final.shape == base.shape == (16, 12)
    base_order = _ranking(base)
    shortlist, rest = base_order[:, :k], base_order[:, k:]
    # (b) the shortlist follows the reranker (reversed), above (a) the rest in base order
    expected = np.concatenate([shortlist[:, ::-1], rest], axis=1)
    np.testing.assert_array_equal(_ranking(final), expected)
    assert (
        final[np.arange(16)[:, None], shortlist].min(1) > final[np.arange(16)[:, None], rest].max(1)
    ).all()
    np.testing.assert_array_equal(
        final[np.arange(16)[:, None], rest], base[np.arange(16)[:, None], rest]
    )
    # (c) each call sees exactly k candidates per query, and only the shortlisted images
    gallery_rows, query_rows = retrieval_rows(manifest, index)
    gallery_embed = store.images(gallery_rows, grids=False).embed  # [12, D]
    query_embed = store.texts(query_rows, grids=False).embed  # [16, D]
    assert sum(c["n_query"] for c in reranker.calls) == 16
    assert len(reranker.calls) == -(-16 // max(1, batch_size // k))
    start = 0
    for c in reranker.calls:
        sl = c["shortlist"]
        assert sl.shape == (c["n_query"], k)
        assert c["n_candidates"] == len(torch.unique(sl)) <= c["n_query"] * k
        want = shortlist[start : start + c["n_query"]]  # [b, k] gallery positions
        np.testing.assert_array_equal(c["gallery"][sl].numpy(), want)
        torch.testing.assert_close(
            c["embed"][sl], gallery_embed[torch.as_tensor(want)], rtol=0, atol=0
        )
        torch.testing.assert_close(c["query_embed"], query_embed[start : start + c["n_query"]], rtol=0, atol=0)  # each batch its own queries
        start += c["n_query"]


class GridReverseReranker(ReverseReranker):
    """:class:`ReverseReranker` that reads the grids."""

    uses_grids = True


def _rows_read(store, monkeypatch) -> dict[str, list[int]]:
    """Every image and text row the store hands out from now on, by modality."""
    read: dict[str, list[int]] = {"images": [], "texts": []}
    for name in read:
        method = getattr(type(store), name)

        def counted(self, rows, grids=True, _method=method, _name=name):
            read[_name].extend(np.asarray(rows).tolist())
            return _method(self, rows, grids=grids)

        monkeypatch.setattr(type(store), name, counted)
    return read


def test_a_pooled_reranker_reads_the_gallery_once_however_many_calls(retrieval_case, monkeypatch):
    """A whole-gallery shortlist (steering's over the gallery) reranked one query a call read
    every gallery image again for each query; a reranker without grids now gets them from
    the gallery's pooled rows, read once, so one call or sixteen read the same rows."""
    store, manifest, index = retrieval_case
    gallery_rows, query_rows = retrieval_rows(manifest, index)
    read = _rows_read(store, monkeypatch)
    counts = {}
    for batch_size in (4, 256):
        for rows in read.values():
            rows.clear()
        reranker = ReverseReranker(k=100)
        score_retrieval(reranker, store, manifest, index, batch_size, base=_clip(store))
        counts[batch_size] = (len(reranker.calls), len(read["images"]), len(read["texts"]))
    assert counts[4][0] == 16 and counts[256][0] == 1
    assert counts[4][1:] == counts[256][1:]
    assert counts[4][1] <= 2 * len(gallery_rows) and counts[4][2] <= 2 * len(query_rows)  # the base's read and the reranker's


def test_a_grid_reranker_gets_each_batchs_grids(retrieval_case):
    """A reranker that reads grids gets the candidates' and queries' grids, row for row
    the store's, and reorders its shortlist as the pooled path does."""
    store, manifest, index = retrieval_case
    gallery_rows, query_rows = retrieval_rows(manifest, index)
    pooled, grids = ReverseReranker(k=5), GridReverseReranker(k=5)
    np.testing.assert_array_equal(score_retrieval(pooled, store, manifest, index, 12), score_retrieval(grids, store, manifest, index, 12))
    call = grids.calls[0]
    assert call["n_query"] == 2 and call["n_candidates"] == len(torch.unique(call["shortlist"]))
    want = store.images(gallery_rows[call["gallery"].numpy()], grids=True)
    torch.testing.assert_close(call["final"], want.final, rtol=0, atol=0)
    torch.testing.assert_close(call["tokens"], store.texts(query_rows[:2], grids=True).tokens, rtol=0, atol=0)


def test_shortlist_as_large_as_the_gallery_reranks_everything(retrieval_case):
    store, manifest, index = retrieval_case
    base = score_retrieval(_clip(store), store, manifest, index, 256)
    reranker = ReverseReranker(k=100)
    final = score_retrieval(reranker, store, manifest, index, 256)
    (call,) = reranker.calls
    assert call["shortlist"].shape == (16, 12) and call["n_candidates"] == 12
    # (d) the whole gallery in the reranker's order: the base order reversed
    np.testing.assert_array_equal(_ranking(final), _ranking(base)[:, ::-1])


def test_retrieval_metric_on_reranked_scores_by_hand():
    """(e) A 4-image gallery, k = 2, base scores and rerank scores planted; the official
    metrics of the merged scores equal the ranks worked out by hand."""
    base = np.array(
        [
            [0.1, 0.4, 0.3, 0.2],  # q0 -> g0: shortlist {g1, g2}; g0 below g3 in the rest: rank 4
            [0.4, 0.3, 0.2, 0.1],  # q1 -> g1: shortlist {g0, g1}; reranker prefers g1: rank 1
            [0.3, 0.1, 0.4, 0.2],  # q2 -> g2: shortlist {g2, g0}; reranker prefers g0: rank 2
            [0.1, 0.2, 0.3, 0.4],  # q3 -> g3: shortlist {g3, g2}; a rerank tie, pessimistic: rank 2
        ]
    )
    table = np.array(
        [[9, 0, 0, 9], [0, 1, 9, 9], [5, 9, 1, 9], [9, 9, 2, 2]], dtype=float
    )  # 9: never seen

    class PlantedStore:
        """Gallery image g = one-hot e_g, query q's embedding = base[q], so clip's cosine
        orders each row like ``base``."""

        def images(self, rows, grids=True):
            e = torch.eye(4)[torch.as_tensor(rows)]
            return ImageFeatures(
                e.new_empty(len(e), 0, 1), e.new_empty(len(e), 0, 1), e.new_empty(len(e), 0), e
            )

        def texts(self, rows, grids=True):
            r = torch.as_tensor(rows)
            e = torch.as_tensor(base, dtype=torch.float32)[r]
            return TextFeatures(
                r[:, None], torch.ones(len(r), 1, dtype=torch.bool), torch.empty(len(r), 0, 1), e
            )

    manifest = pd.DataFrame({"item_id": [f"q{i}" for i in range(4)], "image": [f"g{i}.png" for i in range(4)],
                             "captions": [[f"query {i}"] for i in range(4)], "category": "all"})  # fmt: skip
    index = {"image": np.arange(4)[:, None], "captions": np.arange(4)[:, None]}
    scores = score_retrieval(
        TableReranker(table, k=2), PlantedStore(), manifest, index, 256, base=GlobalClip()
    )
    ranks = np.array([4, 1, 2, 2])
    metrics = SUITES.get("shapes-retrieval").metrics(manifest, scores)
    assert metrics["R@1"] == pytest.approx(0.25)
    assert metrics["R@5"] == metrics["R@10"] == pytest.approx(1.0)
    assert metrics["nDCG@10"] == pytest.approx(np.mean(1 / np.log2(1 + ranks)))
    plain = SUITES.get("shapes-retrieval").metrics(
        manifest, score_retrieval(GlobalClip(), PlantedStore(), manifest, index, 256)
    )
    assert plain["R@1"] == pytest.approx(0.5)  # base ranks 4, 2, 1, 1


def test_merge_reranked_construction():
    base = torch.tensor([[0.5, 3.0, -1.0, 2.0, float("nan")]], dtype=torch.float64)
    shortlist = torch.tensor([[1, 3]])
    out = merge_reranked(base, shortlist, torch.tensor([[-7.0, 4.0]]))
    # offset = max of the rest (0.5); shortlist = offset + 1 + dense rank of the rerank score
    torch.testing.assert_close(
        out,
        torch.tensor([[0.5, 1.5, -1.0, 2.5, float("nan")]], dtype=torch.float64),
        equal_nan=True,
    )
    tied = merge_reranked(base, shortlist, torch.tensor([[2.0, 2.0]]))
    assert tied[0, 1] == tied[0, 3] == 1.5  # rerank ties stay ties
    np.testing.assert_array_equal(
        stable_top_k(torch.tensor([[1.0, 2.0, 2.0, float("nan"), 2.0]]), 3), [[1, 2, 4]]
    )


def test_reranker_errors_name_the_bad_value(retrieval_case):
    store, manifest, index = retrieval_case
    with pytest.raises(ValueError, match=r"k must be a positive int.*got 0"):
        score_retrieval(ReverseReranker(k=0), store, manifest, index, 256)
    bad = ReverseReranker(k=3)
    bad.base = "bindclip"
    with pytest.raises(ValueError, match=r"base 'bindclip'"):
        score_retrieval(bad, store, manifest, index, 256)

    class WrongShape(ReverseReranker):
        def rerank(self, query, candidates, shortlist, gallery=None, queries=None):
            return torch.zeros(len(query))

    with pytest.raises(ValueError, match=r"returned shape \(16,\), expected \[Q, K\] = \(16, 3\)"):
        score_retrieval(WrongShape(k=3), store, manifest, index, 256)


class NaNOnItem(Scorer):
    """Frozen-CLIP-like scores with NaN for every caption of the item whose first token id is
    ``item`` (ids are unique per caption in the tiny store)."""

    uses_grids = False

    def __init__(self, ids: torch.Tensor) -> None:
        super().__init__()
        self.ids = ids

    def score(self, image: ImageFeatures, text: TextFeatures) -> torch.Tensor:
        s = (image.embed * text.embed).sum(-1)
        hit = (text.ids[:, None, :] == self.ids[None]).all(-1).any(-1)  # [b]
        return torch.where(hit, torch.nan, s)


def test_nan_scores_are_refused_never_read_as_absent_options(retrieval_case):
    """A NaN option score would be read as an absent option (ranked below every score), so a
    scorer failing on a wrong option would win; every scoring path refuses it instead,
    naming the source and the first item's position."""
    store, manifest, index = retrieval_case
    choice = suite_inputs(store, "shapes-dev")[1]
    wrong = store.texts(choice["captions"][[2], 1], grids=False).ids  # item 2's wrong option
    with pytest.raises(ValueError, match=r"NaNOnItem.option_scores returned NaN scores for 1 item\(s\) \(the first at position 2 "):
        score_choice(NaNOnItem(wrong), store, choice, 256)
    _, query_rows = retrieval_rows(manifest, index)
    query = store.texts(query_rows[[5]], grids=False).ids
    with pytest.raises(ValueError, match=r"NaNOnItem.score_matrix returned NaN scores for 1 query\(s\) \(the first at position 5 "):
        score_retrieval(NaNOnItem(query), store, manifest, index, 4)

    class NaNReranker(ReverseReranker):
        def rerank(self, query, candidates, shortlist, gallery=None, queries=None):
            out = super().rerank(query, candidates, shortlist).clone()
            out[queries == 7] = torch.nan
            return out

    with pytest.raises(ValueError, match=r"NaNReranker.rerank returned NaN scores for 1 query\(s\) \(the first at position 7 "):
        score_retrieval(NaNReranker(k=3), store, manifest, index, 6)


def test_options_of_one_caption_tie_exactly_under_a_pairwise_scorer(tiny_store):
    """An ARO Order shuffle can reproduce the true caption: both options are one store row,
    and, as the official code's identical embeddings do, they must tie exactly, though a
    pairwise scorer's mean preference sums their terms in another order."""
    from pipeline.scorers import create_scorer
    from pipeline.scoring import score_choice

    index = dict(tiny_store.suite_index("shapes-dev"))
    caps = index["captions"][:, :2]
    index["captions"] = np.concatenate([caps, caps[:, :1], caps[:, 1:]], axis=1)  # [n, 4]: 0 = 2, 1 = 3
    pairwise = create_scorer("bindclip", dims=tiny_store.dims, proj=tiny_store.projections(), h=16, n_iters=8).eval()
    assert pairwise.pairwise
    scores = score_choice(pairwise, tiny_store, index, 4)
    assert (scores[:, 0] == scores[:, 2]).all() and (scores[:, 1] == scores[:, 3]).all()
    assert (scores[:, 0] != scores[:, 1]).any()  # distinct captions keep their own scores


def test_reranker_scores_choice_items_as_one_image_shortlists(tiny_store, registered_reverse):
    _, index = suite_inputs(tiny_store, "shapes-dev")
    scorer = create_scorer(
        registered_reverse, dims=tiny_store.dims, proj=tiny_store.projections(), k=4
    )
    scores = score_choice(scorer, tiny_store, index, 256)
    np.testing.assert_array_equal(scores, np.zeros((8, 2)))  # the one candidate's reversed rank
    assert all(c["shortlist"].shape == (8, 1) and c["gallery"] is None for c in scorer.calls)


# ------------------------------------------------------------------------ image replacement


def _shared_images(rng: np.random.Generator, n: int) -> np.ndarray:
    """[n] image rows with repeats; no image on more than half the items."""
    while True:
        own = rng.integers(100, 100 + max(n, 6) // 3 + 2, n)
        if 2 * np.bincount(own).max() <= n:
            return own


@pytest.mark.parametrize("seed", range(5))
def test_shuffle_is_a_derangement_even_with_shared_images(seed):
    rng = np.random.default_rng(seed)
    cases = [_shared_images(rng, n) for n in (2, 3, 7, 16, 101)]
    cases += [
        np.array([5, 5, 5, 1, 2, 3]),
        np.arange(40) * 3,
        np.repeat([7, 9], 6),
    ]  # exactly half; distinct; two images
    for own in cases:
        index = {
            "image": np.stack([own, own[::-1]], axis=1)
        }  # [n, 2]: the first column is the item's
        out = replacement_images(index, "shuffle", seed=seed)
        assert out.shape == own.shape and out.dtype == np.int64
        assert (out != own).all(), own
        np.testing.assert_array_equal(
            np.sort(out), np.sort(own)
        )  # a permutation of the suite's images
        np.testing.assert_array_equal(
            out, replacement_images(index, "shuffle", seed=seed)
        )  # fixed by the seed


def test_shuffle_differs_across_seeds_and_refuses_impossible_suites():
    own = np.arange(50)
    draws = {
        tuple(replacement_images({"image": own[:, None]}, "shuffle", seed=s)) for s in range(5)
    }
    assert len(draws) == 5
    with pytest.raises(ValueError, match=r"image row 5 is shared by 3 of 5 items.*'fixed'"):
        replacement_images({"image": np.array([[5], [5], [5], [1], [2]])}, "shuffle")
    with pytest.raises(ValueError, match=r"shared by 1 of 1"):
        replacement_images({"image": np.array([[4]])}, "shuffle")


def test_items_sharing_an_image_are_served_alike():
    """Items that share an image stand in a random order within their group, so none of
    them is always the one served by the same neighbour: here the singleton image 2 reaches
    each of the two items of image 5 about a quarter of the time (a fixed order within the
    group would never give it to the second)."""
    own = np.array([5, 5, 1, 1, 2])
    draws = np.stack([replacement_images({"image": own[:, None]}, "shuffle", seed=s) for s in range(400)])
    share = (draws[:, :2] == 2).mean(0)  # [2] how often each item of image 5 gets image 2
    assert (share > 0.15).all() and abs(share[0] - share[1]) < 0.1, share


def test_true_and_fixed_rows_and_errors():
    own = np.array([3, 8, 8, 1, 5, 3])
    index = {"image": own[:, None]}
    np.testing.assert_array_equal(replacement_images(index, "true"), own)
    picked = set()
    for seed in range(20):
        fixed = replacement_images(index, "fixed", seed=seed)
        assert len(np.unique(fixed)) == 1 and fixed[0] in own and fixed.shape == own.shape
        picked.add(int(fixed[0]))
    assert len(picked) > 1  # the seed chooses the image
    with pytest.raises(
        ValueError, match=r"unknown image replacement 'swap'; valid: true, shuffle, fixed"
    ):
        replacement_images(index, "swap")
    with pytest.raises(ValueError, match=r"1 item\(s\) have no image"):
        replacement_images({"image": np.array([[3], [-1]])}, "fixed")


@pytest.mark.parametrize("mode", ["shuffle", "fixed"])
def test_replacement_follows_the_images_not_the_stores_row_numbers(mode):
    """The same suite in a store whose rows are numbered otherwise (a fresh store against a
    grown one) gets the same replacement image for every item: the draw is over the images
    in order of first appearance, never over the row numbers."""
    rng = np.random.default_rng(0)
    own = _shared_images(rng, 60)
    relabel = rng.permutation(1000)  # another store's row number for each row
    for seed in range(5):
        here = replacement_images({"image": own[:, None]}, mode, seed=seed)
        there = replacement_images({"image": relabel[own][:, None]}, mode, seed=seed)
        np.testing.assert_array_equal(relabel[here], there)


def test_distinct_rows_are_in_order_of_first_appearance():
    from pipeline.cache import distinct_rows

    rows, position = distinct_rows(np.array([[7, 3], [-1, 7], [2, 3], [9, -1]]))
    np.testing.assert_array_equal(rows, [7, 3, 2, 9])
    np.testing.assert_array_equal(position, [[0, 1], [-1, 0], [2, 1], [3, -1]])
    rows, position = distinct_rows(np.array([-1, -1]))
    assert rows.size == 0 and position.tolist() == [-1, -1]


def test_image_blind_scorer_is_unchanged_by_replacement(tiny_store):
    _, index = suite_inputs(tiny_store, "shapes-train")
    scorer = TextOnly()
    ref = score_choice(scorer, tiny_store, index, 4)
    for mode in REPLACEMENTS:
        np.testing.assert_array_equal(
            score_choice(scorer, tiny_store, index, 4, images=replacement_images(index, mode)), ref
        )


@pytest.mark.parametrize("mode", REPLACEMENTS)
def test_each_item_is_scored_with_its_replacement_image(tiny_store, mode):
    _, index = suite_inputs(tiny_store, "shapes-train")
    rows = replacement_images(index, mode, seed=3)
    scores = score_choice(ImageProbe(), tiny_store, index, 5, images=rows)
    want = tiny_store.images(rows, grids=False).embed[:, 0].double().numpy()  # [n]
    np.testing.assert_array_equal(scores, np.stack([want, want], axis=1))


def test_true_image_clip_equals_todays_scores_and_shuffle_changes_them(tiny_store):
    _, index = suite_inputs(tiny_store, "shapes-train")
    clip = _clip(tiny_store)
    today = score_choice(clip, tiny_store, index, 256)
    np.testing.assert_array_equal(
        score_choice(clip, tiny_store, index, 256, images=replacement_images(index, "true")), today
    )
    shuffled = score_choice(
        clip, tiny_store, index, 256, images=replacement_images(index, "shuffle")
    )
    assert not np.allclose(shuffled, today)
    with pytest.raises(ValueError, match=r"one image row per item, shape \(16,\); got \(3,\)"):
        score_choice(clip, tiny_store, index, 256, images=np.zeros(3, dtype=np.int64))


def _stage_configs(store, tmp_path: Path, **kw) -> tuple[ScoreConfig, ExtractConfig]:
    ext = extract_config_of(store, pretrained="none", out=str(Path(store.path).parent))  # random init
    cfg = ScoreConfig(variants=["clip"], suites=["shapes-dev", "shapes-train"], encoder="tiny-test",
                      scores_out=str(tmp_path / "scores"), metrics_out=str(tmp_path / "metrics"), **kw)  # fmt: skip
    return cfg, ext


def test_stage_writes_replacement_outputs(tiny_store, tmp_path):
    from stages import score as score_stage

    cfg, ext = _stage_configs(tiny_store, tmp_path / "a", replacements=["shuffle", "fixed"])
    records = score_stage.run(cfg, ext, progress=False)
    assert [(r["variant"], r["suite"]) for r in records] == [
        (v, s) for s in cfg.suites for v in ("clip", "clip@shuffle", "clip@fixed")
    ]
    for suite in cfg.suites:
        _, index = suite_inputs(tiny_store, suite)
        for mode in ("shuffle", "fixed"):
            metrics = json.loads(
                (tmp_path / "a" / "metrics" / f"clip@{mode}" / f"{suite}.json").read_text()
            )
            assert metrics["variant"] == f"clip@{mode}" and metrics["suite"] == suite
            want = score_choice(
                _clip(tiny_store), tiny_store, index, 256, images=replacement_images(index, mode)
            )
            np.testing.assert_allclose(
                load_scores(cfg.scores_out, f"clip@{mode}", suite), want, rtol=0, atol=0
            )
    # without replacements the stage writes exactly today's files, byte for byte
    plain, _ = _stage_configs(tiny_store, tmp_path / "b")
    score_stage.run(plain, ext, progress=False)
    files = sorted(
        p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file()
    )
    assert files == sorted(
        Path(d) / "clip" / f"{s}.{x}"
        for d, x in (("metrics", "json"), ("scores", "parquet"))
        for s in cfg.suites
    )
    for f in files:
        assert (tmp_path / "b" / f).read_bytes() == (tmp_path / "a" / f).read_bytes()
    with pytest.raises(
        ValueError, match=r"unknown score.replacements entry 'shufle'; valid: true, shuffle, fixed"
    ):
        score_stage.run(
            _stage_configs(tiny_store, tmp_path / "c", replacements=["shufle"])[0],
            ext,
            progress=False,
        )


def test_replacement_variants_narrow_which_variants_are_replaced(tiny_store, tmp_path):
    from stages import score as score_stage

    cfg, ext = _stage_configs(tiny_store, tmp_path, replacements=["fixed"], replacement_variants=["local-max"])
    cfg.variants = ["clip", "local-max"]
    cfg.suites = ["shapes-dev"]
    names = [r["variant"] for r in score_stage.run(cfg, ext, progress=False)]
    assert names == ["clip", "local-max", "local-max@fixed"]
    cfg.replacement_variants = ["bindclip"]
    with pytest.raises(ValueError, match=r"score.replacement_variants \['bindclip'\] are not in score.variants"):
        score_stage.run(cfg, ext, progress=False)


def test_per_seed_variants_and_suites_outside_the_scored_ones_are_refused_on_either_path(tiny_store, tmp_path, monkeypatch):
    """A single process would score ``bindclip@seed<k>`` for a seed variant ``score.variants``
    lacks while a cluster's per-(variant, suite) tasks never would: refused by both, before
    any store or cluster is opened."""
    import pipeline.distributed
    from pipeline import cli
    from stages import score as score_stage

    cfg, ext = _stage_configs(tiny_store, tmp_path)
    cfg.variants, cfg.suites, cfg.seed_variants = ["clip"], ["shapes-dev"], ["bindclip"]
    with pytest.raises(ValueError, match=r"score.seed_variants \['bindclip'\] are not in score.variants"):
        score_stage.run(cfg, ext, progress=False)
    monkeypatch.setattr(pipeline.distributed, "cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    with pytest.raises(ValueError, match=r"score.seed_variants \['bindclip'\] are not in score.variants"):
        cli._score_on(cfg, ext, "local:1", progress=False)
    cfg.seed_variants, cfg.seed_suites = [], ["shapes-aro"]
    with pytest.raises(ValueError, match=r"score.seed_suites \['shapes-aro'\] are not in score.suites"):
        cli._score_on(cfg, ext, "local:1", progress=False)


def test_scores_array_pads_ragged_rows_with_nan():
    from pipeline.scoring import scores_array

    table = pd.DataFrame({"scores": [[1.0, 2.0], [3.0], [], [4.0, 5.0, 6.0]]})
    want = np.array([[1, 2, np.nan], [3, np.nan, np.nan], [np.nan] * 3, [4, 5, 6]])
    np.testing.assert_array_equal(scores_array(table), want)
    assert scores_array(pd.DataFrame({"scores": []})).shape == (0, 0)
