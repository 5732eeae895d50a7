"""The real-Slurm tier: one local cluster for the whole session (see harness.py).

Run it alone with ``pytest -m slurm tests/slurm`` after ``scripts/install-slurm.sh``,
as root. Where the tools are missing it is skipped, except under CI (``CI`` set),
where a missing Slurm is a failure, not a skip.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Iterator, Optional

import pytest

from dualsched.config.loader import parse_stack_config
from harness import WAIT, LocalCluster, missing_tools, on_installed_slurm, wait_until

LOCAL_NODE = "node-1"
"""The node this machine's slurmd runs as: the first node of the first pool."""

LOCAL_STACK: dict[str, Any] = on_installed_slurm({
    "environment": "dev",
    "slurm": {
        "clusterName": "local",
        "partitions": [
            {"name": "gpu", "pools": ["gpu"], "default": True, "maxTime": "1:00:00"},
            {"name": "cpu", "pools": ["cpu"], "maxTime": "1:00:00"},
        ],
        "accounting": {"enabled": True, "database": {"mode": "in-cluster"}},
    },
    "pools": [
        # node-1 is this machine (at most 2 CPUs, a CI runner's); node-2 has no slurmd.
        {
            "name": "gpu",
            "nodes": "node-[1-2]",
            "mode": "dedicated",
            "gpusPerNode": 2,
            "gpuType": "sim",
            "cpus": min(2, os.cpu_count() or 1),
            "realMemoryMb": 3000,
            "allocatable": {"cpus": 4, "memoryMb": 8192},
        },
        # A pool without GPUs and without slurmd: a partition whose nodes are all down.
        {"name": "cpu", "nodes": "cpu-[1-3]", "gpusPerNode": 0, "cpus": 2, "realMemoryMb": 3000,
         "allocatable": {"cpus": 4, "memoryMb": 8192}},
    ],
    "storage": {"type": "nfs", "nfs": {"server": "nfs.local", "path": "/export/shared"}},
    "network": {"nodeCidrs": ["127.0.0.0/8"]},  # NetworkPolicies are not rendered here; the field is required
    "inference": {"enabled": False},
})

_session_cluster: Optional[LocalCluster] = None


def _prerequisites() -> Optional[str]:
    if os.geteuid() != 0:
        return "the real-Slurm tier runs munged, MariaDB and the Slurm daemons as root"
    missing = missing_tools()
    if missing:
        return f"not installed: {', '.join(missing)} (run scripts/install-slurm.sh)"
    return None


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    global _session_cluster
    problem = _prerequisites()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    cluster = LocalCluster(parse_stack_config(LOCAL_STACK, "tests/slurm LOCAL_STACK"), LOCAL_NODE)
    try:
        _session_cluster = cluster.start()
        yield cluster
    finally:
        _session_cluster = None
        cluster.stop()


@pytest.fixture
def cluster(local_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The session's cluster, whole again and quiet: every daemon up, no job running, node idle."""
    for name, start in (
        ("slurmdbd", local_cluster.start_slurmdbd),
        ("slurmctld", local_cluster.start_slurmctld),
        ("slurmd", local_cluster.start_slurmd),
    ):
        daemon = local_cluster.daemons.get(name)
        if daemon is None or not daemon.alive():  # an earlier test stopped it, or it died
            local_cluster.daemons.pop(name, None)
            start()
    wait_until("earlier tests' jobs to finish", lambda: not local_cluster.active_job_ids(), WAIT)
    local_cluster.wait_for_node_state(LOCAL_NODE, "IDLE")
    yield local_cluster
    # A failed test may leave held jobs behind: let them finish.
    local_cluster.release_all()


@pytest.fixture
def local_raw() -> dict[str, Any]:
    """A fresh copy of the local cluster's stack config, to change."""
    return copy.deepcopy(LOCAL_STACK)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _session_cluster is not None:
        report.sections.append(("Slurm daemon logs (tails)", _session_cluster.log_tail()))
