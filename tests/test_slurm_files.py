"""slurm.conf, gres.conf, cgroup.conf and slurmdbd.conf (mirrors components/slurm_files.py).

The dev and prod files rendered for the Kubernetes site are compared with the
golden copies in ``tests/golden/<stack>/``. After an intended change to the
templates or the stacks, regenerate them and review the diff:

    UPDATE_GOLDEN=1 pytest tests/test_slurm_files.py
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

from components.slurm_files import (
    SLURM_FILES,
    compact_hostlist,
    config_hash,
    kubernetes_site,
    render_slurm_files,
    render_slurmdbd_conf,
)
from config import StackConfig, parse_stack_config
from tests.conftest import STACKS, raw_stack

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
GOLDEN_FILES = (*SLURM_FILES, "slurmdbd.conf")


def render(config: StackConfig, **site_changes: Any) -> dict[str, str]:
    site = dataclasses.replace(kubernetes_site(config), **site_changes)
    return render_slurm_files(config, site)


def config_of(stack: str, **edits: Any) -> StackConfig:
    raw = raw_stack(stack)
    for key, value in edits.items():
        raw[key] = value
    return parse_stack_config(raw)


def lines(text: str, key: str) -> list[str]:
    """The lines of a config file that set ``key`` (``Key=...``)."""
    return [line for line in text.splitlines() if line.startswith(f"{key}=")]


# ------------------------------------------------------------------------ goldens


def _golden_render(stack: str) -> dict[str, str]:
    config = config_of(stack)
    site = kubernetes_site(config)
    return {**render_slurm_files(config, site), "slurmdbd.conf": render_slurmdbd_conf(config, site)}


@pytest.mark.parametrize("name", GOLDEN_FILES)
@pytest.mark.parametrize("stack", STACKS)
def test_rendered_file_matches_golden(stack: str, name: str):
    rendered = _golden_render(stack)[name]
    golden = GOLDEN / stack / name
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered)
    assert golden.exists(), f"{golden} is missing; run UPDATE_GOLDEN=1 pytest {Path(__file__).name}"
    assert rendered == golden.read_text(), f"{stack}/{name} differs from its golden file"


# slurm.conf(5) parameters the template may set; a typo in the template fails here.
SLURM_CONF_KEYS = {
    "ClusterName", "SlurmctldHost", "SlurmctldPort", "SlurmdPort", "SlurmUser", "SlurmctldParameters",
    "AuthType", "AuthInfo", "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
    "SlurmctldLogFile", "SlurmdLogFile", "SlurmctldDebug", "SlurmdDebug", "ProctrackType", "TaskPlugin",
    "SchedulerType", "SelectType", "SelectTypeParameters", "GresTypes", "PriorityType", "PriorityDecayHalfLife",
    "PriorityWeightFairshare", "PriorityWeightAge", "PriorityWeightPartition", "PriorityWeightJobSize",
    "PriorityWeightTRES", "AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort",
    "AccountingStorageTRES", "JobAcctGatherType", "JobAcctGatherFrequency", "SlurmctldTimeout", "SlurmdTimeout",
    "InactiveLimit", "KillWait", "MinJobAge", "Waittime", "ReturnToService", "NodeName", "PartitionName",
}
NODE_KEYS = {"NodeName", "NodeAddr", "CPUs", "RealMemory", "Gres", "Features", "State"}
PARTITION_KEYS = {"PartitionName", "Nodes", "Default", "MaxTime", "PriorityTier", "State"}
GRES_KEYS = {"AutoDetect", "NodeName", "Name", "Type", "Count", "File"}
CGROUP_KEYS = {"CgroupPlugin", "ConstrainCores", "ConstrainRAMSpace", "ConstrainDevices"}


def _settings(text: str) -> list[list[str]]:
    return [
        [word.split("=", 1)[0] for word in line.split()]
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_slurm_conf_uses_only_slurm_conf_option_names(stack):
    for keys in _settings(render(config_of(stack))["slurm.conf"]):
        allowed = NODE_KEYS if keys[0] == "NodeName" else PARTITION_KEYS if keys[0] == "PartitionName" else SLURM_CONF_KEYS
        assert set(keys) <= allowed, keys


def test_gres_and_cgroup_conf_use_only_their_option_names(stack):
    files = render(config_of(stack))
    assert all(set(keys) <= GRES_KEYS for keys in _settings(files["gres.conf"]))
    assert all(set(keys) <= CGROUP_KEYS for keys in _settings(files["cgroup.conf"]))


# ----------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("expression", "compact"),
    [
        pytest.param("gpu-001,gpu-002,gpu-003", "gpu-[001-003]", id="list-becomes-range"),
        pytest.param("gpu-[001-512]", "gpu-[001-512]", id="range-stays"),
        pytest.param("gpu-[098-102]", "gpu-[098-102]", id="zero-padding-across-a-power-of-ten"),
        pytest.param("gpu-[1-3]", "gpu-[1-3]", id="no-padding-stays-unpadded"),
        pytest.param("gpu-003,gpu-001,gpu-002", "gpu-[001-003]", id="unsorted-is-sorted"),
        pytest.param("gpu-[001-004],gpu-[003-008]", "gpu-[001-008]", id="overlapping-ranges-merge"),
        pytest.param("gpu-[001-003],gpu-[005-006]", "gpu-[001-003,005-006]", id="gap-keeps-two-ranges"),
        pytest.param("gpu-1,gpu-1", "gpu-1", id="duplicates-collapse"),
        pytest.param("gpu-b-[001-002],gpu-a-[001-002]", "gpu-a-[001-002],gpu-b-[001-002]", id="two-prefixes"),
        pytest.param("gpu-[1-2],cpu-[1-2],gpu-3", "cpu-[1-2],gpu-[1-3]", id="interleaved-prefixes-regroup"),
        pytest.param("login", "login", id="single-host"),
    ],
)
def test_compact_hostlist(expression: str, compact: str):
    assert compact_hostlist(expression) == compact


def _with_nodes(nodes: str) -> StackConfig:
    raw = raw_stack("dev")
    raw["pools"][0]["nodes"] = nodes
    return parse_stack_config(raw)


def test_a_512_node_pool_is_one_node_line():
    slurm_conf = render(_with_nodes("gpu-[001-512]"))["slurm.conf"]
    assert lines(slurm_conf, "NodeName") == [
        "NodeName=gpu-[001-512] CPUs=32 RealMemory=128000 Gres=gpu:6 Features=gpu State=UNKNOWN"
    ]
    assert "Nodes=gpu-[001-512] " in slurm_conf


def test_node_lines_use_compact_ranges_for_listed_nodes():
    slurm_conf = render(_with_nodes("gpu-002,gpu-001,gpu-003"))["slurm.conf"]
    assert lines(slurm_conf, "NodeName")[0].startswith("NodeName=gpu-[001-003] ")


def test_files_grow_with_pools_not_nodes():
    small = render(_with_nodes("gpu-[0001-0064]"))
    large = render(_with_nodes("gpu-[0001-4096]"))
    for name in SLURM_FILES:
        assert len(small[name].splitlines()) == len(large[name].splitlines()), name


def test_each_slurm_pool_adds_one_node_line(prod_config):
    assert len(lines(render(prod_config)["slurm.conf"], "NodeName")) == len(prod_config.slurm_pools) == 3


def test_kubernetes_pool_gets_no_node_line(dev_raw):
    dev_raw["pools"].append({"name": "serve", "nodes": "srv-[1-4]", "mode": "kubernetes"})
    files = render(parse_stack_config(dev_raw))
    assert "srv-" not in files["slurm.conf"] and "srv-" not in files["gres.conf"]


# ------------------------------------------------------------------------ contents


def test_gpu_use_is_accounted(stack):
    assert lines(render(config_of(stack))["slurm.conf"], "AccountingStorageTRES") == ["AccountingStorageTRES=gres/gpu"]


def test_compute_nodes_fetch_config_from_the_controller(stack):
    assert lines(render(config_of(stack))["slurm.conf"], "SlurmctldParameters") == [
        "SlurmctldParameters=enable_configless"
    ]


def test_single_controller_is_one_slurmctld_host(dev_config):
    assert lines(render(dev_config)["slurm.conf"], "SlurmctldHost") == [
        "SlurmctldHost=slurmctld-0(slurmctld-0.slurmctld.slurm.svc.cluster.local)"
    ]


def test_ha_controller_is_two_slurmctld_hosts_primary_first(prod_raw):
    prod_raw["slurm"]["namespace"] = "hpc"
    assert lines(render(parse_stack_config(prod_raw))["slurm.conf"], "SlurmctldHost") == [
        "SlurmctldHost=slurmctld-0(slurmctld-0.slurmctld.hpc.svc.cluster.local)",
        "SlurmctldHost=slurmctld-1(slurmctld-1.slurmctld.hpc.svc.cluster.local)",
    ]


def test_partitioned_pool_gres_count_is_slurm_gpus(dev_config):
    files = render(dev_config)
    assert "Gres=gpu:6 " in lines(files["slurm.conf"], "NodeName")[0]
    assert lines(files["gres.conf"], "NodeName") == ["NodeName=gpu-[001-002] Name=gpu Count=6"]


def test_dedicated_pool_gres_count_is_every_gpu(prod_config):
    node_lines = lines(render(prod_config)["slurm.conf"], "NodeName")
    assert "Gres=gpu:h100:8 " in node_lines[0]
    assert "Gres=gpu:h100:4 " in node_lines[2]  # the partitioned pool


def test_gpu_type_appears_as_gres_type(dev_raw):
    dev_raw["pools"][0]["gpuType"] = "a100"
    files = render(parse_stack_config(dev_raw))
    assert "Gres=gpu:a100:6 " in files["slurm.conf"]
    assert "NodeName=gpu-[001-002] Name=gpu Type=a100 Count=6" in files["gres.conf"]


def test_gpus_are_autodetected_on_kubernetes(stack):
    gres = render(config_of(stack))["gres.conf"]
    assert lines(gres, "AutoDetect") == ["AutoDetect=nvml"]
    assert "File=" not in gres


def test_site_device_prefix_lists_gpu_files_instead_of_autodetect(dev_config):
    gres = render(dev_config, gpu_autodetect=None, gpu_device_prefix="/tmp/site/dev/gpu")["gres.conf"]
    assert lines(gres, "NodeName") == ["NodeName=gpu-[001-002] Name=gpu File=/tmp/site/dev/gpu[0-5]"]
    assert "AutoDetect" not in gres and "Count=" not in gres


def test_accounting_disabled_has_no_accounting_storage(dev_raw):
    dev_raw["slurm"]["accounting"] = {"enabled": False}
    slurm_conf = render(parse_stack_config(dev_raw))["slurm.conf"]
    for key in ("AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort"):
        assert not lines(slurm_conf, key), key


def test_accounting_enabled_points_at_slurmdbd(dev_config):
    slurm_conf = render(dev_config)["slurm.conf"]
    assert lines(slurm_conf, "AccountingStorageType") == ["AccountingStorageType=accounting_storage/slurmdbd"]
    assert lines(slurm_conf, "AccountingStorageHost") == ["AccountingStorageHost=slurmdbd.slurm.svc.cluster.local"]


def test_partitions_list_their_pools_nodes(prod_config):
    partitions = lines(render(prod_config)["slurm.conf"], "PartitionName")
    assert partitions[0] == (
        "PartitionName=train Nodes=gpu-a-[001-032],gpu-b-[001-032] Default=YES MaxTime=7-00:00:00 PriorityTier=1 State=UP"
    )
    assert [line.split()[0] for line in partitions] == [
        "PartitionName=train", "PartitionName=train-a", "PartitionName=shared"
    ]


def test_site_paths_and_ports_come_from_the_site(dev_config):
    slurm_conf = render(dev_config, slurmctld_port=7817, state_save_location="/srv/state", log_dir="/srv/log")[
        "slurm.conf"
    ]
    assert lines(slurm_conf, "SlurmctldPort") == ["SlurmctldPort=7817"]
    assert lines(slurm_conf, "StateSaveLocation") == ["StateSaveLocation=/srv/state"]
    assert lines(slurm_conf, "SlurmctldLogFile") == ["SlurmctldLogFile=/srv/log/slurmctld.log"]


def test_daemons_log_to_stderr_on_kubernetes(stack):
    slurm_conf = render(config_of(stack))["slurm.conf"]
    assert not re.search(r"^Slurm\w*LogFile=", slurm_conf, re.MULTILINE)


# -------------------------------------------------------------------- slurmdbd.conf


def test_slurmdbd_conf_never_holds_the_password_unless_given(stack):
    config = config_of(stack)
    assert "StoragePass" not in "\n".join(
        line for line in render_slurmdbd_conf(config, kubernetes_site(config)).splitlines() if not line.startswith("#")
    )


def test_slurmdbd_conf_holds_the_password_when_given(dev_config):
    conf = render_slurmdbd_conf(dev_config, kubernetes_site(dev_config), storage_pass="s3cret-pass")
    assert lines(conf, "StoragePass") == ["StoragePass=s3cret-pass"]


def test_slurmdbd_conf_points_at_the_external_database(prod_config):
    conf = render_slurmdbd_conf(prod_config, kubernetes_site(prod_config))
    assert lines(conf, "StorageHost") == ["StorageHost=slurm-acct.db.prod.internal"]
    assert lines(conf, "StorageLoc") == ["StorageLoc=slurm_acct_db"]


def test_slurmdbd_conf_points_at_the_in_cluster_database(dev_config):
    conf = render_slurmdbd_conf(dev_config, kubernetes_site(dev_config))
    assert lines(conf, "StorageHost") == ["StorageHost=mariadb.slurm.svc.cluster.local"]
    assert lines(conf, "DbdHost") == ["DbdHost=slurmdbd"]


# ---------------------------------------------------------------------- config hash


def test_config_hash_is_stable(dev_config):
    assert config_hash(render(dev_config)) == config_hash(render(dev_config))


def test_config_hash_ignores_file_order(dev_config):
    files = render(dev_config)
    assert config_hash(dict(reversed(list(files.items())))) == config_hash(files)


def test_config_hash_changes_when_any_file_changes(dev_config):
    files = render(dev_config)
    for name in files:
        changed = {**files, name: files[name] + "\n"}
        assert config_hash(changed) != config_hash(files), name


def test_config_hash_changes_when_a_file_is_renamed(dev_config):
    files = render(dev_config)
    renamed = {("gres.conf.old" if name == "gres.conf" else name): text for name, text in files.items()}
    assert config_hash(renamed) != config_hash(files)


def test_config_hash_follows_slurm_settings_only(dev_raw):
    base = config_hash(render(parse_stack_config(dev_raw)))

    dev_raw["inference"]["models"][0]["replicas"]["max"] = 4  # not in any Slurm file
    assert config_hash(render(parse_stack_config(dev_raw))) == base

    dev_raw["slurm"]["partitions"][0]["maxTime"] = "2-00:00:00"  # in slurm.conf
    assert config_hash(render(parse_stack_config(dev_raw))) != base
