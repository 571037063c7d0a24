"""The real backbone path: activation resolution (open_clip's names and pretrained tags),
seeded random init, layer capture, clear errors without weights."""

from __future__ import annotations

import json
import re
import warnings
from types import SimpleNamespace

import pytest
import torch
from open_clip.transformer import QuickGELU

from pipeline.config import ExtractConfig
from pipeline.encoders import (
    ENCODERS,
    EncoderSpec,
    WeightsUnavailableError,
    config_uses_quick_gelu,
    load_encoder,
    open_clip_config,
    resolve_pretrained,
    weights_provenance,
)

REAL = ("ViT-L-14-336", "ViT-L-14", "ViT-B-16", "ViT-B-32")
TINY_GELU = {  # a tiny open_clip config with open_clip's default (GELU) activation
    "embed_dim": 16,
    "vision_cfg": {"image_size": 28, "layers": 2, "width": 32, "patch_size": 14, "head_width": 16},
    "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """Keys ``tinyenc`` (GELU config) and ``tinyenc-quickgelu`` (its QuickGELU twin), laid out
    like a real key pair, and ``tinyenc-42`` / ``tinyenc-ctx12`` (``tinyenc`` at 42 px, a 3 x 3
    grid, and with a 12-token context), registered for this module only."""
    import open_clip

    folder = tmp_path_factory.mktemp("tiny_pair")
    configs = {
        "enc-tiny-test": {**TINY_GELU, "quick_gelu": False},
        "enc-tiny-test-quickgelu": {**TINY_GELU, "quick_gelu": True},
        "enc-tiny-test-42": {**TINY_GELU, "vision_cfg": {**TINY_GELU["vision_cfg"], "image_size": 42}},
        "enc-tiny-test-ctx12": {**TINY_GELU, "text_cfg": {**TINY_GELU["text_cfg"], "context_length": 12}},
    }
    for name, config in configs.items():
        (folder / f"{name}.json").write_text(json.dumps(config))
        open_clip.add_model_config(folder / f"{name}.json")
    with pytest.MonkeyPatch.context() as mp:
        for key, config in (("tinyenc", ""), ("tinyenc-quickgelu", "-quickgelu"), ("tinyenc-42", "-42"), ("tinyenc-ctx12", "-ctx12")):
            spec = EncoderSpec(key, f"enc-tiny-test{config}", 1, default_pretrained="none", openai_model="enc-tiny-test-quickgelu")
            mp.setitem(ENCODERS._entries, key, spec)
        yield folder


def _activation(enc) -> type:
    return type(enc.model.visual.transformer.resblocks[0].mlp.gelu)


def _state(enc) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in enc.model.state_dict().items()}


# ------------------------------------------------------------------ which config a key builds


def test_openai_tag_builds_quickgelu_and_other_weights_the_config_the_key_names(tmp_path):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"not read")
    for name in REAL:
        plain, quick = ENCODERS.get(name), ENCODERS.get(f"{name}-quickgelu")
        assert open_clip_config(plain, "openai") == f"{name}-quickgelu"  # OpenAI weights: QuickGELU
        assert open_clip_config(plain, None) == f"{name}-quickgelu"  # the default tag is openai
        assert open_clip_config(plain, str(weights)) == name  # a file: the plain key is GELU
        assert open_clip_config(plain, "none") == name
        for tag in ("openai", str(weights), "none"):  # the explicit key is always honoured
            assert open_clip_config(quick, tag) == f"{name}-quickgelu"
        assert config_uses_quick_gelu(f"{name}-quickgelu") and not config_uses_quick_gelu(name)
        assert plain.early_layer == quick.early_layer
    assert ENCODERS.get("ViT-L-14-336").early_layer == 5
    assert open_clip_config(ENCODERS.get("toy"), None) == "toy-vit"


@pytest.mark.parametrize("name", ENCODERS.names())
def test_every_registered_encoder_names_a_config_a_layer_and_its_weights(name, tmp_path):
    """Every registry entry, read without building a model or loading weights: its own key,
    an open_clip config that exists, an early layer strictly inside the vision tower, and a
    default weights tag that resolves offline (the OpenAI weights to a QuickGELU config of
    the same tower, which the weights hint names); a toy encoder's missing checkpoint says
    how to make it."""
    import open_clip

    from pipeline.encoders import register_toy_configs

    register_toy_configs()
    spec = ENCODERS.get(name)
    assert spec.name == name and spec.weights_hint
    config = open_clip.get_model_config(spec.open_clip_model)
    assert config is not None, f"{name}: open_clip has no config {spec.open_clip_model!r}"
    assert 1 <= spec.early_layer < config["vision_cfg"]["layers"]
    assert open_clip_config(spec, "none") == spec.open_clip_model
    if spec.toy:
        assert spec.default_pretrained == "toyclip" and not spec.openai_model
        with pytest.raises(WeightsUnavailableError, match=f"toy CLIP checkpoint not found at .*{re.escape(spec.weights_hint)}"):
            resolve_pretrained(spec, None, str(tmp_path / "absent.safetensors"))
        return
    assert resolve_pretrained(spec, None, None) == {"openai": "openai", "none": "random"}[spec.default_pretrained]
    if spec.default_pretrained == "openai":  # the OpenAI weights build a QuickGELU twin of the same tower
        assert config_uses_quick_gelu(spec.open_clip_model) == name.endswith("-quickgelu")  # the key names its activation
        assert open_clip_config(spec, None) == spec.openai_model and config_uses_quick_gelu(spec.openai_model)
        twin = open_clip.get_model_config(spec.openai_model)
        assert twin["vision_cfg"] == config["vision_cfg"] and twin["text_cfg"] == config["text_cfg"]
        assert f"--model {spec.openai_model}" in spec.weights_hint


def test_plain_key_with_weights_file_runs_gelu_and_the_quickgelu_key_quickgelu(tiny_pair, tmp_path):
    from safetensors.torch import save_file

    source = load_encoder("tinyenc", pretrained="none", init_seed=5)
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in source.model.state_dict().items()}, str(path))
    gelu = load_encoder("tinyenc", pretrained=str(path))
    quick = load_encoder("tinyenc-quickgelu", pretrained=str(path))
    assert _activation(gelu) is torch.nn.GELU and _activation(quick) is QuickGELU
    for enc in (gelu, quick):
        assert all(torch.equal(v, _state(source)[k]) for k, v in _state(enc).items())
    assert gelu.fingerprint()["open_clip_model"] == "enc-tiny-test"
    assert quick.fingerprint()["open_clip_model"] == "enc-tiny-test-quickgelu"
    assert gelu.fingerprint()["pretrained"] == quick.fingerprint()["pretrained"] == resolve_pretrained(
        ENCODERS.get("tinyenc"), str(path), None
    )
    assert "init_seed" not in gelu.fingerprint()  # the seed means nothing for loaded weights
    pixels = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(gelu.encode_images(pixels)["embed"], quick.encode_images(pixels)["embed"])


# ------------------------------------------------------------------ seeded random init


def test_random_init_is_seeded_and_the_seed_is_fingerprinted(tiny_pair):
    rng = torch.random.get_rng_state()
    a, b = (load_encoder("tinyenc", pretrained="none", init_seed=0) for _ in range(2))
    c = load_encoder("tinyenc", pretrained="none", init_seed=1)
    assert torch.equal(torch.random.get_rng_state(), rng)  # drawn in a forked RNG
    sa, sb, sc = _state(a), _state(b), _state(c)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # same seed, same weights
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)  # another seed, other weights
    assert a.fingerprint() == b.fingerprint() and a.fingerprint()["init_seed"] == 0
    assert a.fingerprint() != c.fingerprint() and c.fingerprint()["init_seed"] == 1
    assert _activation(a) is torch.nn.GELU  # none runs the activation the key names


def test_random_weights_are_announced_unless_a_worker_loads_them(tiny_pair, caplog):
    """The client of a distributed extract says the weights are random; its workers, which
    load the same encoder again, pass ``warn_random=False`` and stay quiet."""
    import logging

    with caplog.at_level(logging.WARNING, logger="pipeline.encoders"):
        a = load_encoder("tinyenc", pretrained="none", init_seed=3)
        said = [r.getMessage() for r in caplog.records]
        caplog.clear()
        b = load_encoder("tinyenc", pretrained="none", init_seed=3, warn_random=False)
    assert said == ["tinyenc: random weights, seed 3 (pretrained: none)"] and not caplog.records
    assert a.fingerprint() == b.fingerprint()


def test_reader_expects_the_fingerprint_the_writer_records(tiny_pair, tmp_path):
    """``expected_fingerprint`` (every reader) equals ``Encoder.fingerprint`` (extract) for
    the same configuration, and tells seeds and activations apart."""
    from safetensors.torch import save_file

    from pipeline.cache import expected_fingerprint

    seed1 = load_encoder("tinyenc", pretrained="none", init_seed=1)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in seed1.model.state_dict().items()}, str(path))
    loaded = load_encoder("tinyenc-quickgelu", pretrained=str(path))
    for enc, cfg in (
        (seed1, ExtractConfig(model="tinyenc", pretrained="none", init_seed=1)),
        (loaded, ExtractConfig(model="tinyenc-quickgelu", pretrained=str(path))),
    ):
        store = SimpleNamespace(fingerprint=enc.fingerprint())
        assert expected_fingerprint(store, cfg) == enc.fingerprint()
    store = SimpleNamespace(fingerprint=seed1.fingerprint())
    other_seed = ExtractConfig(model="tinyenc", pretrained="none", init_seed=0)
    assert expected_fingerprint(store, other_seed)["init_seed"] == 0
    as_loaded = expected_fingerprint(store, ExtractConfig(model="tinyenc", pretrained=str(path)))
    assert "init_seed" not in as_loaded and as_loaded["pretrained"].startswith("sha256:")


def test_cli_passes_init_seed_to_extract(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app
    from stages import extract as stage

    seen = []
    monkeypatch.setattr(stage, "run", lambda cfg, progress, **_: seen.append(cfg) or {})
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    result = CliRunner().invoke(app, ["extract", "--params", str(empty), "--pretrained", "none", "--init-seed", "7"])
    assert result.exit_code == 0, result.output
    assert seen[0].init_seed == 7 and seen[0].pretrained == "none"
    assert ExtractConfig().init_seed == 0


def test_the_report_opens_the_store_score_read(tmp_path, monkeypatch):
    """``score.encoder`` names the store the tables were scored from: the report opens that
    one (and names its encoder), whatever ``extract.model`` says, as train, ridge and score do."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from stages import report as stage

    seen = []
    monkeypatch.setattr(stage, "run", lambda cfg, score, extract: seen.append(extract) or tmp_path / "report.md")
    params = tmp_path / "params.yaml"
    params.write_text("extract: {model: toy}\nscore: {encoder: toy-small}\n")
    result = CliRunner().invoke(app, ["report", "--params", str(params)])
    assert result.exit_code == 0, result.output
    assert seen[0].model == "toy-small"


# ------------------------------------------------------------------ refusals


def test_weights_path_naming_the_other_activation_is_refused_before_building(tmp_path, monkeypatch):
    from pipeline import encoders

    def never(*a, **k):
        raise AssertionError("a refused configuration must not build a model")

    monkeypatch.setattr(encoders, "create_model", never)
    hub = tmp_path / "models--timm--vit_base_patch32_clip_224.openai" / "snapshots" / "0a1b"
    laion = tmp_path / "laion" / "CLIP-ViT-B-32-laion2B-s34B-b79K"
    for folder in (hub, laion):
        folder.mkdir(parents=True)
        (folder / "open_clip_pytorch_model.bin").write_bytes(b"stand-in")
    openai_file, laion_file = hub / "open_clip_pytorch_model.bin", laion / "open_clip_pytorch_model.bin"
    assert weights_provenance("ViT-B-32", openai_file) == ("ViT-B-32:openai", True)
    assert weights_provenance("ViT-B-32-quickgelu", laion_file) == ("ViT-B-32:laion2b_s34b_b79k", False)
    assert weights_provenance("ViT-B-32", tmp_path / "weights.bin") is None
    # OpenAI (QuickGELU-trained) weights under the plain, GELU key
    with pytest.raises(ValueError, match=r"ViT-B-32:openai \(QuickGELU-trained\).*use --model ViT-B-32-quickgelu"):
        load_encoder("ViT-B-32", pretrained=str(openai_file))
    # LAION (GELU-trained) weights under the key that names QuickGELU
    with pytest.raises(ValueError, match=r"\(GELU-trained\).*builds QuickGELU; use --model ViT-B-32$"):
        load_encoder("ViT-B-32-quickgelu", pretrained=str(laion_file))


def test_a_gelu_key_with_a_weights_file_of_an_openai_only_architecture_is_refused(tmp_path, monkeypatch):
    """ViT-L-14-336's only open_clip weights are OpenAI's (QuickGELU): the hub's file under the
    plain key would build GELU silently, so it is refused naming the -quickgelu key; ViT-L-14,
    which has GELU-trained weights too, takes a file that names no entry."""
    from pipeline import encoders

    monkeypatch.setattr(encoders, "create_model", lambda *a, **k: pytest.fail("a refused configuration must not build a model"))
    weights = tmp_path / "open_clip_pytorch_model.bin"
    weights.write_bytes(b"stand-in")
    with pytest.raises(ValueError, match=r"ViT-L-14-336 \(openai\) are QuickGELU-trained.*use --model ViT-L-14-336-quickgelu"):
        load_encoder("ViT-L-14-336", pretrained=str(weights))
    from pipeline.encoders.provenance import _check_provenance

    _check_provenance(ENCODERS.get("ViT-L-14"), "ViT-L-14", str(weights))  # laion and others are GELU: no refusal
    _check_provenance(ENCODERS.get("ViT-L-14-336-quickgelu"), "ViT-L-14-336-quickgelu", str(weights))


def _save_state(state: dict[str, torch.Tensor], path, form: str) -> None:
    """``state`` as a weights file: safetensors, torch's zip, or torch's zip under a top-level
    ``state_dict`` with DataParallel's ``module.`` prefix (both of which open_clip unwraps)."""
    from safetensors.torch import save_file

    if form == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state if form == "torch" else {"state_dict": {f"module.{k}": v for k, v in state.items()}}, path)


@pytest.mark.parametrize("form", ["safetensors", "torch", "wrapped"])
def test_a_weights_file_of_another_image_size_or_context_is_refused_not_resized(tiny_pair, tmp_path, monkeypatch, form):
    """open_clip's ``load_checkpoint`` interpolates a position embedding of another length to
    fit (OpenAI's ViT-L-14 file loads into ViT-L-14-336 without an error): a file whose image
    or text position embedding differs from the config's is refused before anything is built,
    naming both shapes and the key the file fits."""
    from pipeline import encoders

    source = load_encoder("tinyenc", pretrained="none", init_seed=5)
    path = tmp_path / ("weights.safetensors" if form == "safetensors" else "weights.bin")
    _save_state(_state(source), path, form)
    loaded = load_encoder("tinyenc", pretrained=str(path))  # the file's own config reads it
    assert all(torch.equal(v, _state(source)[k]) for k, v in _state(loaded).items())
    monkeypatch.setattr(encoders, "create_model", lambda *a, **k: pytest.fail("a refused file must not build a model"))
    with pytest.raises(WeightsUnavailableError, match=r"the image position embedding in weights .* has shape \(5, 32\), "
                       r"but config 'enc-tiny-test-42' builds \(10, 32\).*; use --model tinyenc$"):
        load_encoder("tinyenc-42", pretrained=str(path))
    with pytest.raises(WeightsUnavailableError, match=r"the text position embedding .* \(8, 32\), but config 'enc-tiny-test-ctx12' builds \(12, 32\)"):
        load_encoder("tinyenc-ctx12", pretrained=str(path))


def test_a_path_naming_another_architectures_repo_is_refused(tmp_path, monkeypatch):
    """The hub folder of OpenAI's ViT-L-14 (224 px) holds ``openai``, a tag of ViT-L-14-336 too:
    it names ViT-L-14's repo, so it is refused under ViT-L-14-336 naming the key it fits; the
    architecture's own repo, and a LAION repo of ViT-L-14 under ViT-L-14, are not."""
    from pipeline import encoders
    from pipeline.encoders.provenance import _check_provenance

    monkeypatch.setattr(encoders, "create_model", lambda *a, **k: pytest.fail("a refused configuration must not build a model"))
    files = {}
    for repo in ("timm--vit_large_patch14_clip_224.openai", "timm--vit_large_patch14_clip_336.openai", "laion--CLIP-ViT-L-14-laion2B-s32B-b82K"):
        folder = tmp_path / f"models--{repo}" / "snapshots" / "0a1b"
        folder.mkdir(parents=True)
        files[repo.split("--")[1]] = folder / "open_clip_pytorch_model.bin"
        files[repo.split("--")[1]].write_bytes(b"stand-in")
    for key in ("ViT-L-14-336-quickgelu", "ViT-L-14-336"):
        with pytest.raises(WeightsUnavailableError, match=r"ViT-L-14:openai, another architecture than ViT-L-14-336; use --model ViT-L-14-quickgelu$"):
            load_encoder(key, pretrained=str(files["vit_large_patch14_clip_224.openai"]))
    _check_provenance(ENCODERS.get("ViT-L-14-336-quickgelu"), "ViT-L-14-336-quickgelu", str(files["vit_large_patch14_clip_336.openai"]))
    _check_provenance(ENCODERS.get("ViT-L-14"), "ViT-L-14", str(files["CLIP-ViT-L-14-laion2B-s32B-b82K"]))


def test_a_weights_file_runs_under_its_named_entrys_preprocessing(tiny_pair, tmp_path, monkeypatch):
    """open_clip gives a weights file its default (OpenAI) mean and std whatever it holds;
    a file in the hub folder of LAION's ViT-L-14 laion2b_s32b_b82k gets that entry's (0.5),
    in the transform and the fingerprint, and OpenAI's file OpenAI's. (open_clip builds a tiny
    stand-in for ViT-L-14 here; the file holds ViT-L-14's position embeddings only.)"""
    import open_clip

    real = open_clip.create_model

    def stand_in(name, pretrained=None, **kw):  # the meta-device shape check builds the real config
        tiny = "enc-tiny-test-quickgelu" if name.endswith("-quickgelu") else "enc-tiny-test"
        return real(name if kw.get("device") == "meta" else tiny, **kw)

    monkeypatch.setattr(open_clip, "create_model", stand_in)
    means = {}
    for repo, key in (("laion--CLIP-ViT-L-14-laion2B-s32B-b82K", "ViT-L-14"), ("timm--vit_large_patch14_clip_224.openai", "ViT-L-14-quickgelu")):
        folder = tmp_path / f"models--{repo}" / "snapshots" / "0a1b"
        folder.mkdir(parents=True)
        torch.save({"visual.positional_embedding": torch.zeros(257, 1024), "positional_embedding": torch.zeros(77, 768)}, folder / "w.bin")
        enc = load_encoder(key, pretrained=str(folder / "w.bin"))
        normalize = next(t for t in enc.preprocess.transforms if type(t).__name__ == "Normalize")
        assert (tuple(normalize.mean), tuple(normalize.std)) == (enc.preprocess_cfg["mean"], enc.preprocess_cfg["std"])
        means[key] = enc.fingerprint()["preprocess"]["mean"]
    assert means == {"ViT-L-14": [0.5] * 3, "ViT-L-14-quickgelu": list(open_clip.OPENAI_DATASET_MEAN)}
    assert enc.preprocess_cfg["std"] == open_clip.OPENAI_DATASET_STD


def test_a_torchscript_archive_is_refused_unread_naming_the_state_dict_to_use(tmp_path, monkeypatch):
    """OpenAI's own ``ViT-L-14-336px.pt`` is a TorchScript archive: loading it would run code
    from the file, so it is refused before anything reads it, naming open_clip's state dict
    and its repo instead of "check the path"; a state dict saved by ``torch.save`` is not one."""
    from pipeline import encoders

    monkeypatch.setattr(encoders, "create_model", lambda *a, **k: pytest.fail("a refused file must not build a model"))
    archive = tmp_path / "ViT-L-14-336px.pt"
    with warnings.catch_warnings():  # torch deprecates TorchScript
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(archive))
    for key in ("ViT-L-14-336-quickgelu", "ViT-L-14-336"):
        with pytest.raises(WeightsUnavailableError) as e:
            load_encoder(key, pretrained=str(archive))
        said = str(e.value)
        assert "is a TorchScript archive" in said and "check the path" not in said
        assert "timm/vit_large_patch14_clip_336.openai (file open_clip_pytorch_model.bin)" in said
    from pipeline.encoders.provenance import _is_torchscript

    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "state.pt")
    assert _is_torchscript(archive) and not _is_torchscript(tmp_path / "state.pt")


def test_missing_weight_file_names_what_to_download():
    with pytest.raises(WeightsUnavailableError, match="open_clip_pytorch_model.bin"):
        resolve_pretrained(ENCODERS.get("ViT-L-14-336"), "/no/such/weights.bin", None)
    with pytest.raises(WeightsUnavailableError, match="--model ViT-L-14-336-quickgelu --pretrained"):
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
    with pytest.raises(ValueError, match="OpenAI weights need QuickGELU"):
        encoders.load_encoder("ViT-B-32", pretrained="openai")


def test_built_activation_other_than_the_configs_is_refused(tiny_pair, monkeypatch):
    import open_clip

    real = open_clip.create_model
    monkeypatch.setattr(open_clip, "create_model", lambda name, **kw: real("enc-tiny-test"))
    with pytest.raises(ValueError, match="names QuickGELU but config 'enc-tiny-test-quickgelu' built GELU"):
        load_encoder("tinyenc-quickgelu", pretrained="none")


# ------------------------------------------------------------------ the real architecture


def test_vit_l_14_336_random_init_grids_and_layers():
    """The real architecture through the same capture code: 24x24 grid, d_v 1024, d_t 768."""
    enc = load_encoder("ViT-L-14-336-quickgelu", pretrained="none")
    assert enc.dims.grid == (24, 24) and enc.dims.d_v == 1024 and enc.dims.d_t == 768
    assert _activation(enc) is QuickGELU
    pixels = torch.randn(1, 3, 336, 336, generator=torch.Generator().manual_seed(0))
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


def test_ids_from_bpe_equal_the_tokenizers_ids(tiny_encoder):
    """Extract encodes each caption's BPE once (truncation is measured on it) and builds the ids
    from it: the same ids as the tokenizer's, at, below and past the context (16 here: 14
    tokens besides sot and eot), for text the cleaner rewrites, and for an empty one."""
    texts = [
        "a red cube left of a blue ball",
        " ".join(["red"] * 14),  # exactly the context
        " ".join(["red"] * 15),  # one past it: cut, eot kept last
        "Café  naïve &amp; <b>HTML</b> — 3 dogs!!",
        "",
    ]
    bpe = tiny_encoder.bpe(texts)
    assert [len(b) for b in bpe[1:3]] == [14, 15]
    ids = tiny_encoder.ids_from_bpe(bpe)
    assert ids.dtype == torch.long and torch.equal(ids, tiny_encoder.tokenizer(texts))


@pytest.mark.parametrize("content", ["junk", "other-toy"])
def test_a_toy_checkpoint_that_does_not_load_is_named_in_one_line(tmp_path, content):
    """A file that is not a safetensors file, or the small toy's weights under ``--model toy``,
    is named with its path and the fix, not a deserialising traceback or hundreds of size
    mismatches."""
    from safetensors.torch import save_file

    from pipeline.encoders import create_model, load_encoder, register_toy_configs

    path = tmp_path / "toy.safetensors"
    if content == "junk":
        path.write_bytes(b"\x00" * 64)
    else:
        register_toy_configs()
        save_file({k: v.contiguous() for k, v in create_model("toy-vit-small").state_dict().items()}, str(path))
    with pytest.raises(WeightsUnavailableError) as e:
        load_encoder("toy", checkpoint=str(path))
    said = str(e.value)
    assert f"could not load the toy CLIP checkpoint {path} for toy" in said and "check --model and extract.checkpoint" in said
    assert "\n" not in said and len(said) < 700
