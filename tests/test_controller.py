"""SlurmController: slurmctld StatefulSet, headless Service, state claim, probes, restart hash, reconfigure sidecar
and the window reservations program it runs."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from dualsched.components.identity import users_annotation
from dualsched.components.controller import (
    ACCOUNTING_BEFORE_STOP, ACCOUNTING_STATE, ACCOUNTING_WAIT_LIMIT, CONFIG_HASH_ANNOTATION, CORDON_DIR, CORDON_DRAIN, CORDON_WATCH_NODES, PROGRAMS_CONFIG_MAP,
    RECONFIGURE_INTERVAL, WINDOW_RESERVATIONS, controller_programs, reconfigure_loop,
)
from dualsched.components.identity import SLURM_UID
from dualsched.components.programs import source
from dualsched.components.slurm_config import CONFIG_DIR
from dualsched.components.submission import PROGRAM_DIR
from dualsched.components.slurm_files import restart_hash
from rendering import at_release, container, mounts, pod_spec, render_raw, render_stack, variant, volume


def _statefulset(rendered):
    return rendered.named("StatefulSet", "slurmctld", "slurm")


def _state_claim(rendered):
    return rendered.one("PersistentVolumeClaim", "slurmctld-state")


def _conf_value(rendered, key: str) -> str:
    return re.search(rf"^{key}=(.*)$", rendered.slurm_files["slurm.conf"], re.M).group(1)


def _add_partition(raw):
    raw["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "00:30:00"})


def _more_memory(raw):
    raw["pools"][0]["realMemoryMb"] = 200000


def _annotation(rendered) -> str:
    return _statefulset(rendered).manifest["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_headless_service_gives_the_pods_stable_dns(stack):
    rendered = render_stack(stack)
    service = rendered.named("Service", "slurmctld", "slurm").manifest
    statefulset = _statefulset(rendered).manifest
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [{"name": "slurmctld", "port": 6817, "targetPort": 6817}]
    assert statefulset["spec"]["serviceName"] == "slurmctld"
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == pod_labels == statefulset["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(("stack", "replicas"), [("dev", 1), ("prod", 2)])
def test_one_replica_or_two_with_ha(stack, replicas):
    rendered = render_stack(stack)
    assert rendered.config.slurm.controller.ha is (replicas == 2)
    assert _statefulset(rendered).manifest["spec"]["replicas"] == replicas
    assert len(re.findall(r"^SlurmctldHost=", rendered.slurm_files["slurm.conf"], re.M)) == replicas


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_state_claim_is_mounted_at_state_save_location(stack):
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered)
    claim = _state_claim(rendered)
    assert claim.namespace == "slurm"
    assert volume(statefulset, "state")["persistentVolumeClaim"] == {"claimName": claim.name}
    state_dir = _conf_value(rendered, "StateSaveLocation")
    assert mounts(container(statefulset, "slurmctld"))[state_dir]["name"] == "state"


def test_state_claim_size_class_and_access_mode_come_from_config():
    dev = _state_claim(render_stack("dev")).manifest["spec"]
    prod = _state_claim(render_stack("prod")).manifest["spec"]
    assert dev["resources"]["requests"] == {"storage": "5Gi"}
    assert dev["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in dev  # the cluster default
    # HA: both controllers share the state, so it must be ReadWriteMany.
    assert prod["resources"]["requests"] == {"storage": "50Gi"}
    assert prod["accessModes"] == ["ReadWriteMany"]
    assert prod["storageClassName"] == "lustre-rwx"


@pytest.mark.parametrize(("stack", "protect"), [("dev", False), ("prod", True)])
def test_state_claim_survives_the_program(stack, protect):
    rendered = render_stack(stack)
    registration = rendered.registration(_state_claim(rendered))
    assert registration.retain_on_delete is True
    assert registration.protect is protect


@pytest.mark.parametrize(("stack", "protect"), [("dev", False), ("prod", True)])
def test_state_claim_namespace_is_kept_too(stack, protect):
    """Deleting a namespace deletes every claim in it: a retained claim survives a destroy only in a
    namespace that is retained as well (docs/deploy.md, "Data that outlives the program")."""
    rendered = render_stack(stack)
    namespace = rendered.named("Namespace", _state_claim(rendered).namespace)
    registration = rendered.registration(namespace)
    assert registration.retain_on_delete is True
    assert registration.protect is protect


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_probes_and_config_mount(stack):
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered)
    slurmctld = container(statefulset, "slurmctld")
    assert slurmctld["startupProbe"]["tcpSocket"] == {"port": 6817}
    assert slurmctld["livenessProbe"]["tcpSocket"] == {"port": 6817}
    assert slurmctld["readinessProbe"]["exec"]["command"] == ["scontrol", "ping"]
    assert slurmctld["command"][:2] == ["slurmctld", "-D"]
    assert slurmctld["image"] == rendered.config.images.slurmctld
    config_map = rendered.one("ConfigMap", "slurm-config")
    assert volume(statefulset, "slurm-config")["configMap"] == {"name": config_map.name}
    assert mounts(slurmctld)["/etc/slurm"] == {"name": "slurm-config", "mountPath": "/etc/slurm", "readOnly": True}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_resources_come_from_config(stack):
    rendered = render_stack(stack)
    resources = rendered.config.slurm.controller.resources
    actual = container(_statefulset(rendered), "slurmctld")["resources"]
    assert actual == {
        "requests": {"cpu": resources.requests.cpu, "memory": resources.requests.memory},
        "limits": {"cpu": resources.limits.cpu, "memory": resources.limits.memory},
    }
    if stack == "prod":
        assert actual["limits"] == {"cpu": "8", "memory": "32Gi"}


def test_runs_as_the_slurm_user_without_privilege():
    statefulset = _statefulset(render_stack("dev"))
    context = container(statefulset, "slurmctld")["securityContext"]
    assert context["runAsUser"] == SLURM_UID and context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "privileged" not in context
    assert pod_spec(statefulset)["automountServiceAccountToken"] is False


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_restart_hash_annotation_is_the_restart_hash_of_the_rendered_files(stack):
    rendered = render_stack(stack)
    annotations = _statefulset(rendered).manifest["spec"]["template"]["metadata"]["annotations"]
    assert CONFIG_HASH_ANNOTATION == "dualsched.io/slurm-restart-hash"
    assert annotations == {CONFIG_HASH_ANNOTATION: restart_hash(rendered.slurm_files, rendered.config.slurm.release_version),
                           **users_annotation(rendered.config)}
    assert annotations[CONFIG_HASH_ANNOTATION] == rendered.outputs_of("dualsched:slurm_config:SlurmConfig")["restart_hash"]
    # Not the digest of all the files: that would roll slurmctld for every partition change.
    assert annotations[CONFIG_HASH_ANNOTATION] != rendered.render.slurm_conf_hash


def test_adding_a_partition_rolls_neither_the_controller_nor_slurmd():
    """A partition is applied by `scontrol reconfigure` (the reconfigure sidecar), not by a restart."""
    before, after = render_stack("dev"), render_raw(variant("dev", _add_partition))
    assert after.render.slurm_conf_hash != before.render.slurm_conf_hash
    config_before = before.named("ConfigMap", "slurm-config", "slurm")
    config_after = after.named("ConfigMap", "slurm-config", "slurm")
    assert "PartitionName=debug" in config_after.manifest["data"]["slurm.conf"]
    assert config_after.manifest["data"] != config_before.manifest["data"]
    # slurmctld's StatefulSet does not change at all: same annotation, same ConfigMap name.
    assert _statefulset(after).manifest == _statefulset(before).manifest
    # Configless: slurmd fetches slurm.conf from slurmctld, so its DaemonSet does not change at all.
    [daemonset_before], [daemonset_after] = before.by_kind("DaemonSet"), after.by_kind("DaemonSet")
    assert daemonset_after.manifest == daemonset_before.manifest


def test_a_node_line_change_leaves_the_controller_running_on_releases_that_reconfigure_nodes():
    """Slurm 23.11 and later take node changes by `scontrol reconfigure` (the reconfigure sidecar)."""
    before, after = render_stack("dev"), render_raw(variant("dev", _more_memory))
    node_line = [line for line in after.slurm_files["slurm.conf"].splitlines() if line.startswith("NodeName=")]
    assert node_line and " RealMemory=200000 " in node_line[0] and after.config.slurm.release == "25.11"
    assert _statefulset(after).manifest == _statefulset(before).manifest


def test_a_node_line_change_rolls_the_controller_before_23_11():
    def at_22_05(raw):
        at_release(raw, "22.05")

    before = render_raw(variant("dev", at_22_05))
    after = render_raw(variant("dev", lambda raw: (at_22_05(raw), _more_memory(raw))))
    assert _annotation(after) != _annotation(before)
    assert _annotation(after) == restart_hash(after.slurm_files, (22, 5))
    # Only the annotation changed in the controller's pod template.
    template_before = _statefulset(before).manifest["spec"]["template"]
    template_after = _statefulset(after).manifest["spec"]["template"]
    assert template_after["spec"] == template_before["spec"]


def test_a_cgroup_change_rolls_the_controller():
    after = render_raw(variant("dev", lambda raw: raw["slurm"].update(cgroupVersion="v1")))
    assert after.slurm_files["slurm.conf"] == render_stack("dev").slurm_files["slurm.conf"]
    assert _annotation(after) != _annotation(render_stack("dev"))


# ------------------------------------------------------------------ reconfigure sidecar


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_reconfigure_sidecar_watches_the_config_and_talks_to_slurmctld(stack):
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered)
    metrics = ["metrics-collector", "exporter"] if rendered.config.slurm.metrics.enabled else []  # tests/test_metrics.py
    watch = ["cordon-watch"] if rendered.config.slurm.health_check.drain_cordoned else []  # tests/test_health.py
    assert [c["name"] for c in pod_spec(statefulset)["containers"]] == ["slurmctld", "reconfigure", *metrics, *watch]
    reconfigure = container(statefulset, "reconfigure")
    assert reconfigure["image"] == rendered.config.images.slurmctld
    loop = reconfigure_loop(rendered.config.slurm.controller.slurmctld_timeout, rendered.config.slurm.release_version)
    assert reconfigure["command"] == ["sh", "-c", loop]
    assert "scontrol reconfigure" in loop and f"{CONFIG_DIR}/*.conf" in loop
    assert reconfigure["env"] == [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}]
    found = mounts(reconfigure)
    assert found["/etc/slurm"] == {"name": "slurm-config", "mountPath": "/etc/slurm", "readOnly": True}
    assert found["/run/munge"]["name"] == "munge-socket"
    assert found["/etc/passwd"]["name"] == found["/etc/group"]["name"] == "identity"
    assert found["/opt/dualsched"] == {"name": "programs", "mountPath": "/opt/dualsched", "readOnly": True}
    # It never sees the state, the key or anything writable but the socket it connects to.
    cordoned = {CORDON_DIR} if watch else set()
    assert set(found) == {"/etc/slurm", "/opt/dualsched", "/run/munge", "/etc/passwd", "/etc/group", *cordoned}
    assert all(found[path]["readOnly"] for path in cordoned)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_reconfigure_sidecar_runs_the_window_reservations_program_from_a_fixed_config_map(stack):
    """Mounted by its fixed name as a directory: a new script reaches the sidecar in place, never rolling slurmctld."""
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered)
    programs = rendered.named("ConfigMap", PROGRAMS_CONFIG_MAP, "slurm")
    assert {WINDOW_RESERVATIONS, ACCOUNTING_STATE, CORDON_DRAIN} <= set(controller_programs(rendered.config))  # and the exporter's with metrics
    programs_data = {name: text for name, text in programs.manifest["data"].items() if name != CORDON_WATCH_NODES}
    assert programs_data == {name: source(name) for name in controller_programs(rendered.config)}
    assert volume(statefulset, "programs")["configMap"] == {"name": PROGRAMS_CONFIG_MAP}
    assert f"sh /opt/dualsched/{WINDOW_RESERVATIONS} /etc/slurm/window-reservations;" in reconfigure_loop(120, (25, 11))
    assert f"sh /opt/dualsched/{ACCOUNTING_STATE} /etc/slurm/accounting-state;" in reconfigure_loop(120, (25, 11))
    assert rendered.registration(programs).urn in rendered.registration(statefulset).dependencies  # mounted once it exists


def test_reconfigure_sidecar_is_small_and_unprivileged():
    reconfigure = container(_statefulset(render_stack("dev")), "reconfigure")
    context = reconfigure["securityContext"]
    assert context["runAsUser"] == SLURM_UID and context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert reconfigure["resources"] == {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}


PING = "Slurmctld(primary) at slurmctld-0 is {primary}\nSlurmctld(backup) at slurmctld-1 is UP"
"""`scontrol ping` with two controllers (the format of scontrol.c, 22.05 to 26.05)."""


def _run_loop(tmp_path: Path, scontrol_exit: str, host: str = "slurmctld-0", primary: str = "UP", slurmctld_timeout: int = 120,
              release: tuple[int, int] = (22, 5)):
    """The reconfigure loop under sh in the pod ``host``, against a temp config dir, with a fake scontrol (whose
    `ping` finds the primary ``primary``), a fake window reservations program and a short sleep."""
    conf, programs, bin_dir, log = tmp_path / "etc-slurm", tmp_path / "programs", tmp_path / "bin", tmp_path / "scontrol.log"
    for directory in (conf, programs, bin_dir):
        directory.mkdir(parents=True)
    for name in ("slurm.conf", "gres.conf", "cgroup.conf", "window-reservations"):
        (conf / name).write_text(f"# {name}\n")
    scontrol = bin_dir / "scontrol"
    ping = PING.format(primary=primary)
    scontrol.write_text(f'#!/bin/sh\n[ "$1" = ping ] && {{ printf "{ping}\\n"; exit 0; }}\necho "$@" >> {log}\n{scontrol_exit}\n')
    scontrol.chmod(0o755)
    (programs / WINDOW_RESERVATIONS).write_text(f'echo "windows $1" >> {log}\n')
    script = reconfigure_loop(slurmctld_timeout, release).replace(f"{CONFIG_DIR}/", f"{conf}/").replace(f"{PROGRAM_DIR}/", f"{programs}/")
    assert script.count("$(uname -n)") == 2
    script = script.replace("$(uname -n)", host)
    sleep = f"sleep {RECONFIGURE_INTERVAL};"
    assert script.count(sleep) == 1
    # Mark when the first checksum is taken (a change before it would be the baseline), and poll fast.
    ready = tmp_path / "ready"
    script = script.replace(sleep, f"touch {ready}; sleep 0.1;")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    process = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert _wait_for(ready.exists), "the loop never started"
    return process, conf, log


def _update(path: Path, text: str) -> None:
    """As the kubelet updates a ConfigMap volume: the new file appears whole (a rename), never truncated
    first (a loop round reading the empty file between would see two changes)."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(text)
    os.replace(staged, path)


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _reconfigures(log: Path) -> list[str]:
    return [call for call in _calls(log) if not call.startswith("windows ")]


def _windows(log: Path) -> list[str]:
    return [call for call in _calls(log) if call.startswith("windows ")]


def _wait_for(predicate, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_reconfigure_loop_reconfigures_once_slurmctld_answers_after_the_pod_starts_before_23_11(tmp_path):
    """A slurmctld restarted by a node change (before 23.11) pushes no files to configless slurmd: the first round does."""
    process, conf, log = _run_loop(tmp_path, "exit 0")
    try:
        assert _wait_for(lambda: _reconfigures(log) == ["reconfigure"])
        time.sleep(0.6)
        assert _reconfigures(log) == ["reconfigure"]  # once: the files are now seen
    finally:
        process.kill()
        process.wait()


def test_from_23_11_the_loop_starts_from_the_files_as_they_are_and_reconfigures_once_per_change(tmp_path):
    """From 23.11 a reconfigure starts slurmctld anew in place: one at its start, as the slurmd register, left a node
    registered by its name (the multi-node tier's 24.11 module). A node change alone is a reconfigure there."""
    process, conf, log = _run_loop(tmp_path, "exit 0", release=(23, 11))
    try:
        time.sleep(0.6)
        assert _reconfigures(log) == [] and _windows(log)  # its rounds run, without a reconfigure
        _update(conf / "slurm.conf", "PartitionName=debug\n")
        assert _wait_for(lambda: _reconfigures(log) == ["reconfigure"])
        time.sleep(0.6)
        assert _reconfigures(log) == ["reconfigure"]
    finally:
        process.kill()
        process.wait()


def test_only_the_controller_in_charge_reconfigures_and_a_backup_once_it_takes_over(tmp_path):
    """Both pods' sidecars see the same files; two reconfigures at once stalled 24.11's primary while the first
    restarted it in place (the multi-node tier). The backup's sidecar does nothing while the primary is up, nor while
    it has been down for less than SlurmctldTimeout (a primary restarting itself in place), only once it takes over."""
    backup, _, backup_log = _run_loop(tmp_path / "backup", "exit 0", host="slurmctld-1")
    restarting, _, restarting_log = _run_loop(tmp_path / "restarting", "exit 0", host="slurmctld-1", primary="DOWN")
    took_over, _, took_over_log = _run_loop(tmp_path / "took-over", "exit 0", host="slurmctld-1", primary="DOWN", slurmctld_timeout=1)
    try:
        assert _wait_for(lambda: _reconfigures(took_over_log) == ["reconfigure"])  # after more than 1 s
        time.sleep(0.6)
        assert _reconfigures(took_over_log) == ["reconfigure"]
        assert _reconfigures(backup_log) == [] and _reconfigures(restarting_log) == []
        # nor does it run the round's programs: a window reservation or a QOS made by both at once fails one
        assert _windows(took_over_log) and _windows(backup_log) == [] and _windows(restarting_log) == []
    finally:
        for process in (backup, restarting, took_over):
            process.kill()
            process.wait()


def test_reconfigure_loop_reconfigures_once_per_change(tmp_path):
    process, conf, log = _run_loop(tmp_path, "exit 0")
    try:
        assert _wait_for(lambda: _reconfigures(log) == ["reconfigure"])  # at start
        _update(conf / "slurm.conf", "PartitionName=debug\n")
        assert _wait_for(lambda: _reconfigures(log) == ["reconfigure"] * 2)
        time.sleep(0.6)
        assert _reconfigures(log) == ["reconfigure"] * 2  # the change is applied once
        _update(conf / "cgroup.conf", "CgroupPlugin=cgroup/v1\n")
        assert _wait_for(lambda: _reconfigures(log) == ["reconfigure"] * 3)
        _update(conf / "window-reservations", "ReservationName=dualsched-window-gpu\n")
        time.sleep(0.6)
        assert _reconfigures(log) == ["reconfigure"] * 3  # not a Slurm file: Slurm needs no reload
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_reconfigure_loop_applies_the_window_reservations_at_start_and_every_round(tmp_path):
    """At start, then every round: a reservation deleted by hand, or a changed file, is applied within a round."""
    process, conf, log = _run_loop(tmp_path, "exit 0")
    try:
        assert _calls(log)[0] == f"windows {conf}/window-reservations"  # before the first sleep
        assert _wait_for(lambda: len(_windows(log)) >= 4)
        assert set(_windows(log)) == {f"windows {conf}/window-reservations"}
    finally:
        process.kill()
        process.wait()


def test_reconfigure_loop_retries_until_scontrol_succeeds(tmp_path):
    """A failed reconfigure (slurmctld restarting) is retried: the files are not marked as seen."""
    process, conf, log = _run_loop(tmp_path, "exit 1")
    try:
        _update(conf / "slurm.conf", "PartitionName=debug\n")
        assert _wait_for(lambda: len(_reconfigures(log)) >= 3)
        assert set(_reconfigures(log)) == {"reconfigure"}
        assert process.poll() is None  # a failure never ends the sidecar
    finally:
        process.kill()
        process.wait()


def test_address_output_is_the_first_controller():
    outputs = render_stack("prod").outputs_of("dualsched:controller:SlurmController")
    assert outputs["address"] == "slurmctld-0.slurmctld.slurm.svc.cluster.local:6817"
    assert outputs["statefulset_name"] == "slurmctld"


@pytest.mark.parametrize(("stack", "ha"), [("dev", False), ("prod", True)])
def test_the_primary_and_the_backup_prefer_different_nodes(stack, ha):
    """A lost node takes one controller, not both; preferred, so a one-node cluster still runs both."""
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered).manifest
    anti = pod_spec(_statefulset(rendered)).get("affinity", {}).get("podAntiAffinity")
    if not ha:
        assert anti is None
        return
    assert anti == {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": statefulset["spec"]["selector"]["matchLabels"]}},
        }]
    }  # fmt: skip


@pytest.mark.parametrize("timeout", [None, 20])
def test_the_backup_takes_over_after_slurmctld_timeout(timeout):
    def edit(raw):
        if timeout is not None:
            raw["slurm"]["controller"]["slurmctldTimeout"] = timeout

    assert _conf_value(render_raw(variant("prod", edit)), "SlurmctldTimeout") == str(timeout or 120)


def test_control_daemons_prefer_nodes_outside_the_gpu_pools(stack):
    """slurmctld, slurmdbd and MariaDB leave GPU nodes' CPU and memory to jobs when they can."""
    rendered = render_stack(stack)
    workloads = [rendered.named("StatefulSet", "slurmctld"), *rendered.by_kind("Deployment")]
    workloads = [w for w in workloads if w.manifest["metadata"]["labels"].get("app.kubernetes.io/name") != "vllm"]
    if stack == "dev":
        workloads.append(rendered.named("StatefulSet", "mariadb"))
    for workload in workloads:
        preferred = pod_spec(workload)["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred == [
            {
                "weight": 100,
                "preference": {"matchExpressions": [{"key": "dualsched.io/pool", "operator": "DoesNotExist"}]},
            }
        ], workload.name


def test_a_fresh_controller_waits_for_slurmdbd_instead_of_crash_looping(tmp_path):
    rendered = render_stack("dev")
    init = {c["name"]: c for c in pod_spec(_statefulset(rendered))["initContainers"]}
    assert list(init) == ["state-owner", "munged", "wait-for-accounting"]
    wait = init["wait-for-accounting"]
    script = wait["command"][2]
    assert wait["command"][:2] == ["sh", "-c"] and "sacctmgr" in script
    assert wait["securityContext"]["runAsUser"] == SLURM_UID and "restartPolicy" not in wait
    assert set(mounts(wait)) == {"/etc/slurm", "/var/spool/slurmctld", "/run/munge", "/etc/passwd", "/etc/group"}
    # the script itself: with saved state it returns at once; without, it waits until sacctmgr answers
    state = tmp_path / "state"
    state.mkdir()
    answers = tmp_path / "answers"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacctmgr").write_text(f'#!/bin/sh\necho called >> {tmp_path}/calls\n[ -e {answers} ]\n')
    (fake / "sacctmgr").chmod(0o755)
    local = script.replace("/var/spool/slurmctld", str(state)).replace("sleep 3", "sleep 0.1")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    (state / "node_state").touch()
    assert subprocess.run(["sh", "-c", local], env=env, timeout=10).returncode == 0
    assert not (tmp_path / "calls").exists()
    (state / "node_state").unlink()
    waiting = subprocess.Popen(["sh", "-c", local], env=env, stdout=subprocess.PIPE)
    time.sleep(0.5)
    assert waiting.poll() is None  # slurmdbd not answering: still waiting
    answers.touch()
    assert waiting.wait(timeout=10) == 0


def test_the_state_directory_is_given_to_slurm_user_first_whatever_the_volumes_fs_group_policy():
    """fsGroup is skipped for ReadWriteMany volumes by the default CSIDriver policy (prod's HA claim), and some
    drivers apply none: root, with CHOWN and FOWNER only, gives the directory itself (not what is in it) to
    SlurmUser before anything else starts."""
    rendered = render_stack("prod")
    first = pod_spec(_statefulset(rendered))["initContainers"][0]
    assert first["name"] == "state-owner"
    assert first["command"] == ["sh", "-c", f"chown {SLURM_UID}:{SLURM_UID} /var/spool/slurmctld && chmod 0700 /var/spool/slurmctld"]
    assert "-R" not in first["command"][2]
    assert set(mounts(first)) == {"/var/spool/slurmctld"}
    context = first["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]} and "runAsUser" not in context
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True


def test_without_accounting_the_controller_waits_for_nothing():
    rendered = render_raw(variant("dev", lambda raw: raw["slurm"].update(accounting={"enabled": False})))
    assert [c["name"] for c in pod_spec(_statefulset(rendered))["initContainers"]] == ["state-owner", "munged"]
    slurmctld = container(_statefulset(rendered), "slurmctld")
    assert "lifecycle" not in slurmctld and PROGRAM_DIR not in mounts(slurmctld)
    assert ACCOUNTING_BEFORE_STOP not in controller_programs(rendered.config)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmctld_stops_once_slurmdbd_has_every_jobs_record_within_its_grace(stack):
    """The kubelet runs the preStop hook, then sends SIGTERM; both within the pod's grace (a job started just before
    a stop was recorded as root's: components/programs/accounting_before_stop.sh)."""
    rendered = render_stack(stack)
    slurmctld = container(_statefulset(rendered), "slurmctld")
    assert slurmctld["lifecycle"]["preStop"]["exec"]["command"] == [
        "sh", f"{PROGRAM_DIR}/{ACCOUNTING_BEFORE_STOP}", str(ACCOUNTING_WAIT_LIMIT)]  # fmt: skip
    assert mounts(slurmctld)[PROGRAM_DIR]["name"] == "programs"
    assert ACCOUNTING_BEFORE_STOP in controller_programs(rendered.config)
    assert pod_spec(_statefulset(rendered))["terminationGracePeriodSeconds"] >= ACCOUNTING_WAIT_LIMIT + 20


def _run_before_stop(tmp_path: Path, queue: str, records: str, squeue_status: int = 0) -> subprocess.CompletedProcess:
    """accounting_before_stop.sh with a limit of 1 s, a fake `squeue` printing ``queue`` (its id:STATE lines) and a
    fake `sacct` printing ``records`` (JobIDRaw|State) when asked for exactly the queue's jobs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    ids = ",".join(line.split(":")[0] for line in queue.replace("\\n", " ").split())
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ \"$*\" = \"--all --noheader --format=%A:%T\" ] || exit 2\nprintf '{queue}'\nexit {squeue_status}\n")
    (bin_dir / "sacct").write_text(f"#!/bin/sh\ncase \"$*\" in *\"--format=JobIDRaw,State --jobs={ids}\") printf '{records}';; *) exit 2;; esac\n")
    for fake in bin_dir.iterdir():
        fake.chmod(0o755)
    return subprocess.run(["sh", str(Path(__file__).resolve().parent.parent / "components" / "programs" / ACCOUNTING_BEFORE_STOP), "1"],
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)  # fmt: skip


@pytest.mark.parametrize("queue, records, waits_for", [
    ("7:PENDING\\n8:RUNNING\\n9:COMPLETING\\n", "7|PENDING\\n8|RUNNING\\n9|COMPLETED\\n", ""),  # every record as slurmctld knows it
    ("7:PENDING\\n8:RUNNING\\n9:COMPLETING\\n", "7|PENDING\\n8|PENDING\\n", " 8 9"),  # 8 only pending there, 9 not there
    ("12:SUSPENDED\\n", "12|CANCELLED by 0\\n", ""),  # a record past PENDING, whatever its words
    ("", "", ""),  # no job
])  # fmt: skip
def test_the_stop_hook_waits_for_a_record_of_each_job_and_for_started_jobs_past_pending(tmp_path, queue, records, waits_for):
    started = time.monotonic()
    result = _run_before_stop(tmp_path, queue, records)
    assert result.returncode == 0, result.stderr
    if waits_for:
        assert result.stderr == f"slurmctld stops before slurmdbd has a record of job(s){waits_for} as slurmctld knows it\n"
        assert time.monotonic() - started >= 1
    else:
        assert result.stderr == "" and time.monotonic() - started < 1


def test_the_stop_hook_lets_slurmctld_stop_when_squeue_gets_no_answer(tmp_path):
    result = _run_before_stop(tmp_path, "", "", squeue_status=1)
    assert (result.returncode, result.stderr) == (0, "")
