"""The local stack on three real nodes: pods land where the pools say, every node is a real host of
its own to Slurm, and jobs span nodes over real links and one shared file system.

The tests run in file order on one deployment (conftest.py), as an operator would check a new
multi-node cluster: nodes, placement, Slurm's view, then jobs across nodes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from e2e_support import TIMINGS, raw_config
from node_support import JOB_USER_UID, NodeWorld, local_config
from test_real_node import INFERENCE_NS, SLURM_CONF_CACHE, SLURM_NS, Cluster, all_ready, up, wait_until

pytestmark = pytest.mark.multinode

NODES = ("gpu-real-1", "gpu-real-2", "gpu-real-3")
DEDICATED, PARTITIONED = NODES[0], NODES[1:]
"""Pulumi.local.yaml: pool gpu (dedicated, Slurm's alone) and pool shared (partitioned, with the model server
and the two slurmctld). The dedicated node is never taken away: the tests' Slurm clients run there."""
TWO_NODES = NODES[:2]
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


@pytest.fixture(scope="module")
def nodes(nodes_world: NodeWorld) -> Nodes:
    start = time.monotonic()
    up(nodes_world, local_config(nodes_world, raw_config("local")))
    cluster = Nodes(nodes_world)
    for namespace in (SLURM_NS, INFERENCE_NS):
        wait_until(f"every pod in {namespace} Ready", lambda: all_ready(cluster.pods(namespace)), timeout=480)
    wait_until("all three nodes idle in Slurm",
               lambda: set(cluster.node_states().items()) == {(n, "idle") for n in NODES}, timeout=300, every=5)  # fmt: skip
    TIMINGS.append(("multi-node: pulumi up of local until every pod Ready and every node idle", time.monotonic() - start))
    return cluster


# ---------------------------------------------------------------- nodes and placement


def test_three_real_nodes_each_with_its_own_address_runtime_and_gpus(nodes):
    listed = {n["metadata"]["name"]: n for n in nodes.world.kget("nodes")["items"]}
    assert sorted(listed) == list(NODES)
    for name, node in listed.items():
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == NODE_ADDRESSES[name], addresses
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", name


def test_pools_place_slurmd_and_the_model_server_on_their_own_nodes(nodes):
    pods = nodes.slurmd_pods()
    placed = {p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods}
    assert len(pods) == len(NODES) and sorted(placed) == list(NODES), placed
    assert placed[DEDICATED].startswith("dualsched-slurmd-gpu-"), placed
    for node in PARTITIONED:
        assert placed[node].startswith("dualsched-slurmd-shared-"), placed
    # the dedicated node is Slurm's alone: the model server runs on a partitioned node
    servers = [p for p in nodes.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]
    assert servers and {p["spec"]["nodeName"] for p in servers} <= set(PARTITIONED)


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
        assert re.search(rf"Gres=gpu:{4 if node == DEDICATED else 2}\b", shown), shown


# ---------------------------------------------------------------- jobs across nodes


def test_srun_on_two_nodes_runs_a_step_on_each(nodes):
    out = nodes.as_user(DEDICATED, "alice", "srun", "-N2", f"--nodelist={','.join(TWO_NODES)}", "--mem=128M",
                        "--time=2", "hostname")  # fmt: skip
    assert sorted(out.split()) == list(TWO_NODES), out


def test_a_two_node_batch_job_writes_one_shared_file_system_from_both_nodes(nodes):
    jobs = nodes.world.shared / "jobs"
    script = ("srun --ntasks-per-node=1 sh -c 'echo \"$(hostname) $(id -u) $SLURM_NODEID\" "
              "> /shared/jobs/multi-$SLURM_JOB_ID.$SLURM_NODEID'")
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", "-N2", f"--nodelist={','.join(TWO_NODES)}",
                               "--mem=128M", "--time=2", "--output=/shared/jobs/multi-%j.out", f"--wrap={script}")
                 .strip().split(";")[0])  # fmt: skip
    accounted = wait_until(f"job {job_id} COMPLETED in sacct", lambda: completed(nodes, job_id), timeout=180)
    assert accounted["NNodes"] == "2", accounted
    assert f"UserId=alice({JOB_USER_UID})" in nodes.slurm("scontrol", "show", "job", str(job_id))
    # what each node wrote lands in the one directory the test reads on this machine
    written = sorted((jobs / f"multi-{job_id}.{k}").read_text().split()[0] for k in (0, 1))
    assert written == list(TWO_NODES)
    assert {(jobs / f"multi-{job_id}.{k}").stat().st_uid for k in (0, 1)} == {JOB_USER_UID}


def completed(nodes: Nodes, job_id: int) -> dict[str, str] | None:
    fields = ("JobID", "State", "NNodes", "NodeList")
    out = nodes.slurm("sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                      f"--format={','.join(fields)}")  # fmt: skip
    rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]
    return rows[0] if rows and rows[0]["State"] == "COMPLETED" else None


def test_a_checkpoint_written_on_a_training_node_is_read_by_the_model_server_on_another(nodes):
    marker = f"step-{time.time_ns()}"
    job_id = int(nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", f"--nodelist={DEDICATED}", "--mem=128M",
                               "--time=2", "--output=/dev/null",
                               f"--wrap=echo {marker} > /shared/models/tiny/multinode-checkpoint")
                 .strip().split(";")[0])  # fmt: skip
    wait_until(f"job {job_id} COMPLETED", lambda: completed(nodes, job_id), timeout=180)
    [server] = [p for p in nodes.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]
    assert server["spec"]["nodeName"] in PARTITIONED
    read = nodes.exec(INFERENCE_NS, server["metadata"]["name"], "server", "cat", "/models/tiny/multinode-checkpoint")
    assert read.strip() == marker
    assert Path(nodes.world.shared / "models" / "tiny" / "multinode-checkpoint").read_text().strip() == marker


# ---------------------------------------------------------------- controller failover


def client(nodes: Nodes, *command: str):
    """A Slurm client command on the dedicated node, which no failover test takes away (the controller pods'
    nodes may be gone: kubectl exec there would hang). It reaches whichever slurmctld is in control."""
    return nodes.exec(SLURM_NS, nodes.slurmd_pod_on(DEDICATED), "slurmd", "env", f"SLURM_CONF={SLURM_CONF_CACHE}",
                      *command, check=False)  # fmt: skip


class NoAnswer(str):
    """A client command's error: false to wait_until, which shows its text when it gives up."""

    def __bool__(self) -> bool:
        return False


def squeue_states(nodes: Nodes, *job_ids: int) -> dict[int, str] | NoAnswer:
    """Job states from the slurmctld in control; NoAnswer while none answers."""
    result = client(nodes, "squeue", "--noheader", "--states=all", "--format=%i %T", f"--jobs={','.join(map(str, job_ids))}")
    if result.returncode != 0:
        return NoAnswer(result.stderr.strip())
    return {int(job): state for job, state in (line.split() for line in result.stdout.splitlines() if line.strip())}


def controllers_up(nodes: Nodes) -> dict[str, str]:
    """`scontrol ping`: "primary"/"backup" -> "UP"/"DOWN"."""
    return dict(re.findall(r"Slurmctld\((primary|backup)\) at \S+ is (UP|DOWN)", client(nodes, "scontrol", "ping").stdout))


def backup_log(nodes: Nodes) -> str:
    """The end of slurmctld-1's log, for a failure message."""
    result = nodes.world.kubectl("logs", "-n", SLURM_NS, "slurmctld-1", "-c", "slurmctld", "--tail=15", check=False)
    return (result.stdout + result.stderr).strip()


def controller_state(nodes: Nodes) -> Path:
    """slurmctld's StateSaveLocation as this machine sees it: the host directory of the claim's volume
    (tools/cluster.sh's volumes, one directory every node sees)."""
    [claim] = [c for c in nodes.world.kget("pvc", "-n", SLURM_NS)["items"] if "-slurmctld-state-" in c["metadata"]["name"]]
    volume = nodes.world.kget("pv", claim["spec"]["volumeName"])
    return Path(volume["spec"]["hostPath"]["path"])


def test_the_backup_controller_takes_over_from_a_lost_node_and_the_primary_comes_back_with_every_job(nodes):
    world = nodes.world
    placed = {name: nodes.pod(SLURM_NS, name)["spec"]["nodeName"] for name in ("slurmctld-0", "slurmctld-1")}
    primary_node = placed["slurmctld-0"]
    assert primary_node != placed["slurmctld-1"], placed  # spread: one node lost takes one controller
    assert DEDICATED not in placed.values()

    def submit(*args: str, node: str = DEDICATED) -> int:
        out = nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", f"--nodelist={node}", "--mem=128M",
                            "--time=10", "--output=/dev/null", *args)  # fmt: skip
        return int(out.strip().split(";")[0])

    # Without the database (it may be on the lost node), a backup starts only from a full state save, which the
    # primary writes 300 s after it starts (PERIODIC_CHECKPOINT) and then every 300 s; before that, the backup
    # exits: "we have no TRES from it" (docs/multi-node.md).
    tres = controller_state(nodes) / "last_tres"
    wait_until("the primary's first full state save", tres.exists, timeout=330, every=5)
    running = submit("--wrap=sleep 300")  # outlasts the outage and the return
    pending = submit("--begin=now+3600", "--wrap=true")
    wait_until("the long job to run", lambda: (squeue_states(nodes, running) or {}).get(running) == "RUNNING", timeout=120)
    # The backup starts from the state the primary saved (slurmctld saves a change within seconds, not at once):
    # lose the node once the running job is on disk, as it would be on a cluster that has been up a while.
    saved = controller_state(nodes) / "job_state"
    started = time.time()
    wait_until("the primary to save the running job", lambda: saved.exists() and saved.stat().st_mtime > started, timeout=60)

    lost = time.monotonic()
    world.node("fail", primary_node)
    try:
        wait_until("the primary to stop answering", lambda: controllers_up(nodes).get("primary") == "DOWN", timeout=120)
        states = wait_until("the backup to answer for the jobs", lambda: squeue_states(nodes, running, pending) or
                            NoAnswer(f"{squeue_states(nodes, running, pending)}; the backup's log: {backup_log(nodes)}"),
                            timeout=300)  # fmt: skip
        takeover = time.monotonic() - lost
        TIMINGS.append((f"multi-node: backup slurmctld in control after {primary_node} was lost", takeover))
        assert states == {running: "RUNNING", pending: "PENDING"}, states
        # the backup schedules: a job submitted while the primary is gone runs to completion (on the node that
        # is left: the dedicated node's one CPU is the long job's)
        during = submit("--wrap=true", node=placed["slurmctld-1"])
        wait_until(f"job {during} to complete under the backup",
                   lambda: (squeue_states(nodes, during) or {}).get(during) == "COMPLETED", timeout=180)  # fmt: skip
    finally:
        back = time.monotonic()
        world.node("recover", primary_node)
    wait_until("slurmctld-0 Ready again", lambda: all_ready([nodes.pod(SLURM_NS, "slurmctld-0")]), timeout=300, every=5)
    wait_until("both controllers answering", lambda: controllers_up(nodes) == {"primary": "UP", "backup": "UP"}, timeout=240)
    TIMINGS.append((f"multi-node: {primary_node} back, primary slurmctld answering", time.monotonic() - back))
    # the primary, restarted, takes control back with the state the backup kept (the backup restarts into
    # standby meanwhile, and for a few seconds neither answers): every job is still there
    states = wait_until("the primary to answer for the jobs", lambda: squeue_states(nodes, running, pending), timeout=300)
    assert states == {running: "RUNNING", pending: "PENDING"}, states
    assert nodes.slurm("scontrol", "show", "job", str(pending)).count("JobState=PENDING") == 1
    wait_until(f"job {running} COMPLETED in sacct", lambda: completed(nodes, running), timeout=420, every=5)
    nodes.slurm("scancel", str(pending))
