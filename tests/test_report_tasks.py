"""The task layouts (pipeline.report.tasks): every role renders to tasks the registered suites
report, the real world maps the roles to the official suites, and the world is read from the
scored suites' names."""

from __future__ import annotations

import pytest

from pipeline.benchmarks import SUITES
from pipeline.report.sections import BINDING_SLICES, HEAD_TO_HEAD_TASKS, head_to_head_tasks
from pipeline.report.tasks import (
    ALL_TASKS,
    ARO_TASKS,
    BINDING_TASKS,
    DEV_TASKS,
    LAYOUTS,
    REAL,
    SHAPES,
    SUGARCREPE_TASKS,
    WHATSUP,
    label,
    layout_for,
)
from pipeline.scorers.bindclip.analysis import BINDING_ROWS, HEADLINE_ROWS
from pipeline.scorers.bindclip.report import SEED_ROWS
from pipeline.scorers.flowclip.analysis import CORRECTION_TASKS, SEED_TASKS

ROLE_LISTS = {
    "all-task": ALL_TASKS,
    "binding": BINDING_TASKS,
    "dev": DEV_TASKS,
    "head-to-head": (*HEAD_TO_HEAD_TASKS, *BINDING_SLICES),
    "bindclip table 1": (*HEADLINE_ROWS, *BINDING_ROWS),
    "bindclip seeds": SEED_ROWS,
    "flowclip corrections": CORRECTION_TASKS,
    "flowclip seeds": SEED_TASKS,
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.world)
@pytest.mark.parametrize("roles", ROLE_LISTS.values(), ids=list(ROLE_LISTS))
def test_every_role_renders_to_a_metric_its_suite_reports(layout, roles):
    tasks = layout.tasks(roles)
    assert tasks, "a role list renders to nothing"
    for suite, metric in tasks:
        assert metric in SUITES.get(suite).metric_names, (suite, metric)


def test_the_shapes_layout_is_the_identity():
    for roles in ROLE_LISTS.values():
        assert SHAPES.tasks(roles) == tuple(dict.fromkeys(roles))
    assert SHAPES.suite("shapes-dev") == "shapes-dev"


def test_the_real_layout_names_the_official_suites():
    assert REAL.tasks(ARO_TASKS) == (
        ("aro-relation", "relation"),
        ("aro-attribution", "attribution"),
        ("aro-coco-order", "P@1"),
        ("aro-flickr-order", "P@1"),
    )
    assert REAL.tasks(SUGARCREPE_TASKS) == tuple(("sugarcrepe", m) for _, m in SUGARCREPE_TASKS)
    assert {s for s, _ in REAL.tasks(WHATSUP)} == {
        "whatsup-a",
        "whatsup-b",
        "whatsup-coco",
        "whatsup-vg",
    }
    assert REAL.suites_of("shapes-whatsup") == ("whatsup-a", "whatsup-b")  # the 410-pair criterion
    assert REAL.suite("shapes-dev") == "coco-families-dev"  # the validation split
    assert len(REAL.means["all-task"]) == 7 + 4 + 4 + 1
    rows = head_to_head_tasks(REAL)
    assert ("sugarcrepe-pp", "swap-att") in rows and ("whatsup-b", "set") in rows
    assert len(rows) == len(set(rows))


def test_chance_levels_follow_the_options():
    assert REAL.chance(("aro-coco-order", "P@1")) == 0.2  # five captions
    assert REAL.chance(("whatsup-a", "individual")) == 0.25  # four prepositions
    assert REAL.chance(("whatsup-coco", "individual")) == 0.5  # two captions
    assert REAL.chance(("whatsup-b", "set")) == pytest.approx(1 / 256)
    assert SHAPES.chance(("shapes-aro", "order")) == 0.2
    assert SHAPES.chance(("shapes-sugarcrepe", "swap-att")) == 0.5


def test_the_world_is_read_from_the_scored_suites():
    assert layout_for({"shapes-aro": {}, "coco-objects": {}}) is SHAPES
    assert layout_for(["sugarcrepe", "whatsup-a"]) is REAL
    assert layout_for(["aro-coco-order"]) is REAL
    assert layout_for([]) is SHAPES


def test_labels_name_the_suite_only_where_the_metric_repeats():
    aro = REAL.tasks(ARO_TASKS)
    assert [label(t, aro) for t in aro] == [
        "relation",
        "attribution",
        "aro-coco-order P@1",
        "aro-flickr-order P@1",
    ]
