"""The node health check on real daemons: slurm.healthCheck in the typed config renders
HealthCheckProgram=.../node_health.sh; slurmd runs it (at start and when slurmctld asks, every
interval) and the program drains its own node when a check fails, with reason
"dualsched:health: <what failed>", and resumes it once every check passes. A running job keeps
running through the drain and completes; a drain with another reason is never touched.

The checks fail for real: a GPU device file gres.conf counts is removed, the shared directory
(a tmpfs mounted here, as the claim is in the slurmd pod) is unmounted."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from conftest import LOCAL_NODE
from harness import CORDON_DRAIN, LocalCluster, make_gpu_devices, wait_until

pytestmark = pytest.mark.slurm

INTERVAL = 10
"""HealthCheckInterval: the shortest the config allows, so a test waits a few rounds at most."""
ROUNDS = 4 * INTERVAL
"""Time enough for slurmctld to have asked slurmd for a health check at least twice."""


def with_health_check(raw: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(raw)
    changed["slurm"]["healthCheck"] = {"enabled": True, "interval": INTERVAL}
    return changed


def drain(node: dict[str, str]) -> Optional[str]:
    """The node's drain reason (without Slurm's [user@time] suffix), None when not drained."""
    if "DRAIN" not in node["State"].split("+"):
        return None
    return node.get("Reason", "").rsplit(" [", 1)[0]


def wait_for_drain(cluster: LocalCluster, timeout: float = ROUNDS) -> str:
    return wait_until(f"{LOCAL_NODE} to be drained", lambda: drain(cluster.node(LOCAL_NODE)), timeout)


def wait_for_resume(cluster: LocalCluster, timeout: float = ROUNDS) -> dict[str, str]:
    def resumed() -> Optional[dict[str, str]]:
        node = cluster.node(LOCAL_NODE)
        return node if drain(node) is None else None

    return wait_until(f"{LOCAL_NODE} to be resumed", resumed, timeout)


def mount_tmpfs(path: Path) -> None:
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "dualsched-shared", str(path)], check=True)


def unmount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=False)


@pytest.fixture
def healthy(cluster: LocalCluster, local_raw: dict[str, Any]) -> Iterator[LocalCluster]:
    """The cluster with the health check on and every check passing; afterwards as before."""
    shared = Path(cluster.site.shared_dir)
    mount_tmpfs(shared)
    gpu_prefix = cluster.site.gpu_device_prefix or ""
    try:
        cluster.apply(with_health_check(local_raw))
        yield cluster
    finally:
        cluster.release_all()
        make_gpu_devices(gpu_prefix, 2)
        cluster.apply(local_raw)
        unmount(shared)
        cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=RESUME", check=False)


def test_health_check_is_in_slurm_conf_and_a_healthy_node_stays_in_service(healthy: LocalCluster):
    config = healthy.run("scontrol", "show", "config")
    assert "node_health.sh" in config and f"HealthCheckInterval     = {INTERVAL} sec" in config
    job = healthy.sbatch("--partition=gpu", "--gres=gpu:1", script="echo ran\n")
    healthy.wait_for_job(job, "COMPLETED")
    # two rounds of checks that pass leave the node alone
    with pytest.raises(TimeoutError):
        wait_for_drain(healthy, timeout=2 * INTERVAL + 5)


def test_a_missing_gpu_drains_the_node_while_its_job_runs_to_completion_then_it_resumes(healthy: LocalCluster):
    running = healthy.sbatch("--partition=gpu", "--gres=gpu:1", script=healthy.held_script("echo finished"))
    healthy.wait_for_job(running, "RUNNING")
    gpu1 = Path(f"{healthy.site.gpu_device_prefix}1")
    gpu1.unlink()

    reason = wait_for_drain(healthy)
    assert reason.startswith("dualsched:health: gpu devices: 1 of 2"), reason
    assert healthy.job(running)["JobState"] == "RUNNING"
    waiting = healthy.sbatch("--partition=gpu", "--gres=gpu:1", script="echo second\n")
    wait_until("the new job to pend on the drained node", lambda: healthy.job(waiting)["JobState"] == "PENDING", 15)
    healthy.release(running)
    healthy.wait_for_job(running, "COMPLETED")
    assert "finished" in healthy.job_output(running)
    assert healthy.job(waiting)["JobState"] == "PENDING"

    make_gpu_devices(healthy.site.gpu_device_prefix or "", 2)
    wait_for_resume(healthy)
    healthy.wait_for_job(waiting, "COMPLETED", timeout=ROUNDS)


def test_an_unmounted_shared_directory_drains_and_its_return_resumes(healthy: LocalCluster):
    shared = Path(healthy.site.shared_dir)
    unmount(shared)
    reason = wait_for_drain(healthy)
    assert reason == f"dualsched:health: {shared} not mounted", reason
    mount_tmpfs(shared)
    wait_for_resume(healthy)


def test_an_admins_drain_is_left_alone_even_when_a_check_fails(healthy: LocalCluster):
    healthy.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=DRAIN", "Reason=admin: new firmware")
    Path(f"{healthy.site.gpu_device_prefix}1").unlink()
    # failing rounds: the admin's reason stays, no health reason replaces it
    with pytest.raises(TimeoutError):
        wait_until("the reason to change", lambda: drain(healthy.node(LOCAL_NODE)) != "admin: new firmware", 2 * INTERVAL + 5)
    make_gpu_devices(healthy.site.gpu_device_prefix or "", 2)
    # passing rounds: still drained, the admin resumes it
    with pytest.raises(TimeoutError):
        wait_for_resume(healthy, timeout=2 * INTERVAL + 5)
    assert drain(healthy.node(LOCAL_NODE)) == "admin: new firmware"


# ----------------------------------------------------------------- Kubernetes cordon -> Slurm drain

def test_a_cordon_drains_with_its_reason_the_job_completes_and_the_uncordon_resumes(cluster: LocalCluster):
    running = cluster.sbatch("--partition=gpu", "--gres=gpu:1", script=cluster.held_script("echo finished"))
    cluster.wait_for_job(running, "RUNNING")
    try:
        assert f"{LOCAL_NODE}: cordoned in Kubernetes, drained" in cluster.cordon_round([LOCAL_NODE])
        assert drain(cluster.node(LOCAL_NODE)) == "dualsched:cordon"
        assert cluster.cordon_round([LOCAL_NODE]) == ""  # already drained: nothing to do
        waiting = cluster.sbatch("--partition=gpu", "--gres=gpu:1", script="echo second\n")
        cluster.release(running)
        cluster.wait_for_job(running, "COMPLETED")
        assert cluster.job(waiting)["JobState"] == "PENDING"
        assert f"{LOCAL_NODE}: uncordoned in Kubernetes, resumed" in cluster.cordon_round([])
        cluster.wait_for_job(waiting, "COMPLETED", timeout=ROUNDS)
    finally:
        cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=RESUME", check=False)


def test_an_uncordon_never_resumes_an_admins_drain(cluster: LocalCluster):
    cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=DRAIN", "Reason=admin: new firmware")
    try:
        assert cluster.cordon_round([LOCAL_NODE]) == ""
        assert cluster.cordon_round([]) == ""
        assert drain(cluster.node(LOCAL_NODE)) == "admin: new firmware"
    finally:
        cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=RESUME", check=False)


# ----------------------------------------------------------------- a drain Slurm set for a registration short of slurm.conf

RESUME_REGISTERED = CORDON_DRAIN.with_name("resume_registered.sh")
SHORT_REGISTRATION = "gres/gpu count reported lower than configured (1 < 2)"
"""Slurm's own words (src/interfaces/gres.c) when a slurmd registers fewer GPUs than its slurm.conf line."""


def test_a_drain_for_a_short_registration_is_resumed_once_the_registration_is_valid(cluster: LocalCluster):
    """The node registers as slurm.conf says (no INVALID_REG) and carries Slurm's reason: resumed. The drain here is
    set with scontrol; the registration that sets it in a pool change is the multi-node tier's."""
    cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=DRAIN", f"Reason={SHORT_REGISTRATION}")
    try:
        assert f"{LOCAL_NODE}: registers as slurm.conf says now, resumed" in cluster.run("sh", str(RESUME_REGISTERED))
        assert drain(cluster.node(LOCAL_NODE)) is None
    finally:
        cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=RESUME", check=False)


def test_a_drain_with_other_words_is_never_resumed_by_the_registration_check(cluster: LocalCluster):
    cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=DRAIN", "Reason=admin: new firmware")
    try:
        assert cluster.run("sh", str(RESUME_REGISTERED)) == ""
        assert drain(cluster.node(LOCAL_NODE)) == "admin: new firmware"
    finally:
        cluster.run("scontrol", "update", f"NodeName={LOCAL_NODE}", "State=RESUME", check=False)
