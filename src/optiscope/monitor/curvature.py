r"""Curvature on the monitor's schedule: sharpness against the optimizer's threshold, while training.

``Monitor(..., curvature=Curvature(batch, loss_fn, every=100))`` measures, every ``every`` optimizer steps
and right after the step (at the parameters and optimizer state that the *next* step will use), on the
fixed ``batch``, against the threshold at the learning rate the step just taken used (read before it, so
that a scheduler stepped before or after ``monitor.step()`` gives the same record):

    sharpness              λ₁(H), or λ₁(P⁻¹H) for Adam-family optimizers (Lanczos, warm-started from
                           the previous measurement's top eigenvector)
    threshold              the optimizer's stability threshold (2/η, (2 + 2β)/η, 38/η, …) or None
    sharpness/threshold    above 1: unstable along the top eigenvector
    curvature/update       dᵀHd/dᵀd (dᵀHd/dᵀPd preconditioned) along the update just taken (``directions``)
    curvature/gradient     the same along the gradient on ``batch`` (only when ``directions`` names it)
    hessian_trace          Hutchinson's estimate (``trace_probes`` > 0)
    noise_scale            McCandlish et al.'s B_simple, with the unbiased |G|² and tr(Σ) and per-parameter
                           SNR in the details: from ``micro_batches`` ≥ 2 slices of ``batch`` (extra
                           backward passes), or, at no extra backward pass, from the step just taken:
                           under DDP with ``rank_batch_size`` = B examples per rank, from the ranks' own
                           gradients (the monitor's communication hook keeps each rank's local squared
                           gradient norms before DDP averages them); with ``accumulation_batch_size`` = b
                           examples per backward pass, from the passes of a step that accumulates
                           gradients (a post-accumulation hook per parameter keeps each pass's own part)

Every rank of a DDP job computes the same values when it is given the same ``batch`` (the parameters and
optimizer states are identical), so records agree across ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import SEEDS, is_count, is_number, is_seed
from ..curvature import HessianOperator, gradient_noise_scale, hessian_trace, noise_scale_from_norms, sharpness
from ..curvature.hvp import batch_statistics, check_dtype, map_tensors, tensors_in

KEYS = (
    "sharpness",
    "threshold",
    "sharpness/threshold",
    "curvature/update",
    "curvature/gradient",
    "hessian_trace",
    "noise_scale",
)

DIRECTIONS = ("update", "gradient")


@dataclass(frozen=True)
class Curvature:
    """What the monitor measures of the loss's curvature every ``every`` steps, on one fixed batch.

    Right after every ``every``-th step (at the parameters and optimizer state the next step will use), on
    ``batch``, against the threshold at the learning rate η of the step just taken, a record gains

        sharpness              λ₁(H), or λ₁(P⁻¹H) with P = diag(√v̂ + ε) for Adam-family optimizers
                               (Lanczos, warm-started from the previous measurement's top eigenvector)
        threshold              the optimizer's stability threshold (2/η, (2 + 2β)/η, 38/η, …) or None
        sharpness/threshold    above 1: unstable along the top eigenvector
        curvature/update       dᵀHd/dᵀd (dᵀHd/dᵀPd preconditioned) along the update d just taken
        curvature/gradient     the same along the gradient on the batch
        hessian_trace          Hutchinson's estimate of tr H
        noise_scale            McCandlish et al.'s B_simple = tr(Σ)/|G|²

    and ``curvature``, the details (``eigenvalues``, ``label``, ``preconditioned``, ``hvps``, ``residual``,
    ``converged``, ``reason``, ``update_ratio``/``gradient_ratio``, ``trace_std_error``, ``grad_sq``,
    ``trace_sigma``, ``noise_source``, ``snr`` per parameter, as measured).

    Args:
        batch: what ``loss_fn`` takes (a tensor, or tuples / lists / mappings of them), measured as one full
            batch; on the model's device and dtype.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, differentiable through autograd.
        every: measure every ``every``-th optimizer step; an integer ≥ 1.
        k: how many of the largest eigenvalues to compute; 1 ≤ k ≤ ``max_hvps``.
        tol: Lanczos's relative residual at which to stop, in (0, 1).
        max_hvps: at most this many Hessian-vector products for the eigenvalues; an integer ≥ 1.
        directions: which of ``"update"`` and ``"gradient"`` to measure the curvature along (one product
            each, which also enters Lanczos's search space); ``()`` for neither.
        trace_probes: Hutchinson probes for ``hessian_trace``; 0 for no trace.
        micro_batches: slices of ``batch`` along its first dimension for ``noise_scale`` (extra backward
            passes); 0 for none, else ≥ 2 and a divisor of the batch.
        dtype: a floating dtype to measure in (e.g. ``torch.float64``), or None for the model's.
        seed: the random seed of Lanczos's start vector and Hutchinson's probes.
        rank_batch_size: the training examples each rank of a ``DistributedDataParallel`` job (world size ≥ 2)
            takes per optimizer step, for the noise scale over the ranks' gradients of the step just taken
            instead of micro-batches, at no extra backward pass; None: off.
        accumulation_batch_size: the training examples of each backward pass of an optimizer step that
            accumulates gradients over several, for the noise scale over those passes' own gradients, at no
            extra backward pass (not under DDP); None: off.

    Raises:
        ValueError: ``loss_fn`` not callable; ``every``, ``k``, ``max_hvps``, ``trace_probes`` or
            ``micro_batches`` not an integer in range; ``k > max_hvps``; ``directions`` not a tuple of
            "update" / "gradient"; ``tol`` not in (0, 1); a bad ``seed`` or ``dtype``; ``micro_batches=1``;
            ``rank_batch_size`` or ``accumulation_batch_size`` not a positive integer; more than one noise-scale
            source given; a ``batch`` that ``micro_batches`` cannot cut into equal slices.

    Examples:
        >>> import torch
        >>> from optiscope.monitor import Curvature, Monitor
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> x, y = torch.randn(16, 4), torch.randn(16, 1)
        >>> def loss_fn(m, batch):
        ...     return torch.nn.functional.mse_loss(m(batch[0]), batch[1])
        >>> monitor = Monitor(model, optimizer, every=5, curvature=Curvature((x, y), loss_fn, every=5))
        >>> for _ in range(5):
        ...     optimizer.zero_grad()
        ...     loss = loss_fn(model, (x, y))
        ...     loss.backward()
        ...     optimizer.step()
        ...     record = monitor.step(loss)
        >>> record["threshold"], record["curvature"]["label"]  # 2/η for plain SGD
        (20.0, '2/η')
        >>> 0 < record["sharpness/threshold"] < 1  # stable
        True
        >>> monitor.close()

    Notes:
        ``tol`` is 1e-2 here against ``sharpness``'s 1e-3: a residual r places an eigenvalue within r of the
        estimate and, past the gap to the next one, within r²/gap, far below what a sharpness/threshold ratio
        needs, and a measurement repeated every ``every`` steps should cost little
        (``benchmarks/curvature_cost.py`` measures the error: 4e-5 on the ``lm`` GPT). A measurement costs about
        as much as 13–20 training steps of the ``lm`` GPT on a CPU: choose ``every`` for that.

        ``micro_batches`` slices must be large enough for the model's training batch norms: checked when the
        monitor is built, as is ``loss_fn`` on ``batch`` (one forward pass, nothing changed), so that a batch
        of the wrong dtype or device, or a loss that is not a scalar, fails then, not ``every`` steps in.

        ``rank_batch_size`` needs the ``Monitor`` to be given the DDP-wrapped model: the monitor registers a
        communication hook (``RankNoise``) that keeps each rank's local squared gradient norms before averaging
        as DDP's default does. ``accumulation_batch_size`` keeps each backward pass's own part of ``p.grad``
        with a hook after its accumulation, before any clipping (``AccumulationNoise``); a pass that does not
        reach a parameter counts as 0 for it. B_simple and the SNR do not depend on how the passes' losses
        were scaled; |G|² and tr(Σ) assume each was divided by the number of passes.

        Every rank of a DDP job computes the same values when it is given the same ``batch`` (the parameters
        and optimizer states are identical), so records agree across ranks. The warm-start vector and the
        history travel in ``Monitor.state_dict()``.
    """

    batch: Any
    loss_fn: Callable[[nn.Module, Any], Tensor]
    every: int = 100
    k: int = 1
    tol: float = 1e-2
    max_hvps: int = 50
    directions: tuple[str, ...] = ("update",)
    trace_probes: int = 0
    micro_batches: int = 0
    dtype: torch.dtype | None = None
    seed: int = 0
    rank_batch_size: int | None = None
    accumulation_batch_size: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.loss_fn):
            raise ValueError(f"Curvature: loss_fn={self.loss_fn!r} must be a function loss_fn(model, batch) -> loss")
        for names, least in ((("every", "k", "max_hvps"), 1), (("trace_probes", "micro_batches"), 0)):
            for name in names:
                value = getattr(self, name)
                if not is_count(value, least):
                    raise ValueError(f"Curvature: {name}={value!r} must be an integer >= {least}")
        if self.k > self.max_hvps:
            raise ValueError(f"Curvature: k={self.k} eigenvalues need max_hvps >= k, got max_hvps={self.max_hvps}")
        if not (isinstance(self.directions, tuple | list) and set(self.directions) <= set(DIRECTIONS)):
            raise ValueError(
                f"Curvature: directions={self.directions!r}; give a tuple of {DIRECTIONS} (or () for none)"
            )
        check_dtype(self.dtype, "Curvature")
        if not is_seed(self.seed):
            raise ValueError(f"Curvature: seed={self.seed!r} must be {SEEDS} (a random seed)")
        if not (is_number(self.tol) and 0 < self.tol < 1):
            raise ValueError(f"Curvature: tol={self.tol!r} must be a number in (0, 1)")
        if self.micro_batches == 1:
            raise ValueError("Curvature: micro_batches=1 cannot estimate a noise scale; give 0 (off) or >= 2")
        for name, what in (
            ("rank_batch_size", "training examples per rank per step"),
            ("accumulation_batch_size", "training examples per backward pass"),
        ):
            size = getattr(self, name)
            if size is not None and not is_count(size):
                raise ValueError(f"Curvature: {name}={size!r} must be a positive integer ({what}) or None")
        sources = {
            "micro_batches": self.micro_batches or None,
            "rank_batch_size": self.rank_batch_size,
            "accumulation_batch_size": self.accumulation_batch_size,
        }
        given = [f"{k}={v}" for k, v in sources.items() if v is not None]
        if len(given) > 1:
            raise ValueError(
                f"Curvature: {' and '.join(given)}: each asks for the noise scale; give one: micro_batches (slices "
                "of the curvature batch), rank_batch_size (the ranks of a DDP job) or accumulation_batch_size "
                "(the micro-batches of an accumulated step)"
            )
        if self.micro_batches:
            split_batch(self.batch, self.micro_batches)  # fails now, not at step 100

    def due(self, step: int) -> bool:
        """Whether optimizer step number ``step`` is one to measure.

        Args:
            step: an optimizer step number (1 for the first).

        Returns:
            True for every ``every``-th step.
        """
        return step % self.every == 0


@dataclass(frozen=True)
class SmallBatchNorms:
    """What the noise scale needs from ``count`` small batches of ``batch_size`` examples each, taken from
    one training step (``source``: "ranks" of a DDP job, or "accumulated micro-batches"), per parameter
    tensor (``names``, in one order everywhere): ``small_sq``, the mean over the small batches of
    |G_small,p|², and ``big_sq``, |G_big,p|² of their mean (NaN for a parameter not seen)."""

    names: list[str]
    small_sq: list[float]
    big_sq: list[float]
    count: int
    batch_size: int
    source: str


def split_batch(batch: Any, parts: int) -> list[Any]:
    """``batch`` (a tensor, or tuples / lists / mappings of them: ``curvature.hvp.map_tensors``) cut into ``parts``
    equal slices along dim 0, each in the batch's own containers. A 0-d tensor (a temperature, a loss weight) is
    no example and goes whole into every slice."""
    tensors = [t for t in tensors_in(batch) if t.ndim > 0]
    if not tensors:
        raise ValueError(
            f"Curvature: cannot cut a batch of type {type(batch).__name__} into micro-batches (no tensor with a "
            "batch dimension)"
        )
    for t in tensors:
        if t.shape[0] % parts:
            raise ValueError(f"Curvature: a batch of {tuple(t.shape)} cannot be cut into {parts} equal micro-batches")
    return [map_tensors(lambda t, i=i: t.chunk(parts)[i] if t.ndim else t, batch) for i in range(parts)]


def check_curvature(curvature: Any, who: str) -> None:
    """A one-line error unless ``curvature`` is a ``Curvature`` or None (off)."""
    if curvature is not None and not isinstance(curvature, Curvature):
        raise TypeError(f"{who}: curvature={curvature!r} must be a Curvature(batch, loss_fn, every=...) or None (off)")


def check_batch(config: Curvature, model: nn.Module) -> None:
    """Fails now, not at the first measurement ``every`` steps into training, where ``config``'s batch and
    ``loss_fn`` cannot give Hessian-vector products on ``model``: one forward pass on the batch with autograd
    on, as the products take it (``HessianOperator.check``: a batch of the wrong structure, dtype or device, a
    loss that is not a differentiable scalar), with nothing of the model changed; then ``check_micro_batches``.
    The error is the one the measurement would have met (torch's, the loss function's, or ours), with a note
    saying where it was met."""
    try:
        op = HessianOperator(model, config.loss_fn, config.batch, dtype=config.dtype)
        op.check()
    except Exception as error:
        error.add_note(
            "optiscope: met when the monitor was built, trying loss_fn(model, batch) once on Curvature's batch so that "
            "a measurement cannot fail later in training"
        )
        raise
    check_micro_batches(config, op)


def check_micro_batches(config: Curvature, op: HessianOperator) -> None:
    """Fails now, not at the first measurement, where ``config.micro_batches`` cuts the batch into micro-batches
    too small for the model's batch norms: in a measurement those that train normalise by the micro-batch's
    own statistics, which torch refuses for one value per channel (a BatchNorm1d on one example). One forward
    pass of one micro-batch, with nothing of the model changed (``evaluating``), and only for such models;
    each such norm checks its input's values per channel before torch does."""
    norms = [(name, m) for name, m in op.model.named_modules() if batch_statistics(m)]
    if not (config.micro_batches and norms):
        return
    part = split_batch(config.batch, config.micro_batches)[0]

    def refuse_one_value(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]
            if isinstance(x, Tensor) and x.ndim >= 2 and x.numel() == x.shape[1]:
                raise ValueError(
                    f"Curvature: micro_batches={config.micro_batches} cuts the batch into micro-batches of "
                    f"{_batch_size(part)} example(s), too few for the model's training batch norm {name!r} "
                    f"({type(module).__name__} sees one value per channel); give fewer micro_batches"
                )

        return hook

    hooks = [m.register_forward_pre_hook(refuse_one_value(name)) for name, m in norms]
    try:
        op.loss(part)
    finally:
        for h in hooks:
            h.remove()


def measure(
    config: Curvature,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    update: dict[int, Tensor] | None,
    init: Tensor | None,
    small_batches: SmallBatchNorms | None = None,
) -> tuple[dict[str, Any], Tensor]:
    """The record entries (``KEYS`` plus ``curvature``: details) and the top eigenvector (next warm start).

    ``small_batches``: the squared gradient norms the monitor gathered at this step from the ranks of a DDP
    job (``config.rank_batch_size``) or from the micro-batches of an accumulated step
    (``config.accumulation_batch_size``); without them and without ``micro_batches``, no noise scale.
    """
    # the directions join Lanczos's start block: one product each, which also serves the search
    directions = {"update": update, "gradient": "gradient"}
    along = {name: directions[name] for name in config.directions if directions[name] is not None}
    top = sharpness(
        model,
        config.loss_fn,
        config.batch,
        optimizer,
        k=config.k,
        tol=config.tol,
        max_hvps=config.max_hvps,
        init=init,
        seed=config.seed,
        dtype=config.dtype,
        along=along or None,
    )
    out: dict[str, Any] = {
        "sharpness": top["eigenvalues"][0],
        "threshold": top["threshold"],
        "sharpness/threshold": top["ratio"],
    }
    details: dict[str, Any] = {
        "eigenvalues": top["eigenvalues"],
        "label": top["label"],
        "preconditioned": top["preconditioned"],
        "hvps": top["hvps"],
        "residual": top["residuals"][0],
        "converged": top["converged"],
        "reason": top["reason"],
    }
    for name, c in top.get("along", {}).items():
        out[f"curvature/{name}"] = c["curvature"]
        details[f"{name}_ratio"] = c["ratio"]
    if config.trace_probes:
        trace = hessian_trace(
            model, config.loss_fn, config.batch, config.trace_probes, seed=config.seed, dtype=config.dtype
        )
        out["hessian_trace"] = trace["trace"]
        details["trace_std_error"] = trace["std_error"]
    noise, names, source = None, [], ""
    if config.micro_batches:
        op = HessianOperator(model, config.loss_fn, config.batch, dtype=config.dtype)
        parts = split_batch(config.batch, config.micro_batches)
        grads = [op.split(op.gradient(part)).values() for part in parts]
        noise = gradient_noise_scale([list(g) for g in grads], _batch_size(parts[0]))
        names, source = op.names, "micro-batches"
    elif small_batches is not None:
        sb = small_batches
        noise = noise_scale_from_norms(sb.small_sq, sb.big_sq, sb.batch_size, sb.count)
        names, source = sb.names, sb.source
    if noise is not None:
        out["noise_scale"] = noise["noise_scale"]
        details.update(grad_sq=noise["grad_sq"], trace_sigma=noise["trace_sigma"], noise_source=source)
        details["snr"] = dict(zip(names, noise["snr"], strict=True))
    return {**out, "curvature": details}, top["vector"]


def _batch_size(part: Any) -> int:
    return int(next(t for t in tensors_in(part) if t.ndim > 0).shape[0])
