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

Which grid the object embeddings read (:data:`~pipeline.scorers.geometry.objects.OBJECT_LAYERS`:
the final layer in the joint space, the same patches before the projection, or the early
layer) is chosen on the training split itself: every fifth training image is held out, the
map is fitted on the rest for each grid, and the grid whose mapped phrases best rank their
own held-out object above the others (:func:`ranking_auc`) is kept; the map is then refitted
on every training object. The test suites never choose it. With ``ridge.objects: crops`` the
targets are the re-encoded crops instead (``extract.object_crops: true``), the map is fitted
on them alone (their held-out AUC is recorded the same way), and the checkpoint's
``scorer_kwargs`` make ``ridge-fgw`` read crops at scoring: a map is only ever compared with
the object embeddings it was fitted to. The checkpoint (``<out>/ridge-fgw/model.safetensors``) stores
:math:`W, b`; its ``config.json`` the fit's configuration, the store's fingerprint and the
training manifest's hash, so a fit on other data or features is never mistaken for this one.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

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


def training_pairs(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str = "", layer: str = "final", objects: str = "box-mean") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(phrases [N, D], objects [N, D_o], image [N]): every annotated object of the suite's
    images, once per distinct image, its object embedding from ``objects`` (box means of
    ``layer``'s grid, or the re-encoded crops), and the position of its image among those
    images (for image-disjoint held-out splits)."""
    require_columns(manifest, ("object_names", "object_boxes"), suite)
    if "object_names" not in index:
        raise ValueError(f"the store has no object_names rows for {suite}: rerun `pipeline extract`")
    image_rows = index["image"].reshape(len(manifest), -1)[:, 0]
    _, first = np.unique(image_rows, return_index=True)
    first = np.sort(first[image_rows[first] >= 0])
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


def r_squared(P: torch.Tensor, Y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of the objects' (``Y``) variance the map explains."""
    resid = Y - (P @ W + b)
    return float(1 - resid.pow(2).sum() / (Y - Y.mean(0)).pow(2).sum())


def ranking_auc(P: torch.Tensor, Y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> float:
    """How often a mapped phrase is closer (cosine) to its own object than to another object
    of a different phrase, over every such pair: 1 is perfect, 0.5 chance."""
    S = F.normalize(P @ W + b, dim=-1) @ F.normalize(Y, dim=-1).T  # [N, N]
    other = (P @ P.T) < 1 - 1e-6  # pairs of different phrases
    return float(((S < S.diag()[:, None]) & other).sum() / other.sum().clamp_min(1))


def heldout_auc(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str, lam: float, layer: str = "final", objects: str = "box-mean") -> float:
    """Ranking AUC on every fifth training image of the map fitted on the others."""
    P, Y, image = training_pairs(store, manifest, index, suite, layer, objects)
    held = image % 5 == 4
    W, b = fit_ridge(P[~held], Y[~held], lam)
    return ranking_auc(P[held], Y[held], W, b)


def choose_layer(store: FeatureStore, manifest, index: dict[str, np.ndarray], suite: str, lam: float) -> tuple[str, dict[str, float]]:
    """The grid whose held-out ranking AUC is highest (every fifth image held out), and the
    AUC of each."""
    aucs = {layer: heldout_auc(store, manifest, index, suite, lam, layer) for layer in OBJECT_LAYERS}
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
        layer, aucs = "final", {"crops": heldout_auc(store, manifest, index, cfg.suite, cfg.lam, objects="crops")}
    else:
        layer, aucs = choose_layer(store, manifest, index, cfg.suite, cfg.lam)
    P, Y, _ = training_pairs(store, manifest, index, cfg.suite, layer, objects)
    W, b = fit_ridge(P, Y, cfg.lam)
    out = Path(cfg.out) / VARIANT
    out.mkdir(parents=True, exist_ok=True)
    save_file({"weight": W.contiguous(), "bias": b.contiguous()}, str(out / "model.safetensors"))
    record = {
        "variant": VARIANT,
        "ridge": asdict(cfg),
        "n_pairs": int(len(P)),
        "train_r2": r_squared(P, Y, W, b),
        "layer": layer,
        "objects": objects,
        "heldout_auc": aucs,
        "store_fingerprint": store.root.attrs.get("fingerprint_id"),
        "manifest_sha256": manifest_sha256,
        "scorer_kwargs": {"layer": layer, **({"objects": "crops"} if objects == "crops" else {})},
    }
    (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    return record
