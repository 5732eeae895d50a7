"""A time-shared pool on the real node: Kubernetes inside a daily window, Slurm outside it.

The local pool switches from ``partitioned`` (as test_real_node leaves it) to ``time-shared``, the
mode switch an operator makes: `pulumi up`, then slurmd replaced. Its two-minute window then moves
to a few minutes from now, and on the real kubelet and real Slurm: while the window is closed the
model server cannot stay on the node, and a job that would run into the window waits while a short
one runs; when the window opens the model server lands on the node with a GPU; when it closes the
pod leaves and the waiting job runs."""

from __future__ import annotations

import datetime as dt
import time
from typing import Optional

import pytest

from node_support import NodeWorld, local_config
from test_real_node import INFERENCE_NS, NODE, SLURM_NS, Cluster, all_ready, up, wait_until

pytestmark = pytest.mark.node

POOL = "gpu"
WINDOW_MINUTES = 2
LEAD_MINUTES = 4
"""From the window's move to its start: the up, the kubelet's next sync (tools/node.sh: 10 s) and the
sidecar's next round, and a 1-minute job fit in it."""
WINDOW_TAINT = "dualsched.io/inference-window"


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _window_start() -> dt.datetime:
    """A window LEAD_MINUTES from now, within today (UTC): a run minutes before midnight waits for the next day,
    so that the test's own reading of the window's day and hours stays simple."""
    start = (_utc_now() + dt.timedelta(minutes=LEAD_MINUTES + 1)).replace(second=0, microsecond=0)
    if start.date() != (start + dt.timedelta(minutes=WINDOW_MINUTES + 1)).date():
        time.sleep((dt.datetime.combine(start.date() + dt.timedelta(days=1), dt.time(), dt.timezone.utc) - _utc_now()).total_seconds() + 1)
        return _window_start()
    return start


def time_shared_config(world: NodeWorld, start: dt.datetime) -> dict:
    config = local_config(world)
    pool = config["pools"][0]
    pool.update(mode="time-shared", inferenceWindow={"start": start.strftime("%H:%M"), "durationMinutes": WINDOW_MINUTES})
    del pool["slurmGpus"]
    return config


class Window:
    def __init__(self, cluster: Cluster, start: dt.datetime):
        self.cluster, self.start = cluster, start
        self.end = start + dt.timedelta(minutes=WINDOW_MINUTES)
        self.crossing: Optional[int] = None
        """The job submitted before the window whose time limit runs into it."""

    def node_taints(self) -> list[dict]:
        return self.cluster.world.kget("node", NODE).get("spec", {}).get("taints") or []

    def closed_taint(self) -> bool:
        return any(t["key"] == WINDOW_TAINT and t["effect"] == "NoExecute" for t in self.node_taints())

    def model_server(self) -> list[dict]:
        return [p for p in self.cluster.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]

    def serving_on_node(self) -> bool:
        pods = self.model_server()
        return all_ready(pods) and all(p["spec"].get("nodeName") == NODE for p in pods)

    def none_running(self) -> bool:
        return not any(p.get("status", {}).get("phase") == "Running" for p in self.model_server())

    def seconds_until(self, moment: dt.datetime) -> float:
        return (moment - _utc_now()).total_seconds()


def _switch_to_time_shared(node_world: NodeWorld, cluster: Cluster) -> None:
    """The operator's mode switch: `pulumi up` (which does not wait for slurmd: OnDelete); the rollout
    controller then drains the node, replaces slurmd so it runs the new template and resumes the node.
    The window is far away here: the next up moves it close."""
    far = _utc_now().replace(second=0, microsecond=0) + dt.timedelta(hours=6)
    old = cluster.slurmd_pod()["metadata"]["name"]
    up(node_world, time_shared_config(node_world, far))

    def replaced() -> bool:
        pods = [p for p in cluster.pods(SLURM_NS) if p["metadata"]["name"].startswith("dualsched-slurmd-gpu")]
        return [p["metadata"]["name"] for p in pods] != [old] and len(pods) == 1 and all_ready(pods)

    wait_until("the rollout controller's new slurmd pod Ready", replaced, timeout=300, every=3)


def _reservation_starts_at(cluster: Cluster, start: dt.datetime) -> bool:
    """The controller's sidecar has read the moved window (its ConfigMap reaches the pod within the
    kubelet's sync period) and moved the reservation."""
    shown = cluster.slurm("scontrol", "show", "reservation", f"dualsched-window-{POOL}")
    return f"StartTime={start:%Y-%m-%dT%H:%M:00}" in shown


@pytest.fixture(scope="module")
def window(node_world: NodeWorld) -> Window:
    cluster = Cluster(node_world)
    up(node_world, local_config(node_world))  # partitioned, the mode an operator switches from
    _switch_to_time_shared(node_world, cluster)
    start = _window_start()
    up(node_world, time_shared_config(node_world, start))  # only the window moves: no pod restarts
    wait_until("the reservation to move to the window", lambda: _reservation_starts_at(cluster, start), timeout=150, every=5)
    wait_until("the node idle in Slurm", lambda: "idle" in cluster.slurm("sinfo", "--noheader", "--format=%T", "-n", NODE),
               timeout=240, every=5)  # fmt: skip
    return Window(cluster, start)


def test_time_shared_slurmd_holds_no_gpu_and_slurm_owns_all_four_outside_the_window(window):
    slurmd = next(c for c in window.cluster.slurmd_pod()["spec"]["containers"] if c["name"] == "slurmd")
    assert "nvidia.com/gpu" not in slurmd["resources"].get("limits", {})
    assert "gpu:4" in window.cluster.slurm("scontrol", "show", "node", NODE)


def test_outside_the_window_the_node_carries_the_window_taint_and_serves_no_model(window):
    assert window.seconds_until(window.start) > 20, "the setup ran into the window: raise LEAD_MINUTES"
    wait_until("the closed-window taint on the node", window.closed_taint, timeout=60)
    wait_until("the model server off the node", window.none_running, timeout=120)


def test_slurm_runs_a_job_that_ends_before_the_window_and_holds_one_that_would_run_into_it(window):
    cluster = window.cluster
    reservation = cluster.slurm("scontrol", "show", "reservation")
    assert f"dualsched-window-{POOL}" in reservation and "DAILY" in reservation, reservation
    assert window.seconds_until(window.start) > 90, "no time left for a 1-minute job before the window: raise LEAD_MINUTES"
    crossing_minutes = int(window.seconds_until(window.end) // 60) + 2
    window.crossing = cluster.submit_as("alice", "--partition=gpu", "--mem=64M", "--output=/dev/null",
                                        f"--time={crossing_minutes}", "--wrap", "sleep 5")  # fmt: skip
    fits = cluster.submit_as("alice", "--partition=gpu", "--mem=64M", "--output=/dev/null", "--time=1", "--wrap", "sleep 5")
    wait_until(f"job {fits} (1 minute) to complete before the window", lambda: cluster.job_state(fits) == "COMPLETED", timeout=90)
    assert cluster.job_state(window.crossing) == "PENDING"


def test_inside_the_window_the_model_server_lands_on_the_node_with_a_gpu(window):
    wait_until("the window to open and its taint to go", lambda: not window.closed_taint(),
               timeout=window.seconds_until(window.start) + 60, every=5)  # fmt: skip
    assert window.seconds_until(window.start) < 15, "the taint went before the window opened"
    wait_until("the model server Ready on the node", window.serving_on_node, timeout=120, every=3)
    pod = window.model_server()[0]
    server = next(c for c in pod["spec"]["containers"] if c["name"] == "server")
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert window.cluster.job_state(window.crossing) == "PENDING"


def test_when_the_window_closes_the_pod_leaves_and_the_waiting_job_runs(window):
    wait_until("the window to close and its taint to come back", window.closed_taint,
               timeout=window.seconds_until(window.end) + 60, every=5)  # fmt: skip
    assert window.seconds_until(window.end) < 15, "the taint came back before the window closed"
    wait_until("the model server to leave the node", window.none_running, timeout=120, every=3)
    cluster = window.cluster
    wait_until(f"job {window.crossing} to run after the window", lambda: cluster.job_state(window.crossing) == "COMPLETED",
               timeout=180, every=5)  # fmt: skip
