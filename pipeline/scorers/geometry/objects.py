r"""Per-object decomposition from the cache (methods.md §3): the object sets the
geometry-aware rerankers align.

* Image side: one embedding per annotated object (``object_boxes``), from one of two
  sources (:data:`OBJECT_SOURCES`). ``box-mean`` (the default; ours): the mean of the cached
  final-layer patch features inside the box, projected into the joint space
  (``final @ visual_proj``, the projection that maps CLS to the pooled embedding) and
  unit-normalised; a fitted map (``ridge-fgw``) may read another grid instead
  (:data:`OBJECT_LAYERS`), the one its fit held out best. The mean is over the box's area:
  each patch weighs the fraction of its area inside the box
  (:func:`pipeline.world.grounding.box_weights`), so a patch the box barely touches, mostly
  background or a neighbour, counts for little (docs/trials.md). ``crops`` (the paper's):
  the pooled embedding of the box's crop re-encoded by the frozen image tower at extract
  (``extract.object_crops: true``; :func:`pipeline.extract_pixels.crop_to_box`),
  unit-normalised: the object seen alone, at the encoder's full resolution, at the cost of
  one forward pass per object at extract and none at scoring. Either way the object's
  position is its box centre. Box means read the grid through the boxes as the encoder saw
  the image: a manifest with an ``image_size`` column (the real loaders) has its boxes
  mapped onto the square view of the store's ``preprocess.resize_mode``
  (:func:`pipeline.world.grounding.view_boxes`: OpenAI CLIP crops the centre square), and an
  object the crop cut away is left out of the image's set.
* Query side: one embedding per object phrase (``phrases``, encoded at extract like every
  caption): its pooled text embedding, unit-normalised. Positions come from the relation
  structure (``relations``): :func:`relation_positions` lays the phrases out on a grid so
  that each stated relation holds (``left``: phrase j one unit right of phrase i, ``above``:
  one unit below it, y down; their converses likewise), phrases joined by no geometric
  relation share the origin of their component.
* Structures (:func:`structure`), per set: ``offset`` — the signed 2-D offsets
  :math:`C_{ik} = x_k - x_i` (two channels), which tell *left of* from *right of*;
  ``distance`` — :math:`\lVert x_k - x_i \rVert`, the spec's pairwise distances, which
  cannot (they are invariant to reflections, and shapes-retrieval's distractors swap
  left and right), so ``offset`` is the rerankers' default. Each set's structure is
  scaled to a largest entry of 1, so a query's unit layout and an image's normalised box
  centres are comparable.

Sets are padded to the batch's largest set with ``mask`` False; the solvers give padded
entries zero mass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipeline.benchmarks.phrases import spatial_relation
from pipeline.benchmarks.retrieval import parse_boxes, parse_relations
from pipeline.cache import CacheError, FeatureStore, StaleCacheError
from pipeline.world.grounding import box_weights, view_boxes

STRUCTURES = ("offset", "distance")
# Where an image object's embedding comes from: "box-mean" the mean of the cached grid inside
# the box (OBJECT_LAYERS says which grid), "crops" the re-encoded crop (extract.object_crops).
OBJECT_SOURCES = ("box-mean", "crops")
# Which cached grid an object's box mean reads: "final" in the joint space (final @
# visual_proj, what CLS becomes; the spec's default), "final-raw" the same patches before the
# projection, "early" the early-layer grid (raw residual stream). Only a fitted map
# (ridge-fgw) can compare phrases with the last two.
OBJECT_LAYERS = ("final", "final-raw", "early")
# Relation words with a direction in the image plane -> (dx, dy) from phrase i to phrase j
# ("i left of j": j lies one unit to the right of i; y grows downwards like the grid).
DIRECTIONS: dict[str, tuple[float, float]] = {
    "left": (1.0, 0.0),
    "left of": (1.0, 0.0),
    "right": (-1.0, 0.0),
    "right of": (-1.0, 0.0),
    "above": (0.0, 1.0),
    "on top of": (0.0, 1.0),
    "atop": (0.0, 1.0),
    "on": (0.0, 1.0),
    "onto": (0.0, 1.0),
    "over": (0.0, 1.0),
    "below": (0.0, -1.0),
    "under": (0.0, -1.0),
    "underneath": (0.0, -1.0),
    "beneath": (0.0, -1.0),
}


@dataclass
class ObjectSets:
    """N padded object sets: embeddings, validity, positions and, optionally, a cost each
    object adds to every feature cost it enters (``ridge-fgw``'s hub offset)."""

    embed: torch.Tensor  # [N, n, D] unit-norm object (or phrase) embeddings, 0 where padded
    mask: torch.Tensor  # [N, n] bool, True for real objects
    pos: torch.Tensor  # [N, n, 2] positions (box centres, or the relation layout)
    offset: torch.Tensor | None = None  # [N, n] added to the feature cost of every pair with the object; None: 0

    def __len__(self) -> int:
        return self.embed.shape[0]

    def index(self, idx: torch.Tensor) -> ObjectSets:
        return ObjectSets(self.embed[idx], self.mask[idx], self.pos[idx], None if self.offset is None else self.offset[idx])

    def with_embed(self, embed: torch.Tensor, offset: torch.Tensor | None = None) -> ObjectSets:
        """The same sets with ``embed`` [N, n, D'] as their embeddings (a map of the old
        ones) and ``offset`` [N, n] as their cost offsets, zero where padded."""
        if offset is not None:
            offset = torch.where(self.mask, offset, 0.0)
        return ObjectSets(torch.where(self.mask[..., None], embed, 0.0), self.mask, self.pos, offset)


def pad_sets(embeds: list[torch.Tensor], positions: list[torch.Tensor], dim: int) -> ObjectSets:
    """Pad per-item ``[n_i, D]`` embeddings and ``[n_i, 2]`` positions into :class:`ObjectSets`."""
    n = max([len(e) for e in embeds] + [1])
    out = ObjectSets(torch.zeros(len(embeds), n, dim), torch.zeros(len(embeds), n, dtype=torch.bool), torch.zeros(len(embeds), n, 2))
    for i, (e, p) in enumerate(zip(embeds, positions, strict=True)):
        out.embed[i, : len(e)], out.mask[i, : len(e)], out.pos[i, : len(e)] = e, True, p
    return out


def relation_positions(relations: list[tuple[int, str, int]], n: int) -> torch.Tensor:
    """[n, 2] a layout of ``n`` phrases from their directional relations: each relation asks
    for its object one unit from its subject in the relation's direction (:data:`DIRECTIONS`,
    read on its spatial part: :func:`pipeline.benchmarks.phrases.spatial_relation`, so
    "sitting on" places like "on"), and the layout is the least-squares solution of those
    offsets with each connected group's first phrase at the origin. Where the relations form
    a tree (every query of the shapes suites but a few) each holds exactly, one unit long; a
    cycle whose unit offsets disagree ("A left of B, B right of C, A left of C") is met in
    the least-squares sense, which keeps all three here. Phrases no chain of relations links
    may coincide ("A left of B, C left of B" puts A and C at one point): the layout states
    only what the caption does. Non-directional relations ("next to", "behind", "holding")
    place nothing. Where the relations leave more than one group ("A left of B, and C", a
    caption split into unlinked parts), the caption does not say where the groups lie
    relative to each other, and pinning every group's first phrase to one point would ask
    the image for objects piled there: the layout is then all zeros, a query that states no
    layout (the rerankers solve it on features alone)."""
    # imported here: `pipeline score` of a choice suite never loads scipy
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    edges = [(i, j, np.array(d, dtype=float)) for i, rel, j in relations if (d := DIRECTIONS.get(spatial_relation(rel))) is not None]
    ends = np.array([(i, j) for i, j, _ in edges], dtype=np.int64).reshape(-1, 2).T  # [2, E]
    graph = coo_matrix((np.ones(len(edges)), (ends[0], ends[1])), shape=(n, n))
    label = connected_components(graph, directed=False)[1]  # [n] the group each phrase's relations link it into
    anchor = np.unique(label, return_index=True)[1][label]  # [n] each group's first phrase, fixed at the origin
    pos = np.zeros((n, 2))
    free = [i for i in range(n) if anchor[i] != i]
    if edges and free and label.max(initial=0) == 0:  # one group: a layout
        col = {i: k for k, i in enumerate(free)}
        A = np.zeros((len(edges), len(free)))  # [E, F] incidence of each offset pos_j - pos_i
        for e, (i, j, _) in enumerate(edges):
            if j in col:
                A[e, col[j]] += 1.0
            if i in col:
                A[e, col[i]] -= 1.0
        target = np.stack([d for _, _, d in edges])  # [E, 2]
        pos[free] = np.round(np.linalg.lstsq(A, target, rcond=None)[0], 9)  # a tree's unit offsets exactly
    return torch.from_numpy(pos).float()


def structure(sets: ObjectSets, kind: str = "offset") -> torch.Tensor:
    """[N, n, n, c] structure matrices of each set (c = 2 for ``offset``, 1 for
    ``distance``), zero on padded pairs, each set scaled to a largest absolute entry of 1."""
    if kind not in STRUCTURES:
        raise ValueError(f"unknown structure {kind!r}; valid: {', '.join(STRUCTURES)}")
    c, scale = _unscaled(sets, kind)
    return c / scale[:, None, None, None]


def _unscaled(sets: ObjectSets, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, n, n, c] structures before scaling (zero on padded pairs) and [N] their scales,
    each set's largest absolute entry (at least 1e-6)."""
    diff = sets.pos[:, None, :, :] - sets.pos[:, :, None, :]  # [N, n, n, 2]: x_k - x_i
    c = diff if kind == "offset" else diff.norm(dim=-1, keepdim=True)
    pair = (sets.mask[:, :, None] & sets.mask[:, None, :])[..., None]  # [N, n, n, 1]
    c = torch.where(pair, c, 0.0)
    return c, c.abs().flatten(1).amax(1).clamp_min(1e-6)


def offset_positions(sets: ObjectSets) -> torch.Tensor:
    """[N, n, 2] each set's positions on the scale of its ``offset`` structure: the signed
    offsets between these are :func:`structure` ``(sets, "offset")`` (to rounding), which is
    what :func:`pipeline.ot.fgw.fused_gromov_wasserstein_offsets` takes. They are centred on
    the mean of the set's objects (offsets do not see a translation), so a set whose offsets
    are all 0 (one object, or every box centred at one point) sits at 0, not at its centres
    divided by the scale's floor."""
    m = sets.mask[..., None]  # [N, n, 1]
    mean = torch.where(m, sets.pos, 0.0).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1)
    return torch.where(m, sets.pos - mean, 0.0) / _unscaled(sets, "offset")[1][:, None, None]


def feature_cost(query: ObjectSets, image: ObjectSets) -> torch.Tensor:
    """[B, n, m] ``1 - cosine`` between query b's phrases and image b's objects (pairs
    aligned along B), plus each object's ``offset`` where the image sets carry one; padded
    pairs cost 0 and carry no mass in the solvers."""
    cost = 1.0 - torch.einsum("bnd,bmd->bnm", query.embed, image.embed)
    if image.offset is not None:
        cost = cost + image.offset[:, None, :].to(cost.dtype)
    return torch.where(query.mask[:, :, None] & image.mask[:, None, :], cost, 0.0)


def gallery_rows_of(manifest: pd.DataFrame, gallery: list[str]) -> np.ndarray:
    """[G] manifest row of each gallery image's first appearance (its object annotation)."""
    first = {img: i for i, img in reversed(list(enumerate(manifest["image"])))}
    return np.array([first[g] for g in gallery], dtype=np.int64)


OBJECTS_NEEDED = "the geometry-aware rerankers need object boxes and query phrases in the manifest (pipeline.benchmarks.retrieval)"


def require_columns(manifest: pd.DataFrame, columns: tuple[str, ...], suite: str = "", needed: str = OBJECTS_NEEDED) -> None:
    """Refuse a manifest without ``columns``, naming the suite, the columns and what ``needed`` them."""
    missing = [c for c in columns if c not in manifest]
    if missing:
        raise ValueError(f"suite {suite or '(retrieval)'} has no {', '.join(missing)} column(s): {needed}")


def object_dim(store_dims, layer: str) -> int:
    """Width of the object embeddings that ``layer`` gives (:data:`OBJECT_LAYERS`)."""
    if layer not in OBJECT_LAYERS:
        raise ValueError(f"unknown object layer {layer!r}; valid: {', '.join(OBJECT_LAYERS)}")
    return store_dims.embed_dim if layer == "final" else store_dims.d_v


def check_source(objects: str, layer: str = "final") -> None:
    """Refuse an unknown object source, and a grid other than ``final`` with ``crops`` (a
    re-encoded crop has only its pooled embedding, in the joint space)."""
    if objects not in OBJECT_SOURCES:
        raise ValueError(f"unknown object source {objects!r}; valid: {', '.join(OBJECT_SOURCES)}")
    if objects == "crops" and layer != "final":
        raise ValueError(
            f"objects: crops reads the crops' pooled embeddings in the joint space; layer {layer!r} "
            f"applies to box means only (use layer: final, or objects: box-mean)"
        )


def crop_rows(store: FeatureStore, index: dict[str, np.ndarray], n_items: int, suite: str = "") -> np.ndarray:
    """[n_items, K] store rows of each item's object crops (``object/*``, -1 = pad), refusing a
    store or suite index without crops with the option that writes them."""
    if not store.has_object_crops or "object_crops" not in index:
        where = f"{store.path}" if not store.has_object_crops else f"{store.path}'s index of {suite or 'this suite'}"
        raise CacheError(
            f"objects: crops reads re-encoded object crops, and {where} has none: set "
            f"extract.object_crops: true and rerun `pipeline extract` (or use objects: box-mean)"
        )
    return index["object_crops"].reshape(n_items, -1)


@torch.no_grad()
def crop_objects(store: FeatureStore, rows: np.ndarray, boxes: list[np.ndarray], image_rows: np.ndarray) -> ObjectSets:
    """Object sets of G images from their re-encoded crops: ``rows`` [G, K] store rows into
    ``object/*`` (-1 = pad), ``boxes[g]`` [m_g, 4] the boxes they were cut from, in the frame
    the positions are read in (positions: the box centres), ``image_rows`` [G] the images'
    store rows, which every crop must have been cut from; unit-normalised pooled crop
    embeddings."""
    rows = np.asarray(rows).reshape(len(boxes), -1)
    counts = (rows >= 0).sum(1)
    flat = rows[rows >= 0]  # [sum m_g] in image order, boxes in order
    source = np.repeat(np.asarray(image_rows, dtype=np.int64), counts)  # [sum m_g]
    if not np.array_equal(counts, [len(b) for b in boxes]) or not np.array_equal(store.object_images(flat), source):
        raise StaleCacheError(
            f"{store.path}: the object crops of some images do not match their object_boxes "
            f"(an index older than the images); rerun `pipeline extract` with extract.object_crops: true"
        )
    dim = store.dims.embed_dim
    emb = F.normalize(store.objects(flat), dim=-1) if len(flat) else torch.zeros(0, dim)  # [sum m_g, D]
    centres = [torch.as_tensor((b[:, :2] + b[:, 2:]) / 2, dtype=torch.float32).reshape(-1, 2) for b in boxes]
    return pad_sets(list(torch.split(emb, counts.tolist())), centres, dim)


@torch.no_grad()
def image_objects(store: FeatureStore, image_rows: np.ndarray, boxes: list[np.ndarray], layer: str = "final", batch_size: int = 256) -> ObjectSets:
    """Object sets of images ``image_rows`` [G] (store rows) with ``boxes[g]`` [m_g, 4]:
    each object's area-weighted mean patch feature over its box, from the grid ``layer`` names
    (:data:`OBJECT_LAYERS`; default the final layer in the joint space), unit-normalised."""
    dim = object_dim(store.dims, layer)
    proj = store.projections().visual_proj  # [d_v, D]
    grid = store.dims.grid
    embeds: list[torch.Tensor] = []
    for start in range(0, len(image_rows), batch_size):
        feats = store.images(image_rows[start : start + batch_size], grids=True)
        joint = {"final": lambda f: f.final @ proj, "final-raw": lambda f: f.final, "early": lambda f: f.early}[layer](feats)  # [b, R, dim]
        block = [np.asarray(b, dtype=np.float32).reshape(-1, 4) for b in boxes[start : start + batch_size]]
        counts = torch.tensor([len(b) for b in block])  # [b]
        owner = torch.repeat_interleave(torch.arange(len(block)), counts)  # [M] each box's image
        slot = torch.arange(len(owner)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)  # [M] its place there
        W = torch.zeros(len(block), max(counts.tolist(), default=0), joint.shape[1])  # [b, m_max, R]
        W[owner, slot] = box_weights(torch.from_numpy(np.concatenate(block)), grid)
        emb = torch.bmm(W, joint) / W.sum(-1, keepdim=True).clamp_min(1e-12)  # [b, m_max, dim]
        embeds += list(torch.split(F.normalize(emb[owner, slot], dim=-1), counts.tolist()))  # [m_g, dim] each
    centres = [torch.as_tensor((b[:, :2] + b[:, 2:]) / 2, dtype=torch.float32).reshape(-1, 2) for b in boxes]
    return pad_sets(embeds, centres, dim)


@torch.no_grad()
def text_sets(store: FeatureStore, rows: np.ndarray, positions: list[torch.Tensor]) -> ObjectSets:
    """Object sets of phrase rows ``rows`` [N, n] (store text rows, -1 = pad): unit-norm
    pooled phrase embeddings, laid out at ``positions[i]`` [n_i, 2]."""
    rows = np.asarray(rows).reshape(len(rows), -1)
    flat = rows[rows >= 0]
    emb = F.normalize(store.texts(flat, grids=False).embed, dim=-1) if len(flat) else torch.zeros(0, store.dims.embed_dim)
    counts = (rows >= 0).sum(1)
    splits = list(torch.split(emb, counts.tolist()))
    return pad_sets(splits, positions, store.dims.embed_dim)


def grid_views(store: FeatureStore, manifest: pd.DataFrame, rows: np.ndarray, clip: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per manifest row of ``rows``: (its ``object_boxes`` on the view the patch grid covers
    [m, 4], which of them keep some area there [m] bool). Boxes on a manifest with
    ``image_size`` are mapped through the store's resize mode (:func:`view_boxes`; ``clip``
    False keeps them whole beyond the view); without one (square images, the shapes world)
    every box is kept as it is."""
    boxes = [parse_boxes(manifest["object_boxes"].iloc[r]) for r in rows]
    if "image_size" not in manifest:
        return [(b, np.ones(len(b), dtype=bool)) for b in boxes]
    mode = store.fingerprint.get("preprocess", {}).get("resize_mode", "shortest")
    return [view_boxes(b, manifest["image_size"].iloc[r], mode, clip) for b, r in zip(boxes, rows, strict=True)]


def visible_objects(store: FeatureStore, manifest: pd.DataFrame, rows: np.ndarray, objects: str = "box-mean") -> np.ndarray:
    """[sum m_g] bool, in row and box order: which annotated objects of manifest rows ``rows``
    :func:`item_objects` embeds — every one from re-encoded crops (cut from the whole image),
    and for box means those the grid's view still shows."""
    if objects == "crops":
        return np.ones(sum(len(parse_boxes(manifest["object_boxes"].iloc[r])) for r in rows), dtype=bool)
    return np.concatenate([seen for _, seen in grid_views(store, manifest, rows)] or [np.zeros(0, dtype=bool)])


def item_objects(store: FeatureStore, manifest: pd.DataFrame, index: dict[str, np.ndarray], rows: np.ndarray, suite: str = "", layer: str = "final", objects: str = "box-mean") -> ObjectSets:
    """Object sets of the images of manifest rows ``rows`` [G] (their ``object_boxes``), from
    ``objects`` (:data:`OBJECT_SOURCES`; box means read the grid ``layer`` names, over the
    boxes the grid's view shows: :func:`grid_views`)."""
    check_source(objects, layer)
    image_rows = index["image"].reshape(len(manifest), -1)[rows, 0]  # [G]
    if objects == "crops":  # every box, placed in the box means' frame (the grid's view, unclipped): one layout for both sources
        boxes = [b for b, _ in grid_views(store, manifest, rows, clip=False)]
        return crop_objects(store, crop_rows(store, index, len(manifest), suite)[rows], boxes, image_rows)
    return image_objects(store, image_rows, [b[seen] for b, seen in grid_views(store, manifest, rows)], layer)


def suite_objects(store: FeatureStore, manifest: pd.DataFrame, index: dict[str, np.ndarray], gallery: list[str], suite: str = "", layer: str = "final", objects: str = "box-mean") -> tuple[ObjectSets, ObjectSets]:
    """(query sets [n_queries], gallery sets [n_gallery]) of one retrieval suite: the
    queries' phrases with their relation layout, the gallery images' annotated objects
    (from ``objects``: box means of the grid ``layer`` names, or re-encoded crops)."""
    require_columns(manifest, ("object_boxes", "phrases", "relations"), suite)
    if "phrases" not in index:
        raise ValueError(f"the store has no phrases rows for suite {suite}: rerun `pipeline extract` (phrases are a caption column)")
    images = item_objects(store, manifest, index, gallery_rows_of(manifest, gallery), suite, layer, objects)
    phrase_rows = index["phrases"].reshape(len(manifest), -1)
    n = (phrase_rows >= 0).sum(1)
    layout = [relation_positions(parse_relations(cell, int(k)), int(k)) for cell, k in zip(manifest["relations"], n, strict=True)]
    return text_sets(store, phrase_rows, layout), images
