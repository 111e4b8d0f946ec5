"""The monitor's hooks on an optimizer: held weakly, measured once per ``step()`` call, kept out of compilation.

The optimizer holds its step hooks, and the monitor holds the optimizer: a hook that held the monitor would make
a reference cycle around the model, the optimizer and (through a DDP or FSDP model) the process group, which only
the garbage collector frees, perhaps at interpreter shutdown, after ``destroy_process_group``, with gloo's threads
still running (a rank then aborts: "terminate called without an active exception"). So a hook holds its monitor
through a weak reference (``weak_hook``), and does nothing once the monitor is gone.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def weak_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a bound method) as a hook that does not keep its object alive: it calls the method while the
    object lives, and returns None once it is gone."""
    ref = weakref.WeakMethod(method)

    def hook(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return hook


#: frames between a hook and the optimizer's step wrapper that are not the caller: torch.compiler.disable's
#: wrappers, and ``weak_hook``'s own
_WRAPPER_FILES = (
    *(os.path.join(os.path.dirname(torch.__file__), d) + os.sep for d in ("_dynamo", "compiler")),
    __file__,
)


def torch_caller(frame: Any) -> Any:
    """``frame`` (a hook's caller), or, when it is a frame of a wrapper around the hook (``torch.compiler.disable``'s,
    ``weak_hook``'s), the first frame above those: torch's own hook wrapper (its compiled version, under
    ``torch.compile``)."""
    while frame is not None and frame.f_code.co_filename.startswith(_WRAPPER_FILES):
        frame = frame.f_back
    return frame


def on_stack(frame: Any, top: Any) -> bool:
    """Whether ``frame`` is ``top`` or one of its callers."""
    while top is not None:
        if top is frame:
            return True
        top = top.f_back
    return False


def found_inf(optimizer: torch.optim.Optimizer) -> Tensor | None:
    """The flag a GradScaler hands an optimizer that scales by itself (torch's fused Adam, AdamW, SGD) as its
    ``found_inf`` attribute instead of not calling ``step()``: nonzero when the kernel is to skip the update,
    leaving parameters and state as they were. None without one. Reading it waits for the GPU: the monitor
    reads it at once only on the steps it measures, and with the loss on the others."""
    found = getattr(optimizer, "found_inf", None)
    return found if isinstance(found, Tensor) else None


def hooked_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose step hooks see every step: ``optimizer`` itself, or, for a wrapper that has no step
    hooks of its own (accelerate's ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer`` without
    calling its ``__init__``; its ``step()`` calls the wrapped one's), the first down its ``.optimizer``
    chain that has them."""
    inner = optimizer
    while not hasattr(inner, "_optimizer_step_pre_hooks"):
        inner = getattr(inner, "optimizer", None)
        if inner is None:
            raise TypeError(
                f"Monitor: optimizer={optimizer!r} has no step hooks (register_step_pre_hook) and wraps no "
                "optimizer that has them (.optimizer); give a torch.optim.Optimizer"
            )
    return inner
