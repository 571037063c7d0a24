"""Geometry-aware retrieval's picture: one query's phrases matched to the objects of its top
candidates by the reranker's transport plan, for the family's report section
(:mod:`pipeline.scorers.geometry.report`).
"""

from __future__ import annotations

import json

import numpy as np

from pipeline.report import ReportContext


def pictured_query(manifest, scores: np.ndarray, clip: np.ndarray | None) -> int:
    """The first query whose target ``scores`` rank first and frozen CLIP does not (else 0)."""
    from pipeline.benchmarks.base import gallery_images
    from pipeline.benchmarks.retrieval import target_ranks

    pos = {g: j for j, g in enumerate(gallery_images(manifest))}
    target = np.array([pos[i] for i in manifest["image"]])
    mine = target_ranks(scores, target)
    theirs = target_ranks(clip, target) if clip is not None else np.full_like(mine, 2)
    hits = np.flatnonzero((mine == 1) & (theirs > 1))
    return int(hits[0]) if len(hits) else 0


def box_labels(plan: np.ndarray, seen: np.ndarray, phrases: list[str]) -> list[tuple[str, float] | None]:
    """Per annotated box of one image: (the phrase its transport plan column sends the most
    mass to, that mass), or None for a box that receives none. ``plan`` [n_phrases, n_objects]
    has a column for each box the scorer embedded, in box order, ``seen`` [n_boxes] says which
    boxes those are (the grid's view can cut boxes away: :func:`~pipeline.scorers.geometry.objects.visible_objects`)."""
    column = np.cumsum(seen) - 1  # each seen box's column of the plan
    labels: list[tuple[str, float] | None] = []
    for o, shown in enumerate(seen):
        mass = plan[: len(phrases), column[o]] if shown else np.zeros(1)
        i = int(mass.argmax())
        labels.append((phrases[i], float(mass[i])) if shown and mass.sum() > 0 else None)
    return labels


def matching_figure(ctx: ReportContext, suite: str, variant: str, baseline: str, n_candidates: int = 3):
    """The pictured query's top candidates under ``variant`` (the first query it ranks right
    and ``baseline`` does not), each object box labelled with the phrase its transport plan
    sends the most mass to (and that mass)."""
    import matplotlib.pyplot as plt
    import torch
    from matplotlib.patches import Rectangle
    from PIL import Image

    from pipeline.benchmarks.base import gallery_images
    from pipeline.scorers.geometry.objects import visible_objects
    from pipeline.scoring import suite_inputs

    entry = ctx.results[suite]
    manifest, scores = entry["manifest"], entry["scores"][variant]
    q = pictured_query(manifest, scores, entry["scores"].get(baseline))
    top = np.argsort(-scores[q], kind="stable")[:n_candidates]
    scorer = ctx.scorer(variant)
    m_store, index = suite_inputs(ctx.store, suite)
    if len(m_store) != len(manifest):
        return None
    scorer.prepare(ctx.store, m_store, index, suite)
    q_sets, c_sets = scorer.pairs(
        torch.as_tensor(top)[None], torch.arange(len(gallery_images(manifest))), torch.tensor([q])
    )
    plans = scorer.plans(q_sets, c_sets)  # [n, n_phr, n_obj]
    phrases = list(manifest["phrases"].iloc[q])
    gallery = gallery_images(manifest)
    first = {g: i for i, g in reversed(list(enumerate(manifest["image"])))}
    fig, axes = plt.subplots(1, len(top), figsize=(3.2 * len(top), 3.6))
    for ax, j, plan in zip(np.atleast_1d(axes), top, plans, strict=True):
        img = Image.open(entry["image_root"] / gallery[j]).convert("RGB")
        ax.imshow(img)
        w, h = img.size
        row = first[gallery[j]]
        boxes = json.loads(manifest["object_boxes"].iloc[row])
        # the plan's columns are the objects the scorer embedded: boxes the view cut away have none
        labels = box_labels(np.asarray(plan), visible_objects(ctx.store, manifest, np.array([row]), scorer.objects), phrases)
        for (x0, y0, x1, y1), label in zip(boxes, labels, strict=True):
            ax.add_patch(
                Rectangle(
                    (x0 * w, y0 * h), (x1 - x0) * w, (y1 - y0) * h, fill=False, color="white", lw=1
                )
            )
            if label is not None:
                ax.text(
                    x0 * w,
                    y0 * h - 1,
                    f"{label[0]} {label[1]:.2f}",
                    color="yellow",
                    fontsize=6,
                    va="bottom",
                )
        hit = " (target)" if gallery[j] == manifest["image"].iloc[q] else ""
        ax.set_title(f"rank {list(top).index(j) + 1}{hit}", fontsize=8)
        ax.axis("off")
    fig.suptitle(f"{variant}: “{manifest['captions'].iloc[q][0]}”", fontsize=8)
    fig.tight_layout()
    return fig
