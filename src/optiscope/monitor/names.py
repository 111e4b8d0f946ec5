"""Parameter names as the user wrote them, and the module under torch.compile, whatever wraps the model."""

from __future__ import annotations

from torch import nn

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """Parameter name without DDP's ``module.`` and torch.compile's ``_orig_mod.`` prefixes."""
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name.replace("._orig_mod.", ".").replace(".module.", ".")


def under_compile(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wraps (its ``_orig_mod``: e.g. the ``DistributedDataParallel`` of
    ``torch.compile(ddp)``), or ``model`` itself when it is not compiled."""
    return getattr(model, "_orig_mod", model)
