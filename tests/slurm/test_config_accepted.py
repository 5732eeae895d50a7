"""Scenario 1: the rendered configuration is accepted by real Slurm daemons.

slurmctld starts on the library's slurm.conf, the configless slurmd registers
with the GPUs gres.conf lists, and what Slurm reports is what the config says:
every partition with its node count and GRES, every GPU node with Gres=gpu:...
(a node whose GPUs were not found would be drained or show Gres=(null)).
"""

import pytest

from harness import expected_gres, expected_partition_gres, expected_partition_nodes

pytestmark = pytest.mark.slurm


def test_sinfo_shows_every_partition_with_its_configured_node_count(cluster):
    assert cluster.partition_node_counts() == expected_partition_nodes(cluster.config)


def test_sinfo_shows_each_partitions_gres(cluster):
    assert cluster.partition_gres() == expected_partition_gres(cluster.config)
    assert cluster.partition_gres()["gpu"] == {"gpu:sim:2"}


def test_every_node_reports_its_pools_gres(cluster):
    nodes = cluster.nodes()
    for pool in cluster.config.slurm_pools:
        for name in pool.node_names:
            assert nodes[name]["Gres"] == expected_gres(cluster.config, pool.name), name
    assert nodes["node-1"]["Gres"] == "gpu:sim:2"


def test_the_local_gpu_node_registered_with_all_its_gpus(cluster):
    node = cluster.node(cluster.local_node)
    # IDLE, not DRAIN: slurmd found as many GPUs in gres.conf as the node line configures.
    assert node["State"] == "IDLE"
    assert "gres/gpu=2" in node["CfgTRES"].split(",")
    assert node["NodeAddr"] == "127.0.0.1"


def test_nodes_without_a_slurmd_are_not_schedulable(cluster):
    nodes = cluster.nodes()
    for name in ("node-2", "cpu-1", "cpu-2", "cpu-3"):
        assert nodes[name]["State"].startswith(("UNKNOWN", "DOWN")), (name, nodes[name]["State"])


def test_slurmd_runs_configless_on_the_controllers_files(cluster):
    """slurmd read no local file: it fetched the rendered ones from slurmctld."""
    cache = cluster.slurmd_config_cache
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        assert (cache / name).read_text() == (cluster.etc / name).read_text(), name
