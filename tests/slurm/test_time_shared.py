"""Scenario 7: a time-shared pool's inference window, the Slurm half. The pool's window in the
typed config renders the window-reservations file; the program the controller's sidecar runs
(components/programs/window_reservations.sh) makes real slurmctld hold a DAILY reservation of
the pool's nodes for the window, so no job starts that would still run when the window opens;
it leaves a reservation in place alone, moves it with the window and deletes it with the mode.

The windows are placed around the current time, so no test waits for one to open."""

from __future__ import annotations

import copy
import datetime
import subprocess
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from dualsched.components.slurm_files import WINDOW_RESERVATION_PREFIX, WINDOW_RESERVATIONS_FILE
from harness import JOB_USER, LocalCluster, parse_scontrol, wait_until

pytestmark = pytest.mark.slurm

PROGRAM = Path(__file__).resolve().parents[2] / "components" / "programs" / "window_reservations.sh"
RESERVATION = f"{WINDOW_RESERVATION_PREFIX}gpu"
MINUTE = datetime.timedelta(minutes=1)
DAY = datetime.timedelta(days=1)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def whole_minute(moment: datetime.datetime) -> datetime.datetime:
    return moment.replace(second=0, microsecond=0)


def time_shared(raw: dict[str, Any], start: datetime.datetime, minutes: int) -> dict[str, Any]:
    """``raw`` with its GPU pool (node-1, this machine's slurmd, and node-2) time-shared, its window
    opening at ``start``'s time of day."""
    changed = copy.deepcopy(raw)
    pool = changed["pools"][0]
    pool.update(mode="time-shared", inferenceWindow={"start": start.strftime("%H:%M"), "durationMinutes": minutes})
    # a time-shared pool says what its nodes give pods: slurmd's pod and the node's other DaemonSets fit,
    # and some is left to Kubernetes (the inference window's share)
    pool["allocatable"] = {"cpus": pool["cpus"] + 1, "memoryMb": pool["realMemoryMb"] + 2000}
    return changed


def apply_windows(cluster: LocalCluster) -> subprocess.CompletedProcess:
    """What the reconfigure sidecar runs every round, here as SlurmUser (root at this site)."""
    return subprocess.run(
        ["sh", str(PROGRAM), str(cluster.etc / WINDOW_RESERVATIONS_FILE)],
        env=cluster.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def reservations(cluster: LocalCluster) -> dict[str, dict[str, str]]:
    """Every reservation slurmctld holds, times in epoch seconds."""
    out = cluster.run("scontrol", "show", "reservation", "--oneliner", env={**cluster.env, "SLURM_TIME_FORMAT": "%s"})
    records = [parse_scontrol(line) for line in out.splitlines() if line.startswith("ReservationName=")]
    return {record["ReservationName"]: record for record in records}


def epoch(moment: datetime.datetime) -> int:
    return int(moment.timestamp())


def scheduled(cluster: LocalCluster, job_id: int) -> dict[str, str]:
    """The job once the scheduler has looked at it (a pending job's Reason is None until then)."""

    def probe() -> Optional[dict[str, str]]:
        job = cluster.job(job_id)
        return job if job["Reason"] != "None" else None

    return wait_until(f"the scheduler to consider job {job_id}", probe)


@pytest.fixture(autouse=True)
def leave_no_window(cluster: LocalCluster, local_raw: dict[str, Any]) -> Iterator[None]:
    """Leave the shared cluster as it was found: its own config, no window reservation, no job of this test."""
    try:
        yield
    finally:
        cluster.run("scancel", f"--user={JOB_USER}", check=False)
        for name in reservations(cluster):
            if name.startswith(WINDOW_RESERVATION_PREFIX):
                cluster.run("scontrol", "delete", f"ReservationName={name}")
        cluster.apply(local_raw)


def test_a_window_ahead_keeps_out_the_jobs_that_would_run_into_it(cluster, local_raw):
    opens = whole_minute(utc_now()) + 4 * MINUTE  # in 3 to 4 minutes, past midnight or not
    cluster.apply(time_shared(local_raw, opens, 30))
    # Running already, with a time limit that reaches into the window: slurmctld refuses a
    # reservation over it unless IGNORE_JOBS ("Requested nodes are busy").
    running = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=10", script=cluster.held_script())
    cluster.wait_for_job(running, "RUNNING")

    created = apply_windows(cluster)

    assert (created.returncode, created.stderr) == (0, "")
    assert created.stdout == f"created {RESERVATION}: daily from {opens:%H:%M} UTC for 30 minutes on node-[1-2], for root only\n"
    assert cluster.job(running)["JobState"] == "RUNNING"  # the reservation stops none
    cluster.release(running)
    cluster.wait_for_job(running, "COMPLETED")
    reservation = reservations(cluster)[RESERVATION]
    assert (reservation["StartTime"], reservation["EndTime"]) == (str(epoch(opens)), str(epoch(opens + 30 * MINUTE)))
    assert reservation["Nodes"] == "node-[1-2]" and reservation["State"] == "INACTIVE"
    assert {"DAILY", "IGNORE_JOBS"} <= set(reservation["Flags"].split(","))
    assert reservation["Users"] == "root"  # SlurmUser here; slurm.conf has DisableRootJobs=YES

    # A job whose time limit reaches past the window's start waits; one that ends before it runs.
    crossing = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=10", script="echo crossed\n")
    fitting = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=1", script="echo fits\n")
    assert cluster.wait_for_job(fitting, "COMPLETED")["NodeList"] == cluster.local_node
    waiting = scheduled(cluster, crossing)
    assert waiting["JobState"] == "PENDING"
    # node-1 is idle: the reservation made it unavailable to this job (node-2 never has a slurmd)
    assert waiting["Reason"].startswith("ReqNodeNotAvail"), waiting["Reason"]

    # In place: nothing to do, and nothing done.
    again = apply_windows(cluster)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert reservations(cluster)[RESERVATION] == reservation

    # The window moves: the same reservation follows it.
    later = opens + 2 * MINUTE
    cluster.apply(time_shared(local_raw, later, 45))
    moved = apply_windows(cluster)
    assert (moved.returncode, moved.stderr) == (0, "")
    assert moved.stdout.startswith(f"updated {RESERVATION}: daily from {later:%H:%M} UTC for 45 minutes")
    reservation = reservations(cluster)[RESERVATION]
    assert (reservation["StartTime"], reservation["EndTime"]) == (str(epoch(later)), str(epoch(later + 45 * MINUTE)))
    assert cluster.job(crossing)["JobState"] == "PENDING"

    # The pool is dedicated again: the reservation goes, and the waiting job runs.
    cluster.apply(local_raw)
    deleted = apply_windows(cluster)
    assert (deleted.returncode, deleted.stdout) == (0, f"deleted {RESERVATION}: its pool is no longer time-shared\n")
    assert not [name for name in reservations(cluster) if name.startswith(WINDOW_RESERVATION_PREFIX)]
    assert cluster.wait_for_job(crossing, "COMPLETED")["ExitCode"] == "0:0"
    assert cluster.job_output(crossing) == "crossed\n"


@pytest.mark.parametrize(
    ("offset", "minutes"),
    [
        pytest.param(-15 * MINUTE, 30, id="opened-15-minutes-ago"),
        # at this time of day plus an hour, for 23.5 hours: opened yesterday, closes in half an hour
        pytest.param(60 * MINUTE - DAY, 1410, id="open-since-yesterday"),
    ],
)
def test_inside_an_open_window_the_reservation_begins_at_once_and_no_job_starts(cluster, local_raw, offset, minutes):
    """slurmctld takes no start more than 10 minutes past: the reservation begins now, ends with the window."""
    opened = whole_minute(utc_now()) + offset
    cluster.apply(time_shared(local_raw, opened, minutes))
    before = epoch(utc_now())

    created = apply_windows(cluster)

    assert (created.returncode, created.stderr) == (0, "")
    reservation = reservations(cluster)[RESERVATION]
    assert before <= int(reservation["StartTime"]) <= epoch(utc_now())
    assert reservation["EndTime"] == str(epoch(opened + minutes * MINUTE))
    assert reservation["State"] == "ACTIVE"
    job = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=1", script="echo inside\n")
    waiting = scheduled(cluster, job)
    assert waiting["JobState"] == "PENDING" and waiting["Reason"].startswith("ReqNodeNotAvail"), waiting["Reason"]
    # slurmctld keeps a started reservation's start: a second run finds it in place.
    assert apply_windows(cluster).stdout == ""


def test_after_the_window_the_reservation_is_for_tomorrows(cluster, local_raw):
    closed = whole_minute(utc_now()) - 60 * MINUTE
    cluster.apply(time_shared(local_raw, closed - 30 * MINUTE, 30))

    assert apply_windows(cluster).returncode == 0

    reservation = reservations(cluster)[RESERVATION]
    tomorrows = closed - 30 * MINUTE + DAY
    assert (reservation["StartTime"], reservation["EndTime"]) == (str(epoch(tomorrows)), str(epoch(tomorrows + 30 * MINUTE)))
    assert reservation["State"] == "INACTIVE"
