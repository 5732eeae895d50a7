"""Scenario 4: slurmdbd is down while a job finishes; once it is back, slurmctld
delivers the record it kept, and sacct shows the job: nothing lost."""

import signal

import pytest

pytestmark = pytest.mark.slurm


def test_a_job_that_ends_while_slurmdbd_is_down_is_accounted_later(cluster):
    job = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=5", script=cluster.held_script())
    cluster.wait_for_job(job, "RUNNING")

    cluster.stop_daemon("slurmdbd", signal.SIGTERM)
    try:
        assert not cluster.accounting_up()
        cluster.release(job)
        assert cluster.wait_for_job(job, "COMPLETED")["ExitCode"] == "0:0"
        assert not cluster.accounting_up()
    finally:
        cluster.start_slurmdbd()

    record = cluster.wait_for_accounting(job, "COMPLETED")
    assert record["Partition"] == "gpu"
    assert "gres/gpu=1" in record["AllocTRES"].split(","), record
