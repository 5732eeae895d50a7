"""The login pods: config checks, the rendered Deployment, Service, Secret and policies, and the host key."""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import pytest

from dualsched.components.login import (
    CONFIG_HASH_ANNOTATION, HOST_KEY_DIR, HOST_KEY_FILE, KEYS_DIR, P256_ORDER, SMALLEST_KEY, SSHD_CAPABILITIES, SSHD_PORT, ecdsa_host_key,
)
from dualsched.config import ConfigError, parse_stack_config
from dualsched.policy import offline
from rendering import container, mounts, pod_spec, raw_stack, render_raw, volume
from test_posture import PROPERTIES

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF58B9nAJnLphnQeuo/dRbYncWi7fw7t63xz09+j5t0g alice@laptop"
ED25519_BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICDzc9xM9kPkSniXuccP6COobWT7ZeNxCD5KPsVJAYUX bob"


def with_login(login: dict[str, Any], users: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    raw = raw_stack("dev")
    raw["slurm"]["users"] += list(users)
    raw["slurm"]["login"] = login
    return raw


LOGIN = with_login({"enabled": True, "users": [{"name": "alice", "authorizedKeys": [ED25519]}]})


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw)
    return [line.strip() for line in str(caught.value).splitlines()[1:]]


def deployment(rendered):
    [found] = [d for d in rendered.by_kind("Deployment") if d.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "login"]
    return found


# ---------------------------------------------------------------------------- config


def test_login_is_off_by_default_and_renders_nothing():
    raw = raw_stack("dev")
    del raw["slurm"]["login"]
    rendered = render_raw(raw)
    assert not rendered.components("dualsched:login:Login")
    assert not [p for p in rendered.by_kind("NetworkPolicy") if "login" in p.name]


def test_every_login_problem_at_once_with_its_path_and_value():
    raw = with_login({"enabled": True, "users": [
        {"name": "mallory", "authorizedKeys": [ED25519]},
        {"name": "alice", "authorizedKeys": [ED25519]},
        {"name": "alice", "authorizedKeys": [ED25519]},
    ]})
    assert problems(raw) == [
        "slurm.login.users[0].name: is not one of slurm.users (got 'mallory')",
        "slurm.login.users[1].name: is listed more than once (give one entry all its keys) (got 'alice')",
        "slurm.login.users[2].name: is listed more than once (give one entry all its keys) (got 'alice')",
    ]


def test_an_enabled_login_without_users_is_refused():
    assert problems(with_login({"enabled": True})) == [
        "slurm.login.users: an enabled login needs at least one user with keys: nobody could log in (got [])"
    ]


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(f'command="/bin/sh" {ED25519}', id="options"),
        pytest.param(ED25519.replace("ssh-ed25519", "ssh-rsa", 1), id="type-not-the-keys-own"),
        pytest.param(ED25519[:60], id="cut-short"),
        pytest.param(ED25519 + "\nssh-ed25519 AAAA", id="two-lines"),
        pytest.param("-----BEGIN OPENSSH PRIVATE KEY-----", id="a-private-key"),
    ],
)
def test_a_key_that_is_not_one_public_key_line_is_refused(key):
    [problem] = problems(with_login({"enabled": True, "users": [{"name": "alice", "authorizedKeys": [key]}]}))
    assert problem.startswith("slurm.login.users[0].authorizedKeys[0]: must be one OpenSSH public key line"), problem


def test_real_keys_of_every_common_type_are_accepted(tmp_path):
    keys = []
    for key_type in ("ed25519", "ecdsa", "rsa"):
        path = tmp_path / key_type
        subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", "user@host", "-f", str(path)], check=True)
        keys.append(path.with_suffix(".pub").read_text().strip())
    config = parse_stack_config(with_login({"enabled": True, "users": [{"name": "alice", "authorizedKeys": keys}]}))
    assert config.slurm.login.users[0].authorized_keys == tuple(keys)


# ---------------------------------------------------------------------------- host key


def public_key_of(private_pem: str, tmp_path) -> str:
    """OpenSSH's own parse of the key (ssh-keygen -y), as sshd loads a HostKey."""
    path = tmp_path / "key"
    path.write_text(private_pem)
    path.chmod(0o600)
    return subprocess.run(["ssh-keygen", "-y", "-f", str(path)], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(bytes(48), id="smallest"),
        pytest.param((P256_ORDER - 2 - SMALLEST_KEY).to_bytes(48, "big"), id="largest"),
        pytest.param(b"\xff" * 48, id="all-ones"),
        pytest.param(bytes(range(48)), id="bytes"),
    ],
)
def test_any_seed_makes_a_host_key_openssh_loads(seed, tmp_path):
    assert public_key_of(ecdsa_host_key(seed), tmp_path).startswith("ecdsa-sha2-nistp256 ")


def test_the_same_seed_makes_the_same_host_key_and_another_seed_another(tmp_path):
    first = public_key_of(ecdsa_host_key(bytes(range(48))), tmp_path)
    assert public_key_of(ecdsa_host_key(bytes(range(48))), tmp_path) == first
    assert public_key_of(ecdsa_host_key(bytes(range(1, 49))), tmp_path) != first


def test_the_host_key_secret_holds_the_key_of_the_stacks_random_seed():
    """The seed lives in the stack's state: the same key after a pod restart, a rollout or an upgrade."""
    rendered = render_raw(LOGIN)
    [seed] = [r for r in rendered.resources if r.type == "random:index/randomBytes:RandomBytes" and "login" in r.name]
    [secret] = [s for s in rendered.by_kind("Secret") if s.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "login"]
    # the mock keeps each RandomBytes' base64 and hex: the seed is the 48 bytes whose hex is there too
    [seed] = [raw for raw in map(_decoded, rendered.generated_secrets)
              if raw is not None and len(raw) == seed.inputs["length"] and raw.hex() in rendered.generated_secrets]
    assert secret.manifest["stringData"] == {HOST_KEY_FILE: ecdsa_host_key(seed)}


def _decoded(value: str):
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return None


def test_no_key_material_outside_the_secret():
    rendered = render_raw(LOGIN)
    [secret] = [s for s in rendered.by_kind("Secret") if s.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "login"]
    private_key = secret.manifest["stringData"][HOST_KEY_FILE]
    others = json.dumps([o.manifest for o in rendered.objects if o is not secret])
    assert "PRIVATE KEY" not in others and private_key.splitlines()[1] not in others
    assert "PRIVATE KEY" not in json.dumps(rendered.component_outputs, default=str)
    for config_map in rendered.by_kind("ConfigMap"):
        assert "PRIVATE KEY" not in json.dumps(config_map.manifest)


# ---------------------------------------------------------------------------- the pods


def test_the_login_pod_runs_sshd_with_no_token_and_only_the_capabilities_it_needs():
    rendered = render_raw(LOGIN)
    login = deployment(rendered)
    spec = pod_spec(login)
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    sshd = container(login, "login")
    assert sshd["image"] == rendered.config.images.login
    context = sshd["securityContext"]
    assert context["runAsUser"] == 0 and context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"], "add": list(SSHD_CAPABILITIES)}
    assert sshd["ports"] == [{"name": "ssh", "containerPort": SSHD_PORT}]
    assert [c["name"] for c in spec["initContainers"]] == ["munged"]


def test_with_containers_the_login_pod_runs_the_login_image_with_pyxis():
    """srun and sbatch there read the plugstack.conf the login pod mounts, whose Pyxis is `required` once a pool
    runs containers: a client without the plugin stops ("Failed to initialize plugin stack"; the real Slurm:
    tests/slurm/test_pyxis_plugstack.py)."""
    raw = raw_stack("prod")  # its training pools run containers
    raw["slurm"]["login"] = {"enabled": True, "users": [{"name": "mlops", "authorizedKeys": [ED25519]}]}
    rendered = render_raw(raw)
    assert "required " in rendered.slurm_files["plugstack.conf"]
    assert container(deployment(rendered), "login")["image"] == rendered.config.images.login_pyxis
    assert rendered.config.images.login_pyxis == "ghcr.io/slinkyproject/login-pyxis:25.11.6-ubuntu24.04"


def test_only_munged_mounts_the_munge_key_and_only_the_login_container_the_host_key():
    login = deployment(render_raw(LOGIN))
    munge_key = [m["mountPath"] for m in container(login, "munged")["volumeMounts"] if m["name"] == "munge-key"]
    assert munge_key and "munge-key" not in [m["name"] for m in container(login, "login")["volumeMounts"]]
    assert mounts(container(login, "login"))[HOST_KEY_DIR]["readOnly"] is True
    assert volume(login, "host-key")["secret"]["defaultMode"] == 0o400
    assert "host-key" not in [m["name"] for m in container(login, "munged")["volumeMounts"]]


def test_the_login_pod_has_shared_storage_slurm_conf_and_the_compute_pods_identities():
    rendered = render_raw(LOGIN)
    login = deployment(rendered)
    paths = mounts(container(login, "login"))
    [slurmd] = rendered.by_kind("DaemonSet")[:1]
    slurmd_paths = mounts(container(slurmd, "slurmd"))
    claim = volume(login, "shared")["persistentVolumeClaim"]["claimName"]
    assert claim == volume(slurmd, "shared")["persistentVolumeClaim"]["claimName"]
    assert paths["/shared"]["name"] == "shared" and "/shared" in slurmd_paths
    assert paths["/etc/slurm"]["name"] == "slurm-config"
    login_config = rendered.named("ConfigMap", "login-config", "slurm").manifest["data"]
    [user_directory] = [c for c in rendered.by_kind("ConfigMap") if c.namespace == "slurm"
                        and c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "identity"]
    slurm_passwd = user_directory.manifest["data"]["users"]
    # The compute pods' passwd, line for line, plus OpenSSH's privilege-separation user (nobody's ids).
    assert login_config["users"].splitlines()[:-1] == slurm_passwd.splitlines()
    assert login_config["users"].splitlines()[-1].startswith("sshd:x:65534:65534:")
    assert login_config["groups"] == user_directory.manifest["data"]["groups"]
    assert paths["/etc/passwd"]["subPath"] == "users" and paths["/etc/group"]["subPath"] == "groups"


def test_sshd_allows_keys_only_no_root_and_only_the_configured_users():
    raw = with_login(
        {"enabled": True, "users": [{"name": "alice", "authorizedKeys": [ED25519]}, {"name": "bob", "authorizedKeys": [ED25519_BOB]}]},
        users=({"name": "bob", "uid": 2002}, {"name": "carol", "uid": 2003}),
    )
    rendered = render_raw(raw)
    data = rendered.named("ConfigMap", "login-config", "slurm").manifest["data"]
    settings = dict(line.split(" ", 1) for line in data["sshd_config"].splitlines() if line and not line.startswith("#"))
    assert settings["PasswordAuthentication"] == settings["KbdInteractiveAuthentication"] == "no"
    assert settings["PermitRootLogin"] == "no" and settings["AuthenticationMethods"] == "publickey"
    assert settings["AllowUsers"] == "alice bob"  # carol is a Slurm user without login
    assert settings["AuthorizedKeysCommand"] == f"/usr/bin/cat {KEYS_DIR}/%u"
    assert data["alice.pub"] == ED25519 + "\n" and data["bob.pub"] == ED25519_BOB + "\n" and "carol.pub" not in data
    items = volume(deployment(rendered), "authorized-keys")["configMap"]["items"]
    assert items == [{"key": "alice.pub", "path": "alice"}, {"key": "bob.pub", "path": "bob"}]


def test_a_new_key_rolls_no_pod_but_a_new_user_does():
    def annotation(raw):
        return deployment(render_raw(raw)).manifest["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]

    two_keys = with_login({"enabled": True, "users": [{"name": "alice", "authorizedKeys": [ED25519, ED25519_BOB]}]})
    new_user = with_login(
        {"enabled": True, "users": [{"name": "alice", "authorizedKeys": [ED25519]}, {"name": "bob", "authorizedKeys": [ED25519_BOB]}]},
        users=({"name": "bob", "uid": 2002},),
    )
    assert annotation(two_keys) == annotation(LOGIN) != annotation(new_user)


@pytest.mark.parametrize("service_type", ["ClusterIP", "NodePort", "LoadBalancer"])
def test_the_service_maps_the_configured_port_to_sshd(service_type):
    raw = with_login({"enabled": True, "serviceType": service_type, "port": 2022,
                      "users": [{"name": "alice", "authorizedKeys": [ED25519]}]})
    service = render_raw(raw).named("Service", "login", "slurm").manifest["spec"]
    assert service["type"] == service_type
    assert service["ports"] == [{"name": "ssh", "port": 2022, "targetPort": "ssh"}]
    assert service.get("externalTrafficPolicy") == (None if service_type == "ClusterIP" else "Local")


def test_policies_let_clients_reach_sshd_and_the_login_pods_reach_slurmctld_and_slurmdbd():
    raw = with_login({"enabled": True, "clientCidrs": ["203.0.113.0/24"], "users": [{"name": "alice", "authorizedKeys": [ED25519]}]})
    rendered = render_raw(raw)
    policies = {p.name: p.manifest["spec"] for p in rendered.by_kind("NetworkPolicy") if p.namespace == "slurm"}
    [login] = [spec for name, spec in policies.items() if "-slurm-login-" in name]
    assert login["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "login"}}
    assert login["ingress"] == [{"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": SSHD_PORT, "protocol": "TCP"}]}]
    assert [(rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"], rule["ports"][0]["port"]) for rule in login["egress"]] == [
        ("slurmctld", 6817), ("slurmdbd", 6819)
    ]
    login_peer = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "login"}}}
    for daemon in ("slurmctld", "slurmdbd"):
        [spec] = [spec for name, spec in policies.items() if f"-slurm-{daemon}-" in name]
        assert login_peer in spec["ingress"][0]["from"], daemon


def test_the_login_container_holds_the_teams_posture_but_non_root():
    """tests/test_posture.py checks dev and prod, which run no login pod: the same properties here. sshd
    must be root to become the user who logs in; the capabilities it keeps are listed above."""
    login = deployment(render_raw(LOGIN))
    spec = pod_spec(login)
    failing = {prop for prop, holds in PROPERTIES.items() if not holds(container(login, "login"), spec)}
    assert failing == {"non-root"}
    assert not {prop for prop, holds in PROPERTIES.items() if not holds(container(login, "munged"), spec)} - {"non-root"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_stack_with_login_passes_the_policy_pack(stack):
    raw = raw_stack(stack)
    user = raw["slurm"]["users"][0]["name"]
    raw["slurm"]["login"] = {"enabled": True, "users": [{"name": user, "authorizedKeys": [ED25519]}]}
    assert offline.check(parse_stack_config(raw)) == []
