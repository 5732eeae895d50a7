"""InferenceNamespace and ModelServer: restricted namespace, vLLM/Triton Deployments placed off Slurm's GPUs."""

from __future__ import annotations

import pytest

from rendering import container, mounts, pod_spec, render_raw, render_stack, variant, volume

PSA = "pod-security.kubernetes.io"
POOL_LABEL = "dualsched.io/pool"
SLURM_TAINT_KEY = "dualsched.io/slurm"


def _deployments(rendered) -> dict:
    """model name -> Deployment."""
    return {d.manifest["metadata"]["labels"]["app.kubernetes.io/instance"]: d for d in rendered.in_namespace("inference", "Deployment")}


def _triton(raw):
    raw["inference"]["server"] = "triton"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_namespace_enforces_restricted_pod_security(stack):
    labels = render_stack(stack).named("Namespace", "inference").manifest["metadata"]["labels"]
    assert labels[f"{PSA}/enforce"] == "restricted"
    assert labels[f"{PSA}/audit"] == "restricted"
    assert labels[f"{PSA}/warn"] == "restricted"


def test_baseline_pod_security_is_selectable():
    rendered = render_raw(variant("dev", lambda raw: raw["inference"].update(podSecurity="baseline")))
    assert rendered.named("Namespace", "inference").manifest["metadata"]["labels"][f"{PSA}/enforce"] == "baseline"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_one_deployment_service_hpa_and_pdb_per_model(stack):
    rendered = render_stack(stack)
    names = sorted(model.name for model in rendered.config.inference.models)
    assert sorted(_deployments(rendered)) == names
    assert sorted(s.name for s in rendered.in_namespace("inference", "Service")) == names
    assert len(rendered.in_namespace("inference", "HorizontalPodAutoscaler")) == len(names)
    assert len(rendered.in_namespace("inference", "PodDisruptionBudget")) == len(names)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_gpu_limits_and_resources_per_model(stack):
    rendered = render_stack(stack)
    deployments = _deployments(rendered)
    for model in rendered.config.inference.models:
        resources = container(deployments[model.name], "server")["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == str(model.gpus)
        assert resources["requests"]["nvidia.com/gpu"] == str(model.gpus)
        assert resources["limits"]["memory"] == model.resources.limits.memory
        assert resources["requests"]["cpu"] == model.resources.requests.cpu


def test_vllm_command_and_health_probes():
    rendered = render_stack("prod")
    server = container(_deployments(rendered)["qwen-32b-instruct"], "server")
    assert server["image"] == rendered.config.images.vllm
    command = server["command"]
    assert command[:3] == ["vllm", "serve", "/models/Qwen/Qwen2.5-32B-Instruct"]
    assert command[command.index("--served-model-name") + 1] == "qwen-32b-instruct"
    assert command[command.index("--tensor-parallel-size") + 1] == "4"
    assert command[command.index("--max-model-len") + 1] == "32768"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": 8000}
    assert server["ports"] == [{"containerPort": 8000, "name": "http"}]


def test_a_revision_serves_that_checkpoint_under_the_models_path_with_a_surge_first_rollout():
    def promote(raw):
        raw["inference"]["models"][0]["revision"] = "step-12000"

    deployment = _deployments(render_raw(variant("dev", promote)))["qwen-small"]
    assert container(deployment, "server")["command"][:3] == ["vllm", "serve", "/models/qwen2.5-0.5b-instruct/step-12000"]
    strategy = deployment.manifest["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # an old replica keeps serving while the Service drops it from its endpoints
    assert container(deployment, "server")["lifecycle"] == {"preStop": {"sleep": {"seconds": 10}}}


def test_triton_serves_a_revision_as_its_model_repository():
    def promote(raw):
        _triton(raw)
        raw["inference"]["models"][0]["revision"] = "v2"

    command = container(_deployments(render_raw(variant("dev", promote)))["qwen-small"], "server")["command"]
    assert "--model-repository=/models/qwen2.5-0.5b-instruct/v2" in command


def test_triton_is_selectable_with_its_own_health_endpoints():
    rendered = render_raw(variant("dev", _triton))
    server = container(_deployments(rendered)["qwen-small"], "server")
    assert server["image"] == rendered.config.images.triton
    assert server["command"][0] == "tritonserver"
    assert "--model-repository=/models/qwen2.5-0.5b-instruct" in server["command"]
    assert server["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert server["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert server["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8000}


@pytest.mark.parametrize(("stack", "eligible"), [("dev", ["gpu"]), ("prod", ["h100-shared"])])
def test_node_affinity_only_to_inference_eligible_pools(stack, eligible):
    rendered = render_stack(stack)
    for deployment in _deployments(rendered).values():
        affinity = pod_spec(deployment)["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": eligible}]}]
        assert "nodeSelector" not in pod_spec(deployment)


def test_kubernetes_only_pools_are_eligible_and_dedicated_pools_never():
    def add_pool(raw):
        raw["pools"].append({"name": "serve", "nodes": "inf-[01-04]", "mode": "kubernetes", "gpusPerNode": 4})

    rendered = render_raw(variant("prod", add_pool))
    for deployment in _deployments(rendered).values():
        [term] = pod_spec(deployment)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"][0]["values"] == ["h100-shared", "serve"]


def _only_time_shared(raw):
    raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "09:00", "durationMinutes": 480})
    del raw["pools"][0]["slurmGpus"]


def test_servers_that_can_run_only_inside_a_window_are_not_awaited_by_pulumi_up():
    """Outside the window their pods cannot run: an up then must neither hang nor fail on them."""
    deployment = _deployments(render_raw(variant("dev", _only_time_shared)))["qwen-small"]
    assert deployment.manifest["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    assert pod_spec(deployment)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["gpu"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_servers_with_a_pool_at_every_hour_are_awaited(stack):
    for deployment in _deployments(render_stack(stack)).values():
        assert "pulumi.com/skipAwait" not in (deployment.manifest["metadata"].get("annotations") or {})


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_never_tolerates_the_slurm_taint(stack):
    rendered = render_stack(stack)
    for deployment in _deployments(rendered).values():
        tolerations = pod_spec(deployment).get("tolerations") or []
        assert not [t for t in tolerations if t.get("key") == SLURM_TAINT_KEY]
        assert not [t for t in tolerations if "key" not in t]  # a keyless Exists tolerates everything


def test_configured_tolerations_are_applied():
    def taint(raw):
        raw["pools"][0]["taints"] = [{"key": "example.com/serving", "value": "yes", "effect": "NoSchedule"}]
        raw["inference"]["tolerations"] = [{"key": "example.com/serving"}]

    [deployment] = _deployments(render_raw(variant("dev", taint))).values()
    assert pod_spec(deployment)["tolerations"] == [{"key": "example.com/serving", "operator": "Exists"}]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_runs_non_root_with_read_only_root(stack):
    for deployment in _deployments(render_stack(stack)).values():
        spec = pod_spec(deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        assert "hostNetwork" not in spec
        context = container(deployment, "server")["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in context
        # writable scratch and shared memory come from emptyDirs
        assert mounts(container(deployment, "server"))["/tmp"]["name"] == "tmp"
        assert volume(deployment, "shm")["emptyDir"] == {"medium": "Memory"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_models_come_read_only_from_shared_storage(stack):
    rendered = render_stack(stack)
    for deployment in _deployments(rendered).values():
        assert volume(deployment, "models")["persistentVolumeClaim"]["readOnly"] is True
        # the claim's volume is the models directory itself (tests/test_storage.py): no subPath narrows it here
        models = mounts(container(deployment, "server"))["/models"]
        assert models["readOnly"] is True and "subPath" not in models
        claim = next(c for c in rendered.in_namespace("inference", "PersistentVolumeClaim"))
        assert volume(deployment, "models")["persistentVolumeClaim"]["claimName"] == claim.name
        env = {e["name"]: e.get("value") for e in container(deployment, "server")["env"]}
        assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_service_selects_the_model_pods(stack):
    rendered = render_stack(stack)
    for name, deployment in _deployments(rendered).items():
        service = rendered.named("Service", name, "inference").manifest
        assert service["spec"]["selector"] == deployment.manifest["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": 8000}]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_hpa_bounds_come_from_config_and_target_the_deployment(stack):
    rendered = render_stack(stack)
    deployments = _deployments(rendered)
    hpas = {h.manifest["metadata"]["labels"]["app.kubernetes.io/instance"]: h.manifest for h in rendered.by_kind("HorizontalPodAutoscaler")}
    for model in rendered.config.inference.models:
        spec = hpas[model.name]["spec"]
        assert (spec["minReplicas"], spec["maxReplicas"]) == (model.replicas.min, model.replicas.max)
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployments[model.name].name}
        [metric] = spec["metrics"]
        assert metric["resource"]["target"]["averageUtilization"] == model.target_cpu_utilization
        assert deployments[model.name].manifest["spec"]["replicas"] == model.replicas.min


def test_prod_hpa_bounds():
    hpas = {h.manifest["metadata"]["labels"]["app.kubernetes.io/instance"]: h.manifest["spec"] for h in render_stack("prod").by_kind("HorizontalPodAutoscaler")}
    assert (hpas["llama-8b-instruct"]["minReplicas"], hpas["llama-8b-instruct"]["maxReplicas"]) == (2, 8)
    assert (hpas["qwen-32b-instruct"]["minReplicas"], hpas["qwen-32b-instruct"]["maxReplicas"]) == (1, 4)


def test_the_autoscaler_owns_replicas():
    rendered = render_stack("prod")
    for deployment in _deployments(rendered).values():
        assert "spec.replicas" in rendered.registration(deployment).ignore_changes


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_pdb_keeps_all_but_one_replica(stack):
    rendered = render_stack(stack)
    deployments = _deployments(rendered)
    for pdb in rendered.in_namespace("inference", "PodDisruptionBudget"):
        model = pdb.manifest["metadata"]["labels"]["app.kubernetes.io/instance"]
        assert pdb.manifest["spec"]["maxUnavailable"] == 1
        assert pdb.manifest["spec"]["selector"]["matchLabels"] == deployments[model].manifest["spec"]["template"]["metadata"]["labels"]


def test_endpoints_are_the_in_cluster_service_urls():
    rendered = render_stack("prod")
    endpoints = {
        c.name: rendered.component_outputs[c.urn]["endpoint"] for c in rendered.components("dualsched:inference:ModelServer")
    }
    assert endpoints == {
        "dualsched-llama-8b-instruct": "http://llama-8b-instruct.inference.svc.cluster.local",
        "dualsched-qwen-32b-instruct": "http://qwen-32b-instruct.inference.svc.cluster.local",
    }


def test_inference_disabled_creates_no_namespace_or_servers():
    rendered = render_raw(variant("dev", lambda raw: raw["inference"].update(enabled=False)))
    assert not [n for n in rendered.by_kind("Namespace") if n.name == "inference"]
    assert not rendered.in_namespace("inference")
    assert not rendered.components("dualsched:inference:ModelServer")
    assert not [pv for pv in rendered.by_kind("PersistentVolume") if "inference" in pv.name]
