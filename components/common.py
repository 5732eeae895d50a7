"""Small builders every component shares: labels, security contexts, resources."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from dualsched.config.models import GPU_RESOURCE, NOBODY_UID, Resources, ResourceList, StackConfig, Taint

PART_OF = "dualsched"
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
"""pulumi-kubernetes' annotation for objects whose readiness `pulumi up` must not wait for."""


def labels(component: str, instance: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels; selectors use the same set."""
    return {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/part-of": PART_OF,
    }


def meta(
    name: Optional[str] = None,
    namespace: Optional[pulumi.Input[str]] = None,
    labels: Optional[Mapping[str, str]] = None,
    annotations: Optional[Mapping[str, pulumi.Input[str]]] = None,
) -> k8s.meta.v1.ObjectMetaArgs:
    """ObjectMeta; ``name`` only where something must know it first (DNS, Slurm, a PV's claimRef), else Pulumi
    auto-names."""
    return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=labels, annotations=annotations)


def child(parent: pulumi.Resource, **options) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, **options)


def stateful(parent: pulumi.Resource, protect: bool, **options) -> pulumi.ResourceOptions:
    """Options for data that must outlive the program: kept on delete, protected in prod."""
    return pulumi.ResourceOptions(parent=parent, protect=protect, retain_on_delete=True, **options)


def resource_list(resources: ResourceList, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    values = {kind: value for kind, value in (("cpu", resources.cpu), ("memory", resources.memory)) if value}
    return {**values, **(extra or {})}


def requirements(resources: Resources, gpus: int = 0) -> k8s.core.v1.ResourceRequirementsArgs:
    """Requests and limits; GPUs are set on both, as the device plugin requires."""
    gpu = {GPU_RESOURCE: str(gpus)} if gpus else None
    return k8s.core.v1.ResourceRequirementsArgs(
        requests=resource_list(resources.requests, gpu), limits=resource_list(resources.limits, gpu)
    )


def tolerations_for(taints: tuple[Taint, ...]) -> list[k8s.core.v1.TolerationArgs]:
    return [
        k8s.core.v1.TolerationArgs(key=taint.key, operator="Equal", value=taint.value, effect=taint.effect.value)
        for taint in taints
    ]


def control_daemon_placement(config: StackConfig, spread: Optional[dict[str, str]] = None) -> dict:
    """Where Slurm's control daemons run (PodSpecArgs keyword arguments): preferably off the GPU
    pools, and never evicted by the closed-window taint, which exists to move model servers off a
    time-shared node, not the controller or the database a running job reports to. Tolerated with or
    without a window, so switching a pool to time-shared restarts none of them. Replicas labelled
    ``spread`` (the primary and backup slurmctld) prefer different nodes: a lost node takes one."""
    return {"affinity": off_gpu_pools(config.placement.pool_label, spread), "tolerations": tolerations_for((config.window_taint,))}


def off_gpu_pools(pool_label: str, spread: Optional[dict[str, str]] = None) -> k8s.core.v1.AffinityArgs:
    """Prefer nodes outside every GPU pool: control daemons should not take a GPU node's CPU
    and memory from jobs, yet still schedule on a cluster that has nothing else. Preferred, not
    required, for ``spread`` too: a one-node cluster still runs both controllers."""
    return k8s.core.v1.AffinityArgs(
        pod_anti_affinity=None if spread is None else k8s.core.v1.PodAntiAffinityArgs(
            preferred_during_scheduling_ignored_during_execution=[
                k8s.core.v1.WeightedPodAffinityTermArgs(
                    weight=100,
                    pod_affinity_term=k8s.core.v1.PodAffinityTermArgs(
                        topology_key="kubernetes.io/hostname",
                        label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=spread),
                    ),
                )
            ]
        ),
        node_affinity=k8s.core.v1.NodeAffinityArgs(
            preferred_during_scheduling_ignored_during_execution=[
                k8s.core.v1.PreferredSchedulingTermArgs(
                    weight=100,
                    preference=k8s.core.v1.NodeSelectorTermArgs(
                        match_expressions=[k8s.core.v1.NodeSelectorRequirementArgs(key=pool_label, operator="DoesNotExist")]
                    ),
                )
            ]
        )
    )


def locked_down(
    run_as_user: Optional[int] = None,
    read_only_root: bool = True,
    add_capabilities: tuple[str, ...] = (),
    run_as_group: Optional[int] = None,
) -> k8s.core.v1.SecurityContextArgs:
    """No privilege escalation, every capability dropped but those named, read-only root.

    A given user runs with its group (``run_as_group`` defaults to the uid): never the image's
    default group, which is root's; daemons such as slurmctld switch to their own group and fail.
    """
    return k8s.core.v1.SecurityContextArgs(
        allow_privilege_escalation=False,
        read_only_root_filesystem=read_only_root,
        run_as_non_root=True if run_as_user else None,
        run_as_user=run_as_user,
        run_as_group=run_as_user if run_as_group is None else run_as_group,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"], add=list(add_capabilities) or None),
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    )


def pod_runs_as_nobody(fs_group: bool = False) -> k8s.core.v1.PodSecurityContextArgs:
    """Every container of the pod as nobody (uid and group), under the runtime's seccomp profile;
    with ``fs_group``, mounted volumes are group-readable by nobody too."""
    return k8s.core.v1.PodSecurityContextArgs(
        run_as_non_root=True, run_as_user=NOBODY_UID, run_as_group=NOBODY_UID, fs_group=NOBODY_UID if fs_group else None,
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    )


def empty_dir(name: str, medium: Optional[str] = None) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(name=name, empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium=medium))


def claim_volume(name: str, claim_name: pulumi.Input[str], read_only: bool = False) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=name,
        persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
            claim_name=claim_name, read_only=read_only or None
        ),
    )


def config_map_volume(name: str, config_map_name: pulumi.Input[str]) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(name=name, config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=config_map_name))


def mount(name: str, path: str, read_only: bool = False, sub_path: Optional[str] = None) -> k8s.core.v1.VolumeMountArgs:
    return k8s.core.v1.VolumeMountArgs(name=name, mount_path=path, read_only=read_only or None, sub_path=sub_path)


def tcp_probe(port: int, period: int = 10, failures: int = 3, delay: int = 0) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        tcp_socket=k8s.core.v1.TCPSocketActionArgs(port=port),
        period_seconds=period,
        failure_threshold=failures,
        initial_delay_seconds=delay or None,
    )


def exec_probe(command: list[str], period: int = 10, failures: int = 3, timeout: int = 5) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        exec_=k8s.core.v1.ExecActionArgs(command=command),
        period_seconds=period,
        failure_threshold=failures,
        timeout_seconds=timeout,
    )


def deployment_with_service(
    parent: pulumi.Resource,
    name: str,
    namespace: pulumi.Input[str],
    pod_labels: dict[str, str],
    pod_spec: k8s.core.v1.PodSpecArgs,
    service_name: str,
    port: int,
) -> pulumi.Output[str]:
    """One replica of a stateless HTTP server and a Service named for in-cluster DNS; its URL."""
    k8s.apps.v1.Deployment(
        name,
        metadata=meta(namespace=namespace, labels=pod_labels),
        spec=k8s.apps.v1.DeploymentSpecArgs(
            replicas=1,
            selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pod_labels),
            template=k8s.core.v1.PodTemplateSpecArgs(metadata=meta(labels=pod_labels), spec=pod_spec),
        ),
        opts=child(parent),
    )
    service = k8s.core.v1.Service(
        name,
        metadata=meta(name=service_name, namespace=namespace, labels=pod_labels),
        spec=k8s.core.v1.ServiceSpecArgs(selector=pod_labels, ports=[k8s.core.v1.ServicePortArgs(name="http", port=port)]),
        opts=child(parent),
    )
    return pulumi.Output.concat("http://", service.metadata.name, ".", service.metadata.namespace, f".svc.cluster.local:{port}")


def bind_role(
    parent: pulumi.Resource,
    name: str,
    account: k8s.core.v1.ServiceAccount,
    namespace: pulumi.Input[str],
    role_labels: Mapping[str, str],
    *rules: k8s.rbac.v1.PolicyRuleArgs,
    cluster_wide: bool = False,
    after: Sequence[pulumi.Resource] = (),
) -> pulumi.CustomResource:
    """One Role with ``rules`` in ``namespace`` (or, ``cluster_wide``, a ClusterRole: for rights on cluster-scoped
    objects or in every namespace), bound to one ServiceAccount of ``namespace``. The role is created ``after`` what
    must be in place before anyone holds its rights; a pod that needs them from its start waits for the binding
    returned."""
    rbac = k8s.rbac.v1
    role_type, binding_type, kind = (rbac.ClusterRole, rbac.ClusterRoleBinding, "ClusterRole") if cluster_wide else (rbac.Role, rbac.RoleBinding, "Role")
    role_namespace = None if cluster_wide else namespace
    role = role_type(name, metadata=meta(namespace=role_namespace, labels=role_labels), rules=list(rules),
                     opts=child(parent, depends_on=list(after)))  # fmt: skip
    return binding_type(
        name,
        metadata=meta(namespace=role_namespace, labels=role_labels),
        role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind=kind, name=role.metadata.name),
        subjects=[rbac.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=namespace)],
        opts=child(parent),
    )
