"""Fleet scale through the real engine: `pulumi up/preview/destroy` against a local control plane.

    flock /tmp/dualsched-realtier.lock python -m bench.engine            # 256, 1024, 4096 nodes (make bench-engine)
    python -m bench.engine --report-only    # both reports again from the JSON (the machine line: this machine's)
    flock /tmp/dualsched-realtier.lock python -m bench.engine --sizes 256 --no-write

For each size (bench/fleet.py: 8 GPUs per node, 8 pools) and each program (``library`` =
components.program.build, ``flat`` = bench/flat_program.py, the same objects by direct
constructors), on a FRESH private cluster (tools/cluster.sh with its own dir and ports, KWOK fake
nodes, torn down afterwards) and a fresh file backend, with the built Pulumi CLI and providers of the
e2e tier (tools/pulumi-env.sh), it runs and measures:

  up        first `pulumi up --yes` (preview included, as a platform team runs it)
  preview   no-op `pulumi preview --expect-no-changes`
  noop-up   no-op `pulumi up --yes --expect-no-changes`
  pool      `pulumi up --yes` after a one-pool change (fleet variant ``pool``)
  conf      `pulumi up --yes` after a slurm.conf-only change (variant ``conf``)
  destroy   `pulumi destroy --yes` (after an untimed `pulumi state unprotect --all`)

The no-op operations run ``--repeat`` times (3) and report medians. The fleet's nodes are made
schedulable (Ready, not-ready taint lifted) before any clock starts.

Per operation: wall time; CPU time of the whole pulumi process tree (engine, language host and
program, providers: wait4's rusage); peak RSS (VmHWM, sampled from /proc every 0.2 s) of the engine
(`pulumi`), of the program (language host + Python) and of the providers, and the most the tree held
at once (the largest sum of its current RSS over the samples); the state file's size
afterwards; API requests the program's provider made (counted by the API server: the provider
authenticates as its own user, which a FlowSchema of its own classifies, and
``apiserver_flowcontrol_dispatched_requests_total`` for that FlowSchema is read before and after);
for the changes to a running stack (noop-up, pool, conf), the slurmctld pods the operation restarted
(their uids before and after: KWOK's pods are real API objects that the StatefulSet controller replaces).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.control_plane import control_plane_ports  # noqa: E402

TOOLS = ROOT / "tools"
VENV = ROOT / ".venv"
SIZES = (256, 1024, 4096)
PROGRAMS = ("library", "flat")
OPS = ("up", "preview", "noop-up", "pool", "conf", "destroy")
NO_OPS = ("preview", "noop-up")
"""Operations that change nothing, so they can be repeated on the same stack (``--repeat``: medians)."""
PASSPHRASE = "dualsched-bench"
BENCH_USER = "dualsched-bench"
STACK = "bench"
TARGETS = {"preview_s": 60, "noop_up_s": 90, "ratio": 1.1, "memory_mib": 1024, "pool_s": 30, "pool_restarts": 0}
CHANGES = ("noop-up", "pool", "conf")
"""Operations on a running stack: the slurmctld pods each one restarted are counted."""


def log(message: str) -> None:
    print(f"[bench-engine {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- process tree sampling

_CLASSES = (("engine", re.compile(r"^pulumi$")), ("provider", re.compile(r"^pulumi-resource-")),
            ("program", re.compile(r"^(pulumi-language-|python)")))


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _descendants(root: int) -> list[int]:
    kids, out, stack = _children_map(), [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(kids.get(pid, ()))
    return out


def _status(pid: int) -> Optional[tuple[str, int, int]]:
    """(executable, VmHWM kB, VmRSS kB) of a live process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None
    kib = {key: int(value) for key, value in re.findall(r"^(VmHWM|VmRSS):\s+(\d+) kB", text, re.M)}
    return exe, kib.get("VmHWM", 0), kib.get("VmRSS", 0)


class TreeSampler(threading.Thread):
    """Peak RSS of a process tree: per process (VmHWM, exact), summed per class at the end, and the
    largest sum of the tree's current RSS over the samples (what the tree held at once)."""

    def __init__(self, root: int, period: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.period, self.stop = root, period, threading.Event()
        self.peaks: dict[int, tuple[str, int]] = {}
        self.together_kib = 0

    def run(self) -> None:
        while not self.stop.is_set():
            now = 0
            for pid in _descendants(self.root):
                status = _status(pid)
                if status:
                    exe, hwm, rss = status
                    now += rss
                    if hwm >= self.peaks.get(pid, ("", 0))[1]:
                        self.peaks[pid] = (exe, hwm)
            self.together_kib = max(self.together_kib, now)
            self.stop.wait(self.period)

    def by_class(self) -> dict[str, float]:
        out = {name: 0.0 for name, _ in _CLASSES}
        for exe, kib in self.peaks.values():
            for name, pattern in _CLASSES:
                if pattern.search(exe):
                    out[name] += kib / 1024
                    break
        return out

    def processes(self) -> list[list]:
        """[executable, peak MiB] per process, largest first: which process a class's peak is."""
        return sorted(([exe, round(kib / 1024)] for exe, kib in self.peaks.values()), key=lambda p: -p[1])


# ------------------------------------------------------------------------------------- the world


class World:
    """A private cluster with the fleet's fake nodes, a bench user for the provider, a file backend."""

    def __init__(self, tmp: Path, nodes: int):
        self.tmp, self.nodes = tmp, nodes
        self.cluster_dir = tmp / "cluster"
        self.ports = control_plane_ports()
        self.env = self._load_env()

    def _load_env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "DUALSCHED_")) and k != "KUBECONFIG"}
        base.update({
            "DUALSCHED_CLUSTER_DIR": str(self.cluster_dir),
            "DUALSCHED_APISERVER_PORT": str(self.ports["api"]),
            "DUALSCHED_ETCD_PORT": str(self.ports["etcd"]),
            "DUALSCHED_KCM_PORT": str(self.ports["kcm"]),
            "DUALSCHED_SCHEDULER_PORT": str(self.ports["scheduler"]),
            "PULUMI_HOME": str(self.tmp / "pulumi-home"),
            "KUBECONFIG": str(self.cluster_dir / "kubeconfig"),
            # the fleet's nodes renew no Lease (as when bench/ENGINE-RESULTS.md was measured): at 4,096 nodes the
            # Leases would add about 400 writes a second, which a real fleet's kubelets send to its own API server
            "DUALSCHED_KWOK_NODE_LEASE_SECONDS": "0",
        })
        if "DUALSCHED_TOOLS_CACHE" in os.environ:
            base["DUALSCHED_TOOLS_CACHE"] = os.environ["DUALSCHED_TOOLS_CACHE"]
        dump = subprocess.run(["bash", "-c", 'source "$1" >&2 && env -0', "bash", str(TOOLS / "pulumi-env.sh")],
                              env=base, capture_output=True, timeout=300)
        if dump.returncode != 0 or b"WARNING" in dump.stderr:
            raise SystemExit(f"sourcing tools/pulumi-env.sh failed (run `make tools`):\n{dump.stderr.decode()[-2000:]}")
        env = dict(item.split("=", 1) for item in dump.stdout.decode().split("\0") if "=" in item)
        env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env['PATH']}"
        env["PULUMI_CONFIG_PASSPHRASE"] = PASSPHRASE
        env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
        return env

    def run(self, args: list[str], *, timeout: int = 3600, check: bool = True, **kw) -> subprocess.CompletedProcess:
        result = subprocess.run(args, env=kw.pop("env", self.env), capture_output=True, text=True, timeout=timeout, **kw)
        if check and result.returncode != 0:
            raise RuntimeError(f"`{' '.join(map(str, args))}` failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(["kubectl", *args], **kw)

    # ---------------------------------------------------------------- cluster
    def up(self) -> None:
        start = time.monotonic()
        self.run([str(TOOLS / "cluster.sh"), "up"], timeout=600)
        self._fleet_nodes()
        self._rwx_volumes()
        self._bench_user()
        log(f"cluster with {self.nodes} fleet nodes up in {time.monotonic() - start:.0f}s")

    def down(self) -> None:
        self.run([str(TOOLS / "cluster.sh"), "down"], check=False, timeout=600)

    def _fleet_nodes(self) -> None:
        """The fleet's nodes, with their pools' labels already on: KWOK runs no container, so the node keeper
        (which writes them on a real cluster, tests/node/test_node_taints.py) is only marked Ready here; with
        the labels the slurmd DaemonSets get their pod per node, as on a real fleet."""
        from bench.fleet import fleet_config
        from dualsched.components.nodepools import pool_labels

        config = fleet_config(self.nodes)
        kept = {node: pool_labels(config, pool) for pool in config.pools for node in pool.node_names}
        names = list(kept)
        capacity = {"cpu": "256", "memory": "4Ti", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"}
        for chunk in range(0, len(names), 512):
            items = [{
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                      "kubernetes.io/arch": "amd64", "type": "kwok",
                                                      "node-role.kubernetes.io/gpu": "", "nvidia.com/gpu.present": "true",
                                                      **kept[name]},
                             "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {},
                "status": {"capacity": capacity, "allocatable": capacity, "phase": "Running"},
            } for name in names[chunk:chunk + 512]]
            self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        self._wait_schedulable(len(names))

    def _wait_schedulable(self, count: int, timeout: float = 900) -> None:
        """Until ``count`` fleet nodes are schedulable: Ready and without the ``node.kubernetes.io/not-ready``
        taint the API server puts on every new node. The controller-manager lifts it once a node is Ready,
        at 3-5 nodes a second here (on a busy API server): 15 minutes at 4,096 nodes,
        which pods created meanwhile would wait behind, so the bench lifts it itself, as the controller would,
        once every node is Ready. One list per poll (`kubectl wait` watches the nodes one by one)."""
        state = '{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}/{.spec.taints[*].key}{"\\n"}{end}'
        start = time.monotonic()
        deadline, lifted = start + timeout, False
        while True:
            nodes = self.kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", f"jsonpath={state}").stdout.splitlines()
            schedulable = nodes.count("True/")
            if schedulable >= count:
                return
            if not lifted and sum(n.startswith("True/") for n in nodes) >= count:
                lifted = True
                log(f"{count} fleet nodes Ready after {time.monotonic() - start:.0f}s; lifting the not-ready taint of {count - schedulable}")
                # nodes the controller cleared meanwhile make kubectl exit 1 ("not found"); the next list tells
                self.kubectl("taint", "nodes", "-l", "nvidia.com/gpu.present=true", "node.kubernetes.io/not-ready:NoSchedule-",
                             check=False, timeout=900)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{schedulable} of {count} fleet nodes Ready and untainted after {timeout:.0f}s")
            time.sleep(2)

    def _rwx_volumes(self) -> None:
        """The fleet's controller state claim is ReadWriteMany with no class: class-less RWX PVs for it.

        ReadWriteMany only: the PV binder looks for a claim's volume among the PVs with exactly its access
        modes first, and only then among those with more. With RWO too, the shared-storage PV (RWX, bound
        by its own claim's volumeName, not by a claimRef) was the first match whenever the state claim came
        before the shared claim, and the shared claim then stayed Pending (seen at 256 nodes)."""
        self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [{
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"bench-rwx-{i}"},
            "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": str(self.cluster_dir / "volumes" / f"bench-rwx-{i}"), "type": "DirectoryOrCreate"}},
        } for i in range(2)]}))

    def _bench_user(self) -> None:
        """A client cert for the provider; RBAC cluster-admin; a FlowSchema that classifies only it."""
        pki = self.cluster_dir / "pki"
        key, csr, crt = self.tmp / "bench.key", self.tmp / "bench.csr", self.tmp / "bench.crt"
        self.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={BENCH_USER}"])
        self.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
                  "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(pki / "client.ext")])
        admin = self.cluster_dir / "kubeconfig"
        text = admin.read_text()
        text = re.sub(r"client-certificate-data: \S+", f"client-certificate-data: {base64.b64encode(crt.read_bytes()).decode()}", text)
        text = re.sub(r"client-key-data: \S+", f"client-key-data: {base64.b64encode(key.read_bytes()).decode()}", text)
        self.bench_kubeconfig = self.tmp / "bench.kubeconfig"
        self.bench_kubeconfig.write_text(text)
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": BENCH_USER},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "User", "name": BENCH_USER, "apiGroup": "rbac.authorization.k8s.io"}]},
            {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": BENCH_USER},
             "spec": {"priorityLevelConfiguration": {"name": "exempt"}, "matchingPrecedence": 2,
                      "rules": [{"subjects": [{"kind": "User", "user": {"name": BENCH_USER}}],
                                 "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                    "clusterScope": True, "namespaces": ["*"]}],
                                 "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}},
        ]}))

    def controller_pods(self) -> dict[str, str]:
        """The slurmctld pods by name, with their uids: a restarted pod is a new object."""
        pods = json.loads(self.kubectl("get", "pods", "--all-namespaces", "-l", "app.kubernetes.io/name=slurmctld", "-o", "json").stdout)
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods["items"]}

    def api_requests(self) -> int:
        """Requests the API server dispatched for the bench user (its FlowSchema) so far."""
        text = self.kubectl("get", "--raw", "/metrics").stdout
        total = 0
        for line in text.splitlines():
            if line.startswith(("apiserver_flowcontrol_dispatched_requests_total{", "apiserver_flowcontrol_request_execution_seconds_count{")) \
                    and f'flow_schema="{BENCH_USER}"' in line and line.startswith("apiserver_flowcontrol_dispatched"):
                total += int(float(line.rsplit(" ", 1)[1]))
        return total


# ------------------------------------------------------------------------------------ the program

MAIN_LIBRARY = '''"""bench: the library program for a generated fleet (bench-settings.json)."""
import json
from bench.fleet import fleet_config
from dualsched.components.program import build
settings = json.load(open("bench-settings.json"))
build(fleet_config(settings["nodes"], settings["variant"]))
'''
MAIN_FLAT = '''"""bench: the flat program, from the plan the benchmark captured (bench-settings.json)."""
import json
from bench.flat_program import build
settings = json.load(open("bench-settings.json"))
build(json.load(open(f"plan-{settings['variant']}.json")))
'''


class Project:
    def __init__(self, world: World, program: str, nodes: int):
        self.world, self.program, self.nodes = world, program, nodes
        self.dir = world.tmp / f"project-{program}"
        self.backend = world.tmp / f"backend-{program}"
        self.dir.mkdir()
        self.backend.mkdir()
        for name in ("dualsched", "components", "config", "bench"):
            shutil.copytree(ROOT / name, self.dir / name, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
        (self.dir / "__main__.py").write_text(MAIN_LIBRARY if program == "library" else MAIN_FLAT)
        (self.dir / "Pulumi.yaml").write_text(
            "name: dualsched\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
            f"    virtualenv: {VENV}\n")
        if program != "library":
            from bench.fleet import VARIANTS, fleet_config
            from bench.flat_program import capture

            for variant in VARIANTS:
                plan = capture(fleet_config(nodes, variant))
                (self.dir / f"plan-{variant}.json").write_text(json.dumps(plan))
        self.env = {**world.env, "PULUMI_BACKEND_URL": f"file://{self.backend}", "KUBECONFIG": str(world.bench_kubeconfig)}
        self.world.run(["pulumi", "stack", "init", STACK, "--non-interactive"], cwd=self.dir, env=self.env)

    def variant(self, name: str) -> None:
        (self.dir / "bench-settings.json").write_text(json.dumps({"nodes": self.nodes, "variant": name}))

    def state_bytes(self) -> int:
        files = [p for p in self.backend.rglob(f"{STACK}.json") if ".history" not in p.parts and "backups" not in p.parts]
        return max((p.stat().st_size for p in files), default=0)

    def op(self, op: str) -> dict:
        args = {
            "up": ["up", "--yes"], "preview": ["preview", "--expect-no-changes"],
            "noop-up": ["up", "--yes", "--expect-no-changes"], "pool": ["up", "--yes"], "conf": ["up", "--yes"],
            "destroy": ["destroy", "--yes"],
        }[op]
        self.variant({"pool": "pool", "conf": "conf", "destroy": "conf"}.get(op, "base"))
        if op == "destroy":
            self.world.run(["pulumi", "state", "unprotect", "--all", "--yes", "--stack", STACK], cwd=self.dir, env=self.env)
        requests_before = self.world.api_requests()
        controllers_before = self.world.controller_pods()
        out = open(self.world.tmp / f"{self.program}-{op}.log", "w")
        start = time.monotonic()
        proc = subprocess.Popen(["pulumi", *args, "--stack", STACK, "--non-interactive", "--color", "never"],
                                cwd=self.dir, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop.set()
        sampler.join()
        out.close()
        if proc.returncode != 0:
            raise RuntimeError(f"pulumi {op} ({self.program}, {self.nodes} nodes) failed:\n"
                               f"{(self.world.tmp / f'{self.program}-{op}.log').read_text()[-4000:]}")
        time.sleep(1)  # let the API server's counters settle
        memory = sampler.by_class()
        return {
            "op": op, "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "rss_engine_mib": memory["engine"], "rss_program_mib": memory["program"], "rss_provider_mib": memory["provider"],
            "rss_total_mib": sum(memory.values()), "rss_together_mib": sampler.together_kib / 1024,
            "processes": sampler.processes(), "state_bytes": self.state_bytes(),
            "api_requests": self.world.api_requests() - requests_before,
            **({"controller_restarts": restarted(controllers_before, self.world.controller_pods())} if op in CHANGES else {}),
            "summary": _summary((self.world.tmp / f"{self.program}-{op}.log").read_text()),
        }


def _restarts(row: dict) -> str:
    return f" slurmctld restarted {row['controller_restarts']}" if "controller_restarts" in row else ""


def restarted(before: dict[str, str], after: dict[str, str]) -> int:
    """How many of the pods ``before`` are gone or another object ``after`` (by name: uid)."""
    return sum(1 for name, uid in before.items() if after.get(name) != uid)


def _summary(text: str) -> str:
    """The engine's "Resources:" block, on one line."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Resources:")
    except StopIteration:
        return ""
    block = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        block.append(line.strip())
    return ", ".join(block)


def measure_program(program: str, nodes: int, keep: bool = False, ops=OPS, repeat: int = 1) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix=f"dualsched-bench-engine-{nodes}-{program}-"))
    world = World(tmp, nodes)
    try:
        world.up()
        project = Project(world, program, nodes)
        rows = []
        for op in ops:
            runs = [project.op(op) for _ in range(repeat if op in NO_OPS else 1)]
            row = median_row(runs)
            log(f"{nodes} nodes {program:7s} {op:8s} {row['seconds']:7.1f}s cpu {row['cpu_seconds']:6.1f}s "
                f"rss {row['rss_engine_mib']:.0f}/{row['rss_program_mib']:.0f}/{row['rss_provider_mib']:.0f} MiB "
                f"(at once {row['rss_together_mib']:.0f}) state {row['state_bytes'] / 1024:.0f} KiB api {row['api_requests']}"
                f"{_restarts(row)}"
                f"{f' median of {len(runs)}' if len(runs) > 1 else ''}  [{row['summary']}]")
            rows.append({"program": program, "nodes": nodes, **row})
        return rows
    finally:
        world.down()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def median_row(runs: list[dict]) -> dict:
    """One row from repeated runs of an operation: the median of each measured figure, and the wall times of all."""
    if len(runs) == 1:
        return runs[0]
    row = {**runs[0], "runs": len(runs), "seconds_all": [r["seconds"] for r in runs]}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            row[key] = statistics.median(r[key] for r in runs)
    if "controller_restarts" in row:  # a restart in any run counts
        row["controller_restarts"] = max(r["controller_restarts"] for r in runs)
    return row


# ---------------------------------------------------------------------------------------- report

COLUMNS = ("seconds", "cpu_seconds", "rss_total_mib", "state_bytes", "api_requests")


def table(rows: list[dict]) -> str:
    index = {(r["nodes"], r["program"], r["op"]): r for r in rows}
    sizes = sorted({r["nodes"] for r in rows})
    lines = [
        "| nodes | operation | wall library (flat) | ratio | CPU library (flat) | ratio | peak RSS engine / program / providers, library "
        "| peak RSS total library (flat) | ratio | held at once library (flat) | state library (flat) | ratio | API requests library (flat) | ratio |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else ("1.00" if a == b else "-")

    for nodes in sizes:
        for op in OPS:
            lib, flat = index.get((nodes, "library", op)), index.get((nodes, "flat", op))
            if not lib or not flat:
                continue
            lines.append(
                f"| {nodes:,} | {op} | {lib['seconds']:.1f} s ({flat['seconds']:.1f} s) | {ratio(lib['seconds'], flat['seconds'])} "
                f"| {lib['cpu_seconds']:.1f} s ({flat['cpu_seconds']:.1f} s) | {ratio(lib['cpu_seconds'], flat['cpu_seconds'])} "
                f"| {lib['rss_engine_mib']:.0f} / {lib['rss_program_mib']:.0f} / {lib['rss_provider_mib']:.0f} MiB "
                f"| {lib['rss_total_mib']:.0f} MiB ({flat['rss_total_mib']:.0f} MiB) | {ratio(lib['rss_total_mib'], flat['rss_total_mib'])} "
                f"| {_together(lib)} ({_together(flat)}) "
                f"| {lib['state_bytes'] / 1024:,.0f} KiB ({flat['state_bytes'] / 1024:,.0f} KiB) | {ratio(lib['state_bytes'], flat['state_bytes'])} "
                f"| {lib['api_requests']:,} ({flat['api_requests']:,}) | {ratio(lib['api_requests'], flat['api_requests'])} |"
            )
    return "\n".join(lines)


def _together(row: dict) -> str:
    """The tree's RSS held at once (rows recorded before it was measured have none)."""
    return f"{row['rss_together_mib']:.0f} MiB" if "rss_together_mib" in row else "-"


def verdicts(rows: list[dict]) -> list[str]:
    index = {(r["nodes"], r["program"], r["op"]): r for r in rows}
    sizes = sorted({r["nodes"] for r in rows})
    last, first = sizes[-1], sizes[0]
    out = []
    lib = lambda op, n=last: index.get((n, "library", op))  # noqa: E731
    if lib("preview"):
        s = lib("preview")["seconds"]
        out.append(f"- no-op preview at {last:,} nodes: {s:.1f} s (target < {TARGETS['preview_s']} s): " + ("PASS" if s < TARGETS["preview_s"] else "MISS"))
    if lib("noop-up"):
        s = lib("noop-up")["seconds"]
        out.append(f"- no-op up at {last:,} nodes: {s:.1f} s (target < {TARGETS['noop_up_s']} s): " + ("PASS" if s < TARGETS["noop_up_s"] else "MISS"))
    if lib("pool"):
        out.append(_pool_verdict(lib("pool"), last))
    worst = []
    for (n, program, op), r in index.items():
        f = index.get((n, "flat", op))
        if program == "library" and f:
            for col in COLUMNS:
                if f[col]:
                    worst.append((r[col] / f[col], col, op, n))
    if worst:
        top = max(worst)
        over = sum(1 for w in worst if w[0] > TARGETS["ratio"])
        out.append(f"- worst library/flat ratio: {top[0]:.2f} ({top[1]}, {top[2]}, {top[3]:,} nodes), {over} of {len(worst)} cells above "
                   f"{TARGETS['ratio']} (target <= {TARGETS['ratio']} in every column): "
                   + ("PASS" if top[0] <= TARGETS["ratio"] else "MISS"))
    library = [r for r in rows if r["program"] == "library"]
    limit = TARGETS["memory_mib"]
    own = max((r["rss_engine_mib"] + r["rss_program_mib"] for r in library), default=0)
    out.append(f"- peak memory of the engine and the program (language host + Python), library: {own:.0f} MiB "
               f"(target < {limit} MiB): " + ("PASS" if own < limit else "MISS"))
    peak = max((r["rss_total_mib"] for r in library), default=0)
    if library and all("rss_together_mib" in r for r in library):
        held = max(r["rss_together_mib"] for r in library)
        out.append(f"- peak memory with the providers' processes, library: {held:.0f} MiB held at once ({peak:.0f} MiB "
                   f"summed per-process peaks, which come at different times) (target < {limit} MiB): "
                   + ("PASS" if held < limit else "MISS"))
    else:
        out.append(f"- peak memory with the providers' processes, library: {peak:.0f} MiB summed per-process peaks "
                   f"(target < {limit} MiB): " + ("PASS" if peak < limit else "MISS"))
    if first != last:
        scale = last / first
        for op in ("preview", "noop-up"):
            if lib(op) and lib(op, first):
                g = lib(op)["seconds"] / lib(op, first)["seconds"]
                out.append(f"- {op} wall time {first:,} -> {last:,} nodes: x{g:.1f} for x{scale:.0f} the nodes (linear or better): "
                           + ("PASS" if g <= scale * 1.1 else "MISS"))
    return out


def _pool_verdict(row: dict, nodes: int) -> str:
    """The one-pool change: its wall time, and whether slurmctld kept running through it (rows recorded before the
    restarts were counted say so)."""
    seconds = row["seconds"]
    line = f"- one-pool change at {nodes:,} nodes: {seconds:.1f} s (target <= {TARGETS['pool_s']} s)"
    if "controller_restarts" not in row:
        return f"{line}, slurmctld restarts not counted in this run: " + ("PASS" if seconds <= TARGETS["pool_s"] else "MISS")
    restarts = row["controller_restarts"]
    passed = seconds <= TARGETS["pool_s"] and restarts <= TARGETS["pool_restarts"]
    return f"{line}, slurmctld pods restarted: {restarts} (target {TARGETS['pool_restarts']}): " + ("PASS" if passed else "MISS")


DOC_BEGIN, DOC_END = "<!-- bench-engine:begin -->", "<!-- bench-engine:end -->"
"""The markers of this table in docs/benchmark.md, which every written report rewrites."""


def recorded(rows: list[dict]) -> str:
    """The table and verdicts, as bench/ENGINE-RESULTS.md and docs/benchmark.md record them."""
    return "\n".join([table(rows), "", *verdicts(rows)])


def report(rows: list[dict], command: str, sizes) -> str:
    machine = f"{platform.node() or 'this machine'}: {os.cpu_count()} CPUs, {_mem_gib():.0f} GiB RAM, Linux {platform.release()}, load average {os.getloadavg()[0]:.1f} at the end"
    return "\n".join([
        "# Benchmark through the real engine",
        "",
        f"Produced by `{command}` on {machine}{_earlier(rows, sizes)}. Pulumi CLI and providers of the e2e tier (docs/toolchain.md),",
        "file backend, a private local control plane (etcd, kube-apiserver, controller-manager, scheduler v1.36.3) with",
        f"KWOK fake nodes, fresh for each program; {_runs(rows)}. `library` = components.program.build,",
        "`flat` = bench/flat_program.py (the same objects and options by direct constructors). CPU = the whole pulumi",
        "process tree; peak RSS = engine / program (language host + Python) / providers, summed per-process peaks;",
        "held at once = the largest sum of the tree's current RSS over the samples (what the machine must hold);",
        "API requests = what the provider's own user had dispatched by the API server during the operation.",
        "",
        recorded(rows),
        "",
    ])


def _earlier(rows: list[dict], sizes) -> str:
    """Which sizes' rows come from earlier runs than this one's ``sizes`` (bench/engine-results.json keeps
    the last run of each size)."""
    earlier = sorted({r["nodes"] for r in rows} - set(sizes))
    return f" (the {', '.join(f'{n:,}' for n in earlier)}-node rows: earlier runs on the same machine)" if earlier else ""


def _runs(rows: list[dict]) -> str:
    """How many runs each size's no-op cells are the median of."""
    repeats = {}
    for r in rows:
        if r["op"] in NO_OPS:
            repeats.setdefault(r.get("runs", 1), set()).add(r["nodes"])
    parts = [f"{'one run' if runs == 1 else f'median of {runs} runs'} at {', '.join(f'{n:,}' for n in sorted(sizes))} nodes"
             for runs, sizes in sorted(repeats.items())]
    return "one run per cell" + (f" (no-op operations: {'; '.join(parts)})" if max(repeats, default=1) > 1 else "")


def _mem_gib() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "engine-results.json", help="raw rows (appended per size)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "ENGINE-RESULTS.md")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmark.md", help="page whose recorded table is rewritten")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (logs)")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS, help="a prefix of the operations (up first)")
    parser.add_argument("--repeat", type=int, default=3, help=f"runs of each no-op operation ({', '.join(NO_OPS)}): medians")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from --json")
    args = parser.parse_args(argv)
    if args.ops[0] != "up":
        parser.error("--ops must start with up")
    command = "python -m bench.engine" + ("" if args.sizes == list(SIZES) else " --sizes " + " ".join(map(str, args.sizes)))

    if args.report_only:
        rows = json.loads(args.json.read_text())
    else:
        rows = []
        for nodes in args.sizes:
            for program in args.programs:
                rows += measure_program(program, nodes, keep=args.keep, ops=args.ops, repeat=args.repeat)
            if not args.no_write:
                old = json.loads(args.json.read_text()) if args.json.exists() else []
                keep = [r for r in old if (r["nodes"], r["program"]) not in {(r2["nodes"], r2["program"]) for r2 in rows}]
                args.json.write_text(json.dumps(keep + rows, indent=1))
        if not args.no_write:
            rows = json.loads(args.json.read_text())
    text = report(rows, command, args.sizes)
    print(text)
    if not args.no_write:
        from bench.bench import replace_between

        args.out.write_text(text)
        replace_between(args.doc, DOC_BEGIN, DOC_END, recorded(rows))
        log(f"wrote {args.out} and the table of {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
