"""Training a pairwise scorer from the feature cache (methods.md §1.6, seed bindclip §2.4).

    from pipeline.training import train_scorer
    summary = train_scorer(cfg, store)            # cfg: TrainConfig, store: FeatureStore

The frozen features of the training and development suites are read from the store ONCE
(sorted unique rows, one read per array) and kept in memory in fp16; each step gathers a
batch from memory. A step scores, in one batched forward pass,

* ``(I, pos, neg)``          -> caption preference, structural sufficiency, grounding;
* ``(I', pos, neg)``         -> correct-vs-mismatched image (I' = counterfactual render);
* ``(flip I, flip pos, flip neg)`` -> reflection consistency against ``(I, pos, neg)``;
* ``(I, paraphrase, neg)``   -> paraphrase consistency against ``(I, pos, neg)``,

and minimises ``sum_k w_k * worst_group_tau(L_k)`` over the eight families (or, with
``cfg.group_by="edit_kind"``, over the pairs' edit kinds; :mod:`pipeline.objectives`;
``w_k = cfg.weights.get(k, 1)``, ``tau = cfg.group_tau``).
Two objectives of ours are off (weight 0) unless set: ``binding``
(:func:`~pipeline.objectives.binding_contrast`) and ``null``
(:func:`~pipeline.objectives.null_grounding`: the content tokens of words that name no
object, in both captions, to the null patch; shapes-world words, :func:`naming_tokens`).
Objectives with weight 0 are not computed; the two consistency objectives score an extra
copy of only the first ``consistency_items`` (16) items of each batch, to bound the step's
cost. Each step draws ``batch_size`` items without replacement from the items of the
current curriculum phase (all items by default) with the seeded generator.

``TrainConfig`` also sets ``consistency_items``, ``curriculum`` (``[[end_fraction,
[families]], ...]``), ``consistency_from`` (fraction of steps before which reflection
and paraphrase consistency are off), ``consistency_target`` (``"original"``: the original
item's score is the fixed target of the consistency terms), ``paraphrase_positives``
(the paraphrased copies also enter caption preference), ``flip_positives`` (the mirrored
copies too), ``relation_l1`` (weight of the
mean absolute relation-head output) and ``reflection_per_caption`` (reflection consistency
on each caption's scaled energies ``sum_k exp(lambda_k) E_k(X)`` instead of on ``s``: it
also pins what the pair difference leaves free, e.g. a rightward bias shared by "left" and
"right"). These were tried on the shapes world and are off by default
(``pipeline/scorers/bindclip.py`` has the figures). ``lr_schedule`` ``"cosine"``: linear
warm-up over ``warmup`` steps to ``lr``, then cosine decay to 0 at the last step
(:func:`pipeline.schedule.warmup_cosine`; each step's lr is in the log).

Selection *(ours)*: every ``eval_every`` steps (and at the last step) the development
suite is scored and the checkpoint with the best ``mean`` dev accuracy (the official
COCO-families metric: unweighted over families) is kept, ties to the earlier step. After
training, consensus ``q0`` is chosen on dev only from ``cfg.q0_grid`` for the selected
weights (ties to the grid value listed first).

Reproducibility: the scorer is initialised under ``torch.manual_seed(seed)`` and batches
are drawn from a ``torch.Generator`` seeded with ``seed``; a periodic ``resume.pt`` holds
model, optimiser, step, both RNG states, the log and the best checkpoint so far, so a
crashed run resumes to the same weights (if its config matches; it is removed at the end).

Layout under ``<cfg.out>/<variant>/``: ``seed<k>/{model.safetensors, config.json,
train_log.json}`` per seed; ``model.safetensors`` + ``config.json`` = the first seed's
selected model (what ``pipeline score`` loads); ``summary.json`` = per-seed dev metrics and
their spread. ``config.json["scorer_kwargs"]`` are the factory kwargs the scorer must be
built with at scoring time (``cfg.scorer`` plus the chosen ``q0``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pipeline.benchmarks import SUITES
from pipeline.benchmarks.coco_families import FAMILIES
from pipeline.cache import FeatureStore
from pipeline.config import TrainConfig
from pipeline.features import ImageFeatures, TextFeatures
from pipeline.manifests import file_sha256, read_manifest
from pipeline.objectives import (
    binding_contrast,
    box_cells,
    caption_preference,
    compatibility_contrast,
    consistency,
    image_contrast,
    null_grounding,
    object_cells,
    region_grounding,
    structural_sufficiency,
    word_token_positions,
    worst_group,
)
from pipeline.schedule import warmup_cosine
from pipeline.scorers import SCORERS, Scorer, create_scorer
from pipeline.world.families import edit_kinds as edit_kinds_of

OBJECTIVES = ("preference", "image", "sufficiency", "grounding", "reflection", "paraphrase", "binding", "null")
OFF_BY_DEFAULT = ("binding", "null")  # objectives of ours, not the paper's six: weight 0 unless params.yaml sets one
EVAL_BATCH = 256  # dev items per scoring forward pass
CONSISTENCY_ITEMS = TrainConfig.consistency_items  # see step_losses

# ---------------------------------------------------------------------------- data


@dataclass
class PairData:
    """One suite's [pos, neg] pairs with every feature a step needs, in memory (fp16).

    Item arrays index into ``images`` / ``texts`` (the suite's unique store rows, sorted);
    -1 marks a missing column value (e.g. no paraphrase).
    """

    manifest: Any  # pandas DataFrame of the suite
    images: ImageFeatures  # [U_i] unique images
    texts: TextFeatures  # [U_t] unique captions
    image: torch.Tensor  # [n] I
    cf: torch.Tensor  # [n] I' (counterfactual, the negative is true)
    flip: torch.Tensor  # [n] mirrored I
    pos: torch.Tensor  # [n]
    neg: torch.Tensor  # [n]
    flip_pos: torch.Tensor  # [n]
    flip_neg: torch.Tensor  # [n]
    para: torch.Tensor  # [n] paraphrase of pos
    family: torch.Tensor  # [n] index into FAMILIES
    g_offsets: np.ndarray  # [n+1] CSR offsets of each item's grounded tokens
    g_row: torch.Tensor  # [E] plan row of the token (content position - 1 in pos)
    g_cells: torch.Tensor  # [E, R] bool, patches of the token's object box
    # the same for the words of neg that alone name one object (rows within neg's block)
    ng_offsets: np.ndarray | None = None  # [n+1]
    ng_row: torch.Tensor | None = None  # [E']
    ng_cells: torch.Tensor | None = None  # [E', R]
    # with region="mask" or object_masks: the patches of the token's object's visible part and
    # of the scene's other objects (grounding's contrast and compatibility terms)
    g_other: torch.Tensor | None = None  # [E, R] bool
    ng_other: torch.Tensor | None = None  # [E', R] bool
    g_mask: torch.Tensor | None = None  # [E, R] bool
    ng_mask: torch.Tensor | None = None  # [E', R] bool
    # binding pairs: the same word, naming the same object in pos and in neg, after a
    # different word (CSR per item; rows within each caption's block)
    b_offsets: np.ndarray | None = None  # [n+1]
    b_pos_row: torch.Tensor | None = None  # [K]
    b_neg_row: torch.Tensor | None = None  # [K]
    b_cells: torch.Tensor | None = None  # [K, R] bool, the object's cells (visible if known)
    # the finer groups of the worst-group aggregate (``group_by="edit_kind"``): a group id
    # per item, one per distinct :func:`pipeline.world.families.edit_kind`
    edit_kind: torch.Tensor | None = None  # [n]

    def __len__(self) -> int:
        return len(self.image)


def _half(x: ImageFeatures | TextFeatures):
    cls = type(x)
    return cls(
        **{
            f.name: (v.half() if v.is_floating_point() else v)
            for f in dataclasses.fields(x)
            for v in [getattr(x, f.name)]
        }
    )


def _column(index: dict[str, np.ndarray], name: str, n: int, width: int = 1) -> np.ndarray:
    """[n, width] store rows of a suite column, -1 where absent."""
    if name not in index:
        return np.full((n, width), -1, dtype=np.int64)
    rows = np.asarray(index[name], dtype=np.int64)
    return rows.reshape(n, -1)


def load_pairs(
    store: FeatureStore,
    suite: str,
    grounding: bool = True,
    region: str = "box",
    object_masks: bool = False,
    edit_kinds: bool = False,
) -> PairData:
    """Read every feature of ``suite``'s pairs (one read per array) and the grounding map.

    ``region``: a grounded word's target cells, the patches of its object's ``"box"``
    (:func:`~pipeline.objectives.box_cells`) or of the object's visible part, ``"mask"``
    (:func:`~pipeline.objectives.object_cells`, from the manifest's ``scene``). With
    ``region="mask"`` or ``object_masks`` the object's visible patches and the other
    objects' are kept too (``g_mask``, ``g_other``). ``edit_kinds`` also keeps each pair's
    edit kind (``edit_kind``, for ``group_by="edit_kind"``).
    """
    if region not in ("box", "mask"):
        raise ValueError(f"grounding region must be 'box' or 'mask', got {region!r}")
    attrs = store.suite_attrs(suite) if suite in store.suites() else {}
    index = store.suite_index(suite)  # raises naming the extract command when absent
    path = Path(attrs.get("manifest", ""))
    if not path.is_file():
        raise FileNotFoundError(
            f"manifest of {suite} not found at {str(path)!r}; run `pipeline world`"
        )
    store.suite_index(suite, manifest_sha256=file_sha256(path))  # refuse a stale index
    m = read_manifest(path)
    n = len(m)
    if "family" not in m:
        raise ValueError(
            f"{suite} has no `family` column; train on shapes-train / coco-families style suites"
        )
    unknown = sorted(set(m["family"]) - set(FAMILIES))
    if unknown:
        raise ValueError(f"{suite}: unknown families {unknown}; valid: {', '.join(FAMILIES)}")

    correct = m["correct"].to_numpy().astype(np.int64)  # [n]
    caps = _column(index, "captions", n)  # [n, 2]
    pos, neg = caps[np.arange(n), correct], caps[np.arange(n), 1 - correct]
    fcaps = _column(index, "flip_captions", n, 2)
    fpos, fneg = fcaps[np.arange(n), correct], fcaps[np.arange(n), 1 - correct]
    img_cols = {c: _column(index, c, n)[:, 0] for c in ("image", "cf_image", "flip_image")}
    para = _column(index, "paraphrase", n)[:, 0]

    img_rows = np.unique(np.concatenate(list(img_cols.values())))
    img_rows = img_rows[img_rows >= 0]
    txt_rows = np.unique(np.concatenate([pos, neg, fpos, fneg, para]))
    txt_rows = txt_rows[txt_rows >= 0]
    images = _half(store.images(img_rows))  # one read per array, sorted unique rows
    texts = _half(store.texts(txt_rows))

    def local(rows: np.ndarray, uniq: np.ndarray) -> torch.Tensor:
        out = np.searchsorted(uniq, rows)
        return torch.from_numpy(np.where(rows >= 0, out, -1).astype(np.int64))

    # grounding: word indices -> BPE positions -> plan rows, boxes -> patch cells
    def grounding_map(which: np.ndarray, cap_rows: np.ndarray, positions: str, boxes: str):
        if not (grounding and positions in m):
            return [0] * (n + 1), [], []
        return _grounding_map(
            [c[which[i]] for i, c in enumerate(m["captions"])],
            list(m[positions]),
            list(m[boxes]),
            texts.ids[local(cap_rows, txt_rows)],
        )

    offsets, g_rows, g_boxes = grounding_map(correct, pos, "ground_positions", "ground_boxes")
    n_offsets, n_rows, n_boxes = grounding_map(
        1 - correct, neg, "neg_ground_positions", "neg_ground_boxes"
    )
    grid = store.dims.grid

    def cells(offsets: list[int], boxes: list) -> tuple[torch.Tensor, ...]:
        """(target cells, visible cells or None, other objects' cells or None) of every
        grounded word."""
        boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
        if not (region == "mask" or object_masks) or "scene" not in m:
            return box_cells(boxes, grid), None, None
        own, other = [box_cells(boxes[:0], grid)], [torch.zeros(0, grid[0] * grid[1], dtype=torch.bool)]
        for i in np.flatnonzero(np.diff(offsets)):  # items with grounded words
            objects = json.loads(m["scene"].iloc[i])["objects"]
            cells_i, other_i = object_cells(objects, boxes[offsets[i] : offsets[i + 1]], grid)
            own.append(cells_i)
            other.append(other_i)
        own, other = torch.cat(own), torch.cat(other)
        return (own if region == "mask" else box_cells(boxes, grid)), own, other

    g_cells, g_mask, g_other = cells(offsets, g_boxes)
    ng_cells, ng_mask, ng_other = cells(n_offsets, n_boxes)
    b_offsets, b_pos, b_neg = _binding_pairs(
        offsets, g_rows, g_boxes, n_offsets, n_rows, n_boxes,
        texts.ids[local(pos, txt_rows)], texts.ids[local(neg, txt_rows)],
    )
    g_obj = g_mask if g_mask is not None else g_cells
    kind_index = None
    if edit_kinds:  # edit_kinds_of raises naming the missing columns
        kind_index = torch.from_numpy(np.unique(edit_kinds_of(m).astype(str), return_inverse=True)[1]).long()

    return PairData(
        manifest=m,
        images=images,
        texts=texts,
        image=local(img_cols["image"], img_rows),
        cf=local(img_cols["cf_image"], img_rows),
        flip=local(img_cols["flip_image"], img_rows),
        pos=local(pos, txt_rows),
        neg=local(neg, txt_rows),
        flip_pos=local(fpos, txt_rows),
        flip_neg=local(fneg, txt_rows),
        para=local(para, txt_rows),
        family=torch.tensor([FAMILIES.index(f) for f in m["family"]], dtype=torch.long),
        g_offsets=np.asarray(offsets, dtype=np.int64),
        g_row=torch.tensor(g_rows, dtype=torch.long),
        g_cells=g_cells,
        ng_offsets=np.asarray(n_offsets, dtype=np.int64),
        ng_row=torch.tensor(n_rows, dtype=torch.long),
        ng_cells=ng_cells,
        g_other=g_other,
        ng_other=ng_other,
        g_mask=g_mask,
        ng_mask=ng_mask,
        b_offsets=np.asarray(b_offsets, dtype=np.int64),
        b_pos_row=torch.tensor([g_rows[e] for e in b_pos], dtype=torch.long),
        b_neg_row=torch.tensor([n_rows[f] for f in b_neg], dtype=torch.long),
        b_cells=g_obj[torch.tensor(b_pos, dtype=torch.long)],
        edit_kind=kind_index,
    )


def _binding_pairs(
    offsets: list[int],
    rows: list[int],
    boxes: list,
    n_offsets: list[int],
    n_rows: list[int],
    n_boxes: list,
    pos_ids: torch.Tensor,
    neg_ids: torch.Tensor,
) -> tuple[list[int], list[int], list[int]]:
    """CSR (offsets [n+1], pos entries [K], neg entries [K]) of binding pairs: a grounded
    token of pos and one of neg with the same BPE id and the same object box whose
    preceding tokens differ ("circle" in "a red circle" and in "a blue circle").
    ``pos_ids`` / ``neg_ids``: [n, C] stored ids (a row's token sits at position row + 1)."""
    out, pos_e, neg_e = [0], [], []
    for i in range(len(offsets) - 1):
        for e in range(offsets[i], offsets[i + 1]):
            for f in range(n_offsets[i], n_offsets[i + 1]):
                same = int(pos_ids[i, rows[e] + 1]) == int(neg_ids[i, n_rows[f] + 1])
                if same and list(boxes[e]) == list(n_boxes[f]) and int(pos_ids[i, rows[e]]) != int(neg_ids[i, n_rows[f]]):
                    pos_e.append(e)
                    neg_e.append(f)
        out.append(len(pos_e))
    return out, pos_e, neg_e


def objective_weight(weights: dict[str, float], name: str) -> float:
    """The weight of objective ``name``: as given, else 1 (0 for :data:`OFF_BY_DEFAULT`)."""
    return weights.get(name, 0.0 if name in OFF_BY_DEFAULT else 1.0)


def _batch_entries(offsets: np.ndarray, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR entries of the batch's items, in batch order: (entry indices [M], position
    of each entry's item within the batch [M])."""
    lo, hi = offsets[batch.numpy()], offsets[batch.numpy() + 1]
    ent = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)] or [np.zeros(0, int)])
    return torch.from_numpy(ent).long(), torch.from_numpy(np.repeat(np.arange(len(batch)), hi - lo))


def _grounding_map(
    captions: list[str], positions: list, boxes: list, ids: torch.Tensor
) -> tuple[list[int], list[int], list[list[float]]]:
    """CSR grounding map of one caption per item: (offsets [n+1], rows [E], boxes [E][4]).

    ``positions[i]``: word indices in ``captions[i].split()``; ``boxes[i]``: one box per
    word; ``ids``: [n, C] the stored BPE ids of the captions. A row is the token's content
    position - 1 (its row within its caption's block of the plan); a word of several BPE
    pieces gives one row per piece; pieces beyond the stored caption are dropped.
    """
    from open_clip.tokenizer import _tokenizer

    max_tok = ids.shape[1] - 2
    offsets, rows, out_boxes = [0], [], []
    for i, cap in enumerate(captions):
        words = list(positions[i] if positions[i] is not None else [])
        item_boxes = list(boxes[i] if boxes[i] is not None else [])
        for toks, box in zip(
            word_token_positions(cap, words, _tokenizer.encode, max_tok), item_boxes, strict=True
        ):
            for p in toks:
                if int(ids[i, p]) == 0:  # beyond the stored caption (truncated)
                    continue
                rows.append(p - 1)
                out_boxes.append(list(box))
        offsets.append(len(rows))
    return offsets, rows, out_boxes


def curriculum_pools(
    data: PairData, curriculum: list | None, steps: int
) -> tuple[list[torch.Tensor], Any]:
    """Item pools per curriculum phase and ``step -> phase``.

    ``curriculum``: ``[[end_fraction, [families]], ...]`` with increasing end fractions of
    ``steps`` (the last phase runs to the end); empty/None = every family throughout.
    """
    if not curriculum:
        return [torch.arange(len(data))], lambda step: 0
    ends, pools = [], []
    for end, fams in curriculum:
        unknown = sorted(set(fams) - set(FAMILIES))
        if unknown:
            raise ValueError(
                f"curriculum names unknown families {unknown}; valid: {', '.join(FAMILIES)}"
            )
        ids = torch.tensor([FAMILIES.index(f) for f in fams], dtype=torch.long)
        pool = torch.nonzero(torch.isin(data.family, ids)).squeeze(1)
        if len(pool) == 0:
            raise ValueError(f"curriculum phase {fams} has no training items")
        ends.append(float(end) * steps)
        pools.append(pool)

    def phase_of(step: int) -> int:
        return next((i for i, end in enumerate(ends) if step < end), len(ends) - 1)

    return pools, phase_of


# ---------------------------------------------------------------------------- one step


@functools.lru_cache(maxsize=1)
def _naming_vocab() -> torch.Tensor:
    """[vocab] bool: BPE ids of the shapes world's words that name objects (colours,
    shapes, sizes), every piece of each."""
    from open_clip.tokenizer import _tokenizer

    from pipeline.world.scenes import COLOURS, SHAPES, SIZES

    table = torch.zeros(len(_tokenizer.encoder), dtype=torch.bool)
    for word in (*COLOURS, *SHAPES, *SIZES):
        table[_tokenizer.encode(word)] = True
    return table


def naming_tokens(ids: torch.Tensor) -> torch.Tensor:
    """Same shape as ``ids``, bool: the tokens of words that name objects in the shapes
    world (the ``null`` objective pulls every other content token to the null patch)."""
    return _naming_vocab()[ids.long()]


def step_losses(
    model: Scorer,
    data: PairData,
    batch: torch.Tensor,
    weights: dict[str, float],
    group_tau: float,
    consistency_items: int | None = CONSISTENCY_ITEMS,
    consistency_kind: str = "smooth_l1",
    consistency_target: str = "both",
    paraphrase_positives: bool = False,
    flip_positives: bool = False,
    relation_l1: float = 0.0,
    reflection_per_caption: bool = False,
    ground_negatives: bool = False,
    image_per_caption: bool = False,
    ground_contrast: bool = False,
    ground_compat: bool = False,
    ground_compat_margin: float = 0.0,
    group_by: str = "family",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss of one batch of item indices [B] and each objective's value (floats).

    The two consistency objectives score an extra (mirrored / paraphrased) copy of only the
    first ``consistency_items`` items of the batch (None = all), to bound the step's cost.
    ``consistency_target="original"`` detaches the original item's score, so only the
    transformed copy is pulled toward it (the original is trained by the other objectives).
    ``paraphrase_positives`` adds the paraphrased copies ``(I, A', neg)`` to the caption
    preference objective (a paraphrase is a true caption; the forward pass is shared);
    ``flip_positives`` likewise the mirrored copies ``(flip I, flip pos, flip neg)`` (left
    and right exchanged in both captions: pos is still true of the mirror, neg still false).
    ``reflection_per_caption`` compares each caption's scaled energies instead of ``s``;
    ``relation_l1`` adds that weight times the mean ``|d|`` of the relation head.
    ``ground_negatives`` adds to region grounding the words of neg that by themselves name
    exactly one object of I (``neg_ground_*`` of the manifest): on a false caption each
    word is still pulled to its own referent, so "blue" in "a blue circle" said of a red
    circle beside a blue square goes to the square and "circle" to the circle.
    ``image_per_caption`` adds to the image objective the same logistic loss on each
    caption's own learned part (its scaled energies): pos must score higher on I than on
    I', neg higher on I' than on I. The pairwise margin only constrains the difference of
    the two captions (e.g. d(left) - d(right)); this constrains each (the sign of d(left)).
    ``ground_contrast`` adds region grounding's contrast term (mass on the word's object
    against mass on the scene's other objects, :func:`~pipeline.objectives.region_grounding`);
    it needs ``data.g_other``. ``ground_compat`` adds to each grounded word's loss
    :func:`~pipeline.objectives.compatibility_contrast`: its compatibility S, averaged over
    its object's visible patches, above its average over the other objects' (temperature:
    the scorer's Sinkhorn epsilon), by ``ground_compat_margin``; it needs ``data.g_mask``.
    Both need ``data`` loaded with ``load_pairs(..., object_masks=True)`` or ``region="mask"``.
    ``group_by``: the groups of every objective's worst-group aggregate, the eight
    ``"family"``s or each pair's ``"edit_kind"`` (needs ``load_pairs(..., edit_kinds=True)``).
    """
    if consistency_target not in ("both", "original"):
        raise ValueError(f"consistency_target must be 'both' or 'original', got {consistency_target!r}")
    on = {k: objective_weight(weights, k) for k in OBJECTIVES}
    if group_by not in ("family", "edit_kind"):
        raise ValueError(f"group_by must be 'family' or 'edit_kind', got {group_by!r}")
    if group_by == "edit_kind" and data.edit_kind is None:
        raise ValueError("group_by='edit_kind' needs load_pairs(..., edit_kinds=True)")
    fam = (data.family if group_by == "family" else data.edit_kind)[batch]  # [B] group of each item
    positives = {"paraphrase": paraphrase_positives, "reflection": flip_positives}  # copies that join preference
    chunks = [(data.image[batch], data.pos[batch], data.neg[batch])]
    sel: dict[str, torch.Tensor] = {}
    for name, (img, a, b) in {
        "image": (data.cf, data.pos, data.neg),
        "reflection": (data.flip, data.flip_pos, data.flip_neg),
        "paraphrase": (data.image, data.para, data.neg),
    }.items():
        if on[name] == 0 and not positives.get(name, False):
            continue
        ok = (img[batch] >= 0) & (a[batch] >= 0) & (b[batch] >= 0)  # [B]
        if name != "image" and consistency_items is not None:
            ok[consistency_items:] = False
        if ok.any():
            sel[name] = torch.nonzero(ok).squeeze(1)
            chunks.append((img[batch[ok]], a[batch[ok]], b[batch[ok]]))
    image = data.images.index(torch.cat([c[0] for c in chunks]))
    text_a = data.texts.index(torch.cat([c[1] for c in chunks]))
    text_b = data.texts.index(torch.cat([c[2] for c in chunks]))
    e = model.explain(image, text_a, text_b)  # one forward over every chunk
    B = len(batch)
    temperature = getattr(getattr(model, "config", None), "epsilon", 0.1)  # of the S contrasts
    n_tok = (e.plan.shape[1] - 1) // 2  # plan rows [pos (N); neg (N); null]
    s0, g0 = e.score[:B], e.margin[:B]

    per: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
        "sufficiency": (structural_sufficiency(s0, g0), fam),
    }
    start, copies = B, {}
    for name in ("image", "reflection", "paraphrase"):
        if name not in sel:
            continue
        idx = sel[name]
        rows = slice(start, start + len(idx))  # this copy's rows of the forward pass
        s = copies[name] = e.score[rows]
        start += len(idx)
        if name == "image":
            loss = image_contrast(s0[idx], s)
            if image_per_caption:  # each caption's learned part prefers the image it is true of
                on_cf = (e.energies[rows] * e.scales).sum(-1)  # [n, 2] (pos, neg) on I'
                on_true = (e.energies[idx] * e.scales).sum(-1)  # [n, 2] on I
                loss = loss + image_contrast(on_true[:, 0], on_cf[:, 0]) + image_contrast(on_cf[:, 1], on_true[:, 1])
            per[name] = (loss, fam[idx])
        elif name == "reflection" and reflection_per_caption:  # each caption's learned part
            flip = (e.energies[rows] * e.scales).sum(-1)  # [n, 2]
            orig = (e.energies[idx] * e.scales).sum(-1)  # [n, 2]
            if consistency_target == "original":
                orig = orig.detach()
            loss = consistency(flip[:, 0], orig[:, 0], consistency_kind) + consistency(flip[:, 1], orig[:, 1], consistency_kind)
            per[name] = (loss, fam[idx])
        else:
            ref = s0[idx].detach() if consistency_target == "original" else s0[idx]
            per[name] = (consistency(s, ref, consistency_kind), fam[idx])
    per["preference"] = (caption_preference(s0), fam)
    for name, wanted in positives.items():
        if wanted and name in copies:  # a true caption of its image: one more preference item
            per["preference"] = (
                torch.cat([per["preference"][0], caption_preference(copies[name])]),
                torch.cat([per["preference"][1], fam[sel[name]]]),
            )
    if (ground_compat or on["binding"] != 0) and getattr(e, "S", None) is None:
        raise ValueError(f"ground_compat and the binding objective read the compatibility S, which {type(model).__name__} does not expose")
    if on["grounding"] != 0:
        if (ground_contrast or ground_compat) and data.g_other is None:
            raise ValueError(
                "ground_contrast / ground_compat need the objects' visible cells: "
                "load_pairs(..., region='mask') or load_pairs(..., object_masks=True)"
            )
        maps = [(data.g_offsets, data.g_row, data.g_cells, data.g_other, data.g_mask, 0)]
        if ground_negatives and data.ng_row is not None:
            maps.append((data.ng_offsets, data.ng_row, data.ng_cells, data.ng_other, data.ng_mask, n_tok))
        item, row, cells, other, visible = [], [], [], [], []
        for offsets, rows, g_cells, g_other, g_mask, shift in maps:
            ent, of_item = _batch_entries(offsets, batch)
            keep = rows[ent] < n_tok  # a token beyond the scorer's truncation has no row
            item.append(of_item[keep])
            row.append(rows[ent][keep] + shift)
            cells.append(g_cells[ent][keep])
            if ground_contrast or ground_compat:
                other.append(g_other[ent][keep])
                visible.append(g_mask[ent][keep])
        item = torch.cat(item)
        if len(item):
            row = torch.cat(row)
            distractors = torch.cat(other) if ground_contrast else None
            loss = region_grounding(e.plan[:B], e.r[:B], item, row, torch.cat(cells), other=distractors)
            if ground_compat:
                compat = compatibility_contrast(
                    e.S[:B], item, row, torch.cat(visible), torch.cat(other), temperature, ground_compat_margin
                )
                loss = loss + compat
            per["grounding"] = (loss, fam[item])
    if on["binding"] != 0 and data.b_offsets is not None:
        ent, b_item = _batch_entries(data.b_offsets, batch)
        keep = (data.b_pos_row[ent] < n_tok) & (data.b_neg_row[ent] < n_tok)  # both rows in the plan
        if keep.any():
            ent, b_item = ent[keep], b_item[keep]
            bind = binding_contrast(
                e.S[:B], b_item, data.b_pos_row[ent], data.b_neg_row[ent] + n_tok, data.b_cells[ent], temperature
            )
            per["binding"] = (bind, fam[b_item])

    if on["null"] != 0:  # words that name no object go to the null patch
        words = torch.zeros(e.r[:B].shape, dtype=torch.bool)
        for x, ids in enumerate((text_a.ids[:B], text_b.ids[:B])):
            content = ids[:, 1 : 1 + n_tok]  # plan row i of a caption <-> token position i + 1
            k = content.shape[1]
            words[:, x * n_tok : x * n_tok + k] = ~naming_tokens(content) & e.token_mask[:B, x, :k]
        per["null"] = (null_grounding(e.plan[:B], e.r[:B], words), fam)

    total = s0.new_zeros(())
    logged = {}
    for name, (loss, groups) in per.items():
        if on[name] == 0:
            continue
        agg = worst_group(loss, groups, group_tau)
        total = total + on[name] * agg
        logged[name] = float(agg.detach())
    if relation_l1 and getattr(e, "relation", None) is not None:
        m = e.token_mask[..., None].to(e.relation.dtype)  # [B', 2, N, 1]
        l1 = (e.relation.abs() * m).sum() / (m.sum() * e.relation.shape[-1]).clamp_min(1.0)
        total = total + relation_l1 * l1
        logged["relation_l1"] = float(l1.detach())
    logged["total"] = float(total.detach())
    logged["acc"] = float((s0.detach() > 0).float().mean())
    logged["sinkhorn_err"] = float(e.marginal_err.max())
    return total, logged


# ---------------------------------------------------------------------------- evaluation


@torch.no_grad()
def pair_scores(model: Scorer, data: PairData, batch_size: int = EVAL_BATCH) -> np.ndarray:
    """[n] s(I, pos, neg) for every item."""
    out = []
    for start in range(0, len(data), batch_size):
        sl = slice(start, start + batch_size)
        out.append(
            model.score_pair(
                data.images.index(data.image[sl]),
                data.texts.index(data.pos[sl]),
                data.texts.index(data.neg[sl]),
            ).double()
        )
    return torch.cat(out).numpy()


def dev_metrics(model: Scorer, data: PairData, suite: str) -> dict[str, float]:
    """The suite's official metrics (per family + ``mean``) from ``[n, 2] = (s, -s)`` scores."""
    was = model.training
    model.eval()
    with warnings.catch_warnings():  # Sinkhorn convergence: the training log records it
        warnings.simplefilter("ignore", UserWarning)
        s = pair_scores(model, data)
    model.train(was)
    correct = data.manifest["correct"].to_numpy()
    scores = np.where(correct[:, None] == 0, np.stack([s, -s], 1), np.stack([-s, s], 1))
    return {
        k: round(float(v), 6) for k, v in SUITES.get(suite).metrics(data.manifest, scores).items()
    }


# ---------------------------------------------------------------------------- the loop


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimiser step ``step`` under ``cfg.lr_schedule``."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        return warmup_cosine(step, cfg.lr, cfg.warmup, cfg.steps)
    raise ValueError(f"train.lr_schedule must be 'constant' or 'cosine', got {cfg.lr_schedule!r}")


def _fingerprint(cfg: TrainConfig, seed: int, store: FeatureStore) -> str:
    d = asdict(cfg)
    for k in ("seeds", "threads", "out", "eval_every"):
        d.pop(k, None)
    d.update(seed=seed, store=store.root.attrs.get("fingerprint_id"))
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _state(model: Scorer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _set_q0(model: Scorer, q0: float) -> None:
    model.config = dataclasses.replace(model.config, q0=q0)


def train_seed(
    cfg: TrainConfig,
    store: FeatureStore,
    train: PairData,
    dev: PairData,
    seed: int,
    out: Path,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train one seed into ``out`` (``seed<k>/``); returns its config record.

    ``stop_after`` stops (without finishing) after that many steps, leaving ``resume.pt``:
    a simulated crash for tests.
    """
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = create_scorer(cfg.variant, dims=store.dims, proj=store.projections(), **cfg.scorer)
    if not model.trainable:
        raise ValueError(f"{cfg.variant} has no trainable parameters; nothing to train")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    fp = _fingerprint(cfg, seed, store)
    log: dict[str, Any] = {"steps": [], "dev": []}
    best: dict[str, Any] = {"metric": -math.inf, "step": 0, "state": _state(model), "dev": {}}
    step = 0
    pools, phase_of = curriculum_pools(train, cfg.curriculum, cfg.steps)
    resume = out / "resume.pt"
    if resume.is_file():
        ck = torch.load(resume, weights_only=False)
        if ck.get("fingerprint") == fp:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optim"])
            gen.set_state(ck["generator"])
            torch.set_rng_state(ck["torch_rng"])
            step, log, best = ck["step"], ck["log"], ck["best"]

    def save_resume() -> None:
        tmp = resume.with_suffix(".tmp")
        torch.save(
            {
                "fingerprint": fp,
                "step": step,
                "model": model.state_dict(),
                "optim": opt.state_dict(),
                "generator": gen.get_state(),
                "torch_rng": torch.get_rng_state(),
                "log": log,
                "best": best,
            },
            tmp,
        )
        tmp.replace(resume)

    def evaluate() -> None:
        metrics = dev_metrics(model, dev, cfg.dev_suite)
        log["dev"].append({"step": step, **metrics})
        if metrics["mean"] > best["metric"]:
            best.update(metric=metrics["mean"], step=step, state=_state(model), dev=metrics)

    if step == 0:
        evaluate()  # step 0 = the initialisation is a candidate too
    model.train()
    bar = tqdm(
        total=cfg.steps, initial=step, desc=f"train {cfg.variant} seed {seed}", disable=not progress
    )
    t0 = time.time()
    while step < cfg.steps:
        if stop_after is not None and step >= stop_after:
            bar.close()
            return {"stopped_at": step}
        pool = pools[phase_of(step)]  # items of the curriculum phase this step is in
        batch = pool[torch.randperm(len(pool), generator=gen)[: cfg.batch_size]]
        weights = dict(cfg.weights)
        if step < cfg.consistency_from * cfg.steps:  # consistency warm-up: off
            weights.update(reflection=0.0, paraphrase=0.0)
        with warnings.catch_warnings():  # per-step convergence is logged (sinkhorn_err)
            warnings.simplefilter("ignore", UserWarning)
            loss, logged = step_losses(
                model,
                train,
                batch,
                weights,
                cfg.group_tau,
                cfg.consistency_items,
                consistency_target=cfg.consistency_target,
                paraphrase_positives=cfg.paraphrase_positives,
                flip_positives=cfg.flip_positives,
                relation_l1=cfg.relation_l1,
                reflection_per_caption=cfg.reflection_per_caption,
                ground_negatives=cfg.ground_negatives,
                image_per_caption=cfg.image_per_caption,
                ground_contrast=cfg.ground_contrast,
                ground_compat=cfg.ground_compat,
                ground_compat_margin=cfg.ground_compat_margin,
                group_by=cfg.group_by,
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lr = learning_rate(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        step += 1
        log["steps"].append({"step": step, "lr": lr, **{k: round(v, 6) for k, v in logged.items()}})
        bar.update(1)
        bar.set_postfix(loss=f"{logged['total']:.3f}", acc=f"{logged['acc']:.2f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluate()
            bar.set_postfix(loss=f"{logged['total']:.3f}", dev=f"{log['dev'][-1]['mean']:.3f}")
            if step < cfg.steps:
                save_resume()
    bar.close()
    train_seconds = time.time() - t0

    # selected checkpoint, then q0 on dev only
    model.load_state_dict(best["state"])
    q0_dev: dict[str, float] = {}
    chosen_q0 = getattr(model.config, "q0", None)
    if getattr(model.config, "consensus", False) and cfg.q0_grid:
        for q in cfg.q0_grid:
            _set_q0(model, float(q))
            q0_dev[str(float(q))] = dev_metrics(model, dev, cfg.dev_suite)["mean"]
        chosen_q0 = float(
            max(cfg.q0_grid, key=lambda q: (q0_dev[str(float(q))], -cfg.q0_grid.index(q)))
        )
        _set_q0(model, chosen_q0)
    final_dev = dev_metrics(model, dev, cfg.dev_suite)

    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors")
    )
    kwargs = dict(cfg.scorer)
    if chosen_q0 is not None and "q0" in {f.name for f in dataclasses.fields(model.config)}:
        kwargs["q0"] = chosen_q0
    record = {
        "variant": cfg.variant,
        "seed": seed,
        "selected_step": best["step"],
        "selection": "max mean dev accuracy (official COCO-families mean), earliest step on ties",
        "q0": chosen_q0,
        "q0_dev_mean": q0_dev,
        "dev": final_dev,
        "scorer_kwargs": kwargs,  # build the scorer with these at scoring time
        "scorer": asdict(model.config) if dataclasses.is_dataclass(model.config) else {},
        "train": asdict(cfg),
        "store": str(store.path),
        "store_fingerprint_id": store.root.attrs.get("fingerprint_id"),
        "train_seconds": round(train_seconds, 1),
    }
    (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "train_log.json").write_text(json.dumps(log) + "\n")
    if resume.is_file():
        resume.unlink()
    return record


def train_scorer(
    cfg: TrainConfig, store: FeatureStore, progress: bool = True, stop_after: int | None = None
) -> dict[str, Any]:
    """Train ``cfg.variant`` for every seed of ``cfg.seeds``; write the checkpoint layout.

    Returns the summary written to ``<cfg.out>/<variant>/summary.json``.
    """
    owner = getattr(SCORERS.get(cfg.variant), "checkpoint_variant", None) or cfg.variant
    if owner != cfg.variant:
        raise ValueError(
            f"{cfg.variant} reuses the parameters of {owner!r}; train `pipeline train --variant {owner}`"
        )
    if not cfg.seeds:
        raise ValueError("TrainConfig.seeds is empty; give at least one seed")
    unknown = sorted(set(cfg.weights) - set(OBJECTIVES))
    if unknown:
        raise ValueError(f"unknown objective weight(s) {unknown}; valid: {', '.join(OBJECTIVES)}")
    if objective_weight(cfg.weights, "null") != 0 and not cfg.train_suite.startswith("shapes-"):
        raise ValueError(
            f"the null objective knows the shapes world's object words only; {cfg.train_suite} "
            "is not a shapes suite: set train.weights.null to 0"
        )
    learning_rate(0, cfg)  # an unknown schedule fails here
    if cfg.lr_schedule == "cosine" and not 0 <= cfg.warmup < cfg.steps:
        raise ValueError(f"train.warmup must be in [0, steps) = [0, {cfg.steps}), got {cfg.warmup}")
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        # the word -> object maps serve grounding and the binding objective (off by default)
        grounding = objective_weight(cfg.weights, "grounding") != 0 or objective_weight(cfg.weights, "binding") != 0
        masks = cfg.ground_compat or cfg.ground_contrast  # the objects' visible cells
        train = load_pairs(
            store, cfg.train_suite, grounding, region=cfg.ground_region, object_masks=masks,
            edit_kinds=cfg.group_by == "edit_kind",
        )
        dev = load_pairs(store, cfg.dev_suite, grounding=False)
        root = Path(cfg.out) / cfg.variant
        records = []
        for seed in cfg.seeds:
            rec = train_seed(
                cfg, store, train, dev, seed, root / f"seed{seed}", progress, stop_after
            )
            if "stopped_at" in rec:
                return rec
            records.append(rec)
    finally:
        torch.set_num_threads(threads)

    first = root / f"seed{cfg.seeds[0]}"
    shutil.copyfile(first / "model.safetensors", root / "model.safetensors")
    shutil.copyfile(first / "config.json", root / "config.json")
    names = list(records[0]["dev"])
    spread = {}
    for k in names:
        v = np.array([r["dev"][k] for r in records], dtype=float)
        spread[k] = {
            "mean": float(v.mean()),
            "std": float(v.std()),
            "min": float(v.min()),
            "max": float(v.max()),
        }
    summary = {
        "variant": cfg.variant,
        "dev_suite": cfg.dev_suite,
        "scored_seed": cfg.seeds[0],
        "seeds": {
            str(r["seed"]): {"dev": r["dev"], "selected_step": r["selected_step"], "q0": r["q0"]}
            for r in records
        },
        "spread": spread,
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
