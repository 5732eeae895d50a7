"""The program every consumer runs: `pulumi up`, the offline render, the tests."""

from __future__ import annotations

import pulumi

from dualsched.components.cluster import DualScheduledCluster
from dualsched.config.models import StackConfig


def build(config: StackConfig) -> DualScheduledCluster:
    """Register the cluster a validated config describes (Slurm, model servers or both) and export its
    outputs; those of a part the stack leaves out are None."""
    cluster = DualScheduledCluster("dualsched", config)
    pulumi.export("namespaces", cluster.namespaces)
    pulumi.export("controller_address", cluster.controller_address)
    pulumi.export("slurm_conf_hash", cluster.slurm_conf_hash)
    pulumi.export("inference_endpoints", cluster.inference_endpoints)
    return cluster
