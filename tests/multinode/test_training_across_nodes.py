"""The seed's training job, for real, on two nodes: a Kubernetes Job of the `trainer` ServiceAccount
submits examples/train_multinode.sbatch as alice (a minted token, no munge key); Slurm runs it on both
nodes of the container pool; on each, Pyxis has Enroot import and start Debian's PyTorch from a squashfs
image on the shared directory (no registry); torchrun's c10d rendezvous on the first node joins the two,
and data-parallel training over gloo writes a checkpoint under /shared/models/tiny. A config change
(``revision``) then has the model server, on another node, serve that checkpoint.

PyTorch runs on CPU: the GPUs here are the device plugin double (docs/multi-node.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from e2e_support import TIMINGS, TOOLS, raw_config
from node_support import JOB_USER_UID, local_config
from seed_shared import install_job_image
from test_real_node import INFERENCE_NS, all_ready, finished_job, job_logs, up, wait_until

from .multi_node_support import CONTAINER_NODES, PARTITIONED, Nodes, completed

pytestmark = pytest.mark.multinode

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_multinode.sbatch"
STEPS = 20
"""The example's default (TRAIN_STEPS)."""
CHECKPOINT = f"step-{STEPS}"
JOB = {"name": "train-multinode", "serviceAccount": "trainer", "script": EXAMPLE.read_text(),
       "args": [f"--nodelist={','.join(CONTAINER_NODES)}"]}


def torch_image(shared: Path) -> None:
    """Debian's PyTorch as a squashfs file Enroot imports (tools/images.sh squashfs torch, cached by
    `make images`), where the example looks for it."""
    built = subprocess.run([str(TOOLS / "images.sh"), "squashfs", "torch"], capture_output=True, text=True, check=True,
                           timeout=1800).stdout.strip().splitlines()[-1]  # fmt: skip
    install_job_image(shared, "torch.sqsh", Path(built))


def serving(nodes: Nodes, revision: str | None) -> dict:
    config = local_config(nodes.world, raw_config("local"))
    if revision:
        config["inference"]["models"][0]["revision"] = revision
    return config


def loaded_model(nodes: Nodes) -> dict:
    """What the model server loaded (the stand-in's /standin/model), asked inside its pod."""
    [server] = [p for p in nodes.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]
    read = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/standin/model').read().decode())"
    return {"node": server["spec"]["nodeName"],
            **json.loads(nodes.exec(INFERENCE_NS, server["metadata"]["name"], "server", "python3", "-c", read))}  # fmt: skip


@pytest.fixture(scope="module")
def training(nodes: Nodes):
    world = nodes.world
    torch_image(world.shared)
    start = time.monotonic()
    up(world, serving(nodes, None), jobs=[JOB])
    k8s_job = wait_until("the training Job to finish", lambda: finished_job(world, JOB["name"]), timeout=900, every=5)
    TIMINGS.append(("multi-node: the seed's training job on 2 nodes (Pyxis, Enroot, torchrun), submitted to finished",
                    time.monotonic() - start))  # fmt: skip
    logs = job_logs(world, JOB["name"], "sbatch")
    submitted = re.search(r"Submitted batch job (\d+)", logs)
    job_id = int(submitted.group(1)) if submitted else None
    output_file = world.shared / "jobs" / f"train-tiny-{job_id}.out"
    output = output_file.read_text() if output_file.exists() else "(no job output)"
    assert k8s_job["status"].get("succeeded") == 1, f"{logs}\n--- job output:\n{output}"
    yield nodes, job_id, output
    up(world, serving(nodes, None))  # the model back at its base path, the Job gone


def test_slurm_ran_the_job_on_both_container_nodes_to_completion(training):
    nodes, job_id, output = training
    accounted = wait_until(f"job {job_id} COMPLETED in sacct", lambda: completed(nodes, job_id), timeout=60)
    assert accounted["NNodes"] == "2" and accounted["User"] == "alice", accounted
    assert f"UserId=alice({JOB_USER_UID})" in nodes.slurm("scontrol", "show", "job", str(job_id))


def test_each_node_trained_in_the_image_pyxis_started(training):
    nodes, _, output = training
    record = json.loads((nodes.world.shared / "models" / "tiny" / CHECKPOINT / "training.json").read_text())
    assert record["world_size"] == 2 and record["backend"] == "gloo", record
    assert sorted(rank["node"] for rank in record["ranks"]) == list(CONTAINER_NODES), record
    # Debian 12's PyTorch, from the image: the nodes' own Python has no torch
    assert record["torch"].startswith("1.13"), record
    assert record["loss_last"] < record["loss_first"], record
    assert re.search(rf"checkpoint /shared/models/tiny/{CHECKPOINT}: loss", output), output


def test_the_checkpoint_is_alices_and_complete(training):
    nodes = training[0]
    directory = nodes.world.shared / "models" / "tiny" / CHECKPOINT
    files = sorted(p.name for p in directory.iterdir())
    assert files == ["config.json", "pytorch_model.bin", "training.json", "vocab.json"], files
    assert {p.stat().st_uid for p in directory.iterdir()} == {JOB_USER_UID}
    assert not list(directory.parent.glob(".step-*.partial"))


def test_the_model_server_on_another_node_serves_the_new_checkpoint(training):
    nodes = training[0]
    up(nodes.world, serving(nodes, CHECKPOINT))
    wait_until("the model server on the checkpoint",
               lambda: all_ready(nodes.pods(INFERENCE_NS)) and loaded_model(nodes)["path"].endswith(CHECKPOINT),
               timeout=300, every=5)  # fmt: skip
    loaded = loaded_model(nodes)
    assert loaded["node"] in PARTITIONED and loaded["node"] not in CONTAINER_NODES, loaded
    assert "pytorch_model.bin" in json.dumps(loaded["files"]), loaded
