"""The probe on a 🤗 causal LM with PEFT LoRA adapters: ``.logits`` outputs, padded batches, frozen weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("peft")

from peft import LoraConfig, get_peft_model  # noqa: E402

import tiny_hf  # noqa: E402
from optiscope.optim import AdamW  # noqa: E402
from optiscope.probe import probe_step, sample_sequences, update_direction  # noqa: E402
from optiscope.probe.functionals import entropy_per_sequence, sequence_log_prob  # noqa: E402

E, T = 4, 7


def loss_fn(model, batch):
    return model(input_ids=batch, labels=batch).loss


@pytest.fixture(scope="module")
def lora():
    """A tiny Qwen2 with LoRA adapters after two real AdamW steps, its step direction and a snapshot of it."""
    base = tiny_hf.model("qwen2", seed=0).double()
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(3, tiny_hf.VOCAB, (4, T + 1), generator=generator)
    optimizer = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # B starts at zero; after a step the adapters have a gradient in every direction
        optimizer.zero_grad()
        loss_fn(model, batch).backward()
        optimizer.step()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    v = update_direction(model, optimizer, loss_fn, batch)
    sequences = torch.randint(3, tiny_hf.VOCAB, (E, T + 1), generator=generator)
    return model, v, sequences, before


def test_direction_covers_the_trainable_parameters_only(lora):
    model, v, _, _ = lora
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(v) == trainable and all("lora_" in n for n in v)


def perturbed_totals(model, v, eta, sequences, policy, scored=None):
    """The oracle: a float64 copy of the model with θ + ηv written into its weights, scored directly."""
    net = __import__("copy").deepcopy(model).double().eval()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name in v:
                p.add_(eta * v[name])
        logits = net(input_ids=sequences[:, :-1]).logits
    scored = torch.ones(sequences[:, 1:].shape, dtype=torch.bool) if scored is None else scored
    S = entropy_per_sequence(logits, scored)
    n = scored.sum(1).double()
    logp = sequence_log_prob(logits, sequences[:, 1:], scored) if policy else torch.zeros(len(S))
    return S, n, logp


def snis_entropy(model, v, eta, sequences, policy, scored=None):
    S, n, logp = perturbed_totals(model, v, eta, sequences, policy, scored)
    _, _, logp0 = perturbed_totals(model, v, 0.0, sequences, policy, scored)
    w = (logp - logp0).exp()
    return float((w * S).sum() / (w * n).sum())


@pytest.mark.parametrize("mode", ["fixed", "policy"])
def test_terms_match_central_finite_differences(lora, mode):
    model, v, sequences, before = lora
    scored = None
    if mode == "policy":  # prompts of 2 tokens, 6 sampled ones; only the sampled positions count
        starts = sequences[:, :2]
        sequences = sample_sequences(model, starts, T - 1, 64, torch.Generator().manual_seed(1))
        scored = torch.zeros(E, T, dtype=torch.bool)
        scored[:, 1:] = True
    result = probe_step(model, v, sequences, [1e-3, 1e-2], mode=mode, scored=scored)
    # H′ and H″ from a least-squares polynomial (degree 8) through H at 21 step sizes in [−0.02, 0.02]:
    # central differences of a few points would not do, because Qwen2 computes RMSNorm and the attention
    # softmax in float32 even in a float64 model, so H carries ~1e-10 of rounding noise that a fit averages out.
    etas = np.linspace(-0.02, 0.02, 21)
    H = [snis_entropy(model, v, float(eta), sequences, mode == "policy", scored) for eta in etas]
    coefficients = np.polynomial.polynomial.polyfit(etas, H, 8)
    zero = H[10]
    assert result["base_value"] == pytest.approx(zero, rel=1e-9)  # eager vs sdpa, float32 inside
    assert result["approx"]["delta_h_per_lr"] == pytest.approx(coefficients[1], rel=1e-4)
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx(2 * coefficients[2], rel=5e-4)
    for entry in result["true"]["entries"]:
        true = snis_entropy(model, v, entry["eta"], sequences, mode == "policy", scored) - zero
        assert entry["delta_h_true"] == pytest.approx(true, rel=1e-6, abs=1e-9)
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in before.items())  # frozen and trainable alike, bit for bit
    assert model.config._attn_implementation == "sdpa"  # eager only for the measurement


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_scores_like_each_sequence_alone(lora, side):
    model, v, sequences, _ = lora
    lengths = [T + 1, T - 1, 4, 2]
    pad = 1
    padded = torch.full_like(sequences, pad)
    mask = torch.zeros_like(sequences)
    for i, length in enumerate(lengths):
        cols = slice(0, length) if side == "right" else slice(T + 1 - length, T + 1)
        padded[i, cols], mask[i, cols] = sequences[i, :length], 1
    etas = [1e-2]
    batch = probe_step(model, v, padded, etas, mode="policy", attention_mask=mask)
    alone = [probe_step(model, v, sequences[i : i + 1, :n], etas, mode="policy") for i, n in enumerate(lengths)]
    counts = batch["true"]["entries"][0]["diagnostics"]["token_counts"]
    assert counts == [length - 1 for length in lengths]
    for row, single in zip(batch["approx"]["per_sequence"], alone, strict=True):
        for key in ("h_base", "d_sum", "score"):  # equal up to the float32 softmax inside Qwen2's attention
            assert row[key] == pytest.approx(single["approx"]["per_sequence"][0][key], rel=1e-6, abs=1e-12)
    S = torch.tensor([r["h_base"] for r in batch["approx"]["per_sequence"]], dtype=torch.float64)
    assert batch["base_value"] == pytest.approx(float(S.sum()) / sum(counts), rel=1e-12)


def test_the_model_itself_is_measured_with_eager_attention_and_restored(lora):
    model, v, sequences, before = lora
    seen = []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(model.config._attn_implementation))
    try:
        result = probe_step(model, v, sequences, [1e-3], precision="model")
    finally:
        hook.remove()
    assert seen and set(seen) == {"eager"}  # sdpa has no forward-mode rules on the CPU
    assert model.config._attn_implementation == "sdpa"
    assert result["approx"]["delta_h_per_lr"] != 0
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in before.items())
