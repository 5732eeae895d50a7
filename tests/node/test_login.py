"""The login pod on the real node: a user reaches it with the host's ssh client and a key from the
stack config, runs Slurm's client commands there, and a batch job writes to /shared as that user.
Its host key is the same after the pod is deleted and recreated.

The local stack plus ``slurm.login`` (alice, with a key this module generates), one deployment.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from e2e_support import TIMINGS
from node_support import JOB_USER_UID, NodeWorld, local_config
from test_real_node import SLURM_NS, Cluster, all_ready, up, wait_until, wait_until_settled

pytestmark = pytest.mark.node

USER = "alice"


class Login:
    """ssh to the login Service from this host, as a user of the stack, with a key of the test's."""

    def __init__(self, world: NodeWorld, key: Path, known_hosts: Path):
        self.world, self.key, self.known_hosts = world, key, known_hosts

    @property
    def address(self) -> str:
        return self.world.kget("service", "login", "-n", SLURM_NS)["spec"]["clusterIP"]

    def ssh(self, command: str, user: str = USER, key: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-i", str(key or self.key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
             # the first connection learns the host key; every later one must find the same
             "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={self.known_hosts}",
             "-p", "22", f"{user}@{self.address}", command],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def host_key(self) -> str:
        scan = subprocess.run(["ssh-keyscan", "-t", "ecdsa", "-p", "22", self.address], capture_output=True, text=True, timeout=60)
        lines = [line.split(" ", 1)[1] for line in scan.stdout.splitlines() if line and not line.startswith("#")]
        assert len(lines) == 1, (scan.stdout, scan.stderr)
        return lines[0]

    def pods(self) -> list[dict]:
        return [p for p in self.world.kget("pods", "-n", SLURM_NS, "-l", "app.kubernetes.io/name=login")["items"]
                if p["metadata"].get("deletionTimestamp") is None]


def new_key(directory: Path, name: str) -> Path:
    key = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@node-tier", "-f", str(key)], check=True)
    return key


@pytest.fixture(scope="module")
def login(node_world: NodeWorld, tmp_path_factory) -> Login:
    keys = tmp_path_factory.mktemp("login-keys")
    key = new_key(keys, "alice")
    config = local_config(node_world)
    config["slurm"]["login"] = {
        "enabled": True,
        "users": [{"name": USER, "authorizedKeys": [key.with_suffix(".pub").read_text().strip()]}],
    }
    up(node_world, config)
    start = time.monotonic()
    wait_until(f"every pod in {SLURM_NS} Ready", lambda: all_ready(node_world.kget("pods", "-n", SLURM_NS)["items"]), timeout=420)
    TIMINGS.append(("every Slurm pod and the login pod Ready", time.monotonic() - start))
    # After an earlier module's stack slurmd's template may differ: its rollout (docs/upgrades.md) ends first.
    cluster = Cluster(node_world)
    wait_until_settled(cluster)
    login = Login(node_world, key, keys / "known_hosts")
    # When the up replaced slurmctld (an earlier module's config), its name resolves to the old pod's
    # address until the cluster resolver's cache lets go: clients retry, and so does this.
    cluster.wait_for_slurm("slurmctld answering the login pod", lambda: login.ssh("sinfo --noheader >/dev/null").returncode == 0,
                           timeout=120, every=5)  # fmt: skip
    return login


def test_a_configured_user_logs_in_with_their_key_as_their_uid(login):
    result = login.ssh("id -u; id -un; id -g")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(JOB_USER_UID), USER, str(JOB_USER_UID)]


def test_root_another_key_and_an_unlisted_user_are_refused(login, tmp_path):
    assert login.ssh("true").returncode == 0  # the known host key and the Service work
    stranger = new_key(tmp_path, "stranger")
    for user, key in (("root", login.key), (USER, stranger), ("slurm", login.key)):
        refused = login.ssh("true", user=user, key=key)
        assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr, (user, refused.stderr)


def test_the_user_has_a_private_home_and_sshd_runs_no_rc_file_from_it(login):
    """Homes are each user's own (0700, under /home), and sshd ignores ~/.ssh/rc: it would run it at
    every login without checking who wrote it."""
    home = login.ssh("cd && pwd && stat -c '%u %a' .")
    assert home.returncode == 0, home.stderr
    assert home.stdout.split() == [f"/home/{USER}", str(JOB_USER_UID), "700"], home.stdout
    planted = login.ssh("mkdir -p ~/.ssh && printf 'touch ~/rc-ran\\n' > ~/.ssh/rc && rm -f ~/rc-ran")
    assert planted.returncode == 0, planted.stderr
    assert login.ssh("true").returncode == 0
    assert login.ssh("test -e ~/rc-ran").returncode == 1


def test_sinfo_from_the_login_pod_sees_the_node(login):
    result = login.ssh("sinfo --noheader --Node --format='%N %t'")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() in (["gpu-real-1", "idle"], ["gpu-real-1", "mix"]), result.stdout


def test_a_batch_job_from_the_login_pod_writes_to_shared_as_the_user(login):
    directory = "/shared/jobs"
    submitted = login.ssh(
        f"sbatch --parsable --time=5 --mem=64M --chdir={directory} --output=login-%j.out "
        f"--wrap='echo uid=$(id -u) > login-job-$SLURM_JOB_ID.txt'"
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.strip().split(";")[0])

    def finished():
        state = login.ssh(f"squeue --noheader --jobs={job_id} --format=%T").stdout.strip()
        return state == "" and login.ssh(f"sacct --noheader --parsable2 --allocations --jobs={job_id} --format=State").stdout.strip()

    assert wait_until(f"job {job_id} to finish", finished, timeout=180, every=3) == "COMPLETED"
    written = login.world.shared / "jobs" / f"login-job-{job_id}.txt"
    assert written.read_text() == f"uid={JOB_USER_UID}\n"
    assert os.stat(written).st_uid == JOB_USER_UID
    # and the login pod sees the same file through its own mount of /shared, owned by alice
    assert login.ssh(f"stat -c '%u %U' {directory}/login-job-{job_id}.txt").stdout.split() == [str(JOB_USER_UID), USER]


def test_the_host_key_survives_the_pod_being_deleted_and_recreated(login):
    before, [old_pod] = login.host_key(), login.pods()
    old = old_pod["metadata"]["name"]
    login.world.kubectl("delete", "pod", "-n", SLURM_NS, old, "--wait=true")
    wait_until("a new login pod Ready", lambda: [p for p in login.pods() if p["metadata"]["name"] != old] and all_ready(login.pods()),
               timeout=180)
    assert login.host_key() == before
    # ssh itself agrees: the known_hosts entry of the first login still matches, under strict checking
    again = login.ssh("hostname")
    assert again.returncode == 0 and "REMOTE HOST IDENTIFICATION HAS CHANGED" not in again.stderr, again.stderr
    assert again.stdout.strip() != old  # a different pod answered
