"""What counts as a loss spike and as a divergence in the early-warning corpus: fixed before any run was scored.

The definitions below were written and committed before the corpus (``corpus.py``) was built or looked at; the
evaluation (``evaluate.py``) scores every warning method against them and against nothing else. Changing them
after looking at the data would be tuning the labels to the warnings, so they stay as committed.

Notation: Lₜ is the training loss of step t = 1 … T, the mean loss of step t's batch at the parameters *before*
step t's update (what ``loss.backward()`` differentiates). L₁ is the first step's loss.

- **Reference level.** mₜ is the median of the W = 50 losses before step t (Lₜ₋₅₀ … Lₜ₋₁; all earlier steps when
  t ≤ 50) and sₜ their median absolute deviation (the median of |Lᵢ − mₜ| over the same window).
- **Spike step.** Step t > 10 is a spike step when Lₜ is finite and at once
  Lₜ ≥ 2 mₜ (at least twice its recent level), Lₜ ≥ mₜ + 6 sₜ (far outside the batch-to-batch noise) and
  Lₜ − mₜ ≥ 0.05 L₁ (a rise of at least 5 % of the initial loss: a converged loss of 0.001 that doubles on a hard
  batch is not a spike).
- **Divergence.** The first step t with Lₜ not finite, or Lₜ ≥ 10 L₁. The run stops there (its last step).
- **Event.** Spike steps less than ``GAP`` = 10 steps apart belong to one event; its onset is its first spike
  step. A divergence is an event too: it belongs to the spike event whose last spike step is less than 10 steps
  before it (the onset is then that event's), else it is an event of its own whose onset is the divergence step.
  An event's kind is "divergence" when it ends the run, else "spike".
- **Scored steps.** Every step t ≤ T except those of an event, i.e. from its onset to its last spike step + 10
  (inside a spike a warning is moot, and the next 10 steps cannot hold a new onset by the merging rule). A scored
  step t is *positive at horizon N* when an onset lies in t + 1 … t + N, else negative.

A warning computed from what step t's update knew (its gradient, update, optimizer state, the loss Lₜ) and
raised at step t therefore predicts a loss at step t + 1 or later: a lead of at least one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WINDOW = 50  # steps in the reference window
BURN_IN = 10  # no spike before step 11: the median of ten steps is the least we judge against
RATIO = 2.0  # Lₜ ≥ 2 mₜ
MADS = 6.0  # Lₜ ≥ mₜ + 6 sₜ
RISE = 0.05  # Lₜ − mₜ ≥ 0.05 L₁
DIVERGED = 10.0  # Lₜ ≥ 10 L₁
GAP = 10  # spike steps fewer than this apart are one event; an event's scored-out tail


@dataclass(frozen=True)
class Event:
    """One spike or divergence: 1-based steps of its onset and its last spike step, and its kind."""

    onset: int
    last: int
    kind: str  # "spike" or "divergence"


def divergence_step(loss: np.ndarray) -> int | None:
    """The 1-based step at which ``loss`` diverges (non-finite, or ≥ 10 L₁), or None."""
    loss = np.asarray(loss, dtype=float)
    if loss.size == 0:
        return None
    bad = ~np.isfinite(loss)
    if np.isfinite(loss[0]):
        bad |= loss >= DIVERGED * loss[0]
    hits = np.flatnonzero(bad)
    return int(hits[0]) + 1 if hits.size else None


def spike_steps(loss: np.ndarray) -> np.ndarray:
    """The 1-based spike steps of ``loss`` (before any divergence), sorted."""
    loss = np.asarray(loss, dtype=float)
    end = divergence_step(loss)
    n = loss.size if end is None else end - 1  # the losses before the divergence
    if n == 0 or not np.isfinite(loss[0]):
        return np.zeros(0, dtype=int)
    rise = RISE * loss[0]
    steps = []
    for i in range(BURN_IN, n):  # 0-based i is step i + 1 > 10
        window = loss[max(0, i - WINDOW) : i]
        level = np.median(window)
        spread = np.median(np.abs(window - level))
        if loss[i] >= RATIO * level and loss[i] >= level + MADS * spread and loss[i] - level >= rise:
            steps.append(i + 1)
    return np.asarray(steps, dtype=int)


def events(loss: np.ndarray) -> list[Event]:
    """The spike and divergence events of one run's per-step ``loss``, in order."""
    found: list[Event] = []
    for step in spike_steps(loss).tolist():
        if found and step - found[-1].last < GAP:
            found[-1] = Event(found[-1].onset, step, "spike")
        else:
            found.append(Event(step, step, "spike"))
    end = divergence_step(loss)
    if end is not None:
        if found and end - found[-1].last < GAP:
            found[-1] = Event(found[-1].onset, end, "divergence")
        else:
            found.append(Event(end, end, "divergence"))
    return found


def scored(steps: int, found: list[Event]) -> np.ndarray:
    """Which of the steps 1 … ``steps`` are scored (boolean, index 0 is step 1): all but those of an event."""
    keep = np.ones(steps, dtype=bool)
    for event in found:
        keep[event.onset - 1 : event.last + GAP] = False
    return keep


def positives(steps: int, found: list[Event], horizon: int) -> np.ndarray:
    """Whether an onset lies in t + 1 … t + ``horizon`` for each step t of 1 … ``steps`` (boolean, index 0 is
    step 1)."""
    label = np.zeros(steps, dtype=bool)
    for event in found:
        label[max(0, event.onset - 1 - horizon) : event.onset - 1] = True
    return label
