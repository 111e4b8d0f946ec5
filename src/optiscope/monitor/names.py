"""Parameter names as the model itself calls them, whatever wraps it, and the module under torch.compile."""

from __future__ import annotations

from torch import nn

from ..curvature.hvp import unwrap

#: the attribute each wrapper keeps the model in, as it shows in the wrapper's parameter names
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def own_names(model: nn.Module) -> dict[int, str]:
    """Each parameter's name in the model inside its DDP / DataParallel / torch.compile wrappers, keyed by
    ``id``. The wrappers are known by type (``unwrap``), so a submodule that is merely called ``module``
    keeps its place in the name: these are the names ``optiscope.curvature`` and the probe use too."""
    return {id(p): n for n, p in unwrap(model).named_parameters()}


def is_own_name(given: str, own: str) -> bool:
    """Whether ``given`` (e.g. from ``ddp.named_parameters()``) is ``own`` under wrappers' prefixes."""
    while given != own:
        prefix = next((p for p in _WRAPPER_PREFIXES if given.startswith(p)), None)
        if prefix is None:
            return False
        given = given[len(prefix) :]
    return True


def under_compile(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wraps (its ``_orig_mod``: e.g. the ``DistributedDataParallel`` of
    ``torch.compile(ddp)``), or ``model`` itself when it is not compiled."""
    return getattr(model, "_orig_mod", model)
