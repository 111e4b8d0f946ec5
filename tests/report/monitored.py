"""Monitors' directories for the report's tests: a small MLP trained by SGD with curvature measured, whose loss
turns NaN at a chosen step (a real divergence record, diagnosis included), and least squares by gradient
descent, one run per context."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from optiscope.monitor import Curvature, JSONLSink, Monitor


def diverging_run(path: Path, nan_step: int, curvature_every: int) -> dict:
    """Trains until the NaN loss at ``nan_step``, writing ``path`` (metrics.jsonl); returns the divergence record."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def loss_fn(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]), batch[1])

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    curvature = Curvature((x, y), loss_fn, every=curvature_every, directions=())
    monitor = Monitor(model, opt, every=1, sinks=[JSONLSink(path)], curvature=curvature, on_divergence="record")
    for step in range(1, nan_step + 1):
        opt.zero_grad()
        loss = loss_fn(model, (x, y)) * (float("nan") if step == nan_step else 1.0)
        loss.backward()
        opt.step()
        monitor.step(loss)
    monitor.close()
    return monitor.diverged


def monitored_dir(path: Path, contexts: list[dict], steps: int = 3) -> dict[str, list[float]]:
    """Gradient descent on one least-squares problem, one Monitor per context (its ``eta`` the learning rate)
    writing to one ``path/metrics.jsonl``, a divergence recorded and the run stopped there: {context as JSON:
    the losses it saw}."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    losses = {}
    for context in contexts:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=context["eta"])
        sink = JSONLSink(path / "metrics.jsonl")
        monitor = Monitor(model, opt, every=1, sinks=[sink], context=context, on_divergence="record")
        seen = losses.setdefault(json.dumps(context), [])
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            monitor.step(loss)
            seen.append(loss.item())
            if monitor.diverged:
                break
        monitor.close()
    return losses
