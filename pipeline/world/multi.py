"""shapes-multi: CLEVR-HOPE-like text -> image retrieval over galleries of near-duplicates.

Group ``index`` is ``MULTI_GROUP_SIZE`` scenes: a *base* scene of ``n`` objects (``n`` =
3, 4, 5 by ``index % 3``; distinct shapes, colours drawn from the palette with repeats,
sizes at random) on distinct cells of a jittered 3 x 3 grid, and variants that each differ
from the base by exactly one edit:

=================  ====================================================================
variant            edit of the base
=================  ====================================================================
``colour-swap``    two objects of different colours exchange their colours (binding)
``colour-change``  one object takes another palette colour (binding)
``position-swap``  two objects exchange their positions (relation)
``move``           one object moves to a free cell on the other side of another, along a
                   grid axis on which the two are apart (relation)
=================  ====================================================================

Variants keep the base's background, sizes and per-object colour jitter, so only the edit
differs; no two shapes touch (no depth relations). Relation variants are drawn first (as many
as captions can tell apart, up to ``MULTI_RELATION_TARGET``); binding variants (every colour
swap, then colour changes in random order) fill the group. Row ``v0`` is the base, ``v1``
... the variants in random order (column ``variant`` names the kind).

Captions. Each scene's caption is an ``And`` chain that names every object with its colour:
a path through all objects along clear relations (``relation_clear``), rendered "a red
circle left of a blue square which is above a green star ...", plus at most one extra
relation ("and the circle left of the star") for 3 and 4 objects. A binding variant's
caption is false of every other scene by its colours alone; among the base and the relation
variants (all in the base's colours) a variant is kept only if it and every scene kept
before it still have a chain that is false (not ambiguous) of all the others, and each
scene gets one of its shortest such chains. Every caption is then checked with
``captions.truth`` against the whole group (true of its own scene only; a failing group is
redrawn). Every word of these captions is one BPE token, so a 5-object path (15 words of
objects, 4 relations of 1-2 words, 3 ``which is``) has 25-29 tokens, within
``MULTI_MAX_TOKENS`` (the toy CLIP's context of 32 less the start and end tokens); an extra
relation never fits a 5-object path.

Group size. The larger the group, the lower a scorer that sees only which shapes are
present ranks: it ties the whole group (R@10 ~ 10/size with random tie-breaking). Three objects cap it: at most 21
binding variants (3 swaps + 3 x 6 colour changes) and few relation variants that chains can
tell apart, so greedy orders from a random 3-object base reach 27 scenes for about one base
in six and 30 for hardly any. So the size is 27, which a 3-object group reaches in ~20
proposals (docs/trials.md, Cache, solvers and world).

Across groups. Groups are drawn in order (:func:`multi_group`); group k is redrawn until
no caption of it holds in a scene of groups 0 .. k-1 and none of theirs in its scenes, so
every query is true of exactly one image of the suite, as in shapes-retrieval.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from pipeline.world.captions import And, Ref, Rel, bpe_len, caption, truth
from pipeline.world.sampling import make_obj, sample_background
from pipeline.world.scenes import (
    COLOURS,
    GAP,
    OPPOSITE,
    SHAPES,
    SIZES,
    Obj,
    Scene,
    in_frame,
    relation_clear,
    relation_value,
)
from pipeline.world.suites import Item, base_row, holdout, object_columns

MULTI_GROUP_SIZE = 27  # scenes per group: the most every 3-object group reaches (see above)
MULTI_OBJECTS = (3, 4, 5)  # objects per scene, group ``index`` takes MULTI_OBJECTS[index % 3]
MULTI_RELATION_TARGET = MULTI_GROUP_SIZE - 1  # relation variants sought first; binding fill up
MULTI_MAX_TOKENS = 30  # BPE tokens of a caption: the toy CLIP's context 32 less sot/eot
MULTI_MAX_TRIES = 2000  # base scenes proposed per group (a 3-object group succeeds ~1 in 20)
SPATIAL = ("left", "right", "above", "below")
# Objects sit on a 3 x 3 grid, jittered by at most GRID_JITTER: two objects in one row are
# clearly left/right of each other and neither above nor below (|dy| <= 0.024 <= NOT), two
# in one column the same way; a large and a small shape fit side by side, two large do not.
GRID = np.array([0.19, 0.5, 0.81])
GRID_JITTER = 0.012
BINDING_KINDS = ("colour-swap", "colour-change")
RELATION_KINDS = ("position-swap", "move")

Link = tuple[int, str, int]  # (i, rel, j): object i stands in rel to object j
Chain = tuple[Link, ...]


# ------------------------------------------------------------------------------ geometry


def apart(scene: Scene) -> bool:
    """Every shape in frame and every two a ``GAP`` apart (no overlaps: no depth)."""
    objs = scene.objects
    return all(in_frame(o) for o in objs) and all(
        (a.x - b.x) ** 2 + (a.y - b.y) ** 2 >= (a.r + b.r + GAP) ** 2
        for a, b in itertools.combinations(objs, 2)
    )


def _base(rng: np.random.Generator, sid: str, n: int) -> Scene | None:
    """``n`` objects of distinct shapes on distinct cells of the jittered grid."""
    shapes = [SHAPES[int(k)] for k in rng.permutation(len(SHAPES))[:n]]
    cells = [divmod(int(k), 3) for k in rng.permutation(9)[:n]]  # (row, col)
    objs = []
    for z, (shape, (row, col)) in enumerate(zip(shapes, cells, strict=True)):
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        size = list(SIZES)[int(rng.integers(len(SIZES)))]
        o = make_obj(rng, shape, colour, size, z=z)
        jx, jy = rng.uniform(-GRID_JITTER, GRID_JITTER, size=2)
        objs.append(replace(o, x=float(GRID[col] + jx), y=float(GRID[row] + jy)))
    scene = Scene(sid, tuple(objs), sample_background(rng))
    return scene if apart(scene) else None


def cell_of(o: Obj) -> tuple[int, int]:
    """``(row, col)`` of the grid cell an object sits in."""
    return int(np.argmin(np.abs(GRID - o.y))), int(np.argmin(np.abs(GRID - o.x)))


def _moves(scene: Scene, i: int, j: int) -> list[Scene]:
    """Object i moved to each free grid cell on the other side of object j (along a grid
    axis on which the two are apart), keeping its jitter."""
    (ri, ci), (rj, cj) = cell_of(scene.objects[i]), cell_of(scene.objects[j])
    taken = {cell_of(o) for o in scene.objects}
    o = scene.objects[i]
    out = []
    for r, c in itertools.product(range(3), range(3)):
        across_x = ci != cj and (c - cj) * (ci - cj) < 0
        across_y = ri != rj and (r - rj) * (ri - rj) < 0
        if (r, c) not in taken and (across_x or across_y):
            moved = scene.with_object(
                i, x=float(o.x + GRID[c] - GRID[ci]), y=float(o.y + GRID[r] - GRID[ri])
            )
            if apart(moved):
                out.append(moved)
    return out


def _swapped(scene: Scene, i: int, j: int, *fields: str) -> Scene:
    a, b = scene.objects[i], scene.objects[j]
    out = scene.with_object(i, **{f: getattr(b, f) for f in fields})
    return out.with_object(j, **{f: getattr(a, f) for f in fields})


# ------------------------------------------------------------------------------ captions


def clear_links(scene: Scene) -> dict[tuple[int, int], str]:
    """``{(i, j): rel}`` for every ordered pair in a clear spatial relation (at most one)."""
    objs = scene.objects
    out = {}
    for i, j in itertools.permutations(range(len(objs)), 2):
        for rel in SPATIAL:
            if relation_clear(objs[i], objs[j], rel):
                out[(i, j)] = rel
    return out


def chains(scene: Scene, extra: bool) -> list[Chain]:
    """Paths through every object along clear relations (each path once), and with
    ``extra`` each of them plus one more clear relation off the path."""
    links = clear_links(scene)
    n = len(scene.objects)
    out: list[Chain] = []
    for perm in itertools.permutations(range(n)):
        if perm[0] > perm[-1] or any((perm[k], perm[k + 1]) not in links for k in range(n - 1)):
            continue
        path = tuple((perm[k], links[(perm[k], perm[k + 1])], perm[k + 1]) for k in range(n - 1))
        out.append(path)
        if extra:
            used = {frozenset((p, q)) for p, _, q in path}
            out += [
                path + ((i, r, j),)
                for (i, j), r in links.items()
                if i < j and frozenset((i, j)) not in used
            ]
    return out


def false_in(chain: Chain, scene: Scene) -> bool:
    """Whether some link of ``chain`` is False (not ambiguous) in ``scene`` (same colours)."""
    objs = scene.objects
    return any(relation_value(objs[i], objs[j], rel) is False for i, rel, j in chain)


def chain_claim(chain: Chain, scene: Scene, rng: np.random.Generator) -> And:
    """The claim of ``chain`` in ``scene``'s colours; the path read in a random direction and
    the extra link, if any, from a random end."""
    n = len(scene.objects)
    path, extra = list(chain[: n - 1]), list(chain[n - 1 :])
    if rng.random() < 0.5:
        path = [(j, OPPOSITE[r], i) for i, r, j in reversed(path)]
    extra = [(j, OPPOSITE[r], i) if rng.random() < 0.5 else (i, r, j) for i, r, j in extra]
    objs = scene.objects
    ref = [Ref(o.shape, o.colour) for o in objs]
    return And(tuple(Rel(ref[i], r, ref[j]) for i, r, j in path + extra))


def _fits(chain: Chain, scene: Scene) -> bool:
    return bpe_len(caption(chain_claim(chain, scene, np.random.default_rng(0)))) <= MULTI_MAX_TOKENS


# ------------------------------------------------------------------------------ groups


def _relation_candidates(rng: np.random.Generator, base: Scene) -> list[tuple[tuple, Scene]]:
    n = len(base.objects)
    out = [
        (("position-swap", i, j), _swapped(base, i, j, "x", "y"))
        for i, j in itertools.combinations(range(n), 2)
    ]
    for i, j in itertools.permutations(range(n), 2):
        out += [(("move", i, j), m) for m in _moves(base, i, j)]
    out = [(e, c) for e, c in out if apart(c)]
    return [out[int(k)] for k in rng.permutation(len(out))]


def _binding_candidates(rng: np.random.Generator, base: Scene) -> list[tuple[tuple, Scene]]:
    objs = base.objects
    swaps = [
        (("colour-swap", i, j), _swapped(base, i, j, "colour"))
        for i, j in itertools.combinations(range(len(objs)), 2)
        if objs[i].colour != objs[j].colour
    ]
    changes = [
        (("colour-change", i, c), base.with_object(i, colour=c))
        for i, o in enumerate(objs)
        for c in COLOURS
        if c != o.colour
    ]
    return [swaps[int(k)] for k in rng.permutation(len(swaps))] + [
        changes[int(k)] for k in rng.permutation(len(changes))
    ]


def _relation_set(
    rng: np.random.Generator, base: Scene, extra: bool
) -> tuple[list[tuple[tuple, Scene]], list[list[Chain]]] | None:
    """Base plus up to MULTI_RELATION_TARGET relation variants, with each scene's chains
    that are false of every other scene of the set (greedy over shuffled candidates)."""
    base_chains = [c for c in chains(base, extra) if _fits(c, base)]
    if not base_chains:
        return None
    kept, options = [(("base",), base)], [base_chains]
    for edit, cand in _relation_candidates(rng, base):
        if len(kept) > MULTI_RELATION_TARGET:
            break
        if any(
            all((o.x, o.y) == (p.x, p.y) for o, p in zip(cand.objects, s.objects, strict=True))
            for _, s in kept
        ):
            continue
        mine = [
            c
            for c in chains(cand, extra)
            if all(false_in(c, s) for _, s in kept) and _fits(c, cand)
        ]
        theirs = [[c for c in opts if false_in(c, cand)] for opts in options]
        if mine and all(theirs):
            kept.append((edit, cand))
            options = [*theirs, mine]
    return kept, options


def _pick_shortest(rng: np.random.Generator, options: list[Chain]) -> Chain:
    k = min(len(c) for c in options)
    short = [c for c in options if len(c) == k]
    return short[int(rng.integers(len(short)))]


Member = tuple[tuple, Scene, And]  # (edit, scene, claim) of one scene of a group


def _objects(scene: Scene) -> frozenset[tuple[str, str]]:
    return frozenset((o.colour, o.shape) for o in scene.objects)


def clashes(group: list[Member], other: list[Member]) -> bool:
    """Whether a caption of one group is not false of a scene of the other (either way).
    A caption names every object of its scene, so it can hold only where all of them are."""
    for (_, s, c), (_, t, d) in itertools.product(group, other):
        if _objects(s) <= _objects(t) and truth(c, t) is not False:
            return True
        if _objects(t) <= _objects(s) and truth(d, s) is not False:
            return True
    return False


def _draw_group(seed: int, index: int, earlier: list[list[Member]]) -> list[Member]:
    """Group ``index``: base first, then the variants in random order; redrawn until every
    caption is true of its own scene only, in the group and in the ``earlier`` groups."""
    sid, rng = holdout(seed, "multi", index)
    n = MULTI_OBJECTS[index % len(MULTI_OBJECTS)]
    extra = n < 5  # an extra relation fits 3 and 4 objects; a 5-object path leaves no room
    for _ in range(MULTI_MAX_TRIES):
        base = _base(rng, sid, n)
        made = None if base is None else _relation_set(rng, base, extra)
        if made is None:
            continue
        relational, options = made
        binding = _binding_candidates(rng, base)[: MULTI_GROUP_SIZE - len(relational)]
        if len(relational) + len(binding) < MULTI_GROUP_SIZE:
            continue
        base_paths = [c for c in chains(base, extra=False) if _fits(c, base)]
        picked = [
            (e, s, _pick_shortest(rng, opts))
            for (e, s), opts in zip(relational, options, strict=True)
        ]
        picked += [(e, s, _pick_shortest(rng, base_paths)) for e, s in binding]
        order = [0] + [1 + int(k) for k in rng.permutation(len(picked) - 1)]  # v0 = the base
        group = [(e, s, chain_claim(c, s, rng)) for e, s, c in (picked[k] for k in order)]
        if any(bpe_len(caption(c)) > MULTI_MAX_TOKENS for _, _, c in group):
            continue  # never expected: every chain was checked to fit
        if not all(
            truth(c, t) is (a == b)
            for a, (_, _, c) in enumerate(group)
            for b, (_, t, _) in enumerate(group)
        ):
            continue  # never expected: the chains were chosen to be false of the others
        if any(clashes(group, g) for g in earlier):
            continue
        return group
    raise RuntimeError(
        f"multi: no group of {MULTI_GROUP_SIZE} scenes for {sid} in {MULTI_MAX_TRIES} proposals"
    )


_GROUPS: dict[int, list[list[Member]]] = {}  # seed -> groups 0, 1, ... drawn so far


def multi_group(seed: int, index: int) -> list[Member]:
    """Group ``index`` of ``seed``; drawing it draws (and keeps) groups 0 .. index - 1
    first, which it must not clash with, so it is a pure function of (seed, index)."""
    groups = _GROUPS.setdefault(seed, [])
    while len(groups) <= index:
        groups.append(_draw_group(seed, len(groups), groups))
    return groups[index]


def multi_items(seed: int, index: int, suite: str = "shapes-multi") -> list[Item]:
    """Group ``index``: ``MULTI_GROUP_SIZE`` near-duplicate scenes, one row (query) each."""
    group = multi_group(seed, index)
    sid = group[0][1].scene_id
    items = []
    for v, (edit, scene, claim) in enumerate(group):
        image = f"{suite}/{sid}/v{v}.png"
        row = base_row(f"{sid}/v{v}", image, [caption(claim)], 0, "retrieval", scene)
        row.update(group=sid, variant=edit[0], **object_columns(scene, claim))
        items.append(
            Item(row, [(image, scene, False)], scene, [claim], {"edit": edit, "base": group[0][1]})
        )
    return items
