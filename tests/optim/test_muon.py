"""Muon: Newton–Schulz against an SVD oracle, the optimizer against its NumPy twin and torch.optim.Muon,
and the Muon + AdamW split."""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from optiscope import reference
from optiscope.optim import AdamW, Muon, MuonWithAdamW, muon_with_adamw, newton_schulz, split_params_for_muon
from support import HYPOTHESIS_SETTINGS, Quadratic, assert_matches_twin, assert_same_run, shapes_strategy

COEFFS = (3.4445, -4.775, 2.0315)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (1, 6)])
def test_newton_schulz_acts_on_singular_values(shape):
    """NS(G) = U p(S/‖G‖_F) Vᵀ, with p the quintic s ↦ a s + b s³ + c s⁵ iterated five times."""
    g = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    x = s / torch.linalg.vector_norm(g)
    a, b, c = COEFFS
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    oracle = u @ torch.diag(x) @ vh
    torch.testing.assert_close(newton_schulz(g, dtype=torch.float64), oracle, rtol=1e-10, atol=1e-12)
    # …and the result is near-orthogonal: singular values pushed into roughly (0.5, 1.5)
    assert torch.all((x > 0.5) & (x < 1.5)) or min(shape) == 1


@st.composite
def muon_options(draw):
    return dict(
        lr=draw(st.floats(1e-4, 2e-2)),
        weight_decay=draw(st.sampled_from([0.0]) | st.floats(0.0, 0.2)),
        momentum=draw(st.floats(0.0, 0.99)),
        nesterov=draw(st.booleans()),
        maximize=draw(st.booleans()),
    )


@settings(**HYPOTHESIS_SETTINGS)
@given(options=muon_options(), shapes=shapes_strategy(min_dims=2, max_dims=2, max_side=6), seed=st.integers(0, 2**16))
def test_matches_numpy_twin_in_float64(options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    ours = problem.run_torch(lambda ps: Muon(ps, foreach=False, ns_dtype=torch.float64, **options))
    twin = problem.run_numpy(lambda ps: reference.Muon(ps, **options))
    assert_matches_twin(ours, twin, {"momentum_buffer": "b"})


@settings(**HYPOTHESIS_SETTINGS)
@given(
    options=muon_options(),
    adjust=st.sampled_from([None, "original", "match_rms_adamw"]),
    shapes=shapes_strategy(min_dims=2, max_dims=2, max_side=6),
    seed=st.integers(0, 2**16),
)
def test_matches_torch_and_paths_agree(options, adjust, shapes, seed):
    """With torch's bfloat16 Newton–Schulz the updates are the same operations, so the runs agree."""
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    forloop = problem.run_torch(lambda ps: Muon(ps, foreach=False, adjust_lr_fn=adjust, **options))
    foreach = problem.run_torch(lambda ps: Muon(ps, foreach=True, adjust_lr_fn=adjust, **options))
    assert_same_run(foreach, forloop, exact=True)
    if options["maximize"]:
        return  # torch.optim.Muon has no maximize
    torch_options = {k: v for k, v in options.items() if k != "maximize"}
    theirs = problem.run_torch(lambda ps: torch.optim.Muon(ps, adjust_lr_fn=adjust, **torch_options))
    assert_same_run(forloop, theirs)


class TinyLM(nn.Module):
    def __init__(self, vocab=11, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width, bias=False)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        h = self.embed(idx)
        h = h + self.fc2(torch.relu(self.fc1(self.norm(h))))
        return self.lm_head(h)


def test_split_sends_hidden_matrices_to_muon():
    model = TinyLM()
    muon, adamw = split_params_for_muon(model)
    assert {id(p) for p in muon} == {id(model.fc1.weight), id(model.fc2.weight)}
    expected_adamw = {model.embed.weight, model.norm.weight, model.norm.bias, model.fc1.bias, model.lm_head.weight}
    assert {id(p) for p in adamw} == {id(p) for p in expected_adamw}
    model.lm_head.weight = model.embed.weight  # weight tying: the tied head stays with the embedding
    muon, adamw = split_params_for_muon(model, head="lm_head")
    assert len(adamw) == 4 and all(p.ndim == 2 for p in muon)


def test_muon_with_adamw_steps_each_group_like_its_optimizer():
    torch.manual_seed(0)
    model = TinyLM().double()
    idx = torch.randint(0, 11, (4, 6))
    hybrid = muon_with_adamw(model, lr=0.02, weight_decay=0.01, adamw_lr=3e-3, adamw_weight_decay=0.1)
    muon_params, adamw_params = split_params_for_muon(model)
    shadow = {id(p): p.detach().clone().requires_grad_() for p in model.parameters()}
    # on the CPU the hybrid runs Newton–Schulz in float32 (ns_dtype=None picks it by device)
    ref_muon = Muon([shadow[id(p)] for p in muon_params], lr=0.02, weight_decay=0.01, ns_dtype=torch.float32)
    ref_adamw = AdamW([shadow[id(p)] for p in adamw_params], lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(3):
        hybrid.zero_grad()
        model(idx).logsumexp(-1).mean().backward()
        for p in model.parameters():
            shadow[id(p)].grad = p.grad.clone()
        hybrid.step()
        ref_muon.step()
        ref_adamw.step()
    for p in model.parameters():
        assert torch.equal(p.detach(), shadow[id(p)].detach())
    assert hybrid.effective_lr(model.embed.weight).shape == model.embed.weight.shape
    with pytest.raises(KeyError):
        hybrid.effective_lr(model.fc1.weight)


def test_muon_rejects_non_matrices():
    with pytest.raises(ValueError, match=r"params\[1\] has shape \(3,\).*2-D matrices only"):
        Muon([torch.zeros(2, 3, requires_grad=True), torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match="2-D matrices only"):
        MuonWithAdamW([torch.zeros(3, requires_grad=True)], [])


def test_muon_twin_newton_schulz_matches_torch():
    g = np.random.default_rng(0).normal(size=(4, 7))
    np.testing.assert_allclose(
        reference.newton_schulz(g), newton_schulz(torch.tensor(g), dtype=torch.float64).numpy(), rtol=1e-10
    )


@pytest.mark.parametrize("transport", ["as built", "deepcopy"])
def test_an_adamw_group_added_later_takes_the_adamw_arguments(transport):
    """``add_param_group({"params": ..., "use_muon": False})`` steps like torch.optim.AdamW with adamw_lr, adamw_eps
    and adamw_weight_decay (not Muon's lr, eps and weight_decay), also when the hybrid had no AdamW group before."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    hybrid = MuonWithAdamW([w], [], lr=0.02, weight_decay=0.0, adamw_lr=3e-3, adamw_eps=1e-6, adamw_weight_decay=0.1)
    if transport == "deepcopy":
        w, hybrid = copy.deepcopy((w, hybrid))
    hybrid.add_param_group({"params": [b], "use_muon": False})
    shadow = b.detach().clone().requires_grad_()
    ref = torch.optim.AdamW([shadow], lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(3, generator=g, dtype=torch.float64)
        b.grad, shadow.grad, w.grad = grad.clone(), grad.clone(), None
        hybrid.step()
        ref.step()
    torch.testing.assert_close(b.detach(), shadow.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("foreach", [False, True])
def test_an_empty_matrix_without_columns_is_harmless(foreach):
    """A (3, 0) weight (nn.Linear(0, 3)) has nothing to update; the matrix beside it steps like torch.optim.Muon."""
    empty = torch.zeros(3, 0, requires_grad=True)
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    shadow = w.detach().clone().requires_grad_()
    ours = Muon([empty, w], lr=0.02, foreach=foreach)
    ref = torch.optim.Muon([shadow], lr=0.02)
    for t in range(2):
        grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(t + 1))
        empty.grad, w.grad, shadow.grad = torch.zeros(3, 0), grad.clone(), grad.clone()
        ours.step()
        ref.step()
    assert empty.shape == (3, 0)
    torch.testing.assert_close(w.detach(), shadow.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("matrix", [torch.ones(3), torch.ones(2, 3, 4), torch.ones(3, 3, dtype=torch.complex64)])
def test_newton_schulz_refuses_what_is_not_a_real_matrix(matrix):
    with pytest.raises(ValueError, match=r"newton_schulz: matrix has shape .*; give a real 2-D tensor"):
        newton_schulz(matrix)
