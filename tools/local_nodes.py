"""The local stack sized to the namespaced nodes that run (`make up NODES=N`, tools/node.sh).

Pulumi.local.yaml is written for four nodes: pool gpu (gpu-real-1 and 2, dedicated, job steps in
containers) and pool shared (gpu-real-3 and 4, partitioned: the model server and the two slurmctld,
one per node). With N nodes
the last two stay the shared pool's (the last one, with one node) and the others are the gpu pool's;
the NetworkPolicies' node blocks name each node's bridge address.
tools/up.sh applies this to its generated copy of the stack file; the checkout is never written.

Usage: python tools/local_nodes.py STACK_FILE N   (rewrites STACK_FILE in place)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

LINK_NETWORK = "10.250.0.0/24"
"""tools/node.sh: the nodes' link; node K is 10.250.0.(10+K), its pods 10.244.K.0/24 behind bridge 10.244.K.1."""


def node_names(first: int, last: int) -> str:
    return f"gpu-real-{first}" if first == last else f"gpu-real-[{first}-{last}]"


def fit_to_nodes(config: dict, count: int) -> dict:
    """The ``dualsched:`` keys of the local stack for ``count`` nodes (1 to 99)."""
    if not 1 <= count <= 99:
        raise ValueError(f"the local stack runs on 1 to 99 nodes (got {count})")
    pools = {pool["name"]: pool for pool in config["dualsched:pools"]}
    first_shared = max(1, count - 1)
    pools["shared"]["nodes"] = node_names(first_shared, count)
    if first_shared > 1:
        pools["gpu"]["nodes"] = node_names(1, first_shared - 1)
    else:
        del pools["gpu"]
    config["dualsched:pools"] = list(pools.values())
    for partition in config["dualsched:slurm"]["partitions"]:
        partition["pools"] = [name for name in partition["pools"] if name in pools]
    bridges = [f"10.244.{k}.1/32" for k in range(1, count + 1)]
    config["dualsched:network"]["nodeCidrs"] = [LINK_NETWORK, *bridges]
    return config


def main(path: str, count: str) -> None:
    stack_file = Path(path)
    document = yaml.safe_load(stack_file.read_text())
    document["config"] = fit_to_nodes(document["config"], int(count))
    stack_file.write_text(yaml.safe_dump(document, sort_keys=False))


if __name__ == "__main__":
    main(*sys.argv[1:])
