"""Object columns of the shapes world (the contract of pipeline.benchmarks.retrieval) and the
shapes-multi suite: near-duplicate galleries whose captions are true of one scene each."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.retrieval import OBJECT_COLUMNS, parse_boxes, parse_relations
from pipeline.config import WorldConfig
from pipeline.world import build_world, split_of
from pipeline.world import multi as multi_mod
from pipeline.world.captions import And, Ref, Rel, asserted, bpe_len, caption, say, truth
from pipeline.world.families import pair_item
from pipeline.world.multi import (
    BINDING_KINDS,
    MULTI_GROUP_SIZE,
    MULTI_MAX_TOKENS,
    MULTI_OBJECTS,
    RELATION_KINDS,
    multi_items,
)
from pipeline.world.retrieval import retrieval_items
from pipeline.world.scenes import CLEAR, Obj, Scene, relation_value
from pipeline.world.suites import claim_phrases, object_columns

CANONICAL = {"left", "right", "above", "below"}
N_GROUPS = 3  # one group of each size: 3, 4 and 5 objects


@pytest.fixture(scope="module")
def retrieval() -> list:
    return [it for k in range(3) for it in retrieval_items(0, k)]


@pytest.fixture(scope="module")
def groups() -> list[list]:
    return [multi_items(0, k) for k in range(N_GROUPS)]


def boxes_of(scene: Scene) -> np.ndarray:
    return np.array([o.box() for o in scene.objects])


def named(scene: Scene, name: str) -> Obj:
    """The one object of ``scene`` whose name is ``name``."""
    hits = [o for o in scene.objects if f"{o.colour} {o.shape}" == name]
    assert len(hits) == 1, (name, scene.scene_id)
    return hits[0]


def check_query_columns(item) -> None:
    """Every object column parses; boxes are the scene's; phrases and relations are the
    claim's, name objects of the true image and hold there."""
    row, scene, claim = item.row, item.scene, item.claims[0]
    assert set(OBJECT_COLUMNS) <= set(row)
    assert row["object_names"] == [f"{o.colour} {o.shape}" for o in scene.objects]
    np.testing.assert_array_equal(parse_boxes(row["object_boxes"]), boxes_of(scene))  # exact
    assert row["phrases"] == [" ".join(r.words()) for r in asserted(claim)]
    rels = parse_relations(row["relations"], len(row["phrases"]))
    parts = claim.parts if isinstance(claim, And) else (claim,)
    index = {r: k for k, r in enumerate(asserted(claim))}
    assert rels == [(index[p.a], p.rel, index[p.b]) for p in parts]
    assert {r for _, r, _ in rels} <= CANONICAL
    for i, rel, j in rels:  # phrase i is <rel> of phrase j in the row's own (true) image
        assert relation_value(named(scene, row["phrases"][i]), named(scene, row["phrases"][j]), rel)
    text = f" {row['captions'][0]} "  # the caption names the phrases in this order
    first = [text.index(f" {p} ") for p in row["phrases"]]
    assert first == sorted(first)


# ------------------------------------------------------------------------------ object columns


def test_claim_phrases_hand_cases():
    red_circle, blue_square, star = (
        Ref("circle", "red"),
        Ref("square", "blue"),
        Ref("star", "green"),
    )
    assert claim_phrases(Rel(red_circle, "left", blue_square)) == (
        ["red circle", "blue square"],
        [[0, "left", 1]],
    )
    chain = And((Rel(red_circle, "left", blue_square), Rel(blue_square, "above", star)))
    assert claim_phrases(chain) == (
        ["red circle", "blue square", "green star"],
        [[0, "left", 1], [1, "above", 2]],
    )
    obj = Obj("circle", "red", "small", 0.3, 0.4, 0.1, 0)
    cols = object_columns(Scene("s", (obj,), None))
    assert cols == {"object_names": ["red circle"], "object_boxes": json.dumps([list(obj.box())])}


def test_retrieval_rows_have_object_columns(retrieval):
    for item in retrieval:
        check_query_columns(item)
        assert len(item.row["phrases"]) == 2 and len(parse_relations(item.row["relations"], 2)) == 1


def test_train_rows_list_the_image_objects():
    for k in range(8):  # one pair of each family
        item = pair_item(0, "shapes-train", k)
        row = item.row
        assert row["object_names"] == [f"{o.colour} {o.shape}" for o in item.scene.objects]
        assert len(set(row["object_names"])) == len(row["object_names"])  # one name, one object
        np.testing.assert_array_equal(parse_boxes(row["object_boxes"]), boxes_of(item.scene))


def test_suites_encode_object_phrases_and_manifests_round_trip(tmp_path):
    for name in ("shapes-retrieval", "shapes-multi"):
        suite = SUITES.get(name)
        assert {"captions", "object_names", "phrases"} <= set(suite.caption_columns)
    assert "object_names" in SUITES.get("shapes-train").caption_columns
    multi = SUITES.get("shapes-multi")
    assert multi.task == "retrieval" and multi.headline == "R@10"
    cfg = replace(
        WorldConfig(),
        n_retrieval_groups=1,
        n_multi_groups=1,
        suites=["shapes-retrieval", "shapes-multi"],
    )
    build_world(cfg, out=tmp_path, progress=False)
    for name, n in (("shapes-retrieval", 5), ("shapes-multi", MULTI_GROUP_SIZE)):
        m = SUITES.get(name).build_manifest(tmp_path)
        assert len(m) == n
        for _, row in m.iterrows():
            names, phrases = list(row["object_names"]), list(row["phrases"])
            assert all(isinstance(x, str) and x for x in names + phrases)  # extract refuses ""
            assert len(parse_boxes(row["object_boxes"])) == len(names)
            parse_relations(row["relations"], len(phrases))
            assert set(phrases) <= set(names)  # every phrase names an object of the true image


# ------------------------------------------------------------------------------ shapes-multi


def edit_of(base: Scene, scene: Scene) -> str:
    """The kind of the one edit that turns ``base`` into ``scene`` (raises otherwise)."""
    a, b = base.objects, scene.objects
    assert scene.background == base.background and len(a) == len(b)
    for o, p in zip(a, b, strict=True):  # only colours and positions may change
        assert (o.shape, o.size, o.r, o.z, o.jitter) == (p.shape, p.size, p.r, p.z, p.jitter)
    recoloured = [k for k in range(len(a)) if a[k].colour != b[k].colour]
    moved = [k for k in range(len(a)) if (a[k].x, a[k].y) != (b[k].x, b[k].y)]
    assert bool(recoloured) != bool(moved), "exactly one kind of edit"
    if recoloured:
        if len(recoloured) == 1:
            return "colour-change"
        i, j = recoloured
        assert len(recoloured) == 2 and (b[i].colour, b[j].colour) == (a[j].colour, a[i].colour)
        return "colour-swap"
    if len(moved) == 2:
        i, j = moved
        assert (b[i].x, b[i].y, b[j].x, b[j].y) == (a[j].x, a[j].y, a[i].x, a[i].y)
        return "position-swap"
    (i,) = moved  # one object moved to the other side of another along an axis
    assert any(
        (getattr(a[i], ax) - getattr(a[j], ax)) * (getattr(b[i], ax) - getattr(b[j], ax)) < 0
        and min(
            abs(getattr(a[i], ax) - getattr(a[j], ax)), abs(getattr(b[i], ax) - getattr(b[j], ax))
        )
        >= CLEAR
        for j in range(len(a))
        if j != i
        for ax in ("x", "y")
    )
    return "move"


def test_multi_rows_and_object_columns(groups):
    for k, group in enumerate(groups):
        assert len(group) == MULTI_GROUP_SIZE
        sid = group[0].row["group"]
        assert split_of(sid) == "holdout"
        for v, item in enumerate(group):
            row = item.row
            assert (
                row["item_id"] == f"{sid}/v{v}" and row["group"] == sid and row["scene_id"] == sid
            )
            assert row["image"] == f"shapes-multi/{sid}/v{v}.png"
            assert (row["correct"], row["category"], len(row["captions"])) == (0, "retrieval", 1)
            assert row["captions"][0] == caption(item.claims[0])
            objs = item.scene.objects
            assert len(objs) == MULTI_OBJECTS[k % 3] and 3 <= len(objs) <= 5
            assert len({o.shape for o in objs}) == len(objs)  # distinct shapes
            assert sorted(row["phrases"]) == sorted(row["object_names"])  # names every object
            assert bpe_len(row["captions"][0]) <= MULTI_MAX_TOKENS  # + sot/eot <= 32
            check_query_columns(item)


def test_multi_captions_are_true_of_their_own_scene_only(groups):
    every = [it for g in groups for it in g]
    for q in every:  # within the group and across the groups built
        hits = [t.row["item_id"] for t in every if truth(q.claims[0], t.scene) is True]
        assert hits == [q.row["item_id"]]
    for group in groups:  # and clearly false (never ambiguous) of the others in its group
        for q in group:
            assert all(truth(q.claims[0], t.scene) is False for t in group if t is not q)


def test_multi_variants_differ_from_the_base_by_one_edit(groups):
    for group in groups:
        base = group[0].scene
        assert group[0].row["variant"] == "base"
        kinds = [edit_of(base, it.scene) for it in group[1:]]
        assert kinds == [it.row["variant"] for it in group[1:]]
        assert set(kinds) & set(BINDING_KINDS) and set(kinds) & set(RELATION_KINDS)
        scenes = {it.row["scene"] for it in group}
        assert len(scenes) == MULTI_GROUP_SIZE  # no two scenes alike
        assert len({frozenset(o.shape for o in it.scene.objects) for it in group}) == 1


def test_multi_is_deterministic(groups):
    multi_mod._GROUPS.clear()  # drawn afresh, not read from the cache
    again = [multi_items(0, k) for k in range(N_GROUPS)]
    assert [[it.row for it in g] for g in again] == [[it.row for it in g] for g in groups]
    other = multi_items(1, 0)
    assert [it.row["captions"] for it in other] != [it.row["captions"] for it in groups[0]]


def test_and_claims_render_and_hold_as_conjunctions():
    a, b, c = Ref("circle", "red"), Ref("square", "blue"), Ref("star", "green")
    claim = And((Rel(a, "left", b), Rel(b, "above", c), Rel(a, "left", c)))
    cap = say(claim)
    assert (
        cap.text
        == "a red circle left of a blue square which is above a green star and the circle left of the star"
    )
    assert [cap.tags[k] for k, w in enumerate(cap.words) if w in ("circle", "square", "star")] == [
        0,
        1,
        2,
        0,
        2,
    ]
    objs = (
        Obj("circle", "red", "small", 0.2, 0.2, 0.09, 0),
        Obj("square", "blue", "small", 0.5, 0.2, 0.09, 1),
        Obj("star", "green", "small", 0.5, 0.5, 0.09, 2),
    )
    scene = Scene("s", objs, None)
    assert truth(claim, scene) is True
    assert truth(claim, scene.with_object(0, colour="green")) is False  # no red circle
    assert truth(claim, scene.with_object(2, x=0.1)) is False  # the star moved left of the circle
    assert truth(claim, scene.with_object(2, x=0.24)) is None  # the circle only barely left of it


def test_steering_prompts_contrast_each_phrase_with_another_objects_colour_and_an_absent_one():
    from pipeline.world.captions import And, Ref, Rel
    from pipeline.world.scenes import COLOURS
    from pipeline.world.suites import steering_prompts

    claim = Rel(Ref("circle", "red"), "left", Ref("square", "blue"))
    pos, neg, absent = steering_prompts(claim)
    assert (pos, neg) == (["red circle", "blue square"], ["blue circle", "red square"])
    assert [a.split()[1] for a in absent] == ["circle", "square"]  # the same shapes
    assert {a.split()[0] for a in absent} <= set(COLOURS) - {"red", "blue"}  # in colours the claim has not
    assert steering_prompts(claim) == (pos, neg, absent)  # a pure function of the claim
    same = Rel(Ref("circle", "red"), "left", Ref("square", "red"))
    assert steering_prompts(same) == ([], [], [])  # no other colour: no contrast
    red, blue, green = Ref("circle", "red"), Ref("square", "blue"), Ref("star", "green")
    chain = And((Rel(red, "left", blue), Rel(blue, "left", green)))  # three refs: the next one's colour, cyclically
    pos, neg, absent = steering_prompts(chain)
    assert (pos, neg) == (["red circle", "blue square", "green star"], ["blue circle", "green square", "red star"])
    assert len({a.split()[0] for a in absent} & {"red", "blue", "green"}) == 0 and len(absent) == 3
    others = Ref("cross", "yellow"), Ref("diamond", "purple"), Ref("triangle", "orange"), Ref("circle", "white")
    crowded = And((chain.parts[0], chain.parts[1], *(Rel(a, "left", b) for a, b in zip(others[:-1], others[1:], strict=True))))
    with pytest.raises(ValueError, match="the claim uses every colour"):
        steering_prompts(crowded)


def test_every_multi_caption_has_a_paraphrase_of_the_same_truth(groups):
    """world.md: paraphrases for any caption. A shapes-multi caption is an ``And`` of
    relations: its equivalents reorder the relations and state each as itself or its
    converse, and every one is true or false on exactly the scenes the caption is."""
    import numpy as np

    from pipeline.world.captions import N_STYLES, caption, equivalents, paraphrase, truth

    rng = np.random.default_rng(0)
    for items in groups[:2]:
        scenes = [it.scene for it in items]
        for it in items[:5]:
            (claim,) = it.claims
            text = caption(claim)
            other = paraphrase(claim, text, rng)
            assert other != text and other in {caption(c, s) for c in equivalents(claim) for s in range(N_STYLES)}
            want = [truth(claim, s) for s in scenes]
            assert want.count(True) >= 1
            for c in equivalents(claim):
                assert [truth(c, s) for s in scenes] == want
