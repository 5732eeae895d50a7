"""The Slurm namespace, and the NetworkPolicies of every namespace the stack creates.

Each namespace denies all traffic except DNS, then allows what its pods need, named as narrowly as
the peers allow: pods by their ``app.kubernetes.io/name``, other namespaces by
``kubernetes.io/metadata.name``, and the nodes (slurmd runs on the host network) and the API server
by address (``network.nodeCidrs``, ``network.apiServerCidrs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import child, labels, meta, resource_list, stateful
from dualsched.components.login import LOGIN, SSHD_PORT
from dualsched.components.node_keeper import KEEPER
from dualsched.components.slurmrestd import RESTD, RESTD_PORT
from dualsched.components.tokens import MINTER, MINTER_PORT
from dualsched.config.models import DatabaseMode, Inference, Network, StackConfig

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
MYSQL_PORT = 3306
METRICS_PORT = 9341
"""The Slurm exporter's (components/metrics.py): the port Prometheus' list of default exporter ports gives a Slurm exporter."""
DNS_PORT = 53
ROLLOUT = "slurmd-rollout"
"""The slurmd rollout controller's pods. Named here: components/slurmd_rollout.py imports this module (through the controller)."""
NAME_LABEL = "app.kubernetes.io/name"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (immutable since 1.22): the one way to select a namespace by name."""

Spec = k8s.networking.v1.NetworkPolicySpecArgs
Peer = k8s.networking.v1.NetworkPolicyPeerArgs


def pod_security_labels(enforce: str, warn: str) -> dict[str, str]:
    return {
        "pod-security.kubernetes.io/enforce": enforce,
        "pod-security.kubernetes.io/audit": warn,
        "pod-security.kubernetes.io/warn": warn,
    }


def _pods(component: str) -> Peer:
    """Pods of the policy's own namespace with this name label."""
    return Peer(pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={NAME_LABEL: component}))


def _namespace(name: str) -> Peer:
    """Every pod of the namespace called ``name``."""
    return Peer(namespace_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={NAMESPACE_LABEL: name}))


def _addresses(cidrs: tuple[str, ...]) -> list[Peer]:
    return [Peer(ip_block=k8s.networking.v1.IPBlockArgs(cidr=cidr)) for cidr in cidrs]


def _ports(*numbers: int, protocol: str = "TCP") -> list[k8s.networking.v1.NetworkPolicyPortArgs]:
    return [k8s.networking.v1.NetworkPolicyPortArgs(port=number, protocol=protocol) for number in numbers]


def _allow(
    component: str, ingress: Optional[tuple[list[Peer], int]] = None, egress: Sequence[tuple[Optional[list[Peer]], int]] = ()
) -> Spec:
    """Allow ``component``'s pods ingress on one port from ``ingress``'s peers, and egress to each
    (peers, port); peers None means any address."""
    return Spec(
        pod_selector=_pods(component).pod_selector,
        policy_types=[*(["Ingress"] if ingress else []), *(["Egress"] if egress else [])],
        ingress=[k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=ingress[0], ports=_ports(ingress[1]))] if ingress else None,
        egress=[k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=peers, ports=_ports(port)) for peers, port in egress] or None,
    )


def _api_server(config: StackConfig) -> list[tuple[list[Peer], int]]:
    """Egress to the API server. Policies see the endpoint's address and port, after the `kubernetes`
    Service's are translated. An inference-only stack may name no addresses (no ``network``): there, any
    address on the default ports (its node keeper is the only caller)."""
    if config.network is None:
        return [(None, port) for port in Network.model_fields["api_server_ports"].default]
    return [(_addresses(config.network.api_server), port) for port in config.network.api_server_ports]


def baseline_policies() -> dict[str, Spec]:
    """Every namespace we create: nothing in or out but DNS. The cluster's resolver may be a pod
    (kube-dns) or a node-local address, so DNS is allowed by port to any destination."""
    every_pod = k8s.meta.v1.LabelSelectorArgs()
    return {
        "default-deny": Spec(pod_selector=every_pod, policy_types=["Ingress", "Egress"]),
        "allow-dns": Spec(
            pod_selector=every_pod,
            policy_types=["Egress"],
            egress=[k8s.networking.v1.NetworkPolicyEgressRuleArgs(ports=[*_ports(DNS_PORT, protocol="UDP"), *_ports(DNS_PORT)])],
        ),
    }


def node_keeper_policies(config: StackConfig) -> dict[str, Spec]:
    """The node keeper GETs and PATCHes nodes; nobody calls it (the kubelet's probes come from the node itself)."""
    return {KEEPER: _allow(KEEPER, egress=_api_server(config))}


def slurm_policies(config: StackConfig) -> dict[str, Spec]:
    """slurmctld (and its metrics exporter), slurmdbd, MariaDB, the node keeper, the slurmd rollout, (with
    submission) slurmrestd and the token minter, and (with login) the login pods.

    slurmd is not among them: it runs on the host network, where no NetworkPolicy applies. Its
    connections reach the pods below from node addresses, hence the ``nodeCidrs`` blocks."""
    slurm, nodes = config.slurm, _addresses(config.network.node_cidrs)
    accounting = slurm.accounting.enabled
    in_cluster_db = accounting and slurm.accounting.database is not None and slurm.accounting.database.mode is DatabaseMode.IN_CLUSTER
    submission = config.submission.enabled
    # slurmd and client commands on the nodes; the backup controller; the slurmd rollout; slurmdbd's updates; slurmrestd's
    # calls; and sbatch in the submission namespace's Jobs (authenticated by their tokens)
    submitters = [_pods(RESTD), _namespace(config.submission.namespace)] if submission else []
    login = slurm.login.enabled
    logins = [_pods(LOGIN)] if login else []
    controller_clients = [*nodes, _pods("slurmctld"), _pods(ROLLOUT), *([_pods("slurmdbd")] if accounting else []), *submitters, *logins]
    policies = {
        **baseline_policies(),
        "slurmctld": _allow(
            "slurmctld",
            ingress=(controller_clients, SLURMCTLD_PORT),
            egress=[
                (nodes, SLURMD_PORT),
                ([_pods("slurmctld")], SLURMCTLD_PORT),
                *([([_pods("slurmdbd")], SLURMDBD_PORT)] if accounting else []),
                # its cordon watcher GETs the pool nodes (docs/health.md)
                *(_api_server(config) if slurm.health_check.drain_cordoned else []),
            ],
        ),
        **node_keeper_policies(config),
        # it lists slurmd pods and deletes them, and drains and resumes their nodes in slurmctld
        ROLLOUT: _allow(ROLLOUT, egress=[*_api_server(config), ([_pods("slurmctld")], SLURMCTLD_PORT)]),
    }
    if slurm.metrics.enabled:
        # Prometheus, from the namespaces the config names, scrapes the exporter beside slurmctld
        policies["slurm-metrics"] = _allow("slurmctld", ingress=([_namespace(name) for name in slurm.metrics.scrape_namespaces], METRICS_PORT))
    if accounting:
        policies["slurmdbd"] = _allow(
            "slurmdbd",
            # slurmctld registers and sends job records; sacct and sacctmgr on the nodes and login pods query it
            ingress=([_pods("slurmctld"), *nodes, *logins], SLURMDBD_PORT),
            # an external database's address is not in the config: any address, port 3306 only
            egress=[([_pods("mariadb")] if in_cluster_db else None, MYSQL_PORT), ([_pods("slurmctld")], SLURMCTLD_PORT)],
        )
    if in_cluster_db:
        policies["mariadb"] = _allow("mariadb", ingress=([_pods("slurmdbd")], MYSQL_PORT))
    if login:
        # users' ssh from clientCidrs; their client commands call slurmctld (and slurmdbd: sacct). srun and
        # salloc would need slurmd to call back, which nothing allows: batch jobs only.
        policies[LOGIN] = _allow(
            LOGIN,
            ingress=(_addresses(slurm.login.client_cidrs), SSHD_PORT),
            egress=[([_pods("slurmctld")], SLURMCTLD_PORT), *([([_pods("slurmdbd")], SLURMDBD_PORT)] if accounting else [])],
        )
    if submission:
        jobs = _namespace(config.submission.namespace)
        policies[RESTD] = _allow(
            RESTD,
            ingress=([jobs, _namespace(slurm.namespace)], RESTD_PORT),
            egress=[([_pods("slurmctld")], SLURMCTLD_PORT)],
        )
        policies[MINTER] = _allow(
            MINTER,
            ingress=([jobs], MINTER_PORT),
            egress=_api_server(config),
        )
    return policies


def submission_policies(config: StackConfig) -> dict[str, Spec]:
    """Jobs call slurmctld (sbatch with a token), slurmrestd and the token minter in the Slurm
    namespace, nothing else; nobody calls them."""
    slurm = _namespace(config.slurm.namespace)

    def service(component: str, port: int) -> k8s.networking.v1.NetworkPolicyEgressRuleArgs:
        # namespace and pod selector in one peer: those pods of that namespace only
        peer = Peer(namespace_selector=slurm.namespace_selector, pod_selector=_pods(component).pod_selector)
        return k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=[peer], ports=_ports(port))

    return {
        **baseline_policies(),
        "slurm-services": Spec(
            pod_selector=k8s.meta.v1.LabelSelectorArgs(),
            policy_types=["Egress"],
            egress=[service("slurmctld", SLURMCTLD_PORT), service(RESTD, RESTD_PORT), service(MINTER, MINTER_PORT)],
        ),
    }


def inference_policies(inference: Inference, server_port: int) -> dict[str, Spec]:
    """Clients (the namespace itself and ``inference.clientNamespaces``) reach the model servers'
    port; the servers call nothing: models come from a volume, never from the network."""
    clients = [_namespace(name) for name in dict.fromkeys((inference.namespace, *inference.client_namespaces))]
    return {
        **baseline_policies(),
        "model-servers": _allow(inference.server.value, ingress=(clients, server_port)),
    }


def network_policies(parent: pulumi.Resource, name: str, namespace: pulumi.Input[str], policy_labels: dict[str, str], specs: dict[str, Spec]) -> None:
    """One NetworkPolicy per spec in ``namespace``, children of ``parent`` named ``<name>-<key>``."""
    for key, spec in specs.items():
        k8s.networking.v1.NetworkPolicy(
            f"{name}-{key}", metadata=meta(namespace=namespace, labels=policy_labels), spec=spec, opts=child(parent)
        )


@dataclass(frozen=True)
class SlurmNamespaceArgs:
    """Deleting a namespace deletes every claim in it, so the namespace is kept on delete like the
    controller state and database claims it holds; ``protect`` (prod) also refuses its deletion."""

    config: StackConfig
    protect: bool = False


class SlurmNamespace(pulumi.ComponentResource):
    """Namespace for slurmctld, slurmd, slurmdbd, the accounting database, slurmrestd, the token minter
    and the node keeper.

    Enforces ``privileged`` because slurmd runs here (it manages job cgroups and GPUs);
    audits and warns at ``baseline`` so anything else privileged stands out.
    """

    name: pulumi.Output[str]

    def __init__(self, name: str, args: SlurmNamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:namespace:SlurmNamespace", name, None, opts)
        slurm = args.config.slurm
        namespace_labels = labels("slurm", slurm.cluster_name)
        namespace = k8s.core.v1.Namespace(
            name,
            metadata=meta(name=slurm.namespace, labels={**namespace_labels, **pod_security_labels("privileged", "baseline")}),
            opts=stateful(self, args.protect),
        )
        self.name = namespace.metadata.name
        network_policies(self, name, self.name, namespace_labels, slurm_policies(args.config))
        if slurm.resource_quota is not None:
            k8s.core.v1.ResourceQuota(
                f"{name}-quota",
                metadata=meta(namespace=self.name),
                spec=k8s.core.v1.ResourceQuotaSpecArgs(
                    hard={f"requests.{kind}": value for kind, value in resource_list(slurm.resource_quota).items()}
                ),
                opts=child(self),
            )
        self.register_outputs({"name": self.name})
