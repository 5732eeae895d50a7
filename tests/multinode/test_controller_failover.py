"""The loss of the primary controller's node, as a power loss would take it (tools/node.sh fail: link
cut, daemons stopped, its pods' processes killed): the backup slurmctld on another node takes over with
every job, schedules meanwhile, and hands control back when the node returns."""

from __future__ import annotations

import re
import time

import pytest

from e2e_support import TIMINGS
from node_support import NoAnswer
from test_real_node import SLURM_CONF_CACHE, SLURM_NS, all_ready, wait_until

from .multi_node_support import DEDICATED, Nodes, completed, controller_state, held, release

pytestmark = pytest.mark.multinode


def client(nodes: Nodes, *command: str):
    """A Slurm client command on the dedicated node, which no failover test takes away (the controller pods'
    nodes may be gone: kubectl exec there would hang). It reaches whichever slurmctld is in control."""
    return nodes.exec(SLURM_NS, nodes.slurmd_pod_on(DEDICATED), "slurmd", "env", f"SLURM_CONF={SLURM_CONF_CACHE}",
                      *command, check=False)  # fmt: skip


def squeue_states(nodes: Nodes, *job_ids: int) -> dict[int, str] | NoAnswer:
    """Job states from the slurmctld in control; NoAnswer while none answers."""
    result = client(nodes, "squeue", "--noheader", "--states=all", "--format=%i %T", f"--jobs={','.join(map(str, job_ids))}")
    if result.returncode != 0:
        return NoAnswer(result.stderr.strip())
    return {int(job): state for job, state in (line.split() for line in result.stdout.splitlines() if line.strip())}


def controllers_up(nodes: Nodes) -> dict[str, str]:
    """`scontrol ping`: "primary"/"backup" -> "UP"/"DOWN"."""
    return dict(re.findall(r"Slurmctld\((primary|backup)\) at \S+ is (UP|DOWN)", client(nodes, "scontrol", "ping").stdout))


def backup_log(nodes: Nodes) -> str:
    """The end of slurmctld-1's log, for a failure message."""
    result = nodes.world.kubectl("logs", "-n", SLURM_NS, "slurmctld-1", "-c", "slurmctld", "--tail=15", check=False)
    return (result.stdout + result.stderr).strip()


def test_the_backup_controller_takes_over_from_a_lost_node_and_the_primary_comes_back_with_every_job(nodes):
    world = nodes.world
    placed = {name: nodes.pod(SLURM_NS, name)["spec"]["nodeName"] for name in ("slurmctld-0", "slurmctld-1")}
    primary_node = placed["slurmctld-0"]
    assert primary_node != placed["slurmctld-1"], placed  # spread: one node lost takes one controller
    assert DEDICATED not in placed.values()

    def submit(*args: str, node: str = DEDICATED) -> int:
        out = nodes.as_user(DEDICATED, "alice", "sbatch", "--parsable", f"--nodelist={node}", "--mem=128M",
                            "--time=10", "--output=/dev/null", *args)  # fmt: skip
        return int(out.strip().split(";")[0])

    running = submit(held("failover"))  # outlasts the outage and the return: the test ends it
    pending = submit("--begin=now+3600", "--wrap=true")
    wait_until("the long job to run", lambda: (squeue_states(nodes, running) or {}).get(running) == "RUNNING", timeout=120)
    # The backup starts from the state the primary saved, and slurmctld saves a change some seconds later, not at
    # once: lose the node once the running job is on disk, as it would be on a cluster that has been up a while.
    # Whether the save after the job's start came before this line or is still to come cannot be told from the
    # file's time, so a reconfigure has the primary save all its state now (save_all_state, proc_req.c). That
    # includes last_tres, without which a backup that cannot reach the database (it may be on the lost node)
    # exits, "we have no TRES from it"; on its own, the primary first writes it 300 s after it starts
    # (PERIODIC_CHECKPOINT), see docs/multi-node.md.
    saved = [controller_state(nodes) / name for name in ("job_state", "last_tres")]
    asked = time.time()
    nodes.slurm("scontrol", "reconfigure")
    wait_until("the primary to save the running job and the TRES",
               lambda: all(f.exists() and f.stat().st_mtime > asked for f in saved), timeout=60)  # fmt: skip

    lost = time.monotonic()
    world.node("fail", primary_node)
    try:
        wait_until("the primary to stop answering", lambda: controllers_up(nodes).get("primary") == "DOWN", timeout=120)
        states = nodes.wait_for_slurm("the backup to answer for the jobs", lambda: squeue_states(nodes, running, pending) or
                                      NoAnswer(f"{squeue_states(nodes, running, pending)}; the backup's log: {backup_log(nodes)}"),
                                      timeout=300)  # fmt: skip
        takeover = time.monotonic() - lost
        TIMINGS.append((f"multi-node: backup slurmctld in control after {primary_node} was lost", takeover))
        assert states == {running: "RUNNING", pending: "PENDING"}, states
        # the backup schedules: a job submitted while the primary is gone runs to completion (on the node that
        # is left: the dedicated node's one CPU is the long job's)
        during = submit("--wrap=true", node=placed["slurmctld-1"])
        nodes.wait_for_slurm(f"job {during} to complete under the backup",
                             lambda: (squeue_states(nodes, during) or {}).get(during) == "COMPLETED", timeout=180)  # fmt: skip
    finally:
        back = time.monotonic()
        world.node("recover", primary_node)
    wait_until("slurmctld-0 Ready again", lambda: all_ready([nodes.pod(SLURM_NS, "slurmctld-0")]), timeout=300, every=5)
    nodes.wait_for_slurm("both controllers answering", lambda: controllers_up(nodes) == {"primary": "UP", "backup": "UP"}, timeout=240)
    TIMINGS.append((f"multi-node: {primary_node} back, primary slurmctld answering", time.monotonic() - back))
    # the primary, restarted, takes control back with the state the backup kept (the backup restarts into
    # standby meanwhile, and for a few seconds neither answers): every job is still there
    states = nodes.wait_for_slurm("the primary to answer for the jobs", lambda: squeue_states(nodes, running, pending), timeout=300)
    assert states == {running: "RUNNING", pending: "PENDING"}, states
    assert nodes.slurm("scontrol", "show", "job", str(pending)).count("JobState=PENDING") == 1
    release(nodes, "failover")
    nodes.wait_for_slurm(f"job {running} COMPLETED in sacct", lambda: completed(nodes, running), timeout=120, every=3)
    nodes.slurm("scancel", str(pending))
