"""The pull-request workflow: the PR's own code never runs where a deploy credential is.

A pull request's code (render, report, policy over its checkout) runs with no secret and a read-only
token; the job that may write to the PR runs none of its code; only the job on pushes to main, in
the `preview` environment, holds the kubeconfig and the Pulumi credentials.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "preview.yml"
DEPLOY_SECRETS = {"KUBECONFIG_DATA", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN", "PULUMI_BACKEND_URL"}


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def triggers(document: dict) -> dict:
    return document.get("on", document.get(True))  # YAML 1.1 reads a bare `on` as true


def jobs() -> dict[str, dict]:
    return workflow()["jobs"]


def secrets_of(job: dict) -> set[str]:
    return set(re.findall(r"secrets\.([A-Za-z_][A-Za-z0-9_]*)", yaml.safe_dump(job)))


def runs_on_pull_requests(job: dict) -> bool:
    """Jobs without a condition run on every trigger; a condition on the event name decides otherwise."""
    condition = job.get("if", "")
    return "github.event_name == 'push'" not in condition


def checks_out(job: dict) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").startswith("actions/checkout@")]


def test_the_workflow_runs_on_pull_requests_and_on_pushes_to_main_only():
    on = triggers(workflow())
    assert set(on) == {"pull_request", "push"}
    assert on["push"] == {"branches": ["main"]}
    assert "pull_request_target" not in on  # it would run with the base's secrets and a write token


@pytest.mark.parametrize("name", [name for name, job in jobs().items() if runs_on_pull_requests(job)])
def test_no_job_that_runs_for_a_pull_request_sees_a_deploy_credential(name):
    job = jobs()[name]
    assert not secrets_of(job) & DEPLOY_SECRETS, name
    assert "environment" not in job, name
    for step in checks_out(job):
        # the token in .git/config would be readable by the PR's code
        assert step["with"]["persist-credentials"] is False, (name, step)


def test_the_job_that_writes_to_the_pull_request_runs_none_of_its_code():
    writers = {name: job for name, job in jobs().items() if job.get("permissions", {}).get("pull-requests") == "write"}
    assert list(writers) == ["comment"]
    steps = writers["comment"]["steps"]
    assert not checks_out(writers["comment"]) and not [step for step in steps if "run" in step]


def test_jobs_that_run_the_pull_requests_code_may_only_read():
    assert workflow()["permissions"] == {}
    for name, job in jobs().items():
        if checks_out(job) and runs_on_pull_requests(job):
            assert job["permissions"] == {"contents": "read"}, name


def test_only_the_preview_on_main_holds_the_deploy_credentials_in_its_environment():
    holders = {name: job for name, job in jobs().items() if secrets_of(job) & DEPLOY_SECRETS}
    assert list(holders) == ["preview"]
    preview = holders["preview"]
    assert preview["if"] == "github.event_name == 'push'"
    assert preview["environment"] == "preview"
    assert secrets_of(preview) == DEPLOY_SECRETS
    [checkout] = checks_out(preview)
    assert "ref" not in checkout["with"]  # the pushed commit of main, nothing else


def test_every_test_module_has_a_name_of_its_own():
    """`make test` collects every tier in one session, where pytest imports test modules by basename
    (rootdir-relative, no packages): two tiers' test_x.py stop the whole run at collection."""
    names = [path.name for path in (WORKFLOW.parents[2] / "tests").rglob("test_*.py")]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []


def every_step() -> list[dict]:
    return [step for job in jobs().values() for step in job["steps"]]


def test_every_action_is_pinned_by_commit_not_by_a_tag_that_can_move():
    uses = [step["uses"] for step in every_step() if "uses" in step]
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref) for ref in uses), uses


def test_nothing_downloaded_is_piped_to_a_shell():
    scripts = [step["run"] for step in every_step() if "run" in step]
    assert not [s for s in scripts if re.search(r"(curl|wget)[^\n|]*\|\s*(sudo\s+)?(ba|z)?sh\b", s)], scripts


def test_the_deploy_credentials_reach_only_the_step_that_previews():
    preview = jobs()["preview"]
    # the job may ask whether a backend is configured (a boolean), not hold a value
    job_level = yaml.safe_dump({key: value for key, value in preview.items() if key != "steps"}, width=1 << 20)
    assert not set(re.findall(r"secrets\.(\w+)(?! != '')", job_level)) & DEPLOY_SECRETS, job_level
    holders = [step for step in preview["steps"] if secrets_of(step) & DEPLOY_SECRETS]
    assert [step["name"] for step in holders] == ["Pulumi preview (only with a configured backend)"]
    assert secrets_of(holders[0]) == DEPLOY_SECRETS and "pulumi preview" in holders[0]["run"]
