"""Probes of the cached features: what the frozen backbone's patch grids encode.

A scorer over frozen features can only read what the features hold. These probes bound
that from above with the shapes world's ground truth (each object's visible patches,
:func:`pipeline.world.grounding.visible_cover`), independently of any scorer's grounding:

* ``colour``: a linear probe (multinomial logistic regression) of the colour of the object
  that covers a patch, trained on patches of ``shapes-train`` images, accuracy on held-out
  patches; then the **swap-attribute ceiling**: on shapes-sugarcrepe swap-att, the probe's
  mean log-probability over each named object's *true* visible patches, summed over the two
  objects whose colours the negative exchanges, for the true binding vs the swapped one --
  the accuracy of a reader with perfect grounding.
* ``depth``: a linear probe of "this patch belongs to the object in front" vs "... behind"
  on the overlapping pairs of the ``shapes-train`` depth family (each image and its
  counterfactual, which only swaps the drawing order), then the **front/behind ceiling** on
  shapes-aro relation items with "in front of" / "behind": the object whose visible
  patches have the larger mean probe logit is called the front one. A geometric reader is
  given the same perfect masks: the object with the larger visible area, or spread.
* ``text``: a linear probe of the colour word just before a shape word, read from the shape
  word's final token state (``shapes-train`` captions, held-out 20% of the captions), and
  of the shape word itself as a reference: whether the text tower writes an adjective into
  its noun's state, the contextual signal an attribute-binding scorer can read from S.

Run by ``pipeline probes`` (``reports/probes.json``). Patches count for an
object when its visible part covers more than half of them.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.cache import FeatureStore, distinct_rows
from pipeline.manifests import read_manifest
from pipeline.world.grounding import visible_cover

DEPTHS = ("early", "final")
_OWN = 0.5  # a patch belongs to an object whose visible part covers more than this


class LinearProbe:
    """Multinomial logistic regression on standardised features (full-batch L-BFGS, L2)."""

    def __init__(self, l2: float = 1e-3, max_iter: int = 300) -> None:
        self.l2, self.max_iter = l2, max_iter

    def fit(self, X: np.ndarray, y: np.ndarray) -> LinearProbe:
        X = torch.as_tensor(X, dtype=torch.float32)
        y = torch.as_tensor(y, dtype=torch.long)
        self.mu, self.sd = X.mean(0), X.std(0) + 1e-6
        Xn = (X - self.mu) / self.sd
        k = int(y.max()) + 1
        self.W = torch.zeros(X.shape[1], k, requires_grad=True)
        self.b = torch.zeros(k, requires_grad=True)
        opt = torch.optim.LBFGS([self.W, self.b], max_iter=self.max_iter, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(Xn @ self.W + self.b, y)
            loss = loss + self.l2 * (self.W**2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return self

    def log_proba(self, X: np.ndarray) -> np.ndarray:
        """[n, k] log-probabilities."""
        with torch.no_grad():
            Xn = (torch.as_tensor(X, dtype=torch.float32) - self.mu) / self.sd
            return torch.log_softmax(Xn @ self.W + self.b, -1).numpy()

    def accuracy(self, X: np.ndarray, y: np.ndarray) -> float:
        return float((self.log_proba(X).argmax(-1) == np.asarray(y)).mean())


def _suite(store: FeatureStore, suite: str) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    return read_manifest(store.suite_attrs(suite)["manifest"]), store.suite_index(suite)


def _grids(store: FeatureStore, rows: np.ndarray) -> dict[str, np.ndarray]:
    """{depth: [n, R, d_v]} the early and final patch grids of image rows."""
    im = store.images(np.asarray(rows))
    return {"early": im.early.numpy(), "final": im.final.numpy()}


def colour_probe(store: FeatureStore, n_train_images: int = 1600, seed: int = 0) -> dict[str, Any]:
    """Colour of the covering object from one patch; the swap-att ceiling (module doc)."""
    from pipeline.world.scenes import COLOURS

    colours = list(COLOURS)
    grid = store.dims.grid
    m, index = _suite(store, "shapes-train")
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(m), size=min(n_train_images, len(m)), replace=False))
    grids = _grids(store, index["image"][pick, 0])
    img, patch, label = [], [], []
    for k, i in enumerate(pick):
        objects = json.loads(m["scene"].iloc[i])["objects"]
        cover = visible_cover(objects, grid)  # [n_obj, R]
        owner = cover.argmax(0)
        for p in np.flatnonzero(cover.max(0) > _OWN):
            img.append(k), patch.append(p), label.append(colours.index(objects[owner[p]]["colour"]))
    img, patch, label = np.array(img), np.array(patch), np.array(label)
    held = np.isin(img, np.arange(len(pick))[int(0.8 * len(pick)) :])  # last 20% of images

    sc, sidx = _suite(store, "shapes-sugarcrepe")
    items = np.flatnonzero(sc["category"].to_numpy() == "swap-att")
    test = _grids(store, sidx["image"][items, 0])
    pairs = []  # (item k, weights of the two swapped objects [2, R], their colours)
    for k, i in enumerate(items):
        row = sc.iloc[i]
        pos, neg = row["captions"][row["correct"]], row["captions"][1 - row["correct"]]
        objects = json.loads(row["scene"])["objects"]
        named = [j for j, o in enumerate(objects) if f"{o['colour']} {o['shape']}" in pos and f"{o['colour']} {o['shape']}" not in neg]
        if len(named) == 2:
            cover = visible_cover(objects, grid)[named]  # [2, R]
            w = cover / cover.sum(1, keepdims=True).clip(1e-9)
            pairs.append((k, w, [colours.index(objects[j]["colour"]) for j in named]))
    out: dict[str, Any] = {"train_patches": int((~held).sum()), "heldout_patches": int(held.sum())}
    for depth in (*DEPTHS, "both"):
        X = np.concatenate([grids[d] for d in DEPTHS], -1) if depth == "both" else grids[depth]
        Xt = np.concatenate([test[d] for d in DEPTHS], -1) if depth == "both" else test[depth]
        probe = LinearProbe().fit(X[img[~held], patch[~held]], label[~held])
        right = 0
        for k, w, (ca, cb) in pairs:
            lp = probe.log_proba(Xt[k])  # [R, colours]
            true = w[0] @ lp[:, ca] + w[1] @ lp[:, cb]
            swapped = w[0] @ lp[:, cb] + w[1] @ lp[:, ca]
            right += int(true > swapped)
        out[depth] = {
            "patch_accuracy": probe.accuracy(X[img[held], patch[held]], label[held]),
            "swap_att_ceiling": right / max(len(pairs), 1),
            "swap_att_items": len(pairs),
        }
    out["chance_patch_accuracy"] = float(np.bincount(label).max() / len(label))
    return out


def _front_back(objects: list[dict], grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """Visible cover [R] of the front and the back object of the scene's overlapping pair."""
    full = [visible_cover([o], grid)[0].sum() for o in objects]  # each polygon's area alone
    for i in range(len(objects)):
        for j in range(i + 1, len(objects)):
            if visible_cover([objects[i], objects[j]], grid).sum() < full[i] + full[j] - 1e-9:
                cover = visible_cover(objects, grid)  # the pair overlaps: one hides the other
                f, b = (i, j) if objects[i]["z"] > objects[j]["z"] else (j, i)
                return cover[f], cover[b]
    return None


def _require(items: list, where: str, role: str) -> None:
    """Refuse a probe without items: a world too small to hold any (e.g. a handful of ARO items)."""
    if not items:
        raise ValueError(
            f"the front/behind probe has no {role} item: {where} hold no pair of overlapping objects "
            "in this world; build a larger one (world.n_train, world.n_aro) before `pipeline probes`"
        )


def depth_probe(store: FeatureStore) -> dict[str, Any]:
    """Front vs behind from one patch; the ARO front/behind ceiling (module doc)."""
    grid = store.dims.grid
    m, index = _suite(store, "shapes-train")
    fam = np.flatnonzero(m["family"].to_numpy() == "depth")
    covers, rows = [], []
    for col, scene in (("image", "scene"), ("cf_image", "cf_scene")):
        for i in fam:
            fb = _front_back(json.loads(m[scene].iloc[i])["objects"], grid)
            if fb is not None:
                covers.append(fb), rows.append(index[col][i, 0])
    _require(covers, "shapes-train's depth family", "training")
    grids = _grids(store, np.array(rows))
    front = np.stack([c[0] for c in covers])  # [n, R]
    back = np.stack([c[1] for c in covers])

    aro, aidx = _suite(store, "shapes-aro")
    sel = np.flatnonzero(
        (aro["category"].to_numpy() == "relation") & aro["relation_name"].isin(["in front of", "behind"]).to_numpy()
    )
    t_cov, t_rows = [], []
    for i in sel:
        fb = _front_back(json.loads(aro["scene"].iloc[i])["objects"], grid)
        if fb is not None:
            t_cov.append(fb), t_rows.append(aidx["image"][i, 0])
    _require(t_cov, "shapes-aro's in front of / behind relations", "test")
    test = _grids(store, np.array(t_rows))
    t_front = np.stack([c[0] for c in t_cov])
    t_back = np.stack([c[1] for c in t_cov])

    def item_accuracy(logit: np.ndarray, f: np.ndarray, b: np.ndarray) -> float:
        mean = lambda w: (logit * w).sum(1) / w.sum(1).clip(1e-9)  # noqa: E731
        return float((mean(f) > mean(b)).mean())

    def spread(w: np.ndarray) -> np.ndarray:
        gh, gw = grid
        y, x = np.divmod(np.arange(gh * gw), gw)
        w = w / w.sum(1, keepdims=True)
        mx, my = w @ x, w @ y
        return (w * ((x[None] - mx[:, None]) ** 2 + (y[None] - my[:, None]) ** 2)).sum(1)

    out: dict[str, Any] = {
        "train_images": len(rows),
        "aro_items": len(t_rows),
        "geometry_ceiling": {
            "larger_visible_area": float((t_front.sum(1) > t_back.sum(1)).mean()),
            "larger_visible_spread": float((spread(t_front) > spread(t_back)).mean()),
        },
    }
    for depth in (*DEPTHS, "both"):
        X = np.concatenate([grids[d] for d in DEPTHS], -1) if depth == "both" else grids[depth]
        Xt = np.concatenate([test[d] for d in DEPTHS], -1) if depth == "both" else test[depth]
        f_idx, b_idx = np.nonzero(front > _OWN), np.nonzero(back > _OWN)
        feats = np.concatenate([X[f_idx], X[b_idx]])
        label = np.r_[np.ones(len(f_idx[0]), int), np.zeros(len(b_idx[0]), int)]
        probe = LinearProbe().fit(feats, label)
        lp = probe.log_proba(Xt.reshape(-1, Xt.shape[-1]))
        logit = (lp[:, 1] - lp[:, 0]).reshape(len(t_rows), -1)
        out[depth] = {
            "train_patch_accuracy": probe.accuracy(feats, label),
            "front_behind_ceiling": item_accuracy(logit, t_front, t_back),
        }
    return out


def text_probe(store: FeatureStore, max_captions: int = 6000, seed: int = 0) -> dict[str, Any]:
    """The preceding colour word from a shape word's token state (module doc)."""
    from open_clip.tokenizer import _tokenizer

    from pipeline.world.scenes import COLOURS, SHAPES

    def one_piece(words) -> dict[int, int]:
        ids = {w: _tokenizer.encode(w) for w in words}
        return {t[0]: k for k, (w, t) in enumerate(ids.items()) if len(t) == 1}

    colour_of, shape_of = one_piece(COLOURS), one_piece(SHAPES)
    _, index = _suite(store, "shapes-train")
    rows = distinct_rows(index["captions"])[0]  # manifest order, not the store's row layout
    rows = np.random.default_rng(seed).permutation(rows)[:max_captions]  # held out: the last 20%
    texts = store.texts(rows)
    ids, states = texts.ids.numpy(), texts.tokens.float().numpy()
    prev, cur = ids[:, :-1], ids[:, 1:]
    cap, pos = np.nonzero(np.isin(cur, list(shape_of)) & np.isin(prev, list(colour_of)))
    pos = pos + 1  # the shape word's position
    X = states[cap, pos]
    colour = np.array([colour_of[t] for t in ids[cap, pos - 1]])
    shape = np.array([shape_of[t] for t in ids[cap, pos]])
    held = cap >= np.quantile(np.arange(len(rows)), 0.8)  # the last 20% of captions
    out: dict[str, Any] = {"train_nouns": int((~held).sum()), "heldout_nouns": int(held.sum())}
    for name, y in (("preceding_colour", colour), ("own_shape", shape)):
        probe = LinearProbe().fit(X[~held], y[~held])
        out[name] = {
            "accuracy": probe.accuracy(X[held], y[held]),
            "chance": float(np.bincount(y[held]).max() / held.sum()),
        }
    return out


def probes(store: FeatureStore) -> dict[str, Any]:
    """Every probe on one store (``pipeline bench probes``)."""
    return {"colour": colour_probe(store), "depth": depth_probe(store), "text": text_probe(store)}
