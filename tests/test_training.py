"""Training objectives on hand-computed cases, and the training loop on a tiny store:
determinism under the seed, resume after a crash, checkpoint layout, decreasing loss."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.benchmarks.coco_families import FAMILIES
from pipeline.objectives import (
    box_cells,
    caption_preference,
    consistency,
    group_means,
    image_contrast,
    object_cells,
    region_grounding,
    structural_sufficiency,
    visible_cover,
    word_token_positions,
    worst_group,
)

# ---------------------------------------------------------------------------- objectives


def test_worst_group_limits_and_hand_value():
    losses = torch.tensor([1.0, 3.0, 2.0, 6.0, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 4])  # group means 2, 4, 0.5
    means = torch.tensor([2.0, 4.0, 0.5])
    torch.testing.assert_close(worst_group(losses, groups, 0.0), means.max())
    torch.testing.assert_close(worst_group(losses, groups, math.inf), means.mean())
    torch.testing.assert_close(worst_group(losses, groups, 1e-3), means.max(), atol=2e-3, rtol=0)
    big = worst_group(losses.double(), groups, 1e4)  # float64: tau*log-mean-exp cancels
    assert float(big) == pytest.approx(float(means.mean()), abs=1e-3)
    want = 1.0 * math.log((math.exp(2) + math.exp(4) + math.exp(0.5)) / 3)
    assert float(worst_group(losses, groups, 1.0)) == pytest.approx(want, rel=1e-6)
    # absent groups do not count; a single group is its own mean at any tau
    assert float(worst_group(torch.tensor([3.0, 5.0]), torch.tensor([7, 7]), 0.3)) == pytest.approx(
        4.0
    )
    assert float(worst_group(torch.zeros(0), torch.zeros(0, dtype=torch.long), 1.0)) == 0.0
    with pytest.raises(ValueError, match="group_tau"):
        worst_group(losses, groups, -1.0)
    g = group_means(losses, groups, 6)
    torch.testing.assert_close(g[[0, 1, 4]], means)
    assert torch.isnan(g[[2, 3, 5]]).all()


def test_score_objectives_hand_values():
    s = torch.tensor([0.0, 2.0, -1.0])
    torch.testing.assert_close(caption_preference(s), torch.log1p(torch.exp(-s)))
    assert float(caption_preference(torch.tensor([0.0]))) == pytest.approx(math.log(2))
    # image interaction: only the difference of margins matters
    torch.testing.assert_close(image_contrast(s, s), torch.full((3,), math.log(2)))
    torch.testing.assert_close(image_contrast(s + 5, s - 5), F.softplus(torch.full((3,), -10.0)))
    torch.testing.assert_close(image_contrast(s, s, gamma=1.0), F.softplus(torch.ones(3)))
    # sufficiency ignores the frozen margin g
    torch.testing.assert_close(
        structural_sufficiency(s + 7.0, torch.full((3,), 7.0)), caption_preference(s)
    )
    # consistency: zero on equal scores, Huber / square otherwise
    torch.testing.assert_close(consistency(s, s), torch.zeros(3))
    torch.testing.assert_close(
        consistency(torch.tensor([0.5, 3.0]), torch.zeros(2)), torch.tensor([0.125, 2.5])
    )
    torch.testing.assert_close(
        consistency(torch.tensor([3.0]), torch.zeros(1), "squared"), torch.tensor([9.0])
    )
    with pytest.raises(ValueError, match="smooth_l1"):
        consistency(s, s, "l3")


def test_region_grounding_hand_cases():
    # one item, rows [tok0, tok1, null], cells 2 depths x 4 patches + null
    R = 4
    cells = torch.tensor([[True, True, False, False], [False, False, False, True]])  # [M=2, R]
    plan = torch.zeros(1, 3, 2 * R + 1)
    plan[0, 0, [0, 1, R + 0]] = torch.tensor([0.1, 0.1, 0.1])  # all of tok0 in its box
    plan[0, 1, [3, R + 2, 2 * R]] = torch.tensor([0.1, 0.1, 0.2])  # tok1: 0.1 in, 0.1 out, 0.2 null
    r = plan.sum(-1)
    loss = region_grounding(plan, r, torch.tensor([0, 0]), torch.tensor([0, 1]), cells)
    torch.testing.assert_close(loss, torch.tensor([0.0, -math.log(0.1 / 0.4)]))
    # contrast term: tok1's 0.1 outside its box lies on another object's patch (2)
    other = torch.tensor([[False, False, True, True], [False, False, True, False]])
    contrast = region_grounding(plan, r, torch.tensor([0, 0]), torch.tensor([0, 1]), cells, other=other)
    torch.testing.assert_close(contrast, loss + torch.tensor([0.0, -math.log(0.1 / 0.2)]))


def test_compatibility_contrast_hand_computed():
    """softplus(-(mean S on own visible patches - mean S on the other objects') / T), the
    mean over depths; 0 for a token whose scene has no other object."""
    import torch.nn.functional as F

    from pipeline.objectives import compatibility_contrast

    S = torch.tensor([[[[0.9, 0.5, 0.1, -0.3], [0.2, 0.2, 0.4, 0.0]], [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]]])
    own = torch.tensor([[True, True, False, False], [True, False, False, False]])
    other = torch.tensor([[False, False, True, True], [False, False, False, False]])
    loss = compatibility_contrast(S, torch.tensor([0, 0]), torch.tensor([0, 1]), own, other, temperature=0.1)
    depth0 = F.softplus(torch.tensor(-((0.9 + 0.5) / 2 - (0.1 - 0.3) / 2) / 0.1))
    depth1 = F.softplus(torch.tensor(-((0.2 + 0.2) / 2 - (0.4 + 0.0) / 2) / 0.1))
    torch.testing.assert_close(loss, torch.stack([(depth0 + depth1) / 2, torch.tensor(0.0)]))
    # a margin m asks for a gap of m: softplus((m - gap) / T)
    with_margin = compatibility_contrast(S, torch.tensor([0]), torch.tensor([0]), own[:1], other[:1], 0.1, margin=0.3)
    gap0, gap1 = (0.9 + 0.5) / 2 - (0.1 - 0.3) / 2, (0.2 + 0.2) / 2 - (0.4 + 0.0) / 2
    expected = (F.softplus(torch.tensor((0.3 - gap0) / 0.1)) + F.softplus(torch.tensor((0.3 - gap1) / 0.1))) / 2
    torch.testing.assert_close(with_margin, expected[None])
    # the gradient raises S on the own patches and lowers it on the other object's
    S.requires_grad_(True)
    compatibility_contrast(S, torch.tensor([0]), torch.tensor([0]), own[:1], other[:1]).sum().backward()
    g = S.grad[0, 0, 1]
    assert (g[:2] < 0).all() and (g[2:] > 0).all()


def test_box_cells_and_word_positions():
    cells = box_cells(torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.6, 0.6, 0.65, 0.65]]), (2, 2))
    assert cells.tolist() == [[True, False, False, False], [False, False, False, True]]
    # a box covering a quarter of a 4x4 grid's patch (1,1) and most of (1,2)
    c = box_cells(torch.tensor([[0.3, 0.3, 0.7, 0.45]]), (4, 4)).reshape(4, 4)
    assert c[1, 1] and c[1, 2] and c.sum() == 2

    def encode(w: str) -> list[int]:  # a fake BPE: "hexagon" is two pieces
        return [1, 2] if w == "hexagon" else [3]

    pos = word_token_positions("a red hexagon left of a star", [1, 2, 6], encode)
    assert pos == [[2], [3, 4], [8]]
    assert word_token_positions("a red hexagon", [2], encode, max_tokens=3) == [[3]]
    with pytest.raises(ValueError, match="out of range"):
        word_token_positions("a red", [5], encode)


def _square(x: float, y: float, z: int, half: float = 0.25) -> dict:
    r = half / 0.78  # unit_vertices("square") has half-side 0.78 of the circumradius
    return {"shape": "square", "x": x, "y": y, "r": r, "z": z, "box": [x - half, y - half, x + half, y + half]}


def test_visible_cover_subtracts_the_objects_drawn_over_it():
    back, front = _square(0.25, 0.25, z=0), _square(0.5, 0.25, z=1)  # front hides back's right half
    cover = visible_cover([back, front], (2, 2), supersample=16)  # patches (0,0) (0,1) (1,0) (1,1)
    np.testing.assert_allclose(cover[0], [0.5, 0, 0, 0], atol=0.07)
    np.testing.assert_allclose(cover[1], [0.5, 0.5, 0, 0], atol=0.07)
    alone = visible_cover([back], (2, 2), supersample=16)  # nothing over it: the whole square
    np.testing.assert_allclose(alone[0], [1, 0, 0, 0], atol=0.07)


def test_visible_cells_match_boxes_to_objects_and_fall_back_to_the_box():
    back, front = _square(0.25, 0.25, z=0, half=0.2), _square(0.5, 0.25, z=1, half=0.2)
    foreign = [0.55, 0.55, 0.95, 0.95]  # no object has this box
    boxes = torch.tensor([back["box"], front["box"], foreign])
    cells, other = object_cells([back, front], boxes, (4, 4))
    cells, other = cells.reshape(3, 4, 4), other.reshape(3, 4, 4)
    assert cells[0].sum() >= 1 and not cells[0][:, 2:].any()  # back: only left of the front
    assert cells[0].sum() < box_cells(boxes[:1], (4, 4)).sum()  # smaller than its box
    assert cells[1][0, 1] and cells[1][0, 2] and cells[1][1, 1] and cells[1][1, 2]
    assert torch.equal(cells[2], box_cells(boxes[2:], (4, 4)).reshape(4, 4))
    assert torch.equal(other[0], cells[1] & ~cells[0]) and torch.equal(other[1], cells[0] & ~cells[1])
    assert not other[2].any()  # no object of its own: no distractors


def test_word_positions_match_open_clip_tokenizer():
    import open_clip

    cap = "a small purple hexagon partly covering a yellow pentagon"
    ids = open_clip.tokenize([cap])[0]
    for word_idx, positions in zip([2, 3, 8], word_token_positions(cap, [2, 3, 8]), strict=True):
        from open_clip.tokenizer import _tokenizer

        assert [int(ids[p]) for p in positions] == _tokenizer.encode(cap.split()[word_idx])


# ---------------------------------------------------------------------------- the loop

FAMS = list(FAMILIES)


def _cfg(out, **kw):
    from pipeline.config import TrainConfig

    base = dict(
        seeds=[0],
        steps=6,
        batch_size=8,
        lr=1e-2,
        eval_every=3,
        q0_grid=[0.5, 1.0],
        out=str(out),
        threads=1,
        scorer={"h": 16, "n_iters": 16, "absorb_every": 8},
    )
    return TrainConfig(**{**base, **kw})


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def test_load_pairs_grounding_maps_words_to_tokens(tiny_store):
    from pipeline.training import load_pairs

    data = load_pairs(tiny_store, "shapes-train")
    assert len(data) == 16 and (data.cf >= 0).all() and (data.para >= 0).all()
    assert list(np.diff(data.g_offsets)) == [2] * 16  # one-piece shape words
    # each grounded row holds the shape word's BPE id in pos
    from open_clip.tokenizer import _tokenizer

    for i in range(16):
        words = data.manifest["captions"][i][0].split()
        for e, w in zip(range(data.g_offsets[i], data.g_offsets[i + 1]), (2, 7), strict=True):
            token = int(data.texts.ids[data.pos[i], data.g_row[e] + 1])
            assert [token] == _tokenizer.encode(words[w])
    assert data.g_cells.shape == (32, 16) and data.g_cells[0].reshape(4, 4)[:2, :2].all()


def test_load_pairs_mask_region_needs_scenes_and_checks_its_name(tiny_store):
    """The tiny manifest has no ``scene`` column: "mask" falls back to the boxes (the
    masks themselves: test_visible_cells_match_boxes_to_objects_and_fall_back_to_the_box)."""
    from pipeline.training import load_pairs

    box = load_pairs(tiny_store, "shapes-train")
    mask = load_pairs(tiny_store, "shapes-train", region="mask")
    assert torch.equal(mask.g_row, box.g_row) and torch.equal(mask.g_cells, box.g_cells)
    assert torch.equal(mask.ng_cells, box.ng_cells) and mask.g_other is None
    from pipeline.training import step_losses

    _, batch, weights, model = _probe(tiny_store, ("grounding",))
    for option in ("ground_contrast", "ground_compat"):  # no distractor cells to contrast with
        with pytest.raises(ValueError, match="region='mask'"):
            step_losses(model, mask, batch, weights, 1.0, None, **{option: True})
    with pytest.raises(ValueError, match="'box' or 'mask'"):
        load_pairs(tiny_store, "shapes-train", region="disc")


def test_neg_grounding_rows_sit_in_the_negative_block(tiny_store):
    """ground_negatives adds neg's words, at plan rows N + position - 1, to the grounding
    objective; the value is the per-family mean over both captions' words (tau = inf)."""
    import math

    import torch
    from open_clip.tokenizer import _tokenizer

    from pipeline.objectives import region_grounding, worst_group
    from pipeline.training import load_pairs, step_losses

    data = load_pairs(tiny_store, "shapes-train")
    assert list(np.diff(data.ng_offsets)) == [1] * 16
    for i in range(16):  # the neg row holds the colour word's BPE id in neg
        word = data.manifest["captions"][i][1].split()[1]
        assert [int(data.texts.ids[data.neg[i], data.ng_row[i] + 1])] == _tokenizer.encode(word)
    _, batch, weights, model = _probe(tiny_store, ("grounding",))
    with torch.no_grad():
        plain = step_losses(model, data, batch, weights, math.inf, None)[1]["grounding"]
        both = step_losses(model, data, batch, weights, math.inf, None, ground_negatives=True)[1]
        e = model.explain(
            data.images.index(data.image[batch]),
            data.texts.index(data.pos[batch]),
            data.texts.index(data.neg[batch]),
        )
        n_tok = (e.plan.shape[1] - 1) // 2
        item = torch.cat([torch.arange(8).repeat_interleave(2), torch.arange(8)])
        row = torch.cat([data.g_row[:16], data.ng_row[:8] + n_tok])
        cells = torch.cat([data.g_cells[:16], data.ng_cells[:8]])
        loss = region_grounding(e.plan, e.r, item, row, cells)
        expected = worst_group(loss, data.family[item], math.inf)
    assert both["grounding"] == pytest.approx(float(expected), rel=1e-5)
    assert both["grounding"] != pytest.approx(plain, rel=1e-3)


def test_image_per_caption_adds_each_captions_image_preference(tiny_store):
    """image_per_caption: + softplus(-(E_pos(I) - E_pos(I'))) + softplus(-(E_neg(I') - E_neg(I)))
    on the scaled energies of each caption, per item (tau = inf: the mean over families)."""
    import math

    import torch
    import torch.nn.functional as F

    from pipeline.objectives import image_contrast, worst_group
    from pipeline.training import step_losses

    data, batch, weights, model = _probe(tiny_store, ("image",))
    with torch.no_grad():
        plain = step_losses(model, data, batch, weights, math.inf, None)[1]["image"]
        both = step_losses(model, data, batch, weights, math.inf, None, image_per_caption=True)[1]["image"]
        pos, neg = data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch])
        e = model.explain(data.images.index(data.image[batch]), pos, neg)
        e_cf = model.explain(data.images.index(data.cf[batch]), pos, neg)
        on_true, on_cf = (e.energies * e.scales).sum(-1), (e_cf.energies * e_cf.scales).sum(-1)
        extra = F.softplus(-(on_true[:, 0] - on_cf[:, 0])) + F.softplus(-(on_cf[:, 1] - on_true[:, 1]))
        expected = worst_group(image_contrast(e.score, e_cf.score) + extra, data.family[batch], math.inf)
    assert both == pytest.approx(float(expected), rel=1e-4)
    assert both > plain


def test_training_layout_determinism_and_resume(tmp_path, tiny_store):
    from pipeline.config import ScoreConfig
    from pipeline.training import train_scorer
    from stages.score import load_scorer

    summary = train_scorer(_cfg(tmp_path / "a", seeds=[0, 1]), tiny_store, progress=False)
    root = tmp_path / "a" / "bindclip"
    for sub in ("seed0", "seed1"):
        for f in ("model.safetensors", "config.json", "train_log.json"):
            assert (root / sub / f).is_file()
        assert not (root / sub / "resume.pt").exists()
    for f in ("model.safetensors", "config.json", "summary.json"):
        assert (root / f).is_file()
    assert set(summary["seeds"]) == {"0", "1"} and "mean" in summary["spread"]
    rec = json.loads((root / "config.json").read_text())
    assert rec["seed"] == 0 and rec["q0"] in (0.5, 1.0) and rec["scorer_kwargs"]["q0"] == rec["q0"]
    assert rec["selected_step"] in (0, 3, 6) and rec["scorer"]["h"] == 16
    log = json.loads((root / "seed0" / "train_log.json").read_text())
    assert [d["step"] for d in log["dev"]] == [0, 3, 6] and len(log["steps"]) == 6
    assert {"preference", "image", "sufficiency", "grounding", "reflection", "paraphrase"} <= set(
        log["steps"][0]
    )
    w0, w1, top = (
        _weights(root / p)
        for p in ("seed0/model.safetensors", "seed1/model.safetensors", "model.safetensors")
    )
    assert all(torch.equal(top[k], w0[k]) for k in w0)
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # seeds differ

    # same seed, same weights
    train_scorer(_cfg(tmp_path / "b"), tiny_store, progress=False)
    wb = _weights(tmp_path / "b" / "bindclip" / "seed0" / "model.safetensors")
    assert all(torch.equal(wb[k], w0[k]) for k in w0)

    # crash after 4 steps (resume.pt written at step 3), then resume: the same weights
    out = train_scorer(_cfg(tmp_path / "c"), tiny_store, progress=False, stop_after=4)
    assert out == {"stopped_at": 4}
    assert (tmp_path / "c" / "bindclip" / "seed0" / "resume.pt").is_file()
    train_scorer(_cfg(tmp_path / "c"), tiny_store, progress=False)
    wc = _weights(tmp_path / "c" / "bindclip" / "seed0" / "model.safetensors")
    assert all(torch.equal(wc[k], w0[k]) for k in w0)
    assert not (tmp_path / "c" / "bindclip" / "seed0" / "resume.pt").exists()

    # the ablations load bindclip's locked parameters and its dev-chosen q0
    les = load_scorer("bindclip-lesion", tiny_store, ScoreConfig(checkpoints=str(tmp_path / "a")))
    assert les.config.plan == "outer" and les.config.q0 == rec["q0"]
    assert all(torch.equal(les.state_dict()[k], w0[k]) for k in w0)


def test_training_reduces_the_loss(tmp_path, tiny_store):
    from pipeline.training import train_scorer

    cfg = _cfg(tmp_path, steps=30, batch_size=16, eval_every=30, lr=2e-2, q0_grid=[])
    train_scorer(cfg, tiny_store, progress=False)
    log = json.loads((tmp_path / "bindclip" / "seed0" / "train_log.json").read_text())
    total = [s["total"] for s in log["steps"]]
    assert np.mean(total[-5:]) < 0.8 * np.mean(total[:5]), total


def test_ablation_variants_are_not_trained_separately(tmp_path, tiny_store):
    from pipeline.training import train_scorer

    with pytest.raises(ValueError, match="train `pipeline train --variant bindclip`"):
        train_scorer(_cfg(tmp_path, variant="bindclip-lesion"), tiny_store, progress=False)
    with pytest.raises(ValueError, match="unknown objective"):
        train_scorer(_cfg(tmp_path, weights={"bogus": 1.0}), tiny_store, progress=False)
    with pytest.raises(ValueError, match="not a shapes suite"):  # its object words are the shapes world's
        train_scorer(_cfg(tmp_path, weights={"null": 1.0}, train_suite="coco-families"), tiny_store, progress=False)


def test_curriculum_pools_and_phases(tiny_store):
    from pipeline.training import curriculum_pools, load_pairs

    data = load_pairs(tiny_store, "shapes-dev", grounding=False)
    pools, phase_of = curriculum_pools(data, [[0.5, ["vertical", "depth"]], [1.0, FAMS]], 10)
    assert [phase_of(s) for s in (0, 4, 5, 9, 12)] == [0, 0, 1, 1, 1]
    assert set(data.family[pools[0]].tolist()) == {6, 7} and len(pools[1]) == len(data)
    pools, phase_of = curriculum_pools(data, [], 10)
    assert len(pools) == 1 and phase_of(3) == 0
    with pytest.raises(ValueError, match="unknown families"):
        curriculum_pools(data, [[1.0, ["colour"]]], 10)


def _probe(store, on: tuple[str, ...], seed: int = 0):
    """Training pairs, a batch of 8 (one item per family), weights with only ``on``
    switched on, and a tiny BindCLIP moved away from its init."""
    import torch

    from pipeline.scorers import create_scorer
    from pipeline.training import OBJECTIVES, load_pairs

    data = load_pairs(store, "shapes-train", grounding=False)
    weights = {k: (1.0 if k in on else 0.0) for k in OBJECTIVES}
    torch.manual_seed(seed)
    model = create_scorer("bindclip", store.dims, store.projections(), h=16, n_iters=16)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return data, torch.arange(8), weights, model


def test_consistency_target_original_detaches_the_reference(tiny_store):
    """Same loss value; only the gradient differs (the original item is not pulled toward
    the paraphrase); an unknown target is refused."""
    import torch

    from pipeline.training import step_losses

    grads, values = [], []
    for target in ("both", "original"):
        data, batch, weights, model = _probe(tiny_store, ("paraphrase",))
        loss, logged = step_losses(model, data, batch, weights, 1.0, None, consistency_target=target)
        loss.backward()
        values.append(logged["paraphrase"])
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert values[0] == pytest.approx(values[1]) and values[0] > 0
    assert not torch.allclose(grads[0], grads[1])
    with pytest.raises(ValueError, match="consistency_target"):
        step_losses(model, data, batch, weights, 1.0, None, consistency_target="paraphrase")


def test_paraphrase_positives_join_the_preference_objective(tiny_store):
    """With the option, preference averages over the originals and their paraphrased copies
    (one family each here: 8 items of 8 families, so the worst-group mean is a plain mean)."""
    import torch

    from pipeline.objectives import caption_preference
    from pipeline.training import step_losses

    data, batch, weights, model = _probe(tiny_store, ("preference",))
    with torch.no_grad():
        plain = step_losses(model, data, batch, weights, math.inf, None)[1]["preference"]
        both = step_losses(model, data, batch, weights, math.inf, None, paraphrase_positives=True)[1]["preference"]
        image = data.images.index(data.image[batch])
        s0 = model.score_pair(image, data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch]))
        s1 = model.score_pair(image, data.texts.index(data.para[batch]), data.texts.index(data.neg[batch]))
    assert plain == pytest.approx(float(caption_preference(s0).mean()), rel=1e-5)
    want = float((caption_preference(s0) + caption_preference(s1)).mean() / 2)  # each family: its item and its copy
    assert both == pytest.approx(want, rel=1e-5)


def test_flip_positives_join_the_preference_objective(tiny_store):
    """The mirrored copies (flip I, flip pos, flip neg) join caption preference like the
    paraphrased ones; with both options each family averages its item and its two copies."""
    import torch

    from pipeline.objectives import caption_preference
    from pipeline.training import step_losses

    data, batch, weights, model = _probe(tiny_store, ("preference",))
    assert bool((data.flip[batch] >= 0).all() and (data.flip_pos[batch] >= 0).all())
    with torch.no_grad():
        flip = step_losses(model, data, batch, weights, math.inf, None, flip_positives=True)[1]["preference"]
        every = step_losses(
            model, data, batch, weights, math.inf, None, flip_positives=True, paraphrase_positives=True
        )[1]["preference"]
        image = data.images.index(data.image[batch])
        s0 = model.score_pair(image, data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch]))
        s1 = model.score_pair(image, data.texts.index(data.para[batch]), data.texts.index(data.neg[batch]))
        s2 = model.score_pair(
            data.images.index(data.flip[batch]), data.texts.index(data.flip_pos[batch]), data.texts.index(data.flip_neg[batch])
        )
    assert flip == pytest.approx(float((caption_preference(s0) + caption_preference(s2)).mean() / 2), rel=1e-5)
    want = float((caption_preference(s0) + caption_preference(s1) + caption_preference(s2)).mean() / 3)
    assert every == pytest.approx(want, rel=1e-5)


def test_relation_l1_adds_the_mean_absolute_relation_output(tiny_store):
    import torch

    from pipeline.training import step_losses

    data, batch, weights, model = _probe(tiny_store, ("preference",))
    with torch.no_grad():
        base, logged0 = step_losses(model, data, batch, weights, 1.0, None)
        total, logged = step_losses(model, data, batch, weights, 1.0, None, relation_l1=0.5)
        e = model.explain(data.images.index(data.image[batch]), data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch]))
    mask = e.token_mask[..., None].expand_as(e.relation)
    want = float(e.relation.abs()[mask].mean())
    assert "relation_l1" not in logged0 and logged["relation_l1"] == pytest.approx(want, rel=1e-5)
    assert float(total - base) == pytest.approx(0.5 * want, rel=1e-5)


def test_reflection_per_caption_compares_each_captions_scaled_energies(tiny_store):
    import torch

    from pipeline.objectives import consistency
    from pipeline.training import step_losses

    data, batch, weights, model = _probe(tiny_store, ("reflection",))
    with torch.no_grad():
        pair = step_losses(model, data, batch, weights, math.inf, None)[1]["reflection"]
        per = step_losses(model, data, batch, weights, math.inf, None, reflection_per_caption=True)[1]["reflection"]

        def energies(img, a, b):
            e = model.explain(data.images.index(img[batch]), data.texts.index(a[batch]), data.texts.index(b[batch]))
            return (e.energies * e.scales).sum(-1), e.score

        e0, s0 = energies(data.image, data.pos, data.neg)
        e1, s1 = energies(data.flip, data.flip_pos, data.flip_neg)
    # one item per family and tau = inf: the aggregate is the plain mean over the 8 items
    assert pair == pytest.approx(float(consistency(s1, s0).mean()), rel=1e-4)
    want = float((consistency(e1[:, 0], e0[:, 0]) + consistency(e1[:, 1], e0[:, 1])).mean())
    assert per == pytest.approx(want, rel=1e-4) and per != pytest.approx(pair, rel=1e-3)


def test_binding_pairs_match_the_same_word_on_the_same_object_after_another_word():
    """"circle" after "red" (pos) and after "blue" (neg), same box: a pair; "blue" after "a"
    in both: no pair (same preceding token); a word on another box: no pair."""
    from pipeline.training import _binding_pairs

    # ids [n, C]: sot, content..., eot; rows are positions - 1
    pos_ids = torch.tensor([[49406, 1, 10, 20, 2, 1, 11, 21, 49407], [49406, 1, 10, 20, 49407, 0, 0, 0, 0]])
    neg_ids = torch.tensor([[49406, 1, 11, 20, 2, 1, 11, 21, 49407], [49406, 1, 10, 20, 49407, 0, 0, 0, 0]])
    box_a, box_b = [0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]
    # item 0: pos grounds "circle"(20) at row 2 -> box_a, "blue"(11) at row 5 -> box_b
    #         neg grounds "circle"(20) at row 2 -> box_a (after 11, not 10), "blue"(11) at row 1 -> box_b
    # item 1: identical captions: nothing differs
    offsets, rows, boxes = [0, 2, 3], [2, 5, 2], [box_a, box_b, box_a]
    n_offsets, n_rows, n_boxes = [0, 2, 3], [2, 1, 2], [box_a, box_b, box_a]
    out, pos_e, neg_e = _binding_pairs(offsets, rows, boxes, n_offsets, n_rows, n_boxes, pos_ids, neg_ids)
    assert out == [0, 1, 1] and pos_e == [0] and neg_e == [0]


def test_binding_contrast_and_its_objective(tiny_store):
    """softplus(-(mean S of the word in pos - in neg, over the object's patches) / T), the
    mean over depths; the "binding" objective is off unless its weight is set."""
    import math

    import torch.nn.functional as F

    from pipeline.objectives import binding_contrast, worst_group
    from pipeline.training import step_losses

    S = torch.zeros(1, 4, 2, 3)
    S[0, 0, :, :2] = torch.tensor([[0.8, 0.4], [0.2, 0.2]])  # pos row 0 over the object's 2 cells
    S[0, 2, :, :2] = torch.tensor([[0.2, 0.2], [0.5, 0.3]])  # neg row 2
    S[0, 0, :, 2] = S[0, 2, :, 2] = 9.0  # outside the object: ignored
    loss = binding_contrast(S, torch.tensor([0]), torch.tensor([0]), torch.tensor([2]), torch.tensor([[True, True, False]]))
    expected = (F.softplus(torch.tensor(-(0.6 - 0.2) / 0.1)) + F.softplus(torch.tensor(-(0.2 - 0.4) / 0.1))) / 2
    torch.testing.assert_close(loss, expected[None])

    data, batch, weights, model = _probe(tiny_store, ("preference",))
    data.b_offsets = np.arange(len(data) + 1)  # one pair per item: the shape word at row 2 of both captions
    data.b_pos_row = data.b_neg_row = torch.tensor([2] * len(data))
    data.b_cells = torch.zeros(len(data), 16, dtype=torch.bool)
    data.b_cells[:, :4] = True
    with torch.no_grad():
        off = step_losses(model, data, batch, weights, math.inf, None)[1]
        on = step_losses(model, data, batch, {**weights, "binding": 1.0}, math.inf, None)[1]
        e = model.explain(
            data.images.index(data.image[batch]), data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch])
        )
        n_tok = (e.plan.shape[1] - 1) // 2
        rows = torch.tensor([2] * len(batch))
        value = binding_contrast(e.S, batch, rows, rows + n_tok, data.b_cells[batch], model.config.epsilon)
    assert "binding" not in off
    assert on["binding"] == pytest.approx(float(worst_group(value, data.family[batch], math.inf)), rel=1e-5)


def test_null_grounding_hand_cases_and_its_objective(tiny_store):
    """-log(share of the row on the null patch), averaged over the item's flagged rows; the
    "null" objective flags the content tokens of words that name no object, in both
    captions, and is off unless its weight is set."""
    from open_clip.tokenizer import _tokenizer

    from pipeline.objectives import null_grounding
    from pipeline.training import naming_tokens, step_losses

    plan = torch.zeros(2, 4, 5)  # rows [tok0, tok1, tok2, null], 4 cells + null patch
    plan[0, 0] = torch.tensor([0.1, 0.0, 0.0, 0.0, 0.1])  # half on the null patch
    plan[0, 1] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2])  # all of it
    plan[0, 2] = torch.tensor([0.3, 0.0, 0.0, 0.0, 0.0])  # none: not flagged, so ignored
    words = torch.tensor([[True, True, False, False], [False, False, False, False]])
    loss = null_grounding(plan, plan.sum(-1), words)
    torch.testing.assert_close(loss, torch.tensor([math.log(2.0) / 2, 0.0]))

    ids = torch.tensor([_tokenizer.encode("the large red circle is left of a square")])
    assert naming_tokens(ids).tolist() == [[False, True, True, True, False, False, False, False, True]]

    data, batch, weights, model = _probe(tiny_store, ("preference",))
    with torch.no_grad():
        off = step_losses(model, data, batch, weights, math.inf, None)[1]
        on = step_losses(model, data, batch, {**weights, "null": 1.0}, math.inf, None)[1]
        a, b = data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch])
        e = model.explain(data.images.index(data.image[batch]), a, b)
        n_tok = (e.plan.shape[1] - 1) // 2
        flags = torch.zeros(e.r.shape, dtype=torch.bool)
        for j in range(len(batch)):  # word by word, from the decoded tokens
            for x, text in enumerate((a, b)):
                for i in range(n_tok):
                    tok = int(text.ids[j, i + 1])
                    word = _tokenizer.decoder[tok].removesuffix("</w>")
                    named = word in ("red", "green", "blue", "yellow", "purple", "orange", "white", "circle",
                                     "square", "triangle", "star", "cross", "diamond", "small", "large")
                    flags[j, x * n_tok + i] = bool(e.token_mask[j, x, i]) and not named
        value = null_grounding(e.plan, e.r, flags)
    assert flags[:, :n_tok].any() and flags[:, n_tok : 2 * n_tok].any() and not flags[:, -1].any()
    assert "null" not in off
    assert on["null"] == pytest.approx(float(worst_group(value, data.family[batch], math.inf)), rel=1e-5)


def test_learning_rate_schedules():
    from pipeline.config import TrainConfig
    from pipeline.schedule import warmup_cosine
    from pipeline.training import learning_rate

    const = TrainConfig(lr=0.3, steps=10)
    assert [learning_rate(s, const) for s in (0, 5, 9)] == [0.3, 0.3, 0.3]
    cos = TrainConfig(lr=1.0, steps=10, lr_schedule="cosine", warmup=2)
    assert learning_rate(0, cos) == 0.5 and learning_rate(1, cos) == 1.0  # linear warm-up
    assert learning_rate(2, cos) == 1.0  # the peak, then decay
    assert learning_rate(6, cos) == pytest.approx(0.5)  # halfway through the decay: cos(pi/2)
    assert learning_rate(10, cos) == pytest.approx(0.0, abs=1e-12)
    assert all(learning_rate(s, cos) == warmup_cosine(s, 1.0, 2, 10) for s in range(10))
    with pytest.raises(ValueError, match="lr_schedule"):
        learning_rate(0, TrainConfig(lr_schedule="linear"))


def test_cosine_schedule_resumes_on_the_same_curve(tmp_path, tiny_store):
    from pipeline.training import learning_rate, train_scorer

    kw = dict(lr_schedule="cosine", warmup=2, q0_grid=[])
    train_scorer(_cfg(tmp_path / "a", **kw), tiny_store, progress=False)
    assert train_scorer(_cfg(tmp_path / "b", **kw), tiny_store, progress=False, stop_after=4) == {
        "stopped_at": 4
    }
    train_scorer(_cfg(tmp_path / "b", **kw), tiny_store, progress=False)
    wa, wb = (_weights(tmp_path / p / "bindclip" / "seed0" / "model.safetensors") for p in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    logs = {
        p: json.loads((tmp_path / p / "bindclip" / "seed0" / "train_log.json").read_text())["steps"]
        for p in "ab"
    }
    assert logs["a"] == logs["b"]
    cfg = _cfg(tmp_path, **kw)  # the lr each step took, resumed or not: the step's own
    assert [e["lr"] for e in logs["a"]] == [learning_rate(s, cfg) for s in range(cfg.steps)]
    train_scorer(_cfg(tmp_path / "c", q0_grid=[]), tiny_store, progress=False)  # constant lr
    log_c = json.loads((tmp_path / "c" / "bindclip" / "seed0" / "train_log.json").read_text())
    first_c, first_a = ({k: v for k, v in e.items() if k != "lr"} for e in (log_c["steps"][0], logs["a"][0]))
    assert first_c == first_a  # the same first batch and loss, at lr 1e-2 vs 5e-3
    assert [e["lr"] for e in log_c["steps"]] == [1e-2] * 6
    assert log_c["steps"][1]["total"] != logs["a"][1]["total"]  # a different first update


def test_group_by_edit_kind_aggregates_over_the_items_edit_kinds(tiny_store):
    """group_by="edit_kind": the worst-group aggregate runs over each pair's edit kind, not
    its family (here: two kinds over the batch's 8 families); the tiny manifest has no
    scenes, so asking load_pairs for edit kinds names the missing columns."""
    import dataclasses

    import torch

    from pipeline.objectives import caption_preference, worst_group
    from pipeline.training import load_pairs, step_losses

    data, batch, weights, model = _probe(tiny_store, ("preference",))
    kinds = dataclasses.replace(data, edit_kind=torch.arange(len(data)) % 2)
    with torch.no_grad():
        by_family = step_losses(model, kinds, batch, weights, 0.5, None)[1]["preference"]
        by_kind = step_losses(model, kinds, batch, weights, 0.5, None, group_by="edit_kind")[1]["preference"]
        e = model.explain(
            data.images.index(data.image[batch]), data.texts.index(data.pos[batch]), data.texts.index(data.neg[batch])
        )
        loss = caption_preference(e.score)
    assert by_kind == pytest.approx(float(worst_group(loss, batch % 2, 0.5)), rel=1e-5)
    assert by_family == pytest.approx(float(worst_group(loss, data.family[batch], 0.5)), rel=1e-5)
    assert by_kind != pytest.approx(by_family, rel=1e-3)
    with pytest.raises(ValueError, match="edit_kinds=True"):
        step_losses(model, data, batch, weights, 0.5, None, group_by="edit_kind")
    with pytest.raises(ValueError, match="'family' or 'edit_kind'"):
        step_losses(model, data, batch, weights, 0.5, None, group_by="kind")
    with pytest.raises(ValueError, match="lacks"):
        load_pairs(tiny_store, "shapes-train", edit_kinds=True)
