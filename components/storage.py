"""The shared file system: one PersistentVolume and claim per consuming namespace.

A PV binds exactly one claim, so Slurm (read-write, checkpoints) and inference
(read-only, the models directory) each get their own PV over the same export.
Each PV's source is the directory its namespace may reach, not the whole export
narrowed by a subPath in our own pods: a subPath is the choice of whoever writes a
pod, the PV's source is ours (docs/security.md, "The shared file system").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.components.common import child, labels, meta, stateful
from dualsched.config.models import SharedStorage, StorageType, path_under


@dataclass(frozen=True)
class StorageConsumer:
    """A namespace that mounts the shared file system, and how."""

    namespace: pulumi.Input[str]
    read_only: bool
    directory: Optional[str] = None
    """The directory of the shared file system it reaches, relative to the root; None: all of it."""


def volume_source(storage: SharedStorage, directory: Optional[str], read_only: bool) -> dict:
    """The PV's source for ``directory`` of the shared file system (None: all of it), and any mount options,
    as PersistentVolumeSpecArgs keyword arguments."""
    return _SOURCES[storage.type](storage, directory, read_only)


# The kubelet takes a PV's read-only flag from the pod's claim (spec.ReadOnly), never from the PV: the in-tree
# NFS plugin ignores nfs.readOnly (pkg/volume/nfs getVolumeSource), the CSI plugin ignores csi.readOnly
# (pkg/volume/csi NewMounter). It does pass the PV's mountOptions on: to mount(8) for NFS, as the volume
# capability's mount flags for CSI. So a read-only consumer's mount options carry 'ro' wherever the mounter
# honours it, and its volume stays read-only whatever pod mounts the claim.
READ_ONLY = "ro"


def _nfs(storage: SharedStorage, directory: Optional[str], read_only: bool) -> dict:
    nfs = storage.nfs
    path = path_under(nfs.path, directory)
    return {
        "nfs": k8s.core.v1.NFSVolumeSourceArgs(server=nfs.server, path=path, read_only=read_only),
        "mount_options": [READ_ONLY] if read_only else None,
    }


def _host_path(storage: SharedStorage, directory: Optional[str], read_only: bool) -> dict:
    path = path_under(storage.host_path.path, directory)
    # hostPath has neither a read-only flag of its own nor mount options: only a pod whose claim says readOnly
    # (ours) mounts it read-only. A read-only consumer creates nothing either: a models directory the kubelet
    # made would be root's, and training could not write into it.
    kind = "Directory" if read_only else "DirectoryOrCreate"
    return {"host_path": k8s.core.v1.HostPathVolumeSourceArgs(path=path, type=kind)}


def _csi(driver: str, volume_handle: str, read_only: bool, fs_type: Optional[str] = None, mount_options: Sequence[str] = ()) -> dict:
    # csi.readOnly reaches only ControllerPublishVolume (drivers that attach); NodePublishVolume gets the
    # pod's claim's readOnly, and the PV's mount options.
    return {
        "csi": k8s.core.v1.CSIPersistentVolumeSourceArgs(driver=driver, volume_handle=volume_handle, fs_type=fs_type, read_only=read_only),
        "mount_options": list(mount_options) or None,
    }


def _lustre(storage: SharedStorage, directory: Optional[str], read_only: bool) -> dict:
    lustre = storage.lustre
    # HPE's NodePublishVolume passes mount(8) the handle as the source, the PV's fsType as the type and the
    # PV's mountOptions ('ro' among them makes the mount read-only), nothing else: without fsType, mount
    # would have to guess what '<nid>:/<fs>' is.
    options = [*lustre.mount_options, *([READ_ONLY] if read_only else [])]
    return _csi(lustre.driver, lustre.volume_handle_of(directory), read_only, fs_type="lustre", mount_options=options)


def _gpfs(storage: SharedStorage, directory: Optional[str], read_only: bool) -> dict:
    # IBM's NodePublishVolume bind-mounts the handle's path and reads neither readonly nor mount flags:
    # no option makes this source read-only.
    return _csi(storage.gpfs.driver, storage.gpfs.volume_handle_of(directory), read_only)


# The BeeGFS driver mounts with rw, relatime and nosuid unless the PV lists mount options, which then replace
# all three: the read-only list keeps nosuid (BeeGFS' security recommendation) and relatime.
BEEGFS_READ_ONLY = (READ_ONLY, "relatime", "nosuid")


def _beegfs(storage: SharedStorage, directory: Optional[str], read_only: bool) -> dict:
    beegfs = storage.beegfs
    return _csi(beegfs.driver, beegfs.volume_handle_of(directory), read_only, mount_options=BEEGFS_READ_ONLY if read_only else ())


_SOURCES: dict[StorageType, Callable[[SharedStorage, Optional[str], bool], dict]] = {
    StorageType.NFS: _nfs,
    StorageType.LUSTRE: _lustre,
    StorageType.GPFS: _gpfs,
    StorageType.BEEGFS: _beegfs,
    StorageType.HOST_PATH: _host_path,
}


@dataclass(frozen=True)
class SharedStorageVolumesArgs:
    storage: SharedStorage
    consumers: Mapping[str, StorageConsumer]
    protect: bool


class SharedStorageVolumes(pulumi.ComponentResource):
    """PV/PVC pairs with ``Retain``: deleting the program never deletes checkpoints or models."""

    claim_names: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: SharedStorageVolumesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:storage:SharedStorageVolumes", name, None, opts)
        # Claim names with a part of this stack alone: each PV is bound to its claim's name (claimRef) before any
        # claim exists, so no other claim, in any namespace, can bind it first; and a claim that a destroyed stack
        # left behind (claims are retained) never has the name a new stack's claim takes.
        stack_part = random.RandomString(f"{name}-claim-names", length=8, special=False, upper=False, opts=child(self))
        self.claim_names = {
            consumer_name: self._volume_and_claim(f"{name}-{consumer_name}", name, consumer_name, consumer, stack_part.result, args)
            for consumer_name, consumer in args.consumers.items()
        }
        self.register_outputs({"claim_names": self.claim_names})

    def _volume_and_claim(
        self,
        resource_name: str,
        instance: str,
        consumer_name: str,
        consumer: StorageConsumer,
        stack_part: pulumi.Output[str],
        args: SharedStorageVolumesArgs,
    ) -> pulumi.Output[str]:
        """One consumer's PV and the claim bound to it, each naming the other; returns the claim's name."""
        storage = args.storage
        claim_name = stack_part.apply(lambda part: f"{resource_name}-{part}")
        access_mode = "ReadOnlyMany" if consumer.read_only else "ReadWriteMany"
        source = volume_source(storage, consumer.directory, consumer.read_only)
        volume_labels = {**labels("shared-storage", instance), "dualsched.io/consumer": consumer_name}
        volume = k8s.core.v1.PersistentVolume(
            resource_name,
            metadata=meta(labels=volume_labels),
            spec=k8s.core.v1.PersistentVolumeSpecArgs(
                capacity={"storage": storage.capacity},
                access_modes=[access_mode],
                persistent_volume_reclaim_policy="Retain",
                # An empty class keeps a default StorageClass from provisioning a new volume.
                storage_class_name="",
                volume_mode="Filesystem",
                claim_ref=k8s.core.v1.ObjectReferenceArgs(namespace=consumer.namespace, name=claim_name),
                **source,
            ),
            # A PV bound before this was kept carries its claim's reference already (the binder wrote it), to
            # a claim of an earlier, Pulumi-chosen name, which that stack keeps (below).
            opts=stateful(self, args.protect, ignore_changes=["spec.claimRef"]),
        )
        claim = k8s.core.v1.PersistentVolumeClaim(
            resource_name,
            metadata=meta(name=claim_name, namespace=consumer.namespace, labels=volume_labels),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=[access_mode],
                storage_class_name="",
                volume_name=volume.metadata.name,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": storage.capacity}),
            ),
            # A renamed claim would be a new claim, and its PV, retained, never binds again: a stack whose claim
            # Pulumi named keeps that name.
            opts=stateful(self, args.protect, ignore_changes=["metadata.name"]),
        )
        return claim.metadata.name
