"""optiscope.monitor: instruments that show what the optimizer does to every parameter.

``Monitor(model, optimizer, every=N, sinks=[...])`` plus ``monitor.step(loss)`` after
``optimizer.step()`` measures per parameter the gradient norm g, weight norm w, the actual update norm
u, u/w, cos(u, −g), Adam's effective learning rate, non-finite counts and zero-gradient fractions, and
turns a diverging loss into a ``Diverged`` record instead of a crash; ``curvature=Curvature(...)`` adds
sharpness against the optimizer's stability threshold (``optiscope.curvature``) on a schedule;
``early_warning=True`` warns of a loss spike or divergence before it comes (``EarlyWarning``).
``LoggerSink(wandb.log)`` hands each record, flattened (``flat_metrics``), to any ``log(metrics, step)``.
"""

from .curvature import Curvature
from .divergence import Diverged, DivergenceGuard
from .early_warning import EarlyWarning
from .keys import flat_metrics
from .monitor import Monitor
from .sinks import ConsoleSink, JSONLSink, LoggerSink, TensorBoardSink, run_directory_sinks

__all__ = [
    "Monitor",
    "Curvature",
    "ConsoleSink",
    "JSONLSink",
    "TensorBoardSink",
    "LoggerSink",
    "flat_metrics",
    "run_directory_sinks",
    "DivergenceGuard",
    "Diverged",
    "EarlyWarning",
]
