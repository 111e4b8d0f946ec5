r"""Pure tensor maths behind the monitor: norms, update statistics, effective learning rates.

For a parameter tensor θ with gradient g, taking the step θ → θ′ (u = θ′ − θ, the *actual* update,
whatever optimizer made it):

    g  = ‖g‖₂           w = ‖θ′‖₂           u = ‖θ′ − θ‖₂
    u/w                  the relative size of the step
    cos(u, −g) = ⟨u, −g⟩ / (‖u‖ ‖g‖)    1 for a plain SGD step, less when momentum or
                                         per-coordinate scaling (Adam) turn the step away from −g
    u_rms = u / √n       Muon's and Lion's natural scale (Lion moves every coordinate by ~η)

Group and overall figures combine tensors as one long vector: ‖·‖ = (Σ ‖·‖ᵢ²)^½.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..curvature.rules import known_class, radam_rectification
from ..optim.adam import Adam as OwnAdam
from ..optim.adam import adam_steps
from ..optim.muon import MuonWithAdamW


def foreach_norms(tensors: Sequence[Tensor]) -> Tensor:
    """L2 norm of each tensor, as one float64 vector on the CPU (one device transfer in all).

    Accumulated in float32 at least (a bf16 / fp16 norm would be rounded to 3 or 4 digits, and an fp16
    norm above 65504 would be inf); a norm that overflows float32 although every entry is finite is
    measured again in float64, so that only a tensor holding inf or nan has a non-finite norm.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float64)
    by_key: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        by_key.setdefault((t.device, t.dtype), []).append(i)
    if len(by_key) == 1:  # the common case, at a few dispatches whatever the number of tensors
        (_, dtype) = next(iter(by_key))
        out = torch.stack(torch._foreach_norm(tensors, 2, dtype=_wide(dtype))).to("cpu", torch.float64)
    else:
        out = torch.empty(len(tensors), dtype=torch.float64)
        for (_, dtype), idx in by_key.items():
            norms = torch._foreach_norm([tensors[i] for i in idx], 2, dtype=_wide(dtype))
            out[idx] = torch.stack(norms).to("cpu", torch.float64)
    for i, x in enumerate(out.tolist()):
        if math.isinf(x) and torch.isfinite(tensors[i]).all():  # rare: a diverging run's last steps
            out[i] = float(torch.linalg.vector_norm(tensors[i], dtype=torch.float64))
    return out


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype a sum over ``dtype`` entries is accumulated in: float32 at least."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def dot(a: Tensor, b: Tensor) -> Tensor:
    """⟨a, b⟩ without a parameter-sized temporary (float32/64 accumulate natively, others in float32)."""
    if a.dtype not in (torch.float32, torch.float64):
        a, b = a.float(), b.float()
    return torch.dot(a.reshape(-1), b.reshape(-1))


def foreach_dots(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    """⟨aᵢ, bᵢ⟩ for each pair, float64 on the CPU."""
    if not a:
        return torch.zeros(0, dtype=torch.float64)
    dots = [dot(x, y) for x, y in zip(a, b, strict=True)]
    same = all(d.device == dots[0].device and d.dtype == dots[0].dtype for d in dots)
    out = (torch.stack(dots) if same else torch.stack([d.double().cpu() for d in dots])).to("cpu", torch.float64)
    for i, x in enumerate(out.tolist()):
        if not math.isfinite(x) and torch.isfinite(a[i]).all() and torch.isfinite(b[i]).all():
            # rare, a diverging run's last steps: finite entries whose float32 sum overflowed
            out[i] = torch.dot(a[i].reshape(-1).double(), b[i].reshape(-1).double())
    return out


def update_norms(
    weights: Sequence[Tensor], neg_updates: Sequence[Tensor], grads: Sequence[Tensor]
) -> tuple[list[float], list[float], list[float]]:
    """‖θ′ᵢ‖, ‖uᵢ‖ and ⟨−uᵢ, gᵢ⟩ of each tensor, as ``foreach_norms`` and ``foreach_dots`` give them.

    On the CPU, for plain float32/float64 tensors, tensor by tensor through NumPy: each tensor's three arrays are
    read into cache once for its three sums, where three reductions over all tensors, one after the other, read
    every array from memory again (a measured step of the 107k-parameter GPT in ``benchmarks/monitor_overhead.py``:
    0.23 ms less in the training loop, about 9 % of the monitor's cost). Sums accumulate in the tensors' own
    precision, as torch's do; one that overflows although every entry is finite is taken again in float64.
    """
    host = _on_host([*weights, *neg_updates, *grads])
    if host is None:
        both = foreach_norms([*weights, *neg_updates]).tolist()
        return both[: len(weights)], both[len(weights) :], foreach_dots(neg_updates, grads).tolist()
    n = len(weights)
    w, u, dots = [], [], []
    for i in range(n):
        theta, neg, g = host[i], host[n + i], host[2 * n + i]
        w.append(_sum_or_wide(theta, theta, weights[i], weights[i]) ** 0.5)
        u.append(_sum_or_wide(neg, neg, neg_updates[i], neg_updates[i]) ** 0.5)
        dots.append(_sum_or_wide(neg, g, neg_updates[i], grads[i]))
    return w, u, dots


def _sum_or_wide(a: np.ndarray, b: np.ndarray, ta: Tensor, tb: Tensor) -> float:
    """⟨a, b⟩ in their precision, or in float64 where that overflows although every entry is finite."""
    x = float(np.vdot(a, b))
    if not math.isfinite(x) and np.isfinite(a).all() and np.isfinite(b).all():
        x = float(torch.dot(ta.detach().reshape(-1).double(), tb.detach().reshape(-1).double()))
    return x


def _on_host(tensors: Sequence[Tensor]) -> list[np.ndarray] | None:
    """NumPy views of ``tensors`` when every one is a plain float32 or float64 tensor on the CPU, else None."""
    for t in tensors:
        if type(t) not in (Tensor, torch.nn.Parameter) or t.dtype not in _HOST or t.device.type != "cpu":
            return None
    return [(t.detach() if t.requires_grad else t).numpy() for t in tensors]


_HOST = (torch.float32, torch.float64)


def nonfinite_counts(tensors: Sequence[Tensor], norms: Tensor | Sequence[float]) -> list[int]:
    """Number of inf/nan entries per tensor. A finite norm proves a tensor finite, so only tensors with
    a non-finite norm are scanned (the norm of finite entries can overflow too; then the count is 0)."""
    values = norms.tolist() if isinstance(norms, Tensor) else norms
    return [0 if math.isfinite(n) else int((~torch.isfinite(t)).sum()) for t, n in zip(tensors, values, strict=True)]


def zero_counts(tensors: Sequence[Tensor]) -> list[int]:
    """Number of exactly-zero entries per tensor (read from the device in one transfer)."""
    if not tensors:
        return []
    nonzero = [torch.count_nonzero(t) for t in tensors]
    if all(n.device == nonzero[0].device for n in nonzero):
        counts = torch.stack(nonzero).tolist()
    else:
        counts = [int(n) for n in nonzero]
    return [t.numel() - c for t, c in zip(tensors, counts, strict=True)]


def combined_norm(norms: Sequence[float]) -> float:
    """‖(v₁, …, vₙ)‖ from the parts' norms (their squares summed exactly rounded, in float64)."""
    return math.sqrt(math.fsum(x * x for x in norms))


def safe_ratio(num: float, den: float) -> float:
    """num/den, inf for x/0 with x > 0, nan for 0/0 — never a ZeroDivisionError."""
    if den == 0:
        return math.nan if num == 0 else math.inf
    return num / den


def cosine(dot: float, norm_a: float, norm_b: float) -> float:
    return safe_ratio(dot, norm_a * norm_b)


class Rate(NamedTuple):
    """A per-element effective learning rate η_eff = ``scale`` / (√(x/``divisor``) + ``eps``), or with ``root``
    False ``scale`` / (x/``divisor`` + ``eps``): the factor by which a step multiplies the direction it applies,
    falling as x (a second moment, a sum of squares, an infinity norm) grows; ``x`` None: ``scale`` everywhere."""

    x: Tensor | None
    scale: float
    eps: float = 0.0
    divisor: float = 1.0
    root: bool = True

    def at(self, x: Any) -> Any:
        """η_eff at ``x``: a float (NaN for a non-finite one) or a tensor of them."""
        if isinstance(x, Tensor):
            x = x / self.divisor
            return self.scale / ((x.sqrt() if self.root else x) + self.eps)
        if not math.isfinite(x):
            return math.nan
        x = max(x, 0.0) / self.divisor
        return self.scale / ((math.sqrt(x) if self.root else x) + self.eps)


def _stepped(state: dict[str, Any]) -> float:
    """t, a torch.optim state's step count (read once: on a GPU it costs a synchronisation); KeyError at 0."""
    t = float(state["step"]) if "step" in state else 0.0
    if t == 0:
        raise KeyError("not stepped yet")
    return t


def adam_rate(state: dict[str, Any], group: dict[str, Any]) -> Rate:
    """Adam, AdamW (torch's and ours) and torch's NAdam: θ ← θ − η d/(√v̂ + ε) with v̂ = v/(1 − β₂ᵗ) (v_max's with
    amsgrad), d = m̂ for Adam and NAdam's own blend of g and m for NAdam; decoupled weight decay apart."""
    t = adam_steps(state)
    if t == 0:
        raise KeyError("not stepped yet")
    v = state["max_exp_avg_sq"] if group.get("amsgrad") else state["exp_avg_sq"]
    bc2 = 1 - group["betas"][1] ** t if group.get("bias_correction", True) else 1.0
    return Rate(v, float(group["lr"]), float(group["eps"]), bc2)


def radam_rate(state: dict[str, Any], group: dict[str, Any]) -> Rate:
    """torch's RAdam: θ ← θ − η r √(1 − β₂ᵗ)/(√v + ε) m̂ once the variance is tractable (ρₜ > 5, r its
    rectification), θ ← θ − η m̂ before (the first steps: ρₜ ≤ 5)."""
    t = _stepped(state)
    beta2, lr = group["betas"][1], float(group["lr"])
    rect = radam_rectification(beta2, t)
    if rect is None:
        return Rate(None, lr)
    return Rate(state["exp_avg_sq"], lr * rect * math.sqrt(1 - beta2**t), float(group["eps"]))


def adamax_rate(state: dict[str, Any], group: dict[str, Any]) -> Rate:
    """torch's Adamax: θ ← θ − η m̂/u, with u = max(β₂u, |g| + ε) (ε inside u)."""
    _stepped(state)
    return Rate(state["exp_inf"], float(group["lr"]), root=False)


def rmsprop_rate(state: dict[str, Any], group: dict[str, Any]) -> Rate:
    """torch's RMSprop: θ ← θ − η g/(√v + ε), v − ḡ² for v when centered; with momentum μ the buffer
    b ← μb + g/(√v + ε) takes that factor, and θ ← θ − η b."""
    _stepped(state)
    v = state["square_avg"]
    if group.get("centered"):
        v = v.addcmul(state["grad_avg"], state["grad_avg"], value=-1)
    return Rate(v, float(group["lr"]), float(group["eps"]))


def adagrad_rate(state: dict[str, Any], group: dict[str, Any]) -> Rate:
    """torch's Adagrad: θ ← θ − η/(1 + (t − 1)·lr_decay) · g/(√s + ε), s the sum of all g² so far."""
    t = _stepped(state)
    return Rate(state["sum"], float(group["lr"]) / (1 + (t - 1) * group["lr_decay"]), float(group["eps"]))


#: torch.optim's optimizers whose step optiscope knows, and the rule of each (``tests/monitor`` checks every one
#: against the rate a real ``step()`` applied); AdamW is a torch.optim.Adam whose ``step`` is Adam's
RATE_RULES: dict[type, Callable[[dict[str, Any], dict[str, Any]], Rate]] = {
    torch.optim.Adam: adam_rate,
    torch.optim.AdamW: adam_rate,
    torch.optim.NAdam: adam_rate,
    torch.optim.RAdam: radam_rate,
    torch.optim.Adamax: adamax_rate,
    torch.optim.RMSprop: rmsprop_rate,
    torch.optim.Adagrad: adagrad_rate,
}


@functools.cache
def public_name(cls: type) -> str:
    """``cls`` by its shortest import path (``torch.optim.RAdam``, not ``torch.optim.radam.RAdam``)."""
    parts = cls.__module__.split(".")
    for i in range(1, len(parts)):
        if getattr(sys.modules.get(".".join(parts[:i])), cls.__qualname__, None) is cls:
            return f"{'.'.join(parts[:i])}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def _known_rule(cls: type) -> type | None:
    """``known_class`` of an optimizer class among ``RATE_RULES``, looked up once per class: it runs per parameter
    on every measured step."""
    return known_class(cls, RATE_RULES)


def effective_rate(optimizer: torch.optim.Optimizer, param: Tensor, group: dict[str, Any]) -> Rate | Tensor | str:
    """The effective learning rate of ``param``'s latest step where optiscope knows the optimizer's rule: a
    ``Rate``, or the full tensor from the optimizer's own ``effective_lr`` (optiscope's RMSprop); else one
    line saying why there is none."""
    state = optimizer.state.get(param, {})
    try:
        if isinstance(optimizer, MuonWithAdamW) and group.get("use_muon"):
            optimizer.effective_lr(param)  # raises, saying why a Muon group has none
        if isinstance(optimizer, OwnAdam | MuonWithAdamW):  # Adam's state: min, median, max in two reductions
            return adam_rate(state, group)
        if hasattr(optimizer, "effective_lr"):  # the optimizer states its own rule
            return optimizer.effective_lr(param)
        known = _known_rule(type(optimizer))
        if known is not None:
            return RATE_RULES[known](state, group)
        if public_name(type(optimizer)).startswith("optiscope."):  # SGD, Lion, Muon: η times their direction
            return f"{public_name(type(optimizer))}: no per-element rate (its step is lr times its direction)"
        return f"{public_name(type(optimizer))}: step rule not known to optiscope"
    except KeyError as error:  # not stepped yet (or a Muon group): no rate
        reason = error.args[0] if error.args else "not stepped yet"
        return f"{public_name(type(optimizer))}: {reason}"


def effective_lr(optimizer: torch.optim.Optimizer, param: Tensor) -> Tensor | None:
    """The effective learning rate of ``param``'s latest step, per element, or None (``effective_rate``)."""
    group = next((g for g in optimizer.param_groups if any(q is param for q in g["params"])), None)
    rate = None if group is None else effective_rate(optimizer, param, group)
    if isinstance(rate, Rate):
        return torch.full_like(param, rate.scale) if rate.x is None else rate.at(_real(rate.x))
    return rate if isinstance(rate, Tensor) else None


def _real(x: Tensor) -> Tensor:
    """A complex parameter's state as its real and imaginary parts, which torch.optim steps each on its own."""
    return torch.view_as_real(x) if x.is_complex() else x


def effective_lr_summaries(
    optimizer: torch.optim.Optimizer, params: Sequence[Tensor], groups: Sequence[dict[str, Any]]
) -> list[dict[str, float] | str]:
    """min / median / max of each parameter's effective learning rate (``groups[i]`` holds ``params[i]``), without
    building it element by element; or one line saying why there is none (``effective_rate``).

    The median is torch's (the lower of the two middle entries of an even count), as ``summarize`` takes it.
    A ``Rate`` falls as its x grows, so its min, lower median and max are the map of x's max, upper median
    and min: two reductions and a selection over x instead of a parameter-sized temporary; on the CPU through
    NumPy (its ``partition`` selects the median several times faster than ``torch.kthvalue``), on a device
    with torch's, read back in one transfer for all parameters. A rate that the optimizer's own
    ``effective_lr`` gives (RMSprop) is summarised from the full tensor.
    """
    out: list[dict[str, float] | str] = []
    on_device: list[tuple[int, Rate, Tensor]] = []  # (place, rate, [max, upper median, min] of x) to read at once
    for p, group in zip(params, groups, strict=True):
        rate = effective_rate(optimizer, p, group)
        if isinstance(rate, str):
            out.append(rate)
        elif isinstance(rate, Tensor):
            out.append(summarize(rate))
        elif rate.x is None:
            out.append({"min": rate.scale, "median": rate.scale, "max": rate.scale})
        elif rate.x.numel() == 0:
            out.append({"min": math.nan, "median": math.nan, "max": math.nan})
        elif rate.x.device.type == "cpu":
            out.append(_rate_summary(rate, *_cpu_extremes(_real(rate.x))))
        else:
            x = _real(rate.x)
            lo, hi = torch.aminmax(x)
            flat = sampled(x.flatten())
            middle = torch.kthvalue(flat, flat.numel() // 2 + 1).values  # x's upper median (0-based n//2)
            on_device.append((len(out), rate, torch.stack([hi, middle, lo]).double()))
            out.append("")
    if on_device:
        values = torch.stack([t.to(on_device[0][2].device) for _, _, t in on_device]).tolist()
        for (i, rate, _), extremes in zip(on_device, values, strict=True):
            out[i] = _rate_summary(rate, *extremes)
    return out


def _cpu_extremes(x: Tensor) -> tuple[float, float, float]:
    """The max, upper median (over ``sampled``'s sample) and min of a CPU tensor, through NumPy."""
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    a = (x.detach() if x.requires_grad else x).numpy().reshape(-1)
    sample = a[:: a.size // MEDIAN_SAMPLE] if a.size > MEDIAN_SAMPLE else a
    k = sample.size // 2
    return float(a.max()), float(np.partition(sample, k)[k]), float(a.min())


def _rate_summary(rate: Rate, hi: float, middle: float, lo: float) -> dict[str, float]:
    """A falling rate's min, median and max from its x's max, upper median and min."""
    return {"min": rate.at(hi), "median": rate.at(middle), "max": rate.at(lo)}


MEDIAN_SAMPLE = 8192


def summarize(values: Tensor) -> dict[str, float]:
    """min / median / max of a tensor's finite entries (nan when there are none).

    min and max are exact. The median is exact up to ``MEDIAN_SAMPLE`` entries; above that it is the
    median of an evenly strided sample of about that many entries (``sampled``): a median is a sort, and
    on every step of a large model the exact one would cost more than the training step it describes.
    """
    flat = values.detach().flatten()
    lo, hi = torch.aminmax(flat) if flat.numel() else (torch.tensor(math.nan), torch.tensor(math.nan))
    if not (torch.isfinite(lo) and torch.isfinite(hi)):
        flat = flat[torch.isfinite(flat)]
        if flat.numel() == 0:
            return {"min": math.nan, "median": math.nan, "max": math.nan}
        lo, hi = torch.aminmax(flat)
    return {"min": float(lo), "median": float(sampled(flat).median()), "max": float(hi)}


def sampled(flat: Tensor) -> Tensor:
    """``flat`` itself up to ``MEDIAN_SAMPLE`` entries, else an evenly strided sample of about that many."""
    return flat[:: flat.numel() // MEDIAN_SAMPLE] if flat.numel() > MEDIAN_SAMPLE else flat


def log_histogram(values: Tensor, bins: int = 20) -> dict[str, Any]:
    """Counts of log10(values) in ``bins`` equal bins over their finite positive range."""
    flat = values.detach().flatten().double()
    flat = flat[torch.isfinite(flat) & (flat > 0)].log10()
    if flat.numel() == 0:
        return {"log10_edges": [], "counts": []}
    lo, hi = float(flat.min()), float(flat.max())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts = torch.histc(flat, bins=bins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, bins + 1)
    return {"log10_edges": edges.tolist(), "counts": [int(c) for c in counts.tolist()]}


def row_norms(matrix: Tensor) -> Tensor:
    """‖row‖₂ for each row of a 2-D tensor, float64 on the CPU."""
    return torch.linalg.vector_norm(matrix.double(), dim=1).cpu()


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman rank correlation (average ranks for ties); nan if either side is constant."""

    def ranks(v: Tensor) -> Tensor:
        order = torch.argsort(v, stable=True)
        r = torch.empty_like(v, dtype=torch.float64)
        r[order] = torch.arange(len(v), dtype=torch.float64)
        # average the ranks of tied values
        values, inverse = torch.unique(v, return_inverse=True)
        sums = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, r)
        counts = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
        return (sums / counts)[inverse]

    x, y = x.double().flatten(), y.double().flatten()
    if len(x) < 2:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(torch.sqrt((rx**2).sum() * (ry**2).sum()))
    return float((rx * ry).sum()) / den if den > 0 else math.nan


def update_ratio_by(params: dict[str, dict[str, Any]], key: Callable[[str], str]) -> dict[str, float]:
    """u/w of each group of a record's parameters (grouped by ``key(name)``), the group taken as one long
    vector: √Σu² / √Σw² (nan for a group whose weights are all zero)."""
    sums: dict[str, list[float]] = {}
    for name, entry in params.items():
        group = sums.setdefault(key(name), [0.0, 0.0])
        group[0] += entry["u"] ** 2
        group[1] += entry["w"] ** 2
    return {k: math.sqrt(u) / math.sqrt(w) if w > 0 else math.nan for k, (u, w) in sums.items()}


def loglog_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Least-squares line log y = slope · log x + intercept through positive points, and its R²
    (nan when log y is constant). All nan when x takes fewer than two values: no line is determined."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    if np.unique(lx).size < 2:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan}
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (slope * lx + intercept)
    total = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1 - float(residual @ residual) / total if total > 0 else math.nan
    return {"slope": float(slope), "intercept": float(intercept), "r2": r2}
