"""slurmd on a GPU node pool: one DaemonSet per pool, placed by the pool label."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components.common import GPU_RESOURCE, child, claim_volume, empty_dir, labels, meta, mount, tcp_probe
from components.identity import identity_mounts, identity_volume, users_annotation
from components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from components.slurm_files import Site
from config.models import NodePool, StackConfig, Taint

SHARED_MOUNT = "/shared"


def tolerations_for(taints: tuple[Taint, ...]) -> list[k8s.core.v1.TolerationArgs]:
    return [
        k8s.core.v1.TolerationArgs(key=taint.key, operator="Equal", value=taint.value, effect=taint.effect.value)
        for taint in taints
    ]


def conf_servers(site: Site) -> str:
    """slurmd --conf-server list: every controller, so a node can start while the primary is down."""
    return ",".join(f"{host.address or host.name}:{site.slurmctld_port}" for host in site.controller_hosts)


@dataclass(frozen=True)
class ComputePoolArgs:
    config: StackConfig
    pool: NodePool
    site: Site
    namespace: pulumi.Input[str]
    munge_secret_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]
    shared_claim_name: pulumi.Input[str]


def slurmd_resources(pool: NodePool) -> dict[str, str]:
    """The node share Slurm allocates, as both requests and limits: a Guaranteed pod, which
    the kubelet evicts last, with exactly the memory slurm.conf promises (RealMemory, MiB)."""
    gpus = {GPU_RESOURCE: str(pool.slurm_gpu_count)} if pool.slurm_gpu_count else {}
    return {"cpu": str(pool.cpus), "memory": f"{pool.real_memory_mb}Mi", **gpus}


def slurmd_selector(pool: NodePool) -> dict[str, str]:
    """The DaemonSet's selector. Kubernetes never changes a selector in place: a new one replaces the
    DaemonSet, deleting every slurmd pod and the jobs running in them. So it holds only what names
    the pool, never the configurable pool label key or the cluster name."""
    return labels("slurmd", pool.name)


def job_shm_volume(pool: NodePool) -> k8s.core.v1.VolumeArgs:
    """Jobs run in the slurmd container: its /dev/shm is theirs (the runtime's default is 64 MiB)."""
    return k8s.core.v1.VolumeArgs(
        name="shm",
        empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit=f"{pool.job_shm_bytes // 2**20}Mi"),
    )


class ComputePool(pulumi.ComponentResource):
    """slurmd on every node of one pool, with the pool's GPU share and the shared file system.

    Jobs run inside the slurmd container, so its limits are the node share Slurm
    allocates. ``OnDelete`` updates: changing the DaemonSet never kills a running
    job; an admin drains a node in Slurm, then deletes its pod to pick up the change.
    """

    def __init__(self, name: str, args: ComputePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:compute:ComputePool", name, None, opts)
        config, pool, site = args.config, args.pool, args.site
        selector = slurmd_selector(pool)
        pod_labels = {**selector, config.placement.pool_label: pool.name}
        daemonset = k8s.apps.v1.DaemonSet(
            name,
            metadata=meta(namespace=args.namespace, labels=pod_labels),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="OnDelete"),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=pod_labels, annotations=users_annotation(config)),
                    spec=self._pod_spec(args),
                ),
            ),
            opts=child(self),
        )
        self.daemonset_name = daemonset.metadata.name
        self.register_outputs({"daemonset_name": self.daemonset_name})

    @staticmethod
    def _pod_spec(args: ComputePoolArgs) -> k8s.core.v1.PodSpecArgs:
        config, pool, site = args.config, args.pool, args.site
        resources = slurmd_resources(pool)
        return k8s.core.v1.PodSpecArgs(
            host_network=True,
            # slurmd must still resolve slurmctld's cluster DNS name from the host network.
            dns_policy="ClusterFirstWithHostNet",
            automount_service_account_token=False,
            node_selector={config.placement.pool_label: pool.name},
            tolerations=tolerations_for(config.pool_taints(pool)),
            termination_grace_period_seconds=120,
            init_containers=[munged_sidecar(config.images.slurmd)],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="slurmd",
                    image=config.images.slurmd,
                    command=["slurmd", "-D", "-N", "$(NODE_NAME)", "--conf-server", conf_servers(site)],
                    env=[
                        k8s.core.v1.EnvVarArgs(
                            name="NODE_NAME",
                            value_from=k8s.core.v1.EnvVarSourceArgs(
                                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")
                            ),
                        )
                    ],
                    ports=[k8s.core.v1.ContainerPortArgs(name="slurmd", container_port=site.slurmd_port)],
                    resources=k8s.core.v1.ResourceRequirementsArgs(requests=resources, limits=resources),
                    startup_probe=tcp_probe(site.slurmd_port, period=5, failures=60),
                    liveness_probe=tcp_probe(site.slurmd_port, period=30),
                    readiness_probe=tcp_probe(site.slurmd_port, period=15),
                    # slurmd creates job cgroups, binds GPUs and switches to job users.
                    security_context=k8s.core.v1.SecurityContextArgs(privileged=True),
                    volume_mounts=[
                        mount("spool", site.slurmd_spool_dir),
                        mount("run", site.run_dir),
                        mount("shared", SHARED_MOUNT),
                        mount("shm", "/dev/shm"),
                        munge_socket_mount(),
                        *identity_mounts(),
                    ],
                )
            ],
            volumes=[
                empty_dir("spool"),
                empty_dir("run"),
                claim_volume("shared", args.shared_claim_name),
                job_shm_volume(pool),
                *munge_volumes(args.munge_secret_name),
                identity_volume(args.identity_config_map_name),
            ],
        )
