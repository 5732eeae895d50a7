"""JobSubmission: a namespace where Kubernetes Jobs have what they need to sbatch into Slurm."""

from __future__ import annotations

import kubernetes_validate
import pulumi_kubernetes as k8s
import pytest

from components.common import child, meta
from components.program import build
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


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_namespace_holds_the_munge_key_and_a_shared_claim(stack):
    rendered = render_stack(stack)
    kinds = sorted(obj.kind for obj in rendered.in_namespace("slurm-jobs"))
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Secret"]
    [secret] = rendered.in_namespace("slurm-jobs", "Secret")
    assert set(secret.manifest["data"]) == {"munge.key"}


def test_disabled_submission_creates_nothing_for_it():
    rendered = render_raw(variant("dev", lambda raw: raw.update(submission={"enabled": False})))
    assert not rendered.in_namespace("slurm-jobs")
    assert not [n for n in rendered.by_kind("Namespace") if n.name == "slurm-jobs"]
    assert not rendered.components("dualsched:submission:JobSubmission")


def _with_sbatch_job(config):
    cluster = build(config)
    submission = cluster.submission
    k8s.batch.v1.Job(
        "train",
        metadata=meta(namespace=submission.namespace),
        spec=k8s.batch.v1.JobSpecArgs(
            backoff_limit=0,
            template=k8s.core.v1.PodTemplateSpecArgs(
                spec=submission.sbatch_pod_spec("jobs/train.sbatch", ("--partition=gpu", "--nodes=2"))
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


def test_sbatch_pod_mounts_client_config_munge_and_shared_storage(with_job):
    job = with_job.one("Job")
    namespace_objects = {obj.kind: obj for obj in with_job.in_namespace("slurm-jobs") if obj.kind != "Job"}
    assert volume(job, "slurm-config")["configMap"] == {"name": namespace_objects["ConfigMap"].name}
    assert volume(job, "munge-key")["secret"]["secretName"] == namespace_objects["Secret"].name
    assert volume(job, "shared")["persistentVolumeClaim"] == {"claimName": namespace_objects["PersistentVolumeClaim"].name}
    sbatch_mounts = mounts(container(job, "sbatch"))
    assert sbatch_mounts["/etc/slurm"]["readOnly"] is True
    assert sbatch_mounts["/shared"]["name"] == "shared"
    assert sbatch_mounts["/run/munge"]["name"] == "munge-socket"
    assert container(job, "munged")["restartPolicy"] == "Always"


def test_sbatch_pod_is_unprivileged(with_job):
    job = with_job.one("Job")
    context = container(job, "sbatch")["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert pod_spec(job)["automountServiceAccountToken"] is False


def test_sbatch_job_validates_against_the_schema(with_job):
    kubernetes_validate.validate(with_job.one("Job").manifest, with_job.config.kubernetes_version, strict=True)
