"""GPU node pools: the labels of each pool's nodes, which the node keeper writes (tests/test_node_keeper.py),
as no Pulumi resource exists per node."""

from __future__ import annotations

import json

import pytest

from dualsched.components.node_keeper import STATE_FILE
from dualsched.components.nodepools import GUARDED_POOL_LABEL, MODE_LABEL, SLURM_GPUS_LABEL, pool_labels
from dualsched.components.programs.node_keeper import KEPT_BY_LABEL
from rendering import render_raw, render_stack, variant

POOL_LABEL = "dualsched.io/pool"


def _kept_labels(rendered) -> dict[str, dict[str, str]]:
    """Node -> the labels in the keeper's desired state, as deployed."""
    [keeper] = [c for c in rendered.by_kind("ConfigMap") if STATE_FILE in (c.manifest.get("data") or {})]
    return {node: pool["labels"] for pool in json.loads(keeper.manifest["data"][STATE_FILE])["pools"] for node in pool["nodes"]}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_pool_node_gets_the_pool_mode_and_slurm_share_labels(stack):
    rendered = render_stack(stack)
    kept = _kept_labels(rendered)
    assert len(kept) == (2 if stack == "dev" else 80)
    for pool in rendered.config.pools:
        for name in pool.node_names:
            assert kept[name] == {POOL_LABEL: pool.name, GUARDED_POOL_LABEL: pool.name, MODE_LABEL: pool.mode.value,
                                  SLURM_GPUS_LABEL: str(pool.slurm_gpu_count), KEPT_BY_LABEL: "slurm"}  # fmt: skip
    assert kept["gpu-a-001"][SLURM_GPUS_LABEL] == "8" if stack == "prod" else kept["gpu-001"][SLURM_GPUS_LABEL] == "6"


def test_kubernetes_pools_are_labelled_with_no_slurm_share():
    def add_pool(raw):
        raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "gpusPerNode": 4})

    rendered = render_raw(variant("dev", add_pool))
    assert _kept_labels(rendered)["inf-01"] == {POOL_LABEL: "serve", GUARDED_POOL_LABEL: "serve", MODE_LABEL: "kubernetes",
                                                SLURM_GPUS_LABEL: "0", KEPT_BY_LABEL: "slurm"}  # fmt: skip


def test_the_pool_label_key_comes_from_the_placement_config():
    rendered = render_raw(variant("dev", lambda raw: raw.setdefault("placement", {}).update(poolLabel="example.com/gpu-pool")))
    assert _kept_labels(rendered)["gpu-001"]["example.com/gpu-pool"] == "gpu"
    assert pool_labels(rendered.config, rendered.config.pools[0]) == _kept_labels(rendered)["gpu-001"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmd_selects_its_nodes_by_the_labels_the_keeper_writes(stack):
    rendered = render_stack(stack)
    kept = _kept_labels(rendered)
    for daemonset in rendered.by_kind("DaemonSet"):
        selector = daemonset.manifest["spec"]["template"]["spec"]["nodeSelector"]
        selected = {node for node, node_labels in kept.items() if selector.items() <= node_labels.items()}
        [pool] = [p for p in rendered.config.slurm_pools if p.name == selector[POOL_LABEL]]
        assert selected == set(pool.node_names), daemonset.name
