"""Parameter names inside wrappers: the model's own names (``named_parameters`` of the plain model) are the
oracle; a submodule the user called ``module`` is not a wrapper."""

import torch
from torch import nn

from curvature_support import exact_hessian
from optiscope.curvature import directional_curvature
from optiscope.monitor import Monitor
from optiscope.monitor.names import is_own_name, own_names
from optiscope.optim import SGD
from optiscope.probe import update_direction


class Holder(nn.Module):
    """A user's block that keeps its layer in an attribute named ``module`` (as wrappers do)."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(3, 4)

    def forward(self, x):
        return torch.tanh(self.module(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = Holder()  # at the top too: "module.module.weight" is the model's own name
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.module(x))


def loss_fn(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def problem():
    torch.manual_seed(0)
    model = Net().double()
    batch = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    return model, batch


def test_own_names_unwrap_only_wrappers():
    model, _ = problem()
    plain = {id(p): n for n, p in model.named_parameters()}
    assert "module.module.weight" in plain.values()
    assert own_names(model) == plain
    assert own_names(torch.compile(model, backend="eager")) == plain
    assert own_names(nn.DataParallel(torch.compile(model, backend="eager"))) == plain


def test_is_own_name_strips_wrapper_prefixes_only():
    assert is_own_name("module._orig_mod.head.weight", "head.weight")
    assert is_own_name("module.module.weight", "module.module.weight")
    assert is_own_name("module.module.module.weight", "module.module.weight")  # DDP around the model
    assert not is_own_name("module.weight", "module.module.weight")
    assert not is_own_name("head.weight", "module.head.weight")


def test_a_submodule_named_module_is_measured_and_named_as_the_model_names_it():
    model, batch = problem()
    opt = SGD(model.parameters(), lr=0.1)
    monitor = Monitor(torch.compile(model, backend="eager"), opt, every=1)
    opt.zero_grad()
    loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    assert set(monitor.step(loss)["params"]) == {n for n, _ in model.named_parameters()}
    # the probe's update direction is keyed by the names the curvature operator knows: dᵀHd/dᵀd against
    # the exact Hessian
    direction = update_direction(model, opt, loss_fn, batch)
    assert set(direction) == {n for n, _ in model.named_parameters()}
    d = torch.cat([direction[n].reshape(-1) for n, _ in model.named_parameters()])
    exact = float(d @ exact_hessian(model, loss_fn, batch) @ d / (d @ d))
    measured = directional_curvature(model, loss_fn, batch, direction)["curvature"]
    assert abs(measured - exact) <= 1e-10 * abs(exact)
