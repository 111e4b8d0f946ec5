"""The one flat key scheme for loggers: a monitor record as ``{"optiscope/u_over_w/total": 0.012, ...}``.

Loggers (W&B, MLflow, TensorBoard, the 🤗 Trainer's ``report_to``, Lightning's ``trainer.loggers``) take flat
``{name: number}`` dicts; a record is nested (``params``, ``total``, ``curvature``). Every key starts with a prefix
(``optiscope`` by default) so that none is a name the host logs with another meaning: 🤗 logs ``grad_norm``, the
norm before clipping, where the monitor's is after it (``optiscope/grad_norm_after_clip/total``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

from ..checks import is_number

#: the monitor's whole-model numbers: the record's field -> its key (after the prefix)
TOTALS = {"g": "grad_norm_after_clip", "w": "weight_norm", "u": "update_norm", "u_over_w": "u_over_w"}

#: per parameter: the entry's field -> its key (after the prefix; the parameter's name follows)
PER_PARAMETER = {**TOTALS, "cos": "cos_u_neg_g"}

#: the curvature's numbers (``Curvature``): the record's field -> its key (after the prefix)
CURVATURE = {
    "sharpness": "sharpness",
    "threshold": "stability_threshold",
    "sharpness/threshold": "sharpness_over_threshold",
    "curvature/update": "curvature_along_update",
    "curvature/gradient": "curvature_along_gradient",
    "hessian_trace": "hessian_trace",
    "noise_scale": "noise_scale",
}

#: what a prefix may hold: a name (MLflow allows these in metric keys, and so do all the others)
PREFIX = re.compile(r"[A-Za-z0-9_.-]+")


def flat_metrics(
    record: dict[str, Any], per_parameter: bool | str | Iterable[str] = False, prefix: str = "optiscope"
) -> dict[str, float]:
    """A monitor record as the flat ``{key: number}`` dict a logger takes, under one documented key scheme.

    By default the whole model's numbers and the curvature's; the per-parameter series (a large model has
    hundreds of parameters, five series each) only when asked::

        optiscope/loss                          the step's loss
        optiscope/grad_norm_after_clip/total    ‖g‖ the optimizer stepped with (after clipping, if any)
        optiscope/weight_norm/total             ‖θ‖
        optiscope/update_norm/total             ‖u‖, u = θ_after − θ_before
        optiscope/u_over_w/total                ‖u‖/‖θ‖
        optiscope/lr/group{i}                   the learning rate the step used, per param group
        optiscope/tokens_per_s                  with the monitor's batch_tokens
        optiscope/sharpness                     λ₁ (of P⁻¹H for Adam-family optimizers), on curvature steps
        optiscope/stability_threshold           the optimizer's threshold (2/η, 38/η, …)
        optiscope/sharpness_over_threshold      above 1: unstable along the top eigenvector
        optiscope/curvature_along_update        dᵀHd/dᵀd along the update just taken
        optiscope/curvature_along_gradient      the same along the gradient
        optiscope/hessian_trace                 tr H (Hutchinson)
        optiscope/noise_scale                   B_simple = tr(Σ)/|G|²
        optiscope/<name>                        a scalar given to Monitor.step (e.g. grad_norm_before_clip)
        optiscope/warning_score                 with early_warning: the largest value/threshold of its signals since
                                                the record before (above 1: warned)
        optiscope/diverged                      1 at the step the run diverged (with optiscope/loss)
      per parameter, with per_parameter:
        optiscope/{grad_norm_after_clip,weight_norm,update_norm,u_over_w,cos_u_neg_g,eff_lr_median}/<param name>

    A value that is None (no loss given, no threshold for Lion, Adafactor's relative step) leaves its key out
    of that step's dict: loggers take numbers only. A NaN or infinite value is kept: it is what a diverging
    run shows.

    Args:
        record: a record as ``Monitor.step`` returns it (or as read from ``metrics.jsonl``), or a divergence record.
        per_parameter: False for totals only; True for every parameter's series too; a glob pattern or a list of
            them (``"*attn*"``, ``["lm_head.*", "*.0.*"]``) for the parameters whose name matches one.
        prefix: the first part of every key; letters, digits, ``_``, ``.`` and ``-``.

    Returns:
        ``{key: float}``, in the order of the table above.

    Raises:
        ValueError: ``prefix`` is not such a name, or ``per_parameter`` is not a bool, a pattern or a list of them.

    Examples:
        >>> import torch
        >>> from optiscope.monitor import Monitor, flat_metrics
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, optimizer)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> optimizer.step()
        >>> record = monitor.step(0.5)
        >>> for key, value in flat_metrics(record).items():
        ...     print(f"{key:<38} {value:.3g}")
        optiscope/loss                         0.5
        optiscope/grad_norm_after_clip/total   1.73
        optiscope/weight_norm/total            ...
        optiscope/update_norm/total            0.173
        optiscope/u_over_w/total               ...
        optiscope/lr/group0                    0.1
        >>> sorted(flat_metrics(record, per_parameter="bias"))[:2]
        ['optiscope/cos_u_neg_g/bias', 'optiscope/grad_norm_after_clip/bias']
    """
    check_prefix(prefix, "flat_metrics")
    wanted = parameter_filter(per_parameter, "flat_metrics")
    out: dict[str, Any] = {}
    if record.get("diverged"):
        out.update({"loss": record.get("loss"), "diverged": 1.0})
    else:
        out["loss"] = record.get("loss")
        out.update({f"{key}/total": record["total"][field] for field, key in TOTALS.items()})
        out.update({f"lr/group{i}": lr for i, lr in enumerate(record.get("lr", []))})
        out["tokens_per_s"] = record.get("tokens_per_s")
        out.update({key: record.get(field) for field, key in CURVATURE.items()})
        out["warning_score"] = record.get("warning_score")
        out.update(given_scalars(record))
        for name, entry in record["params"].items():
            if wanted(name):
                out.update({f"{key}/{name}": entry[field] for field, key in PER_PARAMETER.items()})
                out[f"eff_lr_median/{name}"] = entry.get("eff_lr", {}).get("median")
    return {f"{prefix}/{key}": float(value) for key, value in out.items() if is_number(value)}


def given_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars given to ``Monitor.step`` that a record holds (``monitor.step(loss, train_acc=0.8)``).

    They are the numbers at the record's top level that are neither the monitor's own fields (``loss``,
    ``grad_norm``, the curvature's, …) nor its context's (named under ``context``), in the order given.

    Args:
        record: a record as ``Monitor.step`` returns it, or as read back from ``metrics.jsonl``.

    Returns:
        ``{name: value}``, e.g. ``{"train_acc": 0.8}``; empty when none were given.
    """
    from .monitor import RECORD_FIELDS  # here, not at the top: monitor.py imports the sinks, which import this

    context = record.get("context")
    own = RECORD_FIELDS | {name for name in (context if isinstance(context, list) else ()) if isinstance(name, str)}
    return {name: value for name, value in record.items() if name not in own and is_number(value)}


def check_prefix(prefix: Any, who: str) -> None:
    """A one-line ValueError unless ``prefix`` is a name fit for every logger's keys."""
    if not isinstance(prefix, str) or not PREFIX.fullmatch(prefix):
        raise ValueError(
            f"{who}: prefix={prefix!r} must be a name of letters, digits, '_', '.' or '-' (e.g. 'optiscope')"
        )


def parameter_filter(per_parameter: Any, who: str) -> Any:
    """Which parameters' series ``per_parameter`` asks for, as a function of the name; a one-line ValueError
    unless it is a bool, a glob pattern or a list of them."""
    if isinstance(per_parameter, bool):
        return lambda name: per_parameter
    patterns = [per_parameter] if isinstance(per_parameter, str) else per_parameter
    if (
        not isinstance(patterns, Iterable)
        or not (patterns := list(patterns))
        or not all(isinstance(p, str) and p for p in patterns)
    ):
        raise ValueError(
            f"{who}: per_parameter={per_parameter!r} must be True, False, a glob pattern of parameter names "
            "(e.g. '*attn*') or a list of them"
        )
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)
