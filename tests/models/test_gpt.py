"""The small GPT against independent oracles: a per-position attention loop, finite differences for the
JVP and the Hessian-vector product, a hand count of parameters, a manual greedy loop, and softmax
probabilities for the sampler."""

import copy
import dataclasses
import math

import pytest
import torch

from optiscope.models.gpt import GPT, GPTConfig, math_attention
from optiscope.optim import split_params_for_muon
from support import assert_rel_close

# torch scripts some internals (forward-mode AD decompositions, inductor) and warns that torch.jit.script is deprecated
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")


def tiny(seed=0, dtype=torch.float32, **overrides):
    torch.manual_seed(seed)
    fields = dict(vocab_size=11, n_layer=2, n_head=2, n_embd=8, block_size=6) | overrides
    return GPT(GPTConfig(**fields)).to(dtype)


def tokens(shape, vocab=11, seed=1):
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(n_embd=10, n_head=4), r"n_embd=10 must be divisible by n_head=4"),
        (dict(n_layer=0), r"n_layer=0 must be a positive integer"),
        (dict(vocab_size=-3), r"vocab_size=-3 must be a positive integer"),
        (dict(block_size=2.0), r"block_size=2.0 must be a positive integer"),
        (dict(attention="flash"), r"attention='flash'; valid modes: auto, math"),
        (dict(dropout=1.0), r"dropout=1.0 must be in \[0, 1\)"),
    ],
)
def test_bad_config_names_the_value(fields, message):
    base = dict(vocab_size=11, n_layer=2, n_head=2, n_embd=8, block_size=6)
    with pytest.raises(ValueError, match=message):
        GPTConfig(**(base | fields))


def naive_causal_attention(q, k, v):
    """Position by position: output i = Σ_{j ≤ i} softmax_j(q_i·k_j / √D) v_j."""
    out = torch.zeros_like(q)
    for i in range(q.shape[-2]):
        scores = (q[..., i : i + 1, :] * k[..., : i + 1, :]).sum(-1) / math.sqrt(q.shape[-1])
        out[..., i, :] = (scores.softmax(-1)[..., None] * v[..., : i + 1, :]).sum(-2)
    return out


def test_math_attention_equals_the_per_position_formula():
    q, k, v = torch.randn(3, 2, 3, 5, 4, dtype=torch.float64).unbind(0)
    assert_rel_close(math_attention(q, k, v), naive_causal_attention(q, k, v), 1e-12, "attention")


def test_math_mode_equals_sdpa_mode():
    auto = tiny(attention="auto")
    exact = GPT(dataclasses.replace(auto.config, attention="math"))
    exact.load_state_dict(auto.state_dict())  # same parameters, the checkpoint loads across modes
    idx = tokens((4, 6))
    assert_rel_close(exact(idx), auto(idx), 1e-5, "logits")


@pytest.mark.parametrize("attention", ["auto", "math"])
def test_changing_a_future_token_leaves_earlier_logits_alone(attention):
    model = tiny(attention=attention)
    idx = tokens((2, 6))
    for t in range(6):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 11
        a, b = model(idx), model(changed)
        assert torch.equal(a[:, :t], b[:, :t]), f"position < {t} saw token {t}"
        assert not torch.allclose(a[:, t], b[:, t]), f"position {t} ignored its own token"


def flat_loss(model, idx, targets):
    """Loss as a function of one flat parameter vector (functional_call: the model is never mutated)."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]

    def f(theta):
        params = dict(zip(names, theta.split([s.numel() for s in shapes]), strict=True))
        params = {n: p.view(s) for (n, p), s in zip(params.items(), shapes, strict=True)}
        return torch.func.functional_call(model, params, (idx, targets))[1]

    return f, torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])


def unit_direction(theta):
    v = torch.randn(theta.shape, dtype=theta.dtype, generator=torch.Generator().manual_seed(3))
    return v / v.norm()  # so that eps is the length of the finite-difference step


def test_forward_mode_jvp_in_math_mode_equals_a_central_difference():
    model = tiny(dtype=torch.float64, attention="math")
    f, theta = flat_loss(model, tokens((3, 6)), tokens((3, 6), seed=2))
    v = unit_direction(theta)
    _, jvp = torch.func.jvp(f, (theta,), (v,))
    eps = 1e-5
    central = (f(theta + eps * v) - f(theta - eps * v)) / (2 * eps)
    assert_rel_close(jvp, central, 1e-7, "∇L·v")


def test_double_backward_hvp_in_math_mode_equals_a_gradient_difference():
    model = tiny(dtype=torch.float64, attention="math")
    f, theta = flat_loss(model, tokens((3, 6)), tokens((3, 6), seed=2))
    v = unit_direction(theta)
    # reverse-over-reverse: Hv = ∇(∇L · v)
    x = theta.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (hv,) = torch.autograd.grad(g @ v, x)
    # forward-over-reverse with torch.func
    _, hv_func = torch.func.jvp(torch.func.grad(f), (theta,), (v,))
    eps = 1e-5
    difference = (torch.func.grad(f)(theta + eps * v) - torch.func.grad(f)(theta - eps * v)) / (2 * eps)
    assert_rel_close(hv, difference, 1e-6, "Hv (autograd twice)")
    assert_rel_close(hv_func, hv, 1e-10, "Hv (torch.func)")


def test_functional_call_uses_the_given_parameters_and_keeps_the_tie():
    model = tiny()
    idx = tokens((2, 6))
    params = {n: p.detach() + 0.01 * torch.randn_like(p) for n, p in model.named_parameters()}
    assert "head.weight" not in params  # tied: one tensor, named once
    expected = copy.deepcopy(model)
    expected.load_state_dict(params, strict=False)
    assert expected.head.weight is expected.token_embedding.weight
    before = {n: p.clone() for n, p in model.state_dict().items()}
    assert torch.equal(torch.func.functional_call(model, params, (idx,)), expected(idx))
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tie_weights", [True, False])
def test_parameter_count_matches_the_hand_formula(bias, tie_weights):
    v, t, c, layers = 37, 16, 24, 3
    model = GPT(GPTConfig(v, layers, 4, c, t, bias=bias, tie_weights=tie_weights))
    b = 1 if bias else 0
    per_block = (
        (c + b * c)  # norm before attention
        + (3 * c * c + b * 3 * c)  # qkv
        + (c * c + b * c)  # attention output projection
        + (c + b * c)  # norm before the MLP
        + (4 * c * c + b * 4 * c)  # up
        + (4 * c * c + b * c)  # down
    )
    expected = v * c + t * c + layers * per_block + (c + b * c) + (0 if tie_weights else v * c)
    assert model.num_parameters() == expected
    assert (model.head.weight is model.token_embedding.weight) == tie_weights


def test_tied_weights_are_one_tensor_that_both_uses_update():
    model = tiny()
    assert model.head.weight.data_ptr() == model.token_embedding.weight.data_ptr()
    logits, loss = model(tokens((2, 6)), tokens((2, 6), seed=2))
    loss.backward()
    with torch.no_grad():
        model.token_embedding.weight.add_(1.0)
    assert torch.equal(model.head.weight, model.token_embedding.weight)


def test_initialisation_scales():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, n_layer=8, n_head=4, n_embd=128, block_size=32, bias=True))
    assert abs(model.token_embedding.weight.std().item() / 0.02 - 1) < 0.05
    assert abs(model.blocks[0].mlp.up.weight.std().item() / 0.02 - 1) < 0.05
    residual = 0.02 / math.sqrt(2 * 8)
    for block in model.blocks:
        assert abs(block.mlp.down.weight.std().item() / residual - 1) < 0.05
        assert abs(block.attn.proj.weight.std().item() / residual - 1) < 0.1
        assert torch.count_nonzero(block.mlp.up.bias) == 0
        assert torch.equal(block.norm_attn.weight, torch.ones(128))


def test_muon_split_finds_the_hidden_matrices():
    model = tiny()
    muon, adamw = split_params_for_muon(model)
    hidden = [m.weight for b in model.blocks for m in (b.attn.qkv, b.attn.proj, b.mlp.up, b.mlp.down)]
    assert {id(p) for p in muon} == {id(p) for p in hidden}
    assert len(muon) + len(adamw) == len(list(model.parameters()))


def test_greedy_generation_equals_a_manual_argmax_loop():
    model = tiny(dropout=0.1).eval()
    with torch.no_grad():
        for p in model.parameters():  # large random weights: every context token sways the argmax
            p.normal_(0, 1)
    prompt = tokens((3, 4))
    out = model.generate_greedy(prompt, max_new_tokens=9)
    sequence = prompt.clone()
    with torch.no_grad():
        for _ in range(9):  # past block_size = 6 the context window slides
            window = sequence[:, max(0, sequence.shape[1] - 6) :]
            next_token = torch.stack([row.argmax() for row in model(window)[:, -1]])
            sequence = torch.cat([sequence, next_token[:, None]], dim=1)
    assert torch.equal(out, sequence) and out.shape == (3, 13)
    assert torch.equal(out[:, :4], prompt)


def test_sample_frequencies_follow_the_softmax():
    model = tiny(seed=4, tie_weights=False).eval()
    prompt = tokens((1, 5)).expand(20000, 5)
    with torch.no_grad():
        model.head.weight.mul_(40)  # logits far from uniform, so a wrong temperature would show
        probs = torch.softmax(model(prompt[:1])[0, -1] / 0.7, dim=-1)
    draws = model.sample(prompt, 1, temperature=0.7, generator=torch.Generator().manual_seed(0))[:, -1]
    freq = torch.bincount(draws, minlength=11).double() / 20000
    sigma = (probs.double() * (1 - probs.double()) / 20000).sqrt()
    assert ((freq - probs.double()).abs() <= 5 * sigma + 1e-4).all(), (freq, probs)


def test_sample_is_reproducible_and_validates_its_arguments():
    model = tiny().eval()
    prompt = tokens((2, 3))
    a = model.sample(prompt, 8, generator=torch.Generator().manual_seed(5))
    b = model.sample(prompt, 8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == (2, 11)
    with pytest.raises(ValueError, match=r"temperature=0 must be > 0"):
        model.sample(prompt, 2, temperature=0)
    with pytest.raises(ValueError, match=r"max_new_tokens=-1"):
        model.generate_greedy(prompt, -1)
    with pytest.raises(ValueError, match=r"sequence length 7 exceeds block_size=6"):
        model(tokens((1, 7)))


@pytest.mark.parametrize("attention", ["auto", "math"])
def test_compiles_without_graph_breaks(attention):
    model = tiny(attention=attention)
    idx, targets = tokens((2, 6)), tokens((2, 6), seed=2)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    logits, loss = compiled(idx, targets)
    loss.backward()
    assert_rel_close(logits, model(idx), 1e-6, "compiled logits")
    assert model.token_embedding.weight.grad is not None


@pytest.mark.slow
def test_compiles_with_inductor():
    model = tiny()
    idx = tokens((2, 6))
    torch._dynamo.reset()
    assert_rel_close(torch.compile(model, fullgraph=True)(idx), model(idx), 1e-5, "inductor logits")
