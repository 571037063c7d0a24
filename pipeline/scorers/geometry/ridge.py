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

Which grid the object embeddings read (:data:`~pipeline.scorers.geometry.objects.OBJECT_LAYERS`:
the final layer in the joint space, the same patches before the projection, or the early
layer) is chosen on the training split itself: every fifth training image is held out, the
map and its whitening are fitted on the rest for each grid, and the grid whose mapped phrases
best rank their own held-out object above the others (:func:`ranking_auc`) is kept; the map is then refitted
on every training object. The test suites never choose it. With ``ridge.objects: crops`` the
targets are the re-encoded crops instead (``extract.object_crops: true``), the map is fitted
on them alone (their held-out AUC is recorded the same way), and the checkpoint's
``scorer_kwargs`` make ``ridge-fgw`` read crops at scoring: a map is only ever compared with
the object embeddings it was fitted to. The checkpoint (``<out>/ridge-fgw/model.safetensors``) stores
:math:`W, b, \mu, T`; its ``config.json`` the fit's configuration, the store's fingerprint and the
training manifest's hash, so a fit on other data or features is never mistaken for this one.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.benchmarks.retrieval import parse_boxes
from pipeline.cache import FeatureStore
from pipeline.scorers.geometry.objects import (
    OBJECT_LAYERS,
    check_source,
    item_objects,
    require_columns,
)

VARIANT = "ridge-fgw"


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
    position of its image among those images (for image-disjoint held-out splits)."""
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
    phr = F.normalize(store.texts(names[names >= 0], grids=False).embed, dim=-1)  # [N, D]
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
    training objects' mean ``centre`` [D_o] and the ``whiten`` matrix [D_o, D_o]."""

    weight: torch.Tensor
    bias: torch.Tensor
    centre: torch.Tensor
    whiten: torch.Tensor

    def phrases(self, P: torch.Tensor) -> torch.Tensor:
        """[..., D] phrase embeddings -> unit [..., D_o] mapped, centred and whitened."""
        return F.normalize((P @ self.weight + self.bias - self.centre) @ self.whiten, dim=-1)

    def objects(self, Y: torch.Tensor) -> torch.Tensor:
        """[..., D_o] object embeddings -> unit [..., D_o] centred and whitened."""
        return F.normalize((Y - self.centre) @ self.whiten, dim=-1)


def fit_map(P: torch.Tensor, Y: torch.Tensor, lam: float, shrinkage: float) -> RidgeMap:
    """The ridge map of ``Y`` on ``P`` with the training objects' mean and the whitening of
    its residuals (the module's W, b, mu and T)."""
    W, b = fit_ridge(P, Y, lam)
    return RidgeMap(W, b, Y.float().mean(0), whitening(Y - (P @ W + b), shrinkage))


def r_squared(P: torch.Tensor, Y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of the objects' (``Y``) variance the map explains."""
    resid = Y - (P @ W + b)
    return float(1 - resid.pow(2).sum() / (Y - Y.mean(0)).pow(2).sum())


def ranking_auc(P: torch.Tensor, Y: torch.Tensor, fitted: RidgeMap, pairs: torch.Tensor | None = None) -> float:
    """How often a mapped phrase is closer (cosine in the map's whitened space) to its own
    object than to another object of a different phrase, over every such pair, or over the
    pairs (i, j) that ``pairs`` [N, N] marks (e.g. phrases sharing a word): 1 is perfect,
    0.5 chance."""
    S = fitted.phrases(P) @ fitted.objects(Y).T  # [N, N]
    other = (P @ P.T) < 1 - 1e-6 if pairs is None else pairs  # pairs of different phrases
    return float(((S < S.diag()[:, None]) & other).sum() / other.sum().clamp_min(1))


def heldout_auc(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str, lam: float, shrinkage: float, layer: str = "final", objects: str = "box-mean") -> float:
    """Ranking AUC on every fifth training image of the map (and whitening) fitted on the
    others."""
    P, Y, image = training_pairs(store, manifest, index, suite, layer, objects)
    held = image % 5 == 4
    return ranking_auc(P[held], Y[held], fit_map(P[~held], Y[~held], lam, shrinkage))


def choose_layer(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str, lam: float, shrinkage: float) -> tuple[str, dict[str, float]]:
    """The grid whose held-out ranking AUC is highest (every fifth image held out), and the
    AUC of each."""
    aucs = {layer: heldout_auc(store, manifest, index, suite, lam, shrinkage, layer) for layer in OBJECT_LAYERS}
    return max(OBJECT_LAYERS, key=lambda layer: aucs[layer]), aucs


def fit(cfg: Any, store: FeatureStore, manifest, index: dict[str, np.ndarray], manifest_sha256: str) -> dict[str, Any]:
    """Choose the grid on held-out training images (box means) or take the crops
    (``cfg.objects``), fit on ``cfg.suite`` and write
    ``<cfg.out>/ridge-fgw/{model.safetensors, config.json}``; returns the config record.
    ``cfg``: :class:`pipeline.config.RidgeConfig`."""
    from safetensors.torch import save_file

    objects = getattr(cfg, "objects", "box-mean")
    check_source(objects)
    if objects == "crops":
        layer, aucs = "final", {"crops": heldout_auc(store, manifest, index, cfg.suite, cfg.lam, cfg.shrinkage, objects="crops")}
    else:
        layer, aucs = choose_layer(store, manifest, index, cfg.suite, cfg.lam, cfg.shrinkage)
    P, Y, _ = training_pairs(store, manifest, index, cfg.suite, layer, objects)
    fitted = fit_map(P, Y, cfg.lam, cfg.shrinkage)
    out = Path(cfg.out) / VARIANT
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in fitted._asdict().items()}, str(out / "model.safetensors"))
    record = {
        "variant": VARIANT,
        "ridge": asdict(cfg),
        "n_pairs": int(len(P)),
        "train_r2": r_squared(P, Y, fitted.weight, fitted.bias),
        "layer": layer,
        "objects": objects,
        "heldout_auc": aucs,
        "store_fingerprint": store.root.attrs.get("fingerprint_id"),
        "manifest_sha256": manifest_sha256,
        "scorer_kwargs": {"layer": layer, **({"objects": "crops"} if objects == "crops" else {})},
    }
    (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    return record
