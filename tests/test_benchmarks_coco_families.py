"""COCO hard-negative families on a tiny COCO-format file, and the family metric."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import bucket_split, hash_bucket
from pipeline.benchmarks.coco_families import (
    FAMILIES,
    CocoFamiliesConfig,
    _caption_items,
    _geometric_items,
    build_families,
    family_units,
    ground,
    plural,
)

CATS = [
    {"id": 1, "name": "dog", "supercategory": "animal"},
    {"id": 2, "name": "cat", "supercategory": "animal"},
    {"id": 3, "name": "horse", "supercategory": "animal"},
    {"id": 4, "name": "car", "supercategory": "vehicle"},
    {"id": 5, "name": "bus", "supercategory": "vehicle"},
    {"id": 6, "name": "person", "supercategory": "person"},
]


def _coco(tmp_path):
    images = [
        {"id": i, "file_name": f"{i:012d}.jpg", "width": 100, "height": 100} for i in (1, 2, 3)
    ]
    boxes = [
        (1, 1, [5, 50, 20, 40]),  # image 1: dog, left, low
        (1, 4, [60, 20, 30, 30]),  # car, right
        (2, 6, [40, 10, 20, 30]),  # image 2: person above ...
        (2, 3, [35, 50, 30, 40]),  # ... a horse
        (3, 1, [10, 40, 50, 55]),  # image 3: dog reaching lower (in front) ...
        (3, 2, [30, 30, 30, 40]),  # ... overlapping a cat
    ]
    anns = [
        {"id": k, "image_id": im, "category_id": c, "bbox": b, "area": b[2] * b[3], "iscrowd": 0}
        for k, (im, c, b) in enumerate(boxes)
    ]
    caps = [
        {"id": 10, "image_id": 1, "caption": "A black dog sitting on a car."},
        {"id": 20, "image_id": 2, "caption": "A person riding a horse."},
        {"id": 30, "image_id": 3, "caption": "A dog and a cat"},
    ]
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "captions_train2017.json").write_text(
        json.dumps({"images": images, "annotations": caps})
    )
    (tmp_path / "annotations" / "instances_train2017.json").write_text(
        json.dumps({"images": images, "annotations": anns, "categories": CATS})
    )


@pytest.fixture()
def manifest(tmp_path):
    _coco(tmp_path)
    return SUITES.get("coco-families").build_manifest(tmp_path).set_index("item_id")


def _pair(m, item):
    return m.loc[item, "captions"]


def test_caption_families(manifest):
    pos, neg = _pair(manifest, "entity/1")
    assert pos == "A black dog sitting on a car." and neg in {
        "A black cat sitting on a car.",
        "A black horse sitting on a car.",
    }
    assert _pair(manifest, "entity/3")[1] == "A horse and a cat"  # the absent animal
    pos, neg = _pair(manifest, "attribute/1")
    assert (
        re.fullmatch(r"(A [^aeiou]|An [aeiou])\w* dog sitting on a car\.", neg)
        and "black" not in neg
    )
    assert _pair(manifest, "role-swap/1") == [
        "A black dog sitting on a car.",
        "A black car sitting on a dog.",
    ]
    assert _pair(manifest, "role-swap/2")[1] == "A horse riding a person."
    assert "role-swap/3" not in manifest.index  # "and" is symmetric: no swap
    assert _pair(manifest, "negation/1") == [
        "a photo of a car and no buses",
        "a photo of a bus and no cars",
    ]


def test_geometric_families_are_true_by_the_boxes(manifest):
    assert set(_pair(manifest, "relative-geometry/1")) in (
        {"a dog to the left of a car", "a dog to the right of a car"},
        {"a car to the right of a dog", "a car to the left of a dog"},
    )
    assert _pair(manifest, "relative-geometry/1")[0] in {
        "a dog to the left of a car",
        "a car to the right of a dog",
    }
    assert _pair(manifest, "absolute-position/1")[0] == "a car on the right side of the picture"
    assert _pair(manifest, "vertical/2")[0] in {"a person above a horse", "a horse below a person"}
    assert _pair(manifest, "depth/3")[0] in {"a dog in front of a cat", "a cat behind a dog"}
    assert "vertical/1" not in manifest.index and "depth/2" not in manifest.index
    row = manifest.loc["vertical/2"]
    assert row["paraphrase"] in {"a horse below a person", "a person above a horse"}
    words = row["captions"][0].split(" ")
    assert [words[k] for k in row["ground_positions"]] == row["ground_words"]
    assert sorted(row["ground_words"]) == ["horse", "person"]
    boxes = dict(zip(row["ground_words"], row["ground_boxes"], strict=True))
    assert boxes["person"] == pytest.approx([0.4, 0.1, 0.6, 0.4])


@pytest.mark.parametrize(
    "family,first,near,far",
    [  # boxes [x0, y0, x1, y1]; the second object 0.03 (under min_gap 0.05) or 0.06 away
        ("relative-geometry", [0.1, 0.4, 0.3, 0.6], [0.33, 0.4, 0.5, 0.6], [0.36, 0.4, 0.5, 0.6]),
        ("vertical", [0.4, 0.1, 0.6, 0.3], [0.4, 0.33, 0.6, 0.6], [0.4, 0.36, 0.6, 0.6]),
        ("depth", [0.2, 0.2, 0.6, 0.8], [0.3, 0.3, 0.5, 0.77], [0.3, 0.3, 0.5, 0.74]),
    ],
)
def test_spatial_families_need_the_minimum_gap(family, first, near, far):
    """A pair closer than ``min_gap`` is ambiguous to a viewer and gives no item; the same
    pair ``min_gap`` apart does."""
    cfg = CocoFamiliesConfig(min_gap=0.05)
    assert family not in _geometric_items([("dog", first), ("cat", near)], cfg, "k")
    assert family in _geometric_items([("dog", first), ("cat", far)], cfg, "k")


def test_grounding_of_caption_families(manifest):
    row = manifest.loc["role-swap/1"]  # "A black dog sitting on a car."
    assert row["ground_words"] == ["dog", "car"] and row["ground_positions"] == [2, 6]
    assert row["ground_boxes"][0] == pytest.approx([0.05, 0.5, 0.25, 0.9])
    assert manifest.loc["negation/1", "ground_words"] == ["car"]  # the absent bus is not grounded


@pytest.mark.parametrize(
    "caption",
    ["A  black dog sitting next to a car.", "A black dog\tsitting next to\na  car.", " A black dog sitting next to a car. "],
)
def test_grounding_positions_count_words_as_the_bpe_map_does(caption):
    """Word indices are read back by ``word_token_positions`` over ``caption.split()``: runs
    of whitespace (COCO captions hold some) must not shift them onto another word."""
    from pipeline.world.grounding import word_token_positions

    got = ground(caption, {"dog": [0.1, 0.1, 0.2, 0.2], "car": [0.5, 0.5, 0.9, 0.9]})
    assert got["ground_words"] == ["dog", "car"] and got["ground_positions"] == [2, 7]
    words = caption.split()
    assert [words[k] for k in got["ground_positions"]] == ["dog", "car."]
    assert len(word_token_positions(caption, got["ground_positions"])) == 2  # in range


def test_grounding_of_a_mention_inside_a_hyphenated_word():
    got = ground("a hot-dog stand and a  car", {"dog": [0, 0, 1, 1], "car": [0, 0, 1, 1]})
    assert got["ground_positions"] == [1, 5]  # "hot-dog" is word 1, "car" word 5


def test_grounding_boxes_follow_the_encoders_square_crop(manifest):
    from pipeline.scorers.bindclip.training import view_grounding

    row = manifest.loc["role-swap/1"]
    assert list(row["image_size"]) == [100.0, 100.0]
    fp = {"preprocess": {"resize_mode": "shortest"}}
    words, boxes = view_grounding([row["ground_positions"]], [row["ground_boxes"]], [row["image_size"]], fp)
    assert words == [[2, 6]] and np.allclose(boxes[0], row["ground_boxes"])  # square: unchanged
    # the same boxes on a 200 x 100 image: x in [0.25, 0.75] survives the centre crop, so
    # the dog at x 0.05-0.25 is cut away and only the car (x 0.6-0.9) stays grounded
    words, boxes = view_grounding([row["ground_positions"]], [row["ground_boxes"]], [[200.0, 100.0]], fp)
    assert words == [[6]] and np.allclose(boxes[0], [[(0.6 * 200 - 50) / 100, 0.2, 1.0, 0.5]])


def test_columns_split_and_no_counterfactuals(manifest):
    assert set(manifest["family"]) == set(FAMILIES)
    assert (manifest["correct"] == 0).all() and (manifest["category"] == manifest["family"]).all()
    for col in ("cf_image", "flip_image", "flip_captions"):
        assert manifest[col].isna().all()
    for image, row in manifest.groupby("image").first().iterrows():
        assert image.startswith("train2017/") and row["bucket"] == hash_bucket(image)
        assert row["split"] == bucket_split(hash_bucket(image))
    assert manifest.groupby("image")["split"].nunique().eq(1).all()  # image-disjoint


def test_bucket_rule():
    assert [bucket_split(b) for b in range(10)] == ["train"] * 3 + ["validation"] * 2 + [
        "holdout"
    ] * 5
    assert (
        hash_bucket("train2017/000000000001.jpg")
        == int(__import__("hashlib").sha256(b"train2017/000000000001.jpg").hexdigest(), 16) % 10
    )


def test_max_per_family_and_missing_files(tmp_path):
    _coco(tmp_path)
    m = build_families(tmp_path, CocoFamiliesConfig(max_per_family=1))
    assert m["family"].value_counts().max() == 1
    with pytest.raises(FileNotFoundError, match="captions_train2017.json.*cocodataset"):
        build_families(tmp_path / "elsewhere" / "nowhere")  # no annotations near it either
    with pytest.raises(FileNotFoundError, match=f"it is under {tmp_path}: give that folder as the root"):
        build_families(tmp_path / "nowhere")  # one level below the files


def test_an_annotation_of_an_undefined_category_names_the_file(tmp_path):
    _coco(tmp_path)
    path = tmp_path / "annotations" / "instances_train2017.json"
    inst = json.loads(path.read_text())
    inst["categories"] = [c for c in inst["categories"] if c["id"] != 4]  # the car's, referenced
    path.write_text(json.dumps(inst))
    with pytest.raises(ValueError, match=r"annotations/instances_train2017\.json: categories defines no id 4, which an entry references"):
        build_families(tmp_path)


@pytest.mark.parametrize(("section", "edit", "message"), [
    ("categories", lambda e: e.update(name=None), r"instances_train2017\.json: category 1: 'name' is null; expected a non-empty string"),
    ("annotations", lambda e: e.update(area=None), r"instances_train2017\.json: annotation 0: 'area' is null; expected a number >= 0"),
    ("annotations", lambda e: e.update(id="0"), r"instances_train2017\.json: an annotation: 'id' is \"0\"; expected an integer id"),
    ("annotations", lambda e: e.update(image_id=None), r"annotation 0: 'image_id' is null; expected an integer id"),
    ("images", lambda e: e.update(file_name=None), r"image 1: 'file_name' is null; expected a non-empty string"),
])  # fmt: skip
def test_malformed_instances_are_refused_naming_the_file_and_entry(tmp_path, section, edit, message):
    """A null name, area or file name, or a string id, is one line naming the file and the
    entry at manifest time, not a TypeError or an image path ending in ``None``."""
    _coco(tmp_path)
    path = tmp_path / "annotations" / "instances_train2017.json"
    inst = json.loads(path.read_text())
    edit(inst[section][0])
    path.write_text(json.dumps(inst))
    with pytest.raises(ValueError, match=message):
        build_families(tmp_path)


def test_plural():
    words = ("bus", "person", "knife", "teddy bear", "dog", "skis", "sheep", "broccoli", "wine glass")
    assert [plural(w) for w in words] == [
        "buses", "people", "knives", "teddy bears", "dogs", "skis", "sheep", "broccoli", "wine glasses",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("caption", "negative"),
    [
        ("Two dogs chasing a cat on the grass", "Two cats chasing a dog on the grass"),
        ("Dogs chasing a cat", "Cats chasing a dog"),
        ("A sheep standing on a bench", "A bench standing on a sheep"),
        ("Two sheep standing on a bench", "Two benches standing on a sheep"),
        ("A person riding a sheep", "A sheep riding a person"),
    ],
)
def test_role_swap_keeps_each_places_number(caption, negative):
    present = {"dog", "cat", "sheep", "bench", "person"}
    assert _caption_items([caption], present, {}, "k")["role-swap"] == (caption, negative)


def test_entity_keeps_the_number_of_a_same_plural_name():
    items = _caption_items(["Two sheep in a field", "A sheep in a field"], {"sheep"}, {"sheep": ["cow"]}, "k")
    assert items["entity"] == ("Two sheep in a field", "Two cows in a field")
    one = _caption_items(["A sheep in a field"], {"sheep"}, {"sheep": ["elephant"]}, "k")
    assert one["entity"] == ("A sheep in a field", "An elephant in a field")


@pytest.mark.parametrize("key", [f"k{i}" for i in range(12)])
def test_attribute_negative_has_a_colour_the_caption_lacks_and_never_swaps_a_category(key):
    from pipeline.benchmarks.coco_families import COLOURS

    nouns = frozenset({"orange", "cat", "dog", "frisbee"})
    cap = "A black and white cat sitting on a couch"
    pos, neg = _caption_items([cap], {"cat"}, {}, key, nouns)["attribute"]
    new = neg.split(" ")[1]  # "A red ..." or "An orange ..."
    assert pos == cap and neg.endswith(" and white cat sitting on a couch") and new in set(COLOURS) - {"black", "white"}
    # "orange" is the fruit here: no attribute pair from it, with or without another colour word
    assert "attribute" not in _caption_items(["An orange next to a dog"], {"dog"}, {}, key, nouns)
    pos, neg = _caption_items(["A dog with an orange frisbee and a red ball"], {"dog"}, {}, key, nouns)["attribute"]
    assert neg.startswith("A dog with an orange frisbee and ") and "red" not in neg and "orange ball" not in neg
    # "grey" is "gray" spelled otherwise: never the new colour of a grey thing
    pos, neg = _caption_items(["A grey and white cat"], {"cat"}, {}, key, nouns)["attribute"]
    assert "gray" not in neg.lower() and neg.lower().count("grey") + neg.lower().count("white") == 1


def test_family_metric_strict_and_unweighted_mean():
    m = pd.DataFrame({"family": ["negation", "negation", "depth"], "correct": 0})
    scores = np.array([[0.3, 0.3], [0.5, 0.1], [0.4, 0.2]])  # tie wrong, right, right
    units = family_units(m, scores)
    assert units["negation"].statistic() == 0.5 and units["depth"].statistic() == 1.0
    assert units["mean"].statistic() == pytest.approx(0.75)  # not the pooled 2/3
    assert SUITES.get("coco-families").metrics(m, scores) == {
        k: u.statistic() for k, u in units.items()
    }
    with pytest.raises(ValueError, match="unknown families"):
        family_units(pd.DataFrame({"family": ["nope"], "correct": 0}), np.array([[1.0, 0.0]]))
