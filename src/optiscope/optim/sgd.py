r"""Stochastic gradient descent, with momentum, Nesterov momentum and two kinds of weight decay.

The update rule is written once, in ``SGD``'s docstring; ``sgd_step_`` is it on one tensor (the for-loop path),
``sgd_foreach_`` on lists of tensors, and ``_sgd_fused_`` calls torch's fused kernel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .optimizer import (
    OptiscopeOptimizer,
    boolean,
    grouped_by_device_and_dtype,
    non_negative,
    unit_interval,
)


def sgd_step_(
    param: Tensor,
    grad: Tensor,
    buf: Tensor | None,
    *,
    lr: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    decoupled_weight_decay: bool,
    maximize: bool,
) -> Tensor | None:
    """One SGD step on one tensor, in place. Returns the momentum buffer (created on the first step)."""
    if maximize:
        grad = -grad
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    if momentum != 0:
        if buf is None:
            buf = grad.clone()
        else:
            buf.mul_(momentum).add_(grad, alpha=1 - dampening)
        grad = grad.add(buf, alpha=momentum) if nesterov else buf
    param.add_(grad, alpha=-lr)
    return buf


def sgd_foreach_(
    params: list[Tensor],
    grads: list[Tensor],
    bufs: list[Tensor | None],
    *,
    lr: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    decoupled_weight_decay: bool,
    maximize: bool,
) -> None:
    """``sgd_step_`` on lists of same-device, same-dtype tensors; fills ``bufs`` in place."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        if decoupled_weight_decay:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum != 0:
        old = [i for i, b in enumerate(bufs) if b is not None]
        for i, b in enumerate(bufs):
            if b is None:
                bufs[i] = grads[i].clone()
        if old:
            old_bufs = [bufs[i] for i in old]
            torch._foreach_mul_(old_bufs, momentum)
            torch._foreach_add_(old_bufs, [grads[i] for i in old], alpha=1 - dampening)
        grads = torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs
    torch._foreach_add_(params, grads, alpha=-lr)


class SGD(OptiscopeOptimizer):
    """SGD with optional (Nesterov) momentum and coupled or decoupled weight decay, as torch.optim.SGD.

    For a parameter θ with gradient g, learning rate η, momentum μ, dampening τ and weight decay λ:

    ```text
    g ← −g                      if maximize
    g ← g + λθ                  coupled ("L2") decay, the default
    θ ← (1 − ηλ) θ              decoupled decay (decoupled_weight_decay=True)
    b ← g                       on the first step,  b ← μ b + (1 − τ) g  afterwards
    d ← g + μ b  (Nesterov)     or  d ← b  (heavy ball)  or  d ← g  (μ = 0)
    θ ← θ − η d
    ```

    Arguments (in torch's positional order), defaults and state are torch.optim.SGD's, plus the keyword
    ``decoupled_weight_decay``.

    Args:
        params: the tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one.
        momentum: μ in [0, 1); 0 for plain SGD.
        dampening: τ in [0, 1], the share of g that does not enter b.
        weight_decay: λ ≥ 0.
        nesterov: Nesterov momentum, d = g + μ b; needs μ > 0 and τ = 0.
        decoupled_weight_decay: shrink θ by (1 − ηλ) each step instead of adding λθ to the gradient.
        maximize: ascend the objective (g ← −g).
        foreach: True for the ``torch._foreach_*`` path, False for the for-loop, None to choose by device.
        fused: True for torch's fused kernel, False never, None to use it where the options allow.
        differentiable: taken as False only (steps run under ``torch.no_grad``).

    Raises:
        ValueError: a hyperparameter out of its range; ``nesterov=True`` without μ > 0 and τ = 0;
            ``fused=True`` with ``decoupled_weight_decay=True`` and λ > 0 (torch's fused SGD kernel only has
            coupled weight decay); ``differentiable=True``.
        TypeError: a hyperparameter of the wrong type, such as ``lr=None``; ``params`` a single tensor.
        RuntimeError: ``fused=True`` together with ``foreach=True``.

    Examples:
        Two heavy-ball steps on ‖θ‖², whose gradient is g = 2θ:

        >>> import torch
        >>> from optiscope.optim import SGD
        >>> w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        >>> optimizer = SGD([w], lr=0.1, momentum=0.9)
        >>> for _ in range(2):
        ...     optimizer.zero_grad()
        ...     (w**2).sum().backward()
        ...     optimizer.step()
        >>> w.detach()  # b = 2θ₀ = (2, −4), then b = 0.9 b + 2θ₁ = (3.4, −6.8)
        tensor([ 0.4600, -0.9200])
        >>> optimizer.state[w]["momentum_buffer"]
        tensor([ 3.4000, -6.8000])

    Notes:
        - State per parameter: ``momentum_buffer`` (b, only when μ ≠ 0), as in torch.optim.SGD.
        - For plain SGD coupled and decoupled decay are the same update; they differ as soon as the step
          is not a fixed multiple of the gradient (momentum here, and above all Adam: see ``AdamW``).
        - The fused path calls ``torch._fused_sgd_``. On the CPU, float16 and bfloat16 tensors take the
          for-loop instead, even with ``fused=True``: torch ≤ 2.13's fused CPU SGD skips their vectorised
          blocks (a tensor of 16 elements or more does not move) and corrupts their momentum
          (pytorch/pytorch#191763, fixed by #192545).
    """

    rules = {
        "momentum": unit_interval(),
        "dampening": unit_interval(closed_right=True),
        "weight_decay": non_negative(),
        "nesterov": boolean(),
        "decoupled_weight_decay": boolean(),
    }

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        decoupled_weight_decay: bool = False,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
            foreach=foreach,
            fused=fused,
        )
        super().__init__(params, defaults, false_only=dict(differentiable=differentiable))

    def check_group(self, group: dict[str, Any]) -> None:
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                f"SGD: nesterov=True needs momentum > 0 and dampening = 0, got momentum={group['momentum']!r}, "
                f"dampening={group['dampening']!r}"
            )

    def fused_supported(self, group: dict[str, Any]) -> bool:
        return not (group["decoupled_weight_decay"] and group["weight_decay"] != 0)

    def fused_unsupported_reason(self, group: dict[str, Any]) -> str:
        return (
            "torch's fused SGD kernel only has coupled weight decay; decoupled_weight_decay=True with weight_decay > 0"
        )

    def fused_cpu_takes(self, p: Tensor) -> bool:
        # torch ≤ 2.13's fused CPU SGD skips the vectorised blocks of float16/bfloat16 tensors (a tensor of 16
        # elements or more does not move) and corrupts their momentum: pytorch/pytorch#191763, fixed by #192545
        return super().fused_cpu_takes(p) and p.dtype not in (torch.float16, torch.bfloat16)

    def update_group(self, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
        hyper = {k: group[k] for k in ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize")}
        uses_buffer = group["momentum"] != 0
        states = [self.state[p] for p in params]  # looked up once: a tensor's hash is a Python call, every step
        bufs = [s.get("momentum_buffer") for s in states]
        new = [i for i, b in enumerate(bufs) if b is None]  # buffers are created once, then updated in place
        if impl == "forloop":
            for i, p in enumerate(params):
                bufs[i] = sgd_step_(p, p.grad, bufs[i], decoupled_weight_decay=group["decoupled_weight_decay"], **hyper)
        else:
            groups = grouped_by_device_and_dtype(params).values()
            whole = len(groups) == 1  # the usual case: the lists as they are, not copies
            for idx in groups:
                ps, bs = (params, bufs) if whole else ([params[i] for i in idx], [bufs[i] for i in idx])
                gs = [p.grad for p in ps]
                if impl == "foreach":
                    sgd_foreach_(ps, gs, bs, decoupled_weight_decay=group["decoupled_weight_decay"], **hyper)
                else:
                    _sgd_fused_(ps, gs, bs, **hyper)
                if not whole:
                    for i, b in zip(idx, bs, strict=True):
                        bufs[i] = b
        if uses_buffer:
            for i in new:
                states[i]["momentum_buffer"] = bufs[i]


def _sgd_fused_(params: list[Tensor], grads: list[Tensor], bufs: list[Tensor | None], **hyper: Any) -> None:
    """torch's fused SGD kernel. It treats a whole list as first-step or not, so new buffers go apart."""
    if hyper["momentum"] == 0:
        torch._fused_sgd_(params, grads, [], is_first_step=False, **hyper)
        return
    new = [i for i, b in enumerate(bufs) if b is None]
    if not new:  # every step after the first
        torch._fused_sgd_(params, grads, bufs, is_first_step=False, **hyper)
        return
    old = [i for i, b in enumerate(bufs) if b is not None]
    for first, idx in ((True, new), (False, old)):
        if not idx:
            continue
        if first:
            for i in idx:
                bufs[i] = torch.empty_like(params[i])
        torch._fused_sgd_(
            [params[i] for i in idx],
            [grads[i] for i in idx],
            [bufs[i] for i in idx],
            is_first_step=first,
            **hyper,
        )
