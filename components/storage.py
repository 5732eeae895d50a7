"""The shared file system: one PersistentVolume and claim per consuming namespace.

A PV binds exactly one claim, so Slurm (read-write, checkpoints) and inference
(read-only, the models directory) each get their own PV over the same export.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components.common import labels, meta, stateful
from config.models import SharedStorage, StorageType


@dataclass(frozen=True)
class StorageConsumer:
    """A namespace that mounts the shared file system, and how."""

    namespace: pulumi.Input[str]
    read_only: bool


def volume_source(storage: SharedStorage, read_only: bool) -> dict:
    """The PV's nfs, csi or hostPath source (as PersistentVolumeSpecArgs keyword arguments)."""
    if storage.type is StorageType.NFS:
        return {"nfs": k8s.core.v1.NFSVolumeSourceArgs(server=storage.nfs.server, path=storage.nfs.path, read_only=read_only)}
    if storage.type is StorageType.HOST_PATH:
        # hostPath has no read-only flag of its own: the claim's ReadOnlyMany and the pods' readOnly mounts hold it.
        return {"host_path": k8s.core.v1.HostPathVolumeSourceArgs(path=storage.host_path.path, type="DirectoryOrCreate")}
    lustre = storage.lustre
    return {
        "csi": k8s.core.v1.CSIPersistentVolumeSourceArgs(
            driver=lustre.driver,
            volume_handle=lustre.volume_handle,
            volume_attributes=dict(lustre.volume_attributes) or None,
            read_only=read_only,
        )
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
