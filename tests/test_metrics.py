"""Slurm metrics: the exporter program and collector round (against fakes of Slurm's commands; the real
ones are tests/slurm/test_slurm_exporter.py), the rendered Service, ServiceMonitor, containers and
NetworkPolicy, and the config checks."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dualsched.components.metrics import COLLECTOR_PROGRAM, EXPORTER_PROGRAM, METRICS_SERVICE, STATE_DIR, STATE_VOLUME
from dualsched.components.namespace import METRICS_PORT
from dualsched.components.programs import slurm_exporter, source
from dualsched.components.submission import PROGRAM_DIR
from dualsched.config import ConfigError, parse_stack_config
from exposition import find, parse, running_exporter
from dualsched.policy import offline
from dualsched.policy.rules import violations
from rendering import container, mounts, pod_spec, raw_stack, render_raw, render_stack, variant, volume

PROGRAMS = Path(__file__).resolve().parent.parent / "components" / "programs"

NODE_LINE = (
    "NodeName=gpu-001 Arch=x86_64 CoresPerSocket=1 CPUAlloc=4 CPUEfctv=14 CPUTot=16 CPULoad=0.10 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:4 NodeAddr=10.0.0.5 NodeHostName=gpu-001 "
    "Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian RealMemory=3000 AllocMem=1024 FreeMem=N/A "
    "Sockets=16 Boards=1 MemSpecLimit=1000 State=MIXED+CLOUD+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu CfgTRES=cpu=16,mem=3000M,billing=16,gres/gpu=4 AllocTRES=cpu=4,mem=1G,gres/gpu=3 "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 Reason=maintenance window [root@2026-12-03T10:00:00]"
)
IDLE_NODE_LINE = "NodeName=gpu-002 CPUAlloc=0 CPUTot=16 RealMemory=3000 AllocMem=0 State=DOWN*+NOT_RESPONDING CfgTRES=cpu=16,mem=3000M,gres/gpu=4 AllocTRES="
JOBS = "\n".join([
    "41|RUNNING|gpu|alice|gpu-[001-002]",
    "42_3|RUNNING|gpu|bob|gpu-001",
    "43|PENDING|gpu|alice|",
    "44|PENDING|cpu|bob|",
]) + "\n"  # fmt: skip
SDIAG = """*******************************************************
sdiag output at Thu Dec 03 20:00:00 2026 (1796328000)
Data since      Thu Dec 03 00:00:00 2026 (1796256000)
*******************************************************
Server thread count:  3
Agent queue size:     0
Agent count:          0
DBD Agent queue size: 0

Jobs submitted: 12
Jobs started:   10
Jobs completed: 8
Jobs canceled:  1
Jobs failed:    0

Job states ts:  Thu Dec 03 20:00:00 2026 (1796328000)
Jobs pending:   2
Jobs running:   2

Main schedule statistics (microseconds):
\tLast cycle:   250
\tMax cycle:    900
\tTotal cycles: 40
\tMean cycle:   300
\tMean depth cycle:  2

Backfilling stats
\tTotal backfilled jobs (since last slurm start): 5
\tTotal backfilled jobs (since last stats cycle start): 1
\tTotal cycles: 7
\tLast cycle when: Thu Dec 03 19:59:30 2026 (1796327970)
\tLast cycle: 1500
\tMax cycle:  4000
\tMean cycle: 2000

Remote Procedure Call statistics by message type
\tREQUEST_PARTITION_INFO ( 2009) count:10 ave_time:87 total_time:876
\tTotal cycles: 99
"""


def _value(samples, name, **labels) -> float:
    found = find(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0].value


# ----------------------------------------------------------------------------- the exporter's parsing


@pytest.mark.parametrize(
    "expression, names",
    [
        ("gpu-001", ["gpu-001"]),
        ("gpu-[001-003,007]", ["gpu-001", "gpu-002", "gpu-003", "gpu-007"]),
        ("a-[1-2]-b-[8-9],cpu-1", ["a-1-b-8", "a-1-b-9", "a-2-b-8", "a-2-b-9", "cpu-1"]),
        ("", []),
    ],
)
def test_host_lists_expand_as_slurm_writes_them(expression, names):
    assert slurm_exporter.expand_hostlist(expression) == names


def _exposed(tmp_path: Path, nodes=NODE_LINE + "\n" + IDLE_NODE_LINE + "\n", jobs=JOBS, sdiag=SDIAG, max_age=90.0):
    for name, text in (("nodes", nodes), ("jobs", jobs), ("sdiag", sdiag)):
        if text is not None:
            (tmp_path / name).write_text(text)
    return parse(slurm_exporter.exposition(slurm_exporter.snapshot_samples(tmp_path, max_age, time.time())))


def test_node_series_carry_the_kubernetes_node_name_and_slurms_counts(tmp_path):
    types, samples = _exposed(tmp_path)
    labels = {"node": "gpu-001", "slurm_node": "gpu-001"}
    assert _value(samples, "slurm_node_state", **labels) == 1
    assert find(samples, "slurm_node_state", **labels)[0].labels["state"] == "mixed"
    assert {s.labels["flag"] for s in find(samples, "slurm_node_state_flag", **labels)} == {"cloud", "drain"}
    assert find(samples, "slurm_node_state", node="gpu-002")[0].labels["state"] == "down"
    assert _value(samples, "slurm_node_gpus", **labels) == 4
    assert _value(samples, "slurm_node_gpus_allocated", **labels) == 3
    assert _value(samples, "slurm_node_gpus_allocated", node="gpu-002") == 0
    assert _value(samples, "slurm_node_cpus", **labels) == 14  # CoreSpecCount's cores are not the jobs'
    assert _value(samples, "slurm_node_cpus", node="gpu-002") == 16  # no CPUEfctv before 22.05
    assert _value(samples, "slurm_node_cpus_allocated", **labels) == 4
    assert _value(samples, "slurm_node_memory_bytes", **labels) == (3000 - 1000) * 2**20  # less MemSpecLimit
    assert _value(samples, "slurm_node_memory_allocated_bytes", **labels) == 1024 * 2**20
    assert all(kind == "gauge" for kind in types.values())


def test_jobs_are_counted_by_state_and_partition_and_placed_on_their_nodes(tmp_path):
    _, samples = _exposed(tmp_path)
    assert _value(samples, "slurm_jobs", state="running", partition="gpu") == 2
    assert _value(samples, "slurm_jobs", state="pending", partition="gpu") == 1
    assert _value(samples, "slurm_jobs", state="pending", partition="cpu") == 1
    assert _value(samples, "slurm_node_jobs", node="gpu-001") == 2
    assert _value(samples, "slurm_node_jobs", node="gpu-002") == 1
    placed = {(s.labels["job_id"], s.labels["node"], s.labels["user"]) for s in find(samples, "slurm_job_node")}
    assert placed == {("41", "gpu-001", "alice"), ("41", "gpu-002", "alice"), ("42_3", "gpu-001", "bob")}


def test_an_idle_node_has_a_zero_job_count(tmp_path):
    _, samples = _exposed(tmp_path, jobs="")
    assert _value(samples, "slurm_node_jobs", node="gpu-001", slurm_node="gpu-001") == 0
    assert not find(samples, "slurm_jobs")


def test_sdiag_gives_the_schedulers_statistics_from_their_own_sections(tmp_path):
    _, samples = _exposed(tmp_path)
    assert _value(samples, "slurm_scheduler_threads") == 3
    assert _value(samples, "slurm_scheduler_jobs", event="submitted") == 12
    assert _value(samples, "slurm_scheduler_jobs", event="failed") == 0
    assert _value(samples, "slurm_scheduler_cycle_last_seconds", scheduler="main") == pytest.approx(250e-6)
    assert _value(samples, "slurm_scheduler_cycle_mean_seconds", scheduler="backfill") == pytest.approx(2000e-6)
    assert _value(samples, "slurm_scheduler_cycles", scheduler="main") == 40  # not the RPC table's line
    assert _value(samples, "slurm_scheduler_cycles", scheduler="backfill") == 7
    assert _value(samples, "slurm_scheduler_backfilled_jobs") == 5


def test_fresh_snapshots_are_up_and_a_missing_or_stale_one_is_not(tmp_path):
    _, samples = _exposed(tmp_path)
    assert _value(samples, "slurm_up") == 1
    assert _value(samples, "slurm_exporter_snapshot_age_seconds", source="sdiag") < 60

    old = time.time() - 600
    os.utime(tmp_path / "sdiag", (old, old))
    _, samples = parse(slurm_exporter.exposition(slurm_exporter.snapshot_samples(tmp_path, 90, time.time())))
    assert _value(samples, "slurm_up") == 0
    assert _value(samples, "slurm_exporter_snapshot_age_seconds", source="sdiag") >= 600

    (tmp_path / "sdiag").unlink()
    _, samples = parse(slurm_exporter.exposition(slurm_exporter.snapshot_samples(tmp_path, 90, time.time())))
    assert _value(samples, "slurm_up") == 0
    assert not find(samples, "slurm_exporter_snapshot_age_seconds", source="sdiag")
    assert find(samples, "slurm_node_gpus")  # what was collected is still served


def test_label_values_are_escaped(tmp_path):
    _, samples = _exposed(tmp_path, jobs='7|RUNNING|gpu|we"ird\\user|gpu-001\n')
    assert find(samples, "slurm_job_node")[0].labels["user"] == 'we"ird\\user'


# ----------------------------------------------------------------------------- the exporter's server


@pytest.fixture
def exporter(tmp_path):
    with running_exporter(tmp_path) as url:
        yield url


def test_the_server_answers_metrics_with_the_text_formats_content_type_and_nothing_else(tmp_path, exporter):
    (tmp_path / "nodes").write_text(NODE_LINE + "\n")
    with urllib.request.urlopen(f"{exporter}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        _, samples = parse(response.read().decode())
    assert _value(samples, "slurm_node_gpus", node="gpu-001") == 4
    assert _value(samples, "slurm_up") == 0  # jobs and sdiag never collected
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{exporter}/", timeout=10)
    assert refused.value.code == 404


# ----------------------------------------------------------------------------- the collector round


def _fake_slurm(bin_dir: Path, failing: str = "") -> None:
    """scontrol, squeue and sdiag that print their arguments; ``failing`` exits 1 with a message."""
    bin_dir.mkdir(exist_ok=True)
    for command in ("scontrol", "squeue", "sdiag"):
        body = f'echo "{command} down" >&2; exit 1' if command == failing else f'echo "{command} $*"'
        (bin_dir / command).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / command).chmod(0o755)


def _collect(tmp_path: Path, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run(["sh", str(PROGRAMS / COLLECTOR_PROGRAM), str(state)], env=env, capture_output=True, text=True, timeout=30)


def test_a_collector_round_writes_each_commands_output_and_keeps_the_last_good_one(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin")
    assert _collect(tmp_path, state).returncode == 0
    assert (state / "nodes").read_text() == "scontrol --oneliner show node\n"
    assert (state / "jobs").read_text() == "squeue --noheader --all --array --format=%i|%T|%P|%u|%N\n"
    assert (state / "sdiag").read_text() == "sdiag \n"  # no arguments

    _fake_slurm(tmp_path / "bin", failing="squeue")
    result = _collect(tmp_path, state)
    assert "jobs: squeue" in result.stderr and "squeue down" in result.stderr
    assert (state / "jobs").read_text().startswith("squeue --noheader")  # the last good output stays
    assert sorted(p.name for p in state.iterdir() if not p.name.startswith(".")) == ["jobs", "nodes", "sdiag"]


# ----------------------------------------------------------------------------- rendering


def _enable(raw, **settings):
    raw["slurm"]["metrics"] = {"enabled": True, **settings}


def _metrics_render(**settings):
    return render_raw(variant("dev", lambda raw: _enable(raw, **settings)))


def _statefulset(rendered):
    return rendered.named("StatefulSet", "slurmctld", "slurm")


def test_without_metrics_nothing_is_added():
    rendered = render_stack("dev")
    assert not [o for o in rendered.objects if o.name.startswith(METRICS_SERVICE)]
    assert {c["name"] for c in pod_spec(_statefulset(rendered))["containers"]} == {"slurmctld", "reconfigure"}
    assert not rendered.components("dualsched:metrics:SlurmMetrics")


def test_the_service_selects_slurmctlds_pods_on_the_named_metrics_port():
    rendered = _metrics_render()
    service = rendered.named("Service", METRICS_SERVICE, "slurm").manifest
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]
    pod_labels = _statefulset(rendered).manifest["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == pod_labels
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == METRICS_SERVICE
    assert rendered.registration(rendered.named("Service", METRICS_SERVICE, "slurm")).parent_type == "dualsched:metrics:SlurmMetrics"
    assert not rendered.by_kind("ServiceMonitor")


def test_slurmctlds_pod_runs_the_collector_and_the_exporter_from_its_programs():
    rendered = _metrics_render(intervalSeconds=15)
    statefulset = _statefulset(rendered)
    exporter, collector = container(statefulset, "exporter"), container(statefulset, "metrics-collector")
    assert exporter["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT}]
    assert exporter["command"] == ["python3", f"{PROGRAM_DIR}/{EXPORTER_PROGRAM}"]
    env = {e["name"]: e["value"] for e in exporter["env"]}
    assert env["EXPORTER_STATE_DIR"] == STATE_DIR and env["EXPORTER_MAX_AGE"] == "45"
    assert exporter["securityContext"]["runAsUser"] == 65534 and exporter["securityContext"]["readOnlyRootFilesystem"]
    assert mounts(exporter)[STATE_DIR]["readOnly"] is True
    assert f"sh {PROGRAM_DIR}/{COLLECTOR_PROGRAM} {STATE_DIR}; sleep 15" in collector["command"][-1]
    assert not mounts(collector)[STATE_DIR].get("readOnly")
    assert collector["image"] == container(statefulset, "slurmctld")["image"]
    assert volume(statefulset, STATE_VOLUME)["emptyDir"] == {}
    programs = rendered.named("ConfigMap", "slurmctld-programs", "slurm").manifest["data"]
    assert programs[EXPORTER_PROGRAM] == source(EXPORTER_PROGRAM)
    assert programs[COLLECTOR_PROGRAM] == source(COLLECTOR_PROGRAM)


def test_the_network_policy_admits_the_scrape_namespaces_on_the_metrics_port_only():
    rendered = _metrics_render(scrapeNamespaces=["monitoring", "observability"])
    [policy] = [o for o in rendered.by_kind("NetworkPolicy") if o.name.startswith("dualsched-slurm-slurm-metrics-")]
    spec = policy.manifest["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "slurmctld"}}
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"port": METRICS_PORT, "protocol": "TCP"}]
    assert [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in rule["from"]] == ["monitoring", "observability"]


def test_a_service_monitor_only_when_asked_and_labelled_for_prometheus():
    rendered = _metrics_render(serviceMonitor=True, serviceMonitorLabels={"release": "kube-prometheus-stack"})
    [monitor] = rendered.by_kind("ServiceMonitor")
    manifest = monitor.manifest
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["metadata"]["namespace"] == "slurm"
    assert manifest["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = rendered.named("Service", METRICS_SERVICE, "slurm").manifest
    assert manifest["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert manifest["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]


# ----------------------------------------------------------------------------- config checks


def _problems(metrics: dict) -> str:
    raw = raw_stack("dev")
    raw["slurm"]["metrics"] = metrics
    with pytest.raises(ConfigError) as error:
        parse_stack_config(raw, "dev")
    return str(error.value)


def test_a_service_monitor_or_its_labels_without_what_they_need_are_refused_together():
    message = _problems({"serviceMonitor": False, "serviceMonitorLabels": {"release": "prom"}, "enabled": False})
    assert "slurm.metrics.serviceMonitorLabels: label the ServiceMonitor, and slurm.metrics.serviceMonitor is false (got {'release': 'prom'})" in message
    message = _problems({"serviceMonitor": True, "serviceMonitorLabels": {"release": "prom"}})
    assert "slurm.metrics.serviceMonitor: needs slurm.metrics.enabled" in message and "(got True)" in message


@pytest.mark.parametrize(
    "metrics, path",
    [
        ({"enabled": True, "intervalSeconds": 1}, "slurm.metrics.intervalSeconds"),
        ({"enabled": True, "scrapeNamespaces": ["Not_A_Namespace"]}, "slurm.metrics.scrapeNamespaces[0]"),
        ({"enabled": True, "scrapeNamespaces": []}, "slurm.metrics.scrapeNamespaces"),
        ({"enabled": True, "serviceMonitor": True, "serviceMonitorLabels": {"release": "has space"}}, "slurm.metrics.serviceMonitorLabels"),
    ],
)
def test_bad_metrics_settings_name_their_path(metrics, path):
    assert f"{path}" in _problems(metrics)


def test_the_prod_stack_with_metrics_passes_every_policy_rule():
    raw = raw_stack("prod")
    _enable(raw, serviceMonitor=True, serviceMonitorLabels={"release": "prometheus"})
    config = parse_stack_config(raw, "prod with metrics")
    resources = offline.rendered_resources(config)
    assert any(r.kind == "ServiceMonitor" for r in resources)
    assert violations(resources, offline.settings_for(config)) == []
