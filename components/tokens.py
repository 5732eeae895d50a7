"""Slurm tokens for clients without the munge key: the HS256 key and the in-cluster minter.

slurmctld verifies HS256 JWTs with the key (``AuthAltTypes=auth/jwt``); the minter, the only
other holder of the key, gives a pod a short-lived token for the Slurm user its ServiceAccount
is mapped to in the stack config (``submission.identities``), after the API server vouched for
the pod's projected token (TokenReview). See components/programs/token_minter.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.components.common import (
    bind_role, child, config_map_volume, control_daemon_placement, deployment_with_service, labels, locked_down, meta, mount,
    pod_runs_as_nobody,
)
from dualsched.components.programs import source
from dualsched.components.programs.token_minter import TOKEN_PATH
from dualsched.components.slurm_files import JWT_KEY_DIR, JWT_KEY_FILE, JWT_KEY_PATH
from dualsched.config.models import NOBODY_UID, StackConfig

JWT_KEY_BYTES = 32
"""HS256 wants a key at least as long as its 256-bit hash (RFC 7518 section 3.2)."""
MINTER = "slurm-token-minter"
MINTER_PORT = 8080
MINTER_DIR = "/opt/token-minter"
KEY_VOLUME = "jwt-key"


def jwt_key_volume(secret_name: pulumi.Input[str]) -> k8s.core.v1.VolumeArgs:
    """The key readable by root and the pod's fsGroup only: auth/jwt refuses a key that others
    can read (Slurm 23.02+, _check_key_permissions)."""
    return k8s.core.v1.VolumeArgs(
        name=KEY_VOLUME, secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=secret_name, default_mode=0o440)
    )


def jwt_key_mount() -> k8s.core.v1.VolumeMountArgs:
    return mount(KEY_VOLUME, JWT_KEY_DIR, read_only=True)


@dataclass(frozen=True)
class JwtKeyArgs:
    namespace: pulumi.Input[str]
    cluster_name: str


class JwtKey(pulumi.ComponentResource):
    """A random HS256 key in one Secret of the Slurm namespace: slurmctld and the minter mount it."""

    secret_name: pulumi.Output[str]

    def __init__(self, name: str, args: JwtKeyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:tokens:JwtKey", name, None, opts)
        key = random.RandomBytes(f"{name}-bytes", length=JWT_KEY_BYTES, opts=child(self))
        secret = k8s.core.v1.Secret(
            name,
            metadata=meta(namespace=args.namespace, labels=labels("slurm-jwt-key", args.cluster_name)),
            type="Opaque",
            data={JWT_KEY_FILE: key.base64},
            opts=child(self),
        )
        self.secret_name = secret.metadata.name
        self.register_outputs({"secret_name": self.secret_name})


@dataclass(frozen=True)
class TokenMinterArgs:
    config: StackConfig
    namespace: pulumi.Input[str]
    jwt_key_secret_name: pulumi.Input[str]


def _health_probe(period: int) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(http_get=k8s.core.v1.HTTPGetActionArgs(path="/healthz", port=MINTER_PORT), period_seconds=period)


def identity_mapping(config: StackConfig) -> dict[str, str]:
    """``<submission namespace>/<ServiceAccount>`` -> Slurm user, as the minter reads it."""
    namespace = config.submission.namespace
    return {f"{namespace}/{identity.service_account}": identity.user for identity in config.submission.identities}


class TokenMinter(pulumi.ComponentResource):
    """The minter Deployment and Service, with a ServiceAccount that may create TokenReviews and nothing else."""

    url: pulumi.Output[str]

    def __init__(self, name: str, args: TokenMinterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:tokens:TokenMinter", name, None, opts)
        config = args.config
        minter_labels = labels(MINTER, config.slurm.cluster_name)
        account = k8s.core.v1.ServiceAccount(
            name, metadata=meta(namespace=args.namespace, labels=minter_labels), opts=child(self)
        )
        self._allow_token_reviews(name, account, args.namespace, minter_labels)
        programs = k8s.core.v1.ConfigMap(
            name,
            metadata=meta(namespace=args.namespace, labels=minter_labels),
            data={"token_minter.py": source("token_minter.py"), "mapping.json": json.dumps(identity_mapping(config), indent=2)},
            opts=child(self),
        )
        pod_spec = self._pod_spec(config, account.metadata.name, programs.metadata.name, args.jwt_key_secret_name)
        self.url = pulumi.Output.concat(
            deployment_with_service(self, name, args.namespace, minter_labels, pod_spec, MINTER, MINTER_PORT), TOKEN_PATH
        )
        self.register_outputs({"url": self.url})

    def _allow_token_reviews(self, name: str, account: k8s.core.v1.ServiceAccount, namespace, minter_labels) -> None:
        # TokenReviews are cluster-scoped: a ClusterRole, with this one verb on this one resource.
        rule = k8s.rbac.v1.PolicyRuleArgs(api_groups=["authentication.k8s.io"], resources=["tokenreviews"], verbs=["create"])
        bind_role(self, name, account, namespace, minter_labels, rule, cluster_wide=True)

    @staticmethod
    def _pod_spec(config: StackConfig, account: pulumi.Input[str], programs: pulumi.Input[str], key_secret: pulumi.Input[str]):
        return k8s.core.v1.PodSpecArgs(
            service_account_name=account,
            automount_service_account_token=True,  # its own token, for TokenReview
            **control_daemon_placement(config),
            security_context=pod_runs_as_nobody(fs_group=True),
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="minter",
                    image=config.images.python,
                    command=["python3", f"{MINTER_DIR}/token_minter.py"],
                    env=[
                        k8s.core.v1.EnvVarArgs(name="MINTER_KEY_FILE", value=JWT_KEY_PATH),
                        k8s.core.v1.EnvVarArgs(name="MINTER_MAPPING_FILE", value=f"{MINTER_DIR}/mapping.json"),
                        k8s.core.v1.EnvVarArgs(name="MINTER_LIFETIME", value=str(config.submission.token_lifetime_seconds)),
                        k8s.core.v1.EnvVarArgs(name="MINTER_PORT", value=str(MINTER_PORT)),
                        k8s.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"),
                    ],
                    ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=MINTER_PORT)],
                    readiness_probe=_health_probe(period=5),
                    liveness_probe=_health_probe(period=20),
                    resources=k8s.core.v1.ResourceRequirementsArgs(
                        requests={"cpu": "20m", "memory": "32Mi"}, limits={"cpu": "200m", "memory": "64Mi"}
                    ),
                    volume_mounts=[mount("programs", MINTER_DIR, read_only=True), jwt_key_mount()],
                    security_context=locked_down(run_as_user=NOBODY_UID),
                )
            ],
            volumes=[config_map_volume("programs", programs), jwt_key_volume(key_secret)],
        )
