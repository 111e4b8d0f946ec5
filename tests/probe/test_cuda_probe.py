"""optiscope.probe on a CUDA device (skipped without one): its terms against central differences of plain forward
passes, with the model, the sequences and the optimizer's state on the GPU."""

import pytest
import torch
from test_probe import NormedLM, mean_entropy_at

from optiscope.optim import AdamW
from optiscope.probe import probe_step, sample_sequences, update_direction
from support import needs_cuda
from tiny_lm import VOCAB, E, T, TinyCausalLM, lm_loss

pytestmark = needs_cuda


def trained_on_cuda(model):
    torch.manual_seed(0)
    model = model.double().to("cuda")
    data = torch.randint(0, VOCAB, (E, T + 1)).to("cuda")
    batch = torch.randint(0, VOCAB, (8, T + 1)).to("cuda")
    opt = AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        lm_loss(model, batch).backward()
        opt.step()
    return model, opt, data, batch


@pytest.mark.parametrize("make", [TinyCausalLM, NormedLM], ids=["plain", "layer-norms"])
def test_linear_and_quadratic_terms_match_finite_differences_on_cuda(make):
    torch.manual_seed(0)
    model, opt, data, batch = trained_on_cuda(make())
    v = update_direction(model, opt, lm_loss, batch)
    assert all(t.device.type == "cuda" for t in v.values())
    result = probe_step(model, v, data, [1e-3], reverse_check=True)
    h = 1e-5  # the layer norms' curvature changes fast: at 1e-4 the central difference is off by 1e-5 (on the CPU too)
    plus, minus = mean_entropy_at(model, v, h, data), mean_entropy_at(model, v, -h, data)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((plus - minus) / (2 * h), rel=1e-6)
    h = 1e-4
    plus, zero, minus = (mean_entropy_at(model, v, s * h, data) for s in (1, 0, -1))
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx((plus - 2 * zero + minus) / h**2, rel=1e-4)
    assert result["approx"]["reverse"]["vHvv"] == pytest.approx(result["approx"]["quadratic"]["vHvv"], rel=1e-9)


def test_sampling_a_cuda_model_with_a_cpu_generator_draws_what_the_cpu_draws():
    """The generator decides the draws, wherever the model is: a CPU generator gives the CPU's sequences."""
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    starts = torch.randint(0, VOCAB, (E,))
    on_cpu = sample_sequences(model, starts, 6, T, torch.Generator().manual_seed(3))
    on_cuda = sample_sequences(model.to("cuda"), starts.to("cuda"), 6, T, torch.Generator().manual_seed(3))
    assert on_cuda.device.type == "cuda" and torch.equal(on_cuda.cpu(), on_cpu)
    own = sample_sequences(model, starts.to("cuda"), 6, T, torch.Generator("cuda").manual_seed(3))
    assert own.shape == on_cpu.shape and own.device.type == "cuda"


def test_sequences_or_a_direction_on_another_device_are_named():
    torch.manual_seed(0)
    model, opt, data, batch = trained_on_cuda(TinyCausalLM())
    v = update_direction(model, opt, lm_loss, batch)
    with pytest.raises(ValueError, match="sequences are on cpu but the model is on cuda:0: pass sequences.to"):
        probe_step(model, v, data.cpu(), [1e-3])
    name = next(iter(v))
    with pytest.raises(ValueError, match=rf"direction\['{name}'\] is on cpu but the parameter is on cuda:0"):
        probe_step(model, {**v, name: v[name].cpu()}, data, [1e-3])


def test_the_direction_of_a_cuda_model_with_dropout_leaves_its_random_streams_alone():
    """Dropout on a GPU draws from the GPU's stream: measuring the direction must not move it (nor the CPU's)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, VOCAB))
    model = model.to("cuda").train()
    batch = torch.randint(0, VOCAB, (8, T + 1), device="cuda")
    opt = AdamW(model.parameters(), lr=1e-2)
    cuda, cpu = torch.cuda.get_rng_state(), torch.get_rng_state()
    update_direction(model, opt, lm_loss, batch)
    assert torch.equal(torch.cuda.get_rng_state(), cuda) and torch.equal(torch.get_rng_state(), cpu)
    model(batch)  # the oracle that the check can fail: a forward pass with dropout does move the GPU's stream
    assert not torch.equal(torch.cuda.get_rng_state(), cuda)
