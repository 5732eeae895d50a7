"""Clients without the munge key: Slurm tokens (auth/jwt) against real slurmctld and slurmrestd.

The tokens are the minter's (components.programs.token_minter.mint), the key is slurmctld's
(AuthAltParameters=jwt_key), and the clients are given a slurm.conf whose munge socket does not
exist, so nothing here can fall back to munge. The job user is the harness's JOB_USER (nobody).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dualsched.components.programs import source
from dualsched.components.programs.token_minter import encode, mint
from dualsched.components.slurmrestd import RESTD_ENV, slurmrestd_command
from harness import JOB_USER, free_ports, wait_until

pytestmark = pytest.mark.slurm

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")


@pytest.fixture
def client_dir(cluster):
    """A directory the job user can read (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(dir=cluster.root, prefix="client-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def client_conf(cluster, client_dir):
    """The cluster's slurm.conf, with munge pointed at nothing."""
    conf = client_dir / "slurm.conf"
    conf.write_text(cluster.slurm_conf.read_text() + "AuthInfo=socket=/nonexistent/munge.socket\n")
    conf.chmod(0o644)
    return conf


def setpriv(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


JOB_UID = pwd.getpwnam(JOB_USER).pw_uid


def as_user(cluster, conf, token: str, *command: str, uid: int = JOB_UID, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**cluster.env, "SLURM_CONF": str(conf), "SLURM_JWT": token}
    return subprocess.run([*setpriv(uid), *command], env=env, input=stdin, capture_output=True, text=True, timeout=60, cwd="/tmp")


class ControllerLog:
    """What slurmctld logs from now on: its reason for a refusal the client sees only as a dropped connection."""

    def __init__(self, cluster):
        self.path = cluster.root / "log" / "slurmctld.log"
        self.start = self.path.stat().st_size

    def says(self, text: str) -> bool:
        with open(self.path, errors="replace") as log:
            log.seek(self.start)
            return text in log.read()


def test_a_token_submits_as_its_user_without_munge(cluster, client_conf):
    token = mint(cluster.jwt_key, JOB_USER, 300)
    result = as_user(cluster, client_conf, token, "sbatch", "--parsable", "--output=/dev/null", "--time=2",
                     stdin="#!/bin/sh\nid -un\n")  # fmt: skip
    assert result.returncode == 0, result.stderr
    job = cluster.wait_for_job(int(result.stdout.strip()), *FINAL_STATES)
    assert job["JobState"] == "COMPLETED", job
    assert job["UserId"].startswith(f"{JOB_USER}("), job


def test_a_job_submitted_with_a_token_never_sees_it_and_its_steps_run(cluster, client_conf):
    """sbatch exports every SLURM_* variable, the token among them; slurm.conf's TaskProlog takes it out of
    every task (components/programs/task_prolog.sh), so srun in the job authenticates with munge."""
    token = mint(cluster.jwt_key, JOB_USER, 300)
    script = '#!/bin/sh\n[ -z "${SLURM_JWT+set}" ] || exit 7\nsrun --time=1 sh -c \'[ -z "${SLURM_JWT+set}" ]\'\n'
    result = as_user(cluster, client_conf, token, "sbatch", "--parsable", "--output=/dev/null", "--time=2", stdin=script)
    assert result.returncode == 0, result.stderr
    job = cluster.wait_for_job(int(result.stdout.strip()), *FINAL_STATES)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", job


def test_users_cannot_mint_tokens_from_slurmctld(cluster):
    """AuthAltParameters=disable_token_creation: a user's `scontrol token` (munge, any lifespan) is refused;
    root and SlurmUser still get one, so the refusal is the setting's, not a broken command."""
    env = {**cluster.env, "SLURM_CONF": str(cluster.slurm_conf)}
    refused = subprocess.run([*setpriv(JOB_UID), "scontrol", "token", "lifespan=31536000"], env=env,
                             capture_output=True, text=True, timeout=60, cwd="/tmp")  # fmt: skip
    assert refused.returncode != 0 and "SLURM_JWT=" not in refused.stdout, refused.stdout + refused.stderr
    assert "denied" in refused.stderr.lower(), refused.stderr
    admin = subprocess.run(["scontrol", "token", f"username={JOB_USER}", "lifespan=60"], env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert admin.returncode == 0 and admin.stdout.startswith("SLURM_JWT="), admin.stderr


def test_without_a_token_the_client_cannot_authenticate(cluster, client_conf):
    log = ControllerLog(cluster)
    result = as_user(cluster, client_conf, "", "squeue")
    assert result.returncode != 0, result.stdout
    wait_until("slurmctld to log the refusal", lambda: log.says("Protocol authentication error"), 10)


def test_a_uid_other_than_the_tokens_is_refused(cluster, client_conf):
    """A pod that picks another uid than its token's user: slurmctld refuses the job."""
    token = mint(cluster.jwt_key, JOB_USER, 300)
    result = as_user(cluster, client_conf, token, "sbatch", "--wrap=true", uid=12345)
    assert result.returncode != 0, result.stdout
    assert "user" in result.stderr.lower(), result.stderr


@pytest.mark.parametrize(
    "claims, key, reason",
    [
        (lambda: {"exp": int(time.time()) + 300, "sun": JOB_USER}, lambda c: os.urandom(32), "jwt_decode failure"),
        (lambda: {"exp": int(time.time()) - 5, "sun": JOB_USER}, lambda c: c.jwt_key, "token expired"),
    ],
    ids=["signed-with-another-key", "expired"],
)
def test_forged_and_expired_tokens_are_refused(cluster, client_conf, claims, key, reason):
    log = ControllerLog(cluster)
    result = as_user(cluster, client_conf, encode(key(cluster), claims()), "squeue")
    assert result.returncode != 0, result.stdout
    wait_until(f"slurmctld to log {reason!r}", lambda: log.says(reason), 10)


def test_root_gets_no_token_and_a_root_token_runs_no_job(cluster, client_conf):
    with pytest.raises(ValueError, match="root"):
        mint(cluster.jwt_key, "root", 300)
    # Even a root token signed with the real key (the minter never makes one) runs no job: DisableRootJobs.
    root_token = encode(cluster.jwt_key, {"exp": int(time.time()) + 300, "sun": "root"})
    log = ControllerLog(cluster)
    result = as_user(cluster, client_conf, root_token, "sbatch", "--wrap=true", uid=0)
    assert result.returncode != 0, result.stdout
    wait_until("slurmctld to refuse root", lambda: log.says("SUBMIT_JOB for user root disabled"), 10)


def test_the_wait_script_follows_the_job_to_its_end(cluster, client_conf, client_dir):
    """components/programs/sbatch_wait.sh, as the Job's container runs it: exit 0 only for COMPLETED."""
    token_file = client_dir / "token"
    token_file.write_text(mint(cluster.jwt_key, JOB_USER, 300))
    token_file.chmod(0o644)
    script = client_dir / "sbatch_wait.sh"
    script.write_text(source("sbatch_wait.sh"))

    def wait(batch: str) -> subprocess.CompletedProcess:
        env = {**cluster.env, "SLURM_CONF": str(client_conf), "SLURM_TOKEN_FILE": str(token_file),
               "BATCH_SCRIPT": batch, "SBATCH_WAIT_POLL_SECONDS": "1"}  # fmt: skip
        return subprocess.run([*setpriv(JOB_UID), "bash", str(script), "--output=/dev/null", "--time=2"],
                              env=env, capture_output=True, text=True, timeout=120, cwd="/tmp")  # fmt: skip

    done = wait("#!/bin/sh\ntrue\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout
    failed = wait("#!/bin/sh\nexit 3\n")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "FAILED" in failed.stderr


# ------------------------------------------------------------------------ slurmrestd


@pytest.fixture
def slurmrestd(cluster, client_conf):
    """slurmrestd with rest_auth/jwt as nobody, as components/slurmrestd.py runs it."""
    port = free_ports(1)[0]
    env = {**cluster.env, "SLURM_CONF": str(client_conf), **RESTD_ENV}
    command = slurmrestd_command(str(client_conf))
    process = subprocess.Popen(
        [*setpriv(JOB_UID), *command[:-1], f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(cluster.root / "log" / "slurmrestd.out", "ab"),
    )  # fmt: skip
    try:
        wait_until("slurmrestd to listen", lambda: _listening(port), 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def _listening(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def rest(url: str, path: str, user: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token, "Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        return error.code, json.loads(text) if text.startswith("{") else {"body": text}


def test_slurmrestd_submits_as_the_tokens_user(cluster, slurmrestd):
    token = mint(cluster.jwt_key, JOB_USER, 300)
    status, answer = rest(slurmrestd, "/slurm/v0.0.38/job/submit", JOB_USER, token, {
        "script": "#!/bin/sh\ntrue\n",
        "job": {"name": "rest", "current_working_directory": "/tmp", "environment": {"PATH": "/usr/bin:/bin"},
                "time_limit": 2, "standard_output": "/dev/null"},
    })  # fmt: skip
    assert status == 200 and not answer.get("errors"), answer
    job = cluster.wait_for_job(int(answer["job_id"]), *FINAL_STATES)
    assert job["UserId"].startswith(f"{JOB_USER}("), job


def test_slurmrestd_refuses_a_token_for_another_user(cluster, slurmrestd):
    """The header says root, the token says nobody: auth/jwt refuses the switch (auth_jwt.c)."""
    token = mint(cluster.jwt_key, JOB_USER, 300)
    status, answer = rest(slurmrestd, "/slurm/v0.0.38/jobs", "root", token)
    assert status != 200 or answer.get("errors"), answer
    status, answer = rest(slurmrestd, "/slurm/v0.0.38/jobs", JOB_USER, encode(os.urandom(32), {"exp": int(time.time()) + 60, "sun": JOB_USER}))
    assert status != 200 or answer.get("errors"), answer
