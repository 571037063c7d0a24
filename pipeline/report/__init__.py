"""The report as registered sections: each method family contributes its own.

    from pipeline.report import SECTIONS, ReportContext, render, section

    @section("bindclip", order=50)                  # in pipeline/scorers/bindclip/report.py
    def bindclip_section(ctx: ReportContext) -> list[str]:
        ...                                          # Markdown blocks ([] = nothing to show)

    text = render(ctx)                               # every section in order, blocks joined

A section is a function of one :class:`ReportContext` that returns Markdown blocks; it is
registered under a kebab-case name with an order key (sections run by ascending order,
then name). The generic sections (overview, failure profile, suite tables with bootstrap
CIs, the cross-family head-to-head, image replacement, performance) live in
:mod:`pipeline.report.sections`; a scorer family adds its section
in ``pipeline/scorers/<family>/report.py``, which the registry imports on its first lookup,
so a new family touches only its own package. Sections never write files: figures, JSON
payloads and tables go into the context and the report stage writes them. Long prose lives
in Markdown templates (:mod:`pipeline.report.templates`).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
from pipeline.registry import Registry

FAMILY_PACKAGES = "pipeline.scorers"  # each subpackage with a ``report`` module adds a section
FIGURE_DPI = 110  # every figure is saved at this resolution


def bench_command(folder: Path, name: str) -> str:
    """``pipeline bench <name>`` writing into ``folder``: with ``--out`` unless that is the
    default folder (``reports/bench``)."""
    folder = Path(folder)
    return f"pipeline bench {name}" if folder == Path("reports/bench") else f"pipeline bench --out {folder} {name}"


@dataclass
class ReportContext:
    """What sections read (results, configs, the store on demand) and what they leave for
    the stage to write (figures, JSON payloads, tables)."""

    results: dict[str, Any]  # {suite: {"manifest", "image_root", "scores": {variant: [n, K]}}}
    cfg: ReportConfig
    score: ScoreConfig
    extract: ExtractConfig
    out: Path  # the report folder; measurements are read from it (bench/*.json, probes.json)
    figures: dict[str, Any] = field(default_factory=dict)  # "coupling.png" -> Figure (figures/)
    json_files: dict[str, Any] = field(default_factory=dict)  # "diagnostics.json" -> payload
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # "plots/metrics.csv" -> rows
    store_: Any = None  # the feature store; None = opened from ``extract`` on first use
    scorers_: dict[str, Any] = field(default_factory=dict)  # trained scorers loaded so far

    def bench_command(self, name: str) -> str:
        """``pipeline bench <name>`` writing where this report reads (``<out>/bench``)."""
        return bench_command(self.out / "bench", name)

    @property
    def scored(self) -> set[str]:
        """Every variant scored on at least one suite (seed variants included)."""
        return {v for entry in self.results.values() for v in entry["scores"]}

    @property
    def layout(self):
        """The scored world's :class:`~pipeline.report.tasks.TaskLayout` (shapes or real)."""
        from pipeline.report.tasks import layout_for

        return layout_for(self.results)

    @property
    def store(self):
        """The configured encoder's feature store, opened (and checked) on first use; its
        read blocks stay in memory, as the sections read the same suites again and again."""
        if self.store_ is None:
            from pipeline.cache import open_store
            from pipeline.scoring import READ_CACHE_BYTES

            self.store_ = open_store(self.extract).cache_reads(READ_CACHE_BYTES)
        return self.store_

    def scorer(self, variant: str):
        """``variant`` rebuilt on the store from its checkpoint, loaded once per report."""
        if variant not in self.scorers_:
            from pipeline.scorers.checkpoints import load_scorer

            options = self.score.options.get(variant)
            self.scorers_[variant] = load_scorer(variant, self.store, self.score.checkpoints, options=options)
        return self.scorers_[variant]

    def figure(self, name: str, fig) -> str:
        """Leave ``fig`` for the stage to save as ``figures/<name>``; its Markdown path."""
        self.figures[name] = fig
        return f"figures/{name}"


@dataclass(frozen=True)
class Section:
    name: str  # registry key (kebab-case)
    order: float  # sections run by ascending order (then name)
    render: Callable[[ReportContext], list[str]]  # the section's Markdown blocks


class SectionRegistry(Registry[Section]):
    """The sections registry: imports ``pipeline.report``'s modules (the generic sections)
    and every ``pipeline.scorers.<family>.report`` module on the first lookup."""

    def _load(self) -> None:
        if self._loaded:
            return
        super()._load()
        families = importlib.import_module(FAMILY_PACKAGES)
        for mod in pkgutil.iter_modules(families.__path__):
            name = f"{FAMILY_PACKAGES}.{mod.name}.report"
            if mod.ispkg and importlib.util.find_spec(name) is not None:
                importlib.import_module(name)

    def in_order(self) -> list[Section]:
        """Every registered section, in report order."""
        return sorted((self.get(n) for n in self.names()), key=lambda s: (s.order, s.name))


SECTIONS = SectionRegistry("report section", "pipeline.report")


def section(name: str, order: float) -> Callable:
    """Register ``fn(ctx) -> list[str]`` as the report section ``name`` at ``order``."""

    def add(fn: Callable[[ReportContext], list[str]]) -> Callable[[ReportContext], list[str]]:
        SECTIONS.register(name, Section(name, order, fn))
        return fn

    return add


def render(ctx: ReportContext) -> str:
    """The report's Markdown: every section's blocks in order, separated by blank lines."""
    blocks = [block for s in SECTIONS.in_order() for block in s.render(ctx)]
    return "\n\n".join(blocks) + "\n"


__all__ = ["FIGURE_DPI", "SECTIONS", "ReportContext", "Section", "bench_command", "render", "section"]
