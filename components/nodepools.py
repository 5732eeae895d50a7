"""GPU node pools: the labels each pool's nodes carry (pool, mode, Slurm's GPU share).

Nodes are not Pulumi resources here: the node keeper (components/node_keeper.py) writes these labels
from its desired state, beside the pools' taints, merge-patching only the keys it owns. A resource per
node (a NodePatch, as before) kept the whole Node in the stack's state and made every `pulumi up` of a
large fleet pay for it (docs/benchmark.md). Removing the program deletes the keeper and leaves the
labels on the nodes as they are, so a `pulumi destroy` never lets Kubernetes pods flood a node in the
middle of a week-long Slurm job.
"""

from __future__ import annotations

from dualsched.components.programs.node_keeper import KEPT_BY_LABEL
from dualsched.config.models import NodePool, StackConfig

MODE_LABEL = "dualsched.io/mode"
SLURM_GPUS_LABEL = "dualsched.io/slurm-gpus"
GUARDED_POOL_LABEL = "node-restriction.kubernetes.io/dualsched-pool"
"""The pool again, under the prefix that the NodeRestriction admission plugin keeps a kubelet from setting on
its own Node. slurmd brings the munge key and the read-write claim of /shared; a kubelet may set any other
label on its Node, so a pool label alone would let a node label itself into a pool and get them."""


def keeper_runs_in_slurm(config: StackConfig) -> bool:
    """Whether the stack's node keeper runs in Slurm's namespace; without Slurm it runs in the inference namespace."""
    return config.slurm is not None


def keeper_namespace(config: StackConfig) -> str:
    """The namespace the stack's node keeper runs in. Two stacks in one cluster never share it, so it names the
    stack on the nodes (KEPT_BY_LABEL)."""
    return config.slurm.namespace if keeper_runs_in_slurm(config) else config.inference.namespace


def pool_labels(config: StackConfig, pool: NodePool) -> dict[str, str]:
    """The labels of every node of ``pool``: what slurmd's nodeSelector and the model servers' affinity match, and
    the stack that keeps them (the keeper finds by it the nodes that left every pool, and releases them)."""
    return {
        config.placement.pool_label: pool.name,
        GUARDED_POOL_LABEL: pool.name,
        MODE_LABEL: pool.mode.value,
        SLURM_GPUS_LABEL: str(pool.slurm_gpu_count),
        KEPT_BY_LABEL: keeper_namespace(config),
    }


def slurmd_node_selector(config: StackConfig, pool: NodePool) -> dict[str, str]:
    """The nodes of ``pool`` that this stack's node keeper labelled: the guarded label, which only a keeper can have
    set, the stack's own pool label, and the keeper that keeps the node (another stack's pool of the same name has
    the same guarded label, and with the default placement the same pool label: its slurmd, with its munge key,
    must not start on this stack's nodes)."""
    labels = pool_labels(config, pool)
    return {key: labels[key] for key in (config.placement.pool_label, GUARDED_POOL_LABEL, KEPT_BY_LABEL)}
