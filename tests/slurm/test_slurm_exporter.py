"""The Slurm exporter (components/metrics.py) against the real daemons: a collector round
(components/programs/collect_slurm_state.sh, as the controller pod's collector container runs it)
reads scontrol, squeue and sdiag of the running cluster, and the exporter program serves it; the
scrape must parse as Prometheus' text format and show the running job on its node and the node's state."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest

from exposition import find, parse, running_exporter
from harness import JOB_USER

pytestmark = pytest.mark.slurm

COLLECTOR = Path(__file__).resolve().parents[2] / "components" / "programs" / "collect_slurm_state.sh"


def _collect(cluster, state: Path) -> None:
    result = subprocess.run(["sh", str(COLLECTOR), str(state)], env=cluster.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr, result.stderr


def _scrape(url: str):
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return parse(response.read().decode())[1]


def _one(samples, name, **labels) -> float:
    found = find(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def _base_state(cluster, node: str) -> str:
    return cluster.node(node)["State"].split("+")[0].rstrip("*").lower()


def test_a_scrape_shows_the_running_job_on_its_node_and_the_nodes_state(cluster, tmp_path):
    node = cluster.local_node
    job = cluster.sbatch("--partition=gpu", "--gres=gpu:1", "--mem=100M", "--time=5", script=cluster.held_script())
    cluster.wait_for_job(job, "RUNNING")
    with running_exporter(tmp_path) as url:
        _collect(cluster, tmp_path)
        samples = _scrape(url)
        assert _one(samples, "slurm_up") == 1
        mine = {"node": node, "slurm_node": node}
        state = find(samples, "slurm_node_state", **mine)
        assert [s.labels["state"] for s in state] == [_base_state(cluster, node)]
        assert state[0].labels["state"] in ("mixed", "allocated")
        assert _one(samples, "slurm_node_gpus", **mine) == 2
        record = cluster.node(node)  # the jobs' share: less MemSpecLimit (the config's slurmd reserve)
        assert _one(samples, "slurm_node_memory_bytes", **mine) == (int(record["RealMemory"]) - int(record["MemSpecLimit"])) * 2**20
        assert _one(samples, "slurm_node_memory_allocated_bytes", **mine) == 100 * 2**20
        assert _one(samples, "slurm_node_cpus_allocated", **mine) == 1
        assert _one(samples, "slurm_node_gpus_allocated", **mine) == 1
        assert _one(samples, "slurm_node_jobs", **mine) == 1
        assert _one(samples, "slurm_job_node", job_id=str(job), user=JOB_USER, partition="gpu", **mine) == 1
        assert _one(samples, "slurm_jobs", state="running", partition="gpu") == 1
        assert _one(samples, "slurm_scheduler_jobs", event="submitted") >= 1
        assert _one(samples, "slurm_scheduler_threads") >= 1
        # node-2 of the pool has no slurmd: Slurm never heard from it
        assert find(samples, "slurm_node_state", node="node-2")[0].labels["state"] in ("down", "unknown", "idle")
        assert find(samples, "slurm_node_state", node="node-2")[0].labels["state"] == _base_state(cluster, "node-2")

        cluster.release(job)
        assert cluster.wait_for_job(job, "COMPLETED", "FAILED")["JobState"] == "COMPLETED"
        cluster.wait_for_node_state(node, "IDLE")
        _collect(cluster, tmp_path)
        samples = _scrape(url)
        assert not find(samples, "slurm_job_node", job_id=str(job))
        assert [s.labels["state"] for s in find(samples, "slurm_node_state", **mine)] == ["idle"]
        assert _one(samples, "slurm_node_gpus_allocated", **mine) == 0
        assert _one(samples, "slurm_node_jobs", **mine) == 0
        assert _one(samples, "slurm_scheduler_jobs", event="completed") >= 1
