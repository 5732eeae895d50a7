"""The real-node tier: the stack's pods run on a real kubelet and container runtime.

One throw-away world per session, like the e2e tier's, plus a real node:

- a private control plane (``tools/cluster.sh up none``: no KWOK, free ports, its own dir);
- a real node joined to it (``tools/node.sh up``): containerd and runc, CNI bridge, kubelet,
  kube-proxy, CoreDNS and the GPU device plugin double, with the images of ``tools/images.sh``;
- a copy of the project whose program is ``tests/node/program.py`` (the project's program plus an
  optional sbatch Job), with the ``local`` stack config and its shared directory in a temp dir.

Everything is stopped and removed at the end (``DUALSCHED_NODE_KEEP=1`` keeps it). A missing
tool or a node that does not start is a FAILURE with the command that fixes it, never a skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node_support import NodeWorld, node_world_running, one_node_config  # (puts tests/e2e on the path)
from e2e_support import TIMINGS


@pytest.fixture(scope="session")
def node_world(tmp_path_factory) -> NodeWorld:
    with node_world_running(tmp_path_factory.mktemp("node"), one_node_config(), None, "DUALSCHED_NODE_KEEP") as world:
        yield world


FIRST_MODULES = ("test_newer_slurm_node", "test_node_taints")
"""The modules that run without the local stack, first, in this order: the Slurm 26.05 stack in its place, then
the node keeper's own stack, which a running local stack's keeper would fight over the node. No local stack is
torn down and deployed again around them."""


def pytest_collection_modifyitems(items):
    """This tier's items with FIRST_MODULES' first, in the places they were collected in: the other tiers' items
    stay where they are."""
    here = Path(__file__).parent
    slots = [k for k, item in enumerate(items) if item.path.parent == here]
    first = {name: rank for rank, name in enumerate(FIRST_MODULES)}
    ordered = sorted((items[k] for k in slots), key=lambda item: first.get(item.path.stem, len(first)))  # stable
    for k, item in zip(slots, ordered):
        items[k] = item


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("node tier timings")
        for what, seconds in TIMINGS:
            terminalreporter.write_line(f"{seconds:7.1f} s  {what}")
