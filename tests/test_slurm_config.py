"""SlurmConfig: the rendered Slurm files in one ConfigMap of a fixed name, their hash and their restart hash."""

from __future__ import annotations

import re

import pytest

from dualsched.components.slurm_config import CLUSTER_NAME_LOCK, CONFIG_MAP_NAME
from dualsched.components.slurm_files import SLURM_FILES, config_hash, kubernetes_site, render_slurm_files, restart_hash
from rendering import render_raw, render_stack, variant


def _config_map(rendered):
    return rendered.named("ConfigMap", CONFIG_MAP_NAME, rendered.config.slurm.namespace)


def _add_partition(raw):
    raw["slurm"]["partitions"].append({"name": "debug", "pools": [raw["pools"][0]["name"]], "maxTime": "00:30:00"})


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_config_map_holds_exactly_the_rendered_slurm_files(stack):
    rendered = render_stack(stack)
    config_map = _config_map(rendered)
    assert config_map.namespace == "slurm"
    assert sorted(config_map.manifest["data"]) == sorted(SLURM_FILES)
    assert config_map.manifest["data"] == rendered.slurm_files
    assert rendered.slurm_files == render_slurm_files(rendered.config, kubernetes_site(rendered.config))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_hash_output_is_the_digest_of_the_files(stack):
    rendered = render_stack(stack)
    outputs = rendered.outputs_of("dualsched:slurm_config:SlurmConfig")
    assert outputs["hash"] == config_hash(rendered.slurm_files) == rendered.render.slurm_conf_hash
    assert outputs["config_map_name"] == _config_map(rendered).name


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_restart_hash_output_is_the_digest_of_the_restart_settings(stack):
    rendered = render_stack(stack)
    outputs = rendered.outputs_of("dualsched:slurm_config:SlurmConfig")
    assert outputs["restart_hash"] == restart_hash(rendered.slurm_files, rendered.config.slurm.release_version)
    assert outputs["restart_hash"] != outputs["hash"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_config_map_has_a_fixed_name(stack):
    """Not auto-named: a data change replaces it under the same name, so no pod template refers to a new name."""
    config_map = _config_map(render_stack(stack))
    assert CONFIG_MAP_NAME == "slurm-config"
    assert config_map.name == "slurm-config"
    assert config_map.manifest["metadata"]["name"] == "slurm-config"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurm_conf_is_configless_and_accounts_gpus(stack):
    conf = render_stack(stack).slurm_files["slurm.conf"]
    assert "SlurmctldParameters=enable_configless" in conf.splitlines()
    assert re.search(r"^AccountingStorageTRES=.*\bgres/gpu\b", conf, re.M)
    assert "AccountingStorageHost=slurmdbd.slurm.svc.cluster.local" in conf.splitlines()


def test_controller_hosts_are_the_statefulset_dns_names():
    dev = render_stack("dev").slurm_files["slurm.conf"]
    prod = render_stack("prod").slurm_files["slurm.conf"]
    assert re.findall(r"^SlurmctldHost=.*$", dev, re.M) == ["SlurmctldHost=slurmctld-0(slurmctld-0.slurmctld.slurm.svc.cluster.local)"]
    assert re.findall(r"^SlurmctldHost=.*$", prod, re.M) == [
        "SlurmctldHost=slurmctld-0(slurmctld-0.slurmctld.slurm.svc.cluster.local)",
        "SlurmctldHost=slurmctld-1(slurmctld-1.slurmctld.slurm.svc.cluster.local)",
    ]


def test_node_lines_grow_with_pools_not_nodes():
    rendered = render_stack("prod")
    conf = rendered.slurm_files["slurm.conf"]
    node_lines = re.findall(r"^NodeName=(\S+) .*Gres=(\S+)", conf, re.M)
    assert node_lines == [("gpu-a-[001-032]", "gpu:h100:8"), ("gpu-b-[001-032]", "gpu:h100:8"), ("gpu-s-[001-016]", "gpu:h100:4")]
    assert sum(len(pool.node_names) for pool in rendered.config.pools) == 80


def test_kubernetes_only_pools_have_no_node_line():
    def add_pool(raw):
        raw["pools"].append({"name": "serve", "nodes": "inf-[01-04]", "mode": "kubernetes"})

    conf = render_raw(variant("dev", add_pool)).slurm_files["slurm.conf"]
    assert "inf-" not in conf


def test_the_files_hold_no_secret():
    rendered = render_stack("dev")
    text = "".join(_config_map(rendered).manifest["data"].values())
    assert not any(secret in text for secret in rendered.generated_secrets)
    assert "StoragePass" not in text


def test_adding_a_partition_changes_the_hash_and_the_data_but_not_the_name_or_restart_hash():
    before, after = render_stack("dev"), render_raw(variant("dev", _add_partition))
    outputs_before = before.outputs_of("dualsched:slurm_config:SlurmConfig")
    outputs_after = after.outputs_of("dualsched:slurm_config:SlurmConfig")
    assert "PartitionName=debug" in after.slurm_files["slurm.conf"]
    assert outputs_after["hash"] != outputs_before["hash"]
    assert outputs_after["restart_hash"] == outputs_before["restart_hash"]
    assert _config_map(after).manifest["data"] != _config_map(before).manifest["data"]
    assert _config_map(after).name == _config_map(before).name == "slurm-config"


def test_a_change_outside_slurm_leaves_the_hash_alone():
    def bigger_model(raw):
        raw["inference"]["models"][0]["replicas"]["max"] = 5

    assert render_raw(variant("dev", bigger_model)).render.slurm_conf_hash == render_stack("dev").render.slurm_conf_hash


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_cluster_name_lock_is_protected_and_gates_the_whole_cluster(stack):
    """A ClusterName change replaces the lock (keepers), which protect refuses, in dev as in prod:
    slurmctld would exit on CLUSTER NAME MISMATCH with its saved state. The cluster component, and
    so every object in it, waits for the lock: a refused rename changes nothing."""
    rendered = render_stack(stack)
    (lock,) = [r for r in rendered.resources if r.name.endswith(CLUSTER_NAME_LOCK)]
    assert (lock.type, lock.name, lock.protect) == ("random:index/randomId:RandomId", "dualsched-cluster-name-lock", True)
    (cluster,) = rendered.components("dualsched:cluster:DualScheduledCluster")
    assert lock.urn in cluster.dependencies


def test_cluster_name_lock_is_keyed_on_the_cluster_name():
    rendered = render_raw(variant("dev", lambda raw: raw["slurm"].update(clusterName="renamed")))
    (lock,) = [r for r in rendered.resources if r.name.endswith(CLUSTER_NAME_LOCK)]
    assert lock.inputs["keepers"] == {"clusterName": "renamed"}
