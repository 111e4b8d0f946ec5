"""The page's headline sentences for results that lack what a full run has: one optimizer, a divergence, an
optimizer without a tuned η. The sentences that can be said are, and nothing raises."""

from __future__ import annotations

import copy
import math

from optiscope import experiments, runs
from optiscope.experiments import rare_tokens as rt
from optiscope.report.headlines import Number, format_number, headlines
from optiscope.sweep import SweepConfig, run_sweep


def text(sentence):
    return "".join(part if isinstance(part, str) else f"<{part.value}>" for part in sentence)


def test_a_rare_tokens_run_without_sgd_keeps_its_adam_sentence():
    """One optimizer (what a sweep's trial is): no SGD-vs-Adam pair, and the page still says Adam's numbers."""
    results = {"experiment": "rare-tokens", **rt.run(rt.Config(steps=60, optimizers="adam", sweep_lrs=(0.01,)), None)}
    assert "pair" not in results or "sgd" not in (results["pair"] or {})
    said = [text(s) for s in headlines(results)]
    assert any(s.startswith("Adam's effective learning rate at the end is") for s in said), said


def test_a_rare_tokens_run_with_one_token_seen_states_no_slope():
    """Two tokens, the rare one never drawn in 5 steps: one frequency seen determines no line, so the sentence
    drops its slope (all-equal frequencies, the other such case, are refused)."""
    config = rt.Config(steps=5, frequencies=(0.9999, 0.0001), optimizers="sgd,adam", sweep_lrs=(0.01,))
    results = {"experiment": "rare-tokens", **rt.run(config, None)}
    assert results["occurrences"][1] == 0  # the case at hand
    (said,) = [text(s) for s in headlines(results) if text(s).startswith("Adam's effective learning rate")]
    assert said.endswith("for the most common.") and "slope" not in said, said


def test_a_rare_tokens_run_whose_rarest_token_was_never_seen_says_so():
    """5 steps never draw the rarest token: its effective lr is η/ε, said as such, and the slope is over the
    tokens seen (their number read from the results)."""
    results = {"experiment": "rare-tokens", **rt.run(rt.Config(steps=5, optimizers="adam", sweep_lrs=(0.01,)), None)}
    seen = sum(c > 0 for c in results["occurrences"])
    assert results["occurrences"][-1] == 0 and seen >= 2  # the case at hand: the test can fail
    (said,) = [text(s) for s in headlines(results) if text(s).startswith("Adam's effective learning rate")]
    assert "for the rarest token (never seen: v̂ = 0, so η/ε)" in said and f"over the <{seen}> tokens seen" in said


def test_a_rare_tokens_run_says_which_optimizers_diverged_and_when():
    config = rt.Config(steps=120, lr=80.0, optimizers="sgd,adam,lion", sweep_lrs=(0.01, 80.0))
    results = {"experiment": "rare-tokens", **rt.run(config, None)}
    at = results["optimizers"]["sgd"]["diverged_at"]
    assert at is not None
    (said,) = [text(s) for s in headlines(results) if text(s).startswith("Diverged: ")]
    assert f"sgd at step <{at}>" in said


def test_a_rare_tokens_rescue_when_sgd_diverged_at_the_nominal_lr_is_said_without_a_comparison():
    """SGD diverged at the nominal η = 5 and η = 2 rescued it: the rescue sentence had dropped out (no nominal
    jitter to compare with); it now says the rescue and that SGD diverged at the nominal η."""
    config = rt.Config(steps=2000, lr=5.0, optimizers="sgd,adam", sweep_lrs=(2.0,))
    results = {"experiment": "rare-tokens", **rt.run(config, None)}
    findings = results["lr_sweep"]["findings"]
    assert results["optimizers"]["sgd"]["diverged_at"] is not None and findings["rescue_lr"] == 2.0  # the case
    (said,) = [text(s) for s in headlines(results) if text(s).startswith("A larger η lets SGD learn")]
    assert said == (
        "A larger η lets SGD learn the rarest token from η = <2.0>, where the most common token's jitter (std) is "
        f"<{findings['rescue_common_tail_std']}> (at η = <5.0> SGD diverged)."
    )


def test_a_sweep_says_what_the_trials_of_an_untuned_optimizer_did(tmp_path, monkeypatch):
    from optiscope import experiments

    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    options = {"sgd_optimum": 1e-3, "adam_optimum": 0.1, "crash_at": 0.01}
    config = SweepConfig("synthetic", ("sgd", "adam"), seeds=1, lrs=(0.01,), options=options)
    results = run_sweep(config, tmp_path / "s")
    said = [text(s) for s in headlines(results)]
    for name in ("sgd", "adam"):
        assert f"{name}: no tuned η — of its 1 trial 1 crashed." in said


def test_a_sweep_says_when_a_tuned_lr_is_at_an_end_of_its_grid(tmp_path, monkeypatch):
    """sgd's optimum 1e-3 lies below the fixed grid 0.01, 0.1 (its tuned η is a bound); adam's 0.03 lies
    inside 0.01, 0.03, 0.1 — the page says so of sgd only, as the console does."""
    from optiscope import experiments

    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    options = {"sgd_optimum": 1e-3, "adam_optimum": 0.03}
    config = SweepConfig("synthetic", ("sgd", "adam"), seeds=2, lrs=(0.01, 0.03, 0.1), options=options)
    results = run_sweep(config, tmp_path / "s")
    said = {s.split(":")[0]: s for s in map(text, headlines(results)) if ": tuned η " in s}
    caveat = " (at an end of the grid that was run: its optimum may lie beyond), "
    assert said["sgd"].startswith("sgd: tuned η <0.01>" + caveat), said
    assert said["adam"].startswith("adam: tuned η <0.03>, "), said


def test_a_landscapes_run_that_diverged_at_every_rate_is_not_said_to_be_slow():
    from optiscope.experiments import landscapes

    config = landscapes.Config(steps=50, optimizers="sgd@1e6,adam", bias_steps=20, decay_steps=20)
    results = {"experiment": "landscapes", **landscapes.run(config, None)}
    said = [text(s) for s in headlines(results)]
    surfaces = [s for s in said if "steps to f − f* ≤" in s]
    assert surfaces and all("sgd@1e6 diverged at every η tried" in s for s in surfaces), surfaces


def test_a_number_is_not_rounded_onto_a_whole_number_it_is_not():
    """A ratio to a threshold just past 1 (or just short of it) keeps the digits that say which side it is on."""
    assert [format_number(x) for x in (1.00012, 0.99997, 1.0, 2.5e-7, 12345.6, 1000.4, 3)] == [
        "1.0001",
        "0.99997",
        "1",
        "2.5e-07",
        "1.235e+04",
        "1000.4",
        "3",
    ]


def test_an_lm_runs_spearman_is_said_only_of_the_runs_that_did_not_diverge(tiny_runs):
    """A diverged run's embedding rows moved by its exploding last steps: its correlation is not stated."""
    results = runs.read_json(tiny_runs["lm"] / "results.json")
    name = next(iter(results["runs"]))
    assert math.isfinite(results["runs"][name]["embedding_rows"]["spearman"])  # stated while the run is ok

    def spearman():
        return next((text(s) for s in headlines(results) if text(s).startswith("Spearman")), "")

    assert f"{name} <" in spearman()
    results["runs"][name].update(status="diverged", divergence={"step": 3, "reason": "loss is nan"})
    assert f"{name} <" not in spearman()


def test_numbers_that_are_not_finite_are_said_in_words():
    """NaN and ±inf read as a reader says them, never Python's "nan" and "inf"."""
    assert [format_number(x) for x in (math.nan, math.inf, -math.inf)] == ["not a number (NaN)", "∞", "−∞"]


def test_an_edge_of_stability_run_that_diverged_says_whether_it_reached_its_edge_first(tiny_results):
    """A diverged run's edge is stated only where it came before the divergence (oracle: the steps set here)."""
    results = copy.deepcopy(tiny_results["edge-of-stability"])
    first, second = results["runs"][:2]
    first.update(status="diverged", divergence={"step": 30, "reason": "loss is nan"}, edge_step=10)
    second.update(status="diverged", divergence={"step": 30, "reason": "loss is nan"}, edge_step=30)
    first["max_ratio"], second["max_ratio"] = math.inf, math.nan
    said = {s.split(":")[0]: s for s in map(text, headlines(results))}
    assert said[first["label"]].endswith(
        ": reached <0.9>× at step <10>, then diverged at step <30>, at most <inf>× it."
    )
    assert said[second["label"]].endswith(": diverged at step <30>, at most <nan>× it.")
    shown = [part.text for s in headlines(results) for part in s if isinstance(part, Number)]
    assert "∞" in shown and "not a number (NaN)" in shown and "inf" not in shown and "nan" not in shown


def test_an_edge_of_stability_run_that_diverged_before_any_measurement_is_still_said_to(tiny_results):
    """momentum@1e308 has non-finite weights after step 1: its one measurement is NaN, so it has no largest ratio
    (max_ratio None), and its headline was dropped whole, saying nothing of the divergence; an ok run without a
    finite ratio likewise. Oracle: the steps and statuses set here."""
    results = copy.deepcopy(tiny_results["edge-of-stability"])
    first, second = results["runs"][:2]
    first.update(status="diverged", divergence={"step": 1, "reason": "non-finite weights"}, edge_step=None)
    first.update(step=[1], sharpness=[math.nan], ratio=[math.nan], loss=[2.0], hvps=[1], max_ratio=None)
    second.update(edge_step=None, equilibrium=None, max_ratio=None, ratio=[None] * len(second["ratio"]))
    said = {s.split(":")[0]: s for s in map(text, headlines(results))}
    assert said[first["label"]].endswith(": diverged at step <1>, with no finite ratio measured before it."), said
    assert said[second["label"]].endswith(f": no finite ratio measured in <{results['steps']}> steps."), said


def test_a_bias_correction_run_that_diverged_is_said_to_and_compares_no_steps():
    """At η = 1e300 x stops being finite at once: the page said nothing of the bias-correction runs (their largest
    step is None), while the figure says they diverged. The oracle: each run's diverged_at in the results."""
    from optiscope.experiments import landscapes as ls

    config = ls.Config(steps=20, lrs=(0.01,), optimizers="sgd", bias_lr=1e300, bias_steps=10, decay_steps=10)
    results = {"experiment": "landscapes", **ls.run(config, None)}
    at = {name: run["diverged_at"] for name, run in results["bias_correction"]["runs"].items()}
    assert all(step is not None for step in at.values())  # the case at hand
    (said,) = [text(s) for s in headlines(results) if text(s).startswith("Bias correction: ")]
    assert said == (
        "Bias correction: "
        + "; ".join(f"{name} diverged at step <{step}>" for name, step in at.items())
        + " (x not finite), so the steps are not compared."
    )


def lead(results) -> str:
    """The first headline sentence: the summary's line of the run."""
    return text(headlines(results)[0])


def test_each_quick_runs_first_headline_names_the_best_that_results_json_holds(demo):
    """The first sentence answers the study's question (the demo's quick runs): lm's lowest validation loss,
    rare-tokens' smallest rarest-token error, landscapes' fewest steps per surface, adder's best score, each with
    its number; entropy and edge-of-stability race no one and name every run. Oracle: each run's own numbers in
    results.json, compared here."""
    r = {name: runs.read_json(demo.out / name / runs.RESULTS) for name in experiments.EXPERIMENTS}

    losses = {name: run["final"]["val_loss"] for name, run in r["lm"]["runs"].items() if run["status"] == "ok"}
    best = min(losses, key=losses.get)
    assert lead(r["lm"]).startswith(f"{best} reached the lowest validation loss, <{losses[best]}> after "), lead(
        r["lm"]
    )

    rarest = r["rare-tokens"]["rarest"]
    errors = {name: o["final_error"][rarest] for name, o in r["rare-tokens"]["optimizers"].items() if o["final_error"]}
    best = min(errors, key=errors.get)
    assert lead(r["rare-tokens"]).startswith(f"{best} ends closest to the target on the rarest token")
    assert f"|w − w*| = <{errors[best]}>" in lead(r["rare-tokens"])

    for surface, data in r["landscapes"]["surfaces"].items():
        steps = {name: run["reached_at"] for name, run in data["runs"].items() if run["reached_at"] is not None}
        best = min(steps, key=steps.get, default=None)
        said = f"{surface}: {best}, <{steps[best]}> steps" if best else f"{surface}: none within"
        assert said in lead(r["landscapes"]), (said, lead(r["landscapes"]))

    adder = r["adder"]
    best = max(adder["runs"], key=lambda run: run["correct"])
    assert lead(adder).startswith(f"Best score, {best['label']} seed ")
    assert f": <{best['correct']}> of <{adder['cases']}> correct (best at step " in lead(adder)

    assert all(f"{name} <" in lead(r["entropy"]) for name in r["entropy"]["optimizers"]), lead(r["entropy"])
    assert all(run["label"] in lead(r["edge-of-stability"]) for run in r["edge-of-stability"]["runs"])


def test_a_sweeps_first_headline_names_the_tuned_winner_and_its_interval(tmp_path, monkeypatch):
    """sgd's optimum lies on the grid (objective seed/1000 there), adam's between two of its points: sgd wins with
    the mean of its fresh seeds 2 and 3, (0.002 + 0.003) / 2 = 0.0025 (the synthetic objective's closed form), and its
    95 % interval and the margin over adam follow."""
    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    options = {"sgd_optimum": 0.01, "adam_optimum": 0.05}
    config = SweepConfig("synthetic", ("adam", "sgd"), seeds=2, lrs=(0.01, 0.1), options=options)
    said = lead(run_sweep(config, tmp_path / "s"))
    assert said.startswith("sgd is best on "), said
    assert ": <0.0025> over its fresh seeds (95 % interval <" in said and " at its tuned η <0.01>" in said, said
    assert "; ahead of adam by <" in said and "beyond seed noise)." in said, said


def test_the_users_own_optimizers_are_named_in_the_text_like_ours():
    """A class path (torch.optim.NAdam) beside the recipes: it had been drawn in the figures and named nowhere in the
    findings, which spoke of SGD and Adam alone."""
    config = rt.Config(steps=60, optimizers="sgd,adam,torch.optim.NAdam@0.01", sweep_lrs=(0.01,))
    results = {"experiment": "rare-tokens", **rt.run(config, None)}
    said = " ".join(text(s) for s in headlines(results)[:2])
    assert all(f"{name} <" in said or said.startswith(name) for name in results["optimizers"]), said
