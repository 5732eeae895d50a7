"""The stack config, as a specification (mirrors config/).

Valid stacks load with their defaults resolved; every invalid case mutates a
valid dev or prod stack and must be rejected with one ``ConfigError`` whose
message names the config path to fix, in the form
``<config path>: <what is wrong> (got <value>)``.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from dualsched.config import ConfigError, ConfigKey, StackConfig, load_pulumi_config, load_stack_file, parse_stack_config
from dualsched.config.checks import Problem
from dualsched.config.models import PoolMode, Taint, TaintEffect
from rendering import own_images, with_joining_pool
from tests.conftest import ROOT, raw_stack, stack_file

SLURM_TAINT = "dualsched.io/slurm"

# ------------------------------------------------------------------------- helpers

DELETE = object()
_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parts(path: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _TOKEN.findall(path)]


def edit(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set (or, with DELETE, remove) the key at a config path like 'pools[0].slurmGpus'."""
    *parents, last = _parts(path)
    node: Any = raw
    for part in parents:
        if isinstance(part, str) and part not in node:
            node[part] = {}
        node = node[part]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value


def problem_line(path: str) -> re.Pattern[str]:
    """A line of the message reporting ``path`` in the ``<path>: <message> (got <value>)`` form."""
    return re.compile(rf"^\s*{re.escape(path)}: .+ \(got .+\)$", re.MULTILINE)


def rejection(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw)
    return caught.value


# -------------------------------------------------------------------- valid stacks


def test_dev_stack_file_loads():
    config = load_stack_file(stack_file("dev"))
    assert config.environment.value == "dev"
    assert config.slurm.cluster_name == "dev"


def test_prod_stack_file_loads():
    config = load_stack_file(stack_file("prod"))
    assert config.environment.value == "prod"
    assert len(config.pools) == 3


def test_dedicated_pool_gets_the_slurm_taint_by_default(prod_config):
    pool = prod_config.pool("h100-a")
    assert pool.taints is None
    assert prod_config.pool_taints(pool) == (Taint(key=SLURM_TAINT, value="true", effect=TaintEffect.NO_SCHEDULE),)


def test_partitioned_pool_has_no_taint_by_default(dev_config):
    assert dev_config.pool_taints(dev_config.pool("gpu")) == ()


def test_dedicated_pool_gives_slurm_every_gpu_by_default(prod_config):
    pool = prod_config.pool("h100-a")
    assert pool.slurm_gpus is None
    assert pool.slurm_gpu_count == 8
    assert pool.kubernetes_gpu_count == 0


def test_partitioned_pool_splits_gpus_between_slurm_and_kubernetes(dev_config):
    pool = dev_config.pool("gpu")
    assert (pool.slurm_gpu_count, pool.kubernetes_gpu_count) == (6, 2)


def test_kubernetes_pool_gives_slurm_no_gpus(dev_raw):
    dev_raw["pools"].append({"name": "serve", "nodes": "srv-[1-2]", "mode": "kubernetes"})
    config = parse_stack_config(dev_raw)
    pool = config.pool("serve")
    assert pool.slurm_gpu_count == 0 and not pool.runs_slurmd
    assert pool not in config.slurm_pools and pool in config.inference_pools


def test_time_shared_pool_gives_slurm_every_gpu_and_kubernetes_every_gpu_inside_its_window(dev_raw):
    dev_raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "22:00", "durationMinutes": 600})
    del dev_raw["pools"][0]["slurmGpus"]
    dev_raw["pools"].append({"name": "serve", "nodes": "srv-[1-2]", "mode": "kubernetes"})
    config = parse_stack_config(dev_raw)
    pool = config.pool("gpu")
    assert (pool.slurm_gpu_count, pool.kubernetes_gpu_count) == (8, 8)
    assert pool.runs_slurmd and pool in config.inference_pools
    assert pool.inference_window.start_minute == 22 * 60  # a window may cross midnight
    assert config.pool_taints(pool) == ()  # the window taint comes and goes with the hours


def test_a_time_shared_pool_counts_for_replica_floors_with_its_in_window_share(dev_raw):
    """Only time-shared pools: inference runs inside the window and waits outside it, by design."""
    dev_raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "09:00", "durationMinutes": 480})
    del dev_raw["pools"][0]["slurmGpus"]
    assert parse_stack_config(dev_raw).pool("gpu").kubernetes_gpu_count == 8

    dev_raw["inference"]["models"][0]["replicas"] = {"min": 17, "max": 17}  # 2 nodes x 8 GPUs
    error = rejection(dev_raw)
    assert {problem.path for problem in error.problems} == {"inference.models"}
    assert "17 GPUs, more than the Kubernetes share of the pools inference may use (16)" in str(error)


def test_protect_defaults_to_true_in_prod(prod_raw):
    del prod_raw["protect"]
    assert parse_stack_config(prod_raw).protect_state is True


def test_protect_defaults_to_false_in_dev(dev_config):
    assert dev_config.protect is None
    assert dev_config.protect_state is False


def test_dev_may_use_latest_images(dev_raw):
    dev_raw["images"] = {"vllm": "docker.io/vllm/vllm-openai:latest", "slurmd": "ghcr.io/slinkyproject/slurmd"}
    assert parse_stack_config(dev_raw).images.vllm.endswith(":latest")


def test_prod_may_pin_an_image_by_digest(prod_raw):
    prod_raw["images"]["vllm"] = "docker.io/vllm/vllm-openai@sha256:" + "a" * 64
    prod_raw["images"]["slurmd"] = "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04@sha256:" + "b" * 64
    parse_stack_config(prod_raw)


def test_default_slurm_images_name_a_patch_release_of_the_default_release(prod_raw):
    del prod_raw["images"]
    images = parse_stack_config(prod_raw).images
    for reference in (images.slurmctld, images.slurmd, images.slurmd_pyxis, images.slurmdbd, images.slurmrestd, images.login):
        assert re.search(r":25\.11\.[0-9]+-ubuntu24\.04$", reference), reference


def test_a_slurm_image_whose_tag_names_no_release_is_taken_at_its_word(prod_raw):
    prod_raw["images"]["slurmd"] = "registry.example/hpc/slurmd:2026-06-build7"
    prod_raw["slurm"]["release"] = "24.11"
    prod_raw["images"].update({name: f"registry.example/hpc/{name.lower()}:v3" for name in ("slurmctld", "slurmdPyxis", "slurmdbd", "slurmrestd")})
    assert parse_stack_config(prod_raw).slurm.release == "24.11"


def test_images_the_stack_does_not_run_need_not_match_the_release(prod_raw):
    """prod runs no login pods, and Pyxis everywhere: the login images and the plain slurmd's (the munged
    sidecars' and sbatch's) may name another release until it runs them."""
    prod_raw["images"]["login"] = "ghcr.io/slinkyproject/login:25.05.5-ubuntu24.04"
    prod_raw["images"]["loginPyxis"] = "ghcr.io/slinkyproject/login-pyxis:24.11.6-ubuntu24.04"
    parse_stack_config(prod_raw)


def test_with_containers_the_login_pods_run_the_login_image_with_pyxis(prod_raw):
    """srun and sbatch there load plugstack.conf's required Pyxis: its image is the one checked against the release."""
    prod_raw["slurm"]["login"] = {"enabled": True, "users": [{"name": "mlops", "authorizedKeys": [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF58B9nAJnLphnQeuo/dRbYncWi7fw7t63xz09+j5t0g mlops@laptop"]}]}
    prod_raw["images"]["login"] = "ghcr.io/slinkyproject/login:25.05.5-ubuntu24.04"
    parse_stack_config(prod_raw)
    prod_raw["images"]["loginPyxis"] = "ghcr.io/slinkyproject/login-pyxis:24.11.6-ubuntu24.04"
    [problem] = rejection(prod_raw).problems
    assert problem.path == "images.loginPyxis" and "names Slurm 24.11, but slurm.release is 25.11" in problem.message


def test_gpus_are_detected_by_nvml_where_the_images_have_it(prod_raw):
    prod_raw["slurm"].update(release="24.05", gpuAutoDetect="nvml")
    prod_raw["images"].update(own_images("24.05"))
    assert parse_stack_config(prod_raw).slurm.gpu_detection.value == "nvml"


def test_a_stack_whose_slurm_holds_no_gpu_needs_no_gpu_detection(dev_raw):
    """CPU nodes only: nothing for gres.conf to detect, whatever the images."""
    dev_raw["pools"][0].update(mode="dedicated", gpusPerNode=0)
    del dev_raw["pools"][0]["slurmGpus"], dev_raw["inference"]
    dev_raw["slurm"]["gpuAutoDetect"] = "nvml"
    assert parse_stack_config(dev_raw).slurm.gpu_detection.value == "nvml"


def test_config_is_immutable(dev_config):
    with pytest.raises(Exception):
        dev_config.slurm.namespace = "other"


def test_snake_case_names_are_accepted_too(dev_raw):
    dev_raw["pools"][0]["gpus_per_node"] = dev_raw["pools"][0].pop("gpusPerNode")
    assert parse_stack_config(dev_raw).pools[0].gpus_per_node == 8


def test_host_path_storage_is_accepted_in_dev(dev_raw):
    dev_raw["storage"] = {"type": "hostPath", "hostPath": {"path": "/srv/dualsched/shared"}}
    storage = parse_stack_config(dev_raw).storage
    assert storage.type.value == "hostPath" and storage.host_path.path == "/srv/dualsched/shared"


def test_users_default_to_none_and_gid_to_the_uid(dev_raw):
    del dev_raw["slurm"]["users"]
    del dev_raw["submission"]  # its identities name a user
    del dev_raw["slurm"]["login"]  # and so do its login users
    assert parse_stack_config(dev_raw).slurm.users == ()
    dev_raw["slurm"]["users"] = [{"name": "alice", "uid": 2001}, {"name": "bob_2", "uid": 2002, "gid": 3000}]
    users = parse_stack_config(dev_raw).slurm.users
    assert [(u.name, u.uid, u.group_id) for u in users] == [("alice", 2001, 2001), ("bob_2", 2002, 3000)]


def test_stacks_configure_job_users(stack):
    users = parse_stack_config(raw_stack(stack)).slurm.users
    assert users and all(user.uid >= 1000 for user in users)


def test_slurmd_memory_defaults(dev_config):
    pool = dev_config.pool("gpu")
    assert pool.mem_spec_limit_mb == 1024
    assert dev_config.slurm.cgroup_version.value == "v2"


def test_an_external_database_may_take_its_password_from_the_config(prod_raw):
    external = prod_raw["slurm"]["accounting"]["database"]["external"]
    del external["passwordSecret"]
    external["password"] = "s3cret-Pass!$[]"
    parsed = parse_stack_config(prod_raw).slurm.accounting.database.external
    assert parsed.password.reveal() == "s3cret-Pass!$[]" and parsed.password_secret is None


def test_kubernetes_pools_need_no_slurmd_memory(dev_raw):
    """memSpecLimitMb only matters where slurmd runs."""
    dev_raw["pools"].append({"name": "serve", "nodes": "srv-[1-2]", "mode": "kubernetes", "realMemoryMb": 1000,
                             "memSpecLimitMb": 2000})
    parse_stack_config(dev_raw)


def _inference_only(raw: dict[str, Any]) -> dict[str, Any]:
    """The dev stack without Slurm: its pool given to Kubernetes whole."""
    for key in ("slurm", "network", "submission"):
        del raw[key]
    raw["pools"][0] = {"name": "gpu", "nodes": "gpu-[001-002]", "mode": "kubernetes"}
    return raw


def test_a_slurm_only_stack_has_no_inference_section_and_submits_by_default(dev_raw):
    del dev_raw["inference"]
    config = parse_stack_config(dev_raw)
    assert config.inference is None and not config.serves_models
    assert config.submission.enabled


def test_an_inference_only_stack_has_no_slurm_network_or_submission(dev_raw):
    config = parse_stack_config(_inference_only(dev_raw))
    assert config.slurm is None and config.network is None
    assert config.submission.enabled is False and config.serves_models
    assert config.slurm_pools == () and [pool.name for pool in config.inference_pools] == ["gpu"]


def test_an_inference_only_stack_may_take_a_namespace_an_absent_section_would_default_to(dev_raw):
    """No absent section's default (slurm.namespace 'slurm', submission's 'slurm-jobs') is held against it."""
    raw = _inference_only(dev_raw)
    raw["inference"]["namespace"] = "slurm-jobs"
    assert parse_stack_config(raw).inference.namespace == "slurm-jobs"


def test_a_slurm_only_stack_may_name_a_namespace_inference(dev_raw):
    del dev_raw["inference"]
    dev_raw["submission"]["namespace"] = "inference"
    assert parse_stack_config(dev_raw).submission.namespace == "inference"


# ------------------------------------------------------------------ invalid stacks


@dataclass(frozen=True)
class Invalid:
    """A valid stack, the edits that break it, and the config path the message must name."""

    id: str
    stack: str
    edits: dict[str, Any]
    path: str
    says: str = ""
    """A phrase the problem's message must contain, when the path alone is not specific."""


INVALID = [
    # partitions and pools
    Invalid("partition-names-missing-pool", "dev", {"slurm.partitions[0].pools": ["nope"]},
            "slurm.partitions[0].pools[0]", "no pool of that name"),
    Invalid("partition-names-kubernetes-pool", "prod",
            {"pools[2].mode": "kubernetes", "pools[2].slurmGpus": DELETE},
            "slurm.partitions[2].pools[0]", "runs no slurmd"),
    Invalid("dedicated-slurm-gpus-disagree", "prod", {"pools[0].slurmGpus": 4}, "pools[0].slurmGpus", "dedicated"),
    Invalid("partitioned-slurm-gpus-equal-gpus-per-node", "dev", {"pools[0].slurmGpus": 8},
            "pools[0].slurmGpus", "partitioned"),
    Invalid("partitioned-slurm-gpus-above-gpus-per-node", "dev", {"pools[0].slurmGpus": 12},
            "pools[0].slurmGpus", "partitioned"),
    Invalid("partitioned-slurm-gpus-zero", "dev", {"pools[0].slurmGpus": 0}, "pools[0].slurmGpus", "partitioned"),
    Invalid("partitioned-slurm-gpus-missing", "dev", {"pools[0].slurmGpus": DELETE},
            "pools[0].slurmGpus", "must say how many"),
    Invalid("kubernetes-pool-with-slurm-gpus", "prod",
            {"pools[2].mode": "kubernetes", "slurm.partitions": [{"name": "train", "pools": ["h100-a"], "default": True}]},
            "pools[2].slurmGpus", "no GPUs"),
    Invalid("node-names-duplicated-across-pools", "prod", {"pools[1].nodes": "gpu-a-[030-040]"},
            "pools[1].nodes", "already in pool h100-a"),
    Invalid("invalid-hostlist", "dev", {"pools[0].nodes": "gpu-[001-002"}, "pools[0].nodes", "hostlist"),
    Invalid("node-name-not-a-kubernetes-name", "dev", {"pools[0].nodes": "GPU_[1-2]"}, "pools[0].nodes"),
    Invalid("too-many-gpus-per-node", "dev", {"pools[0].gpusPerNode": 65}, "pools[0].gpusPerNode"),
    # GPU sharing: windows, CPU/memory split, capacity
    Invalid("time-shared-without-window", "dev", {"pools[0].mode": "time-shared", "pools[0].slurmGpus": DELETE},
            "pools[0].inferenceWindow", "must say when"),
    Invalid("window-on-a-partitioned-pool", "dev", {"pools[0].inferenceWindow": {"start": "09:00", "durationMinutes": 60}},
            "pools[0].inferenceWindow", "only a time-shared pool"),
    Invalid("window-start-not-a-time-of-day", "dev",
            {"pools[0].mode": "time-shared", "pools[0].slurmGpus": DELETE,
             "pools[0].inferenceWindow": {"start": "24:00", "durationMinutes": 60}},
            "pools[0].inferenceWindow.start", "HH:MM"),
    Invalid("window-of-a-whole-day", "dev",
            {"pools[0].mode": "time-shared", "pools[0].slurmGpus": DELETE,
             "pools[0].inferenceWindow": {"start": "00:00", "durationMinutes": 1440}},
            "pools[0].inferenceWindow.durationMinutes"),
    Invalid("time-shared-slurm-gpus-not-all", "prod",
            {"pools[0].mode": "time-shared", "pools[0].inferenceWindow": {"start": "09:00", "durationMinutes": 60},
             "pools[0].slurmGpus": 4, "pools[0].taints": []},
            "pools[0].slurmGpus", "time-shared pool gives Slurm all 8"),
    Invalid("partitioned-without-allocatable", "dev", {"pools[0].allocatable": DELETE}, "pools[0].allocatable",
            "allocatable cpus and memoryMb"),
    Invalid("time-shared-without-allocatable", "dev",
            {"pools[0].mode": "time-shared", "pools[0].slurmGpus": DELETE, "pools[0].allocatable": DELETE,
             "pools[0].inferenceWindow": {"start": "09:00", "durationMinutes": 60}},
            "pools[0].allocatable", "a time-shared pool runs slurmd: give its nodes' allocatable cpus and memoryMb"),
    Invalid("dedicated-without-allocatable", "prod", {"pools[0].allocatable": DELETE}, "pools[0].allocatable",
            "a dedicated pool runs slurmd: give its nodes' allocatable cpus and memoryMb, in which slurmd's pod and the "
            "node's other DaemonSets must fit"),
    Invalid("dedicated-slurmd-larger-than-its-node", "prod", {"pools[0].cpus": 192}, "pools[0].cpus",
            "slurmd's pod (192 and 0.05 for munged) and the node's other DaemonSets (0.5) need 192.55 of the node's "
            "allocatable 191"),
    Invalid("dedicated-slurmd-and-a-large-exporter", "prod", {"pools[0].otherDaemonSets": {"memoryMb": 60000}},
            "pools[0].realMemoryMb", "need 1960064 of the node's allocatable 1950000"),
    Invalid("partitioned-slurm-takes-every-cpu", "dev", {"pools[0].cpus": 62}, "pools[0].cpus",
            "need 62.55 of the node's allocatable 62"),
    Invalid("partitioned-slurm-and-daemonsets-take-every-cpu", "dev",
            {"pools[0].cpus": 61, "pools[0].otherDaemonSets": {"cpus": 0.95}}, "pools[0].cpus",
            "need 62 of the node's allocatable 62, which leaves Kubernetes nothing"),
    Invalid("partitioned-slurm-takes-more-memory-than-the-node-has", "dev", {"pools[0].realMemoryMb": 300000},
            "pools[0].realMemoryMb", "allocatable 250000"),
    Invalid("replica-floors-exceed-the-kubernetes-gpus", "dev", {"inference.models[0].replicas": {"min": 5, "max": 5}},
            "inference.models", "5 GPUs, more than the Kubernetes share of the pools inference may use (4)"),
    Invalid("replica-floors-exceed-the-kubernetes-memory", "dev",
            {"inference.models[0].resources": {"requests": {"cpu": "1", "memory": "250Gi"}, "limits": {"cpu": "1", "memory": "250Gi"}}},
            "inference.models", "MiB of memory"),
    # taints and tolerations
    Invalid("inference-pool-taint-not-tolerated", "dev", {"pools[0].taints": [{"key": "example.com/reserved"}]},
            "pools[0].taints[0]", "tolerates"),
    Invalid("partitioned-pool-carries-slurm-taint", "dev", {"pools[0].taints": [{"key": SLURM_TAINT}]},
            "pools[0].taints[0]", "never tolerates the Slurm taint"),
    Invalid("dedicated-pool-without-slurm-taint", "prod", {"pools[0].taints": []}, "pools[0].taints", "Slurm taint"),
    Invalid("inference-tolerates-slurm-taint", "dev", {"inference.tolerations": [{"key": SLURM_TAINT}]},
            "inference.tolerations[0].key"),
    Invalid("invalid-taint-effect", "prod", {"pools[0].taints": [{"key": SLURM_TAINT, "effect": "NoRun"}]},
            "pools[0].taints[0].effect"),
    # controller
    Invalid("ha-without-read-write-many", "dev", {"slurm.controller.ha": True},
            "slurm.controller.stateStorage.accessMode", "ReadWriteMany"),
    # names
    Invalid("namespace-not-dns-1123", "dev", {"slurm.namespace": "Slurm_NS"}, "slurm.namespace", "DNS-1123"),
    Invalid("namespace-longer-than-63", "dev", {"inference.namespace": "n" * 64}, "inference.namespace", "DNS-1123"),
    Invalid("pool-name-not-dns-1123", "dev", {"pools[0].name": "GPU"}, "pools[0].name", "DNS-1123"),
    Invalid("model-name-not-dns-1123", "dev", {"inference.models[0].name": "qwen.small"},
            "inference.models[0].name", "DNS-1123"),
    Invalid("cluster-name-not-dns-1123", "dev", {"slurm.clusterName": "dev_cluster"}, "slurm.clusterName", "DNS-1123"),
    Invalid("cluster-name-ends-with-dash", "dev", {"slurm.clusterName": "dev-"}, "slurm.clusterName", "DNS-1123"),
    # a trailing newline would end a Slurm line early (`$` alone lets it pass)
    Invalid("cluster-name-trailing-newline", "dev", {"slurm.clusterName": "dev\n"}, "slurm.clusterName", "DNS-1123"),
    Invalid("partition-name-trailing-newline", "dev", {"slurm.partitions[0].name": "gpu\n"}, "slurm.partitions[0].name",
            "partition name"),
    Invalid("namespace-trailing-newline", "dev", {"slurm.namespace": "slurm\n"}, "slurm.namespace", "DNS-1123"),
    Invalid("user-name-trailing-newline", "dev", {"slurm.users[0].name": "alice\n"}, "slurm.users[0].name", "POSIX"),
    Invalid("nfs-server-trailing-newline", "dev", {"storage.nfs.server": "nfs.dev.internal\n"}, "storage.nfs.server"),
    # quantities
    Invalid("quantity-4GB", "dev", {"storage.capacity": "4GB"}, "storage.capacity", "quantity"),
    Invalid("quantity-negative", "dev", {"slurm.controller.stateStorage.size": "-1"},
            "slurm.controller.stateStorage.size", "quantity"),
    Invalid("state-storage-of-zero", "dev", {"slurm.controller.stateStorage.size": "0"},
            "slurm.controller.stateStorage.size", "above zero"),
    Invalid("database-of-zero", "dev", {"slurm.accounting.database.inCluster.size": "0Gi"},
            "slurm.accounting.database.inCluster.size", "above zero"),
    Invalid("storage-capacity-of-zero", "dev", {"storage.capacity": "0"}, "storage.capacity", "above zero"),
    Invalid("quantity-abc", "dev", {"inference.models[0].resources.requests.memory": "abc"},
            "inference.models[0].resources.requests.memory", "quantity"),
    # images
    Invalid("prod-image-latest", "prod", {"images.vllm": "docker.io/vllm/vllm-openai:latest"}, "images.vllm", "pinned"),
    Invalid("prod-image-untagged", "prod", {"images.slurmd": "ghcr.io/slinkyproject/slurmd"}, "images.slurmd", "pinned"),
    Invalid("prod-default-image-unpinned-is-still-checked", "prod", {"images.mariadb": "mariadb"},
            "images.mariadb", "pinned"),
    Invalid("prod-slurm-image-follows-patch-releases", "prod",
            {"images.slurmctld": "ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04"},
            "images.slurmctld", "moves to each new Slurm patch release"),
    Invalid("slurm-image-of-another-release", "dev", {"images.slurmd": "ghcr.io/slinkyproject/slurmd:24.11.6-ubuntu24.04"},
            "images.slurmd", "names Slurm 24.11, but slurm.release is 25.11"),
    Invalid("release-changed-without-the-images", "prod", {"slurm.release": "24.11"},
            "images.slurmdbd", "slurm.release is 24.11"),
    # GPU detection that confines jobs
    Invalid("gpu-detection-nvml-with-slinky-images", "prod", {"slurm.gpuAutoDetect": "nvml"},
            "slurm.gpuAutoDetect", "images.slurmd (ghcr.io/slinkyproject/slurmd:25.11.6-ubuntu24.04) is built without NVML"),
    Invalid("gpu-detection-nvidia-before-24.11", "prod", {"slurm.gpuAutoDetect": "nvidia", "slurm.release": "24.05", **{
            f"images.{key}": image for key, image in own_images("24.05").items()}},
            "slurm.gpuAutoDetect", "AutoDetect=nvidia needs Slurm 24.11 or later, and slurm.release is 24.05"),
    # the RDMA fabric
    Invalid("fabric-on-a-kubernetes-pool", "dev", {"pools[0].mode": "kubernetes", "pools[0].slurmGpus": DELETE,
            "pools[0].fabric": {"rdmaResource": "rdma/hca"}}, "pools[0].fabric", "runs no slurmd"),
    Invalid("fabric-resource-is-the-gpus", "prod", {"pools[0].fabric.rdmaResource": "nvidia.com/gpu"},
            "pools[0].fabric.rdmaResource", "GPUs' resource"),
    Invalid("fabric-resource-without-domain", "prod", {"pools[0].fabric.rdmaResource": "rdma"},
            "pools[0].fabric.rdmaResource", "device plugin's resource name"),
    Invalid("fabric-resource-of-kubernetes", "prod", {"pools[0].fabric.rdmaResource": "kubernetes.io/rdma"},
            "pools[0].fabric.rdmaResource", "device plugin's resource name"),
    Invalid("fabric-rdma-count-zero", "prod", {"pools[0].fabric.rdmaCount": 0}, "pools[0].fabric.rdmaCount"),
    Invalid("fabric-nccl-value-two-lines", "prod", {"pools[0].fabric.nccl.NCCL_IB_HCA": "mlx5\nNCCL_DEBUG=INFO"},
            "pools[0].fabric.nccl.NCCL_IB_HCA", "one line"),
    Invalid("fabric-nccl-key-not-nccl", "prod", {"pools[0].fabric.nccl.OMP_NUM_THREADS": "4"},
            "pools[0].fabric.nccl.OMP_NUM_THREADS.'[key]'", "NCCL variable"),
    Invalid("login-image-of-another-release", "dev", {"images.login": "ghcr.io/slinkyproject/login:25.05-ubuntu24.04"},
            "images.login", "names Slurm 25.05"),
    Invalid("image-reference-malformed", "dev", {"images.slurmctld": "Ghcr.io/Slurm Ctld"}, "images.slurmctld"),
    # accounting
    Invalid("accounting-without-database", "dev", {"slurm.accounting.database": DELETE},
            "slurm.accounting.database", "no database"),
    Invalid("external-database-without-settings", "prod", {"slurm.accounting.database.external": DELETE},
            "slurm.accounting.database.external"),
    Invalid("external-database-without-host", "prod", {"slurm.accounting.database.external.host": DELETE},
            "slurm.accounting.database.external.host", "host"),
    Invalid("external-database-without-password-secret", "prod",
            {"slurm.accounting.database.external.passwordSecret": DELETE},
            "slurm.accounting.database.external.passwordSecret", "Secret"),
    Invalid("external-database-with-password-and-password-secret", "prod",
            {"slurm.accounting.database.external.password": "s3cret-Pass"},
            "slurm.accounting.database.external.password", "not both"),
    Invalid("external-database-password-with-a-space", "prod",
            {"slurm.accounting.database.external.passwordSecret": DELETE, "slurm.accounting.database.external.password": "two words"},
            "slurm.accounting.database.external.password", "printable ASCII without spaces"),
    Invalid("external-database-password-with-a-comment-sign", "prod",
            {"slurm.accounting.database.external.passwordSecret": DELETE, "slurm.accounting.database.external.password": "pass#word"},
            "slurm.accounting.database.external.password", "slurmdbd.conf would read them as a comment"),
    Invalid("database-port-out-of-range", "prod", {"slurm.accounting.database.external.port": 70000},
            "slurm.accounting.database.external.port"),
    # storage
    Invalid("nfs-without-server", "dev", {"storage.nfs.server": DELETE}, "storage.nfs.server", "server"),
    Invalid("nfs-without-path", "dev", {"storage.nfs.path": DELETE}, "storage.nfs.path", "path"),
    Invalid("nfs-without-settings", "dev", {"storage.nfs": DELETE}, "storage.nfs.server"),
    Invalid("nfs-relative-path", "dev", {"storage.nfs.path": "export/shared"}, "storage.nfs.path", "absolute"),
    Invalid("lustre-without-mgs-nodes", "prod", {"storage.lustre.mgsNodes": DELETE},
            "storage.lustre.mgsNodes", "Lustre storage needs the NIDs of its MGS node(s)"),
    Invalid("lustre-without-fs-name", "prod", {"storage.lustre.fsName": DELETE},
            "storage.lustre.fsName", "Lustre storage needs the file system name"),
    Invalid("lustre-without-settings", "prod", {"storage.lustre": DELETE}, "storage.lustre.mgsNodes", "needs"),
    Invalid("lustre-empty-mgs-nodes", "prod", {"storage.lustre.mgsNodes": []}, "storage.lustre.mgsNodes"),
    Invalid("lustre-nid-without-network", "prod", {"storage.lustre.mgsNodes[0].nids[0]": "10.20.0.10"},
            "storage.lustre.mgsNodes[0].nids[0]", "Lustre NID"),
    Invalid("lustre-nids-joined-in-one-item", "prod", {"storage.lustre.mgsNodes[0].nids[0]": "10.20.0.10@o2ib,10.20.0.11@o2ib"},
            "storage.lustre.mgsNodes[0].nids[0]", "separate items"),
    Invalid("lustre-nid-ipv6", "prod", {"storage.lustre.mgsNodes[0].nids[0]": "fd00::10@tcp"},
            "storage.lustre.mgsNodes[0].nids[0]", "Lustre NID"),
    Invalid("lustre-fs-name-over-8", "prod", {"storage.lustre.fsName": "scratch01"}, "storage.lustre.fsName", "1 to 8"),
    Invalid("lustre-fs-name-with-slash", "prod", {"storage.lustre.fsName": "fs1/sub"}, "storage.lustre.fsName", "1 to 8"),
    Invalid("lustre-subdirectory-escapes", "prod", {"storage.lustre.subdirectory": "../other"},
            "storage.lustre.subdirectory", "without '.' or '..'"),
    Invalid("lustre-read-only-mount-option", "prod", {"storage.lustre.mountOptions": ["flock", "ro"]},
            "storage.lustre.mountOptions[1]", "per consumer"),
    Invalid("lustre-mount-options-joined", "prod", {"storage.lustre.mountOptions": ["flock,user_xattr"]},
            "storage.lustre.mountOptions[0]", "without ','"),
    Invalid("lustre-old-volume-handle-key", "prod", {"storage.lustre.volumeHandle": "lustre-prod-fs1"},
            "storage.lustre.volumeHandle", "unknown key"),
    Invalid("gpfs-without-settings", "prod", {"storage.type": "gpfs"}, "storage.gpfs.clusterId",
            "IBM Storage Scale storage needs the owning cluster's ID"),
    Invalid("gpfs-without-uuid", "prod", {"storage.type": "gpfs", "storage.gpfs": {"clusterId": 7118073361626808055, "path": "/ibm/fs1"}},
            "storage.gpfs.filesystemUuid", "needs the file system's UUID"),
    Invalid("gpfs-cluster-id-not-a-number", "prod",
            {"storage.type": "gpfs", "storage.gpfs": {"clusterId": "fs1-cluster", "filesystemUuid": "09762E69:5D36FE8D", "path": "/ibm/fs1"}},
            "storage.gpfs.clusterId"),
    Invalid("gpfs-uuid-not-two-hex-words", "prod",
            {"storage.type": "gpfs", "storage.gpfs": {"clusterId": 1, "filesystemUuid": "09762E69-5D36FE8D", "path": "/ibm/fs1"}},
            "storage.gpfs.filesystemUuid", "8-digit hex"),
    Invalid("gpfs-path-is-root", "prod",
            {"storage.type": "gpfs", "storage.gpfs": {"clusterId": 1, "filesystemUuid": "09762E69:5D36FE8D", "path": "/"}},
            "storage.gpfs.path", "not '/'"),
    Invalid("gpfs-path-relative", "prod",
            {"storage.type": "gpfs", "storage.gpfs": {"clusterId": 1, "filesystemUuid": "09762E69:5D36FE8D", "path": "ibm/fs1"}},
            "storage.gpfs.path", "absolute"),
    Invalid("beegfs-without-settings", "prod", {"storage.type": "beegfs"}, "storage.beegfs.sysMgmtdHost",
            "BeeGFS storage needs the management service's host"),
    Invalid("beegfs-without-path", "prod", {"storage.type": "beegfs", "storage.beegfs": {"sysMgmtdHost": "mgmtd"}},
            "storage.beegfs.path", "needs the directory to share"),
    Invalid("beegfs-host-ipv6", "prod", {"storage.type": "beegfs", "storage.beegfs": {"sysMgmtdHost": "fd00::5", "path": "/"}},
            "storage.beegfs.sysMgmtdHost", "beegfs:// URL"),
    Invalid("beegfs-host-with-port", "prod", {"storage.type": "beegfs", "storage.beegfs": {"sysMgmtdHost": "mgmtd:8008", "path": "/"}},
            "storage.beegfs.sysMgmtdHost"),
    Invalid("beegfs-path-relative", "prod", {"storage.type": "beegfs", "storage.beegfs": {"sysMgmtdHost": "mgmtd", "path": "k8s/shared"}},
            "storage.beegfs.path", "absolute"),
    Invalid("unknown-storage-type", "dev", {"storage.type": "ceph"}, "storage.type"),
    Invalid("host-path-without-path", "dev", {"storage.type": "hostPath"}, "storage.hostPath.path", "needs a path"),
    Invalid("host-path-with-empty-settings", "dev", {"storage.type": "hostPath", "storage.hostPath": {}},
            "storage.hostPath.path", "needs a path"),
    Invalid("host-path-relative", "dev", {"storage.type": "hostPath", "storage.hostPath": {"path": "srv/shared"}},
            "storage.hostPath.path", "absolute"),
    Invalid("host-path-in-prod", "prod", {"storage.type": "hostPath", "storage.hostPath": {"path": "/srv/shared"}},
            "storage.type", "prod needs nfs, lustre, gpfs or beegfs"),
    # network (NetworkPolicy ipBlocks)
    Invalid("missing-network", "dev", {"network": DELETE}, "network", "a stack with a slurm section needs the nodes' addresses"),
    Invalid("no-node-cidrs", "dev", {"network.nodeCidrs": []}, "network.nodeCidrs"),
    Invalid("node-cidr-without-prefix", "dev", {"network.nodeCidrs": ["10.0.0.1"]}, "network.nodeCidrs[0]", "IP network"),
    Invalid("node-cidr-host-bits-set", "dev", {"network.nodeCidrs": ["10.0.0.1/24"]}, "network.nodeCidrs[0]", "past the prefix"),
    Invalid("node-cidr-netmask-form", "dev", {"network.nodeCidrs": ["10.0.0.0/255.255.255.0"]}, "network.nodeCidrs[0]"),
    Invalid("api-server-cidr-not-a-network", "dev", {"network.apiServerCidrs": ["kubernetes.default"]},
            "network.apiServerCidrs[0]", "IP network"),
    Invalid("api-server-port-zero", "dev", {"network.apiServerPorts": [0]}, "network.apiServerPorts[0]"),
    Invalid("client-namespace-not-dns-1123", "dev", {"inference.clientNamespaces": ["Ingress_NGINX"]},
            "inference.clientNamespaces[0]", "DNS-1123"),
    # shape of the document
    Invalid("unknown-key-with-hint", "dev", {"pools[0].gpuPerNode": 8}, "pools[0].gpuPerNode",
            "did you mean 'gpusPerNode'?"),
    Invalid("unknown-top-level-key-with-hint", "dev", {"inferense": {}}, "inferense", "did you mean 'inference'?"),
    Invalid("wrong-type", "dev", {"pools[0].gpusPerNode": "eight"}, "pools[0].gpusPerNode", "integer"),
    Invalid("wrong-type-list-for-mapping", "dev", {"storage.nfs": ["nfs.dev.internal"]}, "storage.nfs"),
    Invalid("missing-cluster-name", "dev", {"slurm.clusterName": DELETE}, "slurm.clusterName", "required key is missing"),
    Invalid("missing-pools", "dev", {"pools": DELETE}, "pools", "required key is missing"),
    Invalid("unknown-environment", "dev", {"environment": "staging"}, "environment"),
    # partitions
    Invalid("two-default-partitions", "prod", {"slurm.partitions[1].default": True},
            "slurm.partitions[1].default", "only one partition"),
    Invalid("bad-max-time", "dev", {"slurm.partitions[0].maxTime": "7 days"}, "slurm.partitions[0].maxTime", "Slurm time"),
    Invalid("bad-partition-name", "dev", {"slurm.partitions[0].name": "gpu partition"}, "slurm.partitions[0].name",
            "partition name"),
    Invalid("partition-without-pools", "dev", {"slurm.partitions[0].pools": []}, "slurm.partitions[0].pools"),
    # duplicates
    Invalid("duplicate-pool-names", "prod", {"pools[1].name": "h100-a"}, "pools[1].name", "more than once"),
    Invalid("duplicate-partition-names", "prod", {"slurm.partitions[1].name": "gpu"},
            "slurm.partitions[1].name", "more than once"),
    Invalid("duplicate-model-names", "prod", {"inference.models[1].name": "llama-8b-instruct"},
            "inference.models[1].name", "more than once"),
    # inference
    Invalid("model-gpus-exceed-what-inference-pools-leave", "dev", {"inference.models[0].gpus": 3},
            "inference.models[0].gpus", "most: 2"),
    Invalid("model-gpus-with-only-dedicated-pools", "prod", {"pools[2].mode": "dedicated", "pools[2].slurmGpus": 8},
            "inference.models[0].gpus", "most: 0"),
    Invalid("replicas-min-above-max", "dev", {"inference.models[0].replicas": {"min": 3, "max": 2}},
            "inference.models[0].replicas.min", "exceeds replicas.max"),
    Invalid("replicas-zero", "dev", {"inference.models[0].replicas.min": 0}, "inference.models[0].replicas.min"),
    Invalid("relative-model-path-escapes", "dev", {"inference.models[0].path": "../secrets"}, "inference.models[0].path"),
    Invalid("models-path-escapes-the-share", "prod", {"storage.modelsPath": "models/../.."}, "storage.modelsPath",
            "without '.' or '..'"),
    # resources
    Invalid("request-above-limit", "dev", {"inference.models[0].resources.requests.cpu": "8"},
            "inference.models[0].resources.requests.cpu", "exceeds the limit"),
    Invalid("memory-request-above-limit", "prod", {"slurm.controller.resources.requests.memory": "64Gi"},
            "slurm.controller.resources.requests.memory", "exceeds the limit"),
    Invalid("slurmd-requests-is-no-longer-a-key", "dev", {"pools[0].slurmdRequests": {"cpu": "1"}},
            "pools[0].slurmdRequests", "unknown key"),
    # slurmd memory: MemSpecLimit comes out of realMemoryMb
    Invalid("mem-spec-limit-equals-real-memory", "dev", {"pools[0].memSpecLimitMb": 128000},
            "pools[0].memSpecLimitMb", "leaves jobs no memory of realMemoryMb (128000)"),
    Invalid("mem-spec-limit-above-real-memory", "prod", {"pools[2].memSpecLimitMb": 1000000},
            "pools[2].memSpecLimitMb", "leaves jobs no memory"),
    Invalid("mem-spec-limit-negative", "dev", {"pools[0].memSpecLimitMb": -1}, "pools[0].memSpecLimitMb"),
    Invalid("job-shm-size-is-withdrawn", "dev", {"pools[0].jobShmSize": "2Gi"},
            "pools[0].jobShmSize", "withdrawn: each job now has a /dev/shm of its own"),
    # users
    Invalid("duplicate-user-names", "dev",
            {"slurm.users": [{"name": "alice", "uid": 2001}, {"name": "alice", "uid": 2002}]},
            "slurm.users[1].name", "more than once"),
    Invalid("duplicate-user-uids", "dev",
            {"slurm.users": [{"name": "alice", "uid": 2001}, {"name": "bob", "uid": 2001}]},
            "slurm.users[1].uid", "more than once"),
    Invalid("user-named-root", "dev", {"slurm.users": [{"name": "root", "uid": 2000}]},
            "slurm.users[0].name", "system account"),
    Invalid("user-named-slurm", "prod", {"slurm.users[1].name": "slurm"}, "slurm.users[1].name", "system account"),
    Invalid("user-named-nobody", "dev", {"slurm.users[0].name": "nobody"}, "slurm.users[0].name", "system account"),
    Invalid("user-uid-below-1000", "dev", {"slurm.users[0].uid": 999}, "slurm.users[0].uid", "greater than or equal to 1000"),
    Invalid("user-uid-zero", "dev", {"slurm.users[0].uid": 0}, "slurm.users[0].uid"),
    Invalid("user-gid-below-1000", "dev", {"slurm.users[0].gid": 100}, "slurm.users[0].gid"),
    Invalid("user-name-not-posix", "dev", {"slurm.users[0].name": "Alice"}, "slurm.users[0].name", "POSIX user name"),
    Invalid("user-name-too-long", "dev", {"slurm.users[0].name": "a" * 33}, "slurm.users[0].name", "POSIX user name"),
    Invalid("user-without-uid", "dev", {"slurm.users": [{"name": "alice"}]}, "slurm.users[0].uid", "required key is missing"),
    Invalid("unknown-cgroup-version", "dev", {"slurm.cgroupVersion": "v3"}, "slurm.cgroupVersion"),
    # namespaces and versions
    Invalid("inference-namespace-clashes-with-slurm", "dev", {"inference.namespace": "slurm"},
            "inference.namespace", "must differ from slurm.namespace"),
    Invalid("submission-namespace-clashes-with-inference", "dev", {"submission.namespace": "inference"},
            "submission.namespace", "must differ from inference.namespace"),
    # partial builds: a section left out builds nothing, and nothing may need it
    Invalid("neither-slurm-nor-models", "dev", {"slurm": DELETE, "network": DELETE, "submission": DELETE, "inference": DELETE,
                                                "pools[0]": {"name": "gpu", "nodes": "gpu-001", "mode": "kubernetes"}},
            "slurm", "a stack builds Slurm, model servers or both"),
    Invalid("no-slurm-but-a-slurmd-pool", "dev", {"slurm": DELETE, "submission": DELETE}, "pools[0].mode",
            "runs slurmd, and the stack has no slurm section"),
    Invalid("no-slurm-but-taints", "dev", {"slurm": DELETE, "submission": DELETE, "inference.tolerations": [{"key": "x.io/gpu"}],
                                           "pools[0]": {"name": "gpu", "nodes": "gpu-001", "mode": "kubernetes",
                                                        "taints": [{"key": "x.io/gpu"}]}},
            "pools[0].taints", "an inference-only stack sets no node taints"),
    Invalid("no-slurm-but-submission", "dev", {"slurm": DELETE, "pools[0]": {"name": "gpu", "nodes": "gpu-001", "mode": "kubernetes"}},
            "submission.enabled", "Jobs submit to Slurm, and the stack has no slurm section"),
    Invalid("bad-kubernetes-version", "dev", {"kubernetesVersion": "v1.34"}, "kubernetesVersion", "minor version"),
    Invalid("kubernetes-version-with-patch", "dev", {"kubernetesVersion": "1.34.1"}, "kubernetesVersion"),
]


def test_invalid_case_ids_are_distinct():
    ids = [case.id for case in INVALID]
    assert len(ids) == len(set(ids)) and len(ids) >= 30


@pytest.mark.parametrize("case", INVALID, ids=[case.id for case in INVALID])
def test_invalid_config_is_rejected_naming_the_path(case: Invalid):
    raw = raw_stack(case.stack)
    for path, value in case.edits.items():
        edit(raw, path, value)

    error = rejection(raw)

    message = str(error)
    assert case.path in [problem.path for problem in error.problems], message
    assert problem_line(case.path).search(message), message
    if case.says:
        reported = [str(problem) for problem in error.problems if problem.path == case.path]
        assert any(case.says in line for line in reported), message


def test_several_problems_are_all_reported_at_once(dev_raw):
    dev_raw["pools"][0]["slurmGpus"] = 8
    del dev_raw["storage"]["nfs"]["server"]
    dev_raw["inference"]["namespace"] = "slurm"
    dev_raw["slurm"]["controller"]["ha"] = True

    error = rejection(dev_raw)

    assert sorted(problem.path for problem in error.problems) == sorted([
        "pools[0].slurmGpus",
        "inference.models[0].gpus",  # slurmGpus 8 leaves inference no GPUs
        "inference.models",  # ... so the replica floors do not fit either
        "storage.nfs.server",
        "inference.namespace",
        "slurm.controller.stateStorage.accessMode",
    ])
    assert "(6 problems)" in str(error)
    assert all(problem_line(problem.path).search(str(error)) for problem in error.problems)


def test_several_field_errors_are_all_reported_at_once(dev_raw):
    dev_raw["slurm"]["namespace"] = "Bad"
    dev_raw["storage"]["capacity"] = "4GB"
    dev_raw["kubernetesVersion"] = "latest"

    error = rejection(dev_raw)

    assert {problem.path for problem in error.problems} == {"slurm.namespace", "storage.capacity", "kubernetesVersion"}
    assert "(3 problems)" in str(error)


def test_unknown_keys_and_cross_field_problems_are_reported_in_one_round(dev_raw):
    dev_raw["pools"][0]["gpuPerNode"] = 8
    dev_raw["slurm"]["controller"]["ha"] = True
    error = rejection(dev_raw)
    assert [problem.path for problem in error.problems] == ["pools[0].gpuPerNode", "slurm.controller.stateStorage.accessMode"]
    assert error.cross_field_checked


def test_a_field_error_that_keeps_the_cross_field_checks_from_running_says_so(dev_raw):
    dev_raw["storage"]["capacity"] = "4GB"
    dev_raw["slurm"]["controller"]["ha"] = True  # found once the capacity is fixed, not before
    error = rejection(dev_raw)
    assert [problem.path for problem in error.problems] == ["storage.capacity"]
    assert not error.cross_field_checked
    assert str(error).startswith("invalid dualsched config in stack config (1 problem); cross-field checks run once it is fixed:\n")
    dev_raw["storage"]["capacity"] = "4Gi"
    assert [problem.path for problem in rejection(dev_raw).problems] == ["slurm.controller.stateStorage.accessMode"]


def test_a_bad_item_is_not_also_reported_as_an_empty_list(dev_raw):
    dev_raw["pools"][0]["gpusPerNode"] = "eight"
    dev_raw["slurm"]["partitions"][0]["maxTime"] = "7 days"
    error = rejection(dev_raw)
    assert [problem.path for problem in error.problems] == ["slurm.partitions[0].maxTime", "pools[0].gpusPerNode"]


def test_missing_value_is_reported_as_got_nothing(dev_raw):
    del dev_raw["slurm"]["clusterName"]
    assert "slurm.clusterName: required key is missing (got nothing)" in str(rejection(dev_raw))


def test_offending_value_is_quoted_in_the_message(dev_raw):
    dev_raw["storage"]["capacity"] = "4GB"
    assert "(got '4GB')" in str(rejection(dev_raw))


@pytest.mark.parametrize(
    ("storage", "line"),
    [
        ({"type": "lustre", "lustre": {"mgsNodes": [{"nids": ["10.20.0.10"]}], "fsName": "fs1"}},
         "storage.lustre.mgsNodes[0].nids[0]: must be one Lustre NID '<address>@<network>' such as '10.0.0.5@tcp' or "
         "'10.20.0.10@o2ib1' (list a node's NIDs as separate items) (got '10.20.0.10')"),
        ({"type": "lustre", "lustre": {"mgsNodes": [{"nids": ["10.20.0.10@o2ib"]}]}},
         "storage.lustre.fsName: Lustre storage needs the file system name (got nothing)"),
        ({"type": "gpfs", "gpfs": {"clusterId": 7118073361626808055, "filesystemUuid": "09762E69", "path": "/ibm/fs1"}},
         "storage.gpfs.filesystemUuid: must be the file system's UUID, two 8-digit hex words such as '09762E69:5D36FE8D' "
         "(got '09762E69')"),
        ({"type": "beegfs", "beegfs": {"sysMgmtdHost": "fd00::5", "path": "/"}},
         "storage.beegfs.sysMgmtdHost: must be a host name or an IPv4 address, without a port: it becomes the host of a "
         "beegfs:// URL (got 'fd00::5')"),
    ],
    ids=["lustre-nid", "lustre-fs-name-missing", "gpfs-uuid", "beegfs-host"],
)
def test_a_bad_storage_handle_part_is_one_line_naming_its_path_problem_and_value(prod_raw, storage, line):
    prod_raw["storage"] = {"capacity": "2Pi", **storage}
    assert str(rejection(prod_raw)).splitlines()[1:] == [f"  {line}"]


def test_settings_of_the_other_storage_types_are_ignored(prod_raw):
    prod_raw["storage"].update(type="beegfs", beegfs={"sysMgmtdHost": "mgmtd.beegfs.internal", "path": "/dualsched"})
    config = parse_stack_config(prod_raw)  # the lustre section stays, unused
    assert config.storage.type.value == "beegfs" and config.storage.lustre is not None


def test_problem_prints_path_message_and_value():
    assert str(Problem("pools[0].slurmGpus", "too many", 9)) == "pools[0].slurmGpus: too many (got 9)"


def test_long_values_are_shortened_in_the_message():
    line = str(Problem("pools[0].nodes", "bad", "x" * 500))
    assert len(line) < 120 and line.endswith("...)")


def test_config_that_is_not_a_mapping_is_rejected():
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(["not", "a", "mapping"])  # type: ignore[arg-type]
    assert problem_line("(top level)").search(str(caught.value))


def test_error_message_names_its_source(dev_raw):
    dev_raw["storage"]["capacity"] = "4GB"
    with pytest.raises(ConfigError, match=r"invalid dualsched config in Pulumi\.dev\.yaml \(1 problem\)"):
        parse_stack_config(dev_raw, "Pulumi.dev.yaml")


# --------------------------------------------------------------------- stack files


def test_broken_yaml_file_is_a_config_error(tmp_path):
    broken = tmp_path / "Pulumi.broken.yaml"
    broken.write_text("config:\n  dualsched:slurm: {clusterName: dev\n  - nope\n")
    with pytest.raises(ConfigError) as caught:
        load_stack_file(broken)
    assert "cannot read the stack file" in str(caught.value)
    assert problem_line(str(broken)).search(str(caught.value))
    # where, as an editor counts: the flow mapping opened on line 2 is still open at the end of the file
    assert (f"{broken}: cannot read the stack file at line 4, column 1 (while parsing a flow mapping from line 2, "
            "column 20) (got \"expected ',' or '}', but got '<stream end>'\")") in str(caught.value), str(caught.value)  # fmt: skip


def test_missing_stack_file_is_a_config_error(tmp_path):
    missing = tmp_path / "Pulumi.nowhere.yaml"
    with pytest.raises(ConfigError) as caught:
        load_stack_file(missing)
    assert "cannot read the stack file" in str(caught.value)


def test_stack_file_without_config_mapping_is_a_config_error(tmp_path):
    odd = tmp_path / "Pulumi.odd.yaml"
    odd.write_text("config: [1, 2]\n")
    with pytest.raises(ConfigError) as caught:
        load_stack_file(odd)
    assert problem_line("config").search(str(caught.value))


def test_stack_file_problems_name_the_file(tmp_path, dev_raw):
    dev_raw["storage"]["capacity"] = "4GB"
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(json.dumps({"config": {f"dualsched:{key}": value for key, value in dev_raw.items()}}))
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_stack_file(path)


ESC_ENVIRONMENTS = {
    "list": (["org/prod-base", "org/prod-db"], "org/prod-base, org/prod-db"),
    "definition": ({"imports": ["org/prod-base", {"org/prod-db": {"merge": False}}], "values": {"pulumiConfig": {}}},
                   "org/prod-base, org/prod-db, the stack's own environment values"),
}


@pytest.mark.parametrize("environment, names", ESC_ENVIRONMENTS.values(), ids=ESC_ENVIRONMENTS.keys())
def test_an_offline_problem_of_a_stack_with_esc_environments_says_what_was_not_read(tmp_path, prod_raw, environment, names):
    """The password may be in an environment the offline tools cannot open: the message says they did not."""
    del prod_raw["slurm"]["accounting"]["database"]["external"]["passwordSecret"]
    path = tmp_path / "Pulumi.esc.yaml"
    document = {"config": {f"dualsched:{key}": value for key, value in prod_raw.items()}}
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path)
    assert caught.value.note == "" and "ESC" not in str(caught.value)

    path.write_text(yaml.safe_dump({"environment": environment, **document}))
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path)
    message = str(caught.value)
    assert "slurm.accounting.database.external.passwordSecret: an external database needs" in message
    assert message.endswith(caught.value.note)
    assert f"note: Pulumi.esc.yaml imports ESC environments ({names}). Offline tools read only its 'config:'" in message


def test_the_render_of_a_stack_with_esc_environments_says_it_did_not_open_them(tmp_path, dev_raw, capsys):
    from dualsched.components import render

    path = tmp_path / "Pulumi.esc.yaml"
    path.write_text(yaml.safe_dump({"environment": ["org/dev-creds"],
                                    "config": {f"dualsched:{key}": value for key, value in dev_raw.items()}}))
    assert render.main(["--config", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "note: Pulumi.esc.yaml imports ESC environments (org/dev-creds)." in capsys.readouterr().out


def test_keys_of_other_namespaces_are_ignored(tmp_path):
    text = stack_file("dev").read_text() + "  kubernetes:context: kind-dev\n"
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(text)
    assert load_stack_file(path).slurm.cluster_name == "dev"


@pytest.mark.parametrize("text, key", [
    ("dualsched", ConfigKey()),
    ("gpu", ConfigKey("gpu")),
    ("gpu:cluster", ConfigKey("gpu", "cluster")),
    ("my-org.infra_1:cluster.v2", ConfigKey("my-org.infra_1", "cluster.v2")),
])
def test_config_keys_are_a_namespace_or_one_key(text, key):
    assert ConfigKey.parse(text) == key and str(key) == text


@pytest.mark.parametrize("text", ["", "a:b:c", "gpu:", ":cluster", "gpu cluster", "gpu/cluster"])
def test_other_config_keys_are_refused(text):
    with pytest.raises(ValueError, match="'<namespace>' or '<namespace>:<key>'"):
        ConfigKey.parse(text)


@pytest.mark.parametrize("key, config", [
    ("gpu:cluster", lambda raw: {"gpu:cluster": raw}),
    ("gpu", lambda raw: {f"gpu:{name}": value for name, value in raw.items()}),
])
def test_a_stack_file_is_read_at_its_config_key(key, config, tmp_path, dev_raw):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(yaml.safe_dump({"config": {**config(dev_raw), "dualsched:slurm": {}}}))
    assert load_stack_file(path, ConfigKey.parse(key)) == load_stack_file(stack_file("dev"))


def test_problems_at_a_config_key_name_the_file_and_the_key(tmp_path, dev_raw):
    dev_raw["pools"][0]["cpus"] = 0
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(yaml.safe_dump({"config": {"gpu:cluster": dev_raw}}))
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path, ConfigKey("gpu", "cluster"))
    assert str(caught.value).startswith(f"invalid dualsched config in {path}, key gpu:cluster (1 problem)")
    assert problem_line("pools[0].cpus").search(str(caught.value))


def _split_project(tmp_path: Path, project: dict, stack: dict) -> Path:
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump({"runtime": "python", **project}))
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(yaml.safe_dump({"config": stack}))
    return path


def test_the_project_files_config_is_read_under_the_stacks(tmp_path, dev_raw):
    """Pulumi.yaml's `config:` reaches every stack, as the CLI merges it: values, declarations with a
    value or a default, keys of the project's own namespace; a key the stack sets wins whole."""
    shared = {key: dev_raw.pop(key) for key in ("storage", "inference", "environment", "kubernetesVersion")}
    project = {"name": "dualsched", "config": {
        "dualsched:storage": {"value": shared["storage"]},
        "inference": {"type": "object", "default": shared["inference"]},  # the project's own namespace
        "dualsched:environment": "prod",  # the stack's own value wins
        "dualsched:kubernetesVersion": "1.30",
    }}
    path = _split_project(tmp_path, project, {f"dualsched:{key}": value for key, value in
                                              {**dev_raw, "environment": shared["environment"]}.items()})
    config = load_stack_file(path)
    reference = load_stack_file(stack_file("dev"))
    assert config.model_copy(update={"kubernetes_version": reference.kubernetes_version}) == reference
    assert config.kubernetes_version == "1.30"


def test_without_the_project_files_share_the_stack_is_incomplete(tmp_path, dev_raw):
    del dev_raw["storage"]
    path = _split_project(tmp_path, {"name": "dualsched"}, {f"dualsched:{key}": value for key, value in dev_raw.items()})
    with pytest.raises(ConfigError, match=re.escape("storage: required key is missing")):
        load_stack_file(path)


def test_an_encrypted_value_under_a_config_key_stays_a_placeholder(tmp_path, prod_raw):
    external = prod_raw["slurm"]["accounting"]["database"]["external"]
    del external["passwordSecret"]
    external["password"] = {"secure": "v1:c2VjcmV0"}
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(yaml.safe_dump({"config": {"gpu:cluster": prod_raw}}))
    assert load_stack_file(path, ConfigKey("gpu", "cluster")).slurm.accounting.database.external.password.encrypted


def test_engine_settings_are_the_whole_config_as_text_with_its_secret_keys(tmp_path):
    from dualsched.config.loader import engine_settings, read_stack_document

    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(yaml.safe_dump({"config": {
        "gpu:cluster": {"environment": "dev", "nested": {"secure": "v1:abc"}}, "gpu:replicas": 3, "gpu:on": True,
        "gpu:name": "a", "gpu:kubeconfig": {"secure": "v1:def"},
    }}))
    values, secret_keys = engine_settings(read_stack_document(path), path)
    assert values == {
        "gpu:cluster": json.dumps({"environment": "dev", "nested": {"secure": "v1:abc"}}), "gpu:replicas": "3", "gpu:on": "true",
        "gpu:name": "a", "gpu:kubeconfig": json.dumps({"secure": "v1:def"}),
    }
    assert sorted(secret_keys) == ["gpu:cluster", "gpu:kubeconfig"]


# ------------------------------------------------------------- Pulumi engine config


def _engine_config(raw: dict[str, Any]) -> dict[str, str]:
    """Config as the engine hands it to the program: objects as JSON text, scalars as text."""
    encoded = {}
    for key, value in raw.items():
        if isinstance(value, (dict, list)) or value is None:
            text = json.dumps(value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        encoded[f"dualsched:{key}"] = text
    return encoded


@pytest.fixture
def engine_config(monkeypatch):
    """Set the runtime config the engine would pass; reset it afterwards."""
    from pulumi.runtime import config as runtime_config

    monkeypatch.delenv("PULUMI_CONFIG", raising=False)

    def set_config(raw: dict[str, Any]) -> None:
        runtime_config.set_all_config(_engine_config(raw))

    yield set_config
    runtime_config.set_all_config({}, [])


def test_engine_config_loads_like_the_stack_file(engine_config, stack):
    engine_config(raw_stack(stack))
    assert load_pulumi_config() == load_stack_file(stack_file(stack))


def test_engine_config_reads_scalar_text(engine_config, prod_raw):
    prod_raw["protect"] = False
    engine_config(prod_raw)
    config = load_pulumi_config()
    assert config.protect_state is False
    assert config.kubernetes_version == "1.34"


def test_a_key_set_to_null_reaches_the_program_as_json_null_and_reads_as_left_out(engine_config, dev_raw):
    """``inference: null`` in a stack file: the engine hands over the JSON text ``null`` (found by tests/test_bad_input.py)."""
    without = {key: value for key, value in dev_raw.items() if key != "inference"}
    engine_config({**without, "inference": None})
    assert _engine_config({"inference": None}) == {"dualsched:inference": "null"}
    nulled = load_pulumi_config()
    engine_config(without)
    assert nulled == load_pulumi_config()


def test_engine_config_ignores_other_namespaces(engine_config, dev_raw):
    from pulumi.runtime import config as runtime_config

    engine_config(dev_raw)
    runtime_config.set_config("kubernetes:context", "kind-dev")
    assert load_pulumi_config().slurm.cluster_name == "dev"


def test_engine_config_rejects_unknown_top_level_key(engine_config, dev_raw):
    dev_raw["foo"] = "bar"
    engine_config(dev_raw)
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert problem_line("foo").search(str(caught.value))
    assert "unknown key" in str(caught.value)


def test_engine_config_reports_problems_with_paths(engine_config, dev_raw):
    dev_raw["pools"][0]["slurmGpus"] = 8
    engine_config(dev_raw)
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert problem_line("pools[0].slurmGpus").search(str(caught.value))


def test_engine_config_under_a_programs_own_key_loads_like_the_stack_file(engine_config, dev_raw, stack):
    from pulumi.runtime import config as runtime_config

    engine_config({})
    runtime_config.set_config("gpu:cluster", json.dumps(raw_stack(stack)))
    assert load_pulumi_config(ConfigKey.parse("gpu:cluster")) == load_stack_file(stack_file(stack))


def test_engine_config_under_a_key_names_the_key_in_its_problems(engine_config, dev_raw, monkeypatch):
    from pulumi.runtime import config as runtime_config

    dev_raw["pools"][0]["slurmGpus"] = 8
    engine_config({})
    runtime_config.set_config("gpu:cluster", json.dumps(dev_raw))
    monkeypatch.setattr(pulumi, "get_stack", lambda: "dev")
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config(ConfigKey.parse("gpu:cluster"))
    assert str(caught.value).startswith("invalid dualsched config in stack 'dev', key gpu:cluster (3 problems):")
    assert problem_line("pools[0].slurmGpus").search(str(caught.value))


def test_a_secret_key_holding_the_whole_config_hides_every_value(engine_config, dev_raw):
    from pulumi.runtime import config as runtime_config

    dev_raw["pools"][0]["slurmGpus"] = 8
    runtime_config.set_all_config({"gpu:cluster": json.dumps(dev_raw)}, ["gpu:cluster"])
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config(ConfigKey.parse("gpu:cluster"))
    assert "pools[0].slurmGpus" in str(caught.value) and "(got [secret])" in str(caught.value)
    assert "(got 8)" not in str(caught.value)


def test_a_secret_key_from_the_stack_file_hides_only_the_values_encrypted_there(engine_config, prod_raw, tmp_path, monkeypatch):
    """`pulumi config set --secret --path 'gpu:cluster...password'` makes the engine mark all of gpu:cluster
    secret; the stack file beside the program says which value it was."""
    from pulumi.runtime import config as runtime_config

    external = prod_raw["slurm"]["accounting"]["database"]["external"]
    del external["passwordSecret"]
    prod_raw["pools"][0]["slurmGpus"] = "nine"
    in_file = copy.deepcopy(prod_raw)
    in_file["slurm"]["accounting"]["database"]["external"]["password"] = {"secure": "v1:AAAABBBBCCCC"}
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": {"gpu:cluster": in_file}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "prod")
    external["password"] = "has space"  # decrypted by the engine; not a valid StoragePassword
    runtime_config.set_all_config({"gpu:cluster": json.dumps(prod_raw)}, ["gpu:cluster"])
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config(ConfigKey.parse("gpu:cluster"))
    message = str(caught.value)
    assert problem_line("pools[0].slurmGpus").search(message) and "(got 'nine')" in message, message
    assert "slurm.accounting.database.external.password" in message and "has space" not in message, message


def test_a_missing_key_is_named_with_the_keys_there_are(engine_config, dev_raw):
    engine_config(dev_raw)
    with pytest.raises(ConfigError, match=re.escape("gpu:cluster: is not set in the stack's config (its keys: dualsched:")):
        load_pulumi_config(ConfigKey.parse("gpu:cluster"))


# ------------------------------------------------------- valid by construction

CONSTRUCTORS = {
    "model_validate": StackConfig.model_validate,
    "keyword arguments": lambda raw: StackConfig(**raw),
    "model_validate_json": lambda raw: StackConfig.model_validate_json(json.dumps(raw)),
}


@pytest.mark.parametrize("construct", CONSTRUCTORS.values(), ids=CONSTRUCTORS.keys())
def test_every_way_to_build_a_stack_config_runs_the_cross_field_checks(dev_raw, construct):
    dev_raw["pools"][0]["slurmGpus"] = 12  # on 8-GPU nodes: rendered as Gres=gpu:12 when unchecked
    with pytest.raises(ValidationError) as caught:
        construct(dev_raw)
    line = "pools[0].slurmGpus: a partitioned pool gives Slurm between 1 and 7 of its 8 GPUs per node (got 12)"
    assert line in str(caught.value)
    [detail] = caught.value.errors()
    assert "pools[0].slurmGpus" in [problem.path for problem in detail["ctx"]["error"].problems]


def test_a_partition_naming_a_missing_pool_is_a_problem_not_a_stop_iteration(dev_raw):
    dev_raw["slurm"]["partitions"][0]["pools"] = ["nope"]
    line = "slurm.partitions[0].pools[0]: no pool of that name (pools: gpu) (got 'nope')"
    with pytest.raises(ValidationError, match=re.escape(line)):
        StackConfig.model_validate(dev_raw)


def test_a_copy_with_an_update_is_validated_again(dev_config):
    twelve = dev_config.pools[0].model_copy(update={"slurm_gpus": 12})
    with pytest.raises(ValidationError, match=re.escape("pools[0].slurmGpus")):
        dev_config.model_copy(update={"pools": (twelve,)})
    assert dev_config.model_copy(update={"protect": True}).protect_state is True
    assert dev_config.model_copy() == dev_config


# ------------------------------------------------------------------ documentation


def _readme_sample_error() -> str:
    section = (ROOT / "README.md").read_text().split("\n## Configuration\n", 1)[1]
    return section.split("```\n", 2)[1].removesuffix("\n")


def test_the_readme_sample_error_is_what_a_stack_gets(engine_config, prod_raw, monkeypatch):
    prod_raw["pools"][0]["gpusPerNod"] = 3
    prod_raw["slurm"]["controller"]["stateStorage"]["accessMode"] = "ReadWriteOnce"
    engine_config(prod_raw)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "prod")
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert str(caught.value) == _readme_sample_error()


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    if model in seen:
        return seen
    seen.add(model)

    def args(annotation: Any):
        yield annotation
        for arg in getattr(annotation, "__args__", ()):
            yield from args(arg)

    for info in model.model_fields.values():
        for arg in args(info.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                _models(arg, seen)
    return seen


CONFIG_MODELS = sorted(_models(StackConfig, set()), key=lambda model: model.__name__)


def test_config_models_are_all_found():
    names = {model.__name__ for model in CONFIG_MODELS}
    assert {"StackConfig", "NodePool", "Partition", "ExternalDatabase", "Toleration", "Replicas"} <= names


@pytest.mark.parametrize("model", CONFIG_MODELS, ids=lambda model: model.__name__)
def test_every_config_field_is_documented(model: type[BaseModel]):
    undocumented = [name for name, info in model.model_fields.items() if not (info.description or "").strip()]
    assert not undocumented, f"{model.__name__} fields without a description: {undocumented}"


def test_pool_modes_are_a_closed_set():
    assert {mode.value for mode in PoolMode} == {"dedicated", "partitioned", "kubernetes", "time-shared"}


def test_user_may_not_take_nobodys_uid(dev_raw):
    dev_raw["slurm"]["users"] = [{"name": "bob", "uid": 65534}]
    del dev_raw["submission"]
    assert "slurm.users[0].uid" in [problem.path for problem in rejection(dev_raw).problems]


# --------------------------------------------------------------------- pools whose nodes join by label


def test_a_joining_pool_needs_the_node_watcher_and_a_mode_that_lists_no_node(dev_raw):
    raw = with_joining_pool(dev_raw)
    raw["slurm"]["healthCheck"]["drainCordoned"] = False
    raw["pools"].append({**raw["pools"][1], "name": "night", "nodes": "night-[1-2]", "mode": "time-shared",
                         "slurmGpus": None, "inferenceWindow": {"start": "22:00", "durationMinutes": 60}})  # fmt: skip
    message = str(rejection(raw))
    assert problem_line("pools[1].joinByLabel").search(message) and "drainCordoned" in message
    assert re.search(r"pools\[2\]\.joinByLabel: only a dedicated or partitioned pool's nodes join by label \(mode is 'time-shared'\) \(got True\)", message)


def test_a_joining_pools_bound_never_overlaps_another_pools_nodes(dev_raw):
    assert problem_line("pools[1].nodes").search(str(rejection(with_joining_pool(dev_raw, nodes="gpu-[002-009]"))))
