"""GPU node pools: the pool label, mode and Slurm's GPU share on existing nodes.

Nodes are patched, not owned: ``retain_on_delete`` keeps the labels when the program is removed, so a
`pulumi destroy` never lets Kubernetes pods flood a node in the middle of a week-long Slurm job.
Labels are a map under server-side apply, each label its own field: other managers' labels survive.
Taints are not here: ``spec.taints`` is one atomic list, so the node keeper (components/node_keeper.py)
edits it; removing the program deletes the keeper and leaves the taints on the nodes as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import child
from dualsched.config.models import NodePool, StackConfig

MODE_LABEL = "dualsched.io/mode"
SLURM_GPUS_LABEL = "dualsched.io/slurm-gpus"
FIELD_MANAGER = "dualsched"


@dataclass(frozen=True)
class GpuNodePoolArgs:
    config: StackConfig
    pool: NodePool


class GpuNodePool(pulumi.ComponentResource):
    """A NodePatch per node: pool label, mode and Slurm's GPU share."""

    node_names: list[str]

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:nodepools:GpuNodePool", name, None, opts)
        config, pool = args.config, args.pool
        node_labels = {
            config.placement.pool_label: pool.name,
            MODE_LABEL: pool.mode.value,
            SLURM_GPUS_LABEL: str(pool.slurm_gpu_count),
        }
        self.node_names = pool.node_names
        for node in self.node_names:
            k8s.core.v1.NodePatch(
                f"{name}-{node}",
                metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                    name=node,
                    labels=node_labels,
                    annotations={"pulumi.com/patchFieldManager": FIELD_MANAGER},
                ),
                opts=child(self, retain_on_delete=True),
            )
        self.register_outputs({"node_names": self.node_names})
