"""Columns for the charts, taken from monitor records (``metrics.jsonl``) and thinned for the page.

Nothing here computes a new quantity: each function picks recorded values apart by run and parameter,
drops points a chart cannot place (non-finite values; non-positive ones where the axis is logarithmic)
and keeps at most ``limit`` evenly spaced points of a long series, always with its first and last, so
that a 2000-step run's page stays small (issue 15: the default ``lm`` run's page under 5 MB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..monitor.sinks import given_scalars

#: Points kept per line and steps kept per heatmap row; enough to see every feature of a training curve.
LINE_POINTS = 400
HEATMAP_STEPS = 200
BAND_POINTS = 120
#: Significant digits kept of each plotted value (x values, steps and seconds, are kept whole).
DIGITS = 5
#: Top-level scalars of a monitor record drawn as lines when present (issue 12 adds the curvature keys).
SCALARS = ("loss", "grad_norm", "grad_norm_before_clip", "sharpness", "threshold", "sharpness/threshold")


def keep_indices(n: int, limit: int) -> list[int]:
    """At most ``limit`` (≥ 2) evenly spaced indices of ``range(n)``, the first and the last included."""
    if n <= limit:
        return list(range(n))
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def thin(xs: Sequence[Any], ys: Sequence[Any], limit: int = LINE_POINTS, positive: bool = False) -> dict[str, list]:
    """The drawable points of (xs, ys), thinned to ``limit``: ``{"x": [...], "y": [...]}``."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=False) if drawable(x) and drawable(y, positive)]
    kept = [pairs[i] for i in keep_indices(len(pairs), limit)]
    return {"x": [float(x) for x, _ in kept], "y": [shown(y) for _, y in kept]}


def shown(value: float) -> float:
    """``value`` to the significant digits a chart's hover shows (a page of long runs is mostly digits)."""
    return float(f"{value:.{DIGITS}g}")


def drawable(value: Any, positive: bool = False) -> bool:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (value > 0 or not positive)


def run_label(record: dict[str, Any], *, unnamed: str, prefix: str = "") -> str:
    """The run a record belongs to: ``prefix`` and its ``run``, or ``unnamed`` (its directory's name) when it has
    none, with its seed when it has one and the other fields of the monitor's ``context`` (named in the record's
    ``context``), e.g. "sgd lr=0.01"."""
    label = prefix + str(record["run"]) if "run" in record else unnamed
    label = f"{label} seed {record['seed']}" if "seed" in record else label
    names = record.get("context") if isinstance(record.get("context"), list) else []
    extra = [k for k in names if isinstance(k, str) and k not in ("run", "seed") and k in record]
    return " ".join([label, *(f"{k}={record[k]}" for k in extra)])


def by_run(records: Sequence[dict[str, Any]], *, unnamed: str, prefix: str = "") -> dict[str, list[dict[str, Any]]]:
    """The measured-step records of each run, in file order (divergence records left out), labelled as
    ``run_label`` says."""
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if not record.get("diverged"):
            out.setdefault(run_label(record, unnamed=unnamed, prefix=prefix), []).append(record)
    return out


def diverged(records: Sequence[dict[str, Any]], *, unnamed: str, prefix: str = "") -> set[str]:
    """The runs whose divergence record is among ``records``, labelled as ``run_label`` says."""
    return {run_label(record, unnamed=unnamed, prefix=prefix) for record in records if record.get("diverged")}


def warnings(records: Sequence[dict[str, Any]], *, unnamed: str, prefix: str = "") -> dict[str, dict[str, list]]:
    """ "<run> warnings" -> the early warnings (``Monitor(early_warning=True)``) of each run that has any, as points:
    at the step each warned, at the loss of the record that carries it (the first measured step from there)."""
    out: dict[str, dict[str, list]] = {}
    for record in records:
        found = record.get("warnings")
        if not isinstance(found, list) or not drawable(record.get("loss")):
            continue
        points = out.setdefault(f"{run_label(record, unnamed=unnamed, prefix=prefix)} warnings", {"x": [], "y": []})
        for warning in found:
            if isinstance(warning, dict) and drawable(warning.get("step")):
                points["x"].append(warning["step"])
                points["y"].append(shown(record["loss"]))
    return {label: points for label, points in out.items() if points["x"]}


def scalar(
    records: Sequence[dict[str, Any]], key: str, positive: bool = False, *, unnamed: str, prefix: str = ""
) -> dict[str, dict[str, list]]:
    """run -> the points of the top-level value ``key`` against step (runs without it left out), each run
    labelled as ``run_label`` says."""
    out = {}
    for run, rows in by_run(records, unnamed=unnamed, prefix=prefix).items():
        rows = [r for r in rows if key in r]
        if rows:
            out[run] = thin([r["step"] for r in rows], [r[key] for r in rows], positive=positive)
    return {run: points for run, points in out.items() if points["x"]}


def given_scalar_names(records: Sequence[dict[str, Any]]) -> list[str]:
    """The scalars given to ``Monitor.step`` (``monitor.step(loss, train_acc=0.8)``) that the measured-step records
    hold, in the order first met; not those drawn on charts of their own already (``SCALARS``), nor a ``run`` or
    ``seed`` that names the run."""
    names: dict[str, None] = {}
    for record in records:
        if not record.get("diverged"):
            names.update(dict.fromkeys(given_scalars(record)))
    return [name for name in names if name not in (*SCALARS, "run", "seed")]


def parameter_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every parameter named in the records, in the order the model lists them."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get("params", {})))
    return list(names)


def ratio_heatmap(rows: Sequence[dict[str, Any]], key: str = "u_over_w") -> dict[str, Any] | None:
    """One run's ``key`` per parameter × measured step, as an image: rows are parameters (model order),
    columns the kept steps; cells a chart cannot colour on a log scale are NaN."""
    rows = [r for r in rows if "params" in r]
    names = parameter_names(rows)
    if not rows or not names:
        return None
    rows = [rows[i] for i in keep_indices(len(rows), HEATMAP_STEPS)]
    image = np.full((len(names), len(rows)), np.nan, dtype=np.float32)
    for j, row in enumerate(rows):
        for i, name in enumerate(names):
            value = row["params"].get(name, {}).get(key)
            if drawable(value, positive=True):
                image[i, j] = value
    steps = [float(r["step"]) for r in rows]
    return {"image": image, "steps": steps, "params": names}


def ratio_lines(rows: Sequence[dict[str, Any]], key: str = "u_over_w") -> dict[str, dict[str, list]]:
    """parameter -> its ``key`` against step for one run (positive values: the axis is logarithmic)."""
    rows = [r for r in rows if "params" in r]
    out = {}
    for name in parameter_names(rows):
        having = [r for r in rows if name in r["params"]]
        out[name] = thin([r["step"] for r in having], [r["params"][name].get(key) for r in having], positive=True)
    return {name: points for name, points in out.items() if points["x"]}


def effective_lr_bands(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """parameter -> the step and the min / median / max of Adam's effective learning rate η/(√v̂ + ε)
    over its entries, as the monitor recorded them; empty for optimizers without second moments."""
    out: dict[str, dict[str, list]] = {}
    for name in parameter_names(rows):
        having = [r for r in rows if isinstance(r.get("params", {}).get(name, {}).get("eff_lr"), dict)]
        bands = [(r["step"], r["params"][name]["eff_lr"]) for r in having]
        bands = [(s, b) for s, b in bands if all(drawable(b.get(k), positive=True) for k in ("min", "median", "max"))]
        if bands:
            bands = [bands[i] for i in keep_indices(len(bands), BAND_POINTS)]
            out[name] = {
                "x": [float(s) for s, _ in bands],
                **{k: [shown(b[k]) for _, b in bands] for k in ("min", "median", "max")},
            }
    return out
