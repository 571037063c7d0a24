"""The caption splitter: a query's object phrases and the relations between them, read from
the caption's words, for retrieval suites without a scene annotation (COCO captions; the
geometry-aware rerankers align these phrases with the image's annotated objects).

``split_phrases``, its rule: lowercase the caption, tokenise words
(``&`` -> ``and``; ``;``/``:`` -> ``,``), then scan left to right matching the longest entry
of one table at each position:

* conjunctions (``,``, ``and``, ``with``, ``while``, ``or``, ``as well as`` ...) end the
  current phrase and cancel a relation still waiting for its object;
* relations (spatial: ``left of`` and its ``to the``/``on the`` forms, ``on top of``, ``in
  front of``, ``next to``, ``behind``, ``above``, ``on``, ``in`` ...; verbs: ``holding``,
  ``riding``, ``wearing`` ...; posture verb + spatial relation: ``sitting on``, ``parked
  next to`` ...; participles: ``covered with``, ``filled with`` ...) end the current phrase;
  the relation joins the last phrase before it (i) to the first phrase after it (j),
  ``(i, relation, j)``. Two relations with no words between them merge (``riding on``);
  a relation with no phrase before it, or none after it before a conjunction or the end,
  is dropped. ``to/on the left (side) of`` -> ``left of`` (same for right); other
  relations keep the caption's words;
* positions without a second object (``on the left``, ``in the background``, ``on the left
  side of the picture`` ...) end the phrase and are dropped; a place followed by ``of`` and
  anything but the frame (``in the middle of the street``, ``on the side of the road``, ``at
  the top of a hill``) is a relation, kept in the caption's words.

Each phrase loses leading articles (``a``, ``an``, ``the``) and ``of``, a leading ``there is/are``,
``photo/picture/image of`` and trailing copulas (``is``, ``are`` ...); empty phrases vanish.
Limits: no parser, so a relation binds only the nearest phrases ("a man and a woman on a
bench" relates only the woman), ``of`` stays inside phrases ("plate of food"), coordinated
modifiers split ("black and white dog" -> "black", "white dog"), ``with`` never becomes a
relation, unknown verbs stay inside the phrase ("a dog chewing a bone" -> one phrase), and
``between`` relates only its first argument.
"""

from __future__ import annotations

import re


def _entries(text: str) -> tuple[str, ...]:
    """``"a|b c|d"`` -> ``("a", "b c", "d")`` (table entries may have several words)."""
    return tuple(" ".join(e.split()) for e in text.split("|"))


_SIDES = {
    f"{pre}{side}{suf}": f"{side} of"
    for side in ("left", "right")
    for pre in ("", "to the ", "on the ", "at the ")
    for suf in (" of", " side of", " hand side of")
    if not (pre == "" and suf != " of")
}
_SPATIAL = {
    **_SIDES,
    **{w: w for w in _entries(
        "on|in|at|by|onto|into|over|above|below|under|underneath|beneath|atop|on top of|"
        "behind|in front of|in back of|next to|beside|near|close to|inside|outside|across|"
        "across from|along|against|around|between|through|toward|towards|facing|alongside|"
        "among|amongst"
    )},
    "inside of": "inside",
    "outside of": "outside",
}  # fmt: skip
_VERBS = _entries(
    "holding|holds|riding|rides|wearing|wears|carrying|carries|eating|eats|drinking|"
    "watching|pulling|pushing|throwing|catching|kicking|hitting|swinging|using|chasing|"
    "feeding|petting|hugging|covering|surrounding|overlooking|crossing|approaching|cutting|"
    "reading|flying|has|have|having|contains|containing|looking at|playing with|"
    "surrounded by|covered with|covered in|covered by|filled with|full of|topped with|"
    "made of|dressed in|pulled by|attached to|tied to|connected to|mounted on"
)
_POSTURES = _entries(  # combined with every spatial relation: "sitting on", "parked next to"
    "sitting|sits|standing|stands|lying|lies|laying|lays|parked|hanging|hangs|walking|"
    "running|perched|resting|leaning|placed|floating|stacked|displayed|located|seen|shown|"
    "posing|waiting"
)
_CONJUNCTIONS = _entries(
    ",|and|with|while|whilst|or|but|plus|as well as|along with|together with|that|which|"
    "who|where|as"
)
_PLACES = _entries(
    "on the left|on the right|on the left side|on the right side|on the side|to the left|"
    "to the right|to the side|in the middle|in the center|in the centre|in the background|"
    "in the foreground|in the distance|in the corner|in the front|in the back|at the top|"
    "at the bottom|at the left|at the right|at the side|at the front|at the back|"
    "on the top|on the bottom"
)
_POSITIONS = tuple(  # a place in the frame, no second object: "on the left (of the picture)"
    f"{place}{tail}"
    for place in _PLACES
    for tail in ("", " of the picture", " of the image", " of the photo", " of the frame")
)
# a place of another object: "in the middle of the street", "on the side of the road"
_SPATIAL.update({f"{place} of": f"{place} of" for place in _PLACES if f"{place} of" not in _SPATIAL})


def _phrase_table() -> dict[tuple[str, ...], tuple[str, str]]:
    """Token tuple -> (kind, canonical words); kind ``rel``, ``conj`` or ``skip``."""
    table: dict[tuple[str, ...], tuple[str, str]] = {}
    for surface, canon in _SPATIAL.items():
        table[tuple(surface.split())] = ("rel", canon)
    for verb in _VERBS:
        table[tuple(verb.split())] = ("rel", verb)
    for posture in _POSTURES:
        for surface, canon in _SPATIAL.items():
            table[(posture, *surface.split())] = ("rel", f"{posture} {canon}")
        for pos in _POSITIONS:  # "sitting on the left": a position, not "sitting on" + "left"
            table[(posture, *pos.split())] = ("skip", pos)
    for conj in _CONJUNCTIONS:
        table[tuple(conj.split())] = ("conj", conj)
    for pos in _POSITIONS:
        table[tuple(pos.split())] = ("skip", pos)
    return table


_TABLE = _phrase_table()
_MAX_LEN = max(len(k) for k in _TABLE)
_TOKEN = re.compile(r"[a-z0-9]+(?:['\-][a-z0-9]+)*|,")
_LEADING = ("a", "an", "the", "there", "is", "are", "was", "were", "of")
_PREFIXES = (("photo", "of"), ("picture", "of"), ("image", "of"), ("close", "up", "of"))
_TRAILING = ("is", "are", "was", "were", "be", "being", "been")


def _clean(tokens: list[str]) -> str:
    """The phrase of ``tokens`` without leading articles/``there is``/``photo of`` and
    trailing copulas."""
    changed = True
    while changed and tokens:
        changed = False
        while tokens and tokens[0] in _LEADING:
            tokens, changed = tokens[1:], True
        for pre in _PREFIXES:
            if tuple(tokens[: len(pre)]) == pre:
                tokens, changed = tokens[len(pre) :], True
    while tokens and tokens[-1] in _TRAILING:
        tokens = tokens[:-1]
    return " ".join(tokens)


def split_phrases(caption: str) -> tuple[list[str], list[tuple[int, str, int]]]:
    """The object phrases of ``caption`` and the relations between them (the rule and its
    limits are in the module docstring).

    Returns:
        ``(phrases, relations)``: lowercase phrases in caption order, and ``(i, relation, j)``
        with ``i < j`` phrase indices (i before the relation words, j after).

    Example:
        ``split_phrases("a red circle to the left of a blue square")`` ->
        ``(["red circle", "blue square"], [(0, "left of", 1)])``.
    """
    text = re.sub(r"[;:]", ",", caption.lower().replace("&", " and "))
    tokens = _TOKEN.findall(text)
    phrases: list[str] = []
    relations: list[tuple[int, str, int]] = []
    current: list[str] = []
    pending: tuple[int, str] | None = None  # (subject phrase, relation) awaiting its object

    def close() -> bool:
        nonlocal current, pending
        phrase, current = _clean(current), []
        if not phrase:
            return False
        phrases.append(phrase)
        if pending is not None:
            relations.append((pending[0], pending[1], len(phrases) - 1))
            pending = None
        return True

    k = 0
    while k < len(tokens):
        match = next(
            (
                (n, _TABLE[key])
                for n in range(min(_MAX_LEN, len(tokens) - k), 0, -1)
                if (key := tuple(tokens[k : k + n])) in _TABLE
            ),
            None,
        )
        if match is None:
            current.append(tokens[k])
            k += 1
            continue
        n, (kind, words) = match
        k += n
        if kind != "rel":  # a conjunction or a lone position: the phrase ends here
            close()
            pending = None
        elif not close() and pending is not None:  # adjacent relation words merge
            pending = (pending[0], f"{pending[1]} {words}")
        else:
            pending = (len(phrases) - 1, words) if phrases else None
    close()
    return phrases, relations


def spatial_relation(relation: str) -> str:
    """The spatial part of a relation, in the splitter's canonical words: a posture verb
    before a spatial relation is dropped and a side's forms read ``left of`` / ``right of``
    (``"Sitting  on"`` -> ``"on"``, ``"parked to the left of"`` -> ``"left of"``,
    ``"standing on top of"`` -> ``"on top of"``); any other relation comes back lowercased
    with its whitespace collapsed (``"holding"``). Captions split here and Visual Genome's
    predicates both carry such forms."""
    words = relation.lower().split()
    if len(words) > 1 and words[0] in _POSTURES and " ".join(words[1:]) in _SPATIAL:
        words = words[1:]
    text = " ".join(words)
    return _SPATIAL.get(text, text)


# ---------------------------------------------------------------------------- shared helpers
