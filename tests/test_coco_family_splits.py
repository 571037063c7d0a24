"""BindCLIP's image-disjoint train/dev splits of the COCO families: a suite selection by a
manifest column, the pair loader reading only the selected rows, and the training loop
training on one split while selecting on the other."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks.base import SuiteSelection, bucket_split, hash_bucket
from pipeline.benchmarks.coco_families import FAMILIES, build_families
from pipeline.config import TrainConfig

CATS = [
    {"id": 1, "name": "dog", "supercategory": "animal"},
    {"id": 2, "name": "cat", "supercategory": "animal"},
    {"id": 4, "name": "car", "supercategory": "vehicle"},
    {"id": 5, "name": "bus", "supercategory": "vehicle"},
]
IDS = range(1, 13)
# image id -> split of train2017/<id:012d>.jpg (sha256 mod 10: 0-2 train, 3-4 validation)
TRAIN, VALIDATION = {2, 3, 8, 9}, {4, 11}
HOLDOUT = set(IDS) - TRAIN - VALIDATION


def _write_coco(root):
    """COCO-format captions + instances files for 12 images (a dog left and low, a car
    right: 6 families each) and a random JPEG per image under train2017/."""
    from PIL import Image

    images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 100, "height": 100} for i in IDS]
    anns, caps = [], []
    for i in IDS:
        for c, box in ((1, [5, 50, 20, 40]), (4, [60, 20, 30, 30])):
            anns.append(
                {
                    "id": len(anns),
                    "image_id": i,
                    "category_id": c,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
        caps.append({"id": 100 + i, "image_id": i, "caption": "A black dog sitting on a car."})
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "captions_train2017.json").write_text(
        json.dumps({"images": images, "annotations": caps})
    )
    (root / "annotations" / "instances_train2017.json").write_text(
        json.dumps({"images": images, "annotations": anns, "categories": CATS})
    )
    rng = np.random.default_rng(0)
    (root / "train2017").mkdir()
    for im in images:
        Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)).save(
            root / "train2017" / im["file_name"]
        )


def _image_ids(manifest) -> set[int]:
    return {int(p.split("/")[-1][:-4]) for p in manifest["image"]}


@pytest.fixture(scope="module")
def coco_store(tmp_path_factory, tiny_encoder):
    """The coco-families manifest of ``_write_coco`` extracted into a tiny store."""
    from pipeline.cache import FeatureStore, store_path
    from pipeline.config import ExtractConfig
    from pipeline.manifests import write_manifest
    from stages import extract as extract_stage

    root = tmp_path_factory.mktemp("coco")
    _write_coco(root)
    path = write_manifest(build_families(root), root / "coco-families.parquet", {})
    cfg = ExtractConfig(
        model="tiny-test",
        suites=["coco-families"],
        manifests={"coco-families": str(path)},
        image_roots={"coco-families": str(root)},
        out=str(root / "features"),
        batch_size=16,
    )
    extract_stage.run(cfg, progress=False, encoder=tiny_encoder)
    return FeatureStore.open(store_path(cfg))


def test_selection_syntax():
    assert SuiteSelection.parse("shapes-train") == SuiteSelection("shapes-train")
    assert SuiteSelection.parse("coco-families[train]") == SuiteSelection(
        "coco-families", "split", "train"
    )
    assert SuiteSelection.parse("coco-families[family=depth]") == SuiteSelection(
        "coco-families", "family", "depth"
    )
    for text in ("coco-families[train]", "coco-families[family=depth]", "shapes-dev"):
        assert str(SuiteSelection.parse(text)) == text
    for bad in ("coco-families[", "coco-families[]", "Coco[train]", "coco-families[a=b=c]"):
        with pytest.raises(ValueError, match="suite\\[column=value\\]"):
            SuiteSelection.parse(bad)


def test_the_split_is_image_disjoint_and_deterministic(tmp_path):
    _write_coco(tmp_path)
    m = build_families(tmp_path)
    assert len(m) == 6 * len(
        IDS
    )  # entity, attribute, role-swap, negation, relative-geometry, absolute-position
    by_split = {s: _image_ids(m[m["split"] == s]) for s in ("train", "validation", "holdout")}
    assert by_split == {"train": TRAIN, "validation": VALIDATION, "holdout": HOLDOUT}
    assert all(
        bucket_split(hash_bucket(f"train2017/{i:012d}.jpg")) == s
        for s, ids in by_split.items()
        for i in ids
    )
    assert not (
        TRAIN & VALIDATION or TRAIN & HOLDOUT or VALIDATION & HOLDOUT
    )  # no image in two splits
    assert m["split"].equals(
        build_families(tmp_path)["split"]
    )  # a hash of the path: the same every run


def test_the_dev_suite_is_the_validation_split(tmp_path):
    from pipeline.benchmarks import SUITES

    _write_coco(tmp_path)
    full = build_families(tmp_path)
    dev = SUITES.get("coco-families-dev").build_manifest(tmp_path)
    assert _image_ids(dev) == VALIDATION
    expected = full[full["split"] == "validation"].reset_index(drop=True)
    pd.testing.assert_frame_equal(dev, expected)
    assert SUITES.get("coco-families-dev").metric_names == SUITES.get("coco-families").metric_names


def test_the_pair_loader_reads_only_the_selected_split(coco_store):
    from pipeline.training.pairs import load_pairs

    everything = load_pairs(coco_store, "coco-families")
    train = load_pairs(coco_store, "coco-families[train]")
    dev = load_pairs(coco_store, "coco-families[validation]")
    assert len(everything) == 6 * len(IDS)
    assert (train.manifest["split"] == "train").all() and (
        dev.manifest["split"] == "validation"
    ).all()
    assert _image_ids(train.manifest) == TRAIN and _image_ids(dev.manifest) == VALIDATION
    assert (len(train), len(dev)) == (6 * len(TRAIN), 6 * len(VALIDATION))
    assert list(train.manifest.index) == list(range(len(train)))  # renumbered from 0
    # only the selected images' features are read: one row per image of the split
    assert (len(train.images), len(dev.images)) == (len(TRAIN), len(VALIDATION))
    index = coco_store.suite_index("coco-families")["image"][:, 0]  # [n] store row per item
    split = everything.manifest["split"].to_numpy()
    assert not set(index[split == "train"]) & set(index[split == "validation"])
    # the selected items are the same pairs as in the whole suite
    rows = everything.manifest.index[split == "train"]
    assert train.manifest["item_id"].tolist() == everything.manifest.loc[rows, "item_id"].tolist()
    pos_all = everything.texts.embed[everything.pos[rows]]
    assert (train.texts.embed[train.pos] == pos_all).all()
    assert (train.family == everything.family[rows]).all()
    same = load_pairs(coco_store, "coco-families[split=validation]")
    assert same.manifest["item_id"].tolist() == dev.manifest["item_id"].tolist()
    with pytest.raises(ValueError, match="values: holdout, train, validation"):
        load_pairs(coco_store, "coco-families[dev]")
    with pytest.raises(ValueError, match="no column 'colour'"):
        load_pairs(coco_store, "coco-families[colour=red]")


def test_the_loop_trains_on_one_split_and_selects_on_the_other(tmp_path, coco_store):
    from pipeline.training.loop import train_variant

    cfg = TrainConfig(
        variant="bindclip",
        train_suite="coco-families[train]",
        dev_suite="coco-families[validation]",
        seeds=[0],
        steps=2,
        batch_size=8,
        eval_every=1,
        out=str(tmp_path),
        threads=1,
        scorer={"h": 16, "n_iters": 8, "absorb_every": 8},
        objective={"q0_grid": []},
    )
    summary = train_variant(cfg, coco_store, progress=False)
    assert summary["dev_suite"] == "coco-families[validation]"
    dev = summary["seeds"]["0"]["dev"]  # the official family metric of the validation pairs
    assert set(dev) == {*FAMILIES[:6], "mean"}  # the families the template image yields
    rec = json.loads((tmp_path / "bindclip" / "config.json").read_text())
    assert rec["train"]["train_suite"] == "coco-families[train]"


@pytest.mark.parametrize(
    "train, dev",
    [
        ("coco-families[train]", "coco-families[train]"),
        ("coco-families", "coco-families[validation]"),
        ("coco-families[split=train]", "coco-families[family=depth]"),
    ],
)
def test_overlapping_train_and_dev_selections_are_refused(tmp_path, train, dev):
    from pipeline.training.loop import train_variant

    cfg = TrainConfig(train_suite=train, dev_suite=dev, seeds=[0], out=str(tmp_path))
    with pytest.raises(ValueError, match="overlapping rows of coco-families"):
        train_variant(cfg, store=None, progress=False)  # refused before the store is read
