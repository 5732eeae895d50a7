"""Helpers of the real-node tier (see conftest.py): its world, its stack config, its shared directory."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

# The node tier drives the engine exactly as the e2e tier does: share its helpers; and it prepares
# its shared directory with the tool `make up` uses.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import e2e_support  # noqa: E402
from dualsched.components.slurm_files import ACCOUNTING_SERVICE, CONTROLLER_SERVICE, DATABASE_SERVICE  # noqa: E402
from dualsched.config.loader import parse_stack_config  # noqa: E402
from e2e_support import TIMINGS, TOOLS, VENV, Scope, World, copy_project, load_env, raw_config, tail  # noqa: E402
from seed_shared import seed_shared  # noqa: E402
from control_plane import control_plane_ports  # noqa: E402

JOB_USER_UID = 2001
"""alice, the local stack's job user: owns the job and model directories on the shared file system."""


OWNER_FILES = {"host": Path("/run/dualsched-node/host-node"), "namespaced": Path("/run/dualsched-node/namespaced-nodes")}
"""The cluster dir whose real nodes of each kind run on this machine (tools/node.sh): this machine itself (the
one-node tier's), namespaced ones (`make up`'s and the multi-node tier's)."""


SLURM_DAEMONS = Scope("slurm", f"app.kubernetes.io/name in ({CONTROLLER_SERVICE},{ACCOUNTING_SERVICE},{DATABASE_SERVICE})",
                      every_container=True, lines=200)
"""The pods of a Slurm that does not answer: every slurmctld (primary and backup), slurmdbd and the accounting
database, each container's state, restarts and log tail (its previous run's too), Ready or not."""
SLURM_QUESTIONS = (("scontrol", "ping"), ("sacctmgr", "show", "cluster"))
"""Asked inside slurmctld-0 when Slurm does not answer: which controllers answer, and whether slurmdbd does and
knows the cluster."""


class NodeWorld(World):
    shared: Path

    def diagnose_slurm(self, why: str, namespace: str) -> None:
        """Write DIAGNOSTICS/<world>-slurm-<time>.log, at most once a minute: what SLURM_QUESTIONS got in slurmctld-0
        (each ended by `timeout` after BOUND seconds, and kubectl too: they may hang), then SLURM_DAEMONS' pods in
        ``namespace`` (World.diagnose_pods). For a wait on Slurm that timed out while every pod was Ready. No
        environment, Secret or ConfigMap is read."""
        if not self.due(SLURM_DAEMONS.kind):
            return
        bound = e2e_support.BOUND
        answers = []
        for question in SLURM_QUESTIONS:
            answer = self.bounded("exec", "-n", namespace, "slurmctld-0", "-c", "slurmctld", "--", "timeout", str(bound), *question,
                                  seconds=bound + 10)  # fmt: skip
            asked = f"`{' '.join(question)}` in {namespace}/slurmctld-0 (`timeout {bound}`: exit 124 when it did not answer)"
            answers.append(f"--- {asked}\n{answer}")
        self.diagnose_pods(why, namespace, scope=SLURM_DAEMONS, found=answers)

    def node(self, *args: str, check: bool = True):
        return self.run([str(TOOLS / "node.sh"), *args], check=check, timeout=900)

    def container_pid(self, container_id: str) -> int:
        """The host pid of a container's first process (``containerd://<id>`` or ``<id>``), from this
        node's containerd."""
        container_id = container_id.removeprefix("containerd://")
        socket = self.cluster_dir / "node" / "containerd" / "containerd.sock"
        tasks = self.run(["ctr", "--address", str(socket), "-n", "k8s.io", "tasks", "ls"]).stdout
        pids = [int(line.split()[1]) for line in tasks.splitlines()[1:] if line.split()[0] == container_id]
        assert len(pids) == 1, (container_id, tasks)
        return pids[0]


class NoAnswer(str):
    """A command's error: false to wait_until, which shows its text when it gives up."""

    def __bool__(self) -> bool:
        return False


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 240, every: float = 2,
               on_timeout: Callable[[str], None] = lambda message: None) -> Any:
    """``probe()``'s first true answer within ``timeout`` seconds; when none came, ``on_timeout`` is told why and
    the test fails."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    message = f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})"
    on_timeout(message)
    pytest.fail(message)


def wait_for_slurm(world: NodeWorld, namespace: str, what: str, probe: Callable[[], Any], timeout: float = 240,
                   every: float = 2) -> Any:
    """wait_until for an answer from Slurm in ``namespace``. A Slurm command that failed ("Socket timed out on
    send/recv operation": a controller starting, restarting or stuck) is no answer yet, not the test's end; when
    the time is up, the world records Slurm's daemons (NodeWorld.diagnose_slurm) before the test fails: their
    pods may all be Ready, and be gone once the test ends."""
    def answer() -> Any:
        try:
            return probe()
        except pytest.fail.Exception as failed:  # World.run's, for a command that failed
            return NoAnswer(str(failed))

    return wait_until(what, answer, timeout, every, on_timeout=lambda message: world.diagnose_slurm(message, namespace))


def free_the_machine(kind: str, say: Callable[[str], None]) -> None:
    """Real nodes are one set of each kind per machine: those of the same kind of another cluster dir (`make
    up`'s, or a kept test world) are stopped, with their control plane, and the tier says so. The other kind's
    run on: the one-node and multi-node tiers run at once."""
    owner = OWNER_FILES[kind]
    other = owner.read_text().strip() if owner.exists() else ""
    if not other or not Path(other).exists():
        return
    say(f"stopping the {kind} real nodes and control plane of {other} (`make up`'s cluster, or a kept test "
        f"world): this tier runs nodes of its own; `make up` brings them back")
    env = {**os.environ, "DUALSCHED_CLUSTER_DIR": other}
    for script in ("node.sh", "cluster.sh"):
        subprocess.run([str(TOOLS / script), "down"], env=env, capture_output=True, timeout=900)


@contextlib.contextmanager
def node_world_running(tmp: Path, config: dict, nodes: Optional[int], keep: str) -> Iterator[NodeWorld]:
    """A private control plane, real nodes joined to it (``nodes`` namespaced ones, or this machine
    itself when None) and a copy of the project whose program is tests/node/program.py; all stopped and
    removed at the end unless the environment variable ``keep`` is 1."""
    if os.geteuid() != 0:
        pytest.fail("real nodes run containerd, kubelets and network namespaces: run this tier as root")
    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} missing: run `make venv`")
    free_the_machine("host" if nodes is None else "namespaced", lambda message: print(f"\n[node] {message}", file=sys.stderr))
    cluster_dir = tmp / "cluster"
    env = load_env(tmp, cluster_dir, control_plane_ports())
    if nodes is not None:
        env["DUALSCHED_NODES"] = str(nodes)
    project = tmp / "project"
    copy_project(project)
    shutil.copy2(Path(__file__).parent / "program.py", project / "__main__.py")
    world = NodeWorld(tmp=tmp, env=env, project=project, cluster_dir=cluster_dir)
    world.shared = shared_directory(config)
    start = time.monotonic()
    try:
        started = world.cluster("up", "none", check=False)
        if started.returncode != 0:
            pytest.fail(f"could not start the control plane (tools/cluster.sh up none):\n{tail(started.stdout)}\n{tail(started.stderr)}")
        TIMINGS.append((f"{'multi-node: ' if nodes else ''}control plane start (cluster.sh up none)", time.monotonic() - start))
        start = time.monotonic()
        joined = world.node("up", check=False)
        if joined.returncode != 0:
            pytest.fail(f"the real nodes did not start (tools/node.sh up):\n{tail(joined.stdout)}\n{tail(joined.stderr)}")
        what = f"multi-node: {nodes} real nodes start" if nodes else "real node start"
        TIMINGS.append((f"{what} (node.sh up: containerd, images, kubelet, proxy, DNS)", time.monotonic() - start))
        yield world
    finally:
        if os.environ.get(keep) == "1":
            print(f"\n[node] kept: KUBECONFIG={cluster_dir / 'kubeconfig'} project={project} shared={world.shared} "
                  f"(DUALSCHED_CLUSTER_DIR={cluster_dir} tools/node.sh down; tools/cluster.sh down)", file=sys.stderr)
        else:
            world.node("down", check=False)
            world.cluster("down", check=False)
            shutil.rmtree(world.shared, ignore_errors=True)


# ---------------------------------------------------------------- GPUs of the device plugin double

GPU_MAJOR = 195
"""NVIDIA's character major: GPU K is the device 195:K (the double's /dev/nvidiaK on the host)."""
KUBELET_CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
GPU_PROBE_PREFIX = "/dev/dualsched-gpuprobe"

GPU_PROBE = r"""#!/bin/bash
# For each GPU device file in view (the runtime's /dev/nvidia*, and the probes the test put in /dev):
# "<path> <major> <minor> <what open() gave>", OPENED or strerror (ENXIO: the device cgroup let it through).
LC_ALL=C
for f in /dev/nvidia* /dev/dualsched-gpuprobe*; do
  [ -e "$f" ] || continue
  dev=$(stat -c '%t %T' "$f")
  if err=$( { exec 3<"$f"; } 2>&1 ); then result=OPENED; else result=${err##*: }; fi
  echo "$f $((16#${dev% *})) $((16#${dev#* })) $result"
done
"""
"""Run by bash in a container or a Slurm job. Only bash and coreutils: the Slurm image has no Python."""

_ERRNO_NAMES = {os.strerror(code): errno.errorcode[code] for code in (errno.ENXIO, errno.EPERM, errno.ENOENT, errno.EACCES)}


def gpu_probe_results(output: str) -> dict[str, tuple[int, str]]:
    """GPU_PROBE's output: path -> (GPU index, ENXIO | EPERM | ... | OPENED). Only NVIDIA's major counts."""
    results = {}
    for line in output.splitlines():
        path, major, minor, outcome = line.split(" ", 3)
        assert int(major) == GPU_MAJOR, line
        results[path] = (int(minor), _ERRNO_NAMES.get(outcome, outcome))
    return results


def may_open(results: dict[str, tuple[int, str]], prefix: str) -> set[int]:
    """The GPUs whose files under ``prefix`` the device cgroup let open (ENXIO: allowed, no driver)."""
    return {gpu for path, (gpu, outcome) in results.items() if path.startswith(prefix) and outcome == "ENXIO"}


def outcomes(results: dict[str, tuple[int, str]], prefix: str) -> dict[int, str]:
    """GPU index -> what open() of its file under ``prefix`` gave."""
    return {gpu: outcome for path, (gpu, outcome) in results.items() if path.startswith(prefix)}


def kubelet_gpu_allocations() -> dict[tuple[str, str], set[int]]:
    """What the kubelet's device manager allocated, from its checkpoint: (pod UID, container) -> GPU indices."""
    data = json.loads(KUBELET_CHECKPOINT.read_text())["Data"]
    allocations: dict[tuple[str, str], set[int]] = {}
    for entry in data["PodDeviceEntries"]:
        if entry["ResourceName"] != "nvidia.com/gpu":
            continue
        ids = entry["DeviceIDs"]  # per NUMA node since 1.20: {"-1": ["gpu1", "gpu0"]}
        ids = [i for group in ids.values() for i in group] if isinstance(ids, dict) else ids
        allocations.setdefault((entry["PodUID"], entry["ContainerName"]), set()).update(
            int(i.removeprefix("gpu")) for i in ids)
    return allocations


def registered_gpus() -> set[int]:
    data = json.loads(KUBELET_CHECKPOINT.read_text())["Data"]
    return {int(i.removeprefix("gpu")) for i in data["RegisteredDevices"]["nvidia.com/gpu"]}


@contextlib.contextmanager
def gpu_files_in(pid: int, gpus: int) -> Iterator[None]:
    """Put a device file for every GPU (195:0..gpus-1, mode 0666) in the /dev of the container whose
    process is ``pid`` (from the host, through /proc/PID/root), and remove them afterwards: then the
    container's device cgroup, not the absence of a file, decides which GPUs open."""
    dev = Path(f"/proc/{pid}/root/dev")
    paths = [dev / f"{Path(GPU_PROBE_PREFIX).name}{k}" for k in range(gpus)]
    try:
        for k, path in enumerate(paths):
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(GPU_MAJOR, k))
            os.chmod(path, 0o666)
        yield
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


ONE_NODE_POOL = {
    "name": "gpu", "nodes": "gpu-real-1", "mode": "partitioned", "gpusPerNode": 4, "slurmGpus": 2,
    "cpus": 1, "realMemoryMb": 4096, "allocatable": {"cpus": 2, "memoryMb": 16384}, "memSpecLimitMb": 512,
}
"""This tier's one node, this machine itself (tools/node.sh without DUALSCHED_NODES): its kubelet offers pods
2 CPUs and ~23 GiB; Slurm takes 1 CPU and 4 GiB of it, 2 of its 4 GPUs."""

ONE_NODE_CIDRS = ["192.0.2.0/24", "10.244.0.1/32"]
"""This machine's eth0 network (the node, slurmd on the host network, and the API server) and the CNI bridge's
own address, which host-network traffic to a pod on this node comes from: slurmd registers from it."""


def one_node_config() -> dict:
    """The checkout's local stack (four namespaced nodes) on this tier's one node."""
    config = raw_config("local")
    config["pools"] = [dict(ONE_NODE_POOL)]
    config["slurm"]["partitions"][0]["pools"] = ["gpu"]
    config["network"] = {"nodeCidrs": list(ONE_NODE_CIDRS)}
    # one node: no backup controller to take over from it
    controller = config["slurm"]["controller"]
    for key in ("ha", "slurmctldTimeout"):
        controller.pop(key)
    controller["stateStorage"].pop("accessMode")
    return config


def shared_directory(config: dict) -> Path:
    """The hostPath "shared file system" of a world, prepared as `make up` prepares the local stack's."""
    path = Path(tempfile.mkdtemp(prefix="dualsched-shared-", dir="/var/tmp"))
    seed_shared(parse_stack_config(with_shared_path(config, path), "Pulumi.local.yaml"))
    return path


def with_shared_path(config: dict, path: Path) -> dict:
    config["storage"]["hostPath"]["path"] = str(path)
    return config


def local_config(world: NodeWorld, config: Optional[dict] = None) -> dict:
    """The checkout's local stack (by default on this tier's one node), its shared directory in this session's
    temp dir and its API server's port (a free one, not 6443) open to the token minter."""
    config = with_shared_path(config or one_node_config(), world.shared)
    config["network"]["apiServerPorts"] = [int(world.env["DUALSCHED_APISERVER_PORT"])]
    return config
