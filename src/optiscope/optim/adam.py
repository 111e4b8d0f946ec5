r"""Adam, AdamW and Adam+L2: one update rule, three places for weight decay.

The rule is written once, in ``Adam``'s docstring; ``AdamW`` and ``AdamL2`` say where their decay goes.
``adam_step_`` is the rule on one tensor (the for-loop path), ``adam_foreach_`` on lists of tensors, and
``update_adam_group`` also calls torch's fused kernels; ``MuonWithAdamW`` reuses it for its AdamW groups.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .optimizer import (
    OptiscopeOptimizer,
    betas_rule,
    boolean,
    grouped_by_device_and_dtype,
    new_step_counter,
    non_negative,
    scalar_lr,
)


def bias_corrections(step: float, beta1: float, beta2: float, enabled: bool) -> tuple[float, float]:
    """(1 − β1ᵗ, 1 − β2ᵗ), or (1, 1) when bias correction is off. t starts at 1, never 0."""
    if not enabled:
        return 1.0, 1.0
    return 1 - beta1**step, 1 - beta2**step


def adam_step_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    max_exp_avg_sq: Tensor | None,
    *,
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled_weight_decay: bool,
    amsgrad: bool,
    bias_correction: bool,
    maximize: bool,
) -> None:
    """One Adam step on one tensor, in place; ``step`` is t after incrementing (1 on the first call)."""
    if maximize:
        grad = -grad
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    if amsgrad:
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        exp_avg_sq = max_exp_avg_sq
    bc1, bc2 = bias_corrections(step, beta1, beta2, bias_correction)
    denom = exp_avg_sq.sqrt().div_(math.sqrt(bc2)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / bc1)


def adam_foreach_(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    *,
    steps: list[float],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled_weight_decay: bool,
    amsgrad: bool,
    bias_correction: bool,
    maximize: bool,
) -> None:
    """``adam_step_`` on lists of same-device, same-dtype tensors (steps may differ per tensor)."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        if decoupled_weight_decay:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        exp_avg_sqs = max_exp_avg_sqs
    corrections = [bias_corrections(s, beta1, beta2, bias_correction) for s in steps]
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, [math.sqrt(bc2) for _, bc2 in corrections])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, [-lr / bc1 for bc1, _ in corrections])


class Adam(OptiscopeOptimizer):
    """Adam (Kingma & Ba, 2015) with coupled L2 weight decay, as torch.optim.Adam.

    For a parameter θ with gradient g at step t = 1, 2, …, learning rate η, betas (β1, β2), ε and decay λ:

    ```text
    g ← −g                                   if maximize
    g ← g + λθ                               coupled L2 decay (Adam, AdamL2: "the wrong way")
    m ← β1 m + (1 − β1) g                    first moment
    v ← β2 v + (1 − β2) g²                   second moment (element-wise square)
    v_max ← max(v_max, v)                    AMSGrad only; v_max replaces v below
    m̂ = m / (1 − β1ᵗ),  v̂ = v / (1 − β2ᵗ)    bias correction (skipped when bias_correction=False)
    θ ← (1 − ηλ) θ                           decoupled decay (AdamW)
    θ ← θ − η m̂ / (√v̂ + ε)
    ```

    The per-element *effective learning rate* is η / (√v̂ + ε), the preconditioner P = diag(√v̂ + ε)
    divided into η: ``effective_lr(param)`` returns it. Arguments, defaults and state are torch.optim.Adam's,
    plus ``bias_correction``.

    Args:
        params: the tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one (not with ``foreach=True``, as in torch).
        betas: (β1, β2), two floats in [0, 1) (write ``0.0``, not ``0``; tensors are refused).
        eps: ε ≥ 0, added to √v̂.
        weight_decay: λ ≥ 0; added to the gradient as λθ unless ``decoupled_weight_decay``.
        amsgrad: use the running maximum of v (AMSGrad) in the denominator.
        bias_correction: divide m and v by (1 − β1ᵗ) and (1 − β2ᵗ); False drops the factors, so that the
            seed's pitfall can be shown, not hidden (the first step is then (1 − β1)/√(1 − β2) η ≈ 3.2 η
            at the default betas, against η with them).
        decoupled_weight_decay: shrink θ by (1 − ηλ) instead (Adam becomes AdamW).
        maximize: ascend the objective (g ← −g).
        foreach: True for the ``torch._foreach_*`` path, False for the for-loop, None to choose by device.
        fused: True for torch's fused kernel, False never, None to use it where the options allow.
        capturable: taken as False only (no step counters kept on the device for CUDA-graph capture).
        differentiable: taken as False only (steps run under ``torch.no_grad``).

    Raises:
        ValueError: a hyperparameter out of its range (or ``betas`` not floats); ``fused=True`` with
            ``bias_correction=False`` (torch's fused Adam kernels always apply bias correction); a tensor
            ``lr`` with ``foreach=True``; ``capturable=True`` or ``differentiable=True``.
        TypeError: a hyperparameter of the wrong type (``lr=None``, ``betas="ab"``).
        IndexError: ``betas`` with fewer than two items (as torch).
        RuntimeError: ``fused=True`` together with ``foreach=True``.

    Examples:
        The seed's worked example, Adam on θ² from θ = 3 (g = 2θ): each step moves θ by about η.

        >>> import torch
        >>> from optiscope.optim import Adam
        >>> x = torch.nn.Parameter(torch.tensor(3.0))
        >>> optimizer = Adam([x], lr=1e-3)
        >>> for _ in range(3):
        ...     optimizer.zero_grad()
        ...     (x**2).backward()
        ...     optimizer.step()
        ...     print(round(x.item(), 3))
        2.999
        2.998
        2.997
        >>> print(f"{optimizer.effective_lr(x).item():.2e}")  # η / (√v̂ + ε) with √v̂ ≈ |g| ≈ 6
        1.67e-04

    Notes:
        - State per parameter (torch.optim's names, so state dicts interoperate both ways): ``step`` (t, a
          float32 scalar tensor), ``exp_avg`` (m), ``exp_avg_sq`` (v) and, with amsgrad, ``max_exp_avg_sq``.
        - The fused path calls ``torch._fused_adam_`` (``torch._fused_adamw_`` with decoupled decay), the
          kernels of torch.optim's ``fused=True``; it needs ``bias_correction=True``.
        - In the float64 tests the foreach path equals the for-loop bit-for-bit and the fused path matches it
          to 1e-10 relative, except with a float32 tensor η on float64 parameters, which the for-loop (torch's
          as ours) multiplies in float32: after 25 AdamW steps (λ = 0.5) the two paths then differ by about
          1e-7 relative, torch's own alike.
    """

    rules = {
        "betas": betas_rule(),
        "eps": non_negative(),
        "weight_decay": non_negative(),
        "amsgrad": boolean(),
        "bias_correction": boolean(),
        "decoupled_weight_decay": boolean(),
    }
    foreach_takes_tensor_lr = False

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        bias_correction: bool = True,
        *,
        decoupled_weight_decay: bool = False,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas) if isinstance(betas, list) else betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            bias_correction=bias_correction,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
            foreach=foreach,
            fused=fused,
        )
        super().__init__(params, defaults, false_only=dict(capturable=capturable, differentiable=differentiable))

    def fused_supported(self, group: dict[str, Any]) -> bool:
        return group["bias_correction"]

    def fused_unsupported_reason(self, group: dict[str, Any]) -> str:
        return "torch's fused Adam kernels always apply bias correction; bias_correction=False"

    def update_group(self, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
        update_adam_group(self.state, group, params, impl)

    @torch.no_grad()
    def effective_lr(self, param: Tensor) -> Tensor:
        """Per-element effective learning rate η / (√v̂ + ε) of ``param`` after its latest step.

        v̂ is bias-corrected unless ``bias_correction=False``, and is v_max's with amsgrad; η is the group's
        current ``lr`` (what a scheduler set last).

        Args:
            param: a parameter of this optimizer that has been stepped.

        Returns:
            A tensor of ``param``'s shape, dtype and device.

        Raises:
            KeyError: ``param`` is not in this optimizer, or has no Adam state yet (it has not been stepped,
                or only by a fused step that a GradScaler skipped, which leaves t = 0).
        """
        return adam_effective_lr(self.state, self.param_groups, param)


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter, 2019): Adam with decoupled weight decay θ ← (1 − ηλ) θ, as torch.optim.AdamW.

    The update is ``Adam``'s with the decay taken out of the gradient:

    ```text
    θ ← (1 − ηλ) θ − η m̂ / (√v̂ + ε)
    ```

    so every weight shrinks by the same factor (1 − ηλ), whatever its gradient's history. Arguments,
    defaults (λ = 1e-2) and state are torch.optim.AdamW's, plus ``bias_correction``.

    Args:
        params: the tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one (not with ``foreach=True``).
        betas: (β1, β2), two floats in [0, 1).
        eps: ε ≥ 0, added to √v̂.
        weight_decay: λ ≥ 0, the decoupled decay rate per unit of η.
        amsgrad: use the running maximum of v in the denominator.
        bias_correction: divide m and v by (1 − β1ᵗ) and (1 − β2ᵗ).
        maximize: ascend the objective (g ← −g).
        foreach: True for the ``torch._foreach_*`` path, False for the for-loop, None to choose by device.
        fused: True for torch's fused kernel (``torch._fused_adamw_``), False never, None where it applies.
        capturable: taken as False only.
        differentiable: taken as False only.

    Raises:
        ValueError: a hyperparameter out of its range; ``fused=True`` with ``bias_correction=False``;
            ``capturable=True`` or ``differentiable=True``.
        TypeError: a hyperparameter of the wrong type.
        RuntimeError: ``fused=True`` together with ``foreach=True``.

    Examples:
        With a zero gradient only the decay acts: θ shrinks by exactly (1 − ηλ).

        >>> import torch
        >>> from optiscope.optim import AdamW
        >>> w = torch.nn.Parameter(torch.ones(1))
        >>> w.grad = torch.zeros(1)
        >>> AdamW([w], lr=0.1, weight_decay=0.5).step()
        >>> round(w.item(), 4)  # 1 − 0.1 · 0.5
        0.95

    Notes:
        ``effective_lr(param)`` is Adam's η / (√v̂ + ε); the decay is not part of it.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        bias_correction: bool = True,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            bias_correction=bias_correction,
            decoupled_weight_decay=True,
            maximize=maximize,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )


class AdamL2(Adam):
    """Adam with L2 decay folded into the gradient ("the wrong way" in the seed), λ = 1e-2 by default.

    The update is ``Adam``'s with g ← g + λθ before the moments:

    ```text
    θ ← θ − η m̂ / (√v̂ + ε)    with m, v built from g + λθ
    ```

    so the decay term passes through 1/(√v̂ + ε) and parameters with small gradients are decayed hardest,
    where ``AdamW`` shrinks every weight by the same factor (1 − ηλ). The same update as
    ``Adam(weight_decay=λ)``; the separate name and AdamW's default λ make side-by-side comparisons with
    ``AdamW`` read clearly.

    Args:
        params: the tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one (not with ``foreach=True``).
        betas: (β1, β2), two floats in [0, 1).
        eps: ε ≥ 0, added to √v̂.
        weight_decay: λ ≥ 0, the L2 coefficient added to the gradient as λθ.
        amsgrad: use the running maximum of v in the denominator.
        bias_correction: divide m and v by (1 − β1ᵗ) and (1 − β2ᵗ).
        maximize: ascend the objective (g ← −g).
        foreach: True for the ``torch._foreach_*`` path, False for the for-loop, None to choose by device.
        fused: True for torch's fused kernel (``torch._fused_adam_``), False never, None where it applies.
        capturable: taken as False only.
        differentiable: taken as False only.

    Raises:
        ValueError: a hyperparameter out of its range; ``fused=True`` with ``bias_correction=False``;
            ``capturable=True`` or ``differentiable=True``.
        TypeError: a hyperparameter of the wrong type.
        RuntimeError: ``fused=True`` together with ``foreach=True``.

    Examples:
        With a zero gradient the decay alone is g = λθ, which Adam normalises to a step of about η:

        >>> import torch
        >>> from optiscope.optim import AdamL2
        >>> w = torch.nn.Parameter(torch.ones(1))
        >>> w.grad = torch.zeros(1)
        >>> AdamL2([w], lr=0.1, weight_decay=0.5).step()
        >>> round(w.item(), 4)  # 1 − 0.1 · m̂/√v̂ = 1 − 0.1 (AdamW: 0.95)
        0.9
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        bias_correction: bool = True,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            bias_correction=bias_correction,
            decoupled_weight_decay=False,
            maximize=maximize,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )


def update_adam_group(state: Any, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
    """Initialise missing state, advance t and apply one Adam step to ``params`` with ``impl``.

    A module-level function so that composite optimizers (``MuonWithAdamW``) can reuse it.
    """
    beta1, beta2 = group["betas"]
    amsgrad = group["amsgrad"]
    states = [state[p] for p in params]  # looked up once: a tensor's hash is a Python call, and this runs every step
    for p, s in zip(params, states, strict=True):
        if "step" not in s:
            s["step"] = new_step_counter(p, on_param_device=impl == "fused")
            s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if amsgrad:
                s["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif impl == "fused" and s["step"].device != p.device:
            s["step"] = s["step"].to(p.device)
    hyper = dict(
        lr=group["lr"],
        beta1=beta1,
        beta2=beta2,
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        amsgrad=amsgrad,
        maximize=group["maximize"],
    )
    steps = [s["step"] for s in states]
    torch._foreach_add_(steps, 1)
    if impl == "fused":
        kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
        for idx in grouped_by_device_and_dtype(params).values():
            ss = [states[i] for i in idx]
            kernel(
                [params[i] for i in idx],
                [params[i].grad for i in idx],
                [s["exp_avg"] for s in ss],
                [s["exp_avg_sq"] for s in ss],
                [s["max_exp_avg_sq"] for s in ss] if amsgrad else [],
                [steps[i] for i in idx],
                **hyper,
            )
        return
    rest = dict(hyper, decoupled_weight_decay=group["decoupled_weight_decay"], bias_correction=group["bias_correction"])
    if impl == "forloop":
        for p, s, t in zip(params, states, steps, strict=True):
            adam_step_(p, p.grad, s["exp_avg"], s["exp_avg_sq"], s.get("max_exp_avg_sq"), step=t.item(), **rest)
        return
    for idx in grouped_by_device_and_dtype(params).values():
        ss = [states[i] for i in idx]
        adam_foreach_(
            [params[i] for i in idx],
            [params[i].grad for i in idx],
            [s["exp_avg"] for s in ss],
            [s["exp_avg_sq"] for s in ss],
            [s["max_exp_avg_sq"] for s in ss] if amsgrad else [],
            steps=[steps[i].item() for i in idx],
            **rest,
        )


def adam_effective_lr(state: Any, param_groups: list[dict[str, Any]], param: Tensor) -> Tensor:
    """η / (√v̂ + ε) for ``param`` from Adam-style state (``step``, ``exp_avg_sq``, ``max_exp_avg_sq``)."""
    group, denominator = adam_denominator(state, param_groups, param)
    return scalar_lr(group["lr"]) / denominator


def adam_denominator(state: Any, param_groups: list[dict[str, Any]], param: Tensor) -> tuple[dict[str, Any], Tensor]:
    """(``param``'s group, √v̂ + ε) from Adam-style state: the preconditioner P = diag(√v̂ + ε), which does
    not depend on η (KeyError for a param not in the optimizer or before its first step)."""
    group = next((g for g in param_groups if any(p is param for p in g["params"])), None)
    if group is None:
        raise KeyError(f"param of shape {tuple(param.shape)} is not in this optimizer")
    s = state.get(param, {})
    t = adam_steps(s)
    if t == 0:
        raise KeyError(f"param of shape {tuple(param.shape)} has no Adam state yet (step it first)")
    beta1, beta2 = group["betas"]
    _, bc2 = bias_corrections(t, beta1, beta2, group.get("bias_correction", True))
    v = s["max_exp_avg_sq"] if group.get("amsgrad") else s["exp_avg_sq"]
    return group, (v / bc2).sqrt() + group["eps"]


def adam_steps(param_state: dict[str, Any]) -> float:
    """t, the steps a parameter's Adam-style state has taken: 0 without a second moment, and at t = 0, where
    v̂ = v/(1 − β2⁰) is not defined yet (a fused step that a GradScaler's ``found_inf`` skipped creates the
    state and leaves t and v at 0). Read once: a step counter on a GPU costs a synchronisation."""
    if "exp_avg_sq" not in param_state or "step" not in param_state:
        return 0.0
    return float(param_state["step"])
