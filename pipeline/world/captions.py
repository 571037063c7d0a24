"""Captions: claims about scenes, their truth, templates, paraphrases and word-order shuffles.

A caption is the rendering of a *claim*, a tiny logical form:

* ``Has(present, absent)``: objects that exist and objects that do not ("a red circle and
  no blue square");
* ``Rel(a, rel, b)``: a spatial relation, ``rel`` in left/right/above/below/front/behind;
* ``Side(a, side)``: the object is on the left/right side of the picture;
* ``And(parts)``: every relation of ``parts`` holds (a chain, "a red circle left of a blue
  square which is above a green star"; shapes-multi).

Objects are named by a ``Ref`` (shape, optional colour, optional size); a ref matches every
object with those attributes. ``truth(claim, scene)`` is three-valued (True / False /
None = ambiguous picture) and is what every suite checks its positives and negatives with.

``say(claim, style)`` renders a claim with one of several templates into a ``Caption``: the
words (split on single spaces; no punctuation) and, per word, which ref of the claim it
names, so grounding (word -> box) and part-of-speech tags come for free: shapes are
nouns, colours and sizes adjectives (the ARO order shuffles need only these). Paraphrases
are the other templates and, for relations, the converse ("X left of Y" <-> "Y right of
X"). Captions stay under ~20 open_clip BPE tokens (``And`` chains: up to 30).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pipeline.world.scenes import (
    COLOURS,
    OPPOSITE,
    RELATIONS,
    SHAPES,
    SIZES,
    Obj,
    Scene,
    relation_clear,
    relation_value,
    side_value,
)

# ------------------------------------------------------------------------------ claims


@dataclass(frozen=True)
class Ref:
    """A noun phrase: ``[size] [colour] shape``; matches objects with those attributes."""

    shape: str
    colour: str | None = None
    size: str | None = None

    def matches(self, o: Obj) -> bool:
        return (
            o.shape == self.shape
            and self.colour in (None, o.colour)
            and self.size in (None, o.size)
        )

    def words(self) -> list[str]:
        return [w for w in (self.size, self.colour, self.shape) if w is not None]


@dataclass(frozen=True)
class Has:
    """Every ``present`` ref matches some object and no ``absent`` ref matches any."""

    present: tuple[Ref, ...]
    absent: tuple[Ref, ...] = ()


@dataclass(frozen=True)
class Rel:
    """``a`` stands in relation ``rel`` to ``b``."""

    a: Ref
    rel: str
    b: Ref


@dataclass(frozen=True)
class Side:
    """``a`` is on the ``left``/``right`` side of the picture."""

    a: Ref
    side: str


@dataclass(frozen=True)
class And:
    """Every relation in ``parts`` holds; a ref named twice names the same object."""

    parts: tuple[Rel, ...]


Claim = Has | Rel | Side | And


def refs(claim: Claim) -> tuple[Ref, ...]:
    """The claim's refs in tag order (caption words are tagged with these indices); an
    ``And`` lists each distinct ref once, in the order of first mention."""
    if isinstance(claim, Has):
        return claim.present + claim.absent
    if isinstance(claim, Rel):
        return (claim.a, claim.b)
    if isinstance(claim, And):
        return tuple(dict.fromkeys(r for p in claim.parts for r in (p.a, p.b)))
    return (claim.a,)


def asserted(claim: Claim) -> tuple[Ref, ...]:
    """The refs the claim says exist (all but ``Has.absent``)."""
    return claim.present if isinstance(claim, Has) else refs(claim)


def _any3(values: list[bool | None]) -> bool | None:
    if any(v is True for v in values):
        return True
    return False if all(v is False for v in values) else None


def _all3(values: list[bool | None]) -> bool | None:
    if any(v is False for v in values):
        return False
    return True if all(v is True for v in values) else None


def truth(claim: Claim, scene: Scene) -> bool | None:
    """Whether ``claim`` holds in ``scene``: True, False or None (ambiguous)."""
    objs = scene.objects
    if isinstance(claim, And):
        return _all3([truth(p, scene) for p in claim.parts])
    if isinstance(claim, Has):
        present = all(any(r.matches(o) for o in objs) for r in claim.present)
        absent = all(not r.matches(o) for r in claim.absent for o in objs)
        return present and absent
    if isinstance(claim, Rel):
        xs = [o for o in objs if claim.a.matches(o)]
        ys = [o for o in objs if claim.b.matches(o)]
        values = [relation_value(x, y, claim.rel) for x in xs for y in ys if x is not y]
        return _any3(values) if values else False
    xs = [o for o in objs if claim.a.matches(o)]
    return _any3([side_value(x, claim.side) for x in xs]) if xs else False


def flip_claim(claim: Claim) -> Claim:
    """The claim about the horizontally mirrored scene (left <-> right)."""
    swap = {"left": "right", "right": "left"}
    if isinstance(claim, Rel):
        return Rel(claim.a, swap.get(claim.rel, claim.rel), claim.b)
    if isinstance(claim, Side):
        return Side(claim.a, swap[claim.side])
    if isinstance(claim, And):
        return And(tuple(flip_claim(p) for p in claim.parts))
    return claim


def converse(claim: Rel) -> Rel:
    """``b <opposite rel> a``: the same fact from the other object."""
    return Rel(claim.b, OPPOSITE[claim.rel], claim.a)


# ------------------------------------------------------------------------------ templates

REL_WORDS: dict[str, tuple[str, str, str]] = {  # (plain, after "is", alternative)
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "above", "higher than"),
    "below": ("below", "below", "lower than"),
    "front": ("in front of", "in front of", "partly covering"),
    "behind": ("behind", "behind", "partly hidden by"),
}


def relation_of(caption: str) -> str | None:
    """The relation a caption states (``left`` ... ``behind``, by its phrase), or None."""
    text = f" {caption} "
    for rel, phrases in REL_WORDS.items():
        if any(f" {p} " in text for p in phrases):
            return rel
    return None


RELATION_NAMES = {
    "left": "left of",
    "right": "right of",
    "above": "above",
    "below": "below",
    "front": "in front of",
    "behind": "behind",
}
REL_TEMPLATES = (  # {A} {B}: "a ..." ; {tA} {tB}: "the ..."; {w0} {w1} {w2}: REL_WORDS
    "{A} {w0} {B}",
    "{A} is {w1} {B}",
    "{tA} is {w0} {tB}",
    "there is {A} {w1} {B}",
    "{A} {w2} {B}",
)
SIDE_TEMPLATES = (
    "{tA} is on the {side} side of the picture",
    "{A} on the {side} side of the image",
    "on the {side} side of the picture there is {A}",
    "{tA} is in the {side} half of the picture",
)
HAS_TEMPLATES = (  # (present only, with absent); {P} = the present refs joined, {n} = bare ref
    ("{P}", "{P} and no {n}"),
    ("there is {P}", "there is {P} but no {n}"),
    ("a picture of {P}", "a picture of {P} and no {n}"),
    ("{P+with}", "{P} but no {n}"),
    ("{P+the}", "{P+the} and no {n}"),
)
N_STYLES = 5  # styles are taken modulo each template list


@dataclass(frozen=True)
class Caption:
    """Caption words and, per word, the index of the ref it names (None for others)."""

    words: tuple[str, ...]
    tags: tuple[int | None, ...]

    @property
    def text(self) -> str:
        return " ".join(self.words)


def _np(ref: Ref, tag: int, article: str | None) -> list[tuple[str, int | None]]:
    words = ref.words()
    out: list[tuple[str, int | None]] = []
    if article == "a":
        out.append(("an" if words[0][0] in "aeiou" else "a", None))
    elif article == "the":
        out.append(("the", None))
    return out + [(w, tag) for w in words]


def _expand(template: str, slots: dict[str, list[tuple[str, int | None]]]) -> Caption:
    pairs: list[tuple[str, int | None]] = []
    for tok in template.split(" "):
        pairs.extend(slots[tok] if tok in slots else [(tok, None)])
    return Caption(tuple(w for w, _ in pairs), tuple(t for _, t in pairs))


def _join(
    phrases: list[list[tuple[str, int | None]]], first: str = "and"
) -> list[tuple[str, int | None]]:
    out = list(phrases[0])
    for k, p in enumerate(phrases[1:]):
        out += [(first if k == 0 else "and", None)] + p
    return out


def _say_and(claim: And) -> Caption:
    """One template: ``A rel B`` for the first part, ``which is rel C`` for a part whose
    subject is the previous part's object, ``and A rel B`` otherwise; a ref is ``a ...`` at
    its first mention and ``the <shape>`` after it (``the`` + all its words where another
    ref has the same shape)."""
    rs = refs(claim)
    tag = {r: k for k, r in enumerate(rs)}
    seen: set[Ref] = set()

    def np_(r: Ref) -> list[tuple[str, int | None]]:
        if r not in seen:
            seen.add(r)
            return _np(r, tag[r], "a")
        if sum(x.shape == r.shape for x in rs) == 1:
            return [("the", None), (r.shape, tag[r])]
        return _np(r, tag[r], "the")

    pairs: list[tuple[str, int | None]] = []
    for k, p in enumerate(claim.parts):
        rel = [(w, None) for w in REL_WORDS[p.rel][1].split()]
        if k == 0:
            pairs += np_(p.a) + rel + np_(p.b)
        elif p.a == claim.parts[k - 1].b:
            pairs += [("which", None), ("is", None)] + rel + np_(p.b)
        else:
            pairs += [("and", None)] + np_(p.a) + rel + np_(p.b)
    return Caption(tuple(w for w, _ in pairs), tuple(t for _, t in pairs))


def say(claim: Claim, style: int = 0) -> Caption:
    """Render ``claim`` with template ``style`` (taken modulo the number of templates;
    an ``And`` has one)."""
    if isinstance(claim, And):
        return _say_and(claim)
    if isinstance(claim, Rel):
        w = REL_WORDS[claim.rel]
        slots = {
            "{A}": _np(claim.a, 0, "a"),
            "{B}": _np(claim.b, 1, "a"),
            "{tA}": _np(claim.a, 0, "the"),
            "{tB}": _np(claim.b, 1, "the"),
            "{w0}": [(x, None) for x in w[0].split()],
            "{w1}": [(x, None) for x in w[1].split()],
            "{w2}": [(x, None) for x in w[2].split()],
        }
        return _expand(REL_TEMPLATES[style % len(REL_TEMPLATES)], slots)
    if isinstance(claim, Side):
        slots = {
            "{A}": _np(claim.a, 0, "a"),
            "{tA}": _np(claim.a, 0, "the"),
            "{side}": [(claim.side, None)],
        }
        return _expand(SIDE_TEMPLATES[style % len(SIDE_TEMPLATES)], slots)
    n = len(claim.present)
    slots = {
        "{P}": _join([_np(r, i, "a") for i, r in enumerate(claim.present)]),
        "{P+with}": _join([_np(r, i, "a") for i, r in enumerate(claim.present)], first="with"),
        "{P+the}": _join([_np(r, i, "the") for i, r in enumerate(claim.present)]),
    }
    for k, r in enumerate(claim.absent):
        slots["{n}" if k == 0 else f"{{n{k}}}"] = _np(r, n + k, None)
    plain, with_absent = HAS_TEMPLATES[style % len(HAS_TEMPLATES)]
    template = with_absent if claim.absent else plain
    if len(claim.absent) > 1:
        template += "".join(f" or {{n{k}}}" for k in range(1, len(claim.absent)))
    return _expand(template, slots)


def caption(claim: Claim, style: int = 0) -> str:
    """The text of ``say(claim, style)``."""
    return say(claim, style).text


def flip_text(text: str) -> str:
    """Swap the words ``left`` and ``right`` (the caption of the mirrored image)."""
    swap = {"left": "right", "right": "left"}
    return " ".join(swap.get(w, w) for w in text.split(" "))


def equivalents(claim: Claim) -> list[Claim]:
    """Claims with the same truth in every scene: reorderings and converses (of an ``And``'s relations)."""
    if isinstance(claim, Rel):
        return [claim, converse(claim)]
    if isinstance(claim, Has):
        return [Has(tuple(p), claim.absent) for p in itertools.permutations(claim.present)]
    forms = itertools.product(*[(r, converse(r)) for r in claim.parts]) if isinstance(claim, And) else None
    return [claim] if forms is None else [And(order) for parts in forms for order in itertools.permutations(parts)]


def paraphrase(claim: Claim, text: str, rng: np.random.Generator) -> str:
    """Another phrasing of ``claim`` (same meaning, other words or order) than ``text``."""
    options = sorted({caption(c, s) for c in equivalents(claim) for s in range(N_STYLES)} - {text})
    return options[int(rng.integers(len(options)))]


# ------------------------------------------------------------------------------ describing scenes


def ref_of(
    o: Obj, scene: Scene, rng: np.random.Generator, p_size: float = 0.35, p_bare: float = 0.1
) -> Ref:
    """A ref that names ``o`` uniquely in ``scene``: colour + shape, maybe size; shape
    alone (with probability ``p_bare``) when the shape is unique."""
    bare_ok = sum(x.shape == o.shape for x in scene.objects) == 1
    if bare_ok and rng.random() < p_bare:
        return Ref(o.shape)
    return Ref(o.shape, o.colour, o.size if rng.random() < p_size else None)


def clear_relations(scene: Scene) -> list[tuple[int, str, int]]:
    """``(i, rel, j)`` for every clear relation between objects i and j."""
    objs = scene.objects
    return [
        (i, rel, j)
        for i in range(len(objs))
        for j in range(len(objs))
        if i != j
        for rel in RELATIONS
        if relation_clear(objs[i], objs[j], rel)
    ]


def clear_sides(scene: Scene) -> list[tuple[int, str]]:
    """``(i, side)`` for objects clearly on one side of the picture (x <= 0.36 or >= 0.64)."""
    return [
        (i, s)
        for i, o in enumerate(scene.objects)
        for s in ("left", "right")
        if (o.x if s == "left" else 1 - o.x) <= 0.36
    ]


def describe(
    scene: Scene,
    rng: np.random.Generator,
    kinds: tuple[str, ...] = ("has", "rel", "side"),
    p_bare: float = 0.1,
) -> Claim:
    """A random true claim about ``scene``: an object list, a relation or a side.

    ``p_bare``: probability that an object whose shape is unique in the scene is named by
    its shape alone (no colour/size), as real captions often omit attributes.
    """
    rels = clear_relations(scene) if "rel" in kinds else []
    sides = clear_sides(scene) if "side" in kinds else []
    weights = {"has": 0.35, "rel": 0.45 if rels else 0.0, "side": 0.2 if sides else 0.0}
    names = [k for k in kinds if weights[k] > 0] or ["has"]
    p = np.array([weights[k] for k in names]) / sum(weights[k] for k in names)
    kind = names[int(rng.choice(len(names), p=p))]
    objs = scene.objects
    if kind == "rel":
        i, rel, j = rels[int(rng.integers(len(rels)))]
        return Rel(ref_of(objs[i], scene, rng, p_bare=p_bare), rel, ref_of(objs[j], scene, rng, p_bare=p_bare))
    if kind == "side":
        i, s = sides[int(rng.integers(len(sides)))]
        return Side(ref_of(objs[i], scene, rng, p_bare=p_bare), s)
    k = int(rng.integers(1, min(3, len(objs)) + 1))
    pick = rng.permutation(len(objs))[:k]
    return Has(tuple(ref_of(objs[i], scene, rng, p_bare=p_bare) for i in sorted(pick)))


# ------------------------------------------------------------------------------ POS and ARO order


def pos_tag(word: str) -> str:
    """``NOUN`` for shapes, ``ADJ`` for colours and sizes, ``OTHER`` otherwise."""
    if word in SHAPES:
        return "NOUN"
    return "ADJ" if word in COLOURS or word in SIZES else "OTHER"


def _permute_at(words: list[str], idx: list[int], rng: np.random.Generator) -> None:
    vals = [words[i] for i in idx]
    for i, k in zip(idx, rng.permutation(len(idx)), strict=True):
        words[i] = vals[k]


def _trigrams(words: list[str]) -> list[list[str]]:
    return [words[i : i + 3] for i in range(0, len(words), 3)]


def shuffle_nouns_and_adj(words: list[str], rng: np.random.Generator) -> list[str]:
    """ARO: nouns permuted among noun positions, adjectives among adjective positions."""
    out = list(words)
    _permute_at(out, [i for i, w in enumerate(words) if pos_tag(w) == "NOUN"], rng)
    _permute_at(out, [i for i, w in enumerate(words) if pos_tag(w) == "ADJ"], rng)
    return out


def shuffle_all_but_nouns_and_adj(words: list[str], rng: np.random.Generator) -> list[str]:
    """ARO: every other word permuted among the non-noun, non-adjective positions."""
    out = list(words)
    _permute_at(out, [i for i, w in enumerate(words) if pos_tag(w) == "OTHER"], rng)
    return out


def shuffle_within_trigrams(words: list[str], rng: np.random.Generator) -> list[str]:
    """ARO: the words of each consecutive trigram permuted in place."""
    return [tri[k] for tri in _trigrams(words) for k in rng.permutation(len(tri))]


def shuffle_trigrams(words: list[str], rng: np.random.Generator) -> list[str]:
    """ARO: the order of the consecutive trigrams permuted."""
    tris = _trigrams(words)
    return [w for k in rng.permutation(len(tris)) for w in tris[k]]


ORDER_PERTURBATIONS = (
    shuffle_nouns_and_adj,
    shuffle_all_but_nouns_and_adj,
    shuffle_within_trigrams,
    shuffle_trigrams,
)


def order_options(text: str, rng: np.random.Generator, tries: int = 50) -> list[str]:
    """``[text, p1, p2, p3, p4]`` with the four ARO order perturbations.

    Departure from ARO: a perturbation equal to the original or to an earlier option is
    redrawn (up to ``tries`` times), so no two options tie by their text.
    """
    words = text.split(" ")
    out = [text]
    for perturb in ORDER_PERTURBATIONS:
        for _ in range(tries):
            cand = " ".join(perturb(words, rng))
            if cand not in out:
                break
        out.append(cand)
    return out


# ------------------------------------------------------------------------------ BPE length


@lru_cache(maxsize=1)
def _bpe():
    from open_clip.tokenizer import _tokenizer  # lazy: importing open_clip loads torch

    return _tokenizer


def bpe_len(text: str) -> int:
    """Number of open_clip BPE tokens of ``text`` (no start/end tokens)."""
    return len(_bpe().encode(text))
