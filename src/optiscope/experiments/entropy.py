"""Experiment ``entropy``: predict what one optimizer step does to a language model's entropy, and check it.

Seed 001's study, for any optimizer. Starting from a trained GPT (an ``lm`` run directory given with
``--checkpoint``, or one trained here), each optimizer first takes ``warm_steps`` real steps so that its
state (momentum, Adam's moments) is that of a running optimizer; then, for each of ``runs`` independent
draws, ``update_direction`` gives v = Δθ/lr of its next step on a training batch, and ``probe_step``
measures on E evaluation sequences the true change of mean next-token entropy ΔH(η) at θ + ηv over an η
grid of ``eta_decades`` decades around the optimizer's lr, against η·∇H·v and η·∇H·v + ½η²·vᵀ∇²Hv. The
same direction is probed for the validation loss, so each optimizer's entropy change can be set against
the loss decrease it buys. Subsets of the E sequences show how far a smaller evaluation batch can be
trusted. Every run's results keep the seed notebook's layout (``approx.*``, ``true.entries[].diagnostics``).

``--hf-model DIR`` probes a local 🤗 causal LM instead (``from_pretrained``; its own tokenizer encodes
the evaluation text and, on-policy, the prompts, which are left-padded and sampled from; only the
sampled tokens are scored). ``--lora-rank R`` wraps it with LoRA adapters first, so that the warm-up
steps and the probed step move the adapters only: seed 001's setting (LoRA on a pretrained LM, a few real
AdamW steps, the probe on-policy — the default mode with ``--lora-rank``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from rich.console import Console
from torch import Tensor, nn

from .. import runs, train
from ..checks import finite
from ..contracts import Positive
from ..data import CorpusError, load_corpus, sample_batch
from ..models import GPT
from ..models.pretrained import add_lora, context_length, load_causal_lm
from ..monitor.stats import loglog_fit
from ..optim import build_optimizer
from ..optim.recipes import RunSpec, parse_runs
from ..probe import prediction_curves, probe_step, sample_sequences, subset_errors, update_direction
from ..probe.probe import MODES
from ..train.distributed import Processes
from . import NO_EFFECT, ConfigError, execute, lm, optimizers_help, require, require_counts

SUMMARY = "One optimizer step's true vs predicted (linear, quadratic) change of a GPT's entropy and loss"
#: The lm run trained here when no --checkpoint is given lives in DIR/lm.
OWNS = ("lm",)


@dataclass
class Config:
    checkpoint: str | None = field(
        default=None,
        metadata={"help": "an `optiscope run lm` directory to probe (default: train one here)", "metavar": "DIR"},
    )
    checkpoint_run: str | None = field(
        default=None,
        metadata={
            "help": "which run of that directory, by its label (default: lowest final validation loss)",
            "metavar": "LABEL",
        },
    )
    optimizers: str = field(
        default="sgd,adam,adamw",
        metadata={"help": optimizers_help("directions to probe, as optimizer[@lr]", lm.DEFAULTS)},
    )
    hf_model: str | None = field(
        default=None,
        metadata={
            "help": "a local 🤗 causal-LM directory (from_pretrained) to probe instead of a GPT",
            "metavar": "DIR",
        },
    )
    lora_rank: int = field(
        default=0, metadata={"help": "with --hf-model: train and probe LoRA adapters of this rank (0: the full model)"}
    )
    mode: str | None = field(
        default=None,
        metadata={
            "help": "the sequences: fixed (held-out text) or policy (sampled from the model) (default: policy with "
            "--lora-rank, else fixed)"
        },
    )
    E: int = field(default=512, metadata={"help": "evaluation sequences per run"})
    runs: int = field(default=4, metadata={"help": "independent draws of sequences and step batch"})
    seq_len: int = field(default=64, metadata={"help": "tokens per evaluation sequence (<= the model's context)"})
    eta_decades: float = field(
        default=3.0, metadata={"help": "decades the η grid spans: lr·10^-d … lr·10 (d = this minus 1)"}
    )
    n_etas: int = field(default=7, metadata={"help": "η values per run (log-spaced)"})
    warm_steps: int = field(default=20, metadata={"help": "real steps each optimizer takes before it is probed"})
    subset_size: int = field(default=128, metadata={"help": "sequences per random subset"})
    subsets: int = field(default=500, metadata={"help": "random subsets per run"})
    subset_seed: int = field(default=42, metadata={"help": "seed of the random subsets"})
    train_steps: int = field(default=1000, metadata={"help": "steps of the GPT trained here when no --checkpoint"})
    train_layers: int = field(default=4, metadata={"help": "transformer blocks of the GPT trained here"})
    train_width: int = field(
        default=128, metadata={"help": "embedding width (n_embd), in channels, of the GPT trained here"}
    )
    text: str | None = field(
        default=None, metadata={"help": "UTF-8 text file to train it on (default: Shakespeare)", "metavar": "PATH"}
    )
    seed: int = field(
        default=0, metadata={"help": "seed of the GPT trained here, the warm-up steps and the sequences drawn"}
    )
    precision: str = field(
        default="float64",
        metadata={"help": "dtype of the probe: float64 (a float64 copy of the model) or model (its own)"},
    )
    quiet: bool = field(default=False, metadata={"help": "print nothing while working", **NO_EFFECT})

    def __post_init__(self) -> None:
        runs_of(self)
        if self.mode is None:
            self.mode = "policy" if self.lora_rank else "fixed"
        require(
            isinstance(self.lora_rank, int) and self.lora_rank >= 0,
            f"--lora-rank={self.lora_rank!r} must be an integer >= 0",
        )
        require(self.lora_rank == 0 or self.hf_model is not None, "--lora-rank needs --hf-model (a 🤗 model directory)")
        require(
            self.hf_model is None or self.checkpoint is None,
            "give either --hf-model or --checkpoint: one model is probed",
        )
        require(
            self.checkpoint is None or bool(self.checkpoint.strip()),
            "--checkpoint is empty; give an `optiscope run lm` directory",
        )
        require(
            self.checkpoint_run is None or self.checkpoint is not None,
            f"--checkpoint-run={self.checkpoint_run!r} names a run of --checkpoint's directory; give --checkpoint too",
        )
        require(
            self.checkpoint is None or self.text is None,
            f"--text={self.text!r} is what the GPT trained here learns; a --checkpoint run brings its own text",
        )
        require(self.mode in MODES, f"--mode={self.mode!r}; valid: {', '.join(MODES)}")
        require(self.precision in ("float64", "model"), f"--precision={self.precision!r}; valid: float64, model")
        counts = ("E", "runs", "seq_len", "subset_size", "subsets", "train_steps", "train_layers", "train_width")
        require_counts(self, *counts)
        require_counts(self, "warm_steps", minimum=0)
        require_counts(self, "n_etas", minimum=3)  # a slope needs points
        require(
            finite(self.eta_decades) and self.eta_decades >= 2,
            f"--eta-decades={self.eta_decades} must be a finite number >= 2 (the grid spans at least two decades)",
        )
        require(self.subset_size <= self.E, f"--subset-size={self.subset_size} must be <= --E={self.E}")


class Fit(TypedDict):
    slope: float
    intercept: float
    r2: float


class OptimizerResults(TypedDict):
    optimizer: str
    lr: Positive
    etas: list[Positive]
    runs: list[dict[str, Any]]
    fits: list[Fit]
    aggregate: dict[str, list[float]]
    real_step: dict[str, Any]


class Results(TypedDict):
    model: str
    parameters: int
    mode: str
    optimizers: dict[str, OptimizerResults]


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    return parse_runs(config.optimizers, lm.LEARNING_RATES)


QUICK = dict(
    E=64,
    runs=2,
    seq_len=32,
    n_etas=5,
    subset_size=16,
    subsets=200,
    train_steps=300,
    warm_steps=10,
    train_layers=2,
    train_width=64,
)


def eta_grid(lr: float, decades: float, n: int) -> list[float]:
    """n log-spaced step sizes from lr·10^(1−decades) to lr·10, plus η = lr (the real step) if not on it."""
    grid = lr * np.logspace(1 - decades, 1, n)
    if not np.any(np.isclose(grid, lr, rtol=1e-9)):
        grid = np.sort(np.append(grid, lr))
    return grid.tolist()


def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    return model(*batch)[1]


def causal_lm_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """The next-token cross-entropy of a 🤗 causal LM on (inputs, targets) windows."""
    x, y = batch
    logits = model(input_ids=x, use_cache=False).logits
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


@dataclass
class Subject:
    """What is probed: the model, the text it trains and is evaluated on, and how it takes a step."""

    model: nn.Module
    description: str
    lm_config: lm.Config  # block size, batch size, clip and weight decay of its steps
    data: lm.Corpus
    context: int  # the longest sequence the model takes
    loss_fn: Callable[[nn.Module, Any], Tensor]
    task: type[lm.LanguageModelling]  # its warm-up steps
    prompts: tuple[Tensor, Tensor] | None = None  # left-padded prompt ids and their mask, for policy mode


# ----------------------------------------------------------------------------------- the model
def trained_model(config: Config, run_dir: Path, console: Console) -> tuple[GPT, lm.Config, lm.Corpus, str]:
    """(model, its lm config, its corpus, a description): from --checkpoint, or trained here."""
    if config.checkpoint is None:
        lm_config = lm.Config(
            optimizers="adamw",
            steps=config.train_steps,
            eval_every=max(config.train_steps // 4, 1),
            checkpoint_every=config.train_steps,
            quiet=config.quiet,
            seed=config.seed,
            sample_tokens=40,
            text=config.text,
            n_layer=config.train_layers,
            prompts=lm.Config.prompts if config.text is None else (),
            n_embd=config.train_width,
            n_head=max(1, config.train_width // 32),
        )
        if not config.quiet:
            console.rule(f"[bold]training a GPT to probe ({config.train_steps} AdamW steps)")
        # resume=True: DIR/lm is either absent or this run's own model from before an interruption
        execute("lm", lm_config, run_dir / "lm", resume=True)
        source, label = run_dir / "lm", "adamw"
    else:
        source = Path(config.checkpoint)
        lm_config = stored_lm_config(source)
        label = config.checkpoint_run or _best_run(source)
    labels = [s.label for s in lm.runs_of(lm_config)]
    if label not in labels:
        raise ConfigError(f"--checkpoint-run={label!r}; the runs in {source} are {', '.join(labels)}")
    data = lm.load_data(lm_config)
    # the plain-ops attention: the probe would run fused attention on its math backend anyway (forward-mode AD
    # has no rule for the fused kernels), and this is the path the probe's tests check against
    model = GPT(replace(lm.model_config(lm_config, data.tokenizer.vocab_size), attention="math"))
    saved = train.load(lm.checkpoint_path(source, label), label)
    if saved["training"] is None:
        raise ConfigError(f"run {label!r} of {source} diverged before its first checkpoint: it has no model to probe")
    model.load_state_dict(saved["training"]["model"])
    return model, lm_config, data, f"{source} run {label}"


def stored_lm_config(source: Path) -> lm.Config:
    """The lm Config of the run directory ``source``, as its config.json stores it."""
    stored = runs.read_json(source / runs.CONFIG) if (source / runs.CONFIG).is_file() else None
    if not runs.is_run_config(stored):
        raise ConfigError(f"--checkpoint {source} holds no optiscope run; give an `optiscope run lm` directory")
    if stored["experiment"] != "lm":
        raise ConfigError(f"--checkpoint {source} holds a {stored['experiment']!r} run; give an `lm` run directory")
    known = {f.name for f in dataclasses.fields(lm.Config)}
    unknown = sorted(set(stored["config"]) - known)
    if unknown:
        raise ConfigError(
            f"--checkpoint {source} was written by another version of optiscope (options {unknown} are unknown); "
            "train it again with this version"
        )
    return lm.Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored["config"].items()})


def _best_run(source: Path) -> str:
    results = runs.read_json(source / runs.RESULTS)["runs"]
    finite = {k: r["final"]["val_loss"] for k, r in results.items() if math.isfinite(r["final"]["val_loss"])}
    if not finite:
        raise ConfigError(f"{source}: no run finished with a finite validation loss; pick one with --checkpoint-run")
    return min(finite, key=finite.get)


class WarmUp(lm.LanguageModelling):
    """The lm experiment's batches and loss, with nothing evaluated or recorded."""

    def evaluate(self, run: train.Run) -> bool:
        return False

    def finish(self, run: train.Run) -> None:
        """Nothing to add: a warm-up only leaves the optimizer's state behind."""


class PretrainedWarmUp(WarmUp):
    """Warm-up steps of a 🤗 causal LM (its output is a ``ModelOutput``, not the GPT's (logits, loss))."""

    def loss(self, net: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return causal_lm_loss(net, batch)


def warmed_optimizer(model: nn.Module, spec: RunSpec, subject: Subject, steps: int, seed: int):
    """The optimizer of ``spec`` after ``steps`` real steps of ``model`` (so it has a running optimizer's state)."""
    lm_config = subject.lm_config
    optimizer = build_optimizer(spec.optimizer, model, spec.lr, lm_config.weight_decay, decay_vectors=False)
    warm = train.Run(spec.label, model, optimizer, torch.Generator().manual_seed(seed))
    task = subject.task(subject.data, lm_config, Processes(0, 1, torch.device("cpu")))
    train.train(warm, task, train.Plan(steps, lm_config.clip))
    return optimizer


def gpt_subject(config: Config, run_dir: Path, console: Console) -> Subject:
    model, lm_config, data, description = trained_model(config, run_dir, console)
    return Subject(model, description, lm_config, data, lm_config.block_size, loss_fn, WarmUp)


def pretrained_subject(config: Config, console: Console) -> Subject:
    """The 🤗 model of ``--hf-model`` (LoRA adapters with ``--lora-rank``) and the text, encoded by its tokenizer."""
    given = Path(config.hf_model)
    if (given.is_absolute() or config.hf_model.startswith(".")) and not given.exists():  # a path, not a hub id
        raise ConfigError(f"--hf-model {config.hf_model} does not exist; give a 🤗 causal-LM directory")
    try:
        model, tokenizer = load_causal_lm(config.hf_model, quiet=config.quiet)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"--hf-model {config.hf_model}: not a 🤗 causal-LM directory that from_pretrained can read ({first})"
        ) from e
    context = context_length(model) or lm.Config.block_size
    lm_config = lm.Config(optimizers="adamw", text=config.text, block_size=min(lm.Config.block_size, context))
    try:
        text = load_corpus(text_path=config.text)
    except CorpusError as e:
        raise ConfigError(str(e)) from e
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    require(
        len(ids) > 0 or not text,
        f"--hf-model {config.hf_model}: its tokenizer encodes the text to no tokens (does the directory hold "
        "the tokenizer's files?)",
    )
    train_ids, val = lm.split_windows(ids, lm_config.block_size, "use a longer --text")
    counts = torch.bincount(train_ids, minlength=len(tokenizer))
    data = lm.Corpus(tokenizer, train_ids, val, counts, config.text or "shakespeare", len(text))
    description = f"{config.hf_model} ({type(model).__name__})"
    if config.lora_rank:
        model = add_lora(model, config.lora_rank)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        description += f" + LoRA r={config.lora_rank} ({trained:,} trained parameters)"
    prompts = None
    if config.mode == "policy":
        encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in lm.Config.prompts]
        prompts = left_padded(encoded, config.E)
    if not config.quiet:
        console.print(f"probing {description}: {len(ids):,} tokens of text")
    return Subject(model, description, lm_config, data, context, causal_lm_loss, PretrainedWarmUp, prompts)


def left_padded(prompts: list[list[int]], E: int) -> tuple[Tensor, Tensor]:
    """E prompts (the given ones in turn), left-padded to the longest: (ids, attention mask)."""
    require(all(prompts), "a prompt encodes to no tokens; every prompt needs at least one")
    width = max(len(p) for p in prompts)
    ids = torch.zeros(E, width, dtype=torch.long)
    mask = torch.zeros(E, width, dtype=torch.long)
    for i in range(E):
        p = prompts[i % len(prompts)]
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    return ids, mask


# ----------------------------------------------------------------------------------------- run
def evaluation_sequences(data: lm.Corpus, E: int, length: int, generator: torch.Generator) -> Tensor:
    """E windows of ``length`` + 1 held-out tokens at random starts."""
    windows = len(data.val) - length
    require(
        windows >= E,
        f"--E={E} sequences of --seq-len={length} need at least {E + length} validation tokens; "
        f"the corpus has {len(data.val)}: lower --E or --seq-len",
    )
    starts = torch.randperm(windows, generator=generator)[:E]
    return data.val[starts[:, None] + torch.arange(length + 1)]


def run(config: Config, run_dir: Path) -> Results:
    console = Console(quiet=config.quiet)
    subject = gpt_subject(config, run_dir, console) if config.hf_model is None else pretrained_subject(config, console)
    base, lm_config, data = subject.model, subject.lm_config, subject.data
    prompt_width = 1 if subject.prompts is None else subject.prompts[0].shape[1]
    inputs = config.seq_len + prompt_width - 1  # the tokens the model reads: the prompt and all but the last
    require(
        inputs <= subject.context,
        f"--seq-len={config.seq_len} must be <= the model's context {subject.context}"
        + (f" less the prompts' {prompt_width - 1} extra tokens" if prompt_width > 1 else ""),
    )
    out: dict[str, Any] = {
        "model": subject.description,
        "parameters": base.num_parameters(),
        "mode": config.mode,
        "optimizers": {},
    }
    for spec in runs_of(config):
        name, lr = spec.label, spec.lr
        model = copy.deepcopy(base)
        optimizer = warmed_optimizer(model, spec, subject, config.warm_steps, config.seed)
        etas = eta_grid(lr, config.eta_decades, config.n_etas)
        probes = []
        for r in range(config.runs):
            generator = torch.Generator().manual_seed(config.seed * 1000 + r)
            batch = sample_batch(data.train, lm_config.block_size, lm_config.batch_size, generator)
            v = update_direction(model, optimizer, subject.loss_fn, batch, max_grad_norm=lm_config.clip)
            held_out = evaluation_sequences(data, config.E, config.seq_len, generator)
            sequences, masks = held_out, {}
            if config.mode == "policy":
                sequences, masks = on_policy(model, subject, held_out, config.seq_len, generator)
            entropy = probe_step(model, v, sequences, etas, mode=config.mode, precision=config.precision, **masks)
            loss = probe_step(model, v, held_out, etas, functional="loss", precision=config.precision)
            subset_eta = min(etas, key=lambda e: abs(math.log(e / (lr / 10))))
            entropy["optimizer"], entropy["lr"], entropy["run"] = spec.optimizer, lr, r
            entropy["subsets"] = subset_errors(
                entropy, subset_eta, config.subset_size, config.subsets, config.subset_seed + r
            )
            entropy["loss_probe"] = {
                "delta_per_lr": loss["approx"]["delta_h_per_lr"],
                "vHvv": loss["approx"]["quadratic"]["vHvv"],
                "base": loss["base_value"],
                "true": [{"eta": e["eta"], "delta": e["delta_h_true"]} for e in loss["true"]["entries"]],
            }
            entropy["curve"] = prediction_curves(entropy)
            probes.append(entropy)
            if not config.quiet:
                console.print(
                    f"{name} run {r}: ∇H·v = {entropy['approx']['delta_h_per_lr']:+.3e}, "
                    f"∇L·v = {loss['approx']['delta_h_per_lr']:+.3e}, "
                    f"η* = {entropy['approx']['eta_star']:.2e} (lr {lr:g})"
                )
        out["optimizers"][name] = {
            "optimizer": spec.optimizer,
            "lr": lr,
            "etas": etas,
            "runs": probes,
            "fits": [true_change_fit(p["true"]["entries"]) for p in probes],
            "aggregate": aggregate(probes),
            "real_step": real_step(probes, lr),
        }
    return out


def on_policy(
    model: nn.Module, subject: Subject, held_out: Tensor, length: int, generator: torch.Generator
) -> tuple[Tensor, dict[str, Tensor]]:
    """``length`` tokens sampled after each prompt (the subject's, or each held-out window's first token),
    and for padded prompts the probe's ``attention_mask`` and ``scored`` (the sampled positions only)."""
    starts, mask = (held_out[:, 0], None) if subject.prompts is None else subject.prompts
    # sample_sequences samples in eval mode itself and restores each module's own flag
    sequences = sample_sequences(model, starts, length, subject.context, generator, attention_mask=mask)
    if mask is None:
        return sequences, {}
    attention = torch.cat([mask, torch.ones(len(mask), length, dtype=mask.dtype)], dim=1)
    scored = torch.zeros(sequences.shape[0], sequences.shape[1] - 1, dtype=torch.bool)
    scored[:, mask.shape[1] - 1 :] = True  # the positions whose next token was sampled
    return sequences, {"attention_mask": attention, "scored": scored}


def true_change_fit(entries: list[dict[str, Any]]) -> dict[str, float]:
    """The line through (log η, log |ΔH_true|) over the probed grid: slope, intercept, R²."""
    changes = np.maximum(np.abs([e["delta_h_true"] for e in entries]), 1e-300)
    return loglog_fit([e["eta"] for e in entries], changes)


def aggregate(probes: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Over the runs of one optimizer, at each η: mean and std of the true ΔH, means of the predictions."""
    true = np.array([p["curve"]["true"] for p in probes])
    return {
        "eta": probes[0]["curve"]["eta"],
        "true_mean": true.mean(0).tolist(),
        "true_std": true.std(0).tolist(),
        "linear_mean": np.mean([p["curve"]["linear"] for p in probes], 0).tolist(),
        "quadratic_mean": np.mean([p["curve"]["quadratic"] for p in probes], 0).tolist(),
    }


def real_step(probes: list[dict[str, Any]], lr: float) -> dict[str, Any]:
    """The first-order change of validation loss and entropy in the real step (η = lr) per run, their
    mean and std over runs, and how much entropy each unit of loss decrease moves: mean ΔH / −mean ΔL."""
    loss = np.array([lr * p["loss_probe"]["delta_per_lr"] for p in probes])
    entropy = np.array([lr * p["approx"]["delta_h_per_lr"] for p in probes])
    return {
        "loss": loss.tolist(),
        "entropy": entropy.tolist(),
        "loss_mean": float(loss.mean()),
        "loss_std": float(loss.std()),
        "entropy_mean": float(entropy.mean()),
        "entropy_std": float(entropy.std()),
        "entropy_per_loss": float(entropy.mean()) / -float(loss.mean()) if loss.mean() != 0 else math.nan,
    }
