"""The e2e tier: the real Pulumi engine (Automation API + the built CLI) on a real API server.

Every session gets its own throw-away world, so a run never depends on or disturbs what
`make up` deployed and two runs in a row behave the same:

- a private local cluster (``tools/cluster.sh up`` with its own ``DUALSCHED_CLUSTER_DIR`` and free
  ports) with the dev nodes plus ``tools/kwok/e2e-extra-nodes.yaml``, stopped at the end
  (``DUALSCHED_E2E_KEEP=1`` keeps it and prints where it is);
- a copy of the project in a temp dir (the committed ``Pulumi.<stack>.yaml`` files are never
  written: Pulumi adds the passphrase salt to the stack file, and tests rewrite the config), whose
  ``Pulumi.yaml`` points at the checkout's ``.venv`` by absolute path;
- a file backend and a ``PULUMI_HOME`` (plugin cache) in the temp dir.

The tools come from ``tools/pulumi-env.sh`` (sourced in bash, its environment loaded). A missing
tool, venv or cluster start failure is a test FAILURE with the command that fixes it, never a skip.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from e2e_support import TIMINGS, TOOLS, VENV, World, copy_project, load_env, tail
from tools.host_keeper import HostKeeper
from tools.control_plane import control_plane_ports


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} missing: run `make venv`")
    tmp = tmp_path_factory.mktemp("e2e")
    cluster_dir = tmp / "cluster"
    ports = control_plane_ports()
    env = load_env(tmp, cluster_dir, ports)
    copy_project(tmp / "project")
    w = World(tmp=tmp, env=env, project=tmp / "project", cluster_dir=cluster_dir)
    start = time.monotonic()
    started = w.cluster("up", check=False)
    try:
        if started.returncode != 0:
            pytest.fail(f"could not start the e2e cluster (tools/cluster.sh up):\n{tail(started.stdout)}\n{tail(started.stderr)}")
        extra = w.cluster("up", str(TOOLS / "kwok" / "e2e-extra-nodes.yaml"), check=False)
        if extra.returncode != 0:
            pytest.fail(f"could not add the extra e2e nodes:\n{tail(extra.stdout)}\n{tail(extra.stderr)}")
        TIMINGS.append(("private cluster start (cluster.sh up, 6 nodes)", time.monotonic() - start))
        # writes the pools' labels and taints, as the node keeper's pod would on real nodes (tools/host_keeper.py)
        keeper = HostKeeper(cluster_dir, env, w.keeper_log.append)
        keeper.start()
        try:
            yield w
        finally:
            keeper.stop()
            print("\n[e2e] host keeper:\n" + "\n".join(w.keeper_log[-40:]), file=sys.stderr)
    finally:
        if os.environ.get("DUALSCHED_E2E_KEEP") == "1":
            print(f"\n[e2e] kept: KUBECONFIG={cluster_dir / 'kubeconfig'} project={w.project} (tools/cluster.sh down "
                  f"with DUALSCHED_CLUSTER_DIR={cluster_dir})", file=sys.stderr)
        else:
            w.cluster("down", check=False)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("e2e timings")
        for what, seconds in TIMINGS:
            terminalreporter.write_line(f"{seconds:7.1f} s  {what}")
