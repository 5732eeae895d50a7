"""Importing dualsched into your own Pulumi program: just Slurm, one component at a time.

Run it as the `__main__.py` of a Pulumi project whose stack config holds the
same `dualsched:*` keys as this repository's stacks (see README, Configuration).
"""

import pulumi

from components.compute import ComputePool, ComputePoolArgs
from components.controller import SlurmController, SlurmControllerArgs
from components.identity import UserDirectory, UserDirectoryArgs
from components.munge import MungeKey, MungeKeyArgs
from components.tokens import JwtKey, JwtKeyArgs
from components.namespace import SlurmNamespace, SlurmNamespaceArgs
from components.slurm_config import SlurmConfig, SlurmConfigArgs
from components.slurm_files import kubernetes_site
from components.storage import SharedStorageVolumes, SharedStorageVolumesArgs, StorageConsumer
from config import ConfigError, StackConfig, load_pulumi_config


def slurm_only(config: StackConfig) -> SlurmController:
    site = kubernetes_site(config)
    namespace = SlurmNamespace("training", SlurmNamespaceArgs(config)).name
    munge = MungeKey("training-munge", MungeKeyArgs({"slurm": namespace}))
    users = UserDirectory("training-users", UserDirectoryArgs(config, {"slurm": namespace}))
    jwt_key = JwtKey("training-jwt-key", JwtKeyArgs(namespace, config.slurm.cluster_name))
    files = SlurmConfig("training-config", SlurmConfigArgs(config, site, namespace))
    storage = SharedStorageVolumes(
        "training-shared",
        SharedStorageVolumesArgs(config.storage, {"slurm": StorageConsumer(namespace, read_only=False)}, config.protect_state),
    )
    controller = SlurmController(
        "training-slurmctld",
        SlurmControllerArgs(
            config,
            site,
            namespace,
            files.config_map_name,
            files.restart_hash,
            munge.secret_names["slurm"],
            users.config_map_names["slurm"],
            jwt_key.secret_name,
        ),
    )
    for pool in config.slurm_pools:
        ComputePool(
            f"training-slurmd-{pool.name}",
            ComputePoolArgs(
                config,
                pool,
                site,
                namespace,
                munge.secret_names["slurm"],
                users.config_map_names["slurm"],
                storage.claim_names["slurm"],
            ),
            opts=pulumi.ResourceOptions(depends_on=[controller]),
        )
    return controller


if __name__ == "__main__":
    try:
        stack_config = load_pulumi_config()
    except ConfigError as error:
        raise pulumi.RunError(str(error)) from None
    pulumi.export("slurmctld", slurm_only(stack_config).address)
