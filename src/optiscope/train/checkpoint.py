"""The one checkpoint format: everything a training run is, after a complete step.

A checkpoint is a ``torch.save``d dict, written atomically (``runs.save_checkpoint``)::

    format      "optiscope.train/1"            what this file is (a foreign file is refused by name)
    label       the run's name                  (a checkpoint of another run is refused)
    step        optimizer steps taken
    history     the run's JSON-able record so far, its status included
    running     sums between two monitor records (the mean loss logged at the next record)
    training    model, optimizer and scheduler state dicts, the data generator's state, the torch,
                CUDA, Python and NumPy RNG states of every rank (a list in rank order: under torchrun each
                rank draws its own dropout masks), the monitor's state — or None for the outcome of a run
                that diverged before its first checkpoint

A run that finished (or diverged) keeps its checkpoint with ``history["status"]`` set, so resuming a
job of several runs skips the finished ones and continues the interrupted one.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import runs
from .distributed import gathered

if TYPE_CHECKING:
    from .loop import Run

FORMAT = "optiscope.train/1"


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG states, in rank order (a collective under torchrun: every rank calls it)."""
    return gathered(rng_state())


def snapshot(run: Run, rng: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The checkpoint of ``run``: with its training state when given every rank's ``rng`` states
    (``rng_states``), else its outcome alone."""
    training = None
    if rng is not None:
        training = {
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
            "data": run.data.get_state(),
            "rng": rng,
            "monitor": run.monitor.state_dict() if run.monitor is not None else None,
        }
    return {
        "format": FORMAT,
        "label": run.label,
        "step": run.history["step"],
        "history": run.history,
        "running": dict(run.running),
        "training": training,
    }


#: what every checkpoint holds (``snapshot``), and what its training state holds when it has one
SNAPSHOT_KEYS = ("format", "label", "step", "history", "running", "training")
TRAINING_KEYS = ("model", "optimizer", "scheduler", "data", "rng", "monitor")


def save(run: Run, path: Path, rng: list[dict[str, Any]]) -> Path:
    """Write the checkpoint of ``run`` to ``path``, atomically: everything the run is, after a complete step.

    The file is a ``torch.save``d dict in the format ``"optiscope.train/1"`` (the module's docstring lists its
    entries): the run's label, step, history and running sums, and its training state (model, optimizer and
    scheduler state dicts, the data generator's state, ``rng``, the monitor's state).

    Args:
        run: the run to save.
        path: the checkpoint file; its folder is created. A previous checkpoint there survives a crash mid-write.
        rng: every rank's RNG states (torch, CUDA, Python, NumPy) in rank order, as
            ``optiscope.train.checkpoint.rng_states()`` gathers them (under torchrun, every rank calls it).

    Returns:
        ``path``.

    Raises:
        WriteError: the machine would not let the file be written (a full disk or quota, a file-size limit, a
            read-only or forbidden folder); what was there before is intact.

    Examples:
        >>> from pathlib import Path
        >>> import torch
        >>> from torch import nn
        >>> from optiscope.train import Run, save
        >>> from optiscope.train.checkpoint import rng_states
        >>> model = nn.Linear(3, 1)
        >>> run = Run("sgd", model, torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator())
        >>> save(run, Path("checkpoints/sgd.pt"), rng_states()).name
        'sgd.pt'

    Notes:
        ``train`` writes the checkpoint itself (only on the writing rank); call ``save`` for a checkpoint of your
        own making. A run that finished (or diverged) keeps its checkpoint with ``history["status"]`` set, so
        resuming a job of several runs skips the finished ones and continues the interrupted one.
    """
    return runs.save_checkpoint(path, snapshot(run, rng))


def load(path: Path, label: str | None = None) -> dict[str, Any]:
    """Read a training checkpoint of this format (and of run ``label``, if given); anything else is refused.

    Args:
        path: the checkpoint file written by ``save`` or ``train``.
        label: the run it must belong to; None: any run's.

    Returns:
        The checkpoint's dict: ``format`` (``"optiscope.train/1"``), ``label``, ``step``, ``history``,
            ``running`` and ``training`` — a dict of ``model``, ``optimizer``, ``scheduler``, ``data``, ``rng`` and
            ``monitor`` states, or None for the outcome of a run that diverged before its first checkpoint.

    Raises:
        CheckpointError: no file at ``path``; a file torch cannot read (truncated, foreign); one of another format
            or of another run than ``label``; or a damaged one (an entry missing, ``training`` not a dict). The
            message names the file and says what to do; nothing is changed on disk.

    Examples:
        >>> from pathlib import Path
        >>> import torch
        >>> from torch import nn
        >>> from optiscope.train import Run, load, save
        >>> from optiscope.train.checkpoint import rng_states
        >>> model = nn.Linear(3, 1)
        >>> run = Run("sgd", model, torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator())
        >>> _ = save(run, Path("sgd.pt"), rng_states())
        >>> state = load(Path("sgd.pt"), "sgd")
        >>> state["format"], state["step"], sorted(state["training"])
        ('optiscope.train/1', 0, ['data', 'model', 'monitor', 'optimizer', 'rng', 'scheduler'])
        >>> load(Path("sgd.pt"), "adam")
        Traceback (most recent call last):
        optiscope.runs.CheckpointError: sgd.pt is the checkpoint of run 'sgd', not of 'adam'

    Notes:
        Tensors are loaded onto the CPU. The file is unpickled whole (``torch.load`` with ``weights_only=False``:
        checkpoints hold RNG states and configs), so load only checkpoints you trust.
    """
    state = runs.load_checkpoint(path)
    if state.get("format") != FORMAT:
        raise runs.CheckpointError(
            f"{path} is not an optiscope training checkpoint (format {state.get('format')!r}, expected {FORMAT!r}); "
            "delete it, or use --force to replace the whole run"
        )
    if label is not None and state.get("label") != label:
        raise runs.CheckpointError(f"{path} is the checkpoint of run {state.get('label')!r}, not of {label!r}")
    training = state.get("training")
    missing = [k for k in SNAPSHOT_KEYS if k not in state]
    if isinstance(training, dict):
        missing += [f"training.{k}" for k in TRAINING_KEYS if k not in training]
    elif training is not None:
        raise runs.CheckpointError(
            f"{path} is damaged: its training entry is a {type(training).__name__}, not a dict; delete it, or use "
            "--force to replace the whole run"
        )
    if missing:
        raise runs.CheckpointError(
            f"{path} is damaged: it lacks {', '.join(missing)}; delete it, or use --force to replace the whole run"
        )
    return state


def mismatch(run: Run, training: dict[str, Any]) -> str | None:
    """How a checkpoint's training state differs in shape from ``run``'s model and optimizer (a checkpoint of
    another run under the same name, e.g. copied from a run of other options), or None where it fits."""
    own, saved = run.model.state_dict(), training["model"]
    if own.keys() != saved.keys():
        missing, extra = sorted(own.keys() - saved.keys()), sorted(saved.keys() - own.keys())
        return f"its model lacks {missing[0]!r}" if missing else f"its model has {extra[0]!r}, which this run's has not"
    for name, tensor in own.items():
        theirs = saved[name]
        if isinstance(tensor, torch.Tensor) and isinstance(theirs, torch.Tensor) and theirs.shape != tensor.shape:
            return f"its {name} is {tuple(theirs.shape)}, this run's {tuple(tensor.shape)}"
    sizes = [len(g["params"]) for g in run.optimizer.state_dict()["param_groups"]]
    saved_sizes = [len(g["params"]) for g in training["optimizer"]["param_groups"]]
    if sizes != saved_sizes:
        return f"its optimizer's parameter groups hold {saved_sizes} tensors, this run's {sizes}"
    return None


def restore(run: Run, state: dict[str, Any], path: Path) -> None:
    """Put ``run`` in the state the checkpoint at ``path`` recorded (model, optimizer, …, history); one whose
    model or optimizer is not shaped as ``run``'s is a CheckpointError (nothing is changed)."""
    training = state["training"]
    why = None if training is None else mismatch(run, training)
    if why is not None:
        raise runs.CheckpointError(
            f"{path} is not a checkpoint of this run ({why}); delete it, or use --force to replace the whole run"
        )
    run.history, run.running = state["history"], dict(state["running"])
    if training is None:
        return
    run.model.load_state_dict(training["model"])
    run.optimizer.load_state_dict(training["optimizer"])
    if run.scheduler is not None:
        run.scheduler.load_state_dict(training["scheduler"])
    run.data.set_state(training["data"])
    states = training["rng"]
    if isinstance(states, dict):  # a checkpoint written before every rank's states were kept
        states = [states]
    # this rank's own; a job resumed on more processes than it ran on (no longer exact) takes rank 0's
    rank = runs.rank()
    set_rng_state(states[rank] if rank < len(states) else states[0])
    if run.monitor is not None:
        run.monitor.load_state_dict(training["monitor"])


def keep_outcome(run: Run, path: Path) -> int | None:
    """Record a diverged run's history in its checkpoint, keeping the last good training state there;
    returns that state's step (None if the run diverged before its first checkpoint)."""
    state = load(path, run.label) if path.exists() else snapshot(run)
    kept = state["step"] if state["training"] is not None else None
    if run.history["divergence"] is not None:
        run.history["divergence"]["checkpoint_step"] = kept
    state["history"] = run.history
    runs.save_checkpoint(path, state)
    return kept
