"""torch's own optimizer database (``torch.testing._internal.common_optimizers.optim_db``) on ours: every error input
torch lists for SGD, RMSprop, Adam, AdamW and Muon, given to our twin, raises torch's exception type (or warns
torch's warning, matched by torch's regex).

torch's test runs a STEP_ERROR input's constructor outside the check and expects the error from ``step()``; ours
may refuse at construction instead (Muon's complex parameter), which is where the check looks first.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.testing._internal.common_optimizers import OptimizerErrorEnum, optim_db

from optiscope import optim

TWINS = {
    torch.optim.SGD: optim.SGD,
    torch.optim.RMSprop: optim.RMSprop,
    torch.optim.Adam: optim.Adam,
    torch.optim.AdamW: optim.AdamW,
    torch.optim.Muon: optim.Muon,
}
CASES = [
    pytest.param(ours, error, id=f"{info.optim_cls.__name__}: {error.optimizer_error_input.desc}")
    for info in optim_db
    if (ours := TWINS.get(info.optim_cls)) is not None
    for error in info.optim_error_inputs_func(device="cpu", dtype=torch.float32)
]


def outcome(cls, error) -> tuple[type[Exception] | None, list[warnings.WarningMessage]]:
    """The exception type ``cls`` raises for torch's error input (None without one) and the warnings it gave."""
    given = error.optimizer_error_input
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            optimizer = cls(given.params, **given.kwargs)
            if error.error_on == OptimizerErrorEnum.STEP_ERROR:
                optimizer.step()
        except Exception as raised:  # noqa: BLE001 — the type is what is compared
            return type(raised), caught
    return None, caught


def test_the_database_lists_every_error_input_of_the_five_twins():
    """47 in torch 2.13 (12 each for Adam and AdamW, 9 for Muon, 7 each for SGD and RMSprop): a torch that lists
    fewer would make the parity below pass vacuously."""
    assert len(CASES) >= 47
    assert {case.values[0] for case in CASES} == set(TWINS.values())


@pytest.mark.parametrize(("ours", "error"), CASES)
def test_ours_fails_each_error_input_as_torch_does(ours, error):
    raised, caught = outcome(ours, error)
    if issubclass(error.error_type, Warning):
        assert raised is None
        assert any(
            issubclass(w.category, error.error_type) and re.search(error.error_regex, str(w.message)) for w in caught
        ), [str(w.message) for w in caught]
    else:
        assert raised is not None and issubclass(raised, error.error_type), raised
