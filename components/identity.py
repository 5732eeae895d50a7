"""Who jobs run as: the passwd and group files every Slurm pod resolves users with.

slurmctld checks a job's user, slurmstepd switches to it and sbatch names it, so all
of them must resolve the same uid to the same name. Each pod mounts these files over
the image's own: the pods then depend on no image's accounts (Debian's slurm user is
64030, SchedMD's is 401), and a user added to the config reaches every pod from one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import child, config_map_volume, empty_dir, labels, meta, mount
from dualsched.components.slurm_files import config_hash
from dualsched.config.models import NOBODY_UID, SLURM_UID, SlurmUser, StackConfig

SLURM_USER = "slurm"
USERS_HASH_ANNOTATION = "dualsched.io/users-hash"
VOLUME = "identity"
# ConfigMap keys -> the files they replace (keys without "passwd": it holds no secret, only names and ids).
FILES = {"users": "/etc/passwd", "groups": "/etc/group"}
HOMES = "/home"
HOME_VOLUME = "home"

# own PATH UID GID MODE: the directory PATH, UID's, with that mode. An entry of PATH's name that UID does not
# own, or a link, goes first: another user may have planted it where everyone could write (dualsched once
# gave every user the one home /tmp, and Enroot world-writable directories).
OWN_DIRECTORY = (
    'own() { if [ -L "$1" ] || { [ -e "$1" ] && [ "$(stat -c %u "$1")" != "$2" ]; }; then rm -rf "$1"; fi;'
    ' mkdir -p "$1" && chown "$2:$3" "$1" && chmod "$4" "$1"; }'
)


def home_of(user: SlurmUser) -> str:
    return f"{HOMES}/{user.name}"


def owned_directories(setup: str, directories: Iterable[tuple[str, int, int, str]]) -> str:
    """Shell, run as root: ``setup``, then each (path, uid, gid, mode) made UID's alone with that mode (OWN_DIRECTORY)."""
    return " && ".join([f"{OWN_DIRECTORY}; {setup}", *(f"own {path} {uid} {gid} {mode}" for path, uid, gid, mode in directories)])


def make_homes(users: tuple[SlurmUser, ...]) -> str:
    """Shell, run as root when a pod that runs users' code starts: each user's home, theirs alone (0700).
    Shells, sshd and tools run files from a home (.profile, ~/.ssh/rc, Python's .pth, .gitconfig), so no
    user may write another's; /tmp is nobody's home. Homes live as long as the pod (an emptyDir): what
    must last belongs on /shared."""
    return owned_directories(f"mkdir -p {HOMES}", ((home_of(u), u.uid, u.group_id, "0700") for u in users))


def passwd_file(users: tuple[SlurmUser, ...]) -> str:
    entries = [
        "root:x:0:0:root:/root:/bin/sh",
        f"{SLURM_USER}:x:{SLURM_UID}:{SLURM_UID}:Slurm workload manager:/var/lib/slurm:/usr/sbin/nologin",
        f"nobody:x:{NOBODY_UID}:{NOBODY_UID}:nobody:/nonexistent:/usr/sbin/nologin",
        *(f"{user.name}:x:{user.uid}:{user.group_id}::{home_of(user)}:/bin/sh" for user in users),
    ]
    return "\n".join(entries) + "\n"


def group_file(users: tuple[SlurmUser, ...]) -> str:
    entries = [
        "root:x:0:",
        f"{SLURM_USER}:x:{SLURM_UID}:",
        f"nogroup:x:{NOBODY_UID}:",
        *(f"{user.name}:x:{user.group_id}:" for user in users),
    ]
    return "\n".join(entries) + "\n"


def identity_files(users: tuple[SlurmUser, ...]) -> dict[str, str]:
    """The ConfigMap's data: its keys are the subPaths mounted over /etc/passwd and /etc/group."""
    return {"users": passwd_file(users), "groups": group_file(users)}


def users_annotation(config: StackConfig) -> dict[str, str]:
    """For the pod templates that mount the files: a pod reads them only when it starts (subPath
    mounts never refresh), so a change of users restarts those pods and the preview says so."""
    return {USERS_HASH_ANNOTATION: config_hash(identity_files(config.slurm.users))}


@dataclass(frozen=True)
class UserDirectoryArgs:
    """``namespaces``: logical name -> namespace that gets the files."""

    config: StackConfig
    namespaces: Mapping[str, pulumi.Input[str]]


class UserDirectory(pulumi.ComponentResource):
    """The rendered passwd and group files, one ConfigMap in each namespace that runs Slurm code."""

    config_map_names: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: UserDirectoryArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:identity:UserDirectory", name, None, opts)
        files = identity_files(args.config.slurm.users)
        self.config_map_names = {}
        for logical, namespace in args.namespaces.items():
            config_map = k8s.core.v1.ConfigMap(
                f"{name}-{logical}",
                metadata=meta(namespace=namespace, labels=labels("identity", args.config.slurm.cluster_name)),
                data=files,
                opts=child(self),
            )
            self.config_map_names[logical] = config_map.metadata.name
        self.register_outputs({"config_map_names": self.config_map_names})


def identity_volume(config_map_name: pulumi.Input[str]) -> k8s.core.v1.VolumeArgs:
    return config_map_volume(VOLUME, config_map_name)


def home_volume() -> k8s.core.v1.VolumeArgs:
    return empty_dir(HOME_VOLUME)


def home_mount() -> k8s.core.v1.VolumeMountArgs:
    return mount(HOME_VOLUME, HOMES)


def identity_mounts() -> list[k8s.core.v1.VolumeMountArgs]:
    """/etc/passwd and /etc/group replaced file by file (the rest of /etc stays the image's)."""
    return [mount(VOLUME, path, read_only=True, sub_path=key) for key, path in FILES.items()]
