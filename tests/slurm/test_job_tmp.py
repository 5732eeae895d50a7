"""Each job's own /tmp and /dev/shm (slurm.conf JobContainerType or NamespaceType, job_container.conf, as
rendered): owned by the job's user, invisible to the machine and to every later job, gone when the job ends.
slurmd fetches job_container.conf from slurmctld (configless), as on Kubernetes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dualsched.components.compute import newer_mount_namespaces_on_every_cpu
from harness import JOB_USER, LocalCluster, wait_until
from mount_namespaces import keep_a_new_namespace_on_each_cpu

pytestmark = pytest.mark.slurm

MARK = "left-by-job"


def run_job(cluster: LocalCluster, script: str) -> tuple[int, str]:
    job = cluster.sbatch("--partition=gpu", "--mem=64M", "--time=5", script=script)
    cluster.wait_for_job(job, "COMPLETED")
    return job, cluster.job_output(job)


def test_a_jobs_tmp_is_its_users_alone_and_dev_shm_is_its_own(cluster):
    _, output = run_job(cluster, 'stat -c "%n %U %a" /tmp /dev/shm; df --output=fstype /dev/shm | tail -1')
    tmp, shm, fstype = output.splitlines()
    assert tmp == f"/tmp {JOB_USER} 700"
    assert shm.startswith("/dev/shm root ") and fstype.strip() == "tmpfs"


def test_what_a_job_leaves_in_tmp_and_dev_shm_no_later_job_and_not_the_machine_sees(cluster):
    leave = f"echo secret > /tmp/{MARK}; echo secret > /dev/shm/{MARK}\n"
    job = cluster.sbatch("--partition=gpu", "--mem=64M", "--time=5", script=leave + cluster.held_script())
    try:
        cluster.wait_for_job(job, "RUNNING")
        base = Path(cluster.site.job_tmp_dir)
        # the job's files exist, under slurmd's BasePath (once its script has run: RUNNING comes first), not in
        # the machine's /tmp or /dev/shm
        left = wait_until("the job's file under BasePath", lambda: list(base.rglob(MARK)))
        assert [path.name for path in left] == [MARK], list(base.rglob("*"))
        assert not Path(f"/tmp/{MARK}").exists() and not Path(f"/dev/shm/{MARK}").exists()
    finally:
        cluster.release(job)
    cluster.wait_for_job(job, "COMPLETED")
    _, output = run_job(cluster, f"ls -A /tmp /dev/shm; cat /tmp/{MARK} /dev/shm/{MARK} 2>&1 || true")
    assert "secret" not in output and MARK in output  # cat's "No such file" names it
    assert not list(Path(cluster.site.job_tmp_dir).rglob(MARK)), "the job's /tmp outlived it"


def test_after_the_slurmd_pods_first_step_a_namespace_made_on_any_cpu_can_be_kept(tmp_path):
    """The kernel keeps a job's namespace only if its id is larger than the keeper's (mnt_ns_loop); from Linux 6.18
    ids come from per-CPU batches. Here the pod's namespace is made on each CPU in turn, as a runtime may, so on a
    kernel that batches some other CPU lags behind it in one of the turns: without slurmd's first step that CPU
    refuses (seen on this machine's 6.18 with two CPUs); after it, every CPU keeps the namespace it made."""
    cpus = sorted(os.sched_getaffinity(0))
    every_cpu = ",".join(map(str, cpus))
    first_step = newer_mount_namespaces_on_every_cpu(str(tmp_path))
    for cpu in cpus:
        script = f"taskset -pc {every_cpu} $$ > /dev/null && {{ {first_step}; }} && {keep_a_new_namespace_on_each_cpu(str(tmp_path))}"
        result = subprocess.run(["taskset", "-c", str(cpu), "unshare", "--mount", "sh", "-c", script],
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [word for c in cpus for word in (f"cpu{c}", "kept")], (cpu, result.stdout)
