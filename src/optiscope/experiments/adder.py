"""Experiment ``adder``: the smallest transformers we can train to add two ten-digit numbers.

For each optimizer and seed: build the model the parameter budget picks, train it (``optiscope.train``)
with teacher forcing on batches whose planted carry chains fade out (carry mixing) and, if asked, whose
digit length grows (curriculum; off by default, it hurt: see the README), both on fixed step schedules;
score the whole 10,010-case suite every ``eval_every`` steps and stop at 10,010/10,010. Every evaluation
also writes a checkpoint, so ``--resume`` continues a killed run bit-exactly. A run whose loss or
gradients stop being finite is recorded as diverged, like the ``lm`` experiment's. ``results.json`` keeps
every run's outcome, the success rate per optimizer, the training curves and, for the best model,
everything the explainer figure draws (weights, an attention pattern on a real example, the parameter
budget, the measured accuracy).

Scoring during training uses ``SuiteScorer``'s single teacher-forced pass (the same count as greedy
decoding; see there); the reported numbers are re-measured by greedy decoding, the challenge's way.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from rich.console import Console

from .. import runs, train
from ..data import addition
from ..data.addition import ANSWER_DIGITS, N_DIGITS, TOKEN_NAMES, from_digits, prompt_tokens, to_digits, training_batch
from ..models.adder import AdderConfig, AdderModel, count_parameters, parameter_budget
from ..models.adder_challenge import SuiteScorer, build_model, evaluate, greedy_answer
from ..monitor import DivergenceGuard, Monitor, run_directory_sinks
from ..optim import RECIPES, as_lambda_lr, build_optimizer, warmup_cosine
from ..optim.recipes import RunSpec, parse_runs, recipe
from ..runs import checkpoint_name
from ..train.loop import new_history
from ..train.progress import Progress
from . import (
    NO_EFFECT,
    ConfigError,
    Objective,
    Trainee,
    flag,
    only_run,
    optimizers_help,
    require,
    require_counts,
    require_non_negative,
    require_positive,
    require_threads,
    torch_threads,
)

SUMMARY = "tiny transformers that add 10-digit numbers: trained, scored on the 10,010-case suite, explained"

#: Every recipe but plain Muon, which cannot take the model's vectors and scalars.
OPTIMIZERS = tuple(name for name in RECIPES if name != "muon")
DEFAULT_LR = 0.02

# The architectures ``--params-budget`` chooses from (README, "Experiment adder", has what each achieved).
# "two-head": routing by two heads that share one Q/K matrix and differ by their learned phase (one reads
# place i + 1, the other place i and the digit just written), on a frozen 11-place spiral where EQUALS
# is place −1. "microadder": one head and MicroAdder's learned EQUALS/CARRY points. "roomy": per-head
# Q/K, rank-3 values read from the whole residual, FFN 16: many times larger, and quick to train.
_SPIRAL = dict(turn=11, learned_points=False, spiral=(2.0, 0.0, 0.1, -0.45))
PRESETS: dict[str, AdderConfig] = {
    "microadder": AdderConfig(),
    "two-head": AdderConfig(n_heads=2, qk_per_head=False, ffn_width=4, ffn_bias=True, norm="unit", **_SPIRAL),
    "roomy": AdderConfig(
        n_heads=2, attn_rank=3, v_source="all", ffn_width=16, ffn_bias=True, norm="separate", **_SPIRAL
    ),
}


def preset_sizes() -> dict[str, int]:
    """Each preset's parameter count, measured on the module."""
    return {name: count_parameters(AdderModel(cfg)) for name, cfg in PRESETS.items()}


def preset_for_budget(budget: int) -> tuple[str, AdderConfig]:
    """The largest preset whose parameter count is within ``budget``."""
    sizes = preset_sizes()
    fitting = [name for name, n in sizes.items() if n <= budget]
    if not fitting:
        raise ConfigError(f"--params-budget={budget} is below the smallest model ({min(sizes.values())} parameters)")
    name = max(fitting, key=sizes.get)
    return name, PRESETS[name]


@dataclass
class Config:
    params_budget: int = field(
        default=100,
        metadata={
            "help": "largest parameter count allowed; picks the largest model that fits: "
            + ", ".join(f"{name} ({n})" for name, n in preset_sizes().items())
        },
    )
    optimizers: str = field(
        default="adamw",
        metadata={"help": optimizers_help(f"runs as optimizer[@lr] (lr {DEFAULT_LR:g} if not given)", OPTIMIZERS)},
    )
    seed: int = field(default=1, metadata={"help": "the seed, when --seeds is not given"})
    seeds: tuple[int, ...] = field(default=(), metadata={"help": "several seeds, e.g. 1,2,3,4,5"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine decays to η × this (a ratio)"})
    warmup_steps: int | None = field(
        default=None, metadata={"help": "warmup steps (default: 7.5 % of --steps, at most 1000)", "follows": "--steps"}
    )
    weight_decay: float = field(default=0.01, metadata={"help": "λ, for the optimizers that decay"})
    clip: float = field(default=1.0, metadata={"help": "largest global gradient L2 norm (clipped above it)"})
    batch_size: int = field(default=256, metadata={"help": "additions per batch"})
    steps: int = field(default=60_000, metadata={"help": "training steps per seed (early stop at 10,010/10,010)"})
    curriculum_digits: int = field(
        default=3, metadata={"help": "operand length cap at step 1, in digits (grows to 10)"}
    )
    curriculum_steps: int = field(default=0, metadata={"help": "steps over which the cap grows to 10 (0: off)"})
    carry_start: float = field(default=0.8, metadata={"help": "fraction of carry-chain examples at step 1"})
    carry_end: float = field(default=0.2, metadata={"help": "fraction of carry-chain examples after --carry-steps"})
    carry_steps: int = field(default=30_000, metadata={"help": "steps over which the fraction fades linearly"})
    eval_every: int = field(default=1_000, metadata={"help": "score the suite and checkpoint every N steps"})
    log_every: int = field(
        default=100, metadata={"help": "the monitor's record (mean loss, g, w, u, u/w, ...) every N steps"}
    )
    threads: int = field(default=1, metadata={"help": "torch CPU threads (tiny models run best on one)", **NO_EFFECT})
    quiet: bool = field(default=False, metadata={"help": "print nothing while training", **NO_EFFECT})
    verbose: bool = field(default=False, metadata={"help": "per-parameter tables at evaluations", **NO_EFFECT})

    def __post_init__(self) -> None:
        require_counts(self, "params_budget", "batch_size", "steps", "eval_every", "log_every")
        require_threads(self)
        if self.warmup_steps is None:  # follows --steps, so that a short run needs no --warmup-steps of its own
            self.warmup_steps = min(1000, self.steps * 3 // 40)
        require_counts(self, "warmup_steps", "curriculum_steps", "carry_steps", minimum=0)
        require(self.warmup_steps < self.steps, f"--warmup-steps={self.warmup_steps} must be < --steps={self.steps}")
        runs_of(self)
        require(0 <= self.min_lr_ratio <= 1, f"--min-lr-ratio={self.min_lr_ratio} must be in [0, 1]")
        require_non_negative(self, "weight_decay")
        require_positive(self, "clip")
        require(
            1 <= self.curriculum_digits <= N_DIGITS,
            f"--curriculum-digits={self.curriculum_digits} must be in 1 … {N_DIGITS}",
        )
        for name in ("carry_start", "carry_end"):
            value = getattr(self, name)
            require(0 <= value <= 1, f"{flag(name)}={value} must be a fraction in [0, 1]")
        require(len(set(self.seed_list)) == len(self.seed_list), f"--seeds={self.seeds} repeats a seed")
        preset_for_budget(self.params_budget)

    @property
    def seed_list(self) -> tuple[int, ...]:
        return tuple(self.seeds) or (self.seed,)


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    return parse_runs(config.optimizers, DEFAULT_LR, OPTIMIZERS)


QUICK = dict(params_budget=300, steps=4_000, carry_steps=2_000, eval_every=500)


class Evaluation(TypedDict):
    step: int
    correct: int


class RunResults(TypedDict):
    label: str
    optimizer: str
    lr: float
    setting: str
    seed: int
    status: str
    divergence: dict[str, Any] | None
    perfect: bool
    correct: int
    best_step: int
    steps: int
    cpu_minutes: float
    wall_minutes: float
    report: dict[str, Any]
    train: dict[str, list[float]]
    evals: list[Evaluation]


class Results(TypedDict):
    status: str
    preset: str
    params: int
    cases: int
    runs: list[RunResults]
    success: dict[str, dict[str, float]]
    best: dict[str, Any]
    explain: dict[str, Any]


#: What ``optiscope sweep adder`` tunes for: the first evaluation step at 10,010/10,010 (a run that never
#: gets there has no value: the worst), or the wrong answers of the best checkpoint (greedy decoding).
OBJECTIVES = {
    "steps_to_perfect": Objective(
        "steps to 10,010/10,010",
        "min",
        lambda results: only_run(results["runs"])["best_step"] if only_run(results["runs"])["perfect"] else None,
    ),
    "wrong": Objective(
        "wrong answers of the best checkpoint",
        "min",
        lambda results: results["cases"] - only_run(results["runs"])["correct"],
    ),
    # fresh additions every step: the training loss of the last steps is the loss on unseen additions
    "train_loss": Objective(
        "mean training loss of the last --log-every steps",
        "min",
        lambda results: last(only_run(results["runs"])["train"]["loss"]),
    ),
}


def last(values: list[float]) -> float | None:
    """The last of ``values``; None when there is none (a run stopped before its first record)."""
    return values[-1] if values else None


# --------------------------------------------------------------------------------------- schedules
def max_digits(cfg: Config, step: int) -> int:
    """Operand length cap at ``step`` (1-based): curriculum_digits, rising evenly to 10."""
    if cfg.curriculum_steps == 0:
        return N_DIGITS
    rise = (N_DIGITS + 1 - cfg.curriculum_digits) * (step - 1) // cfg.curriculum_steps
    return min(N_DIGITS, cfg.curriculum_digits + rise)


def carry_fraction(cfg: Config, step: int) -> float:
    """Share of planted-carry-chain examples at ``step``: carry_start fading linearly to carry_end."""
    left = max(0.0, 1 - (step - 1) / cfg.carry_steps) if cfg.carry_steps else 0.0
    return cfg.carry_end + (cfg.carry_start - cfg.carry_end) * left


def batch_at(cfg: Config, step: int, data: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of step ``step`` (1-based), drawn from ``data``: its digit cap and carry-chain share."""
    return training_batch(cfg.batch_size, max_digits(cfg, step), carry_fraction(cfg, step), data)


# -------------------------------------------------------------------------------------------- loss
def loss_on(model: AdderModel, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the 11 answer digits (teacher forcing)."""
    logits = model.scores(inputs, ANSWER_DIGITS)  # (10, B, 11)
    return F.cross_entropy(logits.transpose(0, 1), targets)


# -------------------------------------------------------------------------------------------- train
def checkpoint_path(run_dir: Path, label: str, seed: int, kind: str = "") -> Path:
    """``checkpoints/<label>-seed-<seed>.pt`` (training state) or ``…-best.pt`` (the best model)."""
    return Path(run_dir) / runs.CHECKPOINTS / checkpoint_name(f"{label}-seed-{seed}{kind}")


class Addition(train.Task):
    """Teacher-forced answers of fresh additions; the suite scored at every evaluation."""

    def __init__(
        self, config: Config, model_cfg: AdderConfig, scorer: SuiteScorer, run_dir: Path, label: str, seed: int
    ):
        self.config, self.model_cfg, self.scorer = config, model_cfg, scorer
        self.run_dir, self.label, self.seed = run_dir, label, seed
        self.best_path = checkpoint_path(run_dir, label, seed, "-best")

    def batch(self, step: int, data: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_at(self.config, step, data)

    def loss(self, net: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return loss_on(net, *batch)

    def evaluate(self, run: train.Run) -> bool:
        """Score the suite; keep the model if it is the best so far; True at 10,010/10,010."""
        correct, history = self.scorer.correct(run.model), run.history
        history["evals"].append({"step": run.step, "correct": correct})
        record = {"run": self.label, "seed": self.seed, "step": run.step, "suite_correct": correct}
        runs.append_jsonl(self.run_dir / runs.METRICS, record)
        if correct > history["best"]:
            history["best"], history["best_step"] = correct, run.step
            best = {
                "model_config": dataclasses.asdict(self.model_cfg),
                "model": run.model.state_dict(),
                "step": run.step,
            }
            runs.save_checkpoint(self.best_path, best)
        return correct == self.scorer.cases

    def finish(self, run: train.Run) -> None:
        """The best checkpoint scored again the challenge's way, by greedy decoding."""
        run.history["report"] = evaluate(build_model(self.best_path)[0])

    def summary(self, run: train.Run) -> str:
        h = run.history
        ending = "finished" if h["status"] == "ok" else f"diverged at step {h['divergence']['step']}"
        return (
            f"{run.label}: {ending}; {h['report']['correct']:,}/{self.scorer.cases:,} exact by greedy decoding "
            f"(best checkpoint, step {h['best_step']:,}), {h['step']:,} steps, "
            f"{h['seconds']['cpu'] / 60:.1f} CPU minutes"
        )


def train_seed(
    config: Config, spec: RunSpec, model_cfg: AdderConfig, seed: int, run_dir: Path, scorer: SuiteScorer, progress=None
) -> dict[str, Any]:
    """Train one optimizer on one seed to the end of its schedule or to 10,010/10,010; returns its history."""
    torch.manual_seed(seed)
    model = AdderModel(model_cfg)
    optimizer = build_optimizer(spec.optimizer, model, spec.lr, config.weight_decay)
    schedule = warmup_cosine(spec.lr, config.steps, config.warmup_steps, spec.lr * config.min_lr_ratio)
    console = Console(soft_wrap=True) if config.verbose else None
    sinks = run_directory_sinks(run_dir, f"{spec.label}-seed-{seed}", console=console, console_every=config.eval_every)
    # The guard asks for 10x the first loss as well as 4x the lowest: these tiny models spike and recover
    # (with the default rule, seeds 1-3 of the 90-parameter model tripped at steps 1.1K-2.5K on spikes to
    # 2.8-4.2 above a lowest 0.35-0.50, and went on to 10,010/10,010 without the guard).
    monitor = Monitor(
        model,
        optimizer,
        every=config.log_every,
        sinks=sinks,
        batch_tokens=config.batch_size * ANSWER_DIGITS,
        guard=DivergenceGuard(first_factor=10),
        context={"run": spec.label, "seed": seed},
    )
    history = new_history(evals=[], best=-1, best_step=0)
    data = torch.Generator().manual_seed(1_000_003 * seed)
    run = train.Run(
        f"{spec.label} seed {seed}", model, optimizer, data, as_lambda_lr(optimizer, schedule), monitor, history
    )
    plan = train.Plan(
        config.steps, config.clip, config.eval_every, eval_at_start=True, checkpoint_every=config.eval_every
    )
    task = Addition(config, model_cfg, scorer, Path(run_dir), spec.label, seed)
    return train.train(run, task, plan, checkpoint_path(run_dir, spec.label, seed), progress=progress)


def trainee(config: Config, spec: RunSpec) -> Trainee:
    """What a learning-rate suggestion probes for ``spec``'s optimizer: the model, loss and batches of its first seed's
    run (its model, drawn from the seed; its batches, in order)."""
    seed = config.seed_list[0]
    _, model_cfg = preset_for_budget(config.params_budget)  # before the seed: it builds every preset to size it
    torch.manual_seed(seed)
    model = AdderModel(model_cfg)
    data = torch.Generator().manual_seed(1_000_003 * seed)
    return Trainee(
        model=model,
        loss_fn=lambda net, batch: loss_on(net, *batch),
        batches=(batch_at(config, step, data) for step in range(1, config.steps + 1)),
        steps=config.steps,
        batch_size=config.batch_size,
        weight_decay=config.weight_decay,
    )


# ------------------------------------------------------------------------------------------ explain
@torch.no_grad()
def explain(model: AdderModel, a: int, b: int) -> dict:
    """Everything the explainer figure shows, read from the model: weights, derived geometry, and
    the attention pattern while it adds ``a + b`` (its own greedy answer fed back)."""
    model.eval()
    prompt = prompt_tokens(to_digits(torch.tensor([a])), to_digits(torch.tensor([b])))
    answer = greedy_answer(model, prompt)[0]
    tokens = torch.cat([prompt[0], answer[:-1]])[None]
    cfg = model.cfg
    digits = model.token.digits()
    norm = model.norm.weight
    budget = parameter_budget(model)
    totals: dict[str, int] = defaultdict(int)
    for row in budget:
        totals[row["component"]] += row["params"]
    attention = model.attention_pattern(tokens)[:, 0]
    return {
        "config": dataclasses.asdict(cfg),
        "params": count_parameters(model),
        "budget": budget,
        "component_totals": dict(totals),
        "routing": [
            addition.routing_summary(attention[h], addition.position_labels()) for h in range(attention.shape[0])
        ],
        "weights": {name: t.tolist() for name, t in model.state_dict().items() if t.dtype.is_floating_point},
        "token_vectors": digits.tolist(),
        "positions": model.positions.table().tolist(),
        "position_labels": addition.position_labels(),
        "norm_weights": None if norm is None else norm.tolist(),
        # 1/RMS of the residual where each norm reads it, at the 11 positions that write answer digits
        "norm_gains": [(x.pow(2).mean(0) + model.norm.eps).rsqrt()[0].tolist() for x in model.residuals(tokens, 11)],
        "digit_values": torch.einsum("hrc,dc->hrd", model.attention.value, digits).tolist()
        if cfg.v_source == "tok"
        else None,
        "example": {
            "a": a,
            "b": b,
            "answer": int(from_digits(answer)),
            "tokens": [TOKEN_NAMES[t] for t in tokens[0].tolist()],
            "attention": attention.tolist(),
        },
    }


# ---------------------------------------------------------------------------------------------- run
def run(config: Config, run_dir: Path) -> Results:
    with torch_threads(config.threads):
        return train_and_report(config, Path(run_dir))


def train_and_report(config: Config, run_dir: Path) -> Results:
    """Every optimizer on every seed, each best checkpoint scored by greedy decoding, the best one explained."""
    preset, model_cfg = preset_for_budget(config.params_budget)
    scorer = SuiteScorer()
    progress = Progress(enabled=not config.quiet)
    records: list[RunResults] = []
    for spec in runs_of(config):
        for seed in config.seed_list:
            h = train_seed(config, spec, model_cfg, seed, run_dir, scorer, progress)
            kept = {k: h[k] for k in ("status", "divergence", "best_step", "report", "train", "evals")}
            record = dict(label=spec.label, optimizer=spec.optimizer, lr=spec.lr, seed=seed, steps=h["step"], **kept)
            record.update(setting=recipe(spec.optimizer).describe(), correct=h["report"]["correct"])
            record.update(perfect=record["correct"] == scorer.cases, cpu_minutes=h["seconds"]["cpu"] / 60)
            records.append({**record, "wall_minutes": h["seconds"]["total"] / 60})
    best = max(records, key=lambda r: (r["correct"], -r["best_step"]))
    best_model, _ = build_model(checkpoint_path(run_dir, best["label"], best["seed"], "-best"))
    tried: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        tried[record["label"]].append(record["perfect"])
    return {
        "status": "diverged" if all(r["status"] == "diverged" for r in records) else "ok",
        "preset": preset,
        "params": count_parameters(best_model),
        "cases": scorer.cases,
        "runs": records,
        "success": {k: {"perfect": sum(v), "tried": len(v), "rate": sum(v) / len(v)} for k, v in tried.items()},
        "best": {"label": best["label"], "seed": best["seed"]},
        "explain": explain(best_model, 1_234_567_890, 9_876_543_210),
    }
