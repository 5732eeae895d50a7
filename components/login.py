"""Login pods: sshd beside the Slurm client commands, for users with keys in the stack config.

A login pod is a Slurm client host like the compute nodes: munged with the cluster's key in a
sidecar (the login container never sees the key), slurm.conf from the cluster's ConfigMap, the
shared file system at the same path as the jobs, and the passwd and group files of
components/identity.py, so a login shell, its files on /shared and its jobs carry the same uid.

The sshd host key is the same across pod restarts, replicas and upgrades: it is derived from
bytes pulumi-random keeps in the stack's state, and reaches the pods only through a Secret.
"""

from __future__ import annotations

import base64
import textwrap
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.components.common import (
    child, claim_volume, config_map_volume, control_daemon_placement, empty_dir, labels, locked_down, meta, mount,
    requirements, tcp_probe,
)
from dualsched.components.compute import SHARED_MOUNT
from dualsched.components.identity import (
    group_file, home_mount, home_volume, identity_mounts, identity_volume, make_homes, passwd_file,
)
from dualsched.components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from dualsched.components.slurm_config import CONFIG_DIR
from dualsched.components.slurm_files import config_hash
from dualsched.config.models import NOBODY_UID, LoginServiceType, StackConfig

LOGIN = "login"
SERVICE_NAME = "login"
SSHD_PORT = 2222
"""Where sshd listens in the pod: above 1023, so it needs no CAP_NET_BIND_SERVICE (the Service maps login.port to it)."""
CONFIG_MAP_NAME = "login-config"
CONFIG_HASH_ANNOTATION = "dualsched.io/login-config-hash"
HOST_KEY_FILE = "ssh_host_ecdsa_key"
HOST_KEY_DIR = "/etc/ssh/host-key"
SSHD_CONFIG_DIR = "/etc/ssh/dualsched"
SSHD_CONFIG = "sshd_config"
KEYS_DIR = "/etc/ssh/authorized-keys"
KEYS_SUFFIX = ".pub"
"""ConfigMap keys of the users' public keys (``<user>.pub``): a suffix, so no user name ends a key
(the policy pack reads a key ending in 'pass' or 'token' as a secret's name)."""
PRIVSEP_DIR = "/run/sshd"
SEED_BYTES = 48
"""384 random bits for a 256-bit key: reduced into the key's range, the bias is below 2**-128."""

# What sshd needs as root, and nothing else (all are in Pod Security's baseline): switch to the user
# (SETUID, SETGID), chroot its pre-authentication child into PRIVSEP_DIR (SYS_CHROOT), signal that
# child at LoginGraceTime (KILL: it runs as nobody), hand the user a terminal (CHOWN, FOWNER: chown,
# then chmod, of /dev/pts/N: sshpty.c pty_setowner), and record a terminal login in the audit log,
# without which Debian's and Ubuntu's sshd (built with Linux audit) close the session (AUDIT_WRITE).
SSHD_CAPABILITIES = ("SETUID", "SETGID", "SYS_CHROOT", "KILL", "CHOWN", "FOWNER", "AUDIT_WRITE")

# The privilege-separation user OpenSSH 9 requires by name ("sshd"); its pre-authentication
# child runs as nobody's ids.
PRIVSEP_USER = f"sshd:x:{NOBODY_UID}:{NOBODY_UID}:sshd privilege separation:{PRIVSEP_DIR}:/usr/sbin/nologin"


def sshd_start(config: StackConfig) -> str:
    """A pod template's emptyDir is 0777: the privilege-separation chroot must not be writable by others,
    /tmp needs the sticky bit, and each user gets a home of their own (identity.make_homes)."""
    return (f"chmod 0755 {PRIVSEP_DIR} && chmod 1777 /tmp && {make_homes(config.slurm.users)}"
            f" && exec /usr/sbin/sshd -D -e -f {SSHD_CONFIG_DIR}/{SSHD_CONFIG}")  # fmt: skip


P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
SMALLEST_KEY = 2**129
"""OpenSSH takes an ECDSA private key above the square root of the order and below order - 1
(sshkey_ec_validate_private): keys are SMALLEST_KEY .. order - 2."""
# RFC 5915 ECPrivateKey, DER: SEQUENCE { version 1, privateKey OCTET STRING (32 bytes), [0] prime256v1 },
# without the optional public key, which OpenSSL computes from the private key when sshd loads the file.
_EC_KEY_PREFIX = bytes.fromhex("30310201010420")
_EC_KEY_SUFFIX = bytes.fromhex("a00a06082a8648ce3d030107")


def ecdsa_host_key(seed: bytes) -> str:
    """An ECDSA P-256 private key in PEM (``EC PRIVATE KEY``) from random bytes: the program has no
    key generator (pulumi-random makes bytes, not keys), and any scalar in the range above is a key."""
    scalar = SMALLEST_KEY + int.from_bytes(seed, "big") % (P256_ORDER - 1 - SMALLEST_KEY)
    der = _EC_KEY_PREFIX + scalar.to_bytes(32, "big") + _EC_KEY_SUFFIX
    lines = textwrap.wrap(base64.b64encode(der).decode(), 64)
    return "\n".join(["-----BEGIN EC PRIVATE KEY-----", *lines, "-----END EC PRIVATE KEY-----", ""])


def sshd_config(config: StackConfig) -> str:
    """Keys only, no root, only the configured users, no forwarding. Keys are read at each login
    from the mounted ConfigMap (kept current by the kubelet), so adding a key restarts nothing."""
    users = " ".join(user.name for user in config.slurm.login.users)
    settings = [
        f"Port {SSHD_PORT}",
        f"HostKey {HOST_KEY_DIR}/{HOST_KEY_FILE}",
        "PidFile none",
        "AuthenticationMethods publickey",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        "UsePAM no",
        f"AllowUsers {users}",
        # The ConfigMap's files sit in a 0777 volume directory, which StrictModes rightly refuses for
        # an AuthorizedKeysFile; a command reads them instead, as nobody.
        "AuthorizedKeysFile none",
        f"AuthorizedKeysCommand /usr/bin/cat {KEYS_DIR}/%u",
        "AuthorizedKeysCommandUser nobody",
        "PermitUserEnvironment no",
        # ~/.ssh/rc runs at every login, and sshd does not check who owns it (session.c do_rc_files)
        "PermitUserRC no",
        "AllowTcpForwarding no",
        "AllowStreamLocalForwarding no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PrintMotd no",
        "PrintLastLog no",
        "Subsystem sftp internal-sftp",
    ]
    return "# Rendered by dualsched (components/login.py).\n" + "\n".join(settings) + "\n"


def login_files(config: StackConfig) -> dict[str, str]:
    """The login ConfigMap's data: sshd_config, the identity files (plus sshd's privilege-separation
    user) and each login user's public keys. Nothing secret."""
    users = config.slurm.users
    return {
        SSHD_CONFIG: sshd_config(config),
        "users": passwd_file(users) + PRIVSEP_USER + "\n",
        "groups": group_file(users),
        **{f"{user.name}{KEYS_SUFFIX}": "\n".join(user.authorized_keys) + "\n" for user in config.slurm.login.users},
    }


def restart_annotation(files: dict[str, str]) -> dict[str, str]:
    """sshd reads its config, and the pod its passwd and group, only at start: a change rolls the pods.
    Key changes do not (sshd reads the keys at each login)."""
    return {CONFIG_HASH_ANNOTATION: config_hash({name: text for name, text in files.items() if not name.endswith(KEYS_SUFFIX)})}


@dataclass(frozen=True)
class LoginArgs:
    config: StackConfig
    namespace: pulumi.Input[str]
    slurm_config_map_name: pulumi.Input[str]
    munge_secret_name: pulumi.Input[str]
    shared_claim_name: pulumi.Input[str]


class Login(pulumi.ComponentResource):
    """The host key Secret, the login ConfigMap, the login Deployment and its Service ``login``."""

    service_name: pulumi.Output[str]

    def __init__(self, name: str, args: LoginArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:login:Login", name, None, opts)
        config = args.config
        pod_labels = labels(LOGIN, config.slurm.cluster_name)
        seed = random.RandomBytes(f"{name}-host-key-seed", length=SEED_BYTES, opts=child(self))
        host_key = k8s.core.v1.Secret(
            f"{name}-host-key",
            metadata=meta(namespace=args.namespace, labels=pod_labels),
            type="Opaque",
            string_data={HOST_KEY_FILE: pulumi.Output.secret(seed.base64.apply(lambda b64: ecdsa_host_key(base64.b64decode(b64))))},
            opts=child(self),
        )
        files = login_files(config)
        # A fixed name, mounted by that name (not the object's output), as slurm_config.py does: a key change
        # replaces the ConfigMap and the kubelet refreshes the keys' files, without a new pod template.
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta(name=CONFIG_MAP_NAME, namespace=args.namespace, labels=pod_labels),
            data=files,
            opts=child(self),
        )
        k8s.apps.v1.Deployment(
            name,
            metadata=meta(namespace=args.namespace, labels=pod_labels),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=config.slurm.login.replicas,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pod_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=pod_labels, annotations=restart_annotation(files)),
                    spec=self._pod_spec(args, host_key.metadata.name),
                ),
            ),
            opts=child(self, depends_on=[config_map]),
        )
        service = k8s.core.v1.Service(
            name,
            metadata=meta(name=SERVICE_NAME, namespace=args.namespace, labels=pod_labels),
            spec=self._service_spec(config, pod_labels),
            opts=child(self),
        )
        self.service_name = service.metadata.name
        self.register_outputs({"service_name": self.service_name})

    @staticmethod
    def _service_spec(config: StackConfig, pod_labels: dict[str, str]) -> k8s.core.v1.ServiceSpecArgs:
        login = config.slurm.login
        external = login.service_type is not LoginServiceType.CLUSTER_IP
        return k8s.core.v1.ServiceSpecArgs(
            type=login.service_type.value,
            selector=pod_labels,
            ports=[k8s.core.v1.ServicePortArgs(name="ssh", port=login.port, target_port="ssh")],
            # Keep the client's address, which the NetworkPolicy's clientCidrs judge (Cluster would
            # replace it with a node's); and an ssh session stays with the pod it began on.
            external_traffic_policy="Local" if external else None,
            session_affinity="ClientIP",
        )

    @staticmethod
    def _pod_spec(args: LoginArgs, host_key_secret: pulumi.Input[str]) -> k8s.core.v1.PodSpecArgs:
        config = args.config
        return k8s.core.v1.PodSpecArgs(
            automount_service_account_token=False,
            enable_service_links=False,
            # root's sshd beside root's munged: no pod-wide user, only the runtime's seccomp profile for both
            security_context=k8s.core.v1.PodSecurityContextArgs(seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")),
            **control_daemon_placement(config),
            init_containers=[munged_sidecar(config.images.slurmd)],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name=LOGIN,
                    image=login_image(config),
                    command=["sh", "-c", sshd_start(config)],
                    ports=[k8s.core.v1.ContainerPortArgs(name="ssh", container_port=SSHD_PORT)],
                    readiness_probe=tcp_probe(SSHD_PORT, period=10),
                    liveness_probe=tcp_probe(SSHD_PORT, period=20),
                    resources=requirements(config.slurm.login.resources),
                    security_context=locked_down(run_as_user=0, add_capabilities=SSHD_CAPABILITIES),
                    volume_mounts=[
                        mount("host-key", HOST_KEY_DIR, read_only=True),
                        mount("sshd-config", SSHD_CONFIG_DIR, read_only=True),
                        mount("authorized-keys", KEYS_DIR, read_only=True),
                        mount("slurm-config", CONFIG_DIR, read_only=True),
                        mount("shared", SHARED_MOUNT),
                        mount("privsep", PRIVSEP_DIR),
                        mount("tmp", "/tmp"),
                        home_mount(),
                        munge_socket_mount(),
                        *identity_mounts(),
                    ],
                )
            ],
            volumes=[
                k8s.core.v1.VolumeArgs(
                    name="host-key",
                    # root-owned and 0400: sshd refuses a host key others may read
                    secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=host_key_secret, default_mode=0o400),
                ),
                _config_map_items("sshd-config", CONFIG_MAP_NAME, {SSHD_CONFIG: SSHD_CONFIG}),
                _config_map_items(
                    "authorized-keys",
                    CONFIG_MAP_NAME,
                    {f"{user.name}{KEYS_SUFFIX}": user.name for user in config.slurm.login.users},
                ),
                config_map_volume("slurm-config", args.slurm_config_map_name),
                claim_volume("shared", args.shared_claim_name),
                empty_dir("privsep"),
                empty_dir("tmp"),
                home_volume(),
                *munge_volumes(args.munge_secret_name),
                identity_volume(CONFIG_MAP_NAME),
            ],
        )


def login_image(config: StackConfig) -> str:
    """srun and sbatch load plugstack.conf: with containers, the login image that carries Pyxis."""
    return getattr(config.images, config.slurm_image_field("login"))


def _config_map_items(name: str, config_map: str, items: dict[str, str]) -> k8s.core.v1.VolumeArgs:
    """Some keys of a ConfigMap as files: key -> file name."""
    return k8s.core.v1.VolumeArgs(
        name=name,
        config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
            name=config_map, items=[k8s.core.v1.KeyToPathArgs(key=key, path=path) for key, path in items.items()]
        ),
    )
