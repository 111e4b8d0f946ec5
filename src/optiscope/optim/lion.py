r"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of a momentum.

The rule is written once, in ``Lion``'s docstring; ``lion_step_`` is it on one tensor (the for-loop path)
and ``lion_foreach_`` on lists of tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .optimizer import OptiscopeOptimizer, betas_rule, grouped_by_device_and_dtype, non_negative


def lion_step_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    maximize: bool,
) -> None:
    """One Lion step on one tensor, in place."""
    if maximize:
        grad = -grad
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    direction = exp_avg.lerp(grad, 1 - beta1).sign_()
    param.add_(direction, alpha=-lr)
    exp_avg.lerp_(grad, 1 - beta2)


def lion_foreach_(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    maximize: bool,
) -> None:
    """``lion_step_`` on lists of same-device, same-dtype tensors."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    directions = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
    torch._foreach_sign_(directions)
    torch._foreach_add_(params, directions, alpha=-lr)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)


class Lion(OptiscopeOptimizer):
    """Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of a momentum.

    For a parameter θ with gradient g, learning rate η, betas (β1, β2) and decoupled weight decay λ:

    ```text
    g ← −g                          if maximize
    c = β1 m + (1 − β1) g           the interpolation whose sign is the step
    θ ← (1 − ηλ) θ − η sign(c)
    m ← β2 m + (1 − β2) g
    ```

    Every coordinate moves by exactly η (plus decay) whatever its gradient's size, so Lion's update norm
    is η·√(number of non-zero signs). Defaults are the paper's (η = 1e-4, β = (0.9, 0.99), λ = 0).

    Args:
        params: the tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one.
        betas: (β1, β2), two floats in [0, 1): β1 mixes the step's sign, β2 smooths m.
        weight_decay: λ ≥ 0, decoupled: θ ← (1 − ηλ) θ.
        maximize: ascend the objective (g ← −g).
        foreach: True for the ``torch._foreach_*`` path, False for the for-loop, None to choose by device.

    Raises:
        ValueError: a hyperparameter out of its range (or ``betas`` not floats); a param group with
            ``fused=True`` (Lion has no fused kernel).
        TypeError: a hyperparameter of the wrong type, such as ``lr=None``.
        IndexError: ``betas`` with fewer than two items.

    Examples:
        Whatever the gradient's size, each coordinate moves by η:

        >>> import torch
        >>> from optiscope.optim import Lion
        >>> w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        >>> optimizer = Lion([w], lr=0.1)
        >>> (w**2).sum().backward()  # g = (2, −4)
        >>> optimizer.step()
        >>> w.detach()
        tensor([ 0.9000, -1.9000])
        >>> optimizer.state[w]["exp_avg"]  # m = (1 − β2) g
        tensor([ 0.0200, -0.0400])

    Notes:
        - State per parameter: ``exp_avg`` (m). Lion is not in torch.optim; it has no fused path.
        - The paper's advice: an η 3–10× smaller than AdamW's, and a λ 3–10× larger.
    """

    rules = {"betas": betas_rule(), "weight_decay": non_negative()}

    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas) if isinstance(betas, list) else betas,
            weight_decay=weight_decay,
            maximize=maximize,
            foreach=foreach,
            fused=False,
        )
        super().__init__(params, defaults)

    def update_group(self, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
        for p in params:
            if "exp_avg" not in self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        hyper = dict(
            lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], maximize=group["maximize"]
        )
        if impl == "forloop":
            for p in params:
                lion_step_(p, p.grad, self.state[p]["exp_avg"], **hyper)
            return
        for idx in grouped_by_device_and_dtype(params).values():
            ps = [params[i] for i in idx]
            lion_foreach_(ps, [p.grad for p in ps], [self.state[p]["exp_avg"] for p in ps], **hyper)
