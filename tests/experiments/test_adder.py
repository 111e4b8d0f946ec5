"""The adder experiment: schedules, config errors, exact resume, early stop, and a tiny CLI run."""

import pytest
import torch

from optiscope import cli, runs
from optiscope.data.addition import suite
from optiscope.experiments import ConfigError, build_config
from optiscope.experiments import adder as E
from optiscope.models.adder_challenge import SuiteScorer, add

TINY = dict(steps=40, eval_every=20, log_every=10, warmup_steps=5, curriculum_steps=10, carry_steps=20)


@pytest.fixture(autouse=True)
def one_thread():
    """As ``run`` does: tiny models are fastest, and least disturbed by a busy machine, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small_scorer():
    return SuiteScorer(suite()[:64])


def test_curriculum_and_carry_schedules():
    cfg = E.Config(curriculum_digits=3, curriculum_steps=800, carry_start=0.8, carry_end=0.2, carry_steps=100)
    caps = [E.max_digits(cfg, t) for t in range(1, 1001)]
    assert caps[0] == 3 and caps[-1] == 10 and caps == sorted(caps)
    assert caps.index(10) + 1 == 1 + 7 * 800 // 8  # the cap reaches 10 after 7/8 of the rise (8 levels)
    assert E.carry_fraction(cfg, 1) == 0.8 and E.carry_fraction(cfg, 51) == pytest.approx(0.5)
    assert E.carry_fraction(cfg, 101) == pytest.approx(0.2) and E.carry_fraction(cfg, 5000) == pytest.approx(0.2)
    assert E.max_digits(E.Config(curriculum_steps=0), 1) == 10


def test_a_warmup_not_given_follows_steps():
    """7.5 % of --steps, at most the seed's 1,000 (of 60,000): --quick's 4,000 steps warm up for 300, and a
    short run needs no --warmup-steps of its own."""
    assert E.Config().warmup_steps == 1000 and build_config(E, True, {}).warmup_steps == 300
    assert build_config(E, True, {"steps": 200}).warmup_steps == 15 and E.Config(steps=10).warmup_steps == 0
    assert E.Config(steps=200, warmup_steps=3).warmup_steps == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(optimizers="adagrad"), "unknown optimizer 'adagrad'; valid: sgd, momentum, nesterov"),
        (dict(optimizers="muon"), "unknown optimizer 'muon'"),
        (dict(params_budget=10), "--params-budget=10 is below the smallest model"),
        (dict(seeds=(1, 1)), "repeats a seed"),
        (dict(carry_start=1.5), "--carry-start=1.5 must be a fraction"),
        (dict(steps=100, warmup_steps=100), "--warmup-steps=100 must be < --steps=100"),
        (dict(clip=float("inf")), "--clip=inf must be a finite number > 0"),
        (dict(weight_decay=float("inf")), "--weight-decay=inf must be a finite number >= 0"),
        (dict(threads=10**10), r"--threads=10000000000 must be an integer from 1 to \d+ \(4 per CPU"),
    ],
)
def test_bad_config_is_a_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        E.Config(**kwargs)


def test_budget_picks_the_largest_preset_that_fits():
    for budget in (60, 100, 10_000):
        name, cfg = E.preset_for_budget(budget)
        n = E.count_parameters(E.AdderModel(cfg))
        assert n <= budget
        assert all(
            E.count_parameters(E.AdderModel(c)) <= n
            for c in E.PRESETS.values()
            if E.count_parameters(E.AdderModel(c)) <= budget
        )


ADAMW = E.RunSpec("adamw", "adamw", 0.02)


def checkpoint_state(run_dir, seed=1, label="adamw"):
    return runs.load_checkpoint(E.checkpoint_path(run_dir, label, seed))


def train(cfg, run_dir, scorer, seed=1, spec=ADAMW):
    _, model_cfg = E.preset_for_budget(100)
    return E.train_seed(cfg, spec, model_cfg, seed, run_dir, scorer)


def test_the_monitor_records_every_parameter(tmp_path, small_scorer):
    train(E.Config(**TINY), tmp_path, small_scorer)
    monitored = [r for r in runs.read_jsonl(tmp_path / runs.METRICS) if "params" in r]
    assert [r["step"] for r in monitored] == [1, 10, 20, 30, 40]
    _, model_cfg = E.preset_for_budget(100)
    trainable = {name for name, p in E.AdderModel(model_cfg).named_parameters() if p.requires_grad}
    for record in monitored:
        assert record["seed"] == 1 and record["run"] == "adamw" and set(record["params"]) == trainable
        assert all(entry["u"] > 0 and "eff_lr" in entry for entry in record["params"].values())
    suite = [r for r in runs.read_jsonl(tmp_path / runs.METRICS) if "suite_correct" in r]
    assert [r["step"] for r in suite] == [0, 20, 40]


def test_a_non_finite_loss_stops_the_run_and_keeps_its_checkpoint(tmp_path, small_scorer, monkeypatch):
    real_loss, calls = E.loss_on, {"n": 0}

    def loss_going_bad(*args):
        calls["n"] += 1
        loss = real_loss(*args)
        return loss * float("nan") if calls["n"] == 25 else loss

    monkeypatch.setattr(E, "loss_on", loss_going_bad)
    history = train(E.Config(**TINY), tmp_path, small_scorer)
    assert history["status"] == "diverged" and history["divergence"]["step"] == 25
    saved = checkpoint_state(tmp_path)
    assert saved["step"] == 20 and saved["history"]["status"] == "diverged"
    assert all(torch.isfinite(t).all() for t in saved["training"]["model"].values())
    assert history["report"]["cases"] == 10_010  # the best checkpoint is still scored


def test_a_blown_up_run_is_recorded_as_diverged(tmp_path, capsys):
    """The issue's reproduction: SGD at lr 1000 used to abort with a bad-input error and no results."""
    out = tmp_path / "run"
    argv = ["run", "adder", "--out", str(out), "--quick", "--steps", "200", "--warmup-steps", "10"]
    argv += ["--eval-every", "100", "--optimizers", "sgd@1000", "--quiet"]
    assert cli.main(argv) == cli.EXIT_DIVERGED
    run = runs.read_json(out / runs.RESULTS)["runs"][0]
    assert run["status"] == "diverged" and run["divergence"]["step"] <= 200 and run["divergence"]["reason"]
    assert len(list((out / runs.FIGURES).glob("*.png"))) == 2


def test_early_stop_at_a_perfect_score(tmp_path, small_scorer, monkeypatch):
    scores = iter([0, small_scorer.cases])  # untrained, then perfect at the first evaluation
    monkeypatch.setattr(small_scorer, "correct", lambda model: next(scores))
    history = train(E.Config(**TINY), tmp_path, small_scorer, seed=3)
    assert history["step"] == 20 and history["best_step"] == 20
    assert E.checkpoint_path(tmp_path, "adamw", 3, "-best").exists()


@pytest.mark.parametrize("optimizer", E.OPTIMIZERS)
def test_every_optimizer_trains(tmp_path, small_scorer, optimizer):
    cfg = E.Config(**dict(TINY, steps=10, eval_every=10))
    history = train(cfg, tmp_path, small_scorer, spec=E.RunSpec(optimizer, optimizer, 1e-3))
    assert history["step"] == 10 and history["train"]["step"] == [1, 10] and history["train"]["loss"][-1] < 10


def test_cli_two_optimizers_two_seeds_then_plot(tmp_path):
    out = tmp_path / "run"
    argv = ["run", "adder", "--out", str(out), "--seeds", "1,2", "--steps", "30", "--eval-every", "15"]
    argv += ["--warmup-steps", "5", "--curriculum-steps", "10", "--carry-steps", "10", "--quiet"]
    assert cli.main([*argv, "--optimizers", "adamw,nesterov@0.01"]) == 0
    results = runs.read_json(out / runs.RESULTS)
    assert [(r["label"], r["seed"]) for r in results["runs"]] == [
        ("adamw", 1),
        ("adamw", 2),
        ("nesterov@0.01", 1),
        ("nesterov@0.01", 2),
    ]
    assert results["success"]["adamw"]["tried"] == 2 and results["success"]["nesterov@0.01"]["tried"] == 2
    assert results["params"] == results["explain"]["params"] <= 100
    assert sum(r["params"] for r in results["explain"]["budget"]) == results["params"]
    for record in results["runs"]:
        assert record["report"]["cases"] == 10_010 and record["correct"] == record["report"]["correct"]
    assert len(results["explain"]["example"]["attention"][0]) == 32
    boards = sorted(p.name for p in (out / runs.TENSORBOARD).iterdir())  # one event folder per run
    assert boards == ["adamw-seed-1", "adamw-seed-2", "nesterov@0.01-seed-1", "nesterov@0.01-seed-2"]
    figures = sorted(p.name for p in (out / runs.FIGURES).iterdir())
    assert figures == ["adder_explainer.png", "adder_training.png"]
    (out / runs.FIGURES / "adder_training.png").unlink()
    assert cli.main(["plot", str(out)]) == 0
    assert (out / runs.FIGURES / "adder_training.png").exists()


def test_explain_reads_the_model():
    torch.manual_seed(0)
    _, cfg = E.preset_for_budget(100)
    model = E.AdderModel(cfg)
    ex = E.explain(model, 1_234_567_890, 9_876_543_210)
    assert ex["params"] == sum(r["params"] for r in ex["budget"]) == E.count_parameters(model)
    assert ex["example"]["answer"] == add(model, 1_234_567_890, 9_876_543_210)
    attention = torch.tensor(ex["example"]["attention"])
    assert attention.shape == (cfg.n_heads, 32, 32)
    torch.testing.assert_close(attention.sum(-1), torch.ones(cfg.n_heads, 32))
    assert ex["example"]["tokens"][:22] == list("0987654321+0123456789=")
    assert torch.equal(torch.tensor(ex["token_vectors"]), model.token.digits().detach())
    assert len(ex["norm_gains"]) == 3 and len(ex["norm_gains"][0]) == 11
    assert sum(ex["component_totals"].values()) == ex["params"] and len(ex["routing"]) == cfg.n_heads


def test_the_first_step_of_the_run_is_the_trainees(tmp_path, small_scorer):
    """The loss of seed 1's first step (the monitor's record at step 1) is the trainee's loss on its first batch at
    its weights: suggest-lr probes the model, the batches and the order this experiment trains on."""
    cfg = E.Config(**dict(TINY, steps=3, warmup_steps=1, eval_every=3, log_every=1, params_budget=100))
    first = train(cfg, tmp_path, small_scorer)["train"]["loss"][0]
    trainee = E.trainee(cfg, ADAMW)
    with torch.no_grad():
        assert float(trainee.loss_fn(trainee.model, next(iter(trainee.batches)))) == pytest.approx(first, rel=1e-6)
    assert (trainee.steps, trainee.batch_size, trainee.weight_decay) == (3, cfg.batch_size, cfg.weight_decay)
    assert E.OBJECTIVES["train_loss"].read({"runs": [{"train": {"loss": [2.0, 1.5]}}]}) == 1.5
