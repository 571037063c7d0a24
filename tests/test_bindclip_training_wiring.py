"""BindCLIP's training step against methods.md §1.6, value by value: each logged objective is
the smooth worst-group aggregate of its per-item losses over the batch's families, the total is
Σ_k w_k × logged_k, structural sufficiency reads s - g, and the negative's grounded words read
the plan's negative block where the two captions differ."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pipeline.config import read_params
from pipeline.scorers.bindclip.objectives import (
    caption_preference,
    consistency,
    image_contrast,
    region_grounding,
    structural_sufficiency,
    worst_group,
)
from tests.test_training import _probe

ROOT = Path(__file__).resolve().parents[1]
PARAMS_OBJECTIVE = read_params(ROOT / "params.yaml")["train"]["bindclip"]["objective"]
WEIGHTS = {"preference": 1.0, "image": 3.0, "sufficiency": 0.5, "grounding": 2.0, "reflection": 0.1, "paraphrase": 0.25}

pytestmark = pytest.mark.usefixtures("single_thread")


def _explain(model, pairs, batch, image=None, pos=None, neg=None):
    """The explanation of (image, pos, neg) columns of ``pairs`` at ``batch`` (default: the
    item's own image, its true caption, its negative)."""
    image = pairs.image if image is None else image
    pos, neg = (pairs.pos if pos is None else pos), (pairs.neg if neg is None else neg)
    return model.explain(pairs.images.index(image[batch]), pairs.texts.index(pos[batch]), pairs.texts.index(neg[batch]))


def test_each_logged_objective_is_the_worst_group_of_its_item_losses(tiny_store):
    """Under params.yaml's objective options (group_tau, ground_negatives, image_per_caption),
    every logged objective equals τ log mean_f exp(L_f / τ) over the batch's families of its
    per-item (per-token for grounding) losses, recomputed from separate forward passes:
    preference softplus(-s), sufficiency softplus(-(s - g)), the image contrast against the
    counterfactual (plus each caption's learned part on the image it is true of), Huber
    consistency of the mirrored and paraphrased items, and the grounding of both captions'
    words (the negative's rows shifted by N). At a finite τ the family each loss is filed
    under changes the value."""
    options = {k: v for k, v in PARAMS_OBJECTIVE.items() if k != "weights"}
    tau = options["group_tau"]
    assert 0 < tau < math.inf
    trainer, data, batch, model = _probe(tiny_store, tuple(WEIGHTS), **options)
    p = data.pairs
    fam = p.family[batch]
    assert len(set(fam.tolist())) > 1  # several families: the grouping shows in the value
    with torch.no_grad():
        logged = trainer.loss(model, data, batch)[1]
        e = _explain(model, p, batch)
        e_cf = _explain(model, p, batch, image=p.cf)
        s_flip = _explain(model, p, batch, image=p.flip, pos=p.flip_pos, neg=p.flip_neg).score
        s_para = _explain(model, p, batch, pos=p.para).score
    s, g = e.score, e.margin
    image = image_contrast(s, e_cf.score)
    if options.get("image_per_caption"):
        on_true, on_cf = (e.energies * e.scales).sum(-1), (e_cf.energies * e_cf.scales).sum(-1)  # [B, 2]
        image = image + image_contrast(on_true[:, 0], on_cf[:, 0]) + image_contrast(on_cf[:, 1], on_true[:, 1])
    n = (e.plan.shape[1] - 1) // 2
    maps = [(data.pos, 0)] + ([(data.neg, n)] if options.get("ground_negatives") else [])
    item, row, cells = [], [], []
    for gmap, shift in maps:
        for i in batch.tolist():
            for entry in range(int(gmap.offsets[i]), int(gmap.offsets[i + 1])):
                item.append(i)
                row.append(int(gmap.row[entry]) + shift)
                cells.append(gmap.cells[entry])
    item = torch.tensor(item)
    grounding = region_grounding(e.plan, e.r, item, torch.tensor(row), torch.stack(cells))
    want = {
        "preference": (caption_preference(s), fam),
        "sufficiency": (structural_sufficiency(s, g), fam),
        "image": (image, fam),
        "reflection": (consistency(s_flip, s), fam),
        "paraphrase": (consistency(s_para, s), fam),
        "grounding": (grounding, fam[item]),
    }
    assert set(want) <= set(logged)
    for name, (losses, groups) in want.items():
        value = float(worst_group(losses, groups, tau))
        assert logged[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
        assert value != pytest.approx(float(losses.mean()), rel=1e-3), f"{name}: the grouping must show"


def test_sufficiency_is_computed_from_the_learned_part_s_minus_g(tiny_store):
    """§1.6.3: structural sufficiency asks s - g alone (without CLIP's frozen margin g) to
    prefer the positive, softplus(-(s - g)). The check needs items whose g is far from 0, so
    that softplus(-s) is another value."""
    trainer, data, batch, model = _probe(tiny_store, ("sufficiency",), group_tau=3.0)
    with torch.no_grad():
        logged = trainer.loss(model, data, batch)[1]
        e = _explain(model, data.pairs, batch)
    fam = data.pairs.family[batch]
    learned = worst_group(structural_sufficiency(e.score, e.margin), fam, 3.0)
    whole = worst_group(caption_preference(e.score), fam, 3.0)
    assert float(learned) != pytest.approx(float(whole), rel=1e-3)
    assert logged["sufficiency"] == pytest.approx(float(learned), rel=1e-5)


def test_total_is_the_weighted_sum_of_the_logged_objectives(tiny_store):
    """The step minimises Σ_k w_k × worst_group(L_k): with six distinct weights the returned
    total equals the weighted sum of the six logged aggregates, not their plain sum."""
    trainer, data, batch, model = _probe(tiny_store, (), weights=WEIGHTS, group_tau=3.0)
    with torch.no_grad():
        total, logged = trainer.loss(model, data, batch)
    assert set(WEIGHTS) <= set(logged)
    want = sum(w * logged[k] for k, w in WEIGHTS.items())
    assert float(total) == pytest.approx(want, rel=1e-5)
    assert want != pytest.approx(sum(logged[k] for k in WEIGHTS), rel=1e-3)


def test_negative_grounding_rows_sit_in_the_negative_block_where_the_captions_differ(tiny_store):
    """ground_negatives: a word of the negative at content position j is plan row N + j. On a
    word of the prefix both captions share, a causal text tower gives both captions the same
    state, hence proportional plan rows j and N + j and the same grounding loss on either; the
    check therefore grounds the negative's relation word (word 3: 'right' against 'left'),
    whose two rows differ, and the loss must read the negative's."""
    trainer, data, batch, model = _probe(tiny_store, ("grounding",), group_tau=math.inf, ground_negatives=True)
    p = data.pairs
    data.neg.row = data.neg.row + 2  # word 1 (the shared colour) -> word 3 (the relation)
    assert (data.neg.offsets[1:] - data.neg.offsets[:-1] == 1).all()  # one word per item
    rows = data.neg.row[:8]
    pos_ids = p.texts.ids[p.pos[batch], rows + 1]
    neg_ids = p.texts.ids[p.neg[batch], rows + 1]
    assert (pos_ids != neg_ids).all()  # the captions differ at this word
    with torch.no_grad():
        got = trainer.loss(model, data, batch)[1]["grounding"]
        e = _explain(model, p, batch)
    n = (e.plan.shape[1] - 1) // 2
    item = torch.cat([torch.arange(8).repeat_interleave(2), torch.arange(8)])
    cells = torch.cat([data.pos.cells[:16], data.neg.cells[:8]])

    def value(shift):
        row = torch.cat([data.pos.row[:16], data.neg.row[:8] + shift])
        return float(worst_group(region_grounding(e.plan, e.r, item, row, cells), p.family[item], math.inf))

    assert value(n) != pytest.approx(value(0), abs=1e-4)  # the two rows tell apart
    assert got == pytest.approx(value(n), rel=1e-5)
