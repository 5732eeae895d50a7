"""The slurmd rollout controller: its program's decisions on observed state (which node to drain,
when to replace its pod, which node to resume and which never), its Slurm bridge, and the deployed
parts (RBAC, the split of credentials between its two containers, network policy, config).
Its work on three real nodes with running jobs is tests/multinode/test_slurmd_rollout_across_nodes.py."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dualsched.components.programs import slurmd_rollout as program
from dualsched.components.programs.slurmd_rollout import (
    DeletePod, Drain, Report, Resume, Rollout, SlurmBridge, SlurmdPod, SlurmFailed, SlurmNode, current_revisions, drain_reason,
    drained_since, parse_sinfo, plan, slurmd_pods,
)
from dualsched.components.slurmd_rollout import BRIDGE_FILE, EXCHANGE_DIR, PROGRAM_DIR, PROGRAM_FILE, TOKEN_DIR
from dualsched.config import ConfigError, parse_stack_config
from rendering import container, pod_spec, raw_stack, render_raw, render_stack, variant

NOW = datetime(2026, 12, 3, 20, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
OURS = drain_reason("new", NOW - timedelta(minutes=5))


def pod(node: str, revision: str = "old", ready: bool = True, deleting: bool = False) -> SlurmdPod:
    return SlurmdPod(name=f"slurmd-{node}", node=node, revision=revision, current="new", ready=ready, deleting=deleting)


def nodes(*entries: tuple) -> dict[str, SlurmNode]:
    """(name, state, reason[, allocated CPUs])"""
    return {entry[0]: SlurmNode(*entry) for entry in entries}


# ------------------------------------------------------------------ decisions


def test_outdated_nodes_are_drained_up_to_max_unavailable_in_name_order():
    pods = [pod("gpu-3"), pod("gpu-1"), pod("gpu-2")]
    seen = nodes(("gpu-1", "mixed", "none"), ("gpu-2", "idle", "none"), ("gpu-3", "allocated", "none"))
    assert plan(pods, seen, 2, DAY, NOW) == [Drain("gpu-1", drain_reason("new", NOW)), Drain("gpu-2", drain_reason("new", NOW))]


def test_a_node_still_draining_for_the_rollout_uses_the_budget_and_waits():
    seen = nodes(("gpu-1", "draining", OURS), ("gpu-2", "idle", "none"))
    assert plan([pod("gpu-1"), pod("gpu-2")], seen, 1, DAY, NOW) == []


def test_the_pod_of_a_drained_node_is_deleted_once_no_job_is_left():
    seen = nodes(("gpu-1", "drained", OURS))
    assert plan([pod("gpu-1")], seen, 1, DAY, NOW) == [DeletePod("gpu-1", "slurmd-gpu-1")]


def test_the_node_is_resumed_only_when_its_new_slurmd_is_ready_and_answers_slurm():
    assert plan([pod("gpu-1", "new", ready=False)], nodes(("gpu-1", "drained", OURS)), 1, DAY, NOW) == []
    assert plan([pod("gpu-1", "new")], nodes(("gpu-1", "drained*", OURS)), 1, DAY, NOW) == []
    assert plan([pod("gpu-1", "new")], nodes(("gpu-1", "drained", OURS)), 1, DAY, NOW) == [Resume("gpu-1")]


def test_while_the_old_pod_terminates_nothing_is_done_on_its_node():
    assert plan([pod("gpu-1", deleting=True)], nodes(("gpu-1", "drained*", OURS)), 1, DAY, NOW) == []


@pytest.mark.parametrize("reason", ["dualsched:health gpu xid 79", "admin: bad DIMM", "none"])
def test_a_node_drained_by_anyone_else_is_never_resumed(reason):
    seen = nodes(("gpu-1", "drained", reason))
    assert plan([pod("gpu-1", "new")], seen, 1, DAY, NOW) == []
    # its outdated pod is replaced once no job is left, without a drain of ours and without the budget
    both = [pod("gpu-1"), pod("gpu-2")]
    assert plan(both, {**seen, **nodes(("gpu-2", "idle", "none"))}, 1, DAY, NOW) == [
        DeletePod("gpu-1", "slurmd-gpu-1"), Drain("gpu-2", drain_reason("new", NOW))]  # fmt: skip


def test_a_node_someone_else_drains_while_jobs_run_is_reported_and_left_alone():
    [report] = plan([pod("gpu-1")], nodes(("gpu-1", "draining", "admin: maintenance")), 1, DAY, NOW)
    assert isinstance(report, Report) and "someone else" in report.message


def test_past_the_deadline_jobs_keep_running_and_the_node_is_reported():
    late = drain_reason("new", NOW - timedelta(hours=25))
    [report] = plan([pod("gpu-1")], nodes(("gpu-1", "draining", late)), 1, DAY, NOW)
    assert report.node == "gpu-1" and "deadline" in report.message and "waiting" in report.message
    # within the deadline: no report; and the same words on every later pass, so it is logged once
    assert plan([pod("gpu-1")], nodes(("gpu-1", "draining", OURS)), 1, DAY, NOW) == []
    assert plan([pod("gpu-1")], nodes(("gpu-1", "draining", late)), 1, DAY, NOW + timedelta(hours=1)) == [report]


def test_a_rollback_before_the_pod_was_replaced_resumes_the_node():
    """The template went back: the pod is current again, so the drain has no reason to stay."""
    assert plan([pod("gpu-1", "new")], nodes(("gpu-1", "draining", OURS)), 1, DAY, NOW) == [Resume("gpu-1")]


REFUSED = "gres/gpu count reported lower than configured (2 < 4)"
"""slurmctld's reason when the outdated slurmd registers the GPUs of the pool's old mode."""


def test_a_node_slurmctld_refused_after_a_gpu_change_gets_our_drain_within_the_budget():
    assert plan([pod("gpu-1")], nodes(("gpu-1", "inval", REFUSED)), 1, DAY, NOW) == [Drain("gpu-1", drain_reason("new", NOW))]
    busy = nodes(("gpu-1", "inval", REFUSED), ("gpu-2", "draining", OURS))
    assert plan([pod("gpu-1"), pod("gpu-2")], busy, 1, DAY, NOW) == []


def test_a_refused_node_with_our_drain_is_replaced_once_its_jobs_end_then_resumed():
    assert plan([pod("gpu-1")], nodes(("gpu-1", "inval", OURS, 2)), 1, DAY, NOW) == []
    assert plan([pod("gpu-1")], nodes(("gpu-1", "inval", OURS, 0)), 1, DAY, NOW) == [DeletePod("gpu-1", "slurmd-gpu-1")]
    assert plan([pod("gpu-1", "new")], nodes(("gpu-1", "drained", OURS)), 1, DAY, NOW) == [Resume("gpu-1")]


def test_a_node_slurm_does_not_know_is_left_alone():
    assert plan([pod("gpu-9")], nodes(("gpu-1", "idle", "none")), 1, DAY, NOW) == []


def test_the_drain_reason_carries_its_start_which_survives_a_restart():
    reason = drain_reason("5d8f7c", NOW)
    assert reason == "dualsched:upgrade to 5d8f7c since 2026-12-03T20:00:00Z"
    assert drained_since(reason) == NOW
    assert drained_since("admin: since yesterday") is None


# ------------------------------------------------------------------ observations


def test_sinfo_lists_each_node_once_with_its_full_reason():
    out = "gpu-1|drained|0/8/0/8|dualsched:upgrade to a since 2026-12-03T20:00:00Z\n" \
          "gpu-1|drained|0/8/0/8|dualsched:upgrade to a since 2026-12-03T20:00:00Z\n" \
          "gpu-2|mixed|2/6/0/8|none\ngpu-3|draining*|4/0/4/8|admin: a|b\ngpu-4|inval|2/0/6/8|gres/gpu count reported lower\n"  # fmt: skip
    parsed = parse_sinfo(out)
    assert sorted(parsed) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert parsed["gpu-4"].invalid and parsed["gpu-4"].draining and parsed["gpu-4"].allocated_cpus == 2
    assert parsed["gpu-1"].drained and parsed["gpu-1"].ours and parsed["gpu-1"].responding
    assert parsed["gpu-3"].draining and not parsed["gpu-3"].responding and parsed["gpu-3"].reason == "admin: a|b"
    assert not parsed["gpu-2"].ours


def _owned(uid: str) -> list[dict]:
    return [{"uid": uid, "controller": True, "kind": "DaemonSet", "name": uid}]


def test_the_current_revision_is_the_highest_numbered_one_of_each_daemonset():
    revisions = [
        {"metadata": {"ownerReferences": _owned("ds-a"), "labels": {"controller-revision-hash": "a1"}}, "revision": 1},
        {"metadata": {"ownerReferences": _owned("ds-a"), "labels": {"controller-revision-hash": "a2"}}, "revision": 3},
        {"metadata": {"ownerReferences": _owned("ds-b"), "labels": {"controller-revision-hash": "b1"}}, "revision": 2},
        {"metadata": {"labels": {"controller-revision-hash": "orphan"}}, "revision": 9},
    ]
    assert current_revisions(revisions) == {"ds-a": "a2", "ds-b": "b1"}


def test_slurmd_pods_carry_their_node_revision_and_readiness():
    pods = [
        {"metadata": {"name": "p1", "ownerReferences": _owned("ds-a"), "labels": {"controller-revision-hash": "a1"}},
         "spec": {"nodeName": "gpu-1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "p2", "ownerReferences": _owned("ds-a"), "labels": {"controller-revision-hash": "a2"},
                      "deletionTimestamp": "2026-12-03T20:00:00Z"}, "spec": {"nodeName": "gpu-2"}, "status": {}},
        {"metadata": {"name": "unscheduled", "ownerReferences": _owned("ds-a"), "labels": {}}, "spec": {}},
        {"metadata": {"name": "foreign", "ownerReferences": _owned("ds-x"), "labels": {}}, "spec": {"nodeName": "gpu-1"}},
    ]  # fmt: skip
    found = slurmd_pods(pods, {"ds-a": "a2"})
    assert found == [SlurmdPod("p1", "gpu-1", "a1", "a2", True, False), SlurmdPod("p2", "gpu-2", "a2", "a2", False, True)]
    assert found[0].outdated and not found[1].outdated


class FakeApi:
    def __init__(self, revisions: list[dict], pods: list[dict]):
        self.revisions, self.pods, self.deleted = revisions, pods, []

    def list(self, path: str) -> list[dict]:
        assert "labelSelector=app.kubernetes.io/name%3Dslurmd%2Capp.kubernetes.io/part-of%3Ddualsched" in path, path
        return self.revisions if "/controllerrevisions?" in path else self.pods

    def delete(self, path: str) -> None:
        self.deleted.append(path)


class FakeSlurm:
    def __init__(self, sinfo: str):
        self.sinfo, self.calls = sinfo, []

    def run(self, *args: str) -> str:
        self.calls.append(args)
        return self.sinfo if args[0] == "sinfo" else ""


def test_a_pass_drains_then_a_later_one_deletes_and_reports_once():
    revisions = [{"metadata": {"ownerReferences": _owned("ds"), "labels": {"controller-revision-hash": "new"}}, "revision": 2}]
    pods = [{"metadata": {"name": f"p{i}", "ownerReferences": _owned("ds"), "labels": {"controller-revision-hash": "old"}},
             "spec": {"nodeName": f"gpu-{i}"}, "status": {}} for i in (1, 2)]  # fmt: skip
    api, lines = FakeApi(revisions, pods), []
    slurm = FakeSlurm("gpu-1|idle|0/8/0/8|none\ngpu-2|idle|0/8/0/8|none\n")
    rollout = Rollout(api, slurm, "slurm", 1, DAY, lines.append)
    rollout.run_pass(NOW)
    assert slurm.calls[1] == ("scontrol", "update", "nodename=gpu-1", "state=drain", f"reason={drain_reason('new', NOW)}")
    slurm.sinfo = f"gpu-1|drained|0/8/0/8|{drain_reason('new', NOW)}\ngpu-2|draining|4/4/0/8|admin: disk\n"
    rollout.run_pass(NOW)
    rollout.run_pass(NOW)
    assert api.deleted == ["/api/v1/namespaces/slurm/pods/p1", "/api/v1/namespaces/slurm/pods/p1"]
    assert sum("someone else" in line for line in lines) == 1, lines


# ------------------------------------------------------------------ the Slurm bridge


@pytest.fixture
def bridge(tmp_path):
    """slurm_bridge.sh in bash, as its container runs it, with sinfo and scontrol doubles on PATH (they print
    their arguments)."""
    bin_dir, exchange = tmp_path / "bin", tmp_path / "exchange"
    bin_dir.mkdir(), exchange.mkdir()
    for command in ("sinfo", "scontrol"):
        (bin_dir / command).write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n[ "$1" = fail ] && exit 3\nexit 0\n')
        (bin_dir / command).chmod(0o755)
    script = Path(program.__file__).with_name(BRIDGE_FILE)
    process = subprocess.Popen(["bash", str(script), str(exchange)], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    yield exchange
    process.kill()
    process.wait()


def test_the_bridge_runs_sinfo_with_its_arguments_intact(bridge):
    slurm = SlurmBridge(bridge, timeout=10)
    assert slurm.run("sinfo", "--format=%N|%T|%E", "a b") == "[--format=%N|%T|%E]\n[a b]\n"
    with pytest.raises(SlurmFailed, match="exit 3"):
        slurm.run("sinfo", "fail")
    assert sorted(p.name for p in bridge.iterdir()) == []


@pytest.mark.parametrize("command", [
    ("rm", "-rf", "/"),
    ("scontrol", "shutdown"),
    ("scontrol", "update", "jobid=7", "priority=1"),
    ("scontrol", "update", "partitionname=gpu", "state=down"),
    ("scontrol", "update", "nodename=n1", "state=down", "reason=x"),
    ("scontrol", "update", "nodename=n1", "state=drain"),
    ("scontrol", "update", "nodename=n1", "state=resume", "weight=1"),
    ("scontrol", "delete", "nodename=n1"),
])
def test_the_bridge_refuses_all_but_sinfo_and_the_rollouts_drain_and_resume(bridge, command):
    """The bridge's container is SlurmUser's: scontrol there could stop the cluster or change any job."""
    with pytest.raises(SlurmFailed, match=f"exit 126: refused: {command[0]}"):
        SlurmBridge(bridge, timeout=10).run(*command)


def test_the_bridge_runs_the_rollouts_drain_and_resume(bridge):
    """With an scontrol double that prints its arguments: exactly what the program asks for runs."""
    slurm = SlurmBridge(bridge, timeout=10)
    drain = ("scontrol", "update", "nodename=n1", "state=drain", "reason=dualsched:upgrade to abc")
    assert slurm.run(*drain) == "".join(f"[{a}]\n" for a in drain[1:])
    assert slurm.run("scontrol", "update", "nodename=n1", "state=resume") == "[update]\n[nodename=n1]\n[state=resume]\n"


def test_without_a_bridge_a_request_times_out_and_is_withdrawn(tmp_path):
    with pytest.raises(SlurmFailed, match="no answer"):
        SlurmBridge(tmp_path, timeout=0.5).run("sinfo")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ deployed parts


def _rollout_objects(rendered):
    [deployment] = [d for d in rendered.in_namespace("slurm", "Deployment") if "slurmd-rollout" in d.name]
    return deployment


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_rollout_may_list_and_delete_pods_and_list_revisions_in_the_slurm_namespace_only(stack):
    rendered = render_stack(stack)
    [role] = [r for r in rendered.by_kind("Role") if r.manifest["metadata"]["labels"]["app.kubernetes.io/name"] == "slurmd-rollout"]
    assert role.namespace == "slurm"
    assert role.manifest["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
        {"apiGroups": ["apps"], "resources": ["controllerrevisions"], "verbs": ["list"]},
    ]
    [binding] = [b for b in rendered.by_kind("RoleBinding") if b.manifest["roleRef"]["name"] == role.name]
    [account] = [a for a in rendered.in_namespace("slurm", "ServiceAccount") if "slurmd-rollout" in a.name]
    assert binding.manifest["subjects"] == [{"kind": "ServiceAccount", "name": account.name, "namespace": "slurm"}]
    assert pod_spec(_rollout_objects(rendered))["serviceAccountName"] == account.name
    assert not any("slurmd-rollout" in r.name for r in rendered.by_kind("ClusterRoleBinding"))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_token_and_the_munge_socket_are_never_in_the_same_container(stack):
    deployment = _rollout_objects(render_stack(stack))
    spec, rollout, slurm = pod_spec(deployment), container(deployment, "rollout"), container(deployment, "slurm")
    assert spec["automountServiceAccountToken"] is False
    assert deployment.manifest["spec"]["replicas"] == 1
    assert deployment.manifest["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    rollout_paths = {m["mountPath"] for m in rollout["volumeMounts"]}
    slurm_paths = {m["mountPath"] for m in slurm["volumeMounts"]}
    assert TOKEN_DIR in rollout_paths and TOKEN_DIR not in slurm_paths
    assert "/run/munge" in slurm_paths and not any("munge" in m["name"] for m in rollout["volumeMounts"])
    assert EXCHANGE_DIR in rollout_paths & slurm_paths
    assert rollout["command"] == ["python3", f"{PROGRAM_DIR}/{PROGRAM_FILE}"]
    assert slurm["command"] == ["bash", f"{PROGRAM_DIR}/{BRIDGE_FILE}", EXCHANGE_DIR]
    assert rollout["securityContext"]["runAsUser"] == 65534 and rollout["securityContext"]["readOnlyRootFilesystem"] is True
    assert slurm["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_config_sets_the_budget_and_the_deadline():
    def edit(raw):
        raw["slurm"]["slurmdRollout"] = {"maxUnavailable": 3, "drainDeadlineMinutes": 90}

    env = {e["name"]: e.get("value") for e in container(_rollout_objects(render_raw(variant("dev", edit))), "rollout")["env"]}
    assert env["ROLLOUT_MAX_UNAVAILABLE"] == "3" and env["ROLLOUT_DRAIN_DEADLINE_SECONDS"] == "5400"
    defaults = {e["name"]: e.get("value") for e in container(_rollout_objects(render_stack("dev")), "rollout")["env"]}
    assert defaults["ROLLOUT_MAX_UNAVAILABLE"] == "1" and defaults["ROLLOUT_DRAIN_DEADLINE_SECONDS"] == str(24 * 3600)


def test_a_zero_budget_or_deadline_is_refused_with_its_path():
    raw = raw_stack("dev")
    raw["slurm"]["slurmdRollout"] = {"maxUnavailable": 0, "drainDeadlineMinutes": 0}
    with pytest.raises(ConfigError) as refused:
        parse_stack_config(raw, "Pulumi.dev.yaml")
    message = str(refused.value)
    assert "slurm.slurmdRollout.maxUnavailable" in message and "(got 0)" in message
    assert "slurm.slurmdRollout.drainDeadlineMinutes" in message


def test_the_rollout_reaches_the_api_server_and_slurmctld_and_slurmctld_lets_it_in():
    rendered = render_stack("dev")
    policies = {p.manifest["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name"): p.manifest["spec"]
                for p in rendered.in_namespace("slurm", "NetworkPolicy")}  # fmt: skip
    rollout = policies["slurmd-rollout"]
    ports = [port["port"] for rule in rollout["egress"] for port in rule["ports"]]
    assert 6817 in ports and set(ports) - {6817} == set(rendered.config.network.api_server_ports)
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "slurmd-rollout"}}} in policies["slurmctld"]["ingress"][0]["from"]
