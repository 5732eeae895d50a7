"""No pod we build holds an API token it does not need.

Every pod spec of every stack (and the sbatch Job of examples/sbatch_job.py) either sets
``automountServiceAccountToken: false`` or runs as a ServiceAccount of its own whose RBAC grants are
listed in ALLOWED below, with the reason. A new workload that mounts a token fails here until
someone writes down why it needs which rights.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import pytest

from dualsched.components.program import build
from dualsched.examples.sbatch_job import submit_training_job
from rendering import Rendered, pod_spec, render_stack, render_with_registrations

POD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod")
NAME_LABEL = "app.kubernetes.io/name"


@dataclass(frozen=True)
class Allowed:
    grants: frozenset[str]
    """'<apiGroup>/<resource>:<verb>' for rules of roles we render, 'clusterrole/<name>' for a built-in role."""
    reason: str


ALLOWED = {
    "slurm-token-minter": Allowed(
        frozenset({"authentication.k8s.io/tokenreviews:create"}),
        "asks the API server whose projected token a Job presented (TokenReview) before minting a Slurm token; "
        "TokenReviews are cluster-scoped, so a ClusterRole",
    ),
    "node-keeper": Allowed(
        frozenset({"/nodes:get", "/nodes:list", "/nodes:patch", "/nodes:keep",
                   "coordination.k8s.io/leases:get", "coordination.k8s.io/leases:patch"}),
        "keeps the pools' labels and taints on their nodes, changing only those it set; the ClusterRole names the "
        "pool nodes for the verb keep, and on any other node its admission policy lets it only remove what it "
        "recorded there (tests/test_node_keeper.py, tests/e2e/test_engine.py); it renews its own Lease (a Role, by "
        "name) and reads other keepers' Leases of that name, to leave a node another stack keeps to that stack",
    ),
}


def with_sbatch_job(config):
    cluster = build(config)
    submit_training_job(cluster, config)
    return cluster


@functools.cache
def renders() -> dict[str, Rendered]:
    return {
        "dev": render_stack("dev"),
        "prod": render_stack("prod"),
        "local": render_stack("local"),
        "dev+sbatch": render_with_registrations(render_stack("dev").config, "dev", program=with_sbatch_job),
    }


def grants(rendered: Rendered) -> dict[tuple[str, str], set[str]]:
    """(namespace, ServiceAccount) -> what its Role and ClusterRole bindings grant."""
    roles = {(o.kind, o.namespace, o.name): o.manifest for o in rendered.by_kind("Role") + rendered.by_kind("ClusterRole")}
    granted: dict[tuple[str, str], set[str]] = defaultdict(set)
    for binding in rendered.by_kind("RoleBinding") + rendered.by_kind("ClusterRoleBinding"):
        ref = binding.manifest["roleRef"]
        role = roles.get((ref["kind"], binding.namespace if ref["kind"] == "Role" else None, ref["name"]))
        what = (
            {f"{group}/{resource}:{verb}" for rule in role.get("rules", []) for group in rule["apiGroups"]
             for resource in rule["resources"] for verb in rule["verbs"]}
            if role else {f"{ref['kind'].lower()}/{ref['name']}"}
        )
        for subject in binding.manifest["subjects"]:
            if subject["kind"] == "ServiceAccount":
                granted[(subject["namespace"], subject["name"])] |= what
    return granted


def token_holders(rendered: Rendered) -> list[tuple[str, str, dict]]:
    """(component, namespace, pod spec) of every pod spec that does not refuse the token."""
    holders = []
    for obj in [o for kind in POD_KINDS for o in rendered.by_kind(kind)]:
        spec = obj.manifest["spec"] if obj.kind == "Pod" else pod_spec(obj)
        if spec.get("automountServiceAccountToken") is not False:
            holders.append((obj.manifest["metadata"]["labels"][NAME_LABEL], obj.namespace, spec))
    return holders


@pytest.mark.parametrize("name", ["dev", "prod", "local", "dev+sbatch"])
def test_every_pod_refuses_the_token_or_runs_as_an_allowed_account_of_its_own(name):
    rendered = renders()[name]
    accounts = {(o.namespace, o.name) for o in rendered.by_kind("ServiceAccount")}
    granted = grants(rendered)
    users: dict[tuple[str, str], set[str]] = defaultdict(set)
    for component, namespace, spec in token_holders(rendered):
        account = (namespace, spec.get("serviceAccountName", "default"))
        assert component in ALLOWED, f"{component} mounts an API token: set automountServiceAccountToken false, or allow it here"
        assert account in accounts, f"{component} runs as {account}, which the stack does not create"
        assert granted[account] == ALLOWED[component].grants, component
        users[account].add(component)
    # dedicated: no two workloads share an account that holds rights
    assert all(len(components) == 1 for components in users.values()), users


def test_the_allow_list_names_only_workloads_that_exist():
    holders = {component for rendered in renders().values() for component, _, _ in token_holders(rendered)}
    assert set(ALLOWED) == holders
