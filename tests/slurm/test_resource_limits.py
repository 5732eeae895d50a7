"""A pool's RDMA fabric on real Slurm: jobs keep slurmd's locked-memory limit, not the submitter's.

RDMA (NCCL over InfiniBand or RoCE, MPI) registers memory that must stay locked. On Kubernetes the slurmd
container lifts its own limit before it starts (`ulimit -l unlimited`, with CAP_SYS_RESOURCE: components
/compute.py); here slurmd is this machine's process, with this machine's limit (8 MiB: root here lacks
CAP_SYS_RESOURCE, so the test cannot lift it further). The submitter's shell has the 64 KiB limit of a
login pod. slurmstepd applies the limits sbatch propagated unless slurm.conf excepts them
(src/slurmd/slurmstepd/ulimits.c, _set_limit), and the rendered slurm.conf excepts MEMLOCK exactly when
a pool has a fabric.

What this does not prove: an RDMA device (none here), NCCL reading /etc/nccl.conf, or the slurmd pod's own
`ulimit -l unlimited` under a container runtime (the unit tier checks the pod spec; no real node here has
RDMA)."""

from __future__ import annotations

import copy
import resource

import pytest

from harness import LocalCluster, wait_until

pytestmark = pytest.mark.slurm

SUBMITTER_MEMLOCK = 64 * 1024
"""A login shell's usual locked-memory limit, in bytes (`ulimit -l` prints KiB: 64)."""
FABRIC = {"rdmaResource": "rdma/rdma_shared_device_a", "nccl": {"NCCL_IB_HCA": "mlx5"}}


def _locked_memory_of_a_job(cluster: LocalCluster) -> str:
    """What `ulimit -l` says in a job submitted from a shell limited to 64 KiB."""
    launcher = ("prlimit", f"--memlock={SUBMITTER_MEMLOCK}:{SUBMITTER_MEMLOCK}")
    job = cluster.sbatch("--partition=gpu", "--mem=64M", "--time=5", script="ulimit -l\n", launcher=launcher)
    cluster.wait_for_job(job, "COMPLETED")
    return cluster.job_output(job).strip()


@pytest.fixture
def slurmds_limit(cluster) -> str:
    """slurmd's own locked-memory limit as `ulimit -l` prints it, above the submitter's."""
    soft, _ = resource.prlimit(cluster.daemons["slurmd"].pid, resource.RLIMIT_MEMLOCK)
    assert soft == resource.RLIM_INFINITY or soft > SUBMITTER_MEMLOCK, "slurmd's limit is no higher than the submitter's"
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft // 1024)


def test_without_a_fabric_a_job_gets_the_submitters_locked_memory_limit(cluster, slurmds_limit):
    assert _locked_memory_of_a_job(cluster) == "64"


def test_with_a_fabric_a_job_keeps_slurmds_locked_memory_limit(cluster, slurmds_limit, local_raw):
    with_fabric = copy.deepcopy(local_raw)
    with_fabric["pools"][0]["fabric"] = FABRIC
    try:
        cluster.apply(with_fabric)  # validate, render, scontrol reconfigure: slurmd fetches the new slurm.conf
        assert "PropagateResourceLimitsExcept=MEMLOCK" in (cluster.etc / "slurm.conf").read_text()
        wait_until("slurmd to fetch the slurm.conf with the fabric",
                   lambda: "PropagateResourceLimitsExcept=MEMLOCK" in (cluster.slurmd_config_cache / "slurm.conf").read_text())  # fmt: skip
        assert _locked_memory_of_a_job(cluster) == slurmds_limit
    finally:
        cluster.apply(local_raw)
        wait_until("slurmd to fetch the slurm.conf without it",
                   lambda: "PropagateResourceLimitsExcept" not in (cluster.slurmd_config_cache / "slurm.conf").read_text())  # fmt: skip
