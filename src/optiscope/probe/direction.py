r"""The direction of an optimizer's next step, taken without taking it.

For parameters θ, an optimizer whose next step on a batch would move them to θ⁺, and η₀ the learning
rate of its first param group,

    v = (θ⁺ − θ) / η₀            so that θ + η₀ v is exactly the step the optimizer would take.

Momentum, Adam's moments, bias correction and weight decay are all in v, because v comes from running
the real optimizer's ``step()`` — on a shadow copy of its state and of the parameters. The gradient pass
runs the model's forward on copies of its buffers, so that what a forward pass updates in place (a batch
norm's running statistics, a call counter, a quantisation observer's range) is updated there; the model,
its gradients, the optimizer's state and the global random-number state are left exactly as they were. (An
embedding with ``max_norm`` rescales rows of its weight in place as it looks them up: v includes that, as
the step's Δθ does, and the weight is put back.)

The shadow step sees what the real one would. A parameter the batch gives no gradient is stepped with a zero
gradient where its ``.grad`` is a tensor (a loop calling ``zero_grad(set_to_none=False)``: momentum and Adam's
moments still move it) and skipped where its ``.grad`` is None. Two parameters over one memory (two
``nn.Parameter`` objects of one tensor) have copies over one copy of it, so that the step of one moves the other.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..checks import is_number, is_optimizer, positive
from ..curvature.hvp import LossModule, buffer_copies, gradients_on, loss_fault, map_tensors, rng_forked, tensors_in
from ..curvature.sharpness import require_optimizer_of
from ..monitor.names import own_names
from ..optim import clip_grad_norm


def gradients(
    model: nn.Module, loss_fn: Callable[[nn.Module, Any], Tensor], batch: Any, held: list[Tensor]
) -> dict[int, Tensor]:
    """∇L(θ) on ``batch`` by id of parameter, for the model's parameters and the tensors ``held`` (an optimizer's,
    a learnable weight of the loss among them); their own ``.grad`` fields are restored after. The forward pass
    sees the model's own parameters (their ``.grad`` is what backward fills) and copies of its buffers."""
    params = list({id(p): p for p in [*model.parameters(), *held] if p.requires_grad}.values())
    saved = [p.grad for p in params]
    buffers = buffer_copies(model, "model.")  # the LossModule's names
    try:
        for p in params:
            p.grad = None
        # dropout here must not shift the training run's RNG
        with rng_forked(model):
            loss = functional_call(LossModule(model, loss_fn), buffers, (saveable(batch),))
            fault = loss_fault(loss)
            if fault is not None:
                raise ValueError(
                    "update_direction: loss_fn must return the scalar training loss as a tensor computed from the "
                    f"model through autograd; it returned {fault}"
                )
            loss.backward()
        return {id(p): p.grad.detach().clone() for p in params if p.grad is not None}
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = g


@contextlib.contextmanager
def renormalisations_undone(model: nn.Module) -> Iterator[dict[int, Tensor]]:
    """Within the block the weights of embeddings with ``max_norm`` may change (their forward pass rescales the rows
    it looks up, in place, before the step); after it they are as they were, and the dict yielded holds by id what
    the block left them at: the weights the step starts from."""
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.max_norm]
    kept = [w.detach().clone() for w in weights]
    renormalised: dict[int, Tensor] = {}
    try:
        yield renormalised
    finally:
        with torch.no_grad():
            for w, k in zip(weights, kept, strict=True):
                renormalised[id(w)] = w.detach().clone()
                w.copy_(k)


def saveable(batch: Any) -> Any:
    """``batch`` with copies, made outside inference mode, of the tensors made inside it (autograd cannot save an
    inference tensor for the backward pass, an embedding's indices say); ``batch`` itself when it holds none."""
    if not any(t.is_inference() for t in tensors_in(batch)):
        return batch
    with torch.inference_mode(False):
        return map_tensors(lambda t: t.clone() if t.is_inference() else t, batch)


def shadow_optimizer(optimizer: torch.optim.Optimizer, clones: dict[int, Tensor]) -> torch.optim.Optimizer:
    """A copy of ``optimizer`` over ``clones`` (by id of the original parameter): its whole ``__dict__`` (state,
    param groups, defaults, and what a subclass sets in ``__init__``, a step counter say) deep-copied with every
    parameter, wherever it is referred to, replaced by its clone; no hooks."""
    shadow = type(optimizer).__new__(type(optimizer))
    memo: dict[int, Any] = {id(optimizer): shadow, **clones}
    for hooks in hook_dicts(optimizer):
        # hooks may be bound methods of a monitor holding open files: they are neither copied nor run on the shadow
        memo[id(hooks)] = type(hooks)()
    # an LR scheduler puts a wrapper of the class's step() in the instance's __dict__ that steps the original
    attributes = {k: v for k, v in vars(optimizer).items() if k != "step"}
    shadow.__dict__.update(copy.deepcopy(attributes, memo))
    return shadow


def hook_dicts(optimizer: Any) -> list[dict[Any, Any]]:
    """The hook registries (``_optimizer_step_pre_hooks``, …) of ``optimizer`` and of the optimizers it wraps."""
    found = []
    for name, value in vars(optimizer).items():
        if name.endswith("_hooks") and isinstance(value, dict):
            found.append(value)
        elif is_optimizer(value):
            found.extend(hook_dicts(value))
    return found


def requires_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the class's ``step()``, which the shadow runs, needs an argument: a closure that re-evaluates the
    loss (LBFGS)."""
    step = type(optimizer).step.__get__(optimizer)  # bound to the instance: ``self`` is no argument to give
    return any(
        p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in inspect.signature(step).parameters.values()
    )


def check_arguments(model: nn.Module, optimizer: Any, loss_fn: Any, max_grad_norm: Any) -> None:
    """One-line errors for a ``loss_fn`` that is not callable, a ``max_grad_norm`` that is no threshold, and an
    ``optimizer`` that is not one of ``model``'s or whose step has no direction."""
    if max_grad_norm is not None and not positive(max_grad_norm):
        raise ValueError(
            f"update_direction: max_grad_norm={max_grad_norm!r}; valid: a finite number > 0, or None for no clipping"
        )
    if not callable(loss_fn):
        raise TypeError(
            f"update_direction: loss_fn is a {type(loss_fn).__name__}, not callable; give loss_fn(model, batch) "
            "returning the scalar training loss"
        )
    if optimizer is None:
        return
    if not is_optimizer(optimizer):
        raise TypeError(
            f"update_direction: optimizer is a {type(optimizer).__name__}, not an optimizer; give a "
            "torch.optim.Optimizer (ours or torch's), or None for v = −∇L"
        )
    require_optimizer_of(model, optimizer, [p for g in optimizer.param_groups for p in g["params"]], "update_direction")
    if requires_closure(optimizer):
        raise ValueError(
            f"update_direction: {type(optimizer).__name__}.step() requires a closure; the direction of a "
            "closure-driven step (the optimizer re-evaluates the loss along its way) is not defined"
        )


def first_lr(optimizer: torch.optim.Optimizer) -> float:
    """η₀, the first param group's lr, by which v = Δθ/η₀ is defined: a number > 0, else a one-line refusal (🤗
    Adafactor's ``lr=None``: it sizes its steps itself)."""
    lr = optimizer.param_groups[0].get("lr")
    if not (isinstance(lr, Tensor) and lr.numel() == 1 or is_number(lr)) or float(lr) <= 0:
        raise ValueError(
            f"update_direction: the first param group's lr={lr!r}; v = Δθ/lr needs a number > 0 there (an "
            "optimizer with lr=None sizes its steps itself and has no direction per unit lr)"
        )
    return float(lr)


def clip_like_the_model(named: dict[int, str], grads: dict[int, Tensor], max_grad_norm: float) -> None:
    """Scale ``grads`` in place (the clones' gradients are these tensors) as ``clip_grad_norm(model.parameters(),
    max_grad_norm)`` would: the model's (``named``, by id) by the global norm of them all, those of parameters another
    optimizer steps included; a tensor outside the model that the optimizer holds is neither counted nor scaled. A
    sparse gradient (``nn.Embedding(sparse=True)``) is refused: neither torch's ``clip_grad_norm_`` nor ours can take
    its norm (torch 2.13 has no sparse ``vector_norm``), so no training loop clips it so."""
    sparse = [named[i] for i, g in grads.items() if i in named and g.is_sparse]
    if sparse:
        raise ValueError(
            f"update_direction: max_grad_norm={max_grad_norm!r}, but the gradient of {sparse[0]} is sparse "
            "(nn.Embedding(sparse=True)), which clip_grad_norm_ cannot clip; give max_grad_norm=None, or sparse=False"
        )
    clip_grad_norm([holding(g) for i, g in grads.items() if i in named], max_grad_norm)


def holding(grad: Tensor) -> Tensor:
    """A zero-memory tensor whose ``.grad`` is ``grad``: how a gradient enters ``clip_grad_norm``."""
    holder = grad.new_empty(()).expand(grad.shape)
    holder.grad = grad
    return holder


def shadow_parameters(params: dict[int, Tensor], start: dict[int, Tensor]) -> dict[int, Tensor]:
    """Copies of ``params`` (by id) for the shadow step, holding ``start``'s values where it has them (the weights the
    forward pass renormalised). Parameters over one memory get copies over one copy of it, each at its own offset and
    strides: the optimizer steps each in place, and the step of one moves the other, as it does the originals."""
    by_memory: dict[Any, list[int]] = {}
    for i, p in params.items():
        by_memory.setdefault(memory_of(p) or i, []).append(i)
    clones = {}
    for ids in by_memory.values():
        if len(ids) == 1:
            clones[ids[0]] = start.get(ids[0], params[ids[0]]).detach().clone()
            continue
        memory = params[ids[0]].untyped_storage().clone()
        for i in ids:
            p = params[i]
            clones[i] = torch.empty(0, dtype=p.dtype, device=p.device).set_(
                memory, p.storage_offset(), p.shape, p.stride()
            )
        with torch.no_grad():
            for i in ids:
                if i in start:
                    clones[i].copy_(start[i])
    return {i: c.requires_grad_(params[i].requires_grad) for i, c in clones.items()}


def memory_of(p: Tensor) -> tuple[torch.device, int] | None:
    """Where ``p``'s elements are stored: its device and its storage's address; None for a tensor without elements,
    or without storage of its own (a subclass wrapping other tensors, a DTensor), which is copied on its own."""
    if p.numel() == 0 or is_traceable_wrapper_subclass(p):
        return None
    return p.device, p.untyped_storage().data_ptr()


def gradient_left(p: Tensor) -> Tensor | None:
    """The gradient the step sees on ``p`` when the batch gives it none: zeros where ``p.grad`` is a tensor (the loop
    zeroes it rather than freeing it, and torch's and our optimizers step a zero gradient), None where it is None
    (the step skips ``p``)."""
    return None if p.grad is None else torch.zeros_like(p.grad)


@gradients_on()  # a measurement taken from an evaluation loop, under no_grad or inference_mode, too
def update_direction(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    loss_fn: Callable[[nn.Module, Any], Tensor],
    batch: Any,
    max_grad_norm: float | None = None,
) -> dict[str, Tensor]:
    """The direction v = Δθ/η₀ of ``optimizer``'s next step on ``batch``, computed without taking the step.

    With η₀ the learning rate of the first param group and θ⁺ where the step would move θ,

        v = (θ⁺ − θ) / η₀,   so that θ + η₀·v is exactly the step the optimizer would take.

    v comes from running the optimizer's real ``step()`` on a shadow copy of its state and of the parameters,
    so momentum, Adam's moments, bias correction and weight decay λ are all in it: for plain SGD v = −g, and
    for Adam's first step (m̂ = g, v̂ = g²) v = −g/(|g| + ε) ≈ −sign(g). The model, its gradients, the
    optimizer's state and the global random-number state are left exactly as they were.

    Args:
        model: the module whose parameters the optimizer steps.
        optimizer: any ``torch.optim.Optimizer`` over (some of) ``model``'s parameters — ours, torch's (Muon
            included), the zoos' (pytorch-optimizer, heavyball), your own — whose ``step()`` takes no closure;
            None for the plain negative gradient v = −∇L.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the training loss, computed through autograd.
        batch: what ``loss_fn`` takes.
        max_grad_norm: clip the gradients first, as a training loop that calls
            ``clip_grad_norm_(model.parameters(), max_grad_norm)`` would: by the global norm of all the model's
            gradients, those of parameters another optimizer steps included; a finite number > 0, or None for
            no clipping.

    Returns:
        v by parameter name (the model's own names, inside DDP / compile wrappers), in the parameter's dtype or
            float32, whichever is wider. Parameters the step does not move are left out (their v is zero).

    Raises:
        TypeError: ``loss_fn`` is not callable, or ``optimizer`` is not an optimizer.
        ValueError: ``max_grad_norm`` is not a finite number > 0; ``optimizer`` holds none of ``model``'s
            parameters; its ``step()`` requires a closure (LBFGS: no single direction); ``loss_fn`` returns
            no scalar tensor computed from the model; ``max_grad_norm`` with a sparse gradient
            (``nn.Embedding(sparse=True)``, which ``clip_grad_norm_`` cannot clip); the first group's lr is not a
            number > 0 (🤗 Adafactor's ``lr=None``).

    Examples:
        Adam's first step moves every weight by η against the sign of its gradient:

        >>> import torch
        >>> from optiscope.probe import update_direction
        >>> model = torch.nn.Linear(3, 1, bias=False)
        >>> _ = torch.nn.init.constant_(model.weight, 0.1)
        >>> def loss_fn(m, batch):
        ...     x, y = batch
        ...     return ((m(x) - y) ** 2).mean()
        >>> batch = (torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.0]]))
        >>> adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        >>> update_direction(model, adam, loss_fn, batch)["weight"].round(decimals=3)
        tensor([[-1., -1., -1.]])
        >>> update_direction(model, None, loss_fn, batch)  # v = −g
        {'weight': tensor([[-1.2000, -2.4000, -3.6000]])}

    Notes:
        The gradient pass runs the model's forward on copies of its buffers, so what a forward pass updates in
        place (a batch norm's running statistics, a call counter, a quantisation observer's range, spectral
        norm's power iteration) is updated there. It works from an evaluation loop too (under ``torch.no_grad``
        or ``inference_mode``, with a batch made there). An embedding with ``max_norm`` rescales rows of its
        weight in place as it looks them up: v includes that, as the step's Δθ does, and the weight is put
        back.

        The shadow step sees what the real one would. A parameter the batch gives no gradient is stepped with a
        zero gradient where its ``.grad`` is a tensor (a loop calling ``zero_grad(set_to_none=False)``: momentum
        and Adam's moments still move it) and skipped where its ``.grad`` is None. Two parameters over one
        memory (two ``nn.Parameter`` objects of one tensor) have copies over one copy of it, so that the step
        of one moves the other. The shadow copy carries every attribute of the optimizer (a subclass's own
        step counter too) and no hooks, and steps on a fork of the random streams: a step that draws (noise,
        stochastic rounding) draws what the real one will, and the training run's stream is left alone. An
        optimizer that changes ``p.grad`` inside ``step()`` (Schedule-Free AdamW divides it, heavyball's use it
        up) changes the shadow's copy. Tested against the real step of a twin model and optimizer for torch's
        Adam, NAdam, RAdam, Adagrad, SGD (Nesterov), Rprop, ASGD, Adadelta and Adafactor, pytorch-optimizer's
        Lion, Prodigy, SOAP and Schedule-Free AdamW, and heavyball's AdamW, with the state unchanged.

        Δθ is taken in float64 and v returned in float32 at least: a bfloat16 v would be 1e-3 off the step
        (1.7e-3 measured), and a float16 one can overflow for a small lr. Whether a parameter the batch gives
        no gradient moves is read from its ``.grad`` as the step would.
    """
    check_arguments(model, optimizer, loss_fn, max_grad_norm)
    named = own_names(model)
    held = [] if optimizer is None else [p for g in optimizer.param_groups for p in g["params"]]
    with renormalisations_undone(model) as renormalised:
        grads = gradients(model, loss_fn, batch, held)
    params = (
        {id(p): p for g in optimizer.param_groups for p in g["params"]}
        if optimizer is not None
        else {i: p for i, p in ((id(p), p) for p in model.parameters()) if i in grads}
    )
    # the step starts from the parameters as the forward pass left them: θ + η₀v is where it lands
    clones = shadow_parameters(params, renormalised)
    for i, clone in clones.items():
        clone.grad = grads[i] if i in grads else gradient_left(params[i])
    if max_grad_norm is not None:
        clip_like_the_model(named, grads, max_grad_norm)
    if optimizer is None:
        return {named[i]: -c.grad for i, c in clones.items() if i in named and c.grad is not None}
    lr = first_lr(optimizer)
    with rng_forked(model):  # a step that draws (noise, stochastic rounding) draws what the real step will
        shadow_optimizer(optimizer, clones).step()
    direction = {}
    for i, p in params.items():
        if i in named:
            delta = clones[i].detach().double() - p.detach().double()
            if torch.any(delta != 0):
                direction[named[i]] = (delta / lr).to(torch.promote_types(p.dtype, torch.float32))
    return direction
