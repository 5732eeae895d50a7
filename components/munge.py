"""The munge key that authenticates every Slurm daemon and client, and the munged sidecar."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.components.common import child, empty_dir, labels, locked_down, meta, mount
from dualsched.config.models import MUNGED_CPUS, MUNGED_MEMORY_MB

MUNGE_KEY_BYTES = 1024
"""munge's own key size (mungekey --bits 8192)."""
KEY_FILE = "munge.key"
KEY_VOLUME = "munge-key"
PRIVATE_VOLUME = "munge-private"
SOCKET_VOLUME = "munge-socket"
SECRET_DIR = "/etc/munge-secret"
PRIVATE_DIR = "/var/lib/munge"
SOCKET_DIR = "/run/munge"
SOCKET = f"{SOCKET_DIR}/munge.socket.2"

# munged refuses a key that is a symlink (a Secret volume's files link into ..data/), a key
# readable by anyone but its owner, and a key or socket directory that others may write without
# the sticky bit (an emptyDir is 0777): munge 0.5.15 src/munged/conf.c and path.c. So the key is
# copied out of the Secret into a private emptyDir, and both directories get munged's modes.
MUNGED_START = " && ".join(
    [
        "umask 077",
        f"install -m 0400 {SECRET_DIR}/{KEY_FILE} {PRIVATE_DIR}/{KEY_FILE}",
        f"chmod 0700 {PRIVATE_DIR}",
        f"chmod 0755 {SOCKET_DIR}",
        " ".join(
            [
                "exec munged --foreground",
                f"--key-file={PRIVATE_DIR}/{KEY_FILE}",
                f"--socket={SOCKET}",
                f"--pid-file={PRIVATE_DIR}/munged.pid",
                f"--seed-file={PRIVATE_DIR}/munged.seed",
                "--log-file=/dev/stderr",
            ]
        ),
    ]
)


@dataclass(frozen=True)
class MungeKeyArgs:
    """``namespaces``: logical name -> namespace that gets a copy of the key Secret."""

    namespaces: Mapping[str, pulumi.Input[str]]


class MungeKey(pulumi.ComponentResource):
    """A random munge key, stored only in a Secret in each namespace that needs it."""

    secret_names: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: MungeKeyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:munge:MungeKey", name, None, opts)
        key = random.RandomBytes(f"{name}-bytes", length=MUNGE_KEY_BYTES, opts=child(self))
        self.secret_names = {}
        for logical, namespace in args.namespaces.items():
            secret = k8s.core.v1.Secret(
                f"{name}-{logical}",
                metadata=meta(namespace=namespace, labels=labels("munge", name)),
                type="Opaque",
                data={KEY_FILE: key.base64},
                opts=child(self),
            )
            self.secret_names[logical] = secret.metadata.name
        self.register_outputs({"secret_names": self.secret_names})


def munge_volumes(secret_name: pulumi.Input[str]) -> list[k8s.core.v1.VolumeArgs]:
    return [
        k8s.core.v1.VolumeArgs(
            name=KEY_VOLUME,
            secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=secret_name, default_mode=0o400),
        ),
        empty_dir(PRIVATE_VOLUME, medium="Memory"),
        empty_dir(SOCKET_VOLUME),
    ]


def munge_socket_mount() -> k8s.core.v1.VolumeMountArgs:
    return mount(SOCKET_VOLUME, SOCKET_DIR)


def munged_sidecar(image: str) -> k8s.core.v1.ContainerArgs:
    """munged as a native sidecar (an init container that keeps running), sharing its socket.

    It runs as root, the owner munged requires of its key, with every capability dropped:
    root may read and chmod what it owns without one. Only it mounts the key.
    Requests equal limits, so a Guaranteed slurmd pod stays Guaranteed.
    """
    resources = {"cpu": f"{round(MUNGED_CPUS * 1000)}m", "memory": f"{MUNGED_MEMORY_MB}Mi"}
    return k8s.core.v1.ContainerArgs(
        name="munged",
        image=image,
        restart_policy="Always",
        command=["sh", "-c", MUNGED_START],
        volume_mounts=[
            mount(KEY_VOLUME, SECRET_DIR, read_only=True),
            mount(PRIVATE_VOLUME, PRIVATE_DIR),
            munge_socket_mount(),
        ],
        resources=k8s.core.v1.ResourceRequirementsArgs(requests=resources, limits=resources),
        # A client that connects before the socket exists fails: start the next container only then.
        startup_probe=k8s.core.v1.ProbeArgs(
            exec_=k8s.core.v1.ExecActionArgs(command=["test", "-S", SOCKET]), period_seconds=1, failure_threshold=60
        ),
        security_context=locked_down(run_as_user=0),
    )
