"""The local stack on another Slurm release than Debian 12's 22.05, from Debian's own packages of it (forky's
26.05, past the 25.11 of the default images; tools/images.sh builds trixie's 24.11 the same way).

Each runs as a stack of its own (a fresh controller state and database: Slurm upgrades state by at most two
releases, never from 22.05), with the local stack's namespaces and names: so the local stack is removed
first where a module left one (two stacks never own the same objects, and the local stack's state never
lists objects that are gone), and this one at its end, namespaces included.

What this does not prove: SchedMD's own images (Slinky's ``slurm*:25.11.6-ubuntu24.04``, not pullable
here) with their other paths and accounts; docs/real-node.md lists what differs.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from e2e_support import TIMINGS, TOOLS, tail, up_or_diagnose
from node_support import NodeWorld
from test_real_node import STACK as LOCAL_STACK
from test_real_node import INFERENCE_NS, JOBS_NS, SLURM_NS, Cluster, all_ready, finished_job, job_logs, wait_until

SLURM_IMAGES = ("slurmctld", "slurmd", "slurmdbd", "slurmrestd")


@dataclass(frozen=True)
class SlurmRelease:
    suite: str
    """The Debian suite whose slurm-wlm it is (tools/images.sh, DUALSCHED_SLURM_SUITE)."""
    release: str
    version: str
    """What `slurmctld -V` prints: Debian's slurm-wlm version."""

    @property
    def image(self) -> str:
        return f"dualsched.local/slurm:{self.release}"

    @property
    def stack(self) -> str:
        return f"slurm-{self.release.replace('.', '-')}"

    def config(self, config: dict) -> dict:
        """``config`` with this release's image for every Slurm daemon, and no job steps in containers: Pyxis
        is built against Debian 12's Slurm only (tools/images.sh slurmd-pyxis)."""
        config["images"].update({name: self.image for name in SLURM_IMAGES})
        config["slurm"]["release"] = self.release
        for pool in config["pools"]:
            pool.pop("containers", None)
        return config

    def import_image(self, world: NodeWorld, nodes: Sequence[str] = ("node",), label: str = "") -> None:
        """Build the image if the cache lacks it and import it into each node's containerd (``nodes``: their
        directories under the cluster's, tools/node.sh)."""
        start = time.monotonic()
        for node in nodes:
            socket = world.cluster_dir / node / "containerd" / "containerd.sock"
            world.run(["env", f"DUALSCHED_SLURM_SUITE={self.suite}", str(TOOLS / "images.sh"), "import", "--address", str(socket), "slurm"],
                      timeout=900)  # fmt: skip
        TIMINGS.append((f"{label}{self.image} built or cached, imported", time.monotonic() - start))


def remove_stack(world: NodeWorld, stack: str) -> None:
    """Everything of the stack, what it keeps on delete too (namespaces and their claims): then the
    next stack starts from nothing. The ClusterName lock is protected on purpose: lift it."""
    env_cwd = ["--stack", stack, "--cwd", str(world.project), "--non-interactive"]
    listed = json.loads(world.run(["pulumi", "stack", "ls", "--json", "--cwd", str(world.project)]).stdout)
    if stack not in {entry["name"].rsplit("/", 1)[-1] for entry in listed}:
        return
    world.run(["pulumi", "state", "unprotect", "--all", "--yes", *env_cwd], check=False)
    destroyed = world.run(["pulumi", "destroy", "--yes", "--skip-preview", *env_cwd], check=False, timeout=600)
    world.kubectl("delete", "namespace", SLURM_NS, JOBS_NS, INFERENCE_NS, "--ignore-not-found", "--wait=true",
                  "--timeout=300s", timeout=330)  # fmt: skip
    world.cluster("pvs")  # the claims' static PVs are Released (Retain): keep the pool topped up
    assert destroyed.returncode == 0, tail(destroyed.stdout + destroyed.stderr)


def up_on(world: NodeWorld, release: SlurmRelease, config: dict, jobs: list[dict], label: str = "") -> None:
    """`pulumi up` of ``config`` on ``release``, its own stack, with ``jobs`` (tests/node/program.py)."""
    from pulumi import automation as auto

    stack = world.stack(release.stack, release.config(config))
    stack.set_config("nodetest:jobs", auto.ConfigValue(json.dumps(jobs)))
    start = time.monotonic()
    result = up_or_diagnose(world, stack, SLURM_NS, INFERENCE_NS, JOBS_NS)
    TIMINGS.append((f"{label}pulumi up of the local stack on Slurm {release.release}", time.monotonic() - start))
    assert result.summary.result == "succeeded", tail(result.stdout)


@contextlib.contextmanager
def deployed(world: NodeWorld, release: SlurmRelease, config: dict, jobs: list[dict], label: str = "") -> Iterator[None]:
    """``config`` on ``release`` as its own stack, with ``jobs``, in place of a local stack; removed at the end."""
    remove_stack(world, LOCAL_STACK)
    try:
        up_on(world, release, config, jobs, label)
        yield
    finally:
        remove_stack(world, release.stack)


def slurm_job_of(world: NodeWorld, job: dict) -> tuple[int, str]:
    """The Kubernetes Job ``job`` once it succeeded: the Slurm job it submitted (with a minted token) and what that
    job wrote to its ``--output`` on /shared."""
    k8s_job = wait_until("the sbatch Job to finish", lambda: finished_job(world, job["name"]), timeout=300)
    logs = job_logs(world, job["name"], "sbatch")
    assert k8s_job["status"].get("succeeded") == 1, logs + job_logs(world, job["name"], "slurm-token")
    job_id = int(re.search(r"Submitted batch job (\d+)", logs).group(1))
    [output] = [arg.removeprefix("--output=/shared/") for arg in job["args"] if arg.startswith("--output=")]
    return job_id, (world.shared / output.replace("%j", str(job_id))).read_text()


def every_pod_ready_on(cluster: Cluster, release: SlurmRelease, timeout: float = 420) -> None:
    """Every pod of the stack Ready, and every Slurm container running ``release``'s image."""
    for namespace in (SLURM_NS, INFERENCE_NS):
        wait_until(f"every pod in {namespace} Ready", lambda: all_ready(cluster.pods(namespace)), timeout=timeout)
    slurm_images = {c["image"] for pod in cluster.pods(SLURM_NS) for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
                    if c["image"].startswith("dualsched.local/slurm")}  # fmt: skip
    assert slurm_images == {release.image}
