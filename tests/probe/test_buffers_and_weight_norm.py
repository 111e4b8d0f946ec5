"""update_direction leaves every buffer of the model as it was, whatever its forward pass does to them, and an
embedding's max_norm weight too; the probe takes weight-normed models and max_norm embeddings. Oracles: the buffers
and weights before the probe, the step a training loop then really takes, and central finite differences of the
entropy of a moved copy."""

import copy
import warnings

import pytest
import torch
from torch import nn

from optiscope.optim import AdamW
from optiscope.probe import entropy_per_sequence, probe_step, sample_sequences, update_direction
from tiny_lm import VOCAB, CountingLM, E, T, TinyCausalLM, lm_loss


class InPlaceCounter(CountingLM):
    """The tiny LM scaled by a call counter its forward updates in place: the loss depends on the count."""

    def forward(self, idx):
        self.calls += 1
        return self.lm(idx) * (1 + 0.5 * self.calls)


class AssigningCounter(InPlaceCounter):
    """The same with the buffer assigned anew (a new tensor) rather than updated in place."""

    def forward(self, idx):
        self.calls = self.calls + 1
        return self.lm(idx) * (1 + 0.5 * self.calls)


class Observed(nn.Module):
    """The tiny LM with a quantisation observer, whose forward records the running range of its logits."""

    def __init__(self):
        super().__init__()
        self.lm = TinyCausalLM()
        self.observer = torch.ao.quantization.MinMaxObserver()

    def forward(self, idx):
        logits = self.lm(idx)
        self.observer(logits.detach())
        return logits


class Normalised(nn.Module):
    """The tiny LM with a batch norm (training mode, running statistics tracked) on its logits."""

    def __init__(self):
        super().__init__()
        self.lm = TinyCausalLM()
        self.norm = nn.BatchNorm1d(VOCAB)

    def forward(self, idx):
        return self.norm(self.lm(idx).transpose(1, 2)).transpose(1, 2)


class SpectrallyNormed(TinyCausalLM):
    """The tiny LM with spectral norm on its hidden layer, whose forward pass in training mode takes a step of
    power iteration on its buffers u and v."""

    def __init__(self):
        super().__init__()
        self.mix = nn.utils.parametrizations.spectral_norm(self.mix)


@pytest.mark.parametrize("make", [InPlaceCounter, AssigningCounter, Observed, Normalised, SpectrallyNormed])
def test_the_direction_leaves_every_buffer_and_is_the_step_then_taken(make):
    torch.manual_seed(0)
    model = make().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        lm_loss(model, torch.randint(0, VOCAB, (8, T + 1))).backward()
        opt.step()
    opt.zero_grad()
    batch = torch.randint(0, VOCAB, (8, T + 1))  # one the observer has not seen: its range moves
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    held = {n: b for n, b in model.named_buffers()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    v = update_direction(model, opt, lm_loss, batch)
    for n, b in model.named_buffers():
        assert b is held[n] and torch.equal(b, buffers[n]), n
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + 0.1 * v[n], rtol=1e-12, atol=1e-14)


def weight_normed(kind):
    """The tiny LM with weight norm on its hidden layer: torch's hook-based one or its parametrization."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the hook-based one is deprecated, and still in use
        norm = nn.utils.weight_norm if kind == "hook" else nn.utils.parametrizations.weight_norm
        model.mix = norm(model.mix)
    return model


def mean_entropy_moved(model, direction, eta, data):
    """H(θ + ηv) by plain means: the parameters moved in place, a forward pass, the parameters put back (a model
    with the hook-based weight norm has no deep copy)."""
    params = dict(model.named_parameters())
    saved = {n: params[n].detach().clone() for n in direction}
    with torch.no_grad():
        for n, v in direction.items():
            params[n].add_(eta * v)
        h = float(entropy_per_sequence(model(data[:, :-1])).sum()) / (data.shape[0] * T)
        for n, t in saved.items():
            params[n].copy_(t)
    return h


@pytest.mark.parametrize("precision", ["float64", "model"])
@pytest.mark.parametrize("kind", ["hook", "parametrization"])
def test_a_weight_normed_model_is_probed_and_its_terms_are_finite_differences(kind, precision):
    """torch's weight-norm kernel has no forward-mode rule (the probe refused the model); composed from ordinary
    ops it gives H′ and H″ of central differences, and the direction is the step AdamW then takes."""
    model = weight_normed(kind)
    batch, data = torch.randint(0, VOCAB, (8, T + 1)), torch.randint(0, VOCAB, (E, T + 1))
    opt = AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        lm_loss(model, batch).backward()
        opt.step()
    opt.zero_grad()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    v = update_direction(model, opt, lm_loss, batch)
    assert any(n.startswith("mix.") and n != "mix.bias" for n in v)  # the weight norm's g and v move
    result = probe_step(model, v, data, [1e-3], precision=precision)
    h = 1e-4
    up, mid, down = (mean_entropy_moved(model, v, e, data) for e in (h, 0.0, -h))
    assert result["base_value"] == pytest.approx(mid, rel=1e-12)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((up - down) / (2 * h), rel=1e-5)
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx((up - 2 * mid + down) / h**2, rel=1e-4)
    assert result["true"]["entries"][0]["delta_h_true"] == pytest.approx(
        mean_entropy_moved(model, v, 1e-3, data) - mid, rel=1e-9
    )
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), params[n]), n  # the probe moved nothing
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + 1e-2 * v[n], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_an_embedding_with_max_norm_is_put_back_and_its_rescaling_is_in_the_step(optimizer):
    """``nn.Embedding(max_norm=…)`` rescales the rows it looks up in place: the probe's gradient pass rescaled the
    caller's weight. Now the weight is put back bit for bit, and θ + lr·v is still where the real step lands
    (its forward pass rescales, then the optimizer steps)."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    model.embed = nn.Embedding(VOCAB, model.embed.embedding_dim, max_norm=1.0).double()
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.5), "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1)}
    opt = make[optimizer](model.parameters())
    batch = torch.randint(0, VOCAB, (8, T + 1))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert bool((params["embed.weight"].norm(dim=1) > 1.5).any())  # rows the forward pass will rescale
    lr = opt.param_groups[0]["lr"]
    v = update_direction(model, opt, lm_loss, batch)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), params[n]), n
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + lr * v[n], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("precision", ["float64", "model"])
def test_the_probe_differentiates_an_embeddings_max_norm_rescaling(precision):
    """The rescaling ran in place without a derivative: H′ was 1.4 % off here (7.8 times the central difference
    along an SGD step), and the probe rescaled the caller's weight with ``precision="model"``, as sampling did.
    Central differences of a moved copy (whose forward pass rescales as torch does) are the oracle."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    model.embed = nn.Embedding(VOCAB, model.embed.embedding_dim, max_norm=1.0).double()
    weight = model.embed.weight.detach().clone()
    assert bool((weight.norm(dim=1) > 1.5).any())
    v = {n: 0.1 * torch.randn_like(p) for n, p in model.named_parameters()}
    data = torch.randint(0, VOCAB, (E, T + 1))
    result = probe_step(model, v, data, [1e-3], precision=precision)
    assert torch.equal(model.embed.weight.detach(), weight)
    sample_sequences(model, data[:, 0], T, T, torch.Generator().manual_seed(0))
    assert torch.equal(model.embed.weight.detach(), weight)

    def entropy_at(eta):
        moved = copy.deepcopy(model)  # the moved copy's forward pass rescales its own weight
        return mean_entropy_moved(moved, v, eta, data)

    h = 1e-4
    up, mid, down = (entropy_at(e) for e in (h, 0.0, -h))
    assert result["base_value"] == pytest.approx(mid, rel=1e-12)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((up - down) / (2 * h), rel=1e-6)
    h = 1e-3
    up, down = (entropy_at(e) for e in (h, -h))
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx((up - 2 * mid + down) / h**2, rel=1e-5)
    assert result["true"]["entries"][0]["delta_h_true"] == pytest.approx(up - mid, rel=1e-9)
