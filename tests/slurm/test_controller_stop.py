"""slurmctld stopped the way the kubelet stops its pod, its preStop hook and then SIGTERM, while a job runs: once
the job ends, accounting records it as its user's, in its partition (components/programs/accounting_before_stop.sh).

Without the hook, Slurm before 24.11 recorded such a job as root's with no partition in 8 stops of 10
here: its start had not reached slurmdbd when slurmctld stopped. Several stops make that failure show."""

import subprocess
from pathlib import Path

import pytest

from harness import JOB_USER, wait_until

pytestmark = pytest.mark.slurm

HOOK = Path(__file__).resolve().parents[2] / "components" / "programs" / "accounting_before_stop.sh"
STOPS = 5


def test_a_job_running_when_slurmctld_stops_is_recorded_as_its_users_in_its_partition(cluster):
    for _ in range(STOPS):
        job_id = cluster.sbatch("--partition=gpu", "--mem=100M", "--time=5", script=cluster.held_script())
        cluster.wait_for_job(job_id, "RUNNING")
        cluster.run("sh", str(HOOK), "20", timeout=40)
        cluster.stop_daemon("slurmctld")
        cluster.start_slurmctld()
        cluster.release(job_id)
        cluster.wait_for_job(job_id, "COMPLETED")
        record = wait_until(f"sacct to record job {job_id} as COMPLETED",
                            lambda: (rows := cluster.sacct(job_id)) and rows[0]["State"] == "COMPLETED" and rows[0])  # fmt: skip
        assert (record["User"], record["Partition"]) == (JOB_USER, "gpu"), record


def test_the_hook_lets_slurmctld_stop_at_once_when_no_job_is_tracked(cluster):
    wait_until("no job tracked", lambda: not cluster.active_job_ids())
    assert cluster.run("sh", str(HOOK), "20", timeout=10) == ""


def test_with_slurmdbd_down_the_hook_waits_its_limit_then_lets_slurmctld_stop_and_names_the_jobs(cluster):
    cluster.stop_daemon("slurmdbd")
    job_id = cluster.sbatch("--partition=gpu", "--mem=100M", "--time=5", script=cluster.held_script())
    cluster.wait_for_job(job_id, "RUNNING")
    hook = subprocess.run(["sh", str(HOOK), "3"], env=cluster.env, capture_output=True, text=True, timeout=30)
    assert hook.returncode == 0 and f"slurmdbd has a record of job(s) {job_id}" in hook.stderr, hook
    cluster.release(job_id)
