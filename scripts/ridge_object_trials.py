"""Held-out trials on ``ridge-fgw``'s box-mean objects that the pipeline did not adopt.

    .venv/bin/python scripts/ridge_object_trials.py TRIAL [--beta B ...] [--gamma G ...] [--params P]

Each trial fits the map on four of every five shapes-train images, exactly as the ridge stage
does (the ``ridge`` section's λ and shrinkage, every direction, the early grid), and prints the
ranking AUC on the fifth (:func:`pipeline.scorers.geometry.ridge.ranking_auc`'s definition:
every pair of different phrases, each object's hub offset at ``--beta`` subtracted):

* ``size``: the map conditioned on the object's size, a ridge on [p, p·s, s] with s the
  standardised log box area, each phrase (and each reference phrase) mapped at the size of
  the object it is compared with; also the plain map's AUC among the small and among the
  large objects alone.
* ``others``: each object's box mean less γ times the mean of its image's other objects
  (what the toy's patches mix in from the rest of the scene), the map fitted on the same;
  ``--retrieval`` also scores ``ridge-fgw`` so built on shapes-retrieval (R@1, R@10 and
  nDCG@10 with their 95% bootstrap CIs), a diagnostic on a test suite.
* ``grids``: the early grid's cost plus w (0.5, 1) times the final-raw or final grid's,
  each grid with its own map and offset.
* ``curve``: the map fitted on a quarter, a half and all of the fitting images.

``docs/trials.md`` ("The ridge map's hubs") holds the figures. It reads the store and never
writes there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.trials import run_main  # noqa: E402

TRIALS = ("size", "others", "grids", "curve")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trial", choices=TRIALS)
    ap.add_argument("--beta", type=float, action="append", default=None, help="hub offset's inverse temperature (default: 100)")
    ap.add_argument("--gamma", type=float, action="append", default=None, help="others: the share of the other objects' mean removed (default: 0, 0.25, 0.5, 0.75, 1)")
    ap.add_argument("--retrieval", action="store_true", help="others: also score ridge-fgw on shapes-retrieval at each gamma")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = ap.parse_args()
    if any(b < 0 for b in args.beta or []):
        raise SystemExit("--beta must be >= 0 (0: no hub offset)")

    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, RidgeConfig, load_config
    from pipeline.scorers.geometry.ridge import fit_map, ranking_auc, training_pairs
    from pipeline.scoring import suite_inputs

    ridge = load_config(RidgeConfig, args.params, "ridge")
    if ridge.objects != "box-mean":
        raise SystemExit(f"these trials are on box means; {args.params} fits the map on {ridge.objects!r}")
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    manifest, index = suite_inputs(store, ridge.suite)
    betas = args.beta or [100.0]

    def pairs(layer: str):
        P, Y, image = training_pairs(store, manifest, index, ridge.suite, layer)
        return P, Y, image, image % 5 == 4

    def fit(P, Y):
        return fit_map(P, Y, ridge.lam, ridge.shrinkage)

    if args.trial == "curve":
        P, Y, image, held = pairs("early")
        for every in (4, 2, 1):
            kept = ~held & ((image // 5) % every == 0)
            aucs = {b: ranking_auc(P[held], Y[held], fit(P[kept], Y[kept]), beta=b) for b in betas}
            print(f"1/{every} of the fitting images ({int(kept.sum())} objects): " + "  ".join(f"beta {b:g} AUC {a:.4f}" for b, a in aucs.items()), flush=True)
    elif args.trial == "grids":
        scores = {}
        for layer in ("early", "final-raw", "final"):
            P, Y, _, held = pairs(layer)
            fitted = fit(P[~held], Y[~held])
            objects = fitted.objects(Y[held])
            for b in betas:
                scores[layer, b] = fitted.phrases(P[held]) @ objects.T - fitted.hub_offset(objects, b)[None, :]
                print(f"{layer:9s} beta {b:<5g} AUC {auc(scores[layer, b], P[held]):.4f}", flush=True)
        for b in betas:
            for other in ("final-raw", "final"):
                for w in (0.5, 1.0):
                    print(f"early + {w:g} x {other:9s} beta {b:<5g} AUC {auc(scores['early', b] + w * scores[other, b], P[held]):.4f}")
    elif args.trial == "others":
        P, Y, image, held = pairs("early")
        for gamma in args.gamma or [0.0, 0.25, 0.5, 0.75, 1.0]:
            Yg = Y - gamma * others_mean(Y, image)
            fitted = fit(P[~held], Yg[~held])
            print(f"gamma {gamma:<5g} " + "  ".join(f"beta {b:g} AUC {ranking_auc(P[held], Yg[held], fitted, beta=b):.4f}" for b in betas), flush=True)
            if args.retrieval:
                for b in betas:
                    retrieval(store, args.params, fit(P, Yg), gamma, b)
    else:
        size_trial(store, manifest, index, ridge, pairs, fit, betas)


def auc(S, P) -> float:
    """:func:`ranking_auc`'s definition on a precomputed [N, N] score matrix."""
    other = (P @ P.T) < 1 - 1e-6
    return float(((S < S.diag()[:, None]) & other).sum() / other.sum())


def others_mean(Y, image):
    """[N, D] the mean of each object's image's other objects (0 for an object alone)."""
    import torch

    n = int(image.max()) + 1
    sums = torch.zeros(n, Y.shape[1]).index_add_(0, image, Y)
    count = torch.zeros(n).index_add_(0, image, torch.ones(len(Y)))[image][:, None]
    return (sums[image] - Y) / (count - 1).clamp_min(1) * (count > 1)


def size_trial(store, manifest, index, ridge, pairs, fit, betas) -> None:
    """The ``size`` trial: the plain map by object size, then the size-conditioned map."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from pipeline.benchmarks.retrieval import parse_boxes
    from pipeline.scorers.geometry.objects import visible_objects
    from pipeline.scorers.geometry.ridge import (
        distinct_image_items,
        fit_ridge,
        reference_phrases,
        whitening,
    )

    P, Y, _, held = pairs("early")
    first = distinct_image_items(index, len(manifest))
    boxes = np.concatenate([np.asarray(parse_boxes(manifest["object_boxes"].iloc[i])).reshape(-1, 4) for i in first])
    boxes = torch.as_tensor(boxes[visible_objects(store, manifest, first)]).float()
    log_area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).clamp_min(1e-6).log()
    s = (log_area - log_area.mean()) / log_area.std()
    small = s[held] < 0
    plain = fit(P[~held], Y[~held])
    objects = plain.objects(Y[held])
    for b in betas:
        S = plain.phrases(P[held]) @ objects.T - plain.hub_offset(objects, b)[None, :]
        print(f"plain map          beta {b:<5g} AUC {auc(S, P[held]):.4f}  small {auc(S[small][:, small], P[held][small]):.4f}  large {auc(S[~small][:, ~small], P[held][~small]):.4f}")
    X = torch.cat([P, P * s[:, None], s[:, None]], 1)
    W, bias = fit_ridge(X[~held], Y[~held], ridge.lam)
    centre = Y[~held].mean(0)
    T = whitening(Y[~held] - (X[~held] @ W + bias), ridge.shrinkage)
    D = P.shape[1]
    o, sh = F.normalize((Y[held] - centre) @ T, dim=-1), s[held]

    def mapped(phr, sizes):  # [n, D] phrases at each of the objects' sizes -> [n, m, r]
        base, slope = phr @ W[:D] + bias - centre, phr @ W[D : 2 * D] + W[-1]
        return F.normalize((base[:, None] + slope[:, None] * sizes[None, :, None]) @ T, dim=-1)

    reference = reference_phrases(P[~held])
    for b in betas:
        S = torch.cat([(mapped(P[held], sh[j : j + 512]) * o[None, j : j + 512]).sum(-1) for j in range(0, len(o), 512)], 1)
        if b > 0:  # the inverted softmax's offset, mapped at each object's size (0: none)
            offset = torch.cat([torch.logsumexp(b * (mapped(reference, sh[j : j + 512]) * o[None, j : j + 512]).sum(-1), 0) / b for j in range(0, len(o), 512)])
            S = S - offset[None, :]
        print(f"size-conditioned   beta {b:<5g} AUC {auc(S, P[held]):.4f}  small {auc(S[small][:, small], P[held][small]):.4f}  large {auc(S[~small][:, ~small], P[held][~small]):.4f}", flush=True)


def retrieval(store, params: str, fitted, gamma: float, beta: float) -> None:
    """``ridge-fgw`` with ``fitted`` and each gallery object's other objects' mean removed
    at ``gamma``, scored on shapes-retrieval."""
    import torch

    from pipeline.benchmarks import SUITES
    from pipeline.config import ScoreConfig, load_config
    from pipeline.scorers import create_scorer
    from pipeline.scoring import drop_missing, score_retrieval, suite_inputs
    from pipeline.stats import bootstrap_ci

    score = load_config(ScoreConfig, params, "score")
    options = {**score.options.get("ridge-fgw", {}), "layer": "early"}
    scorer = create_scorer("ridge-fgw", dims=store.dims, proj=store.projections(), **options, rank=fitted.whiten.shape[1], beta=beta, n_reference=len(fitted.reference)).eval()
    with torch.no_grad():
        for name, value in fitted.tensors().items():
            getattr(scorer, name).copy_(value)
    whiten = scorer.map_objects

    def map_objects(sets):
        embed, mask = sets.embed, sets.mask[..., None].to(sets.embed.dtype)
        count = mask.sum(1, keepdim=True)
        others = ((embed * mask).sum(1, keepdim=True) - embed) / (count - 1).clamp_min(1) * (count > 1)
        return whiten(sets.with_embed(embed - gamma * others))

    scorer.map_objects = map_objects
    manifest, index = suite_inputs(store, "shapes-retrieval")
    manifest, index, _ = drop_missing(manifest, index)
    units = SUITES.get("shapes-retrieval").units(manifest, score_retrieval(scorer, store, manifest, index, score.batch_size, suite="shapes-retrieval"))
    for metric in ("R@1", "R@10", "nDCG@10"):
        ci = bootstrap_ci(units[metric].values, n_resamples=2000)
        print(f"  shapes-retrieval gamma {gamma:g} beta {beta:g} {metric:8s} {ci.estimate:.3f} [{ci.lo:.3f}, {ci.hi:.3f}]", flush=True)


if __name__ == "__main__":
    run_main(main)
