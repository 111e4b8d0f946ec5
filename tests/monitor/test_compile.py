"""A compiled optimizer step (torch's recipe: ``torch.compile`` around ``optimizer.step()``) with the monitor
compiles what it compiles without it, and the monitor's records hold the norms of the gradients, weights and
updates of that compiled step, taken here from copies around it."""

import math

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from optiscope.monitor import Monitor


def _run(compiled: bool, monitored: bool) -> tuple[list[dict], list[dict], int, int]:
    """Six Adam steps of a tiny model: the records, each step's true norms per parameter (g, w, u), the graphs
    compiled and the unique graphs dynamo counted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-2))  # a tensor lr: torch's recipe
    monitor = Monitor(model, opt, every=2) if monitored else None
    compiles = []

    def backend(gm, example_inputs):  # counts every graph compiled, recompiles included; runs it as traced
        compiles.append(gm)
        return gm.forward

    def step():
        opt.step()

    opt_step = torch.compile(step, backend=backend, fullgraph=False) if compiled else step
    torch._dynamo.reset()
    counters.clear()
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    records, truth = [], []
    for _ in range(6):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        before = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
        opt_step()
        truth.append(
            {
                n: {"g": float(g.norm()), "w": float(p.detach().norm()), "u": float((p.detach() - b).norm())}
                for n, p in model.named_parameters()
                for b, g in [before[n]]
            }
        )
        if monitor is not None:
            record = monitor.step(loss)
            if record is not None:
                records.append(record)
    unique = counters["stats"]["unique_graphs"]
    if monitor is not None:
        monitor.close()
    torch._dynamo.reset()
    return records, truth, len(compiles), unique


def test_compiled_step_compiles_as_often_with_the_monitor_as_without():
    _, _, compiles_alone, unique_alone = _run(compiled=True, monitored=False)
    records, _, compiles, unique = _run(compiled=True, monitored=True)
    assert compiles_alone >= 1  # the step did compile
    assert (compiles, unique) == (compiles_alone, unique_alone)
    assert [r["step"] for r in records] == [1, 2, 4, 6]


def test_compiled_step_records_its_own_norms():
    records, truth, _, _ = _run(compiled=True, monitored=True)
    assert [r["step"] for r in records] == [1, 2, 4, 6]
    for record in records:
        true = truth[record["step"] - 1]
        assert record["params"].keys() == true.keys()
        for name, entry in true.items():
            for key, value in entry.items():
                assert record["params"][name][key] == pytest.approx(value, rel=1e-5), (record["step"], name, key)
        assert record["total"]["g"] == pytest.approx(math.sqrt(sum(e["g"] ** 2 for e in true.values())), rel=1e-5)
