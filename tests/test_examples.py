"""The examples in examples/ run as documented (under Pulumi mocks), so they cannot rot."""

from pathlib import Path

import pytest

from components.program import build
from components.render import render_config
from config import load_stack_file, parse_stack_config
from examples.own_program import slurm_only
from examples.sbatch_job import TRAINING_SCRIPT, job_identity, submit_training_job
from rendering import raw_stack

ROOT = Path(__file__).resolve().parent.parent


def _config_with_identities(*identities, users=({"name": "alice", "uid": 2001},)):
    raw = raw_stack("dev")
    raw["slurm"]["users"] = list(users)
    raw["submission"] = {"identities": list(identities)}
    return parse_stack_config(raw)


def test_slurm_only_program_builds_slurm_without_inference():
    config = load_stack_file(ROOT / "Pulumi.dev.yaml")
    render = render_config(config, "example", program=slurm_only)
    kinds = render.summary()
    assert kinds["StatefulSet"] == 1 and render.one("StatefulSet").name == "slurmctld"
    assert kinds["DaemonSet"] == len(config.slurm_pools)
    assert "Deployment" not in kinds and "HorizontalPodAutoscaler" not in kinds


def test_slurm_only_program_wires_users_and_the_restart_hash():
    config = load_stack_file(ROOT / "Pulumi.dev.yaml")
    render = render_config(config, "example", program=slurm_only)
    [identity] = [c for c in render.by_kind("ConfigMap") if c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "identity"]
    for workload in (render.one("StatefulSet"), *render.by_kind("DaemonSet")):
        volumes = {v["name"]: v for v in workload.manifest["spec"]["template"]["spec"]["volumes"]}
        assert volumes["identity"]["configMap"] == {"name": identity.name}, workload.name
    annotations = render.one("StatefulSet").manifest["spec"]["template"]["metadata"]["annotations"]
    assert sorted(annotations) == ["dualsched.io/slurm-restart-hash", "dualsched.io/users-hash"]


def test_sbatch_job_submits_through_the_submission_namespace():
    config = _config_with_identities({"serviceAccount": "trainer", "user": "alice"})
    render = render_config(config, "example", program=lambda c: submit_training_job(build(c), c))
    job = render.one("Job").manifest
    assert job["metadata"]["namespace"] == config.submission.namespace
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    sbatch = pod["containers"][0]
    assert sbatch["command"][:2] == ["bash", "/opt/dualsched/sbatch_wait.sh"]
    assert {"name": "BATCH_SCRIPT", "value": TRAINING_SCRIPT} in sbatch["env"]
    assert pod["initContainers"][0]["name"] == "slurm-token"
    assert pod["securityContext"]["runAsUser"] == sbatch["securityContext"]["runAsUser"] == 2001


def test_sbatch_job_submits_as_the_first_identity():
    config = _config_with_identities(
        {"serviceAccount": "pipelines", "user": "carol"}, {"serviceAccount": "notebooks", "user": "dave"},
        users=({"name": "carol", "uid": 4001, "gid": 4500}, {"name": "dave", "uid": 4002}),
    )
    assert job_identity(config).service_account == "pipelines"
    render = render_config(config, "example", program=lambda c: submit_training_job(build(c), c))
    pod = render.one("Job").manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pipelines"
    assert pod["containers"][0]["securityContext"]["runAsUser"] == 4001
    assert pod["containers"][0]["securityContext"]["runAsGroup"] == 4500


def test_sbatch_job_without_identities_is_a_clear_error():
    config = _config_with_identities()
    with pytest.raises(ValueError, match="maps no ServiceAccount"):
        job_identity(config)


def test_dev_stack_has_an_identity_for_the_example():
    assert job_identity(load_stack_file(ROOT / "Pulumi.dev.yaml")).user == "alice"


