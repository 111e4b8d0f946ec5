r"""RMSProp (Tieleman & Hinton, 2012): Adam's second moment without its first, and no bias correction.

The rule is written once, in ``RMSprop``'s docstring; ``rmsprop_step_`` is it on one tensor (the for-loop
path) and ``rmsprop_foreach_`` on lists of tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .optimizer import (
    OptiscopeOptimizer,
    boolean,
    grouped_by_device_and_dtype,
    new_step_counter,
    non_negative,
    scalar_lr,
    unit_interval,
)


def rmsprop_step_(
    param: Tensor,
    grad: Tensor,
    square_avg: Tensor,
    grad_avg: Tensor | None,
    momentum_buffer: Tensor | None,
    *,
    lr: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
    maximize: bool,
) -> None:
    """One RMSProp step on one tensor, in place."""
    if maximize:
        grad = -grad
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    if centered:
        grad_avg.lerp_(grad, 1 - alpha)
        denom = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_().add_(eps)
    else:
        denom = square_avg.sqrt().add_(eps)
    if momentum > 0:
        momentum_buffer.mul_(momentum).addcdiv_(grad, denom)
        param.add_(momentum_buffer, alpha=-lr)
    else:
        param.addcdiv_(grad, denom, value=-lr)


def rmsprop_foreach_(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor],
    momentum_buffers: list[Tensor],
    *,
    lr: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
    maximize: bool,
) -> None:
    """``rmsprop_step_`` on lists of same-device, same-dtype tensors."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_mul_(square_avgs, alpha)
    torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - alpha)
    if centered:
        torch._foreach_lerp_(grad_avgs, grads, 1 - alpha)
        denom = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, value=-1)
        torch._foreach_sqrt_(denom)
    else:
        denom = torch._foreach_sqrt(square_avgs)
    torch._foreach_add_(denom, eps)
    if momentum > 0:
        torch._foreach_mul_(momentum_buffers, momentum)
        torch._foreach_addcdiv_(momentum_buffers, grads, denom)
        torch._foreach_add_(params, momentum_buffers, alpha=-lr)
    else:
        torch._foreach_addcdiv_(params, grads, denom, value=-lr)


class RMSprop(OptiscopeOptimizer):
    """RMSProp (Tieleman & Hinton, 2012) with torch.optim.RMSprop's arguments and defaults.

    Adam's second moment without its first, and no bias correction. For a parameter θ with gradient g,
    learning rate η, smoothing α, ε, weight decay λ and momentum μ:

    ```text
    g ← −g                           if maximize
    g ← g + λθ                       coupled L2 decay
    v ← α v + (1 − α) g²
    ḡ ← α ḡ + (1 − α) g              centered only; then v − ḡ² replaces v below
    d = g / (√v + ε)
    b ← μ b + d,  θ ← θ − η b        with momentum;  θ ← θ − η d  without
    ```

    Its effective learning rate is η / (√v + ε) (``effective_lr``), Adam's without the bias correction,
    which is why RMSProp's first steps are large: v starts at 0, so the first step is η sign(g)/√(1 − α),
    10 η at α = 0.99 (ε aside).

    Args:
        params: the tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one.
        alpha: α in [0, 1), the smoothing of v (and of ḡ).
        eps: ε ≥ 0, added to √v.
        weight_decay: λ ≥ 0, added to the gradient as λθ.
        momentum: μ in [0, 1); 0 for none.
        centered: divide by the square root of the variance estimate v − ḡ² instead of v.
        capturable: taken as False only (positional after ``centered``, in torch.optim.RMSprop's order).
        foreach: True for the ``torch._foreach_*`` path, False for the for-loop, None to choose by device.
        maximize: ascend the objective (g ← −g).
        differentiable: taken as False only (steps run under ``torch.no_grad``).

    Raises:
        ValueError: a hyperparameter out of its range; ``capturable=True`` or ``differentiable=True``;
            a param group with ``fused=True`` (RMSprop has no fused kernel).
        TypeError: a hyperparameter of the wrong type, such as ``lr=None``.

    Examples:
        The first step is large: v = (1 − α) g², so d = sign(g)/√(1 − α) = 10 sign(g) at α = 0.99.

        >>> import torch
        >>> from optiscope.optim import RMSprop
        >>> w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        >>> optimizer = RMSprop([w], lr=0.01)
        >>> (w**2).sum().backward()
        >>> optimizer.step()
        >>> w.detach()  # each coordinate moved by 10 η
        tensor([ 0.9000, -1.9000])
        >>> optimizer.effective_lr(w)  # η / (√v + ε), √v = 0.1 |g|
        tensor([0.0500, 0.0250])

    Notes:
        State per parameter (torch's names): ``step``, ``square_avg`` (v), ``grad_avg`` (ḡ, when centered),
        ``momentum_buffer`` (b, when μ > 0).
    """

    rules = {
        "alpha": unit_interval(),
        "eps": non_negative(),
        "weight_decay": non_negative(),
        "momentum": unit_interval(),
        "centered": boolean(),
    }

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        capturable: bool = False,  # positional after centered, in torch.optim.RMSprop's order
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=centered,
            maximize=maximize,
            foreach=foreach,
            fused=False,
        )
        super().__init__(params, defaults, false_only=dict(capturable=capturable, differentiable=differentiable))

    def update_group(self, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
        for p in params:
            s = self.state[p]
            if "step" not in s:
                s["step"] = new_step_counter(p, on_param_device=False)
                s["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["momentum"] > 0:
                    s["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["centered"]:
                    s["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            s["step"] += 1
        hyper = {k: group[k] for k in ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize")}
        if impl == "forloop":
            for p in params:
                s = self.state[p]
                rmsprop_step_(p, p.grad, s["square_avg"], s.get("grad_avg"), s.get("momentum_buffer"), **hyper)
            return
        for idx in grouped_by_device_and_dtype(params).values():
            states = [self.state[params[i]] for i in idx]
            rmsprop_foreach_(
                [params[i] for i in idx],
                [params[i].grad for i in idx],
                [s["square_avg"] for s in states],
                [s["grad_avg"] for s in states] if group["centered"] else [],
                [s["momentum_buffer"] for s in states] if group["momentum"] > 0 else [],
                **hyper,
            )

    @torch.no_grad()
    def effective_lr(self, param: Tensor) -> Tensor:
        """Per-element effective learning rate η / (√v + ε) of ``param`` after its latest step.

        With ``centered=True``, v − ḡ² replaces v. With momentum the step is η b, so this is the factor
        applied to g before it enters b.

        Args:
            param: a parameter of this optimizer that has been stepped.

        Returns:
            A tensor of ``param``'s shape, dtype and device.

        Raises:
            KeyError: ``param`` is not in this optimizer or has not been stepped.
        """
        group = next((g for g in self.param_groups if any(p is param for p in g["params"])), None)
        s = self.state.get(param, {})
        if group is None or "square_avg" not in s:
            raise KeyError(f"param of shape {tuple(param.shape)} has no RMSprop state (not stepped or not ours)")
        v = s["square_avg"]
        if group["centered"]:
            v = v.addcmul(s["grad_avg"], s["grad_avg"], value=-1)
        return scalar_lr(group["lr"]) / (v.sqrt() + group["eps"])
