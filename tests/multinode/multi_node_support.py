"""What the multi-node tier's modules share: the local stack's nodes, and Slurm and kubectl commands
on them."""

from __future__ import annotations

import copy
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

from dualsched.components.programs.slurm_exporter import expand_hostlist
from e2e_support import TIMINGS
from test_real_node import SLURM_CONF_CACHE, SLURM_NS, Cluster, quietly, wait_until

NODES = ("gpu-real-1", "gpu-real-2", "gpu-real-3", "gpu-real-4")
CONTAINER_NODES, PARTITIONED = NODES[:2], NODES[2:]
"""Pulumi.local.yaml: pool gpu (dedicated, Slurm's alone, job steps in containers) and pool shared
(partitioned, with the model server and the two slurmctld)."""
DEDICATED = CONTAINER_NODES[0]
"""Never taken away: the tests' Slurm clients run in its slurmd pod."""
POOL_MEMBER = CONTAINER_NODES[1]
"""Moves to pool shared and back while a job runs on DEDICATED."""
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


def kubelet_directories_not_their_own(cluster_dir: Path) -> list[str]:
    """The nodes whose kubelet, in their mount namespace, does not see their own directory at /var/lib/kubelet
    (tools/node.sh mounts it there): such kubelets share this machine's directory and remove each other's pod
    volumes. It happened when the one-node tier's node, beside this tier, removed that directory on its way down."""
    strays = []
    for node in NODES:
        directory = cluster_dir / "nodes" / node
        seen = subprocess.run(["nsenter", f"--mount={directory / 'ns' / 'mnt'}", "stat", "-c", "%d:%i", "/var/lib/kubelet"],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        own = (directory / "kubelet").stat()
        if seen != f"{own.st_dev}:{own.st_ino}":
            strays.append(node)
    return strays


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


def cached_nodes(nodes: Nodes, node: str) -> set[str]:
    """The nodes of the slurm.conf that ``node``'s slurmd fetched from slurmctld (configless), which its clients read."""
    conf = nodes.exec(SLURM_NS, nodes.slurmd_pod_on(node), "slurmd", "cat", SLURM_CONF_CACHE)
    return {name for hostlist in re.findall(r"^NodeName=(\S+)", conf, re.M) for name in expand_hostlist(hostlist)}


def controllers(nodes: Nodes) -> dict[str, tuple[str, int]]:
    """Each slurmctld pod's uid and its slurmctld container's restarts: what a controller restart changes."""
    pods = [p for p in nodes.pods(SLURM_NS) if p["metadata"]["name"].startswith("slurmctld-") and p["metadata"].get("deletionTimestamp") is None]
    return {p["metadata"]["name"]: (p["metadata"]["uid"], next(s["restartCount"] for s in p["status"]["containerStatuses"] if s["name"] == "slurmctld"))
            for p in pods}  # fmt: skip


def pool_member_moved(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with POOL_MEMBER moved from pool gpu to pool shared (Pulumi.local.yaml: gpu-real-[1-2] and
    gpu-real-[3-4])."""
    moved = copy.deepcopy(config)
    pools = {pool["name"]: pool for pool in moved["pools"]}
    assert (pools["gpu"]["nodes"], pools["shared"]["nodes"]) == ("gpu-real-[1-2]", "gpu-real-[3-4]"), pools
    pools["gpu"]["nodes"], pools["shared"]["nodes"] = DEDICATED, "gpu-real-[2-4]"
    return moved


def in_pool(nodes: Nodes, node: str, pool: str, gpus: int) -> bool:
    """``node`` runs ``pool``'s slurmd and is idle in Slurm with that pool's GPUs."""
    slurmd = [p["metadata"]["name"] for p in nodes.slurmd_pods() if p["spec"].get("nodeName") == node]
    if not slurmd or not all(name.startswith(f"dualsched-slurmd-{pool}-") for name in slurmd):
        return False
    shown = quietly(lambda: nodes.slurm("scontrol", "show", "node", node)) or ""
    state = re.search(r"State=(\S+)", shown)
    flags = state.group(1).split("+") if state else []  # IDLE+CLOUD: registered by its address (CLOUD nodes)
    idle = flags[:1] == ["IDLE"] and not {"DRAIN", "INVALID_REG", "NOT_RESPONDING"} & set(flags)
    return bool(re.search(rf"Gres=gpu:{gpus}\b", shown) and idle)


JOINING_POOL = "burst"
"""Pool gpu's like, whose nodes join by label: POOL_MEMBER and names no node has (joining_pool_added)."""


def joining_pool_added(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with POOL_MEMBER in no pool, and pool burst like pool gpu in partition gpu, whose nodes join by label
    within gpu-real-[2,5-6] (POOL_MEMBER and two names no node has)."""
    changed = copy.deepcopy(config)
    pools = {pool["name"]: pool for pool in changed["pools"]}
    assert pools["gpu"]["nodes"] == "gpu-real-[1-2]", pools
    pools["gpu"]["nodes"] = DEDICATED
    changed["pools"].append({**copy.deepcopy(pools["gpu"]), "name": JOINING_POOL, "nodes": "gpu-real-[2,5-6]", "joinByLabel": True})
    [partition] = changed["slurm"]["partitions"]
    partition["pools"] = [*partition["pools"], JOINING_POOL]
    return changed


def in_no_pool(nodes: Nodes, node: str) -> bool:
    """``node`` runs no slurmd and Slurm knows no node of its name."""
    return not any(p["spec"].get("nodeName") == node for p in nodes.slurmd_pods()) and node not in nodes.node_states()


def drained_for(nodes: Nodes, node: str, reason: str) -> bool:
    shown = nodes.slurm("scontrol", "show", "node", "--oneliner", node)
    return "+DRAIN" in re.search(r" State=(\S+)", shown).group(1) and f" Reason={reason} " in shown


def a_node_joins_a_pool_by_label_and_leaves_it_drained_while_jobs_run(
    nodes: Nodes, deploy: Callable[[dict[str, Any]], None], config: dict[str, Any], slurm_release: str
) -> None:
    """With pool burst added and POOL_MEMBER out of every pool, as an autoscaler adds a node: `kubectl label` puts it
    in the pool, and it is a Slurm node of burst with its GPUs that runs a step, without a `pulumi up`. Then it leaves
    as a node should: cordoned, so drained while its job runs on and completes, then unlabelled, and deleted from
    Slurm. Neither restarts a controller, on any release."""
    deploy(joining_pool_added(config))
    nodes.wait_for_slurm(f"{POOL_MEMBER} in no pool", lambda: in_no_pool(nodes, POOL_MEMBER), timeout=300, every=3)
    before = controllers(nodes)

    start = time.monotonic()
    nodes.world.kubectl("label", "node", POOL_MEMBER, f"dualsched.io/pool={JOINING_POOL}")
    nodes.wait_for_slurm(f"{POOL_MEMBER} in pool {JOINING_POOL}, idle with 4 GPUs", lambda: in_pool(nodes, POOL_MEMBER, JOINING_POOL, 4),
                         timeout=300, every=2)  # fmt: skip
    TIMINGS.append((f"multi-node: a node labelled into a pool is idle in Slurm {slurm_release}, from `kubectl label`", time.monotonic() - start))
    assert f"ActiveFeatures={JOINING_POOL} " in nodes.slurm("scontrol", "show", "node", "--oneliner", POOL_MEMBER)
    # the client's configless slurm.conf names no such node: slurmctld hands srun its address
    ran = nodes.as_user(DEDICATED, "alice", "srun", "--partition=gpu", f"--nodelist={POOL_MEMBER}", "--gres=gpu:4", "--mem=64M",
                        "--time=2", "hostname")  # fmt: skip
    assert ran.strip() == POOL_MEMBER

    name = f"leaving-{slurm_release}"
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", "--partition=gpu", f"--nodelist={POOL_MEMBER}",
                               "--mem=64M", "--output=/dev/null", held(name)).strip().split(";")[0])  # fmt: skip
    nodes.wait_for_slurm(f"job {job_id} to run", lambda: nodes.job_state(job_id) == "RUNNING", timeout=120)
    nodes.world.kubectl("cordon", POOL_MEMBER)
    try:
        nodes.wait_for_slurm(f"{POOL_MEMBER} drained for its cordon", lambda: drained_for(nodes, POOL_MEMBER, "dualsched:cordon"), timeout=120)
        assert nodes.job_state(job_id) == "RUNNING"
        release(nodes, name)
        nodes.wait_for_slurm(f"job {job_id} COMPLETED in sacct", lambda: completed(nodes, job_id), timeout=180)
        nodes.world.kubectl("label", "node", POOL_MEMBER, "dualsched.io/pool-")
        start = time.monotonic()
        nodes.wait_for_slurm(f"{POOL_MEMBER} gone from Slurm", lambda: in_no_pool(nodes, POOL_MEMBER), timeout=180, every=2)
        TIMINGS.append((f"multi-node: a drained node unlabelled is deleted from Slurm {slurm_release}", time.monotonic() - start))
    finally:
        nodes.world.kubectl("uncordon", POOL_MEMBER, check=False)
    assert controllers(nodes) == before


def a_node_changes_pools_and_joins_one_by_label_while_a_job_runs(
    nodes: Nodes, deploy: Callable[[dict[str, Any]], None], config: dict[str, Any], slurm_release: str, controller_restarts: bool
) -> None:
    """While a job runs on DEDICATED: `pulumi up` with POOL_MEMBER moved from pool gpu (dedicated, 4 GPUs to Slurm) to
    pool shared (partitioned, 2), both NodeName lines changing; then the joining pool's flow
    (a_node_joins_a_pool_by_label_and_leaves_it_drained_while_jobs_run); then back to pool gpu. The node runs each pool's
    slurmd in turn and is idle in Slurm with that pool's GPUs, runs a step once back; the running job completes; the
    controllers restarted or not as the release needs (components/slurm_files.py, restart_keys)."""
    name = f"pool-change-{slurm_release}"
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", "--partition=gpu", f"--nodelist={DEDICATED}",
                               "--mem=64M", "--output=/dev/null", held(name)).strip().split(";")[0])  # fmt: skip
    nodes.wait_for_slurm(f"job {job_id} to run", lambda: nodes.job_state(job_id) == "RUNNING", timeout=120)
    before = controllers(nodes)

    deploy(pool_member_moved(config))
    nodes.wait_for_slurm(f"{POOL_MEMBER} in pool shared, idle with 2 GPUs", lambda: in_pool(nodes, POOL_MEMBER, "shared", 2),
                         timeout=300, every=3)  # fmt: skip
    assert nodes.job_state(job_id) == "RUNNING"

    a_node_joins_a_pool_by_label_and_leaves_it_drained_while_jobs_run(nodes, deploy, config, slurm_release)
    assert nodes.job_state(job_id) == "RUNNING"

    deploy(config)
    start = time.monotonic()
    nodes.wait_for_slurm(f"{POOL_MEMBER} back in pool gpu, idle with 4 GPUs", lambda: in_pool(nodes, POOL_MEMBER, "gpu", 4),
                         timeout=300, every=3)  # fmt: skip
    TIMINGS.append((f"multi-node: a node moved back to its pool is idle in Slurm {slurm_release}, from the end of `pulumi up`",
                    time.monotonic() - start))  # fmt: skip
    # the clients here read DEDICATED's configless slurm.conf: slurmctld pushes it at its reconfigure
    wait_until(f"{DEDICATED}'s slurm.conf to name {POOL_MEMBER}", lambda: POOL_MEMBER in cached_nodes(nodes, DEDICATED), timeout=120)
    ran = nodes.as_user(DEDICATED, "alice", "srun", "--partition=gpu", f"--nodelist={POOL_MEMBER}", "--gres=gpu:4", "--mem=64M",
                        "--time=2", "hostname")  # fmt: skip
    assert ran.strip() == POOL_MEMBER

    release(nodes, name)
    nodes.wait_for_slurm(f"job {job_id} COMPLETED in sacct", lambda: completed(nodes, job_id), timeout=180)
    after = controllers(nodes)
    if controller_restarts:
        assert after.keys() == before.keys() and all(after[pod][0] != before[pod][0] for pod in before), (before, after)
    else:
        assert after == before
