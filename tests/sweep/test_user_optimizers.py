"""A user's optimizer in `run` and `sweep` (local pool and Ray): a dotted path or a recipe of --recipes runs the
class it names, so a trial's descent on the ravine equals the same optimizer built by hand and stepped on
f = ½(x² + κy²) here; a bad spec is one line and exit 2, before anything runs."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from optiscope import cli, experiments, figures, runs
from optiscope.optim import recipes
from optiscope.sweep import SweepConfig, run_sweep

#: a landscapes run small enough for a test: the ravine at κ = 10 is reached within the steps at η ~ 0.01
SMALL = {"steps": 600, "tolerance": 1e-2, "condition_number": 10.0, "bias_steps": 10, "decay_steps": 10}
SMALL_ARGS = [a for k, v in SMALL.items() for a in (f"--{k.replace('_', '-')}", str(v))]

SIGN_DESCENT = """
import torch


class SignDescent(torch.optim.Optimizer):
    def __init__(self, params, lr=0.01, scale=1.0):
        super().__init__(params, {"lr": lr, "scale": scale})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"] * group["scale"])
"""

RECIPES_FILE = """
[recipes.soap]
class = "pytorch_optimizer.SOAP"
decays = true
options = { betas = [0.95, 0.95] }

[recipes.half-sign]
class = "myopts.SignDescent"
lr = 0.01
options = { scale = 0.5 }
"""


def sign_descent(params, lr, scale=1.0):
    """θ ← θ − η·scale·sign(g), written here: the oracle of myopts.SignDescent."""

    class Oracle(torch.optim.Optimizer):
        def __init__(self):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                p -= lr * scale * p.grad.sign()

    return Oracle()


def by_hand(name, lr):
    """Each optimizer as a user builds it, from its own library: (params) -> optimizer."""
    import pytorch_optimizer

    return {
        "torch.optim.NAdam": lambda p: torch.optim.NAdam(p, lr=lr),
        "soap": lambda p: pytorch_optimizer.SOAP(p, lr=lr, betas=(0.95, 0.95), weight_decay=0.01),  # λ: landscapes'
        "myopts.SignDescent": lambda p: sign_descent(p, lr),
        "half-sign": lambda p: sign_descent(p, lr, scale=0.5),
    }[name]


def ravine(build, start, steps, tolerance, kappa):
    """Descend f = ½(x² + κy²) from ``start`` with ``build([θ])``: (the first step at f ≤ tolerance, θ there)."""
    theta = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    optimizer = build([theta])
    for t in range(1, steps + 1):
        optimizer.zero_grad()
        (0.5 * (theta[0] ** 2 + kappa * theta[1] ** 2)).backward()
        optimizer.step()
        with torch.no_grad():
            if 0.5 * (theta[0] ** 2 + kappa * theta[1] ** 2) <= tolerance:
                return t, theta.tolist()
    return None, theta.tolist()


def assert_ravine_runs_as_by_hand(results, name, lr):
    surface = results["surfaces"]["ravine"]
    (run,) = [r for r in surface["runs"].values() if r["optimizer"] == name and r["grid"][0]["lr"] == lr]
    reached, end = ravine(by_hand(name, lr), surface["start"], SMALL["steps"], SMALL["tolerance"], 10.0)
    assert run["reached_at"] == reached, (name, lr)
    if reached is not None:
        assert run["end"] == pytest.approx(end, rel=1e-9, abs=1e-12), (name, lr)
    return reached is not None


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """myopts.py and recipes.toml in tmp_path, the module importable here and in spawned workers (sys.path) and
    in Ray's (PYTHONPATH); the recipes registered by the test alone."""
    (tmp_path / "myopts.py").write_text(SIGN_DESCENT)
    (tmp_path / "recipes.toml").write_text(RECIPES_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(recipes, "_registered", {})
    yield tmp_path
    sys.modules.pop("myopts", None)


def test_run_takes_dotted_paths_and_recipes_and_runs_what_they_name(user_files, capsys):
    out = user_files / "run"
    optimizers = "torch.optim.NAdam@0.1,myopts.SignDescent@0.01,soap@0.03,half-sign@0.02"
    argv = ["run", "landscapes", "--out", str(out), "--recipes", str(user_files / "recipes.toml")]
    assert cli.main([*argv, "--optimizers", optimizers, *SMALL_ARGS]) == 0, capsys.readouterr().err
    results = runs.read_json(out / "results.json")
    # named as the user did, in results (and so in figures and the report)
    assert list(results["surfaces"]["ravine"]["runs"]) == optimizers.split(",")
    assert results["surfaces"]["ravine"]["runs"]["soap@0.03"]["setting"] == (
        "pytorch_optimizer.optimizer.soap.SOAP(lr=η, betas=(0.95, 0.95), weight_decay=λ)"
    )
    for name, lr in [("torch.optim.NAdam", 0.1), ("myopts.SignDescent", 0.01), ("soap", 0.03), ("half-sign", 0.02)]:
        assert assert_ravine_runs_as_by_hand(results, name, lr)


def test_a_run_with_recipes_resumes_without_them(user_files, monkeypatch, capsys):
    """config.json records the user's recipes that the run's optimizers name, so ``--resume`` needs no
    ``--recipes`` (it had said "unknown optimizer 'half-sign'") and runs the recipe it recorded, as built by hand;
    a resume whose --recipes makes the name another recipe is refused, naming --recipes."""
    out = user_files / "run"
    argv = ["run", "landscapes", "--out", str(out), "--optimizers", "half-sign@0.02,torch.optim.NAdam@0.1"]
    argv += SMALL_ARGS
    monkeypatch.setattr(figures, "draw_run", lambda run_dir, results=None: figures.Drawn([], []))  # not at stake
    assert cli.main([*argv, "--recipes", str(user_files / "recipes.toml")]) == 0, capsys.readouterr().err
    # the file's entry (read here with tomllib), soap left out: no run names it
    entry = tomllib.loads(RECIPES_FILE)["recipes"]["half-sign"]
    assert runs.read_json(out / "config.json")["config"]["recipes"] == {"half-sign": {**entry, "decays": False}}
    monkeypatch.setattr(recipes, "_registered", {})  # as in a new process
    (out / "results.json").unlink()  # the resume computes the results again
    assert cli.main([*argv, "--resume"]) == 0, capsys.readouterr().err
    assert assert_ravine_runs_as_by_hand(runs.read_json(out / "results.json"), "half-sign", 0.02)
    (user_files / "other.toml").write_text(RECIPES_FILE.replace("scale = 0.5", "scale = 0.25"))
    monkeypatch.setattr(recipes, "_registered", {})
    capsys.readouterr()
    assert cli.main([*argv, "--resume", "--recipes", str(user_files / "other.toml")]) == cli.EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the options differ from the stored run's (--recipes " in line, line


def test_the_console_script_finds_a_module_in_the_current_directory(tmp_path):
    """A console script's sys.path lacks the current directory (python -m has it): a module beside the command is
    still found."""
    (tmp_path / "myopts.py").write_text(SIGN_DESCENT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [str(Path(sys.executable).parent / "optiscope"), "run", "landscapes", "--out", "r"]
    done = subprocess.run(
        [*command, "--optimizers", "myopts.SignDescent@0.01", *SMALL_ARGS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert assert_ravine_runs_as_by_hand(runs.read_json(tmp_path / "r" / "results.json"), "myopts.SignDescent", 0.01)


@pytest.mark.parametrize(
    ("optimizers", "said"),
    [
        ("adam,torch.optim.NAdamm@0.1", "torch.optim has no 'NAdamm'; its optimizer classes: "),
        ("nosuchpackage.Opt@0.1", "no module named 'nosuchpackage'"),
        ("torch.nn.Linear@0.1", "'torch.nn.Linear' is not a torch.optim.Optimizer subclass"),
        ("soap", "unknown optimizer 'soap'; valid: "),  # no --recipes given
    ],
)
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_bad_spec_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, command, optimizers, said):
    out = tmp_path / "out"
    assert cli.main([command, "landscapes", "--out", str(out), "--optimizers", optimizers]) == cli.EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert said in line and not out.exists()


def test_a_bad_recipes_file_is_one_line_and_exit_2(user_files, capsys):
    (user_files / "bad.toml").write_text("[recipes.x]\nclass = 'torch.optim.NAdam'\noptions = { momentum = 0.9 }\n")
    for command in ("run", "sweep"):
        argv = [command, "landscapes", "--out", str(user_files / "o"), "--recipes", str(user_files / "bad.toml")]
        assert cli.main([*argv, "--optimizers", "x@0.1"]) == cli.EXIT_BAD_INPUT
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "bad.toml': [recipes.x]: torch.optim.nadam.NAdam takes no momentum; it takes: lr, betas" in line


def test_a_sweep_without_a_usual_lr_says_how_to_give_one(tmp_path, capsys):
    argv = ["sweep", "lm", "--out", str(tmp_path / "s"), "--optimizers", "adamw,torch.optim.NAdam"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'torch.optim.NAdam': lm has no usual learning rate for it; say where its grid starts" in line


def trials_run_as_by_hand(out):
    """Every trial of the sweep in ``out`` descended as its optimizer built by hand does; the optimizers named."""
    results = runs.read_json(out / "results.json")
    reached = set()
    for record in results["trials"]:
        trial = runs.read_json(out / record["dir"] / "results.json")
        if assert_ravine_runs_as_by_hand(trial, record["optimizer"], record["lr"]):
            reached.add(record["optimizer"])
    assert reached == set(results["optimizers"])  # each compared where it reached the minimum, not only diverged
    return results


def test_a_sweep_on_a_pool_runs_dotted_paths_and_recipes_in_its_workers(user_files, capsys):
    """The pool's workers are fresh processes: the recipes reach them with the trials, the module on sys.path."""
    out = user_files / "sweep"
    argv = ["sweep", "landscapes", "--out", str(out), "--recipes", str(user_files / "recipes.toml")]
    options = ["--optimizers", "myopts.SignDescent,half-sign", "--lrs", "0.01,0.02", "--seeds", "1", "--workers", "2"]
    assert cli.main([*argv, *options, *SMALL_ARGS]) == 0, capsys.readouterr().err
    results = trials_run_as_by_hand(out)
    assert set(results["optimizers"]) == {"myopts.SignDescent", "half-sign"}
    assert {p.name for p in (out / "trials").iterdir()} >= {"myopts.SignDescent@0.01", "half-sign@0.02"}
    recorded = runs.read_json(out / "config.json")["config"]["recipes"]
    assert recorded == {
        "half-sign": {"class": "myopts.SignDescent", "decays": False, "options": {"scale": 0.5}, "lr": 0.01}
    }
    recipes._registered.clear()  # as in a new process: the recorded recipes resume the sweep without --recipes
    assert cli.main([*argv[:-2], *options, *SMALL_ARGS, "--resume"]) == 0, capsys.readouterr().err


def test_a_sweep_on_ray_runs_dotted_paths_and_recipes_in_its_workers(user_files, monkeypatch, one_ray_at_a_time):
    ray = pytest.importorskip("ray")
    recipes.load_recipes(user_files / "recipes.toml")
    monkeypatch.chdir(user_files)
    config = SweepConfig(
        "landscapes", ("torch.optim.NAdam@0.1", "soap@0.01"), seeds=1, options=SMALL, backend="ray", workers=2
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_sweep(config, user_files / "ray")
    finally:
        ray.shutdown()
    results = trials_run_as_by_hand(user_files / "ray")
    assert results["optimizers"]["torch.optim.NAdam"]["centre_lr"] == 0.1  # @η: where its grid started


@pytest.mark.parametrize("name", sorted(experiments.EXPERIMENTS))
def test_every_experiment_takes_a_dotted_path_and_names_it_as_written(name):
    """Each experiment that takes --optimizers runs a generic optimizer too (ran whole: rare-tokens, landscapes,
    lm, adder, edge-of-stability and entropy, each with torch.optim.NAdam and pytorch_optimizer.SOAP)."""
    module = experiments.load(name)
    config = experiments.build_config(module, True, {"optimizers": "adam@0.01,torch.optim.NAdam@0.002"})
    specs = module.runs_of(config)
    assert [(s.label, s.optimizer, s.lr) for s in specs][-1] == ("torch.optim.NAdam@0.002", "torch.optim.NAdam", 0.002)
