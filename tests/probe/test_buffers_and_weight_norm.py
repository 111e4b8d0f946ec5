"""update_direction leaves every buffer of the model as it was, whatever its forward pass does to them, and the weight
of an embedding (or embedding bag) with max_norm too; the probe takes weight-normed models and max_norm embeddings, and
refuses one tied to an output head. Oracles: the buffers and weights before the probe, the step a training loop then
really takes, and central finite differences of the entropy of a moved copy."""

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from optiscope.optim import AdamW
from optiscope.probe import entropy_per_sequence, probe_step, sample_sequences, update_direction
from tiny_lm import VOCAB, CountingLM, E, T, TinyCausalLM, give_state, lm_loss


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
    give_state(model, opt, lm_loss, batch)
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

    # the moved copy's forward pass rescales its own weight
    assert_central_differences(result, lambda eta: mean_entropy_moved(copy.deepcopy(model), v, eta, data))


def assert_central_differences(result, entropy_at):
    """The probe's ``result`` at η = 1e-3 against central differences of ``entropy_at(η)``, the mean entropy
    after a step η along the probed direction: H, H′ (step 1e-4), H″ (step 1e-3) and the true change."""
    h = 1e-4
    up, mid, down = (entropy_at(e) for e in (h, 0.0, -h))
    assert result["base_value"] == pytest.approx(mid, rel=1e-12)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((up - down) / (2 * h), rel=1e-6)
    h = 1e-3
    up, down = (entropy_at(e) for e in (h, -h))
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx((up - 2 * mid + down) / h**2, rel=1e-5)
    assert result["true"]["entries"][0]["delta_h_true"] == pytest.approx(up - mid, rel=1e-9)


class BagLM(TinyCausalLM):
    """The tiny LM whose positions also see the sum of their token's and the previous token's rows of an
    ``nn.EmbeddingBag`` with max_norm, whose rows start above it."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, self.embed.embedding_dim, mode="sum", max_norm=1.0)
        with torch.no_grad():
            self.bag.weight.mul_(2)

    def forward(self, idx):
        previous = torch.cat([idx[:, :1], idx[:, :-1]], 1)
        bags = self.bag(torch.stack([previous, idx], -1).reshape(-1, 2)).reshape(*idx.shape, -1)
        h = self.embed(idx) + bags
        prefix = h.cumsum(1) / torch.arange(1, idx.shape[1] + 1, dtype=h.dtype, device=h.device).view(1, -1, 1)
        return self.head(torch.tanh(self.mix(torch.cat([h, prefix], -1))))


@pytest.mark.parametrize("precision", ["float64", "model"])
def test_an_embedding_bag_with_max_norm_is_stepped_probed_and_left_as_it_was(precision):
    """``nn.EmbeddingBag(max_norm=…)`` rescales the rows it looks up in place too. update_direction put the weight
    back and θ + lr·v is the real step (as before). Sampling rescaled the caller's weight (by up to 3.5 here); the
    probe along a step that leaves the bag's weight failed inside torch.func on that in-place write, after rescaling
    the caller's weight (by up to 2.2) with ``precision="model"``. Now both leave it, and the probe's terms are central
    differences of a copy whose forward pass rescales as torch does. Along a step that moves the bag's weight the probe
    refuses in one line: torch 2.13's ``_embedding_bag`` has no forward-mode rule."""
    torch.manual_seed(0)
    model = BagLM().double()
    batch, data = torch.randint(0, VOCAB, (8, T + 1)), torch.randint(0, VOCAB, (E, T + 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert bool((params["bag.weight"].norm(dim=1) > 1.5).all())  # rows the forward pass will rescale
    v = update_direction(model, opt, lm_loss, batch)
    sample_sequences(model, data[:, 0], T, T, torch.Generator().manual_seed(0))
    frozen = {n: d for n, d in v.items() if n != "bag.weight"}
    result = probe_step(model, frozen, data, [1e-3], precision=precision)
    with pytest.raises(ValueError, match=r"does not support forward-mode AD.*_embedding_bag.*; use plain tensor ops"):
        probe_step(model, v, data, [1e-3], precision=precision)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), params[n]), n

    assert_central_differences(result, lambda eta: mean_entropy_moved(copy.deepcopy(model), frozen, eta, data))
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + 0.5 * v[n], rtol=1e-12, atol=1e-14)


def tied_max_norm_model():
    """The tiny LM whose output head is tied to an embedding with max_norm, whose rows start above it."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    model.embed = nn.Embedding(VOCAB, model.embed.embedding_dim, max_norm=1.0).double()
    model.head.weight = model.embed.weight
    return model


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_max_norm_embedding_tied_to_the_head_is_stepped_and_not_probed(optimizer):
    """update_direction's v is the real step (as before). probe_step rescaled the rows for the lookup only, while
    the model's forward pass rescales its weight in place and the head then reads it: H(θ) came out 1.871 against
    the model's 1.921, and along the SGD step H′ 0.161 against 0.013 by central differences. The model has no
    entropy per sequence to probe: its logits for a sequence depend on the others in the batch (the mean entropy of
    the sequences scored one at a time is 1.897). probe_step and sample_sequences refuse it in one line."""
    model = tied_max_norm_model()
    batch, data = torch.randint(0, VOCAB, (8, T + 1)), torch.randint(0, VOCAB, (E, T + 1))
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.5), "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1)}
    opt = make[optimizer](model.parameters())
    lr = opt.param_groups[0]["lr"]
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    v = update_direction(model, opt, lm_loss, batch)

    def entropy(sequences):  # the model's own forward pass, on a copy whose weight it rescales
        return mean_entropy_moved(copy.deepcopy(model), {}, 0.0, sequences)

    alone = sum(entropy(data[i : i + 1]) for i in range(E)) / E
    assert abs(alone - entropy(data)) > 1e-2
    tied = r"embed.weight, the weight of an Embedding with max_norm=1.0, is also head.weight: .*; untie them, or set"
    with pytest.raises(ValueError, match="probe_step: " + tied):
        probe_step(model, v, data, [1e-3])
    with pytest.raises(ValueError, match="sample_sequences: " + tied):
        sample_sequences(model, data[:, 0], T, T, torch.Generator().manual_seed(0))
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + lr * v[n], rtol=1e-12, atol=1e-14)


def test_a_max_norm_embedding_registered_twice_is_not_tied():
    """The same embedding module under two names holds its weight alone: it is probed."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    model.embed = nn.Embedding(VOCAB, model.embed.embedding_dim, max_norm=1.0).double()
    model.again = model.embed
    v = {n: 0.1 * torch.randn_like(p) for n, p in model.named_parameters()}
    result = probe_step(model, v, torch.randint(0, VOCAB, (E, T + 1)), [1e-3])
    assert math.isfinite(result["approx"]["delta_h_per_lr"])
