"""Contract tests over the whole scorer registry (timm style): every registered variant is
built on small random dims and must return finite [B] scores; trainable ones must pass a
gradient to every parameter. A new variant is tested the moment it is registered."""

from __future__ import annotations

import pytest
import torch

from pipeline.features import FeatureDims, ImageFeatures, Projections, TextFeatures
from pipeline.scorers import SCORERS, create_scorer, option_scores

DIMS = FeatureDims(grid=(3, 4), d_v=16, d_t=12, embed_dim=8, context_length=12)


pytestmark = pytest.mark.usefixtures("single_thread")


def _scores_choices(name: str) -> bool:
    return create_scorer(name, dims=DIMS, proj=random_projections()).scores_choices


def random_projections(dims: FeatureDims = DIMS, seed: int = 0) -> Projections:
    g = torch.Generator().manual_seed(seed)
    return Projections(
        visual_proj=torch.randn(dims.d_v, dims.embed_dim, generator=g) / dims.d_v**0.5,
        text_projection=torch.randn(dims.d_t, dims.embed_dim, generator=g) / dims.d_t**0.5,
        logit_scale=torch.tensor(100.0),
    )


def random_image(B: int, dims: FeatureDims = DIMS, seed: int = 0) -> ImageFeatures:
    g = torch.Generator().manual_seed(seed)
    R = dims.n_patches
    return ImageFeatures(
        early=3 * torch.randn(B, R, dims.d_v, generator=g),
        final=torch.randn(B, R, dims.d_v, generator=g),
        cls=torch.randn(B, dims.d_v, generator=g),
        embed=torch.randn(B, dims.embed_dim, generator=g),
    )


def random_text(lengths: list[int], dims: FeatureDims = DIMS, seed: int = 0) -> TextFeatures:
    """Captions with the given content lengths (sot + content + eot, zero padded)."""
    g = torch.Generator().manual_seed(seed)
    B, C = len(lengths), dims.context_length
    mask = torch.zeros(B, C, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, : min(n + 2, C)] = True
    ids = torch.randint(1, 49000, (B, C), generator=g) * mask
    tokens = torch.randn(B, C, dims.d_t, generator=g) * mask[..., None]
    return TextFeatures(ids, mask, tokens, torch.randn(B, dims.embed_dim, generator=g))


def _scores(scorer, image, text_a, text_b):
    if scorer.pairwise:
        return scorer.score_pair(image, text_a, text_b)
    return scorer.score(image, text_a)


# Scorers of choice items; the retrieval-only ones (geometry-aware rerankers) are checked below.
CHOICE_SCORERS = [n for n in SCORERS.names() if _scores_choices(n)]
RETRIEVAL_ONLY = [n for n in SCORERS.names() if not _scores_choices(n)]


@pytest.mark.parametrize("name", SCORERS.names())
def test_every_variant_says_what_it_is(name):
    """`pipeline variants` prints the first line of each factory's docstring."""
    doc = (SCORERS.get(name).__doc__ or "").strip()
    first = doc.splitlines()[0] if doc else ""
    assert first.endswith((".", ")")) and len(first) <= 110, name  # a whole sentence on its line


@pytest.mark.parametrize("name", RETRIEVAL_ONLY)
def test_retrieval_only_scorers_are_rerankers_that_refuse_choice_items(name):
    scorer = create_scorer(name, dims=DIMS, proj=random_projections())
    assert scorer.reranker and not scorer.pairwise and scorer.base == "clip"
    with pytest.raises(RuntimeError, match="retrieval suites only"):
        scorer.score(random_image(2), random_text([3, 4], seed=1))


@pytest.mark.parametrize("name", CHOICE_SCORERS)
def test_shape_finiteness_and_gradients(name):
    torch.manual_seed(0)
    scorer = create_scorer(name, dims=DIMS, proj=random_projections())
    image = random_image(3)
    text_a, text_b = random_text([3, 5, 7], seed=1), random_text([4, 2, 7], seed=2)
    s = _scores(scorer, image, text_a, text_b)
    assert s.shape == (3,)
    assert torch.isfinite(s).all()
    params = list(scorer.parameters())
    if not scorer.trainable:
        return
    assert params, f"{name} is trainable but has no parameters"
    s.pow(2).sum().backward()
    exempt = set(getattr(scorer, "zero_grad_at_init", ()))  # 0 at init in exact arithmetic, declared
    for pname, p in scorer.named_parameters():
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient for {pname}"
        if pname not in exempt:
            assert p.grad.abs().sum() > 0, f"{name}: zero gradient for {pname}"


@pytest.mark.parametrize("name", CHOICE_SCORERS)
def test_option_scores_decide_like_the_scorer(name):
    scorer = create_scorer(name, dims=DIMS, proj=random_projections())
    image = random_image(4)
    a, b = random_text([3, 5, 7, 1], seed=3), random_text([4, 2, 7, 6], seed=4)
    with torch.no_grad():
        out = option_scores(scorer, image, [a, b])
        pair = scorer.score_pair(image, a, b)
    assert out.shape == (4, 2) and torch.isfinite(out).all()
    assert torch.equal(torch.sign(out[:, 0] - out[:, 1]), torch.sign(pair.float()))


RANKING_SCORERS = [n for n in CHOICE_SCORERS if not create_scorer(n, dims=DIMS, proj=random_projections()).pairwise]


@pytest.mark.parametrize("name", RANKING_SCORERS)
def test_score_matrix_is_score_of_every_pair(name):
    """A per-caption scorer's [Ni, Nt] matrix (retrieval) holds its score of each pair."""
    torch.manual_seed(0)
    scorer = create_scorer(name, dims=DIMS, proj=random_projections()).eval()
    for p in scorer.parameters():  # away from any identity initialisation
        p.data.add_(0.05 * torch.randn_like(p))
    image, text = random_image(5), random_text([2, 5, 9, 1])
    with torch.no_grad():
        matrix = scorer.score_matrix(image, text)  # [5, 4]
        pairs = torch.stack([scorer.score(image.index(torch.full((4,), i)), text) for i in range(5)])
    assert matrix.shape == (5, 4)
    torch.testing.assert_close(matrix, pairs, rtol=1e-5, atol=1e-5)


TRAINABLE = [n for n in SCORERS.names() if create_scorer(n, dims=DIMS, proj=random_projections()).trainable]


@pytest.mark.parametrize("variant", TRAINABLE)
def test_a_missing_checkpoint_names_the_command_that_writes_it(variant, tiny_store, tmp_path):
    """Every trainable variant's missing checkpoint names its own fit command: `pipeline
    ridge` for the ridge map, `pipeline train --variant <v>` for the trained scorers (an
    ablation names the variant whose checkpoint it shares)."""
    from pipeline.scorers.checkpoints import checkpoint_owner, load_scorer

    with pytest.raises(FileNotFoundError, match=r"is trained but .* does not exist; run `(pipeline ridge|pipeline train --variant [a-z-]+)`") as e:
        load_scorer(variant, tiny_store, tmp_path)
    want = "pipeline ridge" if variant == "ridge-fgw" else f"pipeline train --variant {checkpoint_owner(variant)}"
    assert f"run `{want}`" in str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage-config", "config-list", "config-empty", "other-shapes"])
def test_a_damaged_checkpoint_is_one_message_naming_the_file_and_the_fix(damage, tiny_store, tmp_path):
    """A checkpoint cut short, a config.json that is not JSON (or not an object, or one without
    the scorer's options: ``{}``), or tensors of another scorer's shapes: one ValueError naming
    the damaged file and the command that rewrites it."""
    from safetensors.torch import save_file

    from pipeline.scorers.checkpoints import load_scorer

    folder = tmp_path / "global-m"
    folder.mkdir()
    scorer = create_scorer("global-m", dims=tiny_store.dims, proj=tiny_store.projections())
    save_file({k: v.contiguous() for k, v in scorer.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text('{"scorer_kwargs": {}}')
    load_scorer("global-m", tiny_store, tmp_path)  # sound
    if damage == "truncated":
        (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100])
        needle = r"model\.safetensors \(global-m\) cannot be loaded"
    elif damage == "garbage-config":
        (folder / "config.json").write_text('{"a": "\x01')
        needle = r"config\.json \(global-m\) is damaged"
    elif damage == "config-list":
        (folder / "config.json").write_text("[]")
        needle = r"config\.json \(global-m\) is damaged \(not a JSON object\)"
    elif damage == "config-empty":
        (folder / "config.json").write_text("{}")
        needle = r"config\.json \(global-m\) records no scorer_kwargs"
    else:
        save_file({k: torch.zeros(3) for k in scorer.state_dict()}, folder / "model.safetensors")
        needle = r"model\.safetensors \(global-m\) cannot be loaded \(.*size mismatch"
    with pytest.raises(ValueError, match=needle + r".*; rerun `pipeline train --variant global-m`"):
        load_scorer("global-m", tiny_store, tmp_path)
