"""ARO loaders (hand-made files in the official formats), Order perturbations and metrics."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pipeline.benchmarks.aro as aro
import pipeline.benchmarks.order_text as order_text
from pipeline.benchmarks import SUITES
from pipeline.benchmarks.aro import (
    attribution_units,
    build_order,
    excluded_relations,
    order_units,
    relation_units,
)
from pipeline.benchmarks.base import bucket_split, hash_bucket
from pipeline.benchmarks.order_text import (
    HeuristicTagger,
    TextShuffler,
    pre_caption,
    resolve_tagger,
)
from tests.conftest import require_shared


def _vg(i, **kw):
    return {
        "image_path": f"{1000 + i}.jpg",
        "bbox_x": 10,
        "bbox_y": 20,
        "bbox_w": 30,
        "bbox_h": 40,
        "true_caption": f"the cup is on the table {i}",
        "false_caption": f"the table is on the cup {i}",
        **kw,
    }


def test_excluded_relations_is_the_official_list():
    names = excluded_relations()
    assert len(names) == 157 and {"near", "with", "next to", "riding on"} <= names
    assert "on" not in names and "to the left of" not in names
    packaged = Path(aro.__file__).parent / "data" / "vgr_excluded_relations.json"
    digest = "b2b161cc9a999c5b490ae26cc62f00eec1f5c475201c1be5d6b493e757c81eff"  # shared/SOURCES.md
    assert hashlib.sha256(packaged.read_bytes()).hexdigest() == digest
    assert packaged.read_bytes() == require_shared("aro", "vgr_excluded_relations.json").read_bytes()


def test_relation_loader_and_macro_without_excluded(tmp_path):
    rels = ["on", "on", "on", "under", "near", "near"]
    data = [_vg(i, relation_name=r) for i, r in enumerate(rels)]
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(data))
    m = SUITES.get("aro-relation").build_manifest(tmp_path)
    row = m.iloc[0]
    assert row["image"] == "1000.jpg" and row["crop_box"] == [
        10.0,
        20.0,
        40.0,
        60.0,
    ]  # x, y, x+w, y+h
    assert (
        row["captions"] == ["the table is on the cup 0", "the cup is on the table 0"]
        and row["correct"] == 1
    )
    assert row["split"] == bucket_split(hash_bucket("1000.jpg"))  # BindCLIP's ARO split
    # on: right, right, tie (argmax-first picks the false caption: wrong); under: wrong; near: right x2
    scores = np.array([[0.1, 0.2], [0.1, 0.3], [0.2, 0.2], [0.3, 0.1], [0.1, 0.2], [0.1, 0.2]])
    units = relation_units(m, scores)
    assert units["relation"].statistic() == pytest.approx((2 / 3 + 0) / 2)  # "near" excluded
    assert units["relation-micro"].statistic() == pytest.approx(4 / 6)
    assert set(units["relation"].groups) == {"on", "under"}
    assert (
        SUITES.get("aro-relation").metrics(m, scores)["relation"] == units["relation"].statistic()
    )
    # without the exclusion list "near" counts as a third relation
    assert relation_units(m, scores, excluded=frozenset())["relation"].statistic() == pytest.approx(
        (2 / 3 + 0 + 1) / 3
    )


def test_attribution_keeps_pairs_with_at_least_25_items(tmp_path):
    attrs = [["white", "wooden"]] * 25 + [["wooden", "white"]] * 24  # ordered keys differ
    data = [_vg(i, attributes=a) for i, a in enumerate(attrs)]
    (tmp_path / "visual_genome_attribution.json").write_text(json.dumps(data))
    m = SUITES.get("aro-attribution").build_manifest(tmp_path)
    assert m["attr_pair"].iloc[0] == "white_wooden" and m["attr_pair"].iloc[-1] == "wooden_white"
    scores = np.zeros((49, 2))
    scores[:20, 1] = 1.0  # 20/25 right on white_wooden, 0/24 (all ties) on wooden_white
    units = attribution_units(m, scores)
    assert units["attribution"].statistic() == pytest.approx(20 / 25)  # 24-item key dropped
    assert units["attribution-micro"].statistic() == pytest.approx(20 / 49)
    assert attribution_units(m, scores, min_count=1)["attribution"].statistic() == pytest.approx(
        (0.8 + 0) / 2
    )


# Image paths 1000 + i by BindCLIP's hash split: i = 1, 2, 6 train; 7, 14, 15 validation; 0, 3 holdout.
SPLIT_OF = {1: "train", 2: "train", 6: "train", 7: "validation", 14: "validation", 15: "validation", 0: "holdout", 3: "holdout"}  # fmt: skip


def test_split_figures_recompute_the_macro_within_each_split(tmp_path):
    items = [(1, "on", True), (2, "under", False), (6, "near", True), (7, "on", True),
             (14, "on", False), (0, "near", True), (3, "near", False)]  # fmt: skip
    data = [_vg(i, relation_name=r) for i, r, _ in items]
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(data))
    m = SUITES.get("aro-relation").build_manifest(tmp_path)
    assert m["split"].tolist() == [SPLIT_OF[i] for i, _, _ in items]
    scores = np.array([[0.0, 1.0] if ok else [1.0, 0.0] for _, _, ok in items])
    metrics = SUITES.get("aro-relation").metrics(m, scores)
    assert metrics == {
        "relation": pytest.approx((2 / 3 + 0) / 2),  # on 2/3, under 0/1; near excluded
        "relation-micro": pytest.approx(4 / 7),
        "relation-train": pytest.approx((1 + 0) / 2),  # on 1/1, under 0/1
        "relation-validation": pytest.approx(1 / 2),  # on 1/2
    }  # holdout holds only the excluded "near": no figure

    items = [(1, "a_b", True), (2, "a_b", False), (6, "a_b", True), (7, "a_b", True),
             (14, "c_d", True), (15, "c_d", False), (0, "c_d", True)]  # fmt: skip
    data = [_vg(i, attributes=k.split("_")) for i, k, _ in items]
    (tmp_path / "visual_genome_attribution.json").write_text(json.dumps(data))
    m = SUITES.get("aro-attribution").build_manifest(tmp_path)
    scores = np.array([[0.0, 1.0] if ok else [1.0, 0.0] for _, _, ok in items])
    units = attribution_units(m, scores, min_count=2)
    assert {k: u.statistic() for k, u in units.items()} == {
        "attribution": pytest.approx((3 / 4 + 2 / 3) / 2),
        "attribution-micro": pytest.approx(5 / 7),
        "attribution-train": pytest.approx(2 / 3),  # a_b has 3 train items
        "attribution-validation": pytest.approx(1 / 2),  # a_b has 1 validation item: dropped
    }  # holdout: c_d has 1 item there, fewer than min_count
    assert set(units["attribution-validation"].groups) == {"c_d"}
    # without the split column: the same official figure and no split figures
    unsplit = attribution_units(m.drop(columns="split"), scores, min_count=2)
    assert set(unsplit) == {"attribution", "attribution-micro"}
    assert unsplit["attribution"].statistic() == units["attribution"].statistic()


def test_missing_and_escaping_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="visual_genome_relation.json.*gdown"):
        SUITES.get("aro-relation").build_manifest(tmp_path)
    with pytest.raises(FileNotFoundError, match="coco_karpathy_test.json"):
        SUITES.get("aro-coco-order").build_manifest(tmp_path)
    (tmp_path / "visual_genome_relation.json").write_text(
        json.dumps([_vg(0, relation_name="on", image_path="../x.jpg")])
    )
    with pytest.raises(ValueError, match="relation/0"):
        SUITES.get("aro-relation").build_manifest(tmp_path)


def test_pre_caption_is_blips():
    assert pre_caption('A man (in red) rides: a "bike"!  ') == "a man in red rides a bike"
    assert (
        pre_caption("Dog's toy, on\tthe bed.") == "dog's toy, on\tthe bed"
    )  # single whitespace kept
    assert pre_caption("one two three four", max_words=2) == "one two"


class DictTagger:
    """A fixed tagger (stands in for spaCy in tests)."""

    name = "dict"
    TAGS = {"man": "NN", "horse": "NN", "field": "NN", "brown": "JJ", "green": "JJ",
            "horses": "NNS", "bob": "NNP", "alps": "NNPS", "greener": "JJR", "biggest": "JJS"}  # fmt: skip

    def pos(self, text):
        return [(w, self.TAGS.get(w.lower(), "IN")) for w in self.words(text)]

    def words(self, text):
        return text.replace(".", " .").split()


def _official(caption, tagger):
    """The official TextShuffler semantics on the *global* RNGs (reference for parity)."""

    class Tok:
        def __init__(self, text, tag):
            self.text, self.tag_ = text, tag

    doc = [Tok(t, g) for t, g in tagger.pos(caption)]
    text = np.array([t.text for t in doc])
    noun_idx = [i for i, t in enumerate(doc) if t.tag_ in ["NN", "NNS", "NNP", "NNPS"]]
    adj_idx = [i for i, t in enumerate(doc) if t.tag_ in ["JJ", "JJR", "JJS"]]
    text[noun_idx] = np.random.permutation(text[noun_idx])
    text[adj_idx] = np.random.permutation(text[adj_idx])
    p1 = " ".join(text)
    text = np.array([t.text for t in doc])
    na = [
        i for i, t in enumerate(doc) if t.tag_ in ["NN", "NNS", "NNP", "NNPS", "JJ", "JJR", "JJS"]
    ]
    else_idx = np.ones(text.shape[0])
    else_idx[na] = 0
    else_idx = else_idx.astype(bool)
    text[else_idx] = np.random.permutation(text[else_idx])
    p2 = " ".join(text)

    def trigrams(s):
        out, tri = [], []
        for i in range(len(s)):
            tri.append(s[i])
            if i % 3 == 2:
                out.append(tri[:])
                tri = []
        if tri:
            out.append(tri)
        return out

    tri = trigrams(tagger.words(caption))
    for t in tri:
        random.shuffle(t)
    p3 = " ".join(" ".join(t) for t in tri)
    tri = trigrams(tagger.words(caption))
    random.shuffle(tri)
    p4 = " ".join(" ".join(t) for t in tri)
    return [pre_caption(caption, 30)] + [pre_caption(p, 30) for p in (p1, p2, p3, p4)]


def test_shuffler_draws_the_official_random_streams():
    captions = [
        "A brown man rides a green horse in a field.",
        "A man and a horse.",
        "Field",
        "A green brown field.",
        "Bob rides the biggest horses near greener Alps.",  # every noun and adjective tag
    ]
    state = (np.random.get_state(), random.getstate())
    try:
        np.random.seed(1)
        random.seed(1)
        expected = [_official(c, DictTagger()) for c in captions]
    finally:
        np.random.set_state(state[0])
        random.setstate(state[1])
    shuffler = TextShuffler(DictTagger(), seed=1)
    assert [shuffler.options(c) for c in captions] == expected


def test_noun_shuffle_only_moves_nouns_among_noun_slots():
    caption = "A brown man rides a green horse in a field"
    out = TextShuffler(DictTagger(), seed=3).shuffle_nouns_and_adj(caption).split()
    src = caption.split()
    slots = [i for i, w in enumerate(src) if w in DictTagger.TAGS]
    assert [out[i] for i in range(len(src)) if i not in slots] == [
        src[i] for i in range(len(src)) if i not in slots
    ]
    nouns = [i for i in slots if DictTagger.TAGS[src[i]] == "NN"]
    assert sorted(out[i] for i in nouns) == sorted(src[i] for i in nouns)


def _karpathy(tmp_path, name="coco_karpathy_test.json"):
    data = [
        {"image": "val2014/COCO_val2014_000000391895.jpg", "caption": ["A man with a red helmet on a small moped on a dirt road. ", "Man riding a motor bike on a dirt road on the countryside."], "image_id": "391895"},
        {"image": "val2014/COCO_val2014_000000522418.jpg", "caption": ["A woman wearing a net on her head cutting a cake. "], "image_id": "522418"},
    ]  # fmt: skip
    (tmp_path / name).write_text(json.dumps(data))
    return data


def test_order_manifest_frozen_options(tmp_path):
    data = _karpathy(tmp_path)
    m = build_order(tmp_path / "coco_karpathy_test.json", tagger="heuristic")
    assert len(m) == 3 and m["item_id"].tolist() == ["order/0/0", "order/0/1", "order/1/0"]
    assert m["image"].iloc[0] == "val2014/COCO_val2014_000000391895.jpg"
    assert (m["correct"] == 0).all() and m["captions"].map(len).eq(5).all()
    assert (m["order_tagger"] == "heuristic").all()
    assert m["captions"].iloc[0][0] == pre_caption(data[0]["caption"][0])
    for opts in m["captions"]:  # every option is a reordering of the same characters
        assert len({"".join(sorted(o.replace(" ", ""))) for o in opts}) == 1
    again = build_order(tmp_path / "coco_karpathy_test.json", tagger="heuristic")
    assert again["captions"].tolist() == m["captions"].tolist()  # fixed seed: deterministic


def test_order_suite_and_flickr_string_captions(tmp_path, monkeypatch):
    monkeypatch.setattr(
        order_text, "SpacyNltkTagger", lambda: (_ for _ in ()).throw(ImportError("no spacy"))
    )
    _karpathy(tmp_path, "flickr30k_test.json")
    with pytest.warns(UserWarning, match="heuristic tagger"):
        m = SUITES.get("aro-flickr-order").build_manifest(tmp_path)
    assert len(m) == 3
    (tmp_path / "one.json").write_text(
        json.dumps([{"image": "flickr30k-images/1.jpg", "caption": "A dog runs."}])
    )
    assert len(build_order(tmp_path / "one.json", tagger=DictTagger())) == 1


def test_order_p_at_1_tie_counts_right():
    m = pd.DataFrame({"correct": [0, 0, 0]})
    scores = np.array(
        [[0.2, 0.2, 0.2, 0.2, 0.2], [0.1, 0.3, 0.0, 0.0, 0.0], [0.5, 0.1, 0.2, 0.3, 0.4]]
    )
    assert order_units(m, scores)["P@1"].statistic() == pytest.approx(2 / 3)


def test_resolve_tagger():
    assert resolve_tagger("heuristic").name == "heuristic"
    tagger = DictTagger()
    assert resolve_tagger(tagger) is tagger
    with pytest.raises(ValueError, match="heuristic"):
        resolve_tagger("bogus")
    tags = dict(
        HeuristicTagger().pos("Two brown dogs are sitting on a wooden bench next to the road .")
    )
    assert (
        tags["dogs"] == "NNS" and tags["bench"] == "NN" and tags["brown"] == tags["wooden"] == "JJ"
    )
    assert tags["sitting"] not in order_text.NOUN_TAGS + order_text.ADJ_TAGS and tags["on"] not in order_text.NOUN_TAGS


@pytest.mark.parametrize(
    "suite,generated", [("aro-coco-order", True), ("aro-flickr-order", True), ("sugarcrepe", False), ("aro-relation", False)]
)
def test_identical_options_are_not_sent_to_be_fixed_where_the_benchmark_generates_them(caplog, suite, generated):
    """ARO Order's options are the official perturbations, one of which can reproduce the
    caption: extract's warning counts those items but does not ask to fix official captions;
    elsewhere two identical options are a manifest's error."""
    from types import SimpleNamespace

    from pipeline.extraction import _truncation

    enc = SimpleNamespace(dims=SimpleNamespace(context_length=77))
    tokens = {"a": [1, 2], "b": [2, 1]}
    cells = [(SimpleNamespace(suite=suite), {"captions": ("text", [["a", "a", "b"], ["a", "b", "b"]])}, None)]
    with caplog.at_level("WARNING", logger="pipeline.extraction"):
        assert _truncation(enc, cells, tokens)[suite]["n_identical_options"] == 2
    (line,) = [r.getMessage() for r in caplog.records if "same tokens" in r.getMessage()]
    assert line.startswith(f"{suite}: 2 item(s) have two options with the same tokens")
    assert ("fix the manifest's captions" not in line) == generated
    assert ("part of the official benchmark: the tie is scored by the official rule" in line) == generated
