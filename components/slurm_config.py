"""The rendered Slurm files in the cluster: one ConfigMap that slurmctld serves to every node."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components.common import child, labels, meta
from components.slurm_files import Site, config_hash, render_slurm_files
from config.models import StackConfig

CONFIG_DIR = "/etc/slurm"


@dataclass(frozen=True)
class SlurmConfigArgs:
    config: StackConfig
    site: Site
    namespace: pulumi.Input[str]


class SlurmConfig(pulumi.ComponentResource):
    """slurm.conf, gres.conf and cgroup.conf in a ConfigMap, and their hash.

    The files hold no secret. Compute nodes never mount them: in configless mode
    slurmd fetches them from slurmctld, so a change rolls only the controller.
    """

    files: dict[str, str]
    hash: str
    config_map_name: pulumi.Output[str]

    def __init__(self, name: str, args: SlurmConfigArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:slurm_config:SlurmConfig", name, None, opts)
        self.files = render_slurm_files(args.config, args.site)
        self.hash = config_hash(self.files)
        config_map = k8s.core.v1.ConfigMap(
            name,
            metadata=meta(namespace=args.namespace, labels=labels("slurm-config", args.config.slurm.cluster_name)),
            data=self.files,
            opts=child(self),
        )
        self.config_map_name = config_map.metadata.name
        self.register_outputs({"config_map_name": self.config_map_name, "hash": self.hash})
