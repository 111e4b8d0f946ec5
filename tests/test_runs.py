"""Run-directory I/O: atomic writes survive a crash mid-write; JSONL readers see whole lines only."""

import json
import math
import os

import pytest
import torch

from optiscope import runs


def test_atomic_write_keeps_old_file_when_writer_dies(tmp_path):
    target = tmp_path / "results.json"
    runs.atomic_write_json(target, {"v": 1})

    def dying_writer(f):
        f.write(b'{"v": 2, "half')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        runs._atomic_write(target, dying_writer)
    assert runs.read_json(target) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left behind


def test_json_round_trips_tensors_and_non_finite(tmp_path):
    path = runs.atomic_write_json(tmp_path / "r.json", {"t": torch.tensor([1.0, 2.0]), "loss": math.inf, "n": (1, 2)})
    back = runs.read_json(path)
    assert back["t"] == [1.0, 2.0] and back["loss"] == math.inf and back["n"] == [1, 2]


def test_jsonl_appends_and_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in range(3):
        runs.append_jsonl(path, {"step": step})
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')  # a writer killed mid-line
    assert [r["step"] for r in runs.read_jsonl(path)] == [0, 1, 2]
    runs.truncate_jsonl(path, lambda r: r["step"] < 2)
    assert path.read_text().splitlines() == [json.dumps({"step": 0}), json.dumps({"step": 1})]


def test_checkpoint_round_trip(tmp_path):
    state = {"model": {"w": torch.arange(3.0)}, "rng": torch.get_rng_state(), "step": 7}
    runs.save_checkpoint(tmp_path / "ckpt.pt", state)
    back = runs.load_checkpoint(tmp_path / "ckpt.pt")
    assert back["step"] == 7 and torch.equal(back["model"]["w"], state["model"]["w"])
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        runs.load_checkpoint(tmp_path / "missing.pt")


def test_prepare_run_dir_refuses_another_experiments_dir(tmp_path):
    runs.prepare_run_dir(tmp_path / "a", "rare-tokens", {"steps": 10})
    assert (tmp_path / "a" / "figures").is_dir()
    with pytest.raises(FileExistsError, match="holds a run of experiment 'rare-tokens'"):
        runs.prepare_run_dir(tmp_path / "a", "landscapes", {})
    with pytest.raises(ValueError, match=r"differs from the stored one in \['steps'\]"):
        runs.prepare_run_dir(tmp_path / "a", "rare-tokens", {"steps": 20}, resume=True)


def test_rank_zero_from_environment(monkeypatch):
    monkeypatch.setitem(os.environ, "RANK", "1")
    assert not runs.is_rank_zero()
    monkeypatch.setitem(os.environ, "RANK", "0")
    assert runs.is_rank_zero()
