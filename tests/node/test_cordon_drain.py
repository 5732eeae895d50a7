"""Node health on the real node (docs/health.md): the local stack with slurm.healthCheck on and
drainCordoned, its pods on a real kubelet.

- slurmd runs node_health.sh from its pool's ConfigMap (HealthCheckProgram) against the pod's real
  /dev/nvidiaK files (the GPU device plugin double's), /shared mount and munged: the node stays in
  service, not drained.
- `kubectl cordon` of the node: the cordon watcher in slurmctld's pod sees spec.unschedulable and the
  reconfigure sidecar drains the Slurm node with reason "dualsched:cordon"; the running job runs on
  and completes, a new job pends. `kubectl uncordon`: the node resumes and the pending job runs.
"""

from __future__ import annotations

import re
import time
from typing import Optional

import pytest

from e2e_support import TIMINGS
from node_support import NodeWorld, local_config
from test_real_node import NODE, SLURM_NS, Cluster, all_ready, up, wait_until, wait_until_settled

pytestmark = pytest.mark.node

USER = "alice"


def health_config(world: NodeWorld) -> dict:
    config = local_config(world)
    config["slurm"]["healthCheck"] = {"enabled": True, "interval": 10, "drainCordoned": True}
    return config


@pytest.fixture(scope="module")
def stack(node_world: NodeWorld) -> Cluster:
    up(node_world, health_config(node_world))
    cluster = Cluster(node_world)
    start = time.monotonic()
    wait_until(f"every pod in {SLURM_NS} Ready", lambda: all_ready(cluster.pods(SLURM_NS)), timeout=420)
    # After an earlier module's stack the health check changes slurmd's template: the rollout controller
    # drains the node, replaces slurmd and resumes it (docs/upgrades.md) before anything here is judged.
    wait_until_settled(cluster)
    TIMINGS.append(("every Slurm pod Ready and slurmd current after pulumi up", time.monotonic() - start))
    yield cluster
    node_world.kubectl("uncordon", NODE, check=False)


def node_record(cluster: Cluster) -> str:
    return cluster.slurm("scontrol", "show", "node", "--oneliner", NODE)


def in_service(cluster: Cluster) -> bool:
    """IDLE (the pool's nodes are CLOUD nodes: IDLE+CLOUD) and not drained."""
    flags = re.search(r" State=(\S+)", node_record(cluster)).group(1).split("+")
    return flags[0] == "IDLE" and "DRAIN" not in flags


def drain_reason(cluster: Cluster) -> Optional[str]:
    """The node's drain reason (without Slurm's [user@time]), None when it is not drained."""
    record = node_record(cluster)
    state = re.search(r" State=(\S+)", record).group(1)
    if "DRAIN" not in state.split("+"):
        return None
    reason = re.search(r" Reason=(.*?) \[", record)
    return reason.group(1) if reason else ""


def held_job(cluster: Cluster, name: str) -> int:
    """A job that runs until the test creates /shared/<name> (the session's shared directory)."""
    return cluster.submit_as(
        USER, "--partition=gpu", "--mem=64M", "--output=/dev/null", f"--job-name={name}",
        "--wrap", f"while [ ! -e /shared/{name} ]; do sleep 1; done",
    )  # fmt: skip


def test_the_health_check_runs_in_the_slurmd_pod_and_the_healthy_node_stays_in_service(stack):
    assert "HealthCheckProgram      = /etc/dualsched/health/node_health.sh" in stack.slurm("scontrol", "show", "config")
    pod = stack.slurmd_pod()["metadata"]["name"]
    # the program as slurmd runs it: root, no arguments, SLURMD_NODENAME alone
    result = stack.exec(SLURM_NS, pod, "slurmd", "env", "-i", f"SLURMD_NODENAME={NODE}",
                        "/etc/dualsched/health/node_health.sh", check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    wait_until("the node idle and not drained", lambda: in_service(stack), timeout=180)
    time.sleep(25)  # two health check rounds
    assert drain_reason(stack) is None, node_record(stack)
    logs = stack.world.kubectl("logs", "-n", SLURM_NS, pod, "-c", "slurmd").stdout
    assert "health_check failed" not in logs and "health_check didn't run" not in logs


def test_cordon_drains_the_slurm_node_the_running_job_completes_and_uncordon_resumes(stack):
    shared = stack.world.shared
    running = held_job(stack, "release-cordon-1")
    wait_until(f"job {running} to run", lambda: stack.job_state(running) == "RUNNING", timeout=120)

    stack.world.kubectl("cordon", NODE)
    start = time.monotonic()
    wait_until("the Slurm node drained for the cordon", lambda: drain_reason(stack) == "dualsched:cordon", timeout=90)
    TIMINGS.append(("kubectl cordon -> Slurm node drained", time.monotonic() - start))
    assert stack.job_state(running) == "RUNNING"
    waiting = held_job(stack, "release-cordon-2")
    time.sleep(15)
    assert stack.job_state(waiting) == "PENDING"

    (shared / "release-cordon-1").touch()
    wait_until(f"job {running} to complete", lambda: stack.job_state(running) == "COMPLETED", timeout=120)
    assert stack.job_state(waiting) == "PENDING"

    stack.world.kubectl("uncordon", NODE)
    start = time.monotonic()
    wait_until("the Slurm node resumed", lambda: drain_reason(stack) is None, timeout=90)
    TIMINGS.append(("kubectl uncordon -> Slurm node resumed", time.monotonic() - start))
    wait_until(f"job {waiting} to run", lambda: stack.job_state(waiting) == "RUNNING", timeout=120)
    (shared / "release-cordon-2").touch()
    wait_until(f"job {waiting} to complete", lambda: stack.job_state(waiting) == "COMPLETED", timeout=120)
