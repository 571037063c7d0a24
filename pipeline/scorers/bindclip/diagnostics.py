"""Why BindCLIP wins or loses on a slice: its score taken apart, and how well it grounds words.

    from pipeline.scorers.bindclip.diagnostics import energy_breakdowns, grounding_precision
    rows = energy_breakdowns(scorer, store, manifest, index, "shapes-sugarcrepe")["category"]
    table = grounding_precision(scorer, data)         # data: training.load_grounded(store, suite)
    stats = attribute_binding(scorer, store, manifest, index)   # shapes-sugarcrepe swap-att

``energy_breakdowns`` scores every (true caption, negative) pair of a choice suite once with
``BindClip.explain`` and reports, per category: how often the score ``s``, the frozen
margin ``g`` alone and the learned part ``s - g`` prefer the true caption, and for each
energy k its contribution ``exp(lambda_k) * move_k``: the share of pairs where it points
to the true caption, its mean absolute size (in logits, comparable with ``|g|``) and the
mean consensus contraction gamma_k. An energy that carries a slice has a large share and
a large size; one that only adds noise has a share near 0.5 and a large size.

``grounding_precision`` measures, for every caption word that names exactly one object
(the region-grounding targets of shapes-dev), the share of the word's plan mass that lies
in that object's box (per depth, non-null cells only) and how often the word's most
compatible patch (argmax of S) lies in it, by word kind (colour, shape, size, other).
The box covers about 7% of the 8x8 grid, which is what a uniform plan would put there.

``attribute_binding`` asks whether the plan binds colours to shapes on attribute swaps:
each colour / shape word's plan mass on its referent's visible patches in the true and
the negative caption, the co-location of adjacent colour-shape rows, and how often it
and the order energy prefer the true caption (see its docstring).

The coupling pictures' data (each edited word's plan row) is
:mod:`pipeline.scorers.bindclip.coupling`'s.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.world.captions import relation_of
from pipeline.world.families import edit_kinds
from pipeline.world.scenes import COLOURS, SHAPES, SIZES

WORD_KINDS = ("colour", "shape", "size", "other")


def _pairs(manifest: pd.DataFrame, index: dict[str, np.ndarray], keys: tuple[str, ...]) -> pd.DataFrame:
    """One row per (item, negative option): store rows of image, true and negative caption,
    and per grouping key the group it is reported in (column ``group:<key>``; see
    :func:`energy_breakdowns`)."""
    unknown = set(keys) - {"category", "relation", "edit_kind"}
    if unknown:
        raise ValueError(f"by must be 'category', 'relation' or 'edit_kind', got {sorted(unknown)[0]!r}")
    caps = index["captions"]  # [n, K], -1 = no option
    correct = manifest["correct"].to_numpy().astype(np.int64)
    item, opt = np.nonzero(caps >= 0)
    keep = opt != correct[item]
    item, opt = item[keep], opt[keep]
    category = manifest["category"].to_numpy() if "category" in manifest else np.full(len(manifest), "all")
    columns = {
        "item": item,
        "image": index["image"][item, 0],
        "pos": caps[item, correct[item]],
        "neg": caps[item, opt],
        "group:category": category[item],
    }
    if "relation" in keys:
        group = category[item].astype(object)
        caps_text = manifest["captions"].to_numpy()
        for p, (i, j) in enumerate(zip(item, opt, strict=True)):
            t, n = relation_of(caps_text[i][correct[i]]), relation_of(caps_text[i][j])
            if t is not None:
                label = t if n in (t, None) else f"{t} vs {n}"
                group[p] = label if group[p] == t else f"{group[p]}: {label}"
        columns["group:relation"] = group
    if "edit_kind" in keys:
        columns["group:edit_kind"] = edit_kinds(manifest)[item]
    return pd.DataFrame(columns)


@torch.no_grad()
def energy_breakdowns(
    scorer,
    store,
    manifest: pd.DataFrame,
    index: dict[str, np.ndarray],
    suite: str,
    by: tuple[str, ...] = ("category",),
    batch_size: int = 256,
) -> dict[str, list[dict[str, Any]]]:
    """Per group of ``suite``: pair accuracy of s, g and s - g, and per energy its share
    of pairs pointing to the true caption (``*_share_true``), its mean absolute contribution
    in logits (``*_mean_abs``), the accuracy of s without it (``*_acc_without``) and its mean
    consensus contraction (``*_gamma``), for each grouping in ``by`` (every pair is scored
    once, whatever the groupings).

    Groupings: ``"category"``, the manifest's categories; ``"relation"``, the category
    plus the relations the two captions state (``"relation: left"`` for an ARO argument
    swap, ``"left vs below"`` for a What'sUp pair, whose category is the true relation);
    ``"edit_kind"``, shapes-train / shapes-dev pairs by
    :func:`pipeline.world.families.edit_kind`. Each row's ``category`` field holds its group.

    ``scorer`` is a ``BindClip`` (anything with ``explain`` returning margin, moves,
    scales and contraction). Rows of ``index["image"]`` equal to -1 (missing image) are
    skipped.
    """
    pairs = _pairs(manifest, index, tuple(by))
    pairs = pairs[pairs["image"] >= 0].reset_index(drop=True)
    score, margin, contrib, gamma = [], [], [], []
    for start in range(0, len(pairs), batch_size):
        b = pairs.iloc[start : start + batch_size]
        ex = scorer.explain(
            store.images(b["image"].to_numpy()), store.texts(b["pos"].to_numpy()), store.texts(b["neg"].to_numpy())
        )
        score.append(ex.score)
        margin.append(ex.margin)
        contrib.append(ex.moves * ex.scales)
        gamma.append(ex.contraction)
    if not score:
        return {key: [] for key in by}
    s, g = torch.cat(score), torch.cat(margin)
    c, gam = torch.cat(contrib), torch.cat(gamma)  # [P, 4]
    from pipeline.scorers.bindclip import ENERGIES

    out = {}
    for key in by:
        rows = []
        for group, grp in pairs.groupby(f"group:{key}", sort=True):
            i = torch.as_tensor(np.array(grp.index), dtype=torch.long)
            row: dict[str, Any] = {
                "suite": suite,
                "category": str(group),
                "pairs": len(i),
                "acc_s": float((s[i] > 0).float().mean()),
                "acc_margin": float((g[i] > 0).float().mean()),
                "acc_learned": float(((s[i] - g[i]) > 0).float().mean()),
                "mean_abs_margin": float(g[i].abs().mean()),
            }
            for k, name in enumerate(ENERGIES):
                row[f"{name}_share_true"] = float((c[i, k] > 0).float().mean())
                row[f"{name}_mean_abs"] = float(c[i, k].abs().mean())
                row[f"{name}_acc_without"] = float(((s[i] - c[i, k]) > 0).float().mean())  # s less this energy
                row[f"{name}_gamma"] = float(gam[i, k].mean())
            rows.append(row)
        out[key] = rows
    return out


def word_kind(word: str) -> str:
    """``colour``, ``shape``, ``size`` or ``other`` for a decoded shapes-world token."""
    if word in COLOURS:
        return "colour"
    if word in SHAPES:
        return "shape"
    return "size" if word in SIZES else "other"


@torch.no_grad()
def grounding_precision(scorer, data, batch_size: int = 256) -> pd.DataFrame:
    """In-box plan mass and S-argmax hit rate of grounded words, by word kind and depth.

    ``data``: :func:`pipeline.scorers.bindclip.training.load_grounded`'s; every grounded
    word of each item's true caption is scored in its item's (I, pos, neg) plan.
    """
    from open_clip.tokenizer import _tokenizer

    pairs, gmap = data.pairs, data.pos
    if gmap is None:
        return pd.DataFrame()
    n_items = len(pairs)
    counts = np.diff(gmap.offsets)
    if counts.sum() == 0:
        return pd.DataFrame()
    L = 2
    in_box, hit, kinds, share = [], [], [], []
    for start in range(0, n_items, batch_size):
        items = torch.arange(start, min(start + batch_size, n_items))
        ex = scorer.explain(
            pairs.images.index(pairs.image[items]),
            pairs.texts.index(pairs.pos[items]),
            pairs.texts.index(pairs.neg[items]),
        )
        lo, hi = gmap.offsets[start], gmap.offsets[items[-1] + 1]
        if hi == lo:
            continue
        item = torch.from_numpy(np.repeat(np.arange(len(items)), counts[items.numpy()]))  # [M]
        row, cells = gmap.row[lo:hi], gmap.cells[lo:hi]  # [M], [M, R]
        keep = row < ex.ids.shape[-1]  # a token beyond the scorer's truncation has no row (rows past it are the negative's)
        item, row, cells = item[keep], row[keep], cells[keep]
        if not len(item):
            continue
        R = cells.shape[1]
        plan = ex.plan[item, row, :-1].reshape(-1, L, R)  # [M, L, R] non-null cells
        inside = cells[:, None].float()  # [M, 1, R]
        in_box.append((plan * inside).sum(-1) / plan.sum(-1).clamp_min(1e-12))  # [M, L]
        best = ex.S[item, row].argmax(-1)  # [M, L]
        hit.append(torch.gather(cells, 1, best).float())  # [M, L]
        ids = ex.ids[item, 0, row]
        kinds += [word_kind(_tokenizer.decode([int(t)]).strip()) for t in ids]
        share.append(cells.float().mean(-1))  # [M] the box's share of the grid
    if not kinds:
        return pd.DataFrame()
    frac, top, area = torch.cat(in_box).numpy(), torch.cat(hit).numpy(), torch.cat(share).numpy()
    kinds = np.array(kinds)
    out = []
    for kind in WORD_KINDS:
        m = kinds == kind
        if not m.any():
            continue
        out.append(
            {
                "word kind": kind,
                "words": int(m.sum()),
                "in-box mass (early)": float(frac[m, 0].mean()),
                "in-box mass (final)": float(frac[m, 1].mean()),
                "S argmax in box (early)": float(top[m, 0].mean()),
                "S argmax in box (final)": float(top[m, 1].mean()),
                "box share of the grid": float(area[m].mean()),
            }
        )
    return pd.DataFrame(out).set_index("word kind")


@torch.no_grad()
def explain_true_vs_negative(scorer, store, manifest: pd.DataFrame, index: dict[str, np.ndarray], items: np.ndarray):
    """``(correct, explanation)`` of ``s(I, true, negative)`` for rows ``items`` of a
    two-caption choice suite: the true option's number per item and ``BindClip.explain``."""
    correct = manifest["correct"].to_numpy().astype(np.int64)[items]
    caps = index["captions"][items]
    k = np.arange(len(items))
    ex = scorer.explain(
        store.images(index["image"][items, 0]), store.texts(caps[k, correct]), store.texts(caps[k, 1 - correct])
    )
    return correct, ex


def word_row(ex, j: int, block: int, caption: str, w: int) -> int | None:
    """Plan row of word ``w`` of ``caption`` (its first BPE piece) in item ``j`` of ``ex``,
    whose caption rows start at ``block`` (0 for A, N for B); None when truncated away."""
    from pipeline.world.grounding import word_token_positions

    pos = word_token_positions(caption, [w], max_tokens=ex.token_mask.shape[2])[0]
    return block + pos[0] - 1 if pos else None  # content rows start after sot


def patch_distribution(ex, j: int, row: int) -> torch.Tensor:
    """[R] a plan row's mass on the cells, both depths (early, final) summed, normalised."""
    cells = ex.plan[j, row, :-1].reshape(2, -1).sum(0)
    return cells / cells.sum().clamp_min(1e-12)


def unique_referent(objects: list[dict], word: str) -> int | None:
    """Index of the one object of a scene (manifest ``scene`` objects) whose colour, shape or
    size is ``word``; None when no object or several have it, or ``word`` is no attribute."""
    kind = word_kind(word)
    hits = [o for o, ob in enumerate(objects) if kind != "other" and ob.get(kind) == word]
    return hits[0] if len(hits) == 1 else None


@torch.no_grad()
def attribute_binding(scorer, store, manifest: pd.DataFrame, index: dict[str, np.ndarray], category: str = "swap-att") -> dict[str, Any]:
    """How the plan binds colours to shapes on attribute swaps (true vs negative caption).

    For every item of ``category`` (``manifest`` / ``index`` of a SugarCrepe-style suite
    with a ``scene`` column), each caption is read in the item's (I, true, negative) plan:

    * ``in_mask``: share of a colour / shape word's plan mass (non-null cells, depths
      summed) on the patches its referent's *visible* part covers (>= 1/4 of the patch,
      :func:`pipeline.world.grounding.visible_cover`) -- the referent being the one object of
      the scene with that colour / shape, which for the negative's colour word is the
      *other* object;
    * ``bc``: mean Bhattacharyya overlap of the depth-summed plan rows of adjacent
      ``colour shape`` words (the order energy's co-location, on the pairs that bind);
    * ``acc_bc``: how often the sum of those overlaps is larger for the true caption than
      for the negative; ``acc_order``: the same for the order energy itself (every
      adjacent pair, depths summed; the score reads its per-depth moves through consensus);
    * ``S own > other``: for the true caption's colour / shape words, how often the
      compatibility S (depths summed), averaged over the patches the referent owns (its
      visible part covers most of the patch, and at least half), exceeds its average over
      the patches the scene's other objects own -- the compatibility alone, before any plan.
    * ``acc_S_referent``: how often the sum over a caption's colour and shape words of S
      (depths averaged) averaged over the patches each word's referent owns is larger for
      the true caption than for the negative -- the same words read on the same objects,
      so only their context in the caption (a noun's state carries its adjective) differs:
      what a reader with perfect grounding would get from S.
    """
    from pipeline.scorers.bindclip import ENERGIES
    from pipeline.world.grounding import visible_cover

    items = np.flatnonzero(manifest["category"].to_numpy() == category)
    if not len(items) or "scene" not in manifest:
        return {}
    correct, ex = explain_true_vs_negative(scorer, store, manifest, index, items)
    n = ex.token_mask.shape[2]
    grid = tuple(ex.grid)
    in_mask = {(c, kind): [] for c in ("true", "negative") for kind in ("colour", "shape")}
    s_own = {"colour": [], "shape": []}
    bc = {"true": [], "negative": []}
    right_bc, right_order, right_referent = [], [], []
    for j, i in enumerate(items):
        objects = json.loads(manifest["scene"].iloc[i])["objects"]
        cover_frac = visible_cover(objects, grid)  # [n_obj, R]
        cover = torch.from_numpy(cover_frac >= 0.25)
        owner = torch.from_numpy(np.where(cover_frac.max(0) >= 0.5, cover_frac.argmax(0), -1))  # [R]
        totals, on_referent = {}, {"true": 0.0, "negative": 0.0}
        for which, opt, block in (("true", correct[j], 0), ("negative", 1 - correct[j], n)):
            cap = manifest["captions"].iloc[i][opt]
            words = cap.split()
            row_dist = {}
            for w, word in enumerate(words):
                kind = word_kind(word)
                row = word_row(ex, j, block, cap, w)
                if kind not in ("colour", "shape") or row is None:
                    continue
                row_dist[w] = patch_distribution(ex, j, row)  # [R] depths summed
                ref = unique_referent(objects, word)
                if ref is not None:
                    in_mask[(which, kind)].append(float(row_dist[w][cover[ref]].sum()))
                    own, other = owner == ref, (owner >= 0) & (owner != ref)
                    if own.any():
                        on_referent[which] += float(ex.S[j, row][:, own].mean())
                    if which == "true" and own.any() and other.any():
                        S = ex.S[j, row].sum(0)  # [R] depths summed
                        s_own[kind].append(bool(S[own].mean() > S[other].mean()))
            pairs = [
                float(torch.sqrt(row_dist[w] * row_dist[w + 1]).sum())
                for w in range(len(words) - 1)
                if words[w] in COLOURS and words[w + 1] in SHAPES and w in row_dist and w + 1 in row_dist
            ]
            bc[which] += pairs
            totals[which] = sum(pairs)
        right_bc.append(totals["true"] > totals["negative"])
        right_referent.append(on_referent["true"] > on_referent["negative"])
        order = ex.energies[j, :, ENERGIES.index("order")]
        right_order.append(bool(order[0] > order[1]))
    out: dict[str, Any] = {"category": category, "items": len(items)}
    for (which, kind), v in in_mask.items():
        out[f"in_mask {kind} ({which})"] = float(np.mean(v)) if v else float("nan")
    for which, v in bc.items():
        out[f"bc colour-shape ({which})"] = float(np.mean(v)) if v else float("nan")
    for kind, v in s_own.items():
        out[f"S own > other {kind}"] = float(np.mean(v)) if v else float("nan")
    out["acc_bc"] = float(np.mean(right_bc))
    out["acc_order"] = float(np.mean(right_order))
    out["acc_S_referent"] = float(np.mean(right_referent))
    return out


PLANAR = {"left of": (0, -1), "right of": (0, 1), "above": (1, -1), "below": (1, 1)}  # axis (x, y down), sign of subject - object


def _centroid(rows: list[torch.Tensor], coords: torch.Tensor) -> torch.Tensor:
    """[2] centroid of the summed plan rows ([R] each) over the patch centres [R, 2]."""
    mass = torch.stack(rows).sum(0)
    return (mass / mass.sum().clamp_min(1e-12)) @ coords


@torch.no_grad()
def argument_swaps(scorer, store, manifest: pd.DataFrame, index: dict[str, np.ndarray], category: str = "relation") -> list[dict[str, Any]]:
    """Where planar argument swaps ("A left of B" vs "B left of A") are won or lost: in the
    plan, or in the energies read from it.

    For each item of ``category`` whose ``relation_name`` is left of / right of / above /
    below (shapes-aro: the shape words are the shapes world's), each caption is read in the item's (I, true, negative) plan
    (rows over the non-null cells, depths summed); a reading *picks the true caption* when
    it agrees with the true caption's claim and disagrees with the negative's:

    * ``shapes``: the plan centroids of the caption's two shape words (subject, then
      object) along the relation's axis -- what a relation reader with this plan could get;
    * ``spans``: the centroids of the tokens before and after the relation word, each
      token weighted by its mass off the null patch (times its span gate, where the scorer
      has one) -- what the spatial energy's relative term reads for the relation word
      (every other token's term reads its own spans);
    * ``learned`` and ``s``: the learned part ``s - g`` and the score ``s`` prefer the true
      caption.

    Returns one row per relation and one ``"all"`` row: ``relation``, ``items`` and the
    four rates; for a scorer with ``span_gate`` also ``gate <kind>``, the mean span gate of
    the true caption's colour, shape and size words, its relation word and its other words
    (what the spans weight: see ``BindClipConfig.span_gate``).
    """
    from pipeline.scorers.bindclip.model import patch_coords

    if "relation_name" not in manifest:
        return []
    relation = manifest["relation_name"].astype(str).to_numpy()
    items = np.flatnonzero((manifest["category"].to_numpy() == category) & np.isin(relation, list(PLANAR)))
    if not len(items):
        return []
    correct, ex = explain_true_vs_negative(scorer, store, manifest, index, items)
    coords = patch_coords(tuple(ex.grid)).double()  # [R, 2]
    n = ex.token_mask.shape[2]
    gates = None if ex.span_gate is None else ex.span_gate.reshape(len(items), 2 * n)  # [B, 2N] by plan row
    rows = []
    for j, i in enumerate(items):
        axis, sign = PLANAR[relation[i]]
        says: dict[str, tuple[bool, bool]] = {}
        gate_by_kind: dict[str, list[float]] = {}
        for which, opt, block in (("true", correct[j], 0), ("negative", 1 - correct[j], n)):
            cap = manifest["captions"].iloc[i][opt]
            words = cap.split()
            if relation[i].split()[0] not in words:  # a caption that words the relation otherwise
                break
            cells = {}
            k = words.index(relation[i].split()[0])
            for w in range(len(words)):
                row = word_row(ex, j, block, cap, w)
                if row is not None:
                    cells[w] = ex.plan[j, row, :-1].reshape(2, -1).sum(0).double()  # [R] depths summed
                    if gates is not None:  # the span weight is the mass times the gate
                        cells[w] = cells[w] * float(gates[j, row])
                        if which == "true":
                            kind = "relation" if w == k else word_kind(words[w])
                            gate_by_kind.setdefault(kind, []).append(float(gates[j, row]))

            shapes = [w for w, word in enumerate(words) if word_kind(word) == "shape" and w in cells]
            by_shapes = len(shapes) == 2 and bool(
                sign * (_centroid([cells[shapes[0]]], coords) - _centroid([cells[shapes[1]]], coords))[axis] > 0
            )
            before = [cells[w] for w in range(k) if w in cells]
            after = [cells[w] for w in range(k + 1, len(words)) if w in cells]
            by_spans = bool(before and after) and bool(
                sign * (_centroid(before, coords) - _centroid(after, coords))[axis] > 0
            )
            says[which] = (by_shapes, by_spans)
        if len(says) < 2:
            continue
        rows.append({
            "relation": relation[i],
            "shapes": says["true"][0] and not says["negative"][0],
            "spans": says["true"][1] and not says["negative"][1],
            "learned": bool(ex.score[j] - ex.margin[j] > 0),
            "s": bool(ex.score[j] > 0),
            **{f"gate {kind}": float(np.mean(g)) for kind, g in gate_by_kind.items()},
        })  # fmt: skip
    if not rows:
        return []
    df = pd.DataFrame(rows)
    rates = ["shapes", "spans", "learned", "s"] + [f"gate {kind}" for kind in (*WORD_KINDS[:3], "relation", "other") if f"gate {kind}" in df]

    def means(g: pd.DataFrame) -> dict[str, float | None]:  # None where no item has the word kind (valid JSON)
        return {c: None if pd.isna(v := g[c].mean()) else float(v) for c in rates}

    out = [{"relation": rel, "items": len(g), **means(g)} for rel, g in df.groupby("relation", sort=False)]
    return out + [{"relation": "all", "items": len(df), **means(df)}]
