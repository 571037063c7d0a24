"""One geometry-aware retrieval trial on the pipeline's cache, away from the pipeline's outputs.

    .venv/bin/python scripts/geometry_trial.py VARIANT [key=YAML ...] [--suite S ...] [--lam L]

e.g. ``scripts/geometry_trial.py fgw structure=distance``. Builds ``VARIANT`` with
``score.options[VARIANT]`` from ``params.yaml`` plus the overrides (a trained ``ridge-fgw``
loads ``score.checkpoints``; ``--lam`` refits the ridge map in memory on the ``ridge`` section's
suite instead, onto the object embeddings the options name: ``objects=crops`` fits it on the
re-encoded crops of a store extracted with ``extract.object_crops: true``), scores it on each retrieval suite (default shapes-retrieval and shapes-multi)
and prints R@1, R@5, R@10, nDCG@10 and mean rank with their 95% bootstrap CIs, and the paired
difference to frozen CLIP; ``--misses`` also classifies the queries whose top-1 is not their
own image, counts those whose own image CLIP left outside the shortlist and names the colour
change of each one-colour miss inside it; ``--shrinkage`` and ``--rank`` (with ``--lam``) set the whitening's shrinkage (default:
the ridge section's), the width of the compared space (the map's top directions; default 0,
all of them) and the hub offset's inverse temperature (``--beta``; default 0, none); ``--inverse`` (with
``--lam``) fits the map the other way, from object embeddings to phrase embeddings, and compares
in the phrase space (phrases centred and whitened, objects mapped) — a diagnostic: the spec's map
goes from phrases to objects; ``--plain`` (with ``--lam``) is the spec's map as written: phrases
mapped by W, b and compared by cosine with the raw object embeddings. ``--fuse W`` ranks each shortlist by the reranker's score plus
W times CLIP's cosine, each standardised over the shortlist (a diagnostic: the spec reranks by
the structural score alone). It reads ``cache/features`` and never writes there. The geometry
rows of ``docs/trials.md`` rerun this way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.trials import run_main  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant")
    ap.add_argument("overrides", nargs="*", help="key=YAML factory options")
    ap.add_argument("--suite", action="append", default=None)
    ap.add_argument("--lam", type=float, default=None, help="refit ridge-fgw's map with this penalty")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--oracle", action="store_true", help="image objects = their names' text embeddings (an upper bound: perfect object embeddings)")
    ap.add_argument("--misses", action="store_true", help="on shapes suites: classify each query whose top-1 is not its own image (near-duplicate of its scene or another scene, and what differs)")
    ap.add_argument("--shrinkage", type=float, default=None, help="with --lam: the whitening's shrinkage (default: the ridge section's)")
    ap.add_argument("--rank", type=int, default=0, help="with --lam: compare in the map's top RANK directions (default 0: all)")
    ap.add_argument("--beta", type=float, default=0.0, help="with --lam: the hub offset's inverse temperature (default 0: none)")
    ap.add_argument("--inverse", action="store_true", help="with --lam: fit the map from objects to phrases and compare in the phrase space")
    ap.add_argument("--plain", action="store_true", help="with --lam: the spec's plain map (phrases mapped by W, b; cosine with the raw objects; no centring, whitening or rank cut)")
    ap.add_argument("--fuse", type=float, default=None, help="rank shortlists by the standardised reranker score + FUSE x the standardised CLIP cosine")
    args = ap.parse_intermixed_args()
    if (args.shrinkage is not None or args.inverse or args.rank or args.beta or args.plain) and args.lam is None:
        raise SystemExit("--shrinkage, --rank, --beta, --inverse and --plain refit the map: pass --lam too")
    if args.beta and (args.plain or args.inverse):
        raise SystemExit("--beta offsets the objects against the reference phrases of the map's own space: not with --plain or --inverse")

    import torch

    from pipeline.benchmarks import SUITES
    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, RidgeConfig, ScoreConfig, load_config
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.scorers.geometry.ridge import RidgeMap, fit_map, fit_ridge, training_pairs
    from pipeline.scoring import drop_missing, score_retrieval, suite_inputs
    from pipeline.stats import bootstrap_ci, units_bootstrap

    score = load_config(ScoreConfig, args.params, "score")
    options = dict(score.options.get(args.variant, {}))
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"override {item!r}: expected key=YAML")
        options[key] = yaml.safe_load(value)
    store = open_store(load_config(ExtractConfig, args.params, "extract"))
    if args.lam is None:
        scorer = load_scorer(args.variant, store, score.checkpoints, options=options)
    else:
        from pipeline.scorers import create_scorer

        ridge = load_config(RidgeConfig, args.params, "ridge")
        m, idx = suite_inputs(store, ridge.suite)
        P, Y, _ = training_pairs(store, m, idx, ridge.suite, options.get("layer", "final"), options.get("objects", "box-mean"))
        shrinkage = ridge.shrinkage if args.shrinkage is None else args.shrinkage
        if args.inverse:  # objects -> phrase space: phrases centred and whitened, objects mapped
            scorer = create_scorer(args.variant, dims=store.dims, proj=store.projections(), **options).eval()
            inverse = fit_map(Y, P, args.lam, shrinkage)
            scorer.map_phrases = lambda phrases: phrases.with_embed(inverse.objects(phrases.embed))
            scorer.map_objects = lambda objects: objects.with_embed(inverse.phrases(objects.embed))
        else:
            D = Y.shape[1]
            fitted = RidgeMap(*fit_ridge(P, Y, args.lam), torch.zeros(D), torch.eye(D)) if args.plain else fit_map(P, Y, args.lam, shrinkage, args.rank)
            width, n_reference = fitted.whiten.shape[1], 0 if fitted.reference is None else len(fitted.reference)
            scorer = create_scorer(args.variant, dims=store.dims, proj=store.projections(), **options, rank=width, beta=args.beta, n_reference=n_reference).eval()
            with torch.no_grad():
                for name, value in fitted.tensors().items():
                    getattr(scorer, name).copy_(value)
    if args.oracle:
        prepare = scorer.prepare

        def oracle_prepare(store_, manifest, index, suite=""):
            from pipeline.benchmarks.base import gallery_images
            from pipeline.scorers.geometry.objects import gallery_rows_of, text_sets

            prepare(store_, manifest, index, suite)
            rows = gallery_rows_of(manifest, gallery_images(manifest))
            names = index["object_names"].reshape(len(manifest), -1)[rows]
            oracle = text_sets(store_, names, [p[m] for p, m in zip(scorer._gallery.pos, scorer._gallery.mask, strict=True)])
            scorer._gallery = oracle

        scorer.prepare = oracle_prepare
    if args.fuse is not None:
        import pipeline.scoring as scoring

        merge = scoring.merge_reranked

        def fused(base_s, shortlist, reranked):
            def z(x):
                return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True).clamp_min(1e-12)

            return merge(base_s, shortlist, z(reranked) + args.fuse * z(base_s.gather(1, shortlist).double()))

        scoring.merge_reranked = fused
    clip = load_scorer("clip", store, score.checkpoints)
    out = {"variant": args.variant, "fuse": args.fuse, "options": options, "lam": args.lam, "suites": {}}
    for suite_name in args.suite or ["shapes-retrieval", "shapes-multi"]:
        suite = SUITES.get(suite_name)
        manifest, index = suite_inputs(store, suite_name)
        manifest, index, _ = drop_missing(manifest, index)
        scores = score_retrieval(scorer, store, manifest, index, score.batch_size, suite=suite_name)
        units = suite.units(manifest, scores)
        clip_scores = score_retrieval(clip, store, manifest, index, score.batch_size)
        if args.misses:
            print(f"{suite_name:17s} misses    {json.dumps(misses(manifest, scores, clip_scores, getattr(scorer, 'k', None)))}")
        base = suite.units(manifest, clip_scores)
        rows = {}
        for metric, u in units.items():
            ci = bootstrap_ci(u.values, n_resamples=2000)
            d = units_bootstrap(u, base[metric], n_resamples=2000)
            rows[metric] = {"value": ci.estimate, "lo": ci.lo, "hi": ci.hi, "clip": base[metric].statistic(), "diff": d.diff, "diff_lo": d.lo, "diff_hi": d.hi}
            print(f"{suite_name:17s} {metric:9s} {ci.estimate:7.3f} [{ci.lo:.3f}, {ci.hi:.3f}]  clip {base[metric].statistic():.3f}  Δ {d.diff:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]")
        out["suites"][suite_name] = rows
    print(json.dumps(out))


def misses(manifest, scores, clip_scores=None, k: int | None = None) -> dict:
    """Each query whose top-1 gallery image is not its own, by what that image changes: a
    near-duplicate of the query's scene (same ``group``) with other (colour, shape) objects or
    only another layout, or another scene sharing both, one or none of the query's shapes
    (shapes-world manifests: ``scene`` JSON and ``group`` columns). With CLIP's scores and the
    shortlist's length ``k``: how many misses had their own image outside CLIP's shortlist
    (its top ``k``, ties by gallery order as the rerankers take it: no reranking can reach it), and, for the misses inside it whose image has
    the query's shapes with exactly one colour changed, each change ("orange->yellow")."""
    from collections import Counter

    import numpy as np
    import torch

    from pipeline.benchmarks.base import gallery_images
    from pipeline.scorers.geometry.objects import gallery_rows_of
    from pipeline.scoring import stable_top_k

    rows = gallery_rows_of(manifest, gallery_images(manifest))  # gallery index -> manifest row
    gold = {manifest["image"].iloc[r]: g for g, r in enumerate(rows)}
    scene = [json.loads(x)["objects"] for x in manifest["scene"]]
    kinds: Counter = Counter()
    changes: Counter = Counter()
    outside = 0
    listed = None if clip_scores is None or k is None else stable_top_k(torch.as_tensor(np.asarray(clip_scores)), min(k, len(rows))).numpy()  # [Q, k] CLIP's shortlists
    for q, top in enumerate(scores.argmax(1)):
        own = gold[manifest["image"].iloc[q]]
        if top == own:
            continue
        t = int(rows[top])
        objects = [{(o["colour"], o["shape"]) for o in scene[i]} for i in (q, t)]
        if manifest["group"].iloc[q] == manifest["group"].iloc[t]:
            kinds["near-duplicate, other objects" if objects[0] != objects[1] else "near-duplicate, other layout"] += 1
        else:
            shared = len({s for _, s in objects[0]} & {s for _, s in objects[1]})
            kinds[f"another scene, {shared} shape(s) shared"] += 1
        if listed is None:
            continue
        if own not in listed[q]:
            outside += 1
            continue
        lost, gained = objects[0] - objects[1], objects[1] - objects[0]
        if len(lost) == len(gained) == 1 and next(iter(lost))[1] == next(iter(gained))[1]:
            changes[f"{next(iter(lost))[0]}->{next(iter(gained))[0]}"] += 1
    found = {"queries": len(scores), "misses": sum(kinds.values()), **dict(sorted(kinds.items()))}
    if listed is not None:
        found |= {"outside the shortlist": outside, "one colour changed": dict(sorted(changes.items()))}
    return found


if __name__ == "__main__":
    run_main(main)
