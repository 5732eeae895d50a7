"""UserDirectory: the passwd and group files every pod that runs Slurm code resolves users with
(mirrors components/identity.py)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from dualsched.components.identity import (
    FILES,
    HOMES,
    NOBODY_UID,
    SLURM_UID,
    group_file,
    home_of,
    identity_mounts,
    identity_volume,
    make_homes,
    passwd_file,
)
from dualsched.components.login import LOGIN
from dualsched.config.models import SlurmUser
from rendering import container, mounts, pod_spec, render_raw, render_stack, variant, volume

TOKEN = "dualsched:identity:UserDirectory"
USERS = (SlurmUser(name="alice", uid=2001), SlurmUser(name="bob", uid=2002, gid=3000))


def _identity_config_maps(rendered):
    return [c for c in rendered.by_kind("ConfigMap") if c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "identity"]


def _entries(text: str) -> dict[str, list[str]]:
    """name -> the fields of its line."""
    assert text.endswith("\n") and "\n\n" not in text
    return {line.split(":")[0]: line.split(":") for line in text.splitlines()}


def _slurm_workloads(rendered):
    """Every workload whose containers run Slurm code (daemons and clients)."""
    workloads = [*rendered.by_kind("DaemonSet"), rendered.named("StatefulSet", "slurmctld")]
    workloads += [d for d in rendered.by_kind("Deployment") if "slurmdbd" in d.name]
    return workloads


# ------------------------------------------------------------------------- the files


def test_passwd_holds_the_system_accounts_and_the_users():
    entries = _entries(passwd_file(USERS))
    assert list(entries) == ["root", "slurm", "nobody", "alice", "bob"]
    assert entries["root"][2:4] == ["0", "0"]
    assert entries["slurm"][2:4] == [str(SLURM_UID), str(SLURM_UID)] == ["401", "401"]
    assert entries["nobody"][2:4] == [str(NOBODY_UID)] * 2 == ["65534", "65534"]
    assert entries["alice"][2:4] == ["2001", "2001"]  # gid defaults to the uid
    assert entries["bob"][2:4] == ["2002", "3000"]
    # Seven fields each, no password hash anywhere ("x": none in this file).
    assert all(len(fields) == 7 and fields[1] == "x" for fields in entries.values())
    # Job users can log in to a shell; the system accounts other than root cannot.
    assert entries["alice"][6] == "/bin/sh" and entries["slurm"][6] == entries["nobody"][6] == "/usr/sbin/nologin"


def test_group_holds_one_group_per_user_primary_gid():
    entries = _entries(group_file(USERS))
    assert list(entries) == ["root", "slurm", "nogroup", "alice", "bob"]
    assert entries["root"] == ["root", "x", "0", ""]
    assert entries["slurm"] == ["slurm", "x", "401", ""]
    assert entries["nogroup"] == ["nogroup", "x", "65534", ""]
    assert entries["alice"] == ["alice", "x", "2001", ""]
    assert entries["bob"] == ["bob", "x", "3000", ""]


def test_without_users_only_the_system_accounts():
    assert list(_entries(passwd_file(()))) == ["root", "slurm", "nobody"]
    assert list(_entries(group_file(()))) == ["root", "slurm", "nogroup"]


def test_every_uid_and_gid_is_unique_in_the_rendered_files():
    passwd = _entries(passwd_file(USERS))
    groups = _entries(group_file(USERS))
    uids = [fields[2] for fields in passwd.values()]
    gids = [fields[2] for fields in groups.values()]
    assert len(uids) == len(set(uids)) and len(gids) == len(set(gids))
    # Every user's primary gid has a group.
    assert {fields[3] for fields in passwd.values()} <= set(gids)


def test_identity_volume_and_mounts():
    assert FILES == {"users": "/etc/passwd", "groups": "/etc/group"}
    mounted = {m.mount_path: (m.name, m.sub_path, m.read_only) for m in identity_mounts()}
    assert mounted == {"/etc/passwd": ("identity", "users", True), "/etc/group": ("identity", "groups", True)}
    source = identity_volume("users-abc")
    assert (source.name, source.config_map.name) == ("identity", "users-abc")


# ---------------------------------------------------------------------- the ConfigMaps


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_config_map_per_namespace_that_runs_slurm_never_inference(stack):
    rendered = render_stack(stack)
    config_maps = _identity_config_maps(rendered)
    assert sorted(c.namespace for c in config_maps) == ["slurm", "slurm-jobs"]
    assert not [c for c in _identity_config_maps(rendered) if c.namespace == rendered.config.inference.namespace]
    assert len(rendered.components(TOKEN)) == 1


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_config_maps_hold_the_stacks_users(stack):
    rendered = render_stack(stack)
    users = rendered.config.slurm.users
    assert users, "the stack configures job users"
    for config_map in _identity_config_maps(rendered):
        assert config_map.manifest["data"] == {"users": passwd_file(users), "groups": group_file(users)}
        passwd = _entries(config_map.manifest["data"]["users"])
        for user in users:
            assert passwd[user.name][2:4] == [str(user.uid), str(user.group_id)]


def test_dev_users_are_alice():
    [config_map, *_] = _identity_config_maps(render_stack("dev"))
    assert "alice:x:2001:2001::/home/alice:/bin/sh" in config_map.manifest["data"]["users"].splitlines()
    assert "alice:x:2001:" in config_map.manifest["data"]["groups"].splitlines()


def test_without_submission_only_the_slurm_namespace_gets_the_files():
    rendered = render_raw(variant("dev", lambda raw: raw.update(submission={"enabled": False})))
    assert [c.namespace for c in _identity_config_maps(rendered)] == ["slurm"]


def test_outputs_name_the_config_map_of_each_namespace():
    rendered = render_stack("dev")
    names = rendered.outputs_of(TOKEN)["config_map_names"]
    by_namespace = {c.namespace: c.name for c in _identity_config_maps(rendered)}
    assert names == {"slurm": by_namespace["slurm"], "jobs": by_namespace["slurm-jobs"]}


def test_a_new_user_reaches_every_namespace_and_no_slurm_file():
    def add_bob(raw):
        raw["slurm"]["users"].append({"name": "bob", "uid": 2002})

    before, after = render_stack("dev"), render_raw(variant("dev", add_bob))
    config_maps = _identity_config_maps(after)
    assert len(config_maps) == 2
    for config_map in config_maps:
        assert "bob:x:2002:2002::/home/bob:/bin/sh" in config_map.manifest["data"]["users"].splitlines()
        assert "bob:x:2002:" in config_map.manifest["data"]["groups"].splitlines()
    assert after.slurm_files == before.slurm_files  # users live in no Slurm file


# --------------------------------------------------------------------------- the pods


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_slurm_pod_mounts_passwd_and_group_from_its_namespace(stack):
    rendered = render_stack(stack)
    config_map_of = {c.namespace: c.name for c in _identity_config_maps(rendered)}
    workloads = _slurm_workloads(rendered)
    assert len(workloads) >= 3
    for workload in workloads:
        assert volume(workload, "identity")["configMap"] == {"name": config_map_of[workload.namespace]}, workload.name
        spec = pod_spec(workload)
        slurm_containers = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] != "munged"]
        for item in slurm_containers:
            if item["name"] in ("slurmdbd-conf", "exporter", "cordon-watch", "state-owner"):  # write or serve files only: resolve nobody
                continue
            found = mounts(item)
            assert found["/etc/passwd"] == {"name": "identity", "mountPath": "/etc/passwd", "subPath": "users", "readOnly": True}, (
                workload.name, item["name"])
            assert found["/etc/group"] == {"name": "identity", "mountPath": "/etc/group", "subPath": "groups", "readOnly": True}, (
                workload.name, item["name"])


@pytest.mark.parametrize(("stack", "names"), [("dev", ["slurmctld", "reconfigure"]), ("prod", ["slurmctld", "reconfigure"])])
def test_controller_containers_resolve_users(stack, names):
    statefulset = render_stack(stack).named("StatefulSet", "slurmctld")
    for name in names:
        assert {"/etc/passwd", "/etc/group"} <= set(mounts(container(statefulset, name)))


def test_slurmd_and_slurmdbd_resolve_users():
    rendered = render_stack("dev")
    for workload, name in ((rendered.by_kind("DaemonSet")[0], "slurmd"), (rendered.one("Deployment", "slurmdbd"), "slurmdbd")):
        assert {"/etc/passwd", "/etc/group"} <= set(mounts(container(workload, name)))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_inference_pods_mount_no_user_directory(stack):
    rendered = render_stack(stack)
    for deployment in rendered.in_namespace(rendered.config.inference.namespace, "Deployment"):
        spec = pod_spec(deployment)
        assert "identity" not in {v["name"] for v in spec.get("volumes", [])}
        for item in spec["containers"]:
            assert "/etc/passwd" not in mounts(item)


def test_munged_does_not_need_the_user_directory():
    """munged runs as root and resolves nobody: only Slurm's own containers get the files."""
    statefulset = render_stack("dev").named("StatefulSet", "slurmctld")
    assert "/etc/passwd" not in mounts(container(statefulset, "munged"))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurm_user_of_slurm_conf_is_the_uid_the_daemons_run_as(stack):
    """SlurmUser=slurm must resolve to the uid slurmctld and slurmdbd run as, in the files they mount."""
    rendered = render_stack(stack)
    [slurm_user] = [line.split("=", 1)[1] for line in rendered.slurm_files["slurm.conf"].splitlines() if line.startswith("SlurmUser=")]
    passwd = _entries(passwd_file(rendered.config.slurm.users))
    assert passwd[slurm_user][2] == str(SLURM_UID)
    daemons = ((rendered.named("StatefulSet", "slurmctld"), "slurmctld"), (rendered.one("Deployment", "slurmdbd"), "slurmdbd"))
    for workload, name in daemons:
        assert container(workload, name)["securityContext"]["runAsUser"] == SLURM_UID


# ---------------------------------------------------------------------------- homes


def _make_homes_under(root: Path, users) -> None:
    """identity.make_homes as a pod runs it (root), with /home moved under ``root``."""
    script = make_homes(users).replace(f" {HOMES}", f" {root}{HOMES}")
    subprocess.run(["sh", "-c", script], check=True)


def test_each_user_has_a_home_of_their_own_that_no_one_else_enters(tmp_path):
    """Shells, sshd and Python run files from a home (.profile, .pth): one user must never write
    another's. Before, every user's home was the one /tmp. Twice: a restarted container finds them."""
    if os.geteuid() != 0:
        pytest.fail("the home tests chown to job users: run them as root, as CI does")
    users = (SlurmUser(name="alice", uid=2001), SlurmUser(name="bob", uid=2002, gid=3000))
    for _ in range(2):
        _make_homes_under(tmp_path, users)
    for user in users:
        home = tmp_path / home_of(user).lstrip("/")
        status = home.stat()
        assert (status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)) == (user.uid, user.group_id, 0o700)
    passwd = _entries(passwd_file(users))
    assert [passwd[user.name][5] for user in users] == ["/home/alice", "/home/bob"]


def test_a_home_another_user_made_first_is_replaced(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the home tests chown to job users: run them as root, as CI does")
    alice = SlurmUser(name="alice", uid=2001)
    planted = tmp_path / "home" / "alice"
    (planted / ".ssh").mkdir(parents=True)
    (planted / ".ssh" / "rc").write_text("steal\n")
    os.chown(planted, 2002, 2002)
    _make_homes_under(tmp_path, (alice,))
    assert not (planted / ".ssh").exists() and planted.stat().st_uid == alice.uid


def test_pods_that_run_users_code_make_the_homes_before_they_start():
    rendered = render_stack("dev")
    homes = make_homes(rendered.config.slurm.users)
    slurmd = [container(ds, "slurmd") for ds in rendered.by_kind("DaemonSet") if ds.name.startswith("dualsched-slurmd-")]
    login = [container(d, LOGIN) for d in rendered.by_kind("Deployment") if LOGIN in d.name]
    assert slurmd and login
    for runs_code in (*slurmd, *login):
        assert homes in runs_code["command"][2], runs_code["command"]
        assert mounts(runs_code)[HOMES]["name"] == "home"
