"""shapes-retrieval, group by group: five scenes of the same two shapes and two colours in
other bindings and arrangements, one caption each, true of its own scene only (the suite's
rules are in :mod:`pipeline.world.suites`, the helpers every builder shares live there too).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from pipeline.world.captions import N_STYLES, Ref, Rel, caption
from pipeline.world.sampling import make_obj, sample_background
from pipeline.world.scenes import CLEAR, COLOURS, SHAPES, SIZES, Scene, scene_ok, scene_rng
from pipeline.world.suites import MAX_TRIES, Item, base_row, check, give_up, holdout, object_columns


def retrieval_combos(seed: int) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """All (shape pair, colour pair) combinations in a seeded order (group g takes g-th)."""
    combos = [
        (s, c)
        for s in itertools.combinations(SHAPES, 2)
        for c in itertools.combinations(COLOURS, 2)
    ]
    rng = scene_rng(seed, 0, "retrieval/combos")
    return [combos[i] for i in rng.permutation(len(combos))]


def retrieval_items(seed: int, index: int, suite: str = "shapes-retrieval") -> list[Item]:
    """Group ``index``: five scenes of two shapes and two colours, one caption each.

    With ``A = colour1 shape1`` and ``B = colour2 shape2`` along the group's axis:
    v0 ``A rel B``, v1 ``B rel A`` (positions swapped), v2 and v3 the colours swapped
    between the shapes (in both orders), v4 ``A rel' B`` on the other axis.
    """
    sid, rng = holdout(seed, "retrieval", index)
    combos = retrieval_combos(seed)
    if not 0 <= index < len(combos):
        raise ValueError(f"shapes-retrieval has {len(combos)} groups at most (one per combination), not group {index}")
    (s1, s2), (c1, c2) = combos[index]
    if rng.random() < 0.5:
        s1, s2 = s2, s1
    for _ in range(MAX_TRIES):
        size = {s1: list(SIZES)[int(rng.integers(2))], s2: list(SIZES)[int(rng.integers(2))]}
        horizontal = rng.random() < 0.5
        rel, rel_other = ("left", "above") if horizontal else ("above", "left")
        pairs = [
            ((c1, s1), (c2, s2)),
            ((c2, s2), (c1, s1)),
            ((c2, s1), (c1, s2)),
            ((c1, s2), (c2, s1)),
            ((c1, s1), (c2, s2)),
        ]
        claims = [
            Rel(Ref(p[1], p[0]), rel if v < 4 else rel_other, Ref(q[1], q[0]))
            for v, (p, q) in enumerate(pairs)
        ]
        scenes = []
        for v, ((ca, sa), (cb, sb)) in enumerate(pairs):
            first, second = (
                make_obj(rng, sa, ca, size[sa], z=0),
                make_obj(rng, sb, cb, size[sb], z=1),
            )
            along_h = horizontal if v < 4 else not horizontal
            dist = max(CLEAR + 0.04, first.r + second.r + rng.uniform(0.04, 0.1))
            mid = 0.5 + rng.uniform(-0.08, 0.08, size=2)
            d = np.array([1.0, 0.0] if along_h else [0.0, 1.0])
            pa = mid - d * dist / 2 + rng.uniform(-0.01, 0.01, size=2) * d[::-1]
            pb = mid + d * dist / 2 + rng.uniform(-0.01, 0.01, size=2) * d[::-1]
            objs = (
                replace(first, x=float(pa[0]), y=float(pa[1])),
                replace(second, x=float(pb[0]), y=float(pb[1])),
            )
            scenes.append(Scene(f"{sid}", objs, sample_background(rng)))
        if not all(scene_ok(s) for s in scenes):
            continue
        if not all(check(claims, s, v) for v, s in enumerate(scenes)):
            continue
        style = int(rng.integers(N_STYLES))
        items = []
        for v, (scene, claim) in enumerate(zip(scenes, claims, strict=True)):
            image = f"{suite}/{sid}/v{v}.png"
            row = base_row(f"{sid}/v{v}", image, [caption(claim, style)], 0, "retrieval", scene)
            row["group"] = sid
            row.update(object_columns(scene, claim))
            items.append(Item(row, [(image, scene, False)], scene, [claim]))
        return items
    raise give_up("retrieval", sid)
