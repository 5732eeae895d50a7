"""Importing dualsched into your own Pulumi program: Slurm only, one component at a time.

The dualsched config lives under your own key, here ``training:cluster`` (one object in the
dualsched schema; see examples/Pulumi.own-program.yaml). For a config it deploys:

- the ClusterName lock, which every component waits for: `pulumi up` refuses a rename;
- the Slurm namespace, the munge and JWT keys, the users' passwd and group files, slurm.conf;
- the shared file system's volume and claim for Slurm;
- the node keeper (each pool's labels, which slurmd's nodeSelector matches, and taints: the Slurm taint
  keeps other pods off dedicated nodes);
- slurmctld, and slurmdbd with its database when accounting is on (slurm.conf points at it then);
- one slurmd DaemonSet per Slurm pool, and the slurmd rollout controller, which takes a changed slurmd
  template to the nodes one drained node at a time (the DaemonSets update OnDelete: without it, nothing would).

It refuses a config asking for what it does not build (model servers, job submission from
Kubernetes) rather than ignore it. Render it, reading the config itself or given it:

    python -m dualsched.components.render --stack-file examples/Pulumi.own-program.yaml --program dualsched.examples.own_program:main --out build/own
    python -m dualsched.components.render --stack-file examples/Pulumi.own-program.yaml --config-key training:cluster \\
        --program dualsched.examples.own_program:slurm_only --out build/own

As the ``__main__.py`` of a Pulumi project, it runs ``main()``.
"""

from __future__ import annotations

from typing import Optional

import pulumi

from dualsched.components.accounting import Accounting, AccountingArgs
from dualsched.components.common import child
from dualsched.components.compute import ComputePool, ComputePoolArgs
from dualsched.components.controller import SlurmController, SlurmControllerArgs
from dualsched.components.identity import UserDirectory, UserDirectoryArgs
from dualsched.components.munge import MungeKey, MungeKeyArgs
from dualsched.components.namespace import SlurmNamespace, SlurmNamespaceArgs
from dualsched.components.node_keeper import NodeKeeper, NodeKeeperArgs
from dualsched.components.slurm_config import SlurmConfig, SlurmConfigArgs, cluster_name_lock
from dualsched.components.slurm_files import kubernetes_site
from dualsched.components.slurmd_rollout import SlurmdRolloutArgs, SlurmdRolloutController
from dualsched.components.storage import SharedStorageVolumes, SharedStorageVolumesArgs, StorageConsumer
from dualsched.components.tokens import JwtKey, JwtKeyArgs
from dualsched.config import ConfigError, Problem, StackConfig, parse_stack_config
from dualsched.config.checks import MISSING

CONFIG_NAMESPACE, CONFIG_KEY = "training", "cluster"
SLURM = "slurm"


def unsupported(config: StackConfig) -> list[Problem]:
    """What the config asks for that this program does not build."""
    problems = []
    if config.slurm is None:
        problems.append(Problem("slurm", "this program deploys Slurm: give a slurm section", MISSING))
    if config.serves_models:
        problems.append(Problem("inference.models", "this program deploys no model servers", [m.name for m in config.inference.models]))
    if config.submission.enabled:
        problems.append(Problem("submission.enabled", "this program deploys no job submission from Kubernetes: set it false", True))
    return problems


class TrainingCluster(pulumi.ComponentResource):
    """Slurm on the config's pools. The parent of every component: it waits for the ClusterName lock, and
    so does everything in it (docs/architecture.md, "Renaming a cluster")."""

    controller_address: pulumi.Output[str]

    def __init__(self, name: str, config: StackConfig, opts: Optional[pulumi.ResourceOptions] = None):
        lock = cluster_name_lock(name, config.slurm.cluster_name, pulumi.ResourceOptions(parent=opts.parent if opts else None))
        super().__init__("examples:own_program:TrainingCluster", name, None,
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[lock])))
        site = kubernetes_site(config)
        namespace = SlurmNamespace(f"{name}-slurm", SlurmNamespaceArgs(config, config.protect_state), opts=child(self)).name
        munge = MungeKey(f"{name}-munge", MungeKeyArgs({SLURM: namespace}), opts=child(self))
        users = UserDirectory(f"{name}-users", UserDirectoryArgs(config, {SLURM: namespace}), opts=child(self))
        jwt_key = JwtKey(f"{name}-jwt-key", JwtKeyArgs(namespace, config.slurm.cluster_name), opts=child(self))
        files = SlurmConfig(f"{name}-slurm-config", SlurmConfigArgs(config, site, namespace), opts=child(self))
        storage = SharedStorageVolumes(
            f"{name}-shared",
            SharedStorageVolumesArgs(config.storage, {SLURM: StorageConsumer(namespace, read_only=False)}, config.protect_state),
            opts=child(self),
        )
        # Labels and taints, in one patch per node: a node joins its pool carrying the pool's taints.
        keeper = NodeKeeper(f"{name}-node-keeper", NodeKeeperArgs(config, namespace), opts=child(self))
        controller = SlurmController(
            f"{name}-slurmctld",
            SlurmControllerArgs(
                config, site, namespace, files.config_map_name, files.restart_hash,
                munge.secret_names[SLURM], users.config_map_names[SLURM], jwt_key.secret_name,
            ),
            opts=child(self, depends_on=[files]),  # slurmctld mounts the ConfigMap by its fixed name
        )
        if config.slurm.accounting.enabled:
            # slurm.conf's AccountingStorageHost is this slurmdbd's Service.
            Accounting(
                f"{name}-accounting",
                AccountingArgs(config, site, namespace, munge.secret_names[SLURM], users.config_map_names[SLURM]),
                opts=child(self),
            )
        for pool in config.slurm_pools:
            ComputePool(
                f"{name}-slurmd-{pool.name}",
                ComputePoolArgs(
                    config, pool, site, namespace,
                    munge.secret_names[SLURM], users.config_map_names[SLURM], storage.claim_names[SLURM],
                ),
                opts=child(self, depends_on=[keeper]),  # slurmd schedules once its nodes carry the label
            )
        if config.slurm_pools:
            SlurmdRolloutController(
                f"{name}-slurmd-rollout",
                SlurmdRolloutArgs(config, namespace, files.config_map_name, munge.secret_names[SLURM], users.config_map_names[SLURM]),
                opts=child(self, depends_on=[files]),  # its client container mounts the Slurm files by their fixed name
            )
        self.controller_address = controller.address
        self.register_outputs({"controller_address": self.controller_address})


def slurm_only(config: StackConfig) -> TrainingCluster:
    """Slurm for a validated config; ConfigError for one that asks for more."""
    problems = unsupported(config)
    if problems:
        raise ConfigError(problems, "examples/own_program.py (Slurm only)")
    return TrainingCluster("training", config)


def main() -> TrainingCluster:
    """The program as `pulumi up` runs it: the config under training:cluster, validated, then Slurm."""
    key = f"{CONFIG_NAMESPACE}:{CONFIG_KEY}"
    try:
        cluster = slurm_only(parse_stack_config(pulumi.Config(CONFIG_NAMESPACE).require_object(CONFIG_KEY), source=key))
    except ConfigError as error:
        # A config mistake is the user's to fix: every problem, no traceback, nothing registered.
        raise pulumi.RunError(str(error)) from None
    pulumi.export("slurmctld", cluster.controller_address)
    return cluster


if __name__ == "__main__":
    main()
