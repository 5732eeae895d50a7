"""What the multi-node tier's modules share: the local stack's nodes, and Slurm and kubectl commands
on them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from test_real_node import SLURM_CONF_CACHE, SLURM_NS, Cluster

NODES = ("gpu-real-1", "gpu-real-2", "gpu-real-3", "gpu-real-4")
CONTAINER_NODES, PARTITIONED = NODES[:2], NODES[2:]
"""Pulumi.local.yaml: pool gpu (dedicated, Slurm's alone, job steps in containers) and pool shared
(partitioned, with the model server and the two slurmctld)."""
DEDICATED = CONTAINER_NODES[0]
"""Never taken away: the tests' Slurm clients run in its slurmd pod."""
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
