"""Which suite and metric plays each role of the report's tables, per world.

The report's tables, means and goals name their tasks by role, in the shapes world's terms:
``("shapes-aro", "relation")`` is "ARO relation", ``("shapes-whatsup", "individual")`` is
"What'sUp individual accuracy", ``"shapes-dev"`` is "the training families' dev suite". A
:class:`TaskLayout` maps each role to the tasks that play it in one world:

    layout = layout_for(results)                      # from the scored suites' names
    layout.tasks(ARO_TASKS)                           # shapes: itself
    # real: (aro-relation, relation), (aro-attribution, attribution),
    #       (aro-coco-order, P@1), (aro-flickr-order, P@1)
    layout.suite("shapes-sugarcrepe")                 # real: "sugarcrepe"

so one section renders the shapes report and the real one, and a mean such as Flow-CLIP's
all-task mean is the seed's analogue in either world: on the real suites the official ARO,
SugarCrepe, What'sUp and retrieval tasks, on the shapes world their shapes-style stand-ins.
A role with no suite in a world maps to nothing, and the tables leave it out.

Chance levels belong to the world's tasks (ARO Order has five options, What'sUp COCO- and
GQA-spatial two, What'sUp A and B four), so :meth:`TaskLayout.chance` takes a mapped task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.benchmarks.coco_families import FAMILIES
from pipeline.benchmarks.sugarcrepe import CATEGORIES
from pipeline.manifests import world_suite

Task = tuple[str, str]  # (suite, metric): one task of a table or a mean

# The roles, in the shapes world's names (the tables and means below are lists of roles).
ARO_TASKS: tuple[Task, ...] = (
    ("shapes-aro", "relation"),
    ("shapes-aro", "attribution"),
    ("shapes-aro", "order"),
)
SUGARCREPE_TASKS: tuple[Task, ...] = tuple(("shapes-sugarcrepe", c) for c in CATEGORIES)
WHATSUP: tuple[Task, ...] = (("shapes-whatsup", "individual"),)
RETRIEVAL: tuple[Task, ...] = (("shapes-retrieval", "R@1"),)
# Every task of the all-task mean: the analogue of the Flow-CLIP seed's 11-task mean.
ALL_TASKS: tuple[Task, ...] = (*SUGARCREPE_TASKS, *ARO_TASKS, *WHATSUP, *RETRIEVAL)
# The binding mean: attribute / object swaps, ARO relation and attribution, spatial arrangement.
BINDING_TASKS: tuple[Task, ...] = (
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-sugarcrepe", "swap-obj"),
    ("shapes-aro", "relation"),
    ("shapes-aro", "attribution"),
    *WHATSUP,
)
MEANS: dict[str, tuple[Task, ...]] = {"all-task": ALL_TASKS, "binding": BINDING_TASKS}
DEV_SUITE = "shapes-dev"  # the training families' dev suite (lesion and corrections by family)
DEV_TASKS: tuple[Task, ...] = tuple((DEV_SUITE, f) for f in FAMILIES)
WHATSUP_SUITE = "shapes-whatsup"  # the What'sUp pair criterion's suite(s)

_TWO_WAY = 0.5  # chance of a 2-option item: every task the chance tables do not name


@dataclass(frozen=True)
class TaskLayout:
    """One world's tasks for each role.

    ``suites`` maps a role suite to the world's suites (the same metric on each);
    ``overrides`` maps a single role task to the world's tasks where the metric is named
    otherwise or only some suites have it; a role in neither maps to itself. ``chances``
    holds the chance level of every task that is not 2-way, ``suite_chances`` the chance
    line under a suite's table.
    """

    world: str  # the report's title: "shapes world", "real benchmarks"
    suites: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    overrides: Mapping[Task, tuple[Task, ...]] = field(default_factory=dict)
    chances: Mapping[Task, float] = field(default_factory=dict)
    suite_chances: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    extra_head_to_head: tuple[
        str, ...
    ] = ()  # suites shown whole in the head-to-head besides the roles'
    toy_world: bool = (
        False  # the toy encoders' world: failure profile vs published ViT-L/14, encoder comparison
    )

    def task(self, role: Task) -> tuple[Task, ...]:
        """The world's tasks playing ``role`` (none when the world has no such suite)."""
        if role in self.overrides:
            return self.overrides[role]
        suite, metric = role
        return tuple((s, metric) for s in self.suites.get(suite, (suite,)))

    def tasks(self, roles: Iterable[Task]) -> tuple[Task, ...]:
        """Every role's tasks, in order, each once."""
        return tuple(dict.fromkeys(t for role in roles for t in self.task(role)))

    def suite(self, role: str) -> str | None:
        """The world's first suite playing the role suite ``role`` (None without one)."""
        found = self.suites.get(role, (role,))
        return found[0] if found else None

    def suites_of(self, role: str) -> tuple[str, ...]:
        """Every suite of the world playing the role suite ``role``."""
        return tuple(self.suites.get(role, (role,)))

    @property
    def means(self) -> dict[str, tuple[Task, ...]]:
        """:data:`MEANS` in this world's tasks."""
        return {name: self.tasks(roles) for name, roles in MEANS.items()}

    def chance(self, task: Task) -> float:
        """The chance level of one of this world's tasks (2-way unless named)."""
        return self.chances.get(task, _TWO_WAY)


_WHATSUP_CHANCE = {"individual": 0.25, "pair": 1 / 16, "set": 1 / 256}  # 4 options, 2 / 4 images
SHAPES = TaskLayout(
    world="shapes world",
    chances={
        ("shapes-aro", "order"): 0.2,
        **{("shapes-whatsup", k): v for k, v in _WHATSUP_CHANCE.items()},
    },
    suite_chances={"shapes-whatsup": _WHATSUP_CHANCE},
    toy_world=True,
)
_REAL_WHATSUP_AB = ("whatsup-a", "whatsup-b")  # Controlled A and B: 4 options, pairs and sets
_REAL_ORDER = (("aro-coco-order", "P@1"), ("aro-flickr-order", "P@1"))
REAL = TaskLayout(
    world="real benchmarks",
    suites={
        "shapes-sugarcrepe": ("sugarcrepe",),
        "shapes-aro": ("aro-relation", "aro-attribution", "aro-coco-order", "aro-flickr-order"),
        "shapes-whatsup": _REAL_WHATSUP_AB,
        "shapes-retrieval": ("coco-objects",),
        "shapes-multi": ("vg-objects",),
        "shapes-dev": ("coco-families-dev",),
    },
    overrides={
        ("shapes-aro", "relation"): (("aro-relation", "relation"),),
        ("shapes-aro", "attribution"): (("aro-attribution", "attribution"),),
        ("shapes-aro", "order"): _REAL_ORDER,
        ("shapes-whatsup", "individual"): tuple(
            (s, "individual") for s in (*_REAL_WHATSUP_AB, "whatsup-coco", "whatsup-vg")
        ),
    },
    chances={
        **dict.fromkeys(_REAL_ORDER, 0.2),
        **{(s, k): v for s in _REAL_WHATSUP_AB for k, v in _WHATSUP_CHANCE.items()},
    },
    suite_chances=dict.fromkeys(_REAL_WHATSUP_AB, _WHATSUP_CHANCE),
    extra_head_to_head=("sugarcrepe-pp",),
)
LAYOUTS: tuple[TaskLayout, ...] = (SHAPES, REAL)


def layout_for(suites: Iterable[str]) -> TaskLayout:
    """The layout of the world the scored ``suites`` (names, or a results dict) belong to:
    the shapes world when any is a shapes suite or none is a real one, else the real one."""
    names = list(suites)
    if any(world_suite(s) for s in names):
        return SHAPES
    real = {s for ss in REAL.suites.values() for s in ss} | {
        s for t in REAL.overrides.values() for s, _ in t
    }
    return REAL if real & set(names) else SHAPES


def label(task: Task, tasks: Sequence[Task]) -> str:
    """``task``'s column label among ``tasks``: its metric where that names one task, else
    ``"suite metric"``."""
    same = sum(m == task[1] for _, m in tasks)
    return task[1] if same == 1 else " ".join(task)


__all__ = [
    "ALL_TASKS",
    "ARO_TASKS",
    "BINDING_TASKS",
    "DEV_SUITE",
    "DEV_TASKS",
    "LAYOUTS",
    "MEANS",
    "REAL",
    "RETRIEVAL",
    "SHAPES",
    "SUGARCREPE_TASKS",
    "Task",
    "TaskLayout",
    "WHATSUP",
    "WHATSUP_SUITE",
    "label",
    "layout_for",
]
