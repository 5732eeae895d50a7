"""The real tiers' worlds record what the machine and the control plane were doing when an API server did not
answer in time, what a stack's pods were doing when it did not come up (tests/e2e/e2e_support.py), and what Slurm's
daemons were doing when a wait for Slurm timed out (tests/node/node_support.py), for `make test` to print last
(tools/test-tiers.sh)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "e2e"))
sys.path.insert(0, str(Path(__file__).parent / "node"))

import e2e_support  # noqa: E402
from e2e_support import World  # noqa: E402
from node_support import NodeWorld, wait_for_slurm  # noqa: E402

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


def fake_kubectl(world: World, directory: Path, pods: str = CRASHING_POD) -> Path:
    """A kubectl that lists ``pods``, logs 300 numbered lines and a last word for the container and run it is asked
    for, runs what `exec` asks for with ``directory``'s commands first on PATH, and records each call."""
    calls = directory / "calls"
    (directory / "pods.json").write_text(pods)
    script = directory / "kubectl"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  "get pods"*) cat {directory / "pods.json"} ;;
  "get events"*) echo "Warning BackOff pod/slurmctld-0 Back-off restarting failed container" ;;
  logs*--previous*) seq -f "$4 $6 previous line %g" 300; echo "$6: fatal: the previous run's last words" ;;
  logs*) seq -f "$4 $6 line %g" 300; echo "$6: the current run" ;;
  exec*) while [ "$1" != "--" ]; do shift; done; shift; exec "$@" ;;
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


# ---------------------------------------------------------------- a Slurm that does not answer


def pod(name: str, containers: dict[str, int], init: tuple[str, ...] = ()) -> dict:
    """A Running pod in slurm whose containers (name -> restarts) are Ready, its init containers ended well."""
    return {"metadata": {"namespace": "slurm", "name": name}, "spec": {"nodeName": "gpu-real-3"}, "status": {
        "phase": "Running",
        "initContainerStatuses": [{"name": c, "ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}} for c in init],
        "containerStatuses": [{"name": c, "ready": True, "restartCount": restarts, "state": {"running": {}},
                               "lastState": {"terminated": {"exitCode": 1}} if restarts else {}} for c, restarts in containers.items()]}}


SLURM_PODS = json.dumps({"items": [
    pod("slurmctld-0", {"slurmctld": 1, "munged": 0, "reconfigure": 0}, init=("wait-for-accounting",)),
    pod("slurmctld-1", {"slurmctld": 0, "munged": 0, "reconfigure": 0}),
    pod("dualsched-accounting-slurmdbd-5d9f", {"slurmdbd": 0}, init=("munged", "slurmdbd-conf")),
    pod("mariadb-0", {"mariadb": 0}, init=("mariadb-init",)),
]})
"""Every pod Ready, as in the CI run where sinfo timed out for 300 s."""
SOCKET_TIMEOUT = "sinfo: error: slurm_load_partitions: Socket timed out on send/recv operation"


def fake_slurm(directory: Path, sinfo_answers_at: int) -> None:
    """Slurm's clients as `kubectl exec` runs them: sinfo answers only its ``sinfo_answers_at``-th call, scontrol
    ping says the primary is DOWN, sacctmgr hangs."""
    commands = {
        "sinfo": f"echo x >> {directory / 'sinfo-calls'}\n[ $(wc -l < {directory / 'sinfo-calls'}) -ge {sinfo_answers_at} ] && "
                 f"{{ echo gpu; exit 0; }}\necho '{SOCKET_TIMEOUT}' >&2; exit 1",
        "scontrol": "echo 'Slurmctld(primary) at slurmctld-0 is DOWN'; echo 'Slurmctld(backup) at slurmctld-1 is UP'",
        "sacctmgr": "exec sleep 30",
    }
    for name, body in commands.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)


@pytest.fixture
def slurm_world(tmp_path, monkeypatch) -> NodeWorld:
    monkeypatch.setattr(e2e_support, "DIAGNOSTICS", tmp_path / "diagnostics")
    monkeypatch.setattr(e2e_support, "BOUND", 1)
    return NodeWorld(tmp=tmp_path / "multinode0", env={"PATH": "/usr/bin:/bin"}, project=tmp_path, cluster_dir=tmp_path / "cluster")


def sinfo(world: NodeWorld) -> str:
    return world.kubectl("exec", "-n", "slurm", "slurmctld-0", "-c", "slurmctld", "--", "sinfo", "--noheader", "--format=%P").stdout


def test_a_wait_for_slurm_that_timed_out_leaves_slurms_daemons_logs_and_bounded_answers(slurm_world, tmp_path):
    calls = fake_kubectl(slurm_world, tmp_path, SLURM_PODS)
    fake_slurm(tmp_path, sinfo_answers_at=99)
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="timed out after 1s waiting for every node idle in Slurm"):
        wait_for_slurm(slurm_world, "slurm", "every node idle in Slurm", lambda: sinfo(slurm_world), timeout=1, every=0.2)
    assert time.monotonic() - start < 15  # the hanging sacctmgr was ended after BOUND seconds
    [written] = (tmp_path / "diagnostics").iterdir()
    text = written.read_text()
    assert written.name.startswith("multinode0-slurm-") and text.startswith("timed out after 1s waiting for every node idle in Slurm")
    assert "Socket timed out on send/recv operation" in text.split("\n\n")[0]  # the wait's last answer
    # bounded commands in slurmctld-0: what scontrol ping said, and that sacctmgr hung until `timeout` ended it
    asked = "in slurm/slurmctld-0 (`timeout 1`: exit 124 when it did not answer)"
    assert f"--- `scontrol ping` {asked}\nSlurmctld(primary) at slurmctld-0 is DOWN\nSlurmctld(backup) at slurmctld-1 is UP\n\n" in text
    assert f"--- `sacctmgr show cluster` {asked}\n[exit 124]\n\n" in text
    # only Slurm's daemons, asked by label: both controllers, slurmdbd, the database; every container, Ready or not
    assert "get pods -n slurm -l app.kubernetes.io/name in (slurmctld,slurmdbd,mariadb) -o json" in calls.read_text()
    for name in ("slurmctld-0", "slurmctld-1", "dualsched-accounting-slurmdbd-5d9f", "mariadb-0"):
        assert f"--- pod slurm/{name} on gpu-real-3: Running" in text
    assert "slurmctld: ready=True restarts=1" in text
    for pod_name, container in (("slurmctld-0", "slurmctld"), ("slurmctld-0", "wait-for-accounting"), ("slurmctld-1", "slurmctld"),
                                ("dualsched-accounting-slurmdbd-5d9f", "slurmdbd"), ("mariadb-0", "mariadb")):
        assert f"{pod_name} {container} line 300\n" in text and f"{pod_name} {container} line 101\n" not in text  # the last 200
        assert f"{pod_name} {container} line 102\n" in text
    assert "slurmctld-0 slurmctld previous line 300" in text and "slurmctld: fatal: the previous run's last words" in text
    assert "slurmctld-1 slurmctld previous line" not in text  # no previous run: it never restarted
    assert "Back-off restarting failed container" in text
    logged = calls.read_text().splitlines()
    assert "logs -n slurm slurmctld-0 -c slurmctld --previous --tail=200" in logged
    assert not [line for line in logged if any(word in line.lower() for word in ("secret", "configmap", " env", "printenv"))]


def test_at_most_one_slurm_record_a_minute(slurm_world, tmp_path):
    fake_kubectl(slurm_world, tmp_path, SLURM_PODS)
    fake_slurm(tmp_path, sinfo_answers_at=99)
    for _ in range(2):
        with pytest.raises(pytest.fail.Exception):
            wait_for_slurm(slurm_world, "slurm", "slurmctld to answer", lambda: sinfo(slurm_world), timeout=0.3, every=0.1)
    assert len(list((tmp_path / "diagnostics").iterdir())) == 1


def test_a_slurm_that_answers_after_a_few_timeouts_leaves_nothing(slurm_world, tmp_path):
    calls = fake_kubectl(slurm_world, tmp_path, SLURM_PODS)
    fake_slurm(tmp_path, sinfo_answers_at=3)
    answer = wait_for_slurm(slurm_world, "slurm", "slurmctld to answer", lambda: "gpu" in sinfo(slurm_world), timeout=30, every=0.1)
    assert answer is True
    assert (tmp_path / "sinfo-calls").read_text().count("x") == 3  # two "Socket timed out" were no answer yet
    assert not (tmp_path / "diagnostics").exists()
    assert not [line for line in calls.read_text().splitlines() if not line.startswith("exec")]


def test_a_command_of_a_record_is_ended_after_its_bound(slurm_world, tmp_path):
    fake_kubectl(slurm_world, tmp_path, SLURM_PODS)
    start = time.monotonic()
    said = slurm_world.bounded("exec", "-n", "slurm", "slurmctld-0", "--", "sh", "-c", "echo started; exec sleep 30", seconds=1)
    assert time.monotonic() - start < 10 and said == "started\n[no answer in 1 s: stopped]"  # what it said before it hung, kept
