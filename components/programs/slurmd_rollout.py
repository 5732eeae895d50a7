"""slurmd rollout: replaces slurmd pods that run an old DaemonSet template without killing a job.

The slurmd DaemonSets update ``OnDelete``: a new template reaches a node only when its pod is deleted.
Every ``PASS_SECONDS`` this program compares each slurmd pod's ``controller-revision-hash`` label with its
DaemonSet's current revision (the newest ControllerRevision the DaemonSet owns) and, for each node whose
pod is outdated, one step at a time:

1. drain the node in Slurm with a reason of its own (``REASON_PREFIX``), at most ``max_unavailable``
   nodes at once across every pool;
2. once the node is ``drained`` (no job left on it), delete its pod: the DaemonSet makes the new one;
3. once the new pod is Ready and Slurm hears from its slurmd again, resume the node.

A node someone else drained (an admin, the health check's ``dualsched:health``) is never resumed: its pod
is replaced once no job is left on it, and it stays drained. A node whose outdated slurmd slurmctld refused
(``INVAL``: a template change moved the pool's GPUs in slurm.conf, and the old slurmd registers the old
count) is drained like one in service, so it is resumed once the new pod registers. Jobs that outlive the drain deadline are left
running: the program reports them every pass and goes on waiting (never a wedged node, never a killed
job); the operator requeues or cancels them. Nothing is remembered between passes: what to do follows
from what the API server and Slurm show, so a restart anywhere in between picks up where it was (the
drain's start, for the deadline, is part of the reason Slurm keeps).

Slurm is reached through a sibling container that runs Slurm's clients with the munge socket (this one
holds the Kubernetes token and no munge key, that one the munge socket and no token): a request is a
file ``request-<n>`` of NUL-separated arguments, its answer a file ``reply-<n>``: the exit status on the
first line, then the output (see slurm_bridge.sh).

Run: ``python3 slurmd_rollout.py`` with ROLLOUT_NAMESPACE, ROLLOUT_MAX_UNAVAILABLE,
ROLLOUT_DRAIN_DEADLINE_SECONDS and ROLLOUT_EXCHANGE_DIR.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol

REASON_PREFIX = "dualsched:upgrade"
"""The drain reason of this program's own drains: the only ones it ever resumes."""
REVISION_LABEL = "controller-revision-hash"
SLURMD_SELECTOR = "app.kubernetes.io/name=slurmd,app.kubernetes.io/part-of=dualsched"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PASS_SECONDS = 10
REQUEST_SECONDS = 10
SLURM_REPLY_SECONDS = 60
SINFO_FORMAT = "%N|%T|%C|%E"
"""Name, state, CPUs allocated/idle/other/total (jobs hold CPUs), reason last (it may hold ``|``)."""
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

Log = Callable[[str], None]


# ---------------------------------------------------------------- what is observed


@dataclass(frozen=True)
class SlurmNode:
    """A node as ``sinfo --Node --format=SINFO_FORMAT`` shows it (state in lower case, reason or "none")."""

    name: str
    state: str
    reason: str
    allocated_cpus: int = 0

    @property
    def invalid(self) -> bool:
        """INVAL: slurmctld refused its slurmd's registration (and drained it); the state hides DRAIN."""
        return self.state.startswith("inval")

    @property
    def drained(self) -> bool:
        """Drained and no job left on it: DRAINED; DRAINING while jobs still run or complete."""
        return self.state.startswith("drained") or (self.invalid and self.allocated_cpus == 0)

    @property
    def draining(self) -> bool:
        return self.state.startswith("draining") or (self.invalid and self.allocated_cpus > 0)

    @property
    def responding(self) -> bool:
        """'*': slurmctld has not heard from its slurmd."""
        return not self.state.endswith("*")

    @property
    def ours(self) -> bool:
        return (self.drained or self.draining) and self.reason.startswith(REASON_PREFIX)


@dataclass(frozen=True)
class SlurmdPod:
    name: str
    node: str
    revision: str
    current: str
    """The revision of its DaemonSet's current template."""
    ready: bool
    deleting: bool

    @property
    def outdated(self) -> bool:
        return self.revision != self.current


def parse_sinfo(output: str) -> dict[str, SlurmNode]:
    """Each node once (sinfo --Node lists a node once per partition)."""
    nodes = {}
    for line in output.splitlines():
        if line.strip():
            name, state, cpus, reason = line.split("|", 3)
            nodes[name] = SlurmNode(name, state.strip().lower(), reason.strip(), int(cpus.split("/")[0]))
    return nodes


def current_revisions(revisions: list[Mapping]) -> dict[str, str]:
    """DaemonSet uid -> the hash of its current template: the ControllerRevision with the highest
    ``revision`` (a rollback to an older template gives that revision the next number)."""
    newest: dict[str, tuple[int, str]] = {}
    for revision in revisions:
        owner = next((o["uid"] for o in revision["metadata"].get("ownerReferences", []) if o.get("controller")), None)
        labels = revision["metadata"].get("labels") or {}
        if owner is None or REVISION_LABEL not in labels:
            continue
        if owner not in newest or revision["revision"] > newest[owner][0]:
            newest[owner] = (revision["revision"], labels[REVISION_LABEL])
    return {owner: hash_ for owner, (_, hash_) in newest.items()}


def _ready(pod: Mapping) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def slurmd_pods(pods: list[Mapping], revisions: Mapping[str, str]) -> list[SlurmdPod]:
    """The scheduled slurmd pods whose DaemonSet's current revision is known."""
    found = []
    for pod in pods:
        metadata, node = pod["metadata"], pod.get("spec", {}).get("nodeName")
        owner = next((o["uid"] for o in metadata.get("ownerReferences", []) if o.get("controller")), None)
        if node is None or owner not in revisions:
            continue
        found.append(
            SlurmdPod(
                name=metadata["name"],
                node=node,
                revision=(metadata.get("labels") or {}).get(REVISION_LABEL, ""),
                current=revisions[owner],
                ready=_ready(pod),
                deleting=metadata.get("deletionTimestamp") is not None,
            )
        )
    return found


# ---------------------------------------------------------------- what to do


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str


@dataclass(frozen=True)
class DeletePod:
    node: str
    pod: str


@dataclass(frozen=True)
class Resume:
    node: str


@dataclass(frozen=True)
class Report:
    node: str
    message: str


Action = Drain | DeletePod | Resume | Report


def drain_reason(revision: str, now: datetime) -> str:
    return f"{REASON_PREFIX} to {revision} since {now.astimezone(timezone.utc).strftime(TIME_FORMAT)}"


def drained_since(reason: str) -> Optional[datetime]:
    """When this program drained the node, from its reason; None for a reason it did not write."""
    _, marker, stamp = reason.rpartition(" since ")
    if not marker:
        return None
    try:
        return datetime.strptime(stamp, TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _step(pod: SlurmdPod, node: SlurmNode, deadline: timedelta, now: datetime) -> Optional[Action]:
    """What an outdated pod's node, already drained, needs next."""
    if node.drained:
        return DeletePod(node.name, pod.name)
    if node.ours:
        since = drained_since(node.reason)
        if since is not None and now - since > deadline:
            # the same words every pass (no elapsed time): it is logged once
            return Report(node.name, f"jobs still running past the drain deadline ({deadline} after the drain at "
                                     f"{since.strftime(TIME_FORMAT)}): waiting; requeue or cancel them to go on")  # fmt: skip
        return None
    return Report(node.name, f"drained by someone else ({node.reason}) with jobs running: replaced once they end")


def plan(pods: list[SlurmdPod], nodes: Mapping[str, SlurmNode], max_unavailable: int, deadline: timedelta, now: datetime) -> list[Action]:
    """The pass's actions, from observed state only: resume this program's drained nodes whose pod is
    current and whose slurmd answers; move each outdated node on a step; drain outdated nodes while
    fewer than ``max_unavailable`` carry this program's drain."""
    actions: list[Action] = []
    busy = sum(1 for node in nodes.values() if node.ours)
    by_node = {pod.node: pod for pod in pods if not pod.deleting}
    for name in sorted(by_node):
        pod, node = by_node[name], nodes.get(name)
        if node is None:
            continue  # not (yet) a Slurm node: nothing to keep running on it
        if not pod.outdated:
            if node.ours and pod.ready and node.responding:
                actions.append(Resume(name))
            continue
        # INVAL under another reason: slurmctld refused the outdated slurmd (it reports the old GPUs), a state
        # the rollout itself causes; drained like a node in service, it is resumed once the new pod registers
        refused = node.invalid and not node.ours
        if (node.drained or node.draining) and not refused:
            step = _step(pod, node, deadline, now)
            if step is not None:
                actions.append(step)
        elif busy < max_unavailable:
            actions.append(Drain(name, drain_reason(pod.current, now)))
            busy += 1
    return actions


# ---------------------------------------------------------------- doing it


class Kubernetes(Protocol):
    def list(self, path: str) -> list[dict]: ...

    def delete(self, path: str) -> None: ...


class Slurm(Protocol):
    def run(self, *args: str) -> str: ...


class ApiServer:
    """GET lists and DELETE, with the pod's own ServiceAccount token."""

    def __init__(self, url: str, token_file: str, ca_file: str):
        self.url, self.token_file = url, token_file
        self.context = ssl.create_default_context(cafile=ca_file)

    def _call(self, method: str, path: str) -> dict:
        with open(self.token_file) as token:  # the kubelet rotates it: read it each time
            bearer = token.read().strip()
        request = urllib.request.Request(
            f"{self.url}{path}", headers={"Authorization": f"Bearer {bearer}", "Accept": "application/json"}, method=method
        )
        with urllib.request.urlopen(request, context=self.context, timeout=REQUEST_SECONDS) as response:
            return json.load(response)

    def list(self, path: str) -> list[dict]:
        return self._call("GET", path)["items"]

    def delete(self, path: str) -> None:
        try:
            self._call("DELETE", path)
        except urllib.error.HTTPError as error:
            if error.code != 404:  # gone already: what was wanted
                raise


class SlurmFailed(RuntimeError):
    pass


class SlurmBridge:
    """Slurm commands run by the sibling container (slurm_bridge.sh), through files in a shared directory."""

    def __init__(self, exchange: Path, timeout: float = SLURM_REPLY_SECONDS):
        self.exchange, self.timeout, self.sequence = exchange, timeout, 0
        for stale in [*exchange.glob("request-*"), *exchange.glob("reply-*")]:  # left by an earlier run of this container
            stale.unlink(missing_ok=True)

    def run(self, *args: str) -> str:
        self.sequence += 1
        request, reply = self.exchange / f"request-{self.sequence}", self.exchange / f"reply-{self.sequence}"
        partial = self.exchange / f".request-{self.sequence}"
        partial.write_bytes(b"\0".join(arg.encode() for arg in args))
        partial.rename(request)  # whole, or not there
        deadline = time.monotonic() + self.timeout
        while not reply.exists():
            if time.monotonic() > deadline:
                request.unlink(missing_ok=True)
                raise SlurmFailed(f"{args[0]}: no answer from the Slurm container in {self.timeout:.0f}s")
            time.sleep(0.2)
        status, _, output = reply.read_text().partition("\n")
        reply.unlink()
        if status.strip() != "0":
            raise SlurmFailed(f"{' '.join(args)}: exit {status.strip()}: {output.strip()}")
        return output


class Rollout:
    def __init__(self, api: Kubernetes, slurm: Slurm, namespace: str, max_unavailable: int, deadline: timedelta, log: Log):
        self.api, self.slurm, self.namespace, self.log = api, slurm, namespace, log
        self.max_unavailable, self.deadline = max_unavailable, deadline
        self.reported: dict[str, str] = {}

    def observe(self) -> tuple[list[SlurmdPod], dict[str, SlurmNode]]:
        selector = urllib.parse.quote(SLURMD_SELECTOR)
        revisions = current_revisions(self.api.list(f"/apis/apps/v1/namespaces/{self.namespace}/controllerrevisions?labelSelector={selector}"))
        pods = slurmd_pods(self.api.list(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}"), revisions)
        nodes = parse_sinfo(self.slurm.run("sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"))
        return pods, nodes

    def act(self, action: Action) -> None:
        if isinstance(action, Report):
            if self.reported.get(action.node) != action.message:  # once per change, not every pass
                self.log(f"{action.node}: {action.message}")
            self.reported[action.node] = action.message
            return
        self.reported.pop(action.node, None)
        if isinstance(action, Drain):
            self.slurm.run("scontrol", "update", f"nodename={action.node}", "state=drain", f"reason={action.reason}")
            self.log(f"{action.node}: drained ({action.reason})")
        elif isinstance(action, DeletePod):
            self.api.delete(f"/api/v1/namespaces/{self.namespace}/pods/{action.pod}")
            self.log(f"{action.node}: no job left, deleted {action.pod}; its DaemonSet makes the new one")
        else:
            self.slurm.run("scontrol", "update", f"nodename={action.node}", "state=resume")
            self.log(f"{action.node}: new slurmd registered, resumed")

    def run_pass(self, now: datetime) -> None:
        pods, nodes = self.observe()
        for action in plan(pods, nodes, self.max_unavailable, self.deadline, now):
            self.act(action)


def log_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop(signum: int, frame: object) -> None:
    """SIGTERM: exit now (as PID 1 the program would ignore it). Any step it stops between is taken
    again from what is observed, by the next pod."""
    raise SystemExit(0)


def api_server_url(env: Mapping[str, str]) -> str:
    host = env["KUBERNETES_SERVICE_HOST"]
    return f"https://{f'[{host}]' if ':' in host else host}:{env['KUBERNETES_SERVICE_PORT']}"


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    env = os.environ
    max_unavailable, deadline = int(env["ROLLOUT_MAX_UNAVAILABLE"]), timedelta(seconds=int(env["ROLLOUT_DRAIN_DEADLINE_SECONDS"]))
    api = ApiServer(api_server_url(env), f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    rollout = Rollout(api, SlurmBridge(Path(env["ROLLOUT_EXCHANGE_DIR"])), env["ROLLOUT_NAMESPACE"], max_unavailable, deadline, log_line)
    log_line(f"slurmd rollout: at most {max_unavailable} node(s) at once, drain deadline {deadline}, a pass every {PASS_SECONDS}s")
    while True:
        try:
            rollout.run_pass(datetime.now(timezone.utc))
        except (OSError, ValueError, SlurmFailed) as error:  # the next pass starts again from what it sees
            log_line(f"pass stopped: {error}")
        time.sleep(PASS_SECONDS)


if __name__ == "__main__":
    main()
