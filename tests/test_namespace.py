"""SlurmNamespace: Pod Security labels, default-deny NetworkPolicy, Slurm's allow rules, quota."""

from __future__ import annotations

import pytest

from rendering import render_raw, render_stack, variant

PSA = "pod-security.kubernetes.io"


def _policy(rendered, part: str) -> dict:
    return rendered.one("NetworkPolicy", f"-slurm-{part}").manifest


def _ports(rules: list[dict]) -> set[tuple[int, str]]:
    return {(port["port"], port["protocol"]) for rule in rules for port in rule.get("ports", [])}


def _peer_names(rule: dict, side: str) -> list[str]:
    return [peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in rule.get(side, [])]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurm_namespace_enforces_privileged_and_warns_at_baseline(stack):
    rendered = render_stack(stack)
    namespace = rendered.named("Namespace", rendered.config.slurm.namespace).manifest
    assert namespace["metadata"]["name"] == "slurm"
    labels = namespace["metadata"]["labels"]
    assert labels[f"{PSA}/enforce"] == "privileged"
    assert labels[f"{PSA}/warn"] == "baseline"
    assert labels[f"{PSA}/audit"] == "baseline"
    assert labels["app.kubernetes.io/part-of"] == "dualsched"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_network_policy_is_in_the_slurm_namespace(stack):
    rendered = render_stack(stack)
    policies = rendered.by_kind("NetworkPolicy")
    assert policies
    assert {policy.namespace for policy in policies} == {"slurm"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_default_deny_selects_every_pod_and_allows_nothing(stack):
    spec = _policy(render_stack(stack), "default-deny")["spec"]
    assert spec["podSelector"] == {}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in spec and "egress" not in spec


def test_dns_is_allowed_for_every_pod_over_udp_and_tcp():
    spec = _policy(render_stack("dev"), "allow-dns")["spec"]
    assert spec["podSelector"] == {}
    assert spec["policyTypes"] == ["Egress"]
    assert _ports(spec["egress"]) == {(53, "UDP"), (53, "TCP")}


def test_slurmctld_accepts_6817_and_reaches_slurmd_and_slurmdbd():
    spec = _policy(render_stack("dev"), "slurmctld")["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "slurmctld"}
    # slurmd and clients come from the host network and other namespaces: any source, port 6817 only.
    [ingress] = spec["ingress"]
    assert "from" not in ingress
    assert _ports([ingress]) == {(6817, "TCP")}
    egress = {next(iter(_ports([rule]))): rule for rule in spec["egress"]}
    assert set(egress) == {(6818, "TCP"), (6819, "TCP")}
    assert _peer_names(egress[(6819, "TCP")], "to") == ["slurmdbd"]


def test_slurmdbd_accepts_6819_and_reaches_the_in_cluster_database_only():
    spec = _policy(render_stack("dev"), "slurmdbd")["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "slurmdbd"}
    assert _ports(spec["ingress"]) == {(6819, "TCP")}
    egress = {next(iter(_ports([rule]))): rule for rule in spec["egress"]}
    assert set(egress) == {(3306, "TCP"), (6817, "TCP")}
    assert _peer_names(egress[(3306, "TCP")], "to") == ["mariadb"]
    assert _peer_names(egress[(6817, "TCP")], "to") == ["slurmctld"]


def test_mariadb_accepts_3306_from_slurmdbd_only():
    spec = _policy(render_stack("dev"), "mariadb")["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "mariadb"}
    assert spec["policyTypes"] == ["Ingress"]
    [ingress] = spec["ingress"]
    assert _ports([ingress]) == {(3306, "TCP")}
    assert _peer_names(ingress, "from") == ["slurmdbd"]


def test_external_database_is_reached_on_3306_at_any_address_and_has_no_mariadb_policy():
    rendered = render_stack("prod")
    spec = _policy(rendered, "slurmdbd")["spec"]
    [mysql] = [rule for rule in spec["egress"] if _ports([rule]) == {(3306, "TCP")}]
    assert "to" not in mysql
    assert not [p for p in rendered.by_kind("NetworkPolicy") if "mariadb" in p.name]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurm_ports_are_all_opened_somewhere(stack):
    rendered = render_stack(stack)
    opened = set()
    for policy in rendered.by_kind("NetworkPolicy"):
        spec = policy.manifest["spec"]
        opened |= {port for port, _ in _ports(spec.get("ingress", []) + spec.get("egress", []))}
    assert {6817, 6818, 6819, 3306, 53} <= opened


def test_accounting_disabled_drops_the_slurmdbd_and_mariadb_rules():
    rendered = render_raw(variant("dev", lambda raw: raw["slurm"]["accounting"].update(enabled=False)))
    names = sorted(p.name.split("-slurm-", 1)[1].rsplit("-", 1)[0] for p in rendered.by_kind("NetworkPolicy"))
    assert names == ["allow-dns", "default-deny", "slurmctld"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_resource_quota_unless_configured(stack):
    assert render_stack(stack).by_kind("ResourceQuota") == []


def test_resource_quota_caps_requests_in_the_slurm_namespace():
    raw = variant("dev", lambda raw: raw["slurm"].update(resourceQuota={"cpu": "200", "memory": "1Ti"}))
    quota = render_raw(raw).one("ResourceQuota").manifest
    assert quota["metadata"]["namespace"] == "slurm"
    assert quota["spec"]["hard"] == {"requests.cpu": "200", "requests.memory": "1Ti"}


def test_custom_namespace_name_is_used_everywhere_slurm_runs():
    rendered = render_raw(variant("dev", lambda raw: raw["slurm"].update(namespace="hpc")))
    assert rendered.named("Namespace", "hpc").manifest["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for kind in ("NetworkPolicy", "StatefulSet", "DaemonSet", "ConfigMap"):
        for obj in rendered.by_kind(kind):
            if obj.namespace == "slurm-jobs":
                # The submission namespace holds its own client config and user directory.
                assert kind == "ConfigMap" and obj.manifest["metadata"]["labels"]["app.kubernetes.io/name"] in (
                    "slurm-client", "identity"), f"{kind}/{obj.name}"
                continue
            assert obj.namespace == "hpc", f"{kind}/{obj.name}"
    identity = [c for c in rendered.by_kind("ConfigMap") if c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "identity"]
    assert sorted(c.namespace for c in identity) == ["hpc", "slurm-jobs"]
    assert rendered.named("ConfigMap", "slurm-config").namespace == "hpc"
