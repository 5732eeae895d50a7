"""sbatch from Kubernetes: a namespace where Jobs submit to Slurm without the munge key.

A Job's pod runs as a ServiceAccount mapped to a Slurm user (``submission.identities``). A
sidecar trades the pod's projected ServiceAccount token for a short-lived Slurm token at the
minter (components/tokens.py) and renews it; sbatch presents it (auth/jwt) and slurmctld runs
the job as that user. The namespace holds no key, no munge socket and no shared file system:
jobs read and write /shared on the Slurm nodes, as their user. :meth:`JobSubmission.sbatch_pod_spec`
builds such a pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import child, config_map_volume, empty_dir, labels, locked_down, meta, mount
from dualsched.components.identity import identity_mounts, identity_volume
from dualsched.components.namespace import network_policies, pod_security_labels, submission_policies
from dualsched.components.programs import source
from dualsched.components.programs.token_minter import AUDIENCE
from dualsched.components.slurm_config import CONFIG_DIR, SLURM_CONF_ENV
from dualsched.config.models import SlurmUser, StackConfig, SubmissionIdentity

SBATCH_WAIT = "sbatch_wait.sh"
TOKEN_FETCHER = "token_fetcher.py"
PROGRAM_DIR = "/opt/dualsched"
SA_TOKEN_DIR = "/var/run/secrets/dualsched"
SA_TOKEN_SECONDS = 600
"""The kubelet renews a projected token at 80% of this; the minter only needs it fresh (10 min is the API's minimum)."""
TOKEN_DIR = "/run/slurm-token"
TOKEN_FILE = f"{TOKEN_DIR}/token"


class JobSubmissionNamespace(pulumi.ComponentResource):
    """The submission Namespace (Pod Security ``restricted``: nothing in it needs more) and its NetworkPolicies."""

    name: pulumi.Output[str]

    def __init__(self, name: str, config: StackConfig, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:submission:JobSubmissionNamespace", name, None, opts)
        namespace = k8s.core.v1.Namespace(
            name,
            metadata=meta(
                name=config.submission.namespace,
                labels={**labels("slurm-jobs", config.slurm.cluster_name), **pod_security_labels("restricted", "restricted")},
            ),
            opts=child(self),
        )
        self.name = namespace.metadata.name
        network_policies(self, name, self.name, labels("slurm-jobs", config.slurm.cluster_name), submission_policies(config))
        self.register_outputs({"name": self.name})


@dataclass(frozen=True)
class JobSubmissionArgs:
    config: StackConfig
    namespace: pulumi.Input[str]
    slurm_files: Mapping[str, str]
    identity_config_map_name: pulumi.Input[str]
    minter_url: pulumi.Input[str]


class JobSubmission(pulumi.ComponentResource):
    """The client config and programs for sbatch, and one ServiceAccount per mapped identity."""

    config_map_name: pulumi.Output[str]

    def __init__(self, name: str, args: JobSubmissionArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:submission:JobSubmission", name, None, opts)
        config = args.config
        client_labels = labels("slurm-client", config.slurm.cluster_name)
        config_map = k8s.core.v1.ConfigMap(
            name,
            metadata=meta(namespace=args.namespace, labels=client_labels),
            data={
                "slurm.conf": args.slurm_files["slurm.conf"],
                SBATCH_WAIT: source(SBATCH_WAIT),
                TOKEN_FETCHER: source(TOKEN_FETCHER),
            },
            opts=child(self),
        )
        for identity in config.submission.identities:
            k8s.core.v1.ServiceAccount(
                f"{name}-{identity.service_account}",
                metadata=meta(name=identity.service_account, namespace=args.namespace, labels=client_labels),
                # its only credential is the projected, audience-bound token the sidecar trades in
                automount_service_account_token=False,
                opts=child(self),
            )
        self.config_map_name = config_map.metadata.name
        self.namespace = args.namespace
        self.identity_config_map_name = args.identity_config_map_name
        self.minter_url = args.minter_url
        self.images = config.images
        self.users = {user.name: user for user in config.slurm.users}
        self.register_outputs({"config_map_name": self.config_map_name})

    def sbatch_pod_spec(
        self, script: str, identity: SubmissionIdentity, sbatch_args: tuple[str, ...] = ()
    ) -> k8s.core.v1.PodSpecArgs:
        """A pod that submits the batch ``script`` (its text) as ``identity`` and waits for the job.

        The pod runs as the identity's ServiceAccount and as its Slurm user's uid: slurmctld runs
        the job as the user the token names and refuses a submission whose uid differs.
        """
        user = self.users[identity.user]
        account = [k8s.core.v1.EnvVarArgs(name="SBATCH_ACCOUNT", value=identity.account)] if identity.account else []
        return k8s.core.v1.PodSpecArgs(
            restart_policy="Never",
            service_account_name=identity.service_account,
            automount_service_account_token=False,
            security_context=k8s.core.v1.PodSecurityContextArgs(
                run_as_non_root=True, run_as_user=user.uid, run_as_group=user.group_id, fs_group=user.group_id
            ),
            init_containers=[self._token_sidecar(user)],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="sbatch",
                    image=self.images.slurmd,
                    command=["bash", f"{PROGRAM_DIR}/{SBATCH_WAIT}", *sbatch_args],
                    env=[
                        SLURM_CONF_ENV,
                        k8s.core.v1.EnvVarArgs(name="SLURM_TOKEN_FILE", value=TOKEN_FILE),
                        k8s.core.v1.EnvVarArgs(name="BATCH_SCRIPT", value=script),
                        *account,
                    ],
                    resources=k8s.core.v1.ResourceRequirementsArgs(
                        requests={"cpu": "100m", "memory": "128Mi"}, limits={"cpu": "500m", "memory": "256Mi"}
                    ),
                    volume_mounts=[
                        mount("client", CONFIG_DIR, read_only=True),
                        mount("client", f"{PROGRAM_DIR}/{SBATCH_WAIT}", read_only=True, sub_path=SBATCH_WAIT),
                        mount("slurm-token", TOKEN_DIR, read_only=True),
                        mount("tmp", "/tmp"),
                        *identity_mounts(),
                    ],
                    security_context=locked_down(run_as_user=user.uid, run_as_group=user.group_id),
                )
            ],
            volumes=[
                config_map_volume("client", self.config_map_name),
                empty_dir("slurm-token", medium="Memory"),
                empty_dir("tmp"),
                k8s.core.v1.VolumeArgs(
                    name="sa-token",
                    projected=k8s.core.v1.ProjectedVolumeSourceArgs(
                        sources=[
                            k8s.core.v1.VolumeProjectionArgs(
                                service_account_token=k8s.core.v1.ServiceAccountTokenProjectionArgs(
                                    audience=AUDIENCE, expiration_seconds=SA_TOKEN_SECONDS, path="token"
                                )
                            )
                        ]
                    ),
                ),
                identity_volume(self.identity_config_map_name),
            ],
        )

    def _token_sidecar(self, user: SlurmUser) -> k8s.core.v1.ContainerArgs:
        """A native sidecar (restartPolicy Always): started, with a token on disk, before sbatch starts,
        and stopped by the kubelet when sbatch exits."""
        return k8s.core.v1.ContainerArgs(
            name="slurm-token",
            image=self.images.python,
            restart_policy="Always",
            command=["python3", f"{PROGRAM_DIR}/{TOKEN_FETCHER}"],
            env=[
                k8s.core.v1.EnvVarArgs(name="FETCHER_MINTER_URL", value=self.minter_url),
                k8s.core.v1.EnvVarArgs(name="FETCHER_SA_TOKEN_FILE", value=f"{SA_TOKEN_DIR}/token"),
                k8s.core.v1.EnvVarArgs(name="FETCHER_TOKEN_FILE", value=TOKEN_FILE),
                k8s.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"),
            ],
            startup_probe=k8s.core.v1.ProbeArgs(
                exec_=k8s.core.v1.ExecActionArgs(command=["test", "-s", TOKEN_FILE]), period_seconds=1, failure_threshold=120
            ),
            resources=k8s.core.v1.ResourceRequirementsArgs(
                requests={"cpu": "10m", "memory": "24Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
            ),
            volume_mounts=[
                mount("client", f"{PROGRAM_DIR}/{TOKEN_FETCHER}", read_only=True, sub_path=TOKEN_FETCHER),
                mount("sa-token", SA_TOKEN_DIR, read_only=True),
                mount("slurm-token", TOKEN_DIR),
            ],
            security_context=locked_down(run_as_user=user.uid, run_as_group=user.group_id),
        )
