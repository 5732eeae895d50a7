"""Helpers of the e2e tier (see conftest.py): the World the tests act on, config, step events."""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
VENV = ROOT / ".venv"
PASSPHRASE = "dualsched-e2e"  # test-only backend in a temp dir
NEEDED = ("pulumi", "pulumi-language-python", "kubectl", "kube-apiserver", "etcd", "kwok")
PREFIX = "dualsched:"


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


DIAGNOSTICS = ROOT / "build" / "diagnostics"
"""Where a world writes what the machine and its control plane were doing when the API server did not answer, what
a stack's pods were doing when its `pulumi up` failed, and what Slurm's daemons were doing when a real tier's wait
for Slurm timed out (node_support.py); `make test` (tools/test-tiers.sh) prints these files last, where a CI log's
tail shows them."""
BOUND = 20
"""Seconds a record waits for any one command of its own (a log, a command in a pod): the pod's node may be gone,
the daemon it asks may hang. Never sent again: a record is written in seconds, not minutes."""
API_TROUBLE = (
    "Error from server (Timeout)", "the server was unable to return a response", "the server is currently unable to handle",
    "etcdserver: request timed out", "TLS handshake timeout", "net/http: request canceled",
)
"""kubectl's words for an API server that did not answer in time (not for a refused or invalid request)."""
RETRIED_VERBS, ATTEMPTS = ("get", "apply", "logs"), 3
"""kubectl commands sent again when the API server did not answer in time, as client-go's controllers do: reads, and
apply of the same objects. Here the API server shares two cores with up to five kubelets and two Pulumi engines, and
now and then one of its etcd reads hangs until the request's minute is up (kube-apiserver logs "Handler timeout"
for a GET, etcd nothing). Commands with effects (exec, create, delete) are never repeated."""


def machine_state() -> str:
    """Load, memory and the busiest processes (with their nice values) of this machine, now."""
    ps = subprocess.run(["ps", "-eo", "pid,ni,pcpu,rss,etime,args", "--sort=-pcpu"], capture_output=True, text=True).stdout
    memory = subprocess.run(["free", "-m"], capture_output=True, text=True).stdout
    return "\n".join([f"load average: {Path('/proc/loadavg').read_text().strip()}", memory,
                      *(line[:200] for line in ps.splitlines()[:25])])


def up_or_diagnose(world: World, stack, *namespaces: str):
    """``stack.up()``'s result; where it fails, the pods of ``namespaces`` are diagnosed first
    (World.diagnose_pods): the engine's error says which pods were not ready, not why."""
    from pulumi import automation as auto

    try:
        return stack.up(on_output=lambda _: None, color="never")
    except auto.CommandError as error:
        world.diagnose_pods(f"pulumi up of stack {stack.name} failed:\n{tail(str(error), 30)}", *namespaces)
        raise


def finished_well(status: dict) -> bool:
    return status.get("state", {}).get("terminated", {}).get("exitCode") == 0


@dataclass(frozen=True)
class Scope:
    """What a pods record (World.diagnose_pods) covers."""

    kind: str
    """Its file: DIAGNOSTICS/<world>-<kind>-<time>.log."""
    selector: str = ""
    """The pods, by kubectl's label selector; every pod of the namespace when empty."""
    every_container: bool = False
    """The logs of every container, or only of those not ready (an init container that ended well is not ready,
    and says nothing new)."""
    lines: int = 40
    """How much of each log: its last lines."""


NOT_READY = Scope("pods")
"""A stack that did not come up: every pod, the logs of what is not ready."""


def pod_diagnosis(world: World, pod: dict, scope: Scope = NOT_READY) -> str:
    """A pod's phase and node, each container's state, restarts and last end, and the log tails of the containers
    ``scope`` asks for: a container that restarted, its previous run's first (a crash loop's cause)."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    statuses = pod["status"].get("initContainerStatuses", []) + pod["status"].get("containerStatuses", [])
    lines = [f"--- pod {namespace}/{name} on {pod['spec'].get('nodeName')}: {pod['status'].get('phase')}"]
    for status in statuses:
        lines.append(f"  {status['name']}: ready={status.get('ready')} restarts={status.get('restartCount', 0)} "
                     f"state={json.dumps(status.get('state'))} last={json.dumps(status.get('lastState'))}")
        if not scope.every_container and (status.get("ready") or finished_well(status)):
            continue
        runs = ([["--previous"]] if status.get("restartCount") else []) + [[]]  # the crashed run first, then now
        for run in runs:
            logs = world.bounded("logs", "-n", namespace, name, "-c", status["name"], *run, f"--tail={scope.lines}")
            lines.append(f"  log of {status['name']} {' '.join(run) or '(now)'}:\n{tail(logs, scope.lines)}")
    return "\n".join(lines)


@dataclass
class World:
    """What every e2e test needs: env, paths, kubectl, stacks."""

    tmp: Path
    env: dict[str, str]
    project: Path
    cluster_dir: Path
    last_diagnosis: dict[str, float] = field(default_factory=dict, init=False)
    """When each kind of record (Scope.kind, "" for the machine's) was last written."""
    keeper_log: list[str] = field(default_factory=list, init=False)
    """What the node keepers run on the host logged (tools/host_keeper.py; conftest.py starts it)."""

    # ---------------------------------------------------------------- commands
    def run(self, args: list[str], *, check: bool = True, timeout: int = 300, **kw) -> subprocess.CompletedProcess:
        for attempt in range(1, ATTEMPTS + 1):
            result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
            if result.returncode == 0 or not any(words in (result.stderr or "") for words in API_TROUBLE):
                break
            self.diagnose(f"`{' '.join(args[:4])}` got no answer in time (attempt {attempt}):\n{tail(result.stderr, 5)}")
            if args[:2] not in [["kubectl", verb] for verb in RETRIED_VERBS]:
                break
        if check and result.returncode != 0:
            pytest.fail(f"`{' '.join(args)}` failed ({result.returncode}):\n{tail(result.stdout)}\n{tail(result.stderr)}")
        return result

    def diagnose(self, why: str) -> None:
        """Write DIAGNOSTICS/<world>-<time>.log: the machine's state and the tails of this world's control-plane
        logs, at most once a minute (a stalled API server fails every command after the first)."""
        if not self.due(""):
            return
        logs = self.cluster_dir / "logs"
        parts = [why, machine_state()]
        for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
            log = logs / f"{name}.log"
            if log.exists():
                parts.append(f"--- {log} (last 60 lines)\n{tail(log.read_text(errors='replace'), 60)}")
        self.record("", parts)

    def diagnose_pods(self, why: str, *namespaces: str, scope: Scope = NOT_READY, found: Sequence[str] = ()) -> None:
        """Write DIAGNOSTICS/<world>-<scope.kind>-<time>.log: ``why``, what the caller ``found`` already, then the pods
        of ``namespaces`` that ``scope`` selects with their containers' states and the log tails it asks for (see
        pod_diagnosis), and the namespaces' latest events. For a stack that did not come up (its pods are gone
        once the test ends), and for Slurm that does not answer (NodeWorld.diagnose_slurm)."""
        parts = [why, *found]
        selector = ["-l", scope.selector] if scope.selector else []
        for namespace in namespaces:
            listed = self.kubectl("get", "pods", "-n", namespace, *selector, "-o", "json", check=False)
            if listed.returncode != 0:
                parts.append(f"--- pods in {namespace}: {tail(listed.stderr, 5)}")
                continue
            parts += [pod_diagnosis(self, pod, scope) for pod in json.loads(listed.stdout)["items"]]
            events = self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
            parts.append(f"--- events in {namespace} (last 30)\n{tail(events.stdout + events.stderr, 30)}")
        self.record(scope.kind, parts)

    def due(self, kind: str) -> bool:
        """Whether a record of ``kind`` may be written now: at most one a minute (what stalls fails every command,
        or every wait, after the first)."""
        now = time.monotonic()
        if now - self.last_diagnosis.get(kind, now - 60) < 60:
            return False
        self.last_diagnosis[kind] = now
        return True

    def record(self, kind: str, parts: list[str]) -> None:
        """Write DIAGNOSTICS/<world>[-<kind>]-<time>.log."""
        DIAGNOSTICS.mkdir(parents=True, exist_ok=True)
        name = "-".join(word for word in (self.tmp.name, kind, time.strftime("%H%M%S")) if word)
        (DIAGNOSTICS / f"{name}.log").write_text("\n\n".join(parts) + "\n")

    def bounded(self, *args: str, seconds: Optional[float] = None) -> str:
        """What ``kubectl args`` printed, for a record: sent once, ended after ``seconds`` (BOUND by default),
        its exit status said where it failed."""
        seconds = BOUND if seconds is None else seconds
        try:
            result = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, timeout=seconds, check=False)
            said, status = result.stdout + result.stderr, f"[exit {result.returncode}]" if result.returncode else ""
        except subprocess.TimeoutExpired as stopped:
            said = "".join(out if isinstance(out, str) else out.decode(errors="replace") for out in (stopped.stdout, stopped.stderr) if out)
            status = f"[no answer in {seconds:g} s: stopped]"
        return "\n".join(part for part in (said.rstrip("\n"), status) if part)

    def kubectl(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return self.run(["kubectl", *args], check=check, **kw)

    def kget(self, *args: str) -> Any:
        """``kubectl get ... -o json`` parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def cluster(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run([str(TOOLS / "cluster.sh"), *args], check=check, timeout=400)

    # ---------------------------------------------------------------- stacks
    def write_config(self, stack: str, config: dict[str, Any]) -> None:
        """Write ``Pulumi.<stack>.yaml`` in the project copy: ``dualsched:`` keys from ``config``,
        keeping the ``encryptionsalt`` Pulumi stored there."""
        path = self.project / f"Pulumi.{stack}.yaml"
        document: dict[str, Any] = {}
        if path.exists():
            old = yaml.safe_load(path.read_text()) or {}
            document = {key: value for key, value in old.items() if key != "config"}
        document["config"] = {PREFIX + key: value for key, value in config.items()}
        path.write_text(yaml.safe_dump(document, sort_keys=False))

    def stack(self, name: str, config: Optional[dict[str, Any]] = None, project: Optional[Path] = None,
              env: Optional[dict[str, str]] = None):
        """Create or select a stack of the project copy (or of ``project``), optionally with a config; ``env``
        adds to the world's environment (the engine's, and the plugins' it starts)."""
        from pulumi import automation as auto

        work_dir = project or self.project
        if config is not None and project is None:
            self.write_config(name, config)
        command = auto.PulumiCommand(root=str(Path(shutil.which("pulumi", path=self.env["PATH"])).parent.parent),
                                     skip_version_check=True)
        return auto.create_or_select_stack(
            stack_name=name,
            work_dir=str(work_dir),
            opts=auto.LocalWorkspaceOptions(env_vars={**self.env, **(env or {})}, pulumi_command=command),
        )


def raw_config(stack: str = "dev") -> dict[str, Any]:
    """The checkout's ``dualsched:`` keys of a stack, without the prefix (a fresh deep copy)."""
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    return copy.deepcopy({k[len(PREFIX):]: v for k, v in document["config"].items() if k.startswith(PREFIX)})


def load_env(tmp: Path, cluster_dir: Path, ports: dict[str, int]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "DUALSCHED_")) and k != "KUBECONFIG"}
    base.update({
        "DUALSCHED_CLUSTER_DIR": str(cluster_dir),
        "DUALSCHED_APISERVER_PORT": str(ports["api"]),
        "DUALSCHED_ETCD_PORT": str(ports["etcd"]),
        "DUALSCHED_KCM_PORT": str(ports["kcm"]),
        "DUALSCHED_SCHEDULER_PORT": str(ports["scheduler"]),
        "PULUMI_HOME": str(tmp / "pulumi-home"),
        "KUBECONFIG": str(cluster_dir / "kubeconfig"),
    })
    if "DUALSCHED_TOOLS_CACHE" in os.environ:
        base["DUALSCHED_TOOLS_CACHE"] = os.environ["DUALSCHED_TOOLS_CACHE"]
    dump = subprocess.run(
        ["bash", "-c", 'source "$1" >&2 && env -0', "bash", str(TOOLS / "pulumi-env.sh")],
        env=base, capture_output=True, timeout=300,
    )
    messages = dump.stderr.decode(errors="replace")
    if dump.returncode != 0:
        pytest.fail(f"sourcing tools/pulumi-env.sh failed:\n{tail(messages)}")
    env = dict(item.split("=", 1) for item in dump.stdout.decode().split("\0") if "=" in item)
    missing = [tool for tool in NEEDED if not shutil.which(tool, path=env.get("PATH", ""))]
    if missing or "WARNING" in messages or "missing" in messages:
        pytest.fail(
            f"the e2e tier needs the built toolchain: missing {', '.join(missing) or 'provider plugins'}; "
            f"run `make tools` (tools/build-tools.sh).\n{tail(messages)}"
        )
    # The project's Python first: the policy pack runs on python3 from PATH (PulumiPolicy.yaml has no virtualenv).
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env['PATH']}"
    (tmp / "backend").mkdir(exist_ok=True)
    env["PULUMI_BACKEND_URL"] = f"file://{tmp / 'backend'}"
    env["PULUMI_CONFIG_PASSPHRASE"] = PASSPHRASE
    env["KUBECONFIG"] = str(cluster_dir / "kubeconfig")
    env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
    return env


def copy_project(dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in ("__main__.py", "Pulumi.dev.yaml", "Pulumi.prod.yaml"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("dualsched", "components", "config"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    runtime = project["runtime"] if isinstance(project["runtime"], dict) else {"name": project["runtime"]}
    runtime.setdefault("options", {})["virtualenv"] = str(VENV)
    project["runtime"] = runtime
    (dest / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))


class Steps:
    """Collects the engine's step events of one operation (``on_event``)."""

    def __init__(self) -> None:
        self.steps: list[Any] = []

    def __call__(self, event) -> None:
        pre = getattr(event, "resource_pre_event", None)
        if pre is not None and pre.metadata is not None:
            self.steps.append(pre.metadata)

    def ops(self, predicate: Callable[[Any], bool] = lambda m: True) -> dict[str, set[str]]:
        """URN -> set of ops, for the steps that match."""
        result: dict[str, set[str]] = {}
        for meta in self.steps:
            if predicate(meta):
                result.setdefault(meta.urn, set()).add(str(getattr(meta.op, "value", meta.op)))
        return result


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


TIMINGS: list[tuple[str, float]] = []
"""(what, seconds) of the slow steps, printed at the end of the run."""
