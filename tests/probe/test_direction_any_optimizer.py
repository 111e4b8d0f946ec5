"""update_direction for any torch.optim.Optimizer: η₀·v against the Δθ of a real ``step()`` of a twin model and
optimizer (built from the same seed and trained the same steps: no copy made by the code under test), and the
optimizer's state, the model's parameters and gradients, and the global random state unchanged by the call.

torch.optim's own optimizers and, where the ``zoo`` extra is installed, pytorch-optimizer's (Schedule-Free AdamW
divides ``p.grad`` in place inside ``step()``) and heavyball's (whose ``step()`` uses up ``p.grad``).
"""

import pytest
import torch
from torch import nn

from optiscope.probe import update_direction


def optional(module, name, **kwargs):
    """``module.name(params, **kwargs)`` of a library that may not be installed (the ``zoo`` extra)."""

    def make(params):
        return getattr(pytest.importorskip(module), name)(params, **kwargs)

    return make


OPTIMIZERS = {
    "torch-adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "torch-nadam": lambda ps: torch.optim.NAdam(ps, lr=1e-2),
    "torch-radam": lambda ps: torch.optim.RAdam(ps, lr=1e-2),  # rectified from its 6th step: the test takes the 7th
    "torch-adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    "torch-sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "torch-rprop": lambda ps: torch.optim.Rprop(ps, lr=1e-2),
    "torch-asgd": lambda ps: torch.optim.ASGD(ps, lr=1e-2),
    "torch-adadelta": lambda ps: torch.optim.Adadelta(ps, lr=1.0),
    "torch-adafactor": lambda ps: torch.optim.Adafactor(ps, lr=1e-2),
    "pytorch_optimizer-lion": optional("pytorch_optimizer", "Lion", lr=1e-3),
    "pytorch_optimizer-prodigy": optional("pytorch_optimizer", "Prodigy", lr=1.0),
    "pytorch_optimizer-soap": optional("pytorch_optimizer", "SOAP", lr=3e-3),
    "pytorch_optimizer-schedulefree-adamw": optional("pytorch_optimizer", "ScheduleFreeAdamW", lr=1e-2),
    "heavyball-adamw": optional("heavyball", "AdamW", lr=1e-2),
}


def problem():
    """A small regression in float64 and its loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(32, 5, dtype=torch.float64), torch.randn(32, 2, dtype=torch.float64)
    return model, (x, y)


def loss_fn(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def trained(make, steps=6):
    """The model and ``make``'s optimizer after ``steps`` steps on its batch, gradients zeroed: built afresh each
    call, so two calls give twins."""
    model, batch = problem()
    opt = make(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    opt.zero_grad()
    return model, opt, batch


def tensors_of(value, path=()):
    """Every tensor and plain value inside ``value`` (a state dict, an object's attributes), by path, as copies."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach().clone()}
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in tensors_of(item, (*path, str(key))).items()}
    if isinstance(value, list | tuple):
        return {k: v for i, item in enumerate(value) for k, v in tensors_of(item, (*path, i)).items()}
    return {path: value} if isinstance(value, int | float | str | bool | type(None)) else {}


def assert_same(before, after):
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key
        else:
            assert value == after[key] or value != value, key  # NaN equals itself here


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_direction_is_the_real_steps_and_leaves_everything_as_it_was(name):
    make = OPTIMIZERS[name]
    model, opt, batch = trained(make)
    state = tensors_of(opt.state_dict())
    attributes = tensors_of({k: v for k, v in vars(opt).items() if k not in ("state", "param_groups")})
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    v = update_direction(model, opt, loss_fn, batch)
    assert_same(state, tensors_of(opt.state_dict()))
    assert_same(attributes, tensors_of({k: v for k, v in vars(opt).items() if k not in ("state", "param_groups")}))
    assert_same(params, {n: p.detach() for n, p in model.named_parameters()})
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    twin, twin_opt, _ = trained(make)
    loss_fn(twin, batch).backward()
    twin_opt.step()
    lr = float(opt.param_groups[0]["lr"])
    for n, p in twin.named_parameters():
        delta = p.detach() - params[n]
        assert n in v or not torch.any(delta != 0), n
        torch.testing.assert_close(lr * v[n], delta, rtol=1e-9, atol=1e-15)


class NoisySGD(torch.optim.Optimizer):
    """θ ← θ − η(g + σξ), ξ ~ N(0, I) from the global generator: a step that draws."""

    def __init__(self, params, lr=0.1, sigma=0.5):
        super().__init__(params, dict(lr=lr, sigma=sigma))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad + group["sigma"] * torch.randn_like(p), alpha=-group["lr"])


def test_a_step_that_draws_random_numbers_draws_the_real_steps_and_leaves_the_global_stream_alone():
    """The shadow step ran on the training run's random stream: it moved it (so the real step drew other noise than
    v said) — now it draws from a fork, the same numbers the real step then draws."""
    model, batch = problem()
    opt = NoisySGD(model.parameters())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(7)
    v = update_direction(model, opt, loss_fn, batch)
    loss_fn(model, batch).backward()
    opt.step()  # the stream is where it was before the call: the real step draws the same ξ
    for n, p in model.named_parameters():
        torch.testing.assert_close(0.1 * v[n], p.detach() - params[n], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("lr", [None, 0.0])
def test_an_optimizer_without_a_positive_lr_is_refused_in_one_line(lr):
    """🤗 Adafactor keeps lr=None (it sizes its steps itself): it raised a TypeError from float(None)."""
    model, batch = problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.param_groups[0]["lr"] = lr
    with pytest.raises(ValueError, match=rf"^update_direction: the first param group's lr={lr}; v = Δθ/lr needs a "):
        update_direction(model, opt, loss_fn, batch)
