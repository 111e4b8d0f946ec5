"""Monitor(early_warning=...): warned before the loss grows where the closed form says it will (GD, heavy ball, Adam
with its preconditioner frozen), never below the edge,
Adam's lag before Molybog et al.'s spike, reduce_lr, an exact resume, and one-line errors."""

import copy
import logging
import math

import pytest
import torch
from torch import nn

from optiscope.monitor import ConsoleSink, Curvature, EarlyWarning, Monitor, flat_metrics
from optiscope.monitor.early_warning import adam_lag_sums
from support import Silent


class Quadratic(nn.Module):
    """f(x) = ½ Σ λᵢ xᵢ²: H = diag(λ), its sharpness max λ."""

    def __init__(self, curvatures: list[float]) -> None:
        super().__init__()
        self.register_buffer("lam", torch.tensor(curvatures, dtype=torch.float64))
        self.x = nn.Parameter(torch.ones(len(curvatures), dtype=torch.float64))

    def forward(self) -> torch.Tensor:
        return 0.5 * (self.lam * self.x**2).sum()


def _quadratic_loss(model: nn.Module, batch: object) -> torch.Tensor:
    return model()


def _every_step(model: nn.Module, opt: torch.optim.Optimizer, warning: EarlyWarning, on_warning) -> Monitor:
    """A monitor measuring the sharpness of a ``Quadratic`` at every step, without a guard."""
    curvature = Curvature(torch.zeros(1), _quadratic_loss, every=1, directions=(), max_hvps=4)
    return Monitor(
        model, opt, every=1, sinks=[], guard=None, curvature=curvature, early_warning=warning, on_warning=on_warning
    )


def _drive(model: Quadratic, opt: torch.optim.Optimizer, lrs: list[float]) -> tuple[list[float], list[dict]]:
    """``opt`` on ``model`` at lr ``lrs[t]`` at step t + 1, the monitor measuring every step: the losses L(θₜ₋₁)
    and the warnings."""
    warnings: list[dict] = []
    monitor = _every_step(model, opt, EarlyWarning(cooldown=1000), warnings.append)
    losses = []
    for lr in lrs:
        opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        loss = model()
        loss.backward()
        opt.step()
        monitor.step(loss)
        losses.append(loss.item())
    monitor.close()
    return losses, warnings


def _run_quadratic(lrs: list[float], momentum: float = 0.0):
    """GD (or heavy ball) on f with λ = (1, 0.1), as ``_drive``."""
    model = Quadratic([1.0, 0.1])
    return _drive(model, torch.optim.SGD(model.parameters(), lr=lrs[0], momentum=momentum), lrs)


@pytest.mark.parametrize(("momentum", "edge"), [(0.0, 2.0), (0.9, 3.8)])
def test_raised_across_the_edge_warned_before_the_loss_grows(momentum, edge):
    # the closed form: GD is stable on λ = 1 while η < 2/λ, heavy ball while η < (2 + 2β)/λ; crossed at step 31
    below, above = 0.95 * edge, 1.05 * edge
    losses, warnings = _run_quadratic([below] * 30 + [above] * 60, momentum)
    grew = next(t for t in range(31, len(losses)) if losses[t] > min(losses[:t]))  # the first loss above its low
    assert warnings, "crossed the edge without a warning"
    first = warnings[0]
    assert first["signal"] == "edge" and first["step"] == 31
    assert first["step"] <= grew  # the warning came with the step that crossed, before the loss rose
    assert first["value"] == pytest.approx(above / edge, rel=1e-3)


@pytest.mark.parametrize(("momentum", "edge"), [(0.0, 2.0), (0.9, 3.8)])
def test_kept_below_the_edge_never_warned(momentum, edge):
    losses, warnings = _run_quadratic([0.9 * edge] * 90, momentum)
    assert losses[-1] < losses[0]
    assert warnings == []


def _run_adam_frozen(lrs: list[float], v: list[float]):
    """Adam (β₁ = 0.9) on f with λ = (1, 0.1) and its second moment frozen at ``v``: β₂ = 1 − 2⁻⁵³ (the largest
    float below 1) moves v by 2⁻⁵³g² per step, and a step count of 10¹⁸ makes both bias corrections 1 (β₂ᵗ ≈ e⁻¹¹¹),
    so P = √v + ε throughout.
    Adam with P frozen is heavy ball on P⁻¹H at η(1 − β₁), β = β₁: stable while η < (2 + 2β₁)/((1 − β₁) h_max) =
    38/h_max. As ``_drive``."""
    model = Quadratic([1.0, 0.1])
    opt = torch.optim.Adam(model.parameters(), lr=lrs[0], betas=(0.9, 1 - 2**-53), foreach=False)
    opt.state[model.x] = {
        "step": torch.tensor(1e18, dtype=torch.float64),
        "exp_avg": torch.zeros(2, dtype=torch.float64),
        "exp_avg_sq": torch.tensor(v, dtype=torch.float64),
    }
    losses, warnings = _drive(model, opt, lrs)
    assert torch.allclose(opt.state[model.x]["exp_avg_sq"], torch.tensor(v, dtype=torch.float64), rtol=1e-6)
    return losses, warnings


def test_adam_with_its_preconditioner_frozen_warned_at_38_over_its_sharpness_before_the_loss_grows():
    # P = (2, 0.1): P⁻¹H = diag(0.5, 1) has h_max = 1 on the flatter coordinate, so the edge is η = 38
    v, edge = [4.0, 0.01], 38.0
    losses, warnings = _run_adam_frozen([0.95 * edge] * 30 + [1.05 * edge] * 30, v)
    grew = next(t for t in range(31, len(losses)) if losses[t] > min(losses[:t]))
    assert warnings, "crossed the edge without a warning"
    first = warnings[0]
    assert first["signal"] == "edge" and first["step"] == 31 and first["step"] <= grew
    assert first["value"] == pytest.approx(1.05, rel=1e-3)
    below, quiet = _run_adam_frozen([0.9 * edge] * 90, v)
    assert below[-1] < below[0] and quiet == []


def _molybog(early_warning, found: list, onset: int = 200, steps: int = 230) -> list[float]:
    """Molybog et al.'s mechanism: input x₁ silent until step ``onset``, so Adam's second moment of b stays 0
    while a fits; b is already right (target 0.5), so x₁ speaking changes no loss, but the first step on b is
    η·m̂/(√v̂ + ε) ≈ 0.45η whatever g's size, along a direction 100× as curved: the loss spikes at the step after."""
    torch.manual_seed(0)
    model = Silent()
    opt = torch.optim.Adam(model.parameters(), lr=0.1, betas=(0.9, 0.95))
    monitor = Monitor(model, opt, every=10, sinks=[], early_warning=early_warning, on_warning=found.append)
    g = torch.Generator().manual_seed(1)
    losses = []
    for t in range(1, steps + 1):
        x = torch.randn(32, 2, generator=g) * torch.tensor([1.0, 10.0 if t >= onset else 0.0])
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), x[:, 0] + 0.5 * x[:, 1])
        loss.backward()
        opt.step()
        monitor.step(loss)
        losses.append(loss.item())
    monitor.flush()
    monitor.close()
    return losses


def test_molybog_mechanism_warned_before_the_spike():
    found: list[dict] = []
    losses = _molybog(EarlyWarning(loss=None, edge=None), found)
    spike = 201  # the loss at θ after step 200's update
    assert losses[spike - 1] > 1e4 * max(losses[150:199])  # the spike is there
    assert [w["step"] for w in found] == [200]  # warned at the step that took the unprepared gradient, only there
    assert found[0]["signal"] == "lag" and found[0]["value"] > 1e6


def test_adam_lag_sums_against_its_definition():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-6)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    opt.zero_grad()
    model(torch.randn(4, 3)).pow(2).sum().backward()
    params = list(model.parameters())
    expected = max(
        float(p.grad.pow(2).sum() / (opt.state[p]["exp_avg_sq"].sum() / (1 - 0.99**3) + p.numel() * 1e-12))
        for p in params
    )
    assert float(adam_lag_sums(opt, params)) == pytest.approx(expected, rel=1e-5)


def test_reduce_lr_halves_every_group_and_says_so(caplog):
    model = Quadratic([1.0, 0.1])
    opt = torch.optim.SGD([{"params": [model.x], "lr": 2.2}])
    monitor = _every_step(model, opt, EarlyWarning(cooldown=5), "reduce_lr")
    records = []
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        for _ in range(12):
            opt.zero_grad()
            model().backward()
            opt.step()
            records.append(monitor.step(model()))
    warned = [w for r in records for w in r["warnings"]]
    # 2.2 > 2/λ: warned at step 1, halved to 1.1 (stable), never again
    assert [(w["step"], w["action"], w["lr"]) for w in warned] == [(1, "reduce_lr", [1.1])]
    assert opt.param_groups[0]["lr"] == 1.1
    assert records[0]["warning_score"] == pytest.approx(1.1, rel=1e-3)
    assert flat_metrics(records[0])["optiscope/warning_score"] == pytest.approx(1.1, rel=1e-3)
    assert records[1]["warnings"] == [] and records[1]["warning_score"] < 1
    # SGD keeps no Adam moments: said once, naming what still warns
    told = [r.message for r in caplog.records if "Adam's lag is not watched" in r.message]
    assert len(told) == 1 and "SGD" in told[0]
    monitor.close()


def test_console_prints_a_warning():
    from rich.console import Console

    console = Console(record=True, width=200)
    warning = {"step": 7, "signal": "loss", "value": 6.2, "threshold": 5.0, "message": "the loss is 6.2 sd above"}
    diverged = {"diverged": True, "step": 9, "loss": math.nan, "reason": "x", "warnings": [warning]}
    ConsoleSink(console=console).write(diverged)
    text = console.export_text()
    assert "WARNING at step 7 (loss): the loss is 6.2 sd above (threshold 5)" in text
    assert text.index("WARNING") < text.index("DIVERGED")


def test_resume_is_exact():
    """Stopped at step 203 (between readings, lags kept on the device) and resumed: the same warnings as the whole
    run, at the same steps, with the same values."""

    def run(stop: int | None):
        torch.manual_seed(0)
        model = Silent()
        opt = torch.optim.Adam(model.parameters(), lr=0.1, betas=(0.9, 0.95))
        found: list[dict] = []
        kwargs = {"every": 10, "sinks": [], "early_warning": EarlyWarning(loss=2.0), "on_warning": found.append}
        monitor = Monitor(model, opt, **kwargs)
        g = torch.Generator().manual_seed(1)
        for t in range(1, 231):
            if t == stop:
                saved = copy.deepcopy((model.state_dict(), opt.state_dict(), monitor.state_dict(), g.get_state()))
                monitor.close()
                model = Silent()
                opt = torch.optim.Adam(model.parameters(), lr=0.1, betas=(0.9, 0.95))
                model.load_state_dict(saved[0])
                opt.load_state_dict(saved[1])
                monitor = Monitor(model, opt, start_step=t - 1, **kwargs)
                monitor.load_state_dict(saved[2])
                g.set_state(saved[3])
            x = torch.randn(32, 2, generator=g) * torch.tensor([1.0, 10.0 if t >= 200 else 0.0])
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), x[:, 0] + 0.5 * x[:, 1])
            loss.backward()
            opt.step()
            monitor.step(loss)
        monitor.flush()
        monitor.close()
        return found

    whole = run(None)
    assert {w["signal"] for w in whole} == {"loss", "lag"}
    assert run(204) == whole


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"early_warning": "yes"}, "early_warning='yes' must be True, False or an EarlyWarning"),
        ({"early_warning": True, "on_warning": "halve"}, "on_warning='halve' must be a function"),
        ({"on_warning": "reduce_lr"}, "needs early_warning=True"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
    model = nn.Linear(2, 1)
    with pytest.raises((TypeError, ValueError), match=message):
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), sinks=[], **kwargs)


@pytest.mark.parametrize(
    ("field", "value"), [("loss", 0), ("lag", -1.0), ("edge", math.inf), ("cooldown", 0), ("loss", "5")]
)
def test_early_warning_refuses_a_bad_threshold(field, value):
    with pytest.raises(ValueError, match=f"EarlyWarning: {field}="):
        EarlyWarning(**{field: value})
