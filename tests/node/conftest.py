"""The real-node tier: the stack's pods run on a real kubelet and container runtime.

One throw-away world per session, like the e2e tier's, plus a real node:

- a private control plane (``tools/cluster.sh up none``: no KWOK, free ports, its own dir);
- a real node joined to it (``tools/node.sh up``): containerd and runc, CNI bridge, kubelet,
  kube-proxy, CoreDNS and the GPU device plugin double, with the images of ``tools/images.sh``;
- a copy of the project whose program is ``tests/node/program.py`` (the project's program plus an
  optional sbatch Job), with the ``local`` stack config and its shared directory in a temp dir.

Everything is stopped and removed at the end (``DUALSCHED_NODE_KEEP=1`` keeps it). A missing
tool or a node that does not start is a FAILURE with the command that fixes it, never a skip.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from node_support import NodeWorld, shared_directory
from e2e_support import TIMINGS, VENV, copy_project, load_env, tail
from tools.control_plane import control_plane_ports


@pytest.fixture(scope="session")
def node_world(tmp_path_factory) -> NodeWorld:
    if os.geteuid() != 0:
        pytest.fail("the real-node tier runs containerd, a kubelet and network namespaces: run it as root")
    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} missing: run `make venv`")
    tmp = tmp_path_factory.mktemp("node")
    cluster_dir = tmp / "cluster"
    ports = control_plane_ports()
    env = load_env(tmp, cluster_dir, ports)
    project = tmp / "project"
    copy_project(project)
    shutil.copy2(Path(__file__).parent / "program.py", project / "__main__.py")
    world = NodeWorld(tmp=tmp, env=env, project=project, cluster_dir=cluster_dir)
    world.shared = shared_directory()
    start = time.monotonic()
    try:
        started = world.cluster("up", "none", check=False)
        if started.returncode != 0:
            pytest.fail(f"could not start the control plane (tools/cluster.sh up none):\n{tail(started.stdout)}\n{tail(started.stderr)}")
        TIMINGS.append(("control plane start (cluster.sh up none)", time.monotonic() - start))
        start = time.monotonic()
        joined = world.node("up", check=False)
        if joined.returncode != 0:
            pytest.fail(f"the real node did not start (tools/node.sh up):\n{tail(joined.stdout)}\n{tail(joined.stderr)}")
        TIMINGS.append(("real node start (node.sh up: containerd, images, kubelet, proxy, DNS)", time.monotonic() - start))
        yield world
    finally:
        if os.environ.get("DUALSCHED_NODE_KEEP") == "1":
            print(f"\n[node] kept: KUBECONFIG={cluster_dir / 'kubeconfig'} project={project} shared={world.shared} "
                  f"(DUALSCHED_CLUSTER_DIR={cluster_dir} tools/node.sh down; tools/cluster.sh down)", file=sys.stderr)
        else:
            world.node("down", check=False)
            world.cluster("down", check=False)
            shutil.rmtree(world.shared, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("node tier timings")
        for what, seconds in TIMINGS:
            terminalreporter.write_line(f"{seconds:7.1f} s  {what}")

