"""The change report on real pairs of configs.

Each pair is a stack's own config (Pulumi.dev.yaml / Pulumi.prod.yaml) as the
base and the same config with one realistic edit as the head; both are rendered
by the real program under the render mocks and written with ``write_render``,
exactly as the pull-request workflow does, then compared.
"""

from __future__ import annotations

import base64
import copy
from collections import Counter
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from dualsched.components.node_keeper import STATE_FILE
from dualsched.components.render import SECRET_SIGNATURE, Render, write_render
from dualsched.components.report import (
    MARKER,
    Change,
    Delta,
    Finding,
    Impact,
    Plan,
    _renamed,
    classify,
    delta_lines,
    main,
    plan_from_preview,
    plan_from_renders,
    render_markdown,
)
from rendering import ROOT, at_release, raw_stack, render_raw, with_joining_pool

NEW_SLURMD = "ghcr.io/slinkyproject/slurmd:25.11.7-ubuntu24.04"
NEW_SLURMD_PYXIS = "ghcr.io/slinkyproject/slurmd-pyxis:25.11.7-ubuntu24.04"
"""What prod's slurmd run (its training pools run job steps in containers, so every pool runs the Pyxis image)."""
"""The next patch release of the default image (a slurmd image must run slurm.release, 25.11)."""
NEW_VLLM = "docker.io/vllm/vllm-openai:v0.11.1"


@dataclass
class Compared:
    plan: Plan
    markdown: str
    findings: list[Finding]
    base: Render
    head: Render

    def of(self, impact: Impact) -> list[Finding]:
        return [finding for finding in self.findings if finding.impact is impact]

    @property
    def impacts(self) -> set[Impact]:
        return {finding.impact for finding in self.findings} - {Impact.OTHER}


def _findings(plan: Plan) -> list[Finding]:
    return [finding for change in plan.changes for finding in classify(change, plan)]


def compare(tmp_path: Path, stack: str, edit: Callable[[dict[str, Any]], None], release: Optional[str] = None) -> Compared:
    """The report of ``edit`` to ``stack`` (on Slurm ``release`` rather than the stack's own)."""
    base_raw = raw_stack(stack) if release is None else at_release(raw_stack(stack), release)
    head_raw = copy.deepcopy(base_raw)
    edit(head_raw)
    base, head = render_raw(base_raw).render, render_raw(head_raw).render
    write_render(base, tmp_path / "base")
    write_render(head, tmp_path / "head")
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    return Compared(plan, render_markdown(plan), _findings(plan), base, head)


def assert_no_secret(markdown: str, *renders: Render) -> None:
    for render in renders:
        for secret in render.generated_secrets:
            assert secret not in markdown


# ------------------------------------------------------------------- render pairs


def test_identical_renders_report_no_changes(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: None)
    assert compared.plan.changes == []
    assert "No changes." in compared.markdown


def test_new_partition_reloads_config_without_restarting_slurmctld(tmp_path):
    def add_partition(raw):
        raw["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "01:00:00"})

    compared = compare(tmp_path, "dev", add_partition)
    assert compared.impacts == {Impact.CONFIG_RELOAD}
    (reload,) = compared.of(Impact.CONFIG_RELOAD)
    assert reload.change.kind == "ConfigMap" and reload.change.op == "replace"
    assert reload.change.name == "slurm-config"  # replaced under the same name
    # the restart hash ignores partitions: slurmctld's pod template is unchanged
    assert not compared.of(Impact.SLURMCTLD_RESTART)
    assert not [c for c in compared.plan.changes if c.kind == "StatefulSet"]
    # configless: no slurmd pod restarts for a partition
    assert not compared.of(Impact.SLURMD_ROLL)
    assert "scontrol reconfigure" in compared.markdown
    assert "+PartitionName=debug Nodes=gpu-[001-002]" in compared.markdown
    assert_no_secret(compared.markdown, compared.base, compared.head)


def test_node_line_change_reloads_config_and_rolls_only_the_pool(tmp_path):
    """Slurm 25.11 (the dev stack's) takes node changes by `scontrol reconfigure`: slurmctld keeps running."""
    compared = compare(tmp_path, "dev", lambda raw: raw["pools"][0].update(realMemoryMb=120000))
    assert compared.impacts == {Impact.CONFIG_RELOAD, Impact.SLURMD_ROLL}
    assert not [c for c in compared.plan.changes if c.kind == "StatefulSet"]
    assert "+NodeName=gpu-[001-002] CPUs=32 RealMemory=120000 MemSpecLimit=1024" in compared.markdown
    assert "scontrol reconfigure" in compared.markdown
    # the slurmd pods' memory follows RealMemory: the pool rolls (drain first)
    (roll,) = compared.of(Impact.SLURMD_ROLL)
    assert roll.nodes == ["gpu-001", "gpu-002"]
    assert_no_secret(compared.markdown, compared.base, compared.head)


def test_a_new_node_reaches_slurmctld_by_reconfigure(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw["pools"][0].update(nodes="gpu-[001-003]"))
    assert Impact.SLURMCTLD_RESTART not in compared.impacts and Impact.CONFIG_RELOAD in compared.impacts
    assert "+NodeName=gpu-[001-003]" in compared.markdown


def test_node_line_change_restarts_slurmctld_before_23_11(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw["pools"][0].update(realMemoryMb=120000), release="22.05")
    assert Impact.CONFIG_RELOAD in compared.impacts and Impact.SLURMCTLD_RESTART in compared.impacts
    (restart,) = compared.of(Impact.SLURMCTLD_RESTART)
    assert restart.change.name == "slurmctld"
    assert "spec.template.metadata.annotations.dualsched.io/slurm-restart-hash" in restart.change.paths
    assert any("dualsched.io/slurm-restart-hash" in detail for detail in restart.details)
    assert_no_secret(compared.markdown, compared.base, compared.head)


@pytest.mark.parametrize(("release", "restarts"), [("22.05", True), ("25.11", False)])
def test_a_pool_whose_nodes_join_by_label_restarts_slurmctld_only_before_23_11(tmp_path, release, restarts):
    """Its NodeSet and MaxNodeCount shape the node table: the report says which release restarts for them. The
    nodes that join later change no file at all."""
    # prod: the cordon watcher a joining pool needs already runs
    compared = compare(tmp_path, "prod", lambda raw: with_joining_pool(raw, like=raw["pools"][0]["name"]), release=release)
    assert Impact.CONFIG_RELOAD in compared.impacts and (Impact.SLURMCTLD_RESTART in compared.impacts) is restarts
    assert "+NodeSet=burst Feature=burst" in compared.markdown and re.search(r"\+MaxNodeCount=\d+", compared.markdown)


def test_a_new_user_restarts_the_pods_that_read_the_user_files(tmp_path):
    """Pods read /etc/passwd (a subPath mount) when they start: the preview says who restarts."""
    compared = compare(tmp_path, "dev", lambda raw: raw["slurm"]["users"].append({"name": "bob", "uid": 2002}))
    (restart,) = compared.of(Impact.SLURMCTLD_RESTART)
    assert "spec.template.metadata.annotations.dualsched.io/users-hash" in restart.change.paths
    assert compared.of(Impact.SLURMDBD_RESTART)
    (roll,) = compared.of(Impact.SLURMD_ROLL)
    assert roll.nodes == ["gpu-001", "gpu-002"]
    assert not compared.of(Impact.INFERENCE_ROLLOUT)


def test_a_slurmd_roll_without_the_rollout_controller_says_the_nodes_are_drained_by_hand(tmp_path):
    """A program that builds ComputePool without SlurmdRolloutController (its own composition) changes no slurmd
    pod by itself: the report says so instead of promising a drain nobody runs."""
    compare(tmp_path, "dev", _slurmd_image_edit)
    for side in ("base", "head"):
        _moved(tmp_path / side, lambda path, manifest: manifest["metadata"].get("labels", {}).get("app.kubernetes.io/name") != "slurmd-rollout")
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    [roll] = [f for f in _findings(plan) if f.impact is Impact.SLURMD_ROLL]
    assert "to drain **by hand**" in roll.summary and "(no slurmd rollout controller)" in roll.summary
    assert "builds no `SlurmdRolloutController`" in roll.details[0] and "the slurmd rollout controller drains" not in roll.details[0]
    with_controller = compare(tmp_path / "again", "dev", _slurmd_image_edit)
    [roll] = with_controller.of(Impact.SLURMD_ROLL)
    assert "by hand" not in roll.summary and "the slurmd rollout controller drains each node" in roll.details[0]


def test_slurmd_image_change_rolls_every_pool_with_its_node_count(tmp_path):
    compared = compare(tmp_path, "prod", lambda raw: raw["images"].update(slurmdPyxis=NEW_SLURMD_PYXIS))
    rolls = {finding.change.name.split("-slurmd-")[1].rsplit("-", 1)[0]: finding for finding in compared.of(Impact.SLURMD_ROLL)}
    assert set(rolls) == {"h100-a", "h100-b", "h100-shared"}
    assert len(rolls["h100-a"].nodes) == 32 and rolls["h100-a"].nodes[0] == "gpu-a-001"
    assert len(rolls["h100-b"].nodes) == 32
    assert len(rolls["h100-shared"].nodes) == 16
    assert "32 GPU nodes (256 Slurm GPUs) to drain" in rolls["h100-a"].summary
    assert "16 GPU nodes (64 Slurm GPUs) to drain" in rolls["h100-shared"].summary
    assert any("OnDelete" in detail and "drain" in detail for detail in rolls["h100-a"].details)
    assert "slurmd pool roll** (80 GPU nodes)" in compared.markdown
    assert "`gpu-s-[001-016]`" in compared.markdown
    assert_no_secret(compared.markdown, compared.base, compared.head)


def test_slurmdbd_resources_restart_slurmdbd_only(tmp_path):
    def resources(raw):
        raw["slurm"]["accounting"]["resources"] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}

    compared = compare(tmp_path, "prod", resources)
    assert compared.impacts == {Impact.SLURMDBD_RESTART}
    (restart,) = compared.of(Impact.SLURMDBD_RESTART)
    assert restart.change.kind == "Deployment" and "slurmdbd" in restart.change.name
    assert "spec.template.spec.containers[slurmdbd].resources.requests.cpu" in restart.change.paths


def test_vllm_image_change_is_an_inference_rollout_with_surge(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw.setdefault("images", {}).update(vllm=NEW_VLLM))
    assert compared.impacts == {Impact.INFERENCE_ROLLOUT}
    (rollout,) = compared.of(Impact.INFERENCE_ROLLOUT)
    assert rollout.change.namespace == "inference"
    assert "maxSurge 1, maxUnavailable 0" in rollout.details[0]
    assert f"`{NEW_VLLM}`" in compared.markdown


def test_nfs_server_change_replaces_the_volumes_as_data_risk(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw["storage"]["nfs"].update(server="nfs2.dev.internal"))
    risks = compared.of(Impact.DATA_RISK)
    assert {f.change.kind for f in risks} == {"PersistentVolume"}
    assert len(risks) == 2 and all(f.change.op == "replace" for f in risks)
    assert all("`spec.nfs.server`" in f.details[0] for f in risks)
    assert "| PersistentVolume |  |  | 2 |  |" in compared.markdown
    assert "DATA RISK" in compared.markdown.split("\n")[4]  # the headline


def test_pool_taint_change_lists_the_nodes(tmp_path):
    def no_execute(raw):
        raw["pools"][0]["taints"] = [{"key": "dualsched.io/slurm", "value": "true", "effect": "NoExecute"}]

    compared = compare(tmp_path, "prod", no_execute)
    changes = compared.of(Impact.NODE_CHANGE)
    assert sorted(n for f in changes for n in f.nodes) == [f"gpu-a-{i:03d}" for i in range(1, 33)]
    # from the node keeper's desired state: no Pulumi resource per node
    assert {(f.change.kind, f.change.name.rsplit("-", 1)[0]) for f in changes} == {("ConfigMap", "dualsched-node-keeper")}
    assert "- `gpu-a-[001-032]` (32 nodes): taint `dualsched.io/slurm=true:NoExecute` added; " in compared.markdown
    assert "taint `dualsched.io/slurm=true:NoSchedule` removed" in compared.markdown
    # the pool's slurmd tolerates the new taint: a template change, so a roll of that pool only
    assert [len(f.nodes) for f in compared.of(Impact.SLURMD_ROLL)] == [32]


def test_a_window_taint_is_reported_with_its_hours(tmp_path):
    """The keeper puts it on the node only outside the window: the report says when."""

    def time_shared(raw):
        raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "22:00", "durationMinutes": 600})
        raw["pools"][0].pop("slurmGpus")
        raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "gpusPerNode": 4,
                             "allocatable": {"cpus": 64, "memoryMb": 256000}})  # fmt: skip

    compared = compare(tmp_path, "dev", time_shared)
    [change] = [f for f in compared.of(Impact.NODE_CHANGE) if f.nodes == ["gpu-001"]]
    assert "taint `dualsched.io/inference-window=closed:NoExecute` (outside 22:00–08:00 UTC) added" in change.summary
    assert "pods that do not tolerate the window taint are evicted each day when the window closes" in change.summary
    assert change.summary.endswith("the GPU stack's DaemonSets on these nodes (device plugin, DCGM exporter, CNI) must tolerate "
                                   "`dualsched.io/inference-window=closed:NoExecute` or they stay off the nodes after their "
                                   "next restart (docs/gpu-sharing.md)")  # fmt: skip
    assert "- `gpu-[001-002]` (2 nodes): label `dualsched.io/mode`: `partitioned` → `time-shared`" in compared.markdown


@pytest.mark.parametrize(("mode", "says"), [
    ("time-shared", "a daily reservation keeps Slurm jobs out of the window"),
    ("dedicated", "stays Pending until the inference pods on the node are gone"),
    ("kubernetes", "the jobs running there die with it: drain them in Slurm first"),
])
def test_a_mode_switch_says_what_it_does_to_running_jobs_and_pods(tmp_path, mode, says):
    def switch(raw):
        pool = raw["pools"][0]
        pool["mode"] = mode
        pool.pop("slurmGpus")
        if mode == "time-shared":
            pool["inferenceWindow"] = {"start": "09:00", "durationMinutes": 480}
        if mode != "time-shared":  # the models need another pool, and no partition may name a kubernetes pool
            raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "gpusPerNode": 4})
        if mode == "kubernetes":
            raw["slurm"]["partitions"][0]["pools"] = ["slurm-only"]
            raw["pools"].append({"name": "slurm-only", "nodes": "hpc-[01-02]", "allocatable": {"cpus": 126, "memoryMb": 500000}})

    compared = compare(tmp_path, "dev", switch)
    [change] = [f for f in compared.of(Impact.NODE_CHANGE) if f.nodes == ["gpu-001"]]
    assert f"mode `partitioned` → `{mode}`: " in change.summary and says in change.summary, change.summary


def test_a_node_that_leaves_every_pool_is_released_and_the_report_says_to_drain_it_first(tmp_path):
    compared = compare(tmp_path, "prod", lambda raw: raw["pools"][1].update(nodes="gpu-b-[001-031]"))
    [left] = [f for f in compared.of(Impact.NODE_CHANGE) if f.nodes == ["gpu-b-032"]]
    assert left.change.kind == "ConfigMap" and left.change.name.startswith("dualsched-node-keeper")
    assert left.summary.startswith("the nodes leave every pool: the node keeper releases them") and "drain them in Slurm first" in left.summary
    assert "- `gpu-b-032` (1 node): the nodes leave every pool" in compared.markdown
    assert not [f for f in compared.of(Impact.NODE_CHANGE) if "gpu-b-031" in f.nodes]


def _moved(directory: Path, edit: Callable[[Path, dict], bool]) -> None:
    """Rewrite or remove (``edit`` returns False) each manifest of a render directory."""
    for path in directory.rglob("*.yaml"):
        if "slurm-files" in path.parts:
            continue
        manifest = yaml.safe_load(path.read_text())
        if edit(path, manifest):
            path.write_text(yaml.safe_dump(manifest))
        else:
            path.unlink()


def _is_keeper(manifest: dict) -> bool:
    return manifest["kind"] == "ConfigMap" and manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "node-keeper"


def _as_node_patches(directory: Path) -> None:
    """Make a render look like one of a version that labelled (and tainted) nodes with one NodePatch each:
    a Node manifest per pool node, with the pool's labels and taints, and no labels in the keeper's state."""
    [keeper_path] = [p for p in directory.rglob("*.yaml") if "slurm-files" not in p.parts and _is_keeper(yaml.safe_load(p.read_text()))]
    keeper = yaml.safe_load(keeper_path.read_text())
    desired = json.loads(keeper["data"][STATE_FILE])
    for pool in desired["pools"]:
        for name in pool["nodes"]:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": pool["labels"]},
                    **({"spec": {"taints": pool["taints"]}} if pool["taints"] else {})}
            (directory / f"node-{name}.yaml").write_text(yaml.safe_dump(node))
        del pool["labels"]
    keeper["data"][STATE_FILE] = json.dumps(desired, indent=2)
    keeper_path.write_text(yaml.safe_dump(keeper))


def test_labels_and_taints_moving_from_the_node_patches_to_the_keeper_are_no_node_change(tmp_path):
    """A base rendered by a version whose NodePatches set labels and taints: the same ones, now the keeper's."""
    render = render_raw(raw_stack("prod")).render
    write_render(render, tmp_path / "base")
    write_render(render, tmp_path / "head")
    _as_node_patches(tmp_path / "base")
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    assert Counter((c.kind, c.op) for c in plan.changes) == {("ConfigMap", "replace"): 1, ("Node", "delete"): 80}
    assert not [f for f in _findings(plan) if f.impact is Impact.NODE_CHANGE]


def test_a_label_changed_while_moving_to_the_keeper_is_reported_on_its_nodes(tmp_path):
    render = render_raw(raw_stack("prod")).render
    write_render(render, tmp_path / "base")
    write_render(render, tmp_path / "head")
    _as_node_patches(tmp_path / "base")
    for path in (tmp_path / "base").glob("node-gpu-s-*.yaml"):
        node = yaml.safe_load(path.read_text())
        node["metadata"]["labels"]["dualsched.io/slurm-gpus"] = "2"
        path.write_text(yaml.safe_dump(node))
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    changed = [f for f in _findings(plan) if f.impact is Impact.NODE_CHANGE]
    assert sorted(n for f in changed for n in f.nodes) == [f"gpu-s-{i:03d}" for i in range(1, 17)]
    assert all(f.summary.startswith("label `dualsched.io/slurm-gpus`: `2` → `4`") for f in changed), changed[0].summary


def _as_auto_named_claims(directory: Path) -> dict[str, str]:
    """Make a render look like one of a version before claimRef: shared claims named by Pulumi (the resource name
    and a suffix of its own), their PVs without claimRef, and no ignoreChanges. Returns new name -> old."""
    renamed = {}
    for path in directory.rglob("persistentvolumeclaim-dualsched-shared-*.yaml"):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        renamed[name] = f"{name.rsplit('-', 1)[0]}-0ld5uff1"

    def earlier(path: Path, manifest: dict) -> bool:
        manifest.update(_renamed(manifest, renamed))
        if manifest["kind"] == "PersistentVolume":
            del manifest["spec"]["claimRef"]
        return True

    _moved(directory, earlier)
    options = directory / "resource-options.json"
    flags = json.loads(options.read_text())
    options.write_text(json.dumps({file: {k: v for k, v in f.items() if k != "ignoreChanges"} for file, f in flags.items()}))
    return renamed


def test_a_stack_from_before_claim_ref_keeps_its_claims_and_volumes_as_the_engine_does(tmp_path):
    """The claims' names and the PVs' claimRef are ignoreChanges: `pulumi up` changes neither on an existing
    stack, so the report shows no claim deleted and created (a data risk it is not), and no PV update."""
    render = render_raw(raw_stack("prod")).render
    write_render(render, tmp_path / "base")
    write_render(render, tmp_path / "head")
    renamed = _as_auto_named_claims(tmp_path / "base")
    assert len(renamed) == 2
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    assert plan.changes == []


def test_without_ignore_changes_the_renamed_claims_would_be_a_data_risk(tmp_path):
    """The counterpart of the test above: the same renders, read as if head's options ignored nothing."""
    render = render_raw(raw_stack("prod")).render
    write_render(render, tmp_path / "base")
    write_render(render, tmp_path / "head")
    _as_auto_named_claims(tmp_path / "base")
    (tmp_path / "head" / "resource-options.json").write_text("{}")
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    ops = Counter((c.kind, c.op) for c in plan.changes)
    assert ops[("PersistentVolumeClaim", "delete")] == ops[("PersistentVolumeClaim", "create")] == 2
    assert ops[("PersistentVolume", "update")] == 2


def test_removing_the_keeper_leaves_the_taints_on_the_nodes(tmp_path):
    render = render_raw(raw_stack("prod")).render
    write_render(render, tmp_path / "base")
    write_render(render, tmp_path / "head")
    _moved(tmp_path / "head", lambda path, manifest: not _is_keeper(manifest))
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    [finding] = [f for f in _findings(plan) if f.impact is Impact.NODE_CHANGE]
    assert len(finding.nodes) == 80 and finding.change.op == "delete"
    assert "- `gpu-a-[001-032],gpu-b-[001-032],gpu-s-[001-016]` (80 nodes): node keeper removed: the nodes keep their labels and taints as they are" in render_markdown(plan)


def headline(markdown: str) -> str:
    """The headline block: from the **Impact:** line to the blank line before the summary table."""
    return markdown.split("**Impact:**", 1)[1].split("\n\n", 1)[0]


def test_pool_label_change_rolls_slurmd_instead_of_replacing_it(tmp_path):
    """The DaemonSet selector does not hold the pool label key: the pool rolls OnDelete (drain, then
    delete each pod), where a replacement would have deleted every slurmd pod and its jobs."""
    compared = compare(tmp_path, "prod", lambda raw: raw.setdefault("placement", {}).update(poolLabel="example.com/gpu-pool"))
    daemonsets = [c for c in compared.plan.changes if c.kind == "DaemonSet"]
    assert len(daemonsets) == 3 and {c.op for c in daemonsets} == {"update"}
    assert not compared.of(Impact.WORKLOAD_REPLACE)
    assert sum(len(f.nodes) for f in compared.of(Impact.SLURMD_ROLL)) == 80
    assert "slurmd pool roll** (80 GPU nodes)" in headline(compared.markdown)


def test_cluster_name_change_is_refused_in_the_headline(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw["slurm"].update(clusterName="renamed"))
    (refused,) = compared.of(Impact.CLUSTER_RENAME)
    assert refused.change.name == "slurm-config"
    top = headline(compared.markdown)
    assert "ClusterName change — refused" in top.split("\n")[0]
    assert "ClusterName `dev` → `renamed` is refused" in top and "CLUSTER NAME MISMATCH" in top
    assert "Renaming a cluster" in compared.markdown
    # slurmd keeps its DaemonSets (and so its jobs); the workloads whose selectors hold the name are
    # replaced on a deliberate rename, and the headline says what each does
    assert not [c for c in compared.plan.changes if c.kind == "DaemonSet" and c.op == "replace"]
    assert "**replace** of StatefulSet slurm/slurmctld: slurmctld is down until the new pods run; running jobs continue" in top


def test_a_removed_or_renamed_partition_heads_the_report_with_the_jobs_that_fail(tmp_path):
    """slurmctld fails the jobs of a partition slurm.conf no longer has (read_config.c, _sync_jobs_to_conf)."""
    compared = compare(tmp_path, "prod", lambda raw: raw["slurm"]["partitions"][1].update(name="train-b"))
    (removed,) = compared.of(Impact.PARTITION_REMOVED)
    assert removed.change.name == "slurm-config"
    top = headline(compared.markdown)
    assert "partition `train-a` removed from slurm.conf" in top and "fails every job, queued or running" in top
    assert not compare(tmp_path / "added", "prod", lambda raw: raw["slurm"]["partitions"].append(
        {"name": "train-b", "pools": ["h100-b"]})).of(Impact.PARTITION_REMOVED)


def test_a_replaced_slurmd_daemonset_heads_the_report_with_the_jobs_it_kills(tmp_path):
    """Any selector change of a DaemonSet (here edited into the head render) is a replacement."""
    compare(tmp_path, "dev", lambda raw: None)
    (path,) = (tmp_path / "head").rglob("daemonset-*.yaml")
    manifest = yaml.safe_load(path.read_text())
    manifest["spec"]["selector"]["matchLabels"]["example.com/extra"] = "x"
    path.write_text(yaml.safe_dump(manifest))
    plan = plan_from_renders(tmp_path / "base", tmp_path / "head")
    markdown = render_markdown(plan)
    (replaced,) = [f for f in _findings(plan) if f.impact is Impact.WORKLOAD_REPLACE]
    assert replaced.change.op == "replace" and replaced.nodes == ["gpu-001", "gpu-002"]
    assert replaced.details == ["forces replacement: `spec.selector.matchLabels.example.com/extra`"]
    top = headline(markdown)
    assert "Workload replaced" in top.split("\n")[0]
    assert "every slurmd pod on `gpu-[001-002]` is deleted: the jobs running there die" in top
    assert "nothing restarts by itself" not in markdown


def test_a_replaced_state_claim_heads_the_report_with_the_state_it_loses(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw["slurm"]["controller"]["stateStorage"].update(storageClass="fast-ssd"))
    (risk,) = compared.of(Impact.DATA_RISK)
    assert risk.change.kind == "PersistentVolumeClaim" and risk.change.op == "replace"
    assert "forces replacement: `spec.storageClassName`" in risk.details
    assert "slurmctld restarts on a new, empty state claim: its saved jobs, reservations and node state are gone" in headline(
        compared.markdown
    )


def test_cli_writes_the_report(tmp_path, capsys):
    compare(tmp_path, "dev", lambda raw: raw.setdefault("images", {}).update(vllm=NEW_VLLM))
    out = tmp_path / "report.md"
    assert main(["--base", str(tmp_path / "base"), "--head", str(tmp_path / "head"), "--out", str(out), "--title", "dev"]) == 0
    text = out.read_text()
    assert text.startswith("## dev\n") and "Inference rollout" in text
    assert MARKER not in text  # the workflow adds the marker to the comment
    with pytest.raises(SystemExit):
        main(["--base", str(tmp_path / "base")])


def _stack_file(path: Path, raw: dict[str, Any], key: str = "dualsched") -> Path:
    """A stack file holding ``raw`` under a namespace (its keys) or under one key (``ns:key``)."""
    config = {key: raw} if ":" in key else {f"{key}:{name}": value for name, value in raw.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def _slurmd_image_edit(raw: dict[str, Any]) -> None:
    raw.setdefault("images", {}).update(slurmd=NEW_SLURMD)


def test_stack_files_are_rendered_and_compared_like_render_directories(tmp_path, monkeypatch, capsys):
    compared = compare(tmp_path, "dev", _slurmd_image_edit)
    head = copy.deepcopy(raw_stack("dev"))
    _slurmd_image_edit(head)
    base_file = _stack_file(tmp_path / "main" / "Pulumi.dev.yaml", raw_stack("dev"))
    _stack_file(tmp_path / "project" / "Pulumi.dev.yaml", head)
    monkeypatch.chdir(tmp_path / "project")
    assert main(["--base", str(base_file), "--stack", "dev"]) == 0
    markdown = capsys.readouterr().out
    assert f"Source: offline render `{base_file}` → `Pulumi.dev.yaml`" in markdown
    # the same report as from the two render directories, but for the line naming its inputs
    strip = lambda text: [line for line in text.splitlines() if not line.startswith("Source:")]
    assert strip(markdown) == strip(compared.markdown)
    assert "slurmd pool roll" in markdown


def test_a_config_key_and_a_program_reach_the_rendered_sides(tmp_path, capsys):
    head = copy.deepcopy(raw_stack("dev"))
    _slurmd_image_edit(head)
    base_file = _stack_file(tmp_path / "base" / "Pulumi.dev.yaml", raw_stack("dev"), "gpu:cluster")
    head_file = _stack_file(tmp_path / "head" / "Pulumi.dev.yaml", head, "gpu:cluster")
    assert main(["--base", str(base_file), "--head", str(head_file), "--config-key", "gpu:cluster",
                 "--program", "dualsched.examples.sbatch_job:program"]) == 0
    markdown = capsys.readouterr().out
    # the config under gpu:cluster was read, and the program's Job (whose sbatch image is slurmd's) rendered on both sides
    assert "slurmd pool roll" in markdown and "replace of Job slurm-jobs/train-llm" in markdown


@pytest.mark.parametrize("argv, line", [
    (["--base", "nowhere", "--head", "nowhere"], "--base: is neither a render directory nor a stack file (got 'nowhere')"),
    (["--preview", "nowhere.json"], "--preview: cannot read it as JSON: [Errno 2] No such file or directory: 'nowhere.json' "
                                    "(got 'nowhere.json')"),
    (["--base", "Pulumi.dev.yaml", "--stack", "dev", "--config-key", "a:b:c"],
     "--config-key: must be a config namespace or one key, '<namespace>' or '<namespace>:<key>' such as 'myproj:cluster' "
     "(got 'a:b:c')"),
    (["--base", "Pulumi.dev.yaml", "--stack", "nope"],
     "--stack: there is no Pulumi.nope.yaml in the working directory {cwd} (--stack-file PATH reads one elsewhere) (got 'nope')"),
], ids=["no-such-side", "no-such-preview", "bad-config-key", "no-such-stack"])
def test_bad_input_is_exit_2_with_one_line(argv, line, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == line.format(cwd=ROOT) + "\n"


def test_the_head_is_given_once(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--base", "a", "--head", "b", "--stack", "dev"])
    assert exit_.value.code == 2 and "give the head once" in capsys.readouterr().err


# -------------------------------------------------------------------- preview JSON
#
# `pulumi preview --json` prints one document:
#
#   {"steps": [{"op": "same" | "create" | "update" | "replace" | "create-replacement"
#                     | "delete-replaced" | "delete",
#               "urn": "urn:pulumi:<stack>::<project>::<parent types $-joined>$<type>::<name>",
#               "provider": "...",
#               "oldState": {"urn", "type", "custom", "protect", "inputs": {manifest}, "outputs": {...}},
#               "newState": {... same shape ...},
#               "diffReasons": ["spec"], "replaceReasons": [...],
#               "detailedDiff": {"spec.template.spec.containers[0].image": {"kind": "update", "inputDiff": true}}},
#              ...],
#    "diagnostics": [...], "changeSummary": {"update": 1, "same": 30}}
#
# A replace shows up as create-replacement + replace + delete-replaced for one URN.
# Secret values appear inside envelopes {"4dabf18193072939515e22adb298388d":
# "1b47061264138c4ac30d75fd1eb44270", "plaintext": "<JSON text>"} (or "[secret]").

SECRET_ENVELOPE_SIG = "1b47061264138c4ac30d75fd1eb44270"
PLANTED = "planted-S3cr3t-value-0xC0FFEE"


def envelope(value: Any) -> dict[str, Any]:
    return {SECRET_SIGNATURE: SECRET_ENVELOPE_SIG, "plaintext": json.dumps(value)}


def urn(resource_type: str, name: str) -> str:
    return f"urn:pulumi:dev::dualsched::dualsched:cluster:DualScheduledCluster${resource_type}::{name}"


def state(resource_type: str, inputs: dict[str, Any], protect: bool = False) -> dict[str, Any]:
    return {"type": resource_type, "custom": True, "protect": protect, "inputs": inputs, "outputs": inputs}


def node(name: str, pool: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"dualsched.io/pool": pool}}}


def slurmd(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "slurmd-gpu-1234", "namespace": "slurm", "labels": {"app.kubernetes.io/name": "slurmd"}},
        "spec": {
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "slurmd"}},
                "spec": {
                    "nodeSelector": {"dualsched.io/pool": "gpu"},
                    "containers": [{"name": "slurmd", "image": image, "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                },
            },
        },
    }


def volume(server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "shared-slurm-5678"},
        "spec": {"persistentVolumeReclaimPolicy": "Retain", "nfs": {"server": server, "path": "/export"}},
    }


def secret(value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "db-password-9abc",
            "namespace": "slurm",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": json.dumps({"stringData": {"password": value}})},
        },
        "stringData": {"password": value},
        "data": {"password": base64.b64encode(value.encode()).decode()},
    }


def server(token: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "qwen-1", "namespace": "inference", "labels": {"app.kubernetes.io/name": "vllm"}},
        "spec": {
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"spec": {"containers": [{"name": "server", "image": "vllm:1", "env": [{"name": "HF_TOKEN", "value": token}]}]}},
        },
    }


def hand_made_preview() -> dict[str, Any]:
    daemonset, pv, sec, deploy = (
        "kubernetes:apps/v1:DaemonSet",
        "kubernetes:core/v1:PersistentVolume",
        "kubernetes:core/v1:Secret",
        "kubernetes:apps/v1:Deployment",
    )
    nodes = [
        {"op": "same", "urn": urn("kubernetes:core/v1:NodePatch", f"gpu-{i}"),
         "oldState": state("kubernetes:core/v1:NodePatch", node(f"gpu-00{i}", "gpu")),
         "newState": state("kubernetes:core/v1:NodePatch", node(f"gpu-00{i}", "gpu"))}
        for i in (1, 2)
    ]
    pv_steps = [
        {"op": op, "urn": urn(pv, "shared-slurm"), "oldState": state(pv, volume("nfs1"), True), "newState": state(pv, volume("nfs2"), True),
         "replaceReasons": ["spec"], "detailedDiff": {"spec.nfs.server": {"kind": "update-replace", "inputDiff": True}}}
        for op in ("create-replacement", "replace", "delete-replaced")
    ]
    return {
        "steps": [
            *nodes,
            {"op": "update", "urn": urn(daemonset, "slurmd-gpu"), "oldState": state(daemonset, slurmd("slurmd:1")),
             "newState": state(daemonset, slurmd("slurmd:2")), "diffReasons": ["spec"],
             "detailedDiff": {"spec.template.spec.containers[0].image": {"kind": "update", "inputDiff": True}}},
            *pv_steps,
            {"op": "update", "urn": urn(sec, "db-password"), "oldState": state(sec, secret("old-" + PLANTED)),
             "newState": state(sec, secret(PLANTED)), "diffReasons": ["stringData"]},
            {"op": "update", "urn": urn(deploy, "qwen"), "oldState": state(deploy, server(envelope("old-" + PLANTED))),
             "newState": state(deploy, server(envelope(PLANTED))), "diffReasons": ["spec"]},
        ],
        "changeSummary": {"same": 2, "update": 3, "replace": 1},
    }


def test_preview_json_is_classified_and_never_shows_a_secret(tmp_path, capsys):
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(hand_made_preview()))
    assert main(["--preview", str(path)]) == 0
    markdown = capsys.readouterr().out
    plan = plan_from_preview(json.loads(path.read_text()))
    findings = _findings(plan)

    (risk,) = [f for f in findings if f.impact is Impact.DATA_RISK]
    assert risk.change.op == "replace" and any("protected" in d for d in risk.details)
    (roll,) = [f for f in findings if f.impact is Impact.SLURMD_ROLL]
    assert roll.nodes == ["gpu-001", "gpu-002"] and "16 Slurm GPUs" in roll.summary
    assert [f.impact for f in findings if f.change.kind == "Deployment"] == [Impact.INFERENCE_ROLLOUT]
    assert "| PersistentVolume |  |  | 1 |  |" in markdown and "| Secret |  |  | 1 |  |" in markdown

    for planted in (PLANTED, base64.b64encode(PLANTED.encode()).decode(), json.dumps(PLANTED)):
        assert planted not in markdown
    assert "not shown" in markdown  # the env change is reported, without its value


def preview_from_renders(base: Render, head: Render) -> dict[str, Any]:
    """A preview document for base -> head, built as the engine would from the same resources."""

    def states(render: Render) -> dict[str, dict[str, Any]]:
        result = {}
        for obj in render.objects:
            manifest = copy.deepcopy(obj.manifest)
            if manifest["kind"] == "Secret":  # secret outputs (munge key, passwords) arrive as envelopes
                for key in ("data", "stringData"):
                    manifest[key] = {k: envelope(v) for k, v in (manifest.get(key) or {}).items()}
            result[urn(obj.pulumi_type, obj.pulumi_name)] = state(obj.pulumi_type, manifest)
        return result

    old, new = states(base), states(head)
    steps = []
    for key in list(old) + [k for k in new if k not in old]:
        before, after = old.get(key), new.get(key)
        op = "create" if before is None else "delete" if after is None else "same" if before == after else "update"
        steps.append({"op": op, "urn": key, **({"oldState": before} if before else {}), **({"newState": after} if after else {})})
    return {"steps": steps}


def test_preview_json_from_real_renders_matches_the_render_report(tmp_path):
    def edit(raw):
        raw["slurm"]["partitions"].append({"name": "debug", "pools": ["gpu"], "maxTime": "01:00:00"})
        raw.setdefault("images", {}).update(slurmd=NEW_SLURMD)

    compared = compare(tmp_path, "dev", edit)
    document = preview_from_renders(compared.base, compared.head)
    # the real generated secrets are in the document, inside envelopes
    assert any(s in json.dumps(document) for s in compared.head.generated_secrets)
    plan = plan_from_preview(document)
    findings = _findings(plan)
    assert {f.impact for f in findings} - {Impact.OTHER} == compared.impacts
    (roll,) = [f for f in findings if f.impact is Impact.SLURMD_ROLL]
    assert roll.nodes == ["gpu-001", "gpu-002"]
    markdown = render_markdown(plan)
    assert "+PartitionName=debug Nodes=gpu-[001-002]" in markdown  # from the ConfigMap data
    assert_no_secret(markdown, compared.base, compared.head)


def test_a_long_value_shows_the_part_that_changed():
    """A model server's command line or a script is long: the report shows where it differs, not its length."""
    old = "vllm serve /models/qwen --served-model-name qwen-small --tensor-parallel-size 1 --max-model-len 4096 --port 8000 --host 0.0.0.0"
    new = old.replace("--max-model-len 4096", "--max-model-len 8192")
    change = Change("update", "Deployment", "inference", "qwen-small", {}, {},
                    [Delta("spec.template.spec.containers[0].args", old, new),
                     Delta("data.script", "#!/bin/sh\nset -eu\n" + "x" * 200, "#!/bin/sh\nset -e\n" + "x" * 200)])
    [command, script] = delta_lines(change)
    assert command == ("`spec.template.spec.containers[0].args`: "
                       "`…rallel-size 1 --max-model-len 4096 --port 8000 --host 0.0.0.0` → "
                       "`…rallel-size 1 --max-model-len 8192 --port 8000 --host 0.0.0.0` (127 → 127 characters)")
    assert script == ("`data.script`: `#!/bin/sh⏎set -eu⏎" + "x" * 29 + "…` → `#!/bin/sh⏎set -e⏎" + "x" * 29 + "…` "
                      "(218 → 217 characters)")


def test_lifting_protect_is_a_data_risk_though_no_object_changes(tmp_path):
    compared = compare(tmp_path, "prod", lambda raw: raw.update(protect=False))
    lifted = [f for f in compared.findings if f.summary.startswith("`protect` lifted from")]
    assert {f.change.kind for f in lifted} >= {"PersistentVolume", "PersistentVolumeClaim", "Namespace"}
    assert all(f.impact is Impact.DATA_RISK and f.change.deltas == [] for f in lifted)
    assert "`protect` lifted from PersistentVolumeClaim slurm/" in compared.markdown


def test_setting_protect_is_reported_and_the_reverse_change_is_not_a_risk(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: raw.update(protect=True))
    set_ = [f for f in compared.findings if f.summary.startswith("`protect` set on")]
    assert set_ and all(f.impact is Impact.OTHER for f in set_)
    assert Impact.DATA_RISK not in compared.impacts


def test_promoting_a_checkpoint_names_the_directories_served_before_and_after(tmp_path):
    def promote(raw):
        raw["inference"]["models"][0]["revision"] = "step-2"

    compared = compare(tmp_path, "dev", promote)
    (rollout,) = compared.of(Impact.INFERENCE_ROLLOUT)
    assert rollout.summary.endswith(": serves `/models/qwen2.5-0.5b-instruct/step-2` instead of "
                                    "`/models/qwen2.5-0.5b-instruct` (a checkpoint promoted, or rolled back)")


# ------------------------------------------------------------ a new stack, a deleted stack


def _empty_render(path: Path) -> Path:
    path.mkdir()
    return path


def test_a_new_stacks_report_says_which_nodes_it_labels_and_taints(tmp_path):
    """The first pull request of an environment compares its render with nothing."""
    write_render(render_raw(raw_stack("prod")).render, tmp_path / "head")
    plan = plan_from_renders(_empty_render(tmp_path / "base"), tmp_path / "head")
    findings = _findings(plan)
    assert {f.change.op for f in findings} == {"create"}
    nodes = sorted({node for f in findings if f.impact is Impact.NODE_CHANGE for node in f.nodes})
    assert len(nodes) == 80, nodes
    assert "**Node label/taint change** (80 nodes)" in render_markdown(plan)


def test_a_deleted_stacks_report_leads_with_its_data_and_its_nodes(tmp_path):
    write_render(render_raw(raw_stack("prod")).render, tmp_path / "base")
    plan = plan_from_renders(tmp_path / "base", _empty_render(tmp_path / "head"))
    markdown = render_markdown(plan)
    assert "node keeper removed: the nodes keep their labels and taints as they are" in markdown
    assert headline(markdown).strip().startswith("🛑 **Storage replace or delete — DATA RISK**"), headline(markdown)


def test_a_first_preview_reports_like_a_new_stacks_render(tmp_path):
    compared = compare(tmp_path, "dev", lambda raw: None)
    document = preview_from_renders(compared.base, compared.base)
    document["steps"] = [{"op": "create", "urn": step["urn"], "newState": step["newState"]} for step in document["steps"]]
    plan = plan_from_preview(document)
    assert {c.op for c in plan.changes} == {"create"}
    assert any(f.impact is Impact.NODE_CHANGE for f in _findings(plan))
    assert_no_secret(render_markdown(plan), compared.base)
