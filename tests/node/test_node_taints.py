"""The node keeper on the real node: it adds the pool's labels and taints next to someone else's taint
and label, removes only its own (a label or taint dropped from the config), and puts a time-shared pool's
window taint on the node only while the window is closed.

The module deploys a stack of its own (a Pulumi project in the session's temp dir) built from the
library's components for the local stack's config, in a Slurm namespace of its own: the namespace with
its NetworkPolicies (the keeper reaches the API server through them, under kube-router), the node keeper,
and a DaemonSet that selects the pool's nodes by the pool label and waits for the keeper, as slurmd's does.
Each `pulumi up` waits for the keeper's new pod to be ready, which it is once a pass found the node as
wanted, so the tests look at the node right after it. At the end the window is open and the config has
no taint of ours, so the node carries none; the stack is destroyed and the foreign taint and label, and
the labels the keeper left (deleting it leaves them), are removed again.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from typing import Iterator

import pytest
import yaml

from dualsched.components.node_keeper import KEEPER
from dualsched.components.nodepools import GUARDED_POOL_LABEL
from dualsched.components.programs.node_keeper import FIELD_MANAGER, KEPT_BY_LABEL, OWNED_ANNOTATION, OWNED_LABELS_ANNOTATION
from e2e_support import TIMINGS, copy_project, tail
from node_support import NodeWorld, local_config

pytestmark = pytest.mark.node

NODE = "gpu-real-1"
NAMESPACE = "keeper-test"
STACK = "keeper"
FOREIGN_TAINT = {"key": "example.com/foreign", "value": "yes", "effect": "PreferNoSchedule"}
FOREIGN_LABEL = ("example.com/foreign-label", "yes")
OURS = {"key": "dualsched.io/keeper-test", "value": "yes", "effect": "PreferNoSchedule"}
WINDOW_KEY = "dualsched.io/inference-window"
POOL_LABEL = "dualsched.io/pool"
MOVED_POOL_LABEL = "dualsched.io/keeper-test-pool"
"""placement.poolLabel of the second config: the first one's pool label key leaves the desired state."""
SELECTED = "keeper-selected"
OUR_LABEL_KEYS = (POOL_LABEL, MOVED_POOL_LABEL, "dualsched.io/mode", "dualsched.io/slurm-gpus", GUARDED_POOL_LABEL, KEPT_BY_LABEL)
PROGRAM = """
import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.namespace import SlurmNamespace, SlurmNamespaceArgs
from dualsched.components.node_keeper import NodeKeeper, NodeKeeperArgs
from dualsched.config import load_pulumi_config

config = load_pulumi_config()
namespace = SlurmNamespace("keeper", SlurmNamespaceArgs(config))
keeper = NodeKeeper("keeper", NodeKeeperArgs(config, namespace.name))
# selects the pool's nodes by the label the keeper writes, and waits for it, as slurmd's DaemonSet does
app = {"app": "%s"}
k8s.apps.v1.DaemonSet(
    "%s",
    metadata={"name": "%s", "namespace": namespace.name},
    spec={
        "selector": {"matchLabels": app},
        "template": {
            "metadata": {"labels": app},
            "spec": {
                "nodeSelector": {config.placement.pool_label: config.pools[0].name},
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "sleep", "image": config.images.python, "command": ["sleep", "infinity"]}],
            },
        },
    },
    opts=pulumi.ResourceOptions(depends_on=[keeper]),
)
""" % (SELECTED, SELECTED, SELECTED)


def window_from_now(minutes_from_now: int, duration: int) -> dict:
    """A daily window (UTC) that opens ``minutes_from_now`` after this minute (negative: it opened before)."""
    now = datetime.now(timezone.utc)
    start = (now.hour * 60 + now.minute + minutes_from_now) % (24 * 60)
    return {"start": f"{start // 60:02d}:{start % 60:02d}", "durationMinutes": duration}


class Keeper:
    """The module's stack and the node it keeps."""

    before: list[dict]
    """The node's taints before the keeper came, the foreign one among them."""

    def __init__(self, world: NodeWorld):
        project = world.tmp / "keeper-project"
        copy_project(project)
        (project / "__main__.py").write_text(PROGRAM)
        settings = yaml.safe_load((project / "Pulumi.yaml").read_text())
        (project / "Pulumi.yaml").write_text(yaml.safe_dump({**settings, "name": "dualsched-keeper-test"}, sort_keys=False))
        self.node_world, self.world = world, dataclasses.replace(world, project=project)

    def up(self, pool_label: str = POOL_LABEL, **pool) -> None:
        """`pulumi up` of the local stack's config, in our namespace, with ``pool`` set on its one pool."""
        config = local_config(self.node_world)
        config["slurm"]["namespace"] = NAMESPACE
        config.setdefault("placement", {})["poolLabel"] = pool_label
        config["inference"], config["submission"] = {"enabled": False}, {"enabled": False}
        config["pools"][0].update(pool)
        if config["pools"][0]["mode"] == "time-shared":
            config["pools"][0].pop("slurmGpus")
        start = time.monotonic()
        result = self.world.stack(STACK, config).up(on_output=lambda _: None, color="never")
        TIMINGS.append((f"pulumi up of the node keeper's stack ({result.summary.result})", time.monotonic() - start))
        assert result.summary.result == "succeeded", tail(result.stdout)
        # pulumi-kubernetes may report a Deployment updated before its controller saw the new template
        # (pulumi-kubernetes#3329, docs/deploy.md): wait for the keeper's new pod, which is ready once a pass
        # found the node as wanted (once, a test read the node while the old pod still ran)
        self.world.kubectl("rollout", "status", "deployment", "-n", NAMESPACE, "--timeout=180s", timeout=210)

    def node(self) -> dict:
        return self.world.kget("node", NODE, "--show-managed-fields")

    def taints(self) -> list[dict]:
        return [{k: v for k, v in t.items() if k != "timeAdded"} for t in self.node()["spec"].get("taints", [])]

    def selected_running(self, seconds: int = 120) -> bool:
        """The DaemonSet's pod runs on the node, within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            pods = self.world.kget("pods", "-n", NAMESPACE, "-l", f"app={SELECTED}")["items"]
            on_node = any(p["spec"].get("nodeName") == NODE and p["status"].get("phase") == "Running"
                          for p in pods if "deletionTimestamp" not in p["metadata"])  # fmt: skip
            if on_node or time.monotonic() > deadline:
                return on_node
            time.sleep(2)

    def keeper_pods(self, terminating: bool = False) -> list[dict]:
        pods = self.world.kget("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={KEEPER}")["items"]
        return [p for p in pods if terminating or "deletionTimestamp" not in p["metadata"]]

    def logs(self) -> str:
        return self.world.kubectl("logs", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={KEEPER}", "--tail=-1").stdout


@pytest.fixture(scope="module")
def keeper(node_world: NodeWorld) -> Iterator[Keeper]:
    keeper = Keeper(node_world)
    # an earlier module's keeper left its labels (deleting a keeper leaves them): this one starts without
    forget_our_labels(node_world)
    # someone else's taint and label, set before the keeper exists (kubectl's own field managers)
    node_world.kubectl("taint", "node", NODE, "{key}={value}:{effect}".format(**FOREIGN_TAINT))
    node_world.kubectl("label", "node", NODE, "=".join(FOREIGN_LABEL))
    keeper.before = keeper.taints()
    try:
        yield keeper
    finally:
        keeper.world.stack(STACK).destroy(color="never")
        node_world.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", check=False, timeout=150)
        # what a failed test may have left of ours too: the keeper is gone, nothing else removes it
        for key, effect in ((FOREIGN_TAINT["key"], FOREIGN_TAINT["effect"]), (OURS["key"], OURS["effect"]), (WINDOW_KEY, "NoExecute")):
            node_world.kubectl("taint", "node", NODE, f"{key}:{effect}-", check=False)
        node_world.kubectl("label", "node", NODE, f"{FOREIGN_LABEL[0]}-", check=False)
        forget_our_labels(node_world)


def forget_our_labels(world: NodeWorld) -> None:
    """The node without any keeper's labels and records."""
    world.kubectl("label", "node", NODE, *(f"{key}-" for key in OUR_LABEL_KEYS), check=False)
    world.kubectl("annotate", "node", NODE, f"{OWNED_ANNOTATION}-", f"{OWNED_LABELS_ANNOTATION}-", check=False)


@pytest.fixture(scope="module")
def tainted(keeper: Keeper) -> Keeper:
    keeper.up(taints=[OURS])
    return keeper


def test_our_taint_is_added_after_the_foreign_ones_which_stay_as_they_were(tainted: Keeper):
    assert FOREIGN_TAINT in tainted.before
    assert tainted.taints() == [*tainted.before, OURS]
    node = tainted.node()
    assert node["metadata"]["labels"][FOREIGN_LABEL[0]] == FOREIGN_LABEL[1]
    assert node["metadata"]["labels"]["dualsched.io/pool"] == "gpu"  # our labels, beside the foreign one
    assert node["metadata"]["annotations"][OWNED_ANNOTATION] == "dualsched.io/keeper-test:PreferNoSchedule"
    # the keeper's merge patch, under its own field manager, which now holds the whole atomic list (kubectl's
    # taint in it): a server-side apply of taints by anyone else would conflict with it, as it did with kubectl
    managers = {entry["manager"] for entry in node["metadata"]["managedFields"]}
    assert FIELD_MANAGER in managers
    assert f"{NODE}: added dualsched.io/keeper-test=yes:PreferNoSchedule" in tainted.logs()


def test_the_pools_labels_are_on_the_node_and_recorded_as_the_keepers(tainted: Keeper):
    labels = tainted.node()["metadata"]["labels"]
    assert {key: labels.get(key) for key in (POOL_LABEL, GUARDED_POOL_LABEL, "dualsched.io/mode", "dualsched.io/slurm-gpus", KEPT_BY_LABEL)} == {
        POOL_LABEL: "gpu", GUARDED_POOL_LABEL: "gpu", "dualsched.io/mode": "partitioned", "dualsched.io/slurm-gpus": "2",
        KEPT_BY_LABEL: NAMESPACE}  # fmt: skip
    annotations = tainted.node()["metadata"]["annotations"]
    assert annotations[OWNED_LABELS_ANNOTATION] == f"{KEPT_BY_LABEL},dualsched.io/mode,{POOL_LABEL},dualsched.io/slurm-gpus,{GUARDED_POOL_LABEL}"
    # its ClusterRole existed before its first pass: not one call refused
    assert "refused" not in tainted.logs()
    assert f"{NODE}: label {POOL_LABEL}=gpu set" in tainted.logs()


def test_a_daemonset_selecting_the_pool_label_is_created_after_the_labels_and_runs_on_the_node(tainted: Keeper):
    """The labels appear when the keeper writes them, not when the engine does: the DaemonSet waits for the
    keeper, which is ready only once they are on the node, so it is created after the keeper's write."""
    [written] = [e["time"] for e in tainted.node()["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER]
    daemonset = tainted.world.kget("daemonset", SELECTED, "-n", NAMESPACE)
    assert written <= daemonset["metadata"]["creationTimestamp"]  # RFC 3339 UTC, second resolution: ordered as strings
    assert tainted.selected_running(), tainted.world.kget("pods", "-n", NAMESPACE, "-l", f"app={SELECTED}")


@pytest.fixture(scope="module")
def window_closed(tainted: Keeper) -> Keeper:
    """Our static taint dropped from the config; the pool time-shared, its window opening in two hours."""
    tainted.up(taints=[], mode="time-shared", inferenceWindow=window_from_now(120, 60), pool_label=MOVED_POOL_LABEL)
    return tainted


def test_a_taint_dropped_from_the_config_goes_and_the_foreign_one_stays(window_closed: Keeper):
    taints = window_closed.taints()
    assert OURS not in taints
    assert [t for t in taints if t["key"] != WINDOW_KEY] == window_closed.before
    assert f"{NODE}: removed dualsched.io/keeper-test=yes:PreferNoSchedule" in window_closed.logs()


def test_a_label_dropped_from_the_config_goes_and_the_foreign_one_stays(window_closed: Keeper):
    """The pool label's key moved (placement.poolLabel): the old key is no longer wanted, and was recorded."""
    node = window_closed.node()
    labels = node["metadata"]["labels"]
    assert POOL_LABEL not in labels and labels[MOVED_POOL_LABEL] == "gpu" and labels["dualsched.io/mode"] == "time-shared"
    assert labels[FOREIGN_LABEL[0]] == FOREIGN_LABEL[1] and labels["kubernetes.io/hostname"] == NODE
    assert node["metadata"]["annotations"][OWNED_LABELS_ANNOTATION] == (
        f"{MOVED_POOL_LABEL},{KEPT_BY_LABEL},dualsched.io/mode,dualsched.io/slurm-gpus,{GUARDED_POOL_LABEL}")
    assert f"{NODE}: label {POOL_LABEL} removed" in window_closed.logs()
    # the DaemonSet follows the new key, and its pod stays on the node
    assert window_closed.selected_running()


def test_a_closed_window_puts_its_no_execute_taint_on_the_node(window_closed: Keeper):
    assert window_closed.taints() == [*window_closed.before, {"key": WINDOW_KEY, "value": "closed", "effect": "NoExecute"}]
    [window] = [t for t in window_closed.node()["spec"]["taints"] if t["key"] == WINDOW_KEY]
    assert "timeAdded" in window
    assert window_closed.node()["metadata"]["annotations"][OWNED_ANNOTATION] == f"{WINDOW_KEY}:NoExecute"
    assert f"{NODE}: added {WINDOW_KEY}=closed:NoExecute" in window_closed.logs()
    # the keeper tolerates the taints it sets: its own NoExecute taint did not evict it
    [pod] = window_closed.keeper_pods()
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Running"


def test_the_replaced_keeper_stopped_at_sigterm(window_closed: Keeper):
    """Its container's PID 1 handles SIGTERM: the old pod is gone within seconds, not after the 30 s grace
    period, during which two keepers with two desired states would each undo the other's changes."""
    deadline = time.monotonic() + 10
    while len(window_closed.keeper_pods(terminating=True)) > 1 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(window_closed.keeper_pods(terminating=True)) == 1


@pytest.fixture(scope="module")
def window_open(window_closed: Keeper) -> Keeper:
    """The window moved to have opened half an hour ago, for two hours."""
    window_closed.up(taints=[], mode="time-shared", inferenceWindow=window_from_now(-30, 120), pool_label=MOVED_POOL_LABEL)
    return window_closed


def test_an_open_window_takes_its_taint_off_and_leaves_the_foreign_ones(window_open: Keeper):
    assert window_open.taints() == window_open.before
    node = window_open.node()
    assert OWNED_ANNOTATION not in node["metadata"].get("annotations", {})
    assert node["metadata"]["labels"][FOREIGN_LABEL[0]] == FOREIGN_LABEL[1]
    assert f"{NODE}: removed {WINDOW_KEY}=closed:NoExecute" in window_open.logs()
