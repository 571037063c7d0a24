"""The real backbone path: QuickGELU resolution, layer capture, clear errors without weights."""

from __future__ import annotations

import pytest
import torch

from pipeline.encoders import ENCODERS, WeightsUnavailableError, load_encoder, resolve_pretrained


def test_real_keys_resolve_to_quickgelu_configs():
    for name in ("ViT-L-14-336", "ViT-L-14", "ViT-B-16", "ViT-B-32"):
        assert ENCODERS.get(name).open_clip_model == f"{name}-quickgelu"
    assert ENCODERS.get("ViT-L-14-336").early_layer == 5


def test_missing_weight_file_names_what_to_download():
    with pytest.raises(WeightsUnavailableError, match="open_clip_pytorch_model.bin"):
        resolve_pretrained(ENCODERS.get("ViT-L-14-336"), "/no/such/weights.bin", None)
    with pytest.raises(WeightsUnavailableError, match="pipeline toyclip"):
        resolve_pretrained(ENCODERS.get("toy"), None, "/no/such/toy.safetensors")


def test_openai_weights_offline_fail_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsUnavailableError, match="vit_base_patch32_clip_224.openai"):
        load_encoder("ViT-B-32", pretrained="openai")


def test_gelu_model_with_openai_weights_is_refused(monkeypatch):
    import open_clip

    from pipeline import encoders

    real = open_clip.create_model

    def gelu_model(name, pretrained=None, **kw):  # what open_clip does for the plain config
        return real(name.replace("-quickgelu", ""), pretrained=None)

    monkeypatch.setattr(open_clip, "create_model", gelu_model)
    with pytest.raises(ValueError, match="QuickGELU"):
        encoders.load_encoder("ViT-B-32", pretrained="openai")


def test_vit_l_14_336_random_init_grids_and_layers():
    """The real architecture through the same capture code: 24x24 grid, d_v 1024, d_t 768."""
    torch.manual_seed(0)
    enc = load_encoder("ViT-L-14-336", pretrained="none")
    assert enc.dims.grid == (24, 24) and enc.dims.d_v == 1024 and enc.dims.d_t == 768
    assert isinstance(enc.model.visual.transformer.resblocks[0].mlp.gelu, __import__("open_clip").transformer.QuickGELU)
    pixels = torch.randn(1, 3, 336, 336)
    out = enc.encode_images(pixels)
    assert out["early"].shape == (1, 577, 1024) and out["final"].shape == (1, 577, 1024)
    # early = output of block 5 (1-based), raw residual stream
    vis = enc.model.visual
    with torch.no_grad():
        x = vis.conv1(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([vis.class_embedding.expand(1, 1, -1), x], dim=1) + vis.positional_embedding
        x = vis.ln_pre(vis.patch_dropout(x))
        for block in vis.transformer.resblocks[:5]:
            x = block(x)
    torch.testing.assert_close(out["early"], x, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["embed"], enc.model.encode_image(pixels), rtol=1e-4, atol=1e-4)
    ids = enc.tokenizer(["a red cube left of a blue ball"])
    t = enc.encode_texts(ids)
    assert t["tokens"].shape == (1, 77, 768)
    torch.testing.assert_close(t["embed"], enc.model.encode_text(ids), rtol=1e-4, atol=1e-4)
