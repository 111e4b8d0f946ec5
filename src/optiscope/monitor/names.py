"""Parameter names as the model itself calls them, whatever wraps it, and the module under torch.compile."""

from __future__ import annotations

from torch import nn

from ..curvature.hvp import unwrap

#: the attribute each wrapper keeps the model in, as it shows in the wrapper's parameter names
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
#: the tokens FSDP1 and activation checkpointing put into the names of the parameters they wrap, at any depth
WRAPPER_TOKENS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def clean_name(name: str) -> str:
    """``name`` without the tokens FSDP1 and checkpoint wrappers insert (``_fsdp_wrapped_module.``)."""
    for token in WRAPPER_TOKENS:
        name = name.replace(token, "")
    return name


def own_names(model: nn.Module) -> dict[int, str]:
    """Each parameter's name in the model inside its DDP / DataParallel / torch.compile wrappers, keyed by
    ``id``. The wrappers are known by type (``unwrap``), so a submodule that is merely called ``module``
    keeps its place in the name: these are the names ``optiscope.curvature`` and the probe use too. FSDP1's
    and checkpoint wrappers' tokens are taken out of the names (``clean_name``)."""
    return {id(p): clean_name(n) for n, p in unwrap(model).named_parameters()}


def is_own_name(given: str, own: str) -> bool:
    """Whether ``given`` (e.g. from ``ddp.named_parameters()``) is ``own`` under wrappers' prefixes (and
    FSDP1's tokens)."""
    given = clean_name(given)
    while given != own:
        prefix = next((p for p in _WRAPPER_PREFIXES if given.startswith(p)), None)
        if prefix is None:
            return False
        given = given[len(prefix) :]
    return True


def under_compile(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wraps (its ``_orig_mod``: e.g. the ``DistributedDataParallel`` of
    ``torch.compile(ddp)``), or ``model`` itself when it is not compiled."""
    # looked up where nn.Module keeps submodules: a plain getattr raises and catches an AttributeError on every
    # model that is not compiled, and the monitor asks on every step
    return model._modules.get("_orig_mod", model)
