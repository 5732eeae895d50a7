"""QOS, preemption and accounts as code, on real Slurm. The stack config's slurm.qos, slurm.accounts and
slurm.preemption render slurm.conf (PreemptType=preempt/qos, AccountingStorageEnforce) and the
accounting-state file; the program the controller's sidecar runs (components/programs/accounting_state.sh)
makes the real slurmdbd hold those QOS, accounts and associations. Then a job of a QOS that may preempt
takes the GPUs of a running requeueable job of a QOS it preempts: that job is requeued and runs again
once the GPUs are free. A QOS the user's association does not allow is refused at submission.

Jobs run as two host users the test makes (and removes): with associations enforced, slurmctld needs
the job's uid to be a user with an association, and config.checks keeps the harness's `nobody` out of
slurm.users."""

from __future__ import annotations

import copy
import pwd
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from dualsched.components.slurm_files import ACCOUNTING_STATE_FILE
from harness import WAIT, LocalCluster, wait_until

pytestmark = pytest.mark.slurm

PROGRAM = Path(__file__).resolve().parents[2] / "components" / "programs" / "accounting_state.sh"
TRAINER, SERVER = "dsqtrain", "dsqserve"
USERS = {TRAINER: 61001, SERVER: 61002}
REQUEUE_WAIT = 240.0
"""A requeued job waits for its first run to end (SIGTERM, KillWait) and for its new BeginTime."""


def with_qos(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with two QOS (high preempts low, requeueing its jobs) and two accounts under one parent."""
    changed = copy.deepcopy(raw)
    slurm = changed["slurm"]
    slurm["users"] = [{"name": name, "uid": uid} for name, uid in USERS.items()]
    slurm["preemption"] = {"type": "qos", "mode": "requeue"}
    slurm["qos"] = [
        {"name": "low", "priority": 10, "usageFactor": 0.5, "maxWall": "1:00:00"},
        {"name": "high", "priority": 1000, "preempt": ["low"], "preemptMode": "cluster",
         "preemptExemptTime": "0:30", "maxTresPerUser": {"gpus": 2}, "grpTres": {"gpus": 2, "nodes": 1},
         "maxJobsPerUser": 4},
    ]  # fmt: skip
    slurm["accounts"] = [
        {"name": "research", "fairshare": 10},
        {"name": "training", "parent": "research", "fairshare": 3, "qos": ["low"], "users": [TRAINER]},
        {"name": "serving", "parent": "research", "qos": ["high", "low"], "defaultQos": "high", "users": [SERVER]},
    ]
    return changed


def apply_state(cluster: LocalCluster) -> subprocess.CompletedProcess:
    """What the reconfigure sidecar runs every round, here as SlurmUser (root at this site)."""
    return subprocess.run(
        ["sh", str(PROGRAM), str(cluster.etc / ACCOUNTING_STATE_FILE)],
        env=cluster.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def restart_slurmctld(cluster: LocalCluster) -> None:
    """AccountingStorageEnforce takes effect at slurmctld's start only (slurm.conf(5))."""
    cluster.stop_daemon("slurmctld")
    cluster.start_slurmctld()
    cluster.wait_for_node_state(cluster.local_node, "IDLE")


def restart_slurmdbd(cluster: LocalCluster) -> None:
    """slurmdbd reads slurmdbd.conf at start (PrivateData comes with accounts): its pod restarts on a change
    of the file (components/accounting.py), slurmctld reconnects."""
    cluster.stop_daemon("slurmdbd")
    cluster.start_slurmdbd()


def show(cluster: LocalCluster, *args: str) -> list[list[str]]:
    out = cluster.run("sacctmgr", "--noheader", "--parsable2", "show", *args)
    return [line.split("|") for line in out.splitlines() if line]


def qos_held(cluster: LocalCluster) -> dict[str, list[str]]:
    rows = show(cluster, "qos", "format=Name,Priority,Preempt,PreemptMode,PreemptExemptTime,UsageFactor,MaxWall,"
                "MaxTRESPU,GrpTRES,MaxJobsPU,Description")
    return {row[0]: row[1:] for row in rows}


def associations(cluster: LocalCluster) -> set[tuple[str, ...]]:
    rows = show(cluster, "association", "where", "cluster=local", "format=Account,User,ParentName,Fairshare,QOS,DefaultQOS")
    return {tuple(row) for row in rows}


def sbatch_as(cluster: LocalCluster, user: str, *options: str, script: str) -> subprocess.CompletedProcess:
    jobs = cluster.root / "jobs"
    jobs.mkdir(exist_ok=True)
    jobs.chmod(0o1777)
    path = jobs / f"job-{time.monotonic_ns()}.sh"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o644)
    return subprocess.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", f"--chdir={jobs}", f"--output={jobs}/job-%j.out",
         "--open-mode=append", *options, str(path)],
        env=cluster.env, capture_output=True, text=True, timeout=30, cwd=cluster.root,
    )  # fmt: skip


def submit(cluster: LocalCluster, user: str, *options: str, script: str) -> int:
    result = sbatch_as(cluster, user, *options, script=script)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip().split(";")[0])


@pytest.fixture(scope="module")
def host_users() -> Iterator[None]:
    """The job users, on this host as the pods' passwd file has them (name, uid, a group of the same id)."""
    made = []
    for name, uid in USERS.items():
        try:
            assert pwd.getpwnam(name).pw_uid == uid, f"host user {name} exists with another uid"
        except KeyError:
            subprocess.run(["useradd", "--uid", str(uid), "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            name], check=True, capture_output=True)  # fmt: skip
            made.append(name)
    try:
        yield
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def qos_cluster(cluster: LocalCluster, local_raw: dict[str, Any], host_users: None) -> Iterator[LocalCluster]:
    """The shared cluster with the QOS config applied; afterwards its own config, enforcement off again,
    and none of what the program made left in slurmdbd."""
    cluster.apply(with_qos(local_raw))
    restart_slurmdbd(cluster)
    try:
        yield cluster
    finally:
        for user in USERS:
            cluster.run("scancel", f"--user={user}", check=False)
        wait_until("the test's jobs to end", lambda: not cluster.active_job_ids(), WAIT)
        cluster.apply(local_raw)
        restart_slurmdbd(cluster)
        apply_state(cluster)
        restart_slurmctld(cluster)


def test_a_high_qos_job_preempts_a_requeueable_low_qos_job_which_runs_again(qos_cluster: LocalCluster):
    cluster = qos_cluster
    state = (cluster.etc / ACCOUNTING_STATE_FILE).read_text()
    assert "PreemptType=preempt/qos" in (cluster.etc / "slurm.conf").read_text()

    created = apply_state(cluster)

    assert (created.returncode, created.stderr) == (0, "")
    assert created.stdout.splitlines() == [
        "added qos low",
        "added qos high",
        "set qos low: Priority=10 UsageFactor=0.500000 MaxWall=01:00:00",
        "set qos high: Priority=1000 Preempt=low PreemptExemptTime=00:00:30 MaxTRESPerUser=gres/gpu=2 "
        "GrpTRES=gres/gpu=2,node=1 MaxJobsPerUser=4",
        "added account research: Parent=root Fairshare=10 QOS=normal DefaultQOS=normal",
        "added account training: Parent=research Fairshare=3 QOS=low DefaultQOS=low",
        "added account serving: Parent=research Fairshare=1 QOS=high,low DefaultQOS=high",
        f"added user {TRAINER} to account training",
        f"added user {SERVER} to account serving",
    ], state
    qos = qos_held(cluster)
    assert qos["high"] == ["1000", "low", "cluster", "00:00:30", "1.000000", "", "gres/gpu=2", "gres/gpu=2,node=1", "4",
                           "dualsched:local"]  # fmt: skip
    assert qos["low"] == ["10", "", "cluster", "", "0.500000", "01:00:00", "", "", "", "dualsched:local"]
    assert qos["normal"][-1] == "Normal QOS default"  # Slurm's own: untouched
    assert {
        ("research", "", "root", "10", "normal", "normal"),
        ("training", "", "research", "3", "low", "low"),
        ("serving", "", "research", "1", "high,low", "high"),
        ("training", TRAINER, "", "1", "low", "low"),
        ("serving", SERVER, "", "1", "high,low", "high"),
    } <= associations(cluster)

    # Everything in place: nothing to do, and nothing done.
    again = apply_state(cluster)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")

    restart_slurmctld(cluster)  # AccountingStorageEnforce=associations,limits,qos

    # A QOS the association does not allow is refused at submission.
    refused = sbatch_as(cluster, TRAINER, "--qos=high", "--gres=gpu:1", "--mem=100M", "--time=5", script="true\n")
    assert refused.returncode != 0
    assert "Invalid qos specification" in refused.stderr, refused.stderr
    # So is a user in no account (here root's own `nobody`: jobs need an association).
    stranger = sbatch_as(cluster, "nobody", "--gres=gpu:1", "--mem=100M", "--time=5", script="true\n")
    assert stranger.returncode != 0 and "Invalid account or account/partition combination" in stranger.stderr, stranger.stderr

    # A requeueable training job holds every GPU of the node...
    low = submit(cluster, TRAINER, "--qos=low", "--requeue", "--gres=gpu:2", "--mem=100M", "--time=10",
                 script='echo "run ${SLURM_RESTART_COUNT:-0}"\n' + cluster.held_script())  # fmt: skip
    first = cluster.wait_for_job(low, "RUNNING")
    assert (first["QOS"], first["Account"], first["Restarts"]) == ("low", "training", "0")
    # ...until a job of a QOS that preempts it needs one: the training job is requeued, this one runs.
    high = submit(cluster, SERVER, "--gres=gpu:1", "--mem=100M", "--time=5", script=cluster.held_script("echo served\n"))
    running = cluster.wait_for_job(high, "RUNNING", timeout=REQUEUE_WAIT)
    assert (running["QOS"], running["Account"]) == ("high", "serving")  # the account's DefaultQOS
    requeued = cluster.job(low)
    assert requeued["JobState"] == "PENDING", requeued
    assert requeued["Restarts"] == "1" and requeued["Requeue"] == "1", requeued
    # slurmctld holds a requeued batch job back for a while (its EligibleTime, ~2 minutes on 22.05)
    assert requeued["Reason"] == "BeginTime", requeued["Reason"]
    assert f"preempted JobId={low} has been requeued to reclaim resources for JobId={high}" in cluster.log_tail("slurmctld", 400)

    # The GPUs free again, the training job runs again, a second time.
    cluster.release(high)
    assert cluster.wait_for_job(high, "COMPLETED")["ExitCode"] == "0:0"
    again = cluster.wait_for_job(low, "RUNNING", timeout=REQUEUE_WAIT)
    assert again["Restarts"] == "1"
    cluster.release(low)
    assert cluster.wait_for_job(low, "COMPLETED")["ExitCode"] == "0:0"
    # Both runs append to one output file; slurmstepd may add lines of its own between them.
    lines = cluster.job_output(low).splitlines()
    runs = [line for line in lines if line.startswith("run ")]
    [preempted] = [line for line in lines if line.endswith("DUE TO PREEMPTION ***")]
    assert runs == ["run 0", "run 1"], lines
    assert f"JOB {low} ON {cluster.local_node} CANCELLED AT" in preempted, lines
    assert lines.index(runs[0]) < lines.index(preempted) < lines.index(runs[1]), lines
    assert cluster.job_output(high) == "served\n"


def test_with_accounts_each_user_sees_only_their_own_jobs_in_accounting(qos_cluster: LocalCluster):
    """PrivateData in slurmdbd.conf: sacct shows a user the jobs of their own associations only."""
    cluster = qos_cluster
    assert "PrivateData=accounts,jobs,usage,users" in (cluster.etc / "slurmdbd.conf").read_text()
    assert apply_state(cluster).returncode == 0
    restart_slurmctld(cluster)
    jobs = {user: submit(cluster, user, "--mem=100M", "--time=5", script="true\n") for user in USERS}
    for job in jobs.values():
        cluster.wait_for_accounting(job, "COMPLETED")
    listed = ("sacct", "--noheader", "--parsable2", "--allocations", "--allusers", f"--jobs={','.join(map(str, jobs.values()))}",
              "--format=JobID,User")  # fmt: skip
    everything = {f"{job}|{user}" for user, job in jobs.items()}
    assert set(cluster.run(*listed).split()) == everything  # root
    for user, job in jobs.items():
        assert cluster.run("runuser", "-u", user, "--", *listed).split() == [f"{job}|{user}"]


def test_dropped_accounts_and_qos_go_but_not_while_jobs_use_them(qos_cluster: LocalCluster, local_raw: dict[str, Any]):
    cluster = qos_cluster
    assert apply_state(cluster).returncode == 0
    restart_slurmctld(cluster)
    job = submit(cluster, TRAINER, "--qos=low", "--gres=gpu:1", "--mem=100M", "--time=10", script=cluster.held_script())
    cluster.wait_for_job(job, "RUNNING")

    # The training account and the low QOS dropped while a job uses both: both are kept, and it says so.
    dropped = with_qos(local_raw)
    dropped["slurm"]["qos"] = [q for q in dropped["slurm"]["qos"] if q["name"] == "high"]
    dropped["slurm"]["qos"][0]["preempt"] = []
    dropped["slurm"]["accounts"] = [a for a in dropped["slurm"]["accounts"] if a["name"] != "training"]
    dropped["slurm"]["accounts"][1]["qos"] = ["high"]
    dropped["slurm"]["users"] = [u for u in dropped["slurm"]["users"] if u["name"] == SERVER]
    dropped["slurm"]["preemption"] = {"type": "off"}
    cluster.apply(dropped)

    kept = apply_state(cluster)

    assert (kept.returncode, kept.stderr) == (0, "")
    assert kept.stdout.splitlines() == [
        "set qos high: Preempt=",
        "set account serving: QOS=high",
        f"kept user {TRAINER} in account training: 1 job(s) of the user's there still pending or running; removed once they end",
        "kept account training: 1 job(s) charged to it still pending or running; removed once they end",
        "kept qos low: 1 job(s) of it still pending or running; removed once they end",
    ]
    assert "low" in qos_held(cluster) and ("training", TRAINER, "", "1", "low", "low") in associations(cluster)
    assert cluster.job(job)["JobState"] == "RUNNING"

    cluster.release(job)
    cluster.wait_for_job(job, "COMPLETED")
    removed = apply_state(cluster)
    assert (removed.returncode, removed.stderr) == (0, "")
    assert removed.stdout.splitlines() == [
        f"removed user {TRAINER} from account training",
        "removed account training",
        "removed qos low",
    ]
    assert "low" not in qos_held(cluster)
    assert not [row for row in associations(cluster) if row[0] == "training"]
    assert apply_state(cluster).stdout == ""

    # Nothing left: everything it made goes, Slurm's own root and normal stay.
    cluster.apply(local_raw)
    gone = apply_state(cluster)
    assert (gone.returncode, gone.stderr) == (0, "")
    assert gone.stdout.splitlines() == [
        f"removed user {SERVER} from account serving",
        "removed account serving",
        "removed account research",
        "removed qos high",
    ]
    assert set(qos_held(cluster)) == {"normal"}
    assert {row[0] for row in associations(cluster)} == {"root"}
