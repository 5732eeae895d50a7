"""The project's program: what __main__.py runs under `pulumi up`, and what the render, the change report,
the policy rules and tests/test_stack.py run under dualsched's mocks (``--program infra:build``).

Add the team's own resources here, beside the cluster; anything they register is rendered and checked too.
"""

import pulumi

from dualsched.components.cluster import DualScheduledCluster
from dualsched.config import StackConfig


def build(config: StackConfig) -> DualScheduledCluster:
    cluster = DualScheduledCluster("cluster", config)
    pulumi.export("namespaces", cluster.namespaces)
    pulumi.export("slurmctld", cluster.controller_address)
    pulumi.export("inferenceEndpoints", cluster.inference_endpoints)
    return cluster
