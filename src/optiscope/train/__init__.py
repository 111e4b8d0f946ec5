"""optiscope.train: the one training loop, its checkpoint format and exact resume.

Experiments say *what* to train (a ``Task``: how to draw a batch, the loss, what to evaluate) and
``train`` says *how*: zero_grad → forward → backward → clip → step → schedule → monitor → guard →
evaluate → checkpoint, written once. A checkpoint holds everything a run is (model, optimizer,
scheduler, data generator, RNG, monitor, running sums, history) and is written atomically after a
complete step, so a run interrupted anywhere (Ctrl-C, SIGTERM, ``kill -9``) resumes bit for bit.
"""

from .checkpoint import FORMAT, load, save
from .distributed import Processes, barrier, global_mean, leave_job, start_processes, wrap
from .loop import Plan, Run, Task, new_history, optimizer_step, train
from .progress import Progress
from .signals import Interrupted

__all__ = [
    "FORMAT",
    "Interrupted",
    "Plan",
    "Processes",
    "Progress",
    "Run",
    "Task",
    "barrier",
    "global_mean",
    "leave_job",
    "load",
    "new_history",
    "optimizer_step",
    "save",
    "start_processes",
    "train",
    "wrap",
]
