"""What ``bindclip`` − ``bindclip-noconsensus`` measures, taken apart on shapes-dev.

    .venv/bin/python scripts/consensus_ablation.py [--params params.yaml]

The two variants differ in two ways (methods.md §1.4–1.5): with consensus the moves are
γ_k · mean over depths of *per-depth* readouts; without it, the readouts of the plan summed
over depths, unrefined. A third row, the consensus path with γ = 1 (q0 → 0: every
contraction 1), separates them: consensus − (γ = 1) is the contraction's part,
(γ = 1) − noconsensus the per-depth readouts'. Reads the trained checkpoint and the cache
that ``dvc repro`` leaves; writes nothing. Prints each row's dev families and mean (%), and
how many decisions differ between the last two rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.benchmarks import SUITES  # noqa: E402
from pipeline.cache import open_store  # noqa: E402
from pipeline.config import ExtractConfig, ScoreConfig, load_config  # noqa: E402
from pipeline.scorers.bindclip.training import pair_scores  # noqa: E402
from pipeline.scorers.checkpoints import load_scorer  # noqa: E402
from pipeline.stats.bootstrap import units_mean_bootstrap  # noqa: E402
from pipeline.training.pairs import load_pairs, pair_decisions  # noqa: E402

SUITE = "shapes-dev"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args()
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    checkpoints = load_config(ScoreConfig, args.params, "score").checkpoints
    data = load_pairs(store, SUITE)
    consensus = load_scorer("bindclip", store, checkpoints)
    gamma_one = load_scorer("bindclip", store, checkpoints)
    gamma_one.config = dataclasses.replace(gamma_one.config, q0=1e-9)  # γ = q⁴ / (q⁴ + q0⁴) = 1
    rows = {"consensus (bindclip)": consensus, "γ = 1, per-depth moves": gamma_one,
            "depth-summed (bindclip-noconsensus)": load_scorer("bindclip-noconsensus", store, checkpoints)}  # fmt: skip
    suite = SUITES.get(SUITE)
    scores, units = {}, {}
    for name, model in rows.items():
        scores[name] = pair_scores(model, data)
        decisions = pair_decisions(scores[name], data.manifest)
        units[name] = [u for k, u in suite.units(data.manifest, decisions).items() if k != "mean"]  # the families
        print(f"{name:38s} " + " ".join(f"{k} {100 * v:.1f}" for k, v in suite.metrics(data.manifest, decisions).items()))
    names = list(rows)
    for a, b in zip(names, names[1:], strict=False):
        r = units_mean_bootstrap(units[a], units[b])
        print(f"{a} − {b}: mean {100 * r.diff:+.1f} [{100 * r.lo:+.1f}, {100 * r.hi:+.1f}] (paired bootstrap, 95%)")
    a, b = scores[names[1]], scores[names[2]]
    print(f"decisions differing between γ = 1 and noconsensus: {int(((a > 0) != (b > 0)).sum())} of {len(a)}")


if __name__ == "__main__":
    main()
