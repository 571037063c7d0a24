"""Object-box retrieval suites (COCO instances + captions, Visual Genome scene graphs) on tiny
official-format files, and the caption splitter."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.objects import (
    OBJECT_SUITES,
    CocoObjectsConfig,
    VgObjectsConfig,
    build_coco_objects,
    build_vg_objects,
)
from pipeline.benchmarks.phrases import spatial_relation, split_phrases
from pipeline.benchmarks.retrieval import (
    OBJECT_COLUMNS,
    RETRIEVAL_METRICS,
    parse_boxes,
    parse_relations,
    retrieval_units,
)
from pipeline.manifests import read_manifest, write_manifest

# ---------------------------------------------------------------------------- split_phrases


@pytest.mark.parametrize(
    ("caption", "phrases", "relations"),
    [
        (
            "a red circle to the left of a blue square",
            ["red circle", "blue square"],
            [(0, "left of", 1)],
        ),
        (
            "a man holding an umbrella and a dog on a leash",
            ["man", "umbrella", "dog", "leash"],
            [(0, "holding", 1), (2, "on", 3)],
        ),
        ("A large brown dog.", ["large brown dog"], []),  # no relation word: one phrase
        ("The cat is on the right of the lamp", ["cat", "lamp"], [(0, "right of", 1)]),
        ("a cup on top of a table", ["cup", "table"], [(0, "on top of", 1)]),  # not "on"
        ("a bus in front of a building", ["bus", "building"], [(0, "in front of", 1)]),
        ("a man with a hat, a dog and a cat", ["man", "hat", "dog", "cat"], []),
        ("There is a cat sitting on a sofa", ["cat", "sofa"], [(0, "sitting on", 1)]),
        ("a man riding on a horse", ["man", "horse"], [(0, "riding on", 1)]),  # merged
        (
            "a lamp above a desk, next to a window",
            ["lamp", "desk", "window"],
            [(0, "above", 1), (1, "next to", 2)],
        ),
        ("a cat on the left and a dog", ["cat", "dog"], []),  # a position, no second object
        ("A car on the side of the road", ["car", "road"], [(0, "on the side of", 1)]),  # a place of an object
        ("A cow standing in the middle of the street", ["cow", "street"], [(0, "standing in the middle of", 1)]),
        ("a man at the top of a hill", ["man", "hill"], [(0, "at the top of", 1)]),
        ("a dog in the corner of the picture", ["dog"], []),  # a place in the frame
        ("a photo of a bird near a tree", ["bird", "tree"], [(0, "near", 1)]),
        ("a woman holding, and a dog", ["woman", "dog"], []),  # a relation without an object
        ("on a table", ["table"], []),  # a relation without its subject
        ("", [], []),
    ],
)
def test_split_phrases(caption, phrases, relations):
    assert split_phrases(caption) == (phrases, relations)


@pytest.mark.parametrize(("relation", "spatial"), [
    ("sitting on", "on"), ("Parked  to the left of", "left of"), ("standing on top of", "on top of"),
    ("on the right side of", "right of"), ("holding", "holding"), ("sitting", "sitting"), ("lying next to", "next to"),
])  # fmt: skip
def test_spatial_relation_drops_a_posture_and_canonicalises_sides(relation, spatial):
    assert spatial_relation(relation) == spatial


def test_split_phrases_relations_join_two_phrases():
    for caption in ("a dog behind a car beside a tree", "a and on the , with of under"):
        phrases, relations = split_phrases(caption)
        assert all(0 <= i < j < len(phrases) for i, _, j in relations)


# ---------------------------------------------------------------------------- COCO files

CATS = [{"id": k, "name": n} for k, n in enumerate(["person", "dog", "car", "cup"], start=1)]


def _coco(tmp_path, split="val2017"):
    images = [  # out of id order in the file
        {"id": 3, "file_name": "000000000003.jpg", "width": 100, "height": 100},
        {"id": 1, "file_name": "000000000001.jpg", "width": 200, "height": 100},
        {"id": 2, "file_name": "000000000002.jpg", "width": 100, "height": 50},
    ]
    anns = [
        (1, 2, [20, 10, 60, 40], 0),  # image 1: dog -> [0.1, 0.1, 0.4, 0.5], area 2400
        (1, 3, [150, 50, 80, 80], 0),  # car leaving the frame -> [0.75, 0.5, 1, 1], area 6400
        (1, 1, [0, 0, 200, 100], 1),  # a crowd of people: skipped
        *((2, 4, [k, 0, 1, k + 1], 0) for k in range(10)),  # image 2: 10 cups, areas 1..10
    ]
    inst = {
        "images": images,
        "categories": CATS,
        "annotations": [
            {"id": 100 + k, "image_id": im, "category_id": c, "bbox": b, "iscrowd": crowd}
            for k, (im, c, b, crowd) in enumerate(anns)
        ],
    }
    caps = [
        {"id": 12, "image_id": 1, "caption": "A dog to the left of a car."},
        {"id": 11, "image_id": 1, "caption": "A dog next to a car "},  # first by id
        {"id": 21, "image_id": 2, "caption": "Cups on a shelf"},
        {"id": 31, "image_id": 3, "caption": "An empty kitchen."},
    ]
    (tmp_path / "annotations").mkdir(exist_ok=True)
    (tmp_path / "annotations" / f"instances_{split}.json").write_text(json.dumps(inst))
    (tmp_path / "annotations" / f"captions_{split}.json").write_text(
        json.dumps({"images": images, "annotations": caps})
    )


@pytest.fixture()
def coco(tmp_path):
    _coco(tmp_path)
    return SUITES.get("coco-objects").build_manifest(tmp_path)


def _check_object_columns(m):
    for col in ("item_id", "image", "captions", "correct", "category", *OBJECT_COLUMNS):
        assert col in m
    assert (m["correct"] == 0).all() and (m["category"] == "retrieval").all()
    assert m["item_id"].is_unique
    for _, r in m.iterrows():
        assert len(r["captions"]) == 1
        assert len(parse_boxes(r["object_boxes"])) == len(r["object_names"])
        parse_relations(r["relations"], len(r["phrases"]))  # raises on a bad index


def _check_metric(m):
    n = len(m)
    scores = np.random.default_rng(0).normal(size=(n, n))  # [n_queries, n_gallery]
    units = retrieval_units(m, scores)
    assert set(units) == set(RETRIEVAL_METRICS) and all(len(u.values) == n for u in units.values())
    perfect = retrieval_units(m, np.eye(n))  # each row's own image is its gallery index
    assert perfect["R@1"].statistic() == 1.0 and perfect["mean-rank"].statistic() == 1.0


def test_coco_manifest(coco):
    _check_object_columns(coco)
    assert coco["item_id"].tolist() == ["1", "2", "3"]  # id order
    r = coco.set_index("item_id").loc["1"]
    assert r["image"] == "val2017/000000000001.jpg" and r["image_id"] == 1
    assert r["captions"] == ["A dog next to a car"]
    assert r["object_names"] == ["car", "dog"]  # largest box first; the crowd is skipped
    assert json.loads(r["object_boxes"]) == [[0.75, 0.5, 1.0, 1.0], [0.1, 0.1, 0.4, 0.5]]
    assert r["phrases"] == ["dog", "car"] and json.loads(r["relations"]) == [[0, "next to", 1]]
    assert list(r["image_size"]) == [200.0, 100.0]  # what maps the boxes onto the encoder's view
    empty = coco.set_index("item_id").loc["3"]
    assert empty["object_names"] == [] and parse_boxes(empty["object_boxes"]).shape == (0, 4)
    _check_metric(coco)


def test_coco_object_cap_keeps_the_largest(tmp_path, coco):
    cups = coco.set_index("item_id").loc["2"]  # 10 cups, box k has width 1 and height k + 1
    heights = [b[3] * 50 for b in parse_boxes(cups["object_boxes"])]
    assert cups["object_names"] == ["cup"] * 8 and np.allclose(heights, range(10, 2, -1))
    m = build_coco_objects(tmp_path, CocoObjectsConfig(max_objects=3, limit=2))
    assert m["item_id"].tolist() == ["1", "2"]
    heights = [b[3] * 50 for b in parse_boxes(m.set_index("item_id").loc["2", "object_boxes"])]
    assert np.allclose(heights, [10, 9, 8])


def test_coco_other_split(tmp_path):
    _coco(tmp_path, "val2014")
    m = build_coco_objects(tmp_path, CocoObjectsConfig(split="val2014"))
    assert m["image"].iloc[0] == "val2014/000000000001.jpg"


def test_coco_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"instances_val2017\.json.*cocodataset\.org"):
        build_coco_objects(tmp_path)
    _coco(tmp_path)
    (tmp_path / "annotations" / "captions_val2017.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"captions_val2017\.json.*trainval2017"):
        build_coco_objects(tmp_path)


# ---------------------------------------------------------------------------- Visual Genome files


def _edit_coco(tmp_path, name: str, edit) -> None:
    path = tmp_path / "annotations" / f"{name}_val2017.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("name", "edit", "message"), [
    ("captions", lambda d: d["annotations"][0].update(caption=None), r"captions_val2017\.json: caption 12: 'caption' is null; expected a non-empty string"),
    ("captions", lambda d: d["annotations"].append(dict(d["annotations"][0])), r"captions_val2017\.json: annotations: id 12 appears twice"),
    ("instances", lambda d: d["images"].append({**d["images"][0], "file_name": "dup.jpg"}), r"instances_val2017\.json: images: id 3 appears twice"),
    ("instances", lambda d: d["annotations"][0].update(bbox=[20, 10, 60]), r"instances_val2017\.json: annotation 100: bbox \[20, 10, 60\] is not \[x, y, width, height\]"),
    ("instances", lambda d: d["annotations"][0].update(bbox=[20, 10, -60, 40]), r"annotation 100: bbox \[20, 10, -60, 40\] is not .* width, height >= 0"),
    ("instances", lambda d: d["annotations"][0].update(bbox=[20, 10, "60", 40]), r"annotation 100: bbox \[20, 10, \"60\", 40\] is not"),
    ("instances", lambda d: d["categories"][0].update(name=None), r"instances_val2017\.json: category \d+: 'name' is null; expected a non-empty string"),
])  # fmt: skip
def test_coco_malformed_entries_are_refused_naming_the_file_and_entry(tmp_path, name, edit, message):
    """A null caption, a repeated id (a plain dict kept the last entry and lost an image) and
    a box that is not four numbers with a non-negative size: one line naming the file and the
    entry, at manifest time."""
    _coco(tmp_path)
    _edit_coco(tmp_path, name, edit)
    with pytest.raises(ValueError, match=message):
        build_coco_objects(tmp_path)


def _obj(oid, name, x, y, w, h, key="names"):
    return {
        "object_id": oid,
        key: [name] if key == "names" else name,
        "x": x,
        "y": y,
        "w": w,
        "h": h,
    }


MAN, HORSE, HAT, TREE = (
    _obj(1, "man", 10, 20, 30, 80),  # [0.1, 0.1, 0.4, 0.5] in 100 x 200, area 2400
    _obj(2, "Horse ", 0, 100, 100, 100),  # [0, 0.5, 1, 1], area 10000
    _obj(3, "hat", 15, 20, 10, 10),  # area 100
    _obj(4, "tree", 60, 0, 40, 40),  # area 1600
)
CUP, LAMP, TABLE = (
    _obj(5, "cup", 0, 0, 10, 10),
    _obj(6, "lamp", 0, 0, 5, 5),
    _obj(7, "table", 0, 10, 50, 60),
)


def _vg(tmp_path, attributes=True, url=True):
    meta = [
        {"image_id": 30, "width": 80, "height": 80, "url": "https://x/VG_100K/30.jpg", "coco_id": None},
        {"image_id": 20, "width": 50, "height": 50, "url": "https://x/VG_100K/20.jpg", "coco_id": 123},
        {"image_id": 10, "width": 100, "height": 200, "coco_id": None,
         **({"url": "https://cs.stanford.edu/people/rak248/VG_100K_2/10.jpg"} if url else {})},
    ]  # fmt: skip
    objects = [
        {"image_id": 10, "objects": [MAN, HORSE, HAT, TREE, dict(MAN)]},  # a duplicate id
        {"image_id": 20, "objects": [CUP, LAMP]},  # the table is only in relationships.json
        {"image_id": 30, "objects": [_obj(8, "sky", 0, 0, 80, 30)]},
    ]

    def rel(s, p, o):
        return {"predicate": p, "subject": {**s, "name": s["names"][0]}, "object": o}

    rels = [
        {"image_id": 20, "relationships": [rel(CUP, "on", CUP), rel(CUP, "ON ", TABLE)]},
        {"image_id": 30, "relationships": []},  # no relationship: no row
        {"image_id": 10, "relationships": [
            rel(MAN, "RIDING", HORSE), rel(MAN, "wearing", HAT), rel(TREE, "near", HORSE)]},
    ]  # fmt: skip
    files = {"image_data.json": meta, "objects.json": objects, "relationships.json": rels}
    if attributes:
        files["attributes.json"] = [
            {"image_id": 10, "attributes": [
                {**MAN, "attributes": ["Young", "tall"]}, {**HAT, "attributes": ["red"]}, HORSE]},
            {"image_id": 20, "attributes": [{**TABLE, "attributes": ["wooden"]}]},
        ]  # fmt: skip
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))


@pytest.fixture()
def vg(tmp_path):
    _vg(tmp_path)
    return SUITES.get("vg-objects").build_manifest(tmp_path)


def test_vg_manifest(vg):
    _check_object_columns(vg)
    assert vg["item_id"].tolist() == ["10", "20"]  # id order; image 30 has no relationship
    r = vg.set_index("item_id").loc["10"]
    assert r["image"] == "VG_100K_2/10.jpg" and r["image_id"] == 10 and pd.isna(r["coco_id"])
    # the first two relationships, attributes prepended (max_attributes=1)
    assert r["captions"] == ["young man riding horse and young man wearing red hat"]
    assert r["phrases"] == ["young man", "horse", "red hat"]  # distinct objects, first mention
    assert json.loads(r["relations"]) == [[0, "riding", 1], [0, "wearing", 2]]
    assert r["object_names"] == ["horse", "man", "tree", "hat"]  # by area, dedup by object_id
    assert len(r["image_size"]) == 2 and min(r["image_size"]) > 0
    boxes = json.loads(r["object_boxes"])
    assert boxes[:2] == [[0.0, 0.5, 1.0, 1.0], [0.1, 0.1, 0.4, 0.5]]
    assert [r["object_names"][k] for k in r["phrase_objects"]] == ["man", "horse", "hat"]
    cup = vg.set_index("item_id").loc["20"]  # the self-relation is skipped
    assert cup["captions"] == ["cup on wooden table"] and cup["coco_id"] == 123
    assert cup["image"] == "VG_100K/20.jpg"
    assert cup["object_names"] == ["table", "cup", "lamp"]  # the table came with the query
    assert json.loads(cup["object_boxes"])[0] == [0.0, 0.2, 1.0, 1.0]  # clipped at y = 1
    _check_metric(vg)


def test_vg_cap_keeps_the_query_objects(tmp_path):
    _vg(tmp_path)
    m = build_vg_objects(tmp_path, VgObjectsConfig(max_objects=3)).set_index("item_id")
    assert m.loc["10", "object_names"] == ["horse", "man", "hat"]  # the larger tree goes
    m = build_vg_objects(tmp_path, VgObjectsConfig(max_objects=2, n_relations=1, limit=1))
    assert m["item_id"].tolist() == ["10"] and m["captions"].iloc[0] == ["young man riding horse"]
    assert m["object_names"].iloc[0] == ["horse", "man"]


def test_vg_without_attributes_or_url(tmp_path):
    _vg(tmp_path, attributes=False, url=False)
    r = build_vg_objects(tmp_path).set_index("item_id").loc["10"]
    assert r["captions"] == ["man riding horse and man wearing hat"]
    assert r["phrases"] == ["man", "horse", "hat"] and r["image"] == "VG_100K/10.jpg"


def test_vg_null_predicate_is_skipped_and_a_repeated_image_refused(tmp_path):
    """A relationship with ``predicate: null`` is skipped like one without a predicate (it
    was read as the word "none"); an image listed twice in relationships.json is refused
    (the second list silently replaced the first)."""
    _vg(tmp_path)
    path = tmp_path / "relationships.json"
    rels = json.loads(path.read_text())
    rels[2]["relationships"][0]["predicate"] = None  # image 10's "man riding horse"
    path.write_text(json.dumps(rels))
    r = build_vg_objects(tmp_path).set_index("item_id").loc["10"]
    assert "none" not in r["captions"][0] and json.loads(r["relations"])[0][1] == "wearing"
    path.write_text(json.dumps([*rels, rels[0]]))
    with pytest.raises(ValueError, match=r"relationships\.json: images: id 20 appears twice"):
        build_vg_objects(tmp_path)


@pytest.mark.parametrize("missing", ["image_data.json", "objects.json", "relationships.json"])
def test_vg_missing_files(tmp_path, missing):
    _vg(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(
        FileNotFoundError, match=rf"{missing.replace('.', '[.]')}.*visualgenome\.org"
    ):
        build_vg_objects(tmp_path)


# ---------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", OBJECT_SUITES)
def test_registered_suites(name, tmp_path):
    suite = SUITES.get(name)
    assert name in SUITES.names() and suite.task == "retrieval" and suite.headline == "R@1"
    assert suite.metric_names == RETRIEVAL_METRICS and suite.units is retrieval_units
    assert {"captions", "object_names", "phrases"} <= set(suite.caption_columns)
    with pytest.raises(FileNotFoundError):
        suite.build_manifest(tmp_path)


def test_manifests_survive_parquet(tmp_path, coco, vg):
    for name, m in (("coco", coco), ("vg", vg)):
        back = read_manifest(write_manifest(m, tmp_path / f"{name}.parquet", {}))
        for col in OBJECT_COLUMNS:
            assert back[col].tolist() == m[col].tolist()
