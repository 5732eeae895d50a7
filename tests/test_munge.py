"""MungeKey and secret hygiene: the key lives only in Secrets, in the namespaces that run Slurm."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from pathlib import Path

import pytest

from dualsched.components.munge import (
    KEY_FILE,
    MUNGE_KEY_BYTES,
    MUNGED_START,
    PRIVATE_DIR,
    SECRET_DIR,
    SOCKET,
    SOCKET_DIR,
    munge_volumes,
    munged_sidecar,
)
from dualsched.components.render import REDACTED, redacted
from rendering import container, mounts, pod_spec, render_stack, volume, walk


def _munge_secrets(rendered):
    return [s for s in rendered.by_kind("Secret") if s.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "munge"]


def _secret_forms(rendered) -> set[str]:
    """Every generated secret value, raw and base64-encoded (as a Secret's data would hold it)."""
    forms = set()
    for value in rendered.generated_secrets:
        forms |= {value, base64.b64encode(value.encode()).decode()}
    return forms


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munge_secret_only_in_the_slurm_namespace(stack):
    """Jobs authenticate with minted tokens: neither the submission nor the inference namespace holds the key."""
    rendered = render_stack(stack)
    assert [s.namespace for s in _munge_secrets(rendered)] == ["slurm"]
    assert not [s for s in rendered.by_kind("Secret") if s.namespace in ("inference", "slurm-jobs")]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munge_key_is_one_random_1024_byte_key_shared_by_every_copy(stack):
    rendered = render_stack(stack)
    munge_bytes = [r for r in rendered.resources if r.type == "random:index/randomBytes:RandomBytes" and "munge" in r.name]
    assert [r.inputs["length"] for r in munge_bytes] == [MUNGE_KEY_BYTES]
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
        assert munged["command"] == ["sh", "-c", MUNGED_START]
        assert mounts(munged) == {
            "/etc/munge-secret": {"name": "munge-key", "mountPath": "/etc/munge-secret", "readOnly": True},
            "/var/lib/munge": {"name": "munge-private", "mountPath": "/var/lib/munge"},
            "/run/munge": {"name": "munge-socket", "mountPath": "/run/munge"},
        }
        assert volume(workload, "munge-private")["emptyDir"] == {"medium": "Memory"}
        assert "emptyDir" in volume(workload, "munge-socket")
        # Only munged sees the key, in the Secret or in its private copy.
        for main in pod_spec(workload)["containers"]:
            if main["name"] in ("cordon-watch", "exporter"):  # read Nodes, serve metrics files: no Slurm daemon is called
                assert "/run/munge" not in mounts(main)
                continue
            assert mounts(main)["/run/munge"]["name"] == "munge-socket"
            assert not {"munge-key", "munge-private"} & {m["name"] for m in main["volumeMounts"]}, main["name"]


def test_munge_volumes_are_the_secret_a_private_memory_dir_and_the_socket_dir():
    key, private, socket = munge_volumes("munge-abc")
    assert (key.name, key.secret.secret_name, key.secret.default_mode) == ("munge-key", "munge-abc", 0o400)
    assert (private.name, private.empty_dir.medium) == ("munge-private", "Memory")
    assert socket.name == "munge-socket" and socket.empty_dir is not None


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munged_runs_as_root_without_capabilities(stack):
    """Root owns the key munged insists on; no capability is needed to read and chmod what root owns."""
    rendered = render_stack(stack)
    workloads = [*rendered.by_kind("DaemonSet"), rendered.named("StatefulSet", "slurmctld"), rendered.one("Deployment", "slurmdbd")]
    for workload in workloads:
        context = container(workload, "munged")["securityContext"]
        assert context["runAsUser"] == 0 and "runAsNonRoot" not in context
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
        assert "privileged" not in context


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_munged_is_guaranteed_and_started_before_its_clients(stack):
    rendered = render_stack(stack)
    for workload in [*rendered.by_kind("DaemonSet"), rendered.named("StatefulSet", "slurmctld")]:
        munged = container(workload, "munged")
        assert munged["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "50m", "memory": "64Mi"}}
        # A native sidecar's startupProbe holds back the main containers until the socket exists.
        assert munged["startupProbe"]["exec"]["command"] == ["test", "-S", "/run/munge/munge.socket.2"]
        assert munged["startupProbe"]["periodSeconds"] == 1 and munged["startupProbe"]["failureThreshold"] >= 30


def test_munged_start_copies_the_key_and_sets_munges_modes():
    steps = MUNGED_START.split(" && ")
    assert steps[:4] == [
        "umask 077",
        f"install -m 0400 {SECRET_DIR}/{KEY_FILE} {PRIVATE_DIR}/{KEY_FILE}",
        f"chmod 0700 {PRIVATE_DIR}",
        f"chmod 0755 {SOCKET_DIR}",
    ]
    munged = steps[4].split()
    assert munged[:3] == ["exec", "munged", "--foreground"]
    assert f"--key-file={PRIVATE_DIR}/{KEY_FILE}" in munged and f"--socket={SOCKET}" in munged
    assert SOCKET == "/run/munge/munge.socket.2"
    # Nothing munged writes goes to the read-only Secret volume.
    assert not [arg for arg in munged if SECRET_DIR in arg]


def _fake_pod(tmp_path: Path) -> tuple[dict[str, Path], Path]:
    """A Secret volume as the kubelet lays it out (the key a symlink into ..data/), two empty
    dirs as the kubelet creates them (0777), and a `munged` that reports what it was given."""
    secret, private, socket = tmp_path / "secret", tmp_path / "private", tmp_path / "socket"
    (secret / "..data").mkdir(parents=True)
    key = secret / "..data" / KEY_FILE
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (secret / KEY_FILE).symlink_to(Path("..data") / KEY_FILE)
    for directory in (private, socket):
        directory.mkdir()
        directory.chmod(0o777)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    report = tmp_path / "munged.args"
    fake = bin_dir / "munged"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {report}\n')
    fake.chmod(0o755)
    return {"secret": secret, "private": private, "socket": socket, "bin": bin_dir}, report


def test_munged_start_runs_against_a_pod_like_layout(tmp_path):
    dirs, report = _fake_pod(tmp_path)
    script = MUNGED_START
    for real, fake in ((SECRET_DIR, dirs["secret"]), (PRIVATE_DIR, dirs["private"]), (SOCKET_DIR, dirs["socket"])):
        assert real in script
        script = script.replace(real, str(fake))
    env = {**os.environ, "PATH": f"{dirs['bin']}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=30)

    copied = dirs["private"] / KEY_FILE
    assert not copied.is_symlink() and copied.is_file()
    assert copied.read_bytes() == (dirs["secret"] / "..data" / KEY_FILE).read_bytes()
    assert stat.S_IMODE(copied.stat().st_mode) == 0o400
    assert stat.S_IMODE(dirs["private"].stat().st_mode) == 0o700
    assert stat.S_IMODE(dirs["socket"].stat().st_mode) == 0o755
    args = report.read_text().splitlines()
    assert args[0] == "--foreground"
    assert f"--key-file={copied}" in args
    assert f"--socket={dirs['socket']}/munge.socket.2" in args
    assert f"--pid-file={dirs['private']}/munged.pid" in args and f"--seed-file={dirs['private']}/munged.seed" in args


def test_munged_start_fails_without_a_key(tmp_path):
    """No key in the Secret: the sidecar fails (and restarts) instead of starting munged with none."""
    dirs, report = _fake_pod(tmp_path)
    (dirs["secret"] / KEY_FILE).unlink()
    script = MUNGED_START.replace(SECRET_DIR, str(dirs["secret"])).replace(PRIVATE_DIR, str(dirs["private"]))
    script = script.replace(SOCKET_DIR, str(dirs["socket"]))
    env = {**os.environ, "PATH": f"{dirs['bin']}:{os.environ['PATH']}"}
    result = subprocess.run(["sh", "-c", script], env=env, timeout=30, capture_output=True)
    assert result.returncode != 0
    assert not report.exists()


def test_munged_sidecar_of_an_image():
    sidecar = munged_sidecar("example.com/slurm:1")
    assert (sidecar.name, sidecar.image, sidecar.restart_policy) == ("munged", "example.com/slurm:1", "Always")
    assert sidecar.security_context.run_as_user == 0


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
