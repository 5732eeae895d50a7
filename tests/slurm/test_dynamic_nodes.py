"""A pool whose nodes join by label, on real daemons: the node's slurmd registers itself as a dynamic node (slurmd -Z
with the pool's options, as its pod runs it), its NodeSet puts it in the partition with its GPUs and it runs jobs;
it stays through a controller restart and a new slurmd; once it left its pool in Kubernetes, cordon_drain.sh
drains it, lets its job finish and deletes it from Slurm.
The Kubernetes half (the keeper labelling the node, the watcher finding it gone) is the multi-node tier's."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dualsched.config.loader import parse_stack_config
from dualsched.config.models import StackConfig
from harness import LocalCluster, wait_until

from conftest import LOCAL_NODE

pytestmark = pytest.mark.slurm


def joining(raw: dict[str, Any]) -> dict[str, Any]:
    """The local stack with pool gpu's nodes joining by label: node-[1-2] is its bound, no node is listed."""
    changed = copy.deepcopy(raw)
    changed["pools"][0]["joinByLabel"] = True
    changed["slurm"]["healthCheck"] = {"drainCordoned": True}
    return changed


def restarted_with(cluster: LocalCluster, raw: dict[str, Any]) -> StackConfig:
    """A change of the node table on 22.05 (NodeSet, MaxNodeCount, NodeName): slurmd stopped, the files rendered,
    slurmctld restarted with its state, slurmd started again as its pod runs it."""
    cluster.stop_daemon("slurmd")
    config = parse_stack_config(raw, "tests/slurm joining pool")
    cluster.render(config)
    cluster.stop_daemon("slurmctld")
    cluster.start_slurmctld()
    cluster.start_slurmd()
    return config


def test_a_node_joins_its_pool_by_registering_runs_jobs_and_is_deleted_once_it_left(cluster: LocalCluster, local_raw):
    try:
        restarted_with(cluster, joining(local_raw))
        node = cluster.wait_for_node_state(LOCAL_NODE, "IDLE+DYNAMIC_NORM")  # a node slurmd registered, in no NodeName line
        assert (node["AvailableFeatures"], node["Gres"], node["CPUTot"]) == ("gpu", "gpu:sim:2", str(cluster.config.pool("gpu").cpus))
        assert cluster.partition_node_counts()["gpu"] == 1  # node-2, in the bound, never registered
        ran = cluster.sbatch("--partition=gpu", "--gres=gpu:2", "--mem=100M", "--time=5", script="echo joined\n")
        assert cluster.wait_for_job(ran, "COMPLETED")["NodeList"] == LOCAL_NODE

        # A controller restart (a restart key changed) keeps it from the saved state; a new slurmd pod (a rollout)
        # registers under the same name again.
        cluster.stop_daemon("slurmctld")
        cluster.start_slurmctld()
        assert cluster.wait_for_node_state(LOCAL_NODE, "IDLE+DYNAMIC_NORM")["Gres"] == "gpu:sim:2"
        cluster.stop_daemon("slurmd")
        cluster.start_slurmd()
        assert cluster.wait_for_node_state(LOCAL_NODE, "IDLE+DYNAMIC_NORM")["AvailableFeatures"] == "gpu"

        running = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", script=cluster.held_script("echo finished"))
        cluster.wait_for_job(running, "RUNNING")
        assert f"{LOCAL_NODE}: left its pool in Kubernetes, drained" in cluster.cordon_round([], left=[LOCAL_NODE])
        assert cluster.cordon_round([], left=[LOCAL_NODE]) == ""  # its job runs on: not deleted
        assert cluster.job(running)["JobState"] == "RUNNING"
        cluster.release(running)
        cluster.wait_for_job(running, "COMPLETED")
        wait_until(f"{LOCAL_NODE} deleted from Slurm",
                   lambda: "deleted from Slurm" in cluster.cordon_round([], left=[LOCAL_NODE]) or LOCAL_NODE not in cluster.nodes())  # fmt: skip
        assert LOCAL_NODE not in cluster.nodes()
        assert "gpu" not in cluster.partition_node_counts() or cluster.partition_node_counts()["gpu"] == 0
    finally:
        cluster.release_all()
        restarted_with(cluster, local_raw)
        cluster.wait_for_node_state(LOCAL_NODE, "IDLE")
