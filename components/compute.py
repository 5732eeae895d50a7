"""slurmd on a GPU node pool: one DaemonSet per pool, placed by the pool label."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import (
    SKIP_AWAIT, child, claim_volume, config_map_volume, empty_dir, labels, meta, mount, tcp_probe, tolerations_for,
)
from dualsched.components.identity import (
    home_mount, home_volume, identity_mounts, identity_volume, make_homes, owned_directories, users_annotation,
)
from dualsched.components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from dualsched.components.nodepools import slurmd_node_selector
from dualsched.components.programs import source
from dualsched.components.slurm_files import (
    ENROOT_CONF, ENROOT_TASK_PROLOG_MOUNTS, HEALTH_PROGRAM, HEALTH_SETTINGS_FILE, TASK_PROLOG, Site, dynamic_node_options,
    render_enroot_conf, render_enroot_mounts, render_health_settings, task_prolog_path,
)
from dualsched.config.models import (
    GPU_RESOURCE, CgroupVersion, GpuAutoDetect, NodePool, PoolContainers, PoolMode, SlurmUser, StackConfig, Taint,
)

SHARED_MOUNT = "/shared"
ENROOT_CONF_DIR = "/etc/enroot"
"""Where Enroot reads enroot.conf (its sysconfdir in the slurmd-pyxis image's package)."""


def slurmd_tolerated_taints(config: StackConfig, pool: NodePool) -> tuple[Taint, ...]:
    """The pool's taints, and the closed window's NoExecute taint, which must evict inference pods
    and never slurmd (its jobs own the node then). Every pool's slurmd tolerates it: when a pool
    switches to time-shared, the keeper may taint its nodes before their slurmd pods are replaced,
    and a pod's tolerations are those of the template it was made from."""
    return (*config.pool_taints(pool), config.window_taint)


def conf_servers(site: Site) -> str:
    """slurmd --conf-server list: every controller, so a node can start while the primary is down."""
    return ",".join(f"{host.address or host.name}:{site.slurmctld_port}" for host in site.controller_hosts)


@dataclass(frozen=True)
class ComputePoolArgs:
    config: StackConfig
    pool: NodePool
    site: Site
    namespace: pulumi.Input[str]
    munge_secret_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]
    shared_claim_name: pulumi.Input[str]


def slurmd_resources(pool: NodePool) -> dict[str, str]:
    """The node share Slurm allocates, as both requests and limits: a Guaranteed pod, which
    the kubelet evicts last, with exactly the memory slurm.conf promises (RealMemory, MiB)."""
    # A time-shared slurmd holds no GPU through the device plugin: inference pods take them in the window.
    held = 0 if pool.mode is PoolMode.TIME_SHARED else pool.slurm_gpu_count
    gpus = {GPU_RESOURCE: str(held)} if held else {}
    # The RDMA devices come with their device plugin's resource; every job in the pod shares them.
    fabric = {pool.fabric.rdma_resource: str(pool.fabric.rdma_count)} if pool.fabric else {}
    return {"cpu": str(pool.cpus), "memory": f"{pool.real_memory_mb}Mi", **gpus, **fabric}


def slurmd_selector(pool: NodePool) -> dict[str, str]:
    """The DaemonSet's selector. Kubernetes never changes a selector in place: a new one replaces the
    DaemonSet, deleting every slurmd pod and the jobs running in them. So it holds only what names
    the pool, never the configurable pool label key or the cluster name."""
    return labels("slurmd", pool.name)


# What slurmd needs without `privileged` (each found missing on the real node): CAP_SYS_ADMIN to
# write the devices controller's allow/deny files of job cgroups (cgroup v1 checks it), to load
# cgroup v2's device BPF program and to remount its cgroup writable; CAP_SYS_NICE for task/affinity
# to pin another user's tasks ("task_g_set_affinity: Operation not permitted"). The runtime's
# default set covers setuid/setgid, kill and chown. Slinky's slurmd (workerbuilder/worker_app.go)
# is privileged and adds BPF, NET_ADMIN, SYS_ADMIN and SYS_NICE: it sees every GPU of the node.
SLURMD_CAPABILITIES = ("SYS_ADMIN", "SYS_NICE")
# With a fabric, CAP_SYS_RESOURCE lets slurmd raise its own locked-memory limit, which jobs keep
# (slurm.conf PropagateResourceLimitsExcept=MEMLOCK): RDMA registers memory that must stay locked.
FABRIC_CAPABILITIES = ("SYS_RESOURCE",)
UNLIMITED_LOCKED_MEMORY = "ulimit -l unlimited"
NCCL_CONF = "nccl.conf"
NCCL_CONF_PATH = "/etc/nccl.conf"
"""Where NCCL reads system-wide settings at its start (its environment variables' documentation); a variable
already in a job's environment wins."""


def isolates_gpus(pool: NodePool) -> bool:
    """Dedicated and partitioned slurmd runs unprivileged, inside the GPUs the kubelet gave it. A
    time-shared pool's slurmd holds no GPU through the device plugin (inference pods take them inside
    the window) and is privileged to see them all; its jobs keep to their own GPUs by Slurm's
    ConstrainDevices, and to their hours by the window's reservation. A pool with containers is
    privileged too: Enroot, run as the job's user, makes a user namespace and mounts /proc in it,
    which the runtime's seccomp profile and masked /proc refuse (config.checks keeps containers out
    of partitioned pools, whose other GPUs are Kubernetes')."""
    return pool.mode is not PoolMode.TIME_SHARED and pool.containers is None


def slurmd_security_context(pool: NodePool) -> k8s.core.v1.SecurityContextArgs:
    if not isolates_gpus(pool):
        return k8s.core.v1.SecurityContextArgs(privileged=True)
    return k8s.core.v1.SecurityContextArgs(
        privileged=False,
        capabilities=k8s.core.v1.CapabilitiesArgs(add=[*SLURMD_CAPABILITIES, *(FABRIC_CAPABILITIES if pool.fabric else ())]),
        # The runtime's AppArmor profile forbids mount, which slurmd_command needs.
        app_armor_profile=k8s.core.v1.AppArmorProfileArgs(type="Unconfined"),
        # slurmd runs users' jobs: the runtime's seccomp profile keeps from them the system calls no job
        # needs (kexec, module loading, keyring and clock changes...). It allows mount, unshare and bpf to
        # a process with CAP_SYS_ADMIN, as slurmd is; a kubelet without --seccomp-default runs a container
        # without any profile unless the pod asks for one.
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    )


# An unprivileged container's cgroup mounts are read-only views of its own cgroup (v1: one per
# controller; v2: its cgroup namespace). Made writable, Slurm nests its cgroups under the
# container's: jobs stay inside the pod's device, memory and cpuset limits. A bind remount flips
# only the mount's read-only flag, on either version. Plain sh and mount(8): images need no awk.
REMOUNT_CGROUPS_WRITABLE = (
    "while read -r _ path type _; do case $type in cgroup|cgroup2) mount -o remount,bind,rw \"$path\" || exit 1;; esac;"
    " done < /proc/mounts"
)


# cgroup v1: Slurm writes `c MAJ:MIN rwm` to a job's devices.allow (cgroup/v1 _handle_device_access),
# and the kernel refuses a child cgroup more than its parent has. Device plugins hand GPUs to the
# container as `rw` (NVIDIA's, and the double), so slurmd first adds `m` to the devices its own
# cgroup already holds `rw`; its parent, the pod's cgroup, allows every device. Nothing new opens:
# the same devices, and root in slurmd is already trusted with CAP_SYS_ADMIN (docs/security.md).
V1_DEVICES = "/sys/fs/cgroup/devices"
GRANT_MKNOD_ON_HELD_DEVICES = (
    f'while read -r type device access; do case $access in rw) echo "$type $device rwm" > {V1_DEVICES}/devices.allow'
    f" || exit 1;; esac; done < {V1_DEVICES}/devices.list"
)


NAMESPACE_ID_BATCH = 4096
"""Mount namespace ids each CPU takes from the kernel at a time (include/linux/cookie.h COOKIE_LOCAL_BATCH)."""
NAMESPACES_PER_PROBE = 64
"""Namespaces made on a CPU between two tries at binding one, which costs more than making one."""


def newer_mount_namespaces_on_every_cpu(run_dir: str) -> str:
    """Each job's /tmp is a mount namespace that the extern step keeps by bind-mounting its
    /proc/<pid>/ns/mnt (job_container/tmpfs, namespace/tmpfs). The kernel refuses that bind (EINVAL,
    "ns base mount failed"; the job is requeued held) unless the new namespace's id is larger than the
    id of the namespace doing the bind (fs/namespace.c mnt_ns_loop). Since Linux 6.18 mount namespace
    ids come from per-CPU batches (gen_cookie_next), so a namespace made later on another CPU can have
    a smaller id than this container's, made by the runtime: the first jobs after slurmd's pod starts
    then fail on some CPUs (seen on the one-node and multi-node tiers, and with the same system calls
    alone in the pod; snapd works around the same bug, canonical/snapd#17376). Before slurmd starts,
    namespaces are made on each CPU the container may run on until one binds, which takes up to one
    batch of ids on a CPU that lags: from then on every namespace made on that CPU is newer than the
    container's. On kernels before 6.18 the first one binds."""
    return (
        f"probe=$(mktemp -d {run_dir}/namespace-order.XXXXXX) && mount --bind \"$probe\" \"$probe\""
        ' && mount --make-private "$probe" && here=$(readlink /proc/self/ns/mnt)'
        + many_mount_namespaces_on()
        + ' && newer_on() { made=0; : > "$probe/$1";'
        f' while [ $made -le {2 * NAMESPACE_ID_BATCH} ]; do taskset -c "$1" unshare --mount sleep 60 & child=$!;'
        ' while [ -e /proc/$child ] && [ "$(readlink /proc/$child/ns/mnt)" = "$here" ]; do :; done;'
        ' if mount --bind /proc/$child/ns/mnt "$probe/$1" 2>/dev/null; then umount "$probe/$1"; kill $child; wait $child; return; fi;'
        f' kill $child 2>/dev/null; wait $child; many_on "$1" {NAMESPACES_PER_PROBE - 1}; made=$((made + {NAMESPACES_PER_PROBE})); done;'
        ' echo "CPU $1: no mount namespace made there binds after $made: jobs whose steps start there may fail'
        ' (job_container/tmpfs: ns base mount failed)" >&2; }'
        " && for range in $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status | tr , ' ');"
        ' do cpu=${range%-*}; while [ $cpu -le ${range#*-} ]; do newer_on $cpu & cpu=$((cpu + 1)); done; done;'
        ' wait; umount "$probe" && rm -r "$probe"'
    )


UNSHARE_SYSCALLS = {"x86_64": 272, "aarch64": 97}
"""unshare(2)'s number by `uname -m` (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h)."""
CLONE_NEWNS = 0x00020000


def many_mount_namespaces_on() -> str:
    """A shell function, `many_on CPU N`: N mount namespaces made one after the other on that CPU. Perl (Debian's
    perl-base is essential) calls unshare(2) N times in one process, about 35 times faster here than N `unshare
    --mount` processes (about 7 s of CPU for one batch of ids), which every slurmd start on a lagging CPU paid;
    an image without perl, or on another machine, gets the processes."""
    numbers = " ".join(f"{machine}) nr={number};;" for machine, number in UNSHARE_SYSCALLS.items())
    return (
        f" && case $(uname -m) in {numbers} *) nr=none;; esac"
        ' && many_on() { taskset -c "$1" perl -e "for (1..$2) { syscall($nr, ' + str(CLONE_NEWNS) + ') == 0 or exit 1 }" 2>/dev/null'
        r' || taskset -c "$1" sh -c "n=0; while [ \$n -lt $2 ]; do unshare --mount true; n=\$((n + 1)); done"; }'
    )


NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"
"""Where gpu/nvidia (AutoDetect=nvidia) finds a node's GPUs: one directory per GPU (gpu_nvidia.c)."""


def only_the_pods_gpus_listed(count: int) -> str:
    """AutoDetect=nvidia gives slurmd every GPU the driver lists in /proc. The NVIDIA runtime shows a container
    only its own GPUs there (libnvidia-container, mount_procfs_gpu); a runtime that shows the node's would hand
    jobs the GPUs of other pods, so slurmd does not start, and says why."""
    return (
        f'listed=$(ls {NVIDIA_PROC_GPUS} 2>/dev/null | wc -l); [ "$listed" -le {count} ] ||'
        f' {{ echo "{NVIDIA_PROC_GPUS} lists $listed GPUs and this pod holds {count}: the container runtime shows it'
        ' GPUs of other pods, which AutoDetect=nvidia would give to jobs (use the NVIDIA runtime, or gpuAutoDetect: nvml)" >&2; exit 1; }'
    )


def wait_for_the_primary(site: Site, seconds: int) -> str:
    """With a backup controller, slurmd first gives the primary up to SlurmctldTimeout to accept connections.
    slurmd fetches its config before it knows SlurmctldTimeout: a primary that refuses (still starting: both
    controllers start together) sends it to the backup, whose "in standby" answer makes it sleep 60 s and
    retry for up to 180 s (slurm_send_recv_controller_msg, the built-in 120 s timeout), then exit; every
    node restarted once. A primary that stays away is the backup's to replace after SlurmctldTimeout, so
    slurmd goes on then. bash for /dev/tcp: the Slurm images have it."""
    primary = site.controller_hosts[0]
    address = f"{primary.address or primary.name}/{site.slurmctld_port}"
    return (
        f"waited=0; until timeout 2 bash -c 'exec 3<>/dev/tcp/{address}' 2>/dev/null || [ $waited -ge {seconds} ];"
        " do sleep 2; waited=$((waited + 2)); done"
    )


def enroot_directories(containers: PoolContainers, users: tuple[SlurmUser, ...]) -> str:
    """Enroot's directories on the node: the pool's three root's and closed to others' writes, and in them
    each job user's own (enroot.conf): runtime and data ``user-<uid>`` for the user alone, the layer cache
    ``group-<gid>`` for the group's members (sticky: none removes another's files). No user makes, enters
    or plants files in another's. The paths are words the shell takes as they are (config.types
    AbsolutePath: letters, digits, '.', '_', '-' and '/')."""
    paths = " ".join(containers.paths.values())
    mine = [(f"{path}/user-{user.uid}", user.uid, user.group_id, "0700")
            for user in users for path in (containers.runtime_path, containers.data_path)]  # fmt: skip
    ours = [(f"{containers.cache_path}/group-{gid}", 0, gid, "1770") for gid in sorted({user.group_id for user in users})]
    return owned_directories(f"mkdir -p {paths} && chown 0:0 {paths} && chmod 0755 {paths}", [*mine, *ours])


def pool_enroot(config: StackConfig, pool: NodePool) -> Optional[PoolContainers]:
    """Enroot's directories for the pool's slurmd: its own where it runs containers. Where it does not but
    another pool does, slurmd still loads Pyxis (one plugstack.conf), and Pyxis runs `enroot list` in every
    job's epilog (container_scope=job): without Enroot's directories that fails and Slurm drains the node
    after each job. There Enroot gets the default paths, all in the pod (nothing to keep), to list nothing;
    its unprivileged slurmd can start no container."""
    if pool.containers is not None:
        return pool.containers
    return PoolContainers() if config.runs_containers else None


def slurmd_arguments(pool: NodePool, site: Site, node_name: str = "$(NODE_NAME)") -> list[str]:
    """slurmd's own command line: in the foreground, as its Kubernetes node, its files from the controllers. A node
    of a pool whose nodes join by label is in no NodeName line: it registers as a dynamic node of its pool (and
    again as one after a restart)."""
    slurmd = ["slurmd", "-D", "-N", node_name, "--conf-server", conf_servers(site)]
    if pool.join_by_label:
        slurmd += ["-Z", "--conf", dynamic_node_options(pool)]
    return slurmd


def slurmd_command(config: StackConfig, pool: NodePool, site: Site) -> list[str]:
    """slurmd in the foreground; once the primary controller answers (or has had its time) when there is a
    backup; unprivileged, after making its own cgroup writable; once jobs' mount namespaces can be kept on
    every CPU; with the users' homes made, and Enroot's directories ready where Pyxis runs (pool_enroot)."""
    steps = []
    if len(site.controller_hosts) > 1:
        steps.append(wait_for_the_primary(site, config.slurm.controller.slurmctld_timeout))
    if isolates_gpus(pool):
        if config.slurm.gpu_detection is GpuAutoDetect.NVIDIA and pool.slurm_gpu_count:
            steps.append(only_the_pods_gpus_listed(pool.slurm_gpu_count))
        steps.append(REMOUNT_CGROUPS_WRITABLE)
        if config.slurm.cgroup_version is CgroupVersion.V1:
            steps.append(GRANT_MKNOD_ON_HELD_DEVICES)
    if pool.fabric:
        steps.append(UNLIMITED_LOCKED_MEMORY)
    steps.append(newer_mount_namespaces_on_every_cpu(site.run_dir))
    steps.append(make_homes(config.slurm.users))
    enroot = pool_enroot(config, pool)
    if enroot is not None:
        steps.append(enroot_directories(enroot, config.slurm.users))
    return ["sh", "-c", " && ".join(f"{{ {step}; }}" for step in steps) + ' && exec "$@"', "slurmd", *slurmd_arguments(pool, site)]


def slurmd_image(config: StackConfig) -> str:
    """Every slurmd loads the plugstack.conf slurmctld serves: with containers, every pool's image carries Pyxis."""
    return getattr(config.images, config.slurm_image_field("slurmd"))


def enroot_volumes(
    pool: NodePool, enroot: PoolContainers, enroot_config_map_name: pulumi.Input[str]
) -> list[k8s.core.v1.VolumeArgs]:
    """Where the pool runs containers, the layer cache and unpacked containers on the node's own disk
    (hostPath): a slurmd pod replaced to pick up a change keeps the images its node already pulled.
    The runtime directory holds nothing a job needs once it has ended, and a pool without containers
    keeps nothing: emptyDirs."""
    stored = (("enroot-cache", enroot.cache_path), ("enroot-data", enroot.data_path))
    if pool.containers is None:
        on_node = [empty_dir(name) for name, _ in stored]
    else:
        on_node = [
            k8s.core.v1.VolumeArgs(
                name=name, host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=path, type="DirectoryOrCreate")
            )
            for name, path in stored
        ]
    return [empty_dir("enroot-runtime"), *on_node, config_map_volume("enroot-conf", enroot_config_map_name)]


def enroot_files(enroot: PoolContainers, task_prolog: Optional[str]) -> dict[str, str]:
    """The enroot ConfigMap's files: enroot.conf, and the mount that puts the TaskProlog in containers."""
    mounts = {ENROOT_TASK_PROLOG_MOUNTS: render_enroot_mounts(task_prolog)} if task_prolog else {}
    return {ENROOT_CONF: render_enroot_conf(enroot), **mounts}


def enroot_mounts(enroot: PoolContainers, task_prolog: Optional[str]) -> list[k8s.core.v1.VolumeMountArgs]:
    """Enroot's directories, and the files of enroot_files where Enroot reads them."""
    files = [(ENROOT_CONF, f"{ENROOT_CONF_DIR}/{ENROOT_CONF}")]
    if task_prolog:
        files.append((ENROOT_TASK_PROLOG_MOUNTS, f"{ENROOT_CONF_DIR}/mounts.d/{ENROOT_TASK_PROLOG_MOUNTS}"))
    return [
        mount("enroot-runtime", enroot.runtime_path),
        mount("enroot-cache", enroot.cache_path),
        mount("enroot-data", enroot.data_path),
        *(mount("enroot-conf", path, read_only=True, sub_path=name) for name, path in files),
    ]


JOB_TMP_VOLUME = "job-tmp"
"""Each job's /tmp (job_container.conf BasePath): on the node's disk, gone with the pod."""
HEALTH_VOLUME = "health"
TASK_PROLOG_VOLUME = "task-prolog"
NCCL_VOLUME = "nccl"


def health_config_map_name(pool: NodePool) -> str:
    """A fixed name, mounted as a directory: a changed check reaches slurmd in place and never restarts it."""
    return f"slurmd-health-{pool.name}"


def task_prolog_config_map_name(pool: NodePool) -> str:
    """A fixed name, mounted as a directory, like the health check's."""
    return f"slurmd-task-prolog-{pool.name}"


def render_nccl_conf(pool: NodePool) -> str:
    settings = "".join(f"{name}={value}\n" for name, value in sorted(pool.fabric.nccl.items()))
    return f"# /etc/nccl.conf of pool {pool.name}'s jobs, generated by dualsched from the stack config (fabric.nccl).\n{settings}"


def program_volume(name: str, config_map_name: str) -> k8s.core.v1.VolumeArgs:
    # slurmd and slurmstepd exec these programs directly (HealthCheckProgram, TaskProlog): they need the execute bit.
    return k8s.core.v1.VolumeArgs(
        name=name, config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=config_map_name, default_mode=0o555)
    )


class ComputePool(pulumi.ComponentResource):
    """slurmd on every node of one pool, with the pool's GPU share and the shared file system.

    Jobs run inside the slurmd container, so its limits are the node share Slurm
    allocates. ``OnDelete`` updates: changing the DaemonSet never kills a running
    job; the rollout controller (components/slurmd_rollout.py) drains a node in Slurm,
    waits for its jobs, then deletes its pod to pick up the change.
    """

    def __init__(self, name: str, args: ComputePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:compute:ComputePool", name, None, opts)
        config, pool = args.config, args.pool
        selector = slurmd_selector(pool)
        pod_labels = {**selector, config.placement.pool_label: pool.name}
        enroot, task_prolog, enroot_config_map_name = pool_enroot(config, pool), task_prolog_path(config, args.site), None
        if enroot is not None:
            enroot_config_map_name = k8s.core.v1.ConfigMap(
                f"{name}-enroot",
                metadata=meta(namespace=args.namespace, labels=pod_labels),
                data=enroot_files(enroot, task_prolog),
                opts=child(self),
            ).metadata.name
        nccl_config_map_name = None
        if pool.fabric:
            # Auto-named, like enroot's: NCCL reads the file through a subPath mount, which the kubelet never
            # updates, so a changed setting is a new ConfigMap, a changed pod template, and slurmd rolls.
            nccl_config_map_name = k8s.core.v1.ConfigMap(
                f"{name}-nccl",
                metadata=meta(namespace=args.namespace, labels=pod_labels),
                data={NCCL_CONF: render_nccl_conf(pool)},
                opts=child(self),
            ).metadata.name
        programs = []
        if task_prolog:
            programs.append(
                k8s.core.v1.ConfigMap(
                    f"{name}-task-prolog",
                    metadata=meta(name=task_prolog_config_map_name(pool), namespace=args.namespace, labels=pod_labels),
                    data={TASK_PROLOG: source(TASK_PROLOG)},
                    opts=child(self),
                )
            )
        if config.slurm.health_check.enabled:
            programs.append(
                k8s.core.v1.ConfigMap(
                    f"{name}-health",
                    metadata=meta(name=health_config_map_name(pool), namespace=args.namespace, labels=pod_labels),
                    data={
                        HEALTH_PROGRAM: source(HEALTH_PROGRAM),
                        HEALTH_SETTINGS_FILE: render_health_settings(config, pool, args.site),
                    },
                    opts=child(self),
                )
            )
        daemonset = k8s.apps.v1.DaemonSet(
            name,
            # pulumi-kubernetes awaits a DaemonSet until every pod runs the new template, which
            # under OnDelete is never without a person (provider/pkg/await/daemonset.go): a template
            # change would fail `up` after 10 minutes. slurmd's readiness is Slurm's to report.
            metadata=meta(namespace=args.namespace, labels=pod_labels, annotations=SKIP_AWAIT),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="OnDelete"),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=pod_labels, annotations=users_annotation(config)),
                    spec=self._pod_spec(args, enroot_config_map_name, nccl_config_map_name),
                ),
            ),
            opts=child(self, depends_on=programs),
        )
        self.daemonset_name = daemonset.metadata.name
        self.register_outputs({"daemonset_name": self.daemonset_name})

    @staticmethod
    def _pod_spec(
        args: ComputePoolArgs, enroot_config_map_name: Optional[pulumi.Output[str]], nccl_config_map_name: Optional[pulumi.Output[str]]
    ) -> k8s.core.v1.PodSpecArgs:
        config, pool, site = args.config, args.pool, args.site
        resources = slurmd_resources(pool)
        image = slurmd_image(config)
        enroot = pool_enroot(config, pool)
        health_check = config.slurm.health_check.enabled
        task_prolog = task_prolog_path(config, site)
        return k8s.core.v1.PodSpecArgs(
            host_network=True,
            # slurmd must still resolve slurmctld's cluster DNS name from the host network.
            dns_policy="ClusterFirstWithHostNet",
            automount_service_account_token=False,
            node_selector=slurmd_node_selector(config, pool),
            tolerations=tolerations_for(slurmd_tolerated_taints(config, pool)),
            termination_grace_period_seconds=120,
            runtime_class_name=pool.runtime_class_name,
            init_containers=[munged_sidecar(image)],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="slurmd",
                    image=image,
                    command=slurmd_command(config, pool, site),
                    env=[
                        k8s.core.v1.EnvVarArgs(
                            name="NODE_NAME",
                            value_from=k8s.core.v1.EnvVarSourceArgs(
                                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")
                            ),
                        )
                    ],
                    ports=[k8s.core.v1.ContainerPortArgs(name="slurmd", container_port=site.slurmd_port)],
                    resources=k8s.core.v1.ResourceRequirementsArgs(requests=resources, limits=resources),
                    startup_probe=tcp_probe(site.slurmd_port, period=5, failures=60),
                    liveness_probe=tcp_probe(site.slurmd_port, period=30),
                    readiness_probe=tcp_probe(site.slurmd_port, period=15),
                    security_context=slurmd_security_context(pool),
                    volume_mounts=[
                        mount("spool", site.slurmd_spool_dir),
                        mount("run", site.run_dir),
                        mount("shared", SHARED_MOUNT),
                        mount(JOB_TMP_VOLUME, site.job_tmp_dir),
                        munge_socket_mount(),
                        *identity_mounts(),
                        home_mount(),
                        *(enroot_mounts(enroot, task_prolog) if enroot else ()),
                        *([mount(HEALTH_VOLUME, site.health_check_dir, read_only=True)] if health_check else []),
                        *([mount(TASK_PROLOG_VOLUME, site.task_prolog_dir, read_only=True)] if task_prolog else []),
                        *([mount(NCCL_VOLUME, NCCL_CONF_PATH, read_only=True, sub_path=NCCL_CONF)] if pool.fabric else []),
                    ],
                )
            ],
            volumes=[
                empty_dir("spool"),
                empty_dir("run"),
                claim_volume("shared", args.shared_claim_name),
                empty_dir(JOB_TMP_VOLUME),
                *munge_volumes(args.munge_secret_name),
                identity_volume(args.identity_config_map_name),
                home_volume(),
                *(enroot_volumes(pool, enroot, enroot_config_map_name) if enroot else ()),
                *([program_volume(HEALTH_VOLUME, health_config_map_name(pool))] if health_check else []),
                *([program_volume(TASK_PROLOG_VOLUME, task_prolog_config_map_name(pool))] if task_prolog else []),
                *([config_map_volume(NCCL_VOLUME, nccl_config_map_name)] if nccl_config_map_name else []),
            ],
        )
