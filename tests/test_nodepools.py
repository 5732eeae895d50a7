"""GpuNodePool: label existing nodes with NodePatch, and leave them so on delete. Their taints are the
node keeper's (tests/test_node_keeper.py)."""

from __future__ import annotations

import hostlist
import pytest

from dualsched.components.nodepools import FIELD_MANAGER, MODE_LABEL, SLURM_GPUS_LABEL
from rendering import render_raw, render_stack, variant

POOL_LABEL = "dualsched.io/pool"


def _nodes(rendered) -> dict:
    return {node.name: node for node in rendered.by_kind("Node")}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_node_patch_per_node_of_every_pool(stack):
    rendered = render_stack(stack)
    expected = [name for pool in rendered.config.pools for name in hostlist.expand_hostlist(pool.nodes)]
    nodes = rendered.by_kind("Node")
    assert sorted(node.name for node in nodes) == sorted(expected)
    assert len(nodes) == (2 if stack == "dev" else 80)
    for node in nodes:
        assert node.pulumi_type == "kubernetes:core/v1:NodePatch"
        assert node.manifest["apiVersion"] == "v1" and node.namespace is None


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_nodes_carry_the_pool_mode_and_slurm_share_labels(stack):
    rendered = render_stack(stack)
    nodes = _nodes(rendered)
    for pool in rendered.config.pools:
        for name in pool.node_names:
            labels = nodes[name].manifest["metadata"]["labels"]
            assert labels == {POOL_LABEL: pool.name, MODE_LABEL: pool.mode.value, SLURM_GPUS_LABEL: str(pool.slurm_gpu_count)}
            assert nodes[name].manifest["metadata"]["annotations"] == {"pulumi.com/patchFieldManager": FIELD_MANAGER}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_node_patches_send_no_taints(stack):
    """Taints are one atomic list under server-side apply: a patch that sent them would conflict with
    every other writer, or wipe their taints. Dedicated pools' nodes too: the keeper sets theirs."""
    for node in render_stack(stack).by_kind("Node"):
        assert "spec" not in node.manifest, node.name
    assert _nodes(render_stack("prod"))["gpu-a-001"].manifest["metadata"]["labels"][SLURM_GPUS_LABEL] == "8"


def test_kubernetes_pools_are_labelled_with_no_slurm_share():
    def add_pool(raw):
        raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "gpusPerNode": 4})

    nodes = _nodes(render_raw(variant("dev", add_pool)))
    assert nodes["inf-01"].manifest["metadata"]["labels"] == {POOL_LABEL: "serve", MODE_LABEL: "kubernetes", SLURM_GPUS_LABEL: "0"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_node_patches_are_retained_on_delete(stack):
    """Removing the program must not strip labels from nodes in the middle of a job (nor their taints:
    nothing removes those once the keeper is gone).

    Observed on the RegisterResource request the engine would receive (retainOnDelete).
    """
    rendered = render_stack(stack)
    registrations = [r for r in rendered.resources if r.type == "kubernetes:core/v1:NodePatch"]
    assert len(registrations) == len(rendered.by_kind("Node"))
    for registration in registrations:
        assert registration.retain_on_delete is True
        assert registration.parent_type == "dualsched:nodepools:GpuNodePool"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_component_per_pool_with_its_node_names(stack):
    rendered = render_stack(stack)
    components = rendered.components("dualsched:nodepools:GpuNodePool")
    assert len(components) == len(rendered.config.pools)
    for pool in rendered.config.pools:
        [component] = [c for c in components if c.name == f"dualsched-{pool.name}"]
        assert rendered.component_outputs[component.urn] == {"node_names": pool.node_names}
