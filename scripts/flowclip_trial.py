"""One Flow-CLIP training trial on the pipeline's feature cache, away from the pipeline's outputs.

    .venv/bin/python scripts/flowclip_trial.py NAME [section.key=YAML ...] [--variants ...] [--out DIR]

e.g. ``scripts/flowclip_trial.py lr3 'train.lr=0.003'``. Takes ``params.yaml`` and applies the
overrides: ``train.KEY`` sets KEY in every trained Flow-CLIP section (``train.global-m``,
``train.flowclip``, ``train.flowclip-cimr``), ``train.<variant>.KEY`` in that one. It trains
seed 0 of each of ``--variants`` (default all three), writes checkpoints, scores and metrics
under ``DIR/NAME/`` (default ``/tmp/flowclip-trials``), scores ``clip`` and the variants on the
choice suites and shapes-retrieval, with Shuffle and Fixed images too, and prints (and saves
as ``DIR/NAME/summary.json``) each variant's all-task and binding means and its ARO-style mean
under the true, shuffled and fixed images (:mod:`pipeline.scorers.flowclip.analysis`'s task
lists). It needs the cache that ``dvc repro`` (or ``pipeline extract``) leaves in
``cache/features``; it never writes there. The Flow-CLIP rows of ``docs/trials.md`` rerun
this way.
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

VARIANTS = ["global-m", "flowclip", "flowclip-cimr"]
SUITES = ["shapes-whatsup", "shapes-aro", "shapes-sugarcrepe", "shapes-retrieval", "shapes-dev"]


def trial_params(base: dict, name: str, out: Path, variants: list[str], overrides: list[str]) -> dict:
    """``base`` with outputs under ``out/name`` and ``section.key=YAML`` overrides applied."""
    params = json.loads(json.dumps(base))  # deep copy
    root = out / name
    for v in variants:
        params["train"][v].update(out=str(root / "checkpoints"), seeds=[0])
    params["score"].update(
        checkpoints=str(root / "checkpoints"),
        scores_out=str(root / "scores"),
        metrics_out=str(root / "metrics"),
        variants=["clip", *variants],
        seed_variants=[],
        seed_suites=[],
        replacements=["shuffle", "fixed"],
        replacement_variants=["clip", *variants],
        suites=SUITES,
    )
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"override {item!r}: expected section.key=YAML")
        *path, last = key.split(".")
        targets = [path]
        if path[0] == "train" and (len(path) == 1 or path[1] not in VARIANTS):
            targets = [["train", v, *path[1:]] for v in variants]  # every trained section
        for target in targets:
            node = params
            for part in target:
                node = node.setdefault(part, {})
            node[last] = yaml.safe_load(value)
    return params


def summary(metrics_dir: Path, variants: list[str]) -> dict:
    """Per variant: all-task, binding and dev means; ARO-style mean under true/shuffle/fixed."""
    from pipeline.report.tasks import ALL_TASKS
    from pipeline.report.tasks import ARO_TASKS as ARO
    from pipeline.report.tasks import BINDING_TASKS as BINDING

    def mean(name: str, tasks) -> float | None:
        vals = []
        for suite, metric in tasks:
            f = metrics_dir / name / f"{suite}.json"
            if not f.is_file():
                return None
            vals.append(json.loads(f.read_text())["metrics"][metric])
        return round(100 * sum(vals) / len(vals), 2)

    return {
        v: {
            "all_task": mean(v, ALL_TASKS),
            "binding": mean(v, BINDING),
            "dev": mean(v, [("shapes-dev", "mean")]),
            **{f"aro_{mode}": mean(f"{v}@{mode}" if mode != "true" else v, ARO) for mode in ("true", "shuffle", "fixed")},
            **{f"{s} {m}": mean(v, [(s, m)]) for s, m in BINDING},
        }
        for v in variants
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name")
    ap.add_argument("overrides", nargs="*", help="section.key=YAML, e.g. train.lr=0.003")
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--out", type=Path, default=Path("/tmp/flowclip-trials"))
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    args = ap.parse_intermixed_args()

    from pipeline.config import ExtractConfig, ScoreConfig, load_config, load_train_config
    from stages import score as score_stage
    from stages import train as train_stage

    out, base = args.out.resolve(), yaml.safe_load(args.params.resolve().read_text())
    os.chdir(ROOT)  # the cache's paths (params.yaml, store attributes) are relative to the repo
    params = trial_params(base, args.name, out, args.variants, args.overrides)
    root, path = write_trial_params(params, out, args.name)
    extract = load_config(ExtractConfig, path, "extract")
    start = time.time()
    for variant in args.variants:
        train_stage.run(load_train_config(path, variant), extract, progress=True)
    score_stage.run(load_config(ScoreConfig, path, "score"), extract, progress=False)
    result = {
        "name": args.name,
        "overrides": args.overrides,
        "seconds": round(time.time() - start),
        **summary(root / "metrics", ["clip", *args.variants]),
    }
    (root / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    run_main(main)
