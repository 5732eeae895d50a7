"""Scenario 6: the library is the gate in front of Slurm.

A config it rejects never reaches Slurm: ConfigError is raised before anything is
rendered, and the running cluster keeps its files and partitions. A config it
accepts starts slurmctld: the dev and prod stacks, rendered for this machine's
Site (loopback ports, local paths, unreachable addresses for their nodes), each
run by a real slurmctld that answers and reports the stack's partitions and GRES.
"""

import pytest

from dualsched.config.loader import ConfigError, parse_stack_config
from dualsched.config.models import NodePool, StackConfig
from harness import DaemonDied, expected_gres, expected_partition_gres, expected_partition_nodes, on_installed_slurm

pytestmark = pytest.mark.slurm


def _pool_for_kubernetes_only(raw):
    raw["pools"][0]["mode"] = "kubernetes"
    raw["pools"][0].pop("gpuType", None)


def _partition_over_missing_pool(raw):
    raw["slurm"]["partitions"][0]["pools"] = ["gpu", "no-such-pool"]


def _more_slurm_gpus_than_the_node_has(raw):
    raw["pools"][0].update(mode="partitioned", slurmGpus=3)


def _partition_name_slurm_cannot_parse(raw):
    raw["slurm"]["partitions"][0]["name"] = "gpu nodes"


def _bad_hostlist(raw):
    raw["pools"][0]["nodes"] = "node-[2-1"


def _two_default_partitions(raw):
    raw["slurm"]["partitions"][1]["default"] = True


@pytest.mark.parametrize(
    "break_config",
    [
        _pool_for_kubernetes_only,
        _partition_over_missing_pool,
        _more_slurm_gpus_than_the_node_has,
        _partition_name_slurm_cannot_parse,
        _bad_hostlist,
        _two_default_partitions,
    ],
)
def test_a_config_the_library_rejects_never_reaches_slurm(cluster, local_raw, break_config):
    before = {name: (cluster.etc / name).read_text() for name in ("slurm.conf", "gres.conf", "cgroup.conf")}
    partitions = cluster.partition_node_counts()
    break_config(local_raw)

    with pytest.raises(ConfigError):
        cluster.apply(local_raw)

    assert {name: (cluster.etc / name).read_text() for name in before} == before
    assert cluster.controller_up()
    assert cluster.partition_node_counts() == partitions


def test_what_the_gate_prevents_slurmctld_refuses_a_partition_without_slurm_nodes(cluster, local_raw):
    """The first rejected config above, let past the library's cross-field checks."""
    local_raw["slurm"]["clusterName"] = "unchecked"  # not the running cluster's accounting
    valid = parse_stack_config(local_raw)
    _pool_for_kubernetes_only(local_raw)
    with pytest.raises(ConfigError, match="runs no slurmd"):
        parse_stack_config(local_raw)

    # StackConfig always runs the checks: only model_construct, pydantic's explicit bypass, skips them.
    pools = tuple(NodePool.model_validate(pool) for pool in local_raw["pools"])  # field rules only
    unchecked = StackConfig.model_construct(**{**dict(valid), "pools": pools})
    controller = cluster.controller_for(unchecked)
    try:
        with pytest.raises(DaemonDied, match="fatal: Invalid node names in partition gpu"):
            controller.start()
    finally:
        controller.stop()


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_each_stack_the_library_accepts_starts_slurmctld(cluster, stack, request):
    """The stack's partitions, pools and GRES, rendered for this machine's Slurm release."""
    raw = on_installed_slurm(request.getfixturevalue(f"{stack}_raw"))
    config = parse_stack_config(raw, f"Pulumi.{stack}.yaml")
    controller = cluster.controller_for(config).start()
    try:
        assert controller.controller_up()
        assert controller.partition_node_counts() == expected_partition_nodes(config)
        assert controller.partition_gres() == expected_partition_gres(config)
        nodes = controller.nodes()
        assert len(nodes) == sum(len(pool.node_names) for pool in config.slurm_pools)
        for pool in config.slurm_pools:
            for name in pool.node_names:
                assert nodes[name]["Gres"] == expected_gres(config, pool.name), name
    finally:
        controller.stop()
