"""Shared placement: Slurm's control daemons and the closed-window taint of time-shared pools."""

from __future__ import annotations

import pytest

from rendering import pod_spec, render_raw, render_stack, variant

WINDOW_TOLERATION = {"key": "dualsched.io/inference-window", "operator": "Equal", "value": "closed", "effect": "NoExecute"}
CONTROL_DAEMONS = ("slurmctld", "slurmdbd", "mariadb", "slurmrestd", "minter")


def _time_shared(raw):
    raw["pools"][0].update(mode="time-shared", inferenceWindow={"start": "09:00", "durationMinutes": 480})
    del raw["pools"][0]["slurmGpus"]


def _workloads(rendered) -> list:
    return [o for o in rendered.objects if o.kind in ("Deployment", "StatefulSet", "DaemonSet")]


def _control_daemons(rendered) -> dict:
    """Each control daemon's workload, found by the container it runs."""
    found = {}
    for workload in _workloads(rendered):
        names = {c["name"] for c in pod_spec(workload)["containers"]}
        for daemon in CONTROL_DAEMONS:
            if daemon in names:
                found[daemon] = workload
    assert set(found) == set(CONTROL_DAEMONS), sorted(found)
    return found


@pytest.mark.parametrize("edit", [_time_shared, lambda raw: None], ids=["time-shared", "no-window"])
def test_control_daemons_outlast_the_closed_window_of_a_time_shared_node(edit):
    """The taint moves model servers off the node; slurmctld and the database stay where they run.
    Tolerated with or without a window, so a pool's switch to time-shared restarts none of them."""
    for daemon, workload in _control_daemons(render_raw(variant("dev", edit))).items():
        assert pod_spec(workload)["tolerations"] == [WINDOW_TOLERATION], daemon


def test_model_servers_do_not_tolerate_the_closed_window():
    rendered = render_raw(variant("dev", _time_shared))
    servers = [w for w in _workloads(rendered) if w.namespace == rendered.config.inference.namespace]
    assert servers
    for server in servers:
        assert WINDOW_TOLERATION not in (pod_spec(server).get("tolerations") or []), server.name


def test_control_daemons_prefer_nodes_outside_the_gpu_pools():
    for daemon, workload in _control_daemons(render_stack("dev")).items():
        [term] = pod_spec(workload)["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["preference"]["matchExpressions"] == [{"key": "dualsched.io/pool", "operator": "DoesNotExist"}], daemon
