"""The munge key that authenticates every Slurm daemon and client, and the munged sidecar."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from components.common import child, empty_dir, labels, locked_down, meta, mount

MUNGE_KEY_BYTES = 1024
"""munge's own key size (mungekey --bits 8192)."""
KEY_FILE = "munge.key"
KEY_VOLUME = "munge-key"
SOCKET_VOLUME = "munge-socket"
SOCKET_DIR = "/run/munge"


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
        empty_dir(SOCKET_VOLUME),
    ]


def munge_socket_mount() -> k8s.core.v1.VolumeMountArgs:
    return mount(SOCKET_VOLUME, SOCKET_DIR)


def munged_sidecar(image: str) -> k8s.core.v1.ContainerArgs:
    """munged as a native sidecar (an init container that keeps running), sharing its socket.

    It runs as root because munged insists the key file is owned by its own user and a
    Secret volume's files belong to root; it needs no capability and writes only its socket dir.
    """
    return k8s.core.v1.ContainerArgs(
        name="munged",
        image=image,
        restart_policy="Always",
        command=[
            "munged",
            "--foreground",
            f"--key-file=/etc/munge/{KEY_FILE}",
            f"--socket={SOCKET_DIR}/munge.socket.2",
            f"--pid-file={SOCKET_DIR}/munged.pid",
            f"--seed-file={SOCKET_DIR}/munged.seed",
            "--log-file=/dev/stderr",
        ],
        volume_mounts=[mount(KEY_VOLUME, "/etc/munge", read_only=True), munge_socket_mount()],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "50m", "memory": "32Mi"}, limits={"cpu": "200m", "memory": "64Mi"}
        ),
        security_context=locked_down(),
    )
