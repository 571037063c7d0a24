"""How each query's steering directions relate to each other, on the pipeline's cache.

    .venv/bin/python scripts/steering_directions.py [--suite S ...] [--contrast swap|absent] [--params params.yaml]

``steer`` moves a query along its first direction v₁ = t(c⁺) − t(c⁻); ``steer-multi`` along
the sum of all of them. For every query with at least two directions this prints the mean
cosine between its directions (pairs of distinct directions) and the length of their sum
against the length of v₁: a sum shorter than v₁ steers less far than ``steer`` at the same β.
Medians and the 10th / 90th percentiles over queries, for the c- prompts of ``--contrast``
(``swap``, the default: the colour of the query's next object; ``absent``: a colour none of its
objects has). Reads ``cache/features``, writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def direction_geometry(directions: torch.Tensor, valid: torch.Tensor) -> dict[str, np.ndarray]:
    """Per query with at least two directions: ``mean_cosine`` (over its ordered pairs of
    distinct directions) and ``sum_over_first`` (|Σ v| / |v₁|, v₁ its first valid direction).

    Args:
        directions: [Q, n, D] each query's contrasts, padded.
        valid: [Q, n] bool, which are real.
    """
    d = directions * valid[..., None]
    counts = valid.sum(1)  # [Q]
    keep = counts >= 2
    unit = torch.nn.functional.normalize(d, dim=-1)  # padded rows stay 0
    gram = unit @ unit.transpose(1, 2)  # [Q, n, n]
    off = gram.sum((1, 2)) - torch.diagonal(gram, dim1=1, dim2=2).sum(1)
    mean_cos = off / (counts * (counts - 1)).clamp(min=1)
    first = d[torch.arange(len(d)), valid.int().argmax(1)]  # [Q, D] the first valid direction
    ratio = d.sum(1).norm(dim=-1) / first.norm(dim=-1)
    return {"mean_cosine": mean_cos[keep].numpy(), "sum_over_first": ratio[keep].numpy()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", default=None)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    from pipeline.benchmarks.retrieval import STEERING_NEGATIVES

    ap.add_argument("--contrast", choices=sorted(STEERING_NEGATIVES), default="swap")
    args = ap.parse_args()

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, load_config
    from pipeline.manifests import resolve_source
    from pipeline.scorers.geometry.steering import concept_directions
    from pipeline.scoring import suite_inputs

    extract = load_config(ExtractConfig, args.params, "extract")
    store = open_store(extract)
    out = {"contrast": args.contrast}
    for suite in args.suite or ["shapes-retrieval", "shapes-multi"]:
        source = resolve_source(suite, extract.world, extract.manifests, extract.image_roots)
        manifest, index = suite_inputs(store, suite, source.manifest)
        found = direction_geometry(*concept_directions(store, manifest, index, suite, args.contrast))
        out[suite] = {"queries": int(len(found["mean_cosine"]))}
        for name, x in found.items():
            q10, med, q90 = np.quantile(x, [0.1, 0.5, 0.9])
            out[suite][name] = {"median": round(float(med), 3), "q10": round(float(q10), 3), "q90": round(float(q90), 3)}
            print(f"{suite:17s} {name:15s} median {med:+.3f} [q10 {q10:+.3f}, q90 {q90:+.3f}] over {len(x)} queries")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
