"""The e2e tier's fake nodes (KWOK, tools/cluster.sh) keep a heartbeat that a loaded machine does not outlast:
each renews its Lease in kube-node-lease every quarter of its 40 s, as a kubelet does. KWOK's status heartbeat
alone came 20-45 s apart, against the controller manager's 50 s grace: under CI's load gpu-003 and gpu-004 went
NotReady, the node lifecycle controller set their pods unready, and KWOK never set them Ready again (the second
stack's model server then had no endpoint for 600 s)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from e2e_support import World

pytestmark = pytest.mark.e2e

LEASE_SECONDS = 40  # tools/cluster.sh: DUALSCHED_KWOK_NODE_LEASE_SECONDS


def _renewals(world: World) -> dict[str, tuple[int, dt.datetime]]:
    leases: list[dict[str, Any]] = world.kget("leases", "-n", "kube-node-lease")["items"]
    return {lease["metadata"]["name"]: (lease["spec"]["leaseDurationSeconds"],
                                         dt.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00")))
            for lease in leases}  # fmt: skip


def test_every_fake_node_renews_a_lease_as_a_kubelet_does(world: World):
    names = {node["metadata"]["name"] for node in world.kget("nodes")["items"]}
    before = _renewals(world)
    time.sleep(LEASE_SECONDS / 4 + 3)
    after = _renewals(world)
    assert set(after) == names, "every node, the extra ones included, has a Lease of its own"
    assert {duration for duration, _ in after.values()} == {LEASE_SECONDS}
    stale = [name for name in names if after[name][1] <= before[name][1]]
    assert stale == [], f"Leases not renewed within {LEASE_SECONDS / 4 + 3:.0f} s"
