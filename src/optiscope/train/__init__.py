"""optiscope.train: the one training loop, its checkpoint format and exact resume.

Experiments say *what* to train (a ``Task``: how to draw a batch, the loss, what to evaluate) and
``train`` says *how*: zero_grad → forward → backward → clip → step → schedule → monitor → guard →
evaluate → checkpoint, written once. A checkpoint holds everything a run is (model, optimizer,
scheduler, data generator, RNG, monitor, running sums, history) and is written atomically after a
complete step, so a run interrupted anywhere (Ctrl-C, SIGTERM, ``kill -9``) resumes bit for bit.
"""

from .checkpoint import load, save
from .loop import Plan, Run, Task, train
from .signals import Interrupted

__all__ = [
    "train",
    "Task",
    "Plan",
    "Run",
    "Interrupted",
    "save",
    "load",
]
