"""sbatch from Kubernetes: a namespace where Jobs get what they need to submit to Slurm.

A Job there mounts the client config (the cluster's slurm.conf, no secrets),
the munge key through a munged sidecar, and the shared file system where batch
scripts and results live; :func:`sbatch_pod_spec` builds such a pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components.common import child, claim_volume, config_map_volume, empty_dir, labels, locked_down, meta, mount
from components.compute import SHARED_MOUNT
from components.identity import identity_mounts, identity_volume
from components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from components.namespace import pod_security_labels
from components.slurm_config import CONFIG_DIR, SLURM_CONF_ENV
from config.models import SlurmUser, StackConfig


class JobSubmissionNamespace(pulumi.ComponentResource):
    """The submission Namespace; created before the munge key and shared claim placed in it."""

    name: pulumi.Output[str]

    def __init__(self, name: str, config: StackConfig, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:submission:JobSubmissionNamespace", name, None, opts)
        namespace = k8s.core.v1.Namespace(
            name,
            metadata=meta(
                name=config.submission.namespace,
                labels={**labels("slurm-jobs", config.slurm.cluster_name), **pod_security_labels("baseline", "restricted")},
            ),
            opts=child(self),
        )
        self.name = namespace.metadata.name
        self.register_outputs({"name": self.name})


@dataclass(frozen=True)
class JobSubmissionArgs:
    config: StackConfig
    namespace: pulumi.Input[str]
    slurm_files: Mapping[str, str]
    munge_secret_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]
    shared_claim_name: pulumi.Input[str]


class JobSubmission(pulumi.ComponentResource):
    """The client config for sbatch, next to the munge key and shared claim in the namespace."""

    config_map_name: pulumi.Output[str]

    def __init__(self, name: str, args: JobSubmissionArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:submission:JobSubmission", name, None, opts)
        config_map = k8s.core.v1.ConfigMap(
            name,
            metadata=meta(namespace=args.namespace, labels=labels("slurm-client", args.config.slurm.cluster_name)),
            data={"slurm.conf": args.slurm_files["slurm.conf"]},
            opts=child(self),
        )
        self.config_map_name = config_map.metadata.name
        self.namespace = args.namespace
        self.munge_secret_name = args.munge_secret_name
        self.identity_config_map_name = args.identity_config_map_name
        self.shared_claim_name = args.shared_claim_name
        self.images = args.config.images
        self.register_outputs({"config_map_name": self.config_map_name})

    def sbatch_pod_spec(self, script: str, user: SlurmUser, sbatch_args: tuple[str, ...] = ()) -> k8s.core.v1.PodSpecArgs:
        """A pod that submits ``script`` (a path under /shared) as ``user`` with sbatch and waits for the job.

        The job runs as that user on the Slurm nodes: slurmctld resolves the uid munge vouches for.
        """
        return k8s.core.v1.PodSpecArgs(
            restart_policy="Never",
            automount_service_account_token=False,
            init_containers=[munged_sidecar(self.images.slurmd)],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="sbatch",
                    image=self.images.slurmd,
                    command=["sbatch", "--wait", *sbatch_args, f"{SHARED_MOUNT}/{script}"],
                    env=[SLURM_CONF_ENV],
                    working_dir=SHARED_MOUNT,
                    resources=k8s.core.v1.ResourceRequirementsArgs(
                        requests={"cpu": "100m", "memory": "128Mi"}, limits={"cpu": "500m", "memory": "256Mi"}
                    ),
                    volume_mounts=[
                        mount("slurm-config", CONFIG_DIR, read_only=True),
                        mount("shared", SHARED_MOUNT),
                        mount("tmp", "/tmp"),
                        munge_socket_mount(),
                        *identity_mounts(),
                    ],
                    security_context=locked_down(run_as_user=user.uid, run_as_group=user.group_id),
                )
            ],
            volumes=[
                config_map_volume("slurm-config", self.config_map_name),
                claim_volume("shared", self.shared_claim_name),
                empty_dir("tmp"),
                *munge_volumes(self.munge_secret_name),
                identity_volume(self.identity_config_map_name),
            ],
        )
