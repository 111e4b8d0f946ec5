"""The probe's terms against finite differences and reverse mode, computed by independent code."""

import copy
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from optiscope.optim import Adam
from optiscope.probe import entropy_per_sequence, prediction_curves, probe_step, sample_sequences, update_direction
from tiny_lm import VOCAB, CountingLM, E, T, TinyCausalLM, lm_loss, setup


def mean_entropy_at(model, direction, eta, data):
    """H(θ + ηv) by plain means: a copy of the model with its parameters moved, then a forward pass."""
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            if name in direction:
                p.add_(eta * direction[name])
        return float(entropy_per_sequence(moved(data[:, :-1])).sum()) / (data.shape[0] * T)


def test_linear_and_quadratic_terms_match_finite_differences():
    model, opt, data, batch = setup()
    v = update_direction(model, opt, lm_loss, batch)
    result = probe_step(model, v, data, [1e-3], reverse_check=True)
    h = 1e-4
    plus, zero, minus = (mean_entropy_at(model, v, s * h, data) for s in (1, 0, -1))
    central = (plus - minus) / (2 * h)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx(central, rel=1e-6)
    h = 1e-3
    plus, minus = mean_entropy_at(model, v, h, data), mean_entropy_at(model, v, -h, data)
    second = (plus - 2 * zero + minus) / h**2
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx(second, rel=1e-5)
    assert result["base_value"] == pytest.approx(zero, rel=1e-13)
    # reverse mode (gradient · v, Hessian-vector product) agrees with the nested forward mode
    reverse = result["approx"]["reverse"]
    assert reverse["gdotv"] == pytest.approx(result["approx"]["delta_h_per_lr"], rel=1e-10)
    assert reverse["vHvv"] == pytest.approx(result["approx"]["quadratic"]["vHvv"], rel=1e-9)


def test_true_change_is_exact_and_per_sequence_parts_sum_to_totals():
    model, opt, data, batch = setup()
    v = update_direction(model, opt, lm_loss, batch)
    etas = [1e-4, 1e-3, 1e-2]
    result = probe_step(model, v, data, etas, chunk_size=4)  # chunking must not change anything
    base = mean_entropy_at(model, v, 0.0, data)
    for entry, eta in zip(result["true"]["entries"], etas, strict=True):
        assert entry["delta_h_true"] == pytest.approx(mean_entropy_at(model, v, eta, data) - base, rel=1e-9, abs=1e-15)
        d = entry["diagnostics"]
        w = np.asarray(d["normalized_weights"]) * d["weights_sum"]
        counts, h_new = np.asarray(d["token_counts"]), np.asarray(d["h_new"])
        per_seq_true = w * h_new / np.dot(counts, w) - counts / counts.sum() * d["base_entropy"]
        assert per_seq_true.sum() == pytest.approx(entry["delta_h_true"], abs=1e-12)
    per_seq = [r["gdotv"] for r in result["approx"]["per_sequence"]]
    assert math.fsum(per_seq) == pytest.approx(result["approx"]["delta_h_per_lr"], abs=1e-12)


def test_small_steps_are_linear():
    model, opt, data, batch = setup()
    v = update_direction(model, opt, lm_loss, batch)
    etas = np.logspace(-6, -4, 5).tolist()
    result = probe_step(model, v, data, etas)
    linear = result["approx"]["delta_h_per_lr"]
    for entry in result["true"]["entries"]:
        assert entry["delta_h_true"] / (linear * entry["eta"]) == pytest.approx(1.0, abs=0.02)
    slope = np.polyfit(np.log(etas), np.log([abs(e["delta_h_true"]) for e in result["true"]["entries"]]), 1)[0]
    assert slope == pytest.approx(1.0, abs=0.05)


def snis_entropy(model, direction, eta, sequences):
    """Ĥ(η) = Σ w_i S_i(η) / Σ w_i n_i with w_i = p_{θ+ηv}(x_i)/p_θ(x_i), by plain forward passes."""

    def scores(m):
        with torch.no_grad():
            logits = m(sequences[:, :-1])
            logp = torch.log_softmax(logits.double(), -1)
            seq_logp = torch.gather(logp, -1, sequences[:, 1:, None]).sum((1, 2))
            return entropy_per_sequence(logits), seq_logp

    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            if name in direction:
                p.add_(eta * direction[name])
    _, logp0 = scores(model)
    S, logp = scores(moved)
    w = torch.exp(logp - logp0)
    return float((w * S).sum() / (w * T).sum())


def test_policy_mode_terms_are_derivatives_of_the_importance_weighted_estimate():
    model, opt, data, batch = setup(seed=1)
    v = update_direction(model, opt, lm_loss, batch)
    sequences = sample_sequences(model, data[:, 0], T, block_size=T, generator=torch.Generator().manual_seed(0))
    result = probe_step(model, v, sequences, [1e-3, 1e-2], mode="policy")
    h = 1e-4
    central = (snis_entropy(model, v, h, sequences) - snis_entropy(model, v, -h, sequences)) / (2 * h)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx(central, rel=1e-6)
    h = 1e-3
    second = (
        snis_entropy(model, v, h, sequences)
        - 2 * snis_entropy(model, v, 0, sequences)
        + snis_entropy(model, v, -h, sequences)
    ) / h**2
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx(second, rel=1e-4)
    for entry in result["true"]["entries"]:
        assert entry["delta_h_true"] == pytest.approx(
            snis_entropy(model, v, entry["eta"], sequences) - snis_entropy(model, v, 0, sequences), rel=1e-9
        )
        assert 1 <= entry["diagnostics"]["ess"] <= E
    per_seq = [r["gdotv"] for r in result["approx"]["per_sequence"]]
    assert math.fsum(per_seq) == pytest.approx(result["approx"]["delta_h_per_lr"], abs=1e-12)


def test_loss_functional_matches_finite_differences():
    model, opt, data, batch = setup()
    v = update_direction(model, None, lm_loss, batch)  # the plain gradient direction
    result = probe_step(model, v, batch, [1e-3], functional="loss")

    def loss_at(eta):
        moved = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in moved.named_parameters():
                p.add_(eta * v[name])
            return float(lm_loss(moved, batch))

    h = 1e-4
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((loss_at(h) - loss_at(-h)) / (2 * h), rel=1e-6)
    assert result["approx"]["delta_h_per_lr"] < 0  # the negative gradient lowers the loss on its own batch


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_direction_leaves_everything_untouched_and_reproduces_the_step(optimizer):
    model, opt, data, batch = setup(optimizer=optimizer)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)  # a stale gradient the probe must put back
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    state = copy.deepcopy(opt.state_dict())
    rng = torch.get_rng_state()
    v = update_direction(model, opt, lm_loss, batch)
    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]) and torch.equal(p.grad, grads[n])
    after = opt.state_dict()
    for k, s in state["state"].items():
        for key, value in s.items():
            assert torch.equal(value, after["state"][k][key]), key
    assert after["param_groups"] == state["param_groups"]  # no key added to a group (torch's __setstate__ does)
    assert torch.equal(torch.get_rng_state(), rng)
    # θ + lr·v is the step the optimizer then really takes
    lr = opt.param_groups[0]["lr"]
    opt.zero_grad()
    lm_loss(model, batch).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + lr * v[n], rtol=1e-12, atol=1e-14)


def test_direction_keeps_a_batch_norms_running_statistics_and_reproduces_the_step():
    """In training mode the step normalises by the batch's statistics; the probe's own forward pass must not
    move the running statistics (nor their counter), and θ + lr·v is still the step taken."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()
    x, y = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, 2, dtype=torch.float64)

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        loss_fn(model, (x + 1, y)).backward()
        opt.step()
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    v = update_direction(model, opt, loss_fn, (x, y))
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n
    assert model[1].track_running_stats
    opt.zero_grad()
    loss_fn(model, (x, y)).backward()
    opt.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] + 0.1 * v.get(n, 0), rtol=1e-12, atol=1e-14)
    assert int(model[1].num_batches_tracked) == int(buffers["1.num_batches_tracked"]) + 1  # the step's own update


def test_direction_for_our_adam_includes_the_moments():
    """v depends on the optimizer's state: after different histories the same batch gives different v."""
    model, opt, data, batch = setup()
    fresh = Adam(model.parameters(), lr=1e-2)
    v_fresh = update_direction(model, fresh, lm_loss, batch)
    v_used = update_direction(model, opt, lm_loss, batch)
    name = "head.weight"
    assert not torch.allclose(v_fresh[name], v_used[name])
    # a fresh Adam's first step is sign-like: v = −g/(|g| + ε) (m̂ = g, √v̂ = |g| at t = 1)
    model.zero_grad()
    lm_loss(model, batch).backward()
    g = dict(model.named_parameters())[name].grad
    torch.testing.assert_close(v_fresh[name], -g / (g.abs() + 1e-8), rtol=1e-9, atol=1e-12)


def test_bad_input_is_named():
    model, opt, data, batch = setup()
    other, other_opt, _, _ = setup(seed=1)
    with pytest.raises(ValueError, match="none of the AdamW's parameters is a parameter of the model"):
        update_direction(model, other_opt, lm_loss, batch)
    with pytest.raises(ValueError, match="update_direction: loss_fn must return .* it returned a tensor that does not"):
        update_direction(model, opt, lambda m, b: lm_loss(m, b).detach(), batch)
    with pytest.raises(ValueError, match=r"it returned a tensor of shape \(8,\)"):
        update_direction(model, opt, lambda m, b: m(b[:, :-1]).sum((1, 2)), batch)
    with pytest.raises(ValueError, match="it returned a float"):
        update_direction(model, opt, lambda m, b: float(lm_loss(m, b)), batch)
    v = update_direction(model, opt, lm_loss, batch)
    with pytest.raises(ValueError, match=r"η grid \[0.0, 0.001\] must be a non-empty list of finite step sizes > 0"):
        probe_step(model, v, data, [0.0, 1e-3])
    with pytest.raises(ValueError, match="mode='sampled'; valid: fixed, policy"):
        probe_step(model, v, data, [1e-3], mode="sampled")

    class Regressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 1)

        def forward(self, idx):
            return self.lin(idx.double().unsqueeze(-1)).squeeze(-1)

    reg = Regressor().double()
    with pytest.raises(ValueError, match="is not a next-token distribution"):
        probe_step(reg, {"lin.weight": torch.ones(1, 1, dtype=torch.float64)}, data, [1e-3])
    with pytest.raises(ValueError, match="not parameters of the model"):
        probe_step(model, {"nope": torch.ones(1)}, data, [1e-3])
    vocabulary = VOCAB
    with pytest.raises(ValueError, match=rf"sequences\[2, 3\] = {vocabulary} is not a token id .* 0..{vocabulary - 1}"):
        probe_step(model, v, data.index_put((torch.tensor(2), torch.tensor(3)), torch.tensor(vocabulary)), [1e-3])
    with pytest.raises(ValueError, match=r"sequences\[0, 0\] = -1 is not a token id"):
        probe_step(model, v, data.index_put((torch.tensor(0), torch.tensor(0)), torch.tensor(-1)), [1e-3])
    with pytest.raises(ValueError, match="sequences must be integer token ids, got dtype torch.float32"):
        probe_step(model, v, data.float(), [1e-3])
    with pytest.raises(ValueError, match=r"sequences is empty \(E = 0\)"):
        probe_step(model, v, data[:0], [1e-3])
    with pytest.raises(ValueError, match="log_ratio_clip=nan; valid: a number > 0"):
        probe_step(model, v, data, [1e-3], log_ratio_clip=math.nan)
    with pytest.raises(ValueError, match="chunk_size=0; valid: a positive number"):
        probe_step(model, v, data, [1e-3], chunk_size=0)
    with pytest.raises(ValueError, match=r"etas=0.001 is one number; give the η grid as a list, e.g. \[0.001\]"):
        probe_step(model, v, data, 1e-3)
    with pytest.raises(ValueError, match=r"the η grid \['a'\] holds 'a', not a number; give finite step sizes > 0"):
        probe_step(model, v, data, ["a"])
    with pytest.raises(ValueError, match=r"etas='1e-3' is not a list; give the η grid as a list of step sizes"):
        probe_step(model, v, data, "1e-3")
    name = next(iter(v))
    with pytest.raises(ValueError, match=rf"direction\['{name}'\] has shape \(1, 1\); the parameter's is"):
        probe_step(model, {**v, name: torch.ones(1, 1, dtype=v[name].dtype)}, data, [1e-3])
    with pytest.raises(ValueError, match=rf"direction\['{name}'\] is not finite"):
        probe_step(model, {**v, name: torch.full_like(v[name], math.nan)}, data, [1e-3])
    half = copy.deepcopy(model).half()
    with pytest.raises(ValueError, match="precision='model' on a torch.float16 model cannot resolve one step"):
        probe_step(half, {n: t.half() for n, t in v.items()}, data, [1e-3], precision="model")


@pytest.mark.parametrize("mode", ["fixed", "policy"])
def test_subsets_rescore_like_the_whole_batch(mode):
    """A 'subset' of all E sequences reproduces the full estimate; smaller subsets are scored on
    their own, checked here against probing the subset directly."""
    from optiscope.probe import subset_errors

    model, opt, data, batch = setup(seed=2)
    v = update_direction(model, opt, lm_loss, batch)
    seqs = data if mode == "fixed" else sample_sequences(model, data[:, 0], T, T, torch.Generator().manual_seed(3))
    eta = 1e-2
    result = probe_step(model, v, seqs, [eta], mode=mode)
    whole = subset_errors(result, eta, size=E, count=1, seed=0)
    entry = result["true"]["entries"][0]
    expected = (result["approx"]["delta_h_per_lr"] * eta - entry["delta_h_true"]) / abs(entry["delta_h_true"])
    assert whole["errors"][0] == pytest.approx(expected, rel=1e-9)
    part = subset_errors(result, eta, size=4, count=1, seed=5)
    idx = torch.randperm(E, generator=torch.Generator().manual_seed(5))[:4]
    direct = probe_step(model, v, seqs[idx], [eta], mode=mode)
    d_entry = direct["true"]["entries"][0]
    direct_error = (direct["approx"]["delta_h_per_lr"] * eta - d_entry["delta_h_true"]) / abs(d_entry["delta_h_true"])
    assert part["errors"][0] == pytest.approx(direct_error, rel=1e-8)
    with pytest.raises(
        ValueError, match=r"subset_errors: size=99; valid: an integer from 1 to the number of sequences E=9"
    ):
        subset_errors(result, eta, size=99, count=1, seed=0)


def test_prediction_curves_are_the_taylor_terms_sorted_by_eta():
    result = {
        "approx": {"delta_h_per_lr": 2.0, "quadratic": {"vHvv": -4.0}},
        "true": {"entries": [{"eta": 0.1, "delta_h_true": 0.15}, {"eta": 0.01, "delta_h_true": 0.0198}]},
    }
    curves = prediction_curves(result)
    assert curves["eta"] == [0.01, 0.1] and curves["true"] == [0.0198, 0.15]
    assert curves["linear"] == pytest.approx([0.02, 0.2])  # η·H′
    assert curves["quadratic"] == pytest.approx([0.02 - 2e-4, 0.2 - 0.02])  # η·H′ + ½η²·H″


class NormedLM(nn.Module):
    """The tiny LM with layer norms (as a transformer has): the quadratic term goes through their second
    derivative, which torch's fused kernel gets wrong in nested forward mode (``probe.norms``)."""

    def __init__(self):
        super().__init__()
        from tiny_lm import VOCAB, WIDTH

        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.mix = nn.Linear(2 * WIDTH, WIDTH)
        self.final = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        h = self.norm(self.embed(idx))
        prefix = h.cumsum(1) / torch.arange(1, idx.shape[1] + 1, dtype=h.dtype, device=h.device).view(1, -1, 1)
        return self.head(self.final(torch.tanh(self.mix(torch.cat([h, prefix], -1)))))


def test_the_quadratic_term_through_layer_norms_matches_finite_differences():
    torch.manual_seed(0)
    model, _, data, batch = setup()
    normed = NormedLM().double()
    opt = Adam(normed.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        lm_loss(normed, batch).backward()
        opt.step()
    v = update_direction(normed, opt, lm_loss, batch)
    result = probe_step(normed, v, data, [1e-3], reverse_check=True)
    h = 1e-4  # the curvature of this one changes fast: a central difference at 1e-3 is off by 6e-5
    plus, zero, minus = (mean_entropy_at(normed, v, s * h, data) for s in (1, 0, -1))
    second = (plus - 2 * zero + minus) / h**2
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx(second, rel=1e-5)
    assert result["approx"]["reverse"]["vHvv"] == pytest.approx(result["approx"]["quadratic"]["vHvv"], rel=1e-9)


def test_a_wrong_kind_of_argument_is_named_in_one_line():
    model, opt, data, batch = setup()
    errors = {
        "update_direction: optimizer is a str, not an optimizer": lambda: update_direction(
            model, "adam", lm_loss, batch
        ),
        "update_direction: optimizer is a TinyCausalLM, not an optimizer": lambda: update_direction(
            model, model, lm_loss, batch
        ),
        "update_direction: loss_fn is a str, not callable": lambda: update_direction(model, opt, "mse", batch),
        "update_direction: max_grad_norm=0; valid: a finite number > 0": lambda: update_direction(
            model, opt, lm_loss, batch, max_grad_norm=0
        ),
    }
    v = update_direction(model, opt, lm_loss, batch)
    name = next(iter(v))
    errors |= {
        "direction is a list; give a dict of tensors by parameter name": lambda: probe_step(
            model, list(v.values()), data, [1e-3]
        ),
        rf"direction\['{name}'\] is a ndarray; give a torch.Tensor": lambda: probe_step(
            model, {n: t.numpy() for n, t in v.items()}, data, [1e-3]
        ),
        r"sequences is a list; give a torch.Tensor of token ids of shape \(E, T\+1\)": lambda: probe_step(
            model, v, data.tolist(), [1e-3]
        ),
        "sequences is a ndarray; give a torch.Tensor": lambda: probe_step(model, v, data.numpy(), [1e-3]),
    }
    for message, call in errors.items():
        with pytest.raises((TypeError, ValueError), match=message) as caught:
            call()
        assert "\n" not in str(caught.value)


def test_reverse_check_in_policy_mode_is_ignored_with_a_warning():
    model, opt, data, batch = setup()
    v = update_direction(model, opt, lm_loss, batch)
    sequences = sample_sequences(model, data[:, 0], T, block_size=T, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="reverse_check=True is ignored in mode='policy'"):
        result = probe_step(model, v, sequences, [1e-3], mode="policy", reverse_check=True)
    assert "reverse" not in result["approx"]


class DroppingLM(nn.Module):
    """The tiny LM with dropout on its logits."""

    def __init__(self):
        super().__init__()
        self.lm = TinyCausalLM()
        self.drop = nn.Dropout(0.5)

    def forward(self, idx):
        return self.drop(self.lm(idx))


@pytest.mark.parametrize("precision", ["float64", "model"])
def test_the_probe_measures_in_eval_mode_and_restores_each_modules_own_flag(precision):
    torch.manual_seed(0)
    model = DroppingLM().double()
    model.train()
    model.lm.embed.eval()  # a frozen part of a training model, which net.train() would put back in training
    flags = {n: m.training for n, m in model.named_modules()}
    data = torch.randint(0, VOCAB, (E, T + 1))
    v = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    result = probe_step(model, v, data, [1e-3], precision=precision)
    assert {n: m.training for n, m in model.named_modules()} == flags
    evaluated = copy.deepcopy(model).eval()  # no dropout: the entropy the probe measures
    assert result["base_value"] == pytest.approx(mean_entropy_at(evaluated, v, 0.0, data), rel=1e-12)


@pytest.mark.parametrize("precision", ["float64", "model"])
def test_a_forward_pass_that_updates_a_buffer_is_probed_without_touching_it(precision):
    """The probe's forward passes update copies of the buffers; with ``precision="model"`` and a direction over
    some of the parameters, the others are detached (no autograd graph, no warning about one)."""
    torch.manual_seed(0)
    model = CountingLM().double()
    data = torch.randint(0, VOCAB, (E, T + 1))
    v = {"lm.head.weight": torch.randn_like(model.lm.head.weight)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        result = probe_step(model, v, data, [1e-3], precision=precision, reverse_check=True)
    assert int(model.calls) == 0
    h = 1e-4
    central = (mean_entropy_at(model, v, h, data) - mean_entropy_at(model, v, -h, data)) / (2 * h)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx(central, rel=1e-6)
    assert result["approx"]["reverse"]["gdotv"] == pytest.approx(central, rel=1e-6)


class ContextLM(TinyCausalLM):
    """The tiny LM refusing fewer than two tokens of context, as a model with a causal convolution may."""

    def forward(self, idx):
        assert idx.shape[1] >= 2, "needs at least two tokens"
        return super().forward(idx)


def test_the_vocabulary_check_runs_on_inputs_as_long_as_the_sequences():
    torch.manual_seed(0)
    model = ContextLM().double()
    data = torch.randint(0, VOCAB, (E, T + 1))
    v = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    result = probe_step(model, v, data, [1e-3])
    assert result["base_value"] == pytest.approx(mean_entropy_at(model, v, 0.0, data), rel=1e-12)


def test_bad_sampling_and_subset_counts_are_named_in_one_line():
    """Before: length=-1 returned the starts unsampled, count=0 gave NaN statistics, size=0 or a size as a
    float failed deep in torch; each is now a one-line error naming the value and what is valid."""
    from optiscope.probe import subset_errors

    model, opt, data, batch = setup()
    generator = torch.Generator().manual_seed(0)
    starts = data[:, 0]
    bad_sampling = [
        (dict(length=-1), r"length=-1; valid: the number of tokens to sample, an integer >= 1"),
        (dict(length=0), r"length=0; valid"),
        (dict(length=2.0), r"length=2.0; valid"),
        (dict(length=True), r"length=True; valid"),
        (dict(block_size=0), r"block_size=0; valid: the model's context in tokens, an integer >= 1"),
        (dict(starts=starts[:0]), r"starts is \(0,\); give token ids of one start token per sequence \(E,\)"),
        (dict(starts=starts.float()), r"starts must be integer token ids, got dtype torch.float32"),
        (dict(attention_mask=torch.ones(3, 2)), r"attention_mask is \(3, 2\); give None or a tensor of the prompts'"),
    ]
    for change, message in bad_sampling:
        arguments = dict(starts=starts, length=T, block_size=T, generator=generator) | change
        with pytest.raises(ValueError, match="^sample_sequences: " + message):
            sample_sequences(model, **arguments)
    with pytest.raises(TypeError, match=r"^sample_sequences: generator is a int; give a torch.Generator"):
        sample_sequences(model, starts, T, T, 0)
    v = update_direction(model, opt, lm_loss, batch)
    result = probe_step(model, v, data, [1e-3, 1e-2])
    bad_subsets = [
        (dict(size=0), r"size=0; valid: an integer from 1 to the number of sequences E=9"),
        (dict(size=E + 1), r"size=10; valid: an integer from 1 to the number of sequences E=9"),
        (dict(size=2.5), r"size=2.5; valid"),
        (dict(count=0), r"count=0; valid: the number of subsets to draw, an integer >= 1"),
        (dict(count=-3), r"count=-3; valid"),
        (dict(seed=0.5), r"seed=0.5; valid: an integer from -2\*\*63 to 2\*\*64 - 1"),
        (dict(eta=3e-3), r"eta=0.003 is not on the probed grid; valid: one of \[0.001, 0.01\]"),
        (dict(eta="0.01"), r"eta='0.01' is not on the probed grid"),
    ]
    for change, message in bad_subsets:
        arguments = dict(eta=1e-2, size=4, count=2, seed=0) | change
        with pytest.raises(ValueError, match="^subset_errors: " + message):
            subset_errors(result, **arguments)


class DropoutCountingLM(CountingLM):
    """The counting LM with dropout on its logits: in training mode it samples from another distribution."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, idx):
        return self.drop(super().forward(idx))


def test_sampling_draws_from_the_distribution_the_probe_scores_and_leaves_the_model():
    """A training model was sampled with dropout on (not the p_θ whose importance weights the policy probe takes,
    and a draw from the global random stream) and counted its calls; now it is sampled in eval mode on copies of
    its buffers, each module's flag restored."""
    torch.manual_seed(0)
    model = DropoutCountingLM().double().train()
    model.lm.embed.eval()
    flags = {n: m.training for n, m in model.named_modules()}
    starts = torch.randint(0, VOCAB, (E,))
    rng = torch.get_rng_state()
    sequences = sample_sequences(model, starts, T, T, torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), rng)
    assert int(model.calls) == 0
    assert {n: m.training for n, m in model.named_modules()} == flags
    evaluated, generator = copy.deepcopy(model).eval(), torch.Generator().manual_seed(4)
    expected = starts.view(-1, 1)
    with torch.no_grad():
        for _ in range(T):
            p = torch.softmax(evaluated(expected[:, -T:])[:, -1].double(), -1)
            expected = torch.cat([expected, torch.multinomial(p, 1, generator=generator)], 1)
    assert torch.equal(sequences, expected)


def test_a_model_calling_fused_attention_is_probed_as_its_plain_twin():
    """``F.scaled_dot_product_attention`` picked a fused CPU kernel without forward-mode rules, and the probe
    refused a GPT with ``attention="auto"``; now it runs the math backend and measures what the same weights in a
    ``attention="math"`` GPT (softmax and matmuls written out) give, and central differences."""
    import dataclasses

    from optiscope.models import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=8, block_size=T, attention="auto", bias=True)
    fused = GPT(config).double()
    plain = GPT(dataclasses.replace(config, attention="math")).double()
    plain.load_state_dict(fused.state_dict())
    v = {n: torch.randn_like(p) for n, p in fused.named_parameters()}
    data = torch.randint(0, 11, (4, T + 1))
    result, twin = (probe_step(m, v, data, [1e-3], reverse_check=True) for m in (fused, plain))
    for key in ("delta_h_per_lr", "reverse"):
        assert result["approx"][key] == pytest.approx(twin["approx"][key], rel=1e-9)
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx(twin["approx"]["quadratic"]["vHvv"], rel=1e-9)
    h = 2e-6  # v is a random direction of all the parameters: its third derivative is large
    up, down = (mean_entropy_at(plain, v, e, data) for e in (h, -h))
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((up - down) / (2 * h), rel=1e-6)


class EncoderLM(nn.Module):
    """A causal LM on torch's own ``nn.TransformerEncoderLayer``, which in eval mode takes a fused fast path."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, activation="gelu", batch_first=True)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, idx):
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], dtype=self.head.weight.dtype)
        return self.head(self.layer(self.embed(idx), src_mask=mask, is_causal=True))


def test_a_model_on_torchs_transformer_layers_is_probed():
    """The layer's fused inference path (``_transformer_encoder_layer_fwd``) has no forward-mode rule, and the probe
    refused the model; now it runs the layer's ordinary path and agrees with central differences."""
    torch.manual_seed(0)
    model = EncoderLM().double()
    v = {n: 0.1 * torch.randn_like(p) for n, p in model.named_parameters()}
    data = torch.randint(0, VOCAB, (4, T + 1))
    fast_path = torch.backends.mha.get_fastpath_enabled()
    result = probe_step(model, v, data, [1e-3])
    assert torch.backends.mha.get_fastpath_enabled() == fast_path
    h = 1e-4
    up, mid, down = (mean_entropy_at(model.eval(), v, e, data) for e in (h, 0.0, -h))
    assert result["base_value"] == pytest.approx(mid, rel=1e-12)
    assert result["approx"]["delta_h_per_lr"] == pytest.approx((up - down) / (2 * h), rel=1e-6)
    h = 1e-3
    up, down = (mean_entropy_at(model.eval(), v, e, data) for e in (h, -h))
    assert result["approx"]["quadratic"]["vHvv"] == pytest.approx((up - 2 * mid + down) / h**2, rel=1e-5)
