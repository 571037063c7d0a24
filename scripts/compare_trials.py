"""Paired bootstrap of BindCLIP trials against a base trial, each averaged over its seeds.

    .venv/bin/python scripts/compare_trials.py BASE NEW [NEW ...] [--suite shapes-dev]
        [--metric mean] [--dir /tmp/bindclip-trials] [--resamples 10000] [--seed 0]

Each of BASE / NEW is a comma-separated list of ``RUN`` or ``RUN:SEED``: ``RUN`` is a
trial written by ``scripts/bindclip_trial.py`` (or ``scripts/flowclip_trial.py``) under
``--dir``, ``RUN/VARIANT`` one of its other scored variants (``lr2/flowclip``, ``lr2/clip``),
``SEED`` picks its ``scores/<variant>@seed<SEED>`` (a single-seed trial has only
``scores/<variant>``, which ``RUN:0`` and a bare ``RUN`` read). ``base:0,base:1,base:2`` is a three-seed setting;
``taux03:0,taux03s12:1,taux03s12:2`` joins a seed-0 trial to one that trained seeds 1-2.
A system's value on a unit is the mean over its seeds of that unit's value under the
suite's official metric (0/1 correct for accuracies; shapes-dev's ``mean`` is the macro
mean over families, so resampling is stratified by family), and
:func:`pipeline.stats.paired_bootstrap` gives NEW - BASE with its percentile interval.
This is how the CI column of ``docs/trials.md`` is computed; ``--row`` also prints, for
each NEW, the table row to add there (date, base, change, dev with seeds, CI, adopted?,
rerun), with the change, the decision and the rerun command left for the author. It reads
the trials' scores and the suite's manifest (through the cache's suite index, as
``pipeline score`` does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.trials import run_main  # noqa: E402


def parse_system(spec: str) -> list[tuple[str, int | None]]:
    """``"a:0,b:1,c"`` -> ``[("a", 0), ("b", 1), ("c", None)]``."""
    runs = []
    for part in spec.split(","):
        name, sep, seed = part.strip().partition(":")
        if not name:
            raise SystemExit(f"{spec!r}: empty run name")
        try:
            runs.append((name, int(seed) if sep else None))
        except ValueError:
            raise SystemExit(f"{spec!r}: seed {seed!r} is not an integer") from None
    return runs


def scores_file(trials: Path, run: str, seed: int | None, suite: str) -> Path:
    """The scores of one seed of one trial (``<variant>@seed<k>``, else ``<variant>``);
    ``run`` is ``RUN`` (variant ``bindclip``) or ``RUN/VARIANT``."""
    run, _, variant = run.partition("/")
    variant = variant or "bindclip"
    base = trials / run / "scores"
    candidates = [base / f"{variant}@seed{seed}" / f"{suite}.parquet"] if seed is not None else []
    if seed in (None, 0):
        candidates.append(base / variant / f"{suite}.parquet")
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"no scores of {run}" + (f" seed {seed}" if seed is not None else "") + f" on {suite} under {base}")


def unit_values(suite_name: str, metric: str, manifest: pd.DataFrame, path: Path):
    """(values [n_units], groups or None) of ``metric`` for one scores file."""
    from pipeline.benchmarks import SUITES
    from pipeline.scoring import scores_array

    table = pd.read_parquet(path).set_index("item_id")
    missing = sorted(set(manifest["item_id"]) - set(table.index))
    if missing:
        raise SystemExit(f"{path} lacks {len(missing)} items of the manifest, e.g. {missing[0]!r}")
    scores = scores_array(table.loc[manifest["item_id"]])  # [n, K] in the manifest's order
    units = SUITES.get(suite_name).units(manifest, scores)
    if metric not in units:
        raise SystemExit(f"{suite_name} has no metric {metric!r}; it has {sorted(units)}")
    return units[metric].values.astype(np.float64), units[metric].groups


def system_values(trials: Path, spec: str, suite: str, metric: str, manifest: pd.DataFrame):
    """The seed-mean unit values of one system and the units' groups."""
    values, groups = [], None
    for run, seed in parse_system(spec):
        v, groups = unit_values(suite, metric, manifest, scores_file(trials, run, seed, suite))
        values.append(v)
    return np.mean(values, axis=0), groups, len(values)


def trials_row(base: str, row: dict) -> str:
    """One ``docs/trials.md`` row for a compared trial: ``date | setting (base) | change |
    dev (seed mean; seeds) | paired-bootstrap CI vs base | adopted? | rerun``."""
    import datetime

    dev = f"{row['dev']:.3f}; {row['seeds']}" if row.get("dev") is not None else "—"
    ci = f"{100 * row['diff']:+.1f} [{100 * row['lo']:+.1f}, {100 * row['hi']:+.1f}]"
    return f"| {datetime.date.today()} | {base} | {row['new']}: CHANGE | {dev} | {ci} | ADOPTED? | `scripts/bindclip_trial.py ...` |"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new", nargs="+")
    ap.add_argument("--suite", default="shapes-dev")
    ap.add_argument("--metric", default="mean")
    ap.add_argument("--dir", default="/tmp/bindclip-trials", help="where the trials are")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="for the cache's location")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row", action="store_true", help="also print each NEW's docs/trials.md table row")
    args = ap.parse_intermixed_args(argv)

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, load_config
    from pipeline.scoring import drop_missing, suite_inputs
    from pipeline.stats import paired_bootstrap

    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    manifest, index = suite_inputs(store, args.suite)
    manifest, _, _ = drop_missing(manifest, index)
    trials = Path(args.dir)
    base, groups, n_base = system_values(trials, args.base, args.suite, args.metric, manifest)
    out = {"suite": args.suite, "metric": args.metric, "base": args.base, "base_seeds": n_base, "units": len(base), "rows": []}
    for spec in args.new:
        new, _, n_new = system_values(trials, spec, args.suite, args.metric, manifest)
        r = paired_bootstrap(new, base, groups, n_resamples=args.resamples, seed=args.seed)
        out["rows"].append({"new": spec, "seeds": n_new, "diff": r.diff, "lo": r.lo, "hi": r.hi, "p": r.p,
                            "dev": float(np.mean(new)) if args.suite == "shapes-dev" else None})
    print(json.dumps(out, indent=1))
    if args.row:
        for row in out["rows"]:
            print(trials_row(args.base, row))
    return out


if __name__ == "__main__":
    run_main(main)
