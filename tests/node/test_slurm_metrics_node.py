"""Slurm metrics on the real node: the local stack with ``slurm.metrics`` on, the exporter's two
containers running in slurmctld's pod on the real kubelet, scraped through its Service the way
Prometheus does, from a pod of a scrape namespace. The ``node`` label of every per-node series is the
name Kubernetes gives the node (what kube-state-metrics' kube_pod_info carries), so one PromQL join
works; a running Slurm job shows on it; a pod of another namespace cannot scrape (NetworkPolicy)."""

from __future__ import annotations

from typing import Iterator, Optional

import pytest
import yaml

from dualsched.components.metrics import METRICS_SERVICE
from dualsched.components.namespace import METRICS_PORT
from exposition import find, parse
from node_support import NodeWorld, local_config
from test_network_policy import CONNECT, pod
from test_real_node import NODE, SLURM_NS, Cluster, all_ready, up, wait_until

pytestmark = pytest.mark.node

SCRAPE_NS, OUTSIDE = "monitoring", "default"
URL = f"http://{METRICS_SERVICE}.{SLURM_NS}.svc.cluster.local:{METRICS_PORT}/metrics"
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"


class Scrapes:
    def __init__(self, cluster: Cluster):
        self.cluster, self.world = cluster, cluster.world

    def scrape(self):
        """What Prometheus would read: the Service's /metrics from the scraper pod, parsed strictly."""
        out = self.world.kubectl("exec", "-n", SCRAPE_NS, "scraper", "--", "python3", "-c", FETCH, URL).stdout
        return parse(out)[1]

    def connect(self, namespace: str, name: str, address: str) -> str:
        return self.world.kubectl("exec", "-n", namespace, name, "--", "python3", "-c", CONNECT, address, str(METRICS_PORT)).stdout.strip()


@pytest.fixture(scope="module")
def scrapes(node_world: NodeWorld) -> Iterator[Scrapes]:
    config = local_config(node_world)
    config["slurm"]["metrics"] = {"enabled": True, "scrapeNamespaces": [SCRAPE_NS], "intervalSeconds": 5}
    up(node_world, config)
    cluster = Cluster(node_world)
    wait_until(f"every pod in {SLURM_NS} Ready", lambda: all_ready(cluster.pods(SLURM_NS)), timeout=420)
    node_world.kubectl("create", "namespace", SCRAPE_NS)
    node_world.kubectl("apply", "-f", "-", input=_manifests())
    for namespace, name in ((SCRAPE_NS, "scraper"), (OUTSIDE, "metrics-outsider")):
        node_world.kubectl("wait", "--for=condition=Ready", "--timeout=180s", "-n", namespace, f"pod/{name}", timeout=200)
    yield Scrapes(cluster)
    node_world.kubectl("delete", "pod", "-n", OUTSIDE, "metrics-outsider", "--wait=false", check=False)
    node_world.kubectl("delete", "namespace", SCRAPE_NS, "--wait=true", "--timeout=120s", check=False, timeout=150)


def _manifests() -> str:
    return "\n---\n".join(yaml.safe_dump(p) for p in (pod(SCRAPE_NS, "scraper", "prometheus", None), pod(OUTSIDE, "metrics-outsider", "outsider", None)))


def test_the_services_metrics_name_the_node_as_kubernetes_does(scrapes):
    def up_and_idle() -> Optional[list]:
        samples = scrapes.scrape()
        up = find(samples, "slurm_up")
        return samples if up and up[0].value == 1 and find(samples, "slurm_node_state", node=NODE, state="idle") else None

    samples = wait_until("the exporter to report the node idle", up_and_idle, timeout=120)
    slurmd = scrapes.cluster.slurmd_pod()
    # kube-state-metrics labels kube_pod_info with spec.nodeName: the same value, so `on(node)` joins
    assert {s.labels["node"] for s in find(samples, "slurm_node_state")} == {slurmd["spec"]["nodeName"]} == {NODE}
    assert find(samples, "slurm_node_gpus", node=NODE)[0].value == 2  # the pool's slurmGpus, of its 4


def test_a_running_job_shows_on_the_node_its_pods_run_on(scrapes):
    job = scrapes.cluster.submit_as("alice", "--partition=gpu", "--gres=gpu:1", "--mem=64M", "--time=5", "--output=/dev/null", "--wrap", "sleep 60")

    def placed() -> Optional[list]:
        samples = scrapes.scrape()
        return samples if find(samples, "slurm_job_node", job_id=str(job), node=NODE, user="alice") else None

    samples = wait_until(f"job {job} on {NODE} in the metrics", placed, timeout=120)
    assert find(samples, "slurm_node_gpus_allocated", node=NODE)[0].value == 1
    assert find(samples, "slurm_node_jobs", node=NODE)[0].value == 1
    scrapes.cluster.slurm("scancel", str(job))


def test_only_the_scrape_namespace_reaches_the_exporter(scrapes):
    address = scrapes.world.kget("pod", "-n", SLURM_NS, "slurmctld-0")["status"]["podIP"]
    assert scrapes.connect(SCRAPE_NS, "scraper", address) == "open"
    assert scrapes.connect(OUTSIDE, "metrics-outsider", address) != "open"
