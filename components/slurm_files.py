"""Slurm's configuration files as a pure function of the stack config and a Site.

``render_slurm_files(config, site)`` is the one way slurm.conf, gres.conf,
cgroup.conf and the inference windows' reservations are made: the Kubernetes
deployment feeds it a Site built from its Services and mount paths
(:func:`kubernetes_site`), the real-Slurm tests a Site pointing at loopback ports
and a temporary directory. Same templates for both.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import hostlist
import jinja2

from dualsched.config.models import (
    CgroupVersion, DatabaseMode, GpuAutoDetect, NodePool, PoolContainers, PoolMode, PreemptType, StackConfig, TresLimit,
)
from dualsched.config.types import image_slurm_patch

TEMPLATES = Path(__file__).parent / "templates"
WINDOW_RESERVATIONS_FILE = "window-reservations"
"""The reservations components/programs/window_reservations.sh makes slurmctld hold. Not a Slurm
file: slurmctld never reads it, and without ``.conf`` the reconfigure sidecar reloads no Slurm for it."""
ACCOUNTING_STATE_FILE = "accounting-state"
"""The QOS, accounts and users' associations components/programs/accounting_state.sh keeps in slurmdbd.
Not a Slurm file either: nothing reloads Slurm for it."""
SLURM_FILES = (
    "slurm.conf", "gres.conf", "cgroup.conf", "plugstack.conf", "job_container.conf", WINDOW_RESERVATIONS_FILE, ACCOUNTING_STATE_FILE,
)
OWNER_MARKER = "dualsched:"
"""Description of the QOS and accounts accounting_state.sh created, followed by the cluster's name: it
deletes those (and only those) the file no longer lists."""
TRACKED_TRES = (("cpus", "cpu"), ("gpus", "gres/gpu"), ("nodes", "node"))
"""TresLimit field -> the TRES name sacctmgr takes and prints (sorted by name)."""
WINDOW_RESERVATION_PREFIX = "dualsched-window-"
"""Reservations named so belong to window_reservations.sh: it deletes those its file no longer lists."""

HEALTH_PROGRAM = "node_health.sh"
HEALTH_SETTINGS_FILE = "node-health.env"
"""node_health.sh's settings, next to it in site.health_check_dir (slurmd runs it without arguments)."""
TASK_PROLOG = "task_prolog.sh"
"""slurm.conf's TaskProlog (components/programs/task_prolog.sh), in site.task_prolog_dir."""


# Kubernetes names Slurm resolves through cluster DNS.
CONTROLLER_SERVICE = "slurmctld"
ACCOUNTING_SERVICE = "slurmdbd"
DATABASE_SERVICE = "mariadb"
DATABASE_USER = "slurm"
DATABASE_NAME = "slurm_acct_db"
JWT_KEY_DIR = "/etc/slurm-jwt"
JWT_KEY_FILE = "jwt_hs256.key"
JWT_KEY_PATH = f"{JWT_KEY_DIR}/{JWT_KEY_FILE}"


@dataclass(frozen=True)
class ControllerHost:
    """One SlurmctldHost: the daemon's host name and, when it differs, its address."""

    name: str
    address: Optional[str] = None


@dataclass(frozen=True)
class DatabaseEndpoint:
    """Where slurmdbd finds its MySQL/MariaDB."""

    host: str
    port: int = 3306
    user: str = DATABASE_USER
    name: str = DATABASE_NAME


@dataclass(frozen=True)
class Site:
    """Where a cluster's Slurm daemons live: host names, ports, paths and node plugins.

    Everything here is a property of the place the daemons run, not of the
    cluster the user configured; the stack config never holds it.
    """

    controller_hosts: tuple[ControllerHost, ...]
    accounting_host: str
    """Address slurmctld uses to reach slurmdbd (AccountingStorageHost)."""
    dbd_host: str
    """Host name slurmdbd runs on (DbdHost must equal it, or be 'localhost')."""
    database: DatabaseEndpoint
    slurmctld_port: int = 6817
    slurmd_port: int = 6818
    slurmdbd_port: int = 6819
    slurm_user: str = "slurm"
    state_save_location: str = "/var/spool/slurmctld"
    slurmd_spool_dir: str = "/var/spool/slurmd"
    run_dir: str = "/run/slurm"
    log_dir: Optional[str] = None
    """None: daemons run in the foreground and log to stderr (what Kubernetes collects)."""
    munge_socket: Optional[str] = None
    """None: munge's default socket."""
    jwt_key: Optional[str] = None
    """slurmctld's HS256 key for auth/jwt tokens; None: munge only."""
    cgroup_plugin: str = "cgroup/v2"
    proctrack_type: str = "proctrack/cgroup"
    task_plugin: str = "task/cgroup,task/affinity"
    jobacct_gather_type: str = "jobacct_gather/cgroup"
    gpu_autodetect: Optional[str] = "nvidia"
    """gres.conf AutoDetect; None lists GPUs explicitly."""
    gpu_device_prefix: Optional[str] = None
    """GPUs are the device files <prefix>0..N-1 instead of detected devices."""
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    """Pool name -> NodeAddr hostlist, when node names do not resolve to the nodes."""
    health_check_dir: str = "/etc/dualsched/health"
    """Where each slurmd node has node_health.sh and its settings (HealthCheckProgram's directory)."""
    task_prolog_dir: str = "/etc/dualsched/task"
    """Where each slurmd node has task_prolog.sh (TaskProlog's directory), when tokens (jwt_key) may submit jobs."""
    shared_dir: str = "/shared"
    """The shared file system inside slurmd (components.compute.SHARED_MOUNT), which the health check tests."""
    job_tmp_dir: str = "/var/spool/slurmd-job-tmp"
    """Where slurmd keeps each job's private /tmp and the handle of its mount namespace (job_container.conf
    BasePath): a directory of this node alone, never /tmp or /dev/shm themselves."""
    addresses_from_registration: bool = False
    """Pools without node_addresses learn each node's address when its slurmd registers
    (State=CLOUD; before Slurm 23.11 also SlurmctldParameters=cloud_reg_addrs), so no node name needs DNS."""
    pyxis_runtime_path: str = "/run/pyxis"
    """Pyxis's own state (its runtime_path); slurmd makes the directory when it starts with Pyxis loaded."""
    spank_pyxis: str = "/usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so"
    """Pyxis's SPANK plugin in the slurmd image: where pyxis's Debian package installs it
    (debian/rules libdir=/usr/lib/$(DEB_HOST_MULTIARCH), Makefile PLUGINDIR=$(libdir)/slurm)."""


CGROUP_PLUGINS = {CgroupVersion.V2: "cgroup/v2", CgroupVersion.V1: "cgroup/v1"}
CLOUD_REG_ADDRS_DEFAULT_SINCE = (23, 11)
"""Slurm 23.11 made cloud_reg_addrs the default and calls the option defunct (an error at every start)."""
NAMESPACE_TYPE_SINCE = (25, 11)
"""Slurm 25.11 renamed JobContainerType=job_container/tmpfs to NamespaceType=namespace/tmpfs (it still reads
the old option, with a warning at every start; src/common/read_config.c)."""


def job_container_option(config: StackConfig) -> str:
    """The slurm.conf line that gives each job its own /tmp and /dev/shm, in the release's spelling."""
    if config.slurm.release_version >= NAMESPACE_TYPE_SINCE:
        return "NamespaceType=namespace/tmpfs"
    return "JobContainerType=job_container/tmpfs"


def slurmctld_parameters(config: StackConfig, site: Site) -> str:
    """SlurmctldParameters: configless always; cloud_reg_addrs where the release still needs it asked for."""
    parameters = ["enable_configless"]
    if site.addresses_from_registration and config.slurm.release_version < CLOUD_REG_ADDRS_DEFAULT_SINCE:
        parameters.append("cloud_reg_addrs")
    return ",".join(parameters)


def kubernetes_site(config: StackConfig) -> Site:
    """The Site of the cluster deployed by the components: names from its Services."""
    namespace = config.slurm.namespace
    replicas = 2 if config.slurm.controller.ha else 1
    hosts = tuple(
        ControllerHost(
            name=f"{CONTROLLER_SERVICE}-{ordinal}",
            address=f"{CONTROLLER_SERVICE}-{ordinal}.{CONTROLLER_SERVICE}.{namespace}.svc.cluster.local",
        )
        for ordinal in range(replicas)
    )
    return Site(
        controller_hosts=hosts,
        accounting_host=f"{ACCOUNTING_SERVICE}.{namespace}.svc.cluster.local",
        dbd_host=ACCOUNTING_SERVICE,
        database=database_endpoint(config),
        jwt_key=JWT_KEY_PATH,
        cgroup_plugin=CGROUP_PLUGINS[config.slurm.cgroup_version],
        gpu_autodetect=config.slurm.gpu_detection.value,
        # Undetected, a node's GPUs are the device files its slurmd container was given.
        gpu_device_prefix="/dev/nvidia" if config.slurm.gpu_detection is GpuAutoDetect.OFF else None,
        # Kubernetes node names are not host names cluster DNS resolves (slurmd runs on the host network).
        addresses_from_registration=True,
    )



def database_endpoint(config: StackConfig) -> DatabaseEndpoint:
    database = config.slurm.accounting.database
    if database is not None and database.mode is DatabaseMode.EXTERNAL and database.external is not None:
        external = database.external
        return DatabaseEndpoint(host=external.host or "", port=external.port, user=external.user, name=external.name)
    return DatabaseEndpoint(host=f"{DATABASE_SERVICE}.{config.slurm.namespace}.svc.cluster.local")


@dataclass(frozen=True)
class _NodeLine:
    name: str
    nodes: str
    addresses: Optional[str]
    cpus: int
    real_memory_mb: int
    mem_spec_limit_mb: int
    gpus: int
    gpu_type: Optional[str]

    @property
    def gres(self) -> Optional[str]:
        if not self.gpus:
            return None
        return f"gpu:{self.gpu_type}:{self.gpus}" if self.gpu_type else f"gpu:{self.gpus}"

    @property
    def options(self) -> str:
        """What every node of the pool has, in slurm.conf's words: its NodeName line after the names and addresses,
        and what a joining node's slurmd registers (slurmd -Z --conf)."""
        gres = f" Gres={self.gres}" if self.gres else ""
        return f"CPUs={self.cpus} RealMemory={self.real_memory_mb} MemSpecLimit={self.mem_spec_limit_mb}{gres} Features={self.name}"


@dataclass(frozen=True)
class _PartitionLine:
    name: str
    nodes: str
    default: bool
    max_time: str
    priority_tier: int


@dataclass(frozen=True)
class _WindowLine:
    """The daily reservation that keeps Slurm jobs off a time-shared pool while Kubernetes owns it."""

    name: str
    start: str
    duration_minutes: int
    nodes: str


def _node_line(pool: NodePool, addresses: Optional[str] = None) -> _NodeLine:
    return _NodeLine(
        name=pool.name,
        nodes=compact_hostlist(pool.nodes),
        addresses=addresses,
        cpus=pool.cpus,
        real_memory_mb=pool.real_memory_mb,
        mem_spec_limit_mb=pool.mem_spec_limit_mb,
        gpus=pool.slurm_gpu_count,
        gpu_type=pool.gpu_type,
    )


def _node_lines(config: StackConfig, site: Site) -> list[_NodeLine]:
    """The NodeName lines: the pools whose nodes are listed. A pool whose nodes join by label has none (its nodes
    register as dynamic nodes) and the gres.conf line of its bound."""
    return [_node_line(pool, site.node_addresses.get(pool.name)) for pool in config.slurm_pools if not pool.join_by_label]


def dynamic_node_options(pool: NodePool) -> str:
    """What a joining node's slurmd registers (slurmd -Z --conf): its pool's NodeName options, the pool's feature
    putting it in the pool's NodeSet. Its address is the one it registers from."""
    return _node_line(pool).options


def _partition_nodes(config: StackConfig, pools: Sequence[str]) -> str:
    """A partition's Nodes: the listed pools' nodes, and the NodeSet of each pool whose nodes join by label (named
    after the pool: NodeSet=<pool> Feature=<pool>), which takes each node as it registers."""
    listed = [config.pool(name).nodes for name in pools if not config.pool(name).join_by_label]
    return ",".join([*([compact_hostlist(",".join(listed))] if listed else []), *(name for name in pools if config.pool(name).join_by_label)])


def _partition_lines(config: StackConfig) -> list[_PartitionLine]:
    return [
        _PartitionLine(
            name=partition.name,
            nodes=_partition_nodes(config, partition.pools),
            default=partition.default,
            max_time=partition.max_time,
            priority_tier=partition.priority_tier,
        )
        for partition in config.slurm.partitions
    ]


def max_node_count(config: StackConfig) -> Optional[int]:
    """MaxNodeCount where nodes join by label: room for every listed node and every name a joining pool's bound
    allows (Slurm sizes its node table by it). None without joining pools: Slurm counts slurm.conf's nodes."""
    if not any(pool.join_by_label for pool in config.slurm_pools):
        return None
    return sum(len(pool.node_names) for pool in config.slurm_pools)


def _window_lines(config: StackConfig) -> list[_WindowLine]:
    return [
        _WindowLine(
            name=f"{WINDOW_RESERVATION_PREFIX}{pool.name}",
            start=pool.inference_window.start,
            duration_minutes=pool.inference_window.duration_minutes,
            nodes=compact_hostlist(pool.nodes),
        )
        for pool in config.pools
        if pool.mode is PoolMode.TIME_SHARED  # config.checks: exactly these pools have a window
    ]


# ------------------------------------------------------------- preemption and accounting state

PREEMPT_TYPES = {
    PreemptType.OFF: "preempt/none",
    PreemptType.QOS: "preempt/qos",
    PreemptType.PARTITION_PRIO: "preempt/partition_prio",
}

_TIME = re.compile(r"(?:(?P<days>\d+)-)?(?P<rest>[\d:]+)$")


def slurm_seconds(value: str) -> Optional[int]:
    """A Slurm time (config.types.SlurmTime) in seconds; None for INFINITE/UNLIMITED.

    The forms of slurm.conf(5): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds (src/common/parse_time.c time_str2secs)."""
    if value.upper() in ("INFINITE", "UNLIMITED"):
        return None
    match = _TIME.match(value)
    if match is None:
        raise ValueError(f"not a Slurm time: {value!r}")
    days = int(match["days"]) if match["days"] is not None else None
    parts = [int(part) for part in match["rest"].split(":")]
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def print_seconds(seconds: int) -> str:
    """A duration as sacctmgr prints it (secs2time_str): [days-]HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _qos_seconds(value: Optional[str]) -> str:
    seconds = slurm_seconds(value) if value is not None else None
    return "" if seconds is None else print_seconds(seconds)


def _qos_minutes(value: Optional[str]) -> str:
    """MaxWall is kept in whole minutes, a part minute rounded up (time_str2mins)."""
    seconds = slurm_seconds(value) if value is not None else None
    return "" if seconds is None else print_seconds((seconds + 59) // 60 * 60)


def print_tres(limit: TresLimit) -> str:
    """A TRES limit as sacctmgr prints it: name=count, sorted by name, nothing when unlimited."""
    counts = sorted((name, getattr(limit, field)) for field, name in TRACKED_TRES if getattr(limit, field) is not None)
    return ",".join(f"{name}={count}" for name, count in counts)


@dataclass(frozen=True)
class _QosLine:
    name: str
    priority: int
    preempt: str
    preempt_mode: str
    preempt_exempt_time: str
    usage_factor: str
    max_wall: str
    max_tres_per_user: str
    grp_tres: str
    max_jobs_per_user: str

    @property
    def options(self) -> str:
        """Its Option=Value words in accounting_state.sh's order; an unset option is left out."""
        values = (
            ("Priority", str(self.priority)), ("Preempt", self.preempt), ("PreemptMode", self.preempt_mode),
            ("PreemptExemptTime", self.preempt_exempt_time), ("UsageFactor", self.usage_factor),
            ("MaxWall", self.max_wall), ("MaxTRESPU", self.max_tres_per_user), ("GrpTRES", self.grp_tres),
            ("MaxJobsPU", self.max_jobs_per_user),
        )  # fmt: skip
        return " ".join(f"{option}={value}" for option, value in values if value)


@dataclass(frozen=True)
class _AccountLine:
    name: str
    parent: str
    fairshare: int
    qos: str
    default_qos: str


@dataclass(frozen=True)
class _UserLine:
    name: str
    account: str
    default_account: str


def _qos_lines(config: StackConfig) -> list[_QosLine]:
    return [
        _QosLine(
            name=qos.name,
            priority=qos.priority,
            preempt=",".join(sorted(set(qos.preempt))),
            preempt_mode=qos.preempt_mode.value,
            preempt_exempt_time=_qos_seconds(qos.preempt_exempt_time),
            usage_factor=f"{qos.usage_factor:f}",
            max_wall=_qos_minutes(qos.max_wall),
            max_tres_per_user=print_tres(qos.max_tres_per_user),
            grp_tres=print_tres(qos.grp_tres),
            max_jobs_per_user="" if qos.max_jobs_per_user is None else str(qos.max_jobs_per_user),
        )
        for qos in config.slurm.qos
    ]


def _account_lines(config: StackConfig) -> list[_AccountLine]:
    return [
        _AccountLine(
            name=account.name,
            parent=account.parent,
            fairshare=account.fairshare,
            qos=",".join(sorted(set(account.qos))),
            default_qos=account.default_qos or account.qos[0],
        )
        for account in config.slurm.accounts  # config.checks: parents first
    ]


def _user_lines(config: StackConfig) -> list[_UserLine]:
    defaults = {user.name: user.default_account for user in config.slurm.users}
    firsts: dict[str, str] = {}
    lines = []
    for account in config.slurm.accounts:
        for user in dict.fromkeys(account.users):
            firsts.setdefault(user, account.name)
            lines.append(_UserLine(name=user, account=account.name, default_account=defaults.get(user) or firsts[user]))
    return lines


def compact_hostlist(expression: str) -> str:
    """Normalise a hostlist expression to Slurm's compact range form: gpu-[001-512]."""
    return hostlist.collect_hostlist(hostlist.expand_hostlist(expression))


_environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


TASK_PROLOG_FIXED_FOR_CONTAINERS = {(24, 11): 7, (25, 5): 2}
"""Releases whose first patches ran a TaskProlog through slurmstepd's own binary (the script launcher), inside
a Pyxis container that has neither it nor its libraries, so every container step failed (NVIDIA/pyxis#163);
and the patch that runs it directly again (SchedMD d4d020b553, ticket 22853: 24.11.7, 25.05.2; every 25.11)."""


def task_prolog_runs_in_containers(config: StackConfig) -> bool:
    """Whether slurmstepd can run the TaskProlog in a job step's container: by the release, and for 24.11 and
    25.05 by the patch level of the slurmd image (a tag without one may be an affected patch)."""
    fixed_in = TASK_PROLOG_FIXED_FOR_CONTAINERS.get(config.slurm.release_version)
    if fixed_in is None:
        return True
    patch = image_slurm_patch(config.images.slurmd_pyxis)
    return patch is not None and patch >= fixed_in


def task_prolog_path(config: StackConfig, site: Site) -> Optional[str]:
    """TaskProlog: where jobs may be submitted with a token (auth/jwt), it keeps the token out of their
    tasks. Not where Pyxis runs job steps on a Slurm that cannot run it in their containers: there a
    job submitted with a token can run no `srun` (Slurm's own limit for clients with SLURM_JWT, jwt.html)."""
    if not site.jwt_key:
        return None
    if config.runs_containers and not task_prolog_runs_in_containers(config):
        return None
    return f"{site.task_prolog_dir}/{TASK_PROLOG}"


def render_slurm_files(config: StackConfig, site: Site) -> dict[str, str]:
    """slurm.conf, gres.conf, cgroup.conf, plugstack.conf, job_container.conf, the window reservations and the
    accounting state for the cluster at this site."""
    context = {
        "config": config,
        "site": site,
        "pools": _node_lines(config, site),
        "partitions": _partition_lines(config),
        "windows": _window_lines(config),
        "preempt_type": PREEMPT_TYPES[config.slurm.preemption.type],
        "slurmctld_parameters": slurmctld_parameters(config, site),
        "manages_accounts": bool(config.slurm.accounts),
        "owner_marker": f"{OWNER_MARKER}{config.slurm.cluster_name}",
        "qos_lines": _qos_lines(config),
        "account_lines": _account_lines(config),
        "user_lines": _user_lines(config),
        "health_program": f"{site.health_check_dir}/{HEALTH_PROGRAM}",
        "task_prolog": task_prolog_path(config, site),
        "fabric": any(pool.fabric for pool in config.slurm_pools),
        # gres.conf names a joining pool's bound: slurmd takes the line whose names hold its own.
        "gres_pools": [_node_line(pool) for pool in config.slurm_pools],
        "node_sets": [pool.name for pool in config.slurm_pools if pool.join_by_label],
        "max_node_count": max_node_count(config),
        "fans_out_to_dynamic_nodes": config.slurm.release_version >= NODES_BY_RECONFIGURE_SINCE,
        "job_container": job_container_option(config),
    }
    return {name: _environment.get_template(f"{name}.j2").render(context) for name in SLURM_FILES}


ENROOT_CONF = "enroot.conf"
ENROOT_TASK_PROLOG_MOUNTS = "90-dualsched-task-prolog.fstab"
"""Enroot's mount file for the TaskProlog, in its mounts.d (render_enroot_mounts)."""


def render_enroot_conf(containers: PoolContainers) -> str:
    """enroot.conf for a pool's slurmd container: Enroot's directories, one per user (or group) under the pool's."""
    return _environment.get_template(f"{ENROOT_CONF}.j2").render(containers=containers)


def render_enroot_mounts(task_prolog: str) -> str:
    """An Enroot fstab (mounts.d) that binds the TaskProlog into every container, read-only: Pyxis joins the
    container before slurmstepd runs the TaskProlog, which must then be found there (NVIDIA/pyxis#83)."""
    return f"{task_prolog} {task_prolog} none x-create=file,bind,ro,nosuid,nodev,private 0 -1\n"


def render_health_settings(config: StackConfig, pool: NodePool, site: Site) -> str:
    """The settings node_health.sh sources on a node of ``pool``: which checks run, and what they expect."""
    return _environment.get_template(f"{HEALTH_SETTINGS_FILE}.j2").render(
        checks=config.slurm.health_check.checks,
        site=site,
        # The same device files gres.conf lists without AutoDetect; the detecting plugins find these too.
        gpu_device_prefix=site.gpu_device_prefix or "/dev/nvidia",
        gpus=pool.slurm_gpu_count,
    )


def render_slurmdbd_conf(config: StackConfig, site: Site, storage_pass: Optional[str] = None) -> str:
    """slurmdbd.conf; without ``storage_pass`` the password line is left to start-up."""
    return _environment.get_template("slurmdbd.conf.j2").render(
        config=config, site=site, database=site.database, storage_pass=storage_pass
    )


def config_hash(files: Mapping[str, str]) -> str:
    """A stable digest of rendered files, to roll pods when (and only when) they change."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()


# slurm.conf(5): changing these needs slurmctld (and slurmd) restarted, not `scontrol reconfigure`.
# Everything else is reloaded in place.
NODE_TABLE_KEYS = ("NodeName", "NodeSet", "MaxNodeCount", "TreeWidth")
"""What sizes or shapes slurmctld's node table: before Slurm 23.11 a reconfigure that changes it is refused (22.05's
read_config.c: "MaxNodeCount has changed ... during reconfig, slurmctld must be restarted", a fatal error)."""
RESTART_KEYS = (
    "AccountingStorageEnforce", "AuthType", "AuthInfo", "AuthAltTypes", "AuthAltParameters", "ClusterName", "GresTypes",
    "JobContainerType", "NamespaceType", "ProctrackType", "PrologFlags", "SelectType", "SelectTypeParameters",
    "SlurmctldHost", "SlurmctldParameters", "SlurmctldPort", "SlurmdPort", "SlurmUser", "StateSaveLocation", "TaskPlugin",
    *NODE_TABLE_KEYS,
)
NODES_BY_RECONFIGURE_SINCE = (23, 11)
"""Slurm 23.11's `scontrol reconfigure` starts slurmctld anew in place (fork and exec, the listening sockets
handed over, the state read back) and slurmd likewise, so adding, removing or resizing nodes no longer needs a
restart: slurm.conf(5) of 24.11 says node changes "require restarting or reconfiguring all slurmctld and slurmd
daemons" (23.02's: "require restarting"), and MaxNodeCount no longer says it needs a restart. Before it, the
node table's keys are restart keys. The same release fans out to dynamic nodes (dynamic_nodes.html of 23.11;
22.05's needs TreeWidth=65533)."""


def restart_keys(release: tuple[int, int]) -> tuple[str, ...]:
    """The slurm.conf options whose change restarts slurmctld, for a Slurm release."""
    if release >= NODES_BY_RECONFIGURE_SINCE:
        return tuple(key for key in RESTART_KEYS if key not in NODE_TABLE_KEYS)
    return RESTART_KEYS


def restart_hash(files: Mapping[str, str], release: tuple[int, int]) -> str:
    """A digest of the slurm.conf lines only a restart applies on ``release``; the rest changes by reconfigure."""
    keys = restart_keys(release)
    lines = [line for line in files["slurm.conf"].splitlines() if line.split("=", 1)[0] in keys]
    return config_hash({"slurm.conf": "\n".join(lines), "cgroup.conf": files["cgroup.conf"]})
