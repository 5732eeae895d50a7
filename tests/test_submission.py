"""JobSubmission: Kubernetes Jobs sbatch into Slurm with minted tokens, never the munge key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pulumi_kubernetes as k8s
import pytest

from dualsched.components.common import child, meta
from dualsched.components.program import build
from dualsched.components.programs import source
from dualsched.config import parse_stack_config
from dualsched.config.checks import trust_warnings
from dualsched.config.models import SubmissionIdentity
from rendering import container, mounts, pod_spec, render_raw, render_stack, render_with_registrations, variant, volume
from tests.conftest import raw_stack

PSA = "pod-security.kubernetes.io"
SCRIPT = "#!/bin/sh\n#SBATCH --job-name=train\nsrun hostname\n"

REPO = Path(__file__).resolve().parents[1]


def _client_config(rendered):
    return rendered.one("ConfigMap", "submission")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_submission_namespace_enforces_restricted(stack):
    """Nothing in it runs as root any more: the munged sidecar is gone."""
    labels = render_stack(stack).named("Namespace", "slurm-jobs").manifest["metadata"]["labels"]
    assert labels[f"{PSA}/enforce"] == labels[f"{PSA}/warn"] == "restricted"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_client_config_is_slurm_conf_and_the_two_programs(stack):
    rendered = render_stack(stack)
    config_map = _client_config(rendered)
    assert config_map.namespace == "slurm-jobs"
    assert config_map.manifest["data"] == {
        "slurm.conf": rendered.slurm_files["slurm.conf"],
        "sbatch_wait.sh": source("sbatch_wait.sh"),
        "token_fetcher.py": source("token_fetcher.py"),
    }


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_namespace_holds_no_secret_and_no_claim(stack):
    """A Job creator there can read nothing that authenticates to Slurm, and cannot touch /shared."""
    rendered = render_stack(stack)
    kinds = {obj.kind for obj in rendered.in_namespace("slurm-jobs")}
    assert "Secret" not in kinds and "PersistentVolumeClaim" not in kinds, kinds
    accounts = {a.name for a in rendered.in_namespace("slurm-jobs", "ServiceAccount")}
    assert accounts == {identity.service_account for identity in rendered.config.submission.identities}
    for account in rendered.in_namespace("slurm-jobs", "ServiceAccount"):
        assert account.manifest["automountServiceAccountToken"] is False


def test_disabled_submission_creates_nothing_for_it():
    rendered = render_raw(variant("dev", lambda raw: raw.update(submission={"enabled": False})))
    assert not rendered.in_namespace("slurm-jobs")
    assert not [n for n in rendered.by_kind("Namespace") if n.name == "slurm-jobs"]
    assert not rendered.components("dualsched:submission:JobSubmission")
    assert not rendered.components("dualsched:tokens:TokenMinter")


TRAINER = SubmissionIdentity(service_account="trainer", user="alice", account="ml")


def _with_sbatch_job(config):
    cluster = build(config)
    k8s.batch.v1.Job(
        "train",
        metadata=meta(namespace=cluster.submission.namespace),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(
                spec=cluster.submission.sbatch_pod_spec(SCRIPT, TRAINER, ("--partition=gpu", "--nodes=2"))
            ),
        ),
        opts=child(cluster),
    )
    return cluster


@pytest.fixture(scope="module")
def with_job():
    return render_with_registrations(render_stack("dev").config, "dev", program=_with_sbatch_job)


def test_sbatch_pod_submits_the_script_text_and_waits_with_a_renewed_token(with_job):
    job = with_job.one("Job")
    assert job.namespace == "slurm-jobs"
    sbatch = container(job, "sbatch")
    assert sbatch["command"] == ["bash", "/opt/dualsched/sbatch_wait.sh", "--partition=gpu", "--nodes=2"]
    env = {e["name"]: e["value"] for e in sbatch["env"]}
    assert env == {"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_TOKEN_FILE": "/run/slurm-token/token",
                   "BATCH_SCRIPT": SCRIPT, "SBATCH_ACCOUNT": "ml"}  # fmt: skip
    assert pod_spec(job)["restartPolicy"] == "Never"


def test_the_token_sidecar_starts_first_and_holds_the_only_credential(with_job):
    job = with_job.one("Job")
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == "trainer" and spec["automountServiceAccountToken"] is False
    [sidecar] = spec["initContainers"]
    assert sidecar["name"] == "slurm-token" and sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["exec"]["command"] == ["test", "-s", "/run/slurm-token/token"]
    projected = volume(job, "sa-token")["projected"]["sources"][0]["serviceAccountToken"]
    assert projected == {"audience": "dualsched-slurm", "expirationSeconds": 600, "path": "token"}
    assert mounts(sidecar)["/var/run/secrets/dualsched"]["readOnly"] is True
    assert "/var/run/secrets/dualsched" not in mounts(container(job, "sbatch"))
    assert volume(job, "slurm-token")["emptyDir"] == {"medium": "Memory"}
    assert mounts(container(job, "sbatch"))["/run/slurm-token"]["readOnly"] is True
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert env["FETCHER_MINTER_URL"] == "http://slurm-token-minter.slurm.svc.cluster.local:8080/token"


def test_sbatch_pod_mounts_no_munge_and_no_shared_storage(with_job):
    job = with_job.one("Job")
    volumes = {v["name"] for v in pod_spec(job)["volumes"]}
    assert volumes == {"client", "slurm-token", "tmp", "sa-token", "identity"}
    sbatch_mounts = mounts(container(job, "sbatch"))
    assert sbatch_mounts["/etc/slurm"] == {"name": "client", "mountPath": "/etc/slurm", "readOnly": True}
    assert sbatch_mounts["/etc/passwd"] == {"name": "identity", "mountPath": "/etc/passwd", "subPath": "users", "readOnly": True}


def test_sbatch_pod_runs_as_the_identitys_user_unprivileged(with_job):
    """slurmctld refuses a submission whose uid is not the token's user: the pod runs as that user."""
    job = with_job.one("Job")
    alice = with_job.config.slurm.users[0]
    assert pod_spec(job)["securityContext"] == {"runAsNonRoot": True, "runAsUser": alice.uid,
                                                "runAsGroup": alice.group_id, "fsGroup": alice.group_id}  # fmt: skip
    for name in ("sbatch", "slurm-token"):
        context = container(job, name)["securityContext"]
        assert context["runAsUser"] == alice.uid and context["runAsNonRoot"] is True
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}


def test_sbatch_job_validates_against_the_schema(with_job):
    kubernetes_validate.validate(with_job.one("Job").manifest, with_job.config.kubernetes_version, strict=True)


# ---------------------------------------------------------------------------- trust boundary


def test_one_namespace_for_several_users_is_said_at_every_preview():
    """Kubernetes lets a pod use any ServiceAccount of its namespace: identities of several Slurm users in one
    submission namespace let whoever creates pods there submit as any of them. Valid, so warned, not refused."""
    [warning] = trust_warnings(parse_stack_config(raw_stack("prod")))
    assert warning.startswith("submission.identities: the ServiceAccounts of Slurm users mlops, research share the namespace ")
    assert "one trust boundary" in warning


@pytest.mark.parametrize("change", [lambda raw: None, lambda raw: raw["submission"].update(enabled=False)])
def test_one_user_per_namespace_or_no_submission_is_not_warned_about(change):
    raw = raw_stack("dev")
    change(raw)
    assert trust_warnings(parse_stack_config(raw)) == []


def _sbatch_wait(tmp_path, sbatch: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """components/programs/sbatch_wait.sh under bash, with a fake sbatch (``sbatch``: its body) and an scontrol that
    reports the job COMPLETED; each sbatch call is a line of the returned list."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/bash\necho x >> {calls}\n{sbatch}\n")
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 'JobId=42 JobState=COMPLETED'\n")
    for tool in ("sbatch", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "token").write_text("t")
    script = (REPO / "components" / "programs" / "sbatch_wait.sh").read_text().replace("/tmp/sbatch.err", str(tmp_path / "err"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_TOKEN_FILE": str(tmp_path / "token"), "BATCH_SCRIPT": "#!/bin/sh\ntrue\n",
           "SBATCH_WAIT_POLL_SECONDS": "0"}  # fmt: skip
    result = subprocess.run(["bash", "-c", script, "sbatch_wait.sh", "--partition=gpu"], env=env, capture_output=True, text=True, timeout=30)
    return result, calls.read_text().split() if calls.exists() else []


def test_a_submission_slurmctld_took_no_connection_for_is_sent_again(tmp_path):
    """A controller starting anew (a reconfigure from 23.11, a failover) refused the one-node tier's Job once; sbatch never
    reached it, so a second try makes no second job."""
    refused_twice = f'[ $(wc -l < {tmp_path / "calls"}) -le 2 ] && {{ echo "sbatch: error: Batch job submission failed: ' \
                    'Unable to contact slurm controller (connect failure)" >&2; exit 1; }; echo 42'
    result, calls = _sbatch_wait(tmp_path, refused_twice)
    assert result.returncode == 0, result.stderr
    assert len(calls) == 3 and "Submitted batch job 42" in result.stdout and "job 42 COMPLETED" in result.stdout


def test_any_other_refusal_ends_the_job_at_once(tmp_path):
    result, calls = _sbatch_wait(tmp_path, 'echo "sbatch: error: Invalid account or account/partition combination" >&2; exit 1')
    assert result.returncode != 0 and len(calls) == 1 and "Invalid account" in result.stderr

