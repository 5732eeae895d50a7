"""Slurm metrics for Prometheus: the exporter's containers in slurmctld's pod, its Service, a ServiceMonitor.

No Slurm exporter is packaged in Debian 12 and the Go module proxy refuses the common ones, and
slurmctld's own metrics endpoint arrives with Slurm 25.11 (this library deploys 25.05, tests 22.05):
so a small exporter of our own reads what Slurm's commands print (docs/metrics.md). The Slurm images
need not carry Python and the Python image carries no Slurm, so the pod gets two containers: the
collector (Slurm image, SlurmUser with the munge socket) writes ``scontrol``/``squeue``/``sdiag``
output into a shared emptyDir each round, and the exporter (Python image, nobody) serves it on
``/metrics``. Their programs travel in slurmctld's programs ConfigMap.

The ServiceMonitor is the Prometheus Operator's CRD: created only when the config says the operator
is there, since a preview cannot reliably ask the cluster whether the CRD exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import child, labels, locked_down, meta, mount, tcp_probe
from dualsched.components.namespace import METRICS_PORT
from dualsched.components.slurm_files import CONTROLLER_SERVICE
from dualsched.components.submission import PROGRAM_DIR
from dualsched.config.models import NOBODY_UID, SlurmMetrics as MetricsConfig, StackConfig

METRICS_SERVICE = "slurm-metrics"
EXPORTER_PROGRAM = "slurm_exporter.py"
COLLECTOR_PROGRAM = "collect_slurm_state.sh"
STATE_VOLUME = "metrics-state"
STATE_DIR = "/var/run/slurm-metrics"
STALE_ROUNDS = 3
"""A snapshot older than this many collection rounds makes ``slurm_up`` 0."""


def collector_command(metrics: MetricsConfig) -> list[str]:
    """The collector's loop; one round is the program, so the tests run the same one against real Slurm."""
    return ["sh", "-c", f"while :; do sh {PROGRAM_DIR}/{COLLECTOR_PROGRAM} {STATE_DIR}; sleep {metrics.interval_seconds}; done"]


def exporter_container(config: StackConfig) -> k8s.core.v1.ContainerArgs:
    """The HTTP side: parses the collector's latest files on each scrape; runs as nobody, reads only."""
    metrics = config.slurm.metrics
    environment = {
        "EXPORTER_STATE_DIR": STATE_DIR,
        "EXPORTER_PORT": str(METRICS_PORT),
        "EXPORTER_MAX_AGE": str(STALE_ROUNDS * metrics.interval_seconds),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return k8s.core.v1.ContainerArgs(
        name="exporter",
        image=config.images.python,
        command=["python3", f"{PROGRAM_DIR}/{EXPORTER_PROGRAM}"],
        env=[k8s.core.v1.EnvVarArgs(name=key, value=value) for key, value in environment.items()],
        ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=METRICS_PORT)],
        readiness_probe=tcp_probe(METRICS_PORT, period=10),
        liveness_probe=tcp_probe(METRICS_PORT, period=30),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "32Mi"}, limits={"cpu": "200m", "memory": "96Mi"}
        ),
        volume_mounts=[mount("programs", PROGRAM_DIR, read_only=True), mount(STATE_VOLUME, STATE_DIR, read_only=True)],
        security_context=locked_down(run_as_user=NOBODY_UID),
    )


def service_labels(config: StackConfig) -> dict[str, str]:
    return labels(METRICS_SERVICE, config.slurm.cluster_name)


def service_monitor_spec(config: StackConfig) -> dict:
    """Scrape the Service's ``metrics`` port in its own namespace (the ServiceMonitor's default)."""
    return {
        "selector": {"matchLabels": service_labels(config)},
        "endpoints": [{"port": "metrics", "path": "/metrics", "interval": f"{config.slurm.metrics.interval_seconds}s"}],
    }


@dataclass(frozen=True)
class SlurmMetricsArgs:
    config: StackConfig
    namespace: pulumi.Input[str]


class SlurmMetrics(pulumi.ComponentResource):
    """The exporter's Service (ClusterIP, port ``metrics``) in front of slurmctld's pods and, when the
    Prometheus Operator is there, a ServiceMonitor for it. The containers are slurmctld's
    (``components.controller``); the NetworkPolicy is the Slurm namespace's (``components.namespace``)."""

    service_name: pulumi.Output[str]

    def __init__(self, name: str, args: SlurmMetricsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:metrics:SlurmMetrics", name, None, opts)
        config = args.config
        own_labels = service_labels(config)
        service = k8s.core.v1.Service(
            name,
            metadata=meta(name=METRICS_SERVICE, namespace=args.namespace, labels=own_labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="ClusterIP",
                selector=labels(CONTROLLER_SERVICE, config.slurm.cluster_name),
                ports=[k8s.core.v1.ServicePortArgs(name="metrics", port=METRICS_PORT, target_port="metrics")],
            ),
            opts=child(self),
        )
        if config.slurm.metrics.service_monitor:
            k8s.apiextensions.CustomResource(
                name,
                api_version="monitoring.coreos.com/v1",
                kind="ServiceMonitor",
                metadata=meta(namespace=args.namespace, labels={**own_labels, **config.slurm.metrics.service_monitor_labels}),
                spec=service_monitor_spec(config),
                opts=child(self),
            )
        self.service_name = service.metadata.name
        self.register_outputs({"service_name": self.service_name})
