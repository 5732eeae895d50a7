"""Containers in Slurm jobs (docs/containers.md): with a pool that has `containers`, the rendered
plugstack.conf makes the real Slurm load the Pyxis plugin built from source against it, and Pyxis
runs Enroot built from source (tools/build-pyxis.sh) with the rendered enroot.conf. slurmd fetches
plugstack.conf from slurmctld (configless), srun offers Pyxis's options, a job without a container
still runs (and Pyxis's epilog leaves the node IDLE), and the example's options are accepted all the
way to Enroot asking the registry for the image, which fails: this machine reaches no registry
(what that leaves unproven: docs/containers.md)."""

from __future__ import annotations

import contextlib
import copy
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from dualsched.components.compute import ENROOT_CONF_DIR, enroot_directories
from dualsched.components.slurm_files import ENROOT_CONF, render_enroot_conf
from dualsched.config.models import PoolContainers, SlurmUser, StackConfig
from harness import JOB_USER, LocalCluster, wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_pyxis.sbatch"
# Its two-node, four-GPU request shrunk to what this machine's one slurmd has (the command line
# overrides #SBATCH lines); everything else, the container options above all, is the example's.
ON_THIS_MACHINE = ("--nodes=1", "--gres=gpu:1", "--mem=100M", "--time=5")
NOBODY_UID = pwd.getpwnam(JOB_USER).pw_uid
JOB_USERS = (SlurmUser(name=JOB_USER, uid=NOBODY_UID, gid=pwd.getpwnam(JOB_USER).pw_gid),)
OTHER_USER = "daemon"
"""Another account of this machine (Debian's), to try the job user's directories with."""


def install_pyxis(cluster: LocalCluster) -> str:
    """Pyxis and Enroot built (or taken from the cache); Enroot installed in /usr/local, where Pyxis's
    job epilog looks for it; the plugin where job users can read it, as they read PluginDir (sbatch
    and srun run as the job's user and load it too)."""
    build = [str(REPO / "tools" / "build-pyxis.sh"), "--install-enroot"]
    result = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"tools/build-pyxis.sh failed:\n{result.stderr}"
    plugins = cluster.root / "plugins"
    plugins.mkdir(exist_ok=True)
    return shutil.copy(result.stdout.strip().splitlines()[-1], plugins / "spank_pyxis.so")


def plugstack_fetched(cluster: LocalCluster) -> bool:
    cached = cluster.slurmd_config_cache / "plugstack.conf"
    return cached.exists() and cached.read_text() == (cluster.etc / "plugstack.conf").read_text()


@contextlib.contextmanager
def enroot_configured(containers: PoolContainers) -> Iterator[None]:
    """What the slurmd container of a pool with containers gets: the rendered enroot.conf where Enroot
    reads it, and the pool's directories made as the container's command makes them."""
    subprocess.run(["sh", "-c", enroot_directories(containers, JOB_USERS)], check=True)
    conf = Path(ENROOT_CONF_DIR) / ENROOT_CONF
    kept = conf.read_bytes() if conf.exists() else None
    conf.write_text(render_enroot_conf(containers))
    try:
        yield
    finally:
        if kept is None:
            conf.unlink()
        else:
            conf.write_bytes(kept)


@pytest.fixture
def pyxis_cluster(cluster: LocalCluster, local_raw) -> Iterator[LocalCluster]:
    """The session's cluster with containers on its GPU pool, their directories under its root."""
    cluster.spank_pyxis = install_pyxis(cluster)
    with_containers = copy.deepcopy(local_raw)
    enroot = cluster.root / "enroot"
    with_containers["pools"][0]["containers"] = {
        "runtimePath": str(enroot / "runtime"), "cachePath": str(enroot / "cache"), "dataPath": str(enroot / "data"),
    }  # fmt: skip
    stack = contextlib.ExitStack()
    try:
        config = apply_with_slurmd_restart(cluster, with_containers)
        stack.enter_context(enroot_configured(config.pools[0].containers))
        yield cluster
    finally:
        stack.close()
        cluster.spank_pyxis = None
        apply_with_slurmd_restart(cluster, local_raw)


def apply_with_slurmd_restart(cluster: LocalCluster, raw: dict[str, Any]) -> StackConfig:
    """slurmd runs SPANK plugins' slurmd-context init only when it starts (Pyxis makes its runtime
    directory there; with a reconfigure alone container steps fail: "couldn't mkdir"), so the node
    takes up the new plugstack.conf as its replaced pod does on Kubernetes: slurmd stopped, the
    config applied, a new slurmd fetching the files from slurmctld as it starts."""
    started = cluster.node(cluster.local_node)["SlurmdStartTime"]
    cluster.stop_daemon("slurmd")
    config = cluster.apply(raw)
    time.sleep(1 - time.time() % 1)  # SlurmdStartTime has whole seconds: start in a later one than the last
    cluster.start_slurmd()
    wait_until("the new slurmd to register", lambda: cluster.node(cluster.local_node)["SlurmdStartTime"] != started)
    cluster.wait_for_node_state(cluster.local_node, "IDLE")
    assert plugstack_fetched(cluster)
    return config


def example_script() -> str:
    """The example without its #! line (the harness writes its own)."""
    return EXAMPLE.read_text().split("\n", 1)[1]


def test_srun_offers_the_container_options_of_the_plugin_slurm_loads(pyxis_cluster):
    plugstack = (pyxis_cluster.etc / "plugstack.conf").read_text()
    runtime = Path(pyxis_cluster.site.pyxis_runtime_path)
    assert f"required {pyxis_cluster.spank_pyxis} runtime_path={runtime} container_scope=job\n" in plugstack
    # Made by Pyxis's slurmd-context init: slurmd loaded the plugin when it started.
    assert runtime.is_dir()

    help_text = pyxis_cluster.run("srun", "--help")
    for option in ("--container-image", "--container-mounts", "--container-name"):
        assert option in help_text, help_text


def test_a_client_without_the_plugin_stops_so_the_login_pods_run_the_image_with_pyxis(pyxis_cluster, tmp_path):
    """The login pod's sbatch and srun read plugstack.conf beside slurm.conf, from the slurm ConfigMap
    (components/login.py). Its Pyxis is `required`, so a client without the plugin stops before it asks
    slurmctld anything: hence images.loginPyxis once a pool has containers. The same clients with the
    plugin go on (the other tests here)."""
    etc = Path(shutil.copytree(pyxis_cluster.etc, tmp_path / "etc"))
    plugstack = etc / "plugstack.conf"
    plugstack.write_text(plugstack.read_text().replace(str(pyxis_cluster.spank_pyxis), str(tmp_path / "not-installed" / "spank_pyxis.so")))
    env = {**pyxis_cluster.env, "SLURM_CONF": str(etc / "slurm.conf")}
    for command in (("sbatch", "--partition=gpu", "--wrap=true"), ("srun", "--partition=gpu", "true")):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert result.returncode != 0, result.stdout
        assert "Failed to load plugin" in result.stderr and "Aborting" in result.stderr, result.stderr


def test_a_job_without_a_container_runs_with_the_plugin_loaded(pyxis_cluster):
    # The step's srun runs in the job, on the node: it reads the plugstack.conf slurmd fetched.
    job = pyxis_cluster.sbatch(
        "--partition=gpu", "--mem=100M", "--time=5",
        script="srun --help | grep -c -- --container-image\nsrun echo plain step ran\n",
    )  # fmt: skip
    finished = pyxis_cluster.wait_for_job(job, "COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")
    output = pyxis_cluster.job_output(job)
    assert finished["JobState"] == "COMPLETED", output
    assert output.splitlines() == ["1", "plain step ran"], output


def test_the_example_is_accepted_up_to_the_registry(pyxis_cluster):
    job = pyxis_cluster.sbatch(*ON_THIS_MACHINE, script=example_script())
    finished = pyxis_cluster.wait_for_job(job, "COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")
    output = pyxis_cluster.job_output(job)
    assert finished["JobState"] == "FAILED", output
    # sbatch and srun took every option; slurmstepd's Pyxis got them and had Enroot import the
    # image, which got as far as the registry, where this machine ends.
    assert "pyxis: importing docker image: nvcr.io#nvidia/pytorch:25.09-py3" in output, output
    assert "[INFO] Querying registry for permission grant" in output, output
    assert "curl: (6) Could not resolve host: nvcr.io" in output, output
    assert "pyxis: failed to import docker image" in output, output
    # Enroot ran with the rendered enroot.conf: its per-user directories, none elsewhere.
    runtime = Path(pyxis_cluster.config.pools[0].containers.runtime_path)
    assert sorted(path.name for path in runtime.iterdir()) == [f"user-{NOBODY_UID}"]
    # Each user's own: Enroot, as the job's user, worked in it; another user can neither look in nor add.
    mine = runtime / f"user-{NOBODY_UID}"
    assert (mine.stat().st_uid, stat.S_IMODE(mine.stat().st_mode)) == (NOBODY_UID, 0o700)
    for attempt in (["ls", str(mine)], ["mkdir", str(runtime / "user-1")]):
        tried = subprocess.run(["runuser", "-u", OTHER_USER, "--", *attempt], capture_output=True, text=True)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, (attempt, tried.stderr)
    pyxis_cluster.wait_for_node_state(pyxis_cluster.local_node, "IDLE")
