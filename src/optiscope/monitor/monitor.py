"""``Monitor``: what the optimizer did to every parameter, measured on any training loop.

Two lines in an existing loop (the first and the last)::

    monitor = Monitor(model, optimizer, every=10, sinks=[ConsoleSink(), JSONLSink(run_dir / "metrics.jsonl")])
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        monitor.step(loss)          # right after optimizer.step()

The monitor registers step hooks on the optimizer. On a *measured* step (the first, then every
``every``-th) the pre-hook reads the gradients (an optimizer may use them up inside its step) and copies the
parameters that have them, and the post-hook turns θ_after − θ_before into the actual update u — whatever
optimizer made it, ours or torch's — then frees the copy: one extra copy of the parameters, and only on
measured steps. ``monitor.step(loss)`` adds the loss, learning rates and throughput, has the divergence guard
judge every step's loss, and sends measured steps' records to the sinks. On the steps it does not measure the
monitor neither waits for the GPU nor starts a collective: their losses stay on the device until it reads them
together (``deferred``), on measured steps and every ``guard.read_every`` steps. Its hooks hold it weakly
(``hooks``), and ``close()`` lets go of the model, the optimizer and the process group.

Under ``torchrun``/DDP every rank computes the same values (parameters and all-reduced gradients are
identical; the loss is averaged across ranks) and only rank 0's sinks write. Under FSDP (``fully_shard``, or
``FullyShardedDataParallel`` with either ``use_orig_params``) each rank reads its shards and the sums behind
every number are added up over the shard group (``sharding``), so every rank records the whole model's.
The hooks are kept out of ``torch.compile``'s tracing: a compiled ``optimizer.step`` compiles as without them.

With ``curvature=Curvature(batch, loss_fn, every=N)`` every N-th step is also measured for sharpness
against the optimizer's stability threshold, curvature along the update and the gradient, the Hessian's
trace and the gradient noise scale (``monitor/curvature.py``), and a divergence is diagnosed with them.
With ``Curvature(..., rank_batch_size=B)`` on a DDP model the noise scale takes the ranks as its small
batches: the monitor registers DDP's communication hook (``RankNoise``), which on the steps the curvature
measures keeps each rank's local squared gradient norms before doing DDP's own averaging all-reduce.
With ``Curvature(..., accumulation_batch_size=b)`` the small batches are the backward passes one step
accumulates (``AccumulationNoise``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..checks import finite, is_count, is_number, require_optimizer
from ..curvature.hvp import SHARDED_CURVATURE, dense, unwrap
from . import sharding, stats
from .accumulation_noise import AccumulationNoise
from .curvature import KEYS, Curvature, check_batch, check_curvature, measure
from .deferred import Read, StepLog, kept_loss
from .divergence import Diverged, DivergenceGuard, GuardState, check_guard, curvature_diagnosis
from .early_warning import EarlyWarning, Warnings, checked_warning
from .hooks import found_inf, hooked_optimizer, on_stack, torch_caller, weak_hook
from .names import is_own_name, own_names, under_compile
from .rank_noise import RankNoise
from .sharding import Part
from .sinks import checked_sinks

DEFAULT_GUARD = DivergenceGuard()
log = logging.getLogger("optiscope")


def check_schedule(every: Any, curvature: Any, guard: Any, who: str) -> None:
    """One-line errors for a monitor's ``every``, ``curvature`` and ``guard`` (shared with the callbacks, which
    check them when built rather than when training starts)."""
    if not is_count(every):
        raise ValueError(f"{who}: every={every!r} must be an integer >= 1")
    check_curvature(curvature, who)
    check_guard(guard, who)


#: the fields the monitor's own records (measured steps, a divergence) hold; a context may not reuse them
RECORD_FIELDS = frozenset(
    {"step", "loss", "grad_norm", "lr", "tokens_per_s", "params", "groups", "total", "embedding", "curvature"}
    | {
        "context",
        "diverged",
        "reason",
        "exploded_first",
        "grew_most",
        "first_measured_step",
        "last_measured_step",
        "curvature_diagnosis",
        "warning_score",
        "warnings",
        *KEYS,
    }
)


@contextlib.contextmanager
def learning_rates(optimizer: torch.optim.Optimizer, lrs: list[Any] | None) -> Iterator[None]:
    """For the duration, the param groups' lr are ``lrs`` (those the step just taken used), so that its
    stability threshold is read at them; restored after. None: as they are."""
    now = [g["lr"] for g in optimizer.param_groups]
    if lrs is not None and len(lrs) == len(now):
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, now, strict=True):
            group["lr"] = lr


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """The name of each tensor the optimizer updates, keyed by ``id``.

    Where the optimizer was given named parameters (``model.named_parameters()`` or (name, tensor) pairs;
    torch.optim keeps them in each group's ``param_names``) those names are used, so records, sinks and
    the optimizer's ``state_dict`` agree; otherwise the model's name, else ``group{i}.param{j}``. The model's
    names are those inside its wrappers (``own_names``), and a given name that is one of them under wrapper
    prefixes (``module.x`` from a DDP model) is that name. A name given to two tensors falls back to the
    model's name (or the position), so no tensor's statistics overwrite another's.
    """
    from_model = own_names(model)
    names: dict[int, str] = {}
    for gi, group in enumerate(optimizer.param_groups):
        given = group.get("param_names")
        for pi, p in enumerate(group["params"]):
            own = from_model.get(id(p), f"group{gi}.param{pi}")
            name = None if given is None else given[pi]
            names[id(p)] = own if name is None or is_own_name(name, own) else name
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            if counts[names[id(p)]] > 1:
                names[id(p)] = from_model.get(id(p), f"group{gi}.param{pi}")
    return names


@dataclass
class Gradients:
    """A measured step's gradients as the step began (``Monitor._read_gradients``): the parameters that had
    one, their gradients' ``norms`` (float64, as the tensors hold them: ``scale`` times the gradient stepped
    with under a GradScaler's fused step), ``nonfinite`` and ``zeros`` counts, the gradient ``tensors`` and
    their ``versions`` (in-place writes count up), and ``copies`` of them where the optimizer may write into
    them."""

    params: list[Tensor]
    norms: Tensor
    scale: float
    nonfinite: list[int]
    zeros: list[int]
    tensors: list[Tensor]
    versions: list[int]
    copies: list[Tensor] | None


class Monitor:
    """Per-parameter statistics of each optimizer step, and a divergence guard, on any training loop.

    For each parameter tensor θ with gradient g that a step moves to θ′, the monitor measures the actual
    update u = θ′ − θ (whatever optimizer made it) and records, on the first step and every ``every``-th,

        g = ‖g‖,  w = ‖θ′‖,  u = ‖θ′ − θ‖,  u/w,  cos(u, −g) = ⟨u, −g⟩/(‖u‖ ‖g‖),  u_rms = ‖u‖/√n,

    and, where optiscope knows the optimizer's rule (ours, torch's Adam, AdamW, NAdam, RAdam, Adamax, RMSprop,
    Adagrad), the effective learning rate (Adam's η/(√v̂ + ε)) as its min, median and max; the same norms over
    each param group and over all parameters. Every step's loss goes to the ``guard``, which turns a diverging
    run into a ``Diverged`` record instead of a crash.

    Args:
        model: the module being trained, for parameter names; may be wrapped in DDP or FSDP, or compiled.
        optimizer: any ``torch.optim.Optimizer`` (ours or torch's), or a wrapper such as accelerate's
            ``AcceleratedOptimizer``, whose wrapped optimizer then carries the step hooks.
        every: measure the first optimizer step and every ``every``-th; an integer ≥ 1.
        sinks: where records go: objects with ``write(record)`` and ``close()``, e.g.
            ``[ConsoleSink(), JSONLSink("metrics.jsonl")]``; ``[]`` for none (``step`` still returns them and
            ``last_record`` keeps the last); None (the default) for none, said once in a warning of the
            ``optiscope`` logger.
        batch_tokens: tokens (or examples) per optimizer step, for a ``tokens_per_s`` field; None for none.
        guard: the ``DivergenceGuard`` that judges every step's loss, or None to switch divergence detection off.
        on_divergence: ``"raise"`` (raise ``Diverged``, the default) or ``"record"`` (set ``monitor.diverged``
            and let the caller stop).
        embedding: an embedding matrix (a 2-D tensor, or a parameter's name) whose per-row updates to track.
        token_counts: occurrences of each token (row of ``embedding``) in the training data, one finite count
            ≥ 0 per row, for the rare-token analysis; needs ``embedding``.
        histograms: add a log10 histogram of each parameter's effective learning rate to records.
        alarm_growth: a multiple > 1: u/w above this multiple of its early level counts as having exploded.
        start_step: optimizer steps already taken (when resuming), so step numbers continue; an integer ≥ 0.
        context: fields added to every record (e.g. ``{"run": "adam@1e-3"}`` when several runs share a file),
            with their names under ``context``; not the record's own field names.
        curvature: a ``Curvature``: sharpness against the optimizer's stability threshold, and the rest,
            every ``curvature.every`` steps; None for none.
        early_warning: warn of a loss spike or divergence before it comes: True for ``EarlyWarning()``'s
            thresholds, an ``EarlyWarning`` for others, False (the default) for none. Measured records then hold
            ``warning_score`` and ``warnings`` (``EarlyWarning``).
        on_warning: what a warning does besides being recorded: a function called with it (a dict), or
            ``"reduce_lr"`` (halve every param group's lr, said in the warning's ``action`` and ``lr``); None
            for nothing more. Needs ``early_warning``.

    Attributes:
        diverged: the first divergence record with ``on_divergence="record"``, else None.
        last_record: the record of the last measured step, or None.
        step_count: optimizer steps taken so far (``start_step`` included).
        names: each updated tensor's name in the records, keyed by ``id``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``; ``optimizer`` is not an optimizer, or has no step hooks
            and wraps none that has; ``sinks`` is not a list of sinks; ``guard`` or ``curvature`` is of
            another type; ``histograms`` is not a bool; ``context`` is not a dict with string keys;
            ``token_counts`` is not a sequence of counts.
        ValueError: ``every``, ``batch_tokens`` or ``start_step`` out of range; ``alarm_growth`` ≤ 1;
            ``on_divergence`` not "raise" or "record"; ``on_warning`` not a function or "reduce_lr", or given
            without ``early_warning``; ``context`` reuses a record field; ``embedding`` is no
            parameter name or not 2-D; ``token_counts`` without ``embedding``, of the wrong length, or not
            finite and ≥ 0; ``curvature.rank_batch_size`` on a model that is not a DDP model of ≥ 2 ranks
            without a communication hook of its own, or ``curvature.accumulation_batch_size`` under DDP; a
            sharding the monitor does not measure (DeepSpeed ZeRO, tensor parallel, HSDP), or ``curvature``,
            ``histograms`` or ``embedding`` under FSDP.
        Exception: whatever ``curvature.loss_fn`` raises on ``curvature.batch`` (tried once here), with a
            note saying so.

    Examples:
        Build it once; call ``monitor.step(loss)`` right after ``optimizer.step()``:

        >>> import torch
        >>> from optiscope.monitor import JSONLSink, Monitor
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        >>> monitor = Monitor(model, optimizer, every=5, sinks=[JSONLSink("metrics.jsonl")])
        >>> x, y = torch.randn(16, 4), torch.randn(16, 1)
        >>> for _ in range(10):
        ...     optimizer.zero_grad()
        ...     loss = torch.nn.functional.mse_loss(model(x), y)
        ...     loss.backward()
        ...     optimizer.step()
        ...     record = monitor.step(loss)
        >>> record["step"], sorted(record["params"])
        (10, ['bias', 'weight'])
        >>> sorted(record["params"]["weight"])
        ['cos', 'eff_lr', 'g', 'nonfinite_grad', 'nonfinite_w', 'u', 'u_over_w', 'u_rms', 'w', 'zero_grad']
        >>> len(open("metrics.jsonl").readlines())  # steps 1, 5 and 10
        3
        >>> monitor.close()

    Notes:
        - Cost: the pre-step hook copies the parameters that have gradients on measured steps only, and the
          post-step hook frees the copy: one extra copy of the parameters; of the gradients too on the first
          measured step, and on every measured step of an optimizer that writes into them (see below). On the
          other steps the monitor keeps the loss on its device (a float64 copy) and reads nothing: the guard
          reads the losses on measured steps and every ``guard.read_every`` steps (``DivergenceGuard``), and a
          GradScaler's ``found_inf`` handed to a fused optimizer is read with them.
        - References: the optimizer's hooks hold the monitor weakly, and ``close()`` lets go of the model, the
          optimizer and (through the model) the process group, so that they are freed by their reference
          counts once the caller drops them, not by the garbage collector at interpreter shutdown.
        - What is measured: every parameter of the optimizer's groups that holds a gradient, as the optimizer
          steps exactly those (one frozen mid-run with ``requires_grad_(False)`` that keeps a zeroed ``.grad``
          is still moved by momentum and decay, and recorded), also one added later with ``add_param_group``.
          Names are those the optimizer was given (``model.named_parameters()``), else the model's own inside
          its wrappers, else ``group{i}.param{j}``. g is the gradient the optimizer steps with, so after any
          clipping, read as the step begins (or as its closure returns): inside ``step()`` an optimizer may use
          it up (heavyball) or rescale it in place (Schedule-Free). For cos(u, −g) the monitor keeps the
          gradient tensors, copied where the optimizer writes into them: the first measured step copies and
          compares; a later one whose gradient was written into after all has a NaN cosine, and the measured
          steps after it copy. A measured step that begins with no gradient warns once. Norms are summed in
          float32 at least, and again in float64 where float32 overflows although every entry is finite, so
          only a tensor holding inf or NaN has a non-finite norm.
        - ``curvature``: its loss is evaluated once on its batch when the monitor is built (``check_batch``),
          so that a batch or loss function the Hessian-vector products cannot take fails here, not ``every``
          steps into training. With ``rank_batch_size`` the model must be a ``DistributedDataParallel`` with
          world size ≥ 2 and no communication hook of its own (DDP takes one): the monitor registers its own,
          which averages exactly as DDP's default does (``RankNoise``), and keeps it until the model is gone
          (after ``close()`` it only averages).
        - DDP: every rank computes the same records (the loss is averaged across ranks when the guard reads it, a
          collective every rank must reach, so every rank must take the same optimizer steps) and only rank 0's
          sinks write.
          Uneven inputs under DDP's ``Join`` are refused at the first ``step`` (give the monitor the
          DDP-wrapped model, where ``Join`` can be seen).
        - FSDP2 (``fully_shard``) and FSDP1 (``FullyShardedDataParallel``, ``use_orig_params`` True or False):
          every rank records the unsharded model's numbers under the names of the user's model (no
          ``_fsdp_wrapped_module.``): norms, ⟨u, g⟩ and counts are summed over the shard group, the effective
          LR's min and max reduced, its median taken over the same entries as unsharded (``sharding``); a
          measured step is then a few collectives every rank reaches. Curvature, ``histograms`` and
          ``embedding`` are refused under FSDP, as are DeepSpeed ZeRO, tensor parallelism and HSDP.
        - A compiled step (``torch.compile(optimizer.step)``): the hooks run outside the graph
          (``torch.compiler.disable``), so the step compiles once, as without the monitor.
        - A ``Monitor`` cannot be pickled or copied (its hooks and open sinks would not survive): save
          ``state_dict()`` and give a new monitor ``load_state_dict()``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        every: int = 10,
        sinks: Iterable[Any] | None = None,
        *,
        batch_tokens: int | None = None,
        guard: DivergenceGuard | None = DEFAULT_GUARD,
        on_divergence: str = "raise",
        embedding: Tensor | str | None = None,
        token_counts: Tensor | Sequence[int] | None = None,
        histograms: bool = False,
        alarm_growth: float = 10.0,
        start_step: int = 0,
        context: dict[str, Any] | None = None,
        curvature: Curvature | None = None,
        early_warning: bool | EarlyWarning = False,
        on_warning: Callable[[dict[str, Any]], Any] | str | None = None,
    ) -> None:
        check_schedule(every, curvature, guard, "Monitor")
        warning_config = checked_warning(early_warning, on_warning, "Monitor")
        if not isinstance(model, nn.Module):
            raise TypeError(f"Monitor: model={model!r} is not an nn.Module; give the model the optimizer trains")
        require_optimizer(optimizer, "Monitor")
        if sinks is None:  # said once: a monitor that records to nowhere looks like one that works
            log.warning(
                "Monitor: no sinks, so its records go nowhere but monitor.last_record (and what step() returns); "
                "give sinks=[JSONLSink('metrics.jsonl')] (or any sink), or sinks=[] for none on purpose"
            )
        sinks = checked_sinks(() if sinks is None else sinks, "Monitor")
        if not (finite(alarm_growth) and alarm_growth > 1):
            raise ValueError(f"Monitor: alarm_growth={alarm_growth!r} must be a number > 1 (a finite multiple of u/w)")
        if on_divergence not in ("raise", "record"):
            raise ValueError(f"Monitor: on_divergence={on_divergence!r} must be 'raise' or 'record'")
        if batch_tokens is not None and not is_count(batch_tokens):
            raise ValueError(f"Monitor: batch_tokens={batch_tokens!r} must be a positive integer or None")
        if not is_count(start_step, least=0):
            raise ValueError(f"Monitor: start_step={start_step!r} must be an integer >= 0 (the steps already taken)")
        if not isinstance(histograms, bool):
            raise TypeError(f"Monitor: histograms={histograms!r} must be True or False")
        if context is not None and not (isinstance(context, Mapping) and all(isinstance(k, str) for k in context)):
            raise TypeError(
                f"Monitor: context={context!r} must be a dict of field names to values, e.g. {{'run': 'sgd'}}"
            )
        hooked = hooked_optimizer(optimizer)
        self.model, self.optimizer, self.every = model, optimizer, every
        self.sinks = sinks
        self.batch_tokens, self.guard, self.on_divergence = batch_tokens, guard, on_divergence
        self.histograms, self.alarm_growth = histograms, alarm_growth
        self.context = dict(context or {})
        clash = sorted(RECORD_FIELDS & self.context.keys())
        if clash:
            raise ValueError(
                f"Monitor: context names {clash}, fields of the monitor's own records that would overwrite it; "
                "name them otherwise (e.g. {'run': 'sgd@0.1'} or {'eta': 0.1})"
            )
        self._taken_names = RECORD_FIELDS | self.context.keys()  # what a step's scalars may not be called
        self.curvature = curvature
        self._curvature_vector: Tensor | None = None  # the warm start: last top eigenvector
        self._curvature_history: list[tuple[int, float | None, str, bool]] = []
        self._update: dict[int, Tensor] | None = None
        self.names: dict[int, str] = parameter_names(model, optimizer)
        self._layout = sharding.layout(model, optimizer, self.names)
        if self._layout is not None:
            _refuse_under_sharding(curvature, histograms, embedding)
        if curvature is not None:
            check_batch(curvature, model)
        self._small_batches = self._small_batch_source(model, optimizer, curvature)
        self.embedding = self._resolve_embedding(embedding, model, optimizer, self.names)
        self.token_counts = _checked_token_counts(token_counts, self.embedding)
        self.row_update_sum: Tensor | None = None
        self.row_update_steps = 0
        self.step_count = start_step
        self._guard_state = GuardState()  # what the guard has judged so far
        self._log = StepLog()  # the steps whose losses are still on their device, not judged yet
        self.diverged: dict[str, Any] | None = None
        self.last_record: dict[str, Any] | None = None
        self.last_measured_step: int | None = None  # last_record's step, which a resumed run keeps (state_dict)
        self._ratio_history: dict[str, list[tuple[int, float]]] = {}
        self._snapshot: list[Tensor] | None = None  # the parameters before a measured step, then −u
        self._snapshot_params: list[Tensor] = []
        self._gradients: Gradients | None = None  # a measured step's gradients, read as the step begins
        self._copy_gradients: bool | None = None  # whether the optimizer writes into p.grad; None: not known yet
        self._warned_no_gradients = False
        self._measured: dict[str, Any] | None = None  # the stats of the last optimizer step, if it was measured
        # each group's lr as the measured step used it, read before the step: a record means the same whether
        # a scheduler moves lr on before monitor.step() (optiscope.train, Lightning) or after (the 🤗 callback)
        self._step_lrs: list[Any] | None = None
        self._clock = (time.perf_counter(), start_step)
        self._skipping = False  # the measured step under way is one a fused kernel skips (``found_inf``)
        self._found_inf: Tensor | None = None  # an unmeasured step's flag, read with its loss (``deferred``)
        self._outer_call: Any = None  # the frame of torch's hook wrapper around the step() call being measured
        self._stepped = False  # the optimizer stepped since the last step() call
        self._closed = False
        self._warning = Warnings(warning_config, on_warning) if warning_config is not None else None
        self._hooks = [
            # kept out of tracing: a compiled step (``torch.compile(optimizer.step)``) compiles once, the hooks
            # running eagerly at its graph's edges, instead of every hook's branch and tensor becoming a guard;
            # held weakly, or the optimizer would hold the monitor that holds it (``hooks``)
            hooked.register_step_pre_hook(torch.compiler.disable(weak_hook(self._before_step))),
            hooked.register_step_post_hook(torch.compiler.disable(weak_hook(self._after_step))),
        ]

    def _small_batch_source(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, curvature: Curvature | None
    ) -> RankNoise | AccumulationNoise | None:
        """Where the noise scale's small batches come from without an extra backward pass, if asked."""
        if curvature is None:
            return None
        me = weakref.ref(self)  # held by DDP's communication hook after close(): not the monitor

        def due() -> bool:  # the hooks run inside backward, before the step they belong to
            monitor = me()
            return monitor is not None and not monitor._closed and monitor._curvature_due(monitor.step_count + 1)

        if curvature.rank_batch_size is not None:
            return RankNoise(model, curvature.rank_batch_size, due)
        if curvature.accumulation_batch_size is not None:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
            named = [(self.names[id(p)], p) for p in params]  # named when the monitor was built
            return AccumulationNoise(model, named, curvature.accumulation_batch_size, due)
        return None

    # ------------------------------------------------------------------------------------ hooks
    def is_measured(self, step: int) -> bool:
        """Whether optimizer step number ``step`` gets a record: the first, every ``every``-th, and those the
        curvature measures.

        Args:
            step: an optimizer step number (1 for the first).

        Returns:
            True when the monitor measures that step.
        """
        return step == 1 or step % self.every == 0 or self._curvature_due(step)

    def _curvature_due(self, step: int) -> bool:
        return self.curvature is not None and self.curvature.due(step)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        # torch runs the hooks in every patched step() of a class chain: a subclass's super().step() calls them
        # again inside the step under way, which is measured once, from outside (a step that raised left its
        # frame behind, off the stack: the next call is a step of its own)
        caller = torch_caller(sys._getframe(1))
        if self._outer_call is not None and on_stack(self._outer_call, caller.f_back):
            return None
        self._outer_call = caller
        measured = self.is_measured(self.step_count + 1)
        if self._warning is not None:  # Adam's lag, on the device: read with the losses
            self._warning.before_step(
                optimizer, self.step_count + 1, measured, self._layout is not None, "Monitor(early_warning=...)"
            )
        if not measured:
            # whether a fused kernel skips this step is read later, with the loss: reading it here would wait
            self._found_inf = found_inf(optimizer)
            return None
        flag, self._found_inf = found_inf(optimizer), None
        self._skipping = flag is not None and bool(flag.item())  # a measured step reads it at once
        if self._skipping:
            return None
        # copies: a scheduler steps a tensor lr in place (``fill_``), before the monitor reads the step's lr
        self._step_lrs = [g["lr"].clone() if isinstance(g["lr"], Tensor) else g["lr"] for g in optimizer.param_groups]
        self._snapshot, self._gradients = None, None  # what a step that raised inside left behind is not this one's
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._read_gradients(optimizer, after_closure=False)
            return None
        # A closure computes the gradients inside step() (Lightning's automatic optimisation), where the
        # optimizer may use them up at once: they are read as its closure returns. One frozen with
        # requires_grad_(False) that keeps a zeroed .grad is still stepped (momentum, weight decay move it).
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad or p.grad is not None]
        self._snapshot_params = self._parts(params)
        self._snapshot = _copies(self._snapshot_params)
        read = []

        def closure_then_read() -> Any:
            loss = closure()
            if not read:  # LBFGS calls it again and again; the step's gradient is the first
                read.append(True)
                self._read_gradients(optimizer, after_closure=True)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_read}
        return (args[0], closure_then_read, *args[2:]), kwargs

    @torch.no_grad()
    def _read_gradients(self, optimizer: torch.optim.Optimizer, after_closure: bool) -> None:
        """What a measured step needs of its gradients, read before the optimizer uses them: an optimizer may
        use them up (heavyball sets ``p.grad`` to None) or rescale them in place (Schedule-Free divides them by
        its preconditioner) inside ``step()``. Their norms, counts and, for cos(u, −g), the gradient tensors
        themselves, copied where the optimizer writes into them (``Gradients``); then the parameters."""
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if after_closure:  # taken before the closure ran: keep the parameters that now have a gradient
            with_grad = {id(p) for p in params}
            kept = [
                (q, b) for q, b in zip(self._snapshot_params, self._snapshot, strict=True) if id(_param(q)) in with_grad
            ]
            self._snapshot_params, self._snapshot = [q for q, _ in kept], [b for _, b in kept]
            params = self._snapshot_params
        else:
            params = self._snapshot_params = self._parts(params)
            self._snapshot = _copies(params)
        if not params and self._layout is None:  # sharded, a rank may hold no part: the others count on it
            self._gradients = None
            return
        grads = [_grad(q) for q in params]
        norms = stats.foreach_norms(grads)
        # a GradScaler hands an optimizer that unscales by itself (torch's fused Adam) its scale instead of
        # unscaling: the gradient it steps with is this one divided by that scale, and its kernel writes that
        # into .grad without telling the tensor's version counter: always copied
        scale = getattr(optimizer, "grad_scale", None)
        copy_them = isinstance(scale, Tensor) or self._copy_gradients is not False
        self._gradients = Gradients(
            params=params,
            norms=norms,
            scale=float(scale) if isinstance(scale, Tensor) else 1.0,
            nonfinite=stats.nonfinite_counts(grads, norms),
            zeros=stats.zero_counts(grads),
            tensors=grads,
            versions=[g._version for g in grads],
            copies=[g.clone() for g in grads] if copy_them else None,
        )

    @torch.no_grad()
    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._outer_call is not None:
            wrapper = sys._getframe(1)  # torch's wrapper, above the frames of this method's decorator
            while wrapper is not None and wrapper.f_code is not self._outer_call.f_code:
                wrapper = wrapper.f_back
            if wrapper is not self._outer_call:  # the end of a step() inside the step under way
                return
            self._outer_call = None
        if self._skipping:  # not a step: as when a GradScaler does not call step() at all
            self._skipping = False
            return
        self.step_count += 1
        self._stepped = True
        # an earlier step's numbers that no step() took (stepped twice without a call there) are not this step's
        self._measured, self._update = None, None
        gradients, before, params = self._gradients, self._snapshot, self._snapshot_params
        self._gradients, self._snapshot, self._snapshot_params = None, None, []
        if before is None:  # not a measured step
            return
        if gradients is None:  # the optimizer had no gradient to step with: there is nothing to measure
            self._warn_no_gradients()
            return
        if before:  # sharded, a rank may hold no part of any parameter
            torch._foreach_sub_(before, [q.of(q.param) if isinstance(q, Part) else q for q in params])  # −u
        self._measured = self._parameter_stats(optimizer, gradients, neg_updates=before)
        if self._measured is None:  # sharded: no rank had a gradient
            self._warn_no_gradients()
            return
        if self._curvature_due(self.step_count):  # −u: the sign does not change a curvature
            self._update = {id(p): u for p, u in zip(params, before, strict=True)}

    def _warn_no_gradients(self) -> None:
        if self._warned_no_gradients:
            return
        self._warned_no_gradients = True
        warnings.warn(
            f"Monitor: optimizer step {self.step_count} began with no parameter holding a gradient (every p.grad "
            "None), so there is nothing to record; call loss.backward() before optimizer.step() (warned once)",
            stacklevel=7,  # the caller of optimizer.step(), above the hook and its two wrappers
        )

    def _parts(self, params: list[Tensor]) -> list[Any]:
        """What a measured step reads: the tensors the optimizer steps, or, sharded, this rank's parts of them."""
        return params if self._layout is None else self._layout.parts_of(params)

    def _parameter_stats(
        self, optimizer: torch.optim.Optimizer, gradients: Gradients, neg_updates: list[Tensor]
    ) -> dict[str, Any] | None:
        # a few operators for all tensors at once and one read each: on a small, fast step the cost is dispatch
        # and Python per tensor, not arithmetic (benchmarks/monitor_overhead.py)
        if self._layout is not None:
            return self._sharded_stats(optimizer, gradients, neg_updates)
        params = gradients.params
        # ⟨−u, g⟩ = ⟨u, −g⟩, over the scaled gradient whose norm divides it: the cosine is the same
        w, u, cos_dot = stats.update_norms(params, neg_updates, self._gradient_tensors(gradients))
        g_stepped = gradients.norms.tolist()  # as the optimizer held it: scaled under a GradScaler's fused step
        g = [x / gradients.scale for x in g_stepped]
        bad_w = stats.nonfinite_counts(params, w)
        group_of = {id(q): group for group in optimizer.param_groups for q in group["params"]}
        groups = [group_of[id(p)] for p in params]
        rates = stats.effective_lr_summaries(optimizer, params, groups)
        per_param: dict[str, dict[str, Any]] = {}
        for i, p in enumerate(params):
            entry = _entry(
                g[i], w[i], u[i], cos_dot[i], g_stepped[i], p.numel(), gradients.zeros[i], gradients.nonfinite[i],
                bad_w[i],
            )  # fmt: skip
            entry["no_eff_lr" if isinstance(rates[i], str) else "eff_lr"] = rates[i]
            if self.histograms and not isinstance(rates[i], str):
                entry["eff_lr_hist"] = stats.log_histogram(stats.effective_lr(optimizer, p))
            per_param[self._name(p)] = entry
            if p is self.embedding:
                self._track_rows(neg_updates[i])
        index = {id(p): i for i, p in enumerate(params)}
        aggregates = []
        for group in optimizer.param_groups:
            idx = [index[id(p)] for p in group["params"] if id(p) in index]
            aggregates.append(_aggregate([g[i] for i in idx], [w[i] for i in idx], [u[i] for i in idx]))
        return {"params": per_param, "groups": aggregates, "total": _aggregate(g, w, u)}

    def _sharded_stats(
        self, optimizer: torch.optim.Optimizer, gradients: Gradients, neg_updates: list[Tensor]
    ) -> dict[str, Any] | None:
        """``_parameter_stats`` of a sharded model: each rank's parts summed over the shard group
        (``sharding``), so that every rank records the whole model's numbers. Collectives: every rank is here."""
        layout, parts = self._layout, gradients.params
        assert layout is not None
        weights = [_weight(q) for q in parts]
        w, u = stats.foreach_norms(weights), stats.foreach_norms(neg_updates)
        columns = [gradients.norms**2, w**2, u**2, stats.foreach_dots(neg_updates, self._gradient_tensors(gradients))]
        counts = [gradients.zeros, gradients.nonfinite, stats.nonfinite_counts(weights, w), [1] * len(parts)]
        rows = torch.stack([*columns, *(torch.tensor(c, dtype=torch.float64) for c in counts)], dim=1)
        totals = sharding.sums(layout, parts, rows.reshape(len(parts), len(sharding.SUMS)))
        rates = sharding.effective_lr_summaries(layout, parts, optimizer)
        per_param, kept = {}, []
        for i, name in enumerate(layout.names):
            g2, w2, u2, dot, zeros, bad_g, bad_w, held = totals[i].tolist()
            if held == 0:  # no rank had its gradient: not stepped
                continue
            norm = math.sqrt(g2)
            entry = _entry(
                norm / gradients.scale, math.sqrt(w2), math.sqrt(u2), dot, norm, layout.numels[i], int(zeros),
                int(bad_g), int(bad_w),
            )  # fmt: skip
            entry["no_eff_lr" if isinstance(rates[i], str) else "eff_lr"] = rates[i]
            per_param[name] = entry
            kept.append(i)
        if not kept:
            return None
        g, w, u = ([per_param[layout.names[i]][k] for i in kept] for k in "gwu")
        groups = []
        for gi in range(len(optimizer.param_groups)):
            idx = [j for j, i in enumerate(kept) if layout.groups[i] == gi]
            groups.append(_aggregate([g[j] for j in idx], [w[j] for j in idx], [u[j] for j in idx]))
        return {"params": per_param, "groups": groups, "total": _aggregate(g, w, u)}

    def _gradient_tensors(self, gradients: Gradients) -> list[Tensor]:
        """The gradients as the step began, for ⟨u, g⟩: the copies, or the optimizer's own tensors where it left
        them as they were. Whether it does is learnt on the first measured step, which copies and compares; a
        later step that writes into them after all (its version counter moved) loses its cosine (NaN) and has
        every later measured step copy."""
        untouched = [t._version == v for t, v in zip(gradients.tensors, gradients.versions, strict=True)]
        if gradients.copies is not None:
            if self._copy_gradients is None:  # the first measured step: did the optimizer write into them?
                now = stats.foreach_norms(gradients.tensors)
                same = bool(((now == gradients.norms) | (now.isnan() & gradients.norms.isnan())).all())
                self._copy_gradients = not (all(untouched) and same)
            return gradients.copies
        if all(untouched):
            return gradients.tensors
        self._copy_gradients = True
        return [t if ok else torch.full_like(t, math.nan) for t, ok in zip(gradients.tensors, untouched, strict=True)]

    def _name(self, p: Tensor) -> str:
        """``p``'s name in the records; a tensor added since (``add_param_group``) is named as
        ``parameter_names`` names it then, and keeps that name."""
        if id(p) not in self.names:
            now, taken = parameter_names(self.model, self.optimizer), set(self.names.values())
            for gi, group in enumerate(self.optimizer.param_groups):
                for pi, q in enumerate(group["params"]):
                    if id(q) not in self.names:  # a name an earlier tensor holds stays that tensor's
                        name = now[id(q)] if now[id(q)] not in taken else f"group{gi}.param{pi}"
                        self.names[id(q)] = name
                        taken.add(name)
        return self.names[id(p)]

    def _track_rows(self, neg_update: Tensor) -> None:
        rows = stats.row_norms(neg_update)
        # the sum follows the rows: a checkpoint loads it onto the CPU, whatever device the model is on by now
        self.row_update_sum = rows if self.row_update_sum is None else self.row_update_sum.to(rows.device) + rows
        self.row_update_steps += 1

    # ------------------------------------------------------------------------------------- step
    def skip(self, steps: int = 1, loss: float | Tensor | None = None, *, scaled: bool = True) -> None:
        """Count optimizer steps that the training loop counted and the optimizer did not take.

        Such a step is a mixed-precision step whose non-finite gradients a GradScaler skipped: it does not call
        ``optimizer.step()``, or, for an optimizer that scales by itself, the kernel skips the update
        (``skipped_inside``); the monitor counts neither as a step. Their numbers are used up without records,
        so that the monitor's step numbers stay the loop's (its logs, its checkpoints). ``step()`` calls this
        itself when no optimizer step came since the last call.

        Args:
            steps: how many steps were skipped; an integer ≥ 1.
            loss: the last skipped step's loss (a number, a tensor, or None); not judged, but carried by a
                divergence record.
            scaled: True when a GradScaler is at work: a run that skips the guard's ``skipped`` steps in a row
                diverges here (``DivergenceGuard``), unless it has diverged already. False: the loop left the
                steps out on purpose (a Lightning module's own ``optimizer_step`` that does not step): numbers
                used up, nothing judged.

        Raises:
            Diverged: with ``on_divergence="raise"``, when the skipped streak reaches the guard's ``skipped``
                (judged with the losses kept before it: see ``step``).
            ValueError: the monitor is closed.
        """
        self._check_open("skip")
        self.step_count += steps
        # every rank skips the same steps (DDP averages the gradients): all keep and read them alike
        self._keep(kept_loss(loss), skipped=steps, scaled=scaled, steps=steps)

    def step(self, loss: float | Tensor | None = None, **scalars: float) -> dict[str, Any] | None:
        """Finish the optimizer step just taken: judge its loss and, on a measured step, record it.

        Call it right after ``optimizer.step()``, once per optimizer step.

        Args:
            loss: the batch's loss: a number, a tensor (one of several elements, e.g. per-sample losses, counts
                as their mean), or None. A tensor is kept on its device and read with the others on measured
                steps and every ``guard.read_every`` steps, where the guard judges each in order (a number, in a
                single process, at once). Under DDP it is averaged across ranks when read.
            **scalars: numbers or one-element tensors that join a measured step's record under their own
                names (e.g. ``val_acc=0.81``); read on measured steps only. Not the record's own field names
                nor the context's.

        Returns:
            The record of a measured step, else None. A record holds ``step``, ``loss``, ``grad_norm`` (the
                global ‖g‖), ``lr`` (one per param group; None where the optimizer sets its own step size, as
                🤗 Adafactor's relative step does), ``tokens_per_s`` (with ``batch_tokens``), the ``scalars``, the
                context's fields, ``params`` (per parameter name: ``g``, ``w``, ``u``, ``u_over_w``, ``cos``,
                ``u_rms``, ``zero_grad`` (the fraction of exactly-zero gradient entries), ``nonfinite_grad``,
                ``nonfinite_w`` and, where optiscope knows the optimizer's rule (``stats.effective_rate``),
                ``eff_lr`` with ``min``/``median``/``max``, plus ``eff_lr_hist`` with ``histograms``, else
                ``no_eff_lr``, one line saying why), ``groups`` and ``total`` (``g``, ``w``, ``u``, ``u_over_w``,
                ``n``); on curvature steps the ``Curvature`` fields and ``curvature`` (details); with
                ``embedding``, ``embedding`` (a summary of the rows' updates).

        Raises:
            Diverged: with ``on_divergence="raise"``, when the guard trips (a non-finite loss, non-finite
                weights on a measured step, a loss far above its lowest, too many skipped steps in a row), at the
                step that reads that loss: the record holds the step it happened at.
            ValueError: a scalar reuses a record or context field; ``loss`` is an empty tensor; a DDP model
                under ``Join`` (uneven inputs); the monitor is closed.
            TypeError: a scalar or ``loss`` is not a number or a tensor.

        Notes:
            A call with no optimizer step since the last one is a step a GradScaler skipped
            (``scaler.step(optimizer)`` did not step it, or the kernel skipped it): its number is used up
            (``skip``) and its loss, often not finite under mixed precision, is not judged: the scaler has
            dealt with it, unless it has skipped too many in a row (``skip``).
        """
        taken = sorted(self._taken_names.intersection(scalars))
        if taken:
            raise ValueError(f"Monitor.step: scalars {taken} would overwrite the record's own or the context's fields")
        for name, value in scalars.items():
            if not (is_number(value) or (isinstance(value, Tensor) and value.numel() == 1)):
                raise TypeError(f"Monitor.step: {name}={value!r} must be a number or a one-element tensor")
        self._check_open("step")
        if not self._stepped:
            self.skip(loss=loss)
            return None
        self._stepped = False
        step = self.step_count
        _refuse_ddp_join(self.model)
        measured, self._measured = self._measured, None
        flag, self._found_inf = self._found_inf, None
        loss = kept_loss(loss)
        if measured is None:
            self._keep(loss, skipped=0 if flag is None else flag, scaled=True, steps=1)
            return None
        # a measured step reads what was kept before it, judged first, and its own loss with it
        self._log.keep(step, loss)
        *before, now = self._log.read()
        self._judge(before)
        loss_value = now.loss
        reason = self._guard_state.judge(self.guard, step, loss_value)
        if self._warning is not None:
            self._act(self._warning.losses([(step, loss_value)]) + self._warning.read_lags())
        self._remember_ratios(step, measured["params"])
        bad = [name for name, e in measured["params"].items() if e["nonfinite_w"]]
        if bad and reason is None and self.guard is not None:
            reason = f"non-finite weights in {', '.join(bad[:5])}"
        record = {
            **self._context_fields(),
            "step": step,
            "loss": loss_value,
            "grad_norm": measured["total"]["g"],
            **self._scalars(step),
            # read on measured steps only: .item() waits for the GPU; TensorBoard and JSON take numbers
            **{name: float(v.detach()) if isinstance(v, Tensor) else v for name, v in scalars.items()},
            **measured,
        }
        if self._curvature_due(step):
            with learning_rates(self.optimizer, self._step_lrs):
                record.update(self._measure_curvature(step))
            if self._warning is not None:
                self._act(self._warning.edge(step, record.get("sharpness/threshold")))
        if self._warning is not None:
            record.update(self._warning.fields())
        if self.row_update_sum is not None:
            record["embedding"] = self.embedding_summary()
        self.last_record, self.last_measured_step = record, step
        self._write(record)
        self._step_lrs = None
        if reason is not None:
            self.diverge(step, loss_value, reason, measured=record)
        return record

    def _keep(self, loss: Tensor | float | None, skipped: Tensor | int, scaled: bool, steps: int) -> None:
        """Keep the step just counted (``self.step_count``, ``steps`` after the one before) for the guard, and
        read what is kept when it is due: every ``guard.read_every`` steps. In a single process, with nothing
        kept before it, a step that waits for nothing is judged at once: a loss given as a number, or a skip the
        loop knows of (whose loss is read only should its streak trip). Without a guard nothing judges the steps
        between measured ones: only a skipped streak is counted."""
        host = isinstance(skipped, int)
        if self.guard is None:
            if host:
                self._judge([Read(self.step_count, None, skipped, scaled)])
            return
        joined = dist.is_available() and dist.is_initialized()
        if not joined and not self._log.kept and host and (skipped or not isinstance(loss, Tensor)):
            if not skipped:
                self._judge([Read(self.step_count, loss, 0, scaled)])  # type: ignore[arg-type]
                return
            reason = self._guard_state.skip(self.guard, skipped, scaled and self.diverged is None)
            if reason is not None:
                self.diverge(self.step_count, None if loss is None else float(loss), reason)
            return
        self._log.keep(self.step_count, loss, skipped, scaled)
        every = self.guard.read_every
        if self.step_count // every > (self.step_count - steps) // every:
            self._judge(self._log.read())

    def _judge(self, steps: list[Read], read_all: bool = False) -> None:
        """The guard's judgement of steps read from the log, in order, as it would have judged them as they came;
        a divergence is declared at the step it happened at. The early warning judges them first, and reads the
        lags it keeps on the device when ``read_all`` or when as many are kept as the guard reads losses at once."""
        if self._warning is not None:
            found = self._warning.losses([(r.step, r.loss) for r in steps if not r.skipped])
            read_every = self.guard.read_every if self.guard is not None else self.every
            if read_all or len(self._warning.pending) >= read_every:
                found += self._warning.read_lags()
            self._act(found)
        for read in steps:
            if read.skipped:
                reason = self._guard_state.skip(self.guard, read.skipped, read.scaled and self.diverged is None)
            else:
                reason = self._guard_state.judge(self.guard, read.step, read.loss)
            if reason is not None:
                self.diverge(read.step, read.loss, reason)

    def flush(self) -> None:
        """Judge now the steps whose losses are still on their device (at most ``guard.read_every`` − 1 of them).

        ``step`` reads them every ``read_every`` steps and on measured steps; call this before saving a
        checkpoint, or when a run ends between readings, so that no step goes unjudged. Under DDP it is a
        collective (one all-reduce when there is anything to read): call it on every rank.

        Raises:
            Diverged: with ``on_divergence="raise"``, when the guard trips on one of those steps.
            ValueError: the monitor is closed.
        """
        self._check_open("flush")
        self._judge(self._log.read(), read_all=True)

    @property
    def first_loss(self) -> float:
        """The run's first finite loss the guard has judged (NaN before one)."""
        return self._guard_state.first

    @property
    def lowest_loss(self) -> float:
        """The lowest level the guard has seen (the median of its window of recent losses; inf before one)."""
        return self._guard_state.lowest

    @property
    def recent_losses(self) -> list[float]:
        """The recent finite losses the guard has judged, oldest first (its window's worth)."""
        return list(self._guard_state.recent)

    def _act(self, warnings: list[dict[str, Any]]) -> None:
        """Warnings found: to ``on_warning``, and kept for the next record."""
        if warnings and self._warning is not None:
            self._warning.act(warnings, self.optimizer)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ValueError(
                f"Monitor.{what}: the monitor is closed; build a new Monitor (give it this one's state_dict() to "
                "go on where it stopped)"
            )

    def _measure_curvature(self, step: int) -> dict[str, Any]:
        assert self.curvature is not None
        update, self._update = self._update, None
        # the ranks' gather is a collective: every rank is here
        small_batches = self._small_batches.gather() if self._small_batches is not None else None
        values, self._curvature_vector = measure(
            self.curvature, self.model, self.optimizer, update, self._curvature_vector, small_batches
        )
        details = values["curvature"]
        self._curvature_history.append(
            (step, values["sharpness/threshold"], details["label"], details["preconditioned"])
        )
        return values

    def _scalars(self, step: int) -> dict[str, Any]:
        now = time.perf_counter()
        last_time, last_step = self._clock
        self._clock = (now, step)
        # float(): torch.optim (and ours) accept a tensor lr, which JSON and TensorBoard cannot take; None stays
        # None (🤗 Adafactor's relative step: the optimizer computes its step size itself, per parameter)
        lrs = self._step_lrs if self._step_lrs is not None else [g["lr"] for g in self.optimizer.param_groups]
        out: dict[str, Any] = {"lr": [None if lr is None else float(lr) for lr in lrs]}
        if self.batch_tokens and step > last_step and now > last_time:
            out["tokens_per_s"] = self.batch_tokens * (step - last_step) / (now - last_time)
        return out

    def _remember_ratios(self, step: int, per_param: dict[str, dict[str, Any]]) -> None:
        for name, entry in per_param.items():
            self._ratio_history.setdefault(name, []).append((step, entry["u_over_w"]))

    def exploded_first(self, limit: int = 5) -> list[dict[str, Any]]:
        """The parameters whose u/w exploded, earliest first: the culprits of a divergence.

        A parameter's u/w exploded at the first measured step at which it was not finite or exceeded
        ``alarm_growth`` times its level before (the median of its first three measurements, of those before it
        while there are fewer: a large first step that settles is no explosion); ties go by growth since that
        early level. Only those that did: a parameter named here is a culprit (``grew_most`` lists the others).

        Args:
            limit: at most this many rows.

        Returns:
            Rows ``{"name", "first_step", "u_over_w", "early", "growth"}``: the step it exploded, the latest u/w,
                its early level and the growth since.
        """
        rows = [r for r in self._ratio_rows() if r["first_step"] is not None]
        rows.sort(key=lambda r: (r["first_step"], -_finite_or_big(r["growth"])))
        return rows[:limit]

    def grew_most(self, limit: int = 3) -> list[dict[str, Any]]:
        """The parameters whose u/w never exploded, by growth since their early level, largest first.

        Where a run that diverged without any explosion moved most.

        Args:
            limit: at most this many rows.

        Returns:
            Rows as ``exploded_first``'s, with ``first_step`` None.
        """
        rows = [r for r in self._ratio_rows() if r["first_step"] is None]
        rows.sort(key=lambda r: -_finite_or_big(r["growth"]))
        return rows[:limit]

    def _ratio_rows(self) -> list[dict[str, Any]]:
        """Each parameter's u/w history judged: ``first_step`` it exploded (None if never), the latest u/w, its
        ``early`` level and ``growth`` since."""
        rows = []
        for name, history in self._ratio_history.items():
            early = _median([r for _, r in history if math.isfinite(r)][:3])
            first, before = None, []
            for s, r in history:
                level = _median(before[:3])
                if not math.isfinite(r) or (before and level > 0 and r > self.alarm_growth * level):
                    first = s
                    break
                before.append(r)
            latest = history[-1][1]
            growth = stats.safe_ratio(latest, early) if math.isfinite(latest) else math.inf
            rows.append({"name": name, "first_step": first, "u_over_w": latest, "early": early, "growth": growth})
        return rows

    def _context_fields(self) -> dict[str, Any]:
        """The context's fields, and under ``context`` their names: what tells this run's records apart from
        other runs' in a shared file (the report labels runs by them)."""
        return {**self.context, "context": list(self.context)} if self.context else {}

    def diverge(self, step: int, loss: float | None, reason: str, measured: dict[str, Any] | None = None) -> None:
        """Declare divergence at ``step``: write the divergence record to the sinks, then raise or keep it.

        The record holds the context's fields, ``diverged`` (True), ``step``, ``loss``, ``reason``,
        ``exploded_first``, ``grew_most``, ``first_measured_step``, ``last_measured_step`` and, with curvature measured,
        ``curvature_diagnosis``. With ``on_divergence="record"`` it is kept in ``self.diverged``: the first
        divergence only (a run that goes on is judged again at every step, and the first is what happened).
        A training loop calls this itself when it stops *before* a step.

        Args:
            step: the step number at which the run diverged.
            loss: its loss, or None.
            reason: why, in a few words (e.g. ``"loss is nan"``).
            measured: the step's own record if it was measured, for ``Diverged.measured``.

        Raises:
            Diverged: with ``on_divergence="raise"``, carrying the record and ``measured``; or the record of an
                earlier step whose loss the guard had not read yet (read first: the first divergence is what
                happened).
        """
        self._judge(self._log.read(), read_all=True)  # under DDP a collective when anything is kept: every rank is here
        if self.on_divergence == "record" and self.diverged is not None:
            return
        record = {
            **self._context_fields(),
            "diverged": True,
            "step": step,
            "loss": loss,
            "reason": reason,
            "exploded_first": self.exploded_first(),
            "grew_most": self.grew_most(),
            # the measured steps the u/w growth spans: one alone has no growth to compare
            "first_measured_step": min((h[0][0] for h in self._ratio_history.values() if h), default=None),
            "last_measured_step": self.last_measured_step,
        }
        diagnosis = curvature_diagnosis(step, self._curvature_history)
        if diagnosis is not None:
            record["curvature_diagnosis"] = diagnosis
        if self._warning is not None:
            record.update(self._warning.fields())
        self.diverged = record
        self._write(record)
        if self.on_divergence == "raise":
            raise Diverged(record, measured)

    # ---------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on exactly; save it in the checkpoint.

        Returns:
            A deep copy, which training on does not change, of what judging divergence, the embedding analysis,
                the curvature measurements (warm start and history) and a divergence record's
                ``last_measured_step`` need: a dict with at least ``STATE_KEYS``. The losses of the steps not
                judged yet are in it as numbers (``unread``: reading them waits for the GPU, and is no collective),
                judged after a resume where the whole run judges them.

        Notes:
            Under DDP the losses not judged yet are this rank's own; call ``flush()`` on every rank first (the
            callbacks and ``optiscope.train`` do, before a checkpoint) for a resume that averages them as the
            whole run does.
        """
        state = {
            "step_count": self.step_count,
            "first_loss": self._guard_state.first,
            "lowest_loss": self._guard_state.lowest,
            "recent_losses": self._guard_state.recent,
            "ratio_history": self._ratio_history,
            "row_update_sum": self.row_update_sum,
            "row_update_steps": self.row_update_steps,
            "curvature_vector": self._curvature_vector,
            "curvature_history": self._curvature_history,
            "skipped_in_a_row": self._guard_state.skipped_in_a_row,
            "last_measured_step": self.last_measured_step,
            "unread": self._log.state(),
        }
        if self._warning is not None:
            state["early_warning"] = self._warning.state_dict()
        return copy.deepcopy(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved ``state_dict()``.

        Args:
            state: what ``state_dict()`` returned; it holds at least ``STATE_KEYS`` (later keys are optional,
                for checkpoints from before them).

        Raises:
            ValueError: ``state`` is not a mapping or lacks one of ``STATE_KEYS``.
        """
        missing = sorted(STATE_KEYS - state.keys()) if isinstance(state, Mapping) else sorted(STATE_KEYS)
        if missing:
            raise ValueError(
                f"Monitor.load_state_dict: the state lacks {missing}; give what Monitor.state_dict() returned"
            )
        self.step_count = state["step_count"]
        self._guard_state = GuardState(
            first=state["first_loss"],
            lowest=state["lowest_loss"],
            recent=list(state.get("recent_losses", [])),  # absent in checkpoints from before the window
            skipped_in_a_row=state.get("skipped_in_a_row", 0),
        )
        self._log.load(state.get("unread", []))  # absent in checkpoints from before losses were kept unread
        self._ratio_history = {k: list(v) for k, v in state["ratio_history"].items()}
        self.row_update_sum, self.row_update_steps = state["row_update_sum"], state["row_update_steps"]
        if self.row_update_sum is not None and self.embedding is not None:  # a checkpoint is loaded onto the CPU
            self.row_update_sum = self.row_update_sum.to(self.embedding.device)
        self._curvature_vector = state.get("curvature_vector")  # absent in checkpoints from before curvature
        self._curvature_history = [tuple(h) for h in state.get("curvature_history", [])]
        self.last_measured_step = state.get("last_measured_step")
        if self._warning is not None and "early_warning" in state:
            self._warning.load_state_dict(state["early_warning"])
        self._clock = (time.perf_counter(), self.step_count)

    # ------------------------------------------------------------------------------- embedding
    @staticmethod
    def _resolve_embedding(
        embedding: Tensor | str | None, model: nn.Module, optimizer: torch.optim.Optimizer, names: dict[int, str]
    ) -> Tensor | None:
        if embedding is None:
            return None
        if not isinstance(embedding, Tensor):
            # the name as the wrapper has it, as the model inside its wrappers has it, or as the records give it
            named = {**dict(model.named_parameters()), **dict(unwrap(model).named_parameters())}
            named.update({names[id(p)]: p for group in optimizer.param_groups for p in group["params"]})
            if embedding not in named:
                raise ValueError(
                    f"Monitor: embedding={embedding!r} is not a parameter name; names: {sorted(named)[:8]} …"
                )
            embedding = named[embedding]
        if embedding.ndim != 2:
            raise ValueError(f"Monitor: embedding must be a 2-D matrix, got shape {tuple(embedding.shape)}")
        return embedding

    def row_updates(self) -> Tensor | None:
        """Mean ‖Δ row‖ of the tracked embedding over the measured steps.

        Returns:
            One value per row of ``embedding``, or None before any measured step (or without ``embedding``).
        """
        if self.row_update_sum is None:
            return None
        return self.row_update_sum / self.row_update_steps

    def embedding_summary(self) -> dict[str, Any] | None:
        """The tracked embedding's row updates in brief, as records carry it under ``embedding``.

        Returns:
            ``rows``, ``measured_steps``, the ``min``/``median``/``max`` of the rows' mean ‖Δ row‖ and, with
                ``token_counts``, ``spearman_count_vs_update`` over the tokens that occur; None before any
                measured step (or without ``embedding``), as ``row_updates``.
        """
        rows = self.row_updates()
        if rows is None:
            return None
        summary: dict[str, Any] = {"rows": len(rows), "measured_steps": self.row_update_steps, **stats.summarize(rows)}
        if self.token_counts is not None:
            seen = self.token_counts > 0
            summary["spearman_count_vs_update"] = stats.spearman(self.token_counts[seen], rows[seen])
        return summary

    # ---------------------------------------------------------------------------------- output
    def rewind_sinks(self, step: int) -> None:
        """After resuming from a checkpoint at ``step``, have the sinks drop what this run logged after it.

        ``JSONLSink`` rewrites its file without this run's (this context's) later records, ``TensorBoardSink``
        purges later events, so that no step appears twice.

        Args:
            step: the checkpoint's step; an integer ≥ 0.

        Raises:
            ValueError: ``step`` is a negative integer.
            TypeError: ``step`` is not an integer.
        """
        if not is_count(step, 0):
            error = ValueError if is_count(step, -math.inf) else TypeError
            raise error(f"Monitor.rewind_sinks: step={step!r} must be an integer >= 0 (the checkpoint's step)")
        for sink in self.sinks:
            if hasattr(sink, "rewind"):
                sink.rewind(step, self.context)

    def _write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        """Remove the monitor's hooks, close the sinks and let go of the model, the optimizer and the process group.

        The records, the divergence record, ``state_dict()`` and the embedding's summary stay (the sinks, closed,
        are let go too); ``step`` and ``flush`` refuse from now on. The losses not judged yet (at most
        ``guard.read_every`` − 1 steps'; see ``flush``) stay unjudged, in ``state_dict()``: reading them could be
        a collective, which a rank closing on its own (an error, an interrupt) would wait in for ever. Closing
        twice does nothing more.
        """
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._small_batches is not None:
            self._small_batches.close()
        for sink in self.sinks:
            sink.close()
        self._closed = True
        # nothing the monitor keeps may hold the model after this: with it, DDP's and FSDP's process group (a
        # sink may too: the callbacks' hands records to the library's trainer, which holds the model)
        self.model = self.optimizer = self.embedding = self._layout = self._small_batches = None  # type: ignore[assignment]
        self.sinks = []
        self._snapshot, self._snapshot_params, self._gradients, self._update = None, [], None, None
        self._step_lrs, self._outer_call, self._found_inf, self._measured = None, None, None, None

    def __getstate__(self) -> Any:
        # Refused rather than rebuilt on unpickling: the monitor lives in hooks on the optimizer (torch drops
        # them when it pickles one) and, with curvature, on the model, and its sinks hold open files, event
        # writers and a console. A copy would measure nothing (and count every step as skipped) or write into
        # the original's files; what a resumed run needs is its state_dict().
        raise TypeError(
            "Monitor cannot be pickled or copied: save monitor.state_dict(), then build a new Monitor and call "
            "its load_state_dict()"
        )

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _refuse_ddp_join(model: nn.Module) -> None:
    """Uneven inputs under DDP's ``Join`` / ``ddp.join()`` cannot work: the monitor averages the steps' losses
    over the ranks when it reads them, a collective that a rank which ran out of data never reaches (it shadows
    only DDP's own), so the job would abort on a collective mismatch. Refused on every rank at its first step instead,
    from the join configuration torch keeps on each ``Joinable`` (private: if it goes, this check passes).
    Only the DDP wrapper holds it (the inner module cannot tell), and torch never turns it off after the
    ``join()`` block, so a model once under ``join()`` stays refused (README, DDP)."""
    config = vars(under_compile(model)).get("_join_config")  # a plain attribute of DDP's: no AttributeError
    if getattr(config, "enable", False):
        raise ValueError(
            "Monitor: DistributedDataParallel under join() (uneven inputs across ranks) is not supported: the "
            "monitor averages each step's loss over the ranks, which a rank that ran out of data never joins; "
            "give every rank the same number of batches (DistributedSampler pads them to equal length)"
        )


def _checked_token_counts(token_counts: Any, embedding: Tensor | None) -> Tensor | None:
    """``token_counts`` as float64, or a one-line error unless it is one finite count >= 0 per embedding row."""
    if token_counts is None:
        return None
    if embedding is None:
        raise ValueError("Monitor: token_counts without embedding; give embedding= (the matrix whose rows they count)")
    try:
        counts = torch.as_tensor(token_counts, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"Monitor: token_counts={token_counts!r} must be a sequence of counts, one per row") from None
    if counts.ndim != 1 or len(counts) != embedding.shape[0]:
        entries = f"{len(counts)} entries" if counts.ndim == 1 else f"shape {tuple(counts.shape)}"
        raise ValueError(
            f"Monitor: token_counts has {entries} but the embedding has {embedding.shape[0]} rows; "
            "give one count per row"
        )
    bad = counts[~(torch.isfinite(counts) & (counts >= 0))]
    if bad.numel():
        raise ValueError(f"Monitor: token_counts holds {bad[0].item()}; counts must be finite and >= 0")
    return counts


def _entry(
    g: float, w: float, u: float, dot: float, g_stepped: float, n: int, zeros: int, bad_g: int, bad_w: int
) -> dict[str, Any]:
    """One parameter's record from its norms, ⟨−u, g⟩ (over ``g_stepped``, the norm of the gradient as the
    optimizer held it: scaled under a GradScaler's fused step), its size and its counts."""
    return {
        "g": g,
        "w": w,
        "u": u,
        "u_over_w": stats.safe_ratio(u, w),
        "cos": stats.cosine(dot, u, g_stepped),
        "u_rms": u / math.sqrt(n) if n else 0.0,
        "zero_grad": zeros / n if n else 0.0,
        "nonfinite_grad": bad_g,
        "nonfinite_w": bad_w,
    }


def _param(q: Any) -> Tensor:
    """The tensor the optimizer steps, of a tensor or of a ``sharding.Part``."""
    return q.param if isinstance(q, Part) else q


def _copies(parts: list[Any]) -> list[Tensor]:
    """Copies of the values a measured step reads (``_weight``) of each tensor or part."""
    with torch.no_grad():  # the parameters themselves, not detached views: one dispatch fewer per tensor
        return [q.of(q.param).clone() if isinstance(q, Part) else q.clone() for q in parts]


def _weight(q: Any) -> Tensor:
    """The values a measured step reads of a tensor the optimizer steps, or of a part of one."""
    return q.of(q.param) if isinstance(q, Part) else q.detach()


def _grad(q: Any) -> Tensor:
    # dense: torch's foreach norms have no kernel for the sparse gradient of an nn.Embedding(sparse=True);
    # detached only where it needs to be (a backward with create_graph=True): a dispatch per tensor saved
    if isinstance(q, Part):
        return q.of(q.param.grad)
    return dense(q.grad) if q.grad.is_sparse or q.grad.requires_grad else q.grad


def _refuse_under_sharding(curvature: Any, histograms: bool, embedding: Any) -> None:
    """What the monitor does not measure on a sharded model, refused in one line each."""
    if curvature is not None:
        raise ValueError(f"Monitor: curvature {SHARDED_CURVATURE}")
    if histograms:
        raise ValueError("Monitor: histograms=True is not measured under FSDP (sharded parameters); leave it False")
    if embedding is not None:
        raise ValueError("Monitor: embedding= is not measured under FSDP (sharded parameters); leave it None")


def _aggregate(g: list[float], w: list[float], u: list[float]) -> dict[str, float]:
    total_g, total_w, total_u = stats.combined_norm(g), stats.combined_norm(w), stats.combined_norm(u)
    return {"g": total_g, "w": total_w, "u": total_u, "u_over_w": stats.safe_ratio(total_u, total_w), "n": len(g)}


def _median(values: list[float]) -> float:
    """The (upper) median of ``values``; NaN for none."""
    return sorted(values)[len(values) // 2] if values else math.nan


def _finite_or_big(x: float) -> float:
    return x if math.isfinite(x) else 1e300


#: What ``Monitor.load_state_dict`` needs of a state (later keys are optional, for checkpoints from before them).
STATE_KEYS = frozenset(
    {"step_count", "first_loss", "lowest_loss", "ratio_history", "row_update_sum", "row_update_steps"}
)
