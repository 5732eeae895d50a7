"""The stack's NetworkPolicies, enforced on the real node (kube-router's policy controller, see
tools/node.sh): a Job's pod reaches slurmrestd and the token minter, never slurmctld.

The local stack's Namespaces and NetworkPolicies come from the offline render, exactly as the
program builds them, in namespaces of their own (so the stack's tests are untouched); the
Slurm services are stand-ins with the real pods' name labels, listening on the real ports.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import yaml

from dualsched.components.namespace import SLURMCTLD_PORT
from dualsched.components.render import render_config
from dualsched.components.slurmrestd import RESTD, RESTD_PORT
from dualsched.components.tokens import MINTER, MINTER_PORT
from dualsched.config.loader import parse_stack_config
from node_support import NodeWorld, local_config

pytestmark = pytest.mark.node

SLURM_NS, JOBS_NS, OUTSIDE = "netpol-slurm", "netpol-jobs", "default"
IMAGE = "dualsched.local/python:3.11"  # python3 and coreutils
UID = 65532
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except OSError as error:
    print(type(error).__name__)
"""


def rendered(world: NodeWorld) -> dict[str, list[dict]]:
    """The local stack's Namespaces and NetworkPolicies of Slurm and submission, in the test's namespaces."""
    raw = local_config(world)
    raw["slurm"]["namespace"], raw["submission"]["namespace"] = SLURM_NS, JOBS_NS
    render = render_config(parse_stack_config(raw, "netpol test"), "netpol")
    return {
        "Namespace": [o.manifest for o in render.by_kind("Namespace") if o.name in (SLURM_NS, JOBS_NS)],
        "NetworkPolicy": [o.manifest for o in render.by_kind("NetworkPolicy") if o.namespace in (SLURM_NS, JOBS_NS)],
    }


def pod(namespace: str, name: str, component: str, port: int | None) -> dict:
    """A pod that passes Pod Security ``restricted``; with ``port``, it listens there (ready when it does)."""
    command = ["python3", "-m", "http.server", "--bind", "0.0.0.0", str(port)] if port else ["sleep", "3600"]
    probe = {"readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}} if port else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": component}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,  # nothing to finish: its namespace goes in seconds, not 30
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": command, **probe,
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def service(namespace: str, component: str, port: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": component, "namespace": namespace},
        "spec": {"selector": {"app.kubernetes.io/name": component}, "ports": [{"port": port}]},
    }


class Net:
    before: str
    """What the Job's pod got from slurmctld's port before the policies were applied."""

    def __init__(self, world: NodeWorld):
        self.world = world
        self.rendered = rendered(world)

    def apply(self, objects: list[dict]) -> None:
        self.world.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in objects))

    def ip(self, namespace: str, name: str) -> str:
        return self.world.kget("pod", "-n", namespace, name)["status"]["podIP"]

    def connect(self, namespace: str, name: str, address: str, port: int) -> str:
        """What a TCP connect from the pod gets: 'open', or the error (TimeoutError, ConnectionRefusedError)."""
        result = self.world.kubectl("exec", "-n", namespace, name, "--", "python3", "-c", CONNECT, address, str(port))
        return result.stdout.strip()


@pytest.fixture(scope="module")
def net(node_world: NodeWorld) -> Iterator[Net]:
    net = Net(node_world)
    net.apply(net.rendered["Namespace"])
    net.apply([
        pod(SLURM_NS, "slurmctld", "slurmctld", SLURMCTLD_PORT),
        pod(SLURM_NS, "slurmrestd", RESTD, RESTD_PORT),
        pod(SLURM_NS, "minter", MINTER, MINTER_PORT),
        service(SLURM_NS, RESTD, RESTD_PORT),
        pod(JOBS_NS, "job", "sbatch", None),
        pod(OUTSIDE, "netpol-outsider", "outsider", None),
    ])
    for namespace, name in ((SLURM_NS, "slurmctld"), (SLURM_NS, "slurmrestd"), (SLURM_NS, "minter"), (JOBS_NS, "job"), (OUTSIDE, "netpol-outsider")):
        node_world.kubectl("wait", "--for=condition=Ready", "--timeout=180s", "-n", namespace, f"pod/{name}", timeout=200)
    slurmctld = net.ip(SLURM_NS, "slurmctld")
    net.before = net.connect(OUTSIDE, "netpol-outsider", slurmctld, SLURMCTLD_PORT)
    net.apply(net.rendered["NetworkPolicy"])
    # the enforcer turns the policies into iptables rules as it sees them: wait for the first deny
    deadline = time.monotonic() + 60
    while net.connect(OUTSIDE, "netpol-outsider", slurmctld, SLURMCTLD_PORT) == "open" and time.monotonic() < deadline:
        time.sleep(1)
    yield net
    node_world.kubectl("delete", "pod", "-n", OUTSIDE, "netpol-outsider", "--wait=false", check=False)
    node_world.kubectl("delete", "namespace", SLURM_NS, JOBS_NS, "--wait=true", "--timeout=120s", check=False, timeout=150)


def test_the_rendered_policies_are_the_ones_applied(net):
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in net.rendered["NetworkPolicy"]}
    applied = {(p["metadata"]["namespace"], p["metadata"]["name"])
               for namespace in (SLURM_NS, JOBS_NS) for p in net.world.kget("networkpolicies", "-n", namespace)["items"]}
    assert applied == policies


def test_the_kubelets_probes_still_reach_the_pods(net):
    time.sleep(5)  # a few probe periods (1 s, 3 failures make a pod unready) under the policies
    for name in ("slurmctld", "slurmrestd", "minter"):
        conditions = net.world.kget("pod", "-n", SLURM_NS, name)["status"]["conditions"]
        assert {c["type"]: c["status"] for c in conditions}["Ready"] == "True", name


def test_a_job_reaches_slurmrestd_by_service_and_pod_address(net):
    assert net.connect(JOBS_NS, "job", f"{RESTD}.{SLURM_NS}.svc.cluster.local", RESTD_PORT) == "open"
    assert net.connect(JOBS_NS, "job", net.ip(SLURM_NS, "slurmrestd"), RESTD_PORT) == "open"


def test_a_job_reaches_the_token_minter(net):
    assert net.connect(JOBS_NS, "job", net.ip(SLURM_NS, "minter"), MINTER_PORT) == "open"


def test_the_minter_reaches_the_api_server_and_no_other_port_of_the_node(net):
    node = net.world.kget("nodes")["items"][0]
    address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    api_port = int(net.world.env["DUALSCHED_APISERVER_PORT"])  # network.apiServerPorts (local_config)
    assert net.connect(SLURM_NS, "minter", address, api_port) == "open"
    assert net.connect(SLURM_NS, "minter", address, 10250) != "open"  # the kubelet, on the same address


def test_slurmctld_takes_jobs_and_slurmrestd_but_not_other_pods(net):
    slurmctld = net.ip(SLURM_NS, "slurmctld")
    assert net.before == "open", "without the policies the pod network lets any pod reach slurmctld"
    # the same listener, four clients: labels and namespaces decide
    assert net.connect(SLURM_NS, "slurmrestd", slurmctld, SLURMCTLD_PORT) == "open"
    assert net.connect(JOBS_NS, "job", slurmctld, SLURMCTLD_PORT) == "open"  # sbatch with its token
    assert net.connect(SLURM_NS, "minter", slurmctld, SLURMCTLD_PORT) != "open"
    assert net.connect(OUTSIDE, "netpol-outsider", slurmctld, SLURMCTLD_PORT) != "open"


def test_a_job_cannot_reach_other_ports_of_an_allowed_pod(net):
    # slurmrestd's pod, on the minter's port: allowed peers are allowed one port each
    assert net.connect(JOBS_NS, "job", net.ip(SLURM_NS, "slurmrestd"), MINTER_PORT) != "open"


def test_a_pod_of_another_namespace_reaches_neither_slurmrestd_nor_a_job(net):
    # "default" has no policies: only the destinations' ingress rules can stop this pod
    net.apply([pod(JOBS_NS, "listener", "sbatch", RESTD_PORT)])
    net.world.kubectl("wait", "--for=condition=Ready", "--timeout=120s", "-n", JOBS_NS, "pod/listener", timeout=150)
    assert net.connect(OUTSIDE, "netpol-outsider", net.ip(SLURM_NS, "slurmrestd"), RESTD_PORT) != "open"
    assert net.connect(OUTSIDE, "netpol-outsider", net.ip(JOBS_NS, "listener"), RESTD_PORT) != "open"
