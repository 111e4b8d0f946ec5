"""Scores early-warning methods on the labelled corpus that ``corpus.py`` built (issue 48), held out by seed and task.

Every run's raw per-step quantities are replayed through ``optiscope.monitor.warning.Signals`` (the code the
monitor runs), which gives each step the scores of ``warning.SCORES``. A *method* turns them into one number per
step; a warning is that number above a threshold. Methods: each signal alone (among them the baselines: ZClip's
gradient-norm z-score, a loss z-score, u/w, the sharpness), the largest of the signals' quantiles ("quantile-max"),
logistic regression on them ("logistic"; "logistic-per-step" without the curvature, which needs Hessian-vector
products), and a small neural network ("mlp").

The protocol: seeds 0 … 4 fit, seeds 5 … 9 are held out; for each task, a method is fitted (its weights and its
threshold) on the fitting seeds of the *other two* tasks and scored on the held-out seeds of that task. Labels are
``labels.py``'s. Scores at horizons N ∈ {1, 5, 20}: AUROC and AUPRC over the scored steps (positive: an onset within
N steps), recall of events (an alarm in the N steps before the onset) at the threshold that gave ≤ 1 false alarm
per 1,000 scored steps on the fitting runs, the false alarms that threshold gives on the held-out runs, and the
median lead (onset − first alarm in the window). The method kept is chosen before the held-out seeds are read: the
best mean AUROC at N = 5 over the three tasks with ``--split dev`` (fit on two tasks' fitting seeds, scored on the
third's fitting seeds). ``--save-warners DIR`` writes the kept method fitted for each task, for
``corpus.py --intervene``.

    python benchmarks/early_warning/evaluate.py --corpus DIR [--split dev|final] [--method NAME]
        [--save-warners DIR] [--json FILE]
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.stats import rankdata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/common.py

import corpus as corpus_module  # noqa: E402
import labels  # noqa: E402

from common import Parser, whole_number  # noqa: E402
from optiscope.monitor import warning  # noqa: E402
from optiscope.monitor.warning import SCORES, Signals  # noqa: E402

HORIZONS = (1, 5, 20)
FALSE_ALARMS = 1e-3  # per scored step
FIT_SEEDS, HELD_OUT_SEEDS = tuple(range(5)), tuple(range(5, 10))
#: the baselines the issue names, by the signal that is each
BASELINES = {
    "grad_norm_z": "ZClip's gradient-norm z-score (α = 0.97)",
    "loss_z": "loss z-score (α = 0.97)",
    "update_ratio_growth": "u/w against its average",
    "sharpness": "sharpness / threshold (every 20 steps)",
}
CURVATURE = ("curvature_update", "curvature_gradient", "sharpness")
#: where the corpus keeps each curvature ratio
CURVATURE_KEYS = dict(zip(CURVATURE, ("curvature_update", "curvature_gradient", "curvature_sharpness"), strict=True))


# ------------------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    """One corpus run: its description, per-step scores (steps × ``SCORES``), labels."""

    meta: dict[str, Any]
    loss: np.ndarray
    scores: np.ndarray
    events: list[labels.Event]
    scored: np.ndarray
    positive: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.meta["task"]

    @property
    def seed(self) -> int:
        return self.meta["seed"]


def threshold_coefficient(meta: dict[str, Any]) -> float:
    """c of the stability threshold c/η: 2(1 + β₁)/(1 − β₁) = 38 for Adam at β₁ = 0.9, 2(1 + β) = 3.8 for heavy
    ball at β = 0.9 (decoupled decay left out)."""
    return 3.8 if meta["optimizer"] == "sgdm" else 38.0


def replay(raws: list[dict[str, Any]]) -> list[np.ndarray]:
    """The scores of ``warning.SCORES`` at every step of each run, by feeding ``Signals`` its recorded quantities;
    runs of one task and optimizer kind at once (``Signals`` takes a leading batch dimension)."""
    out: list[np.ndarray | None] = [None] * len(raws)
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, raw in enumerate(raws):
        groups.setdefault((raw["meta"]["task"], raw["meta"]["optimizer"] != "sgdm"), []).append(i)
    for members in groups.values():
        for i, scores in zip(members, _replay_group([raws[i] for i in members]), strict=True):
            out[i] = scores
    return out


class Feeder:
    """Feeds ``Signals`` one step of recorded quantities at a time, as the monitor would: for one run, or for several
    of one task and optimizer kind at once (a leading dimension over runs)."""

    def __init__(self, metas: list[dict[str, Any]], names: tuple[str, ...] = SCORES) -> None:
        self.signals = Signals(names)
        self.adam = metas[0]["optimizer"] != "sgdm"
        self.scale = torch.tensor([1 / threshold_coefficient(m) for m in metas])  # η/c from η
        self.sizes = torch.tensor(metas[0]["numels"], dtype=torch.float32)
        self.previous_v: torch.Tensor | None = None  # the mean v̂ after the last step: v̂ before this one
        if len(metas) == 1:
            self.scale = self.scale[0]

    def feed(self, step: int, row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Step ``step``'s scores from its row of ``corpus.RAW`` quantities, ``loss``, ``grad_norm`` and ``lr``."""
        adam_before = self.adam and step > 1  # Adam's state exists before the step
        v_sum = None if self.previous_v is None else self.previous_v * self.sizes
        self.previous_v = row["v_mean"]
        return self.signals.update(
            row["loss"],
            grad_norm=row["grad_norm"],
            u2=row["u2"],
            w2=row["w2"],
            gu=row["gu"],
            gu_prev=row["gu_prev"],
            upu=row["upu"],
            lr_over_threshold=row["lr"] * self.scale,
            lag=row["lag"] if adam_before else None,
            g2=row["g2"] if adam_before else None,
            v_sum=v_sum if adam_before else None,
            step2=row["step2"] if self.adam else None,
        )

    def measured(self, ratios: dict[str, torch.Tensor], scores: dict[str, torch.Tensor]) -> None:
        """Curvature measured after this step (ratios to the threshold; NaN where a run has none now), into the
        signals and into this step's ``scores``: it is known when the step is judged."""
        held = {k: torch.where(torch.isfinite(v), v, scores[k]) for k, v in ratios.items() if k in scores}
        self.signals.measured(**held)
        scores.update(held)


def _replay_group(raws: list[dict[str, Any]]) -> list[np.ndarray]:
    steps = max(len(r["loss"]) for r in raws)

    def stacked(key: str) -> np.ndarray:  # (runs, steps, ...) padded with NaN after a run's last step
        parts = [np.asarray(r[key], dtype=np.float32) for r in raws]
        full = np.full((len(raws), steps, *parts[0].shape[1:]), np.nan, dtype=np.float32)
        for i, p in enumerate(parts):
            full[i, : len(p)] = p
        return full

    data = {k: torch.from_numpy(stacked(k)) for k in (*corpus_module.RAW, "loss", "grad_norm", "lr")}
    curvature = {k: torch.full((len(raws), steps), math.nan) for k in CURVATURE}
    for i, r in enumerate(raws):
        at = torch.as_tensor(r["curvature_step"], dtype=torch.long) - 1
        for k in CURVATURE:
            curvature[k][i, at] = torch.as_tensor(r[CURVATURE_KEYS[k]], dtype=torch.float32)
    feeder = Feeder([r["meta"] for r in raws])
    out = np.full((len(raws), steps, len(SCORES)), np.nan)
    for t in range(steps):
        scores = feeder.feed(t + 1, {k: v[:, t] for k, v in data.items()})
        ratios = {k: v[:, t] for k, v in curvature.items()}
        if any(bool(torch.isfinite(v).any()) for v in ratios.values()):
            feeder.measured(ratios, scores)
        out[:, t] = torch.stack([scores[k] for k in SCORES], dim=1).numpy()
    return [out[i, : len(r["loss"])] for i, r in enumerate(raws)]


def load(directory: Path, seeds: tuple[int, ...]) -> list[Run]:
    """Every run of the corpus in ``directory`` with one of ``seeds``, with its scores and labels. The scores are
    replayed once and cached in ``directory/scores/``, under a digest of the code that computes them."""
    paths = sorted((directory / "runs").glob("*/*.npz"))
    raws = [corpus_module.read_run(p) for p in paths]
    keep = [i for i, raw in enumerate(raws) if raw["meta"]["seed"] in seeds]
    paths, raws = [paths[i] for i in keep], [raws[i] for i in keep]
    digest = hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in (warning, sys.modules[__name__])))
    cache = directory / "scores" / digest.hexdigest()[:12]
    cached = [cache / p.relative_to(directory / "runs").with_suffix(".npy") for p in paths]
    fresh = [i for i, c in enumerate(cached) if not c.exists()]
    for i, scores in zip(fresh, replay([raws[i] for i in fresh]), strict=True):
        cached[i].parent.mkdir(parents=True, exist_ok=True)
        np.save(cached[i], scores)
    runs = []
    for raw, c in zip(raws, cached, strict=True):
        loss = raw["loss"]
        found = labels.events(loss)
        run = Run(raw["meta"], loss, np.load(c), found, labels.scored(len(loss), found))
        run.positive = {n: labels.positives(len(loss), found, n) for n in HORIZONS}
        runs.append(run)
    return runs


# ------------------------------------------------------------------------------------------------ methods
def oriented(scores: np.ndarray) -> np.ndarray:
    """Scores with NaN (no signal yet, or none for this optimizer) as −inf: never a warning."""
    return np.where(np.isfinite(scores), scores, -np.inf)


def transformed(scores: np.ndarray) -> np.ndarray:
    """The features a learned method reads: the scores, curvature ratios and the secant through asinh (they span
    decades and take either sign), z-scores clipped to ±50; then a missing-value indicator per score."""
    x = scores.copy()
    for i, name in enumerate(SCORES):
        if name in (*CURVATURE, "secant"):
            x[:, i] = np.arcsinh(x[:, i])
        elif name.endswith("_z"):
            x[:, i] = np.clip(x[:, i], -50, 50)
        elif name.endswith(("_unrest", "_cusum")):
            x[:, i] = np.log1p(x[:, i])
    missing = ~np.isfinite(x)
    return np.concatenate([np.where(missing, 0.0, x), missing.astype(float)], axis=1)


class Method:
    """A warning method: ``fit(runs, horizon)`` learns what it needs, ``score(run)`` gives one number per step."""

    name = ""
    per_step_only = False

    def fit(self, runs: list[Run], horizon: int) -> None:  # noqa: B027 - most methods learn nothing
        pass

    def score(self, scores: np.ndarray) -> np.ndarray:
        """One number per row of ``scores`` (steps × ``SCORES``)."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """What ``fit`` learnt, as JSON types."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - most methods learn nothing
        pass


class Single(Method):
    """One signal of ``SCORES`` as it is."""

    def __init__(self, signal: str) -> None:
        self.name, self.index = signal, SCORES.index(signal)
        self.per_step_only = signal not in CURVATURE

    def score(self, scores: np.ndarray) -> np.ndarray:
        return oriented(scores[:, self.index])


class QuantileMax(Method):
    """The largest, over the per-step signals, of each signal's quantile among the fitting runs' negative steps
    (finite values; a quantile grid of ``GRID`` points, extended linearly above the largest)."""

    name, per_step_only = "quantile-max", True
    GRID = 2001

    def __init__(self) -> None:
        self.columns = tuple(s for s in SCORES if s not in CURVATURE)
        self.grids: list[np.ndarray] = []

    def fit(self, runs: list[Run], horizon: int) -> None:
        negatives = np.concatenate([r.scores[r.scored & ~r.positive[horizon]] for r in runs])
        self.grids = []
        for c in self.columns:
            x = negatives[:, SCORES.index(c)]
            x = x[np.isfinite(x)]
            self.grids.append(np.quantile(x, np.linspace(0, 1, self.GRID)) if x.size else np.zeros(0))

    def score(self, scores: np.ndarray) -> np.ndarray:
        parts = [np.zeros(len(scores))]
        levels = np.linspace(0, 1, self.GRID)
        for c, grid in zip(self.columns, self.grids, strict=True):
            if grid.size == 0:
                continue
            x = scores[:, SCORES.index(c)]
            q = np.interp(x, grid, levels)
            spread = max(grid[-1] - grid[len(grid) // 2], 1e-12)  # above the largest: on by its distance
            q = np.where(x > grid[-1], 1 + (x - grid[-1]) / spread, q)
            parts.append(np.where(np.isfinite(x), q, 0.0))
        return np.max(parts, axis=0)

    def state(self) -> dict[str, Any]:
        return {"grids": [g.tolist() for g in self.grids]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.grids = [np.asarray(g) for g in state["grids"]]


class Logistic(Method):
    """Logistic regression on ``transformed`` scores, classes weighted to balance, L2 penalty 1e-3."""

    def __init__(self, per_step_only: bool = False) -> None:
        self.per_step_only = per_step_only
        self.name = "logistic-per-step" if per_step_only else "logistic"
        self.keep = np.array([not (per_step_only and s in CURVATURE) for s in SCORES] * 2)
        self.mean = self.std = self.weights = None

    def features(self, scores: np.ndarray) -> np.ndarray:
        x = transformed(scores)[:, self.keep]
        return np.clip((x - self.mean) / self.std, -10, 10)

    def fit(self, runs: list[Run], horizon: int) -> None:
        raw = np.concatenate([transformed(r.scores[r.scored])[:, self.keep] for r in runs])
        y = np.concatenate([r.positive[horizon][r.scored] for r in runs]).astype(float)
        self.mean, self.std = raw.mean(0), raw.std(0) + 1e-9
        x = np.clip((raw - self.mean) / self.std, -10, 10)
        x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        w = np.where(y > 0, 0.5 / max(y.mean(), 1e-9), 0.5 / max(1 - y.mean(), 1e-9)) / len(y)

        def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
            z = x @ beta
            p = 1 / (1 + np.exp(-z))
            value = np.sum(w * (np.logaddexp(0, z) - y * z)) + 1e-3 * beta[:-1] @ beta[:-1]
            grad = x.T @ (w * (p - y))
            grad[:-1] += 2e-3 * beta[:-1]
            return value, grad

        self.weights = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B").x

    def score(self, scores: np.ndarray) -> np.ndarray:
        return self.features(scores) @ self.weights[:-1] + self.weights[-1]

    def state(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "weights": self.weights.tolist()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.mean, self.std, self.weights = (np.asarray(state[k]) for k in ("mean", "std", "weights"))


class Network(Method):
    """A two-layer perceptron (32 units each, GELU) on the ``transformed`` scores, classes balanced; trained with
    Adam on the fitting runs' scored steps (negatives subsampled to 100,000), seeded."""

    name = "mlp"

    def __init__(self) -> None:
        self.mean = self.std = self.net = None

    def fit(self, runs: list[Run], horizon: int) -> None:
        raw = np.concatenate([transformed(r.scores[r.scored]) for r in runs])
        y = np.concatenate([r.positive[horizon][r.scored] for r in runs]).astype(np.float32)
        rng = np.random.default_rng(0)
        negatives = np.flatnonzero(y == 0)
        keep = np.concatenate([np.flatnonzero(y > 0), rng.permutation(negatives)[:100_000]])
        raw, y = raw[keep], y[keep]
        self.mean, self.std = raw.mean(0), raw.std(0) + 1e-9
        x = torch.tensor(np.clip((raw - self.mean) / self.std, -10, 10), dtype=torch.float32)
        target = torch.tensor(y)
        torch.manual_seed(0)
        width = x.shape[1]
        self.net = torch.nn.Sequential(
            torch.nn.Linear(width, 32),
            torch.nn.GELU(),
            torch.nn.Linear(32, 32),
            torch.nn.GELU(),
            torch.nn.Linear(32, 1),
        )
        opt = torch.optim.Adam(self.net.parameters(), lr=3e-3, weight_decay=1e-4)
        weight = float((target == 0).sum() / max(float(target.sum()), 1.0))
        batches = torch.Generator().manual_seed(0)
        for _ in range(3000):
            rows = torch.randint(0, len(x), (512,), generator=batches)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                self.net(x[rows]).squeeze(1), target[rows], pos_weight=torch.tensor(weight)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()

    def score(self, scores: np.ndarray) -> np.ndarray:
        x = np.clip((transformed(scores) - self.mean) / self.std, -10, 10)
        with torch.no_grad():
            return self.net(torch.tensor(x, dtype=torch.float32)).squeeze(1).numpy().astype(float)

    def state(self) -> dict[str, Any]:
        weights = {k: v.tolist() for k, v in self.net.state_dict().items()}
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "net": weights}

    def load_state(self, state: dict[str, Any]) -> None:
        self.mean, self.std = np.asarray(state["mean"]), np.asarray(state["std"])
        self.net = self.build(len(self.mean))
        self.net.load_state_dict({k: torch.tensor(v) for k, v in state["net"].items()})

    @staticmethod
    def build(width: int) -> torch.nn.Module:
        layers = [torch.nn.Linear(width, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(32, 1))


def methods() -> dict[str, Callable[[], Method]]:
    """Every method scored, by name."""
    out: dict[str, Callable[[], Method]] = {s: (lambda s=s: Single(s)) for s in SCORES}
    out["quantile-max"] = QuantileMax
    out["logistic-per-step"] = lambda: Logistic(per_step_only=True)
    out["logistic"] = Logistic
    out["mlp"] = Network
    return out


@dataclass
class Warner:
    """A method fitted on some tasks' runs, with its threshold at one horizon: what ``corpus.py --intervene`` acts
    on. Saved as JSON (``save``, ``load``)."""

    method: str
    horizon: int
    threshold: float
    state: dict[str, Any]
    fitted_on: list[str]

    @classmethod
    def fitted(cls, name: str, runs: list[Run], horizon: int) -> Warner:
        method = methods()[name]()
        method.fit(runs, horizon)
        tau = threshold_for(runs, [method.score(r.scores) for r in runs], horizon)
        return cls(name, horizon, tau, method.state(), sorted({r.meta["name"] for r in runs}))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.__dict__) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Warner:
        return cls(**json.loads(Path(path).read_text()))

    @property
    def reads_curvature(self) -> bool:
        return not methods()[self.method]().per_step_only

    def online(self, meta: dict[str, Any]) -> Callable[[int, dict[str, Any], dict[str, float] | None], bool]:
        """``warn(step, quantities, curvature)``: whether step ``step`` of the run ``meta`` describes (its
        ``optimizer`` and the ``numels`` of its tensors) warns, from its row of ``corpus.RAW`` quantities, ``loss``,
        ``grad_norm`` and ``lr``, and the curvature ratios measured after it (None when none was)."""
        method = methods()[self.method]()
        method.load_state(self.state)
        feeder = Feeder([meta])

        def warn(step: int, quantities: dict[str, Any], curvature: dict[str, float] | None) -> bool:
            row = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in quantities.items()}
            scores = feeder.feed(step, row)
            if curvature:
                feeder.measured({k: torch.tensor(float(v)) for k, v in curvature.items()}, scores)
            x = np.array([[float(scores[k]) for k in SCORES]])
            return bool(method.score(x)[0] > self.threshold)

        return warn


# ------------------------------------------------------------------------------------------------ metrics
def auroc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The area under the ROC curve (Mann–Whitney, ties counted half); NaN without both classes."""
    n1, n0 = int(positive.sum()), int((~positive).sum())
    if n1 == 0 or n0 == 0:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auprc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Average precision: Σ over distinct thresholds of precision × the recall it adds; NaN without positives."""
    n1 = int(positive.sum())
    if n1 == 0:
        return math.nan
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], positive[order]
    last_of_tie = np.r_[s[1:] != s[:-1], True]
    tp, seen = np.cumsum(y)[last_of_tie], np.arange(1, len(s) + 1)[last_of_tie]
    recall_gain = np.diff(np.r_[0, tp]) / n1
    return float(np.sum(recall_gain * tp / seen))


def threshold_for(runs: list[Run], scores: list[np.ndarray], horizon: int) -> float:
    """The lowest τ at which the negative scored steps with a score > τ are ≤ ``FALSE_ALARMS`` of the scored steps."""
    negatives = np.concatenate([s[r.scored & ~r.positive[horizon]] for r, s in zip(runs, scores, strict=True)])
    steps = sum(int(r.scored.sum()) for r in runs)
    allowed = int(FALSE_ALARMS * steps)
    ordered = np.sort(negatives)[::-1]
    return float(ordered[allowed]) if allowed < len(ordered) else -math.inf


def alarms(score: np.ndarray, tau: float, latency: int = 0, every: int = 1) -> np.ndarray:
    """Steps at which a warning is *known* (boolean, index 0 is step 1): a score > τ at step t is read at the first
    multiple of ``every`` ≥ t, ``latency`` steps later."""
    raised = score > tau
    if every == 1 and latency == 0:
        return raised
    known = np.zeros_like(raised)
    for i in np.flatnonzero(raised):
        at = (math.ceil((i + 1) / every) * every) - 1 + latency
        if at < len(known):
            known[at] = True
    return known


def event_outcomes(runs: list[Run], known: list[np.ndarray], horizon: int) -> list[dict[str, Any]]:
    """Per event: whether an alarm was known in the ``horizon`` steps before its onset, and the lead of the first."""
    out = []
    for run, alarm in zip(runs, known, strict=True):
        for event in run.events:
            lo = max(0, event.onset - 1 - horizon)
            window = np.flatnonzero(alarm[lo : event.onset - 1] & run.scored[lo : event.onset - 1])
            lead = event.onset - 1 - (lo + int(window[0])) if window.size else None
            out.append({"run": run.meta["name"], "onset": event.onset, "kind": event.kind, "lead": lead})
    return out


def evaluate(
    method: Method, fit: list[Run], test: list[Run], latency: int = 0, every: int = 1
) -> dict[int, dict[str, Any]]:
    """``method`` fitted on ``fit`` (per horizon: its weights and its threshold), scored on ``test``."""
    out = {}
    for n in HORIZONS:
        method.fit(fit, n)
        tau = threshold_for(fit, [method.score(r.scores) for r in fit], n)
        scores = [method.score(r.scores) for r in test]
        mask = np.concatenate([r.scored for r in test])
        pooled = np.concatenate(scores)[mask]
        positive = np.concatenate([r.positive[n] for r in test])[mask]
        known = [alarms(s, tau, latency, every) for s in scores]
        false = sum(int((k & r.scored & ~r.positive[n]).sum()) for k, r in zip(known, test, strict=True))
        outcomes = event_outcomes(test, known, n)
        leads = [o["lead"] for o in outcomes if o["lead"] is not None]
        # the same at the threshold that would give ≤ 1 false alarm per 1,000 steps on the test runs themselves:
        # how well the method ranks, apart from how well a threshold carries over from other tasks
        own = threshold_for(test, scores, n)
        own_outcomes = event_outcomes(test, [alarms(s, own, latency, every) for s in scores], n)
        out[n] = {
            "auroc": auroc(pooled, positive),
            "auprc": auprc(pooled, positive),
            "base_rate": float(positive.mean()) if positive.size else math.nan,
            "threshold": tau,
            "events": len(outcomes),
            "recall": len(leads) / len(outcomes) if outcomes else math.nan,
            "recall_own_threshold": _recall(own_outcomes),
            "recall_spikes": _recall([o for o in outcomes if o["kind"] == "spike"]),
            "recall_divergences": _recall([o for o in outcomes if o["kind"] == "divergence"]),
            "false_alarms_per_1000": 1000 * false / max(int(mask.sum()), 1),
            "median_lead": float(np.median(leads)) if leads else math.nan,
            "steps": int(mask.sum()),
        }
    return out


def _recall(outcomes: list[dict[str, Any]]) -> float:
    return sum(o["lead"] is not None for o in outcomes) / len(outcomes) if outcomes else math.nan


# ------------------------------------------------------------------------------------------------ protocol
def folds(runs: list[Run], split: str) -> list[tuple[str, list[Run], list[Run]]]:
    """(held-out task, fitting runs, test runs) for each task: fit on the other tasks' fitting seeds; test on this
    task's held-out seeds (``final``) or its fitting seeds (``dev``, to choose a method without the held-out ones)."""
    tasks = sorted({r.task for r in runs})
    test_seeds = HELD_OUT_SEEDS if split == "final" else FIT_SEEDS
    out = []
    for task in tasks:
        fit = [r for r in runs if r.task != task and r.seed in FIT_SEEDS]
        test = [r for r in runs if r.task == task and r.seed in test_seeds]
        out.append((task, fit, test))
    return out


def pooled(per_fold: dict[str, dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """The folds' numbers combined: AUROC and AUPRC as their mean over tasks (each task's own pooled steps), recall
    and false alarms weighted by events and steps, the median lead over all detected events' medians (weighted)."""
    out = {}
    for n in HORIZONS:
        parts = [f[n] for f in per_fold.values()]
        events = sum(p["events"] for p in parts)
        steps = sum(p["steps"] for p in parts)
        detected = [(p["recall"] * p["events"], p["median_lead"]) for p in parts if p["events"]]
        out[n] = {
            "auroc": float(np.nanmean([p["auroc"] for p in parts])),
            "auprc": float(np.nanmean([p["auprc"] for p in parts])),
            "recall": _weighted(parts, "recall", "events"),
            "recall_own_threshold": _weighted(parts, "recall_own_threshold", "events"),
            "false_alarms_per_1000": sum(p["false_alarms_per_1000"] * p["steps"] for p in parts) / max(steps, 1),
            "median_lead": _weighted_median(detected),
            "events": events,
        }
    return out


def _weighted(parts: list[dict[str, Any]], key: str, weight: str) -> float:
    total = sum(p[weight] for p in parts if p[weight])
    return sum(p[key] * p[weight] for p in parts if p[weight]) / total if total else math.nan


def _weighted_median(pairs: list[tuple[float, float]]) -> float:
    pairs = sorted((lead, weight) for weight, lead in pairs if weight > 0 and math.isfinite(lead))
    if not pairs:
        return math.nan
    total, running = sum(w for _, w in pairs), 0.0
    for lead, weight in pairs:
        running += weight
        if running >= total / 2:
            return lead
    return pairs[-1][0]


def run_protocol(runs: list[Run], split: str, names: list[str], late: int = 0, every: int = 1) -> dict[str, Any]:
    """Every method in ``names`` through ``folds``: per task and pooled; its warnings read every ``every`` steps,
    ``late`` steps late."""
    results: dict[str, Any] = {}
    for name in names:
        per_fold = {}
        for task, fit, test in folds(runs, split):
            per_fold[task] = evaluate(methods()[name](), fit, test, late, every)
        results[name] = {"tasks": per_fold, "pooled": pooled(per_fold)}
        p = results[name]["pooled"]
        print(
            f"{name:22s} "
            + "  ".join(
                f"N={n}: AUROC {p[n]['auroc']:.3f} AUPRC {p[n]['auprc']:.3f} recall {p[n]['recall']:.2f} "
                f"FA {p[n]['false_alarms_per_1000']:.2f} lead {p[n]['median_lead']:.0f}"
                for n in HORIZONS
            ),
            flush=True,
        )
    return results


def corpus_table(runs: list[Run]) -> str:
    """Markdown: per task and optimizer, the runs, scored steps, spikes and divergences."""
    lines = ["| task | optimizer | runs | scored steps | spikes | divergences |", "|---|---|---|---|---|---|"]
    for task in sorted({r.task for r in runs}):
        for optimizer in ("adam", "adamw", "sgdm"):
            rs = [r for r in runs if r.task == task and r.meta["optimizer"] == optimizer]
            kinds = [e.kind for r in rs for e in r.events]
            lines.append(
                f"| {task} | {optimizer} | {len(rs)} | {sum(int(r.scored.sum()) for r in rs):,} | "
                f"{kinds.count('spike')} | {kinds.count('divergence')} |"
            )
    return "\n".join(lines)


def results_table(results: dict[str, Any], part: str = "pooled") -> str:
    """Markdown: one row per method; per horizon AUROC, AUPRC, recall, false alarms per 1,000 steps, median lead."""
    head = "| method | " + " | ".join(f"N={n}: AUROC · AUPRC · recall · FA/1k · lead" for n in HORIZONS) + " |"
    lines = [head, "|---|" + "---|" * len(HORIZONS)]
    for name, result in results.items():
        numbers = result[part] if part == "pooled" else result["tasks"][part]
        cells = [
            f"{p['auroc']:.3f} · {p['auprc']:.3f} · {p['recall']:.0%} · {p['false_alarms_per_1000']:.1f} · "
            f"{p['median_lead']:.0f}"
            for p in (numbers[n] for n in HORIZONS)
        ]
        label = f"{name} (baseline)" if name in BASELINES else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines).replace("nan", "—")


def save_warners(runs: list[Run], name: str, horizon: int, directory: Path) -> None:
    """For each task, ``name`` fitted on the other tasks' fitting seeds with its threshold at ``horizon``:
    ``directory/<task>.json``, the warner ``corpus.py --intervene`` acts on for that task's held-out seeds."""
    for task in sorted({r.task for r in runs}):
        fit = [r for r in runs if r.task != task and r.seed in FIT_SEEDS]
        Warner.fitted(name, fit, horizon).save(directory / f"{task}.json")
        print(f"{directory / f'{task}.json'}: {name} fitted on {len(fit)} runs of the other tasks", flush=True)


def final_loss(loss: np.ndarray, planned: int) -> float:
    """The mean training loss over the last tenth of a run's planned steps; inf for a run that diverged."""
    if len(loss) < planned or not np.all(np.isfinite(loss)):
        return math.inf
    return float(np.mean(loss[-max(1, planned // 10) :]))


def intervention_table(treated: Path, controls: Path) -> tuple[str, dict[str, Any]]:
    """Markdown and numbers: the runs ``corpus.py --intervene`` trained against the corpus runs of the same names
    (same seed, data and start): spikes, divergences, warnings acted on and final losses, per task."""
    rows, numbers = [], {}
    head = (
        "| task | runs | spikes: controls → with reduce_lr | divergences | runs with an action (actions) | "
        "final loss: median ratio | runs no worse |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for path in sorted((treated / "runs").glob("*/*.npz")):
        control = controls / "runs" / path.relative_to(treated / "runs")
        if control.exists():
            rows.append((corpus_module.read_run(path), corpus_module.read_run(control)))
    for task in sorted({t["meta"]["task"] for t, _ in rows}):
        pairs = [(t, c) for t, c in rows if t["meta"]["task"] == task]
        count = {
            side: {
                kind: sum(e.kind == kind for run in runs for e in labels.events(run["loss"]))
                for kind in ("spike", "divergence")
            }
            for side, runs in (("controls", [c for _, c in pairs]), ("treated", [t for t, _ in pairs]))
        }
        ratios = []
        for t, c in pairs:
            planned = t["meta"]["planned_steps"]
            a, b = final_loss(t["loss"], planned), final_loss(c["loss"], planned)
            ratios.append(a / b if math.isfinite(a) and math.isfinite(b) else (1.0 if a == b else a / b))
        acted = [len(t["meta"]["interventions"] or []) for t, _ in pairs]
        numbers[task] = {"runs": len(pairs), **count, "acted": acted, "final_loss_ratios": ratios}
        lines.append(
            f"| {task} | {len(pairs)} | {count['controls']['spike']} → {count['treated']['spike']} | "
            f"{count['controls']['divergence']} → {count['treated']['divergence']} | "
            f"{sum(a > 0 for a in acted)} ({sum(acted)}) | {float(np.median(ratios)):.3f} | "
            f"{sum(r <= 1 for r in ratios)} of {len(ratios)} |"
        )
    return "\n".join(lines), numbers


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--corpus", type=Path, required=True, help="the directory corpus.py built")
    parser.add_argument("--split", default="dev", choices=("dev", "final"))
    parser.add_argument("--method", action="append", default=None, help="score only these methods (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the corpus and result tables here")
    parser.add_argument("--read-every", type=whole_number(1), default=1, help="warnings read every K steps")
    parser.add_argument("--late", type=whole_number(0), default=0, help="warnings known L steps after the step")
    parser.add_argument("--save-warners", type=Path, default=None, metavar="DIR", help="the first --method, fitted")
    parser.add_argument("--horizon", type=int, default=20, choices=HORIZONS, help="the saved warners' horizon")
    parser.add_argument(
        "--intervention", type=Path, default=None, metavar="DIR", help="compare these runs with --corpus"
    )
    args = parser.parse_args()
    if not (args.corpus / "runs").is_dir():
        parser.error(f"--corpus {args.corpus}: no runs/ inside; give the directory corpus.py --out built")
    if args.save_warners is not None and not args.method:
        parser.error("--save-warners needs --method NAME, the method to fit")
    names = args.method or list(methods())
    unknown = [n for n in names if n not in methods()]
    if unknown:
        parser.error(f"--method {unknown[0]!r}: give one of {', '.join(methods())}")
    torch.set_num_threads(1)
    if args.intervention is not None:
        table, numbers = intervention_table(args.intervention, args.corpus)
        print(table)
        if args.json:
            args.json.write_text(json.dumps(numbers, indent=1, default=float) + "\n")
        return
    seeds = FIT_SEEDS if args.split == "dev" else FIT_SEEDS + HELD_OUT_SEEDS
    runs = load(args.corpus, seeds)
    if args.save_warners is not None:
        save_warners(runs, names[0], args.horizon, args.save_warners)
        return
    print(f"{len(runs)} runs, {sum(len(r.events) for r in runs)} events", flush=True)
    results = run_protocol(runs, args.split, names, args.late, args.read_every)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float) + "\n")
    if args.markdown:
        tasks = sorted({r.task for r in runs})
        parts = [
            f"## {args.split}: corpus",
            corpus_table(runs),
            f"## {args.split}: all held-out tasks",
            results_table(results),
        ]
        for task in tasks:
            parts += [f"## {args.split}: {task} held out", results_table(results, task)]
        args.markdown.write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
