"""The shared file system: one PersistentVolume and claim per consuming namespace.

A PV binds exactly one claim, so Slurm (read-write, checkpoints) and inference
(read-only, the models directory) each get their own PV over the same export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import labels, meta, stateful
from dualsched.config.models import SharedStorage, StorageType


@dataclass(frozen=True)
class StorageConsumer:
    """A namespace that mounts the shared file system, and how."""

    namespace: pulumi.Input[str]
    read_only: bool


def volume_source(storage: SharedStorage, read_only: bool) -> dict:
    """The PV's volume source, and any mount options, as PersistentVolumeSpecArgs keyword arguments."""
    return _SOURCES[storage.type](storage, read_only)


def _nfs(storage: SharedStorage, read_only: bool) -> dict:
    return {"nfs": k8s.core.v1.NFSVolumeSourceArgs(server=storage.nfs.server, path=storage.nfs.path, read_only=read_only)}


def _host_path(storage: SharedStorage, read_only: bool) -> dict:
    # hostPath has no read-only flag of its own: the claim's ReadOnlyMany and the pods' readOnly mounts hold it.
    return {"host_path": k8s.core.v1.HostPathVolumeSourceArgs(path=storage.host_path.path, type="DirectoryOrCreate")}


def _csi(driver: str, volume_handle: str, read_only: bool, fs_type: Optional[str] = None) -> k8s.core.v1.CSIPersistentVolumeSourceArgs:
    # readOnly here reaches only ControllerPublishVolume; NodePublishVolume mounts read-only because the
    # inference pods' claim says readOnly.
    return k8s.core.v1.CSIPersistentVolumeSourceArgs(driver=driver, volume_handle=volume_handle, fs_type=fs_type, read_only=read_only)


def _lustre(storage: SharedStorage, read_only: bool) -> dict:
    lustre = storage.lustre
    # HPE's NodePublishVolume passes mount(8) the handle as the source, the PV's fsType as the type and the
    # PV's mountOptions, nothing else: without fsType, mount would have to guess what '<nid>:/<fs>' is.
    return {
        "csi": _csi(lustre.driver, lustre.volume_handle, read_only, fs_type="lustre"),
        "mount_options": list(lustre.mount_options) or None,
    }


def _gpfs(storage: SharedStorage, read_only: bool) -> dict:
    return {"csi": _csi(storage.gpfs.driver, storage.gpfs.volume_handle, read_only)}


def _beegfs(storage: SharedStorage, read_only: bool) -> dict:
    return {"csi": _csi(storage.beegfs.driver, storage.beegfs.volume_handle, read_only)}


_SOURCES: dict[StorageType, Callable[[SharedStorage, bool], dict]] = {
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
        storage = args.storage
        self.claim_names = {}
        for consumer_name, consumer in args.consumers.items():
            access_mode = "ReadOnlyMany" if consumer.read_only else "ReadWriteMany"
            volume_labels = {**labels("shared-storage", name), "dualsched.io/consumer": consumer_name}
            volume = k8s.core.v1.PersistentVolume(
                f"{name}-{consumer_name}",
                metadata=meta(labels=volume_labels),
                spec=k8s.core.v1.PersistentVolumeSpecArgs(
                    capacity={"storage": storage.capacity},
                    access_modes=[access_mode],
                    persistent_volume_reclaim_policy="Retain",
                    # An empty class keeps a default StorageClass from provisioning a new volume.
                    storage_class_name="",
                    volume_mode="Filesystem",
                    **volume_source(storage, consumer.read_only),
                ),
                opts=stateful(self, args.protect),
            )
            claim = k8s.core.v1.PersistentVolumeClaim(
                f"{name}-{consumer_name}",
                metadata=meta(namespace=consumer.namespace, labels=volume_labels),
                spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                    access_modes=[access_mode],
                    storage_class_name="",
                    volume_name=volume.metadata.name,
                    resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": storage.capacity}),
                ),
                opts=stateful(self, args.protect),
            )
            self.claim_names[consumer_name] = claim.metadata.name
        self.register_outputs({"claim_names": self.claim_names})
