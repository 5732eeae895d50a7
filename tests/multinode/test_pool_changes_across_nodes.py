"""A node moves to another pool of the running local stack (Slurm 22.05, Debian 12's), then joins a pool by label
and leaves it, then goes back, while a job runs.

22.05's `scontrol reconfigure` cannot add, remove or resize nodes, so a NodeName change (or a joining pool's NodeSet)
restarts both controllers (components/slurm_files.py, restart_keys): the running job and the accounting survive
it, the node that comes back runs a step. A node that joins by label registers as a dynamic node, and one that
leaves is deleted, with no restart. The same flow on 24.11, where no `pulumi up` restarts a controller either, is
in test_slurm_24_11_across_nodes.py.
"""

from __future__ import annotations

import pytest

from e2e_support import raw_config
from node_support import local_config
from test_real_node import up

from .multi_node_support import a_node_changes_pools_and_joins_one_by_label_while_a_job_runs

pytestmark = pytest.mark.multinode


def test_a_node_changes_pools_and_joins_one_by_label_while_a_job_runs_the_pool_changes_restarting_the_controllers(nodes):
    world = nodes.world
    a_node_changes_pools_and_joins_one_by_label_while_a_job_runs(
        nodes, lambda config: up(world, config), local_config(world, raw_config("local")), "22.05", controller_restarts=True
    )
