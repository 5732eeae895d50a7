"""A slurmd upgrade rolls through the nodes of a running cluster: `pulumi up` changes every pool's slurmd
pod template (a ``runtimeClassName``) while jobs run on gpu-real-1 and gpu-real-2, an admin has drained
gpu-real-3 and gpu-real-4 is idle. With no person acting, the rollout controller drains at most ``maxUnavailable`` nodes at a
time (1, the default), waits for the drained node's job to complete, replaces its slurmd pod, resumes
it, and goes on to the next, while the other node keeps running its job. The controller is deleted
midway and its successor carries on from what it sees. The node the admin drained gets the new slurmd
at once (it counts against nobody's budget) and stays drained.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field

import pytest

from dualsched.components.programs.slurmd_rollout import REASON_PREFIX, SINFO_FORMAT, SlurmNode, parse_sinfo
from e2e_support import TIMINGS, raw_config
from node_support import local_config
from test_real_node import SLURM_NS, all_ready, current_revision, up, wait_until

from .multi_node_support import DEDICATED, NODES, Nodes, completed, held, release

pytestmark = pytest.mark.multinode

MAX_UNAVAILABLE = 1
"""Pulumi.local.yaml leaves slurmdRollout at its default."""
JOB_NODES = (DEDICATED, NODES[1])
"""The controller drains in name order. Each node's job runs until its node carries the upgrade drain (for
gpu-real-1, also until the successor controller runs, so that the successor finds the drain its predecessor
left): gpu-real-2's job outlasts gpu-real-1's drain, replacement and resume, and still runs when its own
drain comes."""
ADMIN_DRAINED, ADMIN_REASON = NODES[2], "admin: disk check"
RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc"}, "handler": "runc"}
"""The change rolled out: slurmd's pods name a RuntimeClass, as a GPU cluster without CDI names `nvidia`; its
handler is the nodes' containerd runtime (tools/node.sh), so the new pods run as before."""


@dataclass
class Sample:
    seconds: float
    nodes: dict[str, SlurmNode]
    jobs: dict[str, str]
    """node -> its job's state"""
    old_pods: set[str]
    """The nodes whose slurmd pod from before the upgrade still exists."""


@dataclass
class Rollout:
    nodes: Nodes
    jobs: dict[str, int]
    old: dict[str, dict]
    """node -> its slurmd pod before the upgrade"""
    first_controller: str
    samples: list[Sample] = field(default_factory=list)
    restarted: bool = False
    """The first controller pod was deleted while a node carried its drain."""
    released: set[str] = field(default_factory=set)
    """The nodes whose job the test let end."""

    def upgrading(self, sample: Sample) -> set[str]:
        return {name for name, node in sample.nodes.items() if node.reason.startswith(REASON_PREFIX)}


def controller_pod(nodes: Nodes) -> str:
    return nodes.pod(SLURM_NS, "dualsched-slurmd-rollout")["metadata"]["name"]


def controller_log(nodes: Nodes) -> str:
    return nodes.world.kubectl("logs", "-n", SLURM_NS, controller_pod(nodes), "-c", "rollout").stdout


def submit_on(nodes: Nodes, node: str) -> int:
    out = nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", f"--nodelist={node}", "--mem=64M", "--time=10",
                        "--output=/dev/null", held(f"rollout-{node}"))  # fmt: skip
    return int(out.strip().split(";")[0])


def with_runtime_class(nodes: Nodes) -> dict:
    nodes.world.kubectl("apply", "-f", "-", input=json.dumps(RUNTIME_CLASS))
    config = local_config(nodes.world, raw_config("local"))
    for pool in config["pools"]:
        pool["runtimeClassName"] = RUNTIME_CLASS["metadata"]["name"]
    return config


def successor_running(rollout: Rollout) -> bool:
    """The first controller pod is gone and its successor is Ready (both exist while the first terminates)."""
    pods = [p for p in rollout.nodes.pods(SLURM_NS) if p["metadata"]["name"].startswith("dualsched-slurmd-rollout")]
    return all(p["metadata"]["name"] != rollout.first_controller for p in pods) and all_ready(pods)


def release_drained_jobs(rollout: Rollout, sample: Sample) -> None:
    """Lets a node's job end once a sample has seen it running on its draining node."""
    for node in (set(JOB_NODES) & rollout.upgrading(sample)) - rollout.released:
        if sample.jobs[node] == "RUNNING" and (node != JOB_NODES[0] or successor_running(rollout)):
            release(rollout.nodes, f"rollout-{node}")
            rollout.released.add(node)


def observe(rollout: Rollout, start: float) -> bool:
    """One sample of Slurm's and Kubernetes' view; deletes the first controller once a node carries its
    drain, and ends the drained nodes' jobs; true once every node runs a new slurmd pod and is back in its
    state from before."""
    nodes = rollout.nodes
    states = parse_sinfo(nodes.slurm("sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"))
    jobs = {node: nodes.job_state(job) or "GONE" for node, job in rollout.jobs.items()}
    pods = {p["spec"]["nodeName"]: p for p in nodes.slurmd_pods()}
    old = {node for node, pod in pods.items() if pod["metadata"]["uid"] == rollout.old[node]["metadata"]["uid"]}
    sample = Sample(time.monotonic() - start, states, jobs, old)
    rollout.samples.append(sample)
    if rollout.upgrading(sample) and not rollout.restarted:
        nodes.world.kubectl("delete", "pod", "-n", SLURM_NS, rollout.first_controller, "--wait=false")
        rollout.restarted = True
    release_drained_jobs(rollout, sample)
    replaced = len(pods) == len(NODES) and not old and all_ready(list(pods.values()))
    expected = {node: "drained" if node == ADMIN_DRAINED else "idle" for node in NODES}
    return replaced and {name: node.state for name, node in states.items()} == expected


@pytest.fixture(scope="module")
def rollout(nodes: Nodes) -> Rollout:
    old = {pod["spec"]["nodeName"]: pod for pod in nodes.slurmd_pods()}
    nodes.slurm("scontrol", "update", f"nodename={ADMIN_DRAINED}", "state=drain", f"reason={ADMIN_REASON}")
    jobs = {node: submit_on(nodes, node) for node in JOB_NODES}
    wait_until("the jobs running", lambda: all(nodes.job_state(job) == "RUNNING" for job in jobs.values()), timeout=120)
    result = Rollout(nodes, jobs, old, controller_pod(nodes))
    up(nodes.world, with_runtime_class(nodes))
    start = time.monotonic()
    wait_until("every node on a new slurmd and back in its state", lambda: observe(result, start),
               timeout=600, every=3)  # fmt: skip
    TIMINGS.append((f"multi-node: slurmd rollout through {len(NODES)} nodes, {len(JOB_NODES)} of them running a job",
                    time.monotonic() - start))  # fmt: skip
    yield result
    nodes.slurm("scontrol", "update", f"nodename={ADMIN_DRAINED}", "state=resume")


def test_at_most_max_unavailable_nodes_carry_the_upgrade_drain_at_once(rollout):
    counts = [len(rollout.upgrading(s)) for s in rollout.samples]
    assert max(counts) == MAX_UNAVAILABLE, [(round(s.seconds), sorted(rollout.upgrading(s))) for s in rollout.samples]


def test_each_node_with_a_job_is_drained_while_its_job_runs_on_the_old_pod(rollout):
    for node in JOB_NODES:
        seen = [s for s in rollout.samples if node in rollout.upgrading(s) and s.jobs[node] == "RUNNING"]
        assert seen and all(node in s.old_pods and s.nodes[node].state == "draining" for s in seen), (node, rollout.samples)


def test_the_other_node_keeps_running_its_job_while_one_drains(rollout):
    first, second = JOB_NODES
    while_first_drains = [s for s in rollout.samples if rollout.upgrading(s) == {first}]
    assert while_first_drains, rollout.samples
    assert all(s.jobs[second] == "RUNNING" and s.nodes[second].state in ("allocated", "mixed")
               for s in while_first_drains), while_first_drains  # fmt: skip


def test_no_old_pod_is_replaced_before_its_job_has_completed(rollout):
    nodes = rollout.nodes
    for node, job in rollout.jobs.items():
        assert all(node in s.old_pods for s in rollout.samples if s.jobs[node] in ("RUNNING", "COMPLETING")), node
        accounted = completed(nodes, job)
        assert accounted is not None and accounted["NodeList"] == node, accounted
        ended = dt.datetime.fromisoformat(accounted["End"]).replace(tzinfo=dt.timezone.utc)  # slurmctld's clock, UTC
        created = new_pod(rollout, node)["metadata"]["creationTimestamp"]
        assert dt.datetime.fromisoformat(created.replace("Z", "+00:00")) >= ended, (node, created, ended)


def new_pod(rollout: Rollout, node: str) -> dict:
    return next(p for p in rollout.nodes.slurmd_pods() if p["spec"]["nodeName"] == node)


def test_every_node_runs_the_new_revision(rollout):
    for node in NODES:
        pod = new_pod(rollout, node)
        assert pod["metadata"]["uid"] != rollout.old[node]["metadata"]["uid"], node
        assert pod["metadata"]["labels"]["controller-revision-hash"] == current_revision(rollout.nodes, pod), node
        assert pod["spec"]["runtimeClassName"] == RUNTIME_CLASS["metadata"]["name"], node


def test_the_successor_controller_carried_on_where_the_first_stopped(rollout):
    nodes = rollout.nodes
    assert rollout.restarted and controller_pod(nodes) != rollout.first_controller
    first, second = JOB_NODES
    log = controller_log(nodes)
    # it found gpu-real-1 drained by its predecessor (no drain of its own), replaced and resumed it, then drained
    # gpu-real-2 itself
    assert f"{first}: drained" not in log and f"{first}: no job left, deleted" in log, log
    for node in JOB_NODES:
        assert f"{node}: new slurmd registered, resumed" in log, log
    assert f"{second}: drained" in log, log


def test_the_node_an_admin_drained_gets_the_new_slurmd_and_stays_drained(rollout):
    state = rollout.nodes.node_states()[ADMIN_DRAINED]
    reason = parse_sinfo(rollout.nodes.slurm("sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"))[ADMIN_DRAINED].reason
    assert state == "drained" and reason == ADMIN_REASON, (state, reason)
    assert f"{ADMIN_DRAINED}: new slurmd registered, resumed" not in controller_log(rollout.nodes)
    assert all(ADMIN_DRAINED not in rollout.upgrading(s) for s in rollout.samples)
