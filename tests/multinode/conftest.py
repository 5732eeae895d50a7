"""The real multi-node tier: the local stack on four real nodes, one shared world for the tier.

- a private control plane (``tools/cluster.sh up none``: free ports, its own dir);
- four real nodes joined to it (``DUALSCHED_NODES=4 tools/node.sh up``): gpu-real-1..4, each a
  kubelet, containerd, CNI bridge, kube-proxy, CoreDNS, NetworkPolicy controller and GPU device
  plugin double in network, mount and UTS namespaces of its own, linked through a bridge;
- the checkout's ``local`` stack deployed once on them (pool gpu: gpu-real-1 and 2, dedicated, job
  steps in containers; pool shared: gpu-real-3 and 4, partitioned, with the model server and the two
  slurmctld), its hostPath shared directory one directory of this machine that every node sees at
  the same path.

The modules act on that one deployment, in the order an operator would check a new cluster
(MODULE_ORDER): nodes and jobs across them, a node moving to another pool and back, the seed's
training job, a slurmd rollout through the nodes, the loss of the primary controller's node, then the same
stack on Slurm 24.11 in its place. It is stopped and removed when the tier ends
(``DUALSCHED_MULTINODE_KEEP=1`` keeps it). Namespaced real nodes are one set per machine: any other
set running (``make up``'s) is stopped first, and the tier says so; the one-node tier's node (this
machine itself, tests/node) runs beside them (`make test` runs both tiers at once). A missing tool or
a node that does not start is a FAILURE, never a skip.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from node_support import NodeWorld, local_config, node_world_running  # noqa: E402  (puts tests/e2e on the path)
from e2e_support import TIMINGS, raw_config  # noqa: E402
from test_real_node import INFERENCE_NS, SLURM_NS, all_ready, up, wait_until  # noqa: E402

from .multi_node_support import NODES, Nodes, kubelet_directories_not_their_own  # noqa: E402

NODE_COUNT = len(NODES)
"""The local stack's nodes (Pulumi.local.yaml: gpu-real-1, and gpu-real-[2-3])."""
MODULE_ORDER = (
    "test_multi_node", "test_pool_changes_across_nodes", "test_training_across_nodes", "test_slurmd_rollout_across_nodes", "test_controller_failover",
    "test_slurm_24_11_across_nodes",
)
"""Failover after the flows that want every node (it takes a node away and brings it back); Slurm 24.11 last: it
replaces the local stack with a stack of its own."""


def pytest_collection_modifyitems(items):
    """This tier's items in MODULE_ORDER, in the places they were collected in: the other tiers' items stay
    where they are."""
    here = Path(__file__).parent
    slots = [k for k, item in enumerate(items) if item.path.parent == here]
    ordered = sorted((items[k] for k in slots), key=lambda item: MODULE_ORDER.index(item.path.stem))
    for k, item in zip(slots, ordered):
        items[k] = item


@pytest.fixture(scope="package")
def nodes_world(tmp_path_factory) -> NodeWorld:
    with node_world_running(tmp_path_factory.mktemp("multinode"), raw_config("local"), NODE_COUNT,
                            "DUALSCHED_MULTINODE_KEEP") as world:  # fmt: skip
        yield world


@pytest.fixture(scope="module", autouse=True)
def every_kubelet_keeps_its_own_directory(nodes_world: NodeWorld):
    """Checked before and after each module: the one-node tier's node starts and stops beside this tier."""
    def check(when: str) -> None:
        strays = kubelet_directories_not_their_own(nodes_world.cluster_dir)
        assert strays == [], f"{when} this module, the kubelets of {strays} no longer see their own directory at /var/lib/kubelet"

    check("before")
    yield
    check("after")


@pytest.fixture(scope="package")
def nodes(nodes_world: NodeWorld) -> Nodes:
    """The checkout's local stack, deployed once for the tier: every pod Ready and every node idle."""
    start = time.monotonic()
    up(nodes_world, local_config(nodes_world, raw_config("local")))
    cluster = Nodes(nodes_world)
    for namespace in (SLURM_NS, INFERENCE_NS):
        wait_until(f"every pod in {namespace} Ready", lambda: all_ready(cluster.pods(namespace)), timeout=480)
    cluster.wait_for_slurm("every node idle in Slurm",
                           lambda: set(cluster.node_states().items()) == {(n, "idle") for n in NODES}, timeout=300, every=5)  # fmt: skip
    TIMINGS.append(("multi-node: pulumi up of local until every pod Ready and every node idle", time.monotonic() - start))
    return cluster


def pytest_terminal_summary(terminalreporter):
    """This tier's figures: node start, deploy, rollout, failover."""
    mine = [(what, seconds) for what, seconds in TIMINGS if what.startswith("multi-node")]
    if mine:
        terminalreporter.section("multi-node tier timings")
        for what, seconds in mine:
            terminalreporter.write_line(f"{seconds:7.1f} s  {what}")
