"""The shapes world leaves its no-binding shortcuts near chance (:mod:`pipeline.world.shortcuts`
on a small built world): no object's absolute position or fixed pixel answers a What'sUp-style
relation, no replace-rel item is decided by a depth phrase alone, and a negation scene's object
count says nothing about which caption is true."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.config import WorldConfig
from pipeline.world import build_world
from pipeline.world.scenes import AXIS
from pipeline.world.shortcuts import depth_phrase, negation_count, whatsup_shortcuts
from tests.test_world import manifest

SMALL = WorldConfig(n_whatsup=40, n_aro=3, n_sugarcrepe=30, n_retrieval_groups=2, n_multi_groups=1,
                    n_train=320, n_dev=8)  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    build_world(SMALL, out=out, progress=False)
    return out


def test_whatsup_pairs_are_small_and_placed_anywhere(world):
    """Both objects are small and the pair's midpoint spans most of the frame, so the subject
    sits on the far side of the centre from its relation in a good share of the rows."""
    df = manifest(world, "shapes-whatsup")
    scenes = [json.loads(s)["objects"] for s in df["scene"]]
    assert all(o["size"] == "small" for objs in scenes for o in objs)
    direction = {"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}
    offset = np.array([direction[a][0] * (objs[0]["x"] - 0.5) + direction[a][1] * (objs[0]["y"] - 0.5)
                       for a, objs in zip(df["arrangement"], scenes, strict=True)])  # fmt: skip
    assert 0.1 < (offset < 0).mean() < 0.5  # the subject across the centre: never, before
    mids = np.array([[(objs[0]["x"] + objs[1]["x"]) / 2, (objs[0]["y"] + objs[1]["y"]) / 2] for objs in scenes])
    assert mids.max(0).min() - mids.min(0).max() > 0.3  # not a pair straddling the centre


def test_whatsup_position_and_pixel_baselines_stay_near_chance(world):
    """Chance is 25 / 6.25 / 0.4 % (individual / pair / set); one object's half or a fixed pixel
    stays well below the 99.9 / 91.4 % that a centred pair gave them."""
    got = whatsup_shortcuts(manifest(world, "shapes-whatsup"), world / "images")
    for name in ("subject's half", "reference's half", "fixed-pixel lookup"):
        assert got[name]["individual"] < 0.5 and got[name]["set"] < 0.15, (name, got[name])


def test_replace_rel_never_puts_a_depth_phrase_in_one_option_only(world):
    df = manifest(world, "shapes-sugarcrepe")
    got = depth_phrase(df)
    assert got["items"] == SMALL.n_sugarcrepe and got["decided"] == 0
    assert any(AXIS.get(w) == "depth" for caps in df[df["category"] == "replace-rel"]["captions"]
               for c in caps for w in c.split())  # fmt: skip  # depth relations are still asked


def test_negation_scenes_count_alike_whichever_caption_is_true(world):
    """Both kinds of negation item show 2-4 objects, and the counterfactual keeps the count."""
    df = manifest(world, "shapes-train")
    rows = df[df["family"] == "negation"]
    count = lambda col: rows[col].map(lambda s: len(json.loads(s)["objects"])).to_numpy()  # noqa: E731
    n, n_cf = count("scene"), count("cf_scene")
    assert np.array_equal(n, n_cf)
    no_true = np.array([" no " in f" {caps[c]} " for caps, c in zip(rows["captions"], rows["correct"], strict=True)])
    assert set(n[no_true]) == set(n[~no_true]) == {2, 3, 4}
    assert abs(negation_count(rows)["object-count accuracy"] - 0.5) < 0.15


def test_subject_half_reads_the_first_named_object_of_each_option():
    """The two-option rule scores each option by its own subject (named with or without size
    and colour) and skips rows with a caption that states no left/right/above/below."""
    from pipeline.world.shortcuts import subject_half

    objects = [{"shape": "circle", "colour": "red", "size": "small", "x": 0.7, "y": 0.5},
               {"shape": "circle", "colour": "blue", "size": "large", "x": 0.9, "y": 0.5},
               {"shape": "square", "colour": "green", "size": "small", "x": 0.3, "y": 0.2}]  # fmt: skip
    scene = json.dumps({"objects": objects})
    df = pd.DataFrame({
        "captions": [["the small red circle is left of the large blue circle", "a red circle to the right of a blue circle"],
                     ["a blue circle above a square", "the square is above the blue circle"],
                     ["a red circle in front of a square", "a red circle to the left of a square"]],
        "correct": [0, 1, 0], "scene": [scene] * 3})  # fmt: skip
    # row 0: the red circle sits right of centre, so "right" wins, wrongly; row 1: the square
    # (y 0.2) is higher than the blue circle (y 0.5 is the centre), so it wins, rightly;
    # row 2 states a depth relation and is skipped
    assert subject_half(df) == {"items": 2, "accuracy": 0.5}
