"""The examples in examples/ run as documented (under Pulumi mocks), so they cannot rot."""

from pathlib import Path

from components.program import build
from components.render import render_config
from config import load_stack_file
from examples.own_program import slurm_only
from examples.sbatch_job import submit_training_job

ROOT = Path(__file__).resolve().parent.parent


def test_slurm_only_program_builds_slurm_without_inference():
    config = load_stack_file(ROOT / "Pulumi.dev.yaml")
    render = render_config(config, "example", program=slurm_only)
    kinds = render.summary()
    assert kinds["StatefulSet"] == 1 and render.one("StatefulSet").name == "slurmctld"
    assert kinds["DaemonSet"] == len(config.slurm_pools)
    assert "Deployment" not in kinds and "HorizontalPodAutoscaler" not in kinds


def test_sbatch_job_submits_through_the_submission_namespace():
    config = load_stack_file(ROOT / "Pulumi.dev.yaml")
    render = render_config(config, "example", program=lambda c: submit_training_job(build(c)))
    job = render.one("Job").manifest
    assert job["metadata"]["namespace"] == config.submission.namespace
    pod = job["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["sbatch", "--wait"] and command[-1] == "/shared/jobs/train.sbatch"
    assert {volume["name"] for volume in pod["volumes"]} >= {"slurm-config", "shared", "munge-key", "munge-socket"}
    assert pod["initContainers"][0]["name"] == "munged"
