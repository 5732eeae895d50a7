"""The inference windows' reservations: the file rendered for time-shared pools, and the program
(components/programs/window_reservations.sh) that makes slurmctld's reservations match it.

The program runs here under sh with a fake ``scontrol`` and a fake clock, which pins what it asks
of slurmctld for each time of day; tests/slurm/test_time_shared.py shows real slurmctld takes it.
"""

from __future__ import annotations

import calendar
import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dualsched.components.programs import source
from dualsched.components.slurm_files import WINDOW_RESERVATIONS_FILE, kubernetes_site, render_slurm_files
from dualsched.config import StackConfig, parse_stack_config
from tests.conftest import STACKS, raw_stack

PROGRAM = Path(__file__).resolve().parent.parent / "components" / "programs" / "window_reservations.sh"
NOW = calendar.timegm((2026, 12, 3, 10, 0, 0))
"""The fake clock: 10:00 UTC."""
TODAY = NOW - 10 * 3600
HOUR = 3600
DAY = 86400
FLAGS = "Flags=DAILY,IGNORE_JOBS"


def time_shared(raw: dict[str, Any], pool: int = 0, start: str = "09:00", minutes: int = 480) -> dict[str, Any]:
    """``raw`` with its pool made time-shared (the whole node to each scheduler in turn)."""
    raw["pools"][pool].update(mode="time-shared", inferenceWindow={"start": start, "durationMinutes": minutes})
    raw["pools"][pool].pop("slurmGpus", None)
    return raw


def with_serving_pool(raw: dict[str, Any]) -> dict[str, Any]:
    """A kubernetes pool serves the models' replica floors while the window is closed."""
    raw["pools"].append({"name": "serve", "nodes": "srv-[1-2]", "mode": "kubernetes"})
    return raw


def window_file(config: StackConfig, **site_changes: Any) -> str:
    site = dataclasses.replace(kubernetes_site(config), **site_changes)
    return render_slurm_files(config, site)[WINDOW_RESERVATIONS_FILE]


def settings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# ------------------------------------------------------------------------ the file


@pytest.mark.parametrize("stack", STACKS)
def test_no_time_shared_pool_no_reservation(stack):
    text = window_file(parse_stack_config(raw_stack(stack)))
    assert text.startswith("# Inference-window reservations for cluster ")
    assert settings(text) == []


def test_a_time_shared_pool_is_one_line_of_its_window_and_nodes(dev_raw):
    config = parse_stack_config(with_serving_pool(time_shared(dev_raw, start="22:00", minutes=600)))
    assert settings(window_file(config)) == [
        "ReservationName=dualsched-window-gpu DailyStartUTC=22:00 DurationMinutes=600 Nodes=gpu-[001-002] Users=slurm"
    ]


def test_only_slurm_user_may_run_in_the_window(dev_raw):
    """SlurmUser runs no job (DisableRootJobs, and no configured user is a system account)."""
    config = parse_stack_config(with_serving_pool(time_shared(dev_raw)))
    assert settings(window_file(config, slurm_user="root"))[0].endswith(" Users=root")


def test_each_time_shared_pool_has_its_own_reservation(prod_raw):
    for index in range(3):
        prod_raw["pools"][index]["allocatable"] = {"cpus": 224, "memoryMb": 2_000_000}
        time_shared(prod_raw, index, start=f"0{index}:30", minutes=60 * (index + 1))
    config = parse_stack_config(with_serving_pool(prod_raw))
    names = [pool.name for pool in config.pools[:3]]
    lines = settings(window_file(config))
    assert [line.split()[0] for line in lines] == [f"ReservationName=dualsched-window-{name}" for name in names]
    assert [line.split()[1:3] for line in lines] == [
        ["DailyStartUTC=00:30", "DurationMinutes=60"],
        ["DailyStartUTC=01:30", "DurationMinutes=120"],
        ["DailyStartUTC=02:30", "DurationMinutes=180"],
    ]
    assert "srv-" not in "".join(lines)


# ---------------------------------------------------------------------- the program


@dataclasses.dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    actions: list[str]
    """scontrol calls that change something, as the program made them."""


def run_program(
    tmp_path: Path, lines: list[str], held: list[str] = (), show_exit: int = 0, action_exit: int = 0, action_output: str = ""
) -> Run:
    """The program on a file of ``lines``, at NOW, with slurmctld holding the ``held`` reservations."""
    bin_dir, log = tmp_path / "bin", tmp_path / "actions"
    bin_dir.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    (tmp_path / "held").write_text("\n".join(held) + "\n" if held else "No reservations in the system\n")
    fake_scontrol = f"""#!/bin/sh
case "$1 $2" in
    "show reservation") cat {tmp_path}/held; exit {show_exit} ;;
    "show hostnames") echo "$3" | tr , '\\n'; exit 0 ;;
esac
echo "$*" >> {log}
printf '{action_output}'
exit {action_exit}
"""
    for name, text in (("scontrol", fake_scontrol), ("date", f"#!/bin/sh\necho {NOW}\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    file = tmp_path / "window-reservations"
    file.write_text("# header\n" + "".join(f"{line}\n" for line in lines))
    result = subprocess.run(
        ["sh", str(PROGRAM), str(file)],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    actions = log.read_text().splitlines() if log.exists() else []
    return Run(result.returncode, result.stdout, result.stderr, actions)


def line(start: str, minutes: int, name: str = "gpu", nodes: str = "gpu-[1-2]") -> str:
    return f"ReservationName=dualsched-window-{name} DailyStartUTC={start} DurationMinutes={minutes} Nodes={nodes} Users=slurm"


def held(start: int, end: int, name: str = "gpu", nodes: str = "gpu-[1-2]", flags: str = "IGNORE_JOBS,DAILY,SPEC_NODES",
         users: str = "slurm") -> str:  # fmt: skip
    """A reservation as `scontrol show reservation --oneliner` prints it with SLURM_TIME_FORMAT=%s."""
    state = "ACTIVE" if start <= NOW < end else "INACTIVE"
    return (
        f"ReservationName=dualsched-window-{name} StartTime={start} EndTime={end} Duration=01:00:00 Nodes={nodes} "
        f"NodeCnt=2 CoreCnt=64 Features=(null) PartitionName=(null) Flags={flags} TRES=cpu=64 Users={users} "
        f"Groups=(null) Accounts=(null) Licenses=(null) State={state} BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)"
    )


def created(start: int, end: int, name: str = "gpu", nodes: str = "gpu-[1-2]") -> str:
    return (f"create reservation ReservationName=dualsched-window-{name} StartTime=uts{start} EndTime=uts{end} "
            f"Nodes={nodes} Users=slurm {FLAGS}")  # fmt: skip


def test_the_program_is_what_the_controller_ships():
    assert source("window_reservations.sh") == PROGRAM.read_text()
    assert subprocess.run(["sh", "-n", str(PROGRAM)]).returncode == 0


@pytest.mark.parametrize(
    ("start", "minutes", "begin", "end"),
    [
        pytest.param("12:00", 60, TODAY + 12 * HOUR, TODAY + 13 * HOUR, id="before-the-window-today"),
        pytest.param("09:30", 60, NOW, TODAY + 10 * HOUR + 30 * 60, id="inside-the-window-begins-now"),
        pytest.param("10:00", 1, NOW, NOW + 60, id="opening-now"),
        pytest.param("09:00", 60, TODAY + DAY + 9 * HOUR, TODAY + DAY + 10 * HOUR, id="closing-now-is-tomorrows"),
        pytest.param("08:00", 60, TODAY + DAY + 8 * HOUR, TODAY + DAY + 9 * HOUR, id="after-the-window-tomorrow"),
        pytest.param("23:00", 720, NOW, TODAY + 11 * HOUR, id="open-since-yesterday-across-midnight"),
        pytest.param("22:00", 600, TODAY + 22 * HOUR, TODAY + DAY + 8 * HOUR, id="across-midnight-closed-now"),
        pytest.param("00:00", 1439, NOW, TODAY + DAY - 60, id="midnight-nearly-all-day"),
    ],
)
def test_a_missing_reservation_is_created_for_the_window_open_now_or_next(tmp_path, start, minutes, begin, end):
    run = run_program(tmp_path, [line(start, minutes)])
    assert (run.returncode, run.stderr) == (0, "")
    assert run.actions == [created(begin, end)]
    assert run.stdout == (
        f"created dualsched-window-gpu: daily from {start} UTC for {minutes} minutes on gpu-[1-2], for slurm only\n"
    )


def test_a_reservation_in_place_is_left_alone(tmp_path):
    run = run_program(tmp_path, [line("12:00", 60)], held=[held(TODAY + 12 * HOUR, TODAY + 13 * HOUR)])
    assert (run.returncode, run.stdout, run.stderr, run.actions) == (0, "", "", [])


def test_an_active_reservation_in_its_open_window_is_left_alone(tmp_path):
    """Begun when it was made (inside the window): its start cannot change, and need not."""
    run = run_program(tmp_path, [line("09:00", 120)], held=[held(NOW - 600, TODAY + 11 * HOUR)])
    assert (run.returncode, run.stdout, run.actions) == (0, "", [])


@pytest.mark.parametrize(
    "reservation",
    [
        pytest.param(held(TODAY + 13 * HOUR, TODAY + 14 * HOUR), id="other-hours"),
        pytest.param(held(TODAY + 12 * HOUR, TODAY + 13 * HOUR, nodes="gpu-[1-3]"), id="other-nodes"),
        pytest.param(held(TODAY + 12 * HOUR, TODAY + 13 * HOUR, users="alice"), id="other-users"),
        pytest.param(held(TODAY + 12 * HOUR, TODAY + 13 * HOUR, flags="IGNORE_JOBS,SPEC_NODES"), id="not-daily"),
        # made inside yesterday's window: slurmctld moved it to its hours of that day
        pytest.param(held(TODAY + DAY + 12 * HOUR + 1200, TODAY + DAY + 13 * HOUR), id="moved-from-a-partial-day"),
    ],
)
def test_a_future_reservation_that_differs_is_updated(tmp_path, reservation):
    run = run_program(tmp_path, [line("12:00", 60)], held=[reservation])
    assert run.returncode == 0
    assert run.actions == [
        f"update ReservationName=dualsched-window-gpu StartTime=uts{TODAY + 12 * HOUR} EndTime=uts{TODAY + 13 * HOUR} "
        f"Nodes=gpu-[1-2] Users=slurm {FLAGS}"
    ]
    assert run.stdout.startswith("updated dualsched-window-gpu: daily from 12:00 UTC")


def test_a_future_reservation_is_brought_forward_when_its_window_is_open(tmp_path):
    run = run_program(tmp_path, [line("09:00", 120)], held=[held(TODAY + DAY + 9 * HOUR, TODAY + DAY + 11 * HOUR)])
    assert run.actions == [
        f"update ReservationName=dualsched-window-gpu StartTime=uts{NOW} EndTime=uts{TODAY + 11 * HOUR} "
        f"Nodes=gpu-[1-2] Users=slurm {FLAGS}"
    ]


def test_an_active_reservation_gets_the_open_windows_end_but_keeps_its_start(tmp_path):
    """slurmctld refuses a new StartTime for a reservation that has started."""
    run = run_program(tmp_path, [line("09:00", 180)], held=[held(TODAY + 9 * HOUR, TODAY + 11 * HOUR)])
    assert run.actions == [
        f"update ReservationName=dualsched-window-gpu EndTime=uts{TODAY + 12 * HOUR} Nodes=gpu-[1-2] Users=slurm {FLAGS}"
    ]


def test_an_active_reservation_outside_its_moved_window_is_made_again(tmp_path):
    run = run_program(tmp_path, [line("12:00", 60)], held=[held(TODAY + 9 * HOUR, TODAY + 11 * HOUR)])
    assert run.actions == ["delete ReservationName=dualsched-window-gpu", created(TODAY + 12 * HOUR, TODAY + 13 * HOUR)]
    assert run.stdout.splitlines()[0] == "deleted dualsched-window-gpu: active outside its window"


def test_a_reservation_that_just_ended_is_left_for_slurmctld_to_move(tmp_path):
    """Until slurmctld moves a DAILY reservation to the next day, it refuses a new StartTime for it."""
    run = run_program(tmp_path, [line("08:00", 120)], held=[held(TODAY + 8 * HOUR, NOW)])
    assert (run.returncode, run.stdout, run.actions) == (0, "", [])


def test_reservations_of_pools_no_longer_time_shared_are_deleted_and_no_others(tmp_path):
    others = "ReservationName=maintenance StartTime=1 EndTime=2 Nodes=gpu-1 Users=root Flags=MAINT State=INACTIVE"
    reservations = [held(TODAY + 12 * HOUR, TODAY + 13 * HOUR), held(TODAY + 12 * HOUR, TODAY + 13 * HOUR, name="old"), others]
    run = run_program(tmp_path, [line("12:00", 60)], held=reservations)
    assert run.returncode == 0
    assert run.actions == ["delete ReservationName=dualsched-window-old"]
    assert run.stdout == "deleted dualsched-window-old: its pool is no longer time-shared\n"
    assert run_program(tmp_path, [], held=reservations).actions == [
        "delete ReservationName=dualsched-window-gpu", "delete ReservationName=dualsched-window-old",
    ]  # fmt: skip


def test_slurmctld_not_answering_is_a_failure_and_changes_nothing(tmp_path):
    run = run_program(tmp_path, [line("12:00", 60)], show_exit=1)
    assert run.returncode == 1 and run.actions == []
    assert "window reservations: slurmctld did not answer" in run.stderr


def test_a_refused_action_is_a_failure_with_slurmctlds_reason(tmp_path):
    run = run_program(tmp_path, [line("12:00", 60)], action_exit=1, action_output="Error creating the reservation:\nRequested nodes are busy")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == (
        f"window reservations: scontrol {created(TODAY + 12 * HOUR, TODAY + 13 * HOUR)} failed: "
        "Error creating the reservation: Requested nodes are busy\n"
    )


@pytest.mark.parametrize(
    "bad",
    [
        "ReservationName=maintenance DailyStartUTC=12:00 DurationMinutes=60 Nodes=gpu-1 Users=slurm",
        "ReservationName=dualsched-window-gpu DailyStartUTC=12 DurationMinutes=60 Nodes=gpu-1 Users=slurm",
        "ReservationName=dualsched-window-gpu DailyStartUTC=12:00 DurationMinutes=1h Nodes=gpu-1 Users=slurm",
        "ReservationName=dualsched-window-gpu DailyStartUTC=12:00 DurationMinutes=60 Users=slurm",
    ],
)
def test_a_line_that_is_not_the_templates_is_refused_and_the_others_applied(tmp_path, bad):
    run = run_program(tmp_path, [bad, line("12:00", 60, name="cpu")])
    assert run.returncode == 1
    assert f"not a window reservation line: {bad}" in run.stderr
    assert run.actions == [created(TODAY + 12 * HOUR, TODAY + 13 * HOUR, name="cpu")]


def test_an_unreadable_file_is_a_failure(tmp_path):
    result = subprocess.run(["sh", str(PROGRAM), str(tmp_path / "missing")], capture_output=True, text=True)
    assert result.returncode == 1 and "cannot read" in result.stderr


def test_the_rendered_file_is_what_the_program_reads(tmp_path, dev_raw):
    config = parse_stack_config(with_serving_pool(time_shared(dev_raw, start="12:00", minutes=60)))
    run = run_program(tmp_path, settings(window_file(config)))
    assert run.actions == [created(TODAY + 12 * HOUR, TODAY + 13 * HOUR, nodes="gpu-[001-002]")]
