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
