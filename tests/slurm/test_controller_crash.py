"""Scenario 3: slurmctld dies (SIGKILL) with one job running and one pending; after a
restart on the same StateSaveLocation no job is lost and the pending one runs."""

import signal
import time

import pytest

from harness import wait_until

pytestmark = pytest.mark.slurm


def test_no_job_is_lost_when_slurmctld_is_killed_and_restarted(cluster):
    # The running job holds both GPUs of the only node until released, so the second waits.
    running = cluster.sbatch("--partition=gpu", "--gres=gpu:2", "--mem=100M", "--time=5", script=cluster.held_script())
    pending = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=5", script="echo ran\n")
    cluster.wait_for_job(running, "RUNNING")
    assert cluster.job(pending)["JobState"] == "PENDING"
    # slurmctld saves its state in the background, shortly after each change; a crash
    # loses what it had not saved yet, as any crash would. Crash once the state on disk
    # is the one just seen: a job update schedules a save, wait for the file to change.
    before = time.time()
    cluster.run("scontrol", "update", f"JobId={pending}", "Comment=before-crash")
    job_state = cluster.root / "state" / "job_state"
    wait_until("slurmctld to save its job state", lambda: job_state.stat().st_mtime >= before)

    cluster.stop_daemon("slurmctld", signal.SIGKILL)
    assert not cluster.controller_up()
    cluster.start_slurmctld()

    assert {running, pending} <= cluster.queued_job_ids()
    assert cluster.job(running)["JobState"] == "RUNNING"
    assert cluster.job(pending)["JobState"] == "PENDING"
    assert cluster.job(pending)["Comment"] == "before-crash"

    cluster.release(running)
    assert cluster.wait_for_job(running, "COMPLETED")["ExitCode"] == "0:0"
    assert cluster.wait_for_job(pending, "COMPLETED")["ExitCode"] == "0:0"
    assert cluster.job_output(pending) == "ran\n"
    cluster.wait_for_accounting(running, "COMPLETED")
    cluster.wait_for_accounting(pending, "COMPLETED")
