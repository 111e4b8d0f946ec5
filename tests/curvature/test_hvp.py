"""The Hessian-vector operator's contract with the caller's model, batch and loss: wrappers (and only
wrappers) unwrapped, batch containers of every common kind, gradients under ``no_grad`` and
``inference_mode``, and one-line errors for a loss or a batch it cannot use."""

import collections
import warnings

import pytest
import torch
from torch import nn

from curvature_support import exact_hessian, mlp_problem
from optiscope.curvature import HessianOperator, directional_curvature, hessian_trace, sharpness


def top_eigenvalue(model, loss_fn, batch):
    return float(torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch))[-1])


def test_a_model_holding_a_submodule_named_module_is_measured_whole():
    """Only DDP / DataParallel / torch.compile wrappers are unwrapped: a user's ``self.module`` is not one."""

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.module = nn.Linear(3, 4)
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(torch.tanh(self.module(x)))

    _, loss_fn, batch = mlp_problem(0)
    torch.manual_seed(0)
    model = Holder().double()
    out = sharpness(model, loss_fn, batch, tol=1e-10)
    assert out["eigenvalues"][0] == pytest.approx(top_eigenvalue(model, loss_fn, batch), rel=1e-8)
    assert HessianOperator(model, loss_fn, batch).size == sum(p.numel() for p in model.parameters())
    exact_trace = float(exact_hessian(model, loss_fn, batch).trace())
    trace = hessian_trace(model, loss_fn, batch, probes=200)
    assert abs(trace["trace"] - exact_trace) <= 4 * trace["std_error"]
    wrapped = nn.DataParallel(model)  # a real wrapper: without a GPU a pass-through, with one it moves the model there
    batch = tuple(t.to(next(model.parameters()).device) for t in batch)
    assert sharpness(wrapped, loss_fn, batch, tol=1e-10)["eigenvalues"][0] == pytest.approx(out["eigenvalues"][0])


Pair = collections.namedtuple("Pair", "x y")


@pytest.mark.parametrize(
    "wrap",
    [
        lambda x, y: Pair(x, y),
        lambda x, y: collections.UserDict({"x": x, "y": y}),
        lambda x, y: pytest.importorskip("transformers").BatchEncoding({"x": x, "y": y}),
    ],
    ids=["namedtuple", "UserDict", "BatchEncoding"],
)
def test_batches_in_named_tuples_and_mappings_are_cast_and_keep_their_type(wrap):
    """A float32 model measured in float64: the batch is cast through its container, which keeps its type
    (a loss_fn reading ``batch.x`` or ``batch["x"]`` still works), against the exact float64 Hessian."""
    model, _, (x, y) = mlp_problem(1)
    reference = top_eigenvalue(model, lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), (x, y))
    batch = wrap(x.float(), y.float())
    seen = []

    def loss_fn(m, b):
        seen.append(type(b))
        x, y = (b.x, b.y) if isinstance(b, tuple) else (b["x"], b["y"])
        return nn.functional.mse_loss(m(x), y)

    out = sharpness(model.float(), loss_fn, batch, tol=1e-10, dtype=torch.float64)
    assert out["eigenvalues"][0] == pytest.approx(reference, rel=1e-6)
    assert set(seen) == {type(batch)}


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_measures_inside_no_grad_and_inference_mode(context):
    """Called from an evaluation block, with a batch made there: the same numbers as outside it."""
    model, loss_fn, batch = mlp_problem(2)
    expected = top_eigenvalue(model, loss_fn, batch)
    with context():
        inner = tuple(t.clone() for t in batch)
        out = sharpness(model, loss_fn, inner, tol=1e-10)
        trace = hessian_trace(model, loss_fn, inner, probes=2)
    assert out["eigenvalues"][0] == pytest.approx(expected, rel=1e-8)
    assert trace["trace"] == hessian_trace(model, loss_fn, batch, probes=2)["trace"]


@pytest.mark.parametrize("case", ["float64 of a float32 model", "eval-mode batch norm"])
def test_measures_inside_inference_mode_what_it_measures_outside(case):
    """An evaluation loop under ``torch.inference_mode``: a float64 measurement of a float32 model, and a model in
    eval mode whose batch norm normalises by its running statistics (buffers), against the exact Hessian taken
    outside it (the parameters and buffers copied in inference mode cannot be saved for the backward pass)."""
    model, loss_fn, batch = mlp_problem(2)
    dtype = None
    if case == "eval-mode batch norm":
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model.eval()
    else:  # float32 values, so that the float64 oracle sees the same numbers
        model, batch, dtype = model.float().double(), tuple(t.float().double() for t in batch), torch.float64
    expected = top_eigenvalue(model, loss_fn, batch)
    if dtype is not None:
        model, batch = model.float(), tuple(t.float() for t in batch)
    with torch.inference_mode():
        out = sharpness(model, loss_fn, batch, tol=1e-10, dtype=dtype)
        trace = hessian_trace(model, loss_fn, batch, probes=2, dtype=dtype)
    assert out["eigenvalues"][0] == pytest.approx(expected, rel=1e-6)
    assert trace["trace"] == pytest.approx(hessian_trace(model, loss_fn, batch, probes=2, dtype=dtype)["trace"])


@pytest.mark.parametrize(
    ("loss_fn", "message"),
    [
        (lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(1), r"loss_fn returned a tensor of shape \(20,\); it must return"),
        (lambda m, b: ((m(b[0]) - b[1]) ** 2).mean().item(), "loss_fn returned a float; it must return"),
        (lambda m, b: ((m(b[0]) - b[1]) ** 2).mean().detach(), "does not depend on the parameters through autograd"),
    ],
    ids=["per-example", "float", "detached"],
)
def test_a_loss_fn_that_does_not_return_the_scalar_loss_is_refused_in_one_line(loss_fn, message):
    model, _, batch = mlp_problem(0)
    with pytest.raises(ValueError, match=message) as caught:
        sharpness(model, loss_fn, batch)
    assert "\n" not in str(caught.value)


def test_an_empty_batch_a_bad_dtype_and_a_misshapen_direction_are_refused():
    model, loss_fn, (x, y) = mlp_problem(0)
    with pytest.raises(ValueError, match="the batch is empty"):
        sharpness(model, loss_fn, (x[:0], y[:0]))
    for bad in ("float64", torch.int64):
        with pytest.raises(ValueError, match=rf"dtype={bad!r}; give a floating torch.dtype"):
            sharpness(model, loss_fn, (x, y), dtype=bad)
    with pytest.raises(
        ValueError, match=r"along\['update'\] is of type list; give 'gradient' or a dict of tensors keyed"
    ):
        sharpness(model, loss_fn, (x, y), along={"update": [p.detach() for p in model.parameters()]})
    with pytest.raises(ValueError, match=r"^curvature: along\['x'\] is of type int; give 'gradient'"):
        sharpness(model, loss_fn, (x, y), along={"x": 5})
    with pytest.raises(ValueError, match=r"^curvature: along\['x'\]='grad'; give 'gradient' or tensors"):
        sharpness(model, loss_fn, (x, y), along={"x": "grad"})
    transposed = {"0.weight": model[0].weight.detach().T.clone()}
    with pytest.raises(ValueError, match=r"for 0.weight has shape \(3, 6\); the parameter's is \(6, 3\)"):
        sharpness(model, loss_fn, (x, y), along={"update": transposed})
    other, _, _ = mlp_problem(1)
    with pytest.raises(ValueError, match="none of the direction's 4 keys is a parameter H is taken over"):
        directional_curvature(model, loss_fn, (x, y), {id(p): torch.ones_like(p) for p in other.parameters()})
    with pytest.raises(ValueError, match="a direction keyed by a Parameter; key it by parameter name or by id"):
        directional_curvature(model, loss_fn, (x, y), {model[0].weight: torch.ones_like(model[0].weight)})


def hooked_weight_norm(layer, dim):
    with warnings.catch_warnings():  # the hook-based API is deprecated, and still common (audio, vocoders)
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(layer, dim=dim)


@pytest.mark.parametrize("api", [nn.utils.parametrizations.weight_norm, hooked_weight_norm])
@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_is_differentiated_twice_correctly(dim, api):
    """torch's fused weight-norm kernel has a wrong second derivative; measured with ordinary ops instead, H v
    agrees with a central difference of gradients in float64, and the weight norm is left as it was."""
    _, loss_fn, batch = mlp_problem(0)
    torch.manual_seed(0)
    layer = api(nn.Linear(3, 6), dim=dim)
    model = nn.Sequential(layer, nn.Tanh(), nn.Linear(6, 2)).double()
    op = HessianOperator(model, loss_fn, batch)
    v = torch.randn(op.size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    theta = op.flatten(op.theta)

    def gradient_at(flat):
        params = {k: t.detach().requires_grad_(True) for k, t in op.split(flat).items()}
        loss = torch.func.functional_call(op.module, {**op.constants, **params}, (batch,))
        return op.flatten(list(torch.autograd.grad(loss, list(params.values()))))

    h = 1e-5
    finite_difference = (gradient_at(theta + h * v) - gradient_at(theta - h * v)) / (2 * h)
    torch.testing.assert_close(op(v), finite_difference, rtol=1e-6, atol=1e-8)
    if api is hooked_weight_norm:
        assert all("compute_weight" not in vars(hook) for hook in layer._forward_pre_hooks.values())
    else:
        assert "forward" not in vars(layer.parametrizations.weight[0])


def test_an_instance_norm_tracking_running_statistics_is_measured_as_it_normalises_in_training():
    """In training an instance norm normalises each example by its own statistics whatever it tracks; the
    measurement does the same (not eval mode's running statistics) and leaves those statistics alone. Oracle:
    the loss written out (torch.func.hessian through F.instance_norm itself is off by 1e-3 relative in torch
    2.13: its forward-mode derivative, which reverse-over-reverse products do not use)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.last = nn.Linear(4, 6), nn.Linear(6, 2)
            self.norm = nn.InstanceNorm1d(2, affine=True, track_running_stats=True)

        def forward(self, x):
            return self.last(torch.tanh(self.norm(self.first(x).view(-1, 2, 3)).flatten(1)))

    torch.manual_seed(0)
    model = Net().double()
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(3):
            model(3 * x + 2)  # moves the running statistics away from any example's

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    norm = model.norm
    shapes = [p.shape for p in model.parameters()]

    def written_out(flat, own_statistics):
        w1, b1, w2, b2, gamma, beta = (
            t.view(s) for t, s in zip(torch.split(flat, [s.numel() for s in shapes]), shapes, strict=True)
        )
        h = (x @ w1.T + b1).view(-1, 2, 3)
        if own_statistics:
            mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        else:
            mean, var = norm.running_mean[:, None], norm.running_var[:, None]
        h = (h - mean) / torch.sqrt(var + norm.eps) * gamma[:, None] + beta[:, None]
        return ((torch.tanh(h.flatten(1)) @ w2.T + b2 - y) ** 2).mean()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    exact, in_eval = (
        torch.linalg.eigvalsh(torch.func.hessian(lambda f, o=own: written_out(f, o))(flat)).flip(0)[:2]
        for own in (True, False)
    )
    assert not torch.allclose(exact, in_eval, rtol=1e-2)  # the two functions differ: the test can fail
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measured = sharpness(model, loss_fn, (x, y), k=2, tol=1e-10)["eigenvalues"]
    torch.testing.assert_close(torch.tensor(measured, dtype=torch.float64), exact, rtol=1e-6, atol=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert model.norm.training


def test_a_forward_pass_that_updates_a_buffer_in_place_leaves_the_models_alone():
    """A call counter (or a quantisation observer's range) that the forward pass updates: the measurement's
    forward passes update copies, in the model's own dtype as in float64."""

    class Counted(nn.Sequential):
        def __init__(self, *layers):
            super().__init__(*layers)
            self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

        def forward(self, x):
            self.calls += 1
            return super().forward(x)

    model, loss_fn, batch = mlp_problem(0)
    counted = Counted(*model)
    for dtype in (None, torch.float64):
        sharpness(counted, loss_fn, batch, dtype=dtype)
        hessian_trace(counted, loss_fn, batch, probes=2, dtype=dtype)
        assert float(counted.calls) == 0, dtype
    counted(batch[0])
    assert float(counted.calls) == 1  # the counter counts: the test can fail


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_keeps_its_eigenvalues_unrounded(dtype):
    """A model wholly in float16 or bfloat16: its products are taken in its dtype, but the Lanczos vectors and
    the sums behind the eigenvalues are float32 (they were the model's dtype, which rounded the top eigenvalue
    3.7e-4 (float16) and 1.5e-3 (bfloat16) off). Against the closed form H = 2 XᵀX / n of a linear least-squares
    model, X as the model sees it."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 64).to(dtype), torch.randn(256, 1).to(dtype)
    model = nn.Linear(64, 1, bias=False).to(dtype)

    def loss_fn(m, batch):
        return ((m(batch[0]) - batch[1]) ** 2).mean()

    X = x.double()
    top = float(torch.linalg.eigvalsh(2 * X.T @ X / len(X))[-1])
    out = sharpness(model, loss_fn, (x, y), k=3, tol=1e-3)
    assert out["eigenvalues"][0] == pytest.approx(top, rel=1.5e-4)


def test_mixed_parameter_dtypes_are_measured_in_the_widest():
    """A bfloat16 parameter first among float32 ones: the Lanczos vectors are float32, not bfloat16 (whose 3
    significant digits put the top-3 eigenvalues 6e-4 to 3e-3 off); against the exact Hessian of the model
    in float64, where only the bfloat16 parameter's own gradient stays rounded."""

    class Offset(nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
            self.linear = nn.Linear(16, 4)

        def forward(self, x):
            return self.linear(x) + self.offset.float()

    torch.manual_seed(0)
    model = Offset()
    x, y = torch.randn(64, 16) * torch.linspace(0.2, 3, 16), torch.randn(64, 4)

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    measured = sharpness(model, loss_fn, (x, y), k=3, tol=1e-4)["eigenvalues"]
    exact = torch.linalg.eigvalsh(exact_hessian(model.double(), loss_fn, (x.double(), y.double()))).flip(0)[:3]
    assert measured == pytest.approx(exact.tolist(), rel=5e-4)
