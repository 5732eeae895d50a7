"""A slurmd upgrade on the real node keeps the running job: `pulumi up` changes the slurmd pod spec
while a job runs, and with no person acting the rollout controller drains the node, waits for the
job to complete, only then replaces the slurmd pod (new revision), and resumes the node to IDLE; its
pod is deleted while the node drains, and its successor carries on from what it sees. A node an
admin drained gets the next template too, and stays drained.

The change is the pool's ``jobShmSize`` (the size of the job's /dev/shm volume): a change of the
DaemonSet's pod template only, as an image or resources change would be."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

import pytest

from node_support import NodeWorld, local_config
from test_real_node import NODE, SLURM_NS, Cluster, all_ready, current_pod, current_revision, sinfo_node, up, wait_until, wait_until_settled

pytestmark = pytest.mark.node

JOB_SECONDS = 150
"""Long enough for the up and the drain to happen while it runs."""
REASON_PREFIX = "dualsched:upgrade"


def shm_config(world: NodeWorld, size: str) -> dict:
    config = local_config(world)
    config["pools"][0]["jobShmSize"] = size
    return config


def controller_pod(cluster: Cluster) -> str:
    return cluster.pod(SLURM_NS, "dualsched-slurmd-rollout")["metadata"]["name"]


def controller_log(cluster: Cluster) -> str:
    return cluster.world.kubectl("logs", "-n", SLURM_NS, controller_pod(cluster), "-c", "rollout").stdout


@dataclass
class Timeline:
    """What the test saw every few seconds after the up: (seconds, job state, old pod present, node state, reason)."""

    samples: list[tuple[float, str, bool, str, str]] = field(default_factory=list)
    restarted: bool = False
    """The rollout controller's pod was deleted once the node was draining."""


@pytest.fixture(scope="module")
def rollout(node_world: NodeWorld):
    cluster = Cluster(node_world)
    up(node_world, shm_config(node_world, "512Mi"))
    wait_until("every Slurm pod Ready", lambda: all_ready(cluster.pods(SLURM_NS)), timeout=420)
    # from an earlier module's change the controller may still be replacing slurmd: start from a settled node
    wait_until_settled(cluster)
    old = cluster.slurmd_pod()
    job = cluster.submit_as("alice", "--partition=gpu", "--mem=64M", "--output=/dev/null", "--time=5", "--wrap", f"sleep {JOB_SECONDS}")
    wait_until(f"job {job} running", lambda: cluster.job_state(job) == "RUNNING", timeout=60)
    first_controller = controller_pod(cluster)
    up(node_world, shm_config(node_world, "256Mi"))
    timeline, start = Timeline(), time.monotonic()

    def settled() -> bool:
        state = cluster.job_state(job) or "GONE"
        pods = [p for p in cluster.pods(SLURM_NS) if p["metadata"]["name"].startswith("dualsched-slurmd-gpu")]
        old_present = any(p["metadata"]["uid"] == old["metadata"]["uid"] for p in pods)
        node_state, reason = sinfo_node(cluster)
        timeline.samples.append((time.monotonic() - start, state, old_present, node_state, reason))
        if node_state.startswith("draining") and not timeline.restarted:
            # the controller dies mid-way: its successor must go on from what it sees
            node_world.kubectl("delete", "pod", "-n", SLURM_NS, first_controller, "--wait=false")
            timeline.restarted = True
        fresh = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"]]
        return bool(fresh) and all_ready(fresh) and node_state == "idle"

    wait_until("the new slurmd pod Ready and the node idle again", settled, timeout=JOB_SECONDS + 420, every=3)
    yield cluster, job, old, timeline, first_controller
    # leave the local stack as the other modules expect it, its slurmd replaced by the controller
    up(node_world, local_config(node_world))
    wait_until_settled(cluster)


def test_the_node_is_drained_for_the_upgrade_while_the_job_runs_on_the_old_pod(rollout):
    _, _, _, timeline, _ = rollout
    draining = [s for s in timeline.samples if s[1] == "RUNNING" and s[3].startswith("draining")]
    assert draining, timeline.samples
    assert all(s[4].startswith(REASON_PREFIX) and s[2] for s in draining), draining


def test_the_old_pod_stays_until_the_job_has_completed(rollout):
    cluster, job, _, timeline, _ = rollout
    assert all(present for _, state, present, _, _ in timeline.samples if state in ("RUNNING", "COMPLETING")), timeline.samples
    accounted = cluster.sacct(job)
    assert accounted is not None and accounted["State"] == "COMPLETED" and accounted["NodeList"] == NODE, accounted


def test_the_new_pod_runs_the_new_revision_and_was_made_after_the_job_ended(rollout):
    cluster, job, old, _, _ = rollout
    new = cluster.slurmd_pod()
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["metadata"]["labels"]["controller-revision-hash"] == current_revision(cluster, new)
    assert new["metadata"]["labels"]["controller-revision-hash"] != old["metadata"]["labels"]["controller-revision-hash"]
    shm = next(v for v in new["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["sizeLimit"] == "256Mi"
    ended = cluster.slurm("sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job}", "--format=End").strip()
    end = dt.datetime.fromisoformat(ended).replace(tzinfo=dt.timezone.utc)  # slurmctld's clock, in UTC (the image sets no TZ)
    created = dt.datetime.fromisoformat(new["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    assert created >= end, (created, end)


def test_the_node_is_idle_again_without_a_person_though_the_controller_restarted_midway(rollout):
    cluster, _, _, timeline, first_controller = rollout
    assert sinfo_node(cluster) == ("idle", "none")
    assert timeline.restarted and controller_pod(cluster) != first_controller
    # the successor never drained: it found the node drained, then replaced the pod and resumed
    log = controller_log(cluster)
    assert f"{NODE}: no job left, deleted" in log and f"{NODE}: new slurmd registered, resumed" in log, log
    assert f"{NODE}: drained" not in log, log


def test_a_node_an_admin_drained_gets_the_new_slurmd_and_stays_drained(rollout):
    cluster = rollout[0]
    before = cluster.slurmd_pod()
    cluster.slurm("scontrol", "update", f"nodename={NODE}", "state=drain", "reason=admin: disk check")
    try:
        up(cluster.world, shm_config(cluster.world, "128Mi"))
        wait_until("the new slurmd pod Ready on the current revision",
                   lambda: current_pod(cluster) not in (None, before["metadata"]["uid"]), timeout=300, every=3)  # fmt: skip
        time.sleep(25)  # two of the controller's passes with the new slurmd registered
        state, reason = sinfo_node(cluster)
        assert state.startswith("drained") and reason == "admin: disk check", (state, reason)
        assert controller_log(cluster).count(f"{NODE}: new slurmd registered, resumed") == 1
    finally:
        cluster.slurm("scontrol", "update", f"nodename={NODE}", "state=resume")
