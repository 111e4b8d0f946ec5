"""Builds the labelled corpus of training runs on which early warnings of loss spikes are scored (issue 48).

Three tasks: the lm GPT at its quick size (2 layers, 2 heads, 64 wide, context 64, batch 12, optiscope's packaged
Shakespeare, char-level), the adder (its "roomy" model, batch 128) and an MLP (32 → 128 → 128 → 10, GELU,
batch 128, fitting the labels a fixed random teacher gives 4,096 fixed Gaussian inputs). On each: Adam and AdamW
at β₂ ∈ {0.95, 0.999}, at three learning rates straddling the edge where training starts to spike, with and
without a linear warm-up (over the first tenth of the steps), seeds 0 … 9; SGD with heavy-ball momentum 0.9 at
three learning rates as a control. Gradients are clipped to norm 1, as optiscope's experiments do.

Every run records, per step and per parameter tensor, every raw quantity the warning signals and the baselines
read (``RAW``), so that any signal can be scored offline and re-scored without training again; every
``CURVATURE_EVERY`` steps the (preconditioned) curvature along the update and the gradient and the sharpness,
warm-started, against the optimizer's stability threshold, on a fixed batch. One ``.npz`` per run, written
atomically: a killed build continues where it stopped. The spike and divergence labels are ``labels.py``'s,
fixed before the corpus was built. Seeds 0 … 4 are built first (the evaluation fits on them), then 5 … 9.

``--intervene PATH`` trains the same runs with a warner (a method ``evaluate.py`` fitted, saved as JSON) that
halves every group's learning rate when it warns, at most once per ``COOLDOWN`` steps: the intervention against
the corpus runs of the same seeds as matched controls. ``--intervene monitor`` lets the product warn instead:
``Monitor(..., early_warning=EarlyWarning(edge=None))`` at its default thresholds, halving the learning rate on
each warning (at most once per ``COOLDOWN`` steps).

    nice -n 10 python benchmarks/early_warning/corpus.py --out DIR [--tasks lm,adder,mlp] [--seeds 0-9]
        [--only GLOB] [--jobs 1] [--intervene WARNER.json|monitor]
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/common.py

from common import Parser, whole_number  # noqa: E402
from optiscope.curvature import sharpness  # noqa: E402
from optiscope.data import sample_batch  # noqa: E402
from optiscope.data.addition import training_batch  # noqa: E402
from optiscope.data.corpus import load_corpus  # noqa: E402
from optiscope.data.tokenizers import CharTokenizer  # noqa: E402
from optiscope.experiments.adder import PRESETS, loss_on  # noqa: E402
from optiscope.models import GPT, GPTConfig  # noqa: E402
from optiscope.models.adder import AdderModel  # noqa: E402
from optiscope.monitor import DivergenceGuard, EarlyWarning, Monitor  # noqa: E402
from optiscope.monitor.warning import adam_moments, adam_step_size, preconditioned, squared_norms  # noqa: E402

CLIP = 1.0
WARMUP_FRACTION = 0.1
CURVATURE_EVERY = 20  # steps between curvature measurements (on the fixed batch)
#: the curvature ratios the corpus keeps, by the name ``warning.Signals`` gives each
CURVATURE_NAMES = ("curvature_update", "curvature_gradient", "sharpness")
SHARPNESS_HVPS = 3  # Lanczos products per measurement, warm-started from the last top eigenvector
COOLDOWN = 20  # the intervention halves the learning rate at most once per this many steps
BETA2S = (0.95, 0.999)
SEEDS = tuple(range(10))
#: the per-step, per-tensor quantities each run records (float32, shape (steps, tensors))
RAW = {
    "g2": "‖g‖², the gradient the optimizer steps with (after clipping)",
    "w2": "‖θₜ‖², the weights after the step",
    "u2": "‖u‖², u = θₜ − θₜ₋₁",
    "gu": "⟨g, u⟩",
    "gu_prev": "⟨gₜ, uₜ₋₁⟩ (0 at step 1): with gu, the secant curvature along the update",
    "upu": "⟨u, P u⟩, P = diag(√v̂ₜ + ε) after the step (Adam), the identity (SGD)",
    "lag": "mean g²/(√v̂ₜ₋₁ + ε)² over the tensor, v̂ before the step (Adam; NaN at step 1 and for SGD)",
    "lag_max": "max g²/(√v̂ₜ₋₁ + ε)² over the tensor (as lag)",
    "step2": "mean (m̂ₜ/(√v̂ₜ + ε))² over the tensor, Adam's step before η (NaN for SGD)",
    "v_mean": "mean v̂ₜ over the tensor after the step (NaN for SGD)",
}


# ------------------------------------------------------------------------------------------------ tasks
@dataclass(frozen=True)
class Task:
    """A model, its batches and its loss: ``build(seed)`` gives (model, draw(generator) -> batch, loss_fn)."""

    steps: int
    adam_lrs: tuple[float, ...]
    sgd_lrs: tuple[float, ...]
    build: Callable[[], tuple[nn.Module, Callable[[torch.Generator], Any], Callable[[nn.Module, Any], Tensor]]]


def lm_task() -> tuple[nn.Module, Callable, Callable]:
    text = load_corpus()
    ids = torch.tensor(CharTokenizer.from_text(text).encode(text), dtype=torch.long)
    config = GPTConfig(
        vocab_size=int(ids.max()) + 1, n_layer=2, n_head=2, n_embd=64, block_size=64, attention="math"
    )  # math attention: the Hessian-vector products need its second derivative
    return GPT(config), lambda g: sample_batch(ids, 64, 12, g), lambda m, b: m(*b)[1]


def adder_task() -> tuple[nn.Module, Callable, Callable]:
    return AdderModel(PRESETS["roomy"]), lambda g: training_batch(128, 10, 0.5, g), lambda m, b: loss_on(m, *b)


def mlp_task() -> tuple[nn.Module, Callable, Callable]:
    data = torch.Generator().manual_seed(48)  # the dataset and its teacher are the same for every seed
    x = torch.randn(4096, 32, generator=data)
    teacher = torch.randn(32, 64, generator=data) / math.sqrt(32), torch.randn(64, 10, generator=data) / 8
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))

    def draw(g: torch.Generator) -> tuple[Tensor, Tensor]:
        rows = torch.randint(0, len(x), (128,), generator=g)
        return x[rows], y[rows]

    return model, draw, lambda m, b: F.cross_entropy(m(b[0]), b[1])


TASKS = {
    "lm": Task(300, (0.1, 0.5, 1.0), (0.5, 1.5, 3.0), lm_task),
    "adder": Task(800, (3e-3, 1e-2, 3e-2), (0.1, 0.3, 1.0), adder_task),
    "mlp": Task(1000, (3e-3, 1e-2, 3e-2), (0.1, 0.3, 1.0), mlp_task),
}


# ------------------------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class Spec:
    """One run of the corpus."""

    task: str
    optimizer: str  # adam, adamw or sgdm
    beta2: float | None
    lr: float
    warmup: bool
    seed: int

    @property
    def name(self) -> str:
        beta = "" if self.beta2 is None else f"-b{self.beta2:g}"
        return f"{self.task}/{self.optimizer}{beta}-lr{self.lr:g}-{'wu' if self.warmup else 'nowu'}-s{self.seed}"


def grid(tasks: tuple[str, ...], seeds: tuple[int, ...]) -> list[Spec]:
    """Every run, the fitting seeds (0 … 4) first so that the evaluation can start on them."""
    out = []
    for part in (tuple(s for s in seeds if s < 5), tuple(s for s in seeds if s >= 5)):
        for seed in part:
            for task in tasks:
                t = TASKS[task]
                for optimizer in ("adam", "adamw"):
                    for beta2 in BETA2S:
                        for lr in t.adam_lrs:
                            for warmup in (False, True):
                                out.append(Spec(task, optimizer, beta2, lr, warmup, seed))
                for lr in t.sgd_lrs:
                    out.append(Spec(task, "sgdm", None, lr, False, seed))
    return out


def build_optimizer(spec: Spec, model: nn.Module) -> torch.optim.Optimizer:
    """Adam (no decay), AdamW (λ = 0.1 on matrices, nanoGPT's grouping) or SGD with momentum 0.9."""
    if spec.optimizer == "sgdm":
        return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)
    betas = (0.9, spec.beta2)
    if spec.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=spec.lr, betas=betas)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=spec.lr, betas=betas)


def lr_at(spec: Spec, step: int, steps: int) -> float:
    """η at 1-based ``step``: linear warm-up over the first tenth of the steps, then constant."""
    if not spec.warmup:
        return spec.lr
    return spec.lr * min(1.0, step / max(1, round(WARMUP_FRACTION * steps)))


#: ``--intervene monitor``: the product's own warning acts, ``Monitor(..., early_warning=...)``
MONITOR = "monitor"


class Intervention:
    """What the ``--intervene`` runs do on a warning: halve every group's learning rate, at most once per
    ``COOLDOWN`` steps. ``warn(step, quantities, curvature)`` is a fitted warner (``evaluate.Warner.online``), or
    None where ``Monitor(..., early_warning=EarlyWarning(edge=None), on_warning=intervention.halve)`` warns: its
    ``reduce_lr`` would halve ``group["lr"]``, which the schedule sets again at every step, so the factor the
    schedule is multiplied by is halved instead."""

    def __init__(self, warn: Callable[[int, dict[str, Any], dict[str, float] | None], bool] | None) -> None:
        self.warn, self.factor, self.last, self.steps = warn, 1.0, -math.inf, []

    def after(self, step: int, quantities: dict[str, Any], curvature: dict[str, float] | None) -> None:
        if self.warn is not None and self.warn(step, quantities, curvature):
            self.halve({"step": step})

    def halve(self, warning: dict[str, Any]) -> None:
        if warning["step"] - self.last >= COOLDOWN:
            self.factor, self.last = self.factor / 2, warning["step"]
            self.steps.append(warning["step"])


def dots(a: list[Tensor], b: list[Tensor]) -> Tensor:
    return torch.stack([torch.dot(x.reshape(-1).float(), y.reshape(-1).float()) for x, y in zip(a, b, strict=True)])


def train(spec: Spec, warner: Any = None) -> dict[str, Any]:
    """Trains one run, recording what ``RAW`` lists per step; returns the arrays of its ``.npz``. With a ``warner``
    (``evaluate.Warner``) an ``Intervention`` acts on its warnings; the curvature is then measured only if the
    warner's method reads it."""
    task = TASKS[spec.task]
    torch.manual_seed(spec.seed)
    model, draw, loss_fn = task.build()
    data = torch.Generator().manual_seed(1_000_003 * spec.seed + 7)
    curvature_batch = draw(torch.Generator().manual_seed(1_000_003 * spec.seed + 11))
    opt = build_optimizer(spec, model)
    params = [p for g in opt.param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    intervention, every, monitor = None, CURVATURE_EVERY, None
    if warner == MONITOR:  # the real monitor, its loss judged at once (given as a number), its lag every 10 steps
        intervention, every = Intervention(None), 0
        monitor = Monitor(
            model,
            opt,
            every=10,
            sinks=[],
            guard=DivergenceGuard(factor=math.inf),
            on_divergence="record",
            early_warning=EarlyWarning(edge=None),
            on_warning=intervention.halve,
        )
    elif warner is not None:
        meta = {"optimizer": spec.optimizer, "numels": [p.numel() for p in params]}
        intervention = Intervention(warner.online(meta))
        every = CURVATURE_EVERY if warner.reads_curvature else 0
    steps, width = task.steps, len(params)
    sizes = torch.tensor([float(p.numel()) for p in params])
    out: dict[str, Any] = {k: np.full((steps, width), np.nan, dtype=np.float32) for k in RAW}
    for k in ("loss", "lr", "grad_norm"):
        out[k] = np.full(steps, np.nan)
    curvature: dict[str, list[float]] = {k: [] for k in ("step", "update", "gradient", "sharpness", "hvps")}
    previous_u = [torch.zeros_like(p) for p in params]
    vector, first, start = None, None, time.thread_time()
    for step in range(1, steps + 1):
        lr = lr_at(spec, step, steps) * (intervention.factor if intervention else 1.0)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = loss_fn(model, draw(data))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, CLIP))
        value = float(loss.detach())
        out["loss"][step - 1], out["lr"][step - 1], out["grad_norm"][step - 1] = value, lr, grad_norm
        first = value if first is None else first
        if not math.isfinite(value) or value >= 10 * first:  # labels.divergence_step: the run ends here
            return finish(out, curvature, spec, step, names, params, start, intervention)
        grads = [p.grad for p in params]
        before = adam_moments(opt, params)
        if before is not None:
            lag, lag_max = lag_terms(grads, before.second, before.bias_corrections2, before.eps)
            out["lag"][step - 1], out["lag_max"][step - 1] = lag, lag_max
        old = [p.detach().clone() for p in params]
        opt.step()
        if monitor is not None:
            monitor.step(value)
        u = torch._foreach_sub([p.detach() for p in params], old)
        row = {
            "g2": squared_norms(grads),
            "w2": squared_norms([p.detach() for p in params]),
            "u2": squared_norms(u),
            "gu": dots(grads, u),
            "gu_prev": dots(grads, previous_u),
        }
        after = adam_moments(opt, params)
        if after is None:
            row["upu"] = row["u2"]
        else:
            v, bc2 = after.second, after.bias_corrections2
            denominators = torch._foreach_add(torch._foreach_sqrt(torch._foreach_div(v, bc2)), after.eps)  # √v̂ + ε
            row["upu"] = dots(u, torch._foreach_mul(u, denominators))
            row["step2"] = adam_step_size(*after)
            row["v_mean"] = torch.stack([vi.sum() / b for vi, b in zip(v, bc2, strict=True)]) / sizes
        for k, values in row.items():
            out[k][step - 1] = values.numpy()
        measured = None
        if every and step % every == 0:
            vector = measure_curvature(model, loss_fn, curvature_batch, opt, u, params, vector, step, curvature)
            if curvature["step"] and curvature["step"][-1] == step:
                keys = ("update", "gradient", "sharpness")
                measured = {name: curvature[k][-1] for name, k in zip(CURVATURE_NAMES, keys, strict=True)}
        if intervention is not None:
            intervention.after(step, {k: out[k][step - 1] for k in (*RAW, "loss", "lr", "grad_norm")}, measured)
        previous_u = u
    return finish(out, curvature, spec, steps, names, params, start, intervention)


def lag_terms(
    grads: list[Tensor], v: list[Tensor], bc2: list[float], eps: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, max) of g²/(√v̂ + ε)² per tensor, v̂ before the step (``warning.adam_lag`` and its max)."""
    ratios = preconditioned(grads, v, bc2, eps)
    sizes = torch.tensor([float(g.numel()) for g in grads])
    peak = torch.stack(torch._foreach_norm(ratios, math.inf)) ** 2
    return (squared_norms(ratios) / sizes).numpy(), peak.numpy()


def measure_curvature(
    model: nn.Module,
    loss_fn: Callable,
    batch: Any,
    opt: torch.optim.Optimizer,
    u: list[Tensor],
    params: list[Tensor],
    vector: Tensor | None,
    step: int,
    into: dict[str, list[float]],
) -> Tensor | None:
    """Curvature along the update and the gradient and the warm-started sharpness, each over the threshold."""
    try:
        result = sharpness(
            model,
            loss_fn,
            batch,
            opt,
            tol=1e-2,
            max_hvps=SHARPNESS_HVPS,
            init=vector,
            along={"update": {id(p): d for p, d in zip(params, u, strict=True)}, "gradient": "gradient"},
        )
    except (RuntimeError, ValueError):  # a model whose loss on the batch is no longer finite
        return vector
    ratio = result["ratio"] if result["ratio"] is not None else math.nan
    into["step"].append(step)
    into["update"].append(_ratio(result["along"]["update"]))
    into["gradient"].append(_ratio(result["along"]["gradient"]))
    into["sharpness"].append(ratio)
    into["hvps"].append(result["hvps"])
    return result["vector"]


def _ratio(entry: dict[str, Any]) -> float:
    return math.nan if entry["ratio"] is None else float(entry["ratio"])


def finish(
    out: dict[str, Any],
    curvature: dict[str, list[float]],
    spec: Spec,
    last: int,
    names: dict[int, str],
    params: list[Tensor],
    start: float,
    intervention: Intervention | None,
) -> dict[str, Any]:
    """The run's arrays, cut at its last step, with its curvature series and its description."""
    arrays = {k: v[:last] for k, v in out.items()}
    arrays.update({f"curvature_{k}": np.asarray(v, dtype=float) for k, v in curvature.items()})
    meta = {
        **asdict(spec),
        "name": spec.name,
        "planned_steps": TASKS[spec.task].steps,
        "params": [names.get(id(p), "?") for p in params],
        "numels": [p.numel() for p in params],
        "cpu_seconds": time.thread_time() - start,
        "interventions": None if intervention is None else intervention.steps,
    }
    arrays["meta"] = np.asarray(json.dumps(meta))
    return arrays


# ------------------------------------------------------------------------------------------------ files
def path_of(out: Path, spec: Spec) -> Path:
    return out / "runs" / f"{spec.name}.npz"


def write_atomic(path: Path, arrays: dict[str, Any]) -> None:
    """``np.savez_compressed`` to a temporary file beside ``path``, then renamed: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)


def read_run(path: Path) -> dict[str, Any]:
    """One run's arrays and its ``meta`` (a dict)."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["meta"] = json.loads(str(arrays["meta"]))
    return arrays


def build_one(job: tuple[Spec, str, str | None]) -> str:
    spec, out, warner_path = job
    torch.set_num_threads(1)
    warner: Any = MONITOR if warner_path == MONITOR else None
    if warner_path is not None and warner is None:
        from evaluate import Warner  # the intervention's warner, fitted by the evaluation

        warner = Warner.load(Path(warner_path))
    path = path_of(Path(out), spec)
    if not path.exists():
        write_atomic(path, train(spec, warner))
    return spec.name


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the corpus directory (created; resumed if there)")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--seeds", default="0-9", help="a range a-b or a comma-separated list")
    parser.add_argument("--only", default="*", help="a glob over run names, e.g. 'lm/adam-*'")
    parser.add_argument("--jobs", type=whole_number(1), default=1, help="processes (one torch thread each)")
    parser.add_argument(
        "--intervene",
        default=None,
        metavar="WARNER.json",
        help="train with this warner acting; 'monitor': the product's",
    )
    args = parser.parse_args()
    tasks = tuple(t for t in args.tasks.split(",") if t)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        parser.error(f"--tasks {args.tasks!r}: give some of {', '.join(TASKS)}")
    seeds = parse_seeds(args.seeds)
    if seeds is None:
        parser.error(f"--seeds {args.seeds!r}: give a range like 0-9 or a list like 0,3,5")
    if args.intervene not in (None, MONITOR) and not Path(args.intervene).is_file():
        parser.error(f"--intervene {args.intervene!r}: no such file; give a warner saved by evaluate.py, or 'monitor'")
    specs = [s for s in grid(tasks, seeds) if fnmatch.fnmatch(s.name, args.only)]
    todo = [s for s in specs if not path_of(args.out, s).exists()]
    args.out.mkdir(parents=True, exist_ok=True)
    write_manifest(args.out, tasks, seeds, args.intervene)
    print(f"{len(specs)} runs, {len(specs) - len(todo)} already built, {len(todo)} to build", flush=True)
    jobs = [(s, str(args.out), args.intervene) for s in todo]
    start = time.perf_counter()
    if args.jobs == 1:
        done = map(build_one, jobs)
    else:
        pool = multiprocessing.get_context("spawn").Pool(args.jobs)
        done = pool.imap_unordered(build_one, jobs)
    for i, name in enumerate(done, 1):
        elapsed = time.perf_counter() - start
        print(f"[{i}/{len(todo)}] {name} ({elapsed / i:.1f} s per run, {elapsed / 60:.0f} min)", flush=True)


def parse_seeds(text: str) -> tuple[int, ...] | None:
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            seeds = tuple(range(lo, hi + 1))
        else:
            seeds = tuple(int(x) for x in text.split(","))
    except ValueError:
        return None
    return seeds if seeds and min(seeds) >= 0 else None


def write_manifest(out: Path, tasks: tuple[str, ...], seeds: tuple[int, ...], warner: str | None) -> None:
    """``corpus.json``: the grid, the settings and the commit the corpus was built at."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    manifest = {
        "commit": commit,
        "tasks": {name: {k: v for k, v in asdict(TASKS[name]).items() if k != "build"} for name in tasks},
        "seeds": list(seeds),
        "beta2s": list(BETA2S),
        "clip": CLIP,
        "warmup_fraction": WARMUP_FRACTION,
        "curvature_every": CURVATURE_EVERY,
        "sharpness_hvps": SHARPNESS_HVPS,
        "raw": RAW,
        "intervene": warner,
        "cooldown": COOLDOWN,
        "torch": torch.__version__,
    }
    tmp = out / ".corpus.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / "corpus.json")


if __name__ == "__main__":
    main()
