"""SlurmNamespace (Pod Security labels, quota) and every namespace's NetworkPolicies."""

from __future__ import annotations

import pytest

from rendering import render_raw, render_stack, variant

PSA = "pod-security.kubernetes.io"


SLURM_NS, JOBS_NS, INFERENCE_NS = "slurm", "slurm-jobs", "inference"


def policies(rendered, namespace: str) -> dict[str, dict]:
    """The namespace's NetworkPolicy specs by their key (``dualsched-<component>-<key>-<suffix>``)."""
    return {
        p.name.split("-", 2)[2].rsplit("-", 1)[0]: p.manifest["spec"]
        for p in rendered.by_kind("NetworkPolicy")
        if p.namespace == namespace
    }


def _ports(rules: list[dict]) -> set[tuple[int, str]]:
    return {(port["port"], port["protocol"]) for rule in rules for port in rule.get("ports", [])}


def peer(p: dict) -> str:
    """One peer as a short string: 'pods:slurmctld', 'ns:slurm-jobs', 'ns:slurm/pods:slurmrestd', 'ip:10.0.0.0/24'."""
    parts = []
    if "ipBlock" in p:
        parts.append(f"ip:{p['ipBlock']['cidr']}")
    if "namespaceSelector" in p:
        parts.append(f"ns:{p['namespaceSelector']['matchLabels']['kubernetes.io/metadata.name']}")
    if "podSelector" in p:
        parts.append(f"pods:{p['podSelector']['matchLabels']['app.kubernetes.io/name']}")
    return "/".join(parts)


def rules(spec: dict, direction: str) -> dict[int, set[str]]:
    """port -> peers allowed on it ('*' for any peer), for ``ingress`` or ``egress``."""
    side = "from" if direction == "ingress" else "to"
    allowed: dict[int, set[str]] = {}
    for rule in spec.get(direction, []):
        for port, _ in _ports([rule]):
            allowed.setdefault(port, set()).update({peer(p) for p in rule[side]} if side in rule else {"*"})
    return allowed


@pytest.mark.parametrize("stack", ["dev", "prod", "local"])
def test_every_namespace_we_create_denies_everything_but_dns_by_default(stack):
    rendered = render_stack(stack)
    created = {ns.name for ns in rendered.by_kind("Namespace")}
    assert created == {SLURM_NS, JOBS_NS, INFERENCE_NS}
    for namespace in created:
        specs = policies(rendered, namespace)
        assert specs["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}, namespace
        dns = specs["allow-dns"]
        assert dns["podSelector"] == {} and dns["policyTypes"] == ["Egress"]
        assert _ports(dns["egress"]) == {(53, "UDP"), (53, "TCP")} and "to" not in dns["egress"][0]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_policy_admits_any_source_or_opens_every_port(stack):
    # the only rules without peers are DNS and the external database (whose address is not in the config)
    rendered = render_stack(stack)
    for policy in rendered.by_kind("NetworkPolicy"):
        spec = policy.manifest["spec"]
        for rule in spec.get("ingress", []):
            assert rule.get("from") and rule.get("ports"), policy.name
        for rule in spec.get("egress", []):
            assert rule.get("ports"), policy.name
            assert rule.get("to") or _ports([rule]) <= {(53, "UDP"), (53, "TCP"), (3306, "TCP")}, policy.name


def test_slurmctld_accepts_submitters_slurmdbd_its_backup_the_slurmd_rollout_and_the_nodes_only():
    spec = policies(render_stack("dev"), SLURM_NS)["slurmctld"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "slurmctld"}
    # submitters: slurmrestd, sbatch in the submission namespace's Jobs (with a token, no munge), the login pods
    assert rules(spec, "ingress") == {
        6817: {"pods:slurmrestd", "ns:slurm-jobs", "pods:login", "pods:slurmdbd", "pods:slurmctld", "pods:slurmd-rollout",
               "ip:10.0.0.0/24"}
    }
    # slurmd (6818) on the host network of the nodes, the backup controller, slurmdbd
    assert rules(spec, "egress") == {6818: {"ip:10.0.0.0/24"}, 6817: {"pods:slurmctld"}, 6819: {"pods:slurmdbd"}}


def test_slurmdbd_accepts_slurmctld_the_nodes_and_the_login_pods_only():
    spec = policies(render_stack("dev"), SLURM_NS)["slurmdbd"]
    assert rules(spec, "ingress") == {6819: {"pods:slurmctld", "ip:10.0.0.0/24", "pods:login"}}
    assert rules(spec, "egress") == {3306: {"pods:mariadb"}, 6817: {"pods:slurmctld"}}


def test_mariadb_accepts_3306_from_slurmdbd_only():
    spec = policies(render_stack("dev"), SLURM_NS)["mariadb"]
    assert spec["policyTypes"] == ["Ingress"]
    assert rules(spec, "ingress") == {3306: {"pods:slurmdbd"}}


def test_slurmrestd_accepts_the_submission_and_slurm_namespaces_and_calls_slurmctld_only():
    spec = policies(render_stack("dev"), SLURM_NS)["slurmrestd"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "slurmrestd"}
    assert rules(spec, "ingress") == {6820: {"ns:slurm-jobs", "ns:slurm"}}
    assert rules(spec, "egress") == {6817: {"pods:slurmctld"}}


def test_the_token_minter_accepts_the_submission_namespace_and_calls_the_api_server_only():
    prod = policies(render_stack("prod"), SLURM_NS)["slurm-token-minter"]
    assert rules(prod, "ingress") == {8080: {"ns:slurm-jobs"}}
    assert rules(prod, "egress") == {443: {"ip:10.9.0.0/28"}, 6443: {"ip:10.9.0.0/28"}}
    # without apiServerCidrs the API server is looked for on the nodes (control-plane nodes)
    dev = policies(render_stack("dev"), SLURM_NS)["slurm-token-minter"]
    assert rules(dev, "egress") == {443: {"ip:10.0.0.0/24"}, 6443: {"ip:10.0.0.0/24"}}
    # the endpoint's port, wherever the API server listens
    moved = render_raw(variant("dev", lambda raw: raw["network"].update(apiServerPorts=[8443])))
    assert rules(policies(moved, SLURM_NS)["slurm-token-minter"], "egress") == {8443: {"ip:10.0.0.0/24"}}


@pytest.mark.parametrize("stack, api_server", [("dev", "ip:10.0.0.0/24"), ("prod", "ip:10.9.0.0/28")])
def test_the_node_keeper_calls_the_api_server_only_and_nobody_calls_it(stack, api_server):
    spec = policies(render_stack(stack), SLURM_NS)["node-keeper"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "node-keeper"}
    assert spec["policyTypes"] == ["Egress"] and "ingress" not in spec
    assert rules(spec, "egress") == {443: {api_server}, 6443: {api_server}}
    # the same rule as the minter's, wherever the API server listens
    moved = render_raw(variant(stack, lambda raw: raw["network"].update(apiServerPorts=[8443])))
    assert rules(policies(moved, SLURM_NS)["node-keeper"], "egress") == {8443: {api_server}}


def test_jobs_call_slurmctld_slurmrestd_and_the_minter_and_nothing_calls_them():
    specs = policies(render_stack("dev"), JOBS_NS)
    assert set(specs) == {"default-deny", "allow-dns", "slurm-services"}
    services = specs["slurm-services"]
    assert services["podSelector"] == {} and services["policyTypes"] == ["Egress"]
    # namespace and pods in one peer: only those pods of the Slurm namespace
    assert rules(services, "egress") == {6817: {"ns:slurm/pods:slurmctld"}, 6820: {"ns:slurm/pods:slurmrestd"},
                                         8080: {"ns:slurm/pods:slurm-token-minter"}}
    assert not any(spec.get("ingress") for spec in specs.values())


def test_model_servers_accept_their_port_from_the_client_namespaces_and_call_nothing():
    specs = policies(render_stack("dev"), INFERENCE_NS)
    assert set(specs) == {"default-deny", "allow-dns", "model-servers"}
    servers = specs["model-servers"]
    assert servers["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}
    assert servers["policyTypes"] == ["Ingress"]
    assert rules(servers, "ingress") == {8000: {"ns:inference", "ns:ingress-nginx"}}
    custom = render_raw(variant("dev", lambda raw: raw["inference"].update(clientNamespaces=["gateway", "inference"])))
    assert rules(policies(custom, INFERENCE_NS)["model-servers"], "ingress") == {8000: {"ns:inference", "ns:gateway"}}


def test_the_external_database_is_reached_on_3306_at_any_address_and_has_no_mariadb_policy():
    specs = policies(render_stack("prod"), SLURM_NS)
    assert rules(specs["slurmdbd"], "egress")[3306] == {"*"}
    assert "mariadb" not in specs


def test_node_cidrs_are_every_block_the_nodes_get():
    raw = variant("dev", lambda raw: raw["network"].update(nodeCidrs=["10.0.0.0/24", "fd00:1::/64"]))
    spec = policies(render_raw(raw), SLURM_NS)["slurmctld"]
    assert rules(spec, "egress")[6818] == {"ip:10.0.0.0/24", "ip:fd00:1::/64"}


def test_accounting_disabled_drops_the_slurmdbd_and_mariadb_rules():
    rendered = render_raw(variant("dev", lambda raw: raw["slurm"]["accounting"].update(enabled=False)))
    specs = policies(rendered, SLURM_NS)
    assert set(specs) == {"allow-dns", "default-deny", "slurmctld", "slurmrestd", "slurm-token-minter", "node-keeper", "login",
                          "slurmd-rollout"}
    assert rules(specs["slurmctld"], "ingress") == {
        6817: {"pods:slurmrestd", "ns:slurm-jobs", "pods:login", "pods:slurmctld", "pods:slurmd-rollout", "ip:10.0.0.0/24"}
    }
    assert rules(specs["login"], "egress") == {6817: {"pods:slurmctld"}}


def test_submission_disabled_drops_its_namespace_and_the_slurm_services_rules():
    rendered = render_raw(variant("dev", lambda raw: raw["submission"].update(enabled=False)))
    assert not policies(rendered, JOBS_NS)
    specs = policies(rendered, SLURM_NS)
    assert "slurmrestd" not in specs and "slurm-token-minter" not in specs
    assert not {"pods:slurmrestd", "ns:slurm-jobs"} & rules(specs["slurmctld"], "ingress")[6817]


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
            if obj.namespace in ("slurm-jobs", "inference"):
                # The other namespaces hold their own policies, and the submission namespace its own
                # client config and user directory.
                assert kind == "NetworkPolicy" or obj.manifest["metadata"]["labels"]["app.kubernetes.io/name"] in (
                    "slurm-client", "identity"), f"{kind}/{obj.name}"
                continue
            assert obj.namespace == "hpc", f"{kind}/{obj.name}"
    identity = [c for c in rendered.by_kind("ConfigMap") if c.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "identity"]
    assert sorted(c.namespace for c in identity) == ["hpc", "slurm-jobs"]
    assert rendered.named("ConfigMap", "slurm-config").namespace == "hpc"
    # the other namespaces' policies name it too
    assert rules(policies(rendered, JOBS_NS)["slurm-services"], "egress")[6820] == {"ns:hpc/pods:slurmrestd"}
    assert rules(policies(rendered, "hpc")["slurmrestd"], "ingress")[6820] == {"ns:slurm-jobs", "ns:hpc"}
