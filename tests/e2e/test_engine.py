"""`pulumi preview/up/destroy` of the dev stack on a real API server with KWOK nodes.

One stack goes through a life in this order (module-scoped fixtures, tests in file order):
preview + up of dev -> placement, storage, Pod Security, no-op preview, no secrets in the export
-> a new partition (configuration only) -> a variant with a Slurm-dedicated pool on two more GPU
nodes -> that pool dropped again (its nodes released: the keeper's labels, taints and slurmd gone) -> destroy, refused until the ClusterName lock is unprotected on purpose, then done (what is
retained stays: the Slurm namespace with the controller state and database claims, the shared PVs,
the node labels). Before the destroy, a second stack whose pool names a node dev keeps leaves it to dev (dev's keeper
renews its Lease), and is destroyed. A third, small stack with ``protect: true`` takes dev's nodes (dev's Lease went
with it) and must refuse to be destroyed. KWOK runs
no container: the node keeper's program runs on the host instead (tools/host_keeper.py) and writes the pools'
labels and taints, which slurmd's nodeSelector and the model servers' affinity need. The world (cluster,
project copy, backend) comes from conftest.py.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from pulumi import automation as auto

from dualsched.components.node_keeper import KEEP_VERB, KEEPER, STATE_FILE
from dualsched.components.slurm_config import CLUSTER_NAME_LOCK
from dualsched.config import StackConfig, parse_stack_config
from dualsched.config.models import path_under

from e2e_support import TIMINGS, Steps, World, b64, raw_config

pytestmark = pytest.mark.e2e

EXTRA_NODES = ["gpu-003", "gpu-004"]  # tools/kwok/e2e-extra-nodes.yaml


@dataclass
class Deployed:
    stack: Any
    raw: dict[str, Any]
    preview: Any
    preview_steps: Steps
    up: Any

    @property
    def config(self) -> StackConfig:
        return parse_stack_config(self.raw, "e2e dev")


def timed(name: str, fn, *args, **kwargs):
    start = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMINGS.append((name, time.monotonic() - start))


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod.get("status", {}).get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def pods(world: World, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
    return world.kget(*args)["items"]


def nodes(world: World) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in world.kget("nodes")["items"]}


def slurmd_nodes(world: World, config: StackConfig, pool: str) -> list[str]:
    """The nodes running the pool's slurmd, once every node of the pool has a ready one: the DaemonSet
    selects on labels that the keeper writes (up waits for the keeper's readiness, which KWOK fakes)."""
    selector = f"app.kubernetes.io/name=slurmd,{config.placement.pool_label}={pool}"
    [wanted] = [len(p.node_names) for p in config.pools if p.name == pool]
    deadline = time.monotonic() + 60
    found = pods(world, config.slurm.namespace, selector)
    while (len(found) < wanted or not all(ready(p) for p in found)) and time.monotonic() < deadline:
        time.sleep(2)
        found = pods(world, config.slurm.namespace, selector)
    assert all(ready(p) for p in found), [(p["metadata"]["name"], p["status"]) for p in found if not ready(p)]
    return sorted(p["spec"]["nodeName"] for p in found)


def inference_nodes(world: World, config: StackConfig) -> list[str]:
    found = pods(world, config.inference.namespace)
    assert found and all(ready(p) for p in found)
    return [p["spec"]["nodeName"] for p in found]


def op_names(summary) -> set[str]:
    return {str(getattr(op, "value", op)) for op, count in (summary or {}).items() if count}


@pytest.fixture(scope="module")
def dev(world: World) -> Deployed:
    raw = raw_config("dev")
    stack = world.stack("dev", raw)
    steps = Steps()
    preview = timed("preview (dev, empty stack)", stack.preview, on_event=steps, color="never")
    up = timed("up (dev, create)", stack.up, color="never")
    return Deployed(stack, raw, preview, steps, up)


# ------------------------------------------------------------------ 0. bad config


def test_bad_config_is_a_clear_message_and_registers_nothing(world: World):
    """Under the real engine, a config mistake stops the program before any resource exists."""
    raw = raw_config("dev")
    raw["pools"][0]["gpusPerNod"] = 8  # misspelt
    raw["slurm"]["namespace"] = "Slurm_NS"  # not DNS-1123
    stack = world.stack("bad", raw)
    with pytest.raises(auto.CommandError) as failed:
        stack.up(color="never")
    output = str(failed.value)
    assert "invalid dualsched config in stack 'bad'" in output
    assert "pools[0].gpusPerNod: unknown key; did you mean 'gpusPerNode'? (got 8)" in output
    assert "slurm.namespace: must be a DNS-1123 label" in output
    assert "Traceback" not in output
    resources = stack.export_stack().deployment.get("resources") or []
    assert [r["type"] for r in resources if r["type"] != "pulumi:pulumi:Stack"] == []
    stack.workspace.remove_stack("bad", force=True)


# ------------------------------------------------------------------ 1. preview + up


def test_preview_lists_the_expected_creates(dev: Deployed):
    """Every resource is a create, and per type exactly what the offline render registers."""
    from dualsched.components.render import render_config

    render = render_config(dev.config, stack="dev")
    steps = dev.preview_steps.steps
    # Kubernetes objects and components: per type, the same as the render
    expected = Counter(r.type for r in render.registrations if not r.type.startswith(("pulumi:", "random:")))
    assert Counter(m.type for m in steps if not m.type.startswith(("pulumi:", "random:"))) == expected
    # the generated secrets (the render records their values: munge and JWT keys and the login host key's
    # seed base64 + hex, DB password), the ClusterName lock and the random part of the shared claims' names
    assert Counter(m.type for m in steps if m.type.startswith("random:")) == {
        "random:index/randomBytes:RandomBytes": 3, "random:index/randomPassword:RandomPassword": 1,
        "random:index/randomId:RandomId": 1, "random:index/randomString:RandomString": 1}
    assert len(render.generated_secrets) == 7
    assert {str(getattr(m.op, "value", m.op)) for m in dev.preview_steps.steps} == {"create"}
    resources = [m for m in steps if not m.type.startswith("pulumi:providers:")]  # providers are not counted
    assert dict(dev.preview.change_summary) == {"create": len(resources)}
    # with the token minter, slurmrestd, the node keeper (its Lease too), the slurmd rollout controller, the login
    # pods, the pool's TaskProlog and every namespace's NetworkPolicies; no munge key or claim for Jobs; no object
    # per node: the keeper labels the nodes (bounded by its admission policy and binding)
    assert sum(1 for obj in render.objects) == 74


def test_up_succeeds(dev: Deployed):
    assert dev.up.summary.result == "succeeded"
    assert op_names(dev.up.summary.resource_changes) == {"create"}
    assert dev.up.outputs["namespaces"].value == {"slurm": "slurm", "inference": "inference", "jobs": "slurm-jobs"}


# ------------------------------------------------------------------ 2. placement, storage, nodes


def test_slurmd_runs_once_on_each_node_of_the_slurm_pools(world: World, dev: Deployed):
    config = dev.config
    for pool in config.pools:
        if pool.runs_slurmd:
            assert slurmd_nodes(world, config, pool.name) == sorted(pool.node_names)
    every = [p["spec"]["nodeName"] for p in pods(world, config.slurm.namespace, "app.kubernetes.io/name=slurmd")]
    assert len(every) == len(set(every)), f"more than one slurmd on a node: {sorted(every)}"


def test_controller_pod_is_ready(world: World, dev: Deployed):
    pod = world.kget("pod", "slurmctld-0", "-n", dev.config.slurm.namespace)
    assert ready(pod)
    statuses = pod["status"]["containerStatuses"] + pod["status"].get("initContainerStatuses", [])
    # munged: native sidecar; reconfigure: applies slurm.conf changes without a restart; state-owner and
    # wait-for-accounting: init containers that have run to completion (ready, as a kubelet reports it)
    assert {s["name"]: s["ready"] for s in statuses} == {
        "slurmctld": True, "munged": True, "reconfigure": True, "state-owner": True, "wait-for-accounting": True
    }
    waited = next(s for s in pod["status"]["initContainerStatuses"] if s["name"] == "wait-for-accounting")
    assert waited["state"]["terminated"]["exitCode"] == 0


def test_claims_are_bound_to_their_volumes(world: World, dev: Deployed):
    config = dev.config
    claims = [c for ns in (config.slurm.namespace, config.inference.namespace, config.submission.namespace)
              for c in world.kget("pvc", "-n", ns)["items"]]
    assert len(claims) == 4  # controller state, database, and the Slurm and inference shares; Jobs get none
    volumes = {pv["metadata"]["name"]: pv for pv in world.kget("pv")["items"]}
    for claim in claims:
        name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        assert claim["status"]["phase"] == "Bound", name
        volume = volumes[claim["spec"]["volumeName"]]
        assert volume["spec"]["claimRef"]["name"] == claim["metadata"]["name"], name
        if claim["metadata"]["labels"].get("app.kubernetes.io/name") == "shared-storage":
            # the shared file system: our own PV (NFS from the config), bound by name; inference's is the models
            # directory only, read-only at the mount
            assert volume["metadata"]["labels"]["app.kubernetes.io/part-of"] == "dualsched", name
            inference = claim["metadata"]["namespace"] == config.inference.namespace
            path = path_under(config.storage.nfs.path, config.storage.models_path if inference else None)
            nfs = volume["spec"]["nfs"]
            assert (nfs["server"], nfs["path"]) == (config.storage.nfs.server, path), name
            assert volume["spec"].get("mountOptions") == (["ro"] if inference else None), name
            assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        else:
            # controller state / database: a class-less claim on one of the cluster's static PVs
            assert volume["metadata"]["labels"].get("dualsched.io/local-pv") == "true", name


def check_node_labels(world: World, config: StackConfig) -> None:
    current = nodes(world)
    label = config.placement.pool_label
    in_pools = set()
    for pool in config.pools:
        for node in pool.node_names:
            in_pools.add(node)
            meta = current[node]["metadata"]
            assert meta["labels"].get(label) == pool.name, node
            assert meta["labels"].get("dualsched.io/mode") == pool.mode.value, node
            assert meta["labels"].get("dualsched.io/slurm-gpus") == str(pool.slurm_gpu_count), node
    for name, node in current.items():
        if name not in in_pools and name not in EXTRA_NODES:
            assert label not in node["metadata"]["labels"], name


def kept_taints(world: World, config: StackConfig) -> dict[str, list[dict[str, str]]]:
    """Node -> the static taints the node keeper is told to keep there, from its ConfigMap in the cluster.

    What the keeper writes (here its program on the host, tools/host_keeper.py) is checked on a real node by
    tests/node/test_node_taints.py."""
    [files] = world.kget("configmaps", "-n", config.slurm.namespace, "-l", f"app.kubernetes.io/name={KEEPER}")["items"]
    return {node: pool["taints"] for pool in json.loads(files["data"][STATE_FILE])["pools"] for node in pool["nodes"]}


def check_node_placement(world: World, config: StackConfig) -> None:
    check_node_labels(world, config)
    wanted = {node: [{"key": t.key, "value": t.value, "effect": t.effect.value} for t in config.pool_taints(pool)]
              for pool in config.pools for node in pool.node_names}  # fmt: skip
    assert kept_taints(world, config) == wanted
    # the keeper keeps exactly these nodes (elsewhere it may only release: its admission policy)
    [role] = world.kget("clusterroles", "-l", f"app.kubernetes.io/name={KEEPER}")["items"]
    assert role["rules"][1] == {"apiGroups": [""], "resources": ["nodes"], "resourceNames": sorted(wanted), "verbs": [KEEP_VERB]}


def test_node_labels_and_taints_come_from_the_config(world: World, dev: Deployed):
    check_node_placement(world, dev.config)


def test_inference_only_on_inference_eligible_nodes(world: World, dev: Deployed):
    config = dev.config
    eligible = {node for pool in config.inference_pools for node in pool.node_names}
    slurm_tainted = {name for name, taints in kept_taints(world, config).items()
                     if any(t["key"] == config.placement.slurm_taint_key for t in taints)}  # fmt: skip
    placed = inference_nodes(world, config)
    assert set(placed) <= eligible - slurm_tainted


# ------------------------------------------------------------------ 3. Pod Security


def test_pod_security_rejects_privileged_pods_in_inference(world: World, dev: Deployed):
    config = dev.config
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "privileged-probe", "namespace": config.inference.namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "securityContext": {"privileged": True}}]},
    }
    result = world.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert result.returncode != 0
    assert "violates PodSecurity" in result.stderr and "privileged" in result.stderr, result.stderr
    # ... while the Slurm namespace admits slurmd's pods (they are running), whose SYS_ADMIN only "privileged" allows
    slurmd = pods(world, config.slurm.namespace, "app.kubernetes.io/name=slurmd")
    assert slurmd and all(ready(p) for p in slurmd)
    daemons = [c for p in slurmd for c in p["spec"]["containers"] if c["name"] == "slurmd"]
    assert daemons and all("SYS_ADMIN" in c["securityContext"]["capabilities"]["add"] for c in daemons)


# ------------------------------------------------------------------ 4. no-op preview


def test_second_preview_shows_no_changes(dev: Deployed):
    preview = timed("preview (dev, no changes)", dev.stack.preview, color="never")
    assert op_names(preview.change_summary) == {"same"}, preview.change_summary


# ------------------------------------------------------------------ 6. secrets


def test_stack_export_holds_no_plaintext_secret(world: World, dev: Deployed):
    ns = dev.config.slurm.namespace
    secrets = world.kget("secrets", "-n", ns)["items"]
    munge = [s for s in secrets if "munge.key" in s.get("data", {})]
    passwords = [s for s in secrets if "password" in s.get("data", {})]
    assert len(munge) == 1 and len(passwords) == 1
    munge_b64 = munge[0]["data"]["munge.key"]               # base64 of the 1024 random bytes
    munge_raw = base64.b64decode(munge_b64)
    password = base64.b64decode(passwords[0]["data"]["password"]).decode()
    needles = {
        "munge key (base64)": munge_b64,
        "munge key (hex)": munge_raw.hex(),
        "munge key (base64 of base64)": b64(munge_b64)[:64],
        "database password": password,
        "database password (base64)": b64(password),
    }
    # the CLI's `pulumi stack export` (the Automation API's export_stack() adds --show-secrets)
    exported = world.run(["pulumi", "stack", "export", "--stack", "dev", "--cwd", str(world.project)]).stdout
    assert "ciphertext" in exported  # secrets are there, encrypted
    leaked = [what for what, value in needles.items() if value in exported]
    assert not leaked, f"plaintext in `pulumi stack export`: {leaked}"


# ------------------------------------------------------------------ 6b. ClusterName change refused


def test_cluster_name_change_is_refused_before_anything_changes(world: World, dev: Deployed):
    """The protected ClusterName lock would be replaced: `up` stops, and since the whole cluster waits
    for the lock, not even a label has changed (the next preview, in 5., shows only its own change)."""
    raw = json.loads(json.dumps(dev.raw))
    raw["slurm"]["clusterName"] = "renamed"
    world.write_config("dev", raw)
    try:
        with pytest.raises(auto.CommandError) as refused:
            timed("up (ClusterName change, refused)", dev.stack.up, color="never")
    finally:
        world.write_config("dev", dev.raw)
    message = str(refused.value)
    assert "protect" in message and CLUSTER_NAME_LOCK in message, message[-3000:]
    name = dev.config.slurm.cluster_name
    assert f"ClusterName={name}\n" in world.kget("configmap", "slurm-config", "-n", "slurm")["data"]["slurm.conf"]
    assert world.kget("service", "slurmctld", "-n", "slurm")["spec"]["selector"]["app.kubernetes.io/instance"] == name


# ------------------------------------------------------------------ 5. configuration-only change


@pytest.fixture(scope="module")
def new_partition(world: World, dev: Deployed):
    raw = json.loads(json.dumps(dev.raw))
    raw["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "01:00:00"})
    world.write_config("dev", raw)
    pods_before = {p["metadata"]["uid"] for p in pods(world, "slurm", "app.kubernetes.io/name=slurmd")}
    pods_before |= {world.kget("pod", "slurmctld-0", "-n", "slurm")["metadata"]["uid"]}
    steps = Steps()
    preview = timed("preview (new partition)", dev.stack.preview, on_event=steps, color="never")
    up = timed("up (new partition)", dev.stack.up, color="never")
    return raw, steps, preview, up, pods_before


def test_new_partition_changes_configuration_only(new_partition):
    _, steps, preview, _, _ = new_partition
    changed = {urn: ops for urn, ops in steps.ops().items() if ops != {"same"}}
    kinds = {urn: urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1] for urn in changed}
    for urn, ops in changed.items():
        kind = kinds[urn]
        if kind == "kubernetes:core/v1:ConfigMap":
            assert ops <= {"replace", "create-replacement", "delete-replaced"} and "create-replacement" in ops, (urn, ops)
        else:
            pytest.fail(f"unexpected change {ops} of {urn}")
    assert any(urn.endswith("ConfigMap::dualsched-slurm-config") for urn in changed)
    # slurmctld mounts the config by its fixed name: replacing the ConfigMap leaves its pod alone
    # (the reconfigure sidecar applies the change); slurmd is configless
    for kind in ("StatefulSet", "DaemonSet"):
        workloads = steps.ops(lambda m, kind=kind: m.type == f"kubernetes:apps/v1:{kind}")
        assert workloads and all(ops == {"same"} for ops in workloads.values()), workloads
    assert op_names(preview.change_summary) == {"same", "replace"}, preview.change_summary


def test_new_partition_is_applied(world: World, new_partition):
    raw, _, _, up, pods_before = new_partition
    assert up.summary.result == "succeeded"
    config_maps = [cm for cm in world.kget("configmaps", "-n", "slurm")["items"] if "slurm.conf" in cm.get("data", {})]
    assert len(config_maps) == 1 and "PartitionName=debug" in config_maps[0]["data"]["slurm.conf"]
    # neither slurmd nor slurmctld was restarted: configless slurmd, and the controller reloads in place
    after = {p["metadata"]["uid"] for p in pods(world, "slurm", "app.kubernetes.io/name=slurmd")}
    after |= {world.kget("pod", "slurmctld-0", "-n", "slurm")["metadata"]["uid"]}
    assert after == pods_before
    assert ready(world.kget("pod", "slurmctld-0", "-n", "slurm"))


# ------------------------------------------------------------------ 2b. a Slurm-dedicated pool


@pytest.fixture(scope="module")
def dedicated(world: World, dev: Deployed, new_partition) -> Deployed:
    raw = json.loads(json.dumps(new_partition[0]))
    raw["pools"].append({"name": "dedicated", "nodes": "gpu-[003-004]", "mode": "dedicated", "gpusPerNode": 8,
                         "cpus": 32, "realMemoryMb": 128000, "allocatable": {"cpus": 62, "memoryMb": 250000}})
    raw["slurm"]["partitions"].append({"name": "train", "pools": ["dedicated"]})
    # 4 one-GPU replicas: exactly the 2 + 2 GPUs Slurm leaves to Kubernetes on gpu-001/002, while
    # gpu-003/004 have 16 free GPUs. Only placement keeps the replicas off the dedicated nodes.
    raw["inference"]["models"][0]["replicas"] = {"min": 4, "max": 4}
    world.write_config("dev", raw)
    up = timed("up (add dedicated pool)", dev.stack.up, color="never")
    return Deployed(dev.stack, raw, None, Steps(), up)


def test_dedicated_pool_gets_slurmd_and_the_slurm_taint(world: World, dedicated: Deployed):
    assert dedicated.up.summary.result == "succeeded"
    config = dedicated.config
    assert slurmd_nodes(world, config, "dedicated") == EXTRA_NODES
    assert slurmd_nodes(world, config, "gpu") == ["gpu-001", "gpu-002"]
    check_node_placement(world, config)
    kept = kept_taints(world, config)
    for name in EXTRA_NODES:
        assert kept[name] == [{"key": config.placement.slurm_taint_key, "value": "true", "effect": "NoSchedule"}]


def test_no_inference_pod_on_a_dedicated_node(world: World, dedicated: Deployed):
    # The HPA owns the replica count (the Deployment ignores spec.replicas changes): its controller
    # raises the Deployment to minReplicas=4 on its next sync (every 15 s).
    deadline, placed = time.monotonic() + 120, []
    while time.monotonic() < deadline:
        found = pods(world, dedicated.config.inference.namespace)
        placed = [p["spec"].get("nodeName") for p in found if ready(p)]
        if len(found) == 4 and len(placed) == 4:
            break
        time.sleep(3)
    assert len(placed) == 4, f"inference pods not all Ready: {[(p['metadata']['name'], p['spec'].get('nodeName'), p['status'].get('phase')) for p in found]}"
    assert not set(placed) & set(EXTRA_NODES), placed
    assert sorted(placed) == ["gpu-001", "gpu-001", "gpu-002", "gpu-002"]


@pytest.fixture(scope="module")
def released(world: World, dedicated: Deployed, new_partition) -> Deployed:
    """The dedicated pool dropped again: its nodes leave every pool."""
    raw = json.loads(json.dumps(new_partition[0]))
    world.write_config("dev", raw)
    up = timed("up (dedicated pool dropped)", dedicated.stack.up, color="never")
    return Deployed(dedicated.stack, raw, None, Steps(), up)


def ours(node: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """What of the keeper's a node carries: label keys, taint keys, annotation keys."""
    metadata = node["metadata"]
    return ([k for k in metadata.get("labels", {}) if "dualsched" in k],
            [t["key"] for t in node["spec"].get("taints", []) if "dualsched" in t["key"]],
            [k for k in metadata.get("annotations", {}) if k.startswith("dualsched.io/")])  # fmt: skip


def test_nodes_that_leave_every_pool_lose_the_keepers_labels_taints_and_slurmd(world: World, released: Deployed):
    """The keeper lists the nodes by its label and releases them, under its own token's RBAC and admission policy
    (tools/host_keeper.py): the DaemonSet controller then removes their slurmd pods, and with them the munge key."""
    assert released.up.summary.result == "succeeded"
    namespace = released.config.slurm.namespace

    def carried() -> dict[str, Any]:
        found = nodes(world)
        slurmd = {p["spec"].get("nodeName") for p in pods(world, namespace, "app.kubernetes.io/name=slurmd")}
        return {name: (ours(found[name]), name in slurmd) for name in EXTRA_NODES}

    deadline = time.monotonic() + 90
    while carried() != {name: (([], [], []), False) for name in EXTRA_NODES} and time.monotonic() < deadline:
        time.sleep(2)
    assert carried() == {name: (([], [], []), False) for name in EXTRA_NODES}
    assert nodes(world)["gpu-003"]["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-003"  # nobody else's label goes
    check_node_placement(world, released.config)


def test_on_a_node_of_no_pool_the_keepers_token_may_only_release(world: World, released: Deployed):
    namespace = released.config.slurm.namespace
    [keeper] = pods(world, namespace, f"app.kubernetes.io/name={KEEPER}")
    token = world.kubectl("create", "token", keeper["spec"]["serviceAccountName"], "-n", namespace).stdout.strip()

    def as_keeper(*args: str):
        """kubectl with the keeper's token alone (the world's kubeconfig would authenticate by its client certificate)."""
        server = re.search(r"server: (\S+)", (world.cluster_dir / "kubeconfig").read_text()).group(1)
        return world.kubectl("--kubeconfig=/dev/null", f"--server={server}", f"--certificate-authority={world.cluster_dir / 'pki' / 'ca.crt'}",
                             f"--token={token}", *args, check=False)  # fmt: skip

    labelled = as_keeper("label", "node", "gpu-003", f"{released.config.placement.pool_label}=gpu")
    assert labelled.returncode != 0 and "may not add or change labels on a node of no pool" in labelled.stderr, labelled.stderr
    tainted = as_keeper("taint", "node", "gpu-003", "example.com/x=y:NoSchedule")
    assert tainted.returncode != 0 and "may not add taints to a node of no pool" in tainted.stderr, tainted.stderr
    foreign = as_keeper("label", "node", "gpu-003", "kubernetes.io/hostname-")
    assert foreign.returncode != 0 and "may remove only the labels it recorded" in foreign.stderr, foreign.stderr
    # on a pool node the role names, the policy does not apply: the keeper writes its labels there
    assert as_keeper("label", "node", "gpu-001", "dualsched.io/probe=1").returncode == 0
    assert as_keeper("label", "node", "gpu-001", "dualsched.io/probe-").returncode == 0


# ------------------------------------------------------------------ 6. two stacks' pools name one node


@dataclass
class Overlap:
    """A second stack (inference only, its keeper in namespace team-b) whose pool names gpu-001, which dev keeps, and
    gpu-003, which nobody keeps: what the nodes carried while it was up, and its destroy."""

    up: Any
    labels: dict[str, dict[str, str]]
    slurmd_before: str
    slurmd_after: str
    keeper_log: list[str]
    destroy: Any


TEAM_B = "team-b"


@pytest.fixture(scope="module")
def overlap(world: World, released: Deployed) -> Overlap:
    raw = raw_config("dev")
    for key in ("slurm", "submission"):
        del raw[key]
    raw["inference"]["namespace"] = TEAM_B
    raw["inference"]["models"][0]["replicas"] = {"min": 1, "max": 1}
    raw["pools"] = [{"name": "serve", "nodes": "gpu-001,gpu-003", "mode": "kubernetes", "gpusPerNode": 8, "cpus": 32,
                     "realMemoryMb": 128000, "allocatable": {"cpus": 62, "memoryMb": 250000}}]  # fmt: skip
    pool_label = released.config.placement.pool_label

    def slurmd_on_gpu_001() -> str:
        [pod] = [p for p in pods(world, "slurm", "app.kubernetes.io/name=slurmd") if p["spec"].get("nodeName") == "gpu-001"]
        return pod["metadata"]["uid"]

    before, logged = slurmd_on_gpu_001(), len(world.keeper_log)
    stack = world.stack(TEAM_B, raw)
    up = timed("up (a second stack naming a node the first keeps)", stack.up, color="never")
    deadline = time.monotonic() + 60
    while nodes(world)["gpu-003"]["metadata"]["labels"].get(pool_label) != "serve" and time.monotonic() < deadline:
        time.sleep(2)
    time.sleep(10)  # five more passes of both keepers
    labels = {name: nodes(world)[name]["metadata"]["labels"] for name in ("gpu-001", "gpu-003")}
    after, log = slurmd_on_gpu_001(), world.keeper_log[logged:]
    destroy = timed("destroy (the second stack)", stack.destroy, color="never")
    return Overlap(up, labels, before, after, log, destroy)


def test_a_node_another_stacks_keeper_keeps_stays_that_stacks_and_its_slurmd_runs_on(overlap: Overlap, released: Deployed):
    """Before, both keepers set their labels on gpu-001 in turn, and each turn replaced its slurmd pod (slurmd selects
    the keeper's label), killing its jobs. dev's keeper renews its Lease, so team-b's leaves the node alone and says so."""
    assert overlap.up.summary.result == "succeeded"
    label = released.config.placement.pool_label
    assert (overlap.labels["gpu-001"][label], overlap.labels["gpu-001"]["dualsched.io/kept-by"]) == ("gpu", "slurm")
    assert overlap.slurmd_after == overlap.slurmd_before
    left_alone = [line for line in overlap.keeper_log if line.startswith("gpu-001: kept by the node keeper of namespace slurm")]
    assert len(left_alone) == 1, overlap.keeper_log
    assert not [line for line in overlap.keeper_log if line.startswith("gpu-001: label")], overlap.keeper_log
    # both keepers renewed their Leases under their own tokens (a Role each), and read the other's (the ClusterRole)
    assert not [line for line in overlap.keeper_log if line.startswith("its Lease") or "leases" in line], overlap.keeper_log


def test_a_node_nobody_keeps_goes_to_the_second_stack_which_is_destroyed_cleanly(overlap: Overlap, released: Deployed):
    label = released.config.placement.pool_label
    assert (overlap.labels["gpu-003"][label], overlap.labels["gpu-003"]["dualsched.io/kept-by"]) == ("serve", TEAM_B)
    assert overlap.destroy.summary.result == "succeeded"


# ------------------------------------------------------------------ 7. destroy


@dataclass
class Destroyed:
    deployed: Deployed
    volumes: set[str]
    state_claims: set[str]
    refusal: str
    left_after_refusal: list[str]  # resource types still in the stack after the refused destroy
    result: Any


@pytest.fixture(scope="module")
def destroyed(world: World, released: Deployed, overlap: Overlap) -> Destroyed:
    # This stack's shares: a consumer's stack in the same cluster (test_component_package_engine.py)
    # retains its own, under its own instance name, and the second stack (overlap) its own, for its namespace.
    config = released.config
    volumes = {pv["metadata"]["name"] for pv in world.kget("pv", "-l", "app.kubernetes.io/instance=dualsched-shared")["items"]
               if pv["spec"]["claimRef"]["namespace"] in (config.slurm.namespace, config.inference.namespace)}
    state_claims = {c["metadata"]["name"] for c in world.kget("pvc", "-n", "slurm")["items"]
                    if c["metadata"]["labels"]["app.kubernetes.io/name"] in ("slurmctld", "mariadb")}
    # Every stack protects its ClusterName lock: a plain destroy (with --skip-preview, as here) deletes
    # everything else, then fails at the lock ...
    with pytest.raises(auto.CommandError) as refused:
        timed("destroy (dev, refused: ClusterName lock)", released.stack.destroy, color="never")
    resources = released.stack.export_stack().deployment["resources"]
    left = [r["type"] for r in resources if not r["type"].startswith("pulumi:")]
    # ... which goes too once it is unprotected on purpose (docs/deploy.md, "Data that outlives the program")
    (lock,) = [r["urn"] for r in resources if r["urn"].endswith(CLUSTER_NAME_LOCK)]
    world.run(["pulumi", "state", "unprotect", lock, "--stack", "dev", "--yes", "--cwd", str(world.project)])
    result = timed("destroy (dev)", released.stack.destroy, color="never")
    return Destroyed(released, volumes, state_claims, str(refused.value), left, result)


def test_destroy_is_refused_until_the_cluster_name_lock_is_lifted(destroyed: Destroyed):
    assert "protected" in destroyed.refusal and CLUSTER_NAME_LOCK in destroyed.refusal, destroyed.refusal[-3000:]
    assert destroyed.left_after_refusal == ["random:index/randomId:RandomId"]


def test_destroy_removes_all_but_what_is_retained(world: World, destroyed: Destroyed):
    deployed, volumes, result = destroyed.deployed, destroyed.volumes, destroyed.result
    config = deployed.config
    assert result.summary.result == "succeeded"
    namespaces = {ns["metadata"]["name"]: ns for ns in world.kget("namespaces")["items"]}
    for name in (config.inference.namespace, config.submission.namespace):
        assert name not in namespaces or namespaces[name]["status"]["phase"] == "Terminating", name
    # retained on purpose: the Slurm namespace with the controller state and database claims ...
    assert namespaces[config.slurm.namespace]["status"]["phase"] == "Active"
    assert len(destroyed.state_claims) == 2
    assert destroyed.state_claims <= {c["metadata"]["name"] for c in world.kget("pvc", "-n", config.slurm.namespace)["items"]}
    assert not world.kget("daemonsets,statefulsets,deployments", "-n", config.slurm.namespace)["items"]
    # ... the shared-storage PVs (reclaim Retain) and the node labels (the keeper is gone; it removed no taint)
    assert len(volumes) == 2  # the Slurm and inference shares; Jobs have none
    left = {pv["metadata"]["name"] for pv in world.kget("pv")["items"]}
    assert volumes <= left
    check_node_labels(world, config)
    assert json.loads(json.dumps(deployed.stack.export_stack().deployment)).get("resources") in (None, [])


def test_protected_stack_refuses_to_destroy(world: World, destroyed):
    raw = raw_config("dev")
    raw["protect"] = True
    raw["slurm"]["namespace"] = "slurm-protected"
    raw["slurm"]["accounting"] = {"enabled": False}
    raw["inference"] = {"enabled": False}
    raw["submission"] = {"enabled": False}
    world.cluster("pvs")  # Available class-less PVs for the new state claim
    logged = len(world.keeper_log)
    stack = world.stack("protected", raw)
    up = timed("up (protected stack)", stack.up, color="never")
    assert up.summary.result == "succeeded"
    # dev's nodes still carry its labels (a destroy leaves them), but its keeper's Lease went with the stack:
    # this stack's keeper takes them at once
    deadline = time.monotonic() + 60
    while nodes(world)["gpu-001"]["metadata"]["labels"].get("dualsched.io/kept-by") != "slurm-protected" and time.monotonic() < deadline:
        time.sleep(2)
    assert nodes(world)["gpu-001"]["metadata"]["labels"]["dualsched.io/kept-by"] == "slurm-protected"
    assert any(line.startswith("gpu-001: taken over from the node keeper of namespace slurm,") for line in world.keeper_log[logged:])
    with pytest.raises(auto.CommandError) as error:
        timed("destroy (protected stack, refused)", stack.destroy, color="never")
    assert "protected" in str(error.value), str(error.value)[-3000:]
    assert world.kget("namespace", "slurm-protected")["status"]["phase"] == "Active"
