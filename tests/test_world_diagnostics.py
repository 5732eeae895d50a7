"""The real tiers' worlds record what the machine and the control plane were doing when an API server did not
answer in time (tests/e2e/e2e_support.py), for `make test` to print last (tools/test-tiers.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "e2e"))

import e2e_support  # noqa: E402
from e2e_support import World  # noqa: E402

STALLED = "echo 'Error from server (Timeout): the server was unable to return a response in the time allotted' >&2; exit 1"


@pytest.fixture
def world(tmp_path, monkeypatch) -> World:
    monkeypatch.setattr(e2e_support, "DIAGNOSTICS", tmp_path / "diagnostics")
    logs = tmp_path / "cluster" / "logs"
    logs.mkdir(parents=True)
    (logs / "kube-apiserver.log").write_text("".join(f"apiserver line {k}\n" for k in range(100)))
    (logs / "etcd.log").write_text("etcd: slow fdatasync\n")
    return World(tmp=tmp_path / "node0", env={"PATH": "/usr/bin:/bin"}, project=tmp_path, cluster_dir=tmp_path / "cluster")


def test_a_command_the_api_server_did_not_answer_leaves_the_machine_and_control_plane_state(world, tmp_path):
    world.run(["sh", "-c", STALLED], check=False)
    [written] = (tmp_path / "diagnostics").iterdir()
    text = written.read_text()
    assert written.name.startswith("node0-") and "got no answer in time" in text and "Error from server (Timeout)" in text
    assert "load average:" in text and "Mem:" in text and "PID" in text  # the machine: load, memory, busiest processes
    assert "etcd: slow fdatasync" in text and "apiserver line 99" in text and "apiserver line 39\n" not in text  # log tails


def test_at_most_one_record_a_minute_and_none_for_other_failures(world, tmp_path):
    world.run(["sh", "-c", "echo 'Error from server (NotFound): pods \"x\" not found' >&2; exit 1"], check=False)
    assert not (tmp_path / "diagnostics").exists()
    world.run(["sh", "-c", STALLED], check=False)
    world.run(["sh", "-c", STALLED], check=False)
    assert len(list((tmp_path / "diagnostics").iterdir())) == 1


def stalled_kubectl(world: World, directory: Path, answers_at: int) -> Path:
    """A kubectl on ``world``'s PATH whose API server answers only its ``answers_at``-th call; each call is a line of
    the file it returns."""
    counter = directory / "attempts"
    script = directory / "kubectl"
    script.write_text(f"#!/bin/sh\necho x >> {counter}\n[ $(wc -l < {counter}) -ge {answers_at} ] && {{ echo answered; exit 0; }}\n{STALLED}\n")
    script.chmod(0o755)
    world.env["PATH"] = f"{directory}:/usr/bin:/bin"
    return counter


def test_reads_and_applies_are_sent_again_when_the_api_server_did_not_answer(world, tmp_path):
    counter = stalled_kubectl(world, tmp_path, answers_at=2)
    assert world.kubectl("get", "pods").stdout == "answered\n"
    assert counter.read_text().count("x") == 2


def test_commands_with_effects_are_never_sent_twice(world, tmp_path):
    counter = stalled_kubectl(world, tmp_path, answers_at=99)
    assert world.kubectl("exec", "pod", "--", "sbatch", check=False).returncode == 1
    assert counter.read_text().count("x") == 1
    world.kubectl("get", "pods", check=False)
    assert counter.read_text().count("x") == 1 + e2e_support.ATTEMPTS


CRASHING_POD = """{"items": [{"metadata": {"namespace": "slurm", "name": "slurmctld-0"}, "spec": {"nodeName": "gpu-real-1"},
  "status": {"phase": "Running",
    "initContainerStatuses": [{"name": "wait-for-accounting", "ready": false, "restartCount": 0,
                               "state": {"terminated": {"exitCode": 0}}}],
    "containerStatuses": [{"name": "slurmctld", "ready": false, "restartCount": 3,
                           "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                           "lastState": {"terminated": {"exitCode": 1}}},
                          {"name": "reconfigure", "ready": true, "restartCount": 0, "state": {"running": {}}}]}}]}"""


def fake_kubectl(world: World, directory: Path) -> Path:
    """A kubectl that lists CRASHING_POD, logs the container and run it is asked for, and records each call."""
    calls = directory / "calls"
    (directory / "pods.json").write_text(CRASHING_POD)
    script = directory / "kubectl"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  "get pods"*) cat {directory / "pods.json"} ;;
  "get events"*) echo "Warning BackOff pod/slurmctld-0 Back-off restarting failed container" ;;
  logs*--previous*) echo "slurmctld: fatal: the previous run's last words" ;;
  logs*) echo "slurmctld: the current run" ;;
esac
""")
    script.chmod(0o755)
    world.env["PATH"] = f"{directory}:/usr/bin:/bin"
    return calls


def test_a_stack_that_did_not_come_up_leaves_its_pods_states_and_crash_logs(world, tmp_path):
    calls = fake_kubectl(world, tmp_path)
    world.diagnose_pods("pulumi up failed", "slurm")
    [written] = (tmp_path / "diagnostics").iterdir()
    text = written.read_text()
    assert written.name.startswith("node0-pods-") and text.startswith("pulumi up failed")
    assert "pod slurm/slurmctld-0 on gpu-real-1: Running" in text and "slurmctld: ready=False restarts=3" in text
    assert "fatal: the previous run's last words" in text and "slurmctld: the current run" in text
    assert "Back-off restarting failed container" in text
    logged = [line for line in calls.read_text().splitlines() if line.startswith("logs")]
    # only the container that is not ready: neither the init container that ended well nor the ready sidecar
    assert logged == ["logs -n slurm slurmctld-0 -c slurmctld --previous --tail=40", "logs -n slurm slurmctld-0 -c slurmctld --tail=40"]
