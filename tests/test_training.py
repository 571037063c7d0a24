"""The one training loop on a tiny store: determinism under the seed, resume after a crash,
the checkpoint layout, the schedule, a family registered inside the test; and BindCLIP's
training hook: its grounding maps and the objectives it adds."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.config import TrainConfig


def _cfg(out, **kw) -> TrainConfig:
    base = dict(
        seeds=[0],
        steps=6,
        batch_size=8,
        lr=1e-2,
        eval_every=3,
        out=str(out),
        threads=1,
        scorer={"h": 16, "n_iters": 16, "absorb_every": 8},
        objective={"q0_grid": [0.5, 1.0]},
    )
    return TrainConfig(**{**base, **kw})


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path))


# ---------------------------------------------------------------------------- the loop


def test_training_layout_determinism_and_resume(tmp_path, tiny_store):
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.training.loop import train_variant

    summary = train_variant(_cfg(tmp_path / "a", seeds=[0, 1]), tiny_store, progress=False)
    root = tmp_path / "a" / "bindclip"
    for sub in ("seed0", "seed1"):
        for f in ("model.safetensors", "config.json", "train_log.json"):
            assert (root / sub / f).is_file()
        assert not (root / sub / "resume.pt").exists()
    for f in ("model.safetensors", "config.json", "summary.json"):
        assert (root / f).is_file()
    assert set(summary["seeds"]) == {"0", "1"} and "mean" in summary["spread"]
    rec = json.loads((root / "config.json").read_text())
    q0 = rec["chosen"]["q0"]
    assert rec["seed"] == 0 and q0 in (0.5, 1.0) and rec["scorer_kwargs"]["q0"] == q0
    from pipeline.manifests import file_sha256

    assert rec["weights_sha256"] == file_sha256(root / "model.safetensors")  # the bytes load_scorer checks
    assert set(rec["chosen"]["q0_dev_mean"]) == {"0.5", "1.0"}
    assert rec["scorer"]["h"] == 16
    log = json.loads((root / "seed0" / "train_log.json").read_text())
    assert [d["step"] for d in log["dev"]] == [0, 3, 6] and len(log["steps"]) == 6
    means = [d["mean"] for d in log["dev"]]
    assert rec["selected_step"] == log["dev"][means.index(max(means))]["step"]  # the best, earliest of equals
    assert {"total", "preference", "image", "sufficiency", "grounding", "reflection", "paraphrase"} <= set(log["steps"][0])
    w0, w1, top = (_weights(root / p) for p in ("seed0/model.safetensors", "seed1/model.safetensors", "model.safetensors"))
    assert all(torch.equal(top[k], w0[k]) for k in w0)
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # seeds differ

    # same seed, same weights
    train_variant(_cfg(tmp_path / "b"), tiny_store, progress=False)
    wb = _weights(tmp_path / "b" / "bindclip" / "seed0" / "model.safetensors")
    assert all(torch.equal(wb[k], w0[k]) for k in w0)

    # crash after 4 steps (resume.pt written at step 3), then resume: the same weights
    out = train_variant(_cfg(tmp_path / "c"), tiny_store, progress=False, stop_after=4)
    assert out == {"stopped_at": 4}
    assert (tmp_path / "c" / "bindclip" / "seed0" / "resume.pt").is_file()
    train_variant(_cfg(tmp_path / "c"), tiny_store, progress=False)
    wc = _weights(tmp_path / "c" / "bindclip" / "seed0" / "model.safetensors")
    assert all(torch.equal(wc[k], w0[k]) for k in w0)
    assert not (tmp_path / "c" / "bindclip" / "seed0" / "resume.pt").exists()

    # the ablations load bindclip's locked parameters and its dev-chosen q0
    les = load_scorer("bindclip-lesion", tiny_store, tmp_path / "a")
    assert les.config.plan == "outer" and les.config.q0 == q0
    assert all(torch.equal(les.state_dict()[k], w0[k]) for k in w0)


def test_each_seed_sets_both_the_initialisation_and_the_batch_order(tmp_path, tiny_store, monkeypatch):
    """A seed draws its own initial weights and its own batch order: two seeds trained at a
    vanishing learning rate keep initial weights far apart; with the initialisation pinned to
    one for every seed, their per-step losses still differ (other batches)."""
    from pipeline.training.loop import train_variant

    quick = dict(seeds=[0, 1], steps=3, eval_every=3, objective={"q0_grid": []})
    train_variant(_cfg(tmp_path / "init", lr=1e-9, **quick), tiny_store, progress=False)
    w0, w1 = (_weights(tmp_path / "init" / "bindclip" / f"seed{s}" / "model.safetensors") for s in (0, 1))
    assert max(float((w0[k] - w1[k]).abs().max()) for k in w0) > 1e-3  # initial weights apart

    seed_all = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda seed: seed_all(0))  # one initialisation
    train_variant(_cfg(tmp_path / "order", **quick), tiny_store, progress=False)
    totals = [
        [s["total"] for s in json.loads((tmp_path / "order" / "bindclip" / f"seed{k}" / "train_log.json").read_text())["steps"]]
        for k in (0, 1)
    ]
    assert totals[0] != totals[1]  # the same initial weights, other batches


def test_the_stores_row_numbers_never_change_the_training_data(tmp_path, tiny_encoder, tiny_store):
    """The same suites extracted in the other order number the same features otherwise (as a
    fresh store and a grown one do); the pairs a family trains on are the same tensors in the
    same order, so training gives the same weights bit for bit."""
    import dataclasses

    from pipeline.training.pairs import load_pairs
    from tests.conftest import build_pair_store

    other = build_pair_store(tmp_path, tiny_encoder, suites=("shapes-dev", "shapes-train"), dev_reversed=True)
    here, there = tiny_store.suite_index("shapes-train")["image"], other.suite_index("shapes-train")["image"]
    assert (np.argsort(here[:, 0], kind="stable") != np.argsort(there[:, 0], kind="stable")).any()  # rows reordered
    a, b = load_pairs(tiny_store, "shapes-train"), load_pairs(other, "shapes-train")
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "manifest":
            assert x["item_id"].tolist() == y["item_id"].tolist()
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f.name
        else:  # the features, one tensor per field
            assert all(torch.equal(getattr(x, g.name), getattr(y, g.name)) for g in dataclasses.fields(x)), f.name


def test_training_reduces_the_loss(tmp_path, tiny_store):
    from pipeline.training.loop import train_variant

    cfg = _cfg(tmp_path, steps=30, batch_size=16, eval_every=30, lr=2e-2, objective={"q0_grid": []})
    train_variant(cfg, tiny_store, progress=False)
    log = json.loads((tmp_path / "bindclip" / "seed0" / "train_log.json").read_text())
    total = [s["total"] for s in log["steps"]]
    assert np.mean(total[-5:]) < 0.8 * np.mean(total[:5]), total


def test_untrainable_and_ablation_variants_and_bad_options_are_refused(tmp_path, tiny_store):
    from pipeline.training.loop import train_variant

    with pytest.raises(ValueError, match="train `pipeline train --variant bindclip`"):
        train_variant(_cfg(tmp_path, variant="bindclip-lesion"), tiny_store, progress=False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        train_variant(_cfg(tmp_path, variant="clip", scorer={}), tiny_store, progress=False)
    with pytest.raises(ValueError, match="unknown objective"):
        train_variant(_cfg(tmp_path, objective={"weights": {"bogus": 1.0}}), tiny_store, progress=False)
    with pytest.raises(ValueError, match="warmup"):
        train_variant(_cfg(tmp_path, lr_schedule="cosine", warmup=6), tiny_store, progress=False)
    with pytest.raises(ValueError, match="train.bindclip.steps is 0 under lr_schedule cosine.*lr_schedule: constant keeps the initial weights"):
        train_variant(_cfg(tmp_path, lr_schedule="cosine", warmup=0, steps=0), tiny_store, progress=False)


def test_learning_rate_schedules():
    from pipeline.training.loop import learning_rate
    from pipeline.training.schedule import warmup_cosine

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
    from pipeline.training.loop import learning_rate, train_variant

    kw = dict(lr_schedule="cosine", warmup=2, objective={"q0_grid": []})
    train_variant(_cfg(tmp_path / "a", **kw), tiny_store, progress=False)
    assert train_variant(_cfg(tmp_path / "b", **kw), tiny_store, progress=False, stop_after=4) == {"stopped_at": 4}
    train_variant(_cfg(tmp_path / "b", **kw), tiny_store, progress=False)
    wa, wb = (_weights(tmp_path / p / "bindclip" / "seed0" / "model.safetensors") for p in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    logs = {p: json.loads((tmp_path / p / "bindclip" / "seed0" / "train_log.json").read_text())["steps"] for p in "ab"}
    assert logs["a"] == logs["b"]
    cfg = _cfg(tmp_path, **kw)  # the lr each step took, resumed or not: the step's own
    assert [e["lr"] for e in logs["a"]] == [learning_rate(s, cfg) for s in range(cfg.steps)]
    train_variant(_cfg(tmp_path / "c", objective={"q0_grid": []}), tiny_store, progress=False)  # constant lr
    log_c = json.loads((tmp_path / "c" / "bindclip" / "seed0" / "train_log.json").read_text())
    first_c, first_a = ({k: v for k, v in e.items() if k != "lr"} for e in (log_c["steps"][0], logs["a"][0]))
    assert first_c == first_a  # the same first batch and loss, at lr 1e-2 vs 5e-3
    assert [e["lr"] for e in log_c["steps"]] == [1e-2] * 6
    assert log_c["steps"][1]["total"] != logs["a"][1]["total"]  # a different first update


def test_pair_decisions_put_each_preference_on_its_caption():
    """s = s(I, pos, neg) > 0 prefers the positive, wherever the manifest lists it."""
    import pandas as pd

    from pipeline.training.pairs import pair_decisions

    out = pair_decisions(np.array([0.5, 0.5, -2.0]), pd.DataFrame({"correct": [0, 1, 1]}))
    assert out.tolist() == [[0.5, -0.5], [-0.5, 0.5], [2.0, -2.0]]
    assert (out.argmax(1) == [0, 1, 0]).all()  # the third item prefers its negative, option 0


def test_pair_features_are_read_in_store_order_and_returned_in_the_rows_order(tiny_store, monkeypatch):
    """Each block of reads covers ascending store rows, and the result follows the rows given."""
    import pipeline.training.pairs as pairs

    rows = np.array([7, 2, 11, 0, 5, 9, 1, 10, 3])  # first-appearance order, not store order
    calls = []

    def read(r):
        calls.append(np.asarray(r).tolist())
        return tiny_store.texts(r)

    monkeypatch.setattr(pairs, "READ_BLOCK", 4)
    got = pairs._read_half(read, rows)
    assert calls == [[0, 1, 2, 3], [5, 7, 9, 10], [11]]  # ascending blocks of at most 4
    want = tiny_store.texts(rows)
    assert torch.equal(got.tokens, want.tokens.half()) and torch.equal(got.embed, want.embed.half())
    assert torch.equal(got.ids, want.ids) and torch.equal(got.mask, want.mask)
    empty = pairs._read_half(tiny_store.texts, np.zeros(0, dtype=np.int64))
    assert empty.tokens.shape[0] == 0 and empty.tokens.dtype == torch.float16


W_PEAK = 0.05  # the test family's dev figure peaks at this weight (-|w - W_PEAK|)


def test_a_family_registered_in_the_test_trains_through_the_loop(tmp_path, tiny_store):
    """A new trainable family touches only its own code: a scorer, a factory with a
    ``make_trainer`` hook and one registry line. The loop trains, selects, resumes and
    writes its checkpoint; the score stage's loader rebuilds it with the dev choice."""
    from pipeline.scorers import SCORERS, Scorer
    from pipeline.scorers.checkpoints import load_scorer
    from pipeline.training.loop import train_variant
    from pipeline.training.pairs import load_pairs, pair_decisions
    from pipeline.training.trainer import FamilyTrainer

    class Margin(Scorer):  # s(I, A, B) = w * (cos(I, A) - cos(I, B)) + b * 0
        pairwise = True
        trainable = True

        def __init__(self, dims, proj, bias: float = 0.0):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(0.1))
            self.bias = bias

        def score_pair(self, image, text_a, text_b):
            ei = F.normalize(image.embed.float(), dim=-1)
            ca = (ei * F.normalize(text_a.embed.float(), dim=-1)).sum(-1)
            cb = (ei * F.normalize(text_b.embed.float(), dim=-1)).sum(-1)
            return self.w * (ca - cb) + self.bias

    class MarginTrainer(FamilyTrainer):
        calls = 0
        flat = False  # a dev figure equal at every step

        def __init__(self, objective):
            self.margin = objective.get("margin", 1.0)

        def load(self, store, suite, train):
            return load_pairs(store, suite)

        def n_items(self, data):
            return len(data)

        def _s(self, model, d, items):
            return model.score_pair(d.images.index(d.image[items]), d.texts.index(d.pos[items]), d.texts.index(d.neg[items]))

        def loss(self, model, data, batch):
            MarginTrainer.calls += 1
            s = self._s(model, data, batch)
            return F.softplus(self.margin - s).mean(), {"acc": float((s > 0).float().mean())}

        def dev_metrics(self, model, data, suite):
            s = self._s(model, data, torch.arange(len(data))).detach().double().numpy()
            accuracy = float((pair_decisions(s, data.manifest)[:, 0] > 0).mean())
            w = float(model.w.detach())  # a dev figure that peaks inside the run: selection must pick it
            return {"mean": 0.5 if MarginTrainer.flat else -abs(w - W_PEAK), "accuracy": accuracy, "w": w}

        def select(self, model, data, suite):
            return {"scorer_kwargs": {"bias": 0.0}, "record": {"bias": 0.0}}

    def margin(dims, proj, **kwargs):
        return Margin(dims, proj, **kwargs)

    margin.make_trainer = MarginTrainer
    SCORERS.register("test-margin", margin)
    try:
        cfg = TrainConfig(variant="test-margin", seeds=[0], steps=5, batch_size=8, lr=0.1, eval_every=2,
                          out=str(tmp_path), threads=1, objective={"margin": 2.0})
        assert train_variant(cfg, tiny_store, progress=False, stop_after=3) == {"stopped_at": 3}
        summary = train_variant(cfg, tiny_store, progress=False)
        assert MarginTrainer.calls == 3 + 3  # resumed at the step-2 checkpoint: steps 3..5
        rec = json.loads((tmp_path / "test-margin" / "config.json").read_text())
        assert rec["chosen"] == {"bias": 0.0} and rec["scorer_kwargs"] == {"bias": 0.0}
        dev = json.loads((tmp_path / "test-margin" / "seed0" / "train_log.json").read_text())["dev"]
        means = [e["mean"] for e in dev]
        best = means.index(max(means))  # the earliest of equals
        assert [e["step"] for e in dev] == [0, 2, 4, 5] and len(set(means)) == len(means)
        assert 0 < best < len(dev) - 1  # neither the initialisation nor the last step
        assert summary["seeds"]["0"]["selected_step"] == dev[best]["step"]
        w = _weights(tmp_path / "test-margin" / "model.safetensors")["w"]
        assert float(w) == pytest.approx(dev[best]["w"], abs=1e-6) and float(w) != pytest.approx(0.1, abs=1e-4)
        MarginTrainer.flat = True  # equal dev figures: the earliest, the initialisation, is kept
        flat = train_variant(TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "flat")}), tiny_store, progress=False)
        assert flat["seeds"]["0"]["selected_step"] == 0
        assert float(_weights(tmp_path / "flat" / "test-margin" / "model.safetensors")["w"]) == pytest.approx(0.1)
        scorer = load_scorer("test-margin", tiny_store, tmp_path)
        assert float(scorer.w.detach()) == float(w)
    finally:
        SCORERS._entries.pop("test-margin")


# ---------------------------------------------------------------------------- BindCLIP's hook


def _probe(store, on: tuple[str, ...], seed: int = 0, **objective):
    """BindCLIP's trainer with only the objectives ``on`` weighted (1 each), its training
    data, a batch of 8 (one item per family) and a tiny BindCLIP moved away from its init."""
    from pipeline.scorers import create_scorer
    from pipeline.scorers.bindclip.training import OBJECTIVES, BindClipTrainer

    trainer = BindClipTrainer({"weights": {k: (1.0 if k in on else 0.0) for k in OBJECTIVES}, "consistency_items": None, **objective})
    data = trainer.load(store, "shapes-train", train=True)
    torch.manual_seed(seed)
    model = create_scorer("bindclip", store.dims, store.projections(), h=16, n_iters=16)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return trainer, data, torch.arange(8), model


def test_without_counterfactual_renders_the_image_objective_takes_a_donor_image(tiny_store, caplog, monkeypatch):
    """methods.md 1.6.2: the margin on I must exceed the margin on a donor I', "a different
    image". Real photographs (coco-families) have no counterfactual render, so the objective
    contrasts each item's image with the next batch item's, the same loss as a counterfactual
    column holding those images; reflection, without flips, is not computed and is named."""
    import logging

    trainer, data, batch, model = _probe(tiny_store, ("preference", "image", "reflection"))
    d = data.pairs
    own = d.image[batch]
    donors = torch.where(own.roll(1) != own, own.roll(1), -1)
    assert (donors >= 0).any()
    explicit = torch.full_like(d.cf, -1)
    explicit[batch] = donors
    d.flip = torch.full_like(d.flip, -1)
    with torch.no_grad():
        d.cf = explicit
        as_counterfactual = trainer.loss(model, data, batch)[1]
        d.cf = torch.full_like(d.cf, -1)  # as coco-families: no counterfactual rendered
        with_donor = trainer.loss(model, data, batch)[1]
    assert "image" in with_donor and with_donor["image"] == pytest.approx(as_counterfactual["image"], abs=1e-6)
    assert "reflection" not in with_donor
    import pipeline.scorers.bindclip.training as training

    def blanked(store, suite):
        pairs = load_pairs(store, suite)
        pairs.cf, pairs.flip = torch.full_like(pairs.cf, -1), torch.full_like(pairs.flip, -1)
        return pairs

    load_pairs = training.load_pairs
    monkeypatch.setattr(training, "load_pairs", blanked)
    with caplog.at_level(logging.WARNING, logger=training.__name__):
        trainer.load(tiny_store, "shapes-train", train=True)
    assert "no counterfactual images: the image objective contrasts each item's image with the next batch item's" in caplog.text
    assert "no flipped images: the reflection objective is not computed" in caplog.text


def test_grounding_maps_words_to_tokens(tiny_store):
    from open_clip.tokenizer import _tokenizer

    from pipeline.scorers.bindclip.training import load_grounded

    data = load_grounded(tiny_store, "shapes-train", negatives=True)
    pairs, g = data.pairs, data.pos
    assert len(pairs) == 16 and (pairs.cf >= 0).all() and (pairs.para >= 0).all()
    assert list(np.diff(g.offsets)) == [2] * 16  # one-piece shape words
    for i in range(16):  # each grounded row holds the shape word's BPE id in pos
        words = pairs.manifest["captions"][i][0].split()
        for e, w in zip(range(g.offsets[i], g.offsets[i + 1]), (2, 7), strict=True):
            assert [int(pairs.texts.ids[pairs.pos[i], g.row[e] + 1])] == _tokenizer.encode(words[w])
    assert g.cells.shape == (32, 16) and g.cells[0].reshape(4, 4)[:2, :2].all()
    assert list(np.diff(data.neg.offsets)) == [1] * 16
    for i in range(16):  # the neg row holds the colour word's BPE id in neg
        word = pairs.manifest["captions"][i][1].split()[1]
        assert [int(pairs.texts.ids[pairs.neg[i], data.neg.row[i] + 1])] == _tokenizer.encode(word)
    assert load_grounded(tiny_store, "shapes-train").neg is None


def test_neg_grounding_rows_sit_in_the_negative_block(tiny_store):
    """ground_negatives adds neg's words, at plan rows N + position - 1, to the grounding
    objective; the value is the per-family mean over both captions' words (tau = inf)."""
    from pipeline.scorers.bindclip.objectives import region_grounding, worst_group

    plain_t, plain_d, batch, model = _probe(tiny_store, ("grounding",), group_tau=math.inf)
    both_t, data, _, _ = _probe(tiny_store, ("grounding",), group_tau=math.inf, ground_negatives=True)
    assert plain_d.neg is None and data.neg is not None
    with torch.no_grad():
        plain = plain_t.loss(model, plain_d, batch)[1]["grounding"]
        both = both_t.loss(model, data, batch)[1]["grounding"]
        p = data.pairs
        e = model.explain(p.images.index(p.image[batch]), p.texts.index(p.pos[batch]), p.texts.index(p.neg[batch]))
        n_tok = (e.plan.shape[1] - 1) // 2
        item = torch.cat([torch.arange(8).repeat_interleave(2), torch.arange(8)])
        row = torch.cat([data.pos.row[:16], data.neg.row[:8] + n_tok])
        cells = torch.cat([data.pos.cells[:16], data.neg.cells[:8]])
        expected = worst_group(region_grounding(e.plan, e.r, item, row, cells), p.family[item], math.inf)
    assert both == pytest.approx(float(expected), rel=1e-5)
    assert both != pytest.approx(plain, rel=1e-3)


def test_grounded_tokens_past_the_truncation_are_left_out(tiny_store):
    """A scorer truncating captions at the second shape word's row has no plan row for that
    word: grounding keeps the words before it (pos rows < N, neg rows shifted by N) and
    drops it, rather than reading the first row of the negative block."""
    from pipeline.scorers.bindclip.objectives import region_grounding, worst_group

    trainer, data, batch, _ = _probe(tiny_store, ("grounding",), group_tau=math.inf, ground_negatives=True)
    cut = int(data.pos.row[:16].max())  # the second shape word's row in every item
    assert cut > int(data.pos.row[:16].min()) and cut > int(data.neg.row[:8].max())
    _, _, _, model = _probe(tiny_store, ("grounding",))
    model.config = dataclasses.replace(model.config, max_tokens=cut)
    with torch.no_grad():
        got = trainer.loss(model, data, batch)[1]["grounding"]
        p = data.pairs
        e = model.explain(p.images.index(p.image[batch]), p.texts.index(p.pos[batch]), p.texts.index(p.neg[batch]))
        assert (e.plan.shape[1] - 1) // 2 == cut
        kept = data.pos.row[:16] < cut
        item = torch.cat([torch.arange(8).repeat_interleave(2)[kept], torch.arange(8)])
        row = torch.cat([data.pos.row[:16][kept], data.neg.row[:8] + cut])
        cells = torch.cat([data.pos.cells[:16][kept], data.neg.cells[:8]])
        expected = worst_group(region_grounding(e.plan, e.r, item, row, cells), p.family[item], math.inf)
    assert int(kept.sum()) == 8 and got == pytest.approx(float(expected), rel=1e-5)


def test_consistency_items_caps_the_copies_at_the_first_items(tiny_store):
    """consistency_items = 3: reflection and paraphrase compare the first 3 items of the batch
    only, while the image objective keeps all 8."""
    from pipeline.scorers.bindclip.objectives import consistency, image_contrast, worst_group

    on = ("image", "reflection", "paraphrase")
    trainer, data, batch, model = _probe(tiny_store, on, group_tau=math.inf, consistency_items=3)
    with torch.no_grad():
        logged = trainer.loss(model, data, batch)[1]
        p, first = data.pairs, batch[:3]
        s0 = model.score_pair(p.images.index(p.image[batch]), p.texts.index(p.pos[batch]), p.texts.index(p.neg[batch]))
        s_cf = model.score_pair(p.images.index(p.cf[batch]), p.texts.index(p.pos[batch]), p.texts.index(p.neg[batch]))
        s_flip = model.score_pair(p.images.index(p.flip[first]), p.texts.index(p.flip_pos[first]), p.texts.index(p.flip_neg[first]))
        s_para = model.score_pair(p.images.index(p.image[first]), p.texts.index(p.para[first]), p.texts.index(p.neg[first]))
        fam = p.family[batch]
    assert logged["image"] == pytest.approx(float(worst_group(image_contrast(s0, s_cf), fam, math.inf)), rel=1e-4)
    assert logged["reflection"] == pytest.approx(float(worst_group(consistency(s_flip, s0[:3]), fam[:3], math.inf)), rel=1e-4, abs=1e-6)
    assert logged["paraphrase"] == pytest.approx(float(worst_group(consistency(s_para, s0[:3]), fam[:3], math.inf)), rel=1e-4, abs=1e-6)


def test_q0_selection_takes_the_best_dev_mean_and_the_first_listed_on_a_tie(tiny_store, monkeypatch):
    trainer, _, _, model = _probe(tiny_store, ("preference",), q0_grid=[2.0, 0.5, 1.0])
    model.config = dataclasses.replace(model.config, consensus=True)
    means = {2.0: 0.6, 0.5: 0.7, 1.0: 0.7}
    monkeypatch.setattr(trainer, "dev_metrics", lambda m, d, s: {"mean": means[m.config.q0]})
    picked = trainer.select(model, None, "shapes-dev")
    assert picked["scorer_kwargs"] == {"q0": 0.5} and model.config.q0 == 0.5
    assert picked["record"]["q0_dev_mean"] == {"2.0": 0.6, "0.5": 0.7, "1.0": 0.7}


def test_image_per_caption_adds_each_captions_image_preference(tiny_store):
    """image_per_caption: + softplus(-(E_pos(I) - E_pos(I'))) + softplus(-(E_neg(I') - E_neg(I)))
    on the scaled energies of each caption, per item (tau = inf: the mean over families)."""
    from pipeline.scorers.bindclip.objectives import image_contrast, worst_group

    plain_t, data, batch, model = _probe(tiny_store, ("image",), group_tau=math.inf)
    both_t, _, _, _ = _probe(tiny_store, ("image",), group_tau=math.inf, image_per_caption=True)
    with torch.no_grad():
        plain = plain_t.loss(model, data, batch)[1]["image"]
        both = both_t.loss(model, data, batch)[1]["image"]
        p = data.pairs
        pos, neg = p.texts.index(p.pos[batch]), p.texts.index(p.neg[batch])
        e = model.explain(p.images.index(p.image[batch]), pos, neg)
        e_cf = model.explain(p.images.index(p.cf[batch]), pos, neg)
        on_true, on_cf = (e.energies * e.scales).sum(-1), (e_cf.energies * e_cf.scales).sum(-1)
        extra = F.softplus(-(on_true[:, 0] - on_cf[:, 0])) + F.softplus(-(on_cf[:, 1] - on_true[:, 1]))
        expected = worst_group(image_contrast(e.score, e_cf.score) + extra, p.family[batch], math.inf)
    assert both == pytest.approx(float(expected), rel=1e-4)
    assert both > plain


def test_consistency_objectives_compare_the_copy_with_the_original(tiny_store):
    """reflection / paraphrase: smooth_l1(s(copy) - s(I, pos, neg)) per item; the total is
    the weighted sum of the aggregated objectives."""
    from pipeline.scorers.bindclip.objectives import consistency, worst_group

    trainer, data, batch, model = _probe(tiny_store, ("reflection", "paraphrase"), group_tau=math.inf)
    with torch.no_grad():
        total, logged = trainer.loss(model, data, batch)
        p = data.pairs
        s0 = model.score_pair(p.images.index(p.image[batch]), p.texts.index(p.pos[batch]), p.texts.index(p.neg[batch]))
        s_flip = model.score_pair(p.images.index(p.flip[batch]), p.texts.index(p.flip_pos[batch]), p.texts.index(p.flip_neg[batch]))
        s_para = model.score_pair(p.images.index(p.image[batch]), p.texts.index(p.para[batch]), p.texts.index(p.neg[batch]))
        fam = p.family[batch]
        refl = worst_group(consistency(s_flip, s0), fam, math.inf)
        para = worst_group(consistency(s_para, s0), fam, math.inf)
    assert logged["reflection"] == pytest.approx(float(refl), rel=1e-4, abs=1e-6)
    assert logged["paraphrase"] == pytest.approx(float(para), rel=1e-4, abs=1e-6)
    assert set(logged) == {"reflection", "paraphrase", "acc", "sinkhorn_err"}  # weight 0: not computed
    assert float(total) == pytest.approx(logged["reflection"] + logged["paraphrase"], rel=1e-5)


def test_a_resume_or_finished_seed_is_kept_only_under_the_same_data_and_eval_every(tmp_path, tiny_store, monkeypatch):
    """A rerun keeps a seed finished under the same fingerprint (a run killed in its third
    seed trains only that one again) and resumes an interrupted one; other data (the dev
    suite's manifest rebuilt) or another ``eval_every`` (it decides which steps can be
    selected) start again at step 0."""
    import pipeline.training.loop as loop

    cfg = _cfg(tmp_path, seeds=[0, 1])
    loop.train_variant(cfg, tiny_store, progress=False)
    built: list[str] = []  # a scorer is built once to check its options, then only for a seed that trains
    create = loop.create_scorer
    monkeypatch.setattr(loop, "create_scorer", lambda *a, **k: built.append(a[0]) or create(*a, **k))
    (tmp_path / "bindclip" / "seed1" / "config.json").unlink()  # seed 1 interrupted
    before = _weights(tmp_path / "bindclip" / "seed0" / "model.safetensors")
    loop.train_variant(cfg, tiny_store, progress=False)
    assert built == ["bindclip", "bindclip"]  # the check, then seed 1 only: seed 0 kept as it was
    assert all(torch.equal(before[k], v) for k, v in _weights(tmp_path / "bindclip" / "seed0" / "model.safetensors").items())

    fp = json.loads((tmp_path / "bindclip" / "seed0" / "config.json").read_text())["fingerprint"]
    data = loop.data_identity(tiny_store, cfg)
    assert loop._fingerprint(cfg, 0, tiny_store, data) == fp
    assert loop._fingerprint(_cfg(tmp_path, seeds=[0, 1], eval_every=2), 0, tiny_store, data) != fp
    other = {suite: [f"another-{sha}", rows] for suite, (sha, rows) in data.items()}
    assert loop._fingerprint(cfg, 0, tiny_store, other) != fp
    assert loop._fingerprint(_cfg(tmp_path / "x", seeds=[0, 1], threads=2), 0, tiny_store, data) == fp
    monkeypatch.setattr(loop, "code_identity", lambda: "an edited objective")
    assert loop._fingerprint(cfg, 0, tiny_store, data) != fp  # edited code trains again, as under DVC


def test_code_identity_changes_with_any_source_file(tmp_path):
    from pipeline import code_identity

    (tmp_path / "ot").mkdir()
    (tmp_path / "ot" / "sinkhorn.py").write_text("EPS = 0.1\n")
    (tmp_path / "loop.py").write_text("STEPS = 1\n")
    (tmp_path / "notes.txt").write_text("not code")
    first = code_identity(tmp_path)
    (tmp_path / "notes.txt").write_text("edited, still not code")
    assert code_identity(tmp_path) == first
    (tmp_path / "ot" / "sinkhorn.py").write_text("EPS = 0.2\n")  # a module the family imports
    assert code_identity(tmp_path) != first


def test_scoring_reads_the_seeds_of_the_last_training_only(tmp_path, tiny_store):
    """A rerun with fewer seeds leaves the earlier run's seed folder; the seed variants
    scored are the summary's seeds, not every folder."""
    from pipeline.scorers.checkpoints import seed_checkpoints
    from pipeline.training.loop import train_variant

    train_variant(_cfg(tmp_path, seeds=[0, 1], steps=3), tiny_store, progress=False)
    assert [p.name for p in seed_checkpoints("bindclip", tmp_path)] == ["seed0", "seed1"]
    train_variant(_cfg(tmp_path, seeds=[0], steps=3, lr=5e-2), tiny_store, progress=False)
    assert (tmp_path / "bindclip" / "seed1" / "model.safetensors").is_file()
    assert [p.name for p in seed_checkpoints("bindclip", tmp_path)] == ["seed0"]


@pytest.mark.parametrize(("section", "value", "message"), [
    ("objective", {"ground_negatives": "no"}, r"BindCLIP objective options: ground_negatives = 'no': Input should be a valid boolean"),
    ("objective", {"group_tau": "abc"}, r"BindCLIP objective options: group_tau = 'abc': Input should be a valid number"),
    ("objective", {"gama": 1.0}, r"unknown BindCLIP objective options \['gama'\]; valid: \["),
    ("objective", {"weights": {"bogus": 1.0}}, r"BindCLIP objective options: unknown objective weight\(s\) \['bogus'\]; valid: pref"),
    ("scorer", {"text_center": "no"}, r"BindClip options: text_center = 'no': Input should be a valid boolean"),
    ("scorer", {"nu_vv": 0.3}, r"unknown BindClip options \['nu_vv'\]"),
])  # fmt: skip
def test_family_options_are_checked_strictly_in_one_line(tmp_path, tiny_store, section, value, message):
    """A YAML 'no' given to a boolean option was read as true (and trained like it), a typo
    or a string crashed with a TypeError traceback: each is now one line naming the option."""
    from pipeline.config import ParamsError
    from pipeline.training.loop import train_variant

    cfg = _cfg(tmp_path)
    options = {**getattr(cfg, section), **value}
    with pytest.raises(ParamsError, match=message):
        train_variant(_cfg(tmp_path, **{section: options}), tiny_store, progress=False)


def test_train_checks_every_listed_variant_before_training_any(tmp_path):
    """A misspelled variant in train.variants is refused before the first one trains."""
    import yaml
    from typer.testing import CliRunner

    from pipeline.cli import app

    params = tmp_path / "params.yaml"
    section = {"steps": 2, "out": str(tmp_path / "ck")}
    params.write_text(yaml.safe_dump({"train": {"variants": ["global-m", "glbal-m"], "global-m": section}}))
    result = CliRunner().invoke(app, ["train", "--params", str(params), "--quiet"])
    assert result.exit_code == 1 and f"{params}: train.variants names unknown scorer(s) glbal-m; valid scorers:" in result.output
    assert not (tmp_path / "ck").exists()


def test_batch_entries_are_each_items_csr_range_in_batch_order():
    """Items 2, 0, 2 and 1 of a CSR with 2, 0, 3 entries: item 2's entries (2, 3, 4) twice,
    item 0's (0, 1), item 1 none; each entry tagged with its item's place in the batch."""
    from pipeline.scorers.bindclip.training import _batch_entries

    offsets = np.array([0, 2, 2, 5])
    ent, item = _batch_entries(offsets, torch.tensor([2, 0, 2, 1]))
    assert ent.tolist() == [2, 3, 4, 0, 1, 2, 3, 4] and ent.dtype == torch.long
    assert item.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    ent, item = _batch_entries(offsets, torch.tensor([1]))
    assert ent.tolist() == [] and item.tolist() == []
