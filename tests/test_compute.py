"""ComputePool: one slurmd DaemonSet per Slurm pool, placed, tolerated and sized by the pool."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from functools import cache
from types import SimpleNamespace

import pytest

from dualsched.components.compute import (
    GRANT_MKNOD_ON_HELD_DEVICES, NVIDIA_PROC_GPUS, V1_DEVICES, many_mount_namespaces_on, newer_mount_namespaces_on_every_cpu, only_the_pods_gpus_listed,
    slurmd_resources,
    task_prolog_config_map_name, wait_for_the_primary,
)
from dualsched.components.programs import source
from dualsched.components.slurm_files import ControllerHost, DatabaseEndpoint, Site, kubernetes_site, render_slurm_files
from dualsched.config import ConfigError, parse_stack_config
from rendering import (
    container, mounts, own_images, pod_spec, render_raw, render_stack, variant, volume, with_joining_pool, without_containers,
)

POOL_LABEL = "dualsched.io/pool"
GUARDED_POOL_LABEL = "node-restriction.kubernetes.io/dualsched-pool"
KEPT_BY_LABEL = "dualsched.io/kept-by"
SLURM_TAINT = {"key": "dualsched.io/slurm", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
WINDOW_TAINT = {"key": "dualsched.io/inference-window", "operator": "Equal", "value": "closed", "effect": "NoExecute"}
"""Every slurmd tolerates the closed-window taint: a pool switching to time-shared keeps its running slurmd."""


def _daemonsets(rendered) -> dict:
    """pool name -> slurmd DaemonSet."""
    result = {}
    for daemonset in rendered.by_kind("DaemonSet"):
        pool = pod_spec(daemonset)["nodeSelector"][POOL_LABEL]
        assert pool not in result
        result[pool] = daemonset
    return result


def _with_kubernetes_pool(raw):
    raw["pools"].append({"name": "serve", "nodes": "inf-[01-04]", "mode": "kubernetes", "gpusPerNode": 4})


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_daemonset_per_slurm_pool(stack):
    rendered = render_stack(stack)
    assert sorted(_daemonsets(rendered)) == sorted(pool.name for pool in rendered.config.slurm_pools)
    assert {d.namespace for d in rendered.by_kind("DaemonSet")} == {"slurm"}


def test_prod_runs_slurmd_on_all_three_pools():
    assert sorted(_daemonsets(render_stack("prod"))) == ["h100-a", "h100-b", "h100-shared"]


def test_kubernetes_mode_pools_get_no_slurmd():
    rendered = render_raw(variant("dev", _with_kubernetes_pool))
    assert sorted(_daemonsets(rendered)) == ["gpu"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_placed_by_the_pool_label_its_guarded_copy_and_the_stacks_keeper_only(stack):
    """slurmd brings the munge key: it goes only where this stack's node keeper put the pool, under a label that
    NodeRestriction keeps a kubelet from setting on its own Node; not on another stack's pool of the same name."""
    rendered = render_stack(stack)
    for pool, daemonset in _daemonsets(rendered).items():
        spec = pod_spec(daemonset)
        assert spec["nodeSelector"] == {POOL_LABEL: pool, GUARDED_POOL_LABEL: pool, KEPT_BY_LABEL: rendered.config.slurm.namespace}
        assert daemonset.manifest["spec"]["template"]["metadata"]["labels"][POOL_LABEL] == pool
        selector = daemonset.manifest["spec"]["selector"]["matchLabels"]
        assert selector.items() <= daemonset.manifest["spec"]["template"]["metadata"]["labels"].items()


def test_selector_and_name_survive_pool_label_and_cluster_name_edits():
    """A DaemonSet's selector is immutable: a new one makes the engine replace the DaemonSet, and
    every slurmd pod dies with the jobs in it. Renaming the pool label or the cluster leaves the
    selector and the name alone, so the pool rolls (OnDelete) instead."""

    def edit(raw):
        raw.setdefault("placement", {})["poolLabel"] = "example.com/gpu-pool"
        raw["slurm"]["clusterName"] = "renamed"

    def identity(rendered) -> dict:
        return {d.pulumi_name: (d.name, d.manifest["spec"]["selector"]) for d in rendered.by_kind("DaemonSet")}

    before, after = render_stack("dev"), render_raw(variant("dev", edit))
    assert identity(after) == identity(before)
    (daemonset,) = after.by_kind("DaemonSet")
    assert pod_spec(daemonset)["nodeSelector"] == {"example.com/gpu-pool": "gpu", GUARDED_POOL_LABEL: "gpu", KEPT_BY_LABEL: "slurm"}
    assert daemonset.manifest["spec"]["template"]["metadata"]["labels"]["example.com/gpu-pool"] == "gpu"


def test_dedicated_pools_tolerate_exactly_the_slurm_taint_and_the_window():
    daemonsets = _daemonsets(render_stack("prod"))
    for pool in ("h100-a", "h100-b"):
        assert pod_spec(daemonsets[pool])["tolerations"] == [SLURM_TAINT, WINDOW_TAINT]


@pytest.mark.parametrize(("stack", "pool"), [("dev", "gpu"), ("prod", "h100-shared")])
def test_untainted_partitioned_pools_tolerate_only_the_window(stack, pool):
    assert pod_spec(_daemonsets(render_stack(stack))[pool])["tolerations"] == [WINDOW_TAINT]


def test_custom_taints_are_tolerated_exactly():
    def taint(raw):
        raw["pools"][0]["taints"] = [{"key": "example.com/gpu-team", "value": "ml", "effect": "NoExecute"}]
        raw["inference"]["tolerations"] = [{"key": "example.com/gpu-team", "value": "ml"}]

    daemonset = _daemonsets(render_raw(variant("dev", taint)))["gpu"]
    assert pod_spec(daemonset)["tolerations"] == [
        {"key": "example.com/gpu-team", "operator": "Equal", "value": "ml", "effect": "NoExecute"}, WINDOW_TAINT
    ]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_host_network_with_cluster_dns_and_on_delete_updates(stack):
    for daemonset in _daemonsets(render_stack(stack)).values():
        spec = pod_spec(daemonset)
        assert spec["hostNetwork"] is True
        assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert daemonset.manifest["spec"]["updateStrategy"] == {"type": "OnDelete"}


@cache
def prod_without_containers():
    """prod with no pool running job steps in containers: its slurmd pods unprivileged (tests/test_containers.py
    has the pools that run them)."""
    return render_raw(variant("prod", without_containers))


@pytest.mark.parametrize("render", [lambda: render_stack("dev"), prod_without_containers], ids=["dev", "prod"])
def test_dedicated_and_partitioned_slurmd_is_not_privileged(render):
    """The runtime's device cgroup then admits only the GPUs the kubelet allocated to slurmd; it keeps
    the two capabilities job cgroups and CPU binding need, and the runtime's seccomp profile keeps from the
    users' jobs what no job needs (a pool with containers: tests/test_containers.py)."""
    rendered = render()
    for pool, daemonset in _daemonsets(rendered).items():
        fabric = ["SYS_RESOURCE"] if rendered.config.pool(pool).fabric else []
        assert container(daemonset, "slurmd")["securityContext"] == {
            "privileged": False,
            "capabilities": {"add": ["SYS_ADMIN", "SYS_NICE", *fabric]},
            "appArmorProfile": {"type": "Unconfined"},
            "seccompProfile": {"type": "RuntimeDefault"},
        }


@pytest.mark.parametrize("cgroups", ["v1", "v2"])
def test_slurmd_makes_its_own_cgroup_writable_and_mounts_no_host_cgroups(cgroups):
    """Slurm then nests job cgroups under the container's: they inherit its device and memory limits."""
    daemonset = _daemonsets(render_raw(variant("dev", lambda raw: raw["slurm"].update(cgroupVersion=cgroups))))["gpu"]
    slurmd = container(daemonset, "slurmd")
    assert slurmd["command"][:2] == ["sh", "-c"]
    assert "mount -o remount,bind,rw" in slurmd["command"][2] and slurmd["command"][2].endswith('&& exec "$@"')
    assert slurmd["command"][4:7] == ["slurmd", "-D", "-N"]
    assert not any(m["mountPath"].startswith("/sys") for m in slurmd["volumeMounts"])
    assert not any("hostPath" in v for v in pod_spec(daemonset)["volumes"])


def test_on_cgroup_v1_slurmd_first_adds_mknod_to_the_devices_its_cgroup_holds():
    """Slurm asks `rwm` for a job's GPUs and a child cgroup gets no more than its parent."""
    command = {
        version: container(_daemonsets(render_raw(variant("dev", lambda raw: raw["slurm"].update(cgroupVersion=version))))["gpu"],
                           "slurmd")["command"][2]
        for version in ("v1", "v2")
    }  # fmt: skip
    assert GRANT_MKNOD_ON_HELD_DEVICES in command["v1"] and command["v1"].index("remount") < command["v1"].index("devices.allow")
    assert "devices.allow" not in command["v2"]


def test_the_mknod_grant_writes_one_rule_per_held_device(tmp_path):
    """Run as sh runs it, against a devices.list; each write to devices.allow is also logged, as the
    kernel takes one rule per write."""
    (tmp_path / "devices.list").write_text("b *:* m\nc *:* m\nc 1:3 rwm\nc 136:* rwm\nc 195:2 rw\nc 195:3 rw\n")
    log = tmp_path / "writes"
    record_each_write = f'echo() {{ printf "%s\\n" "$*" | tee -a {log}; }}; '
    script = record_each_write + GRANT_MKNOD_ON_HELD_DEVICES.replace(V1_DEVICES, str(tmp_path))
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    assert log.read_text() == "c 195:2 rwm\nc 195:3 rwm\n"
    assert (tmp_path / "devices.allow").read_text() == "c 195:3 rwm\n"


def test_with_autodetect_nvidia_unprivileged_slurmd_first_counts_the_gpus_the_driver_lists():
    """Every pool of dev and prod but the time-shared ones and those with containers (privileged: all the node's
    GPUs are Slurm's)."""
    for rendered, pools in ((render_stack("dev"), {"gpu": 6}), (prod_without_containers(), {"h100-a": 8, "h100-b": 8, "h100-shared": 4})):
        for pool, daemonset in _daemonsets(rendered).items():
            command = container(daemonset, "slurmd")["command"][2]
            assert "{ " + only_the_pods_gpus_listed(pools[pool]) + "; }" in command, (stack, pool)
            assert command.index(NVIDIA_PROC_GPUS) < command.index('exec "$@"'), (stack, pool)


def test_every_slurmd_first_makes_mount_namespaces_on_each_cpu_until_one_newer_than_its_own_binds():
    """Each job's /tmp is a namespace the extern step keeps by a bind Linux 6.18 refuses where a CPU's batch of
    ids lags (tests/node/test_real_node.py shows it on the real node); privileged pools too. The probe's
    directory is in the pod's run volume."""
    for rendered in (render_stack("dev"), render_stack("prod")):
        for pool, daemonset in _daemonsets(rendered).items():
            slurmd = container(daemonset, "slurmd")
            run = next(path for path, mount in mounts(slurmd).items() if mount["name"] == "run")
            step = "{ " + newer_mount_namespaces_on_every_cpu(run) + "; }"
            assert step in slurmd["command"][2] and slurmd["command"][2].index(step) < slurmd["command"][2].index('exec "$@"'), pool


@pytest.mark.parametrize(("perl_works", "made_by"), [(True, ["perl 5 272"]), (False, ["unshare"] * 5)])
def test_many_mount_namespaces_are_made_by_one_perl_process_or_else_by_unshare_processes(tmp_path, perl_works, made_by):
    """`many_on 1 5` on x86_64, with fakes that log: taskset runs its command, perl calls unshare(2) (its number)
    the times asked, or fails (no perl), and then `unshare --mount` runs that many times instead."""
    log = tmp_path / "made"
    fakes = {
        "taskset": 'shift 2; exec "$@"',
        "uname": "echo x86_64",
        "perl": (f'n=$(echo "$2" | sed -n "s/for (1\\.\\.\\([0-9]*\\)).*syscall(\\([0-9]*\\), 131072).*/\\1 \\2/p");'
                 f' echo "perl $n" >> {log}' if perl_works else "exit 127"),
        "unshare": f'[ "$*" = "--mount true" ] && echo unshare >> {log}',
    }  # fmt: skip
    for name, body in fakes.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    script = "true" + many_mount_namespaces_on() + " && many_on 1 5"
    result = subprocess.run(["sh", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    assert log.read_text().split("\n")[:-1] == made_by


@pytest.mark.parametrize(("listed", "exit_code"), [(3, 0), (4, 0), (5, 1)])
def test_slurmd_does_not_start_where_the_driver_lists_gpus_of_other_pods(tmp_path, listed: int, exit_code: int):
    """Run as sh runs it, against a /proc/driver/nvidia/gpus with one directory per GPU (gpu_nvidia.c)."""
    for index in range(listed):
        (tmp_path / f"0000:{index:02x}:00.0").mkdir()
    script = only_the_pods_gpus_listed(4).replace(NVIDIA_PROC_GPUS, str(tmp_path))
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
    assert result.returncode == exit_code
    assert ("lists 5 GPUs and this pod holds 4" in result.stderr) == bool(exit_code), result.stderr


def test_slurmd_whose_gpus_are_listed_or_detected_by_nvml_counts_nothing():
    for detection in ("off", "nvml"):
        raw = variant("dev", lambda raw: raw["slurm"].update(gpuAutoDetect=detection, release="24.05")
                      or raw.setdefault("images", {}).update(own_images("24.05")))  # fmt: skip
        command = container(_daemonsets(render_raw(raw))["gpu"], "slurmd")["command"][2]
        assert NVIDIA_PROC_GPUS not in command, detection


@pytest.mark.parametrize(("stack", "waits"), [("dev", False), ("prod", True)])
def test_with_a_backup_slurmd_first_waits_for_the_primary(stack, waits):
    for daemonset in _daemonsets(render_stack(stack)).values():
        command = container(daemonset, "slurmd")["command"][2]
        assert ("/dev/tcp/slurmctld-0.slurmctld.slurm.svc.cluster.local/6817" in command) is waits
        if waits:
            assert command.index("/dev/tcp/") < command.index('exec "$@"')


def _site_on(port: int) -> Site:
    """A primary on this machine's loopback, at ``port``."""
    hosts = (ControllerHost(name="127.0.0.1"), ControllerHost(name="backup.invalid"))
    return Site(controller_hosts=hosts, accounting_host="", dbd_host="", database=DatabaseEndpoint(host=""), slurmctld_port=port)


def test_the_wait_ends_as_soon_as_the_primary_accepts():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        script = wait_for_the_primary(_site_on(listener.getsockname()[1]), 60)
        start = time.monotonic()
        result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 5


def test_a_primary_that_never_answers_is_given_up_on_after_the_timeout():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed again: connections are refused
    start = time.monotonic()
    result = subprocess.run(["sh", "-c", wait_for_the_primary(_site_on(port), 4)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert 4 <= time.monotonic() - start < 15


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_up_does_not_wait_for_slurmd_pods_that_only_a_person_replaces(stack):
    """Under OnDelete, pulumi-kubernetes' DaemonSet await would wait for every pod to be replaced."""
    for daemonset in _daemonsets(render_stack(stack)).values():
        assert daemonset.manifest["spec"]["updateStrategy"] == {"type": "OnDelete"}
        assert daemonset.manifest["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}


def _time_shared(raw):
    raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "09:00", "durationMinutes": 480})
    del raw["pools"][0]["slurmGpus"]


def test_time_shared_slurmd_holds_no_gpu_sees_them_all_and_outlasts_the_closed_window():
    """Inference pods take the GPUs from the device plugin inside the window, so slurmd must not hold
    them; it is privileged to see every GPU, and tolerates the closed window's NoExecute taint."""
    daemonset = _daemonsets(render_raw(variant("dev", _time_shared)))["gpu"]
    slurmd = container(daemonset, "slurmd")
    assert slurmd["securityContext"] == {"privileged": True}
    assert "nvidia.com/gpu" not in slurmd["resources"]["limits"]
    assert slurmd["command"][:2] == ["sh", "-c"] and slurmd["command"][4:7] == ["slurmd", "-D", "-N"]
    assert WINDOW_TAINT in pod_spec(daemonset)["tolerations"]


@pytest.mark.parametrize(("stack", "pool", "gpus"), [("dev", "gpu", "6"), ("prod", "h100-a", "8"), ("prod", "h100-b", "8"), ("prod", "h100-shared", "4")])
def test_gpu_limit_is_all_gpus_when_dedicated_and_the_slurm_share_when_partitioned(stack, pool, gpus):
    rendered = render_stack(stack)
    config = rendered.config.pool(pool)
    expected = config.gpus_per_node if config.mode.value == "dedicated" else config.slurm_gpus
    assert str(expected) == gpus
    resources = container(_daemonsets(rendered)[pool], "slurmd")["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == gpus
    assert resources["requests"]["nvidia.com/gpu"] == gpus


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_requests_and_limits_are_the_node_share_slurm_allocates(stack):
    """Guaranteed: requests == limits == what slurm.conf promises (CPUs, RealMemory in MiB, GPUs)."""
    rendered = render_stack(stack)
    for pool_name, daemonset in _daemonsets(rendered).items():
        pool = rendered.config.pool(pool_name)
        resources = container(daemonset, "slurmd")["resources"]
        expected = {"cpu": str(pool.cpus), "memory": f"{pool.real_memory_mb}Mi", "nvidia.com/gpu": str(pool.slurm_gpu_count)}
        if pool.fabric:
            expected[pool.fabric.rdma_resource] = str(pool.fabric.rdma_count)
        assert resources == {"requests": expected, "limits": expected}, pool_name


def test_dev_slurmd_resources_exactly():
    resources = container(_daemonsets(render_stack("dev"))["gpu"], "slurmd")["resources"]
    assert resources["limits"] == {"cpu": "32", "memory": "128000Mi", "nvidia.com/gpu": "6"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_container_of_a_slurmd_pod_is_guaranteed(stack):
    """The pod's QoS class is Guaranteed only if every container, the munged sidecar too, has requests == limits."""
    for daemonset in _daemonsets(render_stack(stack)).values():
        spec = pod_spec(daemonset)
        for item in spec["containers"] + spec.get("initContainers", []):
            resources = item["resources"]
            assert resources["requests"] == resources["limits"], item["name"]
            assert {"cpu", "memory"} <= set(resources["limits"]), item["name"]


def _with_cpu_pool(raw):
    raw["pools"].append(
        {"name": "cpu", "nodes": "cpu-[1-2]", "mode": "dedicated", "gpusPerNode": 0, "cpus": 16, "realMemoryMb": 64000,
         "allocatable": {"cpus": 31, "memoryMb": 120000}}
    )


def test_pool_without_slurm_gpus_requests_no_gpu():
    pool = parse_stack_config(variant("dev", _with_cpu_pool)).pool("cpu")
    assert slurmd_resources(pool) == {"cpu": "16", "memory": "64000Mi"}
    resources = container(_daemonsets(render_raw(variant("dev", _with_cpu_pool)))["cpu"], "slurmd")["resources"]
    assert resources == {"requests": {"cpu": "16", "memory": "64000Mi"}, "limits": {"cpu": "16", "memory": "64000Mi"}}


# ------------------------------------------------------------------ jobs' /tmp and /dev/shm


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_jobs_temporary_space_is_a_volume_of_the_slurmd_pod_at_job_container_confs_base_path(stack):
    """slurmd makes each job's /tmp under BasePath (job_container.conf): a directory of this pod on the
    node's disk, not the container's writable layer (an overlay, where Enroot's overlay mounts fail)."""
    rendered = render_stack(stack)
    [base_path] = re.findall(r"^BasePath=(\S+)$", rendered.slurm_files["job_container.conf"], re.M)
    for daemonset in _daemonsets(rendered).values():
        assert volume(daemonset, "job-tmp") == {"name": "job-tmp", "emptyDir": {}}
        assert mounts(container(daemonset, "slurmd"))[base_path] == {"name": "job-tmp", "mountPath": base_path}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmd_pods_share_no_dev_shm_between_jobs(stack):
    """Each job mounts a /dev/shm of its own (job_container.conf's default Dirs), counted against its memory:
    the pod holds no /dev/shm volume for jobs to share."""
    for daemonset in _daemonsets(render_stack(stack)).values():
        assert "/dev/shm" not in mounts(container(daemonset, "slurmd"))
        assert "shm" not in {v["name"] for v in pod_spec(daemonset)["volumes"]}


def test_a_stack_that_still_sizes_the_shared_dev_shm_is_told_the_key_is_withdrawn():
    with pytest.raises(ConfigError) as raised:
        parse_stack_config(variant("dev", lambda raw: raw["pools"][0].update(jobShmSize="2Gi")))
    [problem] = raised.value.problems
    assert (problem.path, problem.value) == ("pools[0].jobShmSize", "2Gi")
    assert "/dev/shm of its own" in problem.message and "remove the key" in problem.message


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munge_key_and_shared_claim_are_mounted(stack):
    rendered = render_stack(stack)
    munge = rendered.one("Secret", "munge-slurm")
    shared_claim = [c for c in rendered.in_namespace("slurm", "PersistentVolumeClaim") if "shared" in c.name]
    assert len(shared_claim) == 1
    for daemonset in _daemonsets(rendered).values():
        assert volume(daemonset, "munge-key")["secret"]["secretName"] == munge.name
        assert volume(daemonset, "shared")["persistentVolumeClaim"] == {"claimName": shared_claim[0].name}
        shared = mounts(container(daemonset, "slurmd"))["/shared"]
        assert shared["name"] == "shared" and not shared.get("readOnly")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_slurmd_runs_the_task_prolog_that_keeps_a_submission_token_out_of_jobs(stack):
    """slurm.conf's TaskProlog is the program of each pool's ConfigMap, executable where slurmstepd runs it; it
    unsets SLURM_JWT in every task (the real proofs: tests/slurm/test_jwt_auth.py and the multi-node tier's
    training job, submitted by a Kubernetes Job, whose srun would fail with the token)."""
    rendered = render_stack(stack)
    prolog = next(line.split("=", 1)[1] for line in rendered.slurm_files["slurm.conf"].splitlines()
                  if line.startswith("TaskProlog="))  # fmt: skip
    directory, program = prolog.rsplit("/", 1)
    for pool, daemonset in _daemonsets(rendered).items():
        config_map = task_prolog_config_map_name(SimpleNamespace(name=pool))
        assert volume(daemonset, "task-prolog")["configMap"] == {"name": config_map, "defaultMode": 0o555}
        assert mounts(container(daemonset, "slurmd"))[directory] == {"name": "task-prolog", "mountPath": directory, "readOnly": True}
        data = rendered.named("ConfigMap", config_map, "slurm").manifest["data"]
        assert data == {program: source(program)}
    printed = subprocess.run(["sh", "-c", source(program)], capture_output=True, text=True, check=True).stdout
    assert printed.splitlines() == ["unset SLURM_JWT"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmd_is_configless(stack):
    """It never mounts slurm.conf: it fetches it from every controller listed in --conf-server."""
    rendered = render_stack(stack)
    controllers = ",".join(
        f"slurmctld-{i}.slurmctld.slurm.svc.cluster.local:6817" for i in range(2 if rendered.config.slurm.controller.ha else 1)
    )
    for pool, daemonset in _daemonsets(rendered).items():
        slurmd = container(daemonset, "slurmd")
        command = slurmd["command"]
        assert command[command.index("--conf-server") + 1] == controllers
        assert command[command.index("-N") + 1] == "$(NODE_NAME)"
        assert slurmd["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
        # The only ConfigMaps it mounts are the user directory, Enroot's config, its programs (the health check in
        # prod, the task prolog) and a fabric's nccl.conf, never the Slurm config.
        health = ["health"] if rendered.config.slurm.health_check.enabled else []
        nccl = ["nccl"] if rendered.config.pool(pool).fabric else []
        enroot = ["enroot-conf"] if rendered.config.runs_containers else []
        assert [v["name"] for v in pod_spec(daemonset)["volumes"] if "configMap" in v] == ["identity", *enroot, *health, "task-prolog", *nccl]
        assert not [path for path in mounts(slurmd) if path.startswith("/etc/slurm")]


def test_prod_conf_server_lists_both_controllers():
    slurmd = container(_daemonsets(render_stack("prod"))["h100-a"], "slurmd")
    servers = slurmd["command"][slurmd["command"].index("--conf-server") + 1].split(",")
    assert servers == [
        "slurmctld-0.slurmctld.slurm.svc.cluster.local:6817",
        "slurmctld-1.slurmctld.slurm.svc.cluster.local:6817",
    ]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_probes_on_the_slurmd_port(stack):
    for daemonset in _daemonsets(render_stack(stack)).values():
        slurmd = container(daemonset, "slurmd")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert slurmd[probe]["tcpSocket"] == {"port": 6818}
        assert slurmd["ports"] == [{"containerPort": 6818, "name": "slurmd"}]


# ----------------------------------------------------------------------------- the RDMA fabric (prod's training pools)


@pytest.mark.parametrize("render", [lambda: render_stack("prod"), prod_without_containers], ids=["containers", "no-containers"])
def test_a_pool_with_a_fabric_holds_its_rdma_devices_and_its_jobs_may_lock_memory(render):
    """prod's h100-a: the RDMA device plugin's resource beside the GPUs, CAP_SYS_RESOURCE to lift slurmd's own
    locked-memory limit before it starts (its jobs keep it: PropagateResourceLimitsExcept=MEMLOCK; a privileged
    slurmd, for containers, has every capability); h100-shared, without a fabric, gets none of it."""
    rendered = render()
    daemonsets = _daemonsets(rendered)
    slurmd = container(daemonsets["h100-a"], "slurmd")
    assert slurmd["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    if rendered.config.pool("h100-a").containers:
        assert slurmd["securityContext"] == {"privileged": True}
    else:
        assert "SYS_RESOURCE" in slurmd["securityContext"]["capabilities"]["add"]
    assert "{ ulimit -l unlimited; }" in slurmd["command"][2]
    shared = container(daemonsets["h100-shared"], "slurmd")
    assert not any(name.startswith("rdma/") for name in shared["resources"]["limits"])
    assert "ulimit -l" not in shared["command"][2]


def test_nccl_reads_the_pools_settings_from_etc_nccl_conf():
    rendered = render_stack("prod")
    daemonset = _daemonsets(rendered)["h100-a"]
    assert mounts(container(daemonset, "slurmd"))["/etc/nccl.conf"] == {
        "name": "nccl", "mountPath": "/etc/nccl.conf", "subPath": "nccl.conf", "readOnly": True,
    }
    name = volume(daemonset, "nccl")["configMap"]["name"]
    [config_map] = [c for c in rendered.by_kind("ConfigMap") if c.manifest["metadata"]["name"] == name]
    lines = config_map.manifest["data"]["nccl.conf"].splitlines()
    assert lines[0].startswith("#") and lines[1:] == ["NCCL_IB_HCA=mlx5", "NCCL_SOCKET_IFNAME=eth0"]
    assert "/etc/nccl.conf" not in mounts(container(_daemonsets(rendered)["h100-shared"], "slurmd"))


def test_a_changed_nccl_setting_is_a_new_config_map_and_so_a_slurmd_roll():
    """NCCL's file is a subPath mount, which the kubelet never updates, so the ConfigMap is auto-named (the
    render names it as the provider does, with a random suffix): pulumi-kubernetes replaces an auto-named
    ConfigMap whose data changed (its enableConfigMapMutable is off by default), under a new name, which
    changes slurmd's pod template and so rolls slurmd through the rollout controller."""
    name = volume(_daemonsets(render_stack("prod"))["h100-a"], "nccl")["configMap"]["name"]
    assert re.fullmatch(r"dualsched-slurmd-h100-a-nccl-[0-9a-f]{8}", name), name


def test_a_runtime_class_reaches_slurmd_and_the_model_servers():
    def runtime_class(raw):
        raw["pools"][2]["runtimeClassName"] = "nvidia"
        raw["inference"]["runtimeClassName"] = "nvidia-cdi"

    rendered = render_raw(variant("prod", runtime_class))
    daemonsets = _daemonsets(rendered)
    assert pod_spec(daemonsets["h100-shared"])["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in pod_spec(daemonsets["h100-a"])
    servers = rendered.by_kind("Deployment")
    assert {pod_spec(d).get("runtimeClassName") for d in servers if d.manifest["metadata"]["namespace"] == "inference"} == {"nvidia-cdi"}


def test_a_joining_pools_slurmd_registers_as_a_dynamic_node_with_its_pools_node_line():
    """slurmd -Z --conf: the options of the pool's NodeName line as a listed pool would have it, the feature that puts
    it in the pool's NodeSet; its name is its Kubernetes node's."""
    rendered = render_raw(with_joining_pool(variant("dev", lambda raw: None)))  # dev: pool gpu, partitioned
    burst, gpu = (container(_daemonsets(rendered)[name], "slurmd")["command"] for name in ("burst", "gpu"))
    assert burst[-3:] == ["-Z", "--conf", "CPUs=32 RealMemory=128000 MemSpecLimit=1024 Gres=gpu:6 Features=burst"]
    assert burst[burst.index("-N") + 1] == "$(NODE_NAME)" and "-Z" not in gpu
    listed = next(line for line in render_slurm_files(rendered.config, kubernetes_site(rendered.config))["slurm.conf"].splitlines()
                  if line.startswith("NodeName=gpu-"))  # fmt: skip
    assert burst[-1].replace("Features=burst", "Features=gpu") in listed
