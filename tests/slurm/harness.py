"""A whole Slurm cluster on loopback, built from the library's own Slurm files.

:class:`LocalCluster` runs munged, MariaDB, slurmdbd, slurmctld and one slurmd
as child processes of the test session, each in its own process group, with
every port on 127.0.0.1 and every file under one temporary directory. The
Slurm files are made by :func:`components.slurm_files.render_slurm_files` from a
config that went through :func:`config.loader.parse_stack_config`, for a
:class:`components.slurm_files.Site` that says where things are on this machine
(:func:`local_site`) - the same templates the Kubernetes deployment renders.

What differs from a Kubernetes node is a property of the site, not of the
cluster (see docs/real-slurm.md and /work/shared/SLURM-LOCAL.md):

- hybrid cgroups here, so cgroup/v1, proctrack/linuxproc and task/none;
- no GPUs, so gres.conf lists device files the harness creates
  (``Site.gpu_device_prefix``, a test-only knob) instead of AutoDetect=nvml,
  which Debian's Slurm is built without;
- Debian's Slurm is not built with --enable-multiple-slurmd, so one slurmd runs,
  as the first node of the first pool (``slurmd -N``); the other nodes have
  addresses where nothing answers and stay DOWN/UNKNOWN.
"""

from __future__ import annotations

import copy
import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

import hostlist

from components.munge import MUNGE_KEY_BYTES
from components.slurm_files import (
    ControllerHost,
    DatabaseEndpoint,
    Site,
    render_slurm_files,
    render_slurmdbd_conf,
)
from config.loader import parse_stack_config
from config.models import StackConfig

T = TypeVar("T")

DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "sbatch", "sacct", "sacctmgr", "scontrol")

WAIT = 60.0
"""Upper bound, in seconds, for anything the cluster is expected to do 'soon'."""

DB_USER = "slurm"
DB_NAME = "slurm_acct_db"

# Where the nodes that have no slurmd on this machine "are": a name in the
# reserved .invalid domain (RFC 6761) never resolves, so slurmctld fails to
# reach them at once instead of hitting the one local slurmd, and they stay down.
UNREACHABLE_DOMAIN = "invalid"


# munged listens on its default socket, as the munged sidecars do on Kubernetes (the Site
# leaves munge_socket unset). It has to: a configless slurmd fetches its config, and so
# learns AuthInfo, only after authenticating through munge - so through the default socket.
DEFAULT_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS + CLIENTS if shutil.which(tool) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(what: str, probe: Callable[[], Optional[T]], timeout: float = WAIT, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except (subprocess.SubprocessError, OSError, ValueError) as error:
            last_error = error
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# ------------------------------------------------------------------------- the site


@dataclass(frozen=True)
class Ports:
    slurmctld: int
    slurmd: int
    slurmdbd: int
    mariadb: int

    @classmethod
    def pick(cls) -> "Ports":
        chosen: set[int] = set()
        while len(chosen) < 4:
            chosen.add(free_port())
        return cls(*sorted(chosen))


def local_node_addresses(config: StackConfig, local_node: Optional[str]) -> dict[str, str]:
    """Pool -> NodeAddr list: 127.0.0.1 for ``local_node``, an unresolvable name for the rest."""
    addresses = {}
    for pool in config.slurm_pools:
        addresses[pool.name] = ",".join(
            "127.0.0.1" if name == local_node else f"{name}.{UNREACHABLE_DOMAIN}" for name in pool.node_names
        )
    return addresses


def local_site(
    config: StackConfig,
    root: Path,
    ports: Ports,
    local_node: Optional[str],
) -> Site:
    """This machine as a Site: loopback ports, paths under ``root``, file GPUs."""
    return Site(
        # slurmctld only starts on a host named in SlurmctldHost.
        controller_hosts=(ControllerHost(name=socket.gethostname().split(".")[0], address="127.0.0.1"),),
        accounting_host="127.0.0.1",
        dbd_host="localhost",
        database=DatabaseEndpoint(host="127.0.0.1", port=ports.mariadb, user=DB_USER, name=DB_NAME),
        slurmctld_port=ports.slurmctld,
        slurmd_port=ports.slurmd,
        slurmdbd_port=ports.slurmdbd,
        slurm_user="root",
        state_save_location=str(root / "state"),
        slurmd_spool_dir=str(root / "spool"),
        run_dir=str(root / "run"),
        log_dir=str(root / "log"),
        munge_socket=None,
        # Hybrid cgroups on this machine: slurmd refuses cgroup/v2 ("Hybrid mode is not supported").
        cgroup_plugin="cgroup/v1",
        proctrack_type="proctrack/linuxproc",
        task_plugin="task/none",
        jobacct_gather_type="jobacct_gather/linux",
        # Debian's Slurm has no gpu_nvml plugin and this machine no GPUs: list device files.
        gpu_autodetect=None,
        gpu_device_prefix=str(root / "dev" / "gpu"),
        node_addresses=local_node_addresses(config, local_node),
    )


# ---------------------------------------------------------------------- processes


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen
    output: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


def _children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    children = _children_of()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def kill_tree(daemon: Daemon, sig: int = signal.SIGKILL) -> None:
    """Signal a daemon, its process group and every descendant (slurmstepd, job steps)."""
    pids = process_tree(daemon.pid)
    try:
        os.killpg(daemon.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


# ------------------------------------------------------------------------ cluster


@dataclass
class LocalCluster:
    """One Slurm cluster on this machine; start with :meth:`start`, always :meth:`stop`."""

    raw_config: Mapping[str, Any]
    local_node: str
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dualsched-slurm-")))
    ports: Ports = field(default_factory=Ports.pick)
    storage_pass: str = field(default_factory=lambda: os.urandom(12).hex())
    daemons: dict[str, Daemon] = field(default_factory=dict)
    extra: list[Daemon] = field(default_factory=list)

    def __post_init__(self) -> None:
        # munged insists every directory above its socket and key is searchable and
        # not writable by others; mkdtemp makes 0700 directories.
        os.chmod(self.root, 0o755)
        for name in ("etc", "state", "spool", "run", "log", "dev", "munge", "mysql", "mysql-run"):
            (self.root / name).mkdir()
        self.config = parse_stack_config(self.raw_config, "local test cluster")
        self.site = self.site_for(self.config)

    # ------------------------------------------------------------------ paths

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return DEFAULT_MUNGE_SOCKET

    @property
    def mysql_socket(self) -> Path:
        return self.root / "mysql-run" / "mysqld.sock"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        for name in list(env):
            if name.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_", "SACCT_")) and name != "SLURM_CONF":
                del env[name]
        return env

    def site_for(self, config: StackConfig) -> Site:
        return local_site(config, self.root, self.ports, self.local_node)

    # -------------------------------------------------------------- rendering

    def render(self, config: StackConfig) -> dict[str, str]:
        """Render the library's Slurm files for this site and write them where slurmctld reads them."""
        site = self.site_for(config)
        files = render_slurm_files(config, site)
        self.make_gpu_devices(config)
        for name, text in files.items():
            (self.etc / name).write_text(text)
        dbd = self.etc / "slurmdbd.conf"
        dbd.write_text(render_slurmdbd_conf(config, site, storage_pass=self.storage_pass))
        # slurmdbd refuses a slurmdbd.conf that is not 0600 and owned by SlurmUser (root here).
        os.chmod(dbd, 0o600)
        return files

    def make_gpu_devices(self, config: StackConfig) -> None:
        """The test GPUs: character devices <prefix>0..N-1 (same numbers as /dev/nvidiaN)."""
        most = max((pool.slurm_gpu_count for pool in config.slurm_pools), default=0)
        prefix = self.root / "dev" / "gpu"
        for index in range(most):
            device = Path(f"{prefix}{index}")
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(195, index))

    # --------------------------------------------------------------- running

    def run(self, *args: str, check: bool = True, timeout: float = 30, env: Optional[dict] = None) -> str:
        result = subprocess.run(
            args, env=env or self.env, capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, args, result.stdout, result.stderr)
        return result.stdout

    def spawn(self, name: str, args: list[str], user: Optional[str] = None, env: Optional[dict] = None) -> Daemon:
        output = self.root / "log" / f"{name}.out"
        with open(output, "ab") as sink:
            process = subprocess.Popen(
                args,
                env=env or self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
            )
        daemon = Daemon(name, process, output)
        return daemon

    def _start(self, name: str, args: list[str], ready: Callable[[], bool], what: str, **kwargs) -> Daemon:
        daemon = self.spawn(name, args, **kwargs)
        self.daemons[name] = daemon

        def probe() -> bool:
            if not daemon.alive():
                raise RuntimeError(f"{name} exited with {daemon.process.returncode}:\n{self.log_tail(name)}")
            return ready()

        wait_until(what, probe)
        return daemon

    def start(self) -> "LocalCluster":
        self.render(self.config)
        self.start_munged()
        self.start_mariadb()
        self.start_slurmdbd()
        self.add_cluster(self.config.slurm.cluster_name)
        self.start_slurmctld()
        self.start_slurmd()
        self.wait_for_node_state(self.local_node, "idle")
        return self

    # munge ---------------------------------------------------------------

    def start_munged(self) -> Daemon:
        key_dir = self.root / "munge"
        key = key_dir / "munge.key"
        # The key is made the way the library makes it: MUNGE_KEY_BYTES random bytes
        # (pulumi_random.RandomBytes in components.munge), here from os.urandom.
        key.write_bytes(os.urandom(MUNGE_KEY_BYTES))
        socket_dir = self.munge_socket.parent
        if self.munge_socket.exists():
            if subprocess.run(["munge", "-n"], capture_output=True, timeout=10).returncode == 0:
                raise RuntimeError(
                    f"a munged already answers on {self.munge_socket} (the system's?); stop it "
                    "(scripts/install-slurm.sh does) so the test cluster can use its own key"
                )
            self.munge_socket.unlink()
        socket_dir.mkdir(parents=True, exist_ok=True)
        for path in (key_dir, key, socket_dir):
            _chown(path, "munge")
        os.chmod(key_dir, 0o700)
        os.chmod(key, 0o400)
        os.chmod(socket_dir, 0o755)
        return self._start(
            "munged",
            [
                "munged",
                "--foreground",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={key_dir / 'munged.pid'}",
                f"--seed-file={key_dir / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ],
            ready=lambda: self.munge_socket.exists()
            and subprocess.run(
                ["munge", "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10
            ).returncode
            == 0,
            what="munged to answer on its socket",
            user="munge",
        )

    # mariadb -------------------------------------------------------------

    def start_mariadb(self) -> Daemon:
        data = self.root / "mysql"
        log = self.root / "log" / "mariadbd.log"
        log.touch()
        for path in (data, self.root / "mysql-run", log):
            _chown(path, "mysql")
        self.run(
            "mariadb-install-db",
            "--no-defaults",
            "--user=mysql",
            f"--datadir={data}",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
            timeout=120,
        )
        daemon = self._start(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                "--user=mysql",
                f"--datadir={data}",
                f"--socket={self.mysql_socket}",
                f"--pid-file={self.root / 'mysql-run' / 'mariadbd.pid'}",
                f"--log-error={log}",
                f"--port={self.ports.mariadb}",
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                # slurmdbd's recommended settings (accounting.html)
                "--innodb-lock-wait-timeout=900",
                "--innodb-log-file-size=64M",
            ],
            ready=lambda: port_open(self.ports.mariadb) and self.mysql_socket.exists(),
            what="MariaDB to listen",
        )
        self.sql(
            f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{self.storage_pass}';"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
        )
        return daemon

    def sql(self, statements: str) -> str:
        return self.run("mariadb", f"--socket={self.mysql_socket}", "-u", "root", "-N", "-e", statements)

    # slurm daemons -------------------------------------------------------

    def start_slurmdbd(self) -> Daemon:
        # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF.
        return self._start(
            "slurmdbd",
            ["slurmdbd", "-D"],
            ready=lambda: port_open(self.ports.slurmdbd) and self.dbd_answers(),
            what="slurmdbd to answer sacctmgr",
        )

    def dbd_answers(self) -> bool:
        return subprocess.run(
            ["sacctmgr", "-n", "-P", "show", "cluster"], env=self.env, capture_output=True, timeout=20
        ).returncode == 0

    def add_cluster(self, name: str) -> None:
        """Register the cluster in accounting; slurmctld with no state needs its TRES from slurmdbd."""
        if name not in self.run("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster").split():
            self.run("sacctmgr", "-i", "add", "cluster", name)

    def start_slurmctld(self) -> Daemon:
        return self._start(
            "slurmctld",
            ["slurmctld", "-D", "-f", str(self.slurm_conf)],
            ready=self.controller_up,
            what="slurmctld to answer scontrol ping",
        )

    def controller_up(self, env: Optional[dict] = None) -> bool:
        result = subprocess.run(
            ["scontrol", "ping"], env=env or self.env, capture_output=True, text=True, timeout=20
        )
        return result.returncode == 0 and "is UP" in result.stdout

    def start_slurmd(self) -> Daemon:
        # Configless, as on Kubernetes: slurmd gets slurm.conf, gres.conf and cgroup.conf
        # from slurmctld (SlurmctldParameters=enable_configless), never from a local file.
        env = self.env
        del env["SLURM_CONF"]
        return self._start(
            "slurmd",
            [
                "slurmd",
                "-D",
                "--conf-server",
                f"127.0.0.1:{self.ports.slurmctld}",
                "-N",
                self.local_node,
            ],
            ready=lambda: self.node_registered(self.local_node),
            what=f"slurmd to register as {self.local_node}",
            env=env,
        )

    # ----------------------------------------------------------- queries

    def sinfo(self, *args: str) -> list[dict[str, str]]:
        """sinfo -a rows as dicts: partition, nodes, state, gres, nodelist."""
        out = self.run("sinfo", "-a", "-h", "-o", "%R|%D|%T|%G|%N", *args)
        rows = []
        for line in out.splitlines():
            partition, nodes, state, gres, nodelist = line.split("|")
            rows.append(dict(partition=partition, nodes=nodes, state=state, gres=gres, nodelist=nodelist))
        return rows

    def partition_node_counts(self) -> dict[str, int]:
        """Nodes per partition, every state summed (sinfo splits rows by state)."""
        counts: dict[str, int] = {}
        for row in self.sinfo():
            counts[row["partition"].rstrip("*")] = counts.get(row["partition"].rstrip("*"), 0) + int(row["nodes"])
        return counts

    def show(self, kind: str, name: str = "") -> dict[str, str]:
        """``scontrol show -o <kind> <name>`` as key=value pairs (one record)."""
        out = self.run("scontrol", "show", "-o", kind, *([name] if name else []))
        return parse_scontrol(out.splitlines()[0])

    def node(self, name: str) -> dict[str, str]:
        return self.show("node", name)

    def node_registered(self, name: str) -> bool:
        node = self.node(name)
        return "NOT_RESPONDING" not in node.get("State", "") and node.get("SlurmdStartTime", "None") != "None"

    def wait_for_node_state(self, name: str, state: str, timeout: float = WAIT) -> dict[str, str]:
        return wait_until(
            f"node {name} to be {state}",
            lambda: (lambda node: node if node["State"].split("+")[0].lower() == state else None)(self.node(name)),
            timeout,
        )

    def sbatch(self, *args: str, script: str) -> int:
        path = self.root / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        out = self.run("sbatch", "--parsable", f"--chdir={self.root}", *args, str(path))
        return int(out.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        return parse_scontrol(self.run("scontrol", "show", "-o", "job", str(job_id)).splitlines()[0])

    def job_state(self, job_id: int) -> str:
        return self.job(job_id)["JobState"]

    def wait_for_job(self, job_id: int, states: Iterable[str], timeout: float = WAIT) -> dict[str, str]:
        wanted = set(states)
        return wait_until(
            f"job {job_id} to be {'/'.join(sorted(wanted))}",
            lambda: (lambda job: job if job["JobState"] in wanted else None)(self.job(job_id)),
            timeout,
        )

    def sacct(self, job_id: int) -> list[dict[str, str]]:
        fields = ("JobID", "State", "Partition", "AllocTRES", "ExitCode")
        out = self.run("sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", ",".join(fields))
        return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]

    def wait_for_accounting(self, job_id: int, state: str, timeout: float = WAIT) -> dict[str, str]:
        def probe() -> Optional[dict[str, str]]:
            rows = self.sacct(job_id)
            return rows[0] if rows and rows[0]["State"] == state else None

        return wait_until(f"sacct to record job {job_id} as {state}", probe, timeout)

    # ------------------------------------------------------ process control

    def stop_daemon(self, name: str, sig: int = signal.SIGTERM, timeout: float = WAIT) -> None:
        daemon = self.daemons.pop(name)
        if sig == signal.SIGKILL:
            kill_tree(daemon, signal.SIGKILL)
        else:
            daemon.process.send_signal(sig)
        try:
            daemon.process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(daemon)
            daemon.process.wait(10)

    def log_tail(self, name: str, lines: int = 40) -> str:
        text = []
        for path in sorted((self.root / "log").glob(f"{name}*")):
            content = path.read_text(errors="replace").splitlines()[-lines:]
            text.append(f"--- {path.name}\n" + "\n".join(content))
        return "\n".join(text)

    def logs(self, lines: int = 40) -> str:
        if not (self.root / "log").exists():
            return ""
        names = sorted({path.name.split(".")[0] for path in (self.root / "log").iterdir()})
        return "\n".join(self.log_tail(name, lines) for name in names)

    def stop(self) -> None:
        """Stop everything this cluster started and remove its directory; safe to call twice."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].alive():
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=20)
        everything = list(self.extra) + [self.daemons[name] for name in reversed(list(self.daemons))]
        for daemon in everything:
            if daemon.alive():
                kill_tree(daemon, signal.SIGTERM)
        for daemon in everything:
            try:
                daemon.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
            kill_tree(daemon, signal.SIGKILL)
            try:
                daemon.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.daemons.clear()
        self.extra.clear()
        # Job steps are reparented to init once slurmd is gone: kill whatever still
        # runs from this cluster's directory.
        for pid in _pids_in(self.root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def _pids_in(root: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == str(root) or cwd.startswith(f"{root}/"):
            pids.append(int(entry.name))
    return pids


def parse_scontrol(record: str) -> dict[str, str]:
    """One ``scontrol show -o`` record: space separated Key=Value (values may hold '=')."""
    fields: dict[str, str] = {}
    for match in re.finditer(r"(\S+?)=(.*?)(?=\s+\S+?=|$)", record):
        fields[match.group(1)] = match.group(2)
    return fields


def with_changes(raw: Mapping[str, Any], change: Callable[[dict], None]) -> dict:
    """A deep copy of a raw stack config with ``change`` applied to it."""
    copied = copy.deepcopy(dict(raw))
    change(copied)
    return copied


def expected_gres(config: StackConfig, pool_name: str) -> str:
    pool = config.pool(pool_name)
    if not pool.slurm_gpu_count:
        return "(null)"
    return f"gpu:{pool.gpu_type}:{pool.slurm_gpu_count}" if pool.gpu_type else f"gpu:{pool.slurm_gpu_count}"


def partition_nodes(config: StackConfig) -> dict[str, int]:
    return {
        partition.name: len({n for pool in partition.pools for n in config.pool(pool).node_names})
        for partition in config.slurm.partitions
    }
