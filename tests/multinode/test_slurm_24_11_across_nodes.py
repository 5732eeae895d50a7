"""The local stack on Slurm 24.11 (Debian trixie), before the 25.11 of the default images, on the four real
nodes; the one-node tier runs 26.05, after it (tests/node/slurm_releases.py: the stack, its image, what it
does not prove).

The slurm image is ``dualsched.local/slurm:24.11`` (``DUALSCHED_SLURM_SUITE=trixie tools/images.sh``), every
pod spec the local stack's with ``slurm.release: "24.11"`` and no job steps in containers (Pyxis is built
for Debian 12's Slurm). The flows whose behaviour changes between releases: configless registration of
each node by its address, GPU GRES, a job from Kubernetes with a Slurm token (auth/jwt) across two nodes
with its own /tmp (JobContainerType=job_container/tmpfs, 25.11 renames it), accounting, a slurm.conf change
reaching every daemon by reconfigure (which 24.11's slurmctld does by starting itself anew), with the backup
controller standing by, a node moving to another pool and back the same way, and a node joining a pool by label
and leaving it (a dynamic node, fanned out to from this release on).
It runs last in the tier (conftest.py): it removes the local stack, and its own is removed at its end.

The Job is submitted by a second `pulumi up`, once every node is idle: a Job created with the stack meets
both controllers starting, and its first sbatch may time out (Slurm's client retries, the Job's sbatch does not).
"""

from __future__ import annotations

import re
import time
from typing import Iterator

import pytest

from e2e_support import raw_config
from node_support import NodeWorld, local_config
from slurm_releases import SlurmRelease, deployed, every_pod_ready_on, slurm_job_of, up_on
from test_real_node import SLURM_CONF_CACHE, SLURM_NS, wait_until

from .multi_node_support import (
    BRIDGE_ADDRESSES, CONTAINER_NODES, NODE_ADDRESSES, NODES, TWO_NODES, Nodes, a_node_changes_pools_and_joins_one_by_label_while_a_job_runs,
    completed,
)

pytestmark = pytest.mark.multinode

TRIXIE = SlurmRelease(suite="trixie", release="24.11", version="24.11.5")
LABEL = "multi-node: "
JOB = {
    "name": "train-24-11", "serviceAccount": "trainer",
    "script": '#!/bin/sh\necho "user=$(id -un) nodes=$SLURM_JOB_NODELIST gpus=${SLURM_JOB_GPUS:-none} tmp=$(stat -c %U:%a /tmp)"\n',
    "args": ["--partition=gpu", "--nodes=2", f"--nodelist={','.join(TWO_NODES)}", "--gres=gpu:1", "--mem=128M",
             "--output=/shared/jobs/slurm-24-11-%j.out"],
}


def release_config(world: NodeWorld) -> dict:
    return local_config(world, raw_config("local"))


def every_node_idle(older: Nodes) -> bool:
    return set(older.node_states().items()) == {(n, "idle") for n in NODES}


@pytest.fixture(scope="module")
def older(nodes_world: NodeWorld) -> Iterator[Nodes]:
    TRIXIE.import_image(nodes_world, [f"nodes/{node}" for node in NODES], LABEL)
    with deployed(nodes_world, TRIXIE, release_config(nodes_world), [], LABEL):
        yield Nodes(nodes_world)


def test_every_pod_runs_and_every_slurm_daemon_is_24_11(older):
    every_pod_ready_on(older, TRIXIE, timeout=480)
    for pod in ("slurmctld-0", "slurmctld-1"):
        assert older.exec(SLURM_NS, pod, "slurmctld", "slurmctld", "-V").split()[-1] == TRIXIE.version, pod
    for node in NODES:
        assert older.exec(SLURM_NS, older.slurmd_pod_on(node), "slurmd", "slurmd", "-V").split()[-1] == TRIXIE.version, node


def test_both_controllers_take_the_files_without_a_defunct_or_obsolete_option(older):
    """Slurm logs options it dropped ("... is defunct, please remove it", src/common/read_config.c)."""
    older.wait_for_slurm("slurmctld to answer", lambda: "gpu" in older.slurm("sinfo", "--noheader", "--format=%P"), timeout=120)
    for pod in ("slurmctld-0", "slurmctld-1"):
        log = older.world.kubectl("logs", "-n", SLURM_NS, pod, "-c", "slurmctld").stdout
        complaints = [line for line in log.splitlines() if re.search(r"defunct|obsolete|please remove|unrecognized key", line, re.I)]
        assert complaints == [], (pod, complaints)
    assert "cloud_reg_addrs" not in older.slurm("scontrol", "show", "config")


RECONFIGURED = "slurmctld started or the slurm files changed: scontrol reconfigure"


def test_no_controller_reconfigures_at_its_start_from_23_11(older):
    """From 23.11 a reconfigure starts slurmctld anew in place; one at its start, as the slurmd registered, left a
    node registered by its name rather than its address (NodeAddr its name: unreachable) in 2 of 3 full runs of this
    tier (components/controller.py, reconfigure_loop). Their rounds run; a change still reconfigures (below)."""
    def reconfigures(pod: str) -> int:
        return older.world.kubectl("logs", "-n", SLURM_NS, pod, "-c", "reconfigure").stdout.count(RECONFIGURED)

    older.wait_for_slurm("slurmctld to answer", lambda: "gpu" in older.slurm("sinfo", "--noheader", "--format=%P"), timeout=120)
    time.sleep(30)  # three rounds of each sidecar
    assert (reconfigures("slurmctld-0"), reconfigures("slurmctld-1")) == (0, 0)


def test_every_node_registers_by_its_address_with_its_gpus_and_is_idle(older):
    older.wait_for_slurm("every node idle in Slurm", lambda: every_node_idle(older), timeout=300, every=5)
    for node in NODES:
        shown = older.slurm("scontrol", "show", "node", node)
        assert re.search(r"NodeAddr=(\S+)", shown).group(1) in (NODE_ADDRESSES[node], BRIDGE_ADDRESSES[node]), shown
        assert re.search(rf"Gres=gpu:{4 if node in CONTAINER_NODES else 2}\b", shown), shown


def test_a_kubernetes_job_runs_a_job_on_two_nodes_as_its_user_with_a_token_and_its_own_tmp(older):
    older.wait_for_slurm("every node idle in Slurm", lambda: every_node_idle(older), timeout=300, every=5)
    up_on(older.world, TRIXIE, release_config(older.world), [JOB], LABEL)
    older.job_id, output = slurm_job_of(older.world, JOB)
    assert re.fullmatch(r"user=alice nodes=gpu-real-\[2-3\] gpus=\d+ tmp=alice:700\n", output), output


def test_accounting_records_the_job_on_both_nodes_with_a_gpu_each(older):
    record = older.wait_for_slurm("slurmdbd to record the job", lambda: completed(older, older.job_id), timeout=120)
    assert record["User"] == "alice" and record["NNodes"] == "2", record
    assert "gres/gpu=2" in record["AllocTRES"].split(","), record


def test_a_slurm_conf_change_reaches_every_daemon_by_reconfigure_without_a_restart(older):
    world = older.world
    before = {p["metadata"]["uid"]: p for p in older.pods(SLURM_NS)}
    config = release_config(world)
    config["slurm"]["partitions"][0]["maxTime"] = "2:00:00"
    # without the finished Job: a Job replaced under its own name (its client config changes with slurm.conf)
    # meets the old one still being deleted, a field conflict for server-side apply
    up_on(world, TRIXIE, config, [], LABEL)
    for node in NODES:
        pod = older.slurmd_pod_on(node)
        wait_until(f"{node}'s configless cache to get MaxTime=2:00:00",
                   lambda: "MaxTime=2:00:00" in older.exec(SLURM_NS, pod, "slurmd", "cat", SLURM_CONF_CACHE), timeout=300, every=5)  # fmt: skip
    assert "MaxTime=02:00:00" in older.slurm("scontrol", "show", "partition", "gpu")
    after = {p["metadata"]["uid"]: p for p in older.pods(SLURM_NS)}
    assert after.keys() == before.keys()
    for uid, pod in after.items():
        restarts = {s["name"]: s["restartCount"] for s in before[uid]["status"]["containerStatuses"]}
        assert {s["name"]: s["restartCount"] for s in pod["status"]["containerStatuses"]} == restarts, pod["metadata"]["name"]


def test_a_node_changes_pools_and_joins_one_by_label_while_a_job_runs_without_a_controller_restart(older):
    """24.11's reconfigure takes node changes, and dynamic nodes come and go: both controllers keep running through them."""
    world = older.world
    a_node_changes_pools_and_joins_one_by_label_while_a_job_runs(
        older, lambda config: up_on(world, TRIXIE, config, [], LABEL), release_config(world), TRIXIE.release, controller_restarts=False
    )
