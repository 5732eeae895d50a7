"""The node keeper: the pools' labels and taints on their nodes, kept by a small program in the cluster.

Taints are not patched by Pulumi: under server-side apply ``spec.taints`` is one atomic list, which
other writers share (docs/architecture.md, "Node labels and taints"). Labels are not either: a resource per node
costs the engine its whole Node in the state at every step (docs/benchmark.md). The program
(components/programs/node_keeper.py) merge-patches both, touching only the labels and taints it owns,
and switches a time-shared pool's window taint at the window's edges. Here: the program and its
desired state (the labels and taints stay code: they come from the StackConfig, and a change shows in
the ConfigMap's diff), its RBAC, the admission policy that bounds it, and its Deployment.

A node that leaves every pool must lose the pool's labels (or its slurmd pod, with the munge key, stays), so the
keeper lists and patches nodes it cannot name in advance. RBAC cannot say "only remove": it grants get, list and
patch on all nodes, plus a verb no API serves (KEEP_VERB) on the pool nodes by name. A ValidatingAdmissionPolicy
asks the authorizer for that verb: on any other node the keeper may only remove labels, taints and annotations,
and only the labels and taints its records there name. So a stolen keeper token can still put a pool's labels on
the pool's own nodes only, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import (
    bind_role, child, config_map_volume, labels, locked_down, meta, mount, off_gpu_pools, pod_runs_as_nobody, tolerations_for,
)
from dualsched.components.nodepools import keeper_namespace, pool_labels
from dualsched.components.programs import source
from dualsched.components.programs.node_keeper import KEPT_BY_LABEL, LEASE, LEASE_SECONDS, OWNED_ANNOTATION, OWNED_LABELS_ANNOTATION
from dualsched.config.models import NOBODY_UID, NodePool, StackConfig, Taint

KEEPER = "node-keeper"
PROGRAM_FILE = "node_keeper.py"
STATE_FILE = "desired.json"
KEEPER_DIR = "/opt/node-keeper"
KEEPER_PORT = 8080
KEEP_VERB = "keep"
"""Granted on the pool nodes by name; no API serves it: the admission policy asks the authorizer for it."""


def _taint(taint: Taint) -> dict[str, str]:
    return {"key": taint.key, "value": taint.value, "effect": taint.effect.value}


def _window(config: StackConfig, pool: NodePool) -> Optional[dict]:
    window = pool.inference_window
    if window is None:
        return None
    return {"startMinute": window.start_minute, "durationMinutes": window.duration_minutes, "taint": _taint(config.window_taint)}


def desired_state(config: StackConfig) -> dict:
    """What the program reads: the label selector of the nodes it keeps, and each pool's nodes, labels, static taints
    and (time-shared) inference window; for a pool whose nodes join by label, the selector that makes a node of its
    bound a member."""
    return {
        "keptBy": f"{KEPT_BY_LABEL}={keeper_namespace(config)}",
        "pools": [
            {
                "name": pool.name,
                "nodes": pool.node_names,
                "labels": pool_labels(config, pool),
                "taints": [_taint(t) for t in config.pool_taints(pool)],
                "window": _window(config, pool),
                **({"joinSelector": f"{config.placement.pool_label}={pool.name}"} if pool.join_by_label else {}),
            }
            for pool in config.pools
        ]
    }


def kept_taints(config: StackConfig) -> tuple[Taint, ...]:
    """Every taint the keeper may set; it tolerates them all, so its own taints never evict it."""
    taints = [t for pool in config.pools for t in config.pool_taints(pool)]
    return tuple(dict.fromkeys((*taints, *config.window_taints)))


def _authorized(verb: str) -> str:
    return f"authorizer.group('').resource('nodes').name(object.metadata.name).check('{verb}').allowed()"


def _recorded(annotation: str) -> str:
    """The items of one of the keeper's records on the node before the change (none without it)."""
    return (f"has(oldObject.metadata.annotations) && '{annotation}' in oldObject.metadata.annotations ? "
            f"oldObject.metadata.annotations['{annotation}'].split(',') : []")  # fmt: skip


RECORDED = {"ownedLabels": _recorded(OWNED_LABELS_ANNOTATION), "ownedTaints": _recorded(OWNED_ANNOTATION)}
"""The admission policy's variables: what the keeper recorded as its own on the node."""
RELEASE_ONLY = (
    ("!has(object.metadata.labels) || object.metadata.labels.all(k, has(oldObject.metadata.labels) && "
     "k in oldObject.metadata.labels && oldObject.metadata.labels[k] == object.metadata.labels[k])",
     "the node keeper may not add or change labels on a node of no pool"),
    ("!has(oldObject.metadata.labels) || oldObject.metadata.labels.all(k, "
     "(has(object.metadata.labels) && k in object.metadata.labels) || k in variables.ownedLabels)",
     "the node keeper may remove only the labels it recorded from a node of no pool"),
    ("!has(object.spec.taints) || object.spec.taints.all(t, has(oldObject.spec.taints) && "
     "oldObject.spec.taints.exists(o, o.key == t.key && o.effect == t.effect))",
     "the node keeper may not add taints to a node of no pool"),
    ("!has(oldObject.spec.taints) || oldObject.spec.taints.all(o, (has(object.spec.taints) && "
     "object.spec.taints.exists(t, t.key == o.key && t.effect == o.effect)) || (o.key + ':' + o.effect) in variables.ownedTaints)",
     "the node keeper may remove only the taints it recorded from a node of no pool"),
    ("(has(object.spec.unschedulable) && object.spec.unschedulable) == (has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable)",
     "the node keeper may not cordon or uncordon a node of no pool"),
    ("!has(object.metadata.annotations) || object.metadata.annotations.all(k, has(oldObject.metadata.annotations) && "
     "k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k])",
     "the node keeper may not add or change annotations on a node of no pool"),
)  # fmt: skip
"""On a node whose name the keeper's role does not list: what a release does (remove the labels and taints it
recorded, and its records), and nothing else."""


@dataclass(frozen=True)
class NodeKeeperArgs:
    config: StackConfig
    namespace: pulumi.Input[str]


class NodeKeeper(pulumi.ComponentResource):
    """Desired state, program, RBAC, its admission policy and a one-replica Deployment; ready once the pool nodes
    carry the labels and taints wanted now, and the nodes that left every pool none of them. Deleting it leaves
    them on the nodes as they are."""

    config_map_name: pulumi.Output[str]

    def __init__(self, name: str, args: NodeKeeperArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:node_keeper:NodeKeeper", name, None, opts)
        config, namespace = args.config, args.namespace
        keeper_labels = labels(KEEPER, config.slurm.cluster_name if config.slurm else name)
        account = k8s.core.v1.ServiceAccount(name, metadata=meta(namespace=namespace, labels=keeper_labels), opts=child(self))
        nodes = sorted({node for pool in config.pools for node in pool.node_names})
        allowed = [self._allow_node_patches(name, account, namespace, keeper_labels, nodes),
                   *self._lease(name, account, namespace, keeper_labels)]
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
            # its first pass needs its rights: started before its ClusterRole, it logged 403s for a pass
            opts=child(self, depends_on=allowed),
        )
        self.config_map_name = files.metadata.name
        self.register_outputs({"config_map_name": self.config_map_name})

    def _allow_node_patches(
        self, name: str, account: k8s.core.v1.ServiceAccount, namespace, keeper_labels, nodes: list[str]
    ) -> pulumi.CustomResource:
        # Nodes are cluster-scoped: a ClusterRole. Its patches on nodes outside the pools are bounded by the
        # policy, which is in force before the role exists. Every keeper reads the others' Leases, in namespaces
        # it cannot know in advance: whether the keeper of a node its pools name is still there.
        policy = self._release_only_outside_the_pools(name, account, namespace, keeper_labels)
        every_node = k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], verbs=["get", "list", "patch"])
        pool_nodes = k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], resource_names=nodes, verbs=[KEEP_VERB])
        leases = k8s.rbac.v1.PolicyRuleArgs(api_groups=["coordination.k8s.io"], resources=["leases"], resource_names=[LEASE], verbs=["get"])
        return bind_role(self, name, account, namespace, keeper_labels, every_node, pool_nodes, leases, cluster_wide=True, after=[policy])

    def _lease(self, name: str, account: k8s.core.v1.ServiceAccount, namespace, keeper_labels) -> tuple[pulumi.Resource, ...]:
        """The keeper's Lease, which it renews each pass, and its right to renew that one alone. It goes with the
        namespace: a destroyed stack's nodes may be taken by another at once."""
        lease = k8s.coordination.v1.Lease(
            name,
            metadata=meta(name=LEASE, namespace=namespace, labels=keeper_labels),
            spec=k8s.coordination.v1.LeaseSpecArgs(holder_identity=namespace, lease_duration_seconds=LEASE_SECONDS),
            opts=child(self),
        )
        renew = k8s.rbac.v1.PolicyRuleArgs(api_groups=["coordination.k8s.io"], resources=["leases"], resource_names=[LEASE], verbs=["patch"])
        return lease, bind_role(self, f"{name}-lease", account, namespace, keeper_labels, renew)

    def _release_only_outside_the_pools(
        self, name: str, account: k8s.core.v1.ServiceAccount, namespace, keeper_labels
    ) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding:
        admission = k8s.admissionregistration.v1
        by_keeper = pulumi.Output.all(namespace, account.metadata.name).apply(
            lambda named: f"request.userInfo.username == 'system:serviceaccount:{named[0]}:{named[1]}'"
        )
        policy = admission.ValidatingAdmissionPolicy(
            name,
            metadata=meta(labels=keeper_labels),
            spec=admission.ValidatingAdmissionPolicySpecArgs(
                failure_policy="Fail",
                match_constraints=admission.MatchResourcesArgs(
                    resource_rules=[
                        admission.NamedRuleWithOperationsArgs(api_groups=[""], api_versions=["v1"], operations=["UPDATE"], resources=["nodes"])
                    ]
                ),
                match_conditions=[
                    admission.MatchConditionArgs(name="by-the-node-keeper", expression=by_keeper),
                    admission.MatchConditionArgs(name="on-a-node-of-no-pool", expression=f"!{_authorized(KEEP_VERB)}"),
                ],
                variables=[admission.VariableArgs(name=n, expression=e) for n, e in RECORDED.items()],
                validations=[admission.ValidationArgs(expression=e, message=m) for e, m in RELEASE_ONLY],
            ),
            opts=child(self),
        )
        return admission.ValidatingAdmissionPolicyBinding(
            name,
            metadata=meta(labels=keeper_labels),
            spec=admission.ValidatingAdmissionPolicyBindingSpecArgs(policy_name=policy.metadata.name, validation_actions=["Deny"]),
            opts=child(self),
        )

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
