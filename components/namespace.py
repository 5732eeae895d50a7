"""The Slurm namespace: Pod Security labels, default-deny network policy and Slurm's allow rules."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components.common import child, labels, meta, resource_list, stateful
from config.models import DatabaseMode, Slurm

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
MYSQL_PORT = 3306
DNS_PORT = 53


def pod_security_labels(enforce: str, warn: str) -> dict[str, str]:
    return {
        "pod-security.kubernetes.io/enforce": enforce,
        "pod-security.kubernetes.io/audit": warn,
        "pod-security.kubernetes.io/warn": warn,
    }


def _peer(component: str) -> k8s.networking.v1.NetworkPolicyPeerArgs:
    return k8s.networking.v1.NetworkPolicyPeerArgs(
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={"app.kubernetes.io/name": component})
    )


def _ports(*numbers: int, protocol: str = "TCP") -> list[k8s.networking.v1.NetworkPolicyPortArgs]:
    return [k8s.networking.v1.NetworkPolicyPortArgs(port=number, protocol=protocol) for number in numbers]


@dataclass(frozen=True)
class SlurmNamespaceArgs:
    """``protect``: deleting the namespace would delete its claims, so prod protects and keeps it."""

    slurm: Slurm
    protect: bool = False


class SlurmNamespace(pulumi.ComponentResource):
    """Namespace for slurmctld, slurmd, slurmdbd and the accounting database.

    Enforces ``privileged`` because slurmd runs here (it manages job cgroups and GPUs);
    audits and warns at ``baseline`` so anything else privileged stands out.
    """

    name: pulumi.Output[str]

    def __init__(self, name: str, args: SlurmNamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:namespace:SlurmNamespace", name, None, opts)
        slurm = args.slurm
        namespace = k8s.core.v1.Namespace(
            name,
            metadata=meta(
                name=slurm.namespace,
                labels={**labels("slurm", slurm.cluster_name), **pod_security_labels("privileged", "baseline")},
            ),
            opts=stateful(self, protect=True) if args.protect else child(self),
        )
        self.name = namespace.metadata.name
        for policy_name, spec in self._policies(slurm).items():
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{policy_name}",
                metadata=meta(namespace=self.name, labels=labels("slurm", slurm.cluster_name)),
                spec=spec,
                opts=child(self),
            )
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

    @staticmethod
    def _policies(slurm: Slurm) -> dict[str, k8s.networking.v1.NetworkPolicySpecArgs]:
        anywhere = None  # an absent peer list matches every source or destination
        policies = {
            "default-deny": k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(), policy_types=["Ingress", "Egress"]
            ),
            "allow-dns": k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(),
                policy_types=["Egress"],
                egress=[k8s.networking.v1.NetworkPolicyEgressRuleArgs(ports=[*_ports(DNS_PORT, protocol="UDP"), *_ports(DNS_PORT)])],
            ),
            # slurmd and submitting clients reach slurmctld from the host network and
            # other namespaces, which pod selectors cannot name: open the port, not the pod.
            "slurmctld": k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=_peer("slurmctld").pod_selector,
                policy_types=["Ingress", "Egress"],
                ingress=[k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=anywhere, ports=_ports(SLURMCTLD_PORT))],
                egress=[
                    k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=anywhere, ports=_ports(SLURMD_PORT)),
                    k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=[_peer("slurmdbd")], ports=_ports(SLURMDBD_PORT)),
                ],
            ),
        }
        if slurm.accounting.enabled:
            in_cluster = slurm.accounting.database is not None and slurm.accounting.database.mode is DatabaseMode.IN_CLUSTER
            policies["slurmdbd"] = k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=_peer("slurmdbd").pod_selector,
                policy_types=["Ingress", "Egress"],
                # slurmctld registers here; sacct/sacctmgr on nodes and in jobs query it.
                ingress=[k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=anywhere, ports=_ports(SLURMDBD_PORT))],
                egress=[
                    k8s.networking.v1.NetworkPolicyEgressRuleArgs(
                        to=[_peer("mariadb")] if in_cluster else anywhere, ports=_ports(MYSQL_PORT)
                    ),
                    k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=[_peer("slurmctld")], ports=_ports(SLURMCTLD_PORT)),
                ],
            )
            if in_cluster:
                policies["mariadb"] = k8s.networking.v1.NetworkPolicySpecArgs(
                    pod_selector=_peer("mariadb").pod_selector,
                    policy_types=["Ingress"],
                    ingress=[k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[_peer("slurmdbd")], ports=_ports(MYSQL_PORT))],
                )
        return policies
