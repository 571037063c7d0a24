"""Checks of benchmark metrics and labels that the mutation audit found unguarded: the
column order of SugarCrepe++'s text-only units, and the truth of the COCO families' spatial
captions for either subject order and away from the frame's outer thirds."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from pipeline.benchmarks.coco_families import CocoFamiliesConfig, _geometric_items
from pipeline.benchmarks.sugarcrepe_pp import sugarcrepe_pp_text_units

KEYS = [f"image-{i}" for i in range(16)]  # enough keys for both subject orders to occur


def test_tot_text_units_read_p1_p2_n_in_that_order():
    """``text`` is [n, 3, D] ordered (P1, P2, N): an item right with that order is wrong
    with P2 and N exchanged, so a column mix-up changes the figure."""
    e = np.eye(3)
    r2 = np.sqrt(2)
    text = np.array(
        [
            [e[0], (e[0] + e[1]) / r2, e[2]],  # cos(P1,P2)=.71 > cos(P1,N)=0, cos(P2,N)=0: right
            [e[0], e[1], (e[0] + e[2]) / r2],  # cos(P1,P2)=0 < cos(P1,N)=.71: wrong
            [e[1], (e[1] + e[2]) / r2, e[0]],  # right
        ]
    )
    manifest = pd.DataFrame({"category": ["replace-obj", "replace-obj", "swap-att"]})
    units = sugarcrepe_pp_text_units(manifest, text)
    assert units["TOT"].values.tolist() == [1.0, 0.0, 1.0]
    assert units["TOT-replace-obj"].statistic() == pytest.approx(0.5)
    assert units["TOT-swap-att"].statistic() == 1.0


@pytest.mark.parametrize("top_first", [True, False])
def test_vertical_positive_is_true_for_either_subject(top_first):
    """The positive "A above B" / "A below B" must hold for the boxes whichever object the
    image's hash makes the subject: both subject orders are exercised over several keys."""
    top, bottom = ("dog", [0.4, 0.1, 0.6, 0.3]), ("cat", [0.35, 0.5, 0.65, 0.9])
    objs = [top, bottom] if top_first else [bottom, top]
    boxes = dict(objs)
    subjects = set()
    for key in KEYS:
        pos, neg = _geometric_items(objs, CocoFamiliesConfig(), key)["vertical"]["captions"]
        a, rel, b = re.fullmatch(r"an? (\w+) (above|below) an? (\w+)", pos).groups()
        subjects.add(a)
        assert (boxes[a][3] <= boxes[b][1]) == (rel == "above"), pos
        assert neg == pos.replace(rel, {"above": "below", "below": "above"}[rel])
    assert subjects == {"dog", "cat"}


def test_relative_geometry_and_depth_positives_are_true_for_either_subject():
    """The same for left/right and for the box-bottom depth rule (the lower bottom is in
    front)."""
    left, right = ("dog", [0.05, 0.4, 0.25, 0.6]), ("cat", [0.6, 0.3, 0.9, 0.7])
    near, far = ("dog", [0.2, 0.3, 0.7, 0.95]), ("cat", [0.3, 0.2, 0.6, 0.8])
    for objs, family, pattern in (
        ([left, right], "relative-geometry", r"an? (\w+) to the (left|right) of an? (\w+)"),
        ([near, far], "depth", r"an? (\w+) (in front of|behind) an? (\w+)"),
    ):
        boxes = dict(objs)
        subjects = set()
        for key in KEYS:
            pos = _geometric_items(objs, CocoFamiliesConfig(), key)[family]["captions"][0]
            a, rel, b = re.fullmatch(pattern, pos).groups()
            subjects.add(a)
            if family == "depth":
                assert (boxes[a][3] > boxes[b][3]) == (rel == "in front of"), pos
            else:
                assert (boxes[a][2] <= boxes[b][0]) == (rel == "left"), pos
        assert subjects == {"dog", "cat"}


@pytest.mark.parametrize(
    "box,side",
    [
        ([0.1, 0.4, 0.4, 0.6], "left"),  # centre x 0.25 < 1/3
        ([0.6, 0.4, 0.9, 0.6], "right"),  # centre x 0.75 > 2/3
        ([0.3, 0.4, 0.6, 0.6], None),  # centre x 0.45: the middle third names no side
        ([0.4, 0.4, 0.7, 0.6], None),  # centre x 0.55
    ],
)
def test_absolute_position_needs_the_outer_thirds(box, side):
    """Only a box centred in the left or right third of the frame gives an absolute-position
    item; a centred object is on neither side."""
    items = _geometric_items([("dog", box)], CocoFamiliesConfig(), "k")
    if side is None:
        assert "absolute-position" not in items
    else:
        assert (
            items["absolute-position"]["captions"][0] == f"a dog on the {side} side of the picture"
        )


def test_absolute_position_skips_a_larger_centred_object():
    """The largest object is tried first, but a centred one is skipped for a smaller object
    in an outer third."""
    objs = [("bus", [0.3, 0.2, 0.6, 0.9]), ("dog", [0.8, 0.5, 0.95, 0.7])]
    items = _geometric_items(objs, CocoFamiliesConfig(), "k")
    assert items["absolute-position"]["captions"] == [
        "a dog on the right side of the picture",
        "a dog on the left side of the picture",
    ]
