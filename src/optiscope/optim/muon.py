r"""Muon (Jordan et al., 2024): momentum whose matrix is replaced by its nearest semi-orthogonal matrix.

The rule is written once, in ``Muon``'s docstring, and the orthogonalisation in ``newton_schulz``'s;
``muon_step_`` is the rule on one tensor (the for-loop path) and ``muon_foreach_`` on lists of tensors.
Muon is for hidden 2-D weights only: ``muon_with_adamw(model)`` splits a model the standard way and
returns one ``MuonWithAdamW`` optimizer that steps hidden matrices with Muon and the rest with AdamW.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from .adam import adam_effective_lr, update_adam_group
from .optimizer import (
    OptiscopeOptimizer,
    Rule,
    betas_rule,
    boolean,
    grouped_by_device_and_dtype,
    non_negative,
    positive,
    unit_interval,
)

ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def newton_schulz(
    matrix: Tensor,
    coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
    steps: int = 5,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """The Newton–Schulz approximation NS(G) ≈ U Vᵀ of the orthogonal factor of a 2-D matrix G = U S Vᵀ.

    X₀ = G / max(‖G‖_F, ε) on the wide orientation (rows ≤ columns), then ``steps`` times

    ```text
    X ← a X + (b A + c A²) X,    A = X Xᵀ
    ```

    Each iteration maps every singular value s of X to a s + b s³ + c s⁵, which with the default
    (a, b, c) = (3.4445, −4.775, 2.0315) pushes all of (0, 1] towards ~1 in five steps (not exactly to 1:
    the quintic trades accuracy for speed). This is Muon's orthogonalisation (see ``Muon``).

    Args:
        matrix: G, a real 2-D tensor of any shape (A, B); a tall one is transposed and back.
        coefficients: (a, b, c) of the quintic.
        steps: the number of iterations, ≥ 0.
        eps: ε > 0, the floor on ‖G‖_F (a zero matrix stays zero).
        dtype: the dtype the arithmetic runs in (bfloat16 by default, as torch.optim.Muon; float32 is ~10×
            faster on a CPU, where bfloat16 matrix products are emulated).

    Returns:
        A tensor of ``matrix``'s shape, in ``dtype`` (not ``matrix``'s dtype), on ``matrix``'s device.

    Raises:
        ValueError: ``matrix`` is not 2-D, or is complex.

    Examples:
        The singular values come out near 1, the directions are G's:

        >>> import torch
        >>> from optiscope.optim import newton_schulz
        >>> _ = torch.manual_seed(0)
        >>> g = torch.randn(4, 8)
        >>> x = newton_schulz(g, dtype=torch.float32)
        >>> x.shape, x.dtype
        (torch.Size([4, 8]), torch.float32)
        >>> torch.linalg.svdvals(x).round(decimals=1)
        tensor([1.1000, 1.1000, 1.0000, 0.7000])
    """
    if matrix.ndim != 2 or matrix.is_complex():
        raise ValueError(
            f"newton_schulz: matrix has shape {tuple(matrix.shape)} and dtype {matrix.dtype}; give a real 2-D tensor"
        )
    a, b, c = coefficients
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A²
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A²) X
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """η' for a weight of shape (A, B): the per-shape scale of Muon's learning rate."""
    rows, cols = shape[0], shape[1]
    # η times one factor, in this order, so that the rounding (and a tensor η's dtype) are torch.optim.Muon's.
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(rows, cols)))
    if cols == 0:  # an empty (A, 0) matrix has no update to scale (and A/B would divide by zero)
        return lr
    return lr * math.sqrt(max(1, rows / cols))


def muon_step_(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    nesterov: bool,
    ns_coefficients: tuple[float, float, float],
    ns_steps: int,
    eps: float,
    adjust_lr_fn: str | None,
    ns_dtype: torch.dtype,
    maximize: bool,
) -> None:
    """One Muon step on one 2-D tensor, in place."""
    if maximize:
        grad = -grad
    momentum_buffer.lerp_(grad, 1 - momentum)
    direction = grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer
    ortho = newton_schulz(direction, ns_coefficients, ns_steps, eps, ns_dtype)
    param.mul_(1 - lr * weight_decay)
    param.add_(ortho, alpha=-adjusted_lr(lr, adjust_lr_fn, param.shape))


def muon_foreach_(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    nesterov: bool,
    ns_coefficients: tuple[float, float, float],
    ns_steps: int,
    eps: float,
    adjust_lr_fn: str | None,
    ns_dtype: torch.dtype,
    maximize: bool,
) -> None:
    """``muon_step_`` on lists: the element-wise parts batched, Newton–Schulz per matrix."""
    if maximize:
        grads = torch._foreach_neg(grads)
    torch._foreach_lerp_(momentum_buffers, grads, 1 - momentum)
    directions = torch._foreach_lerp(grads, momentum_buffers, momentum) if nesterov else momentum_buffers
    orthos = [newton_schulz(d, ns_coefficients, ns_steps, eps, ns_dtype) for d in directions]
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    for p, o in zip(params, orthos, strict=True):
        p.add_(o, alpha=-adjusted_lr(lr, adjust_lr_fn, p.shape))


def _ns_coefficients_ok(x: Any) -> bool:
    return (
        isinstance(x, tuple | list)
        and len(x) == 3
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in x)
    )


MUON_RULES = {
    "weight_decay": non_negative(),
    "momentum": unit_interval(),
    "nesterov": boolean(),
    "ns_coefficients": Rule(_ns_coefficients_ok, "three finite numbers (a, b, c)"),
    "ns_steps": Rule(
        lambda x: isinstance(x, int) and not isinstance(x, bool) and 1 <= x < 100, "an integer in [1, 100)"
    ),
    "eps": positive(),
    "adjust_lr_fn": Rule(lambda x: x in ADJUST_LR_FNS, f"one of {ADJUST_LR_FNS}"),
    "ns_dtype": Rule(
        lambda x: x is None or (isinstance(x, torch.dtype) and x.is_floating_point),
        "a floating-point torch.dtype such as torch.bfloat16 or torch.float32, or None (by device)",
    ),
}

ADAMW_GROUP_RULES = {"betas": betas_rule(), "eps": non_negative(), "weight_decay": non_negative()}

MUON_HYPER = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "ns_steps", "eps", "adjust_lr_fn")


def check_muon_params(name: str, params: Iterable[Tensor]) -> None:
    for i, p in enumerate(params):
        if isinstance(p, Tensor) and p.ndim != 2:
            raise ValueError(
                f"{name}: params[{i}] has shape {tuple(p.shape)}, but Muon updates 2-D matrices only; give "
                "biases, norms, embeddings and the output head to AdamW (muon_with_adamw(model) does this)"
            )


def update_muon_group(state: Any, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
    for p in params:
        if "momentum_buffer" not in state[p]:
            state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    hyper = {k: group[k] for k in MUON_HYPER}
    hyper.update(maximize=group["maximize"])
    if impl == "forloop":
        for p in params:
            muon_step_(p, p.grad, state[p]["momentum_buffer"], ns_dtype=_ns_dtype(group, p), **hyper)
        return
    for idx in grouped_by_device_and_dtype(params).values():
        ps = [params[i] for i in idx]
        muon_foreach_(
            ps,
            [p.grad for p in ps],
            [state[p]["momentum_buffer"] for p in ps],
            ns_dtype=_ns_dtype(group, ps[0]),
            **hyper,
        )


def _ns_dtype(group: dict[str, Any], param: Tensor) -> torch.dtype:
    return group["ns_dtype"] or (torch.bfloat16 if param.is_cuda else torch.float32)


class Muon(OptiscopeOptimizer):
    """Muon (Jordan et al., 2024) for 2-D weights, with torch.optim.Muon's arguments and defaults.

    Momentum whose matrix is replaced by its nearest semi-orthogonal matrix. For a 2-D weight
    θ ∈ ℝ^{A×B} with gradient g, learning rate η, momentum μ and decoupled decay λ:

    ```text
    g ← −g                                   if maximize
    b ← μ b + (1 − μ) g                      momentum, as an exponential average
    d = (1 − μ) g + μ b   (Nesterov)   or  d = b
    O = NS(d) ≈ U Vᵀ  where d = U S Vᵀ       Newton–Schulz orthogonalisation (newton_schulz)
    θ ← (1 − ηλ) θ − η' O                    η' = η·√max(1, A/B) ("original") or η·0.2·√max(A, B)
                                             ("match_rms_adamw", Liu et al. 2025)
    ```

    Muon is for hidden 2-D weights only; give embeddings, the output head, norms and biases to AdamW
    (``muon_with_adamw(model)`` does this, in one optimizer).

    Args:
        params: the 2-D tensors to optimize: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``) or of param-group dicts.
        lr: η, a finite number ≥ 0 or a 1-element tensor holding one.
        weight_decay: λ ≥ 0, decoupled: θ ← (1 − ηλ) θ (torch's default 0.1).
        momentum: μ in [0, 1).
        nesterov: orthogonalise the Nesterov direction (1 − μ) g + μ b instead of b.
        ns_coefficients: (a, b, c) of the Newton–Schulz quintic, three finite numbers.
        eps: ε > 0, the floor on ‖d‖_F in Newton–Schulz.
        ns_steps: Newton–Schulz iterations, an integer in [1, 100).
        adjust_lr_fn: how η' scales with the shape: None or ``"original"`` (η·√max(1, A/B)) or
            ``"match_rms_adamw"`` (η·0.2·√max(A, B), so the update's RMS matches AdamW's).
        ns_dtype: the dtype Newton–Schulz runs in: bfloat16 (the default, as torch.optim.Muon), another
            floating dtype, or None for bfloat16 on a GPU and float32 on a CPU (where bfloat16 matrix
            products are emulated and ~10× slower).
        maximize: ascend the objective (g ← −g); not in torch.optim.Muon.
        foreach: True to batch the element-wise parts with ``torch._foreach_*`` (Newton–Schulz stays per
            matrix), False for the for-loop, None to choose by device.

    Raises:
        ValueError: a parameter that is not 2-D; a hyperparameter out of its range (``ns_steps=0``,
            ``adjust_lr_fn="x"``, ``eps=0``, ``ns_dtype=torch.int32``); a param group with ``fused=True``.
        TypeError: a hyperparameter of the wrong type, such as ``lr=None``.
        RuntimeError: a complex parameter (torch.optim.Muon's type for it).

    Examples:
        One step moves θ by η·O, whose singular values are near 1 (here A/B = 1/2, so η' = η):

        >>> import torch
        >>> from optiscope.optim import Muon
        >>> _ = torch.manual_seed(0)
        >>> w = torch.nn.Parameter(torch.randn(4, 8))
        >>> optimizer = Muon([w], lr=0.02, weight_decay=0.0, ns_dtype=torch.float32)
        >>> before = w.detach().clone()
        >>> w.grad = torch.randn(4, 8)
        >>> optimizer.step()
        >>> torch.linalg.svdvals((before - w.detach()) / 0.02).round(decimals=1)
        tensor([1.1000, 0.9000, 0.8000, 0.7000])

    Notes:
        - State per parameter: ``momentum_buffer`` (b).
        - An empty (A, 0) matrix has no update to scale: η' = η.
        - Muon has no per-element effective learning rate (its step orthogonalises the whole matrix), so it
          has no ``effective_lr``.
    """

    rules = MUON_RULES
    complex_error = RuntimeError  # torch.optim.Muon's type for a complex parameter

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        *,
        ns_dtype: torch.dtype = torch.bfloat16,
        maximize: bool = False,
        foreach: bool | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=tuple(ns_coefficients),
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            ns_dtype=ns_dtype,
            maximize=maximize,
            foreach=foreach,
            fused=False,
        )
        super().__init__(params, defaults)

    def check_params(self, group: dict[str, Any], params: list[Tensor]) -> None:
        check_muon_params("Muon", params)

    def update_group(self, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
        update_muon_group(self.state, group, params, impl)


class MuonWithAdamW(OptiscopeOptimizer):
    """One optimizer, two update rules: groups with ``use_muon=True`` take Muon steps, the others AdamW.

    Hidden 2-D weights take ``Muon``'s step θ ← (1 − ηλ) θ − η' NS(d); everything else takes ``AdamW``'s
    θ ← (1 − ηλ) θ − η m̂ / (√v̂ + ε), each group with its own η and λ. Being a single
    ``torch.optim.Optimizer``, it has one ``state_dict`` and works with the schedulers in
    ``torch.optim.lr_scheduler`` (which scale each group's ``lr``). Build one with ``muon_with_adamw(model)``.

    Args:
        muon_params: the hidden 2-D weights, for the Muon group.
        adamw_params: every other trainable tensor, for the AdamW group (none: no AdamW group).
        lr: Muon's η.
        momentum: Muon's μ in [0, 1).
        nesterov: Muon's Nesterov direction.
        weight_decay: Muon's decoupled λ ≥ 0.
        ns_coefficients: (a, b, c) of the Newton–Schulz quintic.
        ns_steps: Newton–Schulz iterations, an integer in [1, 100).
        ns_eps: ε > 0, the floor on ‖d‖_F in Newton–Schulz.
        adjust_lr_fn: None, ``"original"`` or ``"match_rms_adamw"`` (see ``Muon``).
        ns_dtype: Newton–Schulz's dtype; None (the default here) for bfloat16 on a GPU and float32 on a CPU.
        adamw_lr: AdamW's η.
        adamw_betas: AdamW's (β1, β2), two floats in [0, 1) (note: not AdamW's default (0.9, 0.999)).
        adamw_eps: AdamW's ε ≥ 0.
        adamw_weight_decay: AdamW's decoupled λ ≥ 0.
        maximize: ascend the objective (g ← −g), in both rules.

    Raises:
        ValueError: a tensor of ``muon_params`` that is not 2-D; a hyperparameter out of its range.
        TypeError: a hyperparameter of the wrong type.

    Examples:
        >>> import torch
        >>> from optiscope.optim import MuonWithAdamW, split_params_for_muon
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
        ...                             torch.nn.ReLU(), torch.nn.Linear(16, 1))
        >>> hidden, rest = split_params_for_muon(model)
        >>> optimizer = MuonWithAdamW(hidden, rest, lr=0.02, adamw_lr=1e-3)
        >>> [(g["use_muon"], g["lr"], len(g["params"])) for g in optimizer.param_groups]
        [(True, 0.02, 2), (False, 0.001, 4)]
        >>> model(torch.randn(8, 4)).square().mean().backward()
        >>> optimizer.step()
        >>> optimizer.effective_lr(model[4].bias).shape  # AdamW params have one; Muon params do not
        torch.Size([1])

    Notes:
        - Muon groups use the Muon hyperparameters; AdamW groups use ``lr``, ``betas``, ``eps`` and
          ``weight_decay`` (decoupled). A group added later with
          ``add_param_group({"params": ..., "use_muon": False})`` is an AdamW group whose ``lr``, ``eps`` and
          ``weight_decay`` default to ``adamw_lr``, ``adamw_eps`` and ``adamw_weight_decay``, not Muon's.
        - ``OneCycleLR`` and ``CyclicLR`` cycle one momentum key in every group, here AdamW's β1 in ``betas``,
          so Muon's ``momentum`` stays where it was set.
        - AdamW groups take torch's fused AdamW kernel where it applies (``fused=None``); their foreach path
          takes a float ``lr`` only, as torch's Adam.
        - State per parameter: Muon's ``momentum_buffer``, or AdamW's ``step``, ``exp_avg``, ``exp_avg_sq``.
    """

    foreach_takes_tensor_lr = False  # its AdamW groups' foreach path takes a float lr only, as torch's Adam

    def __init__(
        self,
        muon_params: Iterable[Tensor],
        adamw_params: Iterable[Tensor],
        *,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
        ns_steps: int = 5,
        ns_eps: float = 1e-7,
        adjust_lr_fn: str | None = None,
        ns_dtype: torch.dtype | None = None,
        adamw_lr: float = 1e-3,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.0,
        maximize: bool = False,
    ) -> None:
        defaults = dict(
            use_muon=True,
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            ns_coefficients=tuple(ns_coefficients),
            ns_steps=ns_steps,
            eps=ns_eps,
            adjust_lr_fn=adjust_lr_fn,
            ns_dtype=ns_dtype,
            betas=tuple(adamw_betas),
            amsgrad=False,
            bias_correction=True,
            decoupled_weight_decay=True,
            maximize=maximize,
            foreach=None,
            fused=None,
        )
        # An AdamW group's lr, eps and λ where it names none (add_param_group fills them): the adamw_* arguments,
        # not the Muon values in ``defaults``, which would give a bias added later Muon's 20× larger η.
        self.adamw_defaults = {"lr": adamw_lr, "eps": adamw_eps, "weight_decay": adamw_weight_decay}
        """``lr``, ``eps`` and ``weight_decay`` for an AdamW group added later that does not set them."""
        groups = [{"params": list(muon_params), "use_muon": True}]
        adamw = list(adamw_params)
        if adamw:
            groups.append({"params": adamw, "use_muon": False})
        super().__init__(groups, defaults)

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim pickles (and deep-copies) only defaults, state and param_groups
        return {**super().__getstate__(), "adamw_defaults": self.adamw_defaults}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A pickle made before adamw_defaults existed lacks it; add_param_group needs it.
        super().__setstate__(state)
        if "adamw_defaults" not in self.__dict__:
            self.adamw_defaults = recovered_adamw_defaults(self.param_groups)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a Muon group (``use_muon`` True or absent) or an AdamW group (``use_muon=False``).

        Args:
            param_group: a dict with ``params`` and any hyperparameters to override. An AdamW group's unset
                ``lr``, ``eps`` and ``weight_decay`` come from ``adamw_defaults``, the others from the defaults.

        Raises:
            ValueError: a Muon group's tensor that is not 2-D; a hyperparameter out of its range.
            TypeError: as ``OptiscopeOptimizer.add_param_group``.
        """
        if isinstance(param_group, dict) and not param_group.get("use_muon", True):
            param_group = {**param_group, **{k: v for k, v in self.adamw_defaults.items() if k not in param_group}}
        super().add_param_group(param_group)

    def check_params(self, group: dict[str, Any], params: list[Tensor]) -> None:
        if group["use_muon"]:
            check_muon_params("MuonWithAdamW", params)

    def rules_for(self, group: dict[str, Any]) -> dict[str, Any]:
        return MUON_RULES if group["use_muon"] else ADAMW_GROUP_RULES

    def fused_supported(self, group: dict[str, Any]) -> bool:
        return not group["use_muon"]

    def update_group(self, group: dict[str, Any], params: list[Tensor], impl: str) -> None:
        if group["use_muon"]:
            update_muon_group(self.state, group, params, impl)
        else:
            update_adam_group(self.state, group, params, impl)

    @torch.no_grad()
    def effective_lr(self, param: Tensor) -> Tensor:
        """AdamW's per-element effective learning rate η / (√v̂ + ε) for a parameter of an AdamW group.

        Args:
            param: a parameter of an AdamW group that has been stepped.

        Returns:
            A tensor of ``param``'s shape, dtype and device.

        Raises:
            KeyError: ``param`` is in a Muon group, whose step η'·NS(d) orthogonalises the whole matrix and so
                has no per-element learning rate; or it is not in this optimizer, or has not been stepped.
        """
        group = next((g for g in self.param_groups if any(p is param for p in g["params"])), None)
        if group is not None and group["use_muon"]:
            raise KeyError(
                f"param of shape {tuple(param.shape)} is in a Muon group (use_muon=True): Muon's step orthogonalises "
                "the whole matrix and has no per-element effective learning rate; only AdamW groups' params have one"
            )
        return adam_effective_lr(self.state, self.param_groups, param)


def recovered_adamw_defaults(param_groups: list[dict[str, Any]]) -> dict[str, Any]:
    """``MuonWithAdamW.adamw_defaults`` for an optimizer pickled before it was kept: the constructor put its
    adamw_lr, adamw_eps and adamw_weight_decay into its first AdamW group (whose lr a scheduler may have moved
    since; it keeps the first as ``initial_lr``); without such a group, the constructor's own defaults."""
    adamw = next((g for g in param_groups if not g["use_muon"]), None)
    if adamw is None:
        signature = inspect.signature(MuonWithAdamW).parameters
        return {k: signature[f"adamw_{k}"].default for k in ("lr", "eps", "weight_decay")}
    return {"lr": adamw.get("initial_lr", adamw["lr"]), "eps": adamw["eps"], "weight_decay": adamw["weight_decay"]}


def split_params_for_muon(
    model: nn.Module, head: nn.Module | str | None = None
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """Split a model's trainable parameters into hidden matrices for Muon and everything else for AdamW.

    Muon gets the 2-D weights of ``nn.Linear`` layers. AdamW gets embeddings, the output head, norm
    weights, biases and every parameter that is not 2-D.

    Args:
        model: the model to split.
        head: the output head, excluded from Muon: a module of ``model`` or its qualified name (as in
            ``model.named_modules()``); None for the last ``nn.Linear`` registered in the model (nanoGPT's
            ``lm_head``).

    Returns:
        ``(muon, adamw)``: two lists of parameters, each in ``model.parameters()`` order.

    Raises:
        ValueError: ``head`` is a name that is not a submodule of ``model``.

    Examples:
        >>> import torch
        >>> from optiscope.optim import split_params_for_muon
        >>> model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 16), torch.nn.ReLU(),
        ...                             torch.nn.Linear(16, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 10))
        >>> muon, adamw = split_params_for_muon(model)
        >>> [tuple(p.shape) for p in muon]  # the last Linear is the head
        [(16, 8), (8, 16)]
        >>> [tuple(p.shape) for p in adamw]  # embedding, biases, norm, head
        [(10, 8), (16,), (8,), (8,), (8,), (10, 8), (10,)]

    Notes:
        - A Linear whose weight is tied to an embedding counts as that embedding (AdamW).
        - Frozen parameters (``requires_grad=False``) are in neither list; a parameter shared by several
          modules is listed once.
    """
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if isinstance(head, str):
        modules = dict(model.named_modules())
        if head not in modules:
            raise ValueError(f"head={head!r} is not a submodule; valid names include {[n for n, _ in linears][-5:]}")
        head = modules[head]
    if head is None and linears:
        head = linears[-1][1]
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    hidden_ids = {
        id(m.weight) for _, m in linears if m is not head and id(m.weight) not in embedding_ids and m.weight.ndim == 2
    }
    muon, adamw, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (muon if id(p) in hidden_ids else adamw).append(p)
    return muon, adamw


def muon_with_adamw(model: nn.Module, head: nn.Module | str | None = None, **kwargs: Any) -> MuonWithAdamW:
    """One ``MuonWithAdamW`` over ``model``: Muon for its hidden matrices, AdamW for the rest.

    The split is ``split_params_for_muon``'s: hidden ``nn.Linear`` weights take Muon's step
    θ ← (1 − ηλ) θ − η' NS(d); embeddings, the output head, norms and biases take AdamW's.

    Args:
        model: the model to optimize.
        head: the output head (a module or its qualified name), or None for the last ``nn.Linear``.
        **kwargs: ``MuonWithAdamW``'s keyword arguments (``lr``, ``adamw_lr``, ``weight_decay``, …).

    Returns:
        The optimizer, with a Muon group first and an AdamW group (if the rest is not empty) second.

    Raises:
        ValueError: the model has no hidden ``nn.Linear`` weights for Muon (use AdamW instead), ``head`` is
            not a submodule, or a keyword argument is out of its range.

    Examples:
        >>> import torch
        >>> from optiscope.optim import muon_with_adamw
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        >>> optimizer = muon_with_adamw(model, lr=0.02, adamw_lr=1e-3)
        >>> [(g["use_muon"], g["lr"]) for g in optimizer.param_groups]
        [(True, 0.02), (False, 0.001)]
    """
    muon, adamw = split_params_for_muon(model, head)
    if not muon:
        raise ValueError("muon_with_adamw: the model has no hidden nn.Linear weights for Muon; use AdamW instead")
    return MuonWithAdamW(muon, adamw, **kwargs)
