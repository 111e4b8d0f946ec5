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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..checks import finite, is_number


@dataclass(frozen=True)
class Rule:
    """A hyperparameter's valid values, and the exception torch.optim raises for an invalid one.

    ``ok`` says which values are valid; ``valid`` describes them for the message. ``error(value)`` names
    the exception type for an invalid value as torch does: TypeError where it cannot compare the value
    with 0 (``lr=None``), ValueError for a value out of range, RuntimeError for a multi-element tensor
    (whose truth is ambiguous) in a ``kind="number"`` or ``"bool"`` rule. A number rule judges a
    1-element tensor by its value and refuses a valid one with TypeError (only ``lr`` may be a tensor
    here). ``classify``, when set, replaces all this.
    """

    ok: Callable[[Any], bool]
    valid: str
    kind: str = "other"
    classify: Callable[[Any], type[Exception] | None] | None = None

    def error(self, x: Any) -> type[Exception] | None:
        if self.classify is not None:
            return self.classify(x)
        if self.ok(x):
            return None
        if isinstance(x, Tensor) and self.kind in ("number", "bool"):
            if x.numel() != 1:
                return RuntimeError
            return TypeError if self.kind == "number" and self.ok(x.item()) else ValueError
        if self.kind == "number" and not isinstance(x, Tensor) and not is_number(x):
            return TypeError
        return ValueError


FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def non_negative() -> Rule:
    return Rule(lambda x: finite(x) and x >= 0, "a finite number >= 0", kind="number")


def positive() -> Rule:
    return Rule(lambda x: finite(x) and x > 0, "a finite number > 0", kind="number")


def unit_interval(closed_right: bool = False) -> Rule:
    if closed_right:
        return Rule(lambda x: finite(x) and 0 <= x <= 1, "a number in [0, 1]", kind="number")
    return Rule(lambda x: finite(x) and 0 <= x < 1, "a number in [0, 1)", kind="number")


def learning_rate() -> Rule:
    """η: a number or, as in torch.optim, a 1-element tensor (schedulers then update it in place)."""

    def ok(x: Any) -> bool:
        if isinstance(x, Tensor):
            return x.numel() == 1 and not x.is_complex() and bool(torch.isfinite(x).all()) and float(x) >= 0
        return finite(x) and x >= 0

    def classify(x: Any) -> type[Exception] | None:
        if ok(x):
            return None
        return ValueError if isinstance(x, Tensor) or is_number(x) else TypeError

    return Rule(ok, "a finite number >= 0 or a 1-element tensor holding one", classify=classify)


def betas_rule() -> Rule:
    """(β1, β2): two floats in [0, 1). Like torch.optim.Adam, ints such as 0 are refused (write 0.0)."""

    def ok(b: Any) -> bool:
        return (
            isinstance(b, tuple | list)
            and len(b) == 2
            and all(isinstance(x, float) and math.isfinite(x) and 0 <= x < 1 for x in b)
        )

    def classify(b: Any) -> type[Exception] | None:
        # torch reads betas[0] and betas[1] first: IndexError for fewer items, TypeError for no items
        # at all; then it compares each with 0 and 1 (TypeError for a non-number) and wants floats.
        if ok(b):
            return None
        if isinstance(b, Tensor):
            return IndexError if b.dim() == 0 or len(b) < 2 else ValueError
        if not isinstance(b, tuple | list):
            return TypeError
        if len(b) < 2:
            return IndexError
        if not all(is_number(x) or isinstance(x, Tensor) for x in b[:2]):
            return TypeError
        return ValueError

    return Rule(ok, "a pair of floats (beta1, beta2), each in [0, 1)", classify=classify)


def boolean() -> Rule:
    return Rule(lambda x: isinstance(x, bool), "True or False", kind="bool")


def optional_bool() -> Rule:
    return Rule(lambda x: x is None or isinstance(x, bool), "None, True or False", kind="bool")


#: torch.optim's flags that ours take only as False (so that code written for torch.optim runs unchanged), and why.
FALSE_ONLY_FLAGS = {
    "capturable": "no path keeps its step counters on the device for CUDA-graph capture",
    "differentiable": "steps run under torch.no_grad; use torch.optim's optimizer to differentiate through one",
}


def refuse_true_flags(optimizer: str, flags: dict[str, Any]) -> None:
    """A one-line error for a ``FALSE_ONLY_FLAGS`` flag that is not False: TypeError for a non-bool, else ValueError."""
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{optimizer}: invalid {flag}={value!r} ({type(value).__name__}); {flag} must be False")
        if value:
            raise ValueError(f"{optimizer}: {flag}=True is not supported ({FALSE_ONLY_FLAGS[flag]}); pass False")


COMMON_RULES: dict[str, Rule] = {
    "lr": learning_rate(),
    "maximize": boolean(),
    "foreach": optional_bool(),
    "fused": optional_bool(),
}


class OptiscopeOptimizer(torch.optim.Optimizer):
    """Base class of every optiscope optimizer: a ``torch.optim.Optimizer`` that checks its groups when they are added.

    A subclass writes its update θ ← θ − η d(g, state) once per implementation and this class runs the
    step: for each param group, the parameters that have a gradient g go to
    ``update_group(group, params, impl)`` with ``impl`` one of

    - ``"forloop"``: one tensor at a time, plain in-place tensor ops; the ground truth that every other
      path is tested against, state included;
    - ``"foreach"``: the same rule on lists of tensors with ``torch._foreach_*`` ops (fewer kernel launches
      on a GPU; on a CPU seldom faster than the for-loop);
    - ``"fused"``: torch's single-pass ATen kernel where the rule is exactly one of them
      (``torch._fused_sgd_``, ``torch._fused_adam_``, ``torch._fused_adamw_``).

    With ``foreach=None, fused=None`` the fastest supported path is chosen: fused where the options allow,
    otherwise foreach for CUDA tensors and the for-loop on the CPU, as torch.optim does.

    A subclass sets ``rules`` (hyperparameter -> valid values), may override ``check_group`` (rules on
    several hyperparameters), ``check_params`` (rules on the tensors) and ``fused_supported``, and
    implements ``update_group(group, params, impl)``.

    Args:
        params: the tensors to optimize, as torch.optim takes them: an iterable of tensors (``model.parameters()``),
            of ``(name, tensor)`` pairs (``model.named_parameters()``) or of param-group dicts, each with its
            ``params`` and any hyperparameters that differ from ``defaults``.
        defaults: every hyperparameter's default value; each group gets the ones it does not set. Must hold
            ``lr``; ``lr``, ``maximize``, ``foreach`` and ``fused`` are checked by the common rules where present.
        false_only: the constructor's ``capturable`` and ``differentiable`` flags, as given; they are checked
            (only False is taken) and not kept in the groups. None for an optimizer that takes neither.

    Raises:
        ValueError: a hyperparameter out of its range (``lr=-1.0``); ``capturable=True`` or
            ``differentiable=True``; a tensor already in another group; some parameters named and others not;
            ``fused=True`` with options that no fused kernel has.
        TypeError: a hyperparameter of the wrong type (``lr=None``); ``params`` a single tensor, a set, or
            holding something that is not a tensor; a complex parameter (``complex_error``); a group that is
            not a dict.
        RuntimeError: ``fused=True`` together with ``foreach=True``; a tensor of more than one element for a
            number or bool hyperparameter.

    Examples:
        A new optimizer is its update rule; the checks, param groups and ``state_dict`` come with the base class:

        >>> import torch
        >>> from optiscope.optim import OptiscopeOptimizer
        >>> class SignSGD(OptiscopeOptimizer):
        ...     def __init__(self, params, lr=0.01):
        ...         super().__init__(params, dict(lr=lr, maximize=False, foreach=None, fused=None))
        ...     def update_group(self, group, params, impl):  # θ ← θ − η sign(g)
        ...         for p in params:
        ...             p.add_(p.grad.sign(), alpha=-group["lr"])
        >>> w = torch.nn.Parameter(torch.tensor([0.5, -2.0]))
        >>> optimizer = SignSGD([w], lr=0.1)
        >>> (w**2).sum().backward()
        >>> optimizer.step()
        >>> w.detach()
        tensor([ 0.4000, -1.9000])
        >>> SignSGD([w], lr=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: SignSGD: invalid lr=-1.0; lr must be a finite number >= 0 or a 1-element tensor holding one

    Notes:
        - **A drop-in for torch.optim.** What torch.optim (2.13) accepts, this accepts the same way:
          ``model.named_parameters()`` and groups of (name, tensor) pairs (the names are kept in each group's
          ``param_names`` and in ``state_dict()``, which loads into torch's optimizer and back; the monitor
          names its records by them), a 1-element tensor ``lr`` (of any shape; it acts as a 0-d one), every
          scheduler in ``torch.optim.lr_scheduler``, and a parameter listed twice in one group (with torch's
          warning; it is stepped twice). What torch
          rejects raises the exception type torch raises (``tests/optim/test_torch_parity.py`` runs each case
          against torch side by side). Refused although torch takes them: complex parameters (torch steps
          their real and imaginary parts as separate reals) and ``betas`` given as tensors.
        - torch's ``capturable`` and ``differentiable`` are taken as False only (``FALSE_ONLY_FLAGS``), with a
          one-line ValueError for True: no path keeps its step counters on the device for CUDA-graph capture,
          and steps run under ``torch.no_grad`` (use torch.optim's optimizer to differentiate through a step).
        - ``load_state_dict`` loads a copy of the state: torch keeps references to tensors that need no cast,
          so two optimizers loaded from one in-memory state dict would otherwise step each other's state.
          A state dict from torch.optim (or an older optiscope) that lacks some of this optimizer's options
          takes its defaults for them, and a ``step`` saved as a Python number (torch ≤ 1.11) becomes the
          float32 scalar tensor the step counts with, as torch.optim loads it.
        - Fused falls back to the for-loop per tensor, even with ``fused=True``, where torch's fused CPU
          kernels are wrong: non-contiguous tensors (seen in torch 2.13) and, for SGD, float16/bfloat16 ones
          (``SGD``'s notes). ``fused=True`` needs floating-point parameters and gradients of the same dtype on
          the CPU or CUDA (RuntimeError at ``step`` otherwise).
        - Sparse gradients are refused at ``step`` (RuntimeError): use a dense embedding (``sparse=False``).
    """

    rules: dict[str, Rule] = {}
    """Each hyperparameter's valid values (name -> ``Rule``), checked with ``lr``, ``maximize``, ``foreach``
    and ``fused`` whenever a group is added; a broken rule raises the exception type torch.optim raises."""
    complex_error: type[Exception] = TypeError
    """The exception for a complex parameter, which ours refuse: TypeError, or torch's own type where torch refuses
    one too (torch.optim.Muon: RuntimeError)."""
    foreach_takes_tensor_lr = True
    """Whether the foreach path takes a tensor ``lr`` (torch.optim.Adam's does not: ValueError with
    ``foreach=True``; with ``foreach=None`` such a group takes the fused path where it applies, else the for-loop)."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        defaults: dict[str, Any],
        false_only: dict[str, Any] | None = None,
    ) -> None:
        # torch.optim checks the hyperparameters before the parameters; so do we.
        refuse_true_flags(type(self).__name__, false_only or {})
        self.check_hyperparameters(defaults)
        if isinstance(params, Tensor):
            raise TypeError(
                f"{type(self).__name__}: params must be an iterable of tensors or of param-group dicts, "
                f"got a single {type(params).__name__}; pass [tensor] or model.parameters()"
            )
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from ``state_dict()`` (this optimizer's, torch.optim's or an older optiscope's).

        As torch.optim, but the loaded state is a copy: torch keeps references to tensors that need no cast,
        so two optimizers loaded from one in-memory state dict would step each other's state.

        Args:
            state_dict: what ``state_dict()`` returned: ``state`` (per-parameter tensors) and ``param_groups``.
                Options it lacks take this optimizer's defaults.

        Raises:
            ValueError: its groups do not match this optimizer's in number or sizes (torch.optim's check).
        """
        super().load_state_dict(copy.deepcopy(state_dict))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # load_state_dict() and unpickling land here: a state dict from torch.optim (or an older
        # optiscope) may lack our options, which then take this optimizer's defaults.
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        # torch ≤ 1.11 saved t as a Python number, and torch.optim still loads such state dicts: t becomes the
        # float32 scalar tensor that the step counts with (new_step_counter)
        for param_state in self.state.values():
            if "step" in param_state and not isinstance(param_state["step"], Tensor):
                param_state["step"] = torch.tensor(float(param_state["step"]), dtype=torch.float32)

    # ----------------------------------------------------------------------------------------- checks
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group, checked as the constructor checks its groups.

        Args:
            param_group: a dict with ``params`` (a tensor, tensors, or ``(name, tensor)`` pairs) and any
                hyperparameters that differ from the optimizer's defaults.

        Raises:
            TypeError: ``param_group`` is not a dict; a param is not a real tensor; a hyperparameter has the
                wrong type.
            ValueError: a tensor is already in another group; a hyperparameter is out of its range;
                ``fused=True`` with options that no fused kernel has.
            RuntimeError: ``fused=True`` together with ``foreach=True``.
        """
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a param group must be a dict, got {type(param_group).__name__}")
        params, names = split_names(name, param_group.get("params"))
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(
                    f"{name}: params[{i}] is a {type(p).__name__}; every param must be a torch.Tensor "
                    "(for example an nn.Parameter) or a (name, tensor) pair from named_parameters()"
                )
            if p.is_complex():
                raise self.complex_error(f"{name}: params[{i}] is complex ({p.dtype}); only real tensors are supported")
        seen = {id(p) for group in self.param_groups for p in group["params"]}
        for i, p in enumerate(params):
            if id(p) in seen:
                raise ValueError(
                    f"{name}: params[{i}] (shape {tuple(p.shape)}) is already in another param group; "
                    "each tensor may belong to one group only"
                )
        merged = {**self.defaults, **param_group}
        self.check_hyperparameters(merged)
        self.check_params(merged, params)
        if merged.get("fused") and merged.get("foreach"):
            raise RuntimeError(f"{name}: fused=True and foreach=True are exclusive; set at most one of them")
        if merged.get("fused") and not self.fused_supported(merged):
            raise ValueError(
                f"{name}: fused=True is not available with these options ({self.fused_unsupported_reason(merged)}); "
                "use fused=None (choose automatically) or fused=False"
            )
        group = {**param_group, "params": params}
        if names is not None:
            group["param_names"] = names
        # A tensor listed twice in this group passes with torch.optim's warning (it is stepped twice).
        super().add_param_group(group)

    def check_hyperparameters(self, group: dict[str, Any]) -> None:
        """Check every rule that applies to ``group``; a broken one raises the exception type torch.optim raises.

        Args:
            group: a param group's hyperparameters (defaults merged in).

        Raises:
            ValueError: a value out of range, a True ``capturable``/``differentiable``, a tensor ``lr`` with
                ``foreach=True`` where ``foreach_takes_tensor_lr`` is False, or a ``check_group`` rule broken.
            TypeError: a value of the wrong type.
            RuntimeError: a tensor of more than one element for a number or bool hyperparameter.
        """
        name = type(self).__name__
        refuse_true_flags(name, {flag: group[flag] for flag in FALSE_ONLY_FLAGS if flag in group})
        for key, rule in {**COMMON_RULES, **self.rules_for(group)}.items():
            if key not in group:
                continue
            value = group[key]
            error = rule.error(value)
            if error is not None:
                of_type = f" ({type(value).__name__})" if error is TypeError else ""
                raise error(f"{name}: invalid {key}={value!r}{of_type}; {key} must be {rule.valid}")
        if isinstance(group.get("lr"), Tensor) and group.get("foreach") and not self.foreach_takes_tensor_lr:
            raise ValueError(
                f"{name}: lr as a Tensor is not supported with foreach=True (as in torch.optim); "
                "use foreach=None or False, or a float lr"
            )
        self.check_group(group)

    def check_params(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """Subclass hook: rules on the tensors of a group (Muon's 2-D weights); the base class has none.

        Args:
            group: the group's hyperparameters (defaults merged in).
            params: the group's tensors.

        Raises:
            ValueError: in a subclass, naming the tensors that break a rule.
        """

    def rules_for(self, group: dict[str, Any]) -> dict[str, Rule]:
        """The rules that apply to ``group`` (composite optimizers have different rules per group).

        Args:
            group: the group's hyperparameters (defaults merged in).

        Returns:
            Hyperparameter name -> ``Rule``; ``rules`` unless a subclass overrides this.
        """
        return self.rules

    def check_group(self, group: dict[str, Any]) -> None:
        """Subclass hook: rules that involve more than one hyperparameter; the base class has none.

        Args:
            group: the group's hyperparameters (defaults merged in).

        Raises:
            ValueError: in a subclass, naming the hyperparameters that break a rule.
        """

    # ---------------------------------------------------------------------------------------- fused
    def fused_supported(self, group: dict[str, Any]) -> bool:
        """Whether this group's options map onto a fused kernel (devices are checked at step time).

        Args:
            group: the group's hyperparameters (defaults merged in).

        Returns:
            False here; True in a subclass whose rule with these options is one of torch's fused kernels.
        """
        return False

    def fused_unsupported_reason(self, group: dict[str, Any]) -> str:
        """Why ``fused=True`` is refused for ``group``, for the ValueError's message.

        Args:
            group: the group's hyperparameters (defaults merged in).

        Returns:
            A short clause, e.g. ``"Lion has no fused kernel"``.
        """
        return f"{type(self).__name__} has no fused kernel"

    def fused_cpu_takes(self, p: Tensor) -> bool:
        """Whether torch's fused CPU kernel updates ``p`` right; the others take the for-loop, even with fused=True.

        It does not for non-contiguous tensors (seen in torch 2.13: tests/optim/test_optimizer.py).

        Args:
            p: a parameter whose gradient is set.

        Returns:
            True when ``p`` and its gradient are contiguous (and, in a subclass, any further condition holds).
        """
        return _contiguous(p)

    # ----------------------------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take one step for every parameter that has a gradient; parameters without one are left as they are.

        Args:
            closure: optional; re-evaluates the model and returns the loss (called with gradients enabled).

        Returns:
            The closure's loss, or None without a closure.

        Raises:
            RuntimeError: a sparse gradient; or ``fused=True`` with parameters the fused kernels do not take
                (not floating point, a gradient of another dtype, or a device other than CPU and CUDA).
        """
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
            if isinstance(group["lr"], Tensor) and group["lr"].dim() != 0:
                # the group keeps the caller's tensor, which schedulers update in place
                group = {**group, "lr": scalar_lr(group["lr"])}
            if impl == "fused" and not all(p.is_cuda for p in params):
                # tensors that torch's fused CPU kernel gets wrong take the for-loop path (fused_cpu_takes)
                wrong = [p for p in params if not self.fused_cpu_takes(p)]
                if wrong:
                    params = [p for p in params if self.fused_cpu_takes(p)]
                    self.update_group(group, wrong, "forloop")
            if params:
                self.update_group(group, params, impl)
        return loss

    def implementation(self, group: dict[str, Any], params: list[Tensor]) -> str:
        """The path that steps ``params`` of ``group``, honouring an explicit ``fused`` or ``foreach``.

        Args:
            group: the param group.
            params: its parameters that have a gradient.

        Returns:
            ``"fused"``, ``"foreach"`` or ``"forloop"``.

        Raises:
            RuntimeError: ``fused=True`` with parameters the fused kernels do not take.
        """
        if group.get("fused"):
            if not fused_devices_ok(params):
                raise RuntimeError(
                    f"{type(self).__name__}: fused=True needs floating-point params and grads of the "
                    f"same dtype, on CPU or CUDA; got {sorted({(str(p.device), str(p.dtype)) for p in params})}"
                )
            return "fused"
        if group.get("foreach"):
            return "foreach"
        if group.get("foreach") is None:  # neither chosen: fused where it may be (fused=None), else foreach on CUDA
            if group.get("fused") is None and self.fused_supported(group) and fused_devices_ok(params):
                return "fused"
            if all(p.is_cuda for p in params) and (self.foreach_takes_tensor_lr or not isinstance(group["lr"], Tensor)):
                return "foreach"
        return "forloop"


def scalar_lr(lr: float | Tensor) -> float | Tensor:
    """η as a scalar: a 1-element tensor lr of any shape acts as a 0-d one (torch.optim's _to_scalar), so that
    it neither broadcasts a 0-d parameter's update to shape (1,) nor meets a CUDA tensor as a CPU (1,)-tensor."""
    return lr.reshape(()) if isinstance(lr, Tensor) else lr


def split_names(optimizer: str, params: Any) -> tuple[list[Any], list[str] | None]:
    """(tensors, names) of a group's ``params``, which torch.optim lets be a tensor, a list of tensors,
    or a list of (name, tensor) pairs such as ``model.named_parameters()``; names is None without pairs."""
    if isinstance(params, Tensor):
        return [params], None
    if isinstance(params, set):
        raise TypeError(f"{optimizer}: params must be an ordered sequence (list, tuple), not a set")
    if params is None or isinstance(params, str | bytes) or not isinstance(params, Iterable):
        raise TypeError(
            f"{optimizer}: params must be an iterable of tensors or of (name, tensor) pairs, "
            f"got {type(params).__name__}"
        )
    items = list(params)
    named = [isinstance(item, tuple) for item in items]
    if not any(named):
        return items, None
    if not all(named):
        i = named.index(False)
        raise ValueError(
            f"{optimizer}: params[{i}] has no name but other params do; give every param of every group as a "
            "(name, tensor) pair (model.named_parameters()) or none of them"
        )
    return [item[1] for item in items], [item[0] for item in items]


def fused_devices_ok(params: list[Tensor]) -> bool:
    """Whether torch's fused kernels take these: floating params on CPU or CUDA, each with a gradient of its dtype.
    A gradient is on its parameter's device (torch refuses to assign another) and dense here (``step`` refuses
    sparse ones), so only the few distinct kinds are judged, not each tensor: this runs every step."""
    grads = [p.grad for p in params]
    if any(g is None for g in grads):
        return False
    kinds = {(p.device, p.dtype, g.dtype) for p, g in zip(params, grads, strict=True)}
    return all(device.type in ("cpu", "cuda") and dtype in FUSED_DTYPES and g == dtype for device, dtype, g in kinds)


def _contiguous(p: Tensor) -> bool:
    return p.is_contiguous() and p.grad.is_contiguous()


def grouped_by_device_and_dtype(tensors: list[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    """Positions of tensors sharing a (device, dtype): fused and foreach kernels want uniform lists."""
    kinds = {(p.device, p.dtype) for p in tensors}
    if len(kinds) == 1:  # the usual case, without a dict operation per tensor (this runs every step)
        return {kinds.pop(): list(range(len(tensors)))}
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
