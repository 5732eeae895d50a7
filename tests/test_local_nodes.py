"""tools/local_nodes.py: `make up NODES=N` fits the local stack to the nodes that run."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dualsched.config import parse_stack_config
from tools.local_nodes import fit_to_nodes
LOCAL = yaml.safe_load((Path(__file__).resolve().parents[1] / "Pulumi.local.yaml").read_text())["config"]


def fitted(count: int):
    config = fit_to_nodes(copy.deepcopy(LOCAL), count)
    return parse_stack_config({k.removeprefix("dualsched:"): v for k, v in config.items()}, "Pulumi.local.yaml")


def test_four_nodes_are_the_checked_in_stack():
    assert fit_to_nodes(copy.deepcopy(LOCAL), 4) == LOCAL


def test_the_last_two_nodes_are_the_shared_pools_and_the_others_the_dedicated_pools():
    config = fitted(5)
    pools = {pool.name: pool.node_names for pool in config.pools}
    assert pools == {"gpu": ["gpu-real-1", "gpu-real-2", "gpu-real-3"], "shared": ["gpu-real-4", "gpu-real-5"]}
    assert [str(c) for c in config.network.node_cidrs] == ["10.250.0.0/24", *(f"10.244.{k}.1/32" for k in range(1, 6))]


@pytest.mark.parametrize("count", [1, 2])
def test_one_or_two_nodes_keep_only_the_shared_pool_in_every_partition(count):
    config = fitted(count)
    assert [(pool.name, pool.node_names) for pool in config.pools] == [("shared", [f"gpu-real-{k}" for k in range(1, count + 1)])]
    assert all(partition.pools == ("shared",) or list(partition.pools) == ["shared"] for partition in config.slurm.partitions)


@pytest.mark.parametrize("count", [0, 100])
def test_a_count_out_of_range_is_refused(count):
    with pytest.raises(ValueError, match=rf"1 to 99 nodes \(got {count}\)"):
        fit_to_nodes(copy.deepcopy(LOCAL), count)
