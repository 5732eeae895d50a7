"""slurm.conf, gres.conf, cgroup.conf and slurmdbd.conf (mirrors components/slurm_files.py).

The dev and prod files rendered for the Kubernetes site are compared with the
golden copies in ``tests/golden/<stack>/``. After an intended change to the
templates or the stacks, regenerate them and review the diff:

    UPDATE_GOLDEN=1 pytest tests/test_slurm_files.py
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

from dualsched.components.slurm_files import (
    SLURM_FILES,
    NODE_TABLE_KEYS,
    RESTART_KEYS,
    compact_hostlist,
    config_hash,
    kubernetes_site,
    render_slurm_files,
    render_slurmdbd_conf,
    restart_hash,
    restart_keys,
)
from dualsched.config import ConfigError, StackConfig, parse_stack_config
from rendering import at_release, own_images, with_joining_pool
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
    "AuthType", "AuthInfo", "AuthAltTypes", "AuthAltParameters", "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
    "SlurmctldLogFile", "SlurmdLogFile", "SlurmctldDebug", "SlurmdDebug", "DisableRootJobs", "PrivateData", "ProctrackType", "TaskPlugin",
    "SchedulerType", "SelectType", "SelectTypeParameters", "GresTypes", "PriorityType", "PriorityDecayHalfLife",
    "PriorityWeightFairshare", "PriorityWeightAge", "PriorityWeightPartition", "PriorityWeightJobSize",
    "PriorityWeightTRES", "AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort",
    "AccountingStorageTRES", "JobAcctGatherType", "JobAcctGatherFrequency", "SlurmctldTimeout", "SlurmdTimeout",
    "InactiveLimit", "KillWait", "MinJobAge", "Waittime", "ReturnToService", "NodeName", "PartitionName",
    "AccountingStorageEnforce", "PriorityWeightQOS", "PreemptType", "PreemptMode", "PreemptExemptTime", "JobRequeue",
    "HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState", "TaskProlog", "PropagateResourceLimitsExcept",
    "PrologFlags", "JobContainerType", "NamespaceType", "MaxNodeCount", "TreeWidth",
}
NODE_KEYS = {"NodeName", "NodeAddr", "CPUs", "RealMemory", "MemSpecLimit", "Gres", "Features", "State"}
NODE_SET_KEYS = {"NodeSet", "Feature"}
PARTITION_KEYS = {"PartitionName", "Nodes", "Default", "MaxTime", "PriorityTier", "State"}
GRES_KEYS = {"AutoDetect", "NodeName", "Name", "Type", "Count", "File"}
CGROUP_KEYS = {"CgroupPlugin", "IgnoreSystemd", "ConstrainCores", "ConstrainRAMSpace", "ConstrainDevices"}
JOB_CONTAINER_KEYS = {"AutoBasePath", "BasePath"}


def _settings(text: str) -> list[list[str]]:
    return [
        [word.split("=", 1)[0] for word in line.split()]
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_slurm_conf_uses_only_slurm_conf_option_names(stack):
    for keys in _settings(render(config_of(stack))["slurm.conf"]):
        allowed = {"NodeName": NODE_KEYS, "NodeSet": NODE_SET_KEYS, "PartitionName": PARTITION_KEYS}.get(keys[0], SLURM_CONF_KEYS)
        assert set(keys) <= allowed, keys


def test_gres_cgroup_and_job_container_conf_use_only_their_option_names(stack):
    files = render(config_of(stack))
    assert all(set(keys) <= GRES_KEYS for keys in _settings(files["gres.conf"]))
    assert all(set(keys) <= CGROUP_KEYS for keys in _settings(files["cgroup.conf"]))
    assert all(set(keys) <= JOB_CONTAINER_KEYS for keys in _settings(files["job_container.conf"]))


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
        "NodeName=gpu-[001-512] CPUs=32 RealMemory=128000 MemSpecLimit=1024 Gres=gpu:6 Features=gpu State=CLOUD"
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
    assert lines(render(config_of(stack))["slurm.conf"], "SlurmctldParameters") == ["SlurmctldParameters=enable_configless"]


def _released(stack: str, release: str) -> StackConfig:
    return parse_stack_config(at_release(raw_stack(stack), release))


@pytest.mark.parametrize(
    ("release", "parameters"),
    [
        pytest.param("22.05", "enable_configless,cloud_reg_addrs", id="22.05-asks-for-registration-addresses"),
        pytest.param("23.02", "enable_configless,cloud_reg_addrs", id="23.02-asks-for-registration-addresses"),
        pytest.param("23.11", "enable_configless", id="23.11-registers-addresses-by-default"),
        pytest.param("25.11", "enable_configless", id="25.11-registers-addresses-by-default"),
        pytest.param("26.05", "enable_configless", id="26.05-registers-addresses-by-default"),
    ],
)
def test_cloud_nodes_register_their_address_in_every_release(release: str, parameters: str):
    """Slurm 23.11 made cloud_reg_addrs the default and logs an error for the defunct option
    (src/common/read_config.c); 22.05 needs it for CLOUD nodes to get the address they register from."""
    assert lines(render(_released("dev", release))["slurm.conf"], "SlurmctldParameters") == [f"SlurmctldParameters={parameters}"]


# Options Slurm 25.11 or 26.05 no longer accepts, or accepts only to log that they are defunct or
# obsolete: the keys of 22.05's parser tables missing from 25.11's, the _defunct_option entries and
# the "obsolete"/"defunct" warnings of 25.11 and 26.05 (SchedMD/slurm src/common/read_config.c,
# src/interfaces/cgroup.c). JobContainerType, which 25.11 renamed, has a test of its own.
REMOVED_OPTIONS = {
    "slurm.conf": {
        "AccountingStorageLoc", "AccountingStorageUser", "CoreSpecPlugin", "ExtSensorsFreq", "ExtSensorsType",
        "FastSchedule", "FrontendAddr", "FrontendName", "GetEnvTimeout", "JobCredentialPrivateKey",
        "JobCredentialPublicCertificate", "PowerParameters", "PowerPlugin", "SchedulerAuth", "SlurmctldPlugstack",
    },
    "cgroup.conf": {
        "AllowedDevicesFile", "AllowedKmemSpace", "CgroupAutomount", "CgroupReleaseAgentDir", "ConstrainKmemSpace",
        "MaxKmemPercent", "MinKmemSpace",
    },
}
# Values of comma-separated parameters that are defunct since 23.11 (cloud_reg_addrs, NoAddrCache)
# or 26.05 (enable_job_state_cache).
REMOVED_PARAMETERS = {"cloud_reg_addrs", "noaddrcache", "enable_job_state_cache"}


@pytest.mark.parametrize("release", ["23.11", "25.11", "26.05"])
def test_files_for_newer_releases_use_no_removed_option(stack: str, release: str):
    files = render(_released(stack, release))
    for name, removed in REMOVED_OPTIONS.items():
        used = {key.lower() for keys in _settings(files[name]) for key in keys}
        assert not used & {key.lower() for key in removed}, name
    values = {value.lower() for line in _settings_lines(files["slurm.conf"]) for value in re.split(r"[=,\s]", line)}
    assert not values & REMOVED_PARAMETERS


@pytest.mark.parametrize(
    ("release", "option"),
    [
        ("22.05", "JobContainerType=job_container/tmpfs"),
        ("24.11", "JobContainerType=job_container/tmpfs"),
        ("25.11", "NamespaceType=namespace/tmpfs"),
        ("26.05", "NamespaceType=namespace/tmpfs"),
    ],
)
def test_each_job_gets_its_own_tmp_in_every_releases_spelling(stack: str, release: str, option: str):
    """25.11 renamed the plugin (and only warns about the old option); both need the extern step that
    PrologFlags=Contain starts, and read job_container.conf, which configless slurmd fetches with slurm.conf
    (src/common/fetch_config.c)."""
    files = render(_released(stack, release))
    plugin = [line for line in _settings_lines(files["slurm.conf"]) if line.startswith(("JobContainerType", "NamespaceType"))]
    assert plugin == [option]
    assert lines(files["slurm.conf"], "PrologFlags") == ["PrologFlags=Contain"]
    assert "AutoBasePath=true" in _settings_lines(files["job_container.conf"])


def _settings_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_jobs_keep_slurmds_locked_memory_limit_where_a_pool_has_a_fabric():
    """RDMA registers memory that stays locked: with a fabric, jobs keep slurmd's unlimited limit instead of the
    submitter's (slurmstepd sets only the propagated limits, src/slurmd/slurmstepd/ulimits.c); the Slurm tier
    runs it (tests/slurm/test_resource_limits.py)."""
    assert lines(render(config_of("prod"))["slurm.conf"], "PropagateResourceLimitsExcept") == ["PropagateResourceLimitsExcept=MEMLOCK"]
    assert lines(render(config_of("dev"))["slurm.conf"], "PropagateResourceLimits") == []


def test_a_release_is_year_and_month():
    raw = raw_stack("dev")
    raw["slurm"]["release"] = "25.11.6"
    with pytest.raises(ConfigError, match=r"slurm\.release: must be a Slurm release such as '25\.11'.*\(got '25\.11\.6'\)"):
        parse_stack_config(raw)


# ------------------------------------------------------- node addresses (cloud nodes)


def test_kubernetes_site_learns_node_addresses_from_registration(stack):
    """Kubernetes node names need no DNS: every pool is CLOUD, its address the one slurmd registers from."""
    config = config_of(stack)
    assert kubernetes_site(config).addresses_from_registration is True
    node_lines = lines(render(config)["slurm.conf"], "NodeName")
    assert len(node_lines) == len(config.slurm_pools)
    assert all(line.endswith(" State=CLOUD") and "NodeAddr=" not in line for line in node_lines)


def test_site_without_registration_addresses_has_plain_nodes(dev_config):
    """The real-daemon site: node names resolve, so nodes are ordinary (UNKNOWN) and no cloud_reg_addrs."""
    slurm_conf = render(dev_config, addresses_from_registration=False)["slurm.conf"]
    assert lines(slurm_conf, "SlurmctldParameters") == ["SlurmctldParameters=enable_configless"]
    assert lines(slurm_conf, "NodeName") == [
        "NodeName=gpu-[001-002] CPUs=32 RealMemory=128000 MemSpecLimit=1024 Gres=gpu:6 Features=gpu State=UNKNOWN"
    ]
    assert "CLOUD" not in slurm_conf and "cloud_reg_addrs" not in slurm_conf


def test_pool_with_node_addresses_is_not_a_cloud_pool(prod_config):
    """A pool the site gives NodeAddr for keeps it (State=UNKNOWN); the other pools still register."""
    slurm_conf = render(prod_config, node_addresses={"h100-b": "10.0.1.[1-32]"})["slurm.conf"]
    node_lines = {line.split()[0]: line for line in lines(slurm_conf, "NodeName")}
    assert node_lines["NodeName=gpu-b-[001-032]"] == (
        "NodeName=gpu-b-[001-032] NodeAddr=10.0.1.[1-32] CPUs=188 RealMemory=1900000 MemSpecLimit=1024 "
        "Gres=gpu:h100:8 Features=h100-b State=UNKNOWN"
    )
    assert node_lines["NodeName=gpu-a-[001-032]"].endswith(" State=CLOUD")
    assert node_lines["NodeName=gpu-s-[001-016]"].endswith(" State=CLOUD")


# ------------------------------------------------------------------ memory and users


def test_every_node_line_reserves_mem_spec_limit(dev_raw):
    dev_raw["pools"][0]["memSpecLimitMb"] = 4096
    [node_line] = lines(render(parse_stack_config(dev_raw))["slurm.conf"], "NodeName")
    assert " RealMemory=128000 MemSpecLimit=4096 " in node_line


def test_mem_spec_limit_defaults_to_1024_mib(stack):
    node_lines = lines(render(config_of(stack))["slurm.conf"], "NodeName")
    assert node_lines and all(" MemSpecLimit=1024 " in line for line in node_lines)


def test_root_may_not_run_jobs(stack):
    assert lines(render(config_of(stack))["slurm.conf"], "DisableRootJobs") == ["DisableRootJobs=YES"]


# ---------------------------------------------------------------------------- cgroups


def test_cgroup_v2_is_the_default_and_ignores_systemd(stack):
    config = config_of(stack)
    assert config.slurm.cgroup_version.value == "v2"
    cgroup = render(config)["cgroup.conf"]
    assert lines(cgroup, "CgroupPlugin") == ["CgroupPlugin=cgroup/v2"]
    assert lines(cgroup, "IgnoreSystemd") == ["IgnoreSystemd=yes"]


def test_cgroup_v1_uses_the_v1_plugin_without_ignore_systemd(dev_raw):
    """IgnoreSystemd is an option of cgroup/v2 only."""
    dev_raw["slurm"]["cgroupVersion"] = "v1"
    config = parse_stack_config(dev_raw)
    assert kubernetes_site(config).cgroup_plugin == "cgroup/v1"
    cgroup = render(config)["cgroup.conf"]
    assert lines(cgroup, "CgroupPlugin") == ["CgroupPlugin=cgroup/v1"]
    assert "IgnoreSystemd" not in cgroup
    for key in ("ConstrainCores", "ConstrainRAMSpace", "ConstrainDevices"):
        assert lines(cgroup, key) == [f"{key}=yes"], key


def test_unknown_cgroup_version_is_rejected(dev_raw):
    dev_raw["slurm"]["cgroupVersion"] = "v3"
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(dev_raw)
    assert [problem.path for problem in caught.value.problems] == ["slurm.cgroupVersion"]


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
    assert lines(gres, "AutoDetect") == ["AutoDetect=nvidia"]
    assert "File=" not in gres


@pytest.mark.parametrize(("release", "plugin"), [("22.05", "nvml"), ("24.05", "nvml"), ("24.11", "nvidia"), ("26.05", "nvidia")])
def test_gpus_are_detected_by_the_plugin_every_build_of_the_release_has(release: str, plugin: str):
    """gpu/nvidia (24.11 on) needs no library; before it only NVML detects, in a Slurm built with it (a site's own images)."""
    raw = raw_stack("prod")
    raw["slurm"]["release"] = release
    raw["images"].update(own_images(release))
    assert lines(render(parse_stack_config(raw))["gres.conf"], "AutoDetect") == [f"AutoDetect={plugin}"]


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
        "PartitionName=gpu Nodes=gpu-a-[001-032],gpu-b-[001-032] Default=YES MaxTime=7-00:00:00 PriorityTier=1 State=UP"
    )
    assert [line.split()[0] for line in partitions] == [
        "PartitionName=gpu", "PartitionName=train-a", "PartitionName=shared"
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


# --------------------------------------------------------------------- restart hash


def _edit_line(text: str, key: str) -> str:
    """``text`` with the first ``key=`` line changed (a value Slurm would read differently)."""
    out, done = [], False
    for line in text.splitlines():
        if not done and line.startswith(f"{key}="):
            line, done = line + "X", True
        out.append(line)
    assert done, f"no {key}= line"
    return "\n".join(out) + "\n"


CURRENT = (25, 11)
"""The default release: nodes change by reconfigure."""
BEFORE_RECONFIGURE_NODES = (22, 5)
"""The local stack's release: nodes change by restart."""


def test_restart_keys_are_slurm_conf_options():
    assert set(RESTART_KEYS) <= SLURM_CONF_KEYS | {"NodeSet"}
    assert "PartitionName" not in RESTART_KEYS


@pytest.mark.parametrize(("release", "nodes_restart"), [((22, 5), True), ((23, 2), True), ((23, 11), False), ((25, 11), False), ((26, 5), False)])
def test_nodes_restart_slurmctld_only_before_23_11(release, nodes_restart):
    """23.11's reconfigure starts slurmctld anew in place: nodes come and go without a restart."""
    assert all((key in restart_keys(release)) is nodes_restart for key in NODE_TABLE_KEYS)
    assert set(RESTART_KEYS) - set(restart_keys(release)) <= set(NODE_TABLE_KEYS)


def test_restart_hash_is_stable(dev_config):
    release = dev_config.slurm.release_version
    assert restart_hash(render(dev_config), release) == restart_hash(render(dev_config), release)
    assert restart_hash(render(dev_config), release) != config_hash(render(dev_config))


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("release", ["22.05", "25.11"])
def test_restart_hash_follows_every_restart_key_line(stack, release):
    config = _released(stack, release)
    files, keys = render(config), restart_keys(config.slurm.release_version)
    present = [key for key in keys if lines(files["slurm.conf"], key)]
    assert {"ClusterName", "SlurmctldHost", "SlurmctldPort", "SlurmctldParameters", "AuthType"} <= set(present)
    for key in present:
        changed = {**files, "slurm.conf": _edit_line(files["slurm.conf"], key)}
        assert restart_hash(changed, config.slurm.release_version) != restart_hash(files, config.slurm.release_version), key


@pytest.mark.parametrize("key", ["PartitionName", "PriorityWeightAge", "SlurmctldTimeout", "MinJobAge", "DisableRootJobs"])
def test_restart_hash_ignores_settings_reconfigure_applies(dev_config, key):
    files = render(dev_config)
    changed = {**files, "slurm.conf": _edit_line(files["slurm.conf"], key)}
    assert config_hash(changed) != config_hash(files)
    assert restart_hash(changed, CURRENT) == restart_hash(files, CURRENT)


def test_restart_hash_ignores_comments_and_gres_conf(dev_config):
    files = render(dev_config)
    changed = {**files, "slurm.conf": "# a new comment\n" + files["slurm.conf"], "gres.conf": files["gres.conf"] + "# x\n"}
    assert restart_hash(changed, CURRENT) == restart_hash(files, CURRENT)


def test_restart_hash_follows_cgroup_conf(dev_raw):
    v2 = render(parse_stack_config(dev_raw))
    dev_raw["slurm"]["cgroupVersion"] = "v1"
    v1 = render(parse_stack_config(dev_raw))
    assert v1["slurm.conf"] == v2["slurm.conf"]
    assert restart_hash(v1, CURRENT) != restart_hash(v2, CURRENT)


def test_new_partition_changes_the_files_but_not_the_restart_hash(dev_raw):
    before = render(parse_stack_config(dev_raw))
    dev_raw["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "00:30:00"})
    after = render(parse_stack_config(dev_raw))
    assert config_hash(after) != config_hash(before)
    assert restart_hash(after, BEFORE_RECONFIGURE_NODES) == restart_hash(before, BEFORE_RECONFIGURE_NODES)


@pytest.mark.parametrize(
    ("field", "value"),
    [("cpus", 16), ("realMemoryMb", 64000), ("memSpecLimitMb", 2048), ("nodes", "gpu-[001-004]"), ("slurmGpus", 4)],
)
def test_a_node_line_change_restarts_slurmctld_only_before_23_11(dev_raw, field, value):
    before = render(parse_stack_config(dev_raw))
    dev_raw["pools"][0][field] = value
    after = render(parse_stack_config(dev_raw))
    assert lines(after["slurm.conf"], "NodeName") != lines(before["slurm.conf"], "NodeName")
    assert restart_hash(after, BEFORE_RECONFIGURE_NODES) != restart_hash(before, BEFORE_RECONFIGURE_NODES)
    assert restart_hash(after, CURRENT) == restart_hash(before, CURRENT)


def test_port_change_changes_the_restart_hash(dev_config):
    assert restart_hash(render(dev_config, slurmctld_port=7817), CURRENT) != restart_hash(render(dev_config), CURRENT)


# ----------------------------------------------------------------------- nodes that join by label


def test_a_pool_whose_nodes_join_by_label_is_a_node_set_of_its_partitions(dev_raw):
    """No NodeName line: its nodes register themselves (slurmd -Z) with the pool's feature, which its NodeSet
    matches; the node table has room for every name of every pool; gres.conf names the bound."""
    files = render(parse_stack_config(with_joining_pool(dev_raw)))
    conf = files["slurm.conf"]
    assert lines(conf, "NodeName") == ["NodeName=gpu-[001-002] CPUs=32 RealMemory=128000 MemSpecLimit=1024 Gres=gpu:6 Features=gpu State=CLOUD"]
    assert lines(conf, "NodeSet") == ["NodeSet=burst Feature=burst"]
    assert lines(conf, "MaxNodeCount") == ["MaxNodeCount=66"]
    assert lines(conf, "PartitionName")[0].startswith("PartitionName=gpu Nodes=gpu-[001-002],burst ")
    assert "NodeName=burst-[001-064] Name=gpu Count=6" in files["gres.conf"].splitlines()


def test_without_a_joining_pool_slurm_counts_its_own_nodes(dev_config):
    conf = render(dev_config)["slurm.conf"]
    assert not lines(conf, "NodeSet") and not lines(conf, "MaxNodeCount") and not lines(conf, "TreeWidth")


@pytest.mark.parametrize(("release", "tree"), [("22.05", True), ("23.02", True), ("23.11", False), ("25.11", False)])
def test_slurmctld_fans_out_through_dynamic_nodes_from_23_11(dev_raw, release, tree):
    """dynamic_nodes.html: before 23.11 TreeWidth must be 65533 with dynamic nodes."""
    conf = render(parse_stack_config(at_release(with_joining_pool(dev_raw), release)))["slurm.conf"]
    assert lines(conf, "TreeWidth") == (["TreeWidth=65533"] if tree else [])


def test_a_partition_of_joining_pools_alone_is_their_node_sets(dev_raw):
    raw = with_joining_pool(dev_raw)
    raw["slurm"]["partitions"].append({"name": "burst", "pools": ["burst"], "maxTime": "1:00:00"})
    assert lines(render(parse_stack_config(raw))["slurm.conf"], "PartitionName")[1].startswith("PartitionName=burst Nodes=burst ")


@pytest.mark.parametrize(("release", "restarts"), [("22.05", True), ("25.11", False)])
def test_a_joining_pool_or_a_wider_bound_restarts_slurmctld_only_before_23_11(dev_raw, release, restarts):
    """Its NodeSet and MaxNodeCount shape the node table, which 22.05 changes only at a restart; which nodes joined
    is in no file at all."""
    before = render(parse_stack_config(at_release(copy.deepcopy(dev_raw), release)))
    joined = with_joining_pool(at_release(copy.deepcopy(dev_raw), release))
    wider = with_joining_pool(at_release(copy.deepcopy(dev_raw), release), nodes="burst-[001-128]")
    version = tuple(map(int, release.split(".")))
    hashes = [restart_hash(render(parse_stack_config(raw)), version) for raw in (joined, wider)]
    assert (restart_hash(before, version) != hashes[0]) is restarts and (hashes[0] != hashes[1]) is restarts
