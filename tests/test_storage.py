"""SharedStorageVolumes: a PV/PVC pair per consuming namespace over one NFS, Lustre or hostPath file system."""

from __future__ import annotations

import pytest

from rendering import container, mounts, render_raw, render_stack, variant, volume

# The submission namespace has none: its pods only submit, the jobs use /shared on the Slurm nodes.
CONSUMERS = {"slurm": "slurm", "inference": "inference"}


def _volumes(rendered) -> dict:
    """consumer -> PersistentVolume."""
    return {pv.manifest["metadata"]["labels"]["dualsched.io/consumer"]: pv for pv in rendered.by_kind("PersistentVolume")}


def _claims(rendered) -> dict:
    """consumer -> its shared PersistentVolumeClaim."""
    return {
        c.manifest["metadata"]["labels"]["dualsched.io/consumer"]: c
        for c in rendered.by_kind("PersistentVolumeClaim")
        if "dualsched.io/consumer" in c.manifest["metadata"]["labels"]
    }


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_volume_and_claim_per_consuming_namespace(stack):
    rendered = render_stack(stack)
    volumes, claims = _volumes(rendered), _claims(rendered)
    assert sorted(volumes) == sorted(claims) == sorted(CONSUMERS)
    assert len(rendered.by_kind("PersistentVolume")) == 2
    for consumer, claim in claims.items():
        assert claim.namespace == CONSUMERS[consumer]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_each_claim_binds_its_own_volume(stack):
    rendered = render_stack(stack)
    volumes, claims = _volumes(rendered), _claims(rendered)
    for consumer, claim in claims.items():
        spec = claim.manifest["spec"]
        assert spec["volumeName"] == volumes[consumer].name
        assert spec["storageClassName"] == ""
        assert spec["accessModes"] == volumes[consumer].manifest["spec"]["accessModes"]
        assert spec["resources"]["requests"] == {"storage": rendered.config.storage.capacity}
    assert len({c.manifest["spec"]["volumeName"] for c in claims.values()}) == len(claims)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_volumes_are_retained_static_and_sized_from_config(stack):
    rendered = render_stack(stack)
    for volume_ in _volumes(rendered).values():
        spec = volume_.manifest["spec"]
        assert spec["persistentVolumeReclaimPolicy"] == "Retain"
        assert spec["storageClassName"] == ""  # never provisioned by a default StorageClass
        assert spec["volumeMode"] == "Filesystem"
        assert spec["capacity"] == {"storage": rendered.config.storage.capacity}
        assert volume_.namespace is None


def test_slurm_reads_and_writes_inference_reads_only():
    volumes = _volumes(render_stack("dev"))
    assert volumes["slurm"].manifest["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volumes["inference"].manifest["spec"]["accessModes"] == ["ReadOnlyMany"]


def test_nfs_source():
    volumes = _volumes(render_stack("dev"))
    for consumer, volume_ in volumes.items():
        spec = volume_.manifest["spec"]
        assert "csi" not in spec
        assert spec["nfs"]["server"] == "nfs.dev.internal"
        assert spec["nfs"]["path"] == "/export/shared"
        assert bool(spec["nfs"].get("readOnly")) is (consumer == "inference")


def test_lustre_csi_source():
    volumes = _volumes(render_stack("prod"))
    for consumer, volume_ in volumes.items():
        spec = volume_.manifest["spec"]
        assert "nfs" not in spec
        assert spec["csi"]["driver"] == "lustre.csi.hpe.com"
        assert spec["csi"]["volumeHandle"] == "lustre-prod-fs1"
        assert spec["csi"]["volumeAttributes"] == {"mgsAddress": "10.20.0.10@o2ib", "fsName": "fs1"}
        assert bool(spec["csi"].get("readOnly")) is (consumer == "inference")


def _host_path(raw):
    raw["storage"] = {"type": "hostPath", "capacity": "20Gi", "hostPath": {"path": "/var/lib/dualsched/shared"}}


def test_host_path_source():
    """One directory on the node, created when missing; the claims and mounts carry read-only."""
    rendered = render_raw(variant("dev", _host_path))
    volumes = _volumes(rendered)
    assert sorted(volumes) == sorted(CONSUMERS)
    for consumer, volume_ in volumes.items():
        spec = volume_.manifest["spec"]
        assert "nfs" not in spec and "csi" not in spec
        assert spec["hostPath"] == {"path": "/var/lib/dualsched/shared", "type": "DirectoryOrCreate"}
        assert spec["persistentVolumeReclaimPolicy"] == "Retain"
        assert spec["capacity"] == {"storage": "20Gi"}
        assert spec["accessModes"] == (["ReadOnlyMany"] if consumer == "inference" else ["ReadWriteMany"])
    [deployment] = rendered.in_namespace("inference", "Deployment")
    assert mounts(container(deployment, "server"))["/models"]["readOnly"] is True
    assert volume(deployment, "models")["persistentVolumeClaim"]["readOnly"] is True


@pytest.mark.parametrize(("stack", "protect"), [("dev", False), ("prod", True)])
def test_volumes_and_claims_survive_the_program(stack, protect):
    rendered = render_stack(stack)
    for obj in [*_volumes(rendered).values(), *_claims(rendered).values()]:
        registration = rendered.registration(obj)
        assert registration.retain_on_delete is True, obj.name
        assert registration.protect is protect, obj.name


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurm_mounts_shared_read_write_and_inference_mounts_models_read_only(stack):
    rendered = render_stack(stack)
    claims = _claims(rendered)
    for daemonset in rendered.by_kind("DaemonSet"):
        assert volume(daemonset, "shared")["persistentVolumeClaim"]["claimName"] == claims["slurm"].name
        assert not mounts(container(daemonset, "slurmd"))["/shared"].get("readOnly")
    for deployment in rendered.in_namespace("inference", "Deployment"):
        assert volume(deployment, "models")["persistentVolumeClaim"] == {"claimName": claims["inference"].name, "readOnly": True}
        models = mounts(container(deployment, "server"))["/models"]
        assert models == {"name": "models", "mountPath": "/models", "readOnly": True, "subPath": rendered.config.storage.models_path}


def test_models_path_is_configurable():
    rendered = render_raw(variant("dev", lambda raw: raw["storage"].update(modelsPath="checkpoints/serving")))
    [deployment] = rendered.in_namespace("inference", "Deployment")
    assert mounts(container(deployment, "server"))["/models"]["subPath"] == "checkpoints/serving"


def test_only_enabled_consumers_get_a_volume():
    def slurm_only(raw):
        raw["submission"] = {"enabled": False}
        raw["inference"]["enabled"] = False

    rendered = render_raw(variant("dev", slurm_only))
    assert sorted(_volumes(rendered)) == sorted(_claims(rendered)) == ["slurm"]


def test_claim_names_output_matches_the_claims():
    rendered = render_stack("dev")
    outputs = rendered.outputs_of("dualsched:storage:SharedStorageVolumes")
    assert outputs["claim_names"] == {consumer: claim.name for consumer, claim in _claims(rendered).items()}
