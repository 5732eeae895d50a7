"""JobSubmission: a namespace where Kubernetes Jobs have what they need to sbatch into Slurm."""

from __future__ import annotations

import kubernetes_validate
import pulumi_kubernetes as k8s
import pytest

from components.common import child, meta
from components.program import build
from config.models import SlurmUser
from rendering import container, mounts, pod_spec, render_raw, render_stack, render_with_registrations, variant, volume

PSA = "pod-security.kubernetes.io"


def _client_config(rendered):
    return rendered.one("ConfigMap", "submission")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_submission_namespace_is_baseline(stack):
    labels = render_stack(stack).named("Namespace", "slurm-jobs").manifest["metadata"]["labels"]
    assert labels[f"{PSA}/enforce"] == "baseline"
    assert labels[f"{PSA}/warn"] == "restricted"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_client_config_is_the_clusters_slurm_conf_only(stack):
    rendered = render_stack(stack)
    config_map = _client_config(rendered)
    assert config_map.namespace == "slurm-jobs"
    assert config_map.manifest["data"] == {"slurm.conf": rendered.slurm_files["slurm.conf"]}


def _identity(rendered):
    config_maps = rendered.in_namespace("slurm-jobs", "ConfigMap")
    [config_map] = [c for c in config_maps if c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "identity"]
    return config_map


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_namespace_holds_the_client_config_users_munge_key_and_a_shared_claim(stack):
    rendered = render_stack(stack)
    kinds = sorted(obj.kind for obj in rendered.in_namespace("slurm-jobs"))
    assert kinds == ["ConfigMap", "ConfigMap", "PersistentVolumeClaim", "Secret"]
    [secret] = rendered.in_namespace("slurm-jobs", "Secret")
    assert set(secret.manifest["data"]) == {"munge.key"}
    config_maps = {c.name for c in rendered.in_namespace("slurm-jobs", "ConfigMap")}
    assert config_maps == {_client_config(rendered).name, _identity(rendered).name}
    assert set(_identity(rendered).manifest["data"]) == {"users", "groups"}


def test_disabled_submission_creates_nothing_for_it():
    rendered = render_raw(variant("dev", lambda raw: raw.update(submission={"enabled": False})))
    assert not rendered.in_namespace("slurm-jobs")
    assert not [n for n in rendered.by_kind("Namespace") if n.name == "slurm-jobs"]
    assert not rendered.components("dualsched:submission:JobSubmission")


BOB = SlurmUser(name="bob", uid=2002, gid=3000)


def _with_sbatch_job(config):
    cluster = build(config)
    submission = cluster.submission
    k8s.batch.v1.Job(
        "train",
        metadata=meta(namespace=submission.namespace),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(
                spec=submission.sbatch_pod_spec("jobs/train.sbatch", BOB, ("--partition=gpu", "--nodes=2"))
            ),
        ),
        opts=child(cluster),
    )
    return cluster


@pytest.fixture(scope="module")
def with_job():
    return render_with_registrations(render_stack("dev").config, "dev", program=_with_sbatch_job)


def test_sbatch_pod_submits_a_script_from_shared_storage_and_waits(with_job):
    job = with_job.one("Job")
    assert job.namespace == "slurm-jobs"
    sbatch = container(job, "sbatch")
    assert sbatch["command"] == ["sbatch", "--wait", "--partition=gpu", "--nodes=2", "/shared/jobs/train.sbatch"]
    assert sbatch["env"] == [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}]
    assert pod_spec(job)["restartPolicy"] == "Never"


def test_sbatch_pod_mounts_client_config_users_munge_and_shared_storage(with_job):
    job = with_job.one("Job")
    namespace_objects = {obj.kind: obj for obj in with_job.in_namespace("slurm-jobs") if obj.kind not in ("Job", "ConfigMap")}
    assert volume(job, "slurm-config")["configMap"] == {"name": _client_config(with_job).name}
    assert volume(job, "identity")["configMap"] == {"name": _identity(with_job).name}
    assert volume(job, "munge-key")["secret"]["secretName"] == namespace_objects["Secret"].name
    assert volume(job, "shared")["persistentVolumeClaim"] == {"claimName": namespace_objects["PersistentVolumeClaim"].name}
    sbatch_mounts = mounts(container(job, "sbatch"))
    assert sbatch_mounts["/etc/slurm"]["readOnly"] is True
    assert sbatch_mounts["/shared"]["name"] == "shared"
    assert sbatch_mounts["/run/munge"]["name"] == "munge-socket"
    assert sbatch_mounts["/etc/passwd"] == {"name": "identity", "mountPath": "/etc/passwd", "subPath": "users", "readOnly": True}
    assert sbatch_mounts["/etc/group"] == {"name": "identity", "mountPath": "/etc/group", "subPath": "groups", "readOnly": True}
    assert container(job, "munged")["restartPolicy"] == "Always"


def test_sbatch_pod_is_unprivileged(with_job):
    job = with_job.one("Job")
    context = container(job, "sbatch")["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert pod_spec(job)["automountServiceAccountToken"] is False


def test_sbatch_runs_as_the_given_user_and_group(with_job):
    """munge vouches for the uid sbatch runs as: that is the Slurm job's owner."""
    job = with_job.one("Job")
    assert container(job, "sbatch")["securityContext"]["runAsUser"] == BOB.uid == 2002
    assert container(job, "sbatch")["securityContext"]["runAsGroup"] == BOB.group_id == 3000


def test_sbatch_user_gid_defaults_to_the_uid():
    config = render_stack("dev").config
    alice = config.slurm.users[0]
    assert alice.gid is None and alice.group_id == alice.uid

    def program(config):
        cluster = build(config)
        k8s.batch.v1.Job(
            "as-alice",
            metadata=meta(namespace=cluster.submission.namespace),
            spec=k8s.batch.v1.JobSpecArgs(
                template=k8s.core.v1.PodTemplateSpecArgs(spec=cluster.submission.sbatch_pod_spec("jobs/a.sbatch", alice))
            ),
            opts=child(cluster),
        )
        return cluster

    job = render_with_registrations(config, "dev", program=program).one("Job")
    assert container(job, "sbatch")["securityContext"]["runAsUser"] == alice.uid
    assert container(job, "sbatch")["securityContext"]["runAsGroup"] == alice.uid
    assert container(job, "sbatch")["command"] == ["sbatch", "--wait", "/shared/jobs/a.sbatch"]


def test_sbatch_job_validates_against_the_schema(with_job):
    kubernetes_validate.validate(with_job.one("Job").manifest, with_job.config.kubernetes_version, strict=True)
