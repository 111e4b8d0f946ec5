"""Shared test helpers: random problems that drive an optimizer in torch and in NumPy identically."""

from __future__ import annotations

import collections
import fcntl
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: For the tests that check a CUDA device's paths: skipped where torch sees none (CI has none); run them on a GPU
#: machine with ``pytest -m cuda``.
needs_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@dataclass
class Quadratic:
    """f(θ) = ½ Σ d ⊙ (θ − θ*)², observed with additive gradient noise ξ_t drawn in advance.

    The gradient at step t is g_t = d ⊙ (θ − θ*) + σ ξ_t: it depends on the current θ (closed loop,
    like real training) and on t, so two implementations that agree keep agreeing.
    """

    shapes: list[tuple[int, ...]]
    seed: int
    steps: int = 100
    noise: float = 0.3
    concave: bool = False  # f → −f, for optimizers run with maximize=True

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)

        def draw(sample, shape):
            return np.asarray(sample(size=shape), dtype=np.float64)

        self.theta0 = [draw(rng.normal, s) for s in self.shapes]
        self.target = [draw(rng.normal, s) for s in self.shapes]
        self.curvature = [draw(lambda size: rng.uniform(0.1, 2.0, size=size), s) for s in self.shapes]
        self.xi = [[draw(rng.normal, s) for s in self.shapes] for _ in range(self.steps)]

    def grad(self, i: int, theta: np.ndarray, t: int) -> np.ndarray:
        sign = -1.0 if self.concave else 1.0
        return sign * self.curvature[i] * (theta - self.target[i]) + self.noise * self.xi[t][i]

    def run_numpy(self, make_opt) -> tuple[list[np.ndarray], object]:
        params = [{"params": th.copy(), "grad": np.zeros_like(th)} for th in self.theta0]
        opt = make_opt(params)
        for t in range(self.steps):
            for i, p in enumerate(params):
                p["grad"][...] = self.grad(i, p["params"], t)
            opt.step()
        return [p["params"] for p in params], opt

    def run_torch(self, make_opt, dtype=torch.float64) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
        params = [torch.tensor(th, dtype=dtype, requires_grad=True) for th in self.theta0]
        opt = make_opt(params)
        for t in range(self.steps):
            for i, p in enumerate(params):
                g = self.grad(i, p.detach().double().numpy(), t)
                p.grad = torch.tensor(g, dtype=dtype)
            opt.step()
        return [p.detach() for p in params], opt


def assert_rel_close(actual, expected, rtol: float = 1e-10, what: str = "") -> None:
    """|actual − expected| ≤ rtol · max|expected| element-wise (relative to the tensor's own scale)."""
    a = np.asarray(actual.detach().double() if isinstance(actual, torch.Tensor) else actual, dtype=np.float64)
    e = np.asarray(expected.detach().double() if isinstance(expected, torch.Tensor) else expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    scale = max(float(np.max(np.abs(e), initial=0.0)), 1e-300)
    err = float(np.max(np.abs(a - e), initial=0.0))
    assert err <= rtol * scale, f"{what}: max abs error {err:.3e} > {rtol:.0e} x scale {scale:.3e}"


def state_tensors_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    if sa.keys() != sb.keys():
        return False
    for k in sa:
        if sa[k].keys() != sb[k].keys():
            return False
        for name in sa[k]:
            x, y = sa[k][name], sb[k][name]
            if isinstance(x, torch.Tensor):
                if not torch.equal(x.to(y.device), y):
                    return False
            elif x != y:
                return False
    return True


def ordered_states(opt: torch.optim.Optimizer) -> list[dict]:
    """The optimizer's per-parameter state, in parameter order across groups."""
    return [opt.state.get(p, {}) for g in opt.param_groups for p in g["params"]]


def assert_matches_twin(ours, twin, state_names: dict[str, str], rtol: float = 1e-10) -> None:
    """Our (params, optimizer) run equals the NumPy twin's run: parameters and every state buffer."""
    (params, opt), (twin_params, twin_opt) = ours, twin
    for i, (a, b) in enumerate(zip(params, twin_params, strict=True)):
        assert_rel_close(a, b, rtol, f"param {i}")
    for i, state in enumerate(ordered_states(opt)):
        for ours_name, twin_name in state_names.items():
            if ours_name in state:
                assert_rel_close(state[ours_name], twin_opt.state[i][twin_name], rtol, f"state {i} {ours_name}")


def assert_same_run(a, b, rtol: float = 1e-10, exact: bool = False) -> None:
    """Two torch runs (params, optimizer) agree on parameters and on every state tensor."""
    (params_a, opt_a), (params_b, opt_b) = a, b
    for i, (x, y) in enumerate(zip(params_a, params_b, strict=True)):
        if exact:
            assert torch.equal(x, y), f"param {i} differs: max {float((x - y).abs().max()):.3e}"
        else:
            assert_rel_close(x, y, rtol, f"param {i}")
    for i, (sa, sb) in enumerate(zip(ordered_states(opt_a), ordered_states(opt_b), strict=True)):
        names = set(sa) & set(sb)
        assert names == set(sa), f"state {i}: keys {sorted(sa)} vs {sorted(sb)}"
        for name in names:
            x, y = sa[name], sb[name]
            if not isinstance(x, torch.Tensor):
                assert x == y, f"state {i} {name}: {x} != {y}"
            elif exact:
                assert torch.equal(x.cpu(), y.cpu()), f"state {i} {name} differs"
            else:
                assert_rel_close(x.cpu(), y.cpu(), rtol, f"state {i} {name}")


def shapes_strategy(min_dims: int = 0, max_dims: int = 3, max_side: int = 5):
    """Hypothesis: a list of 1–3 tensor shapes (scalars included unless min_dims > 0)."""
    from hypothesis import strategies as st

    shape = st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)
    return st.lists(shape, min_size=1, max_size=3)


HYPOTHESIS_SETTINGS = dict(max_examples=15, deadline=None, derandomize=True)


WORDS = [
    *("the", "cat", "sat", "on", "a", "mat", "and", "the", "dog"),
    *("ran", "to", "see", "what", "it", "was", "doing", "there", "today"),
]


def run_folder(tmp_path_factory) -> Path:
    """This test run's temporary folder: under pytest-xdist the one all workers share (their base temporary
    folder's parent, one per run)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make) -> Path:
    """``run_folder/name``, made by ``make(folder)`` in the first worker that asks for it while the others wait
    (a lock beside it): what takes a minute is made once per test run, not once per worker."""
    folder = run_folder(tmp_path_factory) / name
    with open(folder.with_name(f"{name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").is_file():
            if folder.exists():  # a worker that failed half-way: start again
                shutil.rmtree(folder)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


def write_tiny_corpus(path: Path) -> Path:
    """900 random sentences over 17 words: a text the lm experiment trains a tiny GPT on in seconds."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) + "." for _ in range(900)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def assert_monitor_resumed(state, whole, records, whole_records, kept: bool, warned: bool) -> None:
    """A library's run resumed from a checkpoint (its monitor's final ``state`` and its ``records`` after the
    checkpoint) against the uninterrupted run (``whole``, ``whole_records`` from the same step on, the oracle).
    With the monitor's state in the checkpoint (``kept``): no warning, the same records, the same guard losses,
    sharpness history and warm start. Without: a warning, and the history short by the one measurement before
    the checkpoint."""
    assert [r["loss"] for r in records] == [r["loss"] for r in whole_records]  # training itself resumed exactly
    assert warned != kept
    if kept:
        assert records == whole_records
        assert state["curvature_history"] == whole["curvature_history"]
        assert (state["first_loss"], state["lowest_loss"]) == (whole["first_loss"], whole["lowest_loss"])
        assert torch.equal(state["curvature_vector"], whole["curvature_vector"])
    else:
        assert len(state["curvature_history"]) == len(whole["curvature_history"]) - 1


def assert_sharded_close(a, b, where: str) -> None:
    """Records (nested dicts and lists) of a sharded run equal to an unsharded run's, ``where`` naming the place:
    to float tolerance, since a sharded sum is the unsharded one added up in another order."""
    if isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in b:
            assert_sharded_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_sharded_close(x, y, f"{where}[{i}]")
    elif isinstance(b, float) and not (math.isnan(b) and isinstance(a, float) and math.isnan(a)):
        # the largest effective LR is η/(|g| + ε) at the smallest |g| (4e-8 at step 1), whose float rounding
        # in the ranks' gradient average is 1e-2 of it: that of the run, not of the monitor (exact: see below)
        assert a == pytest.approx(b, rel=2e-2 if where.endswith("eff_lr.max") else 2e-5, abs=1e-9), where
    else:
        assert a == b, where


class DispatchedOps(TorchDispatchMode):
    """The aten and c10d operators dispatched while it is on, by name (``aten._local_scalar_dense`` is a host
    read: ``float(t)``, ``t.item()``, ``bool(t)``; ``c10d.allreduce_`` a collective). ``.tolist()`` and ``.cpu()``
    of a CPU tensor dispatch nothing: on a GPU, ``torch.cuda.set_sync_debug_mode`` sees those."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func).rsplit(".", 1)[0]] += 1
        return func(*args, **(kwargs or {}))


class Silent(torch.nn.Module):
    """y = a·x₀ + b·x₁, two tensors: b is Molybog et al.'s layer whose gradient vanishes for a while (the early
    warning's tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Parameter(torch.tensor(0.0)), torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * x[:, 0] + self.b * x[:, 1]
