"""Held-out ranking AUC of ``ridge-fgw``'s map, for each object grid, whitening shrinkage and rank.

    .venv/bin/python scripts/ridge_heldout.py [--shrinkage S ...] [--rank R ...] [--beta B ...] [--lam L] [--params P]

Every fifth training image of the ``ridge`` section's suite is held out; the map and its
whitening are fitted on the rest (:func:`pipeline.scorers.geometry.ridge.fit_map`) and each
held-out mapped phrase is compared with the held-out objects in the map's top ``--rank``
directions (default: the ridge section's ranks; 0: all), each object's hub offset at each
``--beta`` subtracted (default: the ridge section's ``inverted_softmax``; 0: none; a non-zero one
is refused with ``--inverse``). Prints, per grid, shrinkage, rank and beta,
the AUC over every pair of different phrases (what the ridge stage selects the grid by) and
over the hard pairs only — different phrases that share a word ("red circle" against "blue
circle"), the confusions retrieval makes — each with the training split alone, never a test
suite. ``--inverse`` fits the map the other way (objects to phrases, compared in the phrase
space), a diagnostic: the spec's map goes from phrases to objects. ``--objects crops`` reads the
re-encoded crops of a store extracted with ``extract.object_crops: true`` (``--params
scripts/params/crops.yaml``). It reads the store and never writes there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shrinkage", type=float, action="append", default=None, help="default: 1, 0.3, 0.1, 0.03, 0.01")
    ap.add_argument("--rank", type=int, action="append", default=None, help="default: the ridge section's ranks")
    ap.add_argument("--beta", type=float, action="append", default=None, help="default: the ridge section's inverted_softmax")
    ap.add_argument("--lam", type=float, default=None, help="default: the ridge section's")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--inverse", action="store_true", help="fit objects -> phrases, compare in the phrase space")
    ap.add_argument("--objects", default=None, choices=["box-mean", "crops"], help="object embeddings (default: the ridge section's; crops: one grid)")
    args = ap.parse_args()
    if args.inverse and any(args.beta or []):
        raise SystemExit("--beta offsets the objects against the reference phrases of the map's own space: not with --inverse")

    import torch

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, RidgeConfig, load_config
    from pipeline.scorers.geometry.objects import OBJECT_LAYERS
    from pipeline.scorers.geometry.ridge import (
        distinct_image_items,
        fit_map,
        ranking_auc,
        restrict_rank,
        training_pairs,
    )
    from pipeline.scoring import suite_inputs
    from scripts.trials import shared_word_pairs

    ridge = load_config(RidgeConfig, args.params, "ridge")
    lam = ridge.lam if args.lam is None else args.lam
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    manifest, index = suite_inputs(store, ridge.suite)
    first = distinct_image_items(index, len(manifest))  # training_pairs' rows, in its order
    names = [n for x in manifest["object_names"].iloc[first] for n in (json.loads(x) if isinstance(x, str) else list(x))]
    ranks = args.rank or ridge.ranks
    betas = [0.0] if args.inverse else args.beta or ridge.inverted_softmax
    out: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {}
    objects = args.objects or ridge.objects
    for layer in ("final",) if objects == "crops" else OBJECT_LAYERS:
        P, Y, image = training_pairs(store, manifest, index, ridge.suite, layer, objects)
        held = image % 5 == 4
        hard = shared_word_pairs([n for n, h in zip(names, held.tolist(), strict=True) if h])
        out[layer] = {}
        for s in args.shrinkage or [1.0, 0.3, 0.1, 0.03, 0.01]:
            full = fit_map(Y[~held], P[~held], lam, s) if args.inverse else fit_map(P[~held], Y[~held], lam, s)
            out[layer][str(s)] = {}
            for r in ranks:
                if args.inverse:  # objects mapped into the phrase space, phrases whitened there
                    inverse = restrict_rank(full, Y[~held], r)
                    fitted = SimpleNamespace(phrases=inverse.objects, objects=inverse.phrases, hub_offset=lambda o, b: torch.zeros(o.shape[:-1]))
                else:
                    fitted = restrict_rank(full, P[~held], r)
                out[layer][str(s)][str(r)] = {}
                for b in betas:
                    every = ranking_auc(P[held], Y[held], fitted, beta=b)
                    shared = ranking_auc(P[held], Y[held], fitted, pairs=hard, beta=b)
                    out[layer][str(s)][str(r)][f"{b:g}"] = [round(every, 4), round(shared, 4)]
                    print(f"{layer:9s} shrinkage {s:<6g} rank {r:<3d} beta {b:<5g} AUC {every:.4f}  hard pairs {shared:.4f}", flush=True)
    print(json.dumps({"lam": lam, "auc_all_hard": out}))


if __name__ == "__main__":
    main()
