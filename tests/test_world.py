"""Tests for pipeline.world: determinism, splits, suite invariants, captions, training data.

A tiny world is built once per module (and once more for the determinism check); every
invariant is checked on all of its rows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipeline.config import SHAPES_SUITES, WorldConfig
from pipeline.world import (
    FAMILIES,
    SUGARCREPE_CATEGORIES,
    build_world,
    render,
    split_of,
    suite_items,
    training_batch,
    training_scene,
    truth,
)
from pipeline.world import build as world_build
from pipeline.world.captions import (
    Has,
    Ref,
    Rel,
    Side,
    bpe_len,
    caption,
    equivalents,
    flip_claim,
    flip_text,
    pos_tag,
    say,
    shuffle_all_but_nouns_and_adj,
    shuffle_nouns_and_adj,
    shuffle_trigrams,
    shuffle_within_trigrams,
)
from pipeline.world.grounding import grounding
from pipeline.world.render import mirror, png_bytes
from pipeline.world.sampling import make_obj, random_scene
from pipeline.world.scenes import (
    COLOURS,
    SPLITS,
    Obj,
    Scene,
    bucket_of,
    relation_value,
    scene_rng,
    side_value,
)

TINY = WorldConfig(n_whatsup=3, n_aro=6, n_sugarcrepe=3, n_retrieval_groups=3, n_multi_groups=2,
                   n_train=16, n_dev=8)  # fmt: skip
EVAL_SUITES = ("shapes-whatsup", "shapes-aro", "shapes-sugarcrepe", "shapes-retrieval")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    build_world(TINY, out=out, progress=False)
    return out


def manifest(world: Path, suite: str) -> pd.DataFrame:
    return pd.read_parquet(world / "manifests" / f"{suite}.parquet")


def pixels(world: Path, rel: str) -> np.ndarray:
    return np.asarray(Image.open(world / "images" / rel).convert("RGB"))


def file_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "world.json"
    }


@pytest.fixture(scope="module")
def items() -> dict[str, list]:
    return {suite: list(suite_items(TINY, suite)) for suite in SHAPES_SUITES}


# ------------------------------------------------------------------------------ determinism


def test_scene_is_pure_function_of_seed_and_index():
    a = png_bytes(render(training_scene(0, 7)[0], 64))
    np.random.seed(123)  # the global RNG must play no part
    b = png_bytes(render(training_scene(0, 7)[0], 64))
    assert a == b
    assert a != png_bytes(render(training_scene(0, 8)[0], 64))
    assert a != png_bytes(render(training_scene(1, 7)[0], 64))


def test_build_world_twice_is_identical_whatever_the_workers(world, tmp_path, monkeypatch):
    monkeypatch.setattr(world_build, "UNITS_PER_TASK", 2)  # several tasks per suite
    build_world(TINY, out=tmp_path / "one", progress=False, workers=1)
    build_world(TINY, out=tmp_path / "two", progress=False, workers=2)
    first = file_hashes(world)
    assert file_hashes(tmp_path / "one") == first  # every image and manifest, byte for byte
    assert file_hashes(tmp_path / "two") == first
    with pytest.raises(ValueError, match="workers must be >= 1"):
        build_world(TINY, out=tmp_path / "none", progress=False, workers=0)
    assert sum(k.endswith(".png") for k in first) == sum(
        json.loads((world / "world.json").read_text())["images"].values()
    )


def test_world_json_records_config_and_counts(world):
    meta = json.loads((world / "world.json").read_text())
    assert meta["config"]["n_train"] == TINY.n_train
    assert meta["counts"] == {s: len(manifest(world, s)) for s in SHAPES_SUITES}
    assert meta["counts"]["shapes-whatsup"] == 4 * TINY.n_whatsup
    assert meta["counts"]["shapes-aro"] == 3 * TINY.n_aro
    assert meta["counts"]["shapes-sugarcrepe"] == 7 * TINY.n_sugarcrepe
    assert meta["counts"]["shapes-retrieval"] == 5 * TINY.n_retrieval_groups


# ------------------------------------------------------------------------------ splits


def test_split_of_follows_sha256_buckets():
    for sid in [f"x-{i}" for i in range(200)]:
        b = int(hashlib.sha256(sid.encode()).hexdigest(), 16) % 10
        assert bucket_of(sid) == b
        assert b in SPLITS[split_of(sid)]


def test_suites_are_image_disjoint_by_bucket(world):
    ids = {s: set(manifest(world, s)["scene_id"]) for s in SHAPES_SUITES}
    assert all(split_of(i) == "train" for i in ids["shapes-train"])
    assert all(split_of(i) == "validation" for i in ids["shapes-dev"])
    for s in EVAL_SUITES:
        assert all(split_of(i) == "holdout" for i in ids[s])
    evals = set().union(*(ids[s] for s in EVAL_SUITES))
    assert not ids["shapes-train"] & ids["shapes-dev"]
    assert not (ids["shapes-train"] | ids["shapes-dev"]) & evals
    # variants carry their base scene's id: the scene JSON names the same id as the row
    for s in SHAPES_SUITES:
        df = manifest(world, s)
        assert all(
            json.loads(j)["scene_id"] == i for j, i in zip(df["scene"], df["scene_id"], strict=True)
        )


# ------------------------------------------------------------------------------ contract


@pytest.mark.parametrize("suite", SHAPES_SUITES)
def test_manifest_contract(world, suite):
    df = manifest(world, suite)
    for col in ("item_id", "image", "captions", "correct", "category"):
        assert col in df.columns
    assert df["item_id"].is_unique
    assert len(df) > 0
    for _, row in df.iterrows():
        assert isinstance(row["image"], str) and not row["image"].startswith("/")
        assert (world / "images" / row["image"]).is_file()
        caps = list(row["captions"])
        assert caps and all(isinstance(c, str) and c for c in caps)
        assert 0 <= int(row["correct"]) < len(caps)
        assert len(set(caps)) == len(caps)  # no option ties with another by its text
        assert max(bpe_len(c) for c in caps) <= (30 if suite == "shapes-multi" else 20)
    extra = {
        "shapes-whatsup": {"pair_key", "arrangement"},
        "shapes-aro": {"relation_name", "attr_pair"},
        "shapes-sugarcrepe": {"length_matched"},
        "shapes-retrieval": {"group"},
        "shapes-train": {
            "family",
            "cf_image",
            "flip_image",
            "flip_captions",
            "paraphrase",
            "ground_words",
            "ground_boxes",
        },
    }.get(suite, set())
    if suite == "shapes-dev":
        extra = {"family", "cf_image", "flip_image", "flip_captions", "paraphrase"}
    assert extra <= set(df.columns)


@pytest.mark.parametrize("suite", SHAPES_SUITES)
def test_every_caption_claim_is_true_exactly_for_the_correct_option(items, suite):
    for item in items[suite]:
        correct = item.row["correct"]
        for k, claim in enumerate(item.claims):
            if claim is not None:
                assert truth(claim, item.scene) is (k == correct), (item.row["item_id"], k)
                assert caption(claim) and item.row["captions"][k]


def test_categories_are_balanced(world):
    aro = manifest(world, "shapes-aro")
    assert aro["category"].value_counts().to_dict() == dict.fromkeys(
        ("relation", "attribution", "order"), TINY.n_aro
    )
    sc = manifest(world, "shapes-sugarcrepe")
    assert sc["category"].value_counts().to_dict() == dict.fromkeys(
        SUGARCREPE_CATEGORIES, TINY.n_sugarcrepe
    )
    for suite, n in (("shapes-train", TINY.n_train), ("shapes-dev", TINY.n_dev)):
        df = manifest(world, suite)
        assert (df["family"] == df["category"]).all()
        assert df["family"].value_counts().to_dict() == dict.fromkeys(FAMILIES, n // 8)


# ------------------------------------------------------------------------------ shapes-whatsup


def test_whatsup_pairs_differ_only_by_placement(world):
    df = manifest(world, "shapes-whatsup")
    assert len(df) == 4 * TINY.n_whatsup
    for key, g in df.groupby("pair_key"):
        assert sorted(g["arrangement"]) == ["above", "below", "left", "right"]
        assert (g["category"] == g["arrangement"]).all()
        assert len({frozenset(c) for c in g["captions"]}) == 1  # same four options
        by = {r.arrangement: r for r in g.itertuples()}
        for arr, r in by.items():
            assert f"_{arr}" in r.image and r.image.startswith(f"shapes-whatsup/{key}/")
        for a, b in (("left", "right"), ("above", "below")):
            sa = Scene.from_dict(json.loads(by[a].scene))
            sb = Scene.from_dict(json.loads(by[b].scene))
            assert sa.background == sb.background
            strip = [[replace(o, x=0.0, y=0.0) for o in s.objects] for s in (sa, sb)]
            assert strip[0] == strip[1]  # same objects, sizes, colours, order
            assert [(o.x, o.y) for o in sa.objects] != [(o.x, o.y) for o in sb.objects]
            # away from every object (4 px for the resampling kernel) the pixels agree
            ia, ib = pixels(world, by[a].image), pixels(world, by[b].image)
            n = ia.shape[0]
            keep = np.ones((n, n), bool)
            for o in sa.objects + sb.objects:
                x0, y0, x1, y1 = o.box()
                keep[
                    max(0, int(y0 * n) - 4) : int(y1 * n) + 5,
                    max(0, int(x0 * n) - 4) : int(x1 * n) + 5,
                ] = False
            assert keep.sum() > n * n // 4
            assert np.array_equal(ia[keep], ib[keep])
            assert not np.array_equal(ia, ib)


# ------------------------------------------------------------------------------ shapes-aro


def test_aro_items(world, items):
    df = manifest(world, "shapes-aro")
    rel = df[df["category"] == "relation"]
    assert (rel["correct"] == 1).all() and (rel["relation_name"] != "").all()
    att = df[df["category"] == "attribution"]
    assert (att["correct"] == 1).all()
    for caps, pair in zip(att["captions"], att["attr_pair"], strict=True):
        c1, c2 = pair.split("_")
        false, true = caps
        assert true.split() != false.split()
        assert sorted(true.split()) == sorted(false.split())  # the same words, colours swapped
        assert [w for w in true.split() if w in (c1, c2)] == [c1, c2]
        assert [w for w in false.split() if w in (c1, c2)] == [c2, c1]
    order = df[df["category"] == "order"]
    assert (order["correct"] == 0).all()
    for caps in order["captions"]:
        assert len(caps) == 5
        words = caps[0].split()
        for p in caps[1:]:
            assert p != caps[0] and sorted(p.split()) == sorted(words)
        p1, p2 = caps[1].split(), caps[2].split()
        assert [w for w in p1 if pos_tag(w) == "OTHER"] == [
            w for w in words if pos_tag(w) == "OTHER"
        ]
        assert [pos_tag(w) for w in p1] == [pos_tag(w) for w in words]
        assert [w for w, t in zip(p2, words, strict=True) if pos_tag(t) != "OTHER"] == [
            w for w in words if pos_tag(w) != "OTHER"
        ]


def test_no_aro_order_negative_says_what_the_caption_says():
    """A shuffle that moves whole noun phrases ("the small yellow square and the large purple
    triangle") is true of the image: no order item keeps one as a negative, in any wording."""
    from pipeline.world.captions import N_STYLES
    from pipeline.world.suites import aro_item

    for k in range(300):
        item = aro_item(0, "order", k)
        same = {caption(c, s) for c in equivalents(item.claims[0]) for s in range(N_STYLES)}
        assert not same & set(item.row["captions"][1:]), item.row["item_id"]


def test_aro_shuffles_hand_case():
    rng = np.random.default_rng(0)
    words = "a small red circle to the left of a large blue square".split()
    for _ in range(20):
        s = shuffle_nouns_and_adj(words, rng)
        assert {s[3], s[11]} == {"circle", "square"} and {s[1], s[2], s[9], s[10]} == {
            "small",
            "red",
            "large",
            "blue",
        }
        o = shuffle_all_but_nouns_and_adj(words, rng)
        assert [o[i] for i in (1, 2, 3, 9, 10, 11)] == [words[i] for i in (1, 2, 3, 9, 10, 11)]
        w = shuffle_within_trigrams(words, rng)
        assert all(sorted(w[i : i + 3]) == sorted(words[i : i + 3]) for i in range(0, 12, 3))
        t = shuffle_trigrams(words, rng)
        assert sorted(tuple(t[i : i + 3]) for i in range(0, 12, 3)) == sorted(
            tuple(words[i : i + 3]) for i in range(0, 12, 3)
        )


# ------------------------------------------------------------------------------ shapes-sugarcrepe


def test_sugarcrepe_length_matched_agrees_with_bpe(world):
    df = manifest(world, "shapes-sugarcrepe")
    assert (df["correct"] == 0).all()
    for caps, matched in zip(df["captions"], df["length_matched"], strict=True):
        assert bool(matched) == (bpe_len(caps[0]) == bpe_len(caps[1]))
    adds = df[df["category"].str.startswith("add")]
    for caps in adds.loc[adds["length_matched"], "captions"]:  # only by construction
        assert caps[0].startswith("a picture of ") and not caps[1].startswith("a picture of ")
    swaps = df[df["category"].str.startswith("swap")]
    for caps in swaps["captions"]:
        assert sorted(caps[0].replace("an ", "a ").split()) == sorted(
            caps[1].replace("an ", "a ").split()
        )


def test_sugarcrepe_add_items_length_matched_by_construction():
    """About P_ADD_LENGTH_MATCHED of the add-* items have equally long captions (the positive
    says "a picture of ..."); the rest have a longer negative, as in SugarCrepe."""
    from pipeline.world.suites import P_ADD_LENGTH_MATCHED, sugarcrepe_item

    for category in ("add-obj", "add-att"):
        items = [sugarcrepe_item(0, category, i) for i in range(80)]
        matched = [it for it in items if it.row["length_matched"]]
        assert 0.5 * P_ADD_LENGTH_MATCHED < len(matched) / len(items) < 1.5 * P_ADD_LENGTH_MATCHED
        for it in items:
            pos, neg = it.row["captions"]
            assert truth(it.claims[0], it.scene) is True and truth(it.claims[1], it.scene) is False
            if not it.row["length_matched"]:
                assert bpe_len(neg) > bpe_len(pos)  # the negative appends a phrase
            else:
                assert pos.startswith("a picture of ") and bpe_len(neg) == bpe_len(pos)


# ------------------------------------------------------------------------------ shapes-retrieval


def test_retrieval_groups(world, items):
    df = manifest(world, "shapes-retrieval")
    assert df["group"].value_counts().eq(5).all()
    assert len(df) == 5 * TINY.n_retrieval_groups
    by_group: dict[str, list] = {}
    for item in items["shapes-retrieval"]:
        by_group.setdefault(item.row["group"], []).append(item)
    for group in by_group.values():
        shapes = {tuple(sorted(o.shape for o in it.scene.objects)) for it in group}
        colours = {tuple(sorted(o.colour for o in it.scene.objects)) for it in group}
        assert len(shapes) == 1 and len(colours) == 1  # same shapes and colours ...
        assert (
            len(
                {
                    frozenset((o.colour, o.shape, round(o.x, 3)) for o in it.scene.objects)
                    for it in group
                }
            )
            == 5
        )
        for i, query in enumerate(group):  # ... and each caption is true of its scene only
            for j, target in enumerate(group):
                assert truth(query.claims[0], target.scene) is (i == j)
    # every query is true of exactly one image in the whole gallery
    all_items = items["shapes-retrieval"]
    for q in all_items:
        assert sum(truth(q.claims[0], t.scene) is True for t in all_items) == 1


# ------------------------------------------------------------------------------ shapes-train / dev


@pytest.mark.parametrize("suite", ["shapes-train", "shapes-dev"])
def test_pairs_counterfactual_flip_paraphrase(world, items, suite):
    df = manifest(world, suite).set_index("item_id")
    for item in items[suite]:
        row = df.loc[item.row["item_id"]]
        pos, neg = item.extra["pos"], item.extra["neg"]
        cf, flipped = item.extra["cf_scene"], item.extra["flip_scene"]
        # counterfactual: neg true, pos false, and a different image
        assert truth(pos, cf) is False and truth(neg, cf) is True
        assert not np.array_equal(pixels(world, row["image"]), pixels(world, row["cf_image"]))
        # flip: the mirror image, captions with left/right swapped and still true/false
        assert np.array_equal(pixels(world, row["flip_image"]), mirror(pixels(world, row["image"])))
        assert list(row["flip_captions"]) == [flip_text(c) for c in row["captions"]]
        for c, f in zip(row["captions"], row["flip_captions"], strict=True):
            assert ("left" in c.split() or "right" in c.split()) == (c != f)
        assert truth(flip_claim(pos), flipped) is True and truth(flip_claim(neg), flipped) is False
        # paraphrase: other words, same meaning
        assert row["paraphrase"] != row["captions"][0]
        assert row["paraphrase"] in {caption(c, s) for c in equivalents(pos) for s in range(5)}
        # grounding: words of pos, aligned with boxes that contain nothing but their object
        words = row["captions"][0].split()
        assert (
            len(row["ground_words"]) == len(row["ground_boxes"]) == len(row["ground_positions"]) > 0
        )
        for w, box, k in zip(
            row["ground_words"], row["ground_boxes"], row["ground_positions"], strict=True
        ):
            assert words[k] == w and pos_tag(w) in ("NOUN", "ADJ")
            assert 0.0 <= box[0] < box[2] <= 1.0 and 0.0 <= box[1] < box[3] <= 1.0
            hits = [o for o in item.scene.objects if np.allclose(o.box(), box, atol=1e-5)]
            assert len(hits) == 1 and w in (hits[0].shape, hits[0].colour, hits[0].size)
        # neg grounding: words of neg that alone name exactly one object of the true scene
        neg_words = row["captions"][1].split()
        assert len(row["neg_ground_boxes"]) == len(row["neg_ground_positions"])
        for box, k in zip(row["neg_ground_boxes"], row["neg_ground_positions"], strict=True):
            w = neg_words[k]
            hits = [o for o in item.scene.objects if np.allclose(o.box(), box, atol=1e-5)]
            assert len(hits) == 1
            attr = next(a for a in ("shape", "colour", "size") if getattr(hits[0], a) == w)
            assert sum(getattr(o, attr) == w for o in item.scene.objects) == 1


def test_word_grounding_reads_each_word_alone():

    rng = np.random.default_rng(0)
    red_circle = make_obj(rng, "circle", "red", "large", 0.25, 0.5)
    blue_square = make_obj(rng, "square", "blue", "large", 0.75, 0.5)
    blue_star = make_obj(rng, "star", "blue", "small", 0.5, 0.2)
    scene = Scene("w", (red_circle, blue_square, blue_star), None)
    claim = Has((Ref("circle", "blue"), Ref("square", "red")))  # both colours swapped: false
    cap = say(claim)
    words, boxes, positions = grounding(claim, cap, scene, by_word=True)
    # "blue" names two objects (skipped); "circle", "red" and "square" one each
    assert words == ["circle", "red", "square"]
    assert [cap.words[k] for k in positions] == words
    assert boxes == [
        [round(c, 6) for c in o.box()] for o in (red_circle, red_circle, blue_square)
    ]
    # the phrase-level grounding finds nothing: no blue circle, no red square
    assert grounding(claim, cap, scene) == ([], [], [])


def test_attribute_family_has_bound_colour_negatives():
    from pipeline.world.families import P_BOUND_COLOUR, pair_item

    a = FAMILIES.index("attribute")
    bound = colour_edits = 0
    for j in range(60):
        item = pair_item(0, "shapes-train", 8 * j + a)
        pos, neg = (set(c.split()) for c in item.row["captions"])
        new = (neg - pos) & set(COLOURS)
        colour_edits += bool(new)
        bound += bool(new & {o.colour for o in item.scene.objects})
    # about P_BOUND_COLOUR of the colour edits take another object's colour (when one can)
    assert colour_edits > 20 and 0.6 * P_BOUND_COLOUR < bound / colour_edits < 0.95


def test_edit_kinds_follow_how_each_pair_was_made():
    """edit_kind read back from the manifest columns agrees with the claims and scenes the
    proposer made: the axis of the role swap's relation, the attribute that changed, the
    side of a negation that says "no"."""
    from pipeline.world.captions import Has, Rel
    from pipeline.world.families import edit_kind, pair_item
    from pipeline.world.scenes import AXIS

    seen = set()
    for fam in ("role-swap", "attribute", "negation", "entity"):
        f = FAMILIES.index(fam)
        for j in range(40):
            item = pair_item(0, "shapes-train", 8 * j + f)
            row, pos = item.row, item.extra["pos"]
            kind = edit_kind(row["family"], row["captions"][row["correct"]], row["scene"], row["cf_scene"])
            seen.add(kind)
            if fam == "role-swap":
                assert isinstance(pos, Rel) and kind == f"role-swap: {AXIS[pos.rel]}"
            elif fam == "attribute":
                (i,) = [i for i, (a, b) in enumerate(zip(item.scene.objects, item.extra["cf_scene"].objects, strict=True)) if a != b]
                a, b = item.scene.objects[i], item.extra["cf_scene"].objects[i]
                others = {o.colour for k, o in enumerate(item.scene.objects) if k != i}
                want = "size" if a.size != b.size else "colour of another object" if b.colour in others else "new colour"
                assert kind == f"attribute: {want}", (row["captions"], kind)
            elif fam == "negation":
                assert isinstance(pos, Has) and kind == ("negation: 'no X' true" if pos.absent else "negation: 'no X' false")
            else:
                assert kind == fam
    assert {"role-swap: horizontal", "role-swap: vertical", "role-swap: depth", "attribute: size",
            "attribute: colour of another object", "attribute: new colour"} <= seen


def test_edit_kind_phrases_and_errors():
    from pipeline.world.families import edit_kind, edit_kinds

    one = json.dumps({"objects": [{"colour": "red", "size": "small"}, {"colour": "blue", "size": "large"}]})
    assert edit_kind("role-swap", "a red star partly covering a cross", one, one) == "role-swap: depth"
    assert edit_kind("role-swap", "a star lower than a cross", one, one) == "role-swap: vertical"
    with pytest.raises(ValueError, match="states no relation"):
        edit_kind("role-swap", "a star and a cross", one, one)
    with pytest.raises(ValueError, match="changes 0 objects"):
        edit_kind("attribute", "a red star", one, one)
    assert edit_kind("vertical", "a", one, one) == "vertical"
    assert edit_kind("negation", "a star and no cross", one, one) == "negation: 'no X' true"
    assert edit_kind("negation", "a star and a cross", one, one) == "negation: 'no X' false"
    rows = pd.DataFrame({"family": ["negation"], "captions": [["a star and a cross", "a star and no cross"]],
                         "correct": [1], "scene": [one], "cf_scene": [one]})  # fmt: skip
    assert list(edit_kinds(rows)) == ["negation: 'no X' true"]  # the true caption by `correct`
    with pytest.raises(ValueError, match="lacks \\['cf_scene', 'scene'\\]"):
        edit_kinds(rows.drop(columns=["scene", "cf_scene"]))


def test_left_right_families_flip_their_words(world):
    df = manifest(world, "shapes-train")
    for fam in ("relative-geometry", "absolute-position"):
        rows = df[df["family"] == fam]
        assert len(rows) > 0
        for caps, flips in zip(rows["captions"], rows["flip_captions"], strict=True):
            assert list(flips) != list(caps)
            assert list(flips) == [
                c.replace("left", "#").replace("right", "left").replace("#", "right") for c in caps
            ]


# ------------------------------------------------------------------------------ relations and captions


def _obj(x: float, y: float, z: int = 0, shape: str = "circle", colour: str = "red") -> Obj:
    return Obj(shape, colour, "small", x, y, 0.07, z)


def test_relations_hand_cases():
    a, b = _obj(0.2, 0.5), _obj(0.6, 0.5, 1, "square", "blue")
    assert relation_value(a, b, "left") is True and relation_value(a, b, "right") is False
    assert relation_value(a, b, "above") is False and relation_value(a, b, "below") is False
    assert relation_value(a, b, "front") is None  # no overlap: depth undefined
    c = _obj(0.25, 0.5, 1, "square", "blue")
    assert relation_value(a, c, "left") is None  # a 0.05 offset is ambiguous
    d = _obj(0.27, 0.52, 1, "square", "blue")
    assert relation_value(d, a, "front") is True and relation_value(a, d, "front") is False
    e = _obj(0.27, 0.52, 1, "square", "red")  # d in a's colour: one red silhouette either way
    assert relation_value(e, a, "front") is None and relation_value(a, e, "behind") is None
    assert side_value(a, "left") is True and side_value(b, "left") is False
    scene = Scene("t", (a, b), None)
    red, blue = Ref("circle", "red"), Ref("square", "blue")
    assert truth(Rel(red, "left", blue), scene) is True
    assert truth(Rel(blue, "left", red), scene) is False
    assert truth(Rel(Ref("star"), "left", blue), scene) is False  # absent object
    assert truth(Has((red,), (Ref("square", "green"),)), scene) is True
    assert truth(Has((red,), (Ref("square"),)), scene) is False
    assert truth(Side(red, "left"), scene) is True
    assert truth(flip_claim(Side(red, "left")), scene.flipped()) is True


def test_overlap_counts_visibility_on_the_object_behind():
    """A big square over most of a small one: the small one (behind) keeps ~20% visible; with
    the small one in front, the big one behind keeps ~80%. The overlap is over the smaller
    (a 480-px raster: the shapes span enough pixels for 1% accuracy)."""
    from pipeline.world.scenes import overlap

    small, big = Obj("square", "red", "small", 0.6, 0.5, 0.1, 0), Obj("square", "blue", "large", 0.5, 0.5, 0.2, 1)
    (s0, s_y0, s1, s_y1), (b0, b_y0, b1, b_y1) = small.box(), big.box()
    inter = (b1 - s0) * (s_y1 - s_y0)  # the small square's right part, its full height
    frac, visible = overlap(big, small, n=480)
    assert frac == pytest.approx(inter / ((s1 - s0) * (s_y1 - s_y0)), abs=0.01)
    assert visible == pytest.approx(1 - frac, abs=0.01) and visible < 0.3
    frac, visible = overlap(replace(small, z=2), big, n=480)
    assert visible == pytest.approx(1 - inter / ((b1 - b0) * (b_y1 - b_y0)), abs=0.01) and visible > 0.7


def test_a_clear_relation_runs_along_its_dominant_axis():
    """Offset >= CLEAR along the relation, and at most 0.6 of it across (either sign)."""
    from pipeline.world.scenes import CLEAR, relation_clear

    a = _obj(0.3, 0.5)
    assert relation_clear(a, _obj(0.5, 0.61), "left") and relation_clear(a, _obj(0.5, 0.39), "left")
    assert not relation_clear(a, _obj(0.5, 0.63), "left") and not relation_clear(a, _obj(0.5, 0.37), "left")
    assert not relation_clear(a, _obj(0.3 + CLEAR - 0.01, 0.5), "left")
    assert relation_clear(_obj(0.5, 0.3), _obj(0.61, 0.5), "above")
    assert not relation_clear(_obj(0.5, 0.3), _obj(0.63, 0.5), "above")


def test_a_scene_refuses_an_overlap_that_hides_the_object_behind(monkeypatch):
    """Overlapping shapes pass when the overlap is clear (>= 2 DEPTH_OVERLAP) and the back
    object keeps at least 55% visible; two shapes at one depth never pass."""
    from pipeline.world import scenes

    a, b = _obj(0.45, 0.5), _obj(0.5, 0.5, 1, "square", "blue")
    scene = Scene("t", (a, b), None)
    for got, ok in (((0.2, 0.56), True), ((0.2, 0.54), False), ((0.09, 0.9), False), ((0.0, 1.0), True)):
        monkeypatch.setattr(scenes, "overlap", lambda *_, got=got: got)
        assert scenes.scene_ok(scene) is ok, got
    assert not scenes.scene_ok(Scene("t", (a, replace(b, z=0)), None))


def test_grounding_leaves_out_the_words_of_an_absent_object():
    """"a red circle and no blue square" of a scene holding both: only the circle's words
    are grounded, though the square's words name exactly one object too."""
    red, blue = Ref("circle", "red"), Ref("square", "blue")
    a, b = _obj(0.2, 0.5), _obj(0.6, 0.5, 1, "square", "blue")
    claim = Has((red,), (blue,))
    words, boxes, _ = grounding(claim, say(claim, 0), Scene("t", (a, b), None))
    assert words == ["red", "circle"] and boxes == [[round(c, 6) for c in a.box()]] * 2
    words, _, _ = grounding(claim, say(claim, 0), Scene("t", (a, b), None), by_word=True)
    assert words == ["red", "circle"]


def test_a_bare_shape_name_only_where_the_shape_is_unique():
    from pipeline.world.captions import ref_of

    rng = np.random.default_rng(0)
    lone = Scene("t", (_obj(0.2, 0.5), _obj(0.6, 0.5, 1, "square", "blue")), None)
    assert ref_of(lone.objects[0], lone, rng, p_bare=1.0) == Ref("circle")
    two = Scene("t", (_obj(0.2, 0.5), _obj(0.6, 0.5, 1, "circle", "blue")), None)
    assert {ref_of(two.objects[0], two, rng, p_size=0.0, p_bare=1.0) for _ in range(20)} == {Ref("circle", "red")}


def test_caption_templates_and_converse():
    red, blue = Ref("circle", "red"), Ref("square", "blue")
    assert caption(Rel(red, "left", blue), 0) == "a red circle to the left of a blue square"
    assert caption(Rel(blue, "right", red), 1) == "a blue square is right of a red circle"
    assert caption(Side(red, "left"), 0) == "the red circle is on the left side of the picture"
    assert caption(Has((red, Ref("star", "orange"))), 0) == "a red circle and an orange star"
    assert caption(Has((red,), (blue,)), 0) == "a red circle and no blue square"
    texts = {caption(c, s) for c in equivalents(Rel(red, "left", blue)) for s in range(5)}
    assert "a blue square to the right of a red circle" in texts and len(texts) == 10


# ------------------------------------------------------------------------------ training data


def test_training_batch_train_buckets_and_deterministic():
    idx = np.arange(40)
    images, caps = training_batch(3, idx, 48)
    assert images.shape == (40, 48, 48, 3) and images.dtype == np.uint8
    assert len(caps) == 40 and all(isinstance(c, str) and c for c in caps)
    images2, caps2 = training_batch(3, idx, 48)
    assert np.array_equal(images, images2) and caps == caps2
    ids = []
    for i in idx:
        scene, claim, style = training_scene(3, int(i))
        assert split_of(scene.scene_id) == "train"
        assert truth(claim, scene) is True and caption(claim, style) == caps[int(i)]
        ids.append(scene.scene_id)
    assert len(set(ids)) == len(ids)  # distinct indices -> distinct scenes
    # a batch is the concatenation of its items
    part, _ = training_batch(3, idx[10:12], 48)
    assert np.array_equal(part, images[10:12])
    kinds = {type(training_scene(3, i)[1]).__name__ for i in range(60)}
    assert kinds == {"Has", "Rel", "Side"}


def test_colourless_batch_is_the_same_scenes_in_white_named_by_shape():
    from pipeline.world import colourless_training_batch
    from pipeline.world.batches import COLOURLESS

    idx = np.arange(30)
    images, caps = colourless_training_batch(2, idx, 48)
    assert images.shape == (30, 48, 48, 3)
    colour_words = set(COLOURS) - {COLOURLESS}
    for i, cap in zip(idx, caps, strict=True):
        plain, _, _ = training_scene(2, int(i))
        scene, claim, style = training_scene(2, int(i), colourless=True)
        assert [(o.shape, o.x, o.y, o.r) for o in scene.objects] == [
            (o.shape, o.x, o.y, o.r) for o in plain.objects
        ]  # same scene, colour taken out
        assert {o.colour for o in scene.objects} == {COLOURLESS}
        assert truth(claim, scene) is True and caption(claim, style) == cap
        assert not colour_words & set(cap.split())
    # objects with a unique shape are named bare: most captions carry no colour word at all
    assert sum(COLOURLESS not in c.split() for c in caps) >= 10  # 15 of these 30


def test_training_batch_shapes_and_types():
    """What ``training_batch`` returns for a 200-image batch (its speed is measured, not
    asserted, by ``scripts/bench_world.py``)."""
    images, caps = training_batch(0, np.arange(100, 300), 64)
    assert images.shape == (200, 64, 64, 3) and images.dtype == np.uint8
    assert len(caps) == 200 and all(isinstance(c, str) and c for c in caps)


def test_random_scenes_have_2_to_4_objects_with_exact_boxes():
    for i in range(50):
        s = random_scene(scene_rng(0, i, "t"), f"t{i}")
        assert 2 <= len(s.objects) <= 4
        assert len({(o.colour, o.shape) for o in s.objects}) == len(s.objects)
        assert len({o.z for o in s.objects}) == len(s.objects)
        for o in s.objects:
            x0, y0, x1, y1 = o.box()
            assert 0 < x0 < o.x < x1 < 1 and 0 < y0 < o.y < y1 < 1


# ------------------------------------------------------------------------------ config errors


def test_bad_config_errors(tmp_path):
    with pytest.raises(ValueError, match="shapes-whatsup") as e:
        build_world(replace(TINY, suites=["shapes-whatsup", "nope"]), out=tmp_path, progress=False)
    assert "nope" in str(e.value)
    with pytest.raises(ValueError, match="n_aro"):
        build_world(replace(TINY, n_aro=0), out=tmp_path, progress=False)
    with pytest.raises(ValueError, match="image_size"):
        build_world(replace(TINY, image_size=4), out=tmp_path, progress=False)
    with pytest.raises(ValueError, match="n_retrieval_groups is 316, but only 315"):  # group 315 would repeat group 0's
        build_world(replace(TINY, n_retrieval_groups=316), out=tmp_path, progress=False)
    assert not (tmp_path / "manifests").exists()  # nothing written on a bad config


def test_scene_streams_are_separate_per_seed_index_and_purpose():
    """One generator per (seed, index, purpose): changing any one of the three gives another
    stream, the same three the same stream."""
    draw = lambda *key: scene_rng(*key).random(4).tolist()  # noqa: E731
    assert draw(0, 3, "layout") == draw(0, 3, "layout")
    others = [draw(1, 3, "layout"), draw(0, 4, "layout"), draw(0, 3, "colour")]
    assert all(o != draw(0, 3, "layout") for o in others)


def test_order_options_never_tie_by_their_text():
    """ARO Order's four perturbations of a shapes caption are redrawn until no option equals
    the original or an earlier one (without the redraw, these captions give ties)."""
    from pipeline.world.captions import order_options

    captions = ["a red circle left of a blue square", "a green triangle and a red circle",
                "a small red square above a large blue circle"]  # fmt: skip
    rng = np.random.default_rng(0)
    for text in captions * 25:
        options = order_options(text, rng)
        assert len(options) == 5 and options[0] == text and len(set(options)) == 5, options


def test_a_subset_rebuild_keeps_one_worlds_suites_and_deletes_another_worlds(tmp_path):
    """Rebuilding some suites of a world keeps the others when they were built with the same
    settings (world.json lists them all); with another seed they are deleted, so no suite of
    the old world is left beside the new one's."""
    import dataclasses
    import json

    from pipeline.world import build_world

    both = dataclasses.replace(TINY, seed=1, suites=["shapes-aro", "shapes-sugarcrepe"])
    build_world(both, tmp_path, progress=False, workers=1)
    build_world(dataclasses.replace(both, suites=["shapes-aro"]), tmp_path, progress=False, workers=1)
    meta = json.loads((tmp_path / "world.json").read_text())
    assert set(meta["counts"]) == {"shapes-aro", "shapes-sugarcrepe"} and meta["config"]["suites"] == ["shapes-aro", "shapes-sugarcrepe"]
    assert (tmp_path / "manifests" / "shapes-sugarcrepe.parquet").is_file()
    build_world(dataclasses.replace(both, seed=0, suites=["shapes-aro"]), tmp_path, progress=False, workers=1)
    meta = json.loads((tmp_path / "world.json").read_text())
    assert set(meta["counts"]) == {"shapes-aro"} and meta["config"]["seed"] == 0
    assert not (tmp_path / "manifests" / "shapes-sugarcrepe.parquet").exists()
    assert not (tmp_path / "images" / "shapes-sugarcrepe").exists()
