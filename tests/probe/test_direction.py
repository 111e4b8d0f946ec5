"""update_direction against the real step: θ + lr·v is what torch.optim (or the optimizer itself) then does to a
copy of the model, with the training loop's clipping, in half precision, for optimizers with state of their own, for
sparse gradients, parameters the batch gives no gradient and weights over one memory."""

import copy
import math

import pytest
import torch
from torch import nn

from optiscope.optim import AdamW
from optiscope.probe import entropy_per_sequence, probe_step, update_direction
from tiny_lm import VOCAB, E, T, TinyCausalLM, give_state, lm_loss, setup


def real_step(model, make_optimizer, state, loss_fn, batch, max_grad_norm=None):
    """Δθ of one step of a training loop on a copy of ``model``: its optimizers (``make_optimizer(copy)``, a
    list) loaded with ``state``, ``clip_grad_norm_`` over all the model's parameters, then each one's step()."""
    moved = copy.deepcopy(model)
    optimizers = make_optimizer(moved)
    for opt, s in zip(optimizers, state, strict=True):
        opt.load_state_dict(copy.deepcopy(s))
    loss_fn(moved, batch).backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(moved.parameters(), max_grad_norm)
    for opt in optimizers:
        opt.step()
    return {
        n: q.detach().double() - p.detach().double()
        for (n, p), (_, q) in zip(model.named_parameters(), moved.named_parameters(), strict=True)
    }


def test_clipping_takes_the_norm_of_all_the_models_gradients():
    """Two optimizers split the parameters (matrices / the rest, as Muon + AdamW do); the loop clips the
    gradients of the whole model, so each optimizer's direction is scaled by the norm of all of them."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    batch = torch.randint(0, VOCAB, (8, T + 1))

    def make(m):
        matrices = [p for p in m.parameters() if p.ndim == 2]
        return [torch.optim.SGD(matrices, lr=0.1), torch.optim.SGD([p for p in m.parameters() if p.ndim < 2], lr=0.1)]

    matrices, rest = make(model)
    c = 0.05
    model.zero_grad()
    lm_loss(model, batch).backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    model.zero_grad()
    assert norm > 2 * c  # the clipping is active
    delta = real_step(model, make, [matrices.state_dict(), rest.state_dict()], lm_loss, batch, max_grad_norm=c)
    v = {**update_direction(model, matrices, lm_loss, batch, c), **update_direction(model, rest, lm_loss, batch, c)}
    assert sorted(v) == sorted(delta)
    for name, d in delta.items():
        torch.testing.assert_close(0.1 * v[name], d, rtol=1e-9, atol=1e-15)


def half_model(dtype):
    torch.manual_seed(0)
    model = TinyCausalLM().to(dtype)
    batch = torch.randint(0, VOCAB, (8, T + 1))
    opt = torch.optim.SGD(model.parameters(), lr=3e-3, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        lm_loss(model, batch).float().backward()
        opt.step()
    opt.zero_grad()
    return model, opt, batch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_models_direction_is_its_step_and_the_probe_takes_it(dtype):
    """v = Δθ/lr is taken in float64 and kept in float32: in the parameter's dtype it was 1.7e-3 (bfloat16) off
    the step the optimizer then takes."""
    model, opt, batch = half_model(dtype)
    v = update_direction(model, opt, lm_loss, batch)
    delta = real_step(
        model, lambda m: [torch.optim.SGD(m.parameters(), lr=3e-3, momentum=0.9)], [opt.state_dict()], lm_loss, batch
    )
    assert {t.dtype for t in v.values()} == {torch.float32}
    for name, d in delta.items():
        torch.testing.assert_close(3e-3 * v[name].double(), d, rtol=1e-6, atol=0)
    # the probe's true ΔH at η = lr is that of the real step, measured on a float64 copy
    sequences = torch.randint(0, VOCAB, (6, T + 1))

    def mean_entropy(step):
        moved = copy.deepcopy(model).double()
        with torch.no_grad():
            for name, p in moved.named_parameters():
                p.add_(step[name])
            logp = torch.log_softmax(moved(sequences[:, :-1]), -1)
            return float(-(logp.exp() * logp).sum(-1).mean())

    result = probe_step(model, v, sequences, [3e-3])
    true = mean_entropy(delta) - mean_entropy({n: torch.zeros_like(d) for n, d in delta.items()})
    assert result["true"]["entries"][0]["delta_h_true"] == pytest.approx(true, rel=1e-5)
    with pytest.raises(ValueError, match=f"precision='model' on a {dtype} model cannot resolve one step"):
        probe_step(model, v, sequences, [3e-3], precision="model")


def test_a_float16_direction_does_not_overflow_for_a_small_lr():
    """At 8192 float16's spacing is 8: a step of lr·g = 1e-4 · 5e4 = 5 rounds to 8, and v = 8/1e-4 = 8e4 is beyond
    float16's largest number (65504)."""
    model = nn.Linear(1, 1, bias=False).half()
    with torch.no_grad():
        model.weight.fill_(8192.0)

    def loss_fn(m, batch):
        return (m.weight.float() * batch).sum()

    def make(m):
        return [torch.optim.SGD(m.parameters(), lr=1e-4)]

    (opt,) = make(model)
    v = update_direction(model, opt, loss_fn, torch.tensor(-5e4))
    delta = real_step(model, make, [opt.state_dict()], loss_fn, torch.tensor(-5e4))
    assert float(delta["weight"]) == 8.0
    torch.testing.assert_close(1e-4 * v["weight"].double(), delta["weight"], rtol=1e-7, atol=0)


class CountingSGD(torch.optim.SGD):
    """Sets attributes of its own in __init__: a step counter and the list of its matrices, which each step
    shrinks by a factor that grows with the count."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.k = 0
        self.matrices = [p for g in self.param_groups for p in g["params"] if p.ndim == 2]

    @torch.no_grad()
    def step(self, closure=None):
        self.k += 1
        super().step(closure)
        for p in self.matrices:
            p.mul_(1 - 0.01 * self.k)


def counting_setup():
    """The tiny LM after two steps of CountingSGD; built afresh each call, the same each time."""
    model, _, _, batch = setup()
    opt = CountingSGD(model.parameters(), lr=0.1)
    give_state(model, opt, lm_loss, batch)
    return model, opt, batch


def test_an_optimizer_with_attributes_of_its_own_is_copied_with_them():
    model, opt, batch = counting_setup()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    v = update_direction(model, opt, lm_loss, batch)
    assert opt.k == 2 and all(torch.equal(p, params[n]) for n, p in model.named_parameters())
    # the same model and optimizer (torch's deepcopy of an optimizer would drop k), stepped for real
    twin, twin_opt, _ = counting_setup()
    lm_loss(twin, batch).backward()
    twin_opt.step()
    for name, p in twin.named_parameters():
        torch.testing.assert_close(params[name] + 0.1 * v[name], p.detach(), rtol=1e-12, atol=1e-15)


class Recorder:
    """A hook's owner holding an open file, as a monitor does: it can be neither deep-copied nor run."""

    def __init__(self, path):
        self.file = open(path, "w")  # noqa: SIM115 (open for the optimizer's lifetime)
        self.calls = 0

    def hook(self, optimizer, args, kwargs):
        self.calls += 1


def test_hooks_and_a_schedulers_step_wrapper_are_left_to_the_original(tmp_path):
    model, opt, _, batch = setup(optimizer="sgd")
    recorder = Recorder(tmp_path / "log")
    opt.register_step_pre_hook(recorder.hook)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # wraps opt.step in the instance's __dict__
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = opt.state_dict()
    v = update_direction(model, opt, lm_loss, batch)
    recorder.file.close()
    assert recorder.calls == 0
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())
    delta = real_step(model, lambda m: [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)], [state], lm_loss, batch)
    for name, d in delta.items():
        torch.testing.assert_close(0.1 * v[name].double(), d, rtol=1e-9, atol=1e-15)


def test_a_closure_driven_step_is_refused():
    model, _, _, batch = setup()
    with pytest.raises(ValueError, match=r"LBFGS.step\(\) requires a closure; the direction of a closure-driven"):
        update_direction(model, torch.optim.LBFGS(model.parameters(), lr=0.1), lm_loss, batch)


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_a_direction_taken_from_an_evaluation_loop_is_the_step(context):
    """Under ``torch.no_grad`` or ``inference_mode`` (an evaluation callback), with a batch made there too, the
    gradient pass was refused as if ``loss_fn`` had detached its loss; now v is the step the optimizer takes."""
    model, opt, _, _ = setup(optimizer="sgd")
    state = opt.state_dict()
    with getattr(torch, context)():
        batch = torch.randint(0, VOCAB, (8, T + 1), generator=torch.Generator().manual_seed(7))
        v = update_direction(model, opt, lm_loss, batch)
    assert not any(t.is_inference() for t in v.values())
    delta = real_step(
        model, lambda m: [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)], [state], lm_loss, batch.clone()
    )
    for name, d in delta.items():
        torch.testing.assert_close(0.1 * v[name].double(), d, rtol=1e-9, atol=1e-15)


def test_a_learnable_weight_of_the_loss_keeps_its_gradient_and_stays_out_of_the_clipping():
    """The optimizer also trains a temperature that ``loss_fn`` holds, outside the model: the probe's backward pass
    left a gradient on it (accumulated into the training loop's next one). Now its ``.grad`` is as it was, and with
    clipping θ + lr·v is the loop's step, whose ``clip_grad_norm_(model.parameters(), c)`` leaves it out."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    temperature = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

    def loss_fn(m, batch):
        logits = m(batch[:, :-1]) / temperature
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))

    opt = torch.optim.SGD([*model.parameters(), temperature], lr=0.1, momentum=0.9)
    batch = torch.randint(0, VOCAB, (8, T + 1))
    give_state(model, opt, loss_fn, batch)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    c = 0.05
    v = update_direction(model, opt, loss_fn, batch, max_grad_norm=c)
    assert temperature.grad is None
    loss_fn(model, batch).backward()
    assert torch.nn.utils.clip_grad_norm_(model.parameters(), c) > 2 * c  # the clipping is active
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + 0.1 * v[n], rtol=1e-12, atol=1e-15)


def test_a_sparse_gradient_is_stepped_and_its_clipping_refused():
    """``nn.Embedding(sparse=True)``: without clipping θ + lr·v is the step SGD with momentum takes. With clipping
    there is no real step: torch's ``clip_grad_norm_`` cannot take a sparse gradient's norm (torch 2.13 raises), nor
    can ours. The probe failed inside its clipping ("expand is unsupported for Sparse tensors"); now it refuses in
    one line."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    model.embed = nn.Embedding(VOCAB, model.embed.embedding_dim, sparse=True).double()
    batch = torch.randint(0, VOCAB, (8, T + 1))

    def make(m):
        return [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)]

    (opt,) = make(model)
    give_state(model, opt, lm_loss, batch)  # momentum buffers, sparse for the embedding
    v = update_direction(model, opt, lm_loss, batch)
    delta = real_step(model, make, [opt.state_dict()], lm_loss, batch)
    assert sorted(v) == sorted(delta)
    for name, d in delta.items():
        torch.testing.assert_close(0.1 * v[name].double(), d, rtol=1e-9, atol=1e-15)
    with pytest.raises(NotImplementedError, match="linalg_vector_norm"):
        real_step(model, make, [opt.state_dict()], lm_loss, batch, max_grad_norm=0.05)
    with pytest.raises(ValueError, match=r"max_grad_norm=0.05, but the gradient of embed.weight is sparse .*; give "):
        update_direction(model, opt, lm_loss, batch, max_grad_norm=0.05)


#: optimizers with state of their own, torch's and ours
STATEFUL = {
    "torch-sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adamw": lambda ps: AdamW(ps, lr=1e-2),
}


class AuxiliaryLM(TinyCausalLM):
    """The tiny LM with an auxiliary head that only the warm-up's loss uses: the probed batch gives it no gradient."""

    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(self.embed.embedding_dim, 1)


def with_auxiliary_loss(model, batch):
    return lm_loss(model, batch) + model.aux(model.embed(batch)).square().mean()


@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize("optimizer", STATEFUL)
def test_a_parameter_without_a_gradient_moves_as_its_grad_field_says(optimizer, set_to_none):
    """After ``zero_grad(set_to_none=False)`` a parameter the batch gives no gradient keeps a zero ``.grad``, and
    torch's and our optimizers step it: momentum and Adam's moments move it. The probe had left it out of v (the real
    step moved the auxiliary weight by 0.145 with SGD-momentum, 7.7e-3 with AdamW); a ``.grad`` of None is skipped."""
    torch.manual_seed(0)
    model = AuxiliaryLM().double()
    opt = STATEFUL[optimizer](model.parameters())
    batch = torch.randint(0, VOCAB, (8, T + 1))
    give_state(model, opt, with_auxiliary_loss, batch, set_to_none=set_to_none)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = opt.param_groups[0]["lr"]
    v = update_direction(model, opt, lm_loss, batch)
    assert ("aux.weight" in v) is not set_to_none
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        moved = params[n] + lr * v[n] if n in v else params[n]
        torch.testing.assert_close(p.detach(), moved, rtol=1e-12, atol=1e-15)


def twin_weights(kind):
    """The tiny LM whose output head's weight is the embedding's: ``tied`` (one parameter under two names) or
    ``aliased`` (two parameters over one memory, each with its own gradient, each stepped: the step of one moves
    the other)."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    model.head.weight = model.embed.weight if kind == "tied" else nn.Parameter(model.embed.weight.detach())
    return model


def mean_entropy(model, data):
    with torch.no_grad():
        return float(entropy_per_sequence(model(data[:, :-1])).sum()) / (data.shape[0] * T)


@pytest.mark.parametrize("optimizer", STATEFUL)
@pytest.mark.parametrize("kind", ["tied", "aliased"])
def test_weights_over_one_memory_are_stepped_as_the_optimizer_steps_them(kind, optimizer):
    """The shadow step cloned each parameter on its own, so the step of one aliased parameter did not move the
    other: lr·v of the embedding was 1.5e-2 off a step of 1.9e-2 (SGD-momentum) and 1.0e-2 off 2.0e-2 (AdamW). Tied
    weights (one parameter) were right. The probe's true ΔH at η = lr is the real step's."""
    model = twin_weights(kind)
    opt = STATEFUL[optimizer](model.parameters())
    batch, data = torch.randint(0, VOCAB, (8, T + 1)), torch.randint(0, VOCAB, (E, T + 1))
    give_state(model, opt, lm_loss, batch)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = opt.param_groups[0]["lr"]
    v = update_direction(model, opt, lm_loss, batch)
    result = probe_step(model, v, data, [lr])
    before = mean_entropy(model, data)
    lm_loss(model, batch).backward()
    opt.step()
    assert model.head.weight.data_ptr() == model.embed.weight.data_ptr()  # still one memory
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + lr * v[n], rtol=1e-12, atol=1e-15)
    true = mean_entropy(model, data) - before
    assert result["true"]["entries"][0]["delta_h_true"] == pytest.approx(true, rel=1e-9)


def test_an_entry_under_a_tied_parameters_second_name_is_named_as_such():
    """A direction keyed like ``named_parameters(remove_duplicate=False)`` or a state dict holds a tied weight twice;
    the probe said its second name was "not a parameter of the model"."""
    model = twin_weights("tied")
    v = {n: torch.randn_like(p) for n, p in model.named_parameters(remove_duplicate=False)}
    data = torch.randint(0, VOCAB, (E, T + 1))
    with pytest.raises(
        ValueError, match=r"^direction\['head.weight'\] is the parameter 'embed.weight' \(tied\): give its entry once"
    ):
        probe_step(model, v, data, [1e-3])
    del v["head.weight"]
    assert math.isfinite(probe_step(model, v, data, [1e-3])["approx"]["delta_h_per_lr"])
