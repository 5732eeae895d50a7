"""DualScheduledCluster and the shape every component shares: type tokens, parents, outputs, providers."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pulumi
import pulumi_kubernetes as k8s
import pytest

from dualsched import components
from dualsched.components.cluster import DualScheduledCluster
from dualsched.components.slurm_config import CLUSTER_NAME_LOCK
from rendering import render_raw, render_stack, render_with_registrations, variant

CLUSTER = "dualsched:cluster:DualScheduledCluster"


def _component_classes() -> dict[str, type]:
    """Every ComponentResource class defined in a components module, by module.ClassName."""
    classes = {}
    for info in pkgutil.iter_modules(components.__path__):
        module = importlib.import_module(f"dualsched.components.{info.name}")
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, pulumi.ComponentResource) and value.__module__ == module.__name__:
                classes[f"{info.name}.{name}"] = value
    return classes


def test_every_component_class_is_registered_under_its_module_type_token():
    registered = {r.type for stack in ("dev", "prod") for r in render_stack(stack).components()}
    expected = {f"dualsched:{key.split('.')[0]}:{key.split('.')[1]}" for key in _component_classes()}
    assert len(expected) >= 14
    assert "dualsched:identity:UserDirectory" in expected
    assert registered == expected


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_type_tokens_name_the_module_and_class(stack):
    for registration in render_stack(stack).components():
        package, module, name = registration.type.split(":")
        assert package == "dualsched"
        cls = getattr(importlib.import_module(f"dualsched.components.{module}"), name)
        assert issubclass(cls, pulumi.ComponentResource)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_component_registers_outputs(stack):
    rendered = render_stack(stack)
    for registration in rendered.components():
        assert registration.urn in rendered.component_outputs, registration.type
        assert rendered.component_outputs[registration.urn], registration.type


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_resource_is_a_child_of_a_component(stack):
    rendered = render_stack(stack)
    [cluster] = rendered.components(CLUSTER)
    for registration in rendered.resources:
        # the ClusterName lock sits beside the cluster, which waits for it (tests/test_slurm_config.py)
        if registration.type == CLUSTER or registration.name.endswith(CLUSTER_NAME_LOCK):
            continue
        assert registration.parent_type.startswith("dualsched:"), f"{registration.type} {registration.name}"
        if not registration.custom:
            assert registration.parent == cluster.urn


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmd_and_model_servers_wait_for_the_node_keeper(stack):
    """Their nodeSelector and affinity match labels the keeper writes: it is ready once every pool node
    carries its pool's labels and taints, so no slurmd or model server is created before."""
    rendered = render_stack(stack)
    [deployment] = [r.urn for r in rendered.resources if r.type == "kubernetes:apps/v1:Deployment" and r.name == "dualsched-node-keeper"]
    waiting = rendered.components("dualsched:compute:ComputePool") + rendered.components("dualsched:inference:ModelServer")
    assert len(waiting) == len(rendered.config.slurm_pools) + len(rendered.config.inference.models)
    for component in waiting:
        assert deployment in component.dependencies, component.name


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_pulumi_resource_per_node(stack):
    """A resource per node costs the engine its whole Node in the state at each step (docs/benchmark.md)."""
    rendered = render_stack(stack)
    assert not [r for r in rendered.resources if r.type.startswith("kubernetes:core/v1:Node")]
    assert len(rendered.resources) < 120


def test_dev_cluster_outputs():
    outputs = render_stack("dev").outputs_of(CLUSTER)
    assert outputs["namespaces"] == {"slurm": "slurm", "inference": "inference", "jobs": "slurm-jobs"}
    assert outputs["controller_address"] == "slurmctld-0.slurmctld.slurm.svc.cluster.local:6817"
    assert outputs["inference_endpoints"] == {"qwen-small": "http://qwen-small.inference.svc.cluster.local"}


def test_prod_cluster_outputs():
    outputs = render_stack("prod").outputs_of(CLUSTER)
    assert outputs["controller_address"] == "slurmctld-0.slurmctld.slurm.svc.cluster.local:6817"
    assert outputs["inference_endpoints"] == {
        "llama-8b-instruct": "http://llama-8b-instruct.inference.svc.cluster.local",
        "qwen-32b-instruct": "http://qwen-32b-instruct.inference.svc.cluster.local",
    }


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurm_conf_hash_output_is_the_config_maps_hash(stack):
    rendered = render_stack(stack)
    outputs = rendered.outputs_of(CLUSTER)
    assert outputs["slurm_conf_hash"] == rendered.render.slurm_conf_hash
    assert outputs["slurm_conf_hash"] == rendered.outputs_of("dualsched:slurm_config:SlurmConfig")["hash"]
    assert len(outputs["slurm_conf_hash"]) == 64


def test_outputs_follow_what_is_enabled():
    def slurm_only(raw):
        raw["inference"]["enabled"] = False
        raw["submission"] = {"enabled": False}

    outputs = render_raw(variant("dev", slurm_only)).outputs_of(CLUSTER)
    assert outputs["namespaces"] == {"slurm": "slurm"}
    assert outputs["inference_endpoints"] == {}


def test_protect_only_in_prod_and_only_on_state():
    """Except the ClusterName lock, which every stack protects (tests/test_slurm_config.py)."""
    dev, prod = render_stack("dev"), render_stack("prod")
    lock = ("RandomId", "dualsched-cluster-name-lock")
    assert {(r.type.rsplit(":", 1)[-1], r.name) for r in dev.resources if r.protect} == {lock}
    protected = {(r.type.rsplit(":", 1)[-1], r.name) for r in prod.resources if r.protect and r.custom}
    assert lock in protected
    assert ("PersistentVolumeClaim", "dualsched-slurmctld-state") in protected
    assert {name for kind, name in protected if kind == "PersistentVolume"} == {
        "dualsched-shared-slurm",
        "dualsched-shared-inference",
    }
    assert ("Namespace", "dualsched-slurm") in protected
    unprotected_kinds = {"DaemonSet", "Deployment", "StatefulSet", "ConfigMap", "Secret"}
    assert not {kind for kind, _ in protected} & unprotected_kinds


def test_providers_pass_through_to_every_kubernetes_resource():
    def program(config):
        provider = k8s.Provider("target", kubeconfig="{}")
        return DualScheduledCluster("dualsched", config, opts=pulumi.ResourceOptions(providers=[provider]))

    rendered = render_with_registrations(render_stack("dev").config, "dev", program=program)
    kubernetes = [r for r in rendered.resources if r.custom and r.type.startswith("kubernetes:")]
    assert kubernetes
    for registration in kubernetes:
        assert "pulumi:providers:kubernetes::target" in registration.provider, registration.name


# ------------------------------------------------------------------------ partial builds


def _inference_only(raw):
    for key in ("slurm", "network", "submission"):
        del raw[key]
    raw["pools"][0] = {"name": "gpu", "nodes": "gpu-[001-002]", "mode": "kubernetes"}


def test_an_inference_only_cluster_builds_no_slurm():
    rendered = render_raw(variant("dev", _inference_only))
    assert {r.type for r in rendered.components()} == {
        CLUSTER,
        "dualsched:storage:SharedStorageVolumes",
        "dualsched:node_keeper:NodeKeeper",
        "dualsched:inference:InferenceNamespace",
        "dualsched:inference:ModelServer",
    }
    # no lock, munge key, JWT key or password: only the random part of the shared claims' names
    assert {r.type for r in rendered.resources if r.type.startswith("random:")} == {"random:index/randomString:RandomString"}
    assert {n.name for n in rendered.by_kind("Namespace")} == {"inference"}
    assert rendered.render.slurm_files == {}
    outputs = rendered.outputs_of(CLUSTER)
    assert outputs["namespaces"] == {"inference": "inference"}
    assert "controller_address" not in outputs and "slurm_conf_hash" not in outputs  # None: no value is registered
    assert outputs["inference_endpoints"] == {"qwen-small": "http://qwen-small.inference.svc.cluster.local"}


def test_an_inference_only_stack_keeps_its_labels_with_a_keeper_in_the_inference_namespace():
    rendered = render_raw(variant("dev", _inference_only))
    [keeper] = [d for d in rendered.by_kind("Deployment") if d.name.startswith("dualsched-node-keeper-")]
    assert keeper.namespace == "inference"
    [server] = rendered.components("dualsched:inference:ModelServer")
    assert rendered.registration(keeper).urn in server.dependencies
    [policy] = [p for p in rendered.by_kind("NetworkPolicy") if p.name.startswith("dualsched-inference-node-keeper-")]
    assert policy.namespace == "inference" and policy.manifest["spec"]["policyTypes"] == ["Egress"]


def test_a_slurm_only_cluster_builds_no_inference():
    rendered = render_raw(variant("dev", lambda raw: raw.pop("inference")))
    types = {r.type for r in rendered.components()}
    assert not {"dualsched:inference:InferenceNamespace", "dualsched:inference:ModelServer"} & types
    assert "dualsched:compute:ComputePool" in types and "dualsched:submission:JobSubmission" in types
    assert {c.namespace for c in rendered.by_kind("PersistentVolumeClaim") if "shared" in c.name} == {"slurm"}
    outputs = rendered.outputs_of(CLUSTER)
    assert outputs["namespaces"] == {"slurm": "slurm", "jobs": "slurm-jobs"} and outputs["inference_endpoints"] == {}
