"""The local stack on a newer Slurm than Debian 12's 22.05: Slurm 26.05 (Debian forky), past the 25.11 of the
default (Slinky) images, on the real node (slurm_releases.py: the stack, its image, what it does not prove).

The slurm image is ``dualsched.local/slurm:26.05`` (``DUALSCHED_SLURM_SUITE=forky tools/images.sh``); the other
images and every pod spec are the ones test_real_node runs on 22.05, with ``slurm.release: "26.05"``. It runs
first (conftest.py), before any local stack exists, and is removed at its end: the modules after it deploy the
22.05 stack afresh, as on a new node.
"""

from __future__ import annotations

import re
from typing import Iterator, Optional

import pytest

from node_support import NodeWorld, local_config
from slurm_releases import SlurmRelease, deployed, every_pod_ready_on, slurm_job_of
from test_real_node import NODE, SLURM_NS, Cluster

pytestmark = pytest.mark.node

FORKY = SlurmRelease(suite="forky", release="26.05", version="26.05.5")
JOB = {
    "name": "train-newer", "serviceAccount": "trainer",
    # /tmp is the job's own (NamespaceType=namespace/tmpfs since 25.11): its user's, mode 0700
    "script": '#!/bin/sh\necho "user=$(id -un) gpus=${SLURM_JOB_GPUS:-none} tmp=$(stat -c %U:%a /tmp)"\n',
    "args": ["--partition=gpu", "--gres=gpu:1", "--mem=256M", "--output=/shared/jobs/newer-%j.out"],
}


@pytest.fixture(scope="module")
def newer(node_world: NodeWorld) -> Iterator[Cluster]:
    FORKY.import_image(node_world)
    with deployed(node_world, FORKY, local_config(node_world), [JOB]):
        yield Cluster(node_world)


def test_every_pod_runs_and_the_slurm_daemons_are_the_newer_release(newer):
    every_pod_ready_on(newer, FORKY)
    # "slurm-wlm 26.05.5" (Debian's name; SchedMD's builds print "slurm 25.11.6")
    assert newer.slurm("slurmctld", "-V").split()[-1] == FORKY.version
    slurmd = newer.slurmd_pod()["metadata"]["name"]
    assert newer.exec(SLURM_NS, slurmd, "slurmd", "slurmd", "-V").split()[-1] == FORKY.version


def test_slurmctld_takes_the_files_without_a_defunct_or_obsolete_option(newer):
    """Slurm logs options it dropped ("... is defunct, please remove it", src/common/read_config.c)."""
    newer.wait_for_slurm("slurmctld to answer", lambda: "gpu" in newer.slurm("sinfo", "--noheader", "--format=%P"), timeout=120)
    log = newer.world.kubectl("logs", "-n", SLURM_NS, "slurmctld-0", "-c", "slurmctld").stdout
    complaints = [line for line in log.splitlines() if re.search(r"defunct|obsolete|please remove|unrecognized key", line, re.I)]
    assert complaints == [], complaints
    assert "cloud_reg_addrs" not in newer.slurm("scontrol", "show", "config")


def test_the_cloud_node_registers_its_address_without_cloud_reg_addrs(newer):
    def idle() -> Optional[str]:
        out = newer.slurm("sinfo", "--noheader", "--Node", "--format=%N %T %G")
        return out if re.search(rf"^{NODE} idle gpu:2\b", out, re.MULTILINE) else None

    newer.wait_for_slurm("slurmd to register and the node to be idle", idle, timeout=180)
    assert re.search(r"NodeAddr=(\d+\.){3}\d+", newer.slurm("scontrol", "show", "node", NODE))


def test_a_kubernetes_job_runs_a_gpu_job_as_its_user(newer):
    newer.job_id, output = slurm_job_of(newer.world, JOB)
    assert re.fullmatch(r"user=alice gpus=\d+ tmp=alice:700\n", output), output


def test_sacct_records_the_job_with_its_gpu(newer):
    record = newer.wait_for_slurm("slurmdbd to record the job", lambda: (r := newer.sacct(newer.job_id)) and
                                  r["State"] == "COMPLETED" and r["AllocTRES"] and r)  # fmt: skip
    assert record["User"] == "alice" and record["NodeList"] == NODE
    assert "gres/gpu=1" in record["AllocTRES"].split(","), record
