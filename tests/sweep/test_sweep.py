"""run_sweep on the synthetic experiment: the grid grows to an interior optimum on either side, a
diverged or crashed trial is recorded and the sweep goes on, a killed sweep resumes to the results of
an uninterrupted one without re-running finished trials."""

import json
import math
import re

import pytest

from optiscope import experiments, figures, runs
from optiscope.errors import ConfigError
from optiscope.sweep import SweepConfig, backends, run_sweep, what_trials_did
from optiscope.sweep.grid import auto_lr as grid_lr

from .synthetic import without_wall_times


def config(**overrides):
    options = overrides.pop("options", {"sgd_optimum": 1e-4, "adam_optimum": 1.0})
    overrides.setdefault("optimizers", ("sgd", "adam"))
    return SweepConfig(experiment="synthetic", options=options, **overrides)


def test_grid_grows_to_an_optimum_outside_it_on_either_side(synthetic, tmp_path):
    results = run_sweep(config(seeds=2), tmp_path / "s")
    sgd, adam = results["optimizers"]["sgd"], results["optimizers"]["adam"]
    # η* = 1e-4 and 1 are 4 half-decades below and above the first grid's centre 0.01
    assert sgd["tuned_lr"] == pytest.approx(1e-4) and adam["tuned_lr"] == pytest.approx(1.0)
    assert sgd["interior"] and adam["interior"]
    assert [p["lr"] for p in sgd["sensitivity"]] == pytest.approx([3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 0.01, 0.0316])
    # seeds 0 and 1 chose η*; the fresh seeds 2 and 3 ran there: objective (0 at η*) + seed / 1000
    assert sgd["tuning_mean"] == pytest.approx(0.0005) and sgd["values"] == pytest.approx([0.002, 0.003])
    assert sgd["mean"] == pytest.approx(0.0025) and sgd["interval"][0] < 0.0025 < sgd["interval"][1]
    assert results["seeds"] == [0, 1] and results["fresh_seeds"] == [2, 3]
    assert sorted(results["ranking"]) == ["adam", "sgd"]
    fresh = [(t["lr"], t["seed"]) for t in results["trials"] if t["optimizer"] == "sgd" and t["seed"] >= 2]
    assert fresh == [(1e-4, 2), (1e-4, 3)]  # at the tuned lr only
    on_disk = runs.read_json(tmp_path / "s" / "results.json")
    trial = on_disk["trials"][0]
    assert (tmp_path / "s" / trial["dir"] / "results.json").is_file()  # each trial is a run directory
    assert runs.read_json(tmp_path / "s" / "config.json")["config"]["factor"] == pytest.approx(math.sqrt(10))


def test_a_sweep_whose_first_rates_miss_the_target_searches_higher(synthetic, tmp_path):
    """Trials below η = 0.05 finish without reaching the target (status ok, value +inf), the optimum is 0.1 and
    the grid starts at 0.00316, 0.01, 0.0316: it grows upwards to 0.1 (the oracle: the known optimum)."""
    options = {"sgd_optimum": 0.1, "miss_below": 0.05}
    results = run_sweep(config(optimizers=("sgd",), seeds=1, options=options), tmp_path / "s")
    missed = [t for t in results["trials"] if t["lr"] < 0.05]
    assert missed and all(t["status"] == "ok" and t["objective"] == math.inf for t in missed)  # the case at hand
    assert results["optimizers"]["sgd"]["tuned_lr"] == 0.1


def test_diverged_and_crashed_trials_are_recorded(synthetic, tmp_path):
    options = {"sgd_optimum": 0.03, "diverge_above": 0.05, "crash_at": 0.00316}
    results = run_sweep(config(optimizers=("sgd",), seeds=1, options=options), tmp_path / "s")
    by_lr = {t["lr"]: t for t in results["trials"]}
    assert by_lr[0.1]["status"] == "diverged" and by_lr[0.1]["objective"] == math.inf
    assert by_lr[0.00316]["status"] == "crashed" and "crashed on purpose" in by_lr[0.00316]["error"]
    assert (tmp_path / "s" / by_lr[0.00316]["dir"] / "error.log").is_file()
    assert results["optimizers"]["sgd"]["tuned_lr"] == 0.0316


@pytest.mark.parametrize(
    ("lrs", "options", "status"),
    [
        ((0.01, 0.1), {"diverge_above": 0.001}, "diverged"),
        ((0.01,), {"crash_at": 0.01}, "failed"),
        ((0.01, 0.1), {"crash_at": 0.01, "diverge_above": 0.02}, "failed"),
        ((0.01, 0.1), {"miss_below": 1.0}, "failed"),
        ((0.01, 0.1), {"miss_below": 0.05, "diverge_above": 0.05}, "failed"),
    ],
    ids=["all-diverged", "all-crashed", "crashed-and-diverged", "all-missed", "missed-and-diverged"],
)
def test_a_sweep_without_a_value_says_diverged_only_when_every_trial_diverged(
    synthetic, tmp_path, lrs, options, status
):
    """A sweep every trial of which crashed (or some crashed, the rest diverged) said "diverged", which the
    trials' own records contradict; one whose trials all missed their target said "ok" with nothing tuned. Both
    are "failed". The oracle: the trials' recorded statuses and objectives."""
    results = run_sweep(config(optimizers=("sgd",), seeds=1, lrs=lrs, options=options), tmp_path / "s")
    ended = {t["status"] for t in results["trials"]}
    assert not any(math.isfinite(t["objective"]) for t in results["trials"])  # the case at hand: no value
    assert (ended == {"diverged"}) == (status == "diverged")
    assert results["status"] == status


def test_a_trials_own_refusal_is_recorded_as_its_crash_and_the_sweep_goes_on(synthetic, tmp_path, monkeypatch):
    """Only an option the experiment refuses (a ConfigError, which every trial would meet) stops a sweep; one
    trial's damaged checkpoint (a CheckpointError, bad input of that trial alone) is that trial's crash."""
    import importlib

    module = importlib.import_module("sweep.synthetic")
    real = module.run

    def damaged_at(config, run_dir):
        if module.runs_of(config)[0].lr == 0.00316:
            raise runs.CheckpointError(f"{run_dir}/checkpoints/sgd.pt is damaged; delete it")
        return real(config, run_dir)

    monkeypatch.setattr(module, "run", damaged_at)
    results = run_sweep(config(optimizers=("sgd",), seeds=1, options={"sgd_optimum": 0.03}), tmp_path / "s")
    by_lr = {t["lr"]: t for t in results["trials"]}
    assert by_lr[0.00316]["status"] == "crashed" and "is damaged" in by_lr[0.00316]["error"]
    assert results["optimizers"]["sgd"]["tuned_lr"] == 0.0316


def test_a_killed_sweep_resumes_to_the_same_results(synthetic, tmp_path, monkeypatch):
    whole = run_sweep(config(seeds=2), tmp_path / "whole")
    ran = []

    def counted(trial):
        ran.append((trial.optimizer, trial.lr, trial.seed))
        return run_trial(trial)

    run_trial = backends.run_trial
    monkeypatch.setattr(backends, "run_trial", counted)

    def kill_after_five(record):
        if len(ran) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(config(seeds=2), tmp_path / "part", report=kill_after_five)
    first = list(ran)
    with pytest.raises(runs.RunDirError, match="--resume"):
        run_sweep(config(seeds=2), tmp_path / "part")
    resumed = run_sweep(config(seeds=2), tmp_path / "part", resume=True)
    assert not set(first) & set(ran[len(first) :])  # finished trials were not run again
    assert len(ran) == len(whole["trials"])
    assert without_wall_times(resumed) == without_wall_times(whole)


def test_resume_runs_a_crashed_trial_again(synthetic, tmp_path, monkeypatch):
    """A crash that does not recur (memory that ran out, a lost machine) leaves no mark on the results once
    the sweep is resumed: they equal those of a sweep where it never happened, but for the trials it caused
    to run meanwhile."""
    whole = run_sweep(config(seeds=2), tmp_path / "whole")
    module = experiments.load("synthetic")
    honest = module.run

    def crashing_once(settings, run_dir):
        if settings.seed == 1 and settings.optimizers == "adam@1":
            monkeypatch.setattr(module, "run", honest)
            raise MemoryError("out of memory, once")
        return honest(settings, run_dir)

    monkeypatch.setattr(module, "run", crashing_once)
    crashed = run_sweep(config(seeds=2), tmp_path / "s")
    assert [(t["label"], t["seed"]) for t in crashed["trials"] if t["status"] == "crashed"] == [("adam@1", 1)]
    assert crashed["optimizers"]["adam"]["values"] != whole["optimizers"]["adam"]["values"]
    resumed = run_sweep(config(seeds=2), tmp_path / "s", resume=True)
    resumed, whole = without_wall_times(resumed), without_wall_times(whole)
    extra = [(t["label"], t["seed"]) for t in resumed["trials"] if t not in whole["trials"]]
    # the crash moved adam's tuned lr, whose fresh seeds ran there: kept among the trials, used for nothing
    assert extra == [("adam@3.16", 2), ("adam@3.16", 3)]
    assert {**resumed, "trials": None} == {**whole, "trials": None}
    lines = runs.read_jsonl(tmp_path / "s" / "trials.jsonl")
    assert [r["status"] for r in lines if (r["label"], r["seed"]) == ("adam@1", 1)] == ["crashed", "ok"]


def test_rare_tokens_trials_read_the_experiments_own_numbers(tmp_path):
    """The objective of each trial equals what one ``optiscope run`` of the same optimizers measures."""
    options = {"steps": 300, "sweep_lrs": (0.1, 1.0)}
    results = run_sweep(
        SweepConfig("rare-tokens", ("adam",), seeds=1, lrs=(0.01, 0.1, 1.0), options=options), tmp_path / "s"
    )
    module = experiments.load("rare-tokens")
    config = experiments.build_config(module, False, {**options, "optimizers": "adam@0.01,adam@0.1,adam@1"})
    together = module.run(config, tmp_path)
    rarest = together["rarest"]
    tuning = [t for t in results["trials"] if t["seed"] == results["seeds"][0]]
    assert len(tuning) == 3 and len(results["trials"]) == 4  # and one fresh seed at the tuned lr
    for trial in tuning:
        run = together["optimizers"][f"adam@{trial['lr']:g}"]
        expected = math.inf if run["tail_rms_error"] is None else run["tail_rms_error"][rarest]
        assert trial["objective"] == pytest.approx(expected, rel=1e-12)
    one = runs.read_json(tmp_path / "s" / results["trials"][0]["dir"] / "results.json")
    assert not figures.draw(one, tmp_path / "figures").failures  # a run of one optimizer draws (no SGD vs Adam)


def test_an_optimizer_without_a_tuned_lr_is_told_which_trials_finished(synthetic, tmp_path, monkeypatch):
    """Seed 1 diverges at every lr, seed 0 at none: no lr has a value for both tuning seeds, so no tuned lr. Seed 0's
    trials reached their values (on disk): they had been said to have "missed the target"."""
    module = experiments.load("synthetic")
    honest = module.run

    def seed_one_diverges(settings, run_dir):
        results = honest(settings, run_dir)
        return {**results, "status": "diverged"} if settings.seed == 1 else results

    monkeypatch.setattr(module, "run", seed_one_diverges)
    results = run_sweep(config(optimizers=("sgd",), seeds=2, lrs=(0.01, 0.1)), tmp_path / "s")
    assert results["optimizers"]["sgd"]["tuned_lr"] is None
    on_disk = [runs.read_json(tmp_path / "s" / t["dir"] / "results.json") for t in results["trials"]]
    finished = sum(r["status"] == "ok" and all(math.isfinite(v["value"]) for v in r["runs"].values()) for r in on_disk)
    assert finished == 2
    assert what_trials_did(results, "sgd") == f"of its 4 trials 2 diverged, {finished} finished"


def test_a_record_cut_short_does_not_damage_the_next(synthetic, tmp_path):
    """A sweep stopped while appending a record (a full disk) leaves a last line cut short, which a reader skips.
    The resumed sweep appended its next record to that line, making one line of two that no JSON reader parses:
    the sweep resumed once, and the file was unreadable (to the next --resume) from then on."""
    whole = run_sweep(config(seeds=2), tmp_path / "whole")
    seen = []

    def kill_after_three(record):
        seen.append(record)
        if len(seen) == 3:
            raise KeyboardInterrupt

    out = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config(seeds=2), out, report=kill_after_three)
    with (out / "trials.jsonl").open("a") as f:
        f.write(json.dumps(whole["trials"][-1])[:40])
    resumed = run_sweep(config(seeds=2), out, resume=True)
    assert without_wall_times(resumed) == without_wall_times(whole)
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert len([json.loads(line) for line in lines]) == len(whole["trials"])


@pytest.mark.parametrize(
    ("optimizers", "says"),
    [((" sgd",), "--optimizers ' sgd' has spaces around the name; give 'sgd'"), ("sgd", "optimizers='sgd': give a")],
)
def test_optimizers_named_with_spaces_or_as_a_string_are_refused_in_one_line(synthetic, tmp_path, optimizers, says):
    """' sgd' passed the checks (stripped) and then failed inside as a KeyError; a string, checked letter by
    letter, was refused as "unknown optimizer 's'"."""
    with pytest.raises(ConfigError) as refused:
        run_sweep(config(optimizers=optimizers, seeds=1, lrs=(0.01, 0.1)), tmp_path / "s")
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    assert not (tmp_path / "s").exists()


def test_a_resume_whose_trials_refuse_leaves_the_sweeps_config_as_it_was(synthetic, tmp_path, monkeypatch):
    """A killed sweep resumed after its input went away (every trial refuses: 'corpus file gone') did not
    resume: its config.json is byte for byte what it was. The trial folders it opened (their locks, their own
    config.json written and taken back) are no work of the sweep's."""

    def kill_after_two(record):
        if len(runs.read_jsonl(tmp_path / "s" / "trials.jsonl")) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(config(seeds=2), tmp_path / "s", report=kill_after_two)
    before = (tmp_path / "s" / "config.json").read_bytes()
    module = experiments.load("synthetic")

    def gone(config, run_dir):
        raise ConfigError("corpus file corpus.txt does not exist")

    monkeypatch.setattr(module, "run", gone)
    with pytest.raises(ConfigError, match="corpus file corpus.txt does not exist"):
        run_sweep(config(seeds=2), tmp_path / "s", resume=True)
    assert (tmp_path / "s" / "config.json").read_bytes() == before


def test_lr_from_suggest_centres_each_grid_on_its_suggestion_and_resume_reads_it_back(synthetic, tmp_path):
    """The synthetic run's probe is ½·20·w², whose SGD edge is 2/20 = 0.1 and whose greedy step 1/20 = 0.05 binds
    first for the default method, without gradient noise (the oracle: the closed forms); the grid of ratio √2 is
    centred on σ·0.05, and a resume takes the centre from suggestion.json, not from a new probe."""
    sweep = config(optimizers=("sgd",), seeds=1, lr_from="suggest", factor=math.sqrt(2), options={"sgd_optimum": 0.05})
    results = run_sweep(sweep, tmp_path / "s")
    saved = runs.read_json(tmp_path / "s" / "suggestion.json")["optimizers"]["sgd"]
    assert saved["edge"] == pytest.approx(0.05, rel=1e-3)
    tuned = results["optimizers"]["sgd"]
    assert tuned["centre_lr"] == saved["lr"]
    grid = {grid_lr(saved["lr"], k, math.sqrt(2)) for k in range(-30, 31)}
    assert {t["lr"] for t in results["trials"]} <= grid
    assert abs(math.log(tuned["tuned_lr"] / 0.05)) <= math.log(math.sqrt(2)) / 2 + 1e-9  # the known optimum
    config_json = runs.read_json(tmp_path / "s" / "config.json")["config"]
    assert config_json["lr_from"] == "suggest" and config_json["factor"] == pytest.approx(math.sqrt(2))


def test_a_resumed_suggested_sweep_keeps_the_centre_it_wrote(synthetic, tmp_path):
    sweep = config(optimizers=("sgd",), seeds=1, lr_from="suggest", options={"sgd_optimum": 0.05})
    path = tmp_path / "s"
    run_sweep(sweep, path)
    stored = runs.read_json(path / "suggestion.json")
    stored["optimizers"]["sgd"]["lr"] = 0.5  # as if another machine's probe had said so
    runs.atomic_write_json(path / "suggestion.json", stored)
    (path / "results.json").unlink()
    results = run_sweep(sweep, path, resume=True)
    assert results["optimizers"]["sgd"]["centre_lr"] == 0.5


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"factor": 1.0}, "--factor 1.0 must be a number from 1.05 to 100"),
        ({"lr_from": "best"}, "--lr-from 'best'; valid: usual, suggest"),
        ({"budget": 0.0}, "--budget 0.0 must be a share"),
        ({"lrs": (0.1, 0.2), "factor": 2.0}, "--factor shapes the automatic grid; --lrs is a fixed one"),
        ({"lrs": (0.1, 0.2), "lr_from": "suggest"}, "--lr-from suggest shapes the automatic grid"),
        ({"optimizers": ("sgd@0.1",), "lr_from": "suggest"}, "with --lr-from suggest give sgd"),
    ],
    ids=["factor", "lr-from", "budget", "factor-and-lrs", "suggest-and-lrs", "suggest-and-at"],
)
def test_grid_options_are_checked(synthetic, tmp_path, overrides, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        run_sweep(config(**overrides), tmp_path / "s")
    assert not (tmp_path / "s").exists()
