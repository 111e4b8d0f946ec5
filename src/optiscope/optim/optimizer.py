"""What every optiscope optimizer shares: hyperparameter checks, the step loop, and the choice of
implementation.

Each optimizer family writes its update rule once per implementation:

* ``forloop`` — one tensor at a time, plain in-place tensor ops. This is the ground truth: it reads like
  the maths and every other path is tested against it, state included.
* ``foreach`` — the same rule on lists of tensors with ``torch._foreach_*`` ops (fewer kernel launches on
  a GPU; on a CPU it is seldom faster than the for-loop).
* ``fused`` — one pass over memory per tensor. Where the rule is exactly one of torch's fused ATen
  kernels (``torch._fused_adam_``, ``torch._fused_adamw_``, ``torch._fused_sgd_``) we call that kernel:
  an optimizer step is memory-bound, and no composition of eager tensor ops can match a single pass
  (``benchmarks/optim_step.py`` measures the gap).

With ``foreach=None, fused=None`` the fastest supported path is chosen: fused where the options allow,
otherwise foreach for CUDA tensors and the for-loop on the CPU (as torch.optim does).
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

#: A rule is (predicate on the value, text describing the valid values).
Rule = tuple[Callable[[Any], bool], str]

FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def non_negative() -> Rule:
    return (lambda x: _is_real(x) and x >= 0, "a finite number >= 0")


def positive() -> Rule:
    return (lambda x: _is_real(x) and x > 0, "a finite number > 0")


def unit_interval(closed_right: bool = False) -> Rule:
    if closed_right:
        return (lambda x: _is_real(x) and 0 <= x <= 1, "a number in [0, 1]")
    return (lambda x: _is_real(x) and 0 <= x < 1, "a number in [0, 1)")


def betas_rule() -> Rule:
    def ok(b: Any) -> bool:
        return isinstance(b, tuple | list) and len(b) == 2 and all(_is_real(x) and 0 <= x < 1 for x in b)

    return (ok, "a pair (beta1, beta2) with each value in [0, 1)")


def boolean() -> Rule:
    return (lambda x: isinstance(x, bool), "True or False")


def optional_bool() -> Rule:
    return (lambda x: x is None or isinstance(x, bool), "None, True or False")


COMMON_RULES: dict[str, Rule] = {
    "lr": non_negative(),
    "maximize": boolean(),
    "foreach": optional_bool(),
    "fused": optional_bool(),
}


class OptiscopeOptimizer(torch.optim.Optimizer):
    """Base class: a ``torch.optim.Optimizer`` whose groups are checked when they are added.

    Subclasses set ``rules`` (hyperparameter -> Rule), may override ``check_group`` for rules that
    involve several hyperparameters, and implement ``update_group(group, params, impl)``.
    """

    rules: dict[str, Rule] = {}

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]) -> None:
        if isinstance(params, Tensor):
            raise TypeError(
                f"{type(self).__name__}: params must be an iterable of tensors or of param-group dicts, "
                f"got a single {type(params).__name__}; pass [tensor] or model.parameters()"
            )
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch.optim, but the loaded state is a copy: torch keeps references to tensors that need
        no cast, so two optimizers loaded from one in-memory state dict would step each other's state."""
        super().load_state_dict(copy.deepcopy(state_dict))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # load_state_dict() and unpickling land here: a state dict from torch.optim (or an older
        # optiscope) may lack our options, which then take this optimizer's defaults.
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    # ----------------------------------------------------------------------------------------- checks
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a param group must be a dict, got {type(param_group).__name__}")
        params = param_group.get("params")
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(f"{name}: params must be an ordered sequence (list, tuple), not a set")
        params = list(params) if params is not None else []
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(
                    f"{name}: params[{i}] is a {type(p).__name__}; every param must be a torch.Tensor "
                    "(for example an nn.Parameter)"
                )
            if p.is_complex():
                raise TypeError(f"{name}: params[{i}] is complex ({p.dtype}); only real tensors are supported")
        seen = {id(p) for group in self.param_groups for p in group["params"]}
        for i, p in enumerate(params):
            if id(p) in seen:
                raise ValueError(
                    f"{name}: params[{i}] (shape {tuple(p.shape)}) is already in another param group; "
                    "each tensor may belong to one group only"
                )
        merged = {**self.defaults, **param_group}
        for key, (ok, valid) in {**COMMON_RULES, **self.rules_for(merged)}.items():
            if key in merged and not ok(merged[key]):
                raise ValueError(f"{name}: invalid {key}={merged[key]!r}; {key} must be {valid}")
        if merged.get("fused") and merged.get("foreach"):
            raise ValueError(f"{name}: fused=True and foreach=True are exclusive; set at most one of them")
        self.check_group(merged)
        if merged.get("fused") and not self.fused_supported(merged):
            raise ValueError(
                f"{name}: fused=True is not available with these options ({self.fused_unsupported_reason(merged)}); "
                "use fused=None (choose automatically) or fused=False"
            )
        super().add_param_group({**param_group, "params": params})

    def rules_for(self, group: dict[str, Any]) -> dict[str, Rule]:
        """The rules that apply to ``group`` (composite optimizers have different rules per group)."""
        return self.rules

    def check_group(self, group: dict[str, Any]) -> None:
        """Rules that involve more than one hyperparameter. Raise ValueError naming them."""

    # ---------------------------------------------------------------------------------------- fused
    def fused_supported(self, group: dict[str, Any]) -> bool:
        """Whether this group's options map onto a fused kernel (devices are checked at step time)."""
        return False

    def fused_unsupported_reason(self, group: dict[str, Any]) -> str:
        return f"{type(self).__name__} has no fused kernel"

    # ----------------------------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take one step for every parameter that has a gradient; returns the closure's loss, if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError(
                        f"{type(self).__name__}: sparse gradients are not supported "
                        f"(param of shape {tuple(p.shape)}); use a dense embedding (sparse=False)"
                    )
            impl = self.implementation(group, params)
            if impl == "fused":
                # torch's fused CPU kernels give wrong results for non-contiguous tensors (seen in
                # torch 2.13: tests/optim/test_optimizer.py), so those take the for-loop path.
                strided = [p for p in params if not _contiguous(p)]
                params = [p for p in params if _contiguous(p)]
                if strided:
                    self.update_group(group, strided, "forloop")
            if params:
                self.update_group(group, params, impl)
        return loss

    def implementation(self, group: dict[str, Any], params: list[Tensor]) -> str:
        """'fused', 'foreach' or 'forloop' for this group, honouring explicit choices."""
        if group.get("fused"):
            if not fused_devices_ok(params):
                raise RuntimeError(
                    f"{type(self).__name__}: fused=True needs floating-point params and grads of the "
                    f"same dtype, on CPU or CUDA; got {sorted({(str(p.device), str(p.dtype)) for p in params})}"
                )
            return "fused"
        if group.get("foreach"):
            return "foreach"
        if group.get("fused") is None and group.get("foreach") is None:
            if self.fused_supported(group) and fused_devices_ok(params):
                return "fused"
            if all(p.is_cuda for p in params):
                return "foreach"
        return "forloop"


def fused_devices_ok(params: list[Tensor]) -> bool:
    return all(
        p.device.type in ("cpu", "cuda")
        and p.dtype in FUSED_DTYPES
        and p.grad is not None
        and p.grad.dtype == p.dtype
        and p.grad.device == p.device
        and not p.grad.is_sparse
        for p in params
    )


def _contiguous(p: Tensor) -> bool:
    return p.is_contiguous() and p.grad.is_contiguous()


def grouped_by_device_and_dtype(tensors: list[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    """Positions of tensors sharing a (device, dtype): fused and foreach kernels want uniform lists."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, p in enumerate(tensors):
        groups.setdefault((p.device, p.dtype), []).append(i)
    return groups


def new_step_counter(param: Tensor, on_param_device: bool) -> Tensor:
    """The step count t, kept as a float32 scalar tensor like torch.optim (so state dicts interoperate).

    Fused kernels read it on the parameter's device; the other paths keep it on the CPU so that
    reading it is not a device synchronisation.
    """
    device = param.device if on_param_device else torch.device("cpu")
    return torch.zeros((), dtype=torch.float32, device=device)
