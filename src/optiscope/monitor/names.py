"""Parameter names as the user wrote them, whatever wraps the model."""

from __future__ import annotations

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
