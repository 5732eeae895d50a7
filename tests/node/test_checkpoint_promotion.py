"""Checkpoints to serving on the real node: a Slurm training job writes checkpoints to the shared file
system, a config change (`inference.models[].revision`) promotes one, and the model server rolls to it
while a client keeps calling it through its Service, without one failed request; setting the earlier
revision back rolls back the same way. The model server is the stand-in (no inference): it serves the
directory it loaded, which is what is checked."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Iterator, Optional

import pytest

from node_support import NodeWorld, local_config
from test_real_node import INFERENCE_NS, Cluster, all_ready, up, wait_until

from dualsched.components.inference import DRAIN_SECONDS

pytestmark = pytest.mark.node

MODEL = "tiny"
CLIENTS_NS = "checkpoint-clients"
CLIENT = "client"
SERVED = f"http://{MODEL}.{INFERENCE_NS}.svc.cluster.local/v1/models"
# The client stops when its stdin closes, so that its last answer is whole: a client killed in the middle
# of a line left a cut one ("ok") that read as a failed request.
POLL = f"""
import json, sys, threading, time, urllib.request
end = time.time() + float(sys.argv[1])
stdin_closed = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stdin_closed.set()), daemon=True).start()
while time.time() < end and not stdin_closed.is_set():
    try:
        with urllib.request.urlopen("{SERVED}", timeout=3) as response:
            print("ok", json.load(response)["data"][0]["root"], flush=True)
    except Exception as error:
        print("failed", type(error).__name__, flush=True)
    time.sleep(0.2)
"""


def serving(world: NodeWorld, revision: Optional[str]) -> dict:
    """The local stack with the model at ``revision``, called by pods of the clients' namespace."""
    config = local_config(world)
    [model] = config["inference"]["models"]
    assert model["name"] == MODEL
    if revision:
        model["revision"] = revision
    config["inference"]["clientNamespaces"] = [CLIENTS_NS]
    return config


def client_pod() -> dict:
    """A client in a namespace of its own, listed in inference.clientNamespaces (no policy of ours applies)."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": CLIENT, "namespace": CLIENTS_NS},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "client", "image": "dualsched.local/python:3.11", "imagePullPolicy": "Never",
                "command": ["python3", "-c", "import time; time.sleep(86400)"],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


class Promotion:
    def __init__(self, cluster: Cluster):
        self.cluster, self.world = cluster, cluster.world

    def train(self, step: str) -> int:
        """A Slurm job as alice writes a checkpoint directory, complete before it has its name."""
        script = (f"set -eu; d=/shared/models/{MODEL}; mkdir -p $d/.{step}.partial; "
                  f"echo \"weights of job $SLURM_JOB_ID\" > $d/.{step}.partial/weights.bin; mv $d/.{step}.partial $d/{step}")
        job = self.cluster.submit_as("alice", "--partition=gpu", "--mem=64M", "--output=/dev/null", "--time=1", "--wrap", script)
        state = wait_until(f"job {job} to end", lambda: self.cluster.job_state(job) in ("COMPLETED", "FAILED", "CANCELLED") and
                           self.cluster.job_state(job), timeout=120)  # fmt: skip
        assert state == "COMPLETED", f"job {job}: {state}"
        return job

    def servers(self) -> list[dict]:
        return [p for p in self.cluster.pods(INFERENCE_NS) if p["metadata"].get("deletionTimestamp") is None]

    def rolled_out(self, revision: Optional[str]) -> bool:
        """Every server runs the template of ``revision``, Ready, and no old one is left."""
        path = f"/models/{MODEL}" + (f"/{revision}" if revision else "")
        pods = self.cluster.pods(INFERENCE_NS)
        commands = [next(c for c in p["spec"]["containers"] if c["name"] == "server")["command"] for p in pods]
        return all_ready(pods) and len(pods) == 1 and all(command[2] == path for command in commands)

    def up_while_calling(self, revision: Optional[str]) -> list[str]:
        """`pulumi up` to ``revision`` while the client calls the Service; every answer, in order."""
        poller = subprocess.Popen(
            ["kubectl", "exec", "-i", "-n", CLIENTS_NS, CLIENT, "--", "python3", "-c", POLL, "300"],
            env=self.world.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            time.sleep(3)  # answers from the server before the change
            up(self.world, serving(self.world, revision))
            wait_until(f"the server rolled out to {revision}", lambda: self.rolled_out(revision), timeout=240, every=2)
            time.sleep(DRAIN_SECONDS + 3)  # answers once the old server has stopped
        finally:
            try:
                out, err = poller.communicate(timeout=30)  # closes the client's stdin: it ends after its answer
            except subprocess.TimeoutExpired:
                poller.kill()
                raise
        answers = out.splitlines()
        assert answers, f"the client printed nothing: {err}"
        return answers


@pytest.fixture(scope="module")
def promotion(node_world: NodeWorld) -> Iterator[Promotion]:
    cluster = Cluster(node_world)
    up(node_world, serving(node_world, None))
    node_world.kubectl("create", "namespace", CLIENTS_NS, check=False)
    node_world.kubectl("apply", "-f", "-", input=json.dumps(client_pod()))
    wait_until("the client pod Ready", lambda: all_ready([node_world.kget("pod", CLIENT, "-n", CLIENTS_NS)]), timeout=120)
    promotion = Promotion(cluster)
    yield promotion
    node_world.kubectl("delete", "namespace", CLIENTS_NS, "--wait=false", check=False)
    up(node_world, local_config(node_world))


def test_a_training_job_writes_checkpoints_the_server_does_not_serve_yet(promotion):
    for step in ("step-1", "step-2"):
        job = promotion.train(step)
        assert (promotion.world.shared / "models" / MODEL / step / "weights.bin").read_text() == f"weights of job {job}\n"
    assert promotion.rolled_out(None)


def _without_a_failed_request(answers: list[str], before: str, after: str) -> None:
    assert [answer for answer in answers if not answer.startswith("ok ")] == []
    assert answers[0] == f"ok /models/{before}" and answers[-1] == f"ok /models/{after}"


def test_promoting_a_checkpoint_rolls_the_server_to_it_without_a_failed_request(promotion):
    _without_a_failed_request(promotion.up_while_calling("step-1"), MODEL, f"{MODEL}/step-1")
    _without_a_failed_request(promotion.up_while_calling("step-2"), f"{MODEL}/step-1", f"{MODEL}/step-2")


def test_setting_the_earlier_revision_back_rolls_back_without_a_failed_request(promotion):
    _without_a_failed_request(promotion.up_while_calling("step-1"), f"{MODEL}/step-2", f"{MODEL}/step-1")
