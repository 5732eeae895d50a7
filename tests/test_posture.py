"""Container posture: every container of dev and prod is sized and locked down, or says why not.

Each container (init containers and native sidecars included) must set CPU and
memory requests and limits, and hold every hardening property below, unless
ALLOWED names that container and property with the reason the software needs
it. An allowance that no longer matches a container fails too, so the list
shrinks as the components improve.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Iterator

import pytest

from rendering import render_stack

STACKS = ("dev", "prod")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod")


def _no_escalation(container: dict, pod: dict) -> bool:
    return container.get("securityContext", {}).get("allowPrivilegeEscalation") is False


def _not_privileged(container: dict, pod: dict) -> bool:
    return container.get("securityContext", {}).get("privileged") is not True


def _read_only_root(container: dict, pod: dict) -> bool:
    return container.get("securityContext", {}).get("readOnlyRootFilesystem") is True


def _non_root(container: dict, pod: dict) -> bool:
    context, pod_context = container.get("securityContext", {}), pod.get("securityContext") or {}
    non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True
    user = context.get("runAsUser", pod_context.get("runAsUser"))
    return non_root and user != 0


def _drops_all_capabilities(container: dict, pod: dict) -> bool:
    return "ALL" in (container.get("securityContext", {}).get("capabilities") or {}).get("drop", [])


def _seccomp(container: dict, pod: dict) -> bool:
    profile = (container.get("securityContext", {}).get("seccompProfile")
               or (pod.get("securityContext") or {}).get("seccompProfile") or {})
    return profile.get("type") in ("RuntimeDefault", "Localhost")


PROPERTIES = {
    "allowPrivilegeEscalation=false": _no_escalation,
    "not privileged": _not_privileged,
    "readOnlyRootFilesystem": _read_only_root,
    "non-root": _non_root,
    "drops ALL capabilities": _drops_all_capabilities,
    "seccomp RuntimeDefault": _seccomp,
}

SLURMD: dict[str, str] = {
    "allowPrivilegeEscalation=false": "jobs run inside this container and may run setuid programs (no_new_privs would break them)",
    "non-root": "slurmd runs as root to start job steps as the submitting user",
    "drops ALL capabilities": "slurmstepd needs the runtime's defaults (setuid, setgid, chown, kill) and adds SYS_ADMIN, SYS_NICE (and SYS_RESOURCE with a fabric)",
    "readOnlyRootFilesystem": "jobs run inside this container and write to its file system",
}

# (kind, object name pattern, container name) -> {property: why this software needs it}; the first that matches
ALLOWED: dict[tuple[str, str, str], dict[str, str]] = {
    ("DaemonSet", "*slurmd-h100-[ab]-*", "slurmd"): {
        **SLURMD,
        "not privileged": "prod's training pools run job steps in containers: Enroot makes a user namespace and mounts /proc in it, "
                          "which the runtime's seccomp profile and masked /proc refuse (docs/containers.md); dedicated pools",
        "seccomp RuntimeDefault": "a privileged container runs unconfined whatever profile it names",
    },
    ("DaemonSet", "*slurmd-*", "slurmd"): SLURMD,
    ("StatefulSet", "slurmctld", "state-owner"): {
        "non-root": "gives the state directory to SlurmUser (chown, chmod: CHOWN and FOWNER only) where no fsGroup is applied",
    },
    ("Deployment", "*-login-*", "login"): {
        "non-root": "sshd becomes the user who logs in; it keeps only the capabilities for that (components/login.py)",
    },
    ("*", "*", "munged"): {
        "non-root": "munged refuses a key file it does not own and Secret volume files belong to root; it keeps no capability",
    },
}


def containers(stack: str) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    for obj in render_stack(stack).objects:
        if obj.kind not in WORKLOADS:
            continue
        spec = obj.manifest["spec"]
        if obj.kind == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        pod = spec if obj.kind == "Pod" else spec["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            yield obj.kind, obj.name, container, pod


def allowance(kind: str, name: str, container: str) -> tuple[tuple[str, str, str] | None, dict[str, str]]:
    for key, allowed in ALLOWED.items():
        if fnmatch.fnmatchcase(kind, key[0]) and fnmatch.fnmatchcase(name, key[1]) and container == key[2]:
            return key, allowed
    return None, {}


@pytest.mark.parametrize("stack", STACKS)
def test_every_container_sets_requests_and_limits(stack):
    missing = []
    for kind, name, container, _ in containers(stack):
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if not (resources.get(section) or {}).get(resource):
                    missing.append(f"{kind}/{name} {container['name']}: {section}.{resource}")
    assert missing == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_container_is_locked_down_or_allowed_with_a_reason(stack):
    seen = list(containers(stack))
    assert seen, "no workloads rendered"
    violations = []
    for kind, name, container, pod in seen:
        _, allowed = allowance(kind, name, container["name"])
        for prop, holds in PROPERTIES.items():
            if not holds(container, pod) and prop not in allowed:
                violations.append(f"{kind}/{name} container {container['name']}: not {prop}")
    assert violations == [], "\n".join(violations)


def test_every_allowance_is_needed():
    """An allowed exception must still be taken by some container in dev or prod (or it is removed)."""
    used: set[tuple[tuple[str, str, str], str]] = set()
    for stack in STACKS:
        for kind, name, container, pod in containers(stack):
            key, allowed = allowance(kind, name, container["name"])
            used.update((key, prop) for prop in allowed if not PROPERTIES[prop](container, pod))
    declared = {(key, prop) for key, allowed in ALLOWED.items() for prop in allowed}
    assert declared - used == set()
    for allowed in ALLOWED.values():
        assert all(prop in PROPERTIES and reason.strip() for prop, reason in allowed.items())
