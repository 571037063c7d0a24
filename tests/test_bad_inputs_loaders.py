"""Bad official annotation files for the ARO, What'sUp, COCO-objects and Visual Genome
loaders, given to the real ``pipeline manifest`` command: a field of the wrong type (a string
where the official file has a list, ``null`` or text where it has a number), a box off its
image, a repeated entry, a file of the wrong shape or with no entry. Each is refused with one
``error:`` line naming the file, the entry and the field, what was found and what is
expected, never read character by character, kept as an empty box or counted twice.
Helpers are ``tests/test_bad_inputs.py``'s; the COCO and VG stand-ins are
``tests/test_benchmarks_objects.py``'s."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_bad_inputs import cli, refused
from tests.test_benchmarks_objects import _coco, _vg

pytestmark = pytest.mark.bad_input


def manifest(suite: str, root: Path, out: Path):
    return cli("manifest", "--suite", suite, "--root", root, "--out", out)


def edit_json(path: Path, edit: Callable) -> None:
    """Rewrite ``path``'s JSON with ``edit(data)`` applied (its return value, if any, replaces it)."""
    data = json.loads(path.read_text())
    new = edit(data)
    path.write_text(json.dumps(data if new is None else new))


# ---------------------------------------------------------------- ARO


def aro_entry(i: int, **fields: object) -> dict:
    base = {
        "image_path": f"{1000 + i}.jpg", "bbox_x": 4, "bbox_y": 6, "bbox_w": 40, "bbox_h": 50,
        "true_caption": "the cup is on the table", "false_caption": "the table is on the cup",
    }  # fmt: skip
    return {**base, **fields}


def aro(tmp: Path, suite: str, data: object) -> tuple[Path, object]:
    """``pipeline manifest`` of ``suite`` (aro-relation / aro-attribution) over ``data``."""
    name = {"aro-relation": "visual_genome_relation.json", "aro-attribution": "visual_genome_attribution.json"}[suite]
    (tmp / "aro").mkdir()
    path = tmp / "aro" / name
    path.write_text(json.dumps(data))
    return path, manifest(suite, tmp / "aro", tmp / "out.parquet")


@pytest.mark.parametrize(
    "fields,says",
    [
        ({"bbox_w": None}, "entry 1: 'bbox_w' is null; expected a number >= 0"),
        ({"bbox_w": "abc"}, "entry 1: 'bbox_w' is \"abc\"; expected a number"),
        ({"bbox_h": -5}, "entry 1: 'bbox_h' is -5; expected a number >= 0"),
        ({"bbox_x": True}, "entry 1: 'bbox_x' is true; expected a number"),
        ({"relation_name": 5}, "entry 1: 'relation_name' is 5; expected a non-empty string"),
        ({"false_caption": ["b on a"]}, "entry 1: 'false_caption' is [\"b on a\"]; expected a non-empty string"),
    ],
    ids=["null-width", "text-width", "negative-height", "boolean-x", "integer-relation", "list-caption"],
)
def test_an_aro_relation_field_of_the_wrong_type_is_named(tmp_path, fields, says):
    path, result = aro(tmp_path, "aro-relation", [aro_entry(0, relation_name="on"), aro_entry(1, **{"relation_name": "on", **fields})])
    refused(result, str(path), says, "replace it with the official file")
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("attributes", ["white", ["white"], ["white", "wooden", "old"], ["white", 3], None], ids=["string", "one", "three", "number", "null"])
def test_aro_attributes_that_are_not_two_strings_are_refused(tmp_path, attributes):
    """A string (whose first two characters ``'w'``, ``'h'`` would pass as two attributes), one
    element, three, a number or null: each refused naming the file and the entry."""
    good = aro_entry(0, attributes=["white", "wooden"])
    path, result = aro(tmp_path, "aro-attribution", [good, aro_entry(1, attributes=attributes)])
    refused(result, str(path), f"entry 1: 'attributes' is {json.dumps(attributes)}; expected a list of 2 non-empty strings")


@pytest.mark.parametrize("name", ["mug_plate.jpeg", "mug__plate.jpeg", "mug.jpeg"])
def test_a_whatsup_file_name_without_its_arrangement_names_the_file_and_entry(tmp_path, name):
    path, result = whatsup_a(tmp_path, lambda d: d[3].update(image_path=f"data/controlled_images/{name}"))
    refused(result, str(path), "entry 3 (item a/3)", f"What'sUp file name {name!r} is not <obj>_<arrangement>_<ref>.jpeg")


def test_a_whatsup_name_keys_its_reference_without_the_suffix_whatever_its_length():
    from pipeline.benchmarks.whatsup import parse_controlled_name

    assert parse_controlled_name("x/mug_left_of_plate.png") == parse_controlled_name("x/mug_left_of_plate.jpeg") == ("mug|plate", "left")


@pytest.mark.parametrize("data,says", [({}, "expected a JSON list of entries, got an object"), ([], "holds no entry (an empty JSON list)")], ids=["object", "empty"])
def test_an_aro_file_that_is_an_object_or_empty_is_named_not_the_output(tmp_path, data, says):
    path, result = aro(tmp_path, "aro-relation", data)
    line = refused(result, str(path), says, "mertyg/vision-language-models-are-bows")
    assert "_Entry" not in line and "out.parquet" not in line


# ---------------------------------------------------------------- What'sUp Controlled


def whatsup_a(tmp: Path, edit: Callable | None = None) -> tuple[Path, object]:
    """``pipeline manifest --suite whatsup-a`` over two complete keys, ``edit`` applied to the
    list (its return value, if any, replaces it)."""
    data = []
    for obj, ref in (("mug", "plate"), ("book", "chair")):
        arrangements = ["left_of", "right_of", "on", "under"]
        for arr in arrangements:
            options = [f"A {obj} {a.replace('_', ' ')} a {ref}" for a in [arr, *(a for a in arrangements if a != arr)]]
            data.append({"image_path": f"data/controlled_images/{obj}_{arr}_{ref}.jpeg", "caption_options": options})
    new = edit(data) if edit is not None else None
    data = data if new is None else new
    (tmp / "data").mkdir()
    path = tmp / "data" / "controlled_images_dataset.json"
    path.write_text(json.dumps(data))
    return path, manifest("whatsup-a", tmp / "data", tmp / "w.parquet")


def test_a_good_whatsup_file_still_builds(tmp_path):
    _, result = whatsup_a(tmp_path)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "held,given",
    [("w/data", "w"), ("w/data", "w/data/controlled_images"), ("w/official", "w")],
    ids=["root-holding-data", "a-subfolder-given", "another-subfolder-of-the-root"],
)
def test_a_root_one_level_off_names_the_folder_that_holds_the_file(tmp_path, held, given):
    """The file in ``root/data``, in ``root``'s parent or in another subfolder of ``root``: the
    refusal names that folder as the root to give, not the download."""
    path, _ = whatsup_a(tmp_path)
    (tmp_path / held).mkdir(parents=True)
    path.rename(tmp_path / held / path.name)
    (tmp_path / given).mkdir(parents=True, exist_ok=True)
    line = refused(manifest("whatsup-a", tmp_path / given, tmp_path / "w.parquet"), f"{path.name} not found")
    assert f"it is under {tmp_path / held}: give that folder as the root" in line
    assert "download" not in line


def test_an_aro_root_given_as_its_image_folder_names_the_annotation_folder(tmp_path):
    aro(tmp_path, "aro-relation", [aro_entry(0)])
    (tmp_path / "aro" / "images").mkdir()
    line = refused(manifest("aro-relation", tmp_path / "aro" / "images", tmp_path / "o.parquet"), "visual_genome_relation.json")
    assert f"it is under {tmp_path / 'aro'}: give that folder as the root" in line
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    line = refused(manifest("aro-relation", empty, tmp_path / "o.parquet"), "visual_genome_relation.json")
    assert "give that folder" not in line and "github.com" in line  # nothing near: where to get it


@pytest.mark.parametrize(
    "options",
    ["Amug", ["A mug to the left of a plate"], ["a", "b", "c"], ["a", "b", "c", None], []],
    ids=["string", "one-option", "three-options", "null-option", "empty"],
)
def test_whatsup_caption_options_that_are_not_four_strings_are_refused(tmp_path, options):
    """A string (which would be split into its characters) or a list of another length (one
    option makes a question that cannot be answered wrong): refused naming the entry."""
    path, result = whatsup_a(tmp_path, lambda d: d[2].update(caption_options=options))
    refused(result, str(path), f"entry 2: 'caption_options' is {json.dumps(options)}; expected a list of 4 non-empty strings")


def test_a_repeated_whatsup_entry_is_refused_naming_both_entries(tmp_path):
    """An exact copy appended to the file became an extra item counted in the metrics."""
    path, result = whatsup_a(tmp_path, lambda d: d.append(dict(d[0])))
    refused(result, str(path), "entry 8 is a copy of entry 0", "mug_left_of_plate.jpeg", "count twice")


def test_two_whatsup_entries_for_one_image_are_refused(tmp_path):
    def other_options(d):
        d.append({**d[1], "caption_options": list(reversed(d[1]["caption_options"]))})

    path, result = whatsup_a(tmp_path, other_options)
    refused(result, str(path), "entry 8 is another entry for the image of entry 1", "mug_right_of_plate.jpeg")


@pytest.mark.parametrize("data,says", [({}, "expected a JSON list of entries, got an object"), ([], "holds no entry (an empty JSON list)")], ids=["object", "empty"])
def test_a_whatsup_file_that_is_an_object_or_empty_is_named(tmp_path, data, says):
    path, result = whatsup_a(tmp_path, lambda d: data)
    line = refused(result, str(path), says, "amitakamath/whatsup_vlms")
    assert "_Entry" not in line and "w.parquet" not in line


# ---------------------------------------------------------------- Visual Genome objects


def vg(tmp: Path, name: str, edit: Callable) -> tuple[Path, object]:
    """``pipeline manifest --suite vg-objects`` over the stand-in with ``name`` edited."""
    _vg(tmp)
    path = tmp / name
    edit_json(path, edit)
    return path, manifest("vg-objects", tmp, tmp / "vg.parquet")


def _object(data: list, image_id: int, object_id: int) -> dict:
    entry = next(e for e in data if e["image_id"] == image_id)
    return next(o for o in entry["objects"] if o["object_id"] == object_id)


@pytest.mark.parametrize(
    "name,edit,says",
    [
        ("objects.json", lambda d: _object(d, 10, 4).update(names="tree"), "image 10, objects entry 3 (object 4): 'names' is \"tree\"; expected a list of strings"),
        ("relationships.json", lambda d: d[2]["relationships"][0]["subject"].update(names="man"), "image 10, relationship 0, subject (object 1): 'names' is \"man\""),
        ("relationships.json", lambda d: d[2]["relationships"][0]["subject"].update(names=None, name=7), "relationship 0, subject (object 1): 'name' is 7; expected a string"),
        ("objects.json", lambda d: _object(d, 10, 4).update(w=-90), "image 10, objects entry 3 (object 4): 'w' is -90; expected a number >= 0"),
        ("objects.json", lambda d: _object(d, 10, 4).update(w=None), "(object 4): 'w' is null; expected a number >= 0"),
        ("objects.json", lambda d: _object(d, 10, 4).update(x="abc"), "(object 4): 'x' is \"abc\"; expected a number"),
        ("image_data.json", lambda d: d[2].update(width="abc"), "image 10: 'width' is \"abc\"; expected a number > 0"),
        ("image_data.json", lambda d: d[2].pop("width") and None, "image 10: 'width' is missing (its fields: 'image_id', 'height'"),
        ("image_data.json", lambda d: d[2].update(image_id=None), "entry 2: 'image_id' is null; expected an integer id"),
        ("image_data.json", lambda d: {"images": d}, "expected a JSON list of entries, got an object"),
        ("objects.json", lambda d: [], "holds no entry (an empty JSON list)"),
        ("objects.json", lambda d: next(e for e in d if e["image_id"] == 10).update(objects={"0": 1}), "image 10: 'objects' is {\"0\": 1}; expected a list"),
        ("attributes.json", lambda d: d[0]["attributes"][0].update(attributes="young"), "image 10, attributes entry 0: 'attributes' is \"young\"; expected a list of strings"),
        ("attributes.json", lambda d: d[0]["attributes"][1].update(attributes=["red", None]), "image 10, attributes entry 1: 'attributes' is [\"red\", null]"),
        ("attributes.json", lambda d: d[0]["attributes"][0].pop("object_id") and None, "image 10, attributes entry 0: 'object_id' is missing"),
        ("attributes.json", lambda d: d[0].update(attributes={"a": 1}), "image 10: 'attributes' is {\"a\": 1}; expected a list"),
        ("image_data.json", lambda d: d[1].update(coco_id="123"), "image 20: 'coco_id' is \"123\"; expected an integer COCO image id or null"),
        ("image_data.json", lambda d: d[1].update(coco_id=12.5), "image 20: 'coco_id' is 12.5"),
    ],
    ids=["string-names", "string-subject-names", "integer-name", "negative-w", "null-w", "text-x",
         "text-width", "missing-width", "null-id", "wrapped-list", "empty", "objects-object", "string-attributes",
         "null-attribute", "attribute-without-object", "attributes-object", "text-coco-id", "fractional-coco-id"],
)  # fmt: skip
def test_a_bad_vg_field_is_refused_naming_file_image_object_and_field(tmp_path, name, edit, says):
    """A string ``names`` became the object name ``'t'`` (a caption ``'m riding horse'``), a
    negative width a zero-width box, ``null`` a bare
    TypeError, and a missing width named neither the file nor the field."""
    path, result = vg(tmp_path, name, edit)
    refused(result, str(path), says, "official")
    assert not (tmp_path / "vg.parquet").exists()


@pytest.mark.parametrize(
    ("object_id", "kept", "says"),
    [
        (4, ["10", "20"], "1 object box(es) lie wholly outside their images and are left out of their images' object lists (first: image 10, object 4)"),
        (1, ["20"], "are named by their images' queries: those images are left out (first: image 10, object 1)"),
    ],
    ids=["other-object", "query-object"],
)  # fmt: skip
def test_a_vg_object_wholly_outside_its_image_is_left_out_and_reported(tmp_path, caplog, object_id, kept, says):
    """A box wholly outside its image is not clipped to a zero-area box such as ``[1, 0.75,
    1, 1]``. An official file cannot be fixed by its user, so the object is left out and
    counted; an image whose query names such an object is left out, as nothing in the
    picture answers it."""
    import pandas as pd

    path, result = vg(tmp_path, "objects.json", lambda d: _object(d, 10, object_id).update(x=5000))
    assert result.exit_code == 0, result.output
    assert f"{path}: " in caplog.text and says in caplog.text
    m = pd.read_parquet(tmp_path / "vg.parquet")
    assert m["item_id"].tolist() == kept
    if "10" in kept:
        assert "tree" not in m.set_index("item_id").loc["10", "object_names"].tolist()


def test_a_coco_annotation_wholly_outside_its_image_is_left_out_and_reported(tmp_path, caplog):
    """A box wholly outside its image is left out of the image's objects and reported, not
    clipped to the zero-area ``[1, 1, 1, 1]``."""
    import pandas as pd

    path, result = coco(tmp_path, "instances", lambda d: _annotation(d, 100).update(bbox=[500, 500, 20, 40]))
    assert result.exit_code == 0, result.output
    assert f"{path}: 1 object box(es) lie wholly outside their images and are left out of their images' object lists (first: image 1, annotation 100)" in caplog.text
    names = pd.read_parquet(tmp_path / "co.parquet").set_index("item_id").loc["1", "object_names"].tolist()
    assert names == ["car"]  # the dog's annotation is left out


# ---------------------------------------------------------------- COCO instances


def coco(tmp: Path, name: str, edit: Callable) -> tuple[Path, object]:
    """``pipeline manifest --suite coco-objects`` over the stand-in with ``name`` edited."""
    _coco(tmp)
    path = tmp / "annotations" / f"{name}_val2017.json"
    edit_json(path, edit)
    return path, manifest("coco-objects", tmp, tmp / "co.parquet")


def _annotation(data: dict, ann_id: int) -> dict:
    return next(a for a in data["annotations"] if a["id"] == ann_id)


@pytest.mark.parametrize(
    "name,edit,says",
    [
        ("instances", lambda d: _annotation(d, 100).update(bbox=None), "annotation 100: bbox null is not [x, y, width, height]"),
        ("instances", lambda d: [d], "expected a JSON object, got a list"),
        ("captions", lambda d: [d], "expected a JSON object, got a list"),
        ("instances", lambda d: d.update(annotations={"100": d["annotations"][0]}), "'annotations': expected a JSON list of entries, got an object"),
        ("instances", lambda d: d.pop("images") and None, "'images' is missing (its fields: 'categories', 'annotations')"),
        ("instances", lambda d: d["images"][1].update(height=0), "image 1: 'height' is 0; expected a number > 0"),
    ],
    ids=["null-bbox", "instances-in-a-list", "captions-in-a-list", "annotations-object", "no-images", "zero-height"],
)  # fmt: skip
def test_a_bad_coco_instances_or_captions_file_is_refused_naming_the_entry(tmp_path, name, edit, says):
    """A file wrapped in a list or a section of another shape is refused naming the file, not
    a bare TypeError."""
    path, result = coco(tmp_path, name, edit)
    refused(result, str(path), says)
    assert not (tmp_path / "co.parquet").exists()


def test_a_coco_families_object_wholly_outside_its_image_counts_as_absent(tmp_path, caplog):
    """A car whose box lies wholly off the image counts as absent: no "a dog to the left of a
    car" about a car the picture does not show."""
    from pipeline.benchmarks import SUITES
    from tests.test_benchmarks_coco_families import _coco as _families

    _families(tmp_path)
    path = tmp_path / "annotations" / "instances_train2017.json"
    edit_json(path, lambda d: d["annotations"][1].update(bbox=[500, 20, 30, 30]))  # image 1's car
    m = SUITES.get("coco-families").build_manifest(tmp_path).set_index("item_id")
    assert "relative-geometry/1" not in m.index and "role-swap/1" not in m.index  # each needs the car
    assert "vertical/2" in m.index and "depth/3" in m.index  # the other images' items are kept
    assert f"{path}: 1 object box(es) lie wholly outside their images and are left out: those objects count as absent" in caplog.text


@pytest.mark.parametrize(("value", "shown_as"), [(None, "null"), (5, "5"), ("  ", '"  "')])
def test_a_whatsup_qa_caption_that_is_not_text_is_named(tmp_path, value, shown_as):
    """A QA entry's captions are checked: a number would reach the label parser, a blank
    caption the encoder."""
    from tests.test_benchmarks_whatsup import _qa

    _qa(tmp_path, "coco")
    path = tmp_path / "coco_qa_two_obj.json"
    edit_json(path, lambda d: d[1].__setitem__(2, value))
    refused(manifest("whatsup-coco", tmp_path, tmp_path / "q.parquet"), str(path), f"entry 1: its third (the wrong caption) value is {shown_as}; expected a non-empty string")


@pytest.mark.parametrize(("value", "shown_as"), [(None, "null"), (1.5, "1.5"), ("12a", '"12a"'), (True, "true"), (-3, "-3")])
def test_a_whatsup_qa_image_id_that_is_not_an_id_is_named(tmp_path, value, shown_as):
    """A QA entry's image id must be a non-negative integer (or its digits): null would make
    the path ``val2017/00000000None.jpg``, -3 ``val2017/-00000000003.jpg``."""
    from tests.test_benchmarks_whatsup import _qa

    _qa(tmp_path, "coco")
    path = tmp_path / "coco_qa_one_obj.json"
    edit_json(path, lambda d: d[0].__setitem__(0, value))
    refused(manifest("whatsup-coco", tmp_path, tmp_path / "q.parquet"), str(path), f"entry 0: its first value (the image id) is {shown_as}; expected a non-negative integer id")


def test_an_order_entry_with_no_caption_is_named(tmp_path):
    """An entry whose caption list is empty is refused, not dropped without a word."""
    from pipeline.benchmarks import SUITES
    from tests.test_benchmarks_aro import _karpathy

    _karpathy(tmp_path)
    path = tmp_path / "coco_karpathy_test.json"
    edit_json(path, lambda d: d[1].update(caption=[]))
    with pytest.raises(ValueError, match=r"coco_karpathy_test\.json: entry 1: 'caption' is \[\]; expected a caption or a non-empty list of captions"):
        SUITES.get("aro-coco-order").build_manifest(tmp_path)
