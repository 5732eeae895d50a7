"""The local stack on a newer Slurm than Debian 12's 22.05: Slurm 26.05, past the 25.11 of the
default (Slinky) images, on the real node.

The slurm image comes from Debian forky's packages (``DUALSCHED_SLURM_SUITE=forky tools/images.sh``:
``dualsched.local/slurm:26.05``); the other images and every pod spec are the ones test_real_node
runs on 22.05, with ``slurm.release: "26.05"``. The stack is its own (a fresh controller state and
database: Slurm upgrades state by at most two releases, never from 22.05). It uses the local stack's
namespaces and names (two stacks never own the same objects, and the local stack's state never lists
objects that are gone), so it runs first (conftest.py), before any local stack exists, and is removed
at the end, namespaces included: the modules after this one deploy the 22.05 stack afresh, as on a new
node. Run alone after another module, it removes the local stack that module left first.

What this does not prove: SchedMD's own images (Slinky's ``slurm*:25.11.6-ubuntu24.04``, not pullable
here) with their other paths and accounts; docs/real-node.md lists what differs.
"""

from __future__ import annotations

import json
import re
import time
from typing import Iterator, Optional

import pytest

from e2e_support import TIMINGS, TOOLS, tail
from node_support import NodeWorld, local_config
from test_real_node import STACK as LOCAL_STACK
from test_real_node import INFERENCE_NS, JOBS_NS, NODE, SLURM_NS, Cluster, all_ready, finished_job, job_logs, wait_until

pytestmark = pytest.mark.node

SUITE, RELEASE, VERSION = "forky", "26.05", "26.05.5"
IMAGE = f"dualsched.local/slurm:{RELEASE}"
SLURM_IMAGES = ("slurmctld", "slurmd", "slurmdbd", "slurmrestd")
STACK = "newer-slurm"
JOB = {
    "name": "train-newer", "serviceAccount": "trainer",
    "script": '#!/bin/sh\necho "user=$(id -un) gpus=${SLURM_JOB_GPUS:-none}"\n',
    "args": ["--partition=gpu", "--gres=gpu:1", "--mem=256M", "--output=/shared/jobs/newer-%j.out"],
}


def newer_config(world: NodeWorld) -> dict:
    config = local_config(world)
    config["images"].update({name: IMAGE for name in SLURM_IMAGES})
    config["slurm"]["release"] = RELEASE
    return config


def import_newer_image(world: NodeWorld) -> None:
    """Build the forky image if the cache lacks it and import it into the node's containerd."""
    socket = world.cluster_dir / "node" / "containerd" / "containerd.sock"
    start = time.monotonic()
    world.run(["env", f"DUALSCHED_SLURM_SUITE={SUITE}", str(TOOLS / "images.sh"), "import", "--address", str(socket), "slurm"],
              timeout=900)  # fmt: skip
    TIMINGS.append((f"{IMAGE} built or cached, imported", time.monotonic() - start))


def remove_stack(world: NodeWorld, stack: str) -> None:
    """Everything of the stack, what it keeps on delete too (namespaces and their claims): then the
    next stack starts from nothing. The ClusterName lock is protected on purpose: lift it."""
    env_cwd = ["--stack", stack, "--cwd", str(world.project), "--non-interactive"]
    listed = json.loads(world.run(["pulumi", "stack", "ls", "--json", "--cwd", str(world.project)]).stdout)
    if stack not in {entry["name"].rsplit("/", 1)[-1] for entry in listed}:
        return
    world.run(["pulumi", "state", "unprotect", "--all", "--yes", *env_cwd], check=False)
    destroyed = world.run(["pulumi", "destroy", "--yes", "--skip-preview", *env_cwd], check=False, timeout=600)
    world.kubectl("delete", "namespace", SLURM_NS, JOBS_NS, INFERENCE_NS, "--ignore-not-found", "--wait=true",
                  "--timeout=300s", timeout=330)  # fmt: skip
    world.cluster("pvs")  # the claims' static PVs are Released (Retain): keep the pool topped up
    assert destroyed.returncode == 0, tail(destroyed.stdout + destroyed.stderr)


@pytest.fixture(scope="module")
def newer(node_world: NodeWorld) -> Iterator[Cluster]:
    import_newer_image(node_world)
    remove_stack(node_world, LOCAL_STACK)
    stack = node_world.stack(STACK, newer_config(node_world))
    from pulumi import automation as auto

    stack.set_config("nodetest:jobs", auto.ConfigValue(json.dumps([JOB])))
    try:
        start = time.monotonic()
        result = stack.up(on_output=lambda _: None, color="never")
        TIMINGS.append((f"pulumi up of the local stack on Slurm {RELEASE}", time.monotonic() - start))
        assert result.summary.result == "succeeded", tail(result.stdout)
        yield Cluster(node_world)
    finally:
        remove_stack(node_world, STACK)


def test_every_pod_runs_and_the_slurm_daemons_are_the_newer_release(newer):
    for namespace in (SLURM_NS, INFERENCE_NS):
        wait_until(f"every pod in {namespace} Ready", lambda: all_ready(newer.pods(namespace)), timeout=420)
    slurm_images = {c["image"] for pod in newer.pods(SLURM_NS) for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
                    if c["image"].startswith("dualsched.local/slurm")}  # fmt: skip
    assert slurm_images == {IMAGE}
    # "slurm-wlm 26.05.5" (Debian's name; SchedMD's builds print "slurm 25.11.6")
    assert newer.slurm("slurmctld", "-V").split()[-1] == VERSION
    slurmd = newer.slurmd_pod()["metadata"]["name"]
    assert newer.exec(SLURM_NS, slurmd, "slurmd", "slurmd", "-V").split()[-1] == VERSION


def test_slurmctld_takes_the_files_without_a_defunct_or_obsolete_option(newer):
    """Slurm logs options it dropped ("... is defunct, please remove it", src/common/read_config.c)."""
    wait_until("slurmctld to answer", lambda: "gpu" in newer.slurm("sinfo", "--noheader", "--format=%P"), timeout=120)
    log = newer.world.kubectl("logs", "-n", SLURM_NS, "slurmctld-0", "-c", "slurmctld").stdout
    complaints = [line for line in log.splitlines() if re.search(r"defunct|obsolete|please remove|unrecognized key", line, re.I)]
    assert complaints == [], complaints
    assert "cloud_reg_addrs" not in newer.slurm("scontrol", "show", "config")


def test_the_cloud_node_registers_its_address_without_cloud_reg_addrs(newer):
    def idle() -> Optional[str]:
        out = newer.slurm("sinfo", "--noheader", "--Node", "--format=%N %T %G")
        return out if re.search(rf"^{NODE} idle gpu:2\b", out, re.MULTILINE) else None

    wait_until("slurmd to register and the node to be idle", idle, timeout=180)
    assert re.search(r"NodeAddr=(\d+\.){3}\d+", newer.slurm("scontrol", "show", "node", NODE))


def test_a_kubernetes_job_runs_a_gpu_job_as_its_user(newer):
    world = newer.world
    k8s_job = wait_until("the sbatch Job to finish", lambda: finished_job(world, JOB["name"]), timeout=300)
    logs = job_logs(world, JOB["name"], "sbatch")
    assert k8s_job["status"].get("succeeded") == 1, logs + job_logs(world, JOB["name"], "slurm-token")
    newer.job_id = int(re.search(r"Submitted batch job (\d+)", logs).group(1))
    output = (world.shared / "jobs" / f"newer-{newer.job_id}.out").read_text()
    assert re.fullmatch(r"user=alice gpus=\d+\n", output), output


def test_sacct_records_the_job_with_its_gpu(newer):
    record = wait_until("slurmdbd to record the job", lambda: (r := newer.sacct(newer.job_id)) and
                        r["State"] == "COMPLETED" and r["AllocTRES"] and r)  # fmt: skip
    assert record["User"] == "alice" and record["NodeList"] == NODE
    assert "gres/gpu=1" in record["AllocTRES"].split(","), record
