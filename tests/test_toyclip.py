"""Tests for pipeline.encoders.toyclip: determinism, checkpoint loading, exact resumption,
learning on a fixed batch, and preprocessing parity with the encoder's PIL transform.

Training runs use the real ``toy-vit`` architecture with a tiny batch on a tiny synthetic
world (one coloured square per image), so they need neither the shapes world nor time.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.config import ToyClipConfig
from pipeline.encoders import load_encoder, register_toy_configs
from pipeline.encoders.toyclip import (
    batch_indices,
    build_model,
    clip_loss,
    learning_rate,
    make_optimizers,
    pixels_from_uint8,
    train_toyclip,
)

COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (50, 100, 240),
           "yellow": (240, 210, 40)}  # fmt: skip
NAMES = list(COLOURS)


def tiny_world(seed: int, indices: np.ndarray, image_size: int) -> tuple[np.ndarray, list[str]]:
    """A pure function of (seed, index): one coloured square on noise, captioned by colour."""
    images, captions = [], []
    for i in indices:
        rng = np.random.default_rng([seed, int(i)])
        im = rng.integers(90, 140, (image_size, image_size, 3), dtype=np.uint8)
        name = NAMES[int(i) % len(NAMES)]
        x, y = rng.integers(0, image_size // 2, 2)
        im[y : y + image_size // 2, x : x + image_size // 2] = COLOURS[name]
        images.append(im)
        captions.append(f"a {name} square")
    return np.stack(images), captions


def tiny_cfg(tmp_path, name: str = "run", **kw) -> ToyClipConfig:
    base = dict(seed=3, out=str(tmp_path / name), steps=6, batch_size=8, pool_size=16,
                warmup=2, lr=1e-3, log_every=1, checkpoint_every=2, threads=1,
                colourless_steps=0)  # fmt: skip
    base.update(kw)
    return ToyClipConfig(**base)


def state_of(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------------------ building blocks


def test_batch_indices_visit_every_scene_once_per_epoch():
    rows = np.concatenate([batch_indices(s, 4, 12, seed=1) for s in range(3)])  # one epoch
    assert sorted(rows.tolist()) == list(range(12))
    assert not np.array_equal(rows, batch_indices(3, 12, 12, seed=1))  # next epoch reshuffled


def test_learning_rate_warms_up_then_decays_to_zero():
    cfg = ToyClipConfig(steps=100, warmup=10, lr=1.0)
    assert learning_rate(0, cfg) == pytest.approx(0.1)
    assert learning_rate(9, cfg) == pytest.approx(1.0)
    assert learning_rate(100, cfg) == pytest.approx(0.0, abs=1e-12)
    lrs = [learning_rate(s, cfg) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_weight_decay_falls_on_trainable_matrices_only(tmp_path):
    """As CLIP: decay on weight matrices; none on biases, gains, the logit scale or embeddings."""
    cfg = tiny_cfg(tmp_path)
    model = build_model(cfg)
    decay, no_decay = make_optimizers(model, cfg)[0].param_groups
    assert decay["weight_decay"] == cfg.weight_decay > 0 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["params"] and all(p.ndim >= 2 and "embedding" not in names[id(p)] for p in decay["params"])
    assert all(p.ndim <= 1 for p in no_decay["params"] if "embedding" not in names[id(p)])  # biases, gains, logit scale
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for g in (decay, no_decay) for p in g["params"]} == trainable


def test_clip_loss_is_symmetric_infonce():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(5, 7, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(5, 7, generator=g), dim=-1)
    t = torch.tensor(2.0)
    logits = t.exp() * img @ txt.T
    ref = 0.5 * (
        -torch.log_softmax(logits, 1).diag().mean() - torch.log_softmax(logits, 0).diag().mean()
    )
    assert clip_loss(img, txt, t).item() == pytest.approx(ref.item(), rel=1e-6)
    assert clip_loss(img, txt, t).item() == pytest.approx(clip_loss(txt, img, t).item(), rel=1e-6)


def test_text_tower_is_causal():
    """A token's state depends on the words before it only (CLIP's causal mask): editing
    the last word leaves every earlier state unchanged; a swap changes the embedding even
    with a zero positional embedding (the mask alone orders the words)."""
    import open_clip

    register_toy_configs()
    tok = open_clip.get_tokenizer("toy-vit")
    ids = tok(["a red circle and a blue square", "a red circle and a blue star", "a blue circle and a red square"])
    for std in (0.0, 0.002):
        model = build_model(ToyClipConfig(text_position_std=std)).eval()
        with torch.no_grad():
            states = model.forward_intermediates(text=ids, text_indices=[-1], normalize=False)["text_intermediates"][-1]
            emb = model.encode_text(ids, normalize=True)
        torch.testing.assert_close(states[0, :7], states[1, :7], atol=1e-5, rtol=1e-5)  # sot + 6 shared words
        assert not torch.allclose(states[0, 7], states[1, 7], atol=1e-3)
        assert not torch.allclose(emb[0], emb[2], atol=1e-4)  # swapped colours
        assert not model.positional_embedding.requires_grad
        assert not model.token_embedding.weight.requires_grad


# ------------------------------------------------------------------------------ preprocessing


def test_pixels_match_encoder_pil_preprocess(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=1)
    train_toyclip(cfg, progress=False, batch_fn=tiny_world)
    enc = load_encoder("toy", checkpoint=str(tmp_path / "run" / "model.safetensors"))
    size = enc.dims.grid[0] * 8
    images, _ = tiny_world(0, np.arange(3), size)
    ours = pixels_from_uint8(images, enc.preprocess_cfg["mean"], enc.preprocess_cfg["std"])
    ref = torch.stack([enc.preprocess(Image.fromarray(im)) for im in images])
    assert ours.shape == ref.shape == (3, 3, size, size)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------ training


def test_training_is_deterministic_and_loadable(tmp_path):
    a = train_toyclip(tiny_cfg(tmp_path, "a"), progress=False, batch_fn=tiny_world)
    b = train_toyclip(tiny_cfg(tmp_path, "b"), progress=False, batch_fn=tiny_world)
    sa, sb = state_of(a["model"]), state_of(b["model"])
    assert_same_state(sa, sb)
    init = build_model(tiny_cfg(tmp_path)).state_dict()
    key = "visual.conv1.net.0.weight"  # the convolutional stem's first layer
    assert not torch.equal(sa[key], init[key])  # it trained

    out = tmp_path / "a"
    assert not (out / "resume.pt").exists()
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["toyclip"]["seed"] == 3
    assert cfg_json["open_clip_config"]["text_cfg"]["no_causal_mask"] is False  # causal, as CLIP
    log = json.loads((out / "train_log.json").read_text())
    assert [e["step"] for e in log["log"]] == list(range(1, 7))
    assert log["wall_time_s"] > 0

    enc = load_encoder("toy", checkpoint=a["model"])
    assert_same_state({k: v for k, v in enc.model.state_dict().items() if k in sa}, sa)
    images, captions = tiny_world(0, np.arange(2), 64)
    pixels = pixels_from_uint8(images, enc.preprocess_cfg["mean"], enc.preprocess_cfg["std"])
    feats = enc.encode_images(pixels)
    assert torch.isfinite(feats["embed"]).all()
    assert torch.isfinite(enc.encode_texts(enc.tokenizer(captions))["embed"]).all()


def test_resume_equals_uninterrupted_run(tmp_path):
    full = train_toyclip(tiny_cfg(tmp_path, "full"), progress=False, batch_fn=tiny_world)
    cfg = tiny_cfg(tmp_path, "crash")
    stopped = train_toyclip(cfg, progress=False, batch_fn=tiny_world, stop_after=3)
    assert stopped["stopped_at"] == 3
    assert (tmp_path / "crash" / "resume.pt").exists()
    assert not (tmp_path / "crash" / "model.safetensors").exists()
    resumed = train_toyclip(cfg, progress=False, batch_fn=tiny_world)
    assert resumed["resumed_from"] == 3
    assert not (tmp_path / "crash" / "resume.pt").exists()
    assert_same_state(state_of(full["model"]), state_of(resumed["model"]))
    log_full = json.loads((tmp_path / "full" / "train_log.json").read_text())["log"]
    log_res = json.loads((tmp_path / "crash" / "train_log.json").read_text())["log"]
    assert [e["loss"] for e in log_full] == [e["loss"] for e in log_res]


def grey_world(seed: int, indices: np.ndarray, image_size: int) -> tuple[np.ndarray, list[str]]:
    """``tiny_world`` with the colour taken out: a grey square, captioned "a square"."""
    images, _ = tiny_world(seed, indices, image_size)
    images[images.max(-1) > 150] = 128
    return images, ["a square"] * len(indices)


def test_colourless_steps_come_first_and_resume_across_the_switch(tmp_path):
    kw = {"colourless_steps": 3}
    fns = {"batch_fn": tiny_world, "colourless_batch_fn": grey_world}
    full = train_toyclip(tiny_cfg(tmp_path, "full", **kw), progress=False, **fns)
    plain = train_toyclip(tiny_cfg(tmp_path, "plain"), progress=False, batch_fn=tiny_world)
    a, b = state_of(full["model"]), state_of(plain["model"])
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the warm-up pool was used
    # a crash after the switch resumes on the main pool and ends where the full run ended
    cfg = tiny_cfg(tmp_path, "crash", **kw)
    train_toyclip(cfg, progress=False, stop_after=4, **fns)
    seen = []

    def no_grey(seed, indices, image_size):
        seen.append(len(indices))
        return grey_world(seed, indices, image_size)

    resumed = train_toyclip(cfg, progress=False, batch_fn=tiny_world, colourless_batch_fn=no_grey)
    assert seen == []  # resumed past the switch: the colourless pool is not rendered again
    assert_same_state(state_of(resumed["model"]), a)


def test_resume_with_other_config_starts_afresh(tmp_path):
    train_toyclip(tiny_cfg(tmp_path, "x"), progress=False, batch_fn=tiny_world, stop_after=2)
    other = train_toyclip(tiny_cfg(tmp_path, "x", lr=5e-4), progress=False, batch_fn=tiny_world)
    assert other["resumed_from"] is None
    ref = train_toyclip(tiny_cfg(tmp_path, "y", lr=5e-4), progress=False, batch_fn=tiny_world)
    assert_same_state(state_of(other["model"]), state_of(ref["model"]))


def counting(fn, calls: list):
    def wrapped(seed, indices, image_size):
        calls.append(len(indices))
        return fn(seed, indices, image_size)

    return wrapped


def test_rerun_keeps_a_finished_model_of_the_same_config_and_code(tmp_path, monkeypatch):
    import pipeline

    first = train_toyclip(tiny_cfg(tmp_path), progress=False, batch_fn=tiny_world)
    weights = (tmp_path / "run" / "model.safetensors").read_bytes()
    calls: list = []
    again = train_toyclip(tiny_cfg(tmp_path, threads=2), progress=False,
                          batch_fn=counting(tiny_world, calls))  # fmt: skip
    assert again["kept"] and calls == []  # nothing rendered, nothing trained
    assert again["model"] == first["model"]
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == weights
    for damaged in ("{oops", "[1]"):  # the log is informational: the model is kept regardless
        (tmp_path / "run" / "train_log.json").write_text(damaged)
        kept = train_toyclip(tiny_cfg(tmp_path), progress=False, batch_fn=counting(tiny_world, calls))
        assert kept["kept"] and kept["wall_time_s"] is None and calls == []

    other = train_toyclip(tiny_cfg(tmp_path, lr=5e-4), progress=False,
                          batch_fn=counting(tiny_world, calls))  # fmt: skip
    assert "kept" not in other and calls  # another config trains again
    calls.clear()
    monkeypatch.setattr(pipeline, "code_identity", lambda: "an edited world")
    edited = train_toyclip(tiny_cfg(tmp_path, lr=5e-4), progress=False,
                           batch_fn=counting(tiny_world, calls))  # fmt: skip
    assert "kept" not in edited and calls  # edited code trains again, as under DVC


def test_resume_made_by_other_code_starts_afresh(tmp_path, monkeypatch):
    import pipeline

    train_toyclip(tiny_cfg(tmp_path, "x"), progress=False, batch_fn=tiny_world, stop_after=2)
    monkeypatch.setattr(pipeline, "code_identity", lambda: "an edited world")
    edited = train_toyclip(tiny_cfg(tmp_path, "x"), progress=False, batch_fn=tiny_world)
    assert edited["resumed_from"] is None
    ref = train_toyclip(tiny_cfg(tmp_path, "y"), progress=False, batch_fn=tiny_world)
    assert_same_state(state_of(edited["model"]), state_of(ref["model"]))


def test_loss_decreases_on_a_fixed_batch(tmp_path):
    # pool == batch: every step sees the same 8 (image, caption) pairs
    cfg = tiny_cfg(tmp_path, steps=25, pool_size=8, warmup=5, lr=5e-4)
    train_toyclip(cfg, progress=False, batch_fn=tiny_world)
    losses = [
        e["loss"] for e in json.loads((tmp_path / "run" / "train_log.json").read_text())["log"]
    ]
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])


# ------------------------------------------------------------------------------ architecture


def test_toy_vit_has_the_convolutional_stem_and_keeps_its_grid():
    from pipeline.encoders.stem import ConvStem

    model = build_model(ToyClipConfig()).eval()
    assert isinstance(model.visual.conv1, ConvStem)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    out = model.visual.forward_intermediates(x, indices=[1], output_fmt="NCHW")
    assert out["image_intermediates"][0].shape == (2, 128, 8, 8)  # 8x8 grid as with patch 8


def test_stem_refuses_a_stride_that_is_not_the_patch_size(monkeypatch):
    import open_clip

    from pipeline.encoders import stem

    register_toy_configs()
    monkeypatch.setitem(stem.VISION_STEMS, "toy-vit", (16, 32))  # stride 4, patch 8
    with pytest.raises(ValueError, match="stride 4, but the patch size is 8"):
        stem.install_stem(open_clip.create_model("toy-vit"), "toy-vit")
