"""DualScheduledCluster: the whole Slurm + Kubernetes GPU cluster from one StackConfig."""

from __future__ import annotations

from typing import Mapping, Optional

import pulumi

from dualsched.components.accounting import Accounting, AccountingArgs
from dualsched.components.common import child
from dualsched.components.compute import ComputePool, ComputePoolArgs
from dualsched.components.controller import SlurmController, SlurmControllerArgs
from dualsched.components.identity import UserDirectory, UserDirectoryArgs
from dualsched.components.inference import InferenceNamespace, ModelServer, ModelServerArgs
from dualsched.components.login import Login, LoginArgs
from dualsched.components.metrics import SlurmMetrics, SlurmMetricsArgs
from dualsched.components.munge import MungeKey, MungeKeyArgs
from dualsched.components.namespace import SlurmNamespace, SlurmNamespaceArgs, node_keeper_policies
from dualsched.components.node_keeper import NodeKeeper, NodeKeeperArgs
from dualsched.components.nodepools import keeper_runs_in_slurm
from dualsched.components.slurm_config import SlurmConfig, SlurmConfigArgs, cluster_name_lock
from dualsched.components.slurm_files import kubernetes_site
from dualsched.components.slurmd_rollout import SlurmdRolloutArgs, SlurmdRolloutController
from dualsched.components.storage import SharedStorageVolumes, SharedStorageVolumesArgs, StorageConsumer
from dualsched.components.slurmrestd import SlurmRestApi, SlurmRestApiArgs
from dualsched.components.submission import JobSubmission, JobSubmissionArgs, JobSubmissionNamespace
from dualsched.components.tokens import JwtKey, JwtKeyArgs, TokenMinter, TokenMinterArgs
from dualsched.config.models import StackConfig

SLURM, INFERENCE, JOBS = "slurm", "inference", "jobs"


def storage_consumers(config: StackConfig, namespaces: Mapping[str, pulumi.Output[str]]) -> dict[str, StorageConsumer]:
    """Who mounts the shared file system: Slurm all of it, read-write; inference its models directory only,
    read-only. Jobs reach it through Slurm, as their user; the submitting pod needs none."""
    consumers = {SLURM: StorageConsumer(namespaces[SLURM], read_only=False)} if SLURM in namespaces else {}
    if INFERENCE in namespaces:
        consumers[INFERENCE] = StorageConsumer(namespaces[INFERENCE], read_only=True, directory=config.storage.models_path)
    return consumers


class DualScheduledCluster(pulumi.ComponentResource):
    """Composes the components the config asks for; data flows one way, from the config to the objects.

    A stack without a ``slurm`` section builds no Slurm (no lock, no Slurm namespace; its pools are mode
    kubernetes, without taints, and the node keeper that labels them runs in the inference namespace);
    one without model servers builds no inference namespace. Outputs: the namespaces, the controller
    address and the slurm.conf hash (None without Slurm), and the inference endpoints (model name ->
    in-cluster URL).
    """

    submission: Optional[JobSubmission] = None

    def __init__(self, name: str, config: StackConfig, opts: Optional[pulumi.ResourceOptions] = None):
        if config.slurm is not None:
            # Registered first, beside the cluster: every child waits for this component, which waits for
            # the lock, so a refused ClusterName change (see cluster_name_lock) touches no object at all.
            lock = cluster_name_lock(name, config.slurm.cluster_name, pulumi.ResourceOptions(parent=opts.parent if opts else None))
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[lock]))
        super().__init__("dualsched:cluster:DualScheduledCluster", name, None, opts)
        namespaces = self._namespaces(name, config)
        storage = SharedStorageVolumes(
            f"{name}-shared",
            SharedStorageVolumesArgs(config.storage, storage_consumers(config, namespaces), config.protect_state),
            opts=child(self),
        )
        # Labels and taints are kept by an in-cluster program, which shares each node's taint list with other
        # writers (docs/architecture.md, "Node labels and taints") and costs the engine nothing per node (docs/benchmark.md).
        # Only it can take off a label or taint that leaves the config. It is ready once every pool node carries
        # its pool's labels and taints: slurmd and the model servers wait for that, as their nodeSelector and
        # affinity match labels that the keeper, not the engine, writes.
        keeper = NodeKeeper(
            f"{name}-node-keeper", NodeKeeperArgs(config, namespaces[SLURM if keeper_runs_in_slurm(config) else INFERENCE]), opts=child(self)
        )

        self.controller_address: Optional[pulumi.Output[str]] = None
        self.slurm_conf_hash: Optional[str] = None
        if config.slurm is not None:
            self._slurm(name, config, namespaces, storage, keeper)
        endpoints = {}
        if config.serves_models:
            endpoints = self._model_servers(name, config, namespaces[INFERENCE], storage, keeper)

        self.namespaces = namespaces
        self.inference_endpoints = endpoints
        self.register_outputs(
            {
                "namespaces": namespaces,
                "controller_address": self.controller_address,
                "slurm_conf_hash": self.slurm_conf_hash,
                "inference_endpoints": endpoints,
            }
        )

    def _namespaces(self, name: str, config: StackConfig) -> dict[str, pulumi.Output[str]]:
        namespaces = {}
        if config.slurm is not None:
            namespaces[SLURM] = SlurmNamespace(f"{name}-slurm", SlurmNamespaceArgs(config, config.protect_state), opts=child(self)).name
        if config.serves_models:
            keeper_policies = None if keeper_runs_in_slurm(config) else node_keeper_policies(config)
            namespaces[INFERENCE] = InferenceNamespace(
                f"{name}-inference", config.inference, opts=child(self), other_programs=keeper_policies
            ).name
        if config.submission.enabled:  # config.checks: only with Slurm
            namespaces[JOBS] = JobSubmissionNamespace(f"{name}-jobs", config, opts=child(self)).name
        return namespaces

    def _slurm(
        self,
        name: str,
        config: StackConfig,
        namespaces: dict[str, pulumi.Output[str]],
        storage: SharedStorageVolumes,
        keeper: NodeKeeper,
    ) -> None:
        """Munge and JWT keys, users, slurm.conf, slurmctld, its metrics, accounting, the slurmd pools and their
        rollout, login and job submission."""
        site, slurm_namespace = kubernetes_site(config), namespaces[SLURM]
        # Only Slurm's own namespace holds the munge key: Jobs authenticate with minted tokens.
        munge = MungeKey(f"{name}-munge", MungeKeyArgs({SLURM: slurm_namespace}), opts=child(self))
        jwt_key = JwtKey(f"{name}-jwt-key", JwtKeyArgs(slurm_namespace, config.slurm.cluster_name), opts=child(self))
        # Who jobs run as: every namespace that runs Slurm code resolves users the same way.
        users = UserDirectory(
            f"{name}-users",
            UserDirectoryArgs(config, {key: ns for key, ns in namespaces.items() if key != INFERENCE}),
            opts=child(self),
        )
        slurm_config = SlurmConfig(f"{name}-slurm-config", SlurmConfigArgs(config, site, slurm_namespace), opts=child(self))
        controller = SlurmController(
            f"{name}-slurmctld",
            SlurmControllerArgs(
                config,
                site,
                slurm_namespace,
                slurm_config.config_map_name,
                slurm_config.restart_hash,
                munge.secret_names[SLURM],
                users.config_map_names[SLURM],
                jwt_key.secret_name,
            ),
            # the ConfigMap exists before slurmctld mounts it (by its fixed name)
            opts=child(self, depends_on=[slurm_config]),
        )
        if config.slurm.metrics.enabled:
            SlurmMetrics(f"{name}-metrics", SlurmMetricsArgs(config, slurm_namespace), opts=child(self))
        if config.slurm.accounting.enabled:
            Accounting(
                f"{name}-accounting",
                AccountingArgs(config, site, slurm_namespace, munge.secret_names[SLURM], users.config_map_names[SLURM]),
                opts=child(self),
            )
        for pool in config.slurm_pools:
            ComputePool(
                f"{name}-slurmd-{pool.name}",
                ComputePoolArgs(
                    config,
                    pool,
                    site,
                    slurm_namespace,
                    munge.secret_names[SLURM],
                    users.config_map_names[SLURM],
                    storage.claim_names[SLURM],
                ),
                # Labels first, so slurmd pods schedule onto the pool as soon as they exist.
                opts=child(self, depends_on=[keeper]),
            )
        if config.slurm.login.enabled:
            Login(
                f"{name}-login",
                LoginArgs(config, slurm_namespace, slurm_config.config_map_name, munge.secret_names[SLURM], storage.claim_names[SLURM]),
                opts=child(self, depends_on=[slurm_config]),
            )
        if config.slurm_pools:
            # Takes a changed slurmd template to the nodes (the DaemonSets update OnDelete), job by job.
            SlurmdRolloutController(
                f"{name}-slurmd-rollout",
                SlurmdRolloutArgs(
                    config, slurm_namespace, slurm_config.config_map_name, munge.secret_names[SLURM], users.config_map_names[SLURM]
                ),
                # the Slurm files' ConfigMap exists before the client container mounts it (by its fixed name)
                opts=child(self, depends_on=[slurm_config]),
            )
        if config.submission.enabled:
            minter = TokenMinter(
                f"{name}-token-minter", TokenMinterArgs(config, slurm_namespace, jwt_key.secret_name), opts=child(self)
            )
            SlurmRestApi(
                f"{name}-slurmrestd",
                SlurmRestApiArgs(config, slurm_namespace, slurm_config.config_map_name, users.config_map_names[SLURM]),
                opts=child(self, depends_on=[slurm_config]),
            )
            self.submission = JobSubmission(
                f"{name}-submission",
                JobSubmissionArgs(config, namespaces[JOBS], slurm_config.files, users.config_map_names[JOBS], minter.url),
                opts=child(self),
            )
        self.controller_address = controller.address
        self.slurm_conf_hash = slurm_config.hash

    def _model_servers(
        self, name: str, config: StackConfig, namespace: pulumi.Output[str], storage: SharedStorageVolumes, keeper: NodeKeeper
    ) -> dict[str, pulumi.Output[str]]:
        """One ModelServer per model; model name -> its in-cluster endpoint."""
        endpoints = {}
        for model in config.inference.models:
            server = ModelServer(
                f"{name}-{model.name}",
                ModelServerArgs(config, model, namespace, storage.claim_names[INFERENCE]),
                # the labels of the nodes they may land on, and the taints that keep them off Slurm's nodes
                # and closed windows
                opts=child(self, depends_on=[keeper]),
            )
            endpoints[model.name] = server.endpoint
        return endpoints
