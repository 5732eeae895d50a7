"""The local stack on four real nodes: pods land where the pools say, every node is a real host of
its own to Slurm, and jobs span nodes over real links and one shared file system.

The tests run in file order on the tier's one deployment (conftest.py), as an operator would check a
new multi-node cluster: nodes, placement, Slurm's view, then jobs across nodes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualsched.components.identity import SLURM_UID
from dualsched.components.nodepools import GUARDED_POOL_LABEL
from node_support import JOB_USER_UID
from test_real_node import INFERENCE_NS, SLURM_NS

from .multi_node_support import (
    BRIDGE_ADDRESSES, CONTAINER_NODES, DEDICATED, NODE_ADDRESSES, NODES, PARTITIONED, TWO_NODES, completed, controller_state,
)

pytestmark = pytest.mark.multinode

# ---------------------------------------------------------------- nodes and placement


def test_four_real_nodes_each_with_its_own_address_runtime_and_gpus(nodes):
    listed = {n["metadata"]["name"]: n for n in nodes.world.kget("nodes")["items"]}
    assert sorted(listed) == list(NODES)
    for name, node in listed.items():
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == NODE_ADDRESSES[name], addresses
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", name


def netns_mounts_outside_the_netns_mount(mountinfo: str) -> list[str]:
    """Network namespaces mounted in /run/netns whose mount does not sit on /run/netns' own mount point: the first
    of two mounts that `ip netns add` leaves when /run/netns becomes a mount point after they were made."""
    mounts = [line.split() for line in mountinfo.splitlines()]
    [netns_dir] = [fields[0] for fields in mounts if fields[4] == "/run/netns"]
    return [fields[4] for fields in mounts if fields[4].startswith("/run/netns/") and fields[1] != netns_dir]


def test_the_nodes_network_namespaces_leave_every_pods_network_namespace_mounted_once(nodes):
    """The namespaced nodes' `ip netns add` made /run/netns a mount point after the one-node tier's containerd (beside
    this tier) had mounted pods' namespaces there: those pods then never ended (tools/node.sh netns_dir_setup)."""
    assert netns_mounts_outside_the_netns_mount(Path("/proc/self/mountinfo").read_text()) == []


def test_pools_place_slurmd_and_the_model_server_on_their_own_nodes(nodes):
    pods = nodes.slurmd_pods()
    placed = {p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods}
    assert len(pods) == len(NODES) and sorted(placed) == list(NODES), placed
    for node in CONTAINER_NODES:
        assert placed[node].startswith("dualsched-slurmd-gpu-"), placed
    for node in PARTITIONED:
        assert placed[node].startswith("dualsched-slurmd-shared-"), placed
    # the dedicated nodes are Slurm's alone: the model server runs on a partitioned node
    servers = [p for p in nodes.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]
    assert servers and {p["spec"]["nodeName"] for p in servers} <= set(PARTITIONED)


def test_a_kubelet_cannot_label_its_own_node_into_a_pool(nodes):
    """slurmd brings the munge key and /shared: it selects the pool's label under the prefix that NodeRestriction
    keeps kubelets from setting, which the node keeper set. The node's own credentials (its kubelet's) may
    label it otherwise, so the refusal is the prefix's."""
    node = PARTITIONED[0]
    world = nodes.world
    as_kubelet = ("--kubeconfig", str(world.cluster_dir / "nodes" / node / "kubelet.kubeconfig"))
    forged = world.kubectl(*as_kubelet, "label", "node", node, f"{GUARDED_POOL_LABEL}=gpu", "--overwrite", check=False)
    assert forged.returncode != 0 and "forbidden" in forged.stderr.lower(), (forged.stdout, forged.stderr)
    world.kubectl(*as_kubelet, "label", "node", node, "example.com/own-label=set")
    world.kubectl(*as_kubelet, "label", "node", node, "example.com/own-label-")
    selectors = [d["spec"]["template"]["spec"]["nodeSelector"] for d in world.kget("daemonsets", "-n", SLURM_NS)["items"]
                 if d["metadata"]["name"].startswith("dualsched-slurmd-")]  # fmt: skip
    assert selectors and all(s[GUARDED_POOL_LABEL] == s["dualsched.io/pool"] for s in selectors), selectors
    for pod in nodes.slurmd_pods():
        labels = world.kget("node", pod["spec"]["nodeName"])["metadata"]["labels"]
        assert labels[GUARDED_POOL_LABEL] == labels["dualsched.io/pool"], labels  # the keeper's, on every node


def test_the_controllers_state_directory_is_slurm_users_alone_on_a_volume_made_roots(nodes):
    """A hostPath volume gets no fsGroup, like a ReadWriteMany CSI volume under the default policy: the
    state-owner init container gave the directory to SlurmUser, and both controllers run on it."""
    state = controller_state(nodes).stat()
    assert (state.st_uid, state.st_gid, oct(state.st_mode & 0o7777)) == (SLURM_UID, SLURM_UID, "0o700")
    # slurmctld writes its cluster name there at its first start (its node state only minutes later)
    assert (controller_state(nodes) / "clustername").stat().st_uid == SLURM_UID


def test_host_network_pods_have_their_own_nodes_address_and_host_name(nodes):
    for node in NODES:
        pod = nodes.slurmd_pod_on(node)
        assert nodes.world.kget("pod", "-n", SLURM_NS, pod)["status"]["podIP"] == NODE_ADDRESSES[node]
        assert nodes.exec(SLURM_NS, pod, "slurmd", "hostname").strip() == node


def test_slurm_knows_each_node_by_the_address_it_registered_from(nodes):
    for node in NODES:
        shown = nodes.slurm("scontrol", "show", "node", node)
        address = re.search(r"NodeAddr=(\S+)", shown).group(1)
        # a slurmd beside slurmctld reaches its pod from the node's bridge, the others over the link
        assert address in (NODE_ADDRESSES[node], BRIDGE_ADDRESSES[node]), shown
        assert re.search(rf"Gres=gpu:{4 if node in CONTAINER_NODES else 2}\b", shown), shown


DNS_IP = "169.254.20.10"
"""Each node's cluster DNS (tools/node.sh), which its pods ask."""


def dns_rcode(node: str, name: str) -> int:
    """The response code the cluster DNS of ``node`` gives an A query for ``name``, asked from inside the node."""
    asked = (
        "import random, socket, struct; t = random.randrange(65536); "
        f"q = struct.pack('>HHHHHH', t, 256, 1, 0, 0, 0) + b''.join(bytes([len(p)]) + p.encode() for p in {name!r}.split('.')) "
        "+ bytes(1) + struct.pack('>HH', 1, 1); s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); "
        f"s.sendto(q, ({DNS_IP!r}, 53)); print(s.recv(512)[3] & 15)"
    )
    result = subprocess.run(["nsenter", f"--net=/run/netns/dualsched-{node}", sys.executable, "-c", asked],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_node_names_resolve_nowhere_and_the_cluster_dns_says_so_at_once(nodes):
    """Slurm learns each node's address from its registration (State=CLOUD), so no node name needs DNS, and none
    resolves here. The cluster DNS answers such a name NXDOMAIN, as a site's DNS does: a refused query is a
    temporary failure to the resolver (EAI_AGAIN), which Debian's Slurm 24.11 retries with growing pauses at every
    slurmctld start, and its controllers then took control from each other for ten minutes (tools/node.sh)."""
    for node in NODES:
        assert dns_rcode(node, NODES[-1]) == 3, node  # NXDOMAIN
        assert dns_rcode(node, "kubernetes.default.svc.cluster.local") == 0, node


# ---------------------------------------------------------------- jobs across nodes


def test_srun_on_two_nodes_runs_a_step_on_each(nodes):
    out = nodes.as_user(DEDICATED, "alice", "srun", "-N2", f"--nodelist={','.join(TWO_NODES)}", "--mem=128M",
                        "--time=2", "hostname")  # fmt: skip
    assert sorted(out.split()) == list(TWO_NODES), out
    # and both nodes are back in service: each slurmd's job epilog (Pyxis's, on every node once a pool runs
    # containers) succeeded, or Slurm would have drained the node
    nodes.wait_for_slurm("both nodes idle again", lambda: all(nodes.node_states()[n] == "idle" for n in TWO_NODES), timeout=60)


def test_a_two_node_batch_job_writes_one_shared_file_system_from_both_nodes(nodes):
    jobs = nodes.world.shared / "jobs"
    script = ("srun --ntasks-per-node=1 sh -c 'echo \"$(hostname) $(id -u) $SLURM_NODEID\" "
              "> /shared/jobs/multi-$SLURM_JOB_ID.$SLURM_NODEID'")
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", "-N2", f"--nodelist={','.join(TWO_NODES)}",
                               "--mem=128M", "--time=2", "--output=/shared/jobs/multi-%j.out", f"--wrap={script}")
                 .strip().split(";")[0])  # fmt: skip
    accounted = nodes.wait_for_slurm(f"job {job_id} COMPLETED in sacct", lambda: completed(nodes, job_id), timeout=180)
    assert accounted["NNodes"] == "2", accounted
    assert f"UserId=alice({JOB_USER_UID})" in nodes.slurm("scontrol", "show", "job", str(job_id))
    # what each node wrote lands in the one directory the test reads on this machine
    written = sorted((jobs / f"multi-{job_id}.{k}").read_text().split()[0] for k in (0, 1))
    assert written == list(TWO_NODES)
    assert {(jobs / f"multi-{job_id}.{k}").stat().st_uid for k in (0, 1)} == {JOB_USER_UID}


def test_a_checkpoint_written_on_a_training_node_is_read_by_the_model_server_on_another(nodes):
    marker = f"step-{time.time_ns()}"
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", f"--nodelist={DEDICATED}", "--mem=128M",
                               "--time=2", "--output=/dev/null",
                               f"--wrap=echo {marker} > /shared/models/tiny/multinode-checkpoint")
                 .strip().split(";")[0])  # fmt: skip
    nodes.wait_for_slurm(f"job {job_id} COMPLETED", lambda: completed(nodes, job_id), timeout=180)
    [server] = [p for p in nodes.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]
    assert server["spec"]["nodeName"] in PARTITIONED
    read = nodes.exec(INFERENCE_NS, server["metadata"]["name"], "server", "cat", "/models/tiny/multinode-checkpoint")
    assert read.strip() == marker
    assert Path(nodes.world.shared / "models" / "tiny" / "multinode-checkpoint").read_text().strip() == marker
