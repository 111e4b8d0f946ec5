"""The rare-tokens simulation against independent oracles: autograd, closed forms, the NumPy Adam twin."""

import math
import warnings

import numpy as np
import pytest
import torch

from figure_checks import assert_figures_drawn_and_replotted, printed
from optiscope import cli, reference, runs
from optiscope.experiments import ConfigError
from optiscope.experiments import rare_tokens as rt

FREQUENCIES = rt.zipf_frequencies(rt.ZIPF_RANKS)


def test_default_frequencies_are_zipf_over_three_decades():
    p = np.asarray(rt.Config().frequencies)
    assert math.isclose(p.sum(), 1.0, rel_tol=0, abs_tol=1e-12)
    assert p.max() / p.min() >= 1000
    ranks = np.asarray(rt.ZIPF_RANKS)
    assert np.allclose(p * ranks, p[0] * ranks[0])  # frequency x rank is constant: Zipf's law


def test_stream_counts_batches_and_follows_the_frequencies():
    counts, target_sums = rt.token_stream(FREQUENCIES, batch_size=32, steps=4000, label_noise=0.3, seed=1)
    assert counts.shape == (4000, 6, 1)
    assert torch.equal(counts.sum(dim=(1, 2)), torch.full((4000,), 32.0, dtype=torch.float64))
    observed = counts.sum(dim=(0, 2)) / (4000 * 32)
    expected = torch.tensor(FREQUENCIES, dtype=torch.float64)
    # binomial standard error per token; 5 sigma
    se = (expected * (1 - expected) / (4000 * 32)).sqrt()
    assert ((observed - expected).abs() <= 5 * se).all()
    # targets are 1 + σξ: per occurrence mean 1 and variance σ²
    n = counts.sum()
    mean = target_sums.sum() / n
    assert abs(float(mean) - 1.0) < 5 * 0.3 / math.sqrt(float(n))


def test_gradient_matches_autograd_of_the_squared_error():
    generator = torch.Generator().manual_seed(0)
    batch = 5  # fewer draws than tokens: some token is surely absent
    tokens = torch.randint(0, 6, (batch,), generator=generator)
    targets = 1 + 0.3 * torch.randn(batch, generator=generator, dtype=torch.float64)
    weights = torch.randn(6, 1, generator=generator, dtype=torch.float64, requires_grad=True)
    loss = 0.5 * ((weights[tokens, 0] - targets) ** 2).mean()
    (expected,) = torch.autograd.grad(loss, weights)
    counts = torch.zeros(6, 1, dtype=torch.float64)
    sums = torch.zeros(6, 1, dtype=torch.float64)
    for k, y in zip(tokens.tolist(), targets.tolist(), strict=True):
        counts[k] += 1
        sums[k] += y
    got = rt.token_gradient(weights.detach(), counts, sums, batch)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    absent = counts[:, 0] == 0
    assert absent.any() and (got[absent] == 0).all()  # no occurrence, no gradient


def test_sgd_without_noise_follows_the_closed_form():
    """With y = w* exactly, SGD gives w_t − 1 = Π_s (1 − η c_s/B) (w_0 − 1)."""
    counts, sums = rt.token_stream(FREQUENCIES, batch_size=8, steps=300, label_noise=0.0, seed=3)
    lr = 0.5
    trained = rt.train("sgd", [lr], counts, sums, 8)
    factors = 1 - lr * counts[:, :, 0] / 8
    expected = 1 - torch.cumprod(factors, dim=0)
    torch.testing.assert_close(trained["trajectory"][1:, 0], expected, rtol=1e-10, atol=1e-12)


def test_adam_matches_the_numpy_twin_and_its_effective_lr():
    counts, sums = rt.token_stream(FREQUENCIES, batch_size=32, steps=400, label_noise=0.3, seed=4)
    trained = rt.train("adam", [0.01], counts, sums, 32)
    w = np.zeros((6, 1))
    param = {"params": w, "grad": np.zeros_like(w)}
    twin = reference.Adam([param], lr=0.01)
    for t in range(400):
        param["grad"][...] = (counts[t].numpy() * w - sums[t].numpy()) / 32
        twin.step()
    np.testing.assert_allclose(trained["trajectory"][-1, 0].numpy(), w[:, 0], rtol=1e-9)
    np.testing.assert_allclose(trained["effective_lr"][0], twin.effective_lr(0)[:, 0], rtol=1e-9)


def test_runs_with_several_learning_rates_do_not_interact():
    counts, sums = rt.token_stream(FREQUENCIES, batch_size=8, steps=200, label_noise=0.3, seed=5)
    together = rt.train("adam", [0.01, 0.3], counts, sums, 8)["trajectory"]
    alone = rt.train("adam", [0.3], counts, sums, 8)["trajectory"]
    torch.testing.assert_close(together[:, 1], alone[:, 0], rtol=0, atol=0)


def test_divergence_is_detected_and_stops_the_run():
    counts, sums = rt.token_stream(FREQUENCIES, batch_size=8, steps=200, label_noise=0.3, seed=6)
    trained = rt.train("sgd", [0.01, 100.0], counts, sums, 8)
    assert trained["diverged_at"][0] is None
    at = trained["diverged_at"][1]
    assert at is not None and at < 50
    assert torch.isnan(trained["trajectory"][at + 1 :, 1]).all()
    assert rt.run_summary(trained["trajectory"][:, 1], at)["final_error"] is None


def test_summary_statistics_against_direct_formulas():
    trajectory = torch.tensor([[0.0, 0.0], [0.5, 2.0], [0.9, 1.5], [1.2, 0.5], [1.0, 1.0]], dtype=torch.float64)
    summary = rt.run_summary(trajectory, None)
    tail = np.array([[1.2, 0.5], [1.0, 1.0]])  # the last quarter of 4 steps: steps 3 and 4
    assert summary["final_error"] == [0.0, 0.0]
    np.testing.assert_allclose(summary["tail_rms_error"], np.sqrt(((tail - 1) ** 2).mean(axis=0)))
    np.testing.assert_allclose(summary["tail_std"], tail.std(axis=0, ddof=1))


def test_sampled_trajectory_keeps_the_ends_and_at_most_the_cap():
    trajectory = torch.arange(2001, dtype=torch.float64).repeat(3, 1).T
    sampled = rt.sampled_trajectory(trajectory)
    assert sampled["steps"][0] == 0 and sampled["steps"][-1] == 2000
    assert len(sampled["steps"]) <= rt.TRAJECTORY_POINTS
    assert sampled["weights"][2] == [float(s) for s in sampled["steps"]]


def test_sweep_findings_pick_the_smallest_rescuing_lr():
    def run(rare_error, common_std, diverged=None):
        return {"diverged_at": diverged, "tail_rms_error": [0.01, rare_error], "tail_std": [common_std, 0.0]}

    sweep = {"lrs": [0.01, 1.0, 2.0, 4.0], "sgd": [run(0.9, 0.001), run(0.3, 0.05), run(0.05, 0.1), run(0, 0, 7)]}
    nominal = {"diverged_at": None, "tail_std": [0.002, 0.0], "tail_rms_error": [0.01, 0.9]}
    findings = rt.sweep_findings(sweep, nominal, 1, 0)
    assert findings["rescue_lr"] == 2.0
    assert findings["rescue_common_tail_std"] == 0.1 and findings["nominal_common_tail_std"] == 0.002
    assert findings["largest_stable_sgd_lr"] == 2.0 and findings["smallest_diverging_sgd_lr"] == 4.0
    sweep["sgd"][2] = run(0.2, 0.1)
    assert rt.sweep_findings(sweep, nominal, 1, 0)["rescue_lr"] is None


@pytest.fixture(scope="module")
def seed_results():
    """The seed's comparison at its settings (η = 0.01, Zipf frequencies), shortened."""
    config = rt.Config(steps=1500, optimizers="sgd,adam", sweep_lrs=(0.01, 2.0))
    return rt.run(config, None)


def test_adam_learns_the_rarest_token_and_sgd_does_not(seed_results):
    rarest = seed_results["rarest"]
    sgd, adam = seed_results["optimizers"]["sgd"], seed_results["optimizers"]["adam"]
    assert seed_results["frequencies"][rarest] == min(FREQUENCIES)
    assert adam["final_error"][rarest] < sgd["final_error"][rarest]
    assert sgd["final_error"][rarest] > 0.5 > 0.2 > adam["tail_rms_error"][rarest]
    # SGD's expected progress on a token is 1 − (1 − ηp)^T; the rarest is barely moved
    expected = 1 - (1 - 0.01 * min(FREQUENCIES)) ** 1500
    assert abs(sgd["final_weight"][rarest] - expected) < 0.02


def test_effective_lr_is_larger_for_rarer_tokens(seed_results):
    effective = seed_results["optimizers"]["adam"]["effective_lr"]
    assert effective[seed_results["rarest"]] > effective[seed_results["most_common"]]
    assert seed_results["optimizers"]["sgd"]["effective_lr"] is None  # SGD has no per-weight rate


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optimizers": "sgd,adam,adagrad"}, "unknown optimizer 'adagrad'; valid: sgd, momentum"),
        ({"steps": 0}, "--steps=0 must be an integer >= 1"),
        ({"lr": -0.1}, "--lr=-0.1 must be a finite number > 0"),
        ({"lr": float("nan")}, "--lr=nan must be a finite number > 0"),
        ({"frequencies": (0.5, 0.4)}, "frequencies sum to 0.9; they must sum to 1"),
        ({"frequencies": (1.5, -0.5)}, "[-0.5] are not finite numbers > 0"),
        ({"frequencies": (0.5, 0.5)}, "--frequencies=(0.5, 0.5) are all equal"),
        ({"sweep_lrs": (0.1, 0.0)}, "--sweep-lrs=(0.1, 0.0)"),
        ({"sweep_lrs": (0.1, 0.1)}, "--sweep-lrs=(0.1, 0.1) names a learning rate twice"),
        ({"optimizers": "sgd,adam@"}, "'adam@' has no learning rate after '@'"),
        ({"batch_size": 2.5}, "--batch-size=2.5 must be an integer >= 1"),
    ],
)
def test_bad_config_names_the_value_and_what_is_valid(overrides, message):
    with pytest.raises(ConfigError) as error:
        rt.Config(**overrides)
    assert message in str(error.value)


def test_steps_beyond_the_machines_memory_are_refused_before_anything_is_allocated(monkeypatch):
    """The run holds every step's batch and every trajectory; the kernel would kill it without a word. Oracle:
    the sizes of what token_stream and train allocate, measured on a small run and scaled."""
    config = rt.Config(steps=1000)
    counts, sums = rt.token_stream(config.frequencies, config.batch_size, config.steps, config.label_noise, 0)
    held = (counts.numel() + sums.numel()) * 8 + (config.steps + 1) * len(config.sweep_lrs) * counts.shape[1] * 8
    assert held <= rt.memory_needed(config) <= 4 * held  # an estimate of the right size, not a bound far off
    monkeypatch.setattr(rt, "physical_memory", lambda: 2**30)  # a machine with 1 GiB
    steps = 2 * 2**30 // (rt.memory_needed(config) // config.steps)
    with pytest.raises(ConfigError, match=rf"--steps {steps}: the run holds .* more than this machine's 1.0 GiB"):
        rt.Config(steps=steps)
    rt.Config(steps=steps // 4)  # a quarter of it fits


def test_tokens_never_seen_are_left_out_of_the_effective_lr_fit():
    """In 5 steps the rarest tokens are never drawn: their v̂ is 0 and their effective lr η/ε, no effect of their
    frequency. The fit runs over the tokens seen (oracle: numpy's polyfit over those), and says over how many."""
    results = rt.run(rt.Config(steps=5, optimizers="adam", sweep_lrs=(0.01,)), None)
    seen = [c > 0 for c in results["occurrences"]]
    assert not seen[-1] and sum(seen) >= 2  # the rarest never drawn, a line through the others: the test can fail
    adam = results["optimizers"]["adam"]
    fit = adam["effective_lr_fit"]
    p = np.log([f for f, s in zip(results["frequencies"], seen, strict=True) if s])
    e = np.log([x for x, s in zip(adam["effective_lr"], seen, strict=True) if s])
    assert fit["tokens"] == sum(seen) and fit["slope"] == pytest.approx(np.polyfit(p, e, 1)[0], rel=1e-9)
    assert math.isnan(fit["ratio"])


def test_a_one_step_run_with_one_swept_rate_warns_of_nothing(tmp_path):
    """One weight in the tail has no spread (NaN, not torch's degrees-of-freedom warning), and one swept η gives
    the sweep's axis equal limits (not matplotlib's singular-limits warning): a run's output stays clean."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main(["run", "rare-tokens", "--out", str(tmp_path), "--steps", "1", "--sweep-lrs", "0.01"]) == 0
    assert all(math.isnan(x) for x in runs.read_json(tmp_path / "results.json")["optimizers"]["sgd"]["tail_std"])


def test_cli_quick_run_then_plot_reproduces_the_figures(tmp_path):
    out = tmp_path / "rare"
    options = ["--steps", "300", "--sweep-lrs", "0.01,5", "--optimizers", "sgd,adam,lion,muon"]
    assert cli.main(["run", "rare-tokens", "--quick", "--out", str(out), *options]) == 0
    results = runs.read_json(out / "results.json")
    assert results["experiment"] == "rare-tokens" and results["quick"] is True
    assert runs.read_json(out / "config.json")["config"]["steps"] == 300
    assert set(results["optimizers"]) == {"sgd", "adam", "lion", "muon"}
    assert_figures_drawn_and_replotted(out, ["sgd_vs_adam.png", "optimizers.png", "lr_sweep.png"])


def test_every_run_diverged_exits_3(tmp_path):
    """SGD and Adam at η = 1e30 blow up on any machine; the lr sweep's runs are not the experiment's runs."""
    out = tmp_path / "rare"
    options = ["--steps", "50", "--lr", "1e30", "--optimizers", "sgd,adam", "--sweep-lrs", "0.01"]
    assert cli.main(["run", "rare-tokens", "--out", str(out), *options]) == cli.EXIT_DIVERGED
    results = runs.read_json(out / "results.json")
    assert results["status"] == "diverged" and all(r["diverged_at"] for r in results["optimizers"].values())
    assert (
        cli.main(["run", "rare-tokens", "--out", str(tmp_path / "one"), *options[:4], "--optimizers", "sgd,adam@0.01"])
        == 0
    )


def test_cli_rejects_frequencies_that_do_not_sum_to_one(tmp_path, capsys):
    code = cli.main(["run", "rare-tokens", "--out", str(tmp_path / "x"), "--frequencies", "0.5,0.3"])
    assert code == cli.EXIT_BAD_INPUT
    assert "frequencies sum to 0.8; they must sum to 1" in printed(capsys)


def test_sweep_findings_take_the_smallest_rescuing_lr_whatever_the_sweep_order():
    def run(rare_error, common_std):
        return {"diverged_at": None, "tail_rms_error": [0.01, rare_error], "tail_std": [common_std, 0.0]}

    nominal = {"diverged_at": None, "tail_std": [0.002, 0.0], "tail_rms_error": [0.01, 0.9]}
    sweep = {"lrs": [3.0, 2.0, 0.01], "sgd": [run(0.01, 0.3), run(0.05, 0.1), run(0.9, 0.001)]}
    findings = rt.sweep_findings(sweep, nominal, 1, 0)
    assert findings["rescue_lr"] == 2.0 and findings["rescue_common_tail_std"] == 0.1


def test_a_rescue_when_sgd_diverged_at_the_nominal_lr_has_no_jitter_ratio(tmp_path):
    """SGD's most common token (p = 0.75 of B = 32 draws, c ≈ 24 a batch) multiplies its error by 1 − ηc/B each
    step: at η = 5 that is about −2.75, so it diverges; η = 2 (about −0.5) learns even the rarest token in 2000
    steps (README: the --quick rescue). The rescue has no nominal jitter to be compared with, and is still drawn."""
    options = ["--steps", "2000", "--lr", "5", "--optimizers", "sgd,adam", "--sweep-lrs", "2"]
    assert cli.main(["run", "rare-tokens", "--out", str(tmp_path), *options]) == 0
    results = runs.read_json(tmp_path / "results.json")
    assert results["optimizers"]["sgd"]["diverged_at"] is not None
    findings = results["lr_sweep"]["findings"]
    assert findings["rescue_lr"] == 2.0 and findings["rescue_common_tail_std"] > 0
    assert findings["nominal_common_tail_std"] is None and findings["rescue_jitter_ratio"] is None


def test_the_sweep_runs_in_increasing_lr_whatever_order_it_is_given():
    """Each swept η's run is independent of the others, so giving them in another order changes nothing but the
    order, which the figure's lines over η need increasing."""
    ascending = rt.run(rt.Config(steps=300, optimizers="sgd", sweep_lrs=(0.01, 1.0, 5.0)), None)["lr_sweep"]
    shuffled = rt.run(rt.Config(steps=300, optimizers="sgd", sweep_lrs=(5.0, 0.01, 1.0)), None)["lr_sweep"]
    assert shuffled["lrs"] == [0.01, 1.0, 5.0]
    assert shuffled == ascending
