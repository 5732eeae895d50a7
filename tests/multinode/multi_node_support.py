"""What the multi-node tier's modules share: the local stack's nodes, and Slurm and kubectl commands
on them."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, Callable, Optional

from e2e_support import TIMINGS
from test_real_node import SLURM_CONF_CACHE, SLURM_NS, Cluster, quietly, wait_until

NODES = ("gpu-real-1", "gpu-real-2", "gpu-real-3", "gpu-real-4")
CONTAINER_NODES, PARTITIONED = NODES[:2], NODES[2:]
"""Pulumi.local.yaml: pool gpu (dedicated, Slurm's alone, job steps in containers) and pool shared
(partitioned, with the model server and the two slurmctld)."""
DEDICATED = CONTAINER_NODES[0]
"""Never taken away: the tests' Slurm clients run in its slurmd pod."""
POOL_MEMBER = CONTAINER_NODES[1]
"""Leaves pool gpu and joins it again while a job runs on DEDICATED."""
TWO_NODES = (NODES[1], NODES[2])
"""A job on two nodes of the one partition, across both pools."""
NODE_ADDRESSES = {node: f"10.250.0.{11 + k}" for k, node in enumerate(NODES)}
"""tools/node.sh: node K's address on the link bridge."""
BRIDGE_ADDRESSES = {node: f"10.244.{1 + k}.1" for k, node in enumerate(NODES)}
"""Each node's CNI bridge: host-network traffic to a pod on the same node comes from it."""


class Nodes(Cluster):
    """The deployed stack, with a slurmd pod per node."""

    def slurmd_pods(self) -> list[dict]:
        return [p for p in self.pods(SLURM_NS)
                if p["metadata"]["labels"].get("app.kubernetes.io/name") == "slurmd" and p["metadata"].get("deletionTimestamp") is None]  # fmt: skip

    def slurmd_pod_on(self, node: str) -> str:
        [pod] = [p["metadata"]["name"] for p in self.slurmd_pods() if p["spec"].get("nodeName") == node]
        return pod

    def as_user(self, node: str, user: str, *command: str) -> str:
        """A Slurm client command as ``user`` in the slurmd pod of ``node`` (its conf-cache is a client config)."""
        return self.exec(SLURM_NS, self.slurmd_pod_on(node), "slurmd",
                         "env", f"SLURM_CONF={SLURM_CONF_CACHE}", "runuser", "-u", user, "--", *command)  # fmt: skip

    def node_states(self) -> dict[str, str]:
        out = self.slurm("sinfo", "--noheader", "--Node", "--format=%N %T")
        return dict(line.split() for line in out.splitlines() if line.strip())


def completed(nodes: Nodes, job_id: int) -> Optional[dict[str, str]]:
    """The job's sacct record once it is COMPLETED."""
    record = nodes.sacct(job_id)
    return record if record and record["State"] == "COMPLETED" else None


def held(name: str) -> str:
    """A job script that runs until the test releases it (``release``): a job lasts as long as a flow needs it
    to, not a number of seconds guessed for a loaded machine. The release file is on the shared file system
    (/shared in every slurmd pod), where this machine writes it."""
    return f"--wrap=until [ -e /shared/.release-{name} ]; do sleep 1; done"


def release(nodes: Nodes, name: str) -> None:
    Path(nodes.world.shared, f".release-{name}").touch()


def controller_state(nodes: Nodes) -> Path:
    """slurmctld's StateSaveLocation as this machine sees it: the host directory of the claim's volume
    (tools/cluster.sh's volumes, one directory every node sees, made root's with mode 0777)."""
    [claim] = [c for c in nodes.world.kget("pvc", "-n", SLURM_NS)["items"] if "-slurmctld-state-" in c["metadata"]["name"]]
    volume = nodes.world.kget("pv", claim["spec"]["volumeName"])
    return Path(volume["spec"]["hostPath"]["path"])


def controllers(nodes: Nodes) -> dict[str, tuple[str, int]]:
    """Each slurmctld pod's uid and its slurmctld container's restarts: what a controller restart changes."""
    pods = [p for p in nodes.pods(SLURM_NS) if p["metadata"]["name"].startswith("slurmctld-") and p["metadata"].get("deletionTimestamp") is None]
    return {p["metadata"]["name"]: (p["metadata"]["uid"], next(s["restartCount"] for s in p["status"]["containerStatuses"] if s["name"] == "slurmctld"))
            for p in pods}  # fmt: skip


def without_pool_member(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with POOL_MEMBER out of pool gpu (Pulumi.local.yaml: gpu-real-[1-2])."""
    smaller = copy.deepcopy(config)
    [pool] = [p for p in smaller["pools"] if p["name"] == "gpu"]
    assert pool["nodes"] == "gpu-real-[1-2]", pool
    pool["nodes"] = DEDICATED
    return smaller


def a_node_leaves_and_joins_its_pool_while_a_job_runs(
    nodes: Nodes, deploy: Callable[[dict[str, Any]], None], config: dict[str, Any], slurm_release: str, controller_restarts: bool
) -> None:
    """`pulumi up` without POOL_MEMBER in its pool, then with it again, while a job runs on DEDICATED: the node leaves
    Slurm, comes back and runs a job; the running job completes, and the controllers restarted or not as the
    release needs (components/slurm_files.py, restart_keys)."""
    name = f"pool-change-{slurm_release}"
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", "--partition=gpu", f"--nodelist={DEDICATED}",
                               "--mem=64M", "--output=/dev/null", held(name)).strip().split(";")[0])  # fmt: skip
    wait_until(f"job {job_id} to run", lambda: nodes.job_state(job_id) == "RUNNING", timeout=120)
    before = controllers(nodes)

    deploy(without_pool_member(config))
    wait_until(f"{POOL_MEMBER} to leave Slurm", lambda: (states := quietly(nodes.node_states)) and POOL_MEMBER not in states, timeout=240)
    assert nodes.job_state(job_id) == "RUNNING"

    deploy(config)
    start = time.monotonic()
    wait_until(f"{POOL_MEMBER} idle in Slurm again", lambda: (states := quietly(nodes.node_states)) and states.get(POOL_MEMBER) == "idle",
               timeout=300)  # fmt: skip
    TIMINGS.append((f"multi-node: a node back in its pool is idle in Slurm {slurm_release}, from the end of `pulumi up`",
                    time.monotonic() - start))  # fmt: skip
    ran = nodes.as_user(DEDICATED, "alice", "srun", "--partition=gpu", f"--nodelist={POOL_MEMBER}", "--mem=64M", "--time=2", "hostname")
    assert ran.strip() == POOL_MEMBER

    release(nodes, name)
    wait_until(f"job {job_id} COMPLETED in sacct", lambda: completed(nodes, job_id), timeout=180)
    after = controllers(nodes)
    if controller_restarts:
        assert after.keys() == before.keys() and all(after[pod][0] != before[pod][0] for pod in before), (before, after)
    else:
        assert after == before
