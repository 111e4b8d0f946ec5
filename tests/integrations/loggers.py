"""Reading back what the loggers stored, each with its own library's reader: TensorBoard's event accumulator,
MLflow's tracking client, W&B's own reader of an offline run's ``.wandb`` log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every events file under ``folder`` (one run per folder)."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    events = EventMultiplexer()
    events.AddRunsFromDirectory(str(folder))
    events.Reload()
    out: dict[str, dict[int, float]] = {}
    for run, tags in events.Runs().items():
        for tag in tags["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in events.Scalars(run, tag)})
    return out


def mlflow_metrics(tracking_uri: str) -> dict[str, dict[int, float]]:
    """``{key: {step: value}}`` of the one run in the MLflow store at ``tracking_uri``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1, runs
    run = runs[0]
    return {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics}


def wandb_history(wandb_dir: Path, step_key: str = "_step") -> dict[str, dict[int, float]]:
    """``{key: {step: value}}`` of the one offline run under ``wandb_dir``, read by ``wandb leet inspect``; the
    step is each row's ``step_key`` (the 🤗 Trainer logs its own as ``train/global_step``)."""
    (run,) = Path(wandb_dir).glob("wandb/offline-run-*")
    shown = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    out: dict[str, dict[int, float]] = {}
    for line in shown.splitlines():
        record = json.loads(line)
        if record.get("type") != "history":
            continue
        item = record["history"]["item"]
        step = int(item[step_key])
        for key, value in item.items():
            if not key.startswith("_") and key != step_key:
                out.setdefault(key, {})[step] = float(value)  # "NaN", "Infinity" as JSON cannot say them
    return out
