"""Scenario 5: a change made in the typed config (a new partition) reaches the running
cluster through `scontrol reconfigure`: slurmd is not restarted, it fetches the new
files from slurmctld (configless), and the new partition takes jobs."""

import copy

import pytest

from harness import expected_partition_nodes, wait_until

pytestmark = pytest.mark.slurm


def test_a_new_partition_is_applied_without_restarting_slurmd(cluster, local_raw):
    slurmd = cluster.daemons["slurmd"]
    started = cluster.node(cluster.local_node)["SlurmdStartTime"]
    changed = copy.deepcopy(local_raw)
    changed["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "30:00", "priorityTier": 2})

    try:
        config = cluster.apply(changed)  # validate, render, scontrol reconfigure

        wait_until("sinfo to show partition debug", lambda: "debug" in cluster.partition_node_counts())
        assert cluster.partition_node_counts() == expected_partition_nodes(config) == {"gpu": 2, "cpu": 3, "debug": 2}
        assert cluster.partition_gres()["debug"] == {"gpu:sim:2"}
        rendered = (cluster.etc / "slurm.conf").read_text()
        assert "PartitionName=debug " in rendered
        wait_until(
            "slurmd to fetch the new slurm.conf from slurmctld",
            lambda: (cluster.slurmd_config_cache / "slurm.conf").read_text() == rendered,
        )
        job = cluster.sbatch("--partition=debug", "--gres=gpu:1", "--mem=100M", "--time=5", script="echo debug\n")
        assert cluster.wait_for_job(job, "COMPLETED")["Partition"] == "debug"

        # The same slurmd process all along.
        assert slurmd.alive() and cluster.daemons["slurmd"] is slurmd
        assert cluster.node(cluster.local_node)["SlurmdStartTime"] == started
    finally:
        cluster.apply(local_raw)
        wait_until("partition debug to go away", lambda: "debug" not in cluster.partition_node_counts())
