"""Helpers of the real-node tier (see conftest.py): its world, its stack config, its shared directory."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterator

# The node tier drives the engine exactly as the e2e tier does: share its helpers; and it prepares
# its shared directory with the tool `make up` uses.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from dualsched.config.loader import parse_stack_config  # noqa: E402
from e2e_support import TOOLS, World, raw_config  # noqa: E402
from seed_shared import seed_shared  # noqa: E402

JOB_USER_UID = 2001
"""alice, the local stack's job user: owns the job and model directories on the shared file system."""


class NodeWorld(World):
    shared: Path

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


def shared_directory() -> Path:
    """The hostPath "shared file system" of this session, prepared as `make up` prepares the local stack's."""
    path = Path(tempfile.mkdtemp(prefix="dualsched-shared-", dir="/var/tmp"))
    seed_shared(parse_stack_config(with_shared_path(raw_config("local"), path), "Pulumi.local.yaml"))
    return path


def with_shared_path(config: dict, path: Path) -> dict:
    config["storage"]["hostPath"]["path"] = str(path)
    return config


def local_config(world: NodeWorld) -> dict:
    """The checkout's local stack, its shared directory in this session's temp dir and its API server's
    port (a free one, not 6443) open to the token minter."""
    config = with_shared_path(raw_config("local"), world.shared)
    config["network"]["apiServerPorts"] = [int(world.env["DUALSCHED_APISERVER_PORT"])]
    return config
