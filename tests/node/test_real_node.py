"""The local stack on a real kubelet: every pod runs, and a Slurm job flows from a Kubernetes
Job through slurmctld and slurmd to sacct, and its checkpoint to the model server.

The tests run in file order and build on each other (one deployment per session), the way an
operator would check a new cluster: pods, then Slurm, then a job, then failures and changes.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from dualsched.components.programs.slurmd_rollout import SINFO_FORMAT, parse_sinfo
from dualsched.components.programs.token_minter import AUDIENCE
from dualsched.components.tokens import MINTER_PORT
from dualsched.config.quantities import parse_quantity
from node_support import (
    GPU_MAJOR, GPU_PROBE, GPU_PROBE_PREFIX, JOB_USER_UID, NodeWorld, gpu_files_in, gpu_probe_results,
    kubelet_gpu_allocations, local_config, may_open, outcomes, registered_gpus, wait_for_slurm, wait_until,
)
from e2e_support import TIMINGS, tail, up_or_diagnose
from mount_namespaces import keep_a_new_namespace_on_each_cpu

pytestmark = pytest.mark.node

STACK = "local"
NODE = "gpu-real-1"
SLURM_NS, JOBS_NS, INFERENCE_NS = "slurm", "slurm-jobs", "inference"
SLURM_CONF_CACHE = "/var/spool/slurmd/conf-cache/slurm.conf"
TRAIN_SCRIPT = """#!/bin/sh
#SBATCH --job-name=train-tiny
echo "user=$(id -un) uid=$(id -u)"
echo "gpus=${SLURM_JOB_GPUS:-none}"
echo "shm_kb=$(df -k /dev/shm | awk 'NR==2 {print $2}') shm_fs=$(df -T /dev/shm | awk 'NR==2 {print $2}')"
echo "checkpoint of job $SLURM_JOB_ID" > /shared/models/tiny/checkpoint.bin
"""


class Cluster:
    """kubectl and Slurm commands against the deployed stack."""

    def __init__(self, world: NodeWorld):
        self.world = world

    def pods(self, namespace: str) -> list[dict]:
        return self.world.kget("pods", "-n", namespace)["items"]

    def pod(self, namespace: str, prefix: str) -> dict:
        matches = [p for p in self.pods(namespace) if p["metadata"]["name"].startswith(prefix)
                   and p["metadata"].get("deletionTimestamp") is None]
        assert len(matches) == 1, [p["metadata"]["name"] for p in matches]
        return matches[0]

    def exec(self, namespace: str, pod: str, container: str, *command: str, check: bool = True) -> str:
        result = self.world.kubectl("exec", "-n", namespace, pod, "-c", container, "--", *command, check=check)
        return result.stdout if check else result

    def slurm(self, *command: str) -> str:
        """A Slurm client command in the controller pod (as SlurmUser, with its munge socket)."""
        return self.exec(SLURM_NS, "slurmctld-0", "slurmctld", *command)

    def wait_for_slurm(self, what: str, probe: Callable[[], Any], timeout: float = 240, every: float = 2) -> Any:
        """wait_until for an answer from Slurm; a Slurm command that fails is no answer yet, and a timeout leaves
        Slurm's daemons in build/diagnostics (node_support.wait_for_slurm)."""
        return wait_for_slurm(self.world, SLURM_NS, what, probe, timeout, every)

    def slurmd_pod(self) -> dict:
        return self.pod(SLURM_NS, "dualsched-slurmd-gpu")

    def submit_as(self, user: str, *sbatch: str) -> int:
        """sbatch as ``user`` from inside the slurmd pod (its conf-cache is a client config)."""
        out = self.exec(SLURM_NS, self.slurmd_pod()["metadata"]["name"], "slurmd",
                        "env", f"SLURM_CONF={SLURM_CONF_CACHE}", "runuser", "-u", user, "--",
                        "sbatch", "--parsable", *sbatch)  # fmt: skip
        return int(out.strip().split(";")[0])

    def job_state(self, job_id: int) -> Optional[str]:
        out = self.slurm("scontrol", "show", "job", "--oneliner", str(job_id))
        match = re.search(r"JobState=(\S+)", out)
        return match.group(1) if match else None

    def sacct(self, job_id: int) -> Optional[dict[str, str]]:
        fields = ("JobID", "User", "State", "Partition", "AllocTRES", "NodeList", "NNodes", "End")
        out = self.slurm("sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                         f"--format={','.join(fields)}")  # fmt: skip
        rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]
        return rows[0] if rows else None


def all_ready(pods: list[dict]) -> bool:
    def ready(pod: dict) -> bool:
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True"

    return bool(pods) and all(ready(p) for p in pods if p["metadata"].get("deletionTimestamp") is None)


# ------------------------------------------------ slurmd after a template change


def sinfo_node(cluster: Cluster) -> tuple[str, str]:
    """(state, reason) of the node as the rollout controller reads them; ("", why) while slurmctld does not
    answer (a replaced controller, or its name still resolving to the old pod's address)."""
    result = cluster.exec(SLURM_NS, "slurmctld-0", "slurmctld", "sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}",
                          "-n", NODE, check=False)  # fmt: skip
    node = parse_sinfo(result.stdout).get(NODE) if result.returncode == 0 else None
    if node is None:
        return "", (result.stdout + result.stderr).strip()
    return node.state, node.reason


def current_revision(cluster: Cluster, pod: dict) -> str:
    """The slurmd DaemonSet's current template hash: its newest ControllerRevision."""
    owner = next(o["uid"] for o in pod["metadata"]["ownerReferences"] if o.get("controller"))
    revisions = [r for r in cluster.world.kget("controllerrevisions", "-n", SLURM_NS)["items"]
                 if any(o["uid"] == owner for o in r["metadata"].get("ownerReferences", []))]  # fmt: skip
    return max(revisions, key=lambda r: r["revision"])["metadata"]["labels"]["controller-revision-hash"]


def current_pod(cluster: Cluster) -> Optional[str]:
    """The uid of the node's one slurmd pod when it is Ready on the DaemonSet's current revision (while it is
    replaced there are two, or none)."""
    pods = [p for p in cluster.pods(SLURM_NS) if p["metadata"]["name"].startswith("dualsched-slurmd-gpu")]
    if len(pods) != 1 or not all_ready(pods):
        return None
    current = pods[0]["metadata"]["labels"]["controller-revision-hash"] == current_revision(cluster, pods[0])
    return pods[0]["metadata"]["uid"] if current else None


def slurmd_daemonsets_observed(cluster: Cluster) -> bool:
    """The DaemonSet controller has seen the latest template (so its newest revision is the current one)."""
    daemonsets = [d for d in cluster.world.kget("daemonsets", "-n", SLURM_NS)["items"]
                  if d["metadata"]["name"].startswith("dualsched-slurmd-")]  # fmt: skip
    return all(d["status"].get("observedGeneration") == d["metadata"]["generation"] for d in daemonsets)


def settled_node(cluster: Cluster) -> bool:
    """The node idle in Slurm and its one slurmd pod Ready on the DaemonSet's current revision."""
    return slurmd_daemonsets_observed(cluster) and current_pod(cluster) is not None and sinfo_node(cluster)[0] == "idle"


def wait_until_settled(cluster: Cluster) -> None:
    cluster.wait_for_slurm("the node idle in Slurm, its slurmd current", lambda: settled_node(cluster), timeout=420, every=5)


def up(world: NodeWorld, config: dict, jobs: Optional[list[dict]] = None) -> None:
    stack = world.stack(STACK, config)
    if jobs is None:
        stack.remove_config("nodetest:jobs")
    else:
        from pulumi import automation as auto

        stack.set_config("nodetest:jobs", auto.ConfigValue(json.dumps(jobs)))
    start = time.monotonic()
    result = up_or_diagnose(world, stack, SLURM_NS, INFERENCE_NS, JOBS_NS)
    TIMINGS.append((f"pulumi up of the local stack ({result.summary.result})", time.monotonic() - start))
    assert result.summary.result == "succeeded", tail(result.stdout)
    # the provider may call a StatefulSet updated before its controller saw the new template
    # (pulumi/pulumi-kubernetes#3329): slurmctld's replacement would then start under the next test
    world.kubectl("rollout", "status", "statefulset", "-n", SLURM_NS, "--timeout=300s", timeout=330)


@pytest.fixture(scope="module")
def cluster(node_world: NodeWorld) -> Cluster:
    up(node_world, local_config(node_world))
    cluster = Cluster(node_world)
    wait_until_settled(cluster)  # an earlier module's template change rolls slurmd first (docs/upgrades.md)
    return cluster


# ---------------------------------------------------------------- pods


def test_every_pod_of_the_stack_runs_and_is_ready_on_the_real_node(cluster):
    start = time.monotonic()
    for namespace in (SLURM_NS, INFERENCE_NS):
        wait_until(f"every pod in {namespace} Ready", lambda: all_ready(cluster.pods(namespace)), timeout=420)
    TIMINGS.append(("every pod Ready after pulumi up", time.monotonic() - start))
    running = {p["metadata"]["name"]: p for p in cluster.pods(SLURM_NS) + cluster.pods(INFERENCE_NS)}
    assert {"slurmctld-0", "mariadb-0"} <= set(running), sorted(running)
    assert any(name.startswith("dualsched-slurmd-gpu") for name in running)
    assert any(name.startswith("dualsched-accounting-slurmdbd") for name in running)
    assert any(name.startswith("dualsched-tiny") for name in running)
    # a fresh controller waits for slurmdbd (wait-for-accounting) instead of crash-looping
    controller = {s["name"]: s for s in running["slurmctld-0"]["status"]["containerStatuses"]}
    assert controller["slurmctld"]["restartCount"] == 0, controller["slurmctld"]
    for name, pod in running.items():
        assert pod["spec"]["nodeName"] == NODE, name
        for status in pod["status"]["containerStatuses"]:
            # a real runtime ran it: containerd's container id and a start time, not KWOK's fakes
            assert status["containerID"].startswith("containerd://"), (name, status)
            assert "running" in status["state"], (name, status)


def test_slurmd_is_guaranteed_with_memory_in_mebibytes(cluster):
    pod = cluster.slurmd_pod()
    assert pod["status"]["qosClass"] == "Guaranteed"
    slurmd = next(c for c in pod["spec"]["containers"] if c["name"] == "slurmd")
    assert parse_quantity(slurmd["resources"]["limits"]["memory"]) == 4096 * 2**20
    # the cgroup the kubelet made holds exactly what slurm.conf promises (RealMemory=4096). Read on the host:
    # slurmd's /sys/fs/cgroup is the host's (a hostPath, so it can make job cgroups), not its own.
    assert int((container_cgroup(cluster, pod, "slurmd", "memory") / "memory.limit_in_bytes").read_text()) == 4096 * 2**20


def container_cgroup(cluster: Cluster, pod: dict, container: str, controller: str) -> Path:
    """The cgroup v1 directory the kubelet and runtime made for a container, from its first process's
    ``pids`` cgroup (a controller Slurm leaves alone)."""
    container_id = next(s["containerID"] for s in pod["status"]["containerStatuses"] if s["name"] == container)
    pid = cluster.world.container_pid(container_id)
    [path] = [line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.split(":")[1] == "pids"]
    return Path(f"/sys/fs/cgroup/{controller}{path}")


def test_slurmd_and_its_cgroups_stay_inside_its_pods_memory_cgroup(cluster):
    """slurmd makes its own (read-only) cgroup mounts writable, so Slurm nests its cgroups there."""
    pod = cluster.slurmd_pod()
    pid = cluster.world.container_pid(next(s["containerID"] for s in pod["status"]["containerStatuses"] if s["name"] == "slurmd"))
    [memory] = [line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.split(":")[1] == "memory"]
    assert Path(f"/sys/fs/cgroup/memory{memory}").is_relative_to(container_cgroup(cluster, pod, "slurmd", "memory"))


def test_munged_keeps_its_key_private_and_its_socket_reachable(cluster):
    pod = cluster.pod(SLURM_NS, "slurmctld-0")["metadata"]["name"]
    key = cluster.exec(SLURM_NS, pod, "munged", "stat", "-c", "%a %u %F", "/var/lib/munge/munge.key").split()
    assert key == ["400", "0", "regular", "file"]
    # munged refuses a socket directory that others may write without the sticky bit (an emptyDir is 0777)
    socket_dir = int(cluster.exec(SLURM_NS, pod, "slurmctld", "stat", "-c", "%a", "/run/munge").strip(), 8)
    assert socket_dir & 0o022 == 0 and socket_dir & 0o005 == 0o005, oct(socket_dir)
    # slurmctld's user gets a credential from munged
    assert "Success" in cluster.exec(SLURM_NS, pod, "slurmctld", "sh", "-c", "munge -n | unmunge")


def test_cluster_dns_resolves_services_for_pods_and_host_network_pods(cluster):
    slurmd = cluster.slurmd_pod()["metadata"]["name"]
    # slurmd runs on the host network (ClusterFirstWithHostNet) and still finds slurmctld by name
    out = cluster.exec(SLURM_NS, slurmd, "slurmd", "getent", "hosts", "slurmctld-0.slurmctld.slurm.svc.cluster.local")
    assert out.split()[0] == cluster.pod(SLURM_NS, "slurmctld-0")["status"]["podIP"]
    out = cluster.exec(SLURM_NS, slurmd, "slurmd", "getent", "hosts", "mariadb.slurm.svc.cluster.local")
    service = cluster.world.kget("service", "-n", SLURM_NS, "mariadb")
    assert out.split()[0] == service["spec"]["clusterIP"]


# ---------------------------------------------------------------- Slurm


def test_sinfo_shows_the_real_node_idle_with_its_gpus(cluster):
    def idle() -> Optional[str]:
        out = cluster.slurm("sinfo", "--noheader", "--Node", "--format=%N %T %G")
        return out if re.search(rf"^{NODE} idle gpu:2\b", out, re.MULTILINE) else None

    cluster.wait_for_slurm("slurmd to register and the node to be idle", idle, timeout=180)
    node = cluster.slurm("scontrol", "show", "node", NODE)
    # the address slurmctld learnt when slurmd registered: no DNS name for the node was needed
    assert re.search(r"NodeAddr=(\d+\.){3}\d+", node), node


TRAIN = {"name": "train-tiny", "serviceAccount": "trainer", "script": TRAIN_SCRIPT,
         "args": ["--partition=gpu", "--gres=gpu:1", "--mem=256M", "--output=/shared/jobs/train-%j.out"]}
# What someone allowed to create Jobs in the submission namespace might try instead.
INTRUDER = {"name": "intruder", "serviceAccount": "intruder", "user": "alice", "script": "#!/bin/sh\ntrue\n",
            "args": ["--output=/dev/null"]}
FORGED_UID = {**TRAIN, "name": "forged-uid", "uid": JOB_USER_UID + 1, "script": "#!/bin/sh\ntrue\n", "args": ["--output=/dev/null"]}
AS_ROOT = {**FORGED_UID, "name": "as-root", "uid": 0}


def finished_job(world: NodeWorld, name: str) -> Optional[dict]:
    job = world.kget("job", "-n", JOBS_NS, name)
    return job if job["status"].get("succeeded") or job["status"].get("failed") else None


def job_logs(world: NodeWorld, name: str, container: str) -> str:
    result = world.kubectl("logs", "-n", JOBS_NS, f"job/{name}", "-c", container, check=False)
    return result.stdout + result.stderr


def test_a_kubernetes_job_runs_a_slurm_job_as_a_named_user_that_writes_a_checkpoint(cluster):
    world = cluster.world
    up(world, local_config(world), jobs=[TRAIN, INTRUDER, FORGED_UID, AS_ROOT])
    k8s_job = wait_until("the sbatch Job to finish", lambda: finished_job(world, TRAIN["name"]), timeout=300)
    logs = job_logs(world, TRAIN["name"], "sbatch")
    assert k8s_job["status"].get("succeeded") == 1, logs + job_logs(world, TRAIN["name"], "slurm-token")
    assert "token for alice" in job_logs(world, TRAIN["name"], "slurm-token")
    job_id = int(re.search(r"Submitted batch job (\d+)", logs).group(1))
    output = (world.shared / "jobs" / f"train-{job_id}.out").read_text()
    assert f"user=alice uid={JOB_USER_UID}" in output, output
    assert "gpus=" in output and "gpus=none" not in output, output
    shm = dict(pair.split("=") for pair in re.search(r"shm_kb=\S+ shm_fs=\S+", output).group(0).split())
    # the job's own tmpfs (job_container.conf), not the runtime's 64 MiB: its pages count against the job's memory
    assert shm["shm_fs"] == "tmpfs" and int(shm["shm_kb"]) > 64 * 1024, output
    checkpoint = world.shared / "models" / "tiny" / "checkpoint.bin"
    assert checkpoint.read_text() == f"checkpoint of job {job_id}\n"
    assert checkpoint.stat().st_uid == JOB_USER_UID
    cluster.job_id = job_id


def test_the_submission_namespace_holds_no_munge_key_and_no_shared_claim(cluster):
    secrets = cluster.world.kget("secrets", "-n", JOBS_NS)["items"]
    assert not [s["metadata"]["name"] for s in secrets if "munge.key" in (s.get("data") or {})]
    assert cluster.world.kget("pvc", "-n", JOBS_NS)["items"] == []
    assert "munge.key" in json.dumps(cluster.world.kget("secrets", "-n", SLURM_NS))  # where it does live


def test_an_unmapped_service_account_gets_no_token(cluster):
    world = cluster.world
    minter = cluster.pod(SLURM_NS, "dualsched-token-minter")["metadata"]["name"]
    refusal = f"ServiceAccount {JOBS_NS}/{INTRUDER['serviceAccount']} is not mapped"
    wait_until("the minter to refuse the intruder", lambda: refusal in world.kubectl("logs", "-n", SLURM_NS, minter).stdout)
    wait_until("the sidecar to report the refusal", lambda: "the minter refused (403)" in job_logs(world, INTRUDER["name"], "slurm-token"))
    pod = world.kget("pods", "-n", JOBS_NS, "-l", f"job-name={INTRUDER['name']}")["items"][0]
    # sbatch never started: the sidecar never produced a token
    assert all("running" not in s["state"] and "terminated" not in s["state"] for s in pod["status"]["containerStatuses"])


ASK_THE_MINTER = """
import sys, urllib.error, urllib.request
request = urllib.request.Request("http://127.0.0.1:%d/token", data=b"", method="POST",
                                 headers={"Authorization": "Bearer " + sys.stdin.read().strip()})
try:
    print(urllib.request.urlopen(request, timeout=10).status)
except urllib.error.HTTPError as error:
    print(error.code, error.read().decode())
""" % MINTER_PORT


def test_a_token_bound_to_no_pod_gets_no_slurm_token(cluster):
    """`kubectl create token` for the mapped ServiceAccount and the minter's audience: the API server takes it,
    but it is bound to no pod and outlives every pod (and the caller's access); the minter refuses it. The
    token goes to the minter's own pod on stdin and is never printed."""
    world = cluster.world
    unbound = world.kubectl("create", "token", "trainer", "-n", JOBS_NS, "--audience", AUDIENCE, "--duration", "10m").stdout.strip()
    minter = cluster.pod(SLURM_NS, "dualsched-token-minter")["metadata"]["name"]
    answer = world.kubectl("exec", "-i", "-n", SLURM_NS, minter, "--", "python3", "-c", ASK_THE_MINTER, input=unbound).stdout
    assert answer.startswith("403 ") and f"the token of {JOBS_NS}/trainer is bound to no pod" in answer, answer


def test_a_pod_with_another_uid_than_its_user_is_refused_by_slurmctld(cluster):
    world = cluster.world
    job = wait_until("the forged-uid Job to finish", lambda: finished_job(world, FORGED_UID["name"]), timeout=180)
    logs = job_logs(world, FORGED_UID["name"], "sbatch")
    assert job["status"].get("failed") == 1 and "Batch job submission failed" in logs, logs
    assert "Submitted batch job" not in logs


def test_root_pods_are_refused_in_the_submission_namespace(cluster):
    def refused() -> Optional[str]:
        events = cluster.world.kget("events", "-n", JOBS_NS, "--field-selector", f"involvedObject.name={AS_ROOT['name']}")
        messages = [e.get("message", "") for e in events["items"]]
        return next((m for m in messages if "violates PodSecurity" in m and "restricted" in m), None)

    message = wait_until("Pod Security to refuse the root pod", refused, timeout=60)
    assert "runAsUser=0" in message or "runAsNonRoot" in message, message


def test_the_model_server_reads_the_checkpoint_through_its_read_only_mount(cluster):
    pod = cluster.pod(INFERENCE_NS, "dualsched-tiny")["metadata"]["name"]
    content = cluster.exec(INFERENCE_NS, pod, "server", "cat", "/models/tiny/checkpoint.bin")
    assert content == f"checkpoint of job {cluster.job_id}\n"
    written = cluster.exec(INFERENCE_NS, pod, "server", "sh", "-c", "echo x > /models/tiny/x", check=False)
    assert written.returncode != 0 and "Read-only file system" in written.stderr


def test_sacct_records_the_job_with_its_gpu(cluster):
    record = cluster.wait_for_slurm("slurmdbd to record the job", lambda: (r := cluster.sacct(cluster.job_id)) and
                                    r["State"] == "COMPLETED" and r["AllocTRES"] and r)  # fmt: skip
    assert record["User"] == "alice" and record["Partition"] == "gpu" and record["NodeList"] == NODE
    assert "gres/gpu=1" in record["AllocTRES"].split(","), record


def test_root_may_not_run_jobs(cluster):
    slurmd = cluster.slurmd_pod()["metadata"]["name"]
    result = cluster.exec(SLURM_NS, slurmd, "slurmd", "env", f"SLURM_CONF={SLURM_CONF_CACHE}",
                          "sbatch", "--wrap", "true", check=False)  # fmt: skip
    # slurmctld's answer to DisableRootJobs (src/slurmctld/job_mgr.c): ESLURM_USER_ID_MISSING, and it logs why
    assert result.returncode != 0 and "Invalid user id" in result.stderr, result.stderr
    log = cluster.world.kubectl("logs", "-n", SLURM_NS, "slurmctld-0", "-c", "slurmctld").stdout
    assert "SUBMIT_JOB for user root disabled" in log


def run_to_the_end(cluster: Cluster, user: str, script: str, while_running: Callable[[], None] = lambda: None) -> str:
    """A batch job of ``user`` running ``script`` on the node; what it printed (kept in the user's home)."""
    output = f"/home/{user}/job-%j.out"
    job_id = cluster.submit_as(user, "--partition=gpu", "--mem=64M", f"--output={output}", "--wrap", script)
    wait_until(f"job {job_id} to run", lambda: cluster.job_state(job_id) in ("RUNNING", "COMPLETED"), timeout=120)
    while_running()
    wait_until(f"job {job_id} to complete", lambda: cluster.job_state(job_id) == "COMPLETED", timeout=120)
    return cluster.exec(SLURM_NS, cluster.slurmd_pod()["metadata"]["name"], "slurmd", "cat", output.replace("%j", str(job_id)))


def test_each_job_has_a_tmp_and_dev_shm_that_neither_the_pod_nor_a_later_job_sees(cluster):
    """job_container.conf as rendered, fetched by configless slurmd in its unprivileged pod: the job's /tmp is
    its user's alone, its /dev/shm its own tmpfs; slurmd's container (where every job used to share /tmp) and
    the next job find nothing of it."""
    slurmd = cluster.slurmd_pod()["metadata"]["name"]

    def the_pod_sees_nothing_of_it() -> None:
        listing = cluster.exec(SLURM_NS, slurmd, "slurmd", "ls", "-A", "/tmp", "/dev/shm")
        assert "left-by-job" not in listing, listing

    first = run_to_the_end(cluster, "alice", 'stat -c "%n %U %a" /tmp /dev/shm; echo secret > /tmp/left-by-job;'
                           " echo secret > /dev/shm/left-by-job; sleep 10", the_pod_sees_nothing_of_it)  # fmt: skip
    assert first.splitlines()[:2] == ["/tmp alice 700", "/dev/shm root 1777"], first
    second = run_to_the_end(cluster, "alice", "ls -A /tmp /dev/shm; cat /tmp/left-by-job /dev/shm/left-by-job 2>&1; true")
    assert "secret" not in second and "No such file" in second, second


def test_right_after_its_pod_is_replaced_slurmd_keeps_a_jobs_namespace_on_every_cpu_and_the_first_job_runs(cluster):
    """The container's mount namespace is newest for a moment: on Linux 6.18 and later, a namespace made then on a
    CPU whose batch of ids lags has a smaller id, and the kernel refuses the bind that keeps a job's /tmp (EINVAL),
    which requeued the first jobs held (components.compute newer_mount_namespaces_on_every_cpu)."""
    old = cluster.slurmd_pod()["metadata"]["name"]
    cluster.world.kubectl("delete", "pod", "-n", SLURM_NS, old, "--wait=true", timeout=180)
    wait_until_settled(cluster)
    slurmd = cluster.slurmd_pod()["metadata"]["name"]
    kept = cluster.exec(SLURM_NS, slurmd, "slurmd", "sh", "-c", keep_a_new_namespace_on_each_cpu("/run/slurm"))
    assert "refused" not in kept and "cpu0 kept" in kept, kept
    output = run_to_the_end(cluster, "alice", 'stat -c "%n %U %a" /tmp')
    assert output.splitlines()[0] == "/tmp alice 700", output


def test_the_database_has_no_remote_root_and_logs_no_password(cluster):
    pod_ip = cluster.pod(SLURM_NS, "mariadb-0")["status"]["podIP"]
    # root exists only as root@localhost over the socket (mariadb-install-db --auth-root-authentication-method=socket)
    remote = cluster.exec(SLURM_NS, "mariadb-0", "mariadb", "mariadb", f"--host={pod_ip}", "--port=3306",
                          "--user=root", "--execute=SELECT 1", check=False)  # fmt: skip
    assert remote.returncode != 0 and "Access denied for user 'root'" in remote.stderr, remote.stderr
    secrets = cluster.world.kget("secrets", "-n", SLURM_NS)["items"]
    [password] = [base64.b64decode(s["data"]["password"]).decode() for s in secrets if "password" in (s.get("data") or {})]
    logs = "".join(cluster.world.kubectl("logs", "-n", SLURM_NS, "mariadb-0", "-c", name).stdout for name in ("mariadb-init", "mariadb"))
    assert password not in logs


# ---------------------------------------------------------------- failures and changes


def test_deleting_the_slurmctld_pod_loses_no_job(cluster):
    job_id = cluster.submit_as("alice", "--partition=gpu", "--mem=64M", "--output=/dev/null", "--wrap", "sleep 40")
    cluster.wait_for_slurm(f"job {job_id} to run", lambda: cluster.job_state(job_id) == "RUNNING", timeout=120)
    old_uid = cluster.pod(SLURM_NS, "slurmctld-0")["metadata"]["uid"]
    cluster.world.kubectl("delete", "pod", "-n", SLURM_NS, "slurmctld-0", "--wait=true", timeout=180)
    wait_until("a new slurmctld-0 Ready", lambda: (p := [x for x in cluster.pods(SLURM_NS) if x["metadata"]["name"] == "slurmctld-0"])
               and p[0]["metadata"]["uid"] != old_uid and all_ready(p), timeout=240)  # fmt: skip
    # the job is still known (state saved on the claim) and runs to the end on its node
    assert cluster.job_state(job_id) in ("RUNNING", "COMPLETING", "COMPLETED")
    cluster.wait_for_slurm(f"job {job_id} to complete", lambda: cluster.job_state(job_id) == "COMPLETED", timeout=180)
    record = cluster.wait_for_slurm("sacct to record it", lambda: (r := cluster.sacct(job_id)) and r["State"] == "COMPLETED" and r)
    if record["User"] != "alice":  # root's, with no partition, without the stop hook: leave the daemons' logs behind
        cluster.world.diagnose_slurm(f"sacct recorded alice's job {job_id} as another user's after slurmctld-0 was replaced: {record}",
                                     SLURM_NS)  # fmt: skip
    assert record["User"] == "alice", record


def test_restarting_the_database_loses_no_accounting_record(cluster):
    before = cluster.sacct(cluster.job_id)
    cluster.world.kubectl("delete", "pod", "-n", SLURM_NS, "mariadb-0", "--wait=true", timeout=180)
    wait_until("mariadb-0 Ready again", lambda: (p := [x for x in cluster.pods(SLURM_NS) if x["metadata"]["name"] == "mariadb-0"])
               and all_ready(p), timeout=240)  # fmt: skip
    after = cluster.wait_for_slurm("sacct to answer again", lambda: cluster.sacct(cluster.job_id), timeout=180)
    assert after == before


def quietly(probe: Callable[[], Any]) -> Any:
    try:
        return probe()
    except BaseException:  # pytest.fail from a kubectl that failed while the database restarts
        return None


def test_a_slurm_conf_change_reaches_slurmd_without_restarting_anything(cluster):
    world = cluster.world
    slurmd_before = cluster.slurmd_pod()
    controller_before = cluster.pod(SLURM_NS, "slurmctld-0")
    config = local_config(world)
    config["slurm"]["partitions"][0]["maxTime"] = "2:00:00"
    up(world, config)

    def slurmd_has_new_config() -> bool:
        name = cluster.slurmd_pod()["metadata"]["name"]
        conf = cluster.exec(SLURM_NS, name, "slurmd", "cat", SLURM_CONF_CACHE)
        return "MaxTime=2:00:00" in conf

    wait_until("slurmd's configless cache to get MaxTime=2:00:00", slurmd_has_new_config, timeout=300, every=5)
    assert "MaxTime=02:00:00" in cluster.slurm("scontrol", "show", "partition", "gpu")
    slurmd_after = cluster.slurmd_pod()
    controller_after = cluster.pod(SLURM_NS, "slurmctld-0")
    assert slurmd_after["metadata"]["uid"] == slurmd_before["metadata"]["uid"]
    assert controller_after["metadata"]["uid"] == controller_before["metadata"]["uid"]
    for before, after in ((slurmd_before, slurmd_after), (controller_before, controller_after)):
        restarts = {s["name"]: s["restartCount"] for s in before["status"]["containerStatuses"]}
        assert {s["name"]: s["restartCount"] for s in after["status"]["containerStatuses"]} == restarts


# ---------------------------------------------------------------- GPU isolation (partitioned pool)
#
# The double gives the host /dev/nvidia0..3 (char 195:K) like a real GPU node, and each container the
# GPUs the kubelet allocated to it, renumbered from /dev/nvidia0. Which GPU a file is is its minor number.
# Opening one gives ENXIO when the device cgroup lets it through (no driver answers) and EPERM when the
# cgroup refuses it. The kubelet's own record (its device-manager checkpoint) says who holds which GPU.

GPU_NS = "gpu-isolation"
PROBE_IMAGE = "dualsched.local/python:3.11"  # bash and coreutils
NVIDIA = "/dev/nvidia"  # the files the runtime put in a container
PROBES = GPU_PROBE_PREFIX  # the files the test puts in a container's /dev, one per GPU of the node


def gpu_pod(name: str, gpus: int = 0, privileged: bool = False) -> dict:
    container: dict[str, Any] = {"name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "infinity"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": GPU_NS},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0, "containers": [container]}}


class Gpus:
    """The node's GPUs as the kubelet and the pods see them."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.world = cluster, cluster.world
        config = local_config(self.world)
        [pool] = config["pools"]
        self.count, self.slurm = pool["gpusPerNode"], pool["slurmGpus"]
        self.inference = sum(model["gpus"] for model in config["inference"]["models"])
        script = self.world.shared / "jobs" / "gpu-probe.sh"
        script.write_text(GPU_PROBE)
        script.chmod(0o755)

    def apply(self, *objects: dict) -> None:
        self.world.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))

    def holding(self, pod: dict, container: str) -> set[int]:
        """The GPUs the kubelet allocated to a container of ``pod`` (its checkpoint, read on the node)."""
        return kubelet_gpu_allocations().get((pod["metadata"]["uid"], container), set())

    def container_id(self, pod: dict, container: str) -> str:
        return next(s["containerID"] for s in pod["status"]["containerStatuses"] if s["name"] == container)

    def probe_container(self, pod: dict, container: str, with_every_gpu: bool = True) -> dict[str, tuple[int, str]]:
        """GPU_PROBE in a container (as its user), after putting a file for every GPU of the node in its /dev."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        pid = self.world.container_pid(self.container_id(pod, container))
        with gpu_files_in(pid, self.count if with_every_gpu else 0):
            return gpu_probe_results(self.cluster.exec(namespace, name, container, "bash", "-c", GPU_PROBE))

    def probe_job(self, gres: int, with_every_gpu: bool = False) -> dict[str, tuple[int, str]]:
        """GPU_PROBE as a Slurm batch job of alice asking for ``gres`` GPUs, run by slurmd in its pod."""
        pod = self.cluster.slurmd_pod()
        pid = self.world.container_pid(self.container_id(pod, "slurmd"))
        with gpu_files_in(pid, self.count if with_every_gpu else 0):
            job_id = self.cluster.submit_as("alice", "--partition=gpu", f"--gres=gpu:{gres}", "--mem=64M",
                                            "--output=/shared/jobs/gpu-probe-%j.out", "/shared/jobs/gpu-probe.sh")  # fmt: skip
            state = self.cluster.wait_for_slurm(
                f"GPU probe job {job_id} to end", lambda: (s := self.cluster.job_state(job_id))
                not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING") and s, timeout=180)  # fmt: skip
        output = (self.world.shared / "jobs" / f"gpu-probe-{job_id}.out").read_text()
        assert state == "COMPLETED", (state, output)
        return gpu_probe_results(output)

    def visible_devices(self, pod: dict, container: str) -> set[int]:
        """NVIDIA_VISIBLE_DEVICES of the container's process, read on the host."""
        pid = self.world.container_pid(self.container_id(pod, container))
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in v)
        return {int(k) for k in environ["NVIDIA_VISIBLE_DEVICES"].split(",")}


@pytest.fixture(scope="module")
def gpus(cluster) -> Iterator[Gpus]:
    gpus = Gpus(cluster)
    gpus.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": GPU_NS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    yield gpus
    cluster.world.kubectl("delete", "namespace", GPU_NS, "--wait=true", "--timeout=120s", check=False, timeout=150)


def running(gpus: Gpus, name: str) -> dict:
    gpus.world.kubectl("wait", "--for=condition=Ready", "--timeout=120s", "-n", GPU_NS, f"pod/{name}", timeout=150)
    return gpus.world.kget("pod", "-n", GPU_NS, name)


def test_the_host_has_every_gpu_and_a_privileged_container_may_open_them_all(gpus):
    # as on a real GPU node: /dev/nvidiaK is char 195:K for every GPU the plugin advertises
    assert registered_gpus() == set(range(gpus.count))
    for k in range(gpus.count):
        st = os.stat(f"/dev/nvidia{k}")
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (GPU_MAJOR, k)
    # the contrast that makes the isolation checks below able to fail: a privileged container gets the
    # host's devices and a device cgroup that admits them all
    gpus.apply(gpu_pod("privileged", privileged=True))
    results = gpus.probe_container(running(gpus, "privileged"), "main", with_every_gpu=False)
    assert outcomes(results, NVIDIA) == {k: "ENXIO" for k in range(gpus.count)}, results
    gpus.world.kubectl("delete", "pod", "-n", GPU_NS, "privileged", "--wait=false")


def check_slurmd_holds_only_its_gpus(gpus: Gpus) -> set[int]:
    pod = gpus.cluster.slurmd_pod()
    held = gpus.holding(pod, "slurmd")
    assert len(held) == gpus.slurm, (held, kubelet_gpu_allocations())
    assert gpus.visible_devices(pod, "slurmd") == held
    # slurmd itself (root, SYS_ADMIN), given a file for each of the node's GPUs: only its own open
    results = gpus.probe_container(pod, "slurmd")
    assert outcomes(results, NVIDIA) == {k: "ENXIO" for k in held}, results
    assert outcomes(results, PROBES) == {k: "ENXIO" if k in held else "EPERM" for k in range(gpus.count)}, results
    return held


def check_jobs_open_only_their_gpus(gpus: Gpus, held: set[int]) -> None:
    # a job asking for all of the pool's Slurm GPUs may open exactly the pod's GPUs...
    every = gpus.probe_job(gres=gpus.slurm)
    assert outcomes(every, NVIDIA) == {k: "ENXIO" for k in held}, every
    # ...and one asking for one GPU opens one of them, and is refused the other (ConstrainDevices)
    one = gpus.probe_job(gres=1)
    assert sorted(outcomes(one, NVIDIA).values()) == ["ENXIO"] + ["EPERM"] * (gpus.slurm - 1), one
    assert may_open(one, NVIDIA) <= held


def check_the_model_server_holds_only_its_gpus(gpus: Gpus) -> set[int]:
    pod = gpus.cluster.pod(INFERENCE_NS, "dualsched-tiny")
    held = gpus.holding(pod, "server")
    assert len(held) == gpus.inference, (held, kubelet_gpu_allocations())
    assert gpus.visible_devices(pod, "server") == held
    # as its own user (65532, no capabilities), with a file for each of the node's GPUs in its /dev
    results = gpus.probe_container(pod, "server")
    assert outcomes(results, NVIDIA) == {k: "ENXIO" for k in held}, results
    assert outcomes(results, PROBES) == {k: "ENXIO" if k in held else "EPERM" for k in range(gpus.count)}, results
    return held


def check_every_gpu_is_held_once(gpus: Gpus, slurm: set[int], inference: set[int], rest: set[int]) -> None:
    assert not slurm & inference and not (slurm | inference) & rest
    assert slurm | inference | rest == set(range(gpus.count))
    # the kubelet's whole record: every GPU of the node allocated, none twice
    held = [gpu for gpus_of_container in kubelet_gpu_allocations().values() for gpu in gpus_of_container]
    assert sorted(held) == list(range(gpus.count))


def test_slurmd_holds_its_gpus_and_slurmd_may_open_no_other(gpus):
    gpus.slurmd_gpus = check_slurmd_holds_only_its_gpus(gpus)


def test_slurm_jobs_open_only_the_gpus_of_their_slurmd_pod(gpus):
    check_jobs_open_only_their_gpus(gpus, gpus.slurmd_gpus)


def test_a_jobs_device_cgroup_admits_only_the_gpus_of_its_slurmd_pod(gpus):
    """With a device file for every GPU put into slurmd's /dev, the kernel still refuses the others:
    the job's device cgroup is nested in the container's."""
    results = gpus.probe_job(gres=gpus.slurm, with_every_gpu=True)
    assert outcomes(results, PROBES) == {k: "ENXIO" if k in gpus.slurmd_gpus else "EPERM" for k in range(gpus.count)}, results


def test_the_model_server_may_open_only_its_own_gpus(gpus):
    gpus.inference_gpus = check_the_model_server_holds_only_its_gpus(gpus)
    assert not gpus.inference_gpus & gpus.slurmd_gpus


def test_slurm_and_kubernetes_hold_every_gpu_of_the_node_once(gpus):
    free = set(range(gpus.count)) - gpus.slurmd_gpus - gpus.inference_gpus
    assert len(free) == gpus.count - gpus.slurm - gpus.inference
    # a pod takes what is left: it gets exactly the free GPUs, and opens them
    gpus.apply(gpu_pod("the-rest", gpus=len(free)))
    rest = running(gpus, "the-rest")
    assert gpus.holding(rest, "main") == free
    results = gpus.probe_container(rest, "main")
    assert outcomes(results, PROBES) == {k: "ENXIO" if k in free else "EPERM" for k in range(gpus.count)}, results
    check_every_gpu_is_held_once(gpus, gpus.slurmd_gpus, gpus.inference_gpus, free)
    # nothing is left for another pod
    gpus.apply(gpu_pod("one-more", gpus=1))

    def unschedulable() -> Optional[str]:
        conditions = gpus.world.kget("pod", "-n", GPU_NS, "one-more")["status"].get("conditions", [])
        return next((c["message"] for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)

    assert "nvidia.com/gpu" in wait_until("the scheduler to find no GPU for another pod", unschedulable, timeout=60)
    gpus.world.kubectl("delete", "pod", "-n", GPU_NS, "one-more", "--wait=false")
    gpus.rest_gpus = free


def slurm_node(cluster: Cluster) -> dict[str, str]:
    out = cluster.slurm("scontrol", "show", "node", "--oneliner", NODE)
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_after_slurmd_restarts_its_gpus_are_isolated_again(gpus):
    cluster = gpus.cluster
    before = cluster.slurmd_pod()
    started = slurm_node(cluster)["SlurmdStartTime"]
    cluster.world.kubectl("delete", "pod", "-n", SLURM_NS, before["metadata"]["name"], "--wait=true", timeout=180)
    wait_until("the DaemonSet's new slurmd pod Ready", lambda: (p := [x for x in cluster.pods(SLURM_NS)
               if x["metadata"]["name"].startswith("dualsched-slurmd-gpu") and x["metadata"]["uid"] != before["metadata"]["uid"]])
               and all_ready(p), timeout=240)  # fmt: skip

    def registered_again() -> Optional[dict[str, str]]:
        node = slurm_node(cluster)
        return node if node["SlurmdStartTime"] != started else None

    cluster.wait_for_slurm("the new slurmd to register with slurmctld", registered_again, timeout=180)

    def idle() -> Optional[dict[str, str]]:  # the last node seen says why (Reason=) when it is DOWN or DRAIN
        node = slurm_node(cluster)
        flags = set(node["State"].split("+"))
        return node if "IDLE" in flags and not flags & {"DOWN", "DRAIN", "NOT_RESPONDING"} else None

    cluster.wait_for_slurm("the node idle (not DOWN or DRAIN) in Slurm again", idle, timeout=120)
    assert re.search(rf"^{NODE} idle gpu:{gpus.slurm}\b", cluster.slurm("sinfo", "--noheader", "--Node", "--format=%N %T %G"), re.M)
    # the same isolation, with the GPUs the kubelet gave the new pod
    slurmd = check_slurmd_holds_only_its_gpus(gpus)
    check_jobs_open_only_their_gpus(gpus, slurmd)
    inference = check_the_model_server_holds_only_its_gpus(gpus)
    check_every_gpu_is_held_once(gpus, slurmd, inference, gpus.holding(gpus.world.kget("pod", "-n", GPU_NS, "the-rest"), "main"))
