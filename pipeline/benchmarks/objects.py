"""Real-data text -> image retrieval suites whose rows carry object boxes, for the
geometry-aware rerankers (COCO instances + captions, Visual Genome scene graphs).

Every row is one gallery image and its query (``captions = [query]``, ``correct = 0``,
``category = "retrieval"``) plus the object columns of :mod:`pipeline.benchmarks.retrieval`:
``object_names`` / ``object_boxes`` (the image's annotated objects, boxes normalised to [0, 1]
by the image's width and height, y down, clipped), ``image_size`` (the image's ``[width,
height]`` in pixels: where the encoder's square crop puts the boxes on its patch grid,
:func:`pipeline.world.grounding.view_boxes`) and ``phrases`` / ``relations`` (the
query's object phrases and the relations between them). Metric: ``retrieval_units``
(R@1, R@5, R@10, nDCG@10, mean-rank) over the gallery of all rows. No image is opened.

* ``coco-objects``: COCO val2017. Files under the COCO root: ``annotations/instances_val2017.json``
  and ``annotations/captions_val2017.json`` (``annotations_trainval2017.zip`` from
  cocodataset.org; other splits, e.g. ``val2014`` from ``annotations_trainval2014.zip``, via
  ``CocoObjectsConfig.split``). ``image = <split>/<file_name>``; the query is the image's
  first caption by annotation id; objects are the non-crowd instances (category names),
  the ``max_objects`` largest by box area. COCO has no scene graph of its captions, so
  ``phrases`` / ``relations`` come from ``split_phrases(query)``.
* ``coco-objects-train``: the same on COCO train2017, its first 10,000 captioned images by
  id: what the ridge mapper is fitted on for real data (no image shared with val2017).
* ``vg-objects`` (every image with a relationship) and ``vg-objects-5k`` (the first 5,000 of
  them by image id): Visual Genome v1.4 / v1.2. Files under the VG root: ``image_data.json``,
  ``objects.json``, ``relationships.json`` and, optional, ``attributes.json``
  (visualgenome.org, "Download"). ``image = VG_100K[_2]/<id>.jpg``, the folder read from the
  image's ``url``. The query states the image's first ``n_relations`` relationships
  (file order, skipping ones without names/predicate or joining an object to itself),
  ``"<subject> <predicate> <object>"`` joined with ``" and "``; names are prefixed by the
  object's first ``max_attributes`` attributes when ``attributes.json`` is present. The
  scene annotation gives ``phrases`` (the distinct objects the query mentions, by object_id)
  and ``relations`` directly, and ``phrase_objects`` (VG only) is each phrase's index in
  ``object_names``: the query's objects are always kept, the rest of the cap goes to the
  largest other objects.

Object lists (both) are sorted by box area, largest first, ties by annotation/object id.
``phrases`` / ``relations`` of COCO come from :func:`pipeline.benchmarks.phrases.split_phrases`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.benchmarks.base import SUITES, Suite
from pipeline.benchmarks.intake import (
    OFFICIAL,
    bbox_field,
    entry_list,
    field_error,
    id_index,
    integer_field,
    number_field,
    off_image,
    read_json_list,
    read_json_object,
    relative_image_path,
    report_off_image,
    require_file,
    shown,
    string_list_field,
    text_field,
)
from pipeline.benchmarks.phrases import split_phrases
from pipeline.benchmarks.retrieval import (
    OBJECT_CAPTION_COLUMNS,
    RETRIEVAL_METRICS,
    retrieval_units,
)


def _norm_box(x: float, y: float, w: float, h: float, width: float, height: float) -> list[float]:
    """Pixel ``[x, y, w, h]`` -> ``[x0, y0, x1, y1]`` / image size, clipped to [0, 1]."""

    def clip(v: float) -> float:
        return round(min(max(v, 0.0), 1.0), 6)

    return [clip(x / width), clip(y / height), clip((x + w) / width), clip((y + h) / height)]


def _image_size(meta: dict, path: Path, where: str) -> tuple[float, float]:
    """An image entry's ``width`` and ``height``: positive numbers, named with the file."""
    return tuple(number_field(meta, k, path, where, positive=True) for k in ("width", "height"))


def _row(
    item: str,
    image: str,
    caption: str,
    names: list[str],
    boxes: list[list[float]],
    phrases: list[str],
    relations: list[tuple[int, str, int]],
    size: tuple[float, float],
) -> dict:
    """One manifest row with the object columns (boxes and relations as JSON)."""
    return {
        "item_id": item,
        "image": image,
        "captions": [caption],
        "correct": 0,
        "category": "retrieval",
        "object_names": list(names),
        "object_boxes": json.dumps(boxes),
        "image_size": [float(size[0]), float(size[1])],
        "phrases": list(phrases),
        "relations": json.dumps([[i, r, j] for i, r, j in relations]),
    }


# ---------------------------------------------------------------------------- COCO

COCO_SOURCE = (
    "download annotations_trainval{year}.zip from cocodataset.org "
    "(images.cocodataset.org/annotations/) and unzip it under the COCO root"
)


@dataclass(frozen=True)
class CocoObjectsConfig:
    split: str = "val2017"  # annotations/{instances,captions}_<split>.json, images <split>/
    limit: int | None = None  # keep the first `limit` captioned images by image id (None: all)
    max_objects: int = 8  # objects kept per image: the largest by box area


def build_coco_objects(root: Path, cfg: CocoObjectsConfig | None = None) -> pd.DataFrame:
    """The COCO object-retrieval manifest from the instances + captions files under ``root``."""
    cfg = cfg or CocoObjectsConfig()
    source = COCO_SOURCE.format(year=cfg.split[-4:])
    inst_path = require_file(root, f"annotations/instances_{cfg.split}.json", source)
    cap_path = require_file(root, f"annotations/captions_{cfg.split}.json", source)
    first_caption: dict[int, tuple[int, str]] = {}
    cap_entries = entry_list(read_json_object(cap_path, source), "annotations", cap_path)
    captions = id_index(((a["id"], a) for a in cap_entries), f"{cap_path}: annotations")
    for cap_id, a in captions.items():
        best = first_caption.get(a["image_id"])
        if best is None or cap_id < best[0]:
            first_caption[a["image_id"]] = (cap_id, text_field(a, "caption", cap_path, f"caption {cap_id}").strip())
    inst = read_json_object(inst_path, source)
    cats = id_index(
        ((c["id"], text_field(c, "name", inst_path, f"category {c['id']}")) for c in entry_list(inst, "categories", inst_path)),
        f"{inst_path}: categories",
    )
    images = id_index(((im["id"], im) for im in entry_list(inst, "images", inst_path)), f"{inst_path}: images")
    anns: dict[int, list[dict]] = {}
    for a in id_index(((a["id"], a) for a in entry_list(inst, "annotations", inst_path)), f"{inst_path}: annotations").values():
        if not a.get("iscrowd", 0):
            a["bbox"] = bbox_field(a, "bbox", inst_path, f"annotation {a['id']}")
            anns.setdefault(a["image_id"], []).append(a)

    ids = sorted(i for i in images if i in first_caption)
    rows, left_out = [], []
    for image_id in ids[: cfg.limit]:
        im, item = images[image_id], str(image_id)
        width, height = _image_size(im, inst_path, f"image {image_id}")
        own = anns.get(image_id, [])
        left_out += [f"image {image_id}, annotation {a['id']}" for a in own if off_image(a["bbox"], width, height)]
        on = [a for a in own if not off_image(a["bbox"], width, height)]
        objs = sorted(on, key=lambda a: (-a["bbox"][2] * a["bbox"][3], a["id"]))
        objs = objs[: cfg.max_objects]
        unknown = sorted({a["category_id"] for a in objs} - set(cats))
        if unknown:
            raise ValueError(f"COCO image {image_id}: unknown category ids {unknown}")
        caption = first_caption[image_id][1]
        phrases, relations = split_phrases(caption)
        rows.append(
            {
                **_row(
                    item,
                    relative_image_path(f"{cfg.split}/{text_field(im, 'file_name', inst_path, f'image {image_id}')}", item),
                    caption,
                    [cats[a["category_id"]] for a in objs],
                    [_norm_box(*a["bbox"], width, height) for a in objs],
                    phrases,
                    relations,
                    (width, height),
                ),
                "image_id": image_id,
            }
        )
    if not rows:
        raise ValueError(f"no captioned image in {inst_path} / {cap_path}")
    report_off_image(inst_path, left_out, "left out of their images' object lists")
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- Visual Genome

VG_SOURCE = (
    "download it (v1.4 or v1.2, zipped JSON) from visualgenome.org/api/v0/api_home.html "
    "and unzip it under the VG root"
)


@dataclass(frozen=True)
class VgObjectsConfig:
    limit: int | None = None  # keep the first `limit` images (by id) with a relationship
    max_objects: int = 8  # objects kept per image: the query's, then the largest others
    n_relations: int = 2  # relationships per query, the image's first valid ones
    max_attributes: int = 1  # attributes prefixed to a query object's name (attributes.json)


def _vg_id(entry: dict, path: Path, index: int) -> int:
    """An entry's image id (``image_id``, or ``id`` in v1.2's image_data.json): an integer."""
    return integer_field(entry, "image_id" if "image_id" in entry else "id", path, f"entry {index}")


def _listed(entry: dict, key: str, path: Path, where: str) -> list:
    """``entry[key]`` of a VG per-image entry as a list (empty when absent or null: an
    image without objects or attributes), or a ValueError naming the file, the image and
    the key; a JSON object there would be iterated as its keys."""
    value = entry.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise field_error(entry, key, value, path, where, "a list")
    return value


def _vg_entries(path: Path) -> list[tuple[int, dict]]:
    """``(image id, entry)`` of a VG file that lists one entry per image."""
    return [(_vg_id(e, path, k), e) for k, e in enumerate(read_json_list(path, source=VG_SOURCE))]


@dataclass(frozen=True)
class _VgObject:
    """One VG object as a query or a row uses it: its id, its name and the raw entry whose
    box :func:`_vg_box` reads (with the file and place that name it in an error)."""

    oid: int
    name: str
    entry: dict
    path: Path
    where: str


def _vg_object(obj: Any, path: Path, where: str) -> _VgObject:
    """A VG object entry checked: ``object_id`` an integer; ``names`` (v1.4) a list of strings,
    or ``name`` (v1.2, relationships) a string; the name is the first, lower-cased with
    whitespace collapsed ("" for an unnamed object, which the loader skips). A string in
    ``names`` is refused, not read as its first character."""
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: {where} is {shown(obj)}, not a JSON object; {OFFICIAL}")
    oid = integer_field(obj, "object_id", path, where)
    where = f"{where} (object {oid})"
    names = string_list_field(obj, "names", path, where, blank_ok=True) if obj.get("names") is not None else []
    if not names:
        name = obj.get("name")
        if name is not None and not isinstance(name, str):
            raise field_error(obj, "name", name, path, where, "a string")
        names = [name or ""]
    return _VgObject(oid, " ".join(names[0].lower().split()), obj, path, where)


def _vg_box(obj: _VgObject) -> tuple[float, float, float, float]:
    """The object's pixel ``(x, y, w, h)``: numbers with ``w, h >= 0``; otherwise a
    ValueError naming the file, the image and the object."""
    d, path, where = obj.entry, obj.path, obj.where
    box = [number_field(d, k, path, where) for k in ("x", "y")]
    box += [number_field(d, k, path, where, minimum=0) for k in ("w", "h")]
    return tuple(box)


def _vg_image_path(meta: dict, image_id: int) -> str:
    """``<folder>/<file>`` from the image url (``.../VG_100K_2/1.jpg``), else ``VG_100K/<id>.jpg``."""
    parts = str(meta.get("url") or "").rstrip("/").split("/")
    rel = "/".join(parts[-2:]) if len(parts) >= 2 and parts[-2] else f"VG_100K/{image_id}.jpg"
    return relative_image_path(rel, f"VG image {image_id}")


Query = list[tuple[_VgObject, str, _VgObject]]


def _vg_query(rels: Any, n: int, path: Path, image_id: int) -> Query:
    """The first ``n`` relationships with names, a predicate and two distinct objects."""
    out: Query = []
    if not isinstance(rels, list):
        raise ValueError(f"{path}: image {image_id}: 'relationships' is {shown(rels)}; expected a list; {OFFICIAL}")
    for k, r in enumerate(rels):
        where = f"image {image_id}, relationship {k}"
        if not isinstance(r, dict):
            raise ValueError(f"{path}: {where} is {shown(r)}, not a JSON object; {OFFICIAL}")
        s, o = (_vg_object(r[role], path, f"{where}, {role}") for role in ("subject", "object"))
        pred = r.get("predicate")
        pred = " ".join(pred.lower().split()) if isinstance(pred, str) else ""
        if pred and s.name and o.name and s.oid != o.oid:
            out.append((s, pred, o))
            if len(out) == n:
                break
    return out


def build_vg_objects(root: Path, cfg: VgObjectsConfig | None = None) -> pd.DataFrame:
    """The Visual Genome object-retrieval manifest from the files under ``root``; the
    files are read one at a time, keeping only what the selected images need. Every field
    the manifest takes is checked against the official format, naming the file, the image,
    the object and the field: ids are integers (``coco_id`` an integer or null), names
    strings, an object's attributes a list of strings, box coordinates numbers with
    ``w, h >= 0`` on the image, and image sizes positive numbers."""
    cfg = cfg or VgObjectsConfig()
    meta_path = require_file(root, "image_data.json", VG_SOURCE)
    rel_path = require_file(root, "relationships.json", VG_SOURCE)
    obj_path = require_file(root, "objects.json", VG_SOURCE)
    attr_path = Path(root) / "attributes.json"

    queries: dict[int, Query] = {}
    entries = id_index(_vg_entries(rel_path), f"{rel_path}: images")
    for image_id, entry in sorted(entries.items()):
        if cfg.limit is not None and len(queries) >= cfg.limit:
            break
        if q := _vg_query(entry.get("relationships") or [], cfg.n_relations, rel_path, image_id):
            queries[image_id] = q
    if not queries:
        raise ValueError(f"no image in {rel_path} has a usable relationship")
    meta = {i: m for i, m in _vg_entries(meta_path) if i in queries}
    missing = sorted(set(queries) - set(meta))
    if missing:
        raise ValueError(f"images {missing[:5]} of relationships.json are not in {meta_path}")
    sizes = {i: _image_size(m, meta_path, f"image {i}") for i, m in meta.items()}
    objects: dict[int, dict[int, _VgObject]] = {i: {} for i in queries}
    for i, entry in _vg_entries(obj_path):
        if i in objects:
            for k, raw in enumerate(_listed(entry, "objects", obj_path, f"image {i}")):
                o = _vg_object(raw, obj_path, f"image {i}, objects entry {k}")
                if o.name:
                    objects[i].setdefault(o.oid, o)  # dedup by object_id
    mentioned = {(i, x.oid) for i, q in queries.items() for s, _, o in q for x in (s, o)}
    attrs: dict[tuple[int, int], list[str]] = {}
    if attr_path.is_file() and cfg.max_attributes > 0:
        for i, entry in _vg_entries(attr_path):
            if i not in queries:
                continue
            for k, o in enumerate(_listed(entry, "attributes", attr_path, f"image {i}")):
                where = f"image {i}, attributes entry {k}"
                oid = integer_field(o, "object_id", attr_path, where)
                if (i, oid) in mentioned and (i, oid) not in attrs:
                    names = string_list_field(o, "attributes", attr_path, where, blank_ok=True) if o.get("attributes") is not None else []
                    attrs[(i, oid)] = list(dict.fromkeys(c for a in names if (c := " ".join(a.lower().split()))))

    rows, left_out, unseen = [], [], []
    for image_id, query in queries.items():
        item = str(image_id)
        width, height = sizes[image_id]
        objs = objects[image_id]
        ids: list[int] = []  # the query's objects, first mention first
        for s, _, o in query:
            for x in (s, o):
                objs.setdefault(x.oid, x)  # a query object missing from objects.json
                if x.oid not in ids:
                    ids.append(x.oid)
        boxes = {oid: _vg_box(obj) for oid, obj in objs.items()}
        off = [oid for oid, box in boxes.items() if off_image(box, width, height)]
        if any(oid in ids for oid in off):  # the query names an object that is not in the picture
            unseen.append(f"image {image_id}, object {next(oid for oid in off if oid in ids)}")
            continue
        left_out += [f"image {image_id}, object {oid}" for oid in off]
        for oid in off:
            del objs[oid], boxes[oid]

        def area(oid: int, boxes=boxes) -> tuple[float, int]:
            _, _, w, h = boxes[oid]
            return -w * h, oid

        others = sorted((oid for oid in objs if oid not in ids), key=area)
        kept = sorted([*ids, *others[: max(cfg.max_objects - len(ids), 0)]], key=area)
        phrases = [
            " ".join([*attrs.get((image_id, oid), [])[: cfg.max_attributes], objs[oid].name])
            for oid in ids
        ]
        relations = [(ids.index(s.oid), p, ids.index(o.oid)) for s, p, o in query]
        caption = " and ".join(f"{phrases[i]} {p} {phrases[j]}" for i, p, j in relations)
        coco_id = meta[image_id].get("coco_id")
        if coco_id is not None and (not isinstance(coco_id, int) or isinstance(coco_id, bool)):
            raise field_error(meta[image_id], "coco_id", coco_id, meta_path, f"image {image_id}", "an integer COCO image id or null")
        rows.append(
            {
                **_row(
                    item,
                    _vg_image_path(meta[image_id], image_id),
                    caption,
                    [objs[oid].name for oid in kept],
                    [_norm_box(*boxes[oid], width, height) for oid in kept],
                    phrases,
                    relations,
                    (width, height),
                ),
                "phrase_objects": [kept.index(oid) for oid in ids],
                "image_id": image_id,
                "coco_id": coco_id,
            }
        )
    report_off_image(obj_path, unseen, "named by their images' queries: those images are left out")
    report_off_image(obj_path, left_out, "left out of their images' object lists")
    if not rows:
        raise ValueError(f"no image of {rel_path} is left: every query names an object outside its image")
    df = pd.DataFrame(rows)
    df["coco_id"] = df["coco_id"].astype("Int64")
    return df


# ---------------------------------------------------------------------------- registration

_ENTRIES = {
    "coco-objects": (
        partial(build_coco_objects, cfg=CocoObjectsConfig()),
        "COCO val2017 first captions, instance boxes: root = COCO root holding "
        "annotations/instances_val2017.json and captions_val2017.json; images under root/val2017/",
    ),
    "coco-objects-train": (
        partial(build_coco_objects, cfg=CocoObjectsConfig(split="train2017", limit=10000)),
        "coco-objects on COCO train2017 (first 10,000 captioned images by id): the geometry "
        "mapper's training split, disjoint from coco-objects' val2017 images; root = COCO root "
        "holding annotations/instances_train2017.json and captions_train2017.json; images under root/train2017/",
    ),
    "vg-objects": (
        partial(build_vg_objects, cfg=VgObjectsConfig()),
        "Visual Genome relationship queries, object boxes: root = VG root holding "
        "image_data.json, objects.json, relationships.json (attributes.json optional); "
        "images under root/VG_100K[_2]/",
    ),
    "vg-objects-5k": (
        partial(build_vg_objects, cfg=VgObjectsConfig(limit=5000)),
        "vg-objects on the first 5,000 images (by id) with a relationship",
    ),
}
OBJECT_SUITES = tuple(_ENTRIES)

for _name, (_build, _what) in _ENTRIES.items():
    SUITES.register(
        _name,
        Suite(
            name=_name,
            task="retrieval",
            build_manifest=_build,
            units=retrieval_units,
            metric_names=RETRIEVAL_METRICS,
            headline="R@1",
            categories=("retrieval",),
            description=_what,
            caption_columns=("captions", *OBJECT_CAPTION_COLUMNS),
        ),
    )
