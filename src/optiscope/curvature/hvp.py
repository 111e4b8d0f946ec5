r"""Hessian-vector products of a loss, by reverse-over-reverse differentiation on a retained gradient graph.

For the loss L(θ) = ``loss_fn(model, batch)`` and a vector v over the parameters that require grad,

    H v = ∇_θ ⟨∇L(θ), v⟩,

Pearlmutter's product by reverse-over-reverse differentiation, without ever forming H. The operator
*linearises once*: its first use runs one forward and one backward pass with ``create_graph=True``,
which gives the gradient g = ∇L(θ) together with the graph that computes it; every product is then one
backward pass through that retained graph (``torch.autograd.grad(g, θ, v)``), which does twice the
matrix products of a backward pass and no forward pass at all. Measured on the ``lm`` GPT
(``benchmarks/curvature_cost.py``), a product costs about two forward+backward passes against four for
a ``torch.func`` forward-over-reverse product that redoes the forward and backward every time. The
graph lives as long as the operator: one operator serves every product of one measurement at one θ.

The model is evaluated with ``torch.func.functional_call`` at detached copies of its parameters and
copies of its buffers (in float64 on request) and is never mutated; it is put in eval mode meanwhile, so
that dropout cannot make H v a random function of v, and the global random-number state is left as it was.
Batch and instance norms that were training are the exception: they keep normalising by the batch's (each
example's) own statistics, so that H is the Hessian of the loss the optimizer descends (in eval mode they
would use the running averages, a different function, far from it early in training), and they leave their
running statistics alone.

Vectors are flat (one tensor over all trainable parameters, in ``model.named_parameters()`` order), so
that Lanczos and Hutchinson see a plain linear operator.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.nn.utils.parametrizations import _WeightNorm
from torch.nn.utils.weight_norm import WeightNorm as WeightNormHook

LossFn = Callable[[nn.Module, Any], Tensor]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside ``DistributedDataParallel`` / ``DataParallel`` (``.module``) and ``torch.compile``
    (``._orig_mod``) wrappers. Known by their types: a model of the user's that merely holds a submodule
    named ``module`` is measured whole."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


#: why curvature is refused on a model that FSDP shards (the rest of the sentence after what is refused)
SHARDED_CURVATURE = (
    "is not measured under FSDP: Hessian-vector products differentiate the gradient of the model at its whole "
    "parameters, which FSDP holds only in shards; measure curvature under DDP, or on an unsharded copy"
)


def sharded(model: nn.Module) -> bool:
    """Whether FSDP (``fully_shard`` or ``FullyShardedDataParallel``) shards ``model`` or a module inside it."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # nothing is sharded before it is imported
    if fsdp is None:
        return False
    return any(isinstance(m, fsdp.FSDPModule | fsdp.FullyShardedDataParallel) for m in model.modules())


def map_tensors(fn: Callable[[Tensor], Any], obj: Any) -> Any:
    """``obj`` (a tensor, or tuples — named ones too —, lists and mappings — ``dict``, a 🤗 ``BatchEncoding``
    — of them, nested) with ``fn`` applied to every tensor and the containers' types kept."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes its fields as arguments
        return type(obj)(*(map_tensors(fn, x) for x in obj))
    if isinstance(obj, tuple | list):
        return type(obj)(map_tensors(fn, x) for x in obj)
    if isinstance(obj, Mapping):
        mapped = {k: map_tensors(fn, v) for k, v in obj.items()}
        try:
            return type(obj)(mapped)
        except TypeError:  # a mapping type that is not built from a dict
            return mapped
    return obj


def tensors_in(obj: Any) -> list[Tensor]:
    """The tensors in ``obj`` (as ``map_tensors`` walks it), in order."""
    found: list[Tensor] = []
    map_tensors(found.append, obj)
    return found


def check_dtype(dtype: Any, who: str) -> None:
    """A floating torch.dtype or None, else a ValueError naming ``who``'s bad value."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"{who}: dtype={dtype!r}; give a floating torch.dtype (e.g. torch.float64) or None")


@contextlib.contextmanager
def gradients_on() -> Iterator[None]:
    """Autograd on for the duration, even inside the caller's ``torch.no_grad`` or ``inference_mode`` (a
    measurement taken from an evaluation loop)."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    """``obj`` (as ``map_tensors`` takes it) with its floating tensors cast to ``dtype``."""
    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, obj)


class LossModule(nn.Module):
    """``loss_fn(model, batch)`` as a module's forward, so that ``functional_call`` can swap the
    parameters that ``loss_fn`` sees through ``model``."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> Tensor:
        return self.loss_fn(self.model, batch)


def rng_forked(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """torch's random streams forked for the duration: the CPU's and those of the CUDA devices ``model`` is on
    (dropout on a GPU draws from the GPU's), so that what runs inside leaves the training run's draws alone."""
    return torch.random.fork_rng(devices=sorted({t.get_device() for t in model.parameters() if t.is_cuda}))


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode, a forked RNG and the plain-math attention kernel for the duration (the fused
    flash-attention kernels have no second derivative); every submodule's training flag is restored.

    Batch and instance norms that were training stay in training mode, normalising by the batch's (the
    example's) statistics, with their running statistics kept (``running_statistics_kept``; an instance norm
    updates the buffers' copies). A ``SyncBatchNorm`` that would
    synchronise over a process group is put in eval mode instead (its running statistics), as its
    synchronising backward pass has no second derivative (one in a group of one process does not
    synchronise, and measures like a batch norm)."""
    batch_norms = [m for m in model.modules() if batch_statistics(m)]
    with in_eval_mode(model):
        for m in batch_norms:
            m.training = True
        with (
            running_statistics_kept(model),
            weight_norms_composed(model),
            rng_forked(model),
            sdpa_kernel(SDPBackend.MATH),
        ):
            yield


def buffer_copies(model: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """Copies of ``model``'s buffers by name (after ``prefix``), for ``functional_call``: a forward pass that
    updates a buffer in place or assigns it anew (a batch norm's running statistics, a call counter, a
    quantisation observer's range) updates its copy, never the model's."""
    return {prefix + n: b.clone() for n, b in model.named_buffers()}


@contextlib.contextmanager
def in_eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the duration; after, every submodule's own flag as it was (a training model may hold
    parts in eval mode, a frozen embedding say, which ``model.train()`` would put back in training)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextlib.contextmanager
def weight_norms_composed(model: nn.Module) -> Iterator[None]:
    """For the duration, weight norm — ``nn.utils.parametrizations.weight_norm`` and the older hook-based
    ``nn.utils.weight_norm`` — computes w = g·v/‖v‖ from ordinary ops (``torch._weight_norm``'s own unfused
    path). Its fused kernel has a wrong second derivative: on a small weight-normed MLP (torch 2.13, CPU) H v by
    reverse-over-reverse through it differs from a finite difference of gradients by 27 %, the composed one by
    rounding (tested, for both)."""
    norms = [m for m in model.modules() if isinstance(m, _WeightNorm)]
    hooks = [h for m in model.modules() for h in m._forward_pre_hooks.values() if isinstance(h, WeightNormHook)]
    for m in norms:
        m.forward = functools.partial(_composed_weight_norm, dim=m.dim)  # an instance attribute, deleted after
    for h in hooks:  # the hook sets module.<name> to compute_weight(module) before each forward
        h.compute_weight = functools.partial(_hooked_weight_norm, name=h.name, dim=h.dim)
    try:
        yield
    finally:
        for m in norms:
            del m.forward
        for h in hooks:
            del h.compute_weight


def _composed_weight_norm(weight_g: Tensor, weight_v: Tensor, dim: int) -> Tensor:
    return weight_v * (weight_g / torch.norm_except_dim(weight_v, 2, dim))


def _hooked_weight_norm(module: nn.Module, name: str, dim: int) -> Tensor:
    return _composed_weight_norm(getattr(module, name + "_g"), getattr(module, name + "_v"), dim)


@contextlib.contextmanager
def running_statistics_kept(model: nn.Module) -> Iterator[None]:
    """For the duration, batch norms in training mode normalise by the batch's statistics without updating
    their running statistics or their counter (``track_running_stats`` off): a measurement's forward pass
    must leave the model as training left it."""
    tracking = [(m, m.track_running_stats) for m in model.modules() if isinstance(m, _BatchNorm) and m.training]
    for m, _ in tracking:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m, track in tracking:
            m.track_running_stats = track


def batch_statistics(module: nn.Module) -> bool:
    """Whether ``module`` is a batch norm (or an instance norm) that normalises by the batch's (the example's)
    statistics in a measurement: one that does so in training (in eval mode, one that tracks running statistics
    would use those)."""
    if not (isinstance(module, _BatchNorm | _InstanceNorm) and module.training):
        return False
    if isinstance(module, nn.SyncBatchNorm) and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(module.process_group or dist.group.WORLD) == 1  # torch's own test to synchronise
    return True


def loss_fault(loss: Any) -> str | None:
    """What ``loss`` is, said for an error, when it is not a differentiable loss (a floating scalar tensor that
    depends on the parameters through autograd, with gradients on); None when it is one."""
    if not isinstance(loss, Tensor):
        return f"a {type(loss).__name__}"
    if loss.numel() != 1:
        return f"a tensor of shape {tuple(loss.shape)}"
    if not loss.is_floating_point():
        return f"a {loss.dtype} tensor"
    if not loss.requires_grad:
        return (
            "a tensor that does not depend on the parameters through autograd (detached, .item(), or computed "
            "under torch.no_grad?)"
        )
    return None


#: how ``HessianOperator`` names a tensor it is given that the model does not hold (``OUTSIDE.0``, …)
OUTSIDE = "outside_model"


def dense(t: Tensor) -> Tensor:
    """``t`` detached, as its dense values where it is sparse (an ``nn.Embedding(sparse=True)``'s gradient)."""
    return t.detach().to_dense() if t.is_sparse else t.detach()


class HessianOperator:
    """The Hessian of a loss as a linear operator on flat vectors: v ↦ H v, without forming H.

    For L(θ) = ``loss_fn(model, batch)``, H v = ∇_θ⟨∇L(θ), v⟩ (Pearlmutter's product, reverse over reverse).
    The first product runs one forward and one backward pass with ``create_graph=True``; every product after
    is one backward pass through that retained graph. Vectors are flat: one tensor over the parameters H is
    taken over, in ``model.named_parameters()`` order, so [`lanczos`][optiscope.curvature.lanczos] and
    Hutchinson see a plain linear operator. One operator serves one measurement at one θ: it reads the
    parameters when built.

    Args:
        model: the module (DDP, DataParallel and ``torch.compile`` wrappers are unwrapped: every rank computes
            the same H).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the training loss (a mean over the batch).
        batch: a fixed batch: a tensor, or tuples, named tuples, lists and mappings (a 🤗 ``BatchEncoding``)
            of tensors, nested, on the model's device.
        dtype: a floating dtype to evaluate in (e.g. ``torch.float64``); None keeps the model's.
        params: the parameters H is taken over (e.g. those an optimizer moves), each requiring grad; None
            for every parameter of the model that requires grad. The others are constants. A tensor here that
            the model does not hold (a learnable weight of the loss, which ``loss_fn`` reaches through its
            closure) is differentiated where ``loss_fn`` uses it, in its own dtype, and named
            ``outside_model.j`` (its place j among them).

    Attributes:
        names: the names of the parameters H is taken over, in vector order.
        params: those parameters.
        size: n, the length of a vector.
        dtype: the vectors' dtype: the widest of the parameters' and at least float32.
        device: the vectors' device, the parameters'.
        hvps: the products taken so far.

    Raises:
        TypeError: ``model`` not an ``nn.Module``, or ``loss_fn`` not callable.
        ValueError: ``dtype`` not floating; an empty batch (a tensor with 0 rows); a batch none of whose
            tensors is on the model's device; no parameter that requires grad; a model that FSDP shards
            (``SHARDED_CURVATURE`` says why). A ``loss_fn`` that does not
            return a differentiable scalar fails at the first product (or at ``check``).

    Examples:
        >>> import torch
        >>> from optiscope.curvature import HessianOperator
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> def loss_fn(m, a):  # ½ Σ aᵢwᵢ²: H = diag(a)
        ...     return 0.5 * (a * m.weight[0] ** 2).sum()
        >>> op = HessianOperator(model, loss_fn, torch.tensor([10.0, 1.0]))
        >>> op(torch.tensor([1.0, 1.0])), op.names, op.size, op.hvps
        (tensor([10.,  1.]), ['weight'], 2, 1)

    Notes:
        - The model is evaluated with ``torch.func.functional_call`` at detached copies of its parameters and
          copies of its buffers (cast to ``dtype`` on request) and is never mutated. It is put in eval mode
          meanwhile, so that dropout cannot make H v a random function of v, with the plain-math attention
          kernel (fused flash-attention kernels have no second derivative), and torch's random state (the
          CPU's and the model's CUDA devices') is left as it was; every submodule's training flag is restored
          after.
        - Batch and instance norms that were training keep normalising by the batch's (each example's)
          statistics, so that H is the Hessian of the loss the optimizer descends, and leave their running
          statistics alone. A ``SyncBatchNorm`` that would synchronise over a process group of several
          processes uses its running statistics instead (its synchronising backward pass has no second
          derivative).
        - Weight norm (``nn.utils.parametrizations.weight_norm`` and ``nn.utils.weight_norm``) is computed
          from ordinary ops: its fused kernel has a wrong second derivative (on a small weight-normed MLP,
          torch 2.13, CPU, H v through it differs from a finite difference of gradients by 27 %).
        - Works inside ``torch.no_grad()`` and ``torch.inference_mode()`` (a measurement from an evaluation
          loop); batches made under inference mode are copied.
        - A parameter the loss does not use has gradient 0 and a zero row and column of H. Sparse gradients
          (``nn.Embedding(sparse=True)``) are read as their dense values.
        - Cost: about two forward+backward passes per product on the ``lm`` GPT, against four for a
          ``torch.func`` forward-over-reverse product that redoes the forward and backward every time
          (``benchmarks/curvature_cost.py``).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        batch: Any,
        dtype: torch.dtype | None = None,
        params: list[Tensor] | None = None,
    ) -> None:
        check_dtype(dtype, "curvature")
        if not isinstance(model, nn.Module):
            raise TypeError(f"curvature: model={model!r} is not a torch.nn.Module")
        if not callable(loss_fn):
            raise TypeError(f"curvature: loss_fn={loss_fn!r} is not a function loss_fn(model, batch) -> loss")
        if sharded(model):
            raise ValueError(f"curvature {SHARDED_CURVATURE}")
        self.model = unwrap(model)
        self.module = LossModule(self.model, loss_fn)
        self.cast = dtype
        self.batch = self.prepare(batch)
        if any(t.ndim >= 1 and t.shape[0] == 0 for t in tensors_in(self.batch)):
            raise ValueError("curvature: the batch is empty (a tensor with 0 rows); give at least one example")
        named = list(self.model.named_parameters())
        chosen = None if params is None else {id(p) for p in params}
        taken = [(n, p) for n, p in named if p.requires_grad and (chosen is None or id(p) in chosen)]
        if not taken:
            raise ValueError("curvature: the model has no parameter that requires grad (to take the Hessian over)")
        held = {id(p) for _, p in named}
        # the model's are replaced by copies in each evaluation (functional_call); those outside it cannot be
        self.outside = [p for p in params or [] if id(p) not in held and p.requires_grad]
        other = [] if dtype is None else sorted({str(p.dtype) for p in self.outside if p.dtype != dtype})
        if other:
            warnings.warn(
                f"curvature: dtype={dtype} casts the model, but the optimizer also moves {len(self.outside)} "
                f"tensor(s) outside it ({', '.join(other)}), which loss_fn uses as they are: their rows of H are "
                f"as precise as their dtype",
                stacklevel=3,
            )
        taken += [(f"{OUTSIDE}.{j}", p) for j, p in enumerate(self.outside)]
        self.names, self.params = [n for n, _ in taken], [p for _, p in taken]
        # the names the caller's own model gives them through its wrappers (DDP's "module.", torch.compile's
        # "_orig_mod."): a direction read from that model's named_parameters() is keyed by those
        ours = {id(p) for p in self.params}
        wrapped = [] if model is self.model else list(model.named_parameters())
        self.wrapped_names = {n: p for n, p in wrapped if id(p) in ours}
        # every name the model (inside its wrappers or through them) gives a parameter, H taken over it or not
        self.model_names = {n for n, _ in named} | {n for n, _ in wrapped}
        cast = (lambda t: t.detach()) if dtype is None else (lambda t: cast_floats(t.detach(), dtype))
        # copies made outside inference mode, even inside the caller's: autograd cannot save an inference tensor
        # (a cast parameter, an eval-mode batch norm's running statistics) for the backward pass
        with torch.inference_mode(False):
            self.theta = {"model." + n: cast(p) for n, p in zip(self.names, self.params, strict=True)}
            # the other parameters and the floating buffers are constants (cast too, so that float64 is float64
            # throughout)
            self.constants = {"model." + n: cast(p) for n, p in named if "model." + n not in self.theta}
            # buffers are copied even where no cast copies them (``buffer_copies``)
            self.constants.update({n: cast(b) for n, b in buffer_copies(self.model, "model.").items()})
        self.inside = len(self.params) - len(self.outside)  # the model's come first in theta
        self.shapes = [t.shape for t in self.theta.values()]
        self.sizes = [t.numel() for t in self.theta.values()]
        self.size = sum(self.sizes)
        # vectors in the widest of the parameters' dtypes and at least float32: a bfloat16 embedding first among
        # float32 weights must not round every Lanczos vector to bfloat16 (3 significant digits), nor a model
        # wholly in float16 or bfloat16 round its eigenvalues and the sums behind them to its dtype; each
        # product is still taken in the parameters' own dtypes
        widest = functools.reduce(torch.promote_types, (t.dtype for t in self.theta.values()))
        self.dtype = torch.promote_types(widest, torch.float32)
        self.device = next(iter(self.theta.values())).device
        devices = {t.device for t in tensors_in(self.batch)}
        if devices and self.device not in devices:  # some may be elsewhere on purpose (lengths for packing on the CPU)
            raise ValueError(
                f"curvature: the batch is on {', '.join(sorted(map(str, devices)))} but the model is on "
                f"{self.device}; move the batch to {self.device}"
            )
        self.hvps = 0
        self._graph: tuple[list[Tensor], list[Tensor]] | None = None

    # -------------------------------------------------------------------------------- vectors
    def split(self, flat: Tensor) -> dict[str, Tensor]:
        parts = torch.split(flat, self.sizes)
        return {k: part.view(shape) for k, part, shape in zip(self.theta, parts, self.shapes, strict=True)}

    def flatten(self, tensors: dict[str, Tensor] | list[Tensor]) -> Tensor:
        values = [tensors[k] for k in self.theta] if isinstance(tensors, dict) else tensors
        # an nn.Embedding(sparse=True) gets sparse gradients and products
        return torch.cat([dense(t).reshape(-1).to(self.device, self.dtype) for t in values])

    def flatten_by_param(self, by_param: dict[int, Tensor], fill: float = 0.0) -> Tensor:
        """A flat vector from tensors keyed by ``id(param)``.

        Args:
            by_param: a tensor per parameter, of its shape, keyed by ``id(param)`` (a sparse one, an
                ``nn.Embedding(sparse=True)``'s gradient, is read as its dense values); keys of other tensors
                are ignored.
            fill: the value of the entries of parameters without a tensor.

        Returns:
            A tensor of length ``size``, in the operator's dtype and on its device.

        Raises:
            ValueError: a tensor whose shape is not its parameter's.
        """
        parts = []
        for name, p, size in zip(self.names, self.params, self.sizes, strict=True):
            t = by_param.get(id(p))
            if t is not None and t.shape != p.shape:
                raise ValueError(
                    f"curvature: the direction's tensor for {name} has shape {tuple(t.shape)}; the parameter's is "
                    f"{tuple(p.shape)}"
                )
            parts.append(
                torch.full((size,), fill, dtype=self.dtype, device=self.device)
                if t is None
                else dense(t).reshape(-1).to(self.device, self.dtype)
            )
        return torch.cat(parts)

    def random(self, generator: torch.Generator, rademacher: bool = False) -> Tensor:
        x = torch.randn(self.size, generator=generator, dtype=torch.float64)
        if rademacher:
            x = x.sign()
        return x.to(self.dtype).to(self.device)

    # ------------------------------------------------------------------------------- products
    def _loss(self, theta: dict[str, Tensor], batch: Any) -> Tensor:
        """The loss with the model's parameters from ``theta`` (its first ``inside`` entries, the only ones
        ``functional_call`` can put in place)."""
        inside = dict(list(theta.items())[: self.inside])
        return functional_call(self.module, {**self.constants, **inside}, (batch,))

    def prepare(self, batch: Any) -> Any:
        """A batch as the operator evaluates it.

        Args:
            batch: a tensor, or tuples, named tuples, lists and mappings of tensors, nested.

        Returns:
            ``batch`` with its floating tensors cast to the operator's ``dtype`` (when one was asked for), and
            copies of tensors made under ``torch.inference_mode`` (autograd cannot save those for the backward
            pass); the containers' types are kept.
        """

        def prepared(t: Tensor) -> Tensor:
            if t.is_inference():
                t = t.clone()
            return t.to(self.cast) if self.cast is not None and t.is_floating_point() else t

        with torch.inference_mode(False):  # a cast made in the caller's inference mode would be an inference tensor
            return map_tensors(prepared, batch)

    def loss(self, batch: Any = None) -> float:
        """The loss at the operator's θ, evaluated as the products are (eval mode, no gradients).

        Args:
            batch: another batch to evaluate on; None for the operator's own.

        Returns:
            L(θ) as a float.
        """
        with evaluating(self.model), torch.no_grad():
            return float(self._loss(self.theta, self.batch if batch is None else self.prepare(batch)))

    def _differentiable_loss(self, batch: Any) -> tuple[list[Tensor], Tensor]:
        """(θ leaves requiring grad, the scalar loss at them on ``batch``); call with gradients on. The leaves
        of the tensors outside the model are those tensors themselves, which ``loss_fn`` uses."""
        inside = list(self.theta.values())[: self.inside]
        leaves = [t.detach().requires_grad_(True) for t in inside] + self.outside
        loss = self._loss(dict(zip(self.theta, leaves, strict=True)), batch)
        fault = loss_fault(loss)
        if fault is not None:
            raise ValueError(
                f"curvature: loss_fn returned {fault}; it must return the scalar loss (a mean) as a tensor "
                "computed from the model"
            )
        return leaves, loss.reshape(())

    def check(self) -> None:
        """Evaluate the loss once as the products will, so that a bad batch or ``loss_fn`` fails now.

        One forward pass with autograd on, nothing of the model changed: a batch or ``loss_fn`` that cannot
        give H v (a wrong structure, dtype or device, a loss that is not a differentiable scalar) fails here,
        before any product is asked for.

        Raises:
            ValueError: ``loss_fn`` does not return a scalar floating tensor that depends on the parameters.
                What the forward pass raises (a batch of the wrong structure, dtype or device) propagates.
        """
        with gradients_on(), evaluating(self.model):
            self._differentiable_loss(self.batch)

    def _gradient(self, batch: Any, create_graph: bool) -> tuple[list[Tensor], list[Tensor]]:
        with gradients_on(), evaluating(self.model):
            leaves, loss = self._differentiable_loss(batch)
            g = torch.autograd.grad(loss, leaves, create_graph=create_graph, allow_unused=True)
        # a parameter the loss does not use has gradient 0 (and a row and column of zeros in H)
        return leaves, [torch.zeros_like(p) if t is None else t for t, p in zip(g, leaves, strict=True)]

    def _linearised(self) -> tuple[list[Tensor], list[Tensor]]:
        """(θ leaves, g = ∇L(θ) with its graph), built on first use."""
        if self._graph is None:
            self._graph = self._gradient(self.batch, create_graph=True)
        return self._graph

    def gradient(self, batch: Any = None) -> Tensor:
        """∇L(θ) as a flat vector.

        Args:
            batch: None for the operator's own batch, from its linearisation (free once a product was taken,
                and the products need it anyway); another batch costs one forward and backward pass.

        Returns:
            A detached tensor of length ``size``, in the operator's dtype.
        """
        if batch is None:
            _, g = self._linearised()
        else:
            _, g = self._gradient(self.prepare(batch), create_graph=False)
        return self.flatten([t.detach() for t in g])

    def __call__(self, v: Tensor) -> Tensor:
        """H v for a flat vector v; counts one product in ``hvps``.

        Args:
            v: a tensor of length ``size`` (cast to the operator's dtype).

        Returns:
            H v, a tensor of length ``size`` in the operator's dtype.
        """
        leaves, g = self._linearised()
        # gradient entries that do not depend on θ (a parameter entering the loss linearly and alone) have
        # no graph and contribute nothing to H v
        split = self.split(v.to(self.dtype)).values()
        pairs = [(gi, vi.to(gi.device, gi.dtype)) for gi, vi in zip(g, split, strict=True) if gi.requires_grad]
        hv: tuple[Tensor | None, ...] = (None,) * len(leaves)
        if pairs:
            outputs, tangents = zip(*pairs, strict=True)
            with gradients_on():
                hv = torch.autograd.grad(outputs, leaves, grad_outputs=tangents, retain_graph=True, allow_unused=True)
        self.hvps += 1
        return self.flatten([torch.zeros_like(p) if h is None else h for h, p in zip(hv, leaves, strict=True)])
