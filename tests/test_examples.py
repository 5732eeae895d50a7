"""The examples in examples/ run as documented (under Pulumi mocks), so they cannot rot."""

from pathlib import Path

import pytest

from components.program import build
from components.render import render_config
from config import load_stack_file, parse_stack_config
from examples.own_program import slurm_only
from examples.sbatch_job import job_user, submit_training_job
from rendering import raw_stack

ROOT = Path(__file__).resolve().parent.parent


def _config_with_users(*users):
    raw = raw_stack("dev")
    raw["slurm"]["users"] = list(users)
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
    config = _config_with_users({"name": "alice", "uid": 2001})
    render = render_config(config, "example", program=lambda c: submit_training_job(build(c), c))
    job = render.one("Job").manifest
    assert job["metadata"]["namespace"] == config.submission.namespace
    pod = job["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["sbatch", "--wait"] and command[-1] == "/shared/jobs/train.sbatch"
    assert {volume["name"] for volume in pod["volumes"]} >= {"slurm-config", "shared", "munge-key", "munge-socket", "identity"}
    assert pod["initContainers"][0]["name"] == "munged"
    assert pod["containers"][0]["securityContext"]["runAsUser"] == 2001


def test_sbatch_job_submits_as_the_first_configured_user():
    config = _config_with_users({"name": "carol", "uid": 4001, "gid": 4500}, {"name": "dave", "uid": 4002})
    assert job_user(config).name == "carol"
    render = render_config(config, "example", program=lambda c: submit_training_job(build(c), c))
    pod = render.one("Job").manifest["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["runAsUser"] == 4001
    assert pod["containers"][0]["securityContext"]["runAsGroup"] == 4500


def test_sbatch_job_without_users_is_a_clear_error():
    config = _config_with_users()
    with pytest.raises(ValueError, match="no Slurm users"):
        job_user(config)
    with pytest.raises(ValueError, match="users"):
        render_config(config, "example", program=lambda c: submit_training_job(build(c), c))


def test_dev_stack_has_a_user_for_the_example():
    assert job_user(load_stack_file(ROOT / "Pulumi.dev.yaml")).name == "alice"
