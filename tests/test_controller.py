"""SlurmController: slurmctld StatefulSet, headless Service, state claim, probes, config hash."""

from __future__ import annotations

import re

import pytest

from components.controller import CONFIG_HASH_ANNOTATION, SLURM_UID
from rendering import container, mounts, pod_spec, render_raw, render_stack, variant, volume


def _statefulset(rendered):
    return rendered.named("StatefulSet", "slurmctld", "slurm")


def _state_claim(rendered):
    return rendered.one("PersistentVolumeClaim", "slurmctld-state")


def _conf_value(rendered, key: str) -> str:
    return re.search(rf"^{key}=(.*)$", rendered.slurm_files["slurm.conf"], re.M).group(1)


def _add_partition(raw):
    raw["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "00:30:00"})


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_headless_service_gives_the_pods_stable_dns(stack):
    rendered = render_stack(stack)
    service = rendered.named("Service", "slurmctld", "slurm").manifest
    statefulset = _statefulset(rendered).manifest
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [{"name": "slurmctld", "port": 6817, "targetPort": 6817}]
    assert statefulset["spec"]["serviceName"] == "slurmctld"
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == pod_labels == statefulset["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(("stack", "replicas"), [("dev", 1), ("prod", 2)])
def test_one_replica_or_two_with_ha(stack, replicas):
    rendered = render_stack(stack)
    assert rendered.config.slurm.controller.ha is (replicas == 2)
    assert _statefulset(rendered).manifest["spec"]["replicas"] == replicas
    assert len(re.findall(r"^SlurmctldHost=", rendered.slurm_files["slurm.conf"], re.M)) == replicas


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_state_claim_is_mounted_at_state_save_location(stack):
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered)
    claim = _state_claim(rendered)
    assert claim.namespace == "slurm"
    assert volume(statefulset, "state")["persistentVolumeClaim"] == {"claimName": claim.name}
    state_dir = _conf_value(rendered, "StateSaveLocation")
    assert mounts(container(statefulset, "slurmctld"))[state_dir]["name"] == "state"


def test_state_claim_size_class_and_access_mode_come_from_config():
    dev = _state_claim(render_stack("dev")).manifest["spec"]
    prod = _state_claim(render_stack("prod")).manifest["spec"]
    assert dev["resources"]["requests"] == {"storage": "5Gi"}
    assert dev["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in dev  # the cluster default
    # HA: both controllers share the state, so it must be ReadWriteMany.
    assert prod["resources"]["requests"] == {"storage": "50Gi"}
    assert prod["accessModes"] == ["ReadWriteMany"]
    assert prod["storageClassName"] == "lustre-rwx"


@pytest.mark.parametrize(("stack", "protect"), [("dev", False), ("prod", True)])
def test_state_claim_survives_the_program(stack, protect):
    rendered = render_stack(stack)
    registration = rendered.registration(_state_claim(rendered))
    assert registration.retain_on_delete is True
    assert registration.protect is protect


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_probes_and_config_mount(stack):
    rendered = render_stack(stack)
    statefulset = _statefulset(rendered)
    slurmctld = container(statefulset, "slurmctld")
    assert slurmctld["startupProbe"]["tcpSocket"] == {"port": 6817}
    assert slurmctld["livenessProbe"]["tcpSocket"] == {"port": 6817}
    assert slurmctld["readinessProbe"]["exec"]["command"] == ["scontrol", "ping"]
    assert slurmctld["command"][:2] == ["slurmctld", "-D"]
    assert slurmctld["image"] == rendered.config.images.slurmctld
    config_map = rendered.one("ConfigMap", "slurm-config")
    assert volume(statefulset, "slurm-config")["configMap"] == {"name": config_map.name}
    assert mounts(slurmctld)["/etc/slurm"] == {"name": "slurm-config", "mountPath": "/etc/slurm", "readOnly": True}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_resources_come_from_config(stack):
    rendered = render_stack(stack)
    resources = rendered.config.slurm.controller.resources
    actual = container(_statefulset(rendered), "slurmctld")["resources"]
    assert actual == {
        "requests": {"cpu": resources.requests.cpu, "memory": resources.requests.memory},
        "limits": {"cpu": resources.limits.cpu, "memory": resources.limits.memory},
    }
    if stack == "prod":
        assert actual["limits"] == {"cpu": "8", "memory": "32Gi"}


def test_runs_as_the_slurm_user_without_privilege():
    statefulset = _statefulset(render_stack("dev"))
    context = container(statefulset, "slurmctld")["securityContext"]
    assert context["runAsUser"] == SLURM_UID and context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "privileged" not in context
    assert pod_spec(statefulset)["automountServiceAccountToken"] is False


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_config_hash_annotation_is_the_rendered_hash(stack):
    rendered = render_stack(stack)
    annotations = _statefulset(rendered).manifest["spec"]["template"]["metadata"]["annotations"]
    assert annotations[CONFIG_HASH_ANNOTATION] == rendered.render.slurm_conf_hash


def test_adding_a_partition_rolls_the_controller_but_not_slurmd():
    before, after = render_stack("dev"), render_raw(variant("dev", _add_partition))
    annotation = lambda r: _statefulset(r).manifest["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    assert annotation(after) != annotation(before)
    assert annotation(after) == after.render.slurm_conf_hash
    # Configless: slurmd fetches slurm.conf from slurmctld, so its DaemonSet does not change at all.
    [daemonset_before], [daemonset_after] = before.by_kind("DaemonSet"), after.by_kind("DaemonSet")
    assert daemonset_after.manifest == daemonset_before.manifest


def test_address_output_is_the_first_controller():
    outputs = render_stack("prod").outputs_of("dualsched:controller:SlurmController")
    assert outputs["address"] == "slurmctld-0.slurmctld.slurm.svc.cluster.local:6817"
    assert outputs["statefulset_name"] == "slurmctld"


def test_control_daemons_prefer_nodes_outside_the_gpu_pools(stack):
    """slurmctld, slurmdbd and MariaDB leave GPU nodes' CPU and memory to jobs when they can."""
    rendered = render_stack(stack)
    workloads = [rendered.named("StatefulSet", "slurmctld"), *rendered.by_kind("Deployment")]
    workloads = [w for w in workloads if w.manifest["metadata"]["labels"].get("app.kubernetes.io/name") != "vllm"]
    if stack == "dev":
        workloads.append(rendered.named("StatefulSet", "mariadb"))
    for workload in workloads:
        preferred = pod_spec(workload)["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred == [
            {
                "weight": 100,
                "preference": {"matchExpressions": [{"key": "dualsched.io/pool", "operator": "DoesNotExist"}]},
            }
        ], workload.name
