"""The inference namespace: model servers on inference-eligible GPU nodes, autoscaled.

Inference pods are placed by node affinity on pools that leave GPUs to
Kubernetes and never tolerate the Slurm taint, so they cannot take a GPU that
Slurm was promised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import SKIP_AWAIT, child, claim_volume, empty_dir, labels, locked_down, meta, mount, requirements
from dualsched.components.namespace import Spec, inference_policies, network_policies, pod_security_labels
from dualsched.config.models import Inference, InferenceModel, InferenceServer, PoolMode, StackConfig

HTTP_PORT = 8000
MODELS_MOUNT = "/models"
DRAIN_SECONDS = 10
"""A stopping server keeps serving this long: the Service drops it from its endpoints asynchronously
(kube-proxy, ingress), so a rollout or scale-down that stopped it at once would fail requests in flight."""
SERVER_UID = 65532
"""An unprivileged UID above the host range (no clash with node or shared-filesystem users); HOME is /tmp."""


@dataclass(frozen=True)
class ServerProfile:
    """What differs between vLLM and Triton: command line and health endpoints."""

    ready_path: str
    live_path: str

    def command(self, server: InferenceServer, model: InferenceModel) -> list[str]:
        path = f"{MODELS_MOUNT}/{model.served_path}"
        if server is InferenceServer.TRITON:
            return ["tritonserver", f"--model-repository={path}", f"--http-port={HTTP_PORT}", "--allow-grpc=false"]
        command = [
            "vllm", "serve", path,
            "--served-model-name", model.name,
            "--tensor-parallel-size", str(model.gpus),
            "--host", "0.0.0.0",
            "--port", str(HTTP_PORT),
        ]
        if model.max_model_len:
            command += ["--max-model-len", str(model.max_model_len)]
        return command


PROFILES = {
    InferenceServer.VLLM: ServerProfile(ready_path="/health", live_path="/health"),
    InferenceServer.TRITON: ServerProfile(ready_path="/v2/health/ready", live_path="/v2/health/live"),
}


def http_probe(path: str, period: int, failures: int) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port=HTTP_PORT),
        period_seconds=period,
        failure_threshold=failures,
        timeout_seconds=5,
    )


class InferenceNamespace(pulumi.ComponentResource):
    """The inference Namespace (restricted or baseline Pod Security) and its NetworkPolicies."""

    name: pulumi.Output[str]

    def __init__(
        self, name: str, inference: Inference, opts: Optional[pulumi.ResourceOptions] = None, other_programs: Optional[dict[str, Spec]] = None
    ):
        """``other_programs``: the policies of programs that run here too (an inference-only stack's node keeper)."""
        super().__init__("dualsched:inference:InferenceNamespace", name, None, opts)
        level = inference.pod_security.value
        namespace_labels = labels("inference", name)
        namespace = k8s.core.v1.Namespace(
            name,
            metadata=meta(name=inference.namespace, labels={**namespace_labels, **pod_security_labels(level, level)}),
            opts=child(self),
        )
        self.name = namespace.metadata.name
        network_policies(self, name, self.name, namespace_labels, {**inference_policies(inference, HTTP_PORT), **(other_programs or {})})
        self.register_outputs({"name": self.name})


@dataclass(frozen=True)
class ModelServerArgs:
    config: StackConfig
    model: InferenceModel
    namespace: pulumi.Input[str]
    models_claim_name: pulumi.Input[str]


def await_annotations(config: StackConfig) -> Optional[dict[str, str]]:
    """`pulumi up` waits for the servers to be Ready, except when every pool they may use is
    time-shared: outside the window they cannot run, and an up then must not wait for them."""
    if all(pool.mode is PoolMode.TIME_SHARED for pool in config.inference_pools):
        return SKIP_AWAIT
    return None


class ModelServer(pulumi.ComponentResource):
    """One model: Deployment, Service, HorizontalPodAutoscaler and PodDisruptionBudget."""

    endpoint: pulumi.Output[str]

    def __init__(self, name: str, args: ModelServerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:inference:ModelServer", name, None, opts)
        config, model = args.config, args.model
        pod_labels = labels(config.inference.server.value, model.name)
        deployment = k8s.apps.v1.Deployment(
            name,
            metadata=meta(namespace=args.namespace, labels=pod_labels, annotations=await_annotations(config)),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=model.replicas.min,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pod_labels),
                # Surge first: a GPU server takes minutes to load its model.
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_surge=1, max_unavailable=0),
                ),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=pod_labels), spec=self._pod_spec(args)
                ),
            ),
            opts=child(self, ignore_changes=["spec.replicas"]),
        )
        service = k8s.core.v1.Service(
            name,
            metadata=meta(name=model.name, namespace=args.namespace, labels=pod_labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=pod_labels,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=80, target_port=HTTP_PORT)],
            ),
            opts=child(self),
        )
        k8s.autoscaling.v2.HorizontalPodAutoscaler(
            name,
            metadata=meta(namespace=args.namespace, labels=pod_labels),
            spec=k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
                scale_target_ref=k8s.autoscaling.v2.CrossVersionObjectReferenceArgs(
                    api_version="apps/v1", kind="Deployment", name=deployment.metadata.name
                ),
                min_replicas=model.replicas.min,
                max_replicas=model.replicas.max,
                metrics=[
                    k8s.autoscaling.v2.MetricSpecArgs(
                        type="Resource",
                        resource=k8s.autoscaling.v2.ResourceMetricSourceArgs(
                            name="cpu",
                            target=k8s.autoscaling.v2.MetricTargetArgs(
                                type="Utilization", average_utilization=model.target_cpu_utilization
                            ),
                        ),
                    )
                ],
            ),
            opts=child(self),
        )
        k8s.policy.v1.PodDisruptionBudget(
            name,
            metadata=meta(namespace=args.namespace, labels=pod_labels),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pod_labels)
            ),
            opts=child(self),
        )
        self.endpoint = pulumi.Output.concat("http://", service.metadata.name, ".", args.namespace, ".svc.cluster.local")
        self.register_outputs({"endpoint": self.endpoint})

    @staticmethod
    def _pod_spec(args: ModelServerArgs) -> k8s.core.v1.PodSpecArgs:
        config, model = args.config, args.model
        profile = PROFILES[config.inference.server]
        eligible = [pool.name for pool in config.inference_pools]
        return k8s.core.v1.PodSpecArgs(
            automount_service_account_token=False,
            runtime_class_name=config.inference.runtime_class_name,
            security_context=k8s.core.v1.PodSecurityContextArgs(
                run_as_non_root=True,
                run_as_user=SERVER_UID,
                fs_group=SERVER_UID,
                seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
            ),
            affinity=k8s.core.v1.AffinityArgs(
                node_affinity=k8s.core.v1.NodeAffinityArgs(
                    required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                        node_selector_terms=[
                            k8s.core.v1.NodeSelectorTermArgs(
                                match_expressions=[
                                    k8s.core.v1.NodeSelectorRequirementArgs(
                                        key=config.placement.pool_label, operator="In", values=eligible
                                    )
                                ]
                            )
                        ]
                    )
                )
            ),
            tolerations=[
                k8s.core.v1.TolerationArgs(
                    key=t.key,
                    operator="Exists" if t.value is None else "Equal",
                    value=t.value,
                    effect=t.effect.value if t.effect else None,
                )
                for t in config.inference.tolerations
            ]
            or None,
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="server",
                    image=config.images.vllm if config.inference.server is InferenceServer.VLLM else config.images.triton,
                    command=profile.command(config.inference.server, model),
                    env=[
                        k8s.core.v1.EnvVarArgs(name="HOME", value="/tmp"),
                        # Models come from the shared file system only, never from a hub at run time.
                        k8s.core.v1.EnvVarArgs(name="HF_HUB_OFFLINE", value="1"),
                    ],
                    ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=HTTP_PORT)],
                    resources=requirements(model.resources, gpus=model.gpus),
                    startup_probe=http_probe(profile.ready_path, period=10, failures=90),
                    readiness_probe=http_probe(profile.ready_path, period=10, failures=3),
                    liveness_probe=http_probe(profile.live_path, period=20, failures=3),
                    lifecycle=k8s.core.v1.LifecycleArgs(
                        pre_stop=k8s.core.v1.LifecycleHandlerArgs(sleep=k8s.core.v1.SleepActionArgs(seconds=DRAIN_SECONDS))
                    ),
                    volume_mounts=[
                        # The claim's volume is the models directory itself (components/storage.py): mounted whole.
                        mount("models", MODELS_MOUNT, read_only=True),
                        mount("tmp", "/tmp"),
                        mount("shm", "/dev/shm"),
                    ],
                    security_context=locked_down(run_as_user=SERVER_UID),
                )
            ],
            volumes=[
                claim_volume("models", args.models_claim_name, read_only=True),
                empty_dir("tmp"),
                # Tensor-parallel workers exchange tensors through shared memory.
                empty_dir("shm", medium="Memory"),
            ],
        )
