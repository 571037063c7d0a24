"""ARO Order's text side: BLIP's ``pre_caption`` and the four official perturbations.

The official code (github.com/mertyg/vision-language-models-are-bows, ``dataset_zoo/``,
``TextShuffler`` in ``perturbations.py``) makes each Order item's four negatives from its
caption: nouns and adjectives shuffled, everything else shuffled, words shuffled within
trigrams, trigrams shuffled. :func:`pipeline.benchmarks.aro.build_order` runs them once
and freezes the options in the manifest.

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

import random
import re
import warnings
from typing import Protocol

import numpy as np

NOUN_TAGS = ("NN", "NNS", "NNP", "NNPS")
ADJ_TAGS = ("JJ", "JJR", "JJS")


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
