"""The real multi-node tier: the local stack on three real nodes, one shared world for the tier.

- a private control plane (``tools/cluster.sh up none``: free ports, its own dir);
- three real nodes joined to it (``DUALSCHED_NODES=3 tools/node.sh up``): gpu-real-1..3, each a
  kubelet, containerd, CNI bridge, kube-proxy, CoreDNS, NetworkPolicy controller and GPU device
  plugin double in network, mount and UTS namespaces of its own, linked through a bridge;
- the checkout's ``local`` stack deployed once on them (pool gpu: gpu-real-1 and 2, dedicated; pool
  shared: gpu-real-3, partitioned, beside the model server), its hostPath shared directory one
  directory of this machine that every node sees at the same path.

The tests act on that one deployment in file order. It is stopped and removed when the tier ends
(``DUALSCHED_MULTINODE_KEEP=1`` keeps it), before the one-node tier (tests/node) starts its own:
real nodes are one set per machine. Any other set running (``make up``'s) is stopped first, and the
tier says so. A missing tool or a node that does not start is a FAILURE, never a skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from node_support import NodeWorld, node_world_running  # noqa: E402  (puts tests/e2e on the path)
from e2e_support import raw_config  # noqa: E402

NODE_COUNT = 3
"""The local stack's nodes (Pulumi.local.yaml: gpu-real-[1-2] and gpu-real-3)."""


@pytest.fixture(scope="package")
def nodes_world(tmp_path_factory) -> NodeWorld:
    with node_world_running(tmp_path_factory.mktemp("multinode"), raw_config("local"), NODE_COUNT,
                            "DUALSCHED_MULTINODE_KEEP") as world:  # fmt: skip
        yield world



def pytest_terminal_summary(terminalreporter):
    """This tier's figures: node start, deploy, failover."""
    from e2e_support import TIMINGS

    mine = [(what, seconds) for what, seconds in TIMINGS if what.startswith("multi-node")]
    if mine:
        terminalreporter.section("multi-node tier timings")
        for what, seconds in mine:
            terminalreporter.write_line(f"{seconds:7.1f} s  {what}")
