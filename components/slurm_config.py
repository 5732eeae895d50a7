"""The rendered Slurm files in the cluster: one ConfigMap that slurmctld serves to every node."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.components.common import child, labels, meta
from dualsched.components.slurm_files import Site, config_hash, render_slurm_files, restart_hash
from dualsched.config.models import StackConfig

CONFIG_DIR = "/etc/slurm"
SLURM_CONF = f"{CONFIG_DIR}/slurm.conf"
SLURM_CONF_ENV = k8s.core.v1.EnvVarArgs(name="SLURM_CONF", value=SLURM_CONF)
"""Where clients and slurmctld read the mounted slurm.conf."""
CONFIG_MAP_NAME = "slurm-config"
CLUSTER_NAME_LOCK = "cluster-name-lock"
"""Suffix of the protected resource that makes `pulumi up` refuse a ClusterName change."""


def cluster_name_lock(name: str, cluster_name: str, opts: Optional[pulumi.ResourceOptions] = None) -> random.RandomId:
    """A protected resource keyed on ClusterName: renaming the cluster would replace it, which the
    engine refuses. Make everything that carries the name wait for it (``depends_on``), so a refused
    rename changes nothing.

    slurmctld exits on "CLUSTER NAME MISMATCH" when ClusterName differs from the clustername file in
    its StateSaveLocation (``_verify_clustername``, src/slurmctld/controller.c, Slurm 25.05): a plain
    rename would leave the controller crash-looping. docs/architecture.md says how to rename on purpose.
    """
    return random.RandomId(
        f"{name}-{CLUSTER_NAME_LOCK}",
        byte_length=4,
        keepers={"clusterName": cluster_name},
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(protect=True)),
    )


@dataclass(frozen=True)
class SlurmConfigArgs:
    config: StackConfig
    site: Site
    namespace: pulumi.Input[str]


class SlurmConfig(pulumi.ComponentResource):
    """slurm.conf, gres.conf and cgroup.conf in a ConfigMap, and their hashes.

    The files hold no secret. Compute nodes never mount them: in configless mode
    slurmd fetches them from slurmctld. The ConfigMap has a fixed name, so a change
    (pulumi-kubernetes replaces a ConfigMap whose data changes) leaves slurmctld's pod
    template alone: the kubelet refreshes the mounted files, and the controller's
    reconfigure sidecar runs `scontrol reconfigure`. Only ``restart_hash`` rolls slurmctld: the
    settings a reconfigure cannot apply, which include the nodes before Slurm 23.11.
    """

    files: dict[str, str]
    hash: str
    restart_hash: str
    config_map_name: str

    def __init__(self, name: str, args: SlurmConfigArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:slurm_config:SlurmConfig", name, None, opts)
        self.files = render_slurm_files(args.config, args.site)
        self.hash = config_hash(self.files)
        self.restart_hash = restart_hash(self.files, args.config.slurm.release_version)
        k8s.core.v1.ConfigMap(
            name,
            metadata=meta(
                name=CONFIG_MAP_NAME, namespace=args.namespace, labels=labels("slurm-config", args.config.slurm.cluster_name)
            ),
            data=self.files,
            opts=child(self),
        )
        # The fixed name, not the object's output: a data change replaces the ConfigMap (delete, then
        # create), and the engine replaces every resource whose inputs come from a replaced one's
        # outputs. Mounting it by name keeps slurmctld running through a config change.
        self.config_map_name = CONFIG_MAP_NAME
        self.register_outputs({"config_map_name": self.config_map_name, "hash": self.hash, "restart_hash": self.restart_hash})
