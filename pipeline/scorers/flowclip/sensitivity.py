"""Flow-CLIP's patch-sensitivity pictures (seed ``flowclip.txt`` §4.7, "first-order changes
in gold–foil evidence increments along centered patch-feature directions"): the first-order
change of the gold-minus-foil margin per patch of the final grid, for a few items, read from
the cache through a trained scorer.

Why centred directions: ICER reads a patch only through its unit key ``v_p =
normalise(P_v^T g_p)``, which does not change when ``g_p`` is scaled, so ``∂m/∂g_p · g_p = 0``
exactly for every patch. Along the centred direction ``g_p − ḡ`` (``ḡ`` the mean valid
patch) the change is what moving a patch toward or away from the image's average does to
the margin; the per-patch changes sum to the margin's directional derivative along the
whole centred grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.features import ImageFeatures, TextFeatures
from pipeline.report.tasks import layout_for

# The items drawn: (suite, category or None for any), in order.
SENSITIVITY_ITEMS = (
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-sugarcrepe", "swap-att"),
    ("shapes-sugarcrepe", "swap-obj"),
    ("shapes-whatsup", None),
)


def patch_sensitivity(
    scorer, image: ImageFeatures, gold: TextFeatures, foil: TextFeatures, centre: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-order change of the margin ``m = s(I, gold) − s(I, foil)`` per final-grid patch.

    ``Δ_p = ∂m/∂g_p · δ_p`` with ``δ_p = g_p − ḡ`` (``centre``; ``ḡ`` the mean valid patch
    of the image) or ``δ_p = g_p``, for the final-layer grid ``g`` (after ``ln_post``, CLS
    excluded). ``Σ_p Δ_p`` is the directional derivative ``d/dt m(g + t δ)`` at ``t = 0``.
    Without centring every ``Δ_p`` is 0 for Flow-CLIP (its patch keys are unit vectors:
    see the module docstring). Padded (all-zero) patches get 0.

    Args:
        scorer: a per-caption scorer (``score(image, text) -> [B]``), e.g. ``FlowClip``.
        image: B images (``final`` [B, R, d_v] is differentiated; nothing else is).
        gold: B true captions, one per image.
        foil: B negative captions, one per image.
        centre: use centred patch directions.

    Returns:
        [B, R] per-patch changes and [B] margins.
    """
    g = image.final.detach().float().clone().requires_grad_(True)  # [B, R, d_v]
    img = ImageFeatures(image.early, g, image.cls, image.embed)
    with torch.enable_grad():
        margin = scorer.score(img, gold) - scorer.score(img, foil)  # [B]
        (grad,) = torch.autograd.grad(margin.sum(), g)  # [B, R, d_v]; items are independent
    g = g.detach()
    valid = (g.abs().amax(-1) > 0).to(g.dtype)[..., None]  # [B, R, 1]
    mean = (g * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp_min(
        1.0
    )  # [B, 1, d_v]
    direction = (g - mean if centre else g) * valid  # [B, R, d_v]
    return (grad * direction).sum(-1), margin.detach()  # [B, R], [B]


def icer_is_zero(scorer) -> bool:
    """Whether ``scorer`` has no ICER branch or ICER's weight W is 0 (the initialisation),
    where ICER is identically 0 and every patch's change of the margin is 0."""
    icer = getattr(scorer, "icer", None)
    return icer is None or not bool(icer.W.detach().any())


def sensitivity_items(
    results: dict[str, Any], variant: str = "flowclip"
) -> list[tuple[str, int, int, int]]:
    """The items of the patch-sensitivity pictures: for each entry of
    :data:`SENSITIVITY_ITEMS`, the first item of that suite and category (manifest order) not
    yet taken, as ``(suite, item, gold option, foil option)``; the foil is ``variant``'s
    highest-scoring wrong option (the other caption of a two-way item)."""
    out: list[tuple[str, int, int, int]] = []
    layout = layout_for(results)
    for role, category in SENSITIVITY_ITEMS:
        suite = layout.suite(role)
        entry = results.get(suite) if suite else None
        if not entry or variant not in entry["scores"]:
            continue
        m = entry["manifest"]
        rows = (
            np.arange(len(m))
            if category is None
            else np.flatnonzero(m["category"].to_numpy() == category)
        )
        taken = {i for s, i, _, _ in out if s == suite}
        left = [int(i) for i in rows if int(i) not in taken]
        if not left:
            continue
        i = left[0]
        gold = int(m["correct"].iloc[i])
        s = np.array(entry["scores"][variant][i], dtype=float)  # [K]
        s[gold] = -np.inf
        s[np.isnan(s)] = -np.inf
        out.append((suite, i, gold, int(np.argmax(s))))
    return out


def patch_maps(
    scorer, store, results: dict[str, Any], items: list[tuple[str, int, int, int]]
) -> list[dict[str, Any]]:
    """:func:`patch_sensitivity` (centred) of ``items`` (:func:`sensitivity_items`), read from
    the store through each suite's index (cut, like the report's manifest, to the items whose
    images were extracted): per item its suite, row, image path, category, gold
    and foil captions, margin, ``map`` ([grid_h, grid_w] per-patch changes) and ``total``
    (their sum). Items of suites the store lacks are skipped."""
    from pipeline.benchmarks.base import extracted_items
    from pipeline.scoring import item_image_rows

    gh, gw = store.dims.grid
    out = []
    for suite in dict.fromkeys(s for s, *_ in items):
        if suite not in store.suites():
            continue
        picked = [(i, a, b) for s, i, a, b in items if s == suite]
        manifest: pd.DataFrame = results[suite]["manifest"]
        index = store.suite_index(suite)
        kept = extracted_items(index)  # the report's manifest holds the scored items only
        if int(kept.sum()) != len(manifest):
            raise ValueError(
                f"{suite}: the store holds {int(kept.sum())} items with images, the report's manifest "
                f"{len(manifest)}; rerun `pipeline extract` and `pipeline score`"
            )
        index = {k: np.asarray(v)[kept] for k, v in index.items()}
        rows = np.array([i for i, _, _ in picked])
        caps = index["captions"][rows]  # [b, K]
        k = np.arange(len(rows))
        gold_opt, foil_opt = (
            np.array([a for _, a, _ in picked]),
            np.array([b for _, _, b in picked]),
        )
        delta, margin = patch_sensitivity(
            scorer,
            store.images(item_image_rows(index)[rows]),
            store.texts(caps[k, gold_opt]),
            store.texts(caps[k, foil_opt]),
        )
        for j, (i, a, b) in enumerate(picked):
            row = manifest.iloc[i]
            out.append(
                {
                    "suite": suite,
                    "item": i,
                    "image": row["image"],
                    "category": str(row["category"]),
                    "gold": row["captions"][a],
                    "foil": row["captions"][b],
                    "margin": float(margin[j]),
                    "map": delta[j].reshape(gh, gw).numpy(),
                    "total": float(delta[j].sum()),
                }
            )
    order = {(s, i): n for n, (s, i, _, _) in enumerate(items)}
    return sorted(out, key=lambda r: order[(r["suite"], r["item"])])
