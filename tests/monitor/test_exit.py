"""Distributed jobs written as the torchrun guide shows them end without an abort: the guide's DDP and FSDP
scripts, and FSDP1 with either ``use_orig_params``, as real 2-process gloo jobs (``exit_jobs``), 5 in all
(``benchmarks/monitor_exit.py`` runs 40 of each two at a time, beside the same jobs without the monitor, which
torch's own collectives make abort now and then; see ``optiscope.collectives``)."""

import json

import pytest

from exit_jobs import guide_scripts, run_job

SCRIPTS = guide_scripts()
#: FSDP1 twice: the case that aborted in CI, when gloo could still hold the monitor's last reduction at shutdown
JOBS = [*SCRIPTS, "FSDP1"]


@pytest.mark.parametrize("name", JOBS, ids=[f"{name}-{i}" for i, name in enumerate(JOBS)])
def test_a_job_as_the_guide_writes_it_ends_cleanly_on_every_rank(name, tmp_path):
    job = run_job(SCRIPTS[name], tmp_path)
    assert job.codes == (0, 0) and not job.aborted, job.outputs
    assert all(f"rank {rank}: step 30, loss 0.6130" in out for rank, out in enumerate(job.outputs)), job.outputs
    written = (tmp_path / ("ddp-run" if name == "DDP" else "fsdp-run") / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in written] == [1, 10, 20, 30]  # rank 0's records, once each
