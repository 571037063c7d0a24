"""Held-out trials on ``ridge-fgw``'s box-mean objects that the pipeline did not adopt.

    .venv/bin/python scripts/ridge_object_trials.py TRIAL [--beta B ...] [--gamma G ...] [--width W ...] [--retrieval] [--params P]

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
* ``probe``: what the box means hold at all. A multinomial logistic probe and a one-hidden-
  layer MLP, each trained on the fitting images' box means to name their phrase (one
  class per distinct phrase; seeded, standardised inputs, Adam), read as the log posterior
  of each held-out phrase for each held-out object: the same AUC, over every pair and over
  the hard pairs (different phrases sharing a word), beside the map's own, on the early,
  final-raw and final grids and the early and final-raw grids concatenated. Also each
  readout's top-1 phrase on the held-out objects and how many of its errors keep the shape
  and change the colour. ``--retrieval`` also scores ``ridge-fgw`` on shapes-retrieval with
  the early grid's MLP probe (trained on every shapes-train object) as its feature cost,
  1 − (1/β) log p(phrase | object), the inverted softmax's form with the probe's posterior,
  and its R@1 against the plain map's (the pipeline's at β 100), paired over queries.
* ``lift``: the map fitted in closed form onto lifted objects, each box mean standardised
  (z) and joined by ``--width`` seeded random ReLU features of it, relu(z W + b) with
  W ~ N(0, 1/D) and b ~ N(0, 1/4): a random-feature kernel on the object side, compared
  as the pipeline compares (centred, whitened, every direction, the hub offset); width 0
  is z alone. ``--learned`` lifts by the hidden layer of the probe trial's MLP instead,
  trained on the fitting objects to name their phrases (a learned object map, still read
  by the closed-form map from phrase embeddings). ``--retrieval`` also scores it on
  shapes-retrieval, R@1 paired against the plain map's.

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

TRIALS = ("size", "others", "grids", "curve", "probe", "lift")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trial", choices=TRIALS)
    ap.add_argument("--beta", type=float, action="append", default=None, help="hub offset's inverse temperature (default: 100)")
    ap.add_argument("--gamma", type=float, action="append", default=None, help="others: the share of the other objects' mean removed (default: 0, 0.25, 0.5, 0.75, 1)")
    ap.add_argument("--width", type=int, action="append", default=None, help="lift: random ReLU features (default: 0, 1024, 2048, 4096)")
    ap.add_argument("--learned", action="store_true", help="lift: the probe's MLP hidden layer in place of --width's random features")
    ap.add_argument("--retrieval", action="store_true", help="others, probe, lift: also score ridge-fgw so built on shapes-retrieval")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = ap.parse_args()
    if any(b < 0 for b in args.beta or []):
        raise SystemExit("--beta must be >= 0 (0: no hub offset)")
    if any(w < 0 for w in args.width or []):
        raise SystemExit("--width must be >= 0 (0: the standardised box means alone)")
    if args.learned and (args.trial != "lift" or args.width):
        raise SystemExit("--learned is the lift trial's learned lift, in place of --width's random features")
    if args.trial == "probe" and args.retrieval and 0 in (args.beta or []):
        raise SystemExit("probe --retrieval divides the probe's log posterior by --beta: give beta > 0")

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
                    retrieval(store, args.params, fit(P, Yg), b, f"gamma {gamma:g} beta {b:g}", others_removed(gamma))
    elif args.trial == "lift":
        widths = [-1] if args.learned else args.width or [0, 1024, 2048, 4096]
        lift_trial(object_names(manifest, index), pairs, fit, betas, widths, (store, args.params) if args.retrieval else None)
    elif args.trial == "probe":
        probe_trial(object_names(manifest, index), pairs, fit, betas, (store, args.params) if args.retrieval else None)
    else:
        size_trial(store, manifest, index, ridge, pairs, fit, betas)


def auc(S, P) -> float:
    """:func:`ranking_auc`'s definition on a precomputed [N, N] score matrix: over every pair
    of different phrases ``P``."""
    return auc_over(S, (P @ P.T) < 1 - 1e-6)


def auc_over(S, pairs) -> float:
    """How often phrase i (row) scores its own object (the diagonal) above object j, over
    the pairs (i, j) that ``pairs`` [N, N] marks."""
    return float(((S < S.diag()[:, None]) & pairs).sum() / pairs.sum())


def standardise(Y_fit):
    """The map Y -> (Y - mean) / std with ``Y_fit``'s per-dimension mean and standard
    deviation (floored at 1e-6)."""
    mean, std = Y_fit.mean(0), Y_fit.std(0).clamp_min(1e-6)
    return lambda Y: (Y - mean) / std


def others_mean(Y, image):
    """[N, D] the mean of each object's image's other objects (0 for an object alone)."""
    import torch

    n = int(image.max()) + 1
    sums = torch.zeros(n, Y.shape[1]).index_add_(0, image, Y)
    count = torch.zeros(n).index_add_(0, image, torch.ones(len(Y)))[image][:, None]
    return (sums[image] - Y) / (count - 1).clamp_min(1) * (count > 1)


def others_removed(gamma: float):
    """A patch of the scorer (:func:`retrieval`): each object's box mean less ``gamma`` times
    the mean of its image's other objects before the map's whitening."""
    def patch(scorer) -> None:
        whiten = scorer.map_objects

        def map_objects(sets):
            embed, mask = sets.embed, sets.mask[..., None].to(sets.embed.dtype)
            count = mask.sum(1, keepdim=True)
            others = ((embed * mask).sum(1, keepdim=True) - embed) / (count - 1).clamp_min(1) * (count > 1)
            return whiten(sets.with_embed(embed - gamma * others))

        scorer.map_objects = map_objects

    return patch


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


def object_names(manifest, index) -> list[str]:
    """Every object's phrase in :func:`training_pairs`' order before it drops the objects
    the encoder cannot see (the shapes world's are all seen; checked by the caller)."""
    from pipeline.scorers.geometry.ridge import distinct_image_items

    first = distinct_image_items(index, len(manifest))
    return [str(n) for x in manifest["object_names"].iloc[first] for n in x]


def probe_trial(names, pairs, fit, betas, scored=None, epochs: int = 200, hidden: int = 512) -> None:
    """The ``probe`` trial (module docstring): the map against trained readouts of the box
    means; with ``scored`` (store, params) also ``ridge-fgw`` with the early grid's MLP
    probe as its feature cost on shapes-retrieval (:func:`probe_cost`)."""
    import numpy as np
    import torch

    from scripts.trials import shared_word_pairs

    grids = {"early": ("early",), "final-raw": ("final-raw",), "final": ("final",), "early+final-raw": ("early", "final-raw")}
    loaded = {layer: pairs(layer) for layer in ("early", "final-raw", "final")}
    P, _, _, held = loaded["early"]
    if len(names) != len(P):
        raise SystemExit(f"{len(P)} objects seen of {len(names)} named: the probe trial needs every object seen")
    classes, first, label = np.unique(names, return_index=True, return_inverse=True)
    label = torch.as_tensor(label)
    held_names = [n for n, h in zip(names, held.tolist(), strict=True) if h]
    hard = shared_word_pairs(held_names)
    shape = torch.as_tensor(np.unique([n.split()[-1] for n in classes], return_inverse=True)[1])

    def report(name: str, S: torch.Tensor, top: torch.Tensor) -> None:
        every, shared, top1, colour, wrong = readout_figures(S, top, label[held], hard, shape)
        print(f"  {name:22s} AUC {every:.4f}  hard pairs {shared:.4f}  top-1 {top1:.4f}  errors keeping the shape {colour} of {wrong}", flush=True)

    for grid, layers in grids.items():
        Y = torch.cat([loaded[layer][1] for layer in layers], 1)
        print(f"{grid} ({Y.shape[1]} dims)", flush=True)
        fitted = fit(P[~held], Y[~held])
        objects = fitted.objects(Y[held])
        prototypes = fitted.phrases(P[first])  # [classes, r] each phrase mapped
        for b in betas:
            offset = fitted.hub_offset(objects, b)
            S = fitted.phrases(P[held]) @ objects.T - offset[None, :]
            top = (objects @ prototypes.T).argmax(1)  # an object's offset is the same for every phrase
            report(f"ridge map, beta {b:g}", S, top)
        X = standardise(Y[~held])(Y)
        for width in (0, hidden):
            log_post = train_probe(X[~held], label[~held], X[held], len(classes), width, epochs)  # [objects, classes]
            report("logistic probe" if width == 0 else f"MLP probe ({width})", log_post[:, label[held]].T, log_post.argmax(1))
    if scored is not None:
        Y = loaded["early"][1]
        z = standardise(Y)
        net = train_probe(z(Y), label, None, len(classes), hidden, epochs)
        plain = fit(P, Y)  # the plain map: the pipeline's, and the scorer each patch replaces the mapping of
        for b in betas:
            base = retrieval(*scored, plain, b, f"the plain map, beta {b:g}")
            retrieval(*scored, plain, b, f"MLP probe, beta {b:g}", probe_cost(net, z, P[first], b), base)


def readout_figures(S, top, truth, hard, shape) -> tuple[float, float, float, int, int]:
    """(AUC, hard-pair AUC, top-1, errors keeping the shape, errors) of one readout of the
    held-out objects: ``S`` [n, n] scores phrase i (rows) against object j (columns),
    object i's own phrase on the diagonal; ``top`` [n] each object's top-1 class, ``truth``
    [n] its own; ``hard`` [n, n] the hard pairs; ``shape`` [classes] each class's shape.
    The AUCs are :func:`pipeline.scorers.geometry.ridge.ranking_auc`'s, over the pairs of
    different phrases (told apart by class) and over the hard pairs."""
    wrong = top != truth
    return (auc_over(S, truth[:, None] != truth[None, :]), auc_over(S, hard), 1 - float(wrong.float().mean()),
            int((wrong & (shape[top] == shape[truth])).sum()), int(wrong.sum()))  # fmt: skip


def relu_lift(Y_fit, width: int, seed: int = 0):
    """The ``lift`` trial's object map: [N, D] box means -> [N, D + width], each standardised
    by ``Y_fit``'s mean and standard deviation (z) and joined by relu(z W + b), W [D, width]
    ~ N(0, 1/D) and b ~ N(0, 1/4) drawn from ``seed``; width 0 gives z alone."""
    import torch

    standard = standardise(Y_fit)
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(Y_fit.shape[1], width, generator=g) / Y_fit.shape[1] ** 0.5
    b = torch.randn(width, generator=g) * 0.5

    def lift(Y):
        z = standard(Y)
        return torch.cat([z, torch.relu(z @ W + b)], -1)

    return lift


def lift_trial(names, pairs, fit, betas, widths, scored=None) -> None:
    """The ``lift`` trial (module docstring); with ``scored`` (store, params) also on
    shapes-retrieval, the lift and the map fitted on every shapes-train object."""
    import numpy as np
    import torch

    from pipeline.scorers.geometry.ridge import ranking_auc
    from scripts.trials import shared_word_pairs

    P, Y, _, held = pairs("early")
    if len(names) != len(P):
        raise SystemExit(f"{len(P)} objects seen of {len(names)} named: the lift trial needs every object seen")
    hard = shared_word_pairs([n for n, h in zip(names, held.tolist(), strict=True) if h])
    classes, label = np.unique(names, return_inverse=True)
    label = torch.as_tensor(label)

    def make_lift(rows, width):  # width -1: the probe's hidden layer, trained on the rows' objects
        return relu_lift(Y[rows], width) if width >= 0 else learned_lift(Y[rows], label[rows], len(classes))

    everything = torch.ones(len(Y), dtype=torch.bool)
    for width in widths:
        lift = make_lift(~held, width)
        Yl = lift(Y)
        fitted = fit(P[~held], Yl[~held])
        print(f"{'learned' if width < 0 else f'width {width}':11s} " + "  ".join(f"beta {b:g} AUC {ranking_auc(P[held], Yl[held], fitted, beta=b):.4f} hard pairs {ranking_auc(P[held], Yl[held], fitted, pairs=hard, beta=b):.4f}" for b in betas), flush=True)
    if scored is not None:
        plain = fit(P, Y)  # the plain map: the pipeline's, and the scorer each patch replaces the mapping of
        bases = {b: retrieval(*scored, plain, b, f"the plain map, beta {b:g}") for b in betas}
        for width in widths:
            lift = make_lift(everything, width)
            fitted = fit(P, lift(Y))
            for b in betas:
                retrieval(*scored, plain, b, f"{'learned' if width < 0 else f'width {width}'} beta {b:g}", lifted(fitted, lift, b), bases[b])


def learned_lift(Y_fit, y_fit, n_classes: int, hidden: int = 512, epochs: int = 200):
    """The ``lift`` trial's learned object map: [N, D] box means -> [N, D + hidden], each
    standardised by ``Y_fit``'s mean and standard deviation (z) and joined by the hidden
    layer of the probe trial's MLP trained on ``Y_fit`` to name ``y_fit``
    (:func:`train_probe`)."""
    import torch

    standard = standardise(Y_fit)
    net = train_probe(standard(Y_fit), y_fit, None, n_classes, hidden, epochs)

    def lift(Y):
        z = standard(Y)
        with torch.no_grad():
            return torch.cat([z, net[1](net[0](z))], -1)

    return lift


def lifted(fitted, lift, beta: float):
    """A patch of the scorer (:func:`retrieval`): phrases mapped by ``fitted``, objects lifted
    by ``lift`` and compared in ``fitted``'s space, each real object offset at ``beta``."""
    import torch

    def patch(scorer) -> None:
        def map_phrases(sets):
            return sets.with_embed(fitted.phrases(sets.embed.float()))

        def map_objects(sets):
            objects = fitted.objects(lift(sets.embed.float()))
            offset = torch.zeros(sets.mask.shape)
            offset[sets.mask] = fitted.hub_offset(objects[sets.mask], beta)
            return sets.with_embed(objects, offset)

        scorer.map_phrases, scorer.map_objects = map_phrases, map_objects

    return patch


def train_probe(X, y, X_eval, n_classes: int, hidden: int, epochs: int, batch: int = 512, seed: int = 0):
    """[len(X_eval), n_classes] log posteriors of a probe (linear, or one GELU layer of
    ``hidden`` units) trained on ``X`` [N, D] to name ``y`` [N] with Adam (lr 1e-3,
    weight decay 1e-4), seeded; the probe itself when ``X_eval`` is None."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    D = X.shape[1]
    net = torch.nn.Linear(D, n_classes) if hidden == 0 else torch.nn.Sequential(torch.nn.Linear(D, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, n_classes))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(epochs):
        for rows in torch.randperm(len(X), generator=g).split(batch):
            loss = F.cross_entropy(net(X[rows]), y[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
    if X_eval is None:
        return net.eval()
    with torch.no_grad():
        return net(X_eval).log_softmax(1)


def probe_cost(net, standard, phrases, beta: float):
    """A patch of the scorer (:func:`retrieval`): the feature cost 1 - (1/beta) log p(c | o),
    with p the posterior of the probe ``net`` over the object's box mean standardised by
    ``standard`` (:func:`standardise`), over the phrases ``phrases`` [C, D] (its classes, in order)
    and each query phrase read as the class whose embedding it equals (the inverted
    softmax's cost has this form, with the map's posterior). A query phrase that is none
    of the classes is refused: the closed-set probe cannot score it."""
    import torch
    import torch.nn.functional as F

    def patch(scorer) -> None:
        def map_phrases(sets):
            cosine = F.normalize(sets.embed, dim=-1) @ F.normalize(phrases, dim=-1).T  # [N, n, C]
            best, cls = cosine.max(-1)
            if (best[sets.mask] < 1 - 1e-4).any():
                raise ValueError("a query phrase is none of the probe's classes: the closed-set probe cannot score it")
            return sets.with_embed(F.one_hot(cls, len(phrases)).to(sets.embed.dtype))

        def map_objects(sets):
            with torch.no_grad():
                log_post = net(standard(sets.embed.float())).log_softmax(-1)
            return sets.with_embed(log_post.to(sets.embed.dtype) / beta)

        scorer.map_phrases, scorer.map_objects = map_phrases, map_objects

    return patch


def retrieval(store, params: str, fitted, beta: float, label: str, patch=None, base=None):
    """``ridge-fgw`` built with the map ``fitted`` at ``beta``, then changed by
    ``patch(scorer)`` (which may replace how it maps phrases and objects), scored on
    shapes-retrieval (each line names ``label``), and with ``base`` (another call's result)
    its R@1 against base's, paired over queries. Returns the per-query units."""
    import torch

    from pipeline.benchmarks import SUITES
    from pipeline.config import ScoreConfig, load_config
    from pipeline.scorers import create_scorer
    from pipeline.scoring import drop_missing, score_retrieval, suite_inputs
    from pipeline.stats import bootstrap_ci, paired_bootstrap

    score = load_config(ScoreConfig, params, "score")
    options = {**score.options.get("ridge-fgw", {}), "layer": "early"}
    scorer = create_scorer("ridge-fgw", dims=store.dims, proj=store.projections(), **options, rank=fitted.whiten.shape[1], beta=beta, n_reference=len(fitted.reference)).eval()
    with torch.no_grad():
        for name, value in fitted.tensors().items():
            getattr(scorer, name).copy_(value)
    if patch is not None:
        patch(scorer)
    manifest, index = suite_inputs(store, "shapes-retrieval")
    manifest, index, _ = drop_missing(manifest, index)
    units = SUITES.get("shapes-retrieval").units(manifest, score_retrieval(scorer, store, manifest, index, score.batch_size, suite="shapes-retrieval"))
    for metric in ("R@1", "R@10", "nDCG@10"):
        ci = bootstrap_ci(units[metric].values, n_resamples=2000)
        print(f"  shapes-retrieval {label} {metric:8s} {ci.estimate:.3f} [{ci.lo:.3f}, {ci.hi:.3f}]", flush=True)
    if base is not None:
        delta = paired_bootstrap(units["R@1"].values, base["R@1"].values, n_resamples=2000)
        print(f"  shapes-retrieval {label} R@1 against the plain map {delta.diff:+.3f} [{delta.lo:+.3f}, {delta.hi:+.3f}], p {delta.p:.3f}", flush=True)
    return units


if __name__ == "__main__":
    run_main(main)
