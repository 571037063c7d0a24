r"""The ridge mapper of ``ridge-fgw`` (methods.md §3): a linear map from phrase embeddings to
per-object image embeddings, fitted in closed form on the training split.

Training pairs are every annotated object of the training suite's images: the pooled
embedding of its name (``object_names``, e.g. "red circle", encoded at extract) and its
per-object image embedding (:func:`pipeline.scorers.geometry.objects.image_objects`), both
unit-normalised. With centred matrices :math:`P, O \in \mathbb{R}^{N \times D}`

.. math::
    W = (P^\top P + \lambda I)^{-1} P^\top O, \qquad b = \bar o - \bar p W,

the minimiser of :math:`\lVert P W - O \rVert_F^2 + \lambda \lVert W \rVert_F^2` with an
unpenalised intercept.

A mapped phrase estimates the mean object of its phrase; the objects scatter around it with
the fit's residual covariance :math:`\Sigma = R^\top R / N`, :math:`R = O - (P W + b)`, which
is far from isotropic: every box mean shares the background and its neighbours' patches. So
phrases and objects are compared by the cosine after centring on the training objects' mean
:math:`\mu` and whitening by that covariance, shrunk toward its mean eigenvalue
(``ridge.shrinkage`` :math:`s`, :func:`whitening`):

.. math::
    \hat p = \mathrm{normalise}\big((p W + b - \mu)\,T\big), \quad
    \hat o = \mathrm{normalise}\big((o - \mu)\,T\big), \quad
    T = \big((1 - s)\,\Sigma + s\,\tfrac{\operatorname{tr}\Sigma}{D_o} I\big)^{-1/2},

so directions the residuals barely move along (what tells one colour from another) count as
much as the shared ones. :math:`s = 1` gives the plain centred cosine.

Whitened, most directions of the object space are ones no phrase predicts: the residual noise
of position, size and neighbours, as large as the signal once whitened. The cosine therefore
reads only the map's range, the top :math:`r` principal directions :math:`V_r` of the whitened,
centred fitted values :math:`(P W + b - \mu)\,T` on the training pairs (``ridge.ranks``;
:math:`r = 0` keeps every direction), so :math:`T` above becomes :math:`T V_r` on both sides.
With categorical phrases this is Fisher's discriminant space: within-phrase scatter whitened,
between-phrase directions kept.

Least-squares maps make hubs (Dinu et al., 2015): objects near many mapped phrases (a box
mean whose colour its neighbours wash out). So an object's cosine is read against the distinct
training phrases mapped alike, :math:`\{\hat r_v\}`, by the inverted softmax (Smith et al.,
2017): :math:`\mathrm{cost}(p, o) = 1 - \hat p^\top \hat o + h(o)`, :math:`h(o) = \tfrac1\beta
\log \sum_v \exp(\beta\, \hat r_v^\top \hat o)` (:meth:`RidgeMap.hub_offset`; :math:`\beta = 0`:
none; the :data:`REFERENCE_MAX` most frequent phrases). FGW's uniform weights give every
object of a candidate its mass, so the offsets leave the coupling as it is and charge the
candidate :math:`1 - \alpha` times its objects' mean offset: images of hubs rank lower.

The grid the object embeddings read (:data:`~pipeline.scorers.geometry.objects.OBJECT_LAYERS`:
the final layer in the joint space, the same patches before the projection, or the early
layer), the rank :math:`r` and :math:`\beta` (``ridge.inverted_softmax``) are chosen on the
training split: every fifth training image is held out, the map fitted on the rest for each
grid, and the (grid, rank, :math:`\beta`) whose mapped phrases best rank their own held-out
object above the others (:func:`ranking_auc`) is kept; the map is then refitted on every
training object. The test suites never choose it. With ``ridge.objects: crops`` the targets are
the re-encoded crops (``extract.object_crops: true``), chosen and recorded the same way, and the
checkpoint's ``scorer_kwargs`` make ``ridge-fgw`` read crops at scoring: a map is only ever
compared with the object embeddings it was fitted to. The checkpoint
(``<out>/ridge-fgw/model.safetensors``) stores :math:`W, b, \mu, T V_r` and the mapped reference
phrases; its ``config.json`` the fit's configuration, the store's fingerprint and the training
manifest's hash, so a fit on other data or features is never mistaken for this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.benchmarks.retrieval import parse_boxes
from pipeline.cache import FeatureStore
from pipeline.files import write_json_atomically
from pipeline.scorers.geometry.objects import (
    OBJECT_LAYERS,
    check_source,
    item_objects,
    require_columns,
    visible_objects,
)

VARIANT = "ridge-fgw"
REFERENCE_MAX = 4096  # the inverted softmax's reference: at most this many distinct training phrases, the most frequent
OFFSET_ROWS = 8192  # objects whose similarities to the reference are held at once (8192 x 4096 floats: 128 MiB)


def distinct_image_items(index: dict[str, np.ndarray], n_items: int) -> np.ndarray:
    """Manifest rows of the suite's distinct images, each image's first item, in row order
    (items without an image left out): the rows the map is fitted on, once per image."""
    image_rows = index["image"].reshape(n_items, -1)[:, 0]
    _, first = np.unique(image_rows, return_index=True)
    return np.sort(first[image_rows[first] >= 0])


def training_pairs(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str = "", layer: str = "final", objects: str = "box-mean") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(phrases [N, D], objects [N, D_o], image [N]): every annotated object of the suite's
    images, once per distinct image (:func:`distinct_image_items`), its object embedding
    from ``objects`` (box means of ``layer``'s grid, or the re-encoded crops), and the
    position of its image among those images (for image-disjoint held-out splits). An
    object that the encoder's view cuts away (a box mean of a wide image's edge) has no
    embedding, so its phrase is left out with it (:func:`visible_objects`)."""
    require_columns(manifest, ("object_names", "object_boxes"), suite)
    if "object_names" not in index:
        raise ValueError(f"the store has no object_names rows for {suite}: rerun `pipeline extract`")
    first = distinct_image_items(index, len(manifest))
    boxes = [parse_boxes(manifest["object_boxes"].iloc[i]) for i in first]
    names = index["object_names"].reshape(len(manifest), -1)[first]  # [n_images, n_max]
    counts = (names >= 0).sum(1)
    if not np.array_equal(counts, [len(b) for b in boxes]):
        raise ValueError(f"{suite}: object_names and object_boxes differ in length on some rows")
    sets = item_objects(store, manifest, index, first, suite, layer, objects)
    obj = sets.embed[sets.mask]  # [N, D_o] in row order
    seen = visible_objects(store, manifest, first, objects)  # [sum m_g], the objects in obj
    phr = F.normalize(store.texts(names[names >= 0][seen], grids=False).embed, dim=-1)  # [N, D]
    image = torch.arange(len(first))[:, None].expand_as(sets.mask)[sets.mask]  # [N]
    return phr, obj, image


def fit_ridge(P: torch.Tensor, Y: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [D, D_o], b [D_o]) of the ridge regression of the objects ``Y`` on the phrases
    ``P`` (the module's O)."""
    if lam < 0:
        raise ValueError(f"ridge lambda must be >= 0, got {lam}")
    P, Y = P.double(), Y.double()
    mp, mo = P.mean(0), Y.mean(0)
    Pc, Oc = P - mp, Y - mo
    A = Pc.T @ Pc + lam * torch.eye(P.shape[1], dtype=P.dtype)
    W = torch.linalg.solve(A, Pc.T @ Oc)
    return W.float(), (mo - mp @ W).float()


def whitening(residuals: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """[D, D] the inverse square root of the covariance of ``residuals`` [N, D] (taken about
    zero, as a fit's residuals are centred), shrunk toward its mean eigenvalue by
    ``shrinkage`` in (0, 1]; symmetric, so it whitens rows on either side."""
    if not 0.0 < shrinkage <= 1.0:
        raise ValueError(f"shrinkage must lie in (0, 1], got {shrinkage}")
    R = residuals.double()
    cov = R.T @ R / max(len(R), 1)
    scale = (cov.trace() / len(cov)).clamp_min(1e-12)
    cov = (1 - shrinkage) * cov + shrinkage * scale * torch.eye(len(cov), dtype=cov.dtype)
    vals, vecs = torch.linalg.eigh(cov)
    return ((vecs * vals.rsqrt()) @ vecs.T).float()


class RidgeMap(NamedTuple):
    """A fitted map and the space it compares in: ``weight`` [D, D_o], ``bias`` [D_o], the
    training objects' mean ``centre`` [D_o], the ``whiten`` matrix [D_o, r] (whitening
    times the map's range, :math:`T V_r`) and the ``reference`` phrases [V, r] of the hub
    offset, mapped (:func:`with_reference`; None: no reference, no offset)."""

    weight: torch.Tensor
    bias: torch.Tensor
    centre: torch.Tensor
    whiten: torch.Tensor
    reference: torch.Tensor | None = None

    def phrases(self, P: torch.Tensor) -> torch.Tensor:
        """[..., D] phrase embeddings -> unit [..., r] mapped, centred and whitened."""
        return F.normalize((P @ self.weight + self.bias - self.centre) @ self.whiten, dim=-1)

    def objects(self, Y: torch.Tensor) -> torch.Tensor:
        """[..., D_o] object embeddings -> unit [..., r] centred and whitened."""
        return F.normalize((Y - self.centre) @ self.whiten, dim=-1)

    def hub_offset(self, objects: torch.Tensor, beta: float) -> torch.Tensor:
        """[...] the hub offset :math:`h(o)` of mapped objects [..., r] (:meth:`objects`): the
        inverted softmax's log-normaliser over the reference phrases at inverse temperature
        ``beta``, divided by it; 0 for ``beta`` 0 or without reference phrases."""
        if beta < 0:
            raise ValueError(f"the inverted softmax's beta must be >= 0 (0: no hub offset), got {beta}")
        if beta == 0 or self.reference is None or len(self.reference) == 0:
            return torch.zeros(objects.shape[:-1], dtype=objects.dtype, device=objects.device)
        flat, reference = objects.reshape(-1, objects.shape[-1]), self.reference.to(objects)
        chunks = [torch.logsumexp(beta * (rows @ reference.T), dim=-1) for rows in flat.split(OFFSET_ROWS)]  # [rows, V] at a time
        return (torch.cat(chunks) if chunks else flat.new_zeros(0)).reshape(objects.shape[:-1]) / beta

    def tensors(self) -> dict[str, torch.Tensor]:
        """The map's tensors by name (the checkpoint's ``model.safetensors``)."""
        return {name: t.contiguous() for name, t in self._asdict().items() if t is not None}


def reference_phrases(P: torch.Tensor, limit: int = REFERENCE_MAX) -> torch.Tensor:
    """[V, D] the distinct rows of the phrase embeddings ``P`` [N, D], at most ``limit`` of
    them, the most frequent first (equals in the order ``torch.unique`` sorts them)."""
    distinct, counts = torch.unique(P, dim=0, return_counts=True)
    order = torch.sort(counts, descending=True, stable=True).indices[:limit]
    return distinct[order]


def with_reference(fitted: RidgeMap, P: torch.Tensor) -> RidgeMap:
    """``fitted`` with its reference set: the distinct training phrases of ``P``
    (:func:`reference_phrases`) mapped into its compared space (:meth:`RidgeMap.phrases`)."""
    return fitted._replace(reference=fitted.phrases(reference_phrases(P)))


def fit_map(P: torch.Tensor, Y: torch.Tensor, lam: float, shrinkage: float, rank: int = 0) -> RidgeMap:
    """The ridge map of ``Y`` on ``P`` with the training objects' mean, the whitening of its
    residuals and, for ``rank`` > 0, the projection onto its range (the module's W, b, mu and
    :math:`T V_r`)."""
    W, b = fit_ridge(P, Y, lam)
    full = RidgeMap(W, b, Y.float().mean(0), whitening(Y - (P @ W + b), shrinkage))
    return restrict_rank(full, P, rank)


def restrict_rank(fitted: RidgeMap, P: torch.Tensor, rank: int) -> RidgeMap:
    """``fitted`` comparing along the top ``rank`` principal directions of its whitened,
    centred fitted values on the phrases ``P`` (``whiten`` T becomes T V_r; ``rank`` 0, or one
    at least the space's dimension, keeps every direction), with the reference phrases of
    ``P`` mapped into that space (:func:`with_reference`)."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0 (0: every direction), got {rank}")
    if rank == 0 or rank >= fitted.whiten.shape[1]:
        return with_reference(fitted, P)
    values = (P @ fitted.weight + fitted.bias - fitted.centre) @ fitted.whiten  # [N, D_o]
    directions = torch.linalg.svd(values.double(), full_matrices=False).Vh[:rank].T  # [D_o, r]
    return with_reference(fitted._replace(whiten=(fitted.whiten.double() @ directions).float()), P)


def r_squared(P: torch.Tensor, Y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of the objects' (``Y``) variance the map explains."""
    resid = Y - (P @ W + b)
    return float(1 - resid.pow(2).sum() / (Y - Y.mean(0)).pow(2).sum())


def ranking_auc(P: torch.Tensor, Y: torch.Tensor, fitted: RidgeMap, pairs: torch.Tensor | None = None, beta: float = 0.0) -> float:
    """How often a mapped phrase is closer (cosine in the map's whitened space, less each
    object's hub offset at ``beta``: the reranker's cost) to its own object than to another
    object of a different phrase, over every such pair, or over the pairs (i, j) that
    ``pairs`` [N, N] marks (e.g. phrases sharing a word): 1 is perfect, 0.5 chance, NaN when
    there is no such pair (nothing measured)."""
    objects = fitted.objects(Y)
    S = fitted.phrases(P) @ objects.T - fitted.hub_offset(objects, beta)[None, :]  # [N, N]
    other = (P @ P.T) < 1 - 1e-6 if pairs is None else pairs  # pairs of different phrases
    if not other.any():
        return float("nan")
    return float(((S < S.diag()[:, None]) & other).sum() / other.sum())


def heldout_aucs(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str, lam: float, shrinkage: float, ranks: list[int], layer: str = "final", objects: str = "box-mean", betas: Sequence[float] = (0.0,)) -> dict[int, dict[float, float]]:
    """Ranking AUC on every fifth training image of the map (and whitening) fitted on the
    others, for each rank of ``ranks`` and each inverted-softmax ``beta`` of ``betas``.

    Raises:
        ValueError: either side of that split has no object the encoder sees (too few
            training images with objects to fit and choose on).
    """
    P, Y, image = training_pairs(store, manifest, index, suite, layer, objects)
    held = image % 5 == 4
    if held.all() or not held.any():
        found = f"{len(P)} object(s) the encoder sees in {len(image.unique())} image(s)" if len(P) else "no object the encoder sees"
        raise ValueError(
            f"{suite}: ridge-fgw fits its map on the objects of four of every five training images and chooses "
            f"its grid and rank on the fifth's; the suite has {found}, too few for both sides. "
            f"Use a training suite with more annotated images (ridge.suite)"
        )
    full = fit_map(P[~held], Y[~held], lam, shrinkage)
    cut = {r: restrict_rank(full, P[~held], r) for r in ranks}
    return {r: {b: ranking_auc(P[held], Y[held], cut[r], beta=b) for b in betas} for r in ranks}


def choose_space(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str, lam: float, shrinkage: float, ranks: list[int], layers: tuple[str, ...] = OBJECT_LAYERS, objects: str = "box-mean", betas: Sequence[float] = (0.0,)) -> tuple[str, int, float, dict[str, dict[str, dict[str, float]]]]:
    """The (grid, rank, beta) whose held-out ranking AUC is highest (every fifth image held
    out; the first of equals in ``layers``, ``ranks`` and ``betas`` order), and the AUC of
    each, by grid, rank and beta."""
    aucs = {layer: heldout_aucs(store, manifest, index, suite, lam, shrinkage, ranks, layer, objects, betas) for layer in layers}
    if any(np.isnan(a) for by_rank in aucs.values() for by_beta in by_rank.values() for a in by_beta.values()):
        raise ValueError(
            f"{suite}: the held-out training images (every fifth) hold no two objects with different phrases, so "
            f"ridge-fgw's grid and rank cannot be chosen; use a training suite with more annotated images (ridge.suite)"
        )
    layer, rank, beta = max(((layer, r, b) for layer in layers for r in ranks for b in betas), key=lambda c: aucs[c[0]][c[1]][c[2]])
    record = {layer: {str(r): {f"{b:g}": auc for b, auc in by_beta.items()} for r, by_beta in by_rank.items()} for layer, by_rank in aucs.items()}
    return layer, rank, beta, record


def fit(cfg: Any, store: FeatureStore, manifest, index: dict[str, np.ndarray], manifest_sha256: str) -> dict[str, Any]:
    """Choose the grid (box means; crops, ``cfg.objects``, have one), the rank and the
    inverted softmax's beta on held-out training images, fit on ``cfg.suite`` and write
    ``<cfg.out>/ridge-fgw/{model.safetensors, config.json}``; returns the config record.
    ``cfg``: :class:`pipeline.config.RidgeConfig`."""
    from safetensors.torch import save_file

    from pipeline.scorers.checkpoints import WEIGHTS_KEY, weights_sha256_of

    objects = getattr(cfg, "objects", "box-mean")
    check_source(objects)
    layers = ("final",) if objects == "crops" else OBJECT_LAYERS  # crops: one space, the pooled embedding
    layer, rank, beta, aucs = choose_space(store, manifest, index, cfg.suite, cfg.lam, cfg.shrinkage, cfg.ranks, layers, objects, cfg.inverted_softmax)
    if objects == "crops":
        aucs = {"crops": aucs["final"]}
    P, Y, _ = training_pairs(store, manifest, index, cfg.suite, layer, objects)
    fitted = fit_map(P, Y, cfg.lam, cfg.shrinkage, rank)
    out = Path(cfg.out) / VARIANT
    out.mkdir(parents=True, exist_ok=True)
    save_file(fitted.tensors(), str(out / "model.safetensors"))
    record = {
        "variant": VARIANT,
        "ridge": asdict(cfg),
        "n_pairs": int(len(P)),
        "train_r2": r_squared(P, Y, fitted.weight, fitted.bias),
        "layer": layer,
        "rank": rank,
        "beta": beta,
        "objects": objects,
        "heldout_auc": aucs,
        "store_fingerprint": store.root.attrs.get("fingerprint_id"),
        "train_suite": cfg.suite,
        "manifest_sha256": manifest_sha256,
        "scorer_kwargs": {
            "layer": layer,
            "rank": int(fitted.whiten.shape[1]),
            "beta": float(beta),
            "n_reference": len(fitted.reference),
            **({"objects": "crops"} if objects == "crops" else {}),
        },
        WEIGHTS_KEY: weights_sha256_of(out),  # load_scorer refuses weights that are not these bytes
    }
    write_json_atomically(out / "config.json", record)
    return record
