"""A whole Slurm cluster on loopback, built from the library's own Slurm files.

:class:`LocalCluster` runs munged, MariaDB, slurmdbd, slurmctld and one slurmd
as child processes of the test session, each in its own process group, every
daemon on its own 127.0.0.1 port and every file under one temporary directory.
The Slurm files are made by :func:`components.slurm_files.render_slurm_files`
from a config that went through :func:`config.loader.parse_stack_config`, for a
:class:`components.slurm_files.Site` that says where things are on this machine
(:func:`local_site`): the same templates the Kubernetes deployment renders, no
copy and no patching of their output.

What differs from a Kubernetes node is a property of the site, not of the
cluster (docs/real-slurm.md):

- hybrid cgroups here, so cgroup/v1, proctrack/linuxproc and task/none;
- no GPUs, so gres.conf lists character devices the harness creates
  (``Site.gpu_device_prefix``, a test-only knob) instead of AutoDetect=nvml,
  which Debian's Slurm is built without;
- Debian's Slurm is not built with --enable-multiple-slurmd, so one slurmd runs,
  as one named node of the config (``slurmd -N``); the other nodes get addresses
  where nothing answers and stay UNKNOWN (later DOWN).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from dualsched.components.compute import slurmd_arguments
from dualsched.components.munge import MUNGE_KEY_BYTES
from dualsched.components.programs import source
from dualsched.components.slurm_files import (
    HEALTH_PROGRAM, HEALTH_SETTINGS_FILE, JWT_KEY_FILE, TASK_PROLOG, ControllerHost, DatabaseEndpoint, Site,
    render_health_settings, render_slurm_files, render_slurmdbd_conf, task_prolog_path,
)
from dualsched.components.tokens import JWT_KEY_BYTES
from dualsched.config.loader import parse_stack_config
from dualsched.config.models import StackConfig
from rendering import own_images

T = TypeVar("T")

TOOLS = (
    "munged", "munge", "mariadbd", "mariadb-install-db", "mariadb",
    "slurmdbd", "slurmctld", "slurmd", "sinfo", "sbatch", "sacct", "sacctmgr", "scontrol", "scancel",
)  # fmt: skip

WAIT = 60.0
CORDON_DRAIN = Path(__file__).resolve().parents[2] / "components" / "programs" / "cordon_drain.sh"
OUTSIDE_JOB_TMP = "/var/tmp"
"""Where each cluster's files live: jobs see this machine's /var/tmp, while /tmp (where tempfile puts
them by default) is their own (job_container.conf), so release files and the shared directory there
would be invisible to them."""
"""Upper bound, in seconds, for anything the cluster is expected to do 'soon'."""

DB_USER = "slurm"
DB_NAME = "slurm_acct_db"
# Batch jobs run as this host account: slurm.conf has DisableRootJobs=YES.
JOB_USER = "nobody"

# munged listens on its default socket, as the munged sidecars do on Kubernetes (their
# Site leaves munge_socket unset, and so does this one). It has to: a configless slurmd
# authenticates its config request before it has read AuthInfo, so through the default.
DEFAULT_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")

# Where the nodes that have no slurmd on this machine "are". Not 127.0.0.x: the one
# slurmd listens on every loopback address, answers slurmctld's pings for them, and they
# would turn IDLE and get jobs. Not a name that does not resolve: slurmctld retries each
# for ~10 s and then hides the node (FUTURE). An IPv4 multicast address parses at once and
# no TCP connection can reach it (connect() fails with ENETUNREACH), so those nodes never
# respond and stay UNKNOWN, then DOWN - what a powered-off node looks like.
UNREACHABLE_NET = (239, 255)


def installed_release() -> str:
    """The release of the Slurm this machine runs (`slurmd -V`: "slurm-wlm 22.05.8"): the files are rendered
    for it, as a stack's `slurm.release` renders them for its images. 22.05 (Debian 12's) where none is installed."""
    if not shutil.which("slurmd"):
        return "22.05"
    version = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, check=True).stdout
    return re.search(r"(\d+\.\d+)\.\d+", version).group(1)


RELEASE = installed_release()


def on_installed_slurm(raw: dict[str, Any]) -> dict[str, Any]:
    """A stack switched to this machine's Slurm release, with a site's own images of it: what differs between
    releases (e.g. JobContainerType, NamespaceType since 25.11) is rendered as this slurmctld reads it."""
    raw["slurm"]["release"] = RELEASE
    raw.setdefault("images", {}).update(own_images(RELEASE))
    return raw


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    probes, ports = [], []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind(("127.0.0.1", 0))
            probes.append(probe)
            ports.append(probe.getsockname()[1])
    finally:
        for probe in probes:
            probe.close()
    return ports


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_until(what: str, probe: Callable[[], Optional[T]], timeout: float = WAIT, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except (subprocess.SubprocessError, OSError, ValueError, IndexError, KeyError) as error:
            last_error = error
        if time.monotonic() > deadline:
            detail = f" (last error: {_describe(last_error)})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def _describe(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        return f"{error} {(error.stderr or '').strip()}"
    return str(error)


# -------------------------------------------------------------------------- the site


@dataclass(frozen=True)
class Ports:
    slurmctld: int
    slurmd: int
    slurmdbd: int
    mariadb: int

    @classmethod
    def pick(cls) -> "Ports":
        return cls(*free_ports(4))


def local_node_addresses(config: StackConfig, local_node: Optional[str]) -> dict[str, str]:
    """Pool -> NodeAddr list: 127.0.0.1 for ``local_node``, an unreachable address for the others."""
    addresses: dict[str, str] = {}
    index = 0
    for pool in config.slurm_pools:
        listed = []
        for name in pool.node_names:
            if name == local_node:
                listed.append("127.0.0.1")
            else:
                listed.append("{}.{}.{}.{}".format(*UNREACHABLE_NET, index // 250, index % 250 + 1))
                index += 1
        addresses[pool.name] = ",".join(listed)
    return addresses


def local_site(
    config: StackConfig, root: Path, ports: Ports, local_node: Optional[str], spank_pyxis: Optional[str] = None
) -> Site:
    """This machine as a Site: loopback ports, every path under ``root``, device-file GPUs, and
    ``spank_pyxis``, the Pyxis plugin tools/build-pyxis.sh built (the image's path if not given)."""
    site = Site(
        # slurmctld starts only on a host named by SlurmctldHost.
        controller_hosts=(ControllerHost(name=socket.gethostname().split(".")[0], address="127.0.0.1"),),
        accounting_host="127.0.0.1",
        dbd_host="localhost",
        database=DatabaseEndpoint(host="127.0.0.1", port=ports.mariadb, user=DB_USER, name=DB_NAME),
        slurmctld_port=ports.slurmctld,
        slurmd_port=ports.slurmd,
        slurmdbd_port=ports.slurmdbd,
        # The daemons run as root here; SlurmUser=slurm would need every directory chowned.
        slurm_user="root",
        state_save_location=str(root / "state"),
        slurmd_spool_dir=str(root / "spool"),
        run_dir=str(root / "run"),
        log_dir=str(root / "log"),
        munge_socket=None,
        jwt_key=str(root / "jwt" / JWT_KEY_FILE),
        # Hybrid cgroups on this kind of machine: slurmd refuses cgroup/v2 ("Hybrid mode is not supported").
        cgroup_plugin="cgroup/v1",
        proctrack_type="proctrack/linuxproc",
        task_plugin="task/none",
        jobacct_gather_type="jobacct_gather/linux",
        # Debian's Slurm has no gpu_nvml plugin and the machine no GPUs: list device files.
        gpu_autodetect=None,
        gpu_device_prefix=str(root / "dev" / "gpu"),
        node_addresses=local_node_addresses(config, local_node),
        pyxis_runtime_path=str(root / "run" / "pyxis"),
        # The health check's program and settings, and the directory it checks as the shared file system.
        health_check_dir=str(root / "health"),
        task_prolog_dir=str(root / "task"),
        shared_dir=str(root / "shared"),
        job_tmp_dir=str(root / "job-tmp"),
    )
    return dataclasses.replace(site, spank_pyxis=spank_pyxis) if spank_pyxis else site


def make_gpu_devices(prefix: str, count: int) -> None:
    """The test GPUs: character devices <prefix>0..N-1 with /dev/nvidiaN's numbers (195, N)."""
    for index in range(count):
        device = Path(f"{prefix}{index}")
        if not device.exists():
            os.mknod(device, 0o666 | 0o020000, os.makedev(195, index))


def write_slurm_files(config: StackConfig, site: Site, etc: Path, storage_pass: str) -> dict[str, str]:
    """Render the library's files for ``site`` into ``etc`` (where $SLURM_CONF points)."""
    files = render_slurm_files(config, site)
    if site.jwt_key and not Path(site.jwt_key).exists():
        # slurmctld exits without it; made once per site as the library makes it (components.tokens)
        key = Path(site.jwt_key)
        key.parent.mkdir(exist_ok=True)
        key.write_bytes(os.urandom(JWT_KEY_BYTES))
        key.chmod(0o600)
    if site.gpu_device_prefix:
        make_gpu_devices(site.gpu_device_prefix, max((pool.slurm_gpu_count for pool in config.slurm_pools), default=0))
    for name, text in files.items():
        (etc / name).write_text(text)
    dbd = etc / "slurmdbd.conf"
    dbd.write_text(render_slurmdbd_conf(config, site, storage_pass=storage_pass))
    # slurmdbd refuses a slurmdbd.conf that is not 0600 and owned by SlurmUser (root here).
    os.chmod(dbd, 0o600)
    return files


def write_health_check(config: StackConfig, site: Site, local_node: str) -> None:
    """node_health.sh and the settings of the local node's pool, where slurm.conf's HealthCheckProgram
    points: what the slurmd pod gets from its pool's ConfigMap (components.compute)."""
    pool = next(pool for pool in config.slurm_pools if local_node in pool.node_names)
    directory = Path(site.health_check_dir)
    directory.mkdir(exist_ok=True)
    program = directory / HEALTH_PROGRAM
    program.write_text(source(HEALTH_PROGRAM))
    program.chmod(0o555)
    (directory / HEALTH_SETTINGS_FILE).write_text(render_health_settings(config, pool, site))


def write_task_prolog(config: StackConfig, site: Site) -> None:
    """task_prolog.sh where slurm.conf's TaskProlog points (with auth/jwt on): what each slurmd pod gets from
    its pool's ConfigMap (components.compute)."""
    path = task_prolog_path(config, site)
    if path is None:
        return
    program = Path(path)
    program.parent.mkdir(exist_ok=True)
    program.write_text(source(TASK_PROLOG))
    program.chmod(0o555)


def parse_scontrol(record: str) -> dict[str, str]:
    """One ``scontrol show -o`` record: Key=Value pairs separated by spaces (values may hold '=')."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(\S+?)=(.*?)(?=\s+[A-Za-z/:_]+=|$)", record.strip())}


# ------------------------------------------------------------------------ processes


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def process_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def signal_tree(daemon: Daemon, sig: int) -> None:
    """Signal a daemon's process group and every descendant (slurmstepd, job processes)."""
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


def _pids_under(root: Path) -> list[int]:
    """Processes whose working directory is inside ``root`` (job steps orphaned by slurmd)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd == str(root) or cwd.startswith(f"{root}/"):
                pids.append(int(entry.name))
    return pids


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


# ----------------------------------------------------------------------- clients


class SlurmClient:
    """Slurm's commands against one slurm.conf, with their output parsed."""

    def __init__(self, root: Path):
        self.root = root
        self.daemons: dict[str, Daemon] = {}

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SBATCH_", "SQUEUE_", "SINFO_", "SACCT"))}
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 30, env: Optional[dict] = None) -> str:
        result = subprocess.run(args, env=env or self.env, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, args, result.stdout, result.stderr)
        return result.stdout

    # processes -----------------------------------------------------------

    def spawn(self, name: str, args: list[str], ready: Callable[[], bool], what: str, **popen) -> Daemon:
        """Start a daemon in the foreground in its own session and wait until ``ready``."""
        with open(self.root / "log" / f"{name}.out", "ab") as sink:
            process = subprocess.Popen(
                args,
                env=popen.pop("env", None) or self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **popen,
            )
        daemon = self.daemons[name] = Daemon(name, process)

        def probe() -> bool:
            if not daemon.alive():
                raise DaemonDied(f"{name} exited with status {process.returncode}:\n{self.log_tail(name)}")
            return ready()

        wait_until(what, probe)
        return daemon

    def stop_daemon(self, name: str, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        """Stop one daemon (SIGKILL: the process alone, as a crash would); returns its exit status."""
        daemon = self.daemons.pop(name)
        daemon.process.send_signal(sig)
        try:
            return daemon.process.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_tree(daemon, signal.SIGKILL)
            return daemon.process.wait(10)

    def stop_all(self) -> None:
        """Stop every daemon started here, last started first, then their leftovers."""
        daemons = list(reversed(self.daemons.values()))
        for daemon in daemons:
            if daemon.alive():
                signal_tree(daemon, signal.SIGTERM)
                try:
                    daemon.process.wait(15)
                except subprocess.TimeoutExpired:
                    pass
            signal_tree(daemon, signal.SIGKILL)
            try:
                daemon.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.daemons.clear()
        for pid in _pids_under(self.root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_tail(self, name: str = "", lines: int = 25) -> str:
        logs = self.root / "log"
        if not logs.exists():
            return ""
        parts = []
        for path in sorted(logs.glob(f"{name}*")):
            if path.suffix == ".out" and path.with_suffix(".log").exists():
                continue  # the daemon's stderr, a copy of its log file
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(parts)

    # controller ----------------------------------------------------------

    def start_slurmctld(self) -> Daemon:
        return self.spawn(
            "slurmctld",
            ["slurmctld", "-D", "-f", str(self.slurm_conf)],
            ready=self.controller_up,
            what="slurmctld to answer `scontrol ping`",
        )

    def controller_up(self) -> bool:
        result = subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True, text=True, timeout=20)
        return result.returncode == 0 and "is UP" in result.stdout

    # queries -------------------------------------------------------------

    def sinfo(self) -> list[dict[str, str]]:
        """``sinfo`` rows (one per partition and node state): partition, nodes, state, gres, nodelist."""
        out = self.run("sinfo", "--all", "--noheader", "--format=%R|%D|%T|%G|%N")
        keys = ("partition", "nodes", "state", "gres", "nodelist")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line]

    def partition_node_counts(self) -> dict[str, int]:
        """Nodes per partition as sinfo reports them, all states summed."""
        counts: dict[str, int] = {}
        for row in self.sinfo():
            counts[row["partition"]] = counts.get(row["partition"], 0) + int(row["nodes"])
        return counts

    def partition_gres(self) -> dict[str, set[str]]:
        """The GRES sinfo reports per partition."""
        gres: dict[str, set[str]] = {}
        for row in self.sinfo():
            gres.setdefault(row["partition"], set()).add(row["gres"])
        return gres

    def nodes(self) -> dict[str, dict[str, str]]:
        """Every node as ``scontrol show node`` reports it."""
        out = self.run("scontrol", "show", "--oneliner", "node")
        return {record["NodeName"]: record for record in map(parse_scontrol, out.splitlines()) if "NodeName" in record}

    def node(self, name: str) -> dict[str, str]:
        return parse_scontrol(self.run("scontrol", "show", "--oneliner", "node", name).splitlines()[0])


class DaemonDied(RuntimeError):
    pass


class ClusterFailed(RuntimeError):
    pass


# ------------------------------------------------------------------------ cluster


class LocalCluster(SlurmClient):
    """munged, MariaDB, slurmdbd, slurmctld and one slurmd for ``config``; :meth:`stop` always."""

    def __init__(self, config: StackConfig, local_node: str):
        super().__init__(Path(tempfile.mkdtemp(prefix="dualsched-slurm-", dir=OUTSIDE_JOB_TMP)))
        # munged wants every directory above its key searchable; mkdtemp makes 0700.
        os.chmod(self.root, 0o755)
        for name in ("etc", "state", "spool", "run", "log", "dev", "munge", "mysql", "mysql-run", "jwt"):
            (self.root / name).mkdir()
        self.config = config
        self.local_node = local_node
        self.ports = Ports.pick()
        self.storage_pass = os.urandom(12).hex()
        self.controllers: list[Controller] = []
        self.spank_pyxis: Optional[str] = None
        """The Pyxis plugin plugstack.conf names, once a test has built one."""

    # configuration -------------------------------------------------------

    def site_for(self, config: StackConfig) -> Site:
        return local_site(config, self.root, self.ports, self.local_node, self.spank_pyxis)

    @property
    def site(self) -> Site:
        return self.site_for(self.config)

    @property
    def jwt_key(self) -> bytes:
        """slurmctld's HS256 key (AuthAltParameters=jwt_key), for tests that mint tokens."""
        return Path(self.site.jwt_key or "").read_bytes()

    def render(self, config: StackConfig) -> dict[str, str]:
        site = self.site_for(config)
        files = write_slurm_files(config, site, self.etc, self.storage_pass)
        if config.slurm.health_check.enabled:
            write_health_check(config, site, self.local_node)
        write_task_prolog(config, site)
        self.config = config
        return files

    def apply(self, raw: Mapping) -> StackConfig:
        """What a config change goes through: validate, render, `scontrol reconfigure`.

        A config the library rejects raises ConfigError here, before anything is written.
        """
        config = parse_stack_config(raw, "changed local test cluster")
        self.render(config)
        self.run("scontrol", "reconfigure")
        return config

    # start and stop ------------------------------------------------------

    def start(self) -> "LocalCluster":
        """Bring the cluster up in the order it needs; on any failure stop what started."""
        try:
            self.render(self.config)
            self.start_munged()
            self.start_mariadb()
            self.start_slurmdbd()
            self.add_cluster(self.config.slurm.cluster_name)
            self.start_slurmctld()
            self.start_slurmd()
            self.wait_for_node_state(self.local_node, "IDLE")
        except BaseException as error:
            logs = self.log_tail()
            self.stop()
            raise ClusterFailed(f"the local cluster did not start: {error}\n{logs}") from error
        return self

    def stop(self) -> None:
        """Stop every daemon and job and remove the directory; safe to call twice."""
        for controller in self.controllers:
            controller.stop()
        self.controllers.clear()
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].alive():
            self.run("scancel", "--full", f"--user={JOB_USER}", check=False, timeout=20)
        self.stop_all()
        shutil.rmtree(self.root, ignore_errors=True)

    # munge ---------------------------------------------------------------

    def start_munged(self) -> Daemon:
        key_dir = self.root / "munge"
        key = key_dir / "munge.key"
        # The key is made as the library makes it (components.munge: pulumi_random.RandomBytes
        # of MUNGE_KEY_BYTES), the bytes here from os.urandom.
        key.write_bytes(os.urandom(MUNGE_KEY_BYTES))
        socket_dir = DEFAULT_MUNGE_SOCKET.parent
        if DEFAULT_MUNGE_SOCKET.exists():
            if subprocess.run(["munge", "-n"], capture_output=True, timeout=10).returncode == 0:
                raise RuntimeError(
                    f"a munged already answers on {DEFAULT_MUNGE_SOCKET} (the system's, or a killed test "
                    "run's); stop it - scripts/install-slurm.sh stops the packaged one"
                )
            DEFAULT_MUNGE_SOCKET.unlink()
        socket_dir.mkdir(parents=True, exist_ok=True)
        # munged refuses a key that is not 0400 and its own, in a directory others can write.
        for path in (key_dir, key, socket_dir):
            _chown(path, "munge")
        os.chmod(key_dir, 0o700)
        os.chmod(key, 0o400)
        os.chmod(socket_dir, 0o755)
        return self.spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--key-file={key}",
                f"--socket={DEFAULT_MUNGE_SOCKET}",
                f"--pid-file={key_dir / 'munged.pid'}",
                f"--seed-file={key_dir / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ],
            ready=lambda: subprocess.run(["munge", "-n"], capture_output=True, timeout=10).returncode == 0,
            what="munged to encode a credential",
            user="munge",
        )

    # mariadb -------------------------------------------------------------

    @property
    def mysql_socket(self) -> Path:
        return self.root / "mysql-run" / "mysqld.sock"

    def start_mariadb(self) -> Daemon:
        data = self.root / "mysql"
        log = self.root / "log" / "mariadbd.log"
        log.touch()
        for path in (data, self.root / "mysql-run", log):
            _chown(path, "mysql")
        self.run(
            "mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={data}",
            "--auth-root-authentication-method=socket", "--skip-test-db",
            timeout=180,
        )  # fmt: skip
        daemon = self.spawn(
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
                # What slurmdbd asks for (accounting.html), so it does not warn about it.
                "--innodb-lock-wait-timeout=900",
                "--innodb-log-file-size=64M",
            ],
            ready=lambda: self.mysql_socket.exists() and port_open(self.ports.mariadb),
            what="MariaDB to listen",
        )
        self.run(
            "mariadb", f"--socket={self.mysql_socket}", "--user=root", "--execute",
            f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{self.storage_pass}';"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';",
        )  # fmt: skip
        return daemon

    # slurm daemons -------------------------------------------------------

    def start_slurmdbd(self) -> Daemon:
        # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF.
        return self.spawn(
            "slurmdbd",
            ["slurmdbd", "-D"],
            ready=lambda: port_open(self.ports.slurmdbd) and self.accounting_up(),
            what="slurmdbd to answer sacctmgr",
        )

    def accounting_up(self) -> bool:
        result = subprocess.run(["sacctmgr", "--noheader", "show", "cluster"], env=self.env, capture_output=True, timeout=20)
        return result.returncode == 0

    def add_cluster(self, name: str) -> None:
        """Register a cluster in accounting: a slurmctld without state takes its TRES from slurmdbd."""
        known = self.run("sacctmgr", "--noheader", "--parsable2", "show", "cluster", "format=cluster").split()
        if name not in known:
            self.run("sacctmgr", "--immediate", "add", "cluster", name)

    def start_slurmd(self) -> Daemon:
        # Configless, as on Kubernetes: slurmd gets slurm.conf, gres.conf and cgroup.conf from
        # slurmctld (SlurmctldParameters=enable_configless) and has no SLURM_CONF of its own.
        env = self.env
        del env["SLURM_CONF"]
        [pool] = [pool for pool in self.config.slurm_pools if self.local_node in pool.node_names]
        return self.spawn(
            "slurmd",
            # The command line of the slurmd container (components.compute); a dynamic node is in no list before it registers.
            slurmd_arguments(pool, self.site, self.local_node),
            ready=lambda: self.nodes().get(self.local_node, {}).get("SlurmdStartTime", "None") != "None",
            what=f"slurmd to register as {self.local_node}",
            env=env,
        )

    @property
    def slurmd_config_cache(self) -> Path:
        """Where a configless slurmd keeps the files it fetched from slurmctld."""
        return Path(self.site.slurmd_spool_dir) / "conf-cache"

    # nodes and jobs ------------------------------------------------------

    def wait_for_node_state(self, name: str, state: str, timeout: float = WAIT) -> dict[str, str]:
        def probe() -> Optional[dict[str, str]]:
            node = self.node(name)
            return node if node["State"] == state else None

        return wait_until(f"node {name} to be {state}", probe, timeout)

    def sbatch(self, *options: str, script: str, launcher: Sequence[str] = ()) -> int:
        """Submit ``script`` (sh) as a batch job of JOB_USER (slurm.conf has DisableRootJobs), through
        ``launcher`` (e.g. prlimit with the submitter's limits); its output goes to job-<id>.out in the jobs
        directory."""
        jobs = self.root / "jobs"
        jobs.mkdir(exist_ok=True)
        os.chmod(jobs, 0o1777)
        path = jobs / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o644)
        out = self.run(
            "runuser", "-u", JOB_USER, "--", *launcher,
            "sbatch", "--parsable", f"--chdir={jobs}", f"--output={jobs}/job-%j.out", *options, str(path),
        )  # fmt: skip
        return int(out.strip().split(";")[0])

    def cordon_round(self, cordoned: Sequence[str], left: Sequence[str] = ()) -> str:
        """One round of the reconfigure sidecar's cordon step (cordon_drain.sh), with the lists cordon_watch.py would
        write: the nodes cordoned in Kubernetes, and those that left a pool they joined by label."""
        paths = self.root / "cordoned", self.root / "left"
        for path, names in zip(paths, (cordoned, left)):
            path.write_text("".join(f"{name}\n" for name in names))
        return self.run("sh", str(CORDON_DRAIN), *map(str, paths))

    def held_script(self, then: str = "") -> str:
        """A job script that runs until the test calls :meth:`release` for its job, then ``then``."""
        return f'while [ ! -e "{self.root}/release-$SLURM_JOB_ID" ]; do sleep 0.2; done\n{then}'

    def release(self, job_id: int) -> None:
        (self.root / f"release-{job_id}").touch()

    def release_all(self) -> None:
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].alive():
            for job_id in self.active_job_ids():
                self.release(job_id)

    def job_output(self, job_id: int) -> str:
        return (self.root / "jobs" / f"job-{job_id}.out").read_text()

    def job(self, job_id: int) -> dict[str, str]:
        return parse_scontrol(self.run("scontrol", "show", "--oneliner", "job", str(job_id)).splitlines()[0])

    def queued_job_ids(self) -> set[int]:
        """Every job slurmctld knows of, finished ones included (MinJobAge keeps them a while)."""
        out = self.run("squeue", "--noheader", "--states=all", "--format=%i")
        return {int(line) for line in out.split()}

    def active_job_ids(self) -> set[int]:
        """Jobs pending, running or completing."""
        out = self.run("squeue", "--noheader", "--states=PENDING,RUNNING,CONFIGURING,COMPLETING", "--format=%i")
        return {int(line) for line in out.split()}

    def wait_for_job(self, job_id: int, *states: str, timeout: float = WAIT) -> dict[str, str]:
        def probe() -> Optional[dict[str, str]]:
            job = self.job(job_id)
            return job if job["JobState"] in states else None

        return wait_until(f"job {job_id} to be {'/'.join(states)}", probe, timeout)

    def sacct(self, job_id: int) -> list[dict[str, str]]:
        """The job's allocation record in accounting (``sacct -X``)."""
        fields = ("JobID", "User", "State", "Partition", "AllocTRES", "ExitCode")
        out = self.run("sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                       f"--format={','.join(fields)}")  # fmt: skip
        return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]

    def wait_for_accounting(self, job_id: int, state: str, timeout: float = WAIT) -> dict[str, str]:
        # slurmctld sends a job's record in several messages; wait for the whole of it.
        def probe() -> Optional[dict[str, str]]:
            rows = self.sacct(job_id)
            return rows[0] if rows and rows[0]["State"] == state and rows[0]["Partition"] else None

        return wait_until(f"sacct to record job {job_id} as {state}", probe, timeout)

    # other controllers ---------------------------------------------------

    def controller_for(self, config: StackConfig) -> "Controller":
        """A second slurmctld for another cluster's config, sharing this munged and slurmdbd."""
        controller = Controller(config, self)
        self.controllers.append(controller)
        return controller


class Controller(SlurmClient):
    """slurmctld alone for a stack's config at the local site, accounting in the shared slurmdbd."""

    def __init__(self, config: StackConfig, shared: LocalCluster):
        super().__init__(Path(tempfile.mkdtemp(prefix="dualsched-slurmctld-", dir=OUTSIDE_JOB_TMP)))
        for name in ("etc", "state", "spool", "run", "log", "dev"):
            (self.root / name).mkdir()
        self.config = config
        slurmctld, slurmd = free_ports(2)
        ports = Ports(slurmctld=slurmctld, slurmd=slurmd, slurmdbd=shared.ports.slurmdbd, mariadb=shared.ports.mariadb)
        self.site = local_site(config, self.root, ports, local_node=None)
        self.files = write_slurm_files(config, self.site, self.etc, shared.storage_pass)
        shared.add_cluster(config.slurm.cluster_name)

    def start(self) -> "Controller":
        self.start_slurmctld()
        return self

    def stop(self) -> None:
        self.stop_all()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------- expectations


def expected_partition_nodes(config: StackConfig) -> dict[str, int]:
    """Nodes per partition, from the config."""
    return {
        partition.name: len({name for pool in partition.pools for name in config.pool(pool).node_names})
        for partition in config.slurm.partitions
    }


def expected_gres(config: StackConfig, pool_name: str) -> str:
    """The Gres= a node of the pool must report: gpu:<n>, gpu:<type>:<n>, or (null)."""
    pool = config.pool(pool_name)
    if not pool.slurm_gpu_count:
        return "(null)"
    return f"gpu:{pool.gpu_type}:{pool.slurm_gpu_count}" if pool.gpu_type else f"gpu:{pool.slurm_gpu_count}"


def expected_partition_gres(config: StackConfig) -> dict[str, set[str]]:
    return {
        partition.name: {expected_gres(config, pool) for pool in partition.pools}
        for partition in config.slurm.partitions
    }

