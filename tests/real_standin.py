"""Stand-in data for the real path: the official annotation formats, small, and random images
under the file names the annotations name.

``write_real_standin(root)`` lays out one folder per benchmark under ``root`` the way the
official downloads are laid out (``pipeline suites`` names the files each root holds):

* SugarCrepe and SugarCrepe++: the first items of the official files in
  ``../shared/benchmarks/`` (the files themselves, cut to ``n_items`` entries each);
* ARO VG-Relation / VG-Attribution, ARO COCO-Order, What'sUp Controlled A / B, and COCO
  2017 (captions + instances, train2017 and val2017): small files in the official formats,
  written here (the official files are downloads);
* images: every path a suite's manifest names gets a random JPEG at that path under its
  image root, except ``missing`` (suite -> how many of its images to leave out), so that a
  run can show missing images being listed and counted.

Returns {suite: (annotation root, image root)} for params files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.benchmarks import SUITES

SHARED_FILES = {"sugarcrepe": ("add_att", "replace_rel", "swap_att"), "sugarcrepe_pp": ("replace_rel", "swap_att")}
CATEGORIES = [
    {"id": 1, "name": "dog", "supercategory": "animal"},
    {"id": 2, "name": "cat", "supercategory": "animal"},
    {"id": 3, "name": "car", "supercategory": "vehicle"},
    {"id": 4, "name": "cup", "supercategory": "kitchen"},
]


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _sugarcrepe(shared: Path, root: Path, n_items: int) -> None:
    for folder, names in SHARED_FILES.items():
        for name in names:
            data = json.loads((shared / folder / f"{name}.json").read_text())
            cut = data[:n_items] if isinstance(data, list) else dict(list(data.items())[:n_items])
            _write(root / folder / f"{name}.json", cut)


def _aro(root: Path) -> None:
    def vg(i: int, **kw) -> dict:
        return {"image_path": f"{1000 + i}.jpg", "bbox_x": 4, "bbox_y": 6, "bbox_w": 40, "bbox_h": 50, **kw}

    rels = ["on", "under", "on", "to the left of", "under", "on", "to the right of", "on"]
    _write(
        root / "aro" / "visual_genome_relation.json",
        [vg(i, relation_name=r, true_caption=f"the cup is {r} the table", false_caption=f"the table is {r} the cup") for i, r in enumerate(rels)],
    )
    _write(  # one attribute pair with the 25 items the official macro needs
        root / "aro" / "visual_genome_attribution.json",
        [vg(i, attributes=["white", "wooden"], true_caption="the white cup and the wooden table", false_caption="the wooden cup and the white table") for i in range(26)],
    )
    _write(
        root / "aro" / "coco_karpathy_test.json",
        [
            {"image": f"val2014/COCO_val2014_{i:012d}.jpg", "caption": [f"a man riding a red bike down road number {i}", "a dog on a couch"], "image_id": str(i)}
            for i in (1, 2, 3, 101, 102, 103)  # 1-3 are train2017 photographs too (COCO 2017 re-splits 2014)
        ],
    )


def _whatsup(root: Path) -> None:
    prep = {"on": "on", "under": "under", "left_of": "to the left of", "right_of": "to the right of", "in-front_of": "in front of", "behind": "behind"}
    for _subset, folder, name, arrangements in (
        ("a", "controlled_images", "controlled_images_dataset.json", ["left_of", "right_of", "on", "under"]),
        ("b", "controlled_clevr", "controlled_clevr_dataset.json", ["left_of", "right_of", "in-front_of", "behind"]),
    ):
        data = []
        for obj, ref in (("mug", "plate"), ("beer-bottle", "armchair"), ("book", "chair")):
            for arr in arrangements:
                others = [a for a in arrangements if a != arr]
                data.append({"image_path": f"data/{folder}/{obj}_{arr}_{ref}.jpeg", "caption_options": [f"A {obj} {prep[a]} a {ref}" for a in [arr, *others]]})
        _write(root / "whatsup" / "data" / name, data)  # the official layout: every file in data/


def _coco(root: Path, split: str, ids: range) -> None:
    """COCO captions + instances files of ``split``: a dog left and low, a car right."""
    images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 100, "height": 100} for i in ids]
    anns, caps = [], []
    for i in ids:
        for c, box in ((1, [5, 50, 20, 40]), (3, [60, 20, 30, 30])):
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": c, "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
        caps.append({"id": 100 + i, "image_id": i, "caption": "A black dog sitting next to a red car."})
        caps.append({"id": 1000 + i, "image_id": i, "caption": "A dog and a car on the street."})
    _write(root / "coco" / "annotations" / f"captions_{split}.json", {"images": images, "annotations": caps})
    _write(root / "coco" / "annotations" / f"instances_{split}.json", {"images": images, "annotations": anns, "categories": CATEGORIES})


def write_real_standin(root: Path, shared: Path, n_items: int = 6, missing: dict[str, int] | None = None) -> dict[str, tuple[Path, Path]]:
    """Write the stand-in data under ``root``; returns {suite: (annotation root, image root)}."""
    from PIL import Image

    root = Path(root)
    _sugarcrepe(shared, root, n_items)
    _aro(root)
    _whatsup(root)
    _coco(root, "train2017", range(1, 25))
    _coco(root, "val2017", range(101, 109))
    roots = {
        "aro-relation": (root / "aro", root / "aro" / "images"),  # the official layout: images/ beside the JSON
        "aro-attribution": (root / "aro", root / "aro" / "images"),
        "aro-coco-order": (root / "aro", root / "coco2014"),
        "sugarcrepe": (root / "sugarcrepe", root / "coco" / "val2017"),
        "sugarcrepe-pp": (root / "sugarcrepe_pp", root / "coco" / "val2017"),
        "whatsup-a": (root / "whatsup" / "data", root / "whatsup"),
        "whatsup-b": (root / "whatsup" / "data", root / "whatsup"),
        "coco-families": (root / "coco", root / "coco"),
        "coco-families-dev": (root / "coco", root / "coco"),
        "coco-objects": (root / "coco", root / "coco"),
        "coco-objects-train": (root / "coco", root / "coco"),
    }
    targets: set[Path] = set()
    left_out: set[Path] = set()
    for suite, (ann_root, image_root) in roots.items():
        df = SUITES.get(suite).build_manifest(ann_root)
        paths = sorted({p for col in SUITES.get(suite).image_columns if col in df for p in df[col].dropna()})
        targets |= {image_root / rel for rel in paths}
        left_out |= {image_root / rel for rel in paths[: (missing or {}).get(suite, 0)]}
    rng = np.random.default_rng(0)
    for target in sorted(targets - left_out):
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(target, format="JPEG")
    return roots
