"""ARO (Yuksekgonul et al., ICLR 2023): VG-Relation, VG-Attribution, COCO- and Flickr30k-Order.

Official code: github.com/mertyg/vision-language-models-are-bows (``dataset_zoo/``, MIT).
Expected files under ``root``:

* ``aro-relation``: ``visual_genome_relation.json`` (gdown id ``1kX2iCHEv0CADL8dSO1nMdW-V0NqIAiP3``);
* ``aro-attribution``: ``visual_genome_attribution.json`` (gdown id ``13tWvOrNOLHxl3Rm9cR3geAdHx2qR3-Tw``).
  Both: a list of ``{"image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption",
  "false_caption", "relation_name" | "attributes"}``. ``image`` is the official
  ``image_path``, relative to ``<root>/images/`` (``vgr_vga_images.zip``, gdown id
  ``1qaPlrwhGNMrR3a11iopZUT_GPP_LrgP9``); ``crop_box = [x, y, x+w, y+h]`` is applied
  before preprocessing. Options are ``[false, true]``, so ``correct = 1``. Column ``split``
  is BindCLIP's image-disjoint split of the ARO image paths (``hash_bucket(image)``: 0-2
  train, 3-4 validation, 5-9 holdout); recompute the macro metrics on a split's rows.
* ``aro-coco-order``: BLIP's ``coco_karpathy_test.json``; ``aro-flickr-order``: BLIP's
  ``flickr30k_test.json`` (both from storage.googleapis.com/sfr-vision-language-research/datasets/).
  Entries ``{"image", "caption": [str, ...]}``; ``image`` (``val2014/COCO_val2014_...jpg``,
  ``flickr30k-images/<id>.jpg``) is relative to the COCO-2014 / Flickr30k root.

Official metrics (``np.argmax``: the first maximum wins):

* ``relation``: macro accuracy over ``relation_name`` after dropping the 157 names of the
  notebook's ``symmetric`` list (``data/vgr_excluded_relations.json``); a tie picks the
  false caption (index 0) and counts wrong. ``relation-micro`` (all items) is ours.
* ``attribution``: macro accuracy over ``f"{attributes[0]}_{attributes[1]}"`` keys with at
  least 25 items (``min_count``, 1 for the shapes world); ``attribution-micro`` is ours.
* ``relation-<split>`` / ``attribution-<split>`` (``train``, ``validation``, ``holdout``):
  the same macro metric recomputed on one split's rows, the exclusion list and the
  ``min_count`` filter applied within the split (so a relation or attribute pair may drop
  out of a split, and a split with no group left has no figure), for BindCLIP's
  development/holdout figures. Ours; the official code scores the whole file.
* ``P@1`` (Order): share of items whose original caption (index 0) wins; a tie counts right.
  The Order files are the Karpathy / Flickr30k *test* splits only, so Order has no split
  figures.

Order options: ``[pre(c), pre(p1(c)), pre(p2(c)), pre(p3(c)), pre(p4(c))]`` with BLIP's
``pre_caption(·, 30)`` and the four ``TextShuffler`` perturbations (nouns+adjectives
shuffled; everything else shuffled; words shuffled within trigrams; trigrams shuffled),
seeded as ``main_aro.py`` (``seed_all(1)``: numpy's and Python's RNGs, here local instances
that draw the same streams), captions in JSON order. They are generated once by
``build_manifest`` and frozen in the manifest (column ``order_tagger`` names the tagger).

**Where ours may differ (POS tagging).** The official perturbations 1-2 use spaCy's
``en_core_web_sm`` tags (NN/NNS/NNP/NNPS, JJ/JJR/JJS) and 3-4 use ``nltk.word_tokenize``.
``en_core_web_sm`` is not distributed on PyPI and nltk's tagger/punkt data are downloads, so
neither can be installed offline. The tagger is pluggable (``OrderTagger``):

* ``official`` (``SpacyNltkTagger``): spaCy ``en_core_web_sm`` + ``nltk.word_tokenize``,
  used by ``tagger="auto"`` whenever both load; identical to the official code up to
  library versions;
* ``heuristic`` (``HeuristicTagger``), the offline fallback, chosen with a warning: a
  Treebank-style regex tokenizer (punctuation and clitics such as ``'s``/``n't`` split off;
  unlike spaCy, hyphenated words stay one token) and a rule tagger: closed-class word lists
  (determiners, prepositions, pronouns, conjunctions, auxiliaries, numerals), a verb list,
  ``-ing``/``-ed``/``-ly`` suffixes with noun exceptions, an adjective list (colours,
  sizes, common COCO adjectives) plus adjective suffixes, and "noun" for everything else.
  Its noun/adjective sets differ from spaCy's on some words, so its options (not the
  metric) differ from the official ones; numbers made with it must be labelled so.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from pipeline.benchmarks.base import (
    SPLITS,
    SUITES,
    Suite,
    Units,
    bucket_split,
    choice_correct,
    hash_bucket,
)
from pipeline.benchmarks.intake import (
    field_error,
    number_field,
    read_json_list,
    relative_image_path,
    require_file,
    string_list_field,
    text_field,
)

VG_SOURCE = "download it with gdown as in dataset_zoo/aro_datasets.py of github.com/mertyg/vision-language-models-are-bows"
BLIP_SOURCE = "download it from storage.googleapis.com/sfr-vision-language-research/datasets/ (BLIP annotations)"
NOUN_TAGS = ("NN", "NNS", "NNP", "NNPS")
ADJ_TAGS = ("JJ", "JJR", "JJS")


@lru_cache(maxsize=1)
def excluded_relations() -> frozenset[str]:
    """The 157 relation names the official notebook drops before macro-averaging VG-R."""
    text = (
        resources.files("pipeline.benchmarks")
        .joinpath("data/vgr_excluded_relations.json")
        .read_text()
    )
    return frozenset(json.loads(text)["excluded_relations"])


# ---------------------------------------------------------------------------- VG loaders


def _vg_row(d: dict, i: int, path: Path, category: str) -> dict:
    """One VG-Relation / VG-Attribution entry ``i`` of ``path`` -> its manifest row, every
    field checked against the official format (a ``null`` or text box coordinate, a negative
    box size, a caption that is not a string) with the file, the entry and the field named."""
    where, item = f"entry {i}", f"{category}/{i}"
    x, y = (number_field(d, k, path, where) for k in ("bbox_x", "bbox_y"))
    w, h = (number_field(d, k, path, where, minimum=0) for k in ("bbox_w", "bbox_h"))
    image = relative_image_path(text_field(d, "image_path", path, where), item)
    return {
        "item_id": item,
        "image": image,
        "crop_box": [x, y, x + w, y + h],
        "captions": [text_field(d, k, path, where) for k in ("false_caption", "true_caption")],
        "correct": 1,
        "category": category,
        "split": bucket_split(hash_bucket(image)),
    }


def build_relation(root: Path) -> pd.DataFrame:
    """VG-Relation manifest from ``root/visual_genome_relation.json``; ``relation_name`` must
    be a non-empty string (it is the macro's group key)."""
    path = require_file(root, "visual_genome_relation.json", VG_SOURCE)
    rows = [
        {**_vg_row(d, i, path, "relation"), "relation_name": text_field(d, "relation_name", path, f"entry {i}")}
        for i, d in enumerate(read_json_list(path, source=VG_SOURCE))
    ]
    return pd.DataFrame(rows)


def build_attribution(root: Path) -> pd.DataFrame:
    """VG-Attribution manifest from ``root/visual_genome_attribution.json``; ``attributes``
    must be the official list of two non-empty strings, joined into the macro's group key."""
    path = require_file(root, "visual_genome_attribution.json", VG_SOURCE)
    rows = [
        {
            **_vg_row(d, i, path, "attribution"),
            "attr_pair": "_".join(string_list_field(d, "attributes", path, f"entry {i}", length=2)),
        }
        for i, d in enumerate(read_json_list(path, source=VG_SOURCE))
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- Order text


def pre_caption(caption: str, max_words: int = 30) -> str:
    """BLIP's ``pre_caption``: lowercase, ``.!"()*#:;~`` -> space, runs of 2+ whitespace ->
    one space, strip, keep the first ``max_words`` space-separated words."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption)
    caption = caption.rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


class OrderTagger(Protocol):
    """What the Order perturbations need: ``pos`` (perturbations 1-2, spaCy in the official
    code) gives ``[(token, Penn tag)]``; ``words`` (3-4, ``nltk.word_tokenize``) gives tokens."""

    name: str

    def pos(self, text: str) -> list[tuple[str, str]]: ...

    def words(self, text: str) -> list[str]: ...


class SpacyNltkTagger:
    """The official tools: spaCy ``en_core_web_sm`` tags and ``nltk.word_tokenize``."""

    name = "official"

    def __init__(self) -> None:
        import nltk
        import spacy

        self.nlp = spacy.load("en_core_web_sm")
        self._word_tokenize = nltk.word_tokenize
        self._word_tokenize("a test.")  # raises LookupError without nltk's punkt data

    def pos(self, text: str) -> list[tuple[str, str]]:
        return [(t.text, t.tag_) for t in self.nlp(text)]

    def words(self, text: str) -> list[str]:
        return self._word_tokenize(text)


_TOKEN = re.compile(r"\w+(?=n't)|n't|'(?:s|re|ve|ll|d|m)\b|\w+(?:-\w+)*|[^\w\s]", re.IGNORECASE)
_CLOSED = set(
    """a an the this that these those some any each every no another other both either neither
    all few many several much more most such what which whose who whom
    of in on at by for with from to into onto upon over under above below behind beside besides
    between among through across along around near nearby inside outside within without against next
    toward towards atop underneath beneath beyond past off out up down about after before during
    while until since than like via amongst throughout
    and or but nor so yet if then because though although as whether
    i me my mine you your yours he him his she her hers it its we us our ours they them their
    theirs itself himself herself themselves myself yourself there here where when how why not
    is are was were be been being am 's 're 've 'll 'd 'm n't has have had having do does did
    can could will would shall should may might must ca wo""".split()
)
_NUMBERS = set("zero one two three four five six seven eight nine ten eleven twelve dozen".split())
_VERBS = set(
    """sit stand hold ride look lay lie eat wait fly play walk run hang carry wear throw catch
    hit pose talk read use lean cross contain sleep graze smile try take make get go come cook
    prepare serve swim kick jump pull push grab drive sell stare climb chase perch sniff lick
    open close hover tow hug touch reach appear seem keep overlook approach enjoy""".split()
)
_ADJECTIVES = set(
    """red orange yellow green blue purple pink brown black white gray grey silver gold golden
    tan beige dark bright pale colorful multicolored striped spotted plaid checkered
    big small large little tiny huge giant tall short long wide narrow thick thin fat
    high low young old new older elderly full empty open closed clean dirty wet dry hot cold
    warm fresh ripe raw frozen wooden plastic stuffed fancy nice pretty beautiful cute ugly
    happy sad busy quiet
    calm lush grassy sandy snowy rocky sunny cloudy foggy rainy shady single double same
    different various several modern vintage antique round square flat steep crowded
    leafy wild domestic male female asian african american english french italian
    chinese japanese mexican professional commercial electric public private local outdoor
    indoor other many few whole half main front back top bottom left right middle upper lower
    sharp soft hard heavy clear shiny plain messy neat""".split()
) - {"front", "back", "top", "bottom", "left", "right", "middle", "many", "few", "other", "several"}
_ADJ_SUFFIXES = ("ful", "ous", "ive", "able", "ible", "less", "ish", "colored", "coloured")
_ING_NOUNS = set(
    """building ceiling clothing painting ring king thing wing string something nothing anything
    everything evening morning railing icing topping sibling pudding bedding wedding awning
    parking stuffing filling frosting dressing seating lighting landing spring swing sling
    offering opening""".split()
)
_ED_WORDS = set("bed shed sled red seed weed reed feed sheed bread speed".split())
_LY_NOUNS = set("family fly belly jelly butterfly lily rally ally holly italy sally".split())


class HeuristicTagger:
    """Offline fallback tagger (see the module docstring for how it differs from spaCy)."""

    name = "heuristic"

    def words(self, text: str) -> list[str]:
        return _TOKEN.findall(text)

    def _tag(self, token: str) -> str:
        w = token.lower()
        if not re.search(r"\w", w):
            return "."
        if w in _CLOSED:
            return "IN"
        if w.isdigit() or w in _NUMBERS:
            return "CD"
        if w in _ADJECTIVES or w.endswith(_ADJ_SUFFIXES):
            return "JJ"
        stem = w[:-2] if w.endswith("es") and w[:-2] in _VERBS else w[:-1] if w.endswith("s") else w
        if w in _VERBS or stem in _VERBS:
            return "VB"
        if w.endswith("ing") and len(w) > 4 and w not in _ING_NOUNS:
            return "VBG"
        if w.endswith("ed") and len(w) > 4 and w not in _ED_WORDS:
            return "VBN"
        if w.endswith("ly") and len(w) > 4 and w not in _LY_NOUNS:
            return "RB"
        return "NNS" if w.endswith("s") and not w.endswith("ss") else "NN"

    def pos(self, text: str) -> list[tuple[str, str]]:
        return [(t, self._tag(t)) for t in self.words(text)]


def resolve_tagger(tagger: str | OrderTagger = "auto") -> OrderTagger:
    """``auto`` (official if spaCy's en_core_web_sm and nltk's punkt load, else heuristic
    with a warning), ``official``, ``heuristic``, or an ``OrderTagger`` instance."""
    if not isinstance(tagger, str):
        return tagger
    if tagger == "heuristic":
        return HeuristicTagger()
    if tagger not in ("auto", "official"):
        raise ValueError(
            f"unknown Order tagger {tagger!r}; valid: auto, official, heuristic, or an OrderTagger"
        )
    try:
        return SpacyNltkTagger()
    except (ImportError, OSError, LookupError) as e:
        if tagger == "official":
            raise RuntimeError(
                "the official Order tagger needs spaCy with en_core_web_sm and nltk with punkt; "
                f"failed with: {e}"
            ) from e
        warnings.warn(
            f"ARO Order: spaCy en_core_web_sm / nltk punkt unavailable ({type(e).__name__}); "
            "using the documented heuristic tagger, so the options differ from the official ones",
            stacklevel=2,
        )
        return HeuristicTagger()


def _trigrams(tokens: list[str]) -> list[list[str]]:
    return [list(tokens[i : i + 3]) for i in range(0, len(tokens), 3)]


class TextShuffler:
    """The four official Order perturbations over one RNG state (numpy for 1-2, Python's
    ``random`` for 3-4, both seeded with ``seed`` like ``seed_all(1)``)."""

    def __init__(self, tagger: OrderTagger, seed: int = 1) -> None:
        self.tagger = tagger
        self.np_rng = np.random.RandomState(seed)
        self.py_rng = random.Random(seed)

    def shuffle_nouns_and_adj(self, ex: str) -> str:
        tagged = self.tagger.pos(ex)
        text = np.array([t for t, _ in tagged])
        noun_idx = [i for i, (_, tag) in enumerate(tagged) if tag in NOUN_TAGS]
        adj_idx = [i for i, (_, tag) in enumerate(tagged) if tag in ADJ_TAGS]
        text[noun_idx] = self.np_rng.permutation(text[noun_idx])
        text[adj_idx] = self.np_rng.permutation(text[adj_idx])
        return " ".join(text)

    def shuffle_allbut_nouns_and_adj(self, ex: str) -> str:
        tagged = self.tagger.pos(ex)
        text = np.array([t for t, _ in tagged])
        other = np.array([tag not in NOUN_TAGS + ADJ_TAGS for _, tag in tagged], dtype=bool)
        text[other] = self.np_rng.permutation(text[other])
        return " ".join(text)

    def shuffle_within_trigrams(self, ex: str) -> str:
        trigrams = _trigrams(self.tagger.words(ex))
        for trigram in trigrams:
            self.py_rng.shuffle(trigram)
        return " ".join(" ".join(t) for t in trigrams)

    def shuffle_trigrams(self, ex: str) -> str:
        trigrams = _trigrams(self.tagger.words(ex))
        self.py_rng.shuffle(trigrams)
        return " ".join(" ".join(t) for t in trigrams)

    def options(self, caption: str, max_words: int = 30) -> list[str]:
        """``[pre(c), pre(p1(c)), ..., pre(p4(c))]`` (each perturbation on the raw caption)."""
        fns = (
            self.shuffle_nouns_and_adj,
            self.shuffle_allbut_nouns_and_adj,
            self.shuffle_within_trigrams,
            self.shuffle_trigrams,
        )
        return [pre_caption(caption, max_words)] + [
            pre_caption(fn(caption), max_words) for fn in fns
        ]


def build_order(
    path: Path, tagger: str | OrderTagger = "auto", seed: int = 1, max_words: int = 30
) -> pd.DataFrame:
    """Order manifest from a BLIP annotation file: one row per (image, caption), 5 options."""
    data = read_json_list(path, source=BLIP_SOURCE)
    tg = resolve_tagger(tagger)
    shuffler = TextShuffler(tg, seed)
    rows = []
    for i, ann in enumerate(data):
        where = f"entry {i}"
        captions = (
            [text_field(ann, "caption", path, where)]
            if isinstance(ann.get("caption"), str)
            else string_list_field(ann, "caption", path, where)
        )
        if not captions:  # the image would add no item, without a word
            raise field_error(ann, "caption", [], path, where, "a caption or a non-empty list of captions")
        image = text_field(ann, "image", path, where)
        for j, caption in enumerate(captions):
            item = f"order/{i}/{j}"
            rows.append(
                {
                    "item_id": item,
                    "image": relative_image_path(image, item),
                    "captions": shuffler.options(caption, max_words),
                    "correct": 0,
                    "category": "order",
                    "order_tagger": tg.name,
                }
            )
    return pd.DataFrame(rows)


def _order_suite(file: str):
    def build_manifest(root: Path) -> pd.DataFrame:
        return build_order(require_file(root, file, BLIP_SOURCE))

    return build_manifest


# ---------------------------------------------------------------------------- metrics


def _split_rows(manifest: pd.DataFrame) -> dict[str, np.ndarray]:
    """``{split: [n] bool}`` for each of :data:`~pipeline.benchmarks.base.SPLITS` that has
    rows in the manifest's ``split`` column (none without the column)."""
    if "split" not in manifest:
        return {}
    split = manifest["split"].astype(str).to_numpy()
    return {s: split == s for s in SPLITS if (split == s).any()}


def _macro(correct: np.ndarray, group: np.ndarray, keep: np.ndarray) -> Units:
    """Units of the macro accuracy over ``group`` on the rows ``keep``."""
    return Units(correct[keep], groups=group[keep])


def relation_units(
    manifest: pd.DataFrame, scores: np.ndarray, excluded: frozenset[str] | None = None
) -> dict[str, Units]:
    """``relation`` (macro over relation names not in ``excluded``; default the official
    list), ``relation-micro`` (ours, all items) and ``relation-<split>`` (the macro on each
    split present); argmax-first, so a tie is wrong."""
    excluded = excluded_relations() if excluded is None else excluded
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    rel = manifest["relation_name"].to_numpy()
    keep = ~np.isin(rel, list(excluded))
    units = {"relation": _macro(correct, rel, keep), "relation-micro": Units(correct)}
    for split, rows in _split_rows(manifest).items():
        if (keep & rows).any():
            units[f"relation-{split}"] = _macro(correct, rel, keep & rows)
    return units


def _frequent(keys: np.ndarray, min_count: int) -> np.ndarray:
    """[n] bool: rows whose key occurs at least ``min_count`` times among ``keys``."""
    counts = pd.Series(keys).value_counts()
    return np.isin(keys, counts.index[counts >= min_count].to_numpy())


def attribution_units(
    manifest: pd.DataFrame, scores: np.ndarray, min_count: int = 25
) -> dict[str, Units]:
    """``attribution`` (macro over attribute pairs with at least ``min_count`` items),
    ``attribution-micro`` (ours, all items) and ``attribution-<split>`` (the macro on each
    split present, over the pairs with ``min_count`` items *in the split*); argmax-first,
    so a tie is wrong."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    pair = manifest["attr_pair"].to_numpy()
    units = {
        "attribution": _macro(correct, pair, _frequent(pair, min_count)),
        "attribution-micro": Units(correct),
    }
    for split, rows in _split_rows(manifest).items():
        keep = np.zeros(len(pair), dtype=bool)
        keep[rows] = _frequent(pair[rows], min_count)
        if keep.any():
            units[f"attribution-{split}"] = _macro(correct, pair, keep)
    return units


def order_units(manifest: pd.DataFrame, scores: np.ndarray) -> dict[str, Units]:
    """``P@1``: the original caption (index 0) wins by argmax-first, so a tie is right."""
    correct = choice_correct(scores, manifest["correct"].to_numpy(), ties="first").astype(float)
    return {"P@1": Units(correct)}


# ---------------------------------------------------------------------------- registration

SUITES.register(
    "aro-relation",
    Suite(
        name="aro-relation",
        task="choice",
        build_manifest=build_relation,
        units=relation_units,
        metric_names=("relation", "relation-micro", *(f"relation-{s}" for s in SPLITS)),
        headline="relation",
        categories=("relation",),
        description="ARO VG-Relation: root holds visual_genome_relation.json; image root = root/images/ (the cropped VG images)",
    ),
)
SUITES.register(
    "aro-attribution",
    Suite(
        name="aro-attribution",
        task="choice",
        build_manifest=build_attribution,
        units=attribution_units,
        metric_names=("attribution", "attribution-micro", *(f"attribution-{s}" for s in SPLITS)),
        headline="attribution",
        categories=("attribution",),
        description="ARO VG-Attribution: root holds visual_genome_attribution.json; image root = root/images/ (the cropped VG images)",
    ),
)
for _name, _file, _images in (
    ("aro-coco-order", "coco_karpathy_test.json", "COCO 2014 root (val2014/...)"),
    ("aro-flickr-order", "flickr30k_test.json", "Flickr30k root (flickr30k-images/...)"),
):
    SUITES.register(
        _name,
        Suite(
            name=_name,
            task="choice",
            build_manifest=_order_suite(_file),
            units=order_units,
            metric_names=("P@1",),
            headline="P@1",
            categories=("order",),
            description=f"ARO {_name.split('-')[1].capitalize()}-Order: root holds BLIP's {_file}; images = {_images}",
        ),
    )
