"""The geometry-aware rerankers and steering (pipeline.scorers.geometry) on a tiny store
whose retrieval suite carries object boxes, phrases, relations and steering prompts."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.benchmarks import SUITES, Suite
from pipeline.benchmarks.retrieval import RETRIEVAL_METRICS, retrieval_units
from pipeline.scorers import SCORERS, create_scorer
from pipeline.scorers.geometry.objects import (
    ObjectSets,
    feature_cost,
    image_objects,
    offset_positions,
    relation_positions,
    structure,
)
from pipeline.scorers.geometry.rerankers import (
    UNMATCHED_COST,
    FGWReranker,
    matched_cost,
    rerank_scores,
)
from pipeline.scorers.geometry.ridge import (
    RidgeMap,
    fit_map,
    fit_ridge,
    r_squared,
    ranking_auc,
    reference_phrases,
    restrict_rank,
    training_pairs,
    whitening,
)
from pipeline.scoring import retrieval_rows, score_retrieval, suite_inputs
from pipeline.world.grounding import box_weights

COLOURS = ["red", "green", "blue", "yellow"]
SHAPES = ["circle", "square", "star", "cross"]
SUITE = "geo-test"
N = 10  # gallery images = queries


def _manifest(names: list[str]) -> pd.DataFrame:
    rng, spare = np.random.default_rng(0), np.random.default_rng(1)  # spare: the absent colours, after the rest
    rows = []
    for i, img in enumerate(names):
        c1, c2 = rng.choice(COLOURS, 2, replace=False)
        s1, s2 = rng.choice(SHAPES, 2, replace=False)
        a, b = f"{c1} {s1}", f"{c2} {s2}"
        x = rng.uniform(0.1, 0.3)
        rows.append(
            {
                "item_id": f"q{i}",
                "image": img,
                "captions": [f"a {a} left of a {b}"],
                "correct": 0,
                "category": "retrieval",
                "object_names": [a, b],
                "object_boxes": json.dumps([[x, 0.4, x + 0.2, 0.6], [x + 0.5, 0.4, x + 0.7, 0.6]]),
                "phrases": [a, b],
                "relations": json.dumps([[0, "left", 1]]),
                "steer_pos": [a, b],
                "steer_neg": [f"{c2} {s1}", f"{c1} {s2}"],
                "steer_neg_absent": [f"{c} {s}" for c, s in zip(spare.choice(sorted(set(COLOURS) - {c1, c2}), 2), (s1, s2), strict=True)],
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def geo(tmp_path_factory, tiny_encoder):
    """(store, manifest, index) of a 10-query retrieval suite with every object column."""
    from pipeline.cache import FeatureStore, store_path
    from pipeline.config import ExtractConfig
    from stages import extract as extract_stage
    from tests.conftest import make_images

    tmp = tmp_path_factory.mktemp("geo")
    names = make_images(tmp / "images", N)
    _manifest(names).to_parquet(tmp / "geo.parquet", index=False)
    SUITES.names()
    SUITES.register(SUITE, Suite(
        name=SUITE, task="retrieval", build_manifest=lambda root: pd.read_parquet(root),
        units=retrieval_units, metric_names=RETRIEVAL_METRICS, headline="R@1",
        caption_columns=("captions", "object_names", "phrases", "steer_pos", "steer_neg", "steer_neg_absent"),
    ))  # fmt: skip
    try:
        cfg = ExtractConfig(model="tiny-test", suites=[SUITE], manifests={SUITE: str(tmp / "geo.parquet")},
                            image_roots={SUITE: str(tmp / "images")}, out=str(tmp / "features"), batch_size=16)  # fmt: skip
        extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
        store = FeatureStore.open(store_path(cfg))
        manifest, index = suite_inputs(store, SUITE)
        yield store, manifest, index
    finally:
        SUITES._entries.pop(SUITE)


def _scorer(name, store, **kw):
    return create_scorer(name, dims=store.dims, proj=store.projections(), **kw).eval()


def test_object_embedding_is_the_projected_area_weighted_patch_mean_over_the_box(geo):
    store, manifest, index = geo
    gallery_rows, _ = retrieval_rows(manifest, index)
    boxes = [np.array(json.loads(b)) for b in manifest["object_boxes"]]
    sets = image_objects(store, gallery_rows, boxes)
    feats = store.images(gallery_rows[:1])
    w = box_weights(torch.tensor(boxes[0], dtype=torch.float32), store.dims.grid)[1]  # object 1: [R]
    assert 0 < int((w > 0).sum()) < len(w)  # the box covers some patches, not all
    want = (w @ (feats.final[0] @ store.projections().visual_proj)) / w.sum()
    torch.testing.assert_close(sets.embed[0, 1], want / want.norm(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sets.pos[0, 1], torch.tensor((boxes[0][1, :2] + boxes[0][1, 2:]) / 2, dtype=torch.float32))


def test_every_object_of_every_image_is_its_own_box_mean_across_batches(geo):
    """Box means are computed a batch of images at a time: each object, in images with
    other object counts (none included) and across batch boundaries, is its own image's
    area-weighted box mean, in its own place."""
    store, manifest, index = geo
    gallery_rows, _ = retrieval_rows(manifest, index)
    boxes = [np.array(json.loads(b)) for b in manifest["object_boxes"]]
    boxes = [b[: i % 3] if i % 4 else b for i, b in enumerate(boxes)]  # 0, 1, 2 or all objects
    assert {len(b) for b in boxes} >= {0, 1, 2}
    sets = image_objects(store, gallery_rows, boxes, batch_size=3)
    joint = store.images(gallery_rows).final @ store.projections().visual_proj  # [G, R, D]
    for g, b in enumerate(boxes):
        assert sets.mask[g].sum() == len(b)
        if len(b):
            w = box_weights(torch.tensor(b, dtype=torch.float32), store.dims.grid)  # [m, R]
            want = torch.nn.functional.normalize((w @ joint[g]) / w.sum(1, keepdim=True), dim=-1)
            torch.testing.assert_close(sets.embed[g, : len(b)], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("relation", "same_as"), [
    ("sitting on", "on"), ("Standing  on top of", "on top of"), ("parked to the left of", "left"),
    ("hanging above", "above"), ("atop", "on"), ("onto", "on"), ("underneath", "under"), ("lying beneath", "under"),
])  # fmt: skip
def test_relations_with_a_posture_or_another_spatial_word_place_like_their_spatial_part(relation, same_as):
    """The caption splitter's and Visual Genome's posture forms ("sitting on") and the other
    spatial words the splitter keeps give the query a layout; without one the query's
    structure is zero and FGW drops the structure term for it."""
    placed = relation_positions([(0, relation, 1)], 2)[1]
    assert placed.abs().sum() > 0 and torch.equal(placed, relation_positions([(0, same_as, 1)], 2)[1])


def test_non_directional_relations_place_nothing():
    for relation in ("standing next to", "behind", "holding", "sitting"):
        assert relation_positions([(0, relation, 1)], 2).abs().sum() == 0, relation


def test_relation_layout_and_structures():
    pos = relation_positions([(0, "left", 1), (1, "above", 2)], 3)
    torch.testing.assert_close(pos, torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]))
    assert relation_positions([(0, "right", 1)], 2)[1].tolist() == [-1.0, 0.0]
    sets = ObjectSets(torch.zeros(2, 3, 4), torch.tensor([[True, True, False], [True, True, True]]),
                      torch.tensor([[[0.0, 0.0], [0.5, 0.0], [9.0, 9.0]], [[0.0, 0.0], [0.0, 2.0], [1.0, 0.0]]]))  # fmt: skip
    off, dist = structure(sets, "offset"), structure(sets, "distance")
    assert off.shape == (2, 3, 3, 2) and dist.shape == (2, 3, 3, 1)
    torch.testing.assert_close(off, -off.transpose(1, 2))  # offsets are antisymmetric
    torch.testing.assert_close(dist, dist.transpose(1, 2))
    assert off[0, 2].abs().sum() == 0 and off[0, :, 2].abs().sum() == 0  # padding is zero
    assert off.abs().flatten(1).amax(1).tolist() == [1.0, 1.0]  # scaled per set
    mirrored = ObjectSets(sets.embed, sets.mask, sets.pos * torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(structure(mirrored, "distance"), dist)  # blind to reflection
    assert not torch.allclose(structure(mirrored, "offset"), off)
    with pytest.raises(ValueError, match="unknown structure"):
        structure(sets, "angles")


def test_offset_positions_give_the_offset_structure_and_sit_at_0_without_offsets():
    # set 0: three real objects and padding; set 1: one object; set 2: two boxes centred at one point
    sets = ObjectSets(torch.zeros(3, 3, 4), torch.tensor([[True, True, True], [True, False, False], [True, True, False]]),
                      torch.tensor([[[0.2, 0.1], [0.6, 0.1], [0.3, 0.9]], [[0.13, 0.71], [5.0, 5.0], [0.0, 0.0]],
                                    [[0.13, 0.71], [0.13, 0.71], [7.0, 7.0]]]))  # fmt: skip
    x = offset_positions(sets)
    off = x[:, None, :, :] - x[:, :, None, :]  # [N, n, n, 2]: x_k - x_i
    pair = (sets.mask[:, :, None] & sets.mask[:, None, :])[..., None]
    torch.testing.assert_close(torch.where(pair, off, 0.0), structure(sets, "offset"))
    assert x[1:].abs().max() < 1e-6  # not the centres over the scale's 1e-6 floor (1e5 and more)
    assert (x[~sets.mask] == 0).all()


def test_matched_cost_ignores_padding_and_finds_the_planted_matching():
    rng = np.random.default_rng(0)
    perm = rng.permutation(5)
    cost = torch.from_numpy(rng.uniform(0.5, 1.0, (1, 5, 7)))
    cost[0, np.arange(5), perm] = 0.1  # the planted matching
    rows = torch.ones(1, 5, dtype=torch.bool)
    cols = torch.tensor([[True] * 5 + [False] * 2])
    cost[0, :, 5:] = -10.0  # padded columns would be the cheapest if they were allowed
    torch.testing.assert_close(matched_cost(cost, rows, cols), torch.tensor([0.1], dtype=torch.float64))


def _sets(embeds: list[list[list[float]]], pos: list[list[list[float]]]) -> ObjectSets:
    """Padded object sets from per-set lists of unit 2-D embeddings and positions."""
    n = max([len(e) for e in embeds] + [1])
    out = ObjectSets(torch.zeros(len(embeds), n, 2), torch.zeros(len(embeds), n, dtype=torch.bool), torch.zeros(len(embeds), n, 2))
    for i, (e, p) in enumerate(zip(embeds, pos, strict=True)):
        if e:
            out.embed[i, : len(e)], out.mask[i, : len(e)], out.pos[i, : len(e)] = torch.tensor(e), True, torch.tensor(p)
    return out


A, B = [1.0, 0.0], [0.0, 1.0]  # two unit phrase/object embeddings, orthogonal


def test_matched_cost_charges_a_phrase_without_an_object_the_worst_cost():
    # a query of two phrases against: the exact pair, one of the two, and no object at all
    q = _sets([[A, B]] * 3, [[[0, 0], [1, 0]]] * 3)
    c = _sets([[A, B], [A], []], [[[0.2, 0.5], [0.8, 0.5]], [[0.2, 0.5]], []])
    cost = 1.0 - torch.einsum("bnd,bmd->bnm", q.embed, c.embed).double()
    got = matched_cost(cost, q.mask, c.mask)
    torch.testing.assert_close(got, torch.tensor([0.0, UNMATCHED_COST / 2, UNMATCHED_COST], dtype=torch.float64))
    assert got[0] < got[1] < got[2]  # the empty image no longer looks like a perfect match


def test_fgw_ranks_a_candidate_without_objects_last_and_does_not_fail():
    q = _sets([[A, B]] * 3, [[[0, 0], [1, 0]]] * 3)  # "A left of B"
    c = _sets([[], [A, B], [B, A]], [[], [[0.2, 0.5], [0.8, 0.5]], [[0.2, 0.5], [0.8, 0.5]]])
    value = FGWReranker().fgw(q, c)
    assert torch.isinf(value[0]) and torch.isfinite(value[1:]).all()
    scores = rerank_scores(value, q, c, (1, 3))
    assert scores.argmax() == 1 and scores.argmin() == 0  # exact layout first, empty last


def test_a_query_without_structure_is_matched_on_features_alone():
    """One phrase per object and no directional relation: a zero query structure, which with
    alpha > 0 would penalise the exact image for its objects being spread out."""
    q = _sets([[A, B]] * 2, [[[0, 0], [0, 0]]] * 2)  # "A and B": both at the origin
    c = _sets([[A, B], [A]], [[[0.1, 0.5], [0.9, 0.5]], [[0.5, 0.5]]])  # exact pair vs A alone
    value = FGWReranker(alpha=0.5).fgw(q, c)
    assert value[0] < value[1]
    torch.testing.assert_close(value[0], torch.tensor(0.0, dtype=torch.float64))  # features match exactly


def _order(scores: torch.Tensor) -> list[list[int]]:
    """Each row's candidates best first; a tie would make the stable sort hide it, so none
    is allowed."""
    assert all(len(set(row.tolist())) == len(row) for row in scores), f"ties in {scores}"
    return scores.argsort(dim=1, descending=True, stable=True).tolist()


def test_a_query_without_phrases_keeps_the_shortlist_order():
    q = _sets([[], [A]], [[], [[0, 0]]])  # query 0 has no phrases, query 1 one
    cost = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.1, 0.9], dtype=torch.float64)  # [Q * K], K = 3
    q_pairs = q.index(torch.tensor([0, 0, 0, 1, 1, 1]))
    c = _sets([[A]] * 6, [[[0, 0]]] * 6)
    assert _order(rerank_scores(cost, q_pairs, c, (2, 3))) == [[0, 1, 2], [1, 0, 2]]


def test_candidates_without_objects_rank_last_in_the_shortlist_order():
    """Every candidate of query 0 lacks objects (infinite FGW cost, or the worst matching
    cost for Hungarian): the costs say nothing, and ranking by them would tie the target
    with the rest (last under the pessimistic tie rule), so the shortlist's order stays.
    Query 1's second and third candidates lack objects: they rank below the first, in the
    shortlist's order, whatever their costs; real costs still rank the rest."""
    q = _sets([[A], [A]], [[[0, 0]], [[0, 0]]]).index(torch.tensor([0, 0, 0, 1, 1, 1, 1]))
    c = _sets([[], [], [], [A], [], [], [B]], [[], [], [], [[0, 0]], [], [], [[0, 0]]])
    inf = float("inf")
    fgw = torch.tensor([inf, inf, inf, 0.5, inf, inf, 0.1], dtype=torch.float64)
    hungarian = torch.tensor([2.0, 2.0, 2.0, 0.5, 2.0, 2.0, 0.1], dtype=torch.float64)
    first, second = torch.arange(3), torch.arange(3, 7)
    for cost in (fgw, hungarian):
        assert _order(rerank_scores(cost[first], q.index(first), c.index(first), (1, 3))) == [[0, 1, 2]]
        assert _order(rerank_scores(cost[second], q.index(second), c.index(second), (1, 4))) == [[3, 0, 1, 2]]


@pytest.mark.parametrize("name", ["fgw", "hungarian", "fgw-hungarian", "ridge-fgw", "steer", "steer-multi"])
def test_rerankers_never_change_the_order_outside_the_shortlist(geo, name):
    """Every reranker (ridge-fgw with a random map, steering with a large beta, so each
    reorders its shortlist) leaves the gallery outside CLIP's top K in CLIP's order."""
    store, manifest, index = geo
    base = score_retrieval(_scorer("clip", store), store, manifest, index, 7)  # the batches the shortlist sees
    scorer = _scorer(name, store, k=4, **({"beta": 3.0} if name.startswith("steer") else {}))
    if name == "ridge-fgw":
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            scorer.weight.copy_(torch.randn(scorer.weight.shape, generator=g))
            scorer.bias.copy_(torch.randn(scorer.bias.shape, generator=g))
    final = score_retrieval(scorer, store, manifest, index, 7)
    order = np.argsort(-base, axis=1, kind="stable")
    assert (np.argsort(-final, axis=1, kind="stable")[:, :4] != order[:, :4]).any()  # the shortlist was reordered
    top, rest = order[:, :4], order[:, 4:]
    rows = np.arange(N)[:, None]
    np.testing.assert_array_equal(final[rows, rest], base[rows, rest])
    assert (final[rows, top].min(1) > final[rows, rest].max(1)).all()
    assert set(retrieval_units(manifest, final)) == set(RETRIEVAL_METRICS)


def test_offset_structures_are_solved_as_one_exact_ot_with_fgws_values(geo):
    """The rerankers solve signed-offset FGW by one exact OT on positions; every pair's value
    is the conditional-gradient FGW of the same offset structures (to float32 input rounding)."""
    from pipeline.ot import fused_gromov_wasserstein_batched
    from pipeline.scorers.geometry.objects import feature_cost

    store, manifest, index = geo
    s = _scorer("fgw", store, k=N)
    s.prepare(store, manifest, index, SUITE)
    q, c = s.pairs(torch.arange(N).repeat(N, 1), torch.arange(N), torch.arange(N))
    p, w = (x.mask.double() / x.mask.sum(1, keepdim=True) for x in (q, c))
    want, _ = fused_gromov_wasserstein_batched(
        feature_cost(q, c).double(), structure(q).double(), structure(c).double(), p, w, alpha=s.alpha
    )
    torch.testing.assert_close(s.fgw(q, c), want, atol=1e-6, rtol=0)
    assert structure(q).abs().amax() > 0  # the queries have layouts: the structure term is on


def test_alpha_zero_fgw_ranks_like_optimal_transport_on_features(geo):
    """With alpha = 0 FGW is OT on the feature cost; for two objects per side and uniform
    weights the optimal plan is a matching, so its order equals Hungarian's."""
    store, manifest, index = geo
    a = score_retrieval(_scorer("fgw", store, k=N, alpha=0.0), store, manifest, index, 256)
    b = score_retrieval(_scorer("hungarian", store, k=N), store, manifest, index, 256)
    np.testing.assert_array_equal(np.argsort(-a, 1, kind="stable"), np.argsort(-b, 1, kind="stable"))


def test_fgw_hungarian_puts_hungarians_pick_first_then_the_fgw_order(geo):
    store, manifest, index = geo
    fgw = score_retrieval(_scorer("fgw", store, k=N), store, manifest, index, 256)
    hun = score_retrieval(_scorer("hungarian", store, k=N), store, manifest, index, 256)
    both = score_retrieval(_scorer("fgw-hungarian", store, k=N, top=3), store, manifest, index, 256)
    for q in range(N):
        top3 = np.argsort(-fgw[q], kind="stable")[:3]
        pick = top3[np.argmax(hun[q, top3])]
        order = np.argsort(-both[q], kind="stable")
        assert order[0] == pick
        np.testing.assert_array_equal(order[1:], [g for g in np.argsort(-fgw[q], kind="stable") if g != pick])


def test_ridge_recovers_a_planted_map_and_loads_like_a_checkpoint(geo, tmp_path):
    g = torch.Generator().manual_seed(0)
    P = torch.randn(200, 8, generator=g)
    A, c = torch.randn(8, 6, generator=g), torch.randn(6, generator=g)
    W, b = fit_ridge(P, P @ A + c, lam=0.0)
    torch.testing.assert_close(W, A, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b, c, atol=1e-4, rtol=1e-4)
    assert r_squared(P, P @ A + c, W, b) == pytest.approx(1.0)
    W1, _ = fit_ridge(P, P @ A + c, lam=1e4)
    assert W1.norm() < 0.5 * A.norm()  # the penalty shrinks the map
    store, manifest, index = geo
    phr, obj, image = training_pairs(store, manifest, index, SUITE)
    assert phr.shape == obj.shape == (2 * N, store.dims.embed_dim)
    assert image.tolist() == [i for i in range(N) for _ in range(2)]
    _, early, _ = training_pairs(store, manifest, index, SUITE, layer="early")
    assert early.shape == (2 * N, store.dims.d_v)
    with pytest.raises(ValueError, match="object_boxes"):
        training_pairs(store, manifest.drop(columns="object_boxes"), index, SUITE)


def test_training_pairs_leave_out_the_phrases_of_objects_the_view_cuts_away(geo):
    """A wide image's centre crop hides a box at its edge: the pair of that object goes (its
    phrase with it), every other phrase stays paired with its own object."""
    store, manifest, index = geo
    wide = manifest.copy()
    wide["image_size"] = [[64.0, 64.0]] * len(wide)
    wide.at[0, "image_size"] = [400.0, 100.0]  # the centre square keeps x in [0.375, 0.625]
    wide.at[0, "object_boxes"] = json.dumps([[0.0, 0.2, 0.1, 0.8], [0.4, 0.2, 0.6, 0.8]])
    phr, obj, image = training_pairs(store, wide, index, SUITE)
    assert phr.shape == (2 * N - 1, store.dims.embed_dim) and obj.shape[0] == 2 * N - 1
    assert image.tolist() == [0] + [i for i in range(1, N) for _ in range(2)]
    names = index["object_names"].reshape(len(wide), -1)
    kept = np.concatenate([names[0, 1:2], names[1:].reshape(-1)])
    expected = torch.nn.functional.normalize(store.texts(kept, grids=False).embed, dim=-1)
    torch.testing.assert_close(phr, expected)
    fit_map(phr, obj, lam=0.1, shrinkage=0.1)  # they pair up, so the fit runs


def _identity_map(d: int) -> RidgeMap:
    return RidgeMap(torch.eye(d), torch.zeros(d), torch.zeros(d), torch.eye(d))


def test_ranking_auc_counts_pairs_of_different_phrases():
    P, fitted = torch.eye(2), _identity_map(2)  # the map is the identity
    assert ranking_auc(P, torch.eye(2), fitted) == 1.0  # each phrase nearest its own object
    assert ranking_auc(P, torch.eye(2).flip(0), fitted) == 0.0  # objects swapped
    assert ranking_auc(P, torch.tensor([[1.0, 0.0], [1.0, 0.0]]), fitted) == 0.0  # ties lose
    P3 = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # phrases 0 and 1 are one phrase
    Y3 = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    # pairs of different phrases: (0,2) 0<1 no, (1,2) 0<1 yes, (2,0) 1<1 no, (2,1) 0<1 yes
    assert ranking_auc(P3, Y3, fitted) == 0.5
    # a pair mask counts its pairs only: (1,2) alone is right, (0,2) alone wrong
    only = torch.zeros(3, 3, dtype=torch.bool)
    assert ranking_auc(P3, Y3, fitted, pairs=only.index_put((torch.tensor([1]), torch.tensor([2])), torch.tensor(True))) == 1.0
    assert ranking_auc(P3, Y3, fitted, pairs=only.index_put((torch.tensor([0]), torch.tensor([2])), torch.tensor(True))) == 0.0


def test_object_sets_take_new_embeddings_zero_where_padded():
    sets = ObjectSets(torch.ones(1, 3, 2), torch.tensor([[True, False, True]]), torch.rand(1, 3, 2))
    out = sets.with_embed(torch.full((1, 3, 4), 2.0))
    assert out.embed.shape == (1, 3, 4) and out.embed[0, 1].eq(0).all() and out.embed[0, [0, 2]].eq(2).all()
    assert torch.equal(out.mask, sets.mask) and torch.equal(out.pos, sets.pos)
    offset = sets.with_embed(torch.full((1, 3, 4), 2.0), torch.tensor([[0.5, 0.7, -0.2]]))
    assert torch.equal(offset.offset, torch.tensor([[0.5, 0.0, -0.2]]))  # zero where padded
    assert torch.equal(offset.index(torch.tensor([0, 0])).offset, offset.offset.expand(2, 3))


def test_hub_offset_is_the_inverted_softmax_log_normaliser_over_the_reference(monkeypatch):
    """h(o) = log(sum_v exp(beta r_v . o)) / beta, by hand on two reference phrases, whatever
    number of objects is held at once; 0 at beta 0 or with no reference; a negative beta
    refused."""
    import pipeline.scorers.geometry.ridge as ridge

    reference = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    fitted = RidgeMap(torch.eye(2), torch.zeros(2), torch.zeros(2), torch.eye(2), reference)
    objects = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    want = torch.tensor([np.log(np.exp(2.0) + 1.0) / 2, np.log(np.exp(1.2) + np.exp(1.6)) / 2], dtype=torch.float32)
    torch.testing.assert_close(fitted.hub_offset(objects, 2.0), want)
    monkeypatch.setattr(ridge, "OFFSET_ROWS", 1)  # one object at a time
    torch.testing.assert_close(fitted.hub_offset(objects[None], 2.0), want[None])
    assert fitted.hub_offset(objects, 0.0).eq(0).all() and fitted.hub_offset(objects[None], 0.0).shape == (1, 2)
    assert _identity_map(2).hub_offset(objects, 2.0).eq(0).all()  # no reference phrases
    with pytest.raises(ValueError, match="beta must be >= 0"):
        fitted.hub_offset(objects, -1.0)


def test_reference_phrases_are_the_distinct_phrases_most_frequent_first():
    a, b, c = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.6, 0.8])
    P = torch.stack([c, b, a, a, b, a])
    assert torch.equal(reference_phrases(P), torch.stack([a, b, c]))
    assert torch.equal(reference_phrases(P, limit=2), torch.stack([a, b]))
    g = torch.Generator().manual_seed(0)
    P, Y = torch.randn(20, 3, generator=g).round(), torch.randn(20, 4, generator=g)
    for rank in (2, 0):  # the reference is mapped into the compared space, after the rank cut
        fitted = fit_map(P, Y, 0.1, 0.5, rank=rank)
        torch.testing.assert_close(fitted.reference, fitted.phrases(reference_phrases(P)))
        assert fitted.reference.shape[1] == (rank or 4)


def test_hub_offset_ranks_an_object_near_every_phrase_below_the_one_its_phrase_explains():
    """Object b lies between both phrases (a hub); a's own object is nearer b's phrase than a's
    by the cosine, so the plain cosine ranks the hub first for a. Read against the reference
    phrases, a's object is explained by a alone and the hub by both: each phrase's own object
    wins."""
    P = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # phrases a, b
    angle = torch.tensor(50.0).deg2rad()
    Y = torch.stack([torch.stack([angle.cos(), -angle.sin()]), torch.tensor([1.0, 1.0]) / 2**0.5])  # a's object, the hub
    fitted = _identity_map(2)._replace(reference=P)
    assert ranking_auc(P, Y, fitted) == 0.5 and ranking_auc(P, Y, fitted, beta=5.0) == 1.0


def test_the_ridge_stage_chooses_the_beta_the_held_out_images_prefer(monkeypatch):
    """The (grid, rank, beta) of the highest held-out AUC wins, beta included."""
    import pipeline.scorers.geometry.ridge as ridge

    table = {"final": {0: {0.0: 0.90, 30.0: 0.93}, 8: {0.0: 0.95, 30.0: 0.94}}, "early": {0: {0.0: 0.91, 30.0: 0.97}, 8: {0.0: 0.96, 30.0: 0.92}}}
    monkeypatch.setattr(ridge, "heldout_aucs", lambda *a, **k: table[a[7]])
    layer, rank, beta, record = ridge.choose_space(None, None, {}, "s", 1.0, 0.1, [0, 8], ("final", "early"), "box-mean", [0.0, 30.0])
    assert (layer, rank, beta) == ("early", 0, 30.0) and record["early"]["0"] == {"0": 0.91, "30": 0.97}


def test_feature_cost_adds_each_objects_offset():
    g = torch.Generator().manual_seed(0)
    q = ObjectSets(torch.randn(2, 2, 3, generator=g), torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 2, 2))
    plain = ObjectSets(torch.randn(2, 3, 3, generator=g), torch.tensor([[True, True, False], [True, True, True]]), torch.zeros(2, 3, 2))
    offset = plain.with_embed(plain.embed, torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
    want = feature_cost(q, plain) + torch.tensor([[0.1, 0.2, 0.0], [0.4, 0.5, 0.6]])[:, None, :]
    torch.testing.assert_close(feature_cost(q, offset), want)
    assert feature_cost(q, offset)[0, :, 2].eq(0).all()  # padded pairs still cost 0


def test_whitening_is_the_inverse_square_root_of_the_shrunk_covariance():
    g = torch.Generator().manual_seed(0)
    R = torch.randn(500, 4, generator=g) @ torch.tensor([[3.0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0.2, 0], [0, 0, 0, 0.05]])
    cov = (R.T @ R / len(R)).double()
    for s in (0.3, 1e-6):
        T = whitening(R, s).double()
        torch.testing.assert_close(T, T.T)
        shrunk = (1 - s) * cov + s * cov.trace() / 4 * torch.eye(4, dtype=torch.float64)
        torch.testing.assert_close(T @ shrunk @ T, torch.eye(4, dtype=torch.float64), atol=1e-5, rtol=1e-5)
    T1 = whitening(R, 1.0)  # full shrinkage: a multiple of the identity, so cosines are unchanged
    torch.testing.assert_close(T1, T1[0, 0] * torch.eye(4))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="shrinkage"):
            whitening(R, bad)


def test_whitening_lets_a_weak_attribute_direction_count():
    # The two phrases' objects differ by 0.1 along (1, 1); a shared nuisance (sd 3) moves
    # them along (1, 0): the plain cosine ranks by the nuisance, the whitened one by the phrase.
    g = torch.Generator().manual_seed(0)
    n = 400
    label = torch.arange(n) % 2
    P = torch.nn.functional.one_hot(label, 2).float()
    sign = (2 * label - 1).float()[:, None]
    Y = 0.1 * sign * torch.tensor([1.0, 1.0]) + torch.randn(n, 2, generator=g) * torch.tensor([3.0, 0.02])
    plain = fit_map(P, Y, lam=1e-3, shrinkage=1.0)
    white = fit_map(P, Y, lam=1e-3, shrinkage=1e-3)
    torch.testing.assert_close(plain.weight, white.weight)  # whitening changes the space, not the map
    assert ranking_auc(P, Y, white) > 0.95
    assert ranking_auc(P, Y, plain) < 0.85


def test_restrict_rank_keeps_the_top_directions_of_the_whitened_fitted_values():
    g = torch.Generator().manual_seed(0)
    P, Y = torch.randn(300, 5, generator=g), torch.randn(300, 6, generator=g)
    full = fit_map(P, Y, lam=0.1, shrinkage=0.2)
    values = ((P @ full.weight + full.bias - full.centre) @ full.whiten).double()
    for r in (1, 3):
        cut = restrict_rank(full, P, r)
        assert cut.whiten.shape == (6, r) and torch.equal(cut.weight, full.weight) and torch.equal(cut.centre, full.centre)
        V = torch.linalg.solve(full.whiten.double(), cut.whiten.double())  # [6, r] the kept directions
        torch.testing.assert_close(V.T @ V, torch.eye(r, dtype=torch.float64), atol=1e-5, rtol=1e-5)  # orthonormal
        kept = (values @ V).pow(2).sum()  # the fitted values' energy along them: the top r eigenvalues
        top = torch.linalg.eigvalsh(values.T @ values).flip(0)[:r].sum()
        torch.testing.assert_close(kept, top, rtol=1e-5, atol=1e-6)
    assert restrict_rank(full, P, 0).whiten is full.whiten and restrict_rank(full, P, 6).whiten is full.whiten  # every direction
    torch.testing.assert_close(fit_map(P, Y, 0.1, 0.2, rank=3).whiten, restrict_rank(full, P, 3).whiten)
    with pytest.raises(ValueError, match="rank"):
        restrict_rank(full, P, -1)


def test_restricting_to_the_maps_range_drops_what_no_phrase_predicts():
    # Six phrases whose objects differ in 5 of 40 axes; the other 35 carry a nuisance whose
    # size varies from object to object (as a box's background does). The full-width cosine
    # divides by that nuisance; the map's range (rank 5) never sees it.
    g = torch.Generator().manual_seed(0)
    n = 3000
    label = torch.arange(n) % 6
    P = torch.nn.functional.one_hot(label, 6).float()
    means = torch.zeros(6, 40)
    means[:, :5] = torch.randn(6, 5, generator=g)
    noise = 0.3 * torch.randn(n, 40, generator=g)
    noise[:, 5:] *= torch.exp(1.5 * torch.randn(n, 1, generator=g))
    Y = means[label] + noise
    full = fit_map(P, Y, lam=1e-3, shrinkage=0.5)
    five = fit_map(P, Y, lam=1e-3, shrinkage=0.5, rank=5)
    assert ranking_auc(P, Y, five) > 0.98 and ranking_auc(P, Y, five) > ranking_auc(P, Y, full) + 0.015


def test_r_squared_is_zero_for_the_mean_and_one_for_the_true_map():
    from pipeline.scorers.geometry.ridge import r_squared

    g = torch.Generator().manual_seed(3)
    P, W, b = torch.randn(40, 5, generator=g), torch.randn(5, 3, generator=g), torch.randn(3, generator=g) + 4.0
    Y = P @ W + b
    assert r_squared(P, Y, W, b) == pytest.approx(1.0)
    assert r_squared(P, Y, torch.zeros(5, 3), Y.mean(0)) == pytest.approx(0.0, abs=1e-6)  # not 1 - |resid|² / |Y|²


def test_held_out_training_objects_come_from_images_the_map_never_saw(monkeypatch):
    """The ridge stage's selection holds out every fifth training image with all its objects:
    no image gives objects to both the fit and the held-out comparison."""
    import pipeline.scorers.geometry.ridge as ridge

    image = torch.tensor([0, 0, 0, 1, 1, 2, 3, 4, 4, 4, 5, 6, 7, 8, 9, 9, 9])  # [N] objects' images
    g = torch.Generator().manual_seed(0)
    P, Y = torch.randn(len(image), 6, generator=g), torch.randn(len(image), 6, generator=g)
    P[:, 0] = torch.arange(len(image), dtype=P.dtype)  # a row's id, readable from the row
    monkeypatch.setattr(ridge, "training_pairs", lambda *a, **k: (P, Y, image))
    rows: dict[str, torch.Tensor] = {}
    fit_map = ridge.fit_map

    def spy_fit(Pf, Yf, lam, shrinkage):
        rows["fit"] = Pf[:, 0].long()
        return fit_map(Pf, Yf, lam, shrinkage)

    def spy_auc(Ph, Yh, fitted, pairs=None, beta=0.0):
        rows["held"] = Ph[:, 0].long()
        return 0.5

    restrict = ridge.restrict_rank

    def spy_restrict(fitted, Pr, rank):
        rows.setdefault("directions", []).append(Pr[:, 0].long())
        return restrict(fitted, Pr, rank)

    monkeypatch.setattr(ridge, "fit_map", spy_fit)
    monkeypatch.setattr(ridge, "ranking_auc", spy_auc)
    monkeypatch.setattr(ridge, "restrict_rank", spy_restrict)
    aucs = ridge.heldout_aucs(None, None, {}, "s", lam=1.0, shrinkage=0.1, ranks=[0, 2], betas=[0.0, 10.0])
    assert aucs == {0: {0.0: 0.5, 10.0: 0.5}, 2: {0.0: 0.5, 10.0: 0.5}}  # every (rank, beta)
    fit, held = set(image[rows["fit"]].tolist()), set(image[rows["held"]].tolist())
    assert held == {4, 9} and fit == set(range(10)) - held  # every fifth image, whole
    assert len(rows["fit"]) + len(rows["held"]) == len(image)
    assert all(torch.equal(d, rows["fit"]) for d in rows["directions"])  # the rank's directions: the fit's rows too


def test_ridge_refuses_a_training_suite_too_small_to_fit_and_choose_on(monkeypatch):
    """No visible object, objects on one side of the every-fifth-image split only, or held-out
    objects that all share one phrase: one line naming the suite and the fix, never a
    checkpoint of NaNs chosen by AUCs of zero."""
    import pipeline.scorers.geometry.ridge as ridge

    g = torch.Generator().manual_seed(0)

    def case(image: list[int], phrases: torch.Tensor | None = None) -> None:
        image_t = torch.tensor(image, dtype=torch.long)
        P = phrases if phrases is not None else torch.randn(len(image), 6, generator=g)
        Y = torch.randn(len(image), 6, generator=g)
        monkeypatch.setattr(ridge, "training_pairs", lambda *a, **k: (P, Y, image_t))

    case([])
    with pytest.raises(ValueError, match=r"^coco-objects-train: .*no object the encoder sees, too few .*\(ridge.suite\)$"):
        ridge.choose_space(None, None, {}, "coco-objects-train", lam=1.0, shrinkage=0.1, ranks=[0])
    case([0, 1, 2, 3, 3])  # no fifth image
    with pytest.raises(ValueError, match=r"has 5 object\(s\) the encoder sees in 4 image\(s\), too few"):
        ridge.choose_space(None, None, {}, "s", lam=1.0, shrinkage=0.1, ranks=[0])
    same = torch.randn(1, 6, generator=g).expand(3, 6)
    case([0, 1, 2, 4, 4, 4], torch.cat([torch.randn(3, 6, generator=g), same]))  # image 4: one phrase thrice
    with pytest.raises(ValueError, match="hold no two objects with different phrases"):
        ridge.choose_space(None, None, {}, "s", lam=1.0, shrinkage=0.1, ranks=[0, 2])
    assert np.isnan(ranking_auc(same, torch.randn(3, 6, generator=g), ridge.fit_map(same, torch.randn(3, 6, generator=g), 1.0, 0.1)))


def test_ridge_fgw_rank_sets_the_width_of_its_whitening(geo):
    store = geo[0]
    assert _scorer("ridge-fgw", store, rank=3).whiten.shape == (store.dims.embed_dim, 3)
    assert _scorer("ridge-fgw", store).whiten.shape == (store.dims.embed_dim, store.dims.embed_dim)
    with pytest.raises(ValueError, match="rank"):
        _scorer("ridge-fgw", store, rank=store.dims.embed_dim + 1)


def test_the_ridge_stage_keeps_the_held_out_best_grid_and_scoring_reads_it(geo, tmp_path):
    from pipeline.config import RidgeConfig
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scorers.geometry.ridge import fit

    store, manifest, index = geo
    cfg = RidgeConfig(suite=SUITE, out=str(tmp_path), ranks=[2, 0], inverted_softmax=[0, 10])
    record = fit(cfg, store, manifest, index, store.suite_attrs(SUITE)["manifest_sha256"])
    assert record["layer"] in ("final", "final-raw", "early") and record["rank"] in (2, 0) and record["beta"] in (0, 10)
    aucs = record["heldout_auc"]
    assert set(aucs) == {"final", "final-raw", "early"} and all(set(a) == {"2", "0"} for a in aucs.values())
    assert all(set(by_beta) == {"0", "10"} for a in aucs.values() for by_beta in a.values())
    every = [v for by_rank in aucs.values() for by_beta in by_rank.values() for v in by_beta.values()]
    assert aucs[record["layer"]][str(record["rank"])][f"{record['beta']:g}"] == max(every)
    P, Y, _ = training_pairs(store, manifest, index, SUITE, record["layer"])
    fitted = fit_map(P, Y, cfg.lam, cfg.shrinkage, record["rank"])
    assert record["scorer_kwargs"] == {"layer": record["layer"], "rank": fitted.whiten.shape[1], "beta": record["beta"], "n_reference": len(fitted.reference)}
    scorer = load_scorer("ridge-fgw", store, tmp_path)
    assert scorer.layer == record["layer"] and scorer.weight.shape[0] == store.dims.embed_dim and scorer.beta == record["beta"]
    for name, value in fitted._asdict().items():  # the checkpoint holds the map, its whitening and reference
        torch.testing.assert_close(getattr(scorer, name).detach(), value)
    scores = score_retrieval(scorer, store, manifest, index, 256)
    assert np.isfinite(scores).all()
    config = tmp_path / "ridge-fgw" / "config.json"
    text = config.read_text()
    config.write_text(text.replace(record["store_fingerprint"], "another-store"))
    with pytest.raises(ValueError, match="fitted on another feature store"):
        load_scorer("ridge-fgw", store, tmp_path)
    # the same store, its training suite re-extracted from another manifest: the fit is stale
    config.write_text(text.replace(record["manifest_sha256"], "another-manifest"))
    with pytest.raises(ValueError, match=f"fitted on another {SUITE} manifest .*another-manifest"):
        load_scorer("ridge-fgw", store, tmp_path)
    config.unlink()  # no record of what it was fitted on: nothing to check it against
    with pytest.raises(FileNotFoundError, match="has no config.json .*pipeline ridge"):
        load_scorer("ridge-fgw", store, tmp_path)


def test_ridge_fgw_with_the_identity_map_equals_fgw(geo):
    store, manifest, index = geo
    ridge = _scorer("ridge-fgw", store, k=N)  # initial weights: identity, zero bias
    a = score_retrieval(ridge, store, manifest, index, 256)
    b = score_retrieval(_scorer("fgw", store, k=N), store, manifest, index, 256)
    np.testing.assert_allclose(a, b)


def test_steering(geo):
    store, manifest, index = geo
    clip = score_retrieval(_scorer("clip", store), store, manifest, index, 256)
    zero = score_retrieval(_scorer("steer", store, beta=0.0), store, manifest, index, 256)
    np.testing.assert_array_equal(np.argsort(-zero, 1, kind="stable"), np.argsort(-clip, 1, kind="stable"))
    one, multi = (score_retrieval(_scorer(n, store, beta=0.7), store, manifest, index, 256) for n in ("steer", "steer-multi"))
    assert not np.allclose(one, multi)  # two directions per query: the sum differs
    # steer-multi's direction is the sum of each prompt pair's contrast
    s = _scorer("steer-multi", store, beta=0.7)
    s.prepare(store, manifest, index, SUITE)
    e = lambda col: torch.nn.functional.normalize(store.texts(index[col][0], grids=False).embed, dim=-1)  # noqa: E731
    torch.testing.assert_close(s._directions[0], (e("steer_pos") - e("steer_neg")).sum(0))
    # steer: the first contrast only, added to the unit query, the sum renormalised, ranked by
    # its cosine with each unit image (by hand, over the whole gallery: k is unbounded here)
    first = _scorer("steer", store, beta=0.7)
    first.prepare(store, manifest, index, SUITE)
    torch.testing.assert_close(first._directions[0], e("steer_pos")[0] - e("steer_neg")[0])
    absent = _scorer("steer-multi", store, beta=0.7, contrast="absent")  # the other c- column
    absent.prepare(store, manifest, index, SUITE)
    torch.testing.assert_close(absent._directions[0], (e("steer_pos") - e("steer_neg_absent")).sum(0))
    with pytest.raises(ValueError, match=r"contrast must be one of \['absent', 'swap'\], got 'opposite'"):
        _scorer("steer", store, contrast="opposite")
    # length "one": the same sum, rescaled to the first direction's length
    equal = _scorer("steer-multi", store, beta=0.7, length="one")
    equal.prepare(store, manifest, index, SUITE)
    summed, single = s._directions, first._directions
    torch.testing.assert_close(equal._directions, summed * (single.norm(dim=-1) / summed.norm(dim=-1))[:, None])
    torch.testing.assert_close(equal._directions.norm(dim=-1), single.norm(dim=-1))
    with pytest.raises(ValueError, match=r"length must be one of \['sum', 'one'\], got 'unit'"):
        _scorer("steer", store, length="unit")
    gallery_rows, query_rows = retrieval_rows(manifest, index)
    unit = lambda x: torch.nn.functional.normalize(x, dim=-1)  # noqa: E731
    q = unit(unit(store.texts(query_rows, grids=False).embed) + 0.7 * first._directions)  # [Q, D]
    hand = (q @ unit(store.images(gallery_rows, grids=False).embed).T).numpy()  # [Q, G]
    np.testing.assert_array_equal(np.argsort(-one, 1, kind="stable"), np.argsort(-hand, 1, kind="stable"))


def test_steering_strength_rescores_both_variants_at_every_beta_and_scope(geo, tmp_path):
    """The report's strength table re-scores ``steer`` and ``steer-multi`` from the store:
    each row's values are those of the variant scored at that β and K by hand, ``clip``'s
    are CLIP's, and "sum - one" is the paired difference of the two."""
    from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
    from pipeline.report import ReportContext
    from pipeline.scorers.geometry.diagnostics import (
        EQUAL_LENGTH,
        EQUAL_VS_ONE,
        STRENGTHS,
        SUM_VS_ONE,
    )
    from pipeline.scorers.geometry.steering import WHOLE_GALLERY
    from pipeline.scorers.geometry.steering_report import strength_rows

    store, manifest, index = geo
    attrs = store.suite_attrs(SUITE)
    extract = ExtractConfig(model="tiny-test", suites=[SUITE], manifests={SUITE: attrs["manifest"]}, image_roots={SUITE: attrs["image_root"]})
    score = ScoreConfig(variants=["clip", "steer", "steer-multi"], suites=[SUITE], options={"steer": {"beta": 0.5, "k": 3}})
    ctx = ReportContext({}, ReportConfig(bootstrap=200), score, extract, tmp_path, store_=store)
    rows = strength_rows(ctx, SUITE)
    assert [(r["contrast"], r["scope"], r["k"], r["beta"]) for r in rows] == [
        (c, scope, k, b) for c in ("swap", "absent") for scope, k in (("local (K = 3)", 3), ("whole gallery", WHOLE_GALLERY))
        for b in STRENGTHS
    ]
    clip = retrieval_units(manifest, score_retrieval(_scorer("clip", store), store, manifest, index, 256))["R@1"].statistic()
    for r in rows:
        by_hand = {
            v: retrieval_units(manifest, score_retrieval(
                _scorer(name, store, beta=r["beta"], k=r["k"], contrast=r["contrast"], length=length), store, manifest, index, 256))
            for v, name, length in (("steer", "steer", "sum"), ("steer-multi", "steer-multi", "sum"),
                                    (EQUAL_LENGTH, "steer-multi", "one"))
        }  # fmt: skip
        assert r["clip R@1"] == clip
        for v, units in by_hand.items():
            assert r[f"{v} R@1"]["value"] == units["R@1"].statistic()
            assert r[f"{v} R@10"]["diff"] == pytest.approx(units["R@10"].statistic() - r["clip R@10"])
        assert r[f"{SUM_VS_ONE} R@1"]["diff"] == pytest.approx(r["steer-multi R@1"]["value"] - r["steer R@1"]["value"])
        assert r[f"{EQUAL_VS_ONE} R@1"]["diff"] == pytest.approx(r[f"{EQUAL_LENGTH} R@1"]["value"] - r["steer R@1"]["value"])
    assert strength_rows(ctx, "shapes-retrieval") is None  # not in this store: nothing to show


def test_geometry_variants_are_registered_for_retrieval_only():
    for name in ("fgw", "hungarian", "fgw-hungarian", "ridge-fgw", "steer", "steer-multi"):
        assert name in SCORERS.names()
    from pipeline.scorers.geometry.rerankers import FGWReranker

    assert FGWReranker.scores_choices is False
    with pytest.raises(ValueError, match="alpha"):
        FGWReranker(alpha=1.5)


def test_steering_on_a_suite_without_concept_prompts_says_why(geo):
    """The real COCO / VG loaders write boxes and phrases but no steering prompts: the
    refusal names what steering needs and where it exists, not object boxes."""
    from pipeline.scorers.geometry.steering import Steer

    manifest = pd.DataFrame({"item_id": ["1"], "object_boxes": ["[]"], "phrases": [["dog"]]})
    with pytest.raises(ValueError, match=r"^suite coco-objects has no steer_pos, steer_neg column\(s\): steer and steer-multi need each query's concept prompts .* COCO and Visual Genome loaders do not"):
        Steer().prepare(geo[0], manifest, {}, "coco-objects")
