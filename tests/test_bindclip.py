"""BindCLIP invariants: antisymmetry, row permutation under swap, marginals, lesion,
hand-computed readouts, consensus, masking/truncation, and the parameter breakdown."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pipeline.features import FeatureDims, ImageFeatures, TextFeatures
from pipeline.scorers import create_scorer
from pipeline.scorers.bindclip.model import (
    BindClipConfig,
    column_marginal,
    consensus,
    cross_caption_residual,
    parameter_breakdown,
    patch_coords,
    readouts,
)
from tests.test_scorers_contract import DIMS, random_image, random_projections, random_text

VARIANTS = ["bindclip", "bindclip-lesion", "bindclip-noconsensus"]
LENS_A, LENS_B = [3, 5, 7, 1, 9], [4, 2, 7, 6, 9]


pytestmark = pytest.mark.usefixtures("single_thread")


def _model(name="bindclip", seed=0, **kwargs):
    torch.manual_seed(seed)
    m = create_scorer(name, dims=DIMS, proj=random_projections(), **kwargs)
    with torch.no_grad():  # move away from init so that every energy is non-trivial
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def _batch(seed=0):
    return (
        random_image(5, seed=seed),
        random_text(LENS_A, seed=seed + 1),
        random_text(LENS_B, seed=seed + 2),
    )


@pytest.mark.parametrize("name", VARIANTS)
def test_antisymmetry(name):
    m = _model(name)
    for seed in range(3):
        image, a, b = _batch(seed)
        with torch.no_grad():
            s_ab, s_ba = m.score_pair(image, a, b), m.score_pair(image, b, a)
        torch.testing.assert_close(s_ab, -s_ba, atol=1e-5, rtol=1e-5)
        assert (s_ab.abs() > 1e-3).all()


def test_energies_are_not_vacuous():
    m = _model("bindclip-noconsensus")
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    assert (e.moves.abs() > 1e-5).all(dim=0).all(), e.moves


def test_identical_captions_score_zero():
    m = _model()
    image, a, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(m.score_pair(image, a, a), torch.zeros(5), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_swap_permutes_plan_rows_and_nothing_else(name):
    m = _model(name)
    image, a, b = _batch()
    with torch.no_grad():
        e1, e2 = m.explain(image, a, b), m.explain(image, b, a)
    n = e1.u.shape[-1]
    perm = torch.cat([torch.arange(n, 2 * n), torch.arange(n), torch.tensor([2 * n])])
    torch.testing.assert_close(e2.plan, e1.plan[:, perm], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(e2.r, e1.r[:, perm], atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(e2.c, e1.c, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(e2.u, e1.u.flip(1))
    torch.testing.assert_close(e2.energies, e1.energies.flip(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e2.contraction, e1.contraction, atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["bindclip", "bindclip-lesion"])
def test_plan_marginals_equal_r_and_c(name):
    m = _model(name)
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    n, cfg = e.u.shape[-1], m.config
    torch.testing.assert_close(e.plan.sum(-1), e.r, atol=1e-6, rtol=0)
    torch.testing.assert_close(e.plan.sum(-2), e.c, atol=1e-6, rtol=0)
    # the budget: (1 - nu_t)/2 per caption, nu_t null token; nu_v null patch
    torch.testing.assert_close(e.r[:, :n].sum(-1), torch.full((5,), (1 - cfg.nu_t) / 2))
    torch.testing.assert_close(e.r[:, n : 2 * n].sum(-1), torch.full((5,), (1 - cfg.nu_t) / 2))
    torch.testing.assert_close(e.r[:, -1], torch.full((5,), cfg.nu_t))
    torch.testing.assert_close(e.c[:, -1], torch.full((5,), cfg.nu_v))
    torch.testing.assert_close(e.c.sum(-1), torch.ones(5))
    # padded token rows carry no mass
    assert (e.plan[:, : 2 * n][~e.token_mask.reshape(5, 2 * n)] == 0).all()
    assert float(e.marginal_err.max()) < 1e-5


def test_lesion_plan_is_outer_product_of_the_same_marginals():
    full = _model("bindclip")
    lesion = create_scorer("bindclip-lesion", dims=DIMS, proj=random_projections())
    lesion.load_state_dict(copy.deepcopy(full.state_dict()))  # same locked parameters
    image, a, b = _batch()
    with torch.no_grad():
        e_full, e_les = full.explain(image, a, b), lesion.explain(image, a, b)
    torch.testing.assert_close(e_les.r, e_full.r)
    torch.testing.assert_close(e_les.c, e_full.c)
    torch.testing.assert_close(e_les.plan, e_les.r[:, :, None] * e_les.c[:, None, :])
    # with a co-location-free plan every token has the same patch distribution, so adjacent
    # tokens overlap fully: no order move (item 3's caption A has no adjacent pair at all)
    both_have_pairs = torch.tensor([True, True, True, False, True])
    assert e_les.moves[both_have_pairs, 2].abs().max() < 1e-5


def test_edited_token_receives_the_transport_budget():
    m = _model()
    image, a, _ = _batch()
    b = TextFeatures(a.ids.clone(), a.mask.clone(), a.tokens.clone(), a.embed.clone())
    b.tokens[0, 3] = torch.randn(DIMS.d_t)  # edit content token 2 of item 0 (position 3)
    with torch.no_grad():
        e = m.explain(image, a, b)
    n = e.u.shape[-1]
    assert int(e.u[0, 0].argmax()) == 2 and int(e.u[0, 1].argmax()) == 2
    assert int(e.r[0, :n].argmax()) == 2 and int(e.r[0, n : 2 * n].argmax()) == 2
    shared = torch.ones(3, dtype=torch.bool)
    shared[2] = False
    assert (e.u[0, 0, :3][shared] < 0.2).all()  # shared anchors sit at the floor


def test_per_depth_linear_readouts_average_to_the_summed_ones():
    m = _model("bindclip-noconsensus")
    image, a, b = _batch()
    with torch.no_grad():
        e = m.explain(image, a, b)
    torch.testing.assert_close(e.energies_depth[..., :2].mean(2), e.energies[..., :2])


def test_scores_do_not_depend_on_batch_neighbours():
    m = _model()
    image, a, b = _batch()
    with torch.no_grad():
        full = m.score_pair(image, a, b)
        idx = torch.tensor([3])  # the item with a 1-token caption, padded to 9 in the batch
        alone = m.score_pair(image.index(idx), a.index(idx), b.index(idx))
    torch.testing.assert_close(alone, full[idx], atol=1e-4, rtol=1e-4)


def test_captions_are_truncated_to_max_tokens():
    dims = FeatureDims(grid=(2, 2), d_v=16, d_t=12, embed_dim=8, context_length=50)
    m = create_scorer("bindclip", dims=dims, proj=random_projections(dims))
    image = random_image(2, dims)
    a, b = random_text([40, 10], dims, seed=1), random_text([45, 3], dims, seed=2)
    with torch.no_grad():
        e = m.explain(image, a, b)
    assert e.u.shape[-1] == 32 and e.plan.shape == (2, 65, 2 * 4 + 1)


def test_spatial_readout_on_a_hand_made_plan():
    """'cube left-of ball': token 0 at the left patch, token 2 at the right patch."""
    coords = patch_coords((1, 2))  # x = 0.25, 0.75
    Q = torch.zeros(1, 2, 3, 1, 2)  # [B, X, N, V, R]
    Q[0, 0, 0, 0, 0] = Q[0, 0, 2, 0, 1] = 0.1  # caption A: subject left, object right
    Q[0, 1, 0, 0, 1] = Q[0, 1, 2, 0, 0] = 0.1  # caption B: swapped
    Q[:, :, 1] = 0.05  # relation word spread over both patches
    r = torch.full((1, 2, 3), 0.125)
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    d = torch.zeros(1, 2, 3, 5)
    d[..., 1, 0] = 1.0  # the relation word reads +x (object minus subject)
    e_ord, e_sp = readouts(Q, r, mask, d, coords, var_floor=1e-4)
    # only token 1 has a subject and an object span: E = r_1 * 0.5 / (3 r) = 1/6
    torch.testing.assert_close(e_sp[0, :, 0], torch.tensor([1 / 6, -1 / 6]))
    torch.testing.assert_close(e_ord[0, 0], e_ord[0, 1])  # order cannot tell them apart here
    # adjacent tokens on disjoint patches overlap 0; relation word on both overlaps sqrt(.5)
    torch.testing.assert_close(e_ord[0, 0, 0], torch.tensor(0.5**0.5))



def test_span_gate_weights_the_span_means():
    """'cube left-of the ball' with "the" grounded on the cube's patch: ungated, the object
    span's centroid is halfway (x = 0.5); with "the" gated out it is the ball's (x = 0.75)."""
    coords = patch_coords((1, 2))  # x = 0.25, 0.75
    Q = torch.zeros(1, 1, 4, 1, 2)  # [B, X, N, V, R]: one caption
    Q[0, 0, 0, 0, 0] = Q[0, 0, 2, 0, 0] = Q[0, 0, 3, 0, 1] = 0.1  # cube, the: left; ball: right
    Q[0, 0, 1, 0] = 0.05  # relation word spread over both patches
    r, mask = torch.full((1, 1, 4), 0.1), torch.ones(1, 1, 4, dtype=torch.bool)
    d = torch.zeros(1, 1, 4, 5)
    d[..., 1, 0] = 1.0  # only the relation word reads (+x)
    _, plain = readouts(Q, r, mask, d, coords, var_floor=1e-4)
    _, gated = readouts(Q, r, mask, d, coords, var_floor=1e-4, gate=torch.tensor([[[1.0, 1.0, 0.0, 1.0]]]))
    torch.testing.assert_close(plain[0, 0, 0], torch.tensor(0.25 / 4))  # r_1 (0.5 - 0.25) / (4 r)
    torch.testing.assert_close(gated[0, 0, 0], torch.tensor(0.5 / 4))  # r_1 (0.75 - 0.25) / (4 r)


def test_patch_centres_on_a_grid():
    """Patch centres in [0, 1], row-major, x across and y down."""
    want = [[1 / 6, 0.25], [0.5, 0.25], [5 / 6, 0.25], [1 / 6, 0.75], [0.5, 0.75], [5 / 6, 0.75]]
    torch.testing.assert_close(patch_coords((2, 3)), torch.tensor(want))


def test_absolute_frame_term_by_hand():
    """'cube on the left': token 0 reads the absolute direction (+x) of the others' centroid
    against the picture's centre, <(1, 0), (0.75, 0.5) - 1/2> = 0.25; token 1 reads nothing.
    E_sp = r_0 0.25 / (r_0 + r_1) = 0.125."""
    coords = patch_coords((1, 2))  # x = 0.25, 0.75
    Q = torch.zeros(1, 1, 2, 1, 2)  # [B, X, N, V, R]
    Q[0, 0, 0, 0, 0] = Q[0, 0, 1, 0, 1] = 0.1  # token 0 left, token 1 right
    r, mask = torch.full((1, 1, 2), 0.1), torch.ones(1, 1, 2, dtype=torch.bool)
    d = torch.zeros(1, 1, 2, 5)
    d[0, 0, 0, 3] = 1.0  # token 0's absolute direction: +x
    _, e_sp = readouts(Q, r, mask, d, coords, var_floor=1e-4)
    torch.testing.assert_close(e_sp[0, 0, 0], torch.tensor(0.125))


def test_spread_contrast_by_hand():
    """The relation word reads the spread difference of its spans: subject on one patch
    (variance 0), object over two patches 0.5 apart (variance 1/16): sigma+ - sigma- =
    1/2 log((1/16 + floor) / floor), weighted r_1 / (3 r)."""
    coords = patch_coords((1, 2))
    Q = torch.zeros(1, 1, 3, 1, 2)
    Q[0, 0, 0, 0, 0] = 0.1  # subject: the left patch only
    Q[0, 0, 1, 0] = 0.05  # relation word over both
    Q[0, 0, 2, 0] = 0.05  # object over both
    r, mask = torch.full((1, 1, 3), 0.1), torch.ones(1, 1, 3, dtype=torch.bool)
    d = torch.zeros(1, 1, 3, 5)
    d[0, 0, 1, 2] = 1.0  # the relation word reads the spread (dspread) only
    _, e_sp = readouts(Q, r, mask, d, coords, var_floor=1e-4)
    want = 0.5 * math.log((1 / 16 + 1e-4) / 1e-4) / 3
    torch.testing.assert_close(e_sp[0, 0, 0], torch.tensor(want))


def test_cross_caption_residual_by_hand():
    """u = clip(1 - E_w[cos], 0, 1) with w = softmax over (cos to the other caption's tokens,
    0 for the null) / tau_x: a token equal to the other's one token (cos 1, tau_x 0.5) keeps
    1 - e^2 / (e^2 + 1); an opposite one (E_w[cos] < 0) is clipped to 1; padding gets 0."""
    e0 = torch.tensor([1.0, 0.0])
    t_x = torch.stack([e0, -e0, e0])[None]  # [B=1, N=3, h=2]
    t_y = e0[None, None]  # [1, M=1, 2]
    m_x, m_y = torch.tensor([[True, True, False]]), torch.tensor([[True]])
    u = cross_caption_residual(t_x, t_y, m_x, m_y, tau_x=0.5)
    e2 = math.exp(2.0)
    torch.testing.assert_close(u, torch.tensor([[1 - e2 / (e2 + 1), 1.0, 0.0]]))


def test_column_marginal_by_hand():
    """Cells share 1 - nu_v in proportion to sum_i r_i softmax_c(S_ic / tau): one token with
    compatibilities (0, 1) at tau 0.5 puts 1/(1 + e^2) and e^2/(1 + e^2) of 0.5 on the cells."""
    S = torch.tensor([[[0.0, 1.0]]])  # [B, 2N=1, L*R=2]
    c = column_marginal(S, torch.tensor([[0.4]]), nu_v=0.5, tau=0.5)
    e2 = math.exp(2.0)
    torch.testing.assert_close(c, torch.tensor([[0.5 / (1 + e2), 0.5 * e2 / (1 + e2)]]))


def test_consensus_std_is_over_the_depths_as_they_are():
    """q = |mean| / (std + floor) with the depths' own (population) standard deviation:
    moves 1 and 3 give mean 2, std 1, q = 2 / 1.05."""
    move, q, gamma = consensus(torch.tensor([[[1.0], [3.0]]]), floor=0.05, q0=1.0)
    q_want = 2 / 1.05
    torch.testing.assert_close(q, torch.tensor([[q_want]]))
    torch.testing.assert_close(gamma, torch.tensor([[q_want**4 / (q_want**4 + 1)]]))
    torch.testing.assert_close(move, 2 * gamma)


def test_consensus_contracts_disagreeing_depths():
    agree = torch.tensor([[[0.2], [0.2]]])  # [B=1, L=2, K=1]
    disagree = torch.tensor([[[0.2], [-0.2]]])
    move, q, gamma = consensus(agree, floor=0.05, q0=0.5)
    torch.testing.assert_close(q, torch.tensor([[4.0]]), atol=1e-4, rtol=0)
    torch.testing.assert_close(move, 0.2 * gamma)
    assert float(gamma) > 0.99
    move, q, gamma = consensus(disagree, floor=0.05, q0=0.5)
    assert float(move.abs()) == 0.0 and float(gamma) == 0.0


def test_consensus_switch():
    m_on, m_off = _model("bindclip"), _model("bindclip-noconsensus")
    assert m_on.config.consensus and not m_off.config.consensus
    image, a, b = _batch()
    with torch.no_grad():
        e = m_off.explain(image, a, b)
    assert (e.contraction == 1).all()
    torch.testing.assert_close(e.moves, e.energies[:, 0] - e.energies[:, 1])


def test_unknown_options_are_rejected_with_the_valid_ones():
    with pytest.raises(TypeError, match="valid"):
        create_scorer("bindclip", dims=DIMS, proj=random_projections(), n_iter=3)
    with pytest.raises(ValueError, match="plan"):
        BindClipConfig(plan="outer-product")


def test_scale_init_is_one_value_or_one_per_energy():
    one = create_scorer("bindclip", dims=DIMS, proj=random_projections(), scale_init=2.0)
    each = create_scorer("bindclip", dims=DIMS, proj=random_projections(), scale_init=[1.0, 2.0, 10.0, 0.5])
    torch.testing.assert_close(one.scale_logits.exp(), torch.full((4,), 2.0))
    torch.testing.assert_close(each.scale_logits.exp(), torch.tensor([1.0, 2.0, 10.0, 0.5]))
    with pytest.raises(ValueError, match="one per energy"):
        create_scorer("bindclip", dims=DIMS, proj=random_projections(), scale_init=[1.0, 2.0])


def test_parameter_breakdown_vit_l_14_336():
    dims = FeatureDims(grid=(24, 24), d_v=1024, d_t=768, embed_dim=768, context_length=77)
    pb = parameter_breakdown(dims)
    h = 192
    assert pb["phi_t.layernorm"] == 2 * 768 and pb["phi_t.linear"] == 768 * h + h
    assert pb["phi_v.layernorm"] == 2 * 1024 and pb["phi_v.linear"] == 1024 * h + h
    assert pb["phi_v.depth_offset"] == 2 * h
    assert pb["relation_head_U"] == 5 * h + 5
    assert pb["scale_logits"] == 4
    assert pb["total"] == sum(v for k, v in pb.items() if k != "total") == 349_385
    # the paper's 521,475 has no breakdown; ours is 67% of it (see the module docstring)
    assert 0.6 < pb["total"] / 521_475 < 0.7


def _left_of_world(seed: int = 0):
    """Two objects on a 3x3 grid; A = 'X left-of Y', B = 'Y left-of X' (same words, swapped).

    Global embeddings are equal, so the CLIP margin is 0 and only the coupling can decide.
    """
    g = torch.Generator().manual_seed(seed)
    dims = FeatureDims(grid=(3, 3), d_v=16, d_t=16, embed_dim=4, context_length=6)
    e_v, e_t = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    e_rel = torch.randn(16, generator=g)

    def batch(B: int):
        obj = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(B)])  # [B, 2]
        col = torch.stack([torch.randperm(3, generator=g)[:2] for _ in range(B)])  # distinct
        pos = torch.randint(0, 3, (B, 2), generator=g) * 3 + col  # [B, 2] patch index
        grid = 0.5 * torch.randn(B, 9, 16, generator=g)
        for k in range(2):
            grid[torch.arange(B), pos[:, k]] += e_v[obj[:, k]]
        image = ImageFeatures(grid, grid, torch.zeros(B, 16), torch.randn(B, 4, generator=g))

        def caption(first, second):
            mask = torch.zeros(B, 6, dtype=torch.bool)
            mask[:, :5] = True  # sot, X, rel, Y, eot
            tok = torch.zeros(B, 6, 16)
            tok[:, 1], tok[:, 2], tok[:, 3] = e_t[first], e_rel, e_t[second]
            return TextFeatures(mask.long(), mask, tok, torch.ones(B, 4))

        y = (col[:, 0] < col[:, 1]).float() * 2 - 1  # +1 iff A is true
        return image, caption(obj[:, 0], obj[:, 1]), caption(obj[:, 1], obj[:, 0]), y

    return dims, random_projections(dims), batch


def test_learns_a_spatial_swap_that_the_lesion_cannot_see():
    """world.md's trial in miniature: the plan carries arrangement, r ⊗ c does not."""
    dims, proj, batch = _left_of_world()
    torch.manual_seed(0)
    m = create_scorer("bindclip-noconsensus", dims=dims, proj=proj, h=16)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(30):
        image, a, b, y = batch(32)
        loss = torch.nn.functional.softplus(-m.score_pair(image, a, b) * y).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    image, a, b, y = batch(256)
    with torch.no_grad():
        acc = float(((m.score_pair(image, a, b) * y) > 0).float().mean())
        lesion = create_scorer("bindclip-lesion", dims=dims, proj=proj, h=16, consensus=False)
        lesion.load_state_dict(m.state_dict())
        s_lesion = lesion.score_pair(image, a, b)
    assert acc > 0.7, acc  # 1.0 at this seed; 0.76-1.0 over seeds 0-3
    assert float(s_lesion.abs().max()) < 1e-4  # same words, no binding: no preference at all


def test_text_center_keeps_antisymmetry_and_changes_the_score():
    m, c = _model(), _model(text_center=True)
    image, a, b = _batch()
    with torch.no_grad():
        s_ab, s_ba = c.score_pair(image, a, b), c.score_pair(image, b, a)
        plain = m.score_pair(image, a, b)
    torch.testing.assert_close(s_ab, -s_ba, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(s_ab, plain)


def test_grad_iters_gives_the_same_plan_and_gradient():
    """Warm-started truncated backprop: identical forward, (numerically) identical gradient
    once the plan has converged."""
    full, trunc = _model(), _model(grad_iters=8)
    image, a, b = _batch()
    e1, e2 = full.explain(image, a, b), trunc.explain(image, a, b)
    torch.testing.assert_close(e2.plan, e1.plan, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(e2.score, e1.score, atol=1e-4, rtol=1e-4)
    e1.score.sum().backward()
    e2.score.sum().backward()
    for (name, p1), p2 in zip(full.named_parameters(), trunc.parameters(), strict=True):
        cos = torch.nn.functional.cosine_similarity(p1.grad.flatten(), p2.grad.flatten(), 0)
        assert cos > 0.999, name
    with torch.no_grad():  # without autograd the option is inert: one K-iteration solve
        torch.testing.assert_close(
            trunc.explain(image, a, b).plan, e1.plan.detach(), atol=1e-6, rtol=1e-4
        )


def test_grad_iters_gives_the_same_plan_on_a_peaked_kernel():
    """At a small epsilon the warm-started kernel's entries are tiny; the padded rows
    (captions of unequal length) must still not enter its column sums (they once did, and
    training read plans a few 1e-3 off their marginals)."""
    full, trunc = _model(epsilon=0.01), _model(epsilon=0.01, grad_iters=8)
    image, a, b = _batch()
    assert not bool(a.mask.all() and b.mask.all())  # some padding
    e1, e2 = full.explain(image, a, b), trunc.explain(image, a, b)
    torch.testing.assert_close(e2.plan, e1.plan, atol=1e-6, rtol=1e-4)
    assert float(e2.marginal_err.max()) < 2 * float(e1.marginal_err.max()) + 1e-6


def test_ablations_share_bindclip_checkpoint():
    from pipeline.scorers import SCORERS

    for name in VARIANTS:
        assert SCORERS.get(name).checkpoint_variant == "bindclip"
