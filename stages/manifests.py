"""Stage `manifests`: build real suites' manifests from their official annotation files.

I/O and orchestration only: each suite's registered builder
(:attr:`pipeline.benchmarks.base.Suite.build_manifest`) reads the files under its root and
the manifest is written as ``<out>/<suite>.parquet`` with the annotation files' hashes in its
metadata (:func:`pipeline.manifests.write_manifest`), so a changed annotation file gives a
changed manifest and extract re-indexes it. ``image_share`` cuts a suite to the items of a
hashed share of its images (:func:`pipeline.benchmarks.base.image_share_mask`), so the
COCO families need not extract all of train2017 to train on a few thousand pairs.
``disjoint_from`` drops a suite's rows whose COCO photograph another suite of the run shows
(by COCO image id), so training suites hold no test photograph; the count is recorded in
the manifest's metadata, as are, for a suite with one file per category (SugarCrepe,
SugarCrepe++), the categories whose files were present and missing. No image is opened:
images are extract's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.base import coco_image_ids, coco_overlap_mask, image_share_mask
from pipeline.config import ManifestsConfig
from pipeline.manifests import source_hashes, write_manifest

log = logging.getLogger(__name__)


def run(cfg: ManifestsConfig) -> dict[str, int]:
    """Write one manifest per entry of ``cfg.roots``; returns {suite: items}.

    Raises:
        ValueError: ``cfg.roots`` is empty, or names an unknown suite (listing the valid ones),
            or a suite has no item (none in its files, or none kept by ``image_share`` or
            ``disjoint_from``), or ``disjoint_from`` names an unknown suite, a suite not built in
            this run, or the suite itself.
        FileNotFoundError: a root or an annotation file is missing (the builder names it).
    """
    if not cfg.roots:
        raise ValueError("manifests.roots is empty: map each suite to the folder of its official annotation files")
    suites = {name: SUITES.get(name) for name in cfg.roots}  # unknown names fail before any work
    SUITES.check_known(cfg.image_share, "manifests.image_share")
    stray = sorted(set(cfg.image_share) - set(cfg.roots))
    if stray:
        raise ValueError(f"manifests.image_share names {', '.join(stray)}, not in manifests.roots: {', '.join(cfg.roots)}")
    for name, others in cfg.disjoint_from.items():
        SUITES.check_known([name, *others], f"manifests.disjoint_from.{name}")
        if name in others:  # its own photographs: every item would be dropped, said as if another suite held them
            raise ValueError(f"manifests.disjoint_from.{name} names {name} itself; list the suites whose COCO photographs it must not show")
        stray = sorted({name, *others} - set(cfg.roots))
        if stray:
            raise ValueError(f"manifests.disjoint_from.{name} needs {', '.join(stray)} built in the same run; add to manifests.roots")
    absent = [name for name, root in cfg.roots.items() if not Path(root).is_dir()]
    if len(absent) == 1:
        name = absent[0]
        raise FileNotFoundError(f"manifests.roots.{name}: folder {cfg.roots[name]} does not exist ({suites[name].description})")
    if absent:  # every one at once: a first real run lacks several
        raise FileNotFoundError(
            f"{len(absent)} folders of manifests.roots do not exist: "
            + ", ".join(f"{name} ({cfg.roots[name]})" for name in absent)
            + "; `pipeline suites` says what each suite's folder holds"
        )
    built: dict[str, pd.DataFrame] = {}
    coverage: dict[str, dict | None] = {}  # the categories present and missing, before any cut
    for name, suite in suites.items():
        root = Path(cfg.roots[name])
        df = suite.build_manifest(root)
        if df.empty:
            raise ValueError(f"manifests.roots.{name}: the annotation files under {root} hold no item ({suite.description})")
        coverage[name] = suite.category_coverage(df)
        if name in cfg.image_share:
            n = len(df)
            df = df[image_share_mask(df, cfg.image_share[name])].reset_index(drop=True)
            if df.empty:
                raise ValueError(f"manifests.image_share.{name}: {cfg.image_share[name]} keeps none of its {n} items; raise it")
        built[name] = df
    counts = {}
    for name, df in built.items():
        sources = source_hashes(Path(cfg.roots[name]))
        if others := cfg.disjoint_from.get(name):
            held = set().union(*(coco_image_ids(built[o], suites[o].image_columns) for o in others))
            shared = coco_overlap_mask(df, held)
            df = df[~shared].reset_index(drop=True)
            if df.empty:
                raise ValueError(f"manifests.disjoint_from.{name}: every item shows a photograph of {', '.join(others)}")
            sources["disjoint_from"] = {"suites": sorted(others), "items_dropped": int(shared.sum())}
            log.info("%s: %d items dropped, their COCO photographs are in %s", name, int(shared.sum()), ", ".join(others))
        write_manifest(df, Path(cfg.out) / f"{name}.parquet", sources, coverage[name])
        counts[name] = len(df)
        log.info("%s: %d items -> %s", name, len(df), Path(cfg.out) / f"{name}.parquet")
    return counts
