"""The node keeper: the pools' labels and taints on their nodes, kept by a small program in the cluster.

Taints are not patched by Pulumi: under server-side apply ``spec.taints`` is one atomic list, which
other writers share (docs/architecture.md, "Node labels and taints"). Labels are not either: a resource per node
costs the engine its whole Node in the state at every step (docs/benchmark.md). The program
(components/programs/node_keeper.py) merge-patches both, touching only the labels and taints it owns,
and switches a time-shared pool's window taint at the window's edges. Here: the program and its
desired state (the labels and taints stay code: they come from the StackConfig, and a change shows in
the ConfigMap's diff), its RBAC (get and patch on the pool nodes, by name) and its Deployment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import (
    bind_cluster_role, child, config_map_volume, labels, locked_down, meta, mount, off_gpu_pools, pod_runs_as_nobody, tolerations_for,
)
from dualsched.components.nodepools import pool_labels
from dualsched.components.programs import source
from dualsched.config.models import NOBODY_UID, NodePool, StackConfig, Taint

KEEPER = "node-keeper"
PROGRAM_FILE = "node_keeper.py"
STATE_FILE = "desired.json"
KEEPER_DIR = "/opt/node-keeper"
KEEPER_PORT = 8080


def _taint(taint: Taint) -> dict[str, str]:
    return {"key": taint.key, "value": taint.value, "effect": taint.effect.value}


def _window(config: StackConfig, pool: NodePool) -> Optional[dict]:
    window = pool.inference_window
    if window is None:
        return None
    return {"startMinute": window.start_minute, "durationMinutes": window.duration_minutes, "taint": _taint(config.window_taint)}


def desired_state(config: StackConfig) -> dict:
    """What the program reads: each pool's nodes, labels, static taints and (time-shared) inference window."""
    return {
        "pools": [
            {
                "name": pool.name,
                "nodes": pool.node_names,
                "labels": pool_labels(config, pool),
                "taints": [_taint(t) for t in config.pool_taints(pool)],
                "window": _window(config, pool),
            }
            for pool in config.pools
        ]
    }


def kept_taints(config: StackConfig) -> tuple[Taint, ...]:
    """Every taint the keeper may set; it tolerates them all, so its own taints never evict it."""
    taints = [t for pool in config.pools for t in config.pool_taints(pool)]
    return tuple(dict.fromkeys((*taints, *config.window_taints)))


@dataclass(frozen=True)
class NodeKeeperArgs:
    config: StackConfig
    namespace: pulumi.Input[str]


class NodeKeeper(pulumi.ComponentResource):
    """Desired state, program, RBAC and a one-replica Deployment; ready once the pool nodes carry
    the labels and taints wanted now. Deleting it leaves them on the nodes as they are."""

    config_map_name: pulumi.Output[str]

    def __init__(self, name: str, args: NodeKeeperArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:node_keeper:NodeKeeper", name, None, opts)
        config, namespace = args.config, args.namespace
        keeper_labels = labels(KEEPER, config.slurm.cluster_name if config.slurm else name)
        account = k8s.core.v1.ServiceAccount(name, metadata=meta(namespace=namespace, labels=keeper_labels), opts=child(self))
        nodes = sorted({node for pool in config.pools for node in pool.node_names})
        self._allow_node_patches(name, account, namespace, keeper_labels, nodes)
        # Program and desired state in one auto-named ConfigMap: a change replaces it under a new name,
        # which rolls the pod, and the new pod is ready once the nodes carry the new labels and taints.
        files = k8s.core.v1.ConfigMap(
            name,
            metadata=meta(namespace=namespace, labels=keeper_labels),
            data={PROGRAM_FILE: source(PROGRAM_FILE), STATE_FILE: json.dumps(desired_state(config), indent=2)},
            opts=child(self),
        )
        k8s.apps.v1.Deployment(
            name,
            metadata=meta(namespace=namespace, labels=keeper_labels),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                # Never two keepers at once (an old one would put back what the new one removes): no surge, the
                # old pod goes first, and it stops at SIGTERM. Not Recreate: its new ReplicaSet only appears once
                # the old pod is gone, and the engine's await may take the old one's readiness for the rollout's.
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_surge=0, max_unavailable=1),
                ),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=keeper_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=keeper_labels), spec=self._pod_spec(config, account.metadata.name, files.metadata.name)
                ),
            ),
            opts=child(self),
        )
        self.config_map_name = files.metadata.name
        self.register_outputs({"config_map_name": self.config_map_name})

    def _allow_node_patches(self, name: str, account: k8s.core.v1.ServiceAccount, namespace, keeper_labels, nodes: list[str]) -> None:
        # Nodes are cluster-scoped: a ClusterRole, with get and patch on the pool nodes by name only.
        rule = k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], resource_names=nodes, verbs=["get", "patch"])
        bind_cluster_role(self, name, account, namespace, keeper_labels, rule)

    @staticmethod
    def _pod_spec(config: StackConfig, account: pulumi.Input[str], files: pulumi.Input[str]) -> k8s.core.v1.PodSpecArgs:
        def probe(path: str, period: int) -> k8s.core.v1.ProbeArgs:
            return k8s.core.v1.ProbeArgs(http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port=KEEPER_PORT), period_seconds=period)

        return k8s.core.v1.PodSpecArgs(
            service_account_name=account,
            automount_service_account_token=True,  # its own token, for the node GETs and PATCHes
            affinity=off_gpu_pools(config.placement.pool_label),
            tolerations=tolerations_for(kept_taints(config)) or None,
            security_context=pod_runs_as_nobody(fs_group=True),
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="keeper",
                    image=config.images.python,
                    command=["python3", f"{KEEPER_DIR}/{PROGRAM_FILE}"],
                    env=[
                        k8s.core.v1.EnvVarArgs(name="KEEPER_DESIRED_FILE", value=f"{KEEPER_DIR}/{STATE_FILE}"),
                        k8s.core.v1.EnvVarArgs(name="KEEPER_PORT", value=str(KEEPER_PORT)),
                        k8s.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"),
                    ],
                    ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=KEEPER_PORT)],
                    # ready once a pass found every pool node as wanted: what the model servers wait for
                    readiness_probe=probe("/readyz", period=5),
                    liveness_probe=probe("/healthz", period=20),
                    resources=k8s.core.v1.ResourceRequirementsArgs(
                        requests={"cpu": "10m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
                    ),
                    volume_mounts=[mount("files", KEEPER_DIR, read_only=True)],
                    security_context=locked_down(run_as_user=NOBODY_UID),
                )
            ],
            volumes=[config_map_volume("files", files)],
        )
