"""The slurmd rollout controller: a changed slurmd template reaches every node without killing a job.

The slurmd DaemonSets update ``OnDelete`` (components/compute.py). This component runs the program
that does the deleting (components/programs/slurmd_rollout.py): drain in Slurm, wait for the node's
jobs, delete the old pod, resume once the new slurmd registered; docs/upgrades.md. Here: its RBAC
(list slurmd pods and ControllerRevisions, delete pods, in the Slurm namespace only) and its Deployment,
whose pod splits the two credentials: the program's container holds the Kubernetes token and no munge
key, the Slurm client container beside it the munge socket and no token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import (
    bind_role, child, config_map_volume, control_daemon_placement, empty_dir, labels, locked_down, meta, mount,
)
from dualsched.components.controller import slurm_client
from dualsched.components.identity import identity_volume
from dualsched.components.munge import munge_volumes, munged_sidecar
from dualsched.components.namespace import ROLLOUT
from dualsched.components.programs import source
from dualsched.config.models import NOBODY_UID, StackConfig

PROGRAM_FILE = "slurmd_rollout.py"
BRIDGE_FILE = "slurm_bridge.sh"
PROGRAM_DIR = "/opt/slurmd-rollout"
EXCHANGE_DIR = "/run/slurmd-rollout"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600


def rollout_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    """What the program reads and deletes, in its own namespace. RBAC cannot restrict ``delete`` to the
    slurmd pods (resourceNames cannot select by label, and DaemonSet pod names are random): it may
    delete any pod of the Slurm namespace (docs/security.md)."""
    return [
        k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods"], verbs=["list", "delete"]),
        k8s.rbac.v1.PolicyRuleArgs(api_groups=["apps"], resources=["controllerrevisions"], verbs=["list"]),
    ]


def token_volume() -> k8s.core.v1.VolumeArgs:
    """The ServiceAccount token and the API server's CA, as automounting gives them, but mounted only in the
    program's container (automounting mounts them in every container, the Slurm client's too)."""
    return k8s.core.v1.VolumeArgs(
        name="token",
        projected=k8s.core.v1.ProjectedVolumeSourceArgs(
            sources=[
                k8s.core.v1.VolumeProjectionArgs(
                    service_account_token=k8s.core.v1.ServiceAccountTokenProjectionArgs(expiration_seconds=TOKEN_SECONDS, path="token")
                ),
                k8s.core.v1.VolumeProjectionArgs(
                    config_map=k8s.core.v1.ConfigMapProjectionArgs(
                        name="kube-root-ca.crt", items=[k8s.core.v1.KeyToPathArgs(key="ca.crt", path="ca.crt")]
                    )
                ),
            ]
        ),
    )


def program_env(config: StackConfig) -> list[k8s.core.v1.EnvVarArgs]:
    rollout = config.slurm.slurmd_rollout
    namespace = k8s.core.v1.EnvVarSourceArgs(field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.namespace"))
    return [
        k8s.core.v1.EnvVarArgs(name="ROLLOUT_NAMESPACE", value_from=namespace),
        k8s.core.v1.EnvVarArgs(name="ROLLOUT_MAX_UNAVAILABLE", value=str(rollout.max_unavailable)),
        k8s.core.v1.EnvVarArgs(name="ROLLOUT_DRAIN_DEADLINE_SECONDS", value=str(rollout.drain_deadline_minutes * 60)),
        k8s.core.v1.EnvVarArgs(name="ROLLOUT_EXCHANGE_DIR", value=EXCHANGE_DIR),
        k8s.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"),
    ]


@dataclass(frozen=True)
class SlurmdRolloutArgs:
    config: StackConfig
    namespace: pulumi.Input[str]
    slurm_config_map_name: str
    munge_secret_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]


class SlurmdRolloutController(pulumi.ComponentResource):
    """ServiceAccount, Role and binding, the program's files and a one-replica Deployment."""

    def __init__(self, name: str, args: SlurmdRolloutArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:slurmd_rollout:SlurmdRolloutController", name, None, opts)
        config, namespace = args.config, args.namespace
        rollout_labels = labels(ROLLOUT, config.slurm.cluster_name)
        account = k8s.core.v1.ServiceAccount(name, metadata=meta(namespace=namespace, labels=rollout_labels), opts=child(self))
        bind_role(self, name, account, namespace, rollout_labels, *rollout_rules())
        # Auto-named: a new program or setting is a new ConfigMap name, which rolls the pod.
        files = k8s.core.v1.ConfigMap(
            name,
            metadata=meta(namespace=namespace, labels=rollout_labels),
            data={file: source(file) for file in (PROGRAM_FILE, BRIDGE_FILE)},
            opts=child(self),
        )
        deployment = k8s.apps.v1.Deployment(
            name,
            metadata=meta(namespace=namespace, labels=rollout_labels),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                # Never two at once: two would each drain up to maxUnavailable nodes. The old pod goes first.
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_surge=0, max_unavailable=1),
                ),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=rollout_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=rollout_labels),
                    spec=self._pod_spec(args, account.metadata.name, files.metadata.name),
                ),
            ),
            opts=child(self),
        )
        self.deployment_name = deployment.metadata.name
        self.register_outputs({"deployment_name": self.deployment_name})

    @staticmethod
    def _pod_spec(args: SlurmdRolloutArgs, account: pulumi.Input[str], files: pulumi.Input[str]) -> k8s.core.v1.PodSpecArgs:
        config = args.config
        exchange = mount("exchange", EXCHANGE_DIR)
        program_files = mount("files", PROGRAM_DIR, read_only=True)
        return k8s.core.v1.PodSpecArgs(
            service_account_name=account,
            automount_service_account_token=False,  # token_volume(), in the program's container only
            # no user fits them all (munged root, the program nobody, the Slurm client SlurmUser): each container sets its own
            security_context=k8s.core.v1.PodSecurityContextArgs(seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")),
            **control_daemon_placement(config),
            init_containers=[munged_sidecar(config.images.slurmd)],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="rollout",
                    image=config.images.python,
                    command=["python3", f"{PROGRAM_DIR}/{PROGRAM_FILE}"],
                    env=program_env(config),
                    resources=k8s.core.v1.ResourceRequirementsArgs(
                        requests={"cpu": "10m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
                    ),
                    volume_mounts=[program_files, exchange, mount("token", TOKEN_DIR, read_only=True)],
                    security_context=locked_down(run_as_user=NOBODY_UID),
                ),
                slurm_client("slurm", config.images.slurmctld, ["bash", f"{PROGRAM_DIR}/{BRIDGE_FILE}", EXCHANGE_DIR],
                             extra_mounts=(program_files, exchange)),  # fmt: skip
            ],
            volumes=[
                config_map_volume("files", files),
                empty_dir("exchange"),
                config_map_volume("slurm-config", args.slurm_config_map_name),
                *munge_volumes(args.munge_secret_name),
                identity_volume(args.identity_config_map_name),
                token_volume(),
            ],
        )
