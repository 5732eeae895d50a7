"""DualScheduledCluster: the whole Slurm + Kubernetes GPU cluster from one StackConfig."""

from __future__ import annotations

from typing import Optional

import pulumi

from dualsched.components.accounting import Accounting, AccountingArgs
from dualsched.components.common import child
from dualsched.components.compute import ComputePool, ComputePoolArgs
from dualsched.components.controller import SlurmController, SlurmControllerArgs
from dualsched.components.identity import UserDirectory, UserDirectoryArgs
from dualsched.components.inference import InferenceNamespace, ModelServer, ModelServerArgs
from dualsched.components.munge import MungeKey, MungeKeyArgs
from dualsched.components.namespace import SlurmNamespace, SlurmNamespaceArgs
from dualsched.components.node_keeper import NodeKeeper, NodeKeeperArgs
from dualsched.components.nodepools import GpuNodePool, GpuNodePoolArgs
from dualsched.components.slurm_config import SlurmConfig, SlurmConfigArgs, cluster_name_lock
from dualsched.components.slurm_files import kubernetes_site
from dualsched.components.storage import SharedStorageVolumes, SharedStorageVolumesArgs, StorageConsumer
from dualsched.components.slurmd_rollout import SlurmdRolloutArgs, SlurmdRolloutController
from dualsched.components.slurmrestd import SlurmRestApi, SlurmRestApiArgs
from dualsched.components.submission import JobSubmission, JobSubmissionArgs, JobSubmissionNamespace
from dualsched.components.tokens import JwtKey, JwtKeyArgs, TokenMinter, TokenMinterArgs
from dualsched.config.models import StackConfig

SLURM, INFERENCE, JOBS = "slurm", "inference", "jobs"


class DualScheduledCluster(pulumi.ComponentResource):
    """Composes the components the config asks for; data flows one way, from the config to the objects.

    A stack without a ``slurm`` section builds no Slurm (no lock, no Slurm namespace, no node keeper:
    its pools are mode kubernetes, without taints); one without model servers builds no inference
    namespace. Outputs: the namespaces, the controller address and the slurm.conf hash (None without
    Slurm), and the inference endpoints (model name -> in-cluster URL).
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
            SharedStorageVolumesArgs(
                config.storage,
                # Jobs reach the shared file system through Slurm, as their user; the submitting pod needs none.
                {key: StorageConsumer(ns, read_only=key == INFERENCE) for key, ns in namespaces.items() if key != JOBS},
                config.protect_state,
            ),
            opts=child(self),
        )
        # Taints are kept by an in-cluster program beside Slurm, which shares each node's taint list with other
        # writers (docs/architecture.md, "Node taints"). Always there with Slurm: only it can take off a taint that
        # leaves the config. Labels wait for it, so a node joins its pool only once it carries the pool's taints.
        keeper = None
        if config.slurm is not None:
            keeper = NodeKeeper(f"{name}-node-keeper", NodeKeeperArgs(config, namespaces[SLURM]), opts=child(self))
        labels_wait_for = [keeper] if keeper else []
        node_pools = {
            pool.name: GpuNodePool(f"{name}-{pool.name}", GpuNodePoolArgs(config, pool), opts=child(self, depends_on=labels_wait_for))
            for pool in config.pools
        }

        self.controller_address: Optional[pulumi.Output[str]] = None
        self.slurm_conf_hash: Optional[str] = None
        if config.slurm is not None:
            self._slurm(name, config, namespaces, storage, node_pools)
        endpoints = {}
        if config.serves_models:
            # Model servers wait for the labels of the nodes they can land on, and only those (each dependency on
            # a pool fans out to one per node), and for the taints that keep them off Slurm's nodes and closed windows.
            waits_for = [*labels_wait_for, *(node_pools[pool.name] for pool in config.inference_pools)]
            endpoints = self._model_servers(name, config, namespaces[INFERENCE], storage, waits_for)

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
            namespaces[INFERENCE] = InferenceNamespace(f"{name}-inference", config.inference, opts=child(self)).name
        if config.submission.enabled:  # config.checks: only with Slurm
            namespaces[JOBS] = JobSubmissionNamespace(f"{name}-jobs", config, opts=child(self)).name
        return namespaces

    def _slurm(
        self,
        name: str,
        config: StackConfig,
        namespaces: dict[str, pulumi.Output[str]],
        storage: SharedStorageVolumes,
        node_pools: dict[str, GpuNodePool],
    ) -> None:
        """Munge and JWT keys, users, slurm.conf, slurmctld, accounting, the slurmd pools and their rollout, and job submission."""
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
                opts=child(self, depends_on=[node_pools[pool.name]]),
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
        self, name: str, config: StackConfig, namespace: pulumi.Output[str], storage: SharedStorageVolumes, waits_for: list[pulumi.Resource]
    ) -> dict[str, pulumi.Output[str]]:
        """One ModelServer per model; model name -> its in-cluster endpoint."""
        endpoints = {}
        for model in config.inference.models:
            server = ModelServer(
                f"{name}-{model.name}",
                ModelServerArgs(config, model, namespace, storage.claim_names[INFERENCE]),
                opts=child(self, depends_on=waits_for),
            )
            endpoints[model.name] = server.endpoint
        return endpoints
