"""Node health (docs/health.md): slurm.healthCheck's config checks, what it renders (slurm.conf,
the slurmd pods' health ConfigMap, the cordon watcher and its RBAC), and the three programs
under sh/python with fake Slurm and Kubernetes. tests/slurm/test_node_health.py runs
node_health.sh and cordon_drain.sh against real daemons; tests/node/test_cordon_drain.py runs
the whole on the real node."""

from __future__ import annotations

import copy
import os
import subprocess
import urllib.error
from pathlib import Path
from typing import Any, Optional

import pytest

from dualsched.components.compute import SHARED_MOUNT, health_config_map_name
from dualsched.components.controller import CORDON_DIR, CORDON_WATCH, CORDON_WATCH_NODES, PROGRAMS_CONFIG_MAP, slurm_nodes
from dualsched.components.nodepools import GUARDED_POOL_LABEL, KEPT_BY_LABEL
from dualsched.components.programs import cordon_watch
from dualsched.components.programs import source
from dualsched.components.slurm_files import HEALTH_PROGRAM, HEALTH_SETTINGS_FILE, kubernetes_site, render_health_settings, render_slurm_files
from dualsched.config import ConfigError, parse_stack_config
from rendering import container, mounts, pod_spec, raw_stack, render_raw, render_stack, volume, with_joining_pool
from test_namespace import policies, rules

PROGRAMS = Path(__file__).resolve().parent.parent / "components" / "programs"


def with_health(raw: dict[str, Any], **health: Any) -> dict[str, Any]:
    changed = copy.deepcopy(raw)
    changed["slurm"]["healthCheck"] = health
    return changed


# ------------------------------------------------------------------------ config


def problems(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw)
    return str(caught.value)


def test_the_health_check_is_off_unless_asked_for(dev_config):
    health = dev_config.slurm.health_check
    assert not health.enabled and not health.drain_cordoned
    settings = [line for line in render_stack("dev").slurm_files["slurm.conf"].splitlines() if not line.startswith("#")]
    assert not [line for line in settings if line.startswith("HealthCheck")]


def test_meaningless_health_settings_are_reported_together(dev_raw):
    raw = with_health(
        dev_raw,
        enabled=True,
        nodeState=["any", "idle", "idle"],
        checks={"gpuDevices": False, "sharedMount": False, "munge": False, "nvidiaSmi": False},
    )
    text = problems(raw)
    assert "slurm.healthCheck.checks: the health check is enabled and every check is off (got " in text
    assert "slurm.healthCheck.nodeState[2]: is listed more than once (got 'idle')" in text
    assert "slurm.healthCheck.nodeState: any already covers alloc, mixed and idle: give any or some of them (got " in text


@pytest.mark.parametrize("field, value", [("interval", 5), ("interval", 86401), ("nodeState", ["busy"]), ("nodeState", [])])
def test_out_of_range_health_fields_name_their_path(dev_raw, field, value):
    assert f"slurm.healthCheck.{field}" in problems(with_health(dev_raw, enabled=True, **{field: value}))


def test_cycle_may_join_any_state(dev_raw):
    config = parse_stack_config(with_health(dev_raw, enabled=True, nodeState=["idle", "mixed", "cycle"]))
    assert "HealthCheckNodeState=IDLE,MIXED,CYCLE\n" in render_site_conf(config)


def render_site_conf(config) -> str:
    return render_slurm_files(config, kubernetes_site(config))["slurm.conf"]


# ------------------------------------------------------------------------ rendering


def test_prod_runs_the_health_program_from_the_slurmd_pods_config_map():
    rendered = render_stack("prod")
    conf = rendered.slurm_files["slurm.conf"]
    assert "HealthCheckProgram=/etc/dualsched/health/node_health.sh\n" in conf
    assert "HealthCheckInterval=300\nHealthCheckNodeState=ANY,CYCLE\n" in conf
    for pool in rendered.config.slurm_pools:
        files = rendered.named("ConfigMap", health_config_map_name(pool), "slurm").manifest["data"]
        assert files[HEALTH_PROGRAM] == source(HEALTH_PROGRAM)
        assert files[HEALTH_SETTINGS_FILE] == render_health_settings(rendered.config, pool, kubernetes_site(rendered.config))
        assert f"GPUS={pool.slurm_gpu_count}\n" in files[HEALTH_SETTINGS_FILE]
        daemonset = next(d for d in rendered.by_kind("DaemonSet") if d.manifest["metadata"]["labels"].get("dualsched.io/pool") == pool.name)
        # slurmd execs it: executable, read-only, where slurm.conf says
        assert volume(daemonset, "health")["configMap"] == {"name": health_config_map_name(pool), "defaultMode": 0o555}
        assert mounts(container(daemonset, "slurmd"))["/etc/dualsched/health"] == {
            "name": "health", "mountPath": "/etc/dualsched/health", "readOnly": True,
        }


def test_settings_point_at_the_configless_cache_gpus_and_shared_mount(prod_config):
    site = kubernetes_site(prod_config)
    settings = render_health_settings(prod_config, prod_config.slurm_pools[0], site)
    assert f"SLURM_CONF={site.slurmd_spool_dir}/conf-cache/slurm.conf\n" in settings
    assert "GPU_DEVICE_PREFIX=/dev/nvidia\n" in settings
    assert site.shared_dir == SHARED_MOUNT  # the check tests the directory the claim is mounted on


def test_only_the_cordon_watcher_holds_a_token_and_it_may_only_get_the_pool_nodes():
    rendered = render_stack("prod")
    statefulset = rendered.named("StatefulSet", "slurmctld", "slurm")
    spec = pod_spec(statefulset)
    assert spec["automountServiceAccountToken"] is False
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    holders = [c["name"] for c in spec["containers"] + spec.get("initContainers", []) if token_dir in mounts(c)]
    assert holders == ["cordon-watch"]
    watcher = container(statefulset, "cordon-watch")
    assert watcher["securityContext"]["readOnlyRootFilesystem"] is True
    assert mounts(watcher)[CORDON_DIR]["name"] == "cordon" and mounts(watcher)[token_dir]["readOnly"] is True
    [role] = [r for r in rendered.by_kind("ClusterRole") if "slurmctld-node-reader" in r.name]
    assert role.manifest["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "resourceNames": slurm_nodes(rendered.config), "verbs": ["get"]}
    ]
    [binding] = [b for b in rendered.by_kind("ClusterRoleBinding") if "slurmctld-node-reader" in b.name]
    assert binding.manifest["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": "slurm"}]
    programs = rendered.named("ConfigMap", PROGRAMS_CONFIG_MAP, "slurm").manifest["data"]
    assert programs[CORDON_WATCH] == source(CORDON_WATCH)
    assert programs[CORDON_WATCH_NODES].split() == slurm_nodes(rendered.config)


def test_the_watcher_gets_a_joining_pools_bound_by_name_with_the_labels_of_its_members():
    rendered = render_raw(with_joining_pool(raw_stack("dev"), nodes="burst-[001-002]"))
    watched = rendered.named("ConfigMap", PROGRAMS_CONFIG_MAP, "slurm").manifest["data"][CORDON_WATCH_NODES]
    members = f"{GUARDED_POOL_LABEL}=burst,{KEPT_BY_LABEL}=slurm"
    assert watched == f"burst-001 {members}\nburst-002 {members}\ngpu-001\ngpu-002\n"
    [role] = [r for r in rendered.by_kind("ClusterRole") if "slurmctld-node-reader" in r.name]
    assert role.manifest["rules"][0]["resourceNames"] == ["burst-001", "burst-002", "gpu-001", "gpu-002"]
    loop = container(rendered.named("StatefulSet", "slurmctld", "slurm"), "reconfigure")["command"][-1]
    assert f"cordon_drain.sh {CORDON_DIR}/cordoned {CORDON_DIR}/left;" in loop


def test_without_drain_cordoned_no_watcher_account_or_role():
    rendered = render_stack("dev")
    spec = pod_spec(rendered.named("StatefulSet", "slurmctld", "slurm"))
    # "default" named, not omitted: the API server would copy the defaulted serviceAccount of an earlier
    # watcher's template back into an omitted name, and slurmctld-0 could not be created (the account is gone)
    assert spec["serviceAccountName"] == "default" and "cordon-watch" not in [c["name"] for c in spec["containers"]]
    assert not [r for r in rendered.by_kind("ClusterRole") if "node-reader" in r.name]


# ------------------------------------------------------------------------ fakes for the programs


def fake_scontrol(bin_dir: Path, records: dict[str, tuple[str, Optional[str]]], log: Path) -> None:
    """`scontrol show node [--oneliner] [NAME]` prints the records; `scontrol update ...` is logged."""
    lines = []
    for name, (state, reason) in records.items():
        tail = f" Reason={reason} [root@2026-12-03T10:00:00]" if reason else ""
        lines.append(f"NodeName={name} Arch=x86_64 CPUTot=2 State={state} ThreadsPerCore=1 Partitions=gpu{tail}")
    (bin_dir / "records").write_text("\n".join(lines) + "\n")
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = update ]; then shift; echo "$*" >> {log}; exit 0; fi\n'
        f'if [ "$1" = delete ]; then echo "$*" >> {log}; exit 0; fi\n'
        f'name=$4; if [ -z "$name" ]; then cat {bin_dir}/records; else grep "^NodeName=$name " {bin_dir}/records; fi\n'
    )
    script.chmod(0o755)


def updates(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# ------------------------------------------------------------------------ node_health.sh


@pytest.fixture
def node(tmp_path: Path):
    """node_health.sh in a directory with its settings; GPUs are two device-like files; munge faked."""
    directory = tmp_path / "health"
    directory.mkdir()
    program = directory / HEALTH_PROGRAM
    program.write_text(source(HEALTH_PROGRAM))
    program.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("munge", "unmunge"):
        (bin_dir / tool).write_text("#!/bin/sh\ncat >/dev/null; echo credential\n")
        (bin_dir / tool).chmod(0o755)
    devices = tmp_path / "dev"
    devices.mkdir()

    class Node:
        log = tmp_path / "updates"

        def settings(self, gpus_present: int, gpus: int = 2, shared: str = "/nonexistent", check_shared: int = 0) -> None:
            for index in range(gpus_present):
                os.mknod(devices / f"gpu{index}", 0o600 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
            (directory / HEALTH_SETTINGS_FILE).write_text(
                f"SLURM_CONF=/nonexistent\nCHECK_GPU_DEVICES=1\nGPU_DEVICE_PREFIX={devices}/gpu\nGPUS={gpus}\n"
                f"CHECK_SHARED_MOUNT={check_shared}\nSHARED_DIR={shared}\nCHECK_MUNGE=1\nCHECK_NVIDIA_SMI=1\n"
            )

        def run(self, state: str, reason: Optional[str] = None, unknown: bool = False) -> subprocess.CompletedProcess:
            fake_scontrol(bin_dir, {} if unknown else {"gpu-001": (state, reason)}, self.log)
            env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "gpu-001"}
            return subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=60)

    if os.geteuid() != 0:
        pytest.fail("the health check's tests make device files (mknod): run them as root, as CI does")
    return Node()


def test_a_failed_check_drains_an_undrained_node_with_what_failed(node):
    node.settings(gpus_present=1)
    result = node.run("MIXED")
    assert result.returncode == 1
    assert updates(node.log) == [f"NodeName=gpu-001 State=DRAIN Reason=dualsched:health: gpu devices: 1 of 2 {node.log.parent}/dev/gpuN"]


def test_every_failed_check_is_in_the_reason(node):
    node.settings(gpus_present=0, check_shared=1)
    node.run("IDLE")
    assert updates(node.log) == [
        f"NodeName=gpu-001 State=DRAIN Reason=dualsched:health: gpu devices: 0 of 2 {node.log.parent}/dev/gpuN; /nonexistent not mounted"
    ]


@pytest.mark.parametrize("reason", ["admin: new firmware", "dualsched:upgrade: 22.05 to 23.02", "dualsched:cordon", "dualsched:health: munge"])
def test_a_failed_check_leaves_a_drained_node_as_it_is(node, reason):
    node.settings(gpus_present=1)
    assert node.run("IDLE+DRAIN", reason).returncode == 1
    assert updates(node.log) == []


def test_passing_checks_resume_only_the_health_checks_own_drain(node):
    node.settings(gpus_present=2)
    assert node.run("MIXED+DRAIN", "dualsched:health: gpu devices: 1 of 2 /dev/nvidiaN").returncode == 0
    assert updates(node.log) == ["NodeName=gpu-001 State=RESUME"]


@pytest.mark.parametrize(
    "state, reason",
    [("IDLE", None), ("IDLE+DRAIN", "admin: dualsched:health is fine"), ("IDLE+DRAIN", "dualsched:upgrade"), ("ALLOCATED+DRAIN", "dualsched:cordon")],
)
def test_passing_checks_touch_nothing_else(node, state, reason):
    node.settings(gpus_present=3)  # more device files than Slurm counts (a privileged slurmd) is healthy
    assert node.run(state, reason).returncode == 0
    assert updates(node.log) == []


def test_a_node_scontrol_cannot_read_fails_only_when_a_check_failed(node):
    node.settings(gpus_present=2)
    assert node.run("IDLE", unknown=True).returncode == 0  # nothing to resume, the next round acts
    (node.log.parent / "dev" / "gpu1").unlink()
    failed = node.run("IDLE", unknown=True)
    assert failed.returncode == 1 and "not drained: gpu devices: 1 of 2" in failed.stdout
    assert updates(node.log) == []


def test_a_mounted_writable_directory_passes_the_shared_check(node, tmp_path):
    node.settings(gpus_present=2, shared="/dev/shm", check_shared=1)  # a tmpfs mount, writable by root
    assert node.run("IDLE").returncode == 0, node.run("IDLE").stdout
    assert updates(node.log) == []


# ------------------------------------------------------------------------ cordon_drain.sh


def run_cordon_drain(
    tmp_path: Path, records: dict[str, tuple[str, Optional[str]]], listed: Optional[list[str]], left: Optional[list[str]] = None
) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "updates"
    fake_scontrol(bin_dir, records, log)
    cordoned, gone = tmp_path / "cordoned", tmp_path / "left"
    for path, names in ((cordoned, listed), (gone, left)):
        if names is not None:
            path.write_text("".join(f"{name}\n" for name in names))
    result = subprocess.run(
        ["sh", str(PROGRAMS / "cordon_drain.sh"), str(cordoned), str(gone)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return updates(log)


def test_cordoned_nodes_drain_and_uncordoned_ones_resume_only_from_the_cordon_reason(tmp_path):
    records = {
        "gpu-001": ("ALLOCATED", None),  # cordoned now: drained, its job runs on
        "gpu-002": ("IDLE+DRAIN", "dualsched:cordon"),  # still cordoned: nothing
        "gpu-003": ("MIXED+DRAIN", "dualsched:cordon"),  # uncordoned: resumed
        "gpu-004": ("IDLE+DRAIN", "admin: new firmware"),  # an admin's: never resumed, even when not cordoned
        "gpu-005": ("IDLE+DRAIN", "dualsched:health: munge"),  # cordoned, drained already: left alone
        "gpu-006": ("IDLE+DRAIN", "dualsched:cordoned-by-someone-else"),  # another reason with our prefix: left alone
        "gpu-0010": ("IDLE", None),  # a name that gpu-001 is a prefix of: not cordoned
    }
    assert run_cordon_drain(tmp_path, records, ["gpu-001", "gpu-002", "gpu-005"]) == [
        "NodeName=gpu-001 State=DRAIN Reason=dualsched:cordon",
        "NodeName=gpu-003 State=RESUME",
    ]


def test_a_node_that_left_its_pool_is_drained_then_deleted_once_no_job_runs_there(tmp_path):
    records = {
        "burst-1": ("ALLOCATED", None),  # just left, a job on it: drained, the job runs on
        "burst-2": ("MIXED+DRAIN", "dualsched:left"),  # its job still runs: nothing yet
        "burst-3": ("IDLE+DRAIN", "dualsched:left"),  # no job left: deleted
        "burst-4": ("DOWN+DRAIN+NOT_RESPONDING", "dualsched:cordon"),  # cordoned, then gone from Kubernetes: deleted
        "burst-5": ("IDLE+COMPLETING+DRAIN", "dualsched:left"),  # its job's epilog runs: not yet
        "burst-6": ("IDLE+DRAIN", "dualsched:left"),  # labelled back before it was deleted: resumed
        "burst-7": ("IDLE+DRAIN", "dualsched:left"),  # back, but cordoned meanwhile: stays drained
        "gpu-001": ("IDLE", None),  # a listed node: never deleted
    }
    assert run_cordon_drain(tmp_path, records, ["burst-7"], left=["burst-1", "burst-2", "burst-3", "burst-4", "burst-5"]) == [
        "NodeName=burst-1 State=DRAIN Reason=dualsched:left",
        "delete NodeName=burst-3",
        "delete NodeName=burst-4",
        "NodeName=burst-6 State=RESUME",
    ]


def test_without_the_watchers_list_nothing_changes(tmp_path):
    assert run_cordon_drain(tmp_path, {"gpu-001": ("IDLE+DRAIN", "dualsched:cordon")}, listed=None) == []


# ------------------------------------------------------------------------ resume_registered.sh


def run_resume_registered(tmp_path: Path, drained: list[str]) -> list[str]:
    """resume_registered.sh with a fake `sinfo` that prints ``drained`` (its ``%N|%T|%E`` lines) and a fake
    `scontrol update` that logs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "updates"
    fake_scontrol(bin_dir, {}, log)
    (bin_dir / "drained").write_text("".join(f"{line}\n" for line in drained))
    sinfo = bin_dir / "sinfo"
    sinfo.write_text(f'#!/bin/sh\n[ "$*" = "--noheader --Node --states=drain --format=%N|%T|%E" ] || exit 2\ncat {bin_dir}/drained\n')
    sinfo.chmod(0o755)
    result = subprocess.run(
        ["sh", str(PROGRAMS / "resume_registered.sh")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return updates(log)


def test_only_a_valid_registration_after_slurms_own_mismatch_reason_resumes_a_node(tmp_path):
    """A pool change's new slurmd pod registered before slurmctld read the new slurm.conf: Slurm's own reasons
    (src/slurmctld/node_mgr.c, src/interfaces/gres.c) and a drain that outlives the mismatch."""
    drained = [
        "gpu-001|drained|gres/gpu count reported lower than configured (2 < 4)",  # valid now: resumed
        "gpu-001|drained|gres/gpu count reported lower than configured (2 < 4)",  # the same node in another partition
        "gpu-002|inval|gres/gpu count reported lower than configured (7 < 8)",  # still registers short: left drained
        "gpu-003|draining|Low RealMemory (reported:1024 < 100.00% of configured:2048)",  # valid now: resumed
        "gpu-004|drained|Low socket*core*thread count, Low CPUs",  # valid now: resumed
        "gpu-005|drained|admin: Low CPUs after the firmware update",  # an admin's words: left alone
        "gpu-006|drained|dualsched:cordon",  # cordon_drain.sh's: left alone
    ]
    assert run_resume_registered(tmp_path, drained) == ["NodeName=gpu-001 State=RESUME", "NodeName=gpu-003 State=RESUME",
                                                        "NodeName=gpu-004 State=RESUME"]  # fmt: skip


# ------------------------------------------------------------------------ cordon_watch.py


def watch(tmp_path: Path, listed: str, get_node, log=print) -> tuple[bool, str, str]:
    """One watcher round over ``listed`` (the ConfigMap's list): whether it wrote, then the cordoned and the left lists."""
    nodes_file, out, left = tmp_path / "watched", tmp_path / "cordoned", tmp_path / "left"
    nodes_file.write_text(listed)
    wrote = cordon_watch.run_round(str(nodes_file), get_node, str(out), str(left), log)
    return wrote, out.read_text() if out.exists() else "", left.read_text() if left.exists() else ""


def test_the_watcher_lists_unschedulable_nodes_and_keeps_the_list_when_a_read_fails(tmp_path):
    nodes = {"a": {"spec": {"unschedulable": True}}, "b": {"spec": {}}, "c": None}
    assert watch(tmp_path, "a\nb\nc\n", nodes.get) == (True, "a\n", "")

    def flaky(name: str):
        if name == "b":
            raise urllib.error.URLError("connection refused")
        return {"spec": {}}

    logged: list[str] = []
    assert watch(tmp_path, "a\nb\n", flaky, logged.append) == (False, "a\n", "")
    assert "the lists stay as they were" in logged[0]
    assert not (tmp_path / "cordoned.partial").exists()


def test_the_watcher_reads_its_list_each_round_so_a_pool_change_reaches_it_without_a_restart(tmp_path):
    """From Slurm 23.11 a pool change restarts no controller pod: the kubelet swaps the new list into the mounted
    ConfigMap, and the next round watches the new node."""
    nodes = {"a": {"spec": {}}, "b": {"spec": {"unschedulable": True}}}
    assert watch(tmp_path, "a\n", nodes.get) == (True, "", "")
    assert watch(tmp_path, "a\nb\n", nodes.get) == (True, "b\n", "")


def test_the_watcher_lists_the_joining_nodes_without_their_member_labels_as_left(tmp_path):
    """A node of a pool whose nodes join by label is a member while it carries the keeper's labels for the pool and
    this stack: one that lost them, carries another pool's or stack's, or is not in the cluster, left."""
    members = {GUARDED_POOL_LABEL: "burst", KEPT_BY_LABEL: "slurm"}
    listed = "gpu-001\n" + "".join(f"burst-{k} {GUARDED_POOL_LABEL}=burst,{KEPT_BY_LABEL}=slurm\n" for k in range(1, 6))
    assert cordon_watch.parse_watched(listed)[1] == cordon_watch.Watched("burst-1", members)
    nodes = {
        "gpu-001": {"metadata": {"labels": {}}, "spec": {}},  # a listed node: never left
        "burst-1": {"metadata": {"labels": {**members, "other": "x"}}, "spec": {"unschedulable": True}},  # cordoned member
        "burst-2": {"metadata": {"labels": {KEPT_BY_LABEL: "slurm"}}, "spec": {}},  # released by the keeper
        "burst-3": {"metadata": {"labels": {**members, KEPT_BY_LABEL: "other-stack"}}, "spec": {}},
        "burst-4": None,  # deleted, or never joined
        "burst-5": {"metadata": {"labels": members}, "spec": {}},
    }
    assert watch(tmp_path, listed, nodes.get) == (True, "burst-1\n", "burst-2\nburst-3\nburst-4\n")


def test_slurmctld_may_reach_the_api_server_only_for_the_cordon_watcher():
    with_watcher = rules(policies(render_stack("prod"), "slurm")["slurmctld"], "egress")
    assert with_watcher[443] == with_watcher[6443] == {"ip:10.9.0.0/28"}  # prod's apiServerCidrs
    without = rules(policies(render_stack("dev"), "slurm")["slurmctld"], "egress")
    assert not {443, 6443} & set(without)
