"""Containers in Slurm jobs (Pyxis/Enroot): config checks, plugstack.conf, enroot.conf and the slurmd
pod of a pool with containers (mirrors components/compute.py and components/slurm_files.py; the
real Slurm loading the plugin is tests/slurm/test_pyxis_plugstack.py, docs/containers.md)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from dualsched.components.compute import enroot_directories
from dualsched.components.slurm_files import kubernetes_site, render_enroot_conf, render_slurm_files
from dualsched.config import ConfigError, parse_stack_config
from dualsched.config.models import PoolContainers, SlurmUser
from dualsched.examples.sbatch_job import TRAINING_SCRIPT
from rendering import at_release, container, mounts, pod_spec, render_raw, render_stack, variant, volume, without_containers
from tests.conftest import raw_stack

REPO = Path(__file__).resolve().parents[1]
POOL_LABEL = "dualsched.io/pool"
PYXIS_LINE = "required /usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so runtime_path=/run/pyxis container_scope=job"


def _containers_on_h100_a(raw):
    """prod with containers on its first pool only (prod has them on both training pools)."""
    without_containers(raw)
    raw["pools"][0]["containers"] = {}


def _slurmd_of(rendered, pool: str):
    return next(ds for ds in rendered.by_kind("DaemonSet") if pod_spec(ds)["nodeSelector"][POOL_LABEL] == pool)


# ---------------------------------------------------------------------------- config


def test_containers_default_to_pyxis_with_node_local_directories():
    config = parse_stack_config(variant("prod", _containers_on_h100_a))
    assert config.pools[0].containers == PoolContainers(
        runtime="pyxis", runtime_path="/run/enroot", cache_path="/var/lib/enroot/cache", data_path="/var/lib/enroot/data"
    )
    assert config.runs_containers and not parse_stack_config(variant("prod", without_containers)).runs_containers


def test_containers_where_they_cannot_run_are_rejected_all_at_once():
    def edit(raw):
        raw["pools"][2]["containers"] = {}  # partitioned
        raw["pools"][0]["containers"] = {"cachePath": "/var/lib/enroot", "dataPath": "/var/lib/enroot/data"}
        raw["pools"][1]["containers"] = {"runtimePath": "/run/enroot", "dataPath": "/run/enroot"}
        raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "containers": {}})

    with pytest.raises(ConfigError) as caught:
        parse_stack_config(variant("prod", edit))
    message = str(caught.value)
    for line in (
        "pools[0].containers.cachePath: must not be, contain or lie inside dataPath (/var/lib/enroot/data) (got '/var/lib/enroot')",
        "pools[1].containers.runtimePath: must not be, contain or lie inside dataPath (/run/enroot) (got '/run/enroot')",
        "pools[2].containers: needs a privileged slurmd, which would see the GPUs a partitioned pool gives Kubernetes: "
        "use a dedicated or time-shared pool (got 'partitioned')",
        "pools[3].containers: runs Slurm job steps in containers, and a pool of mode 'kubernetes' runs no slurmd (got 'kubernetes')",
    ):
        assert line in message, message


@pytest.mark.parametrize(("field", "value"), [("runtime", "docker"), ("cachePath", "var/cache"), ("dataPath", "")])
def test_bad_container_fields_name_their_path(field, value):
    raw = variant("prod", _containers_on_h100_a)
    raw["pools"][0]["containers"][field] = value
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw)
    assert f"pools[0].containers.{field}:" in str(caught.value)


# ---------------------------------------------------------------------- Slurm files


def test_plugstack_requires_pyxis_once_a_pool_runs_containers():
    config = parse_stack_config(variant("prod", _containers_on_h100_a))
    plugstack = render_slurm_files(config, kubernetes_site(config))["plugstack.conf"]
    assert [line for line in plugstack.splitlines() if not line.startswith("#")] == [PYXIS_LINE]


def test_plugstack_of_a_stack_without_containers_loads_nothing():
    config = parse_stack_config(variant("prod", without_containers))
    plugstack = render_slurm_files(config, kubernetes_site(config))["plugstack.conf"]
    assert plugstack.strip() and all(line.startswith("#") for line in plugstack.splitlines())


def test_slurm_conf_keeps_the_default_plugstack_path():
    """Configless slurmd fetches plugstack.conf with slurm.conf and reads it next to it in its cache;
    a PlugStackConfig path would point it at a file the node does not have."""
    config = parse_stack_config(variant("prod", _containers_on_h100_a))
    assert "PlugStackConfig" not in render_slurm_files(config, kubernetes_site(config))["slurm.conf"]


def test_enroot_conf_gives_each_user_its_own_directories():
    containers = PoolContainers(runtime_path="/run/e", cache_path="/srv/cache", data_path="/srv/data")
    settings = [line for line in render_enroot_conf(containers).splitlines() if line and not line.startswith("#")]
    assert settings == [
        "ENROOT_RUNTIME_PATH /run/e/user-$(id -u)",
        "ENROOT_CACHE_PATH /srv/cache/group-$(id -g)",
        "ENROOT_DATA_PATH /srv/data/user-$(id -u)",
    ]


# ------------------------------------------------------------------------ slurmd pods


def test_every_slurmd_runs_the_pyxis_image_once_a_pool_has_containers():
    """The plugstack.conf every slurmd fetches requires the plugin, so every pool's image carries it."""
    rendered = render_raw(variant("prod", _containers_on_h100_a))
    for pool in ("h100-a", "h100-b", "h100-shared"):
        pod = pod_spec(_slurmd_of(rendered, pool))
        assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {
            "ghcr.io/slinkyproject/slurmd-pyxis:25.11.6-ubuntu24.04"
        }


def test_a_pool_with_containers_gets_enroot_config_directories_and_privilege():
    rendered = render_raw(variant("prod", _containers_on_h100_a))
    daemonset = _slurmd_of(rendered, "h100-a")
    slurmd = container(daemonset, "slurmd")
    assert slurmd["securityContext"] == {"privileged": True}
    mounted = mounts(slurmd)
    assert mounted["/etc/enroot/enroot.conf"] == {
        "name": "enroot-conf", "mountPath": "/etc/enroot/enroot.conf", "readOnly": True, "subPath": "enroot.conf"
    }
    assert volume(daemonset, "enroot-runtime") == {"name": "enroot-runtime", "emptyDir": {}}
    assert mounted["/run/enroot"]["name"] == "enroot-runtime"
    for name, path in (("enroot-cache", "/var/lib/enroot/cache"), ("enroot-data", "/var/lib/enroot/data")):
        assert volume(daemonset, name) == {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        assert mounted[path]["name"] == name
    config_map = rendered.named("ConfigMap", volume(daemonset, "enroot-conf")["configMap"]["name"], "slurm")
    # and the mount that puts the TaskProlog in containers (below)
    assert config_map.manifest["data"]["enroot.conf"] == render_enroot_conf(PoolContainers())
    assert set(config_map.manifest["data"]) == {"enroot.conf", "90-dualsched-task-prolog.fstab"}
    # The directories are made before slurmd starts; slurmd is still what runs.
    command = slurmd["command"]
    users = parse_stack_config(variant("prod", _containers_on_h100_a)).slurm.users
    assert command[:2] == ["sh", "-c"] and enroot_directories(PoolContainers(), users) in command[2]
    assert command[2].endswith('&& exec "$@"') and command[4:7] == ["slurmd", "-D", "-N"]


def test_pools_without_containers_get_an_enroot_that_lists_nothing_and_no_privilege():
    """Their slurmd loads Pyxis too, whose job epilog runs `enroot list`: without Enroot's directories it
    fails and Slurm drains the node after every job (found on the multi-node tier). So they get the
    default directories, all emptyDirs (nothing on the node's disk), and stay unprivileged."""
    rendered = render_raw(variant("prod", _containers_on_h100_a))
    daemonset = _slurmd_of(rendered, "h100-b")
    slurmd = container(daemonset, "slurmd")
    assert slurmd["securityContext"]["privileged"] is False
    mounted = mounts(slurmd)
    for name, path in (("enroot-runtime", "/run/enroot"), ("enroot-cache", "/var/lib/enroot/cache"),
                       ("enroot-data", "/var/lib/enroot/data")):  # fmt: skip
        assert volume(daemonset, name) == {"name": name, "emptyDir": {}}
        assert mounted[path]["name"] == name
    assert mounted["/etc/enroot/enroot.conf"]["name"] == "enroot-conf"
    users = parse_stack_config(variant("prod", _containers_on_h100_a)).slurm.users
    assert enroot_directories(PoolContainers(), users) in slurmd["command"][2]
    assert not any("hostPath" in v and "enroot" in v["name"] for v in pod_spec(daemonset)["volumes"])


TASK_PROLOG = "/etc/dualsched/task/task_prolog.sh"


def _containers_at(release: str, patch: int = 1):
    def edit(raw):
        _containers_on_h100_a(raw)
        at_release(raw, release, patch)

    return edit


def _task_prolog_lines(rendered) -> list[str]:
    return [line for line in rendered.slurm_files["slurm.conf"].splitlines() if line.startswith("TaskProlog=")]


@pytest.mark.parametrize(("release", "patch"), [("22.05", 1), ("24.11", 7), ("25.05", 2), ("25.11", 6), ("26.05", 1)])
def test_the_task_prolog_is_bound_into_every_container_where_slurmstepd_runs_it_there(release, patch):
    """slurmstepd runs slurm.conf's TaskProlog after Pyxis has joined the container (NVIDIA/pyxis#83), by
    exec'ing the script there: an Enroot mount puts it in, read-only, on every pool whose slurmd runs Enroot
    (the real proof, on 22.05: the multi-node tier's training job, its srun steps in containers). So a job
    submitted with a token can srun in containers on prod's default 25.11 too."""
    rendered = render_raw(variant("prod", _containers_at(release, patch)))
    assert _task_prolog_lines(rendered) == [f"TaskProlog={TASK_PROLOG}"]
    for pool in ("h100-a", "h100-b"):
        daemonset = _slurmd_of(rendered, pool)
        fstab = mounts(container(daemonset, "slurmd"))["/etc/enroot/mounts.d/90-dualsched-task-prolog.fstab"]
        assert fstab == {"name": "enroot-conf", "mountPath": "/etc/enroot/mounts.d/90-dualsched-task-prolog.fstab",
                         "readOnly": True, "subPath": "90-dualsched-task-prolog.fstab"}  # fmt: skip
        data = rendered.named("ConfigMap", volume(daemonset, "enroot-conf")["configMap"]["name"], "slurm").manifest["data"]
        assert data["90-dualsched-task-prolog.fstab"] == f"{TASK_PROLOG} {TASK_PROLOG} none x-create=file,bind,ro,nosuid,nodev,private 0 -1\n"


@pytest.mark.parametrize(("release", "patch"), [("24.11", 1), ("24.11", 6), ("25.05", 1)])
def test_a_patch_that_runs_the_task_prolog_through_slurmstepds_binary_gets_none_with_containers(release, patch):
    """24.11.0-24.11.6 and 25.05.0-25.05.1 ran a TaskProlog through slurmstepd's own binary inside the container,
    which lacks it and its libraries (NVIDIA/pyxis#163): every container step would fail. Jobs submitted with a
    token then cannot srun (Slurm's limit, docs/security.md)."""
    rendered = render_raw(variant("prod", _containers_at(release, patch)))
    assert not _task_prolog_lines(rendered)
    for daemonset in rendered.by_kind("DaemonSet"):
        assert not any(v["name"] == "task-prolog" for v in pod_spec(daemonset).get("volumes", []))
        assert not any(p.startswith("/etc/enroot/mounts.d/") for p in mounts(container(daemonset, "slurmd")))


def test_a_slurmd_image_that_names_no_patch_of_an_affected_release_gets_no_task_prolog():
    """A digest or a tag without a patch level may be an affected patch: the TaskProlog is left out."""
    def by_digest(raw):
        _containers_at("24.11", 7)(raw)
        raw["images"]["slurmdPyxis"] = "ghcr.io/slinkyproject/slurmd-pyxis@sha256:" + "a" * 64

    assert not _task_prolog_lines(render_raw(variant("prod", by_digest)))


def test_a_stack_without_containers_has_no_enroot():
    rendered = render_raw(variant("prod", without_containers))
    assert not [cm for cm in rendered.by_kind("ConfigMap") if "enroot.conf" in cm.manifest.get("data", {})]
    for daemonset in rendered.by_kind("DaemonSet"):
        assert not any(v["name"].startswith("enroot-") for v in pod_spec(daemonset).get("volumes", []))


ALICE, BOB, CAROL = (SlurmUser(name="alice", uid=2001), SlurmUser(name="bob", uid=2002),
                     SlurmUser(name="carol", uid=2003, gid=2001))  # fmt: skip


def _owner_and_mode(path: Path) -> tuple[int, int, int]:
    status = os.lstat(path)
    return status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)


def test_enroot_directories_are_each_users_own(tmp_path):
    """Run as the slurmd container runs it (root): the pool's directories are root's and closed to others'
    writes; each user gets runtime and data directories only they can enter, each group a layer cache only
    its members can enter, in which none removes another's files. Twice: a restarted pod finds them there."""
    if os.geteuid() != 0:
        pytest.fail("the Enroot directory tests chown to job users: run them as root, as CI does")
    containers = PoolContainers(
        runtime_path=str(tmp_path / "run"), cache_path=str(tmp_path / "cache"), data_path=str(tmp_path / "data")
    )
    for _ in range(2):
        subprocess.run(["sh", "-c", enroot_directories(containers, (ALICE, BOB, CAROL))], check=True)
    for path in containers.paths.values():
        assert _owner_and_mode(Path(path)) == (0, 0, 0o755)
    for user in (ALICE, BOB, CAROL):
        for path in (containers.runtime_path, containers.data_path):
            assert _owner_and_mode(Path(path) / f"user-{user.uid}") == (user.uid, user.group_id, 0o700)
    assert sorted(p.name for p in Path(containers.cache_path).iterdir()) == ["group-2001", "group-2002"]
    for gid in (2001, 2002):
        assert _owner_and_mode(Path(containers.cache_path) / f"group-{gid}") == (0, gid, 0o1770)


def test_what_another_user_planted_in_enroot_directories_goes_and_a_users_own_stays(tmp_path):
    """Before each user had their own, the directories were world-writable: bob may have made alice's
    directory (to read or plant her containers) or linked it elsewhere. Those go; alice's own files stay."""
    if os.geteuid() != 0:
        pytest.fail("the Enroot directory tests chown to job users: run them as root, as CI does")
    containers = PoolContainers(
        runtime_path=str(tmp_path / "run"), cache_path=str(tmp_path / "cache"), data_path=str(tmp_path / "data")
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = Path(containers.data_path) / f"user-{ALICE.uid}"
    planted.mkdir(parents=True)
    (planted / "pyxis_job").mkdir()
    os.chown(planted, BOB.uid, BOB.uid)
    Path(containers.runtime_path).mkdir()
    (Path(containers.runtime_path) / f"user-{ALICE.uid}").symlink_to(elsewhere)
    kept = Path(containers.data_path) / f"user-{BOB.uid}" / "pyxis_own"
    kept.mkdir(parents=True)
    os.chown(kept.parent, BOB.uid, BOB.uid)

    subprocess.run(["sh", "-c", enroot_directories(containers, (ALICE, BOB))], check=True)

    assert not (planted / "pyxis_job").exists()
    assert _owner_and_mode(planted) == (ALICE.uid, ALICE.uid, 0o700)
    runtime = Path(containers.runtime_path) / f"user-{ALICE.uid}"
    assert not runtime.is_symlink() and _owner_and_mode(runtime) == (ALICE.uid, ALICE.uid, 0o700)
    assert elsewhere.is_dir() and _owner_and_mode(elsewhere)[0] == 0
    assert kept.is_dir()


# --------------------------------------------------------------------------- example


def test_the_container_example_is_the_seed_training_job_in_a_container():
    """Same job as examples/sbatch_job.py; its step runs in the image with /shared mounted."""
    example = (REPO / "examples" / "train_pyxis.sbatch").read_text()
    sbatch_lines = [line for line in example.splitlines() if line.startswith("#SBATCH")]
    assert sbatch_lines == [line for line in TRAINING_SCRIPT.splitlines() if line.startswith("#SBATCH")]
    step = example.split("\nsrun ", 1)[1].replace("\\\n", " ").split()
    assert step[:2] == ["--container-image=nvcr.io#nvidia/pytorch:25.09-py3", "--container-mounts=/shared:/shared"]
    assert " ".join(step[2:]) == TRAINING_SCRIPT.split("\nsrun ", 1)[1].strip()


def test_prod_runs_the_container_example_as_it_is_written():
    """Its partition is prod's training pools, every one with containers, whose nodes have the GPUs and the count
    it asks for; and slurm.conf's TaskProlog, bound into the containers, keeps the token of a job submitted from a
    Kubernetes Job out of it, so its srun steps run (on 25.11, prod's release)."""
    example = (REPO / "examples" / "train_pyxis.sbatch").read_text()
    options = dict(line.removeprefix("#SBATCH --").split("=", 1) for line in example.splitlines() if line.startswith("#SBATCH"))
    config = parse_stack_config(raw_stack("prod"))
    [partition] = [p for p in config.slurm.partitions if p.name == options["partition"]]
    pools = [config.pool(name) for name in partition.pools]
    assert pools and all(pool.containers for pool in pools)
    assert all(pool.slurm_gpu_count >= int(options["gres"].removeprefix("gpu:")) for pool in pools)
    assert sum(len(pool.node_names) for pool in pools) >= int(options["nodes"])
    rendered = render_stack("prod")
    assert _task_prolog_lines(rendered) == [f"TaskProlog={TASK_PROLOG}"]
    for pool in pools:
        assert "/etc/enroot/mounts.d/90-dualsched-task-prolog.fstab" in mounts(container(_slurmd_of(rendered, pool.name), "slurmd"))

