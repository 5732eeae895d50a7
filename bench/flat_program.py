"""The floor: a flat, hand-written pulumi-kubernetes program, no components.

It registers the same Kubernetes objects as ``components.program.build`` for a
fleet config (same kinds, same counts, specs of the same shape and size), as
straightforward direct resource constructors, the way one would write it by
hand for one cluster. The benchmark times it under the same mocks to price what
the library's abstraction (components, typed helpers, validation) costs.

It takes the rendered Slurm files as input: their render time is reported
separately, and is charged to the library alone (a conservative ratio).
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from config.models import StackConfig

core, apps, meta, net = k8s.core.v1, k8s.apps.v1, k8s.meta.v1, k8s.networking.v1


def _locked(uid=None):
    return core.SecurityContextArgs(
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        run_as_non_root=True if uid else None,
        run_as_user=uid,
        capabilities=core.CapabilitiesArgs(drop=["ALL"]),
        seccomp_profile=core.SeccompProfileArgs(type="RuntimeDefault"),
    )


def _munged(image):
    return core.ContainerArgs(
        name="munged",
        image=image,
        restart_policy="Always",
        command=["munged", "--foreground", "--key-file=/etc/munge/munge.key", "--socket=/run/munge/munge.socket.2",
                 "--pid-file=/run/munge/munged.pid", "--seed-file=/run/munge/munged.seed", "--log-file=/dev/stderr"],
        volume_mounts=[core.VolumeMountArgs(name="munge-key", mount_path="/etc/munge", read_only=True),
                       core.VolumeMountArgs(name="munge-socket", mount_path="/run/munge")],
        resources=core.ResourceRequirementsArgs(requests={"cpu": "50m", "memory": "32Mi"}, limits={"cpu": "200m", "memory": "64Mi"}),
        security_context=_locked(),
    )


def _munge_volumes(secret_name):
    return [core.VolumeArgs(name="munge-key", secret=core.SecretVolumeSourceArgs(secret_name=secret_name, default_mode=0o400)),
            core.VolumeArgs(name="munge-socket", empty_dir=core.EmptyDirVolumeSourceArgs())]


def _tcp(port, period, failures=3):
    return core.ProbeArgs(tcp_socket=core.TCPSocketActionArgs(port=port), period_seconds=period, failure_threshold=failures)


def build(config: StackConfig, slurm_files: dict[str, str], slurmdbd_conf: str) -> None:
    images, cluster = config.images, config.slurm.cluster_name
    protect = config.protect_state
    kept = pulumi.ResourceOptions(protect=protect, retain_on_delete=True)
    lbl = {"app.kubernetes.io/part-of": "dualsched", "app.kubernetes.io/instance": cluster}

    # Namespaces
    slurm_ns = core.Namespace("slurm", metadata=meta.ObjectMetaArgs(name="slurm", labels={
        **lbl, "pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/audit": "baseline",
        "pod-security.kubernetes.io/warn": "baseline"}), opts=kept)
    inf_ns = core.Namespace("inference", metadata=meta.ObjectMetaArgs(name="inference", labels={
        **lbl, "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}))
    jobs_ns = core.Namespace("slurm-jobs", metadata=meta.ObjectMetaArgs(name="slurm-jobs", labels={
        **lbl, "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}))
    slurm, inference, jobs = slurm_ns.metadata.name, inf_ns.metadata.name, jobs_ns.metadata.name

    # Network policies
    def peer(name):
        return net.NetworkPolicyPeerArgs(pod_selector=meta.LabelSelectorArgs(match_labels={"app.kubernetes.io/name": name}))

    def port(number, protocol="TCP"):
        return net.NetworkPolicyPortArgs(port=number, protocol=protocol)

    net.NetworkPolicy("default-deny", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=lbl), spec=net.NetworkPolicySpecArgs(
        pod_selector=meta.LabelSelectorArgs(), policy_types=["Ingress", "Egress"]))
    net.NetworkPolicy("allow-dns", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=lbl), spec=net.NetworkPolicySpecArgs(
        pod_selector=meta.LabelSelectorArgs(), policy_types=["Egress"],
        egress=[net.NetworkPolicyEgressRuleArgs(ports=[port(53, "UDP"), port(53)])]))
    net.NetworkPolicy("slurmctld", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=lbl), spec=net.NetworkPolicySpecArgs(
        pod_selector=peer("slurmctld").pod_selector, policy_types=["Ingress", "Egress"],
        ingress=[net.NetworkPolicyIngressRuleArgs(ports=[port(6817)])],
        egress=[net.NetworkPolicyEgressRuleArgs(ports=[port(6818)]),
                net.NetworkPolicyEgressRuleArgs(to=[peer("slurmdbd")], ports=[port(6819)])]))
    net.NetworkPolicy("slurmdbd", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=lbl), spec=net.NetworkPolicySpecArgs(
        pod_selector=peer("slurmdbd").pod_selector, policy_types=["Ingress", "Egress"],
        ingress=[net.NetworkPolicyIngressRuleArgs(ports=[port(6819)])],
        egress=[net.NetworkPolicyEgressRuleArgs(ports=[port(3306)]),
                net.NetworkPolicyEgressRuleArgs(to=[peer("slurmctld")], ports=[port(6817)])]))

    # Munge key, one Secret per namespace that runs Slurm clients or daemons
    key = random.RandomBytes("munge", length=1024)
    munge_slurm = core.Secret("munge-slurm", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=lbl), type="Opaque",
                              data={"munge.key": key.base64})
    munge_jobs = core.Secret("munge-jobs", metadata=meta.ObjectMetaArgs(namespace=jobs, labels=lbl), type="Opaque",
                             data={"munge.key": key.base64})

    # Slurm config
    slurm_cm = core.ConfigMap("slurm-config", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=lbl), data=slurm_files)

    # Shared storage: a PV/PVC pair per namespace
    lustre = config.storage.lustre
    claims = {}
    for consumer, namespace, read_only in (("slurm", slurm, False), ("inference", inference, True), ("jobs", jobs, False)):
        mode = "ReadOnlyMany" if read_only else "ReadWriteMany"
        pv = core.PersistentVolume(f"shared-{consumer}", metadata=meta.ObjectMetaArgs(labels=lbl), spec=core.PersistentVolumeSpecArgs(
            capacity={"storage": config.storage.capacity}, access_modes=[mode], persistent_volume_reclaim_policy="Retain",
            storage_class_name="", volume_mode="Filesystem", csi=core.CSIPersistentVolumeSourceArgs(
                driver=lustre.driver, volume_handle=lustre.volume_handle, volume_attributes=dict(lustre.volume_attributes),
                read_only=read_only)), opts=kept)
        claims[consumer] = core.PersistentVolumeClaim(
            f"shared-{consumer}", metadata=meta.ObjectMetaArgs(namespace=namespace, labels=lbl),
            spec=core.PersistentVolumeClaimSpecArgs(access_modes=[mode], storage_class_name="", volume_name=pv.metadata.name,
                                                    resources=core.VolumeResourceRequirementsArgs(requests={"storage": config.storage.capacity})),
            opts=kept).metadata.name

    # Node labels and taints: one NodePatch per node
    patches: dict[str, list] = {}
    for pool in config.pools:
        patches[pool.name] = []
        node_labels = {"dualsched.io/pool": pool.name, "dualsched.io/mode": pool.mode.value,
                       "dualsched.io/slurm-gpus": str(pool.slurm_gpu_count)}
        taints = [core.TaintPatchArgs(key=t.key, value=t.value, effect=t.effect.value) for t in config.pool_taints(pool)]
        for node in pool.node_names:
            patches[pool.name].append(core.NodePatch(
                f"{pool.name}-{node}",
                metadata=meta.ObjectMetaPatchArgs(name=node, labels=node_labels,
                                                  annotations={"pulumi.com/patchFieldManager": "dualsched"}),
                spec=core.NodeSpecPatchArgs(taints=taints) if taints else None,
                opts=pulumi.ResourceOptions(retain_on_delete=True)))

    # slurmctld
    ctld = {**lbl, "app.kubernetes.io/name": "slurmctld"}
    state = core.PersistentVolumeClaim("slurmctld-state", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=ctld),
                                       spec=core.PersistentVolumeClaimSpecArgs(access_modes=["ReadWriteMany"],
                                       resources=core.VolumeResourceRequirementsArgs(requests={"storage": "50Gi"})), opts=kept)
    core.Service("slurmctld", metadata=meta.ObjectMetaArgs(name="slurmctld", namespace=slurm, labels=ctld),
                 spec=core.ServiceSpecArgs(cluster_ip="None", publish_not_ready_addresses=True, selector=ctld,
                                           ports=[core.ServicePortArgs(name="slurmctld", port=6817, target_port=6817)]))
    apps.StatefulSet("slurmctld", metadata=meta.ObjectMetaArgs(name="slurmctld", namespace=slurm, labels=ctld), spec=apps.StatefulSetSpecArgs(
        service_name="slurmctld", replicas=2, pod_management_policy="Parallel", selector=meta.LabelSelectorArgs(match_labels=ctld),
        template=core.PodTemplateSpecArgs(
            metadata=meta.ObjectMetaArgs(labels=ctld, annotations={"dualsched.io/slurm-restart-hash": "0" * 64}),
            spec=core.PodSpecArgs(
                automount_service_account_token=False, security_context=core.PodSecurityContextArgs(fs_group=401),
                init_containers=[_munged(images.slurmd)],
                containers=[core.ContainerArgs(
                    name="slurmctld", image=images.slurmctld, command=["slurmctld", "-D", "-f", "/etc/slurm/slurm.conf"],
                    env=[core.EnvVarArgs(name="SLURM_CONF", value="/etc/slurm/slurm.conf")],
                    ports=[core.ContainerPortArgs(name="slurmctld", container_port=6817)],
                    resources=core.ResourceRequirementsArgs(requests={"cpu": "1", "memory": "2Gi"}, limits={"cpu": "4", "memory": "8Gi"}),
                    startup_probe=_tcp(6817, 5, 60), liveness_probe=_tcp(6817, 15),
                    readiness_probe=core.ProbeArgs(exec_=core.ExecActionArgs(command=["scontrol", "ping"]), period_seconds=15),
                    volume_mounts=[core.VolumeMountArgs(name="slurm-config", mount_path="/etc/slurm", read_only=True),
                                   core.VolumeMountArgs(name="state", mount_path="/var/spool/slurmctld"),
                                   core.VolumeMountArgs(name="run", mount_path="/run/slurm"),
                                   core.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                                   core.VolumeMountArgs(name="munge-socket", mount_path="/run/munge")],
                    security_context=_locked(401))],
                volumes=[core.VolumeArgs(name="slurm-config", config_map=core.ConfigMapVolumeSourceArgs(name=slurm_cm.metadata.name)),
                         core.VolumeArgs(name="state", persistent_volume_claim=core.PersistentVolumeClaimVolumeSourceArgs(
                             claim_name=state.metadata.name)),
                         core.VolumeArgs(name="run", empty_dir=core.EmptyDirVolumeSourceArgs()),
                         core.VolumeArgs(name="tmp", empty_dir=core.EmptyDirVolumeSourceArgs()),
                         *_munge_volumes(munge_slurm.metadata.name)]))))

    # slurmdbd against the external database
    dbd = {**lbl, "app.kubernetes.io/name": "slurmdbd"}
    password = config.slurm.accounting.database.external.password_secret
    dbd_conf = core.Secret("slurmdbd-conf", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=dbd), type="Opaque",
                           string_data={"slurmdbd.conf": slurmdbd_conf})
    core.Service("slurmdbd", metadata=meta.ObjectMetaArgs(name="slurmdbd", namespace=slurm, labels=dbd), spec=core.ServiceSpecArgs(
        selector=dbd, ports=[core.ServicePortArgs(name="slurmdbd", port=6819, target_port=6819)]))
    apps.Deployment("slurmdbd", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=dbd), spec=apps.DeploymentSpecArgs(
        replicas=1, strategy=apps.DeploymentStrategyArgs(type="Recreate"), selector=meta.LabelSelectorArgs(match_labels=dbd),
        template=core.PodTemplateSpecArgs(metadata=meta.ObjectMetaArgs(labels=dbd), spec=core.PodSpecArgs(
            hostname="slurmdbd", automount_service_account_token=False, security_context=core.PodSecurityContextArgs(fs_group=401),
            init_containers=[_munged(images.slurmd), core.ContainerArgs(
                name="slurmdbd-conf", image=images.slurmdbd,
                command=["sh", "-c", "umask 077 && cp /conf-template/slurmdbd.conf /etc/slurm/slurmdbd.conf && "
                         f'printf "StoragePass=%s\\n" "$(cat /db-password/{password.key})" >> /etc/slurm/slurmdbd.conf'],
                resources=core.ResourceRequirementsArgs(requests={"cpu": "50m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "64Mi"}),
                volume_mounts=[core.VolumeMountArgs(name="conf-template", mount_path="/conf-template", read_only=True),
                               core.VolumeMountArgs(name="db-password", mount_path="/db-password", read_only=True),
                               core.VolumeMountArgs(name="conf", mount_path="/etc/slurm")],
                security_context=_locked(401))],
            containers=[core.ContainerArgs(
                name="slurmdbd", image=images.slurmdbd, command=["slurmdbd", "-D"],
                env=[core.EnvVarArgs(name="SLURM_CONF", value="/etc/slurm/slurm.conf")],
                ports=[core.ContainerPortArgs(name="slurmdbd", container_port=6819)],
                resources=core.ResourceRequirementsArgs(requests={"cpu": "250m", "memory": "512Mi"}, limits={"cpu": "1", "memory": "1Gi"}),
                startup_probe=_tcp(6819, 5, 60), liveness_probe=_tcp(6819, 20), readiness_probe=_tcp(6819, 10),
                volume_mounts=[core.VolumeMountArgs(name="conf", mount_path="/etc/slurm"),
                               core.VolumeMountArgs(name="run", mount_path="/run/slurm"),
                               core.VolumeMountArgs(name="munge-socket", mount_path="/run/munge")],
                security_context=_locked(401))],
            volumes=[core.VolumeArgs(name="conf-template", secret=core.SecretVolumeSourceArgs(secret_name=dbd_conf.metadata.name)),
                     core.VolumeArgs(name="db-password", secret=core.SecretVolumeSourceArgs(
                         secret_name=password.name, items=[core.KeyToPathArgs(key=password.key, path=password.key)])),
                     core.VolumeArgs(name="conf", empty_dir=core.EmptyDirVolumeSourceArgs(medium="Memory")),
                     core.VolumeArgs(name="run", empty_dir=core.EmptyDirVolumeSourceArgs()),
                     *_munge_volumes(munge_slurm.metadata.name)]))))

    # slurmd: one DaemonSet per Slurm pool
    servers = ",".join(f"slurmctld-{i}.slurmctld.slurm.svc.cluster.local:6817" for i in range(2))
    for pool in config.slurm_pools:
        pod = {**lbl, "app.kubernetes.io/name": "slurmd", "dualsched.io/pool": pool.name}
        gpus = {"nvidia.com/gpu": str(pool.slurm_gpu_count)}
        apps.DaemonSet(f"slurmd-{pool.name}", metadata=meta.ObjectMetaArgs(namespace=slurm, labels=pod), spec=apps.DaemonSetSpecArgs(
            selector=meta.LabelSelectorArgs(match_labels=pod), update_strategy=apps.DaemonSetUpdateStrategyArgs(type="OnDelete"),
            template=core.PodTemplateSpecArgs(metadata=meta.ObjectMetaArgs(labels=pod), spec=core.PodSpecArgs(
                host_network=True, dns_policy="ClusterFirstWithHostNet", automount_service_account_token=False,
                node_selector={"dualsched.io/pool": pool.name},
                tolerations=[core.TolerationArgs(key=t.key, operator="Equal", value=t.value, effect=t.effect.value)
                             for t in config.pool_taints(pool)],
                priority_class_name="system-node-critical", termination_grace_period_seconds=120,
                init_containers=[_munged(images.slurmd)],
                containers=[core.ContainerArgs(
                    name="slurmd", image=images.slurmd, command=["slurmd", "-D", "-N", "$(NODE_NAME)", "--conf-server", servers],
                    env=[core.EnvVarArgs(name="NODE_NAME", value_from=core.EnvVarSourceArgs(
                        field_ref=core.ObjectFieldSelectorArgs(field_path="spec.nodeName")))],
                    ports=[core.ContainerPortArgs(name="slurmd", container_port=6818)],
                    resources=core.ResourceRequirementsArgs(requests={"cpu": "1", "memory": "2Gi", **gpus},
                                                            limits={"cpu": str(pool.cpus), "memory": f"{pool.real_memory_mb}M", **gpus}),
                    startup_probe=_tcp(6818, 5, 60), liveness_probe=_tcp(6818, 30), readiness_probe=_tcp(6818, 15),
                    security_context=core.SecurityContextArgs(privileged=True),
                    volume_mounts=[core.VolumeMountArgs(name="spool", mount_path="/var/spool/slurmd"),
                                   core.VolumeMountArgs(name="run", mount_path="/run/slurm"),
                                   core.VolumeMountArgs(name="shared", mount_path="/shared"),
                                   core.VolumeMountArgs(name="munge-socket", mount_path="/run/munge")])],
                volumes=[core.VolumeArgs(name="spool", empty_dir=core.EmptyDirVolumeSourceArgs()),
                         core.VolumeArgs(name="run", empty_dir=core.EmptyDirVolumeSourceArgs()),
                         core.VolumeArgs(name="shared", persistent_volume_claim=core.PersistentVolumeClaimVolumeSourceArgs(
                             claim_name=claims["slurm"])),
                         *_munge_volumes(munge_slurm.metadata.name)]))),
            opts=pulumi.ResourceOptions(depends_on=patches[pool.name]))

    # Inference: Deployment, Service, HPA and PDB per model
    eligible = [pool.name for pool in config.inference_pools]
    eligible_patches = [patch for name in eligible for patch in patches[name]]
    for model in config.inference.models:
        pod = {**lbl, "app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": model.name}
        deployment = apps.Deployment(model.name, metadata=meta.ObjectMetaArgs(namespace=inference, labels=pod), spec=apps.DeploymentSpecArgs(
            replicas=model.replicas.min, selector=meta.LabelSelectorArgs(match_labels=pod),
            strategy=apps.DeploymentStrategyArgs(type="RollingUpdate", rolling_update=apps.RollingUpdateDeploymentArgs(max_surge=1, max_unavailable=0)),
            template=core.PodTemplateSpecArgs(metadata=meta.ObjectMetaArgs(labels=pod), spec=core.PodSpecArgs(
                automount_service_account_token=False,
                security_context=core.PodSecurityContextArgs(run_as_non_root=True, run_as_user=1000, fs_group=1000,
                                                             seccomp_profile=core.SeccompProfileArgs(type="RuntimeDefault")),
                affinity=core.AffinityArgs(node_affinity=core.NodeAffinityArgs(
                    required_during_scheduling_ignored_during_execution=core.NodeSelectorArgs(node_selector_terms=[
                        core.NodeSelectorTermArgs(match_expressions=[core.NodeSelectorRequirementArgs(
                            key="dualsched.io/pool", operator="In", values=eligible)])]))),
                containers=[core.ContainerArgs(
                    name="server", image=images.vllm,
                    command=["vllm", "serve", f"/models/{model.path}", "--served-model-name", model.name, "--tensor-parallel-size",
                             str(model.gpus), "--host", "0.0.0.0", "--port", "8000"],
                    env=[core.EnvVarArgs(name="HOME", value="/tmp"), core.EnvVarArgs(name="HF_HUB_OFFLINE", value="1")],
                    ports=[core.ContainerPortArgs(name="http", container_port=8000)],
                    resources=core.ResourceRequirementsArgs(
                        requests={"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(model.gpus)},
                        limits={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(model.gpus)}),
                    startup_probe=core.ProbeArgs(http_get=core.HTTPGetActionArgs(path="/health", port=8000), period_seconds=10, failure_threshold=90),
                    readiness_probe=core.ProbeArgs(http_get=core.HTTPGetActionArgs(path="/health", port=8000), period_seconds=10),
                    liveness_probe=core.ProbeArgs(http_get=core.HTTPGetActionArgs(path="/health", port=8000), period_seconds=20),
                    volume_mounts=[core.VolumeMountArgs(name="models", mount_path="/models", read_only=True, sub_path="models"),
                                   core.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                                   core.VolumeMountArgs(name="shm", mount_path="/dev/shm")],
                    security_context=_locked(1000))],
                volumes=[core.VolumeArgs(name="models", persistent_volume_claim=core.PersistentVolumeClaimVolumeSourceArgs(
                             claim_name=claims["inference"], read_only=True)),
                         core.VolumeArgs(name="tmp", empty_dir=core.EmptyDirVolumeSourceArgs()),
                         core.VolumeArgs(name="shm", empty_dir=core.EmptyDirVolumeSourceArgs(medium="Memory"))]))),
            opts=pulumi.ResourceOptions(depends_on=eligible_patches, ignore_changes=["spec.replicas"]))
        core.Service(model.name, metadata=meta.ObjectMetaArgs(name=model.name, namespace=inference, labels=pod), spec=core.ServiceSpecArgs(
            selector=pod, ports=[core.ServicePortArgs(name="http", port=80, target_port=8000)]))
        k8s.autoscaling.v2.HorizontalPodAutoscaler(model.name, metadata=meta.ObjectMetaArgs(namespace=inference, labels=pod),
            spec=k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
                scale_target_ref=k8s.autoscaling.v2.CrossVersionObjectReferenceArgs(api_version="apps/v1", kind="Deployment",
                                                                                    name=deployment.metadata.name),
                min_replicas=model.replicas.min, max_replicas=model.replicas.max,
                metrics=[k8s.autoscaling.v2.MetricSpecArgs(type="Resource", resource=k8s.autoscaling.v2.ResourceMetricSourceArgs(
                    name="cpu", target=k8s.autoscaling.v2.MetricTargetArgs(type="Utilization",
                                                                          average_utilization=model.target_cpu_utilization)))]))
        k8s.policy.v1.PodDisruptionBudget(model.name, metadata=meta.ObjectMetaArgs(namespace=inference, labels=pod),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(max_unavailable=1, selector=meta.LabelSelectorArgs(match_labels=pod)))

    # Job submission: the client slurm.conf next to the munge key and shared claim
    core.ConfigMap("slurm-client", metadata=meta.ObjectMetaArgs(namespace=jobs, labels=lbl), data={"slurm.conf": slurm_files["slurm.conf"]})
    pulumi.export("controller_address", "slurmctld-0.slurmctld.slurm.svc.cluster.local:6817")
    pulumi.export("secret", munge_jobs.metadata.name)
