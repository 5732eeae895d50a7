"""Tenants apart in what slurmctld shows (PrivateData in slurm.conf): a user sees their own jobs, never
another user's; root sees every job. The job is the tier's job user's; the other user is another account
of this machine (Debian's daemon). The same in accounting (slurmdbd.conf, with accounts):
tests/slurm/test_preemption.py."""

from __future__ import annotations

import pytest

from harness import JOB_USER, LocalCluster

pytestmark = pytest.mark.slurm

OTHER_USER = "daemon"
LISTING = ("squeue", "--noheader", "--format=%i %u")


def as_user(cluster: LocalCluster, user: str, *command: str) -> str:
    return cluster.run("runuser", "-u", user, "--", *command)


def test_a_user_sees_their_own_jobs_and_not_another_users(cluster):
    job = cluster.sbatch("--partition=gpu", "--mem=64M", "--time=5", script=cluster.held_script())
    try:
        cluster.wait_for_job(job, "RUNNING")
        assert f"{job} {JOB_USER}" in cluster.run(*LISTING).splitlines()
        assert f"{job} {JOB_USER}" in as_user(cluster, JOB_USER, *LISTING).splitlines()
        assert as_user(cluster, OTHER_USER, *LISTING).strip() == ""
    finally:
        cluster.release(job)
    cluster.wait_for_job(job, "COMPLETED")
