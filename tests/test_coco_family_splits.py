"""BindCLIP's image-disjoint train/dev splits of the COCO families: a suite selection by a
manifest column, the pair loader reading only the selected rows, and the training loop
training on one split while selecting on the other."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

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
    # COCO has no counterfactual or mirrored images and captions: those stay absent (-1),
    # never local row 0 (which would train the image and reflection objectives on another item)
    for field in ("cf", "flip", "flip_pos", "flip_neg"):
        assert (getattr(everything, field) == -1).all(), field
    absent = everything.manifest["paraphrase"].isna().to_numpy()  # caption families have none
    assert absent.any() and not absent.all()
    assert ((everything.para == -1).numpy() == absent).all()
    same = load_pairs(coco_store, "coco-families[split=validation]")
    assert same.manifest["item_id"].tolist() == dev.manifest["item_id"].tolist()
    with pytest.raises(ValueError, match="values: holdout, train, validation"):
        load_pairs(coco_store, "coco-families[dev]")
    with pytest.raises(ValueError, match="no column 'colour'"):
        load_pairs(coco_store, "coco-families[colour=red]")


def test_pairs_without_an_extracted_image_are_left_out_and_counted(coco_store, monkeypatch):
    """A pair whose image was skipped at extract (row -1) is neither trained nor selected
    on (it would read another item's image through row -1): it is left out, with a warning."""
    from pipeline.training.pairs import load_pairs

    whole = load_pairs(coco_store, "coco-families[train]")
    split = pd.read_parquet(coco_store.suite_attrs("coco-families")["manifest"])["split"].to_numpy()
    first_train = int(np.flatnonzero(split == "train")[0])
    real_index = coco_store.suite_index

    def index_with_a_skipped_image(suite, **kw):
        index = {k: np.array(v) for k, v in real_index(suite, **kw).items()}
        index["image"][first_train] = -1
        return index

    monkeypatch.setattr(coco_store, "suite_index", index_with_a_skipped_image)
    with pytest.warns(UserWarning, match="coco-families: 1 of .* pairs have no image"):
        cut = load_pairs(coco_store, "coco-families[train]")
    assert len(cut) == len(whole) - 1 and (cut.image >= 0).all()
    assert cut.manifest["item_id"].tolist() == whole.manifest["item_id"].tolist()[1:]
    assert (cut.images.embed[cut.image] == whole.images.embed[whole.image[1:]]).all()


def _split_cfg(tmp_path, **kw) -> TrainConfig:
    """Two steps on coco-families[train], selected on coco-families[validation]."""
    base = dict(train_suite="coco-families[train]", dev_suite="coco-families[validation]", seeds=[0],
                steps=2, eval_every=1, out=str(tmp_path), threads=1)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_the_loop_trains_on_one_split_and_selects_on_the_other(tmp_path, coco_store):
    from pipeline.training.loop import train_variant

    cfg = _split_cfg(tmp_path, variant="bindclip", batch_size=8,
                     scorer={"h": 16, "n_iters": 8, "absorb_every": 8}, objective={"q0_grid": []})  # fmt: skip
    summary = train_variant(cfg, coco_store, progress=False)
    assert summary["dev_suite"] == "coco-families[validation]"
    dev = summary["seeds"]["0"]["dev"]  # the official family metric of the validation pairs
    assert set(dev) == {*FAMILIES[:6], "mean"}  # the families the template image yields
    rec = json.loads((tmp_path / "bindclip" / "config.json").read_text())
    assert rec["train"]["train_suite"] == "coco-families[train]"


def test_an_image_share_keeps_whole_images_alike_in_both_suites(tmp_path):
    from pipeline.benchmarks import SUITES
    from pipeline.benchmarks.base import hash_unit, image_share_mask

    _write_coco(tmp_path)
    full = build_families(tmp_path)
    keep = image_share_mask(full, 0.5)
    kept = _image_ids(full[keep])
    # ids 4, 6, 7, 11 hash below 0.5 (hash_unit of train2017/<id:012d>.jpg)
    assert kept == {i for i in IDS if hash_unit(f"train2017/{i:012d}.jpg") < 0.5} == {4, 6, 7, 11}
    assert not _image_ids(full[~keep]) & kept  # every row of a kept image is kept
    dev = SUITES.get("coco-families-dev").build_manifest(tmp_path)
    dev_cut = dev[image_share_mask(dev, 0.5)]
    cut = full[keep]
    assert dev_cut["item_id"].tolist() == cut[cut["split"] == "validation"]["item_id"].tolist()
    assert image_share_mask(full, 1.0).all()
    with pytest.raises(ValueError, match=r"in \(0, 1\], got 0"):
        image_share_mask(full, 0)
    with pytest.raises(ValueError, match="needs an `image` column"):
        image_share_mask(pd.DataFrame({"x": [1]}), 0.5)


def test_the_manifests_stage_cuts_a_suite_to_its_image_share(tmp_path):
    from pipeline.config import ManifestsConfig
    from pipeline.manifests import read_manifest
    from stages import manifests as manifests_stage

    _write_coco(tmp_path)
    cfg = ManifestsConfig(roots={"coco-families": str(tmp_path), "coco-families-dev": str(tmp_path)},
                          out=str(tmp_path / "m"), image_share={"coco-families": 0.5, "coco-families-dev": 0.5})  # fmt: skip
    counts = manifests_stage.run(cfg)
    m = read_manifest(tmp_path / "m" / "coco-families.parquet")
    assert _image_ids(m) == {4, 6, 7, 11} and counts["coco-families"] == 6 * 4
    assert list(m.index) == list(range(len(m)))
    assert _image_ids(read_manifest(tmp_path / "m" / "coco-families-dev.parquet")) == {4, 11} & VALIDATION
    bad = ManifestsConfig(roots={"coco-families": str(tmp_path)}, out=str(tmp_path / "m"), image_share={"coco-objects": 0.5})
    with pytest.raises(ValueError, match="image_share names coco-objects, not in manifests.roots"):
        manifests_stage.run(bad)


def test_a_sample_keeps_a_seeded_subset_of_the_selected_rows(tmp_path):
    _write_coco(tmp_path)
    m = build_families(tmp_path)
    train = SuiteSelection.parse("coco-families[train]")
    full = train.mask(m)
    a = train.sampled(5).mask(m)
    assert a.sum() == 5 and not (a & ~full).any()  # five of the train rows, nothing else
    assert (a == train.sampled(5, seed=0).mask(m)).all()  # the same seed, the same rows
    assert any((train.sampled(5, seed=k).mask(m) != a).any() for k in range(1, 4))
    assert (train.sampled(10_000).mask(m) == full).all()  # a cap above the rows keeps them all
    assert SuiteSelection.parse(train.sampled(5)) == train.sampled(5)  # a selection parses as itself
    assert train.sampled(5, seed=3).describe() == "coco-families[train] (a sample of at most 5 rows, seed 3)"
    assert train.sampled(None).describe() == str(train) == "coco-families[train]"
    with pytest.raises(ValueError, match="at least one row, got 0"):
        train.sampled(0)


def test_the_pair_loader_reads_only_the_sampled_rows(coco_store, monkeypatch):
    import pipeline.training.pairs as pairs

    whole = pairs.load_pairs(coco_store, "coco-families[train]")
    monkeypatch.setattr(pairs, "READ_BLOCK", 3)  # several blocks: the same features
    blocks = pairs.load_pairs(coco_store, "coco-families[train]")
    for a, b in ((whole.images, blocks.images), (whole.texts, blocks.texts)):
        for f in ("embed", "ids"):
            if hasattr(a, f):
                assert torch.equal(getattr(a, f), getattr(b, f))
    assert torch.equal(whole.images.final, blocks.images.final)
    assert torch.equal(whole.texts.tokens, blocks.texts.tokens)

    sel = SuiteSelection.parse("coco-families[train]").sampled(7, seed=1)
    part = pairs.load_pairs(coco_store, sel)
    assert len(part) == 7 and (part.manifest["split"] == "train").all()
    ids = set(part.manifest["item_id"])
    assert ids < set(whole.manifest["item_id"])
    kept = torch.from_numpy(whole.manifest["item_id"].isin(ids).to_numpy().copy())
    # the same pairs' features as in the whole split, and only their images read
    assert torch.equal(part.texts.embed[part.pos], whole.texts.embed[whole.pos[kept]])
    assert len(part.images) == len(set(part.manifest["image"])) <= 7


def test_the_loop_trains_and_selects_on_the_samples_and_records_them(tmp_path, coco_store):
    from pipeline.training.loop import train_variant

    cfg = _split_cfg(tmp_path, variant="global-m", batch_size=4, train_items=10, dev_items=4)
    summary = train_variant(cfg, coco_store, progress=False)
    assert summary["train_items"] == {
        "selection": "coco-families[train] (a sample of at most 10 rows, seed 0)",
        "items": 10,
    }
    assert summary["dev_items"]["items"] == 4
    uncapped = train_variant(dataclasses.replace(cfg, train_items=None, dev_items=None, out=str(tmp_path / "all")), coco_store, progress=False)
    assert uncapped["train_items"]["items"] == 6 * len(TRAIN)
    assert uncapped["dev_items"] == {"selection": "coco-families[validation]", "items": 6 * len(VALIDATION)}


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
