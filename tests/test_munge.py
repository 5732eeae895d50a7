"""MungeKey and secret hygiene: the key lives only in Secrets, in the namespaces that run Slurm."""

from __future__ import annotations

import base64

import pytest

from components.munge import MUNGE_KEY_BYTES
from components.render import REDACTED, redacted
from rendering import container, mounts, pod_spec, render_raw, render_stack, variant, volume, walk


def _munge_secrets(rendered):
    return [s for s in rendered.by_kind("Secret") if s.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "munge"]


def _secret_forms(rendered) -> set[str]:
    """Every generated secret value, raw and base64-encoded (as a Secret's data would hold it)."""
    forms = set()
    for value in rendered.generated_secrets:
        forms |= {value, base64.b64encode(value.encode()).decode()}
    return forms


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munge_secret_in_slurm_and_jobs_namespaces_never_inference(stack):
    rendered = render_stack(stack)
    secrets = _munge_secrets(rendered)
    assert sorted(s.namespace for s in secrets) == ["slurm", "slurm-jobs"]
    assert not [s for s in rendered.by_kind("Secret") if s.namespace == "inference"]


def test_without_submission_only_slurm_gets_the_key():
    rendered = render_raw(variant("dev", lambda raw: raw.update(submission={"enabled": False})))
    assert [s.namespace for s in _munge_secrets(rendered)] == ["slurm"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munge_key_is_one_random_1024_byte_key_shared_by_every_copy(stack):
    rendered = render_stack(stack)
    assert len([r for r in rendered.resources if r.type == "random:index/randomBytes:RandomBytes"]) == 1
    keys = {s.manifest["data"]["munge.key"] for s in _munge_secrets(rendered)}
    assert len(keys) == 1
    [key] = keys
    assert len(base64.b64decode(key)) == MUNGE_KEY_BYTES
    assert key in rendered.generated_secrets
    assert all(s.manifest["type"] == "Opaque" for s in _munge_secrets(rendered))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_slurm_daemon_pod_runs_munged_with_the_key_of_its_namespace(stack):
    rendered = render_stack(stack)
    secret_by_namespace = {s.namespace: s.name for s in _munge_secrets(rendered)}
    daemons = [
        *rendered.by_kind("DaemonSet"),
        rendered.named("StatefulSet", "slurmctld"),
        rendered.one("Deployment", "slurmdbd"),
    ]
    for workload in daemons:
        key = volume(workload, "munge-key")["secret"]
        assert key["secretName"] == secret_by_namespace[workload.namespace]
        assert key["defaultMode"] == 0o400
        munged = container(workload, "munged")
        assert munged in pod_spec(workload)["initContainers"]
        assert munged["restartPolicy"] == "Always"  # a native sidecar: it outlives init
        assert mounts(munged)["/etc/munge"] == {"name": "munge-key", "mountPath": "/etc/munge", "readOnly": True}
        assert mounts(munged)["/run/munge"]["name"] == "munge-socket"
        assert "emptyDir" in volume(workload, "munge-socket")
        main = pod_spec(workload)["containers"][0]
        assert mounts(main)["/run/munge"]["name"] == "munge-socket"
        assert "/etc/munge" not in mounts(main)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_inference_pods_never_see_the_munge_key(stack):
    for deployment in render_stack(stack).in_namespace("inference", "Deployment"):
        names = {v["name"] for v in pod_spec(deployment)["volumes"]}
        assert "munge-key" not in names and not any("secret" in v for v in pod_spec(deployment)["volumes"])


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_generated_secret_outside_a_secret(stack):
    """Neither in a ConfigMap, an annotation, an env value nor anywhere else of any non-Secret object."""
    rendered = render_stack(stack)
    forms = _secret_forms(rendered)
    assert forms
    for obj in rendered.objects:
        if obj.kind == "Secret":
            continue
        for path, value in walk(obj.manifest):
            if isinstance(value, str):
                assert not any(form in value for form in forms), f"{obj.kind}/{obj.name} {path} holds a secret"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_secret_in_annotations_or_env_literals_of_secrets_either(stack):
    rendered = render_stack(stack)
    forms = _secret_forms(rendered)
    for obj in rendered.objects:
        annotations = obj.manifest["metadata"].get("annotations") or {}
        assert not any(form in str(value) for value in annotations.values() for form in forms)
        for path, value in walk(obj.manifest):
            if ".env[" in path and path.endswith(".value"):
                assert value not in forms and "PASS" not in path, f"{obj.kind}/{obj.name} {path}"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_redacted_hides_every_secret_value_and_leaves_other_objects_alone(stack):
    rendered = render_stack(stack)
    forms = _secret_forms(rendered)
    for obj in rendered.objects:
        clean = redacted(obj.manifest)
        if obj.kind != "Secret":
            assert clean == obj.manifest
            continue
        for key in ("data", "stringData"):
            if key in obj.manifest:
                assert set(clean[key]) == set(obj.manifest[key])
                assert set(clean[key].values()) == {REDACTED}
        assert not any(form in str(value) for _, value in walk(clean) for form in forms)
    # redacting is a copy: the render itself keeps the values
    assert any(form in str(s.manifest) for s in rendered.by_kind("Secret") for form in forms)
