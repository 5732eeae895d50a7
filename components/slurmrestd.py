"""slurmrestd: Slurm's REST API for clients that hold a Slurm token, never the munge key.

It runs with ``rest_auth/jwt``: each request carries ``X-SLURM-USER-NAME`` and
``X-SLURM-USER-TOKEN`` (a token from the minter, components/tokens.py), which slurmrestd hands
to slurmctld unchanged; slurmctld verifies it and acts as that user. slurmrestd itself holds
no key and no munge socket, and runs as nobody: Slurm refuses to run it as root or SlurmUser.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import (
    config_map_volume, control_daemon_placement, deployment_with_service, empty_dir, labels, locked_down, mount, pod_runs_as_nobody,
    tcp_probe,
)
from dualsched.components.identity import identity_mounts, identity_volume
from dualsched.components.slurm_config import CONFIG_DIR, SLURM_CONF, SLURM_CONF_ENV
from dualsched.config.models import NOBODY_UID, StackConfig

RESTD = "slurmrestd"
RESTD_PORT = 6820
RESTD_ENV = {
    # its own calls use auth/jwt as well: it never needs munge
    "SLURM_JWT": "daemon",
    # slurmrestd unshares its SysV IPC and file namespaces at start, which the runtime's default
    # seccomp profile refuses without CAP_SYS_ADMIN; as Slinky does, skip that rather than grant it.
    "SLURMRESTD_SECURITY": "disable_unshare_files,disable_unshare_sysv",
}


def slurmrestd_command(slurm_conf: str) -> list[str]:
    return ["slurmrestd", "-f", slurm_conf, "-a", "rest_auth/jwt", f"0.0.0.0:{RESTD_PORT}"]


@dataclass(frozen=True)
class SlurmRestApiArgs:
    config: StackConfig
    namespace: pulumi.Input[str]
    slurm_config_map_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]


class SlurmRestApi(pulumi.ComponentResource):
    """A slurmrestd Deployment and its Service ``slurmrestd`` on port 6820."""

    url: pulumi.Output[str]

    def __init__(self, name: str, args: SlurmRestApiArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:slurmrestd:SlurmRestApi", name, None, opts)
        config = args.config
        restd_labels = labels(RESTD, config.slurm.cluster_name)
        self.url = deployment_with_service(
            self, name, args.namespace, restd_labels, self._pod_spec(config, args), RESTD, RESTD_PORT
        )
        self.register_outputs({"url": self.url})

    @staticmethod
    def _pod_spec(config: StackConfig, args: SlurmRestApiArgs) -> k8s.core.v1.PodSpecArgs:
        return k8s.core.v1.PodSpecArgs(
            automount_service_account_token=False,
            **control_daemon_placement(config),
            security_context=pod_runs_as_nobody(),
            containers=[
                k8s.core.v1.ContainerArgs(
                    name=RESTD,
                    image=config.images.slurmrestd,
                    command=slurmrestd_command(SLURM_CONF),
                    env=[SLURM_CONF_ENV, *(k8s.core.v1.EnvVarArgs(name=name, value=value) for name, value in RESTD_ENV.items())],
                    ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=RESTD_PORT)],
                    readiness_probe=tcp_probe(RESTD_PORT, period=10),
                    liveness_probe=tcp_probe(RESTD_PORT, period=20),
                    resources=k8s.core.v1.ResourceRequirementsArgs(
                        requests={"cpu": "50m", "memory": "64Mi"}, limits={"cpu": "500m", "memory": "256Mi"}
                    ),
                    volume_mounts=[mount("slurm-config", CONFIG_DIR, read_only=True), mount("tmp", "/tmp"), *identity_mounts()],
                    security_context=locked_down(run_as_user=NOBODY_UID),
                )
            ],
            volumes=[
                config_map_volume("slurm-config", args.slurm_config_map_name),
                empty_dir("tmp"),
                identity_volume(args.identity_config_map_name),
            ],
        )
