"""SharedStorageVolumes: a PV/PVC pair per consuming namespace over one NFS, Lustre, IBM Storage Scale,
BeeGFS or hostPath file system.

Each CSI volume is checked against what its driver's node server does with it (see docs/storage.md):
the handle is taken apart the way the driver takes it apart, not compared with a copy of our own code.
Inference's volume is the models directory itself, read-only at the source wherever the mounter honours
a mount option: whatever pod mounts its claim reaches nothing else (docs/security.md).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from dualsched.config.models import BeegfsStorage, LustreStorage

from rendering import container, mounts, render_raw, render_stack, variant, volume

# The submission namespace has none: its pods only submit, the jobs use /shared on the Slurm nodes.
CONSUMERS = {"slurm": "slurm", "inference": "inference"}
# Where the kubelet or the driver turns a PV's mountOptions into a read-only mount (docs/storage.md).
READ_ONLY_OPTION = "ro"


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
def test_each_volume_is_bound_to_its_claim_by_name_before_any_claim_exists(stack):
    """claimRef: the binder gives the PV to no other claim, in any namespace, in the seconds before ours exists."""
    rendered = render_stack(stack)
    volumes, claims = _volumes(rendered), _claims(rendered)
    for consumer, volume_ in volumes.items():
        assert volume_.manifest["spec"]["claimRef"] == {"namespace": CONSUMERS[consumer], "name": claims[consumer].name}


def test_claim_names_carry_a_part_of_their_stack_alone():
    """Claims are retained: a destroyed stack's claim stays in its namespace, and a new stack's claim of the same
    name would be that claim (a spec the API server refuses to change). The part is a RandomString of the stack."""
    rendered = render_stack("dev")
    [part] = [r for r in rendered.render.registrations if r.type == "random:index/randomString:RandomString"]
    suffixes = set()
    for consumer, claim in _claims(rendered).items():
        assert re.fullmatch(rf"dualsched-shared-{consumer}-([a-z0-9]{{8}})", claim.name), claim.name
        assert part.urn in rendered.registration(claim).dependencies
        suffixes.add(claim.name.rsplit("-", 1)[1])
    assert len(suffixes) == 1


def test_a_stack_whose_claims_pulumi_named_keeps_them_and_their_volumes_binding():
    """Stacks from before claimRef have auto-named claims, bound: a new name would be a new claim that the
    retained PV never binds, and the binder already wrote the PV's claimRef."""
    rendered = render_stack("dev")
    for consumer in CONSUMERS:
        assert rendered.registration(_claims(rendered)[consumer]).ignore_changes == ("metadata.name",)
        assert rendered.registration(_volumes(rendered)[consumer]).ignore_changes == ("spec.claimRef",)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_each_claim_is_created_after_its_volume(stack):
    """Pulumi waits for a claim to be Bound: its volume must exist first (waiting for it to name the claim)."""
    rendered = render_stack(stack)
    volumes, claims = _volumes(rendered), _claims(rendered)
    for consumer, volume_ in volumes.items():
        assert claims[consumer].namespace == CONSUMERS[consumer]
        assert rendered.registration(volume_).urn in rendered.registration(claims[consumer]).dependencies


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
    """Slurm mounts the export, inference its models directory. The kubelet ignores a PV's nfs.readOnly (it
    takes the pod's claim's) but hands the PV's mountOptions to mount(8): 'ro' holds for any pod."""
    volumes = _volumes(render_stack("dev"))
    paths = {"slurm": "/export/shared", "inference": "/export/shared/models"}
    for consumer, volume_ in volumes.items():
        spec = volume_.manifest["spec"]
        assert "csi" not in spec
        assert spec["nfs"]["server"] == "nfs.dev.internal"
        assert spec["nfs"]["path"] == paths[consumer]
        assert bool(spec["nfs"].get("readOnly")) is (consumer == "inference")
    assert volumes["inference"].manifest["spec"]["mountOptions"] == [READ_ONLY_OPTION]
    assert "mountOptions" not in volumes["slurm"].manifest["spec"]


def test_an_nfs_export_of_the_root_directory_still_gives_inference_only_the_models():
    rendered = render_raw(variant("dev", lambda raw: raw["storage"]["nfs"].update(path="/")))
    assert {c: v.manifest["spec"]["nfs"]["path"] for c, v in _volumes(rendered).items()} == {"slurm": "/", "inference": "/models"}


def _csi_volumes(rendered) -> dict:
    """consumer -> the PV's spec, after checking what every CSI PV here shares: the read-only flag of
    its consumer and no volumeAttributes (none of the three drivers reads any for a static volume)."""
    specs = {consumer: volume_.manifest["spec"] for consumer, volume_ in _volumes(rendered).items()}
    assert sorted(specs) == sorted(CONSUMERS)
    for consumer, spec in specs.items():
        assert "nfs" not in spec and "hostPath" not in spec
        assert "volumeAttributes" not in spec["csi"]
        assert bool(spec["csi"].get("readOnly")) is (consumer == "inference")
    return specs


def lustre_mount_source(handle: str) -> tuple[list[list[str]], str, str]:
    """HPE's NodePublishVolume hands mount(8) the volumeHandle as the source; mount.lustre(8) reads it as
    '<mgsnode>[:<mgsnode>]:/<fsname>[/<subdir>]', each mgsnode '<nid>[,<nid>]'. -> (NIDs per MGS node, fsname, subdir)."""
    mgs_name, separator, target = handle.partition(":/")
    assert separator, handle
    fs_name, _, subdirectory = target.partition("/")
    return [node.split(",") for node in mgs_name.split(":")], fs_name, subdirectory


def gpfs_volume_id(handle: str) -> dict[str, str]:
    """getVolIDMembers (IBM/ibm-spectrum-scale-csi driver/csiplugin/gpfs_util.go): a 7-field handle is the
    CSI 2.5.0 format; NodePublishVolume bind-mounts its path, ControllerPublishVolume looks up its fs UUID."""
    fields = handle.split(";")
    assert len(fields) == 7, handle
    names = ("storageClassType", "volType", "clusterId", "fsUUID", "consistencyGroup", "fsetName", "path")
    return dict(zip(names, fields))


def beegfs_volume(handle: str) -> tuple[str, str]:
    """parseBeegfsURL (ThinkParQ/beegfs-csi-driver pkg/beegfs/beegfs_util.go): url.Parse, scheme 'beegfs',
    -> (sysMgmtdHost, directory in the file system)."""
    url = urlsplit(handle)
    assert url.scheme == "beegfs", handle
    assert not (url.query or url.fragment or url.username or url.port), handle
    return url.netloc, url.path


def test_lustre_volumes_are_what_hpes_driver_mounts():
    """Inference's handle is a subdirectory mount of the models directory; its 'ro' reaches mount(8) through
    getMountOptions whether or not the pod's claim says readOnly."""
    specs = _csi_volumes(render_stack("prod"))
    subdirectories = {"slurm": "", "inference": "models"}
    for consumer, spec in specs.items():
        csi = spec["csi"]
        assert csi["driver"] == "lustre-csi.hpe.com"
        assert csi["fsType"] == "lustre"  # NodePublishVolume mounts with exactly this type
        assert lustre_mount_source(csi["volumeHandle"]) == ([["10.20.0.10@o2ib"]], "fs1", subdirectories[consumer])
    assert specs["slurm"]["csi"]["volumeHandle"] == "10.20.0.10@o2ib:/fs1"
    assert "mountOptions" not in specs["slurm"]
    assert specs["inference"]["csi"]["volumeHandle"] == "10.20.0.10@o2ib:/fs1/models"
    assert specs["inference"]["mountOptions"] == [READ_ONLY_OPTION]


def _lustre_failover_pair(raw):
    raw["storage"]["lustre"] = {
        "mgsNodes": [{"nids": ["10.20.0.10@o2ib", "10.21.0.10@tcp"]}, {"nids": ["10.20.0.11@o2ib"]}],
        "fsName": "fs1",
        "subdirectory": "dualsched/shared",
        "mountOptions": ["flock", "lazystatfs"],
    }


def test_lustre_handle_lists_failover_nodes_their_nids_and_the_subdirectory():
    specs = _csi_volumes(render_raw(variant("prod", _lustre_failover_pair)))
    subdirectories = {"slurm": "dualsched/shared", "inference": "dualsched/shared/models"}
    for consumer, spec in specs.items():
        handle = spec["csi"]["volumeHandle"]
        assert handle == f"10.20.0.10@o2ib,10.21.0.10@tcp:10.20.0.11@o2ib:/fs1/{subdirectories[consumer]}"
        nids = [["10.20.0.10@o2ib", "10.21.0.10@tcp"], ["10.20.0.11@o2ib"]]
        assert lustre_mount_source(handle) == (nids, "fs1", subdirectories[consumer])
    # the driver adds them to the mount's options
    assert specs["slurm"]["mountOptions"] == ["flock", "lazystatfs"]
    assert specs["inference"]["mountOptions"] == ["flock", "lazystatfs", READ_ONLY_OPTION]


def _gpfs(raw):
    raw["storage"] = {
        "type": "gpfs",
        "capacity": "2Pi",
        "gpfs": {"clusterId": 7118073361626808055, "filesystemUuid": "09762E69:5D36FE8D", "path": "/ibm/fs1/dualsched"},
    }


def test_gpfs_volumes_carry_ibms_static_volume_handle():
    """NodePublishVolume bind-mounts the handle's path: inference's is the models directory. The driver reads
    neither readonly nor mount flags, so no option makes it read-only (docs/security.md)."""
    paths = {"slurm": "/ibm/fs1/dualsched", "inference": "/ibm/fs1/dualsched/models"}
    for consumer, spec in _csi_volumes(render_raw(variant("prod", _gpfs))).items():
        csi = spec["csi"]
        assert csi["driver"] == "spectrumscale.csi.ibm.com"
        assert csi["volumeHandle"] == f"0;0;7118073361626808055;09762E69:5D36FE8D;;;{paths[consumer]}"
        assert gpfs_volume_id(csi["volumeHandle"]) == {
            "storageClassType": "0",  # STORAGECLASS_CLASSIC
            "volType": "0",  # FILE_DIRECTORYBASED_VOLUME
            "clusterId": "7118073361626808055",
            "fsUUID": "09762E69:5D36FE8D",
            "consistencyGroup": "",
            "fsetName": "",
            "path": paths[consumer],
        }
        assert "fsType" not in csi and "mountOptions" not in spec  # a bind mount: the driver reads neither


def _beegfs(raw):
    raw["storage"] = {"type": "beegfs", "capacity": "2Pi", "beegfs": {"sysMgmtdHost": "mgmtd.beegfs.internal", "path": "/dualsched"}}


def test_beegfs_volumes_carry_a_beegfs_url():
    """Inference's URL is the models directory. Its mount options are the driver's defaults with 'ro' for 'rw':
    a PV's list replaces all of them (constructMountOptions), so nosuid is listed again."""
    specs = _csi_volumes(render_raw(variant("prod", _beegfs)))
    directories = {"slurm": "/dualsched", "inference": "/dualsched/models"}
    for consumer, spec in specs.items():
        csi = spec["csi"]
        assert csi["driver"] == "beegfs.csi.netapp.com"
        assert csi["volumeHandle"] == f"beegfs://mgmtd.beegfs.internal{directories[consumer]}"
        assert beegfs_volume(csi["volumeHandle"]) == ("mgmtd.beegfs.internal", directories[consumer])
        assert "fsType" not in csi
    assert "mountOptions" not in specs["slurm"]  # the driver's own: rw, relatime, nosuid
    assert specs["inference"]["mountOptions"] == [READ_ONLY_OPTION, "relatime", "nosuid"]


def test_a_beegfs_volume_may_be_the_whole_file_system():
    storage = BeegfsStorage(sys_mgmtd_host="10.30.0.5", path="/")
    assert beegfs_volume(storage.volume_handle) == ("10.30.0.5", "/")
    assert beegfs_volume(storage.volume_handle_of("models")) == ("10.30.0.5", "/models")


def test_a_lustre_handle_without_subdirectory_mounts_the_file_system_root():
    storage = LustreStorage(mgs_nodes=[{"nids": ["mgs1@tcp0"]}], fs_name="testfs")
    assert storage.volume_handle == "mgs1@tcp0:/testfs"
    assert lustre_mount_source(storage.volume_handle) == ([["mgs1@tcp0"]], "testfs", "")
    assert lustre_mount_source(storage.volume_handle_of("org/models")) == ([["mgs1@tcp0"]], "testfs", "org/models")


def _host_path(raw):
    raw["storage"] = {"type": "hostPath", "capacity": "20Gi", "hostPath": {"path": "/var/lib/dualsched/shared"}}


def test_host_path_source():
    """One directory on the node, created when missing for Slurm; inference's is the models directory, which
    must exist (a read-only volume creates nothing). hostPath has no read-only flag and takes no mount options:
    the claims and our pods' mounts carry read-only (docs/security.md says what remains)."""
    rendered = render_raw(variant("dev", _host_path))
    volumes = _volumes(rendered)
    assert sorted(volumes) == sorted(CONSUMERS)
    sources = {
        "slurm": {"path": "/var/lib/dualsched/shared", "type": "DirectoryOrCreate"},
        "inference": {"path": "/var/lib/dualsched/shared/models", "type": "Directory"},
    }
    for consumer, volume_ in volumes.items():
        spec = volume_.manifest["spec"]
        assert "nfs" not in spec and "csi" not in spec and "mountOptions" not in spec
        assert spec["hostPath"] == sources[consumer]
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
        # the claim is the models directory: mounted whole, no subPath into it
        models = mounts(container(deployment, "server"))["/models"]
        assert models == {"name": "models", "mountPath": "/models", "readOnly": True}


def test_models_path_is_configurable():
    rendered = render_raw(variant("dev", lambda raw: raw["storage"].update(modelsPath="checkpoints/serving")))
    assert _volumes(rendered)["inference"].manifest["spec"]["nfs"]["path"] == "/export/shared/checkpoints/serving"
    assert _volumes(rendered)["slurm"].manifest["spec"]["nfs"]["path"] == "/export/shared"
    [deployment] = rendered.in_namespace("inference", "Deployment")
    assert "subPath" not in mounts(container(deployment, "server"))["/models"]


# storage type -> (the dev stack edited to use it, where the inference volume's source names its directory)
_TYPES = {
    "nfs": (lambda raw: None, lambda spec: spec["nfs"]["path"]),
    "lustre": (_lustre_failover_pair, lambda spec: lustre_mount_source(spec["csi"]["volumeHandle"])[2]),
    "gpfs": (_gpfs, lambda spec: gpfs_volume_id(spec["csi"]["volumeHandle"])["path"]),
    "beegfs": (_beegfs, lambda spec: beegfs_volume(spec["csi"]["volumeHandle"])[1]),
    "hostPath": (_host_path, lambda spec: spec["hostPath"]["path"]),
}
# Where the mounter makes the volume read-only from the PV alone, whatever the pod's claim says.
READ_ONLY_AT_THE_SOURCE = {"nfs": True, "lustre": True, "gpfs": False, "beegfs": True, "hostPath": False}


@pytest.mark.parametrize("storage_type", sorted(_TYPES))
def test_inference_volume_is_the_models_directory_of_every_storage_type(storage_type):
    """The finding of issue 25: inference's PV pointed at the export's root and only our own pods' subPath
    narrowed it, so any pod of the namespace could mount all of /shared. Now the source is the models
    directory, one level below Slurm's, for every type; and it is read-only at the source wherever the
    mounter takes an option for it."""
    edit, directory_of = _TYPES[storage_type]
    rendered = render_raw(variant("prod" if storage_type in ("lustre", "gpfs", "beegfs") else "dev", edit))
    assert rendered.config.storage.type.value == storage_type
    specs = {consumer: volume_.manifest["spec"] for consumer, volume_ in _volumes(rendered).items()}
    slurm, inference = directory_of(specs["slurm"]), directory_of(specs["inference"])
    assert inference == f"{slurm.rstrip('/')}/{rendered.config.storage.models_path}"
    assert (READ_ONLY_OPTION in (specs["inference"].get("mountOptions") or [])) is READ_ONLY_AT_THE_SOURCE[storage_type]
    assert READ_ONLY_OPTION not in (specs["slurm"].get("mountOptions") or [])


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
