"""One BindCLIP training trial on the pipeline's feature cache, away from the pipeline's outputs.

    .venv/bin/python scripts/bindclip_trial.py NAME [section.key=YAML ...] [--out DIR]

e.g. ``scripts/bindclip_trial.py tau-x 'train.scorer.tau_x=0.03'``. Takes ``params.yaml``,
applies the overrides (``train.KEY`` is ``train.bindclip.KEY``, BindCLIP's training
section), trains seed 0 only (``train.seeds`` can be overridden), writes checkpoints,
scores and metrics under
``DIR/NAME/`` (default ``/tmp/bindclip-trials``), scores ``bindclip`` and ``bindclip-lesion``
on shapes-whatsup, shapes-aro, shapes-sugarcrepe and shapes-dev, and prints (and saves as
``DIR/NAME/summary.json``) the goal slices, the dev families, the lesion's dev families,
the first seed's attribute binding on swap-att
(:func:`pipeline.scorers.bindclip.diagnostics.attribute_binding`), where it wins and loses
ARO's planar argument swaps (:func:`pipeline.scorers.bindclip.diagnostics.argument_swaps`)
and its score taken apart on swap-att and ARO attribution (:func:`diagnostics`).
It needs the cache that ``dvc repro`` (or ``pipeline extract``) leaves in ``cache/features``;
it never writes there. Every trial in ``docs/trials.md`` reruns this way (2 CPU cores:
about 2 minutes per 600-step trial); ``scripts/compare_trials.py`` compares them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.trials import run_main, write_trial_params  # noqa: E402

SUITES = ["shapes-whatsup", "shapes-aro", "shapes-sugarcrepe", "shapes-dev"]
GOAL_SLICES = [
    ("shapes-whatsup", "individual"),
    ("shapes-whatsup", "pair"),
    ("shapes-aro", "relation"),
    ("shapes-aro", "attribution"),  # not a goal: where non-spatial noise from the spatial energy shows
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-sugarcrepe", "swap-obj"),
    ("shapes-sugarcrepe", "replace-obj"),
    ("shapes-dev", "mean"),
]


def trial_params(base: dict, name: str, out: Path, overrides: list[str]) -> dict:
    """``base`` with outputs under ``out/name`` and ``section.key=YAML`` overrides applied."""
    params = json.loads(json.dumps(base))  # deep copy
    root = out / name
    params["train"]["bindclip"].update(out=str(root / "checkpoints"), seeds=[0])
    params["score"].update(
        checkpoints=str(root / "checkpoints"),
        scores_out=str(root / "scores"),
        metrics_out=str(root / "metrics"),
        variants=["bindclip", "bindclip-lesion"],
        seed_variants=[],
        seed_suites=[],
        replacements=[],
        replacement_variants=[],
        suites=SUITES,
    )
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"override {item!r}: expected section.key=YAML")
        *path, last = key.split(".")
        if path[0] == "train":  # BindCLIP's training section
            path = ["train", "bindclip", *path[1:]]
        node = params
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return params


def summary(metrics_dir: Path) -> dict:
    out = {}
    for variant in ("bindclip", "bindclip-lesion"):
        values = {}
        for suite in SUITES:
            path = metrics_dir / variant / f"{suite}.json"
            if path.is_file():
                values[suite] = json.loads(path.read_text())["metrics"]
        out[variant] = values
    b = out["bindclip"]
    return {
        "goal_slices": {f"{s} {m}": b.get(s, {}).get(m) for s, m in GOAL_SLICES},
        "dev": b.get("shapes-dev", {}),
        "lesion_dev": out["bindclip-lesion"].get("shapes-dev", {}),
    }


BREAKDOWN_SLICES = [("shapes-sugarcrepe", "swap-att"), ("shapes-aro", "attribution")]


def diagnostics(score, extract) -> dict:
    """The trial's (seed 0) :func:`pipeline.scorers.bindclip.diagnostics.attribute_binding` on swap-att,
    :func:`~pipeline.scorers.bindclip.diagnostics.argument_swaps` on ARO relation, and the score taken apart
    (:func:`~pipeline.scorers.bindclip.diagnostics.energy_breakdowns`: accuracy of s, g, s - g; each energy's
    share pointing to the true caption / mean size in logits) on the non-spatial
    ``BREAKDOWN_SLICES``."""
    from pipeline.cache import open_store
    from pipeline.scorers.bindclip.diagnostics import (
        argument_swaps,
        attribute_binding,
        energy_breakdowns,
    )
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scoring import suite_inputs

    store = open_store(extract)
    scorer = load_scorer("bindclip", store, score.checkpoints)
    wanted = {"shapes-sugarcrepe", "shapes-aro"} | {suite for suite, _ in BREAKDOWN_SLICES}
    inputs = {suite: suite_inputs(store, suite) for suite in sorted(wanted) if suite in store.suites()}  # read once
    out: dict = {"attribute_binding": {}, "argument_swaps": [], "energy_breakdown": {}}
    if "shapes-sugarcrepe" in inputs:
        out["attribute_binding"] = attribute_binding(scorer, store, *inputs["shapes-sugarcrepe"])
    if "shapes-aro" in inputs:
        out["argument_swaps"] = argument_swaps(scorer, store, *inputs["shapes-aro"])
    for suite, category in BREAKDOWN_SLICES:
        if suite in inputs:
            rows = energy_breakdowns(scorer, store, *inputs[suite], suite)["category"]
            row = next((r for r in rows if r["category"] == category), None)
            if row is not None:
                keep = {k: round(v, 3) for k, v in row.items() if isinstance(v, float) and not k.endswith("_gamma")}
                out["energy_breakdown"][f"{suite} {category}"] = keep
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name")
    ap.add_argument("overrides", nargs="*", help="section.key=YAML, e.g. train.steps=900")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bindclip-trials"))
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    args = ap.parse_intermixed_args()

    from pipeline.config import ExtractConfig, ScoreConfig, load_config, load_train_config
    from stages import score as score_stage
    from stages import train as train_stage

    out, base = args.out.resolve(), yaml.safe_load(args.params.resolve().read_text())
    os.chdir(ROOT)  # the cache's paths (params.yaml, store attributes) are relative to the repo
    params = trial_params(base, args.name, out, args.overrides)
    root, path = write_trial_params(params, out, args.name)
    extract = load_config(ExtractConfig, path, "extract")
    start = time.time()
    train_stage.run(load_train_config(path, "bindclip"), extract, progress=True)
    score_stage.run(load_config(ScoreConfig, path, "score"), extract, progress=False)
    result = {"name": args.name, "overrides": args.overrides, "seconds": round(time.time() - start), **summary(root / "metrics")}
    result.update(diagnostics(load_config(ScoreConfig, path, "score"), extract))
    (root / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    run_main(main)
