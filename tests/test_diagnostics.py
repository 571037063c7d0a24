"""pipeline.scorers.bindclip.diagnostics: the per-energy breakdown against hand-computed values, and the
grounding precision on a tiny store (uniform plan -> box share; plan inside the box -> 1)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.scorers.bindclip.coupling import coupling_maps, edited_words
from pipeline.scorers.bindclip.diagnostics import (
    argument_swaps,
    attribute_binding,
    energy_breakdowns,
    grounding_precision,
    relation_of,
    word_kind,
)


class _RowStore:
    """images(rows) / texts(rows) hand back the store rows themselves."""

    def images(self, rows):
        return torch.tensor(np.asarray(rows))

    def texts(self, rows):
        return torch.tensor(np.asarray(rows))


class _StubScorer:
    """margin = pos - neg; moves = (pos - neg, neg - pos, 0, image - 1); scales 2."""

    def explain(self, image, pos, neg):
        d = (pos - neg).float()
        moves = torch.stack([d, -d, torch.zeros_like(d), image.float() - 1], -1)
        scales = torch.full((4,), 2.0)
        return SimpleNamespace(
            score=d + (moves * scales).sum(-1),
            margin=d,
            moves=moves,
            scales=scales,
            contraction=torch.full_like(moves, 0.5),
        )


def test_energy_breakdown_hand_values():
    manifest = pd.DataFrame({"correct": [0, 1, 0], "category": ["a", "a", "b"]})
    index = {
        "image": np.array([[0], [1], [2]]),
        "captions": np.array([[10, 11, -1], [12, 13, -1], [14, 15, 16]]),
    }
    rows = {r["category"]: r for r in energy_breakdowns(_StubScorer(), _RowStore(), manifest, index, "s", batch_size=2)["category"]}
    a, b = rows["a"], rows["b"]
    # a: pairs (img 0: 10 vs 11), (img 1: 13 vs 12): g = [-1, +1], spatial = [-1, 0] * 2
    assert a["pairs"] == 2 and a["acc_margin"] == 0.5 and a["acc_s"] == 0.5 and a["acc_learned"] == 0.0
    assert a["semantic_share_true"] == 0.5 and a["semantic_mean_abs"] == 2.0
    assert a["order_share_true"] == 0.0 and a["order_mean_abs"] == 0.0
    assert a["spatial_share_true"] == 0.0 and a["spatial_mean_abs"] == 1.0 and a["spatial_gamma"] == 0.5
    # b: pairs (img 2: 14 vs 15), (14 vs 16): g = [-1, -2], spatial = [+2, +2]
    assert b["pairs"] == 2 and b["acc_margin"] == 0.0 and b["acc_s"] == 0.5 and b["acc_learned"] == 1.0
    assert b["spatial_share_true"] == 1.0 and b["spatial_mean_abs"] == 2.0 and b["mean_abs_margin"] == 1.5
    # s less one energy: b's s = [+1, 0]; without spatial [-1, -2], without semantic [+3, +4]
    assert (b["spatial_acc_without"], b["semantic_acc_without"], b["order_acc_without"]) == (0.0, 1.0, 0.5)
    # a's s = [-3, +1]; without spatial [-1, +1], without semantic [-1, -1]
    assert (a["spatial_acc_without"], a["semantic_acc_without"]) == (0.5, 0.0)


def test_word_kind():
    assert [word_kind(w) for w in ("red", "star", "large", "of")] == ["colour", "shape", "size", "other"]


@pytest.mark.parametrize("plan_kind", ["real", "uniform", "inside"])
def test_grounding_precision(tiny_store, plan_kind):
    from pipeline.scorers import create_scorer
    from pipeline.scorers.bindclip.training import load_grounded

    data = load_grounded(tiny_store, "shapes-train")
    gmap = data.pos
    torch.manual_seed(0)
    scorer = create_scorer("bindclip", tiny_store.dims, tiny_store.projections(), h=16, n_iters=16)
    cells = gmap.cells  # [E, R]
    if plan_kind != "real":
        real = scorer.explain

        def explain(image, a, b):
            ex = real(image, a, b)
            P = torch.zeros_like(ex.plan)
            P[..., :-1] = 1.0  # uniform over the non-null cells
            if plan_kind == "inside":  # every grounded row inside its box only (both depths)
                item = torch.arange(len(image))
                for i in item.tolist():
                    for e in range(gmap.offsets[i], gmap.offsets[i + 1]):
                        P[i, gmap.row[e], :-1] = cells[e].repeat(2).float()
            ex.plan = P
            return ex

        scorer.explain = explain  # batches start at item 0 with batch_size >= len(data)
    table = grounding_precision(scorer, data, batch_size=64)
    assert list(table.index) == ["shape"] and table.loc["shape", "words"] == 32
    share = cells.float().mean(-1).mean().item()
    assert table.loc["shape", "box share of the grid"] == pytest.approx(share)
    for col in ("in-box mass (early)", "in-box mass (final)"):
        value = table.loc["shape", col]
        if plan_kind == "uniform":
            assert value == pytest.approx(share, abs=1e-6)
        elif plan_kind == "inside":
            assert value == pytest.approx(1.0)
        else:
            assert 0.0 <= value <= 1.0


def test_grounding_precision_leaves_out_words_beyond_the_truncation(tiny_store):
    """A grounded word past the scorer's ``max_tokens`` has no row of its own caption (the
    rows after them are the negative caption's): it is left out, not read from those."""
    from pipeline.scorers import create_scorer
    from pipeline.scorers.bindclip.training import load_grounded

    data = load_grounded(tiny_store, "shapes-train")
    cut = int(data.pos.row.max())  # the last grounded position falls just past the truncation
    torch.manual_seed(0)
    scorer = create_scorer("bindclip", tiny_store.dims, tiny_store.projections(), h=16, n_iters=16, max_tokens=cut)
    table = grounding_precision(scorer, data, batch_size=64)
    assert table["words"].sum() == int((data.pos.row < cut).sum()) < len(data.pos.row)


def test_relation_of_and_relation_groups():
    assert [relation_of(c) for c in (
        "a red circle to the left of a blue square",
        "the star is right of the cross",
        "a star higher than a cross",
        "a cross partly hidden by a star",
        "the red circle is on the left side of the picture",
        "a red circle and a blue square",
    )] == ["left", "right", "above", "behind", None, None]
    manifest = pd.DataFrame(
        {
            "correct": [0, 1, 0],
            "category": ["left", "relation", "attribution"],
            "captions": [
                ["a star to the left of a cross", "a star below a cross", "a star to the right of a cross"],
                ["a cross left of a star", "a star left of a cross", None],
                ["a red star and a blue cross", "a blue star and a red cross", None],
            ],
        }
    )
    index = {"image": np.array([[0], [1], [2]]), "captions": np.array([[0, 1, 2], [3, 4, -1], [5, 6, -1]])}
    rows = energy_breakdowns(_StubScorer(), _RowStore(), manifest, index, "s", by=("relation",))["relation"]
    assert sorted(r["category"] for r in rows) == ["attribution", "left vs below", "left vs right", "relation: left"]
    with pytest.raises(ValueError, match="by must be"):
        energy_breakdowns(_StubScorer(), _RowStore(), manifest, index, "s", by=("word",))["word"]


def test_edit_kind_groups():
    """Pairs grouped by the edit kind of their shapes-dev row (role swap by axis)."""
    import json

    scene = json.dumps({"objects": []})
    manifest = pd.DataFrame(
        {
            "correct": [0, 0, 0],
            "family": ["role-swap", "role-swap", "entity"],
            "category": ["role-swap", "role-swap", "entity"],
            "scene": scene,
            "cf_scene": scene,
            "captions": [
                ["a star above a cross", "a cross above a star"],
                ["a star partly covering a cross", "a cross partly covering a star"],
                ["a star", "a circle"],
            ],
        }
    )
    index = {"image": np.array([[0], [1], [2]]), "captions": np.array([[0, 1], [2, 3], [4, 5]])}
    rows = energy_breakdowns(_StubScorer(), _RowStore(), manifest, index, "s", by=("edit_kind",))["edit_kind"]
    assert sorted((r["category"], r["pairs"]) for r in rows) == [
        ("entity", 1), ("role-swap: depth", 1), ("role-swap: vertical", 1)
    ]


def test_attribute_binding_hand_values():
    """A red square fills the top-left patch of a 2x2 grid and a blue circle the
    bottom-right one. The true caption's rows each sit on their referent; the negative's
    colour words split evenly over the two, its shape words sit on their shapes."""
    import json

    scene = {"objects": [
        {"shape": "square", "colour": "red", "x": 0.25, "y": 0.25, "r": 0.24 / 0.78, "z": 0},
        {"shape": "circle", "colour": "blue", "x": 0.75, "y": 0.75, "r": 0.24, "z": 1},
    ]}  # fmt: skip
    manifest = pd.DataFrame({
        "correct": [0], "category": ["swap-att"], "scene": [json.dumps(scene)],
        "captions": [["a red square and a blue circle", "a blue square and a red circle"]],
    })  # fmt: skip
    index = {"image": np.array([[0]]), "captions": np.array([[10, 11]])}
    sq, ci, even = [1.0, 0, 0, 0], [0, 0, 0, 1.0], [0.5, 0, 0, 0.5]  # patches (0,0) (0,1) (1,0) (1,1)
    n, L, R = 7, 2, 4  # one BPE token per word: word w is row w
    rows = {1: sq, 2: sq, 5: ci, 6: ci}  # true: red, square, blue, circle
    rows |= {n + 1: even, n + 2: sq, n + 5: even, n + 6: ci}  # negative: blue, square, red, circle
    plan = torch.zeros(1, 2 * n + 1, L * R + 1)
    for row, dist in rows.items():
        plan[0, row, :-1] = torch.tensor(dist * L) / (2 * L)
    S = torch.zeros(1, 2 * n, L, R)
    S[0, 1, 0] = torch.tensor([1.0, 0, 0, 0.5])  # "red": higher on its square
    S[0, 5, 0] = torch.tensor([0.9, 0, 0, 0.1])  # "blue": higher on the square, not its circle
    S[0, 2, 1], S[0, 6, 1] = torch.tensor(sq), torch.tensor(ci)  # shape words: on their shapes
    energies = torch.zeros(1, 2, 4)
    energies[0, 1, 2] = 1.0  # the order energy prefers the negative

    class Stub:
        def explain(self, image, a, b):
            mask = torch.ones(1, 2, n, dtype=torch.bool)
            return SimpleNamespace(plan=plan, S=S, token_mask=mask, grid=(2, 2), energies=energies)

    out = attribute_binding(Stub(), _RowStore(), manifest, index)
    assert out["items"] == 1
    assert out["in_mask colour (true)"] == pytest.approx(1.0)
    assert out["in_mask shape (true)"] == pytest.approx(1.0)
    assert out["in_mask colour (negative)"] == pytest.approx(0.5)  # half on the other object
    assert out["in_mask shape (negative)"] == pytest.approx(1.0)
    assert out["bc colour-shape (true)"] == pytest.approx(1.0)
    assert out["bc colour-shape (negative)"] == pytest.approx(np.sqrt(0.5))
    assert out["S own > other colour"] == 0.5 and out["S own > other shape"] == 1.0
    assert out["acc_bc"] == 1.0 and out["acc_order"] == 0.0
    # S on the referents: true 0.5 + 0.5 + 0.05 + 0.5 (depths averaged) > negative 0
    assert out["acc_S_referent"] == 1.0
    S[0, n + 6, 1, 3] = 4.0  # the negative's "circle" reads 2.0 on the circle: now it wins
    assert attribute_binding(Stub(), _RowStore(), manifest, index)["acc_S_referent"] == 0.0


def test_argument_swaps_hand_values():
    """2x2 grid; a star on the left column, a circle on the right. Item 0 ("the star is
    left of the circle", true): every plan row of both captions sits on its shape, so the
    shape words pick the true caption; the negative's other rows make it look true as well
    ("the", "is" before its relation word on the left, "of", "the" after it on the right:
    span centroids 5/12 and 7/12), so the spans do not. Item 1 (above, answered as
    true by s but not by s - g) has only one shape word per caption: neither reading picks
    it. A relation that is not planar is left out, and so is an item whose captions word
    the relation otherwise ("under" for below)."""
    left, right = [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5]  # patches (0,0) (0,1) (1,0) (1,1)
    manifest = pd.DataFrame({
        "correct": [0, 1, 0, 0], "category": ["relation"] * 4,
        "relation_name": ["left of", "above", "behind", "below"],
        "captions": [
            ["the star is left of the circle", "the circle is left of the star"],
            ["a red thing is above the circle", "the circle is above a red thing"],
            ["the star is behind the circle", "the circle is behind the star"],
            ["the star is under the circle", "the circle is under the star"],
        ],
    })  # fmt: skip
    index = {"image": np.array([[0], [1], [2], [3]]), "captions": np.array([[10, 11], [12, 13], [14, 15], [16, 17]])}
    n, L, R = 7, 2, 4  # one BPE token per word: word w of a caption is row w of its block
    plan = torch.zeros(3, 2 * n + 1, L * R + 1)
    true0 = {0: left, 1: left, 2: left, 3: right, 4: right, 5: right, 6: right}  # star ... | circle
    neg0 = {0: left, 1: right, 2: left, 3: right, 4: right, 5: right, 6: left}  # circle on the right, star left
    for block, rows in ((0, true0), (n, neg0)):
        for w, dist in rows.items():
            plan[0, block + w, :-1] = torch.tensor(dist * L) / (2 * L)
    plan[1, : 2 * n, :-1] = 1.0 / (L * R)  # item 1: uniform rows

    class Stub:
        span_gate = None

        def explain(self, image, a, b):
            assert len(image) == 3  # the "behind" item is not read
            return SimpleNamespace(plan=plan, token_mask=torch.ones(3, 2, n, dtype=torch.bool), grid=(2, 2),
                                   score=torch.tensor([1.0, 2.0, 1.0]), margin=torch.tensor([0.5, 3.0, 0.0]),
                                   span_gate=self.span_gate)

    rows = {r["relation"]: r for r in argument_swaps(Stub(), _RowStore(), manifest, index)}
    assert set(rows) == {"left of", "above", "all"}
    assert rows["left of"] == {"relation": "left of", "items": 1, "shapes": 1.0, "spans": 0.0, "learned": 1.0, "s": 1.0}
    assert rows["above"] == {"relation": "above", "items": 1, "shapes": 0.0, "spans": 0.0, "learned": 0.0, "s": 1.0}
    assert rows["all"]["items"] == 2 and rows["all"]["shapes"] == 0.5 and rows["all"]["s"] == 1.0

    # a span gate that all but drops "the", "is", "of": item 0's spans now hold the shapes only
    gated = Stub()
    gated.span_gate = torch.full((3, 2, n), 0.5)  # item 1 (and 2): every gate 1/2
    gated.span_gate[0] = torch.tensor([0.01, 1.0, 0.01, 0.5, 0.01, 0.01, 1.0])  # both captions of item 0
    rows = {r["relation"]: r for r in argument_swaps(gated, _RowStore(), manifest, index)}
    assert rows["left of"]["spans"] == 1.0 and rows["left of"]["shapes"] == 1.0
    assert rows["above"]["spans"] == 0.0  # uniform rows stay uninformative
    assert rows["left of"]["gate shape"] == pytest.approx(1.0) and rows["left of"]["gate other"] == pytest.approx(0.01)
    assert rows["left of"]["gate colour"] is None  # no colour word in item 0's true caption
    assert rows["all"]["gate shape"] == pytest.approx(0.75) and rows["all"]["gate colour"] == pytest.approx(0.5)
    assert rows["all"]["gate relation"] == pytest.approx(0.5) and rows["all"]["gate other"] == pytest.approx(0.255)


def test_edited_words():
    # attribute swap: the two colour words in each caption
    assert edited_words("a red circle and a blue square", "a blue circle and a red square") == ([1, 5], [1, 5])
    # noun-phrase swap with article agreement: articles are not edits, every swapped word is
    a, b = "there is an orange diamond above a blue cross", "there is a blue cross above an orange diamond"
    assert edited_words(a, b) == ([3, 4, 7, 8], [3, 4, 7, 8])
    # noun phrases of unequal length: both phrases move, the relation word stays unedited
    a, b = "a small purple diamond is left of a yellow square", "a yellow square is left of a small purple diamond"
    assert edited_words(a, b) == ([1, 2, 3, 8, 9], [1, 2, 7, 8, 9])
    # a swap without attribute or object words falls back to every non-grammar word
    assert edited_words("dogs chase cats", "cats chase dogs") == ([0, 2], [0, 2])
    # replacement of unequal length: the diff, without "in" / "of"
    a, b = "a red circle in front of a square", "a red circle behind a square"
    assert edited_words(a, b) == ([4], [3])
    # a length-matched addition (equal word counts, different words): the diff, not positions
    assert edited_words("a picture of a red circle", "a red circle and a star") == ([1], [5])
    # addition: only the longer caption has edited words
    assert edited_words("a red circle", "a red circle and a star") == ([], [5])
    assert edited_words("a red circle", "a red circle") == ([], [])


def test_coupling_maps_rows_and_boxes():
    """Item 0 is a swap-att item whose true caption is option 1; the plan puts the true
    caption's "red" on patch 0 (grounded 0.8) and the negative's "red" on patch 3."""
    import json

    scene = {"objects": [
        {"shape": "square", "colour": "red", "size": "small", "box": [0, 0, 0.5, 0.5]},
        {"shape": "circle", "colour": "blue", "size": "small", "box": [0.5, 0.5, 1, 1]},
    ]}  # fmt: skip
    manifest = pd.DataFrame({
        "correct": [1], "category": ["swap-att"], "scene": [json.dumps(scene)], "image": ["x.png"],
        "captions": [["a blue square and a red circle", "a red square and a blue circle"]],
    })  # fmt: skip
    index = {"image": np.array([[0]]), "captions": np.array([[10, 11]])}
    n, L, R = 7, 2, 4  # one BPE token per word: word w is row w (row x * n + w)
    plan = torch.zeros(1, 2 * n + 1, L * R + 1)
    plan[0, 1, [0, L * R]] = torch.tensor([0.4, 0.1])  # true "red" (word 1): patch 0 at depth 0, some null
    plan[0, 1, R] = 0.4  # ... and patch 0 at depth 1
    plan[0, n + 5, [3, R + 3]] = 0.5  # the negative's "red" (word 5): patch 3
    seen = {}

    class Stub:
        def explain(self, image, a, b):
            seen["texts"] = (int(a[0]), int(b[0]))
            mask = torch.ones(1, 2, n, dtype=torch.bool)
            return SimpleNamespace(plan=plan, token_mask=mask, grid=(2, 2), score=torch.tensor([1.5]))

    (item,) = coupling_maps(Stub(), _RowStore(), manifest, index, [0])
    assert seen["texts"] == (11, 10)  # scored as s(I, true, negative)
    assert item["score"] == 1.5 and item["category"] == "swap-att"
    true, negative = item["captions"]
    assert true["text"] == "a red square and a blue circle"
    assert [m["word"] for m in true["words"]] == ["red", "blue"]
    assert [m["word"] for m in negative["words"]] == ["blue", "red"]
    red = true["words"][0]
    np.testing.assert_allclose(red["rho"], [[1.0, 0.0], [0.0, 0.0]])
    assert red["grounded"] == pytest.approx(0.8 / 0.9)
    assert red["box"] == (0, 0, 0.5, 0.5)  # the one red object
    np.testing.assert_allclose(negative["words"][1]["rho"], [[0.0, 0.0], [0.0, 1.0]])
    assert negative["words"][1]["box"] == (0, 0, 0.5, 0.5)  # "red" names the square in either caption
    assert coupling_maps(Stub(), _RowStore(), manifest, index, []) == []
