"""The landscapes experiment against closed forms, finite differences and the seed's worked example."""

import math

import numpy as np
import pytest
import torch

from figure_checks import assert_figures_drawn_and_replotted, printed
from optiscope import cli, runs
from optiscope.experiments import ConfigError
from optiscope.experiments import landscapes as ls
from optiscope.experiments.bias_correction import bias_correction_story, descend_parabola, predicted_step_ratio
from optiscope.experiments.descent import DIVERGED_FACTOR, best_run, descend, log_sampled, thin_path
from optiscope.experiments.surfaces import SADDLE_MU, surfaces
from optiscope.experiments.weight_decay import l2_optimum, seed_claims, shape_stats, weight_decay_story
from optiscope.optim import build_optimizer

SURFACES = surfaces(condition_number=50.0)


# ----------------------------------------------------------------------------------------- surfaces
@pytest.mark.parametrize("name", list(SURFACES))
def test_gradient_matches_central_finite_differences(name):
    surface = SURFACES[name]
    points = torch.tensor([[-1.3, 0.7], [0.4, -0.2], [1.1, 1.3], [0.0, 0.05]], dtype=torch.float64)
    h = 1e-6
    for point in points:
        numeric = torch.stack(
            [(surface.f(point + h * e) - surface.f(point - h * e)) / (2 * h) for e in torch.eye(2, dtype=torch.float64)]
        )
        torch.testing.assert_close(surface.grad(point), numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(SURFACES))
def test_minima_are_stationary_and_have_the_stated_value(name):
    surface = SURFACES[name]
    for minimum in surface.minima:
        theta = torch.tensor(minimum, dtype=torch.float64)
        assert float(surface.grad(theta).abs().max()) < 1e-12
        assert math.isclose(float(surface.f(theta)), surface.f_star, abs_tol=1e-15)
    assert float(surface.f(torch.tensor(surface.start, dtype=torch.float64))) > surface.f_star


def test_saddle_is_a_saddle():
    """Curvature +1 along x and −μ along y at the origin (second differences)."""
    f, h = SURFACES["saddle"].f, 1e-4
    origin = torch.zeros(2, dtype=torch.float64)
    along = [(f(origin + h * e) - 2 * f(origin) + f(origin - h * e)) / h**2 for e in torch.eye(2, dtype=torch.float64)]
    assert math.isclose(float(along[0]), 1.0, rel_tol=1e-6)
    assert math.isclose(float(along[1]), -SADDLE_MU, rel_tol=1e-4)


# ------------------------------------------------------------------------------------------ descent
def test_sgd_on_the_ravine_follows_the_closed_form():
    """SGD on ½(x² + κy²): x_t = (1 − η)ᵗ x₀, y_t = (1 − ηκ)ᵗ y₀."""
    surface, lr, kappa = SURFACES["ravine"], 0.03, 50.0
    found = descend(surface, "sgd", [lr], steps=200, tolerance=1e-300)
    path = found["path"][0]
    t = np.arange(201)
    x0, y0 = surface.start
    np.testing.assert_allclose(path[:, 0], x0 * (1 - lr) ** t, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(path[:, 1], y0 * (1 - lr * kappa) ** t, rtol=1e-9, atol=1e-300)


def test_reached_and_diverged_steps_match_the_closed_form():
    surface, kappa = SURFACES["ravine"], 50.0
    x0, y0 = surface.start
    stable, unstable, tolerance = 0.015, 2.2 / kappa, 1e-4  # |1 − ηκ| > 1 diverges
    found = descend(surface, "sgd", [stable, unstable], steps=5000, tolerance=tolerance)
    t = np.arange(5001)

    def gap(lr):
        return 0.5 * ((x0 * (1 - lr) ** t) ** 2 + kappa * (y0 * (1 - lr * kappa) ** t) ** 2)

    assert found["reached_at"][0] == int(np.argmax(gap(stable) <= tolerance))
    assert found["diverged_at"][0] is None and found["reached_at"][1] is None
    with np.errstate(over="ignore"):
        assert found["diverged_at"][1] == int(np.argmax(gap(unstable) > DIVERGED_FACTOR * gap(unstable)[0]))
    assert len(found["path"][0]) == found["reached_at"][0] + 1


def test_batched_learning_rates_equal_separate_runs():
    surface = SURFACES["rosenbrock"]
    together = descend(surface, "adam", [0.01, 0.1], steps=300, tolerance=1e-12)
    alone = descend(surface, "adam", [0.1], steps=300, tolerance=1e-12)
    np.testing.assert_array_equal(together["path"][1], alone["path"][0])


def test_best_run_prefers_fewest_steps_then_smallest_gap():
    runs_ = {
        "lrs": [0.1, 0.2, 0.3, 0.4],
        "reached_at": [None, 40, 30, 30],
        "diverged_at": [None, None, None, None],
        "final_gap": [1, 0, 0, 0],
    }
    assert best_run(runs_) == 2
    runs_ = {"lrs": [0.1, 0.2, 0.3], "reached_at": [None] * 3, "diverged_at": [None, 5, None]}
    runs_["final_gap"] = [0.3, 0.0, 0.1]
    assert best_run(runs_) == 2
    assert best_run({"lrs": [1.0], "reached_at": [None], "diverged_at": [3], "final_gap": [math.inf]}) is None


def test_the_best_lr_does_not_depend_on_the_order_of_the_grid():
    """Ties (RMSprop on the quick ravine grid reaches 10⁻⁶ in 9 steps at η = 0.3 and at η = 1) go to the smaller
    η, so the grid given in either order shows the same run."""
    for reached, gaps in (([9, 9, 12], [1e-7, 2e-7, 3e-7]), ([None, None, None], [0.2, 0.2, 0.5])):
        grid = {"lrs": [1.0, 0.3, 0.1], "reached_at": reached, "diverged_at": [None] * 3, "final_gap": gaps}
        reverse = {key: values[::-1] for key, values in grid.items()}
        assert grid["lrs"][best_run(grid)] == reverse["lrs"][best_run(reverse)] == 0.3


def test_thin_path_drops_only_points_within_resolution():
    extent = (0.0, 3.0, 0.0, 4.0)  # diagonal 5
    resolution = 5 * 1e-3
    rng = np.random.default_rng(0)
    path = np.cumsum(rng.normal(scale=resolution, size=(2000, 2)), axis=0)
    kept = np.asarray(thin_path(path, extent))
    assert np.array_equal(kept[0], path[0]) and np.array_equal(kept[-1], path[-1])
    assert 10 < len(kept) < len(path)
    # every original point lies within the resolution of the last kept point before it (or is kept)
    last = path[0]
    kept_set = {tuple(p) for p in kept}
    for point in path[1:-1]:
        if tuple(point) in kept_set:
            last = point
        else:
            assert math.dist(point, last) < resolution


def test_log_sampled_keeps_first_and_last_step():
    values = np.arange(5001, dtype=float) ** 2
    sampled = log_sampled(values)
    assert sampled["steps"][0] == 0 and sampled["steps"][-1] == 5000
    assert sampled["values"] == [float(s) ** 2 for s in sampled["steps"]]
    assert log_sampled(np.array([7.0])) == {"steps": [0], "values": [7.0]}


def test_plot_extent_holds_the_paths_but_is_capped():
    extent = (-1.0, 1.0, -1.0, 1.0)
    widened = ls.plot_extent(extent, [[[0.0, 0.0], [1.5, -1.2]]])
    assert widened[1] > 1.5 and widened[2] < -1.2 and widened[0] == -1.0 and widened[3] == 1.0
    capped = ls.plot_extent(extent, [[[100.0, 0.0]]])
    assert capped[1] == 2.0


# ----------------------------------------------------------------------------------- bias correction
def test_bias_corrected_adam_reproduces_the_seed_worked_example():
    path, betas = descend_parabola("adam", 1e-3, 3.0, 3)
    np.testing.assert_allclose(path, [3.0, 2.999, 2.998, 2.997], atol=2e-6)
    assert betas == (0.9, 0.999)


def test_uncorrected_steps_follow_the_constant_gradient_prediction():
    """With η tiny, g = 2x stays ≈ 6 and the uncorrected step is η (1 − β1ᵗ)/√(1 − β2ᵗ)."""
    lr = 1e-7
    path, (beta1, beta2) = descend_parabola("adam-no-bc", lr, 3.0, 50)
    t = np.arange(1, 51)
    expected = (1 - beta1**t) / np.sqrt(1 - beta2**t)
    np.testing.assert_allclose(np.abs(np.diff(path)) / lr, expected, rtol=1e-5)
    np.testing.assert_allclose(predicted_step_ratio(50, beta1, beta2), expected, rtol=1e-15)
    assert math.isclose(expected[0], 0.1 / math.sqrt(0.001), rel_tol=1e-12)


def test_bias_story_measures_first_step_and_overshoot():
    story = bias_correction_story(lr=0.05, start=3.0, steps=300)
    corrected, raw = story["runs"]["adam"], story["runs"]["adam-no-bc"]
    # the step is η m̂/(√v̂ + ε): ε shifts it by ε/√v̂ relative, 2e-9 corrected and 5e-8 uncorrected
    assert math.isclose(corrected["first_step"], 0.05, rel_tol=1e-8)
    assert math.isclose(raw["first_step"], 0.05 * 0.1 / math.sqrt(0.001), rel_tol=1e-6)
    x = np.asarray(raw["x"])
    assert raw["overshoot"] == pytest.approx(max(0.0, -x.min()))
    assert raw["first_crossing"] == int(np.argmax(x < 0))
    assert raw["overshoot"] > 10 * corrected["overshoot"]
    np.testing.assert_allclose(story["second_moment_correction"][:2], [1 - 0.999, 1 - 0.999**2])


def test_bias_story_of_a_run_that_overflowed_reads_its_steps_where_x_is_finite():
    """At η = 1e300 Adam's first step is η (corrected) or 3.16η (not) from x₀ = 3, both finite; the gradient
    there, about 2e300, squares past float64's range (1.8e308), and x is no longer finite from step 2. The
    largest step is then the first one, not the NaN that argmax would pick."""
    story = bias_correction_story(lr=1e300, start=3.0, steps=10)
    for name, ratio in (("adam", 1.0), ("adam-no-bc", 0.1 / math.sqrt(0.001))):
        run = story["runs"][name]
        assert run["diverged_at"] == 2 and not np.isfinite(run["x"][2])
        assert run["largest_step"] == run["first_step"] == pytest.approx(1e300 * ratio, rel=1e-6)
        assert run["largest_step_at"] == 1 and run["overshoot"] == pytest.approx(1e300 * ratio - 3.0, rel=1e-6)
    assert bias_correction_story(lr=0.05, start=3.0, steps=30)["runs"]["adam"]["diverged_at"] is None


# -------------------------------------------------------------------------------------- weight decay
def test_shape_stats_against_hand_computed_moments():
    w = np.array([0.0, 1.0, 1.0, 2.0, 6.0])
    mean = 2.0
    m2 = sum((v - mean) ** 2 for v in w) / 5  # 4.4
    m3 = sum((v - mean) ** 3 for v in w) / 5
    m4 = sum((v - mean) ** 4 for v in w) / 5
    stats = shape_stats(w)
    assert stats["mean"] == mean and stats["max_abs"] == 6.0
    assert math.isclose(stats["std"], math.sqrt(m2))
    assert math.isclose(stats["skewness"], m3 / m2**1.5)
    assert math.isclose(stats["excess_kurtosis"], m4 / m2**2 - 3)


def test_shape_stats_of_known_distributions():
    rng = np.random.default_rng(0)
    normal = shape_stats(rng.normal(size=400_000))
    exponential = shape_stats(rng.exponential(size=400_000))
    assert abs(normal["skewness"]) < 0.02 and abs(normal["excess_kurtosis"]) < 0.05
    assert abs(exponential["skewness"] - 2) < 0.1 and abs(exponential["excess_kurtosis"] - 6) < 0.6


def test_l2_optimum_zeroes_the_regularised_gradient():
    rng = np.random.default_rng(1)
    w_star, scales, lam = rng.normal(size=30), rng.uniform(0.1, 10, size=30), 0.1
    theta = l2_optimum(w_star, scales, lam)
    np.testing.assert_allclose(scales**2 * (theta - w_star) + lam * theta, 0.0, atol=1e-12)


def test_adamw_shrinks_by_one_minus_lr_lambda_at_zero_gradient():
    theta = torch.tensor([2.0, -3.0, 0.5], dtype=torch.float64)
    optimizer = build_optimizer("adamw", [theta], lr=0.01, weight_decay=0.1)
    for _ in range(5):
        theta.grad = torch.zeros_like(theta)
        before = theta.clone()
        optimizer.step()
        torch.testing.assert_close(theta / before, torch.full((3,), 1 - 0.01 * 0.1, dtype=torch.float64))


def test_weight_decay_story_decay_and_fixed_points():
    story = weight_decay_story((0.1, 1.0, 10.0), 20, lr=0.01, weight_decay=0.1, steps=800, seed=0)
    group = np.asarray(story["group"])
    adamw = np.asarray(story["runs"]["adamw"]["effective_decay"])
    adaml2 = np.asarray(story["runs"]["adaml2"]["effective_decay"])
    np.testing.assert_allclose(adamw, 0.01 * 0.1)
    # coupled decay is divided by √v̂: smaller gradients (smaller feature scale) decay faster
    medians = [np.median(adaml2[group == j]) for j in range(3)]
    assert medians[0] > medians[1] > medians[2]
    # Adam+L2 descends L + ½λ‖θ‖², so it ends at that objective's optimum; AdamW does not
    assert story["runs"]["adaml2"]["rms_distance_to_l2_optimum"] < story["runs"]["adamw"]["rms_distance_to_l2_optimum"]
    assert story["runs"]["adaml2"]["stats"] == shape_stats(np.asarray(story["runs"]["adaml2"]["final_weights"]))


def test_seed_claims_read_the_statistics():
    n = 600  # 2 SE of skewness = 0.2, 2 SE of a kurtosis difference = 0.8
    symmetric = {"skewness": 0.05, "excess_kurtosis": 0.1, "max_abs": 2.0}
    skewed = {"skewness": 0.5, "excess_kurtosis": 1.5, "max_abs": 3.0}
    claims = seed_claims(symmetric, skewed, n)
    assert claims == {
        "adamw_symmetric": True,
        "adaml2_skewed": True,
        "adaml2_heavier_tails": True,
        "adaml2_larger_max_abs": True,
    }
    assert not any(seed_claims(skewed, symmetric, n).values())


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optimizers": "sgd,muon"}, "muon is not offered here (θ is a 2-vector"),
        ({"optimizers": "sgd,adagrad"}, "unknown optimizer 'adagrad'; valid: sgd, momentum, nesterov"),
        ({"steps": -5}, "--steps=-5 must be an integer >= 1"),
        ({"lrs": (0.1, -1.0)}, "--lrs=(0.1, -1.0): give one or more finite numbers > 0"),
        ({"lrs": ()}, "--lrs=(): give one or more"),
        ({"lrs": (0.1, 0.1)}, "--lrs=(0.1, 0.1) names a learning rate twice"),
        ({"condition_number": 0.5}, "--condition-number=0.5 must be a finite number >= 1"),
        ({"tolerance": 0.0}, "tolerance=0.0 must be a finite number > 0"),
        ({"bias_lr": float("inf")}, "--bias-lr=inf must be a finite number > 0"),
        ({"bias_start": 0.0}, "--bias-start=0.0 must be a finite number other than 0"),
        ({"group_scales": (1.0, 0.0)}, "--group-scales=(1.0, 0.0)"),
        ({"weights_per_group": 1}, "--weights-per-group=1 must be an integer >= 4 (each group's skewness"),
        ({"weights_per_group": 2.5}, "--weights-per-group=2.5 must be an integer >= 4"),
    ],
)
def test_bad_config_names_the_value_and_what_is_valid(overrides, message):
    with pytest.raises(ConfigError) as error:
        ls.Config(**overrides)
    assert message in str(error.value)


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_quick_run_then_plot_reproduces_the_figures(tmp_path):
    out = tmp_path / "landscapes"
    options = [
        *("--steps", "200", "--lrs", "0.01,0.1", "--optimizers", "sgd,adam,lion"),
        *("--bias-steps", "60", "--decay-steps", "100", "--weights-per-group", "10"),
    ]
    assert cli.main(["run", "landscapes", "--quick", "--out", str(out), *options]) == 0
    results = runs.read_json(out / "results.json")
    assert set(results["surfaces"]) == {"ravine", "saddle", "rosenbrock"}
    assert set(results["surfaces"]["ravine"]["runs"]) == {"sgd", "adam", "lion"}
    assert len(results["bias_correction"]["runs"]["adam"]["x"]) == 61
    names = ["landscapes.png", "convergence_table.png", "bias_correction.png", "adamw_vs_adaml2.png"]
    assert_figures_drawn_and_replotted(out, names)


def test_cli_lists_valid_optimizers_for_a_bad_name(tmp_path, capsys):
    code = cli.main(["run", "landscapes", "--out", str(tmp_path / "x"), "--optimizers", "sgd,adamax"])
    assert code == cli.EXIT_BAD_INPUT
    assert "unknown optimizer 'adamax'; valid: sgd, momentum, nesterov, rmsprop, adam" in printed(capsys)
