"""The typed stack configuration.

Every top-level key of a stack's ``dualsched:`` config is a field of
:class:`StackConfig`; keys are camelCase as written in ``Pulumi.<stack>.yaml``
(``pulumi config set --path 'pools[0].gpusPerNode' 8``). Field-level rules live
on the fields; rules that relate several fields live in :mod:`config.checks` and
run as part of StackConfig's own validation, so every StackConfig has passed them.
Models are frozen: once validated, a config is never changed downstream.
"""

from __future__ import annotations

import posixpath
import re
from enum import Enum
from typing import Annotated, Any, Mapping, Optional

import hostlist
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from dualsched.config.quantities import parse_quantity
from dualsched.config.types import (
    AbsolutePath,
    Cidr,
    CsiDriverName,
    DnsLabel,
    DnsSubdomain,
    ExtendedResourceName,
    HostName,
    ImageRef,
    KubernetesMinor,
    NcclValue,
    NcclVariable,
    SlurmRelease,
    LabelKey,
    LabelValue,
    HostlistExpression,
    Namespace,
    OwnLabelKey,
    PartitionName,
    SecretKey,
    PosixName,
    Quantity,
    StorageSize,
    RelativePath,
    SlurmTime,
    SqlName,
    SshPublicKey,
    StoragePassword,
    TimeOfDay,
)


MAX_ITEMS = 256
"""Most items in a list (pools, partitions, models, taints): far more than a real stack has, and it
bounds the work and the length of the error message for a list pasted by mistake."""


class Model(BaseModel):
    """Base for every config model: camelCase keys, unknown keys rejected, immutable.

    pydantic's own messages (a model built directly, not through config.loader) quote no input,
    since one may be a secret; the loader's messages quote every value but a secret.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        hide_input_in_errors=True,
    )


# --------------------------------------------------------------------------- enums


class Environment(str, Enum):
    """Which kind of environment a stack is; prod turns on the strict rules."""

    DEV = "dev"
    PROD = "prod"


class PoolMode(str, Enum):
    """How a GPU node pool is shared between the two schedulers."""

    DEDICATED = "dedicated"
    """Every GPU of the node belongs to Slurm; the node carries the Slurm taint."""
    PARTITIONED = "partitioned"
    """Slurm gets ``slurmGpus`` GPUs per node; the rest stay allocatable to Kubernetes."""
    KUBERNETES = "kubernetes"
    """No slurmd: the whole node serves Kubernetes workloads such as inference."""
    TIME_SHARED = "time-shared"
    """Every GPU belongs to Slurm outside the pool's ``inferenceWindow`` and to Kubernetes inside it:
    a daily Slurm reservation keeps jobs off the nodes during the window, and a window taint keeps
    inference pods off them outside it."""


class TaintEffect(str, Enum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class AccessMode(str, Enum):
    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_MANY = "ReadWriteMany"


class DatabaseMode(str, Enum):
    IN_CLUSTER = "in-cluster"
    """A MariaDB StatefulSet with its own claim, in the Slurm namespace (dev)."""
    EXTERNAL = "external"
    """An existing MySQL/MariaDB host; its password is a Pulumi secret or comes from an existing Secret (prod)."""


class StorageType(str, Enum):
    NFS = "nfs"
    LUSTRE = "lustre"
    """Lustre, mounted by HPE's lustre-csi-driver."""
    GPFS = "gpfs"
    """IBM Storage Scale (GPFS), mounted by IBM's CSI driver."""
    BEEGFS = "beegfs"
    """BeeGFS, mounted by the BeeGFS CSI driver."""
    HOST_PATH = "hostPath"
    """A directory on the node itself: single-node test clusters only, nothing is shared between nodes."""


class CgroupVersion(str, Enum):
    """The cgroup hierarchy of the GPU nodes, which decides Slurm's cgroup plugin."""

    V2 = "v2"
    """Unified hierarchy (current distributions): cgroup/v2 without asking systemd for a scope."""
    V1 = "v1"
    """Legacy or hybrid hierarchy (older kernels and distributions): cgroup/v1."""


class InferenceServer(str, Enum):
    VLLM = "vllm"
    TRITON = "triton"


class PodSecurityLevel(str, Enum):
    RESTRICTED = "restricted"
    BASELINE = "baseline"


# ------------------------------------------------------------------ small building blocks


class ResourceList(Model):
    cpu: Optional[Quantity] = None
    """CPU, e.g. '500m' or '4'."""
    memory: Optional[Quantity] = None
    """Memory, e.g. '4Gi'."""


class Resources(Model):
    """Container resource requests and limits."""

    requests: ResourceList = ResourceList(cpu="250m", memory="512Mi")
    """What the scheduler reserves for the container."""
    limits: ResourceList = ResourceList(cpu="1", memory="1Gi")
    """The most the container may use."""


class Taint(Model):
    """A node taint, as in the Node spec."""

    key: OwnLabelKey
    """Taint key, e.g. 'dualsched.io/slurm'."""
    value: LabelValue = "true"
    """Taint value."""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE
    """What happens to pods that do not tolerate it."""


class Toleration(Model):
    """A pod toleration; matches a taint with the same key (and value, when given)."""

    key: LabelKey
    """Taint key to tolerate."""
    value: Optional[LabelValue] = None
    """Taint value; when absent the toleration matches any value (operator Exists)."""
    effect: Optional[TaintEffect] = None
    """Taint effect; when absent every effect is tolerated."""


WITHDRAWN_KEYS = {
    ("NodePool", "jobShmSize"): "withdrawn: each job now has a /dev/shm of its own (job_container.conf), whose pages "
    "count against the job's memory; remove the key",
}
"""(model, key) -> why a key earlier versions took is refused now: the message a stack that still sets it gets."""


NVIDIA_AUTODETECT_SINCE = (24, 11)
"""The first release with gpu/nvidia (AutoDetect=nvidia)."""


class GpuAutoDetect(str, Enum):
    """How slurmd learns a node's GPUs (gres.conf AutoDetect). A plugin slurmd lacks leaves it gpu/generic,
    which gives jobs no device files: ConstrainDevices confines nothing, every job sees every GPU of its node."""

    NVIDIA = "nvidia"
    """Read the NVIDIA driver's /proc/driver/nvidia/gpus (gpu/nvidia, Slurm 24.11 or later). It needs no library,
    so every build has it, SchedMD's Slinky images included."""
    NVML = "nvml"
    """Ask NVML (gpu/nvml): only a Slurm built with NVML has it. Slinky's images are not (BUILD_NVML,
    src/plugins/gpu/Makefile.am)."""
    OFF = "off"
    """Not detected: a node's GPUs are /dev/nvidia0..N-1 of its slurmd container (runtimes that number a container's GPUs from 0)."""


class Images(Model):
    """Container images. Defaults are pinned, real release tags: Slurm's are SchedMD's Slinky images
    of Slurm 25.11.6 (SlinkyProject/containers schedmd/slurm/25.11/ubuntu24.04), as slurm.release says;
    a Slurm image whose tag names a release must name slurm.release's."""

    slurmctld: ImageRef = "ghcr.io/slinkyproject/slurmctld:25.11.6-ubuntu24.04"
    """slurmctld image (SchedMD's Slinky image)."""
    slurmd: ImageRef = "ghcr.io/slinkyproject/slurmd:25.11.6-ubuntu24.04"
    """slurmd image, also used for munged sidecars and the sbatch client."""
    slurmd_pyxis: ImageRef = "ghcr.io/slinkyproject/slurmd-pyxis:25.11.6-ubuntu24.04"
    """slurmd image with Pyxis and Enroot (SchedMD's slurmd-pyxis): every pool's slurmd runs it once any pool has containers."""
    slurmdbd: ImageRef = "ghcr.io/slinkyproject/slurmdbd:25.11.6-ubuntu24.04"
    """slurmdbd image."""
    mariadb: ImageRef = "docker.io/library/mariadb:11.4.8"
    """MariaDB image for the in-cluster accounting database."""
    vllm: ImageRef = "docker.io/vllm/vllm-openai:v0.11.0"
    """vLLM OpenAI-compatible server image."""
    triton: ImageRef = "nvcr.io/nvidia/tritonserver:25.09-py3"
    """NVIDIA Triton Inference Server image."""
    slurmrestd: ImageRef = "ghcr.io/slinkyproject/slurmrestd:25.11.6-ubuntu24.04"
    """slurmrestd image (Slurm's REST API, JWT-authenticated)."""
    python: ImageRef = "docker.io/library/python:3.13.9-slim-bookworm"
    """Python image for the token minter, the node keeper and the Jobs' token sidecar (standard library only)."""
    login: ImageRef = "ghcr.io/slinkyproject/login:25.11.6-ubuntu24.04"
    """Login pod image: OpenSSH's sshd and the Slurm client commands (munged runs beside it from the slurmd image)."""
    login_pyxis: ImageRef = "ghcr.io/slinkyproject/login-pyxis:25.11.6-ubuntu24.04"
    """Login pod image with Pyxis (SchedMD's login-pyxis): the login pods run it once any pool has containers, since
    srun and sbatch load plugstack.conf's required Pyxis and stop without it."""


class Placement(Model):
    """The one label key and the one taint key every selector and toleration reads."""

    pool_label: OwnLabelKey = "dualsched.io/pool"
    """Node label whose value is the name of the pool a node belongs to."""
    slurm_taint_key: OwnLabelKey = "dualsched.io/slurm"
    """Taint key that marks nodes whose GPUs belong to Slurm."""
    window_taint_key: OwnLabelKey = "dualsched.io/inference-window"
    """NoExecute taint on time-shared nodes while their inference window is closed."""


# ----------------------------------------------------------------------------- pools

MAX_NODES = 5000
"""Kubernetes supports clusters of at most 5000 nodes ("Considerations for large clusters")."""


class InferenceWindow(Model):
    """The daily hours, in UTC, when a time-shared pool's GPUs belong to Kubernetes."""

    start: TimeOfDay
    """When the window opens each day, 'HH:MM' UTC."""
    duration_minutes: int = Field(ge=1, le=1439)
    """How long it stays open (a window of a whole day is a kubernetes pool)."""

    @property
    def start_minute(self) -> int:
        """Minutes after midnight UTC."""
        hours, minutes = self.start.split(":")
        return int(hours) * 60 + int(minutes)


GPU_RESOURCE = "nvidia.com/gpu"
"""The NVIDIA device plugin's resource: a node's GPUs, as pods ask for them."""
MUNGED_CPUS, MUNGED_MEMORY_MB = 0.05, 64
"""The munged sidecar's requests (and limits) in every slurmd pod, counted where the pod must fit its node."""


class NodeAllocatable(Model):
    """What each node of a pool offers to pods: the kubelet's Allocatable (capacity minus system reserves),
    as `kubectl get node <name> -o jsonpath='{.status.allocatable}'` shows it (round CPUs and MiB down)."""

    cpus: int = Field(ge=1, le=4096)
    """Allocatable CPUs per node."""
    memory_mb: int = Field(ge=1, le=2**31)
    """Allocatable memory per node, in MiB."""


class DaemonSetRequests(Model):
    """What the node's other DaemonSets request together (CNI, kube-proxy, the GPU device plugin, exporters)."""

    cpus: float = Field(0.5, ge=0, le=4096)
    """CPUs (0.5 is 500m)."""
    memory_mb: int = Field(1024, ge=0, le=2**31)
    """Memory, in MiB."""


class ContainerRuntime(str, Enum):
    """What runs a Slurm job step in a container image."""

    PYXIS = "pyxis"
    """NVIDIA Pyxis, a SPANK plugin of slurmd and srun (`srun --container-image`), importing and starting images with Enroot."""


class PoolContainers(Model):
    """Containers in Slurm jobs on a pool's nodes. Enroot keeps its files in directories of the node
    itself (hostPath), named per user: image layers and unpacked containers outlive the slurmd pod."""

    runtime: ContainerRuntime = ContainerRuntime.PYXIS
    """The container runtime Slurm jobs use."""
    runtime_path: AbsolutePath = "/run/enroot"
    """Enroot's runtime working directory (ENROOT_RUNTIME_PATH, a directory per user under it), an emptyDir of the slurmd pod."""
    cache_path: AbsolutePath = "/var/lib/enroot/cache"
    """Enroot's image layer cache on the node (ENROOT_CACHE_PATH, a directory per group under it): node-local disk, not the shared file system."""
    data_path: AbsolutePath = "/var/lib/enroot/data"
    """Where Enroot unpacks containers on the node (ENROOT_DATA_PATH, a directory per user under it): node-local disk."""

    @property
    def paths(self) -> dict[str, str]:
        """Config field name -> node directory."""
        return {"runtimePath": self.runtime_path, "cachePath": self.cache_path, "dataPath": self.data_path}


class PoolFabric(Model):
    """The nodes' RDMA fabric (InfiniBand or RoCE) for jobs that span nodes (NCCL, MPI): slurmd's pod holds
    its devices, which its jobs share, and jobs may lock all the memory RDMA registers."""

    rdma_resource: ExtendedResourceName
    """The RDMA device plugin's resource, e.g. 'rdma/rdma_shared_device_a' (the RDMA shared device plugin,
    as NVIDIA's Network Operator deploys it) or 'nvidia.com/hostdev' (its SR-IOV host devices)."""
    rdma_count: int = Field(1, ge=1, le=64)
    """How many of that resource slurmd's pod holds: 1 of a shared device, one per NIC of host devices."""
    nccl: dict[NcclVariable, NcclValue] = Field(default_factory=dict, max_length=MAX_ITEMS)
    """NCCL settings for every job on the pool (/etc/nccl.conf in slurmd's container), e.g.
    NCCL_IB_HCA: mlx5 or NCCL_SOCKET_IFNAME: eth0; a job's own environment still wins."""


class NodePool(Model):
    """A set of existing GPU nodes with the same hardware and the same sharing mode."""

    name: DnsLabel
    """Pool name: the value of the pool label on its nodes and the Slurm NodeSet/Feature."""
    nodes: HostlistExpression
    """Node names as a Slurm hostlist expression, e.g. 'gpu-[001-064]'; they are the Kubernetes node names. With
    joinByLabel, the names a node may have to join the pool (a bound), not a list of nodes that must exist."""
    join_by_label: bool = False
    """A Kubernetes node named within nodes that carries the pool label (placement.poolLabel=<name>, from a node
    group's template, an autoscaler or `kubectl label`) becomes a Slurm node of the pool by itself, without a
    `pulumi up`: its slurmd registers as a dynamic node (slurmd -Z) with the pool's CPUs, memory, GPUs and feature,
    and the partitions take it by NodeSet. A node that loses the label or leaves Kubernetes is drained, then deleted
    from Slurm once no job runs on it (docs/node-pools.md)."""
    mode: PoolMode = PoolMode.DEDICATED
    """How the pool's GPUs are shared between Slurm and Kubernetes."""
    # Bounds: 64 GPUs and 4096 CPUs are above any node built today; 2**31 MiB (2 PiB) is far above any
    # node's memory and inside Slurm's RealMemory (uint64 MB). They catch a typo, not a real node.
    gpus_per_node: int = Field(8, ge=0, le=64)
    """Physical GPUs per node (the node's nvidia.com/gpu capacity)."""
    slurm_gpus: Optional[int] = Field(None, ge=0, le=64)
    """GPUs per node given to Slurm (GRES gpu count). Defaults to all in dedicated mode; required in partitioned mode."""
    gpu_type: Optional[DnsLabel] = None
    """GRES type, e.g. 'a100' or 'h100' (Gres=gpu:<type>:<n>)."""
    cpus: int = Field(64, ge=1, le=4096)
    """CPUs per node Slurm may allocate (NodeName CPUs=)."""
    real_memory_mb: int = Field(256000, ge=1, le=2**31)
    """Memory per node given to Slurm, in MiB (NodeName RealMemory=): the slurmd pod's memory request and limit."""
    mem_spec_limit_mb: int = Field(1024, ge=0, le=2**31)
    """Part of realMemoryMb kept for slurmd itself, in MiB (MemSpecLimit=); jobs get the rest."""
    taints: Optional[tuple[Taint, ...]] = Field(None, max_length=MAX_ITEMS)
    """Node taints. Defaults to the Slurm taint for dedicated pools and none otherwise."""
    allocatable: Optional[NodeAllocatable] = None
    """Each node's allocatable CPUs and memory. Required where slurmd runs: its Guaranteed pod (cpus,
    realMemoryMb), its munged sidecar and the node's other DaemonSets must fit in it; in partitioned and
    time-shared mode the rest is the Kubernetes share."""
    other_daemon_sets: DaemonSetRequests = DaemonSetRequests()
    """What the node's other DaemonSets request, which must fit beside slurmd: a pod that does not fit is
    never scheduled, and the node never joins Slurm."""
    inference_window: Optional[InferenceWindow] = None
    """Required in time-shared mode: the daily window when Kubernetes owns the pool's GPUs."""
    containers: Optional[PoolContainers] = None
    """Run Slurm job steps in container images on this pool (`srun --container-image`); see docs/containers.md."""
    fabric: Optional[PoolFabric] = None
    """The RDMA fabric between the pool's nodes, for multi-node jobs (docs/fabric.md)."""
    runtime_class_name: Optional[DnsSubdomain] = None
    """RuntimeClass of slurmd's pods, e.g. 'nvidia' where the GPU runtime is not containerd's default (no CDI)."""

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, value: str) -> str:
        try:
            names = hostlist.expand_hostlist(value)
        except hostlist.BadHostlist as error:
            raise ValueError(f"is not a valid hostlist expression: {error}") from None
        if not names:
            raise ValueError("must name at least one node")
        if len(names) > MAX_NODES:
            raise ValueError(f"names {len(names)} nodes; a Kubernetes cluster has at most {MAX_NODES}")
        return value

    @property
    def node_names(self) -> list[str]:
        return hostlist.expand_hostlist(self.nodes)

    @property
    def runs_slurmd(self) -> bool:
        return self.mode is not PoolMode.KUBERNETES

    @property
    def serves_inference(self) -> bool:
        return self.mode is not PoolMode.DEDICATED

    @property
    def slurm_gpu_count(self) -> int:
        """GRES gpu count per node, resolving the dedicated-mode default."""
        if not self.runs_slurmd:
            return 0
        if self.slurm_gpus is None:
            return self.gpus_per_node
        return self.slurm_gpus

    @property
    def kubernetes_gpu_count(self) -> int:
        """GPUs per node Kubernetes workloads may use (inside the window, for a time-shared pool)."""
        if self.mode is PoolMode.TIME_SHARED:
            return self.gpus_per_node
        return max(0, self.gpus_per_node - self.slurm_gpu_count)


# ----------------------------------------------------------------------------- slurm


class StateStorage(Model):
    """The claim holding slurmctld's StateSaveLocation."""

    size: StorageSize = "10Gi"
    """Requested size."""
    storage_class: Optional[DnsSubdomain] = None
    """StorageClass; the cluster default when absent."""
    access_mode: AccessMode = AccessMode.READ_WRITE_ONCE
    """ReadWriteMany is required when the backup controller shares the state."""


class Controller(Model):
    """slurmctld."""

    ha: bool = False
    """Run a backup slurmctld (second SlurmctldHost) sharing the state claim."""
    resources: Resources = Resources(
        requests=ResourceList(cpu="1", memory="2Gi"), limits=ResourceList(cpu="4", memory="8Gi")
    )
    """slurmctld container resources."""
    state_storage: StateStorage = StateStorage()
    """Persistent state (jobs, reservations, node state) that must survive restarts."""
    slurmctld_timeout: int = Field(120, ge=3, le=65533)
    """Seconds the backup waits for an unresponsive primary before it takes over (SlurmctldTimeout; Slurm's
    default 120). Lower it only where a slow primary would rather lose control than stall jobs."""


class SlurmdRollout(Model):
    """How a changed slurmd template reaches the nodes: the rollout controller drains a node in Slurm,
    waits for its jobs, replaces its slurmd pod and resumes it (docs/upgrades.md)."""

    max_unavailable: int = Field(1, ge=1, le=MAX_NODES)
    """Nodes drained for the rollout at once, across every pool (a node drained by anyone else never counts)."""
    drain_deadline_minutes: int = Field(24 * 60, ge=1, le=366 * 24 * 60)
    """How long a drained node's jobs should take to end. Past it the controller logs the node and goes on
    waiting: it never kills or requeues a job, nor replaces a node with jobs on it."""


class Partition(Model):
    """A Slurm partition over one or more pools."""

    name: PartitionName
    """PartitionName."""
    pools: tuple[DnsLabel, ...] = Field(min_length=1, max_length=MAX_ITEMS)
    """Pools whose nodes form the partition (via NodeSet)."""
    default: bool = False
    """Default=YES: jobs without -p land here."""
    max_time: SlurmTime = "INFINITE"
    """MaxTime for jobs in the partition."""
    priority_tier: int = Field(1, ge=0, le=65533)  # Slurm's uint16; 65534 and 65535 mean "not set"
    """PriorityTier: higher tiers are scheduled first."""


class SecretKeyRef(Model):
    """A key of an existing Kubernetes Secret."""

    name: DnsLabel
    """Secret name."""
    key: SecretKey = "password"
    """Key in the Secret."""


class ExternalDatabase(Model):
    """An existing MySQL/MariaDB for slurmdbd."""

    host: Optional[HostName] = None
    """Database host name."""
    port: int = Field(3306, ge=1, le=65535)
    """Database port."""
    user: SqlName = "slurm"
    """StorageUser."""
    name: SqlName = "slurm_acct_db"
    """StorageLoc (database name)."""
    password: Optional[StoragePassword] = None
    """The password, as a Pulumi secret: `pulumi config set --secret --path
    'dualsched:slurm.accounting.database.external.password'`. dualsched keeps it in a Secret of its own
    and shows it nowhere else. Give this or passwordSecret."""
    password_secret: Optional[SecretKeyRef] = None
    """Existing Secret in the Slurm namespace holding the password. Give this or password."""


class InClusterDatabase(Model):
    """The MariaDB StatefulSet run for slurmdbd."""

    size: StorageSize = "20Gi"
    """Size of the database claim."""
    storage_class: Optional[DnsSubdomain] = None
    """StorageClass; the cluster default when absent."""
    resources: Resources = Resources(
        requests=ResourceList(cpu="500m", memory="1Gi"), limits=ResourceList(cpu="2", memory="4Gi")
    )
    """MariaDB container resources."""


class Database(Model):
    mode: DatabaseMode = DatabaseMode.IN_CLUSTER
    """Where the accounting database runs."""
    in_cluster: InClusterDatabase = InClusterDatabase()
    """Settings for mode in-cluster."""
    external: Optional[ExternalDatabase] = None
    """Settings for mode external."""


class Accounting(Model):
    """slurmdbd and its database."""

    enabled: bool = True
    """Run slurmdbd and record jobs (AccountingStorageType=accounting_storage/slurmdbd)."""
    database: Optional[Database] = None
    """The database; required when accounting is enabled."""
    resources: Resources = Resources()
    """slurmdbd container resources."""


SLURM_UID = 401
"""SlurmUser's uid (SchedMD's images use it too); files on the state claim belong to it."""
NOBODY_UID = 65534
SYSTEM_ACCOUNTS = {"root": 0, "slurm": SLURM_UID, "nobody": NOBODY_UID}
"""Accounts every Slurm pod's passwd file holds besides slurm.users (components/identity.py)."""


class SlurmUser(Model):
    """A user jobs run as, known to every Slurm pod through the passwd and group files dualsched renders."""

    name: PosixName
    """User name: the job owner in squeue and sacct."""
    # Below 1000 are system ids (useradd's UID_MIN); 2**31 - 2 keeps the id positive for tools
    # that read it as a signed int, and away from (uid_t)-1.
    uid: int = Field(ge=1000, le=2**31 - 2)
    """User id; a job's processes and the files it writes on the shared file system carry it."""
    gid: Optional[int] = Field(None, ge=1000, le=2**31 - 2)
    """Primary group id (a group named like the user). Defaults to the uid."""
    default_account: Optional[PosixName] = None
    """With slurm.accounts: the account the user's jobs are charged to without --account (DefaultAccount).
    One of the accounts listing the user; defaults to the first of them."""

    @property
    def group_id(self) -> int:
        return self.uid if self.gid is None else self.gid


# ------------------------------------------------------------------ QOS, preemption and accounts


class PreemptType(str, Enum):
    """What decides which jobs may preempt which (slurm.conf PreemptType)."""

    OFF = "off"
    """preempt/none: no job preempts another."""
    QOS = "qos"
    """preempt/qos: a job whose QOS lists another QOS in its preempt list preempts that QOS's jobs."""
    PARTITION_PRIO = "partition_prio"
    """preempt/partition_prio: jobs of a higher priorityTier partition preempt jobs of lower tiers on the same nodes."""


class PreemptMode(str, Enum):
    """What happens to a preempted job (slurm.conf PreemptMode)."""

    REQUEUE = "requeue"
    """The job is requeued (a batch job that may be requeued, see preemption.requeueByDefault), else cancelled."""
    CANCEL = "cancel"
    """The job is cancelled."""
    SUSPEND = "suspend"
    """Refused by the checks: a suspended job keeps its GPUs (slurm.conf(5): "Suspended jobs will not release GRES")."""


class QosPreemptMode(str, Enum):
    """A QOS's own PreemptMode for its jobs when they are preempted (sacctmgr: Cluster, Cancel, Requeue)."""

    CLUSTER = "cluster"
    CANCEL = "cancel"
    REQUEUE = "requeue"


class Preemption(Model):
    """Job preemption: who may take a running job's resources, and what becomes of the job."""

    type: PreemptType = PreemptType.OFF
    """off, qos (a QOS's preempt list) or partition_prio (partitions' priorityTier)."""
    mode: PreemptMode = PreemptMode.REQUEUE
    """PreemptMode for the whole cluster: requeue or cancel (a QOS may set its own)."""
    exempt_time: Optional[SlurmTime] = None
    """PreemptExemptTime: how long a job runs before it may be preempted (a QOS may set its own)."""
    requeue_by_default: bool = True
    """JobRequeue=1: batch jobs may be requeued unless submitted with --no-requeue. With false only jobs
    submitted with --requeue are; the others are cancelled when preempted in mode requeue."""


class TresLimit(Model):
    """A limit on trackable resources (TRES); an absent resource is unlimited."""

    gpus: Optional[int] = Field(None, ge=0, le=2**31 - 1)
    """GPUs (gres/gpu)."""
    cpus: Optional[int] = Field(None, ge=0, le=2**31 - 1)
    """CPUs (cpu)."""
    nodes: Optional[int] = Field(None, ge=0, le=2**31 - 1)
    """Nodes (node)."""


class Qos(Model):
    """A Slurm QOS kept in accounting by dualsched (sacctmgr add/modify qos)."""

    name: PosixName
    """QOS name (jobs ask for it with --qos)."""
    priority: int = Field(0, ge=0, le=2**31 - 1)
    """Priority: added to a job's priority through PriorityWeightQOS."""
    preempt: tuple[PosixName, ...] = Field((), max_length=MAX_ITEMS)
    """QOS whose jobs this QOS's jobs preempt (preemption.type qos)."""
    preempt_mode: QosPreemptMode = QosPreemptMode.CLUSTER
    """What becomes of this QOS's jobs when preempted: cluster (preemption.mode), cancel or requeue."""
    preempt_exempt_time: Optional[SlurmTime] = None
    """How long this QOS's jobs run before they may be preempted; overrides preemption.exemptTime."""
    usage_factor: float = Field(1.0, ge=0, le=1000)
    """UsageFactor: how much of a job's use counts toward fair-share (0.5: half)."""
    max_wall: Optional[SlurmTime] = None
    """MaxWall: the longest time limit a job of this QOS may have."""
    max_tres_per_user: TresLimit = TresLimit()
    """MaxTRESPerUser: what one user's running jobs of this QOS may hold at once."""
    grp_tres: TresLimit = TresLimit()
    """GrpTRES: what all running jobs of this QOS may hold at once."""
    max_jobs_per_user: Optional[int] = Field(None, ge=0, le=2**31 - 1)
    """MaxJobsPerUser: running jobs per user."""


class SlurmAccount(Model):
    """A Slurm account (bank) kept in accounting by dualsched, with its users' associations."""

    name: PosixName
    """Account name (jobs give it with --account)."""
    parent: PosixName = "root"
    """Parent account: root or another of slurm.accounts, listed before this one."""
    fairshare: int = Field(1, ge=1, le=2**31 - 1)
    """Fairshare: the account's shares among its siblings."""
    qos: tuple[PosixName, ...] = Field(("normal",), min_length=1, max_length=MAX_ITEMS)
    """QOS the account's jobs may use: of slurm.qos, or normal (Slurm's own)."""
    default_qos: Optional[PosixName] = None
    """QOS of a job that gives no --qos; one of qos, the first of them when absent."""
    users: tuple[PosixName, ...] = Field((), max_length=4096)
    """Users (of slurm.users) who may charge jobs to the account."""


class SlurmMetrics(Model):
    """Slurm's state as Prometheus metrics: an exporter in slurmctld's pod, a Service and, with the
    Prometheus Operator, a ServiceMonitor (docs/metrics.md)."""

    enabled: bool = False
    """Run the exporter (port 9341, path /metrics) beside slurmctld and create its Service."""
    scrape_namespaces: tuple[DnsLabel, ...] = Field(("monitoring",), min_length=1, max_length=MAX_ITEMS)
    """Namespaces whose pods may scrape the exporter (the Slurm namespace's NetworkPolicy admits them)."""
    interval_seconds: int = Field(30, ge=5, le=3600)
    """How often the exporter reads Slurm's state, and the ServiceMonitor's scrape interval."""
    service_monitor: bool = False
    """Create a monitoring.coreos.com/v1 ServiceMonitor. Only where the Prometheus Operator's CRDs are
    installed: the API server refuses the object otherwise, and a preview cannot tell."""
    service_monitor_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_ITEMS)
    """Labels of the ServiceMonitor, for the Prometheus resource's serviceMonitorSelector (for
    kube-prometheus-stack: ``release: <its release name>``)."""


class LoginServiceType(str, Enum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class LoginUser(Model):
    """A user of slurm.users who may log in to the login pods, and the public keys that let them."""

    name: PosixName
    """One of slurm.users: the login shell runs as that user's uid, as its jobs do."""
    authorized_keys: tuple[SshPublicKey, ...] = Field(min_length=1, max_length=64)
    """OpenSSH public key lines (the contents of ``id_ed25519.pub``). Public keys are not secret: they
    stay in the stack config."""


class Login(Model):
    """Login pods users reach with ssh: sshd with the Slurm client commands, /shared and the users of
    slurm.users, keys only (no passwords, no root)."""

    enabled: bool = False
    """Run the login Deployment, its Service and its NetworkPolicy."""
    replicas: int = Field(1, ge=1, le=16)
    """Login pods; they share one host key, so any of them answers as the same host."""
    service_type: LoginServiceType = LoginServiceType.CLUSTER_IP
    """How users reach sshd: ClusterIP (from inside the cluster or a port-forward), NodePort or LoadBalancer."""
    port: int = Field(22, ge=1, le=65535)
    """The Service's ssh port (the pods listen on 2222)."""
    client_cidrs: tuple[Cidr, ...] = Field(("0.0.0.0/0",), min_length=1, max_length=MAX_ITEMS)
    """Addresses allowed to reach sshd (the NetworkPolicy's ingress); add '::/0' on dual-stack clusters."""
    users: tuple[LoginUser, ...] = Field((), max_length=4096)
    """Who may log in, with their keys. Users of slurm.users not listed here cannot."""
    resources: Resources = Resources(
        requests=ResourceList(cpu="100m", memory="256Mi"), limits=ResourceList(cpu="2", memory="4Gi")
    )
    """The login container's requests and limits: every user's shell and client commands share them."""


class HealthCheckNodeState(str, Enum):
    """slurm.conf HealthCheckNodeState values (Slurm 22.05: src/common/read_config.c _health_node_state)."""

    ANY = "any"
    ALLOC = "alloc"
    MIXED = "mixed"
    IDLE = "idle"
    CYCLE = "cycle"


class HealthChecks(Model):
    """What node_health.sh checks on every slurmd node; each failure drains the node with its name."""

    gpu_devices: bool = True
    """The node holds at least as many GPU device files (/dev/nvidiaN) as gres.conf gives it GPUs."""
    shared_mount: bool = True
    """/shared is a mount point, read-write, and root can create a file in it within 10 seconds."""
    munge: bool = True
    """munged on the node encodes and decodes a credential (slurmd authenticates every message with it)."""
    nvidia_smi: bool = True
    """When nvidia-smi is on the node: `nvidia-smi -L` succeeds within 20 seconds. Skipped where it is absent."""


class HealthCheck(Model):
    """Slurm's node health check (HealthCheckProgram): a failing node is drained with reason
    "dualsched:health: <what failed>" (running jobs finish, no new ones start) and resumed once every
    check passes again. Drains with any other reason are never touched."""

    enabled: bool = False
    """Run components/programs/node_health.sh as slurm.conf's HealthCheckProgram on every slurmd node."""
    interval: int = Field(300, ge=10, le=86400)
    """HealthCheckInterval in seconds (slurmd also runs the program once when it starts, before it registers)."""
    node_state: tuple[HealthCheckNodeState, ...] = Field((HealthCheckNodeState.ANY,), min_length=1, max_length=5)
    """HealthCheckNodeState: the node states the check runs in (any, alloc, mixed, idle; cycle spreads the
    nodes over the interval instead of all at once)."""
    checks: HealthChecks = HealthChecks()
    """Which checks run."""
    drain_cordoned: bool = False
    """Drain the Slurm node of a cordoned Kubernetes node (spec.unschedulable) with reason "dualsched:cordon",
    and resume it once uncordoned: slurmctld's pod reads the pool nodes (get, by name) each round."""


class Slurm(Model):
    """The Slurm cluster."""

    cluster_name: DnsLabel = ...
    """ClusterName in slurm.conf and in accounting."""
    namespace: Namespace = "slurm"
    """Kubernetes namespace of the Slurm daemons."""
    controller: Controller = Controller()
    """slurmctld settings."""
    partitions: tuple[Partition, ...] = Field(min_length=1, max_length=MAX_ITEMS)
    """Partitions; exactly one should be the default."""
    accounting: Accounting = Accounting()
    """Accounting settings."""
    resource_quota: Optional[ResourceList] = None
    """Optional ResourceQuota (requests) for the Slurm namespace."""
    users: tuple[SlurmUser, ...] = Field((), max_length=4096)  # their passwd and group lines fit one ConfigMap (1 MiB)
    """Users jobs run as (root never may: DisableRootJobs). Every Slurm pod resolves them the same way."""
    release: SlurmRelease = "25.11"
    """Slurm release the images run (the default images': 25.11). slurm.conf leaves out what it
    no longer accepts, e.g. SlurmctldParameters=cloud_reg_addrs, the default since 23.11."""
    cgroup_version: CgroupVersion = CgroupVersion.V2
    """cgroup hierarchy of the GPU nodes: v2, or v1 for legacy and hybrid hosts."""
    gpu_auto_detect: Optional[GpuAutoDetect] = None
    """gres.conf AutoDetect: nvidia (Slurm 24.11 or later), nvml (a Slurm built with NVML), or off (GPUs
    listed as /dev/nvidia0..N-1). Unset: nvidia from 24.11, nvml before."""
    preemption: Preemption = Preemption()
    """Job preemption (PreemptType, PreemptMode, PreemptExemptTime, JobRequeue)."""
    slurmd_rollout: SlurmdRollout = SlurmdRollout()
    """Rolling replacement of slurmd pods whose DaemonSet template changed, without killing a job."""
    qos: tuple[Qos, ...] = Field((), max_length=MAX_ITEMS)
    """QOS dualsched keeps in accounting: created, changed to match, deleted when dropped (only those it created)."""
    accounts: tuple[SlurmAccount, ...] = Field((), max_length=4096)
    """Accounts and their users' associations dualsched keeps in accounting. With any, slurm.conf enforces
    associations, limits and QOS: a user in no account runs no job."""
    metrics: SlurmMetrics = SlurmMetrics()
    """Slurm metrics for Prometheus."""
    login: Login = Login()
    """Login pods reached with ssh (off by default)."""
    health_check: HealthCheck = HealthCheck()
    """Node health check: drains a failing node and resumes it when healthy (docs/health.md)."""

    @property
    def release_version(self) -> tuple[int, int]:
        """The release as numbers, to compare: (25, 11)."""
        year, month = self.release.split(".")
        return int(year), int(month)

    @property
    def gpu_detection(self) -> GpuAutoDetect:
        """gpu_auto_detect, or the release's default: gpu/nvidia where the release has it."""
        if self.gpu_auto_detect is not None:
            return self.gpu_auto_detect
        return GpuAutoDetect.NVIDIA if self.release_version >= NVIDIA_AUTODETECT_SINCE else GpuAutoDetect.NVML


# --------------------------------------------------------------------------- storage


class NfsStorage(Model):
    server: Optional[HostName] = None
    """NFS server host or address."""
    path: Optional[AbsolutePath] = None
    """Exported path."""


# A Lustre NID, '<address>@<network>': an IPv4 address or host name (tcp, o2ib) or a number (gni, kfi),
# then the network: its type and optional number ('tcp', 'o2ib', 'o2ib1'). A mount source separates NIDs
# with ',', MGS nodes with ':' and the file system with ':/', so no NID may hold any of them.
_LUSTRE_NID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?@[a-z][a-z0-9]{0,15}", re.ASCII)
# lustre_is_fsname_valid() with LUSTRE_MAXFSNAME (lustre/include/uapi/linux/lustre/lustre_param.h).
_LUSTRE_FS_NAME = re.compile(r"[A-Za-z0-9_-]{1,8}", re.ASCII)
# One option: the driver joins them with ',' for mount(8).
_MOUNT_OPTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_=.:/+-]{0,254}", re.ASCII)
# As the Storage Scale REST API reports a file system's uuid: two 32-bit words in hex.
_GPFS_UUID = re.compile(r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8}", re.ASCII)


def _refuse_unless(pattern: re.Pattern[str], message: str, max_length: int) -> AfterValidator:
    def check(value: str) -> str:
        if len(value) > max_length or not pattern.fullmatch(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


def _not_read_only_switch(value: str) -> str:
    if value in ("ro", "rw"):
        raise ValueError("read-only is set per consumer (Slurm's volume is read-write, inference's read-only)")
    return value


def _without_port_or_ipv6(value: str) -> str:
    if ":" in value:
        raise ValueError("must be a host name or an IPv4 address, without a port: it becomes the host of a beegfs:// URL")
    return value


LustreNid = Annotated[
    str,
    _refuse_unless(_LUSTRE_NID, "must be one Lustre NID '<address>@<network>' such as '10.0.0.5@tcp' or "
                   "'10.20.0.10@o2ib1' (list a node's NIDs as separate items)", 270),
]
LustreFsName = Annotated[
    str, _refuse_unless(_LUSTRE_FS_NAME, "must be a Lustre file system name: 1 to 8 letters, digits, '_' or '-'", 8)
]
LustreMountOption = Annotated[
    str,
    _refuse_unless(_MOUNT_OPTION, "must be one mount option such as 'flock' or 'network=o2ib1', without ',' or spaces", 255),
    AfterValidator(_not_read_only_switch),
]
GpfsUuid = Annotated[
    str, _refuse_unless(_GPFS_UUID, "must be the file system's UUID, two 8-digit hex words such as '09762E69:5D36FE8D'", 17)
]
BeegfsHost = Annotated[HostName, AfterValidator(_without_port_or_ipv6)]


def path_under(root: str, directory: Optional[str]) -> str:
    """``directory`` (a RelativePath: no '..') under the absolute ``root``; ``root`` itself without one."""
    return posixpath.join(root, directory) if directory else root


class LustreMgsNode(Model):
    """A node the Lustre management service (MGS) runs on."""

    nids: tuple[LustreNid, ...] = Field(min_length=1, max_length=16)
    """The node's NIDs, one per network it is reached on, e.g. [10.20.0.10@o2ib]."""


class LustreStorage(Model):
    """Lustre, mounted by HPE's lustre-csi-driver: its NodePublishVolume mounts the volumeHandle as the
    mount source, with the PV's fsType and mountOptions; it reads no volumeAttributes."""

    driver: CsiDriverName = "lustre-csi.hpe.com"
    """CSI driver name (the one HPE's driver registers unless started with --drivername)."""
    mgs_nodes: Optional[tuple[LustreMgsNode, ...]] = Field(None, min_length=1, max_length=8)
    """Nodes the MGS runs on, tried in order: one, or the two of an HA failover pair."""
    fs_name: Optional[LustreFsName] = None
    """File system name (mkfs.lustre --fsname)."""
    subdirectory: Optional[RelativePath] = None
    """Directory in the file system to share instead of its root (a Lustre subdirectory mount); it must exist."""
    mount_options: tuple[LustreMountOption, ...] = Field((), max_length=32)
    """Lustre client mount options (the PVs' mountOptions), e.g. [flock]."""

    @property
    def volume_handle(self) -> str:
        """The mount source as mount.lustre(8) takes it: '<mgsnode>[:<mgsnode>]:/<fsname>[/<subdir>]',
        each mgsnode '<nid>[,<nid>]'."""
        return self.volume_handle_of(None)

    def volume_handle_of(self, directory: Optional[str]) -> str:
        """The handle of ``directory`` of the shared one (None: the shared one): a subdirectory mount
        of it, which reaches nothing above it."""
        mgs = ":".join(",".join(node.nids) for node in self.mgs_nodes)
        return f"{mgs}:/" + "/".join(part for part in (self.fs_name, self.subdirectory, directory) if part)


class GpfsStorage(Model):
    """IBM Storage Scale (GPFS), mounted by IBM's CSI driver: a directory of a file system the nodes
    already mount, bind-mounted into the pods."""

    driver: CsiDriverName = "spectrumscale.csi.ibm.com"
    """CSI driver name."""
    cluster_id: Optional[int] = Field(None, ge=1, le=2**64 - 1)
    """ID of the Storage Scale cluster that owns the file system (clusterSummary.clusterId of the REST
    API's /scalemgmt/v2/cluster)."""
    filesystem_uuid: Optional[GpfsUuid] = None
    """The file system's UUID, e.g. 09762E69:5D36FE8D (uuid of /scalemgmt/v2/filesystems/<name>)."""
    path: Optional[AbsolutePath] = None
    """The directory as the nodes see it, under the file system's mount point (e.g. /ibm/fs1/dualsched)."""

    @field_validator("path")
    @classmethod
    def _inside_a_file_system(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.strip("/"):
            raise ValueError("must be a directory under the file system's mount point, not '/'")
        return value

    @property
    def volume_handle(self) -> str:
        """The static volume handle of CSI 2.5.0 and later, '<storage class type>;<volume type>;<cluster id>;
        <file system uuid>;<consistency group>;<fileset>;<path>': classic (0), directory-based (0), with no
        consistency group or fileset. AbsolutePath holds no ';'."""
        return self.volume_handle_of(None)

    def volume_handle_of(self, directory: Optional[str]) -> str:
        """The handle of ``directory`` of the shared one (None: the shared one): the driver bind-mounts
        the handle's path, nothing above it."""
        return f"0;0;{self.cluster_id};{self.filesystem_uuid};;;{path_under(self.path, directory)}"


class BeegfsStorage(Model):
    """BeeGFS, mounted by the BeeGFS CSI driver: a directory already on the file system."""

    driver: CsiDriverName = "beegfs.csi.netapp.com"
    """CSI driver name."""
    sys_mgmtd_host: Optional[BeegfsHost] = None
    """The management service's host, written exactly as this file system's entry in the driver's
    config and connAuth files names it (the driver matches the text)."""
    path: Optional[AbsolutePath] = None
    """Directory within the file system ('/' for all of it); it must exist: the driver creates none."""

    @property
    def volume_handle(self) -> str:
        """'beegfs://<sysMgmtdHost><path>', the URL the driver parses (AbsolutePath needs no escaping)."""
        return self.volume_handle_of(None)

    def volume_handle_of(self, directory: Optional[str]) -> str:
        """The handle of ``directory`` of the shared one (None: the shared one): the driver bind-mounts
        the URL's directory, nothing above it."""
        return f"beegfs://{self.sys_mgmtd_host}{path_under(self.path, directory)}"


class HostPathStorage(Model):
    path: Optional[AbsolutePath] = None
    """Directory on the node; created when missing."""


class SharedStorage(Model):
    """The file system both schedulers share: training writes checkpoints, serving reads them."""

    type: StorageType = StorageType.NFS
    """nfs, lustre, gpfs (IBM Storage Scale), beegfs, or hostPath (one-node test clusters); that type's
    settings below are required, the others ignored."""
    capacity: StorageSize = "1Ti"
    """Capacity declared on the PersistentVolumes."""
    nfs: Optional[NfsStorage] = None
    """NFS settings (type nfs)."""
    lustre: Optional[LustreStorage] = None
    """Lustre settings (type lustre)."""
    gpfs: Optional[GpfsStorage] = None
    """IBM Storage Scale settings (type gpfs)."""
    beegfs: Optional[BeegfsStorage] = None
    """BeeGFS settings (type beegfs)."""
    host_path: Optional[HostPathStorage] = None
    """hostPath settings (type hostPath)."""
    models_path: RelativePath = "models"
    """Directory on the shared file system that inference mounts read-only."""


# ------------------------------------------------------------------------- inference


class Replicas(Model):
    # 1000 replicas of a GPU server exceed any fleet this manages.
    min: int = Field(1, ge=1, le=1000)
    """Minimum replicas (HPA minReplicas)."""
    max: int = Field(2, ge=1, le=1000)
    """Maximum replicas (HPA maxReplicas)."""


class InferenceModel(Model):
    """One served model."""

    name: DnsLabel
    """Deployment and Service name."""
    path: RelativePath
    """Model directory relative to the shared models directory."""
    revision: Optional[RelativePath] = None
    """The checkpoint served: a directory under ``path`` that training wrote (e.g. ``step-12000``).
    Changing it promotes that checkpoint by a rolling update (a replica loading it turns Ready before an
    old one stops); setting the earlier value back rolls back. Unset: ``path`` itself is served."""
    gpus: int = Field(1, ge=1, le=64)
    """GPUs per replica (nvidia.com/gpu limit; vLLM --tensor-parallel-size)."""
    replicas: Replicas = Replicas()
    """Autoscaling bounds."""
    target_cpu_utilization: int = Field(70, ge=1, le=100)
    """HPA target average CPU utilisation (percent)."""
    resources: Resources = Resources(
        requests=ResourceList(cpu="4", memory="32Gi"), limits=ResourceList(cpu="8", memory="64Gi")
    )
    """Container CPU and memory."""
    max_model_len: Optional[int] = Field(None, ge=1, le=2**24)  # 16M tokens: above any released model's context
    """vLLM --max-model-len."""

    @property
    def served_path(self) -> str:
        """The directory served, relative to the shared models directory."""
        return f"{self.path}/{self.revision}" if self.revision else self.path


class Inference(Model):
    """The Kubernetes inference namespace."""

    enabled: bool = True
    """Deploy the inference namespace and servers."""
    namespace: Namespace = "inference"
    """Namespace name."""
    pod_security: PodSecurityLevel = PodSecurityLevel.RESTRICTED
    """Pod Security admission level enforced on the namespace."""
    server: InferenceServer = InferenceServer.VLLM
    """vllm (OpenAI-compatible API) or triton."""
    models: tuple[InferenceModel, ...] = Field((), max_length=MAX_ITEMS)
    """Served models."""
    tolerations: tuple[Toleration, ...] = Field((), max_length=MAX_ITEMS)
    """Taints of inference-eligible pools that inference pods tolerate (never the Slurm taint)."""
    client_namespaces: tuple[DnsLabel, ...] = Field(("ingress-nginx",), max_length=MAX_ITEMS)
    """Namespaces whose pods may call the model servers, besides the inference namespace itself;
    the default is where the ingress-nginx controller installs itself."""
    runtime_class_name: Optional[DnsSubdomain] = None
    """RuntimeClass of the model servers' pods, e.g. 'nvidia' where the GPU runtime is not containerd's default."""


class SubmissionIdentity(Model):
    """A ServiceAccount in the submission namespace whose Jobs submit as one Slurm user."""

    service_account: DnsLabel
    """ServiceAccount name (dualsched creates it, with no API token mounted)."""
    user: PosixName
    """The Slurm user its jobs run as: one of ``slurm.users``."""
    account: Optional[PosixName] = None
    """Default Slurm account for its jobs (``SBATCH_ACCOUNT``); Slurm's associations decide what it may use."""


class Submission(Model):
    """sbatch from Kubernetes Jobs, authenticated with short-lived Slurm tokens instead of the munge key."""

    enabled: bool = True
    """Create the submission namespace, its client config and the token minter (a stack without a
    slurm section has nothing to submit to: there it defaults to false)."""
    namespace: Namespace = "slurm-jobs"
    """Namespace where Kubernetes Jobs submit to Slurm. Anyone who may create pods there may use
    every ServiceAccount below, so it is one trust boundary: give teams their own stacks or namespaces."""
    identities: tuple[SubmissionIdentity, ...] = ()
    """ServiceAccount -> Slurm user. A pod of any other ServiceAccount gets no token."""
    token_lifetime_seconds: int = Field(900, ge=60, le=86400)
    """Lifetime of a minted Slurm token; the Job's sidecar renews it at a third of that."""


# ---------------------------------------------------------------------------- network


class Network(Model):
    """Addresses that NetworkPolicies must name as IP blocks: slurmd runs on the host network, so its
    traffic to and from slurmctld carries node addresses, which no pod selector matches."""

    node_cidrs: tuple[Cidr, ...] = Field(min_length=1, max_length=MAX_ITEMS)
    """Networks holding the nodes' addresses: slurmctld and slurmdbd accept connections from them
    (slurmd, sbatch and sacct on the nodes) and slurmctld reaches slurmd (6818) there."""
    api_server_cidrs: Optional[tuple[Cidr, ...]] = Field(None, min_length=1, max_length=MAX_ITEMS)
    """Addresses of the Kubernetes API server (the endpoints of the `kubernetes` Service), which the
    token minter calls for TokenReviews; defaults to nodeCidrs (control-plane nodes)."""
    api_server_ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = Field((443, 6443), min_length=1, max_length=MAX_ITEMS)
    """The API server's port at those addresses (the endpoint's, not the Service's 443): 443 on managed
    clusters, 6443 on kubeadm's."""

    @property
    def api_server(self) -> tuple[str, ...]:
        return self.node_cidrs if self.api_server_cidrs is None else self.api_server_cidrs


# ----------------------------------------------------------------------------- stack


PYXIS_VARIANTS = {"slurmd": "slurmd_pyxis", "login": "login_pyxis"}
"""The ``images`` fields of the roles that load plugstack.conf, each with its field that carries Pyxis."""


class StackConfig(Model):
    """One stack's whole configuration (the ``dualsched:`` keys)."""

    environment: Environment = Environment.DEV
    """dev or prod; prod requires pinned images and protects stateful resources."""
    kubernetes_version: KubernetesMinor = "1.34"
    """Kubernetes minor version the manifests target (e.g. '1.34')."""
    protect: Optional[bool] = None
    """Pulumi protect on state claims, database and storage; defaults to true in prod."""
    placement: Placement = Placement()
    """Label and taint keys."""
    images: Images = Images()
    """Container images."""
    slurm: Optional[Slurm] = None
    """The Slurm cluster. Leave it out for an inference-only stack (its pools are then all mode kubernetes)."""
    pools: tuple[NodePool, ...] = Field(min_length=1, max_length=MAX_ITEMS)
    """GPU node pools."""
    storage: SharedStorage
    """The shared file system."""
    network: Optional[Network] = None
    """Node and API server addresses for the Slurm namespace's NetworkPolicies; required with slurm."""
    inference: Optional[Inference] = None
    """Inference serving. Leave it out for a Slurm-only stack."""
    submission: Submission = Submission()
    """Job submission from Kubernetes to Slurm: on by default with a slurm section, off without one."""

    @model_validator(mode="before")
    @classmethod
    def _nothing_to_submit_to_without_slurm(cls, data: Any) -> Any:
        # Submission defaults to on, for Slurm; a stack without Slurm gets no submission
        # namespace, rather than a section it never asked for that nothing builds.
        if isinstance(data, Mapping) and data.get("slurm") is None and "submission" not in data:
            return {**data, "submission": {"enabled": False}}
        return data

    @model_validator(mode="after")
    def _passes_the_cross_field_checks(self) -> StackConfig:
        # Imported here: config.checks imports this module for the classes it checks.
        from dualsched.config.checks import CrossFieldError, cross_field_problems

        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldError(problems)
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> StackConfig:
        """A copy; with ``update``, validated again as a whole (pydantic's copy validates nothing)."""
        copy = super().model_copy(update=update, deep=deep)
        return type(self).model_validate(dict(copy)) if update else copy

    @property
    def protect_state(self) -> bool:
        if self.protect is None:
            return self.environment is Environment.PROD
        return self.protect

    def pool(self, name: str) -> NodePool:
        return next(pool for pool in self.pools if pool.name == name)

    def pool_taints(self, pool: NodePool) -> tuple[Taint, ...]:
        """The pool's taints, with the dedicated-mode default resolved."""
        if pool.taints is not None:
            return pool.taints
        if pool.mode is PoolMode.DEDICATED:
            return (Taint(key=self.placement.slurm_taint_key),)
        return ()

    @property
    def window_taint(self) -> Taint:
        """The taint a time-shared pool's nodes carry while their inference window is closed."""
        return Taint(key=self.placement.window_taint_key, value="closed", effect=TaintEffect.NO_EXECUTE)

    @property
    def window_taints(self) -> tuple[Taint, ...]:
        """The closed-window taint if any pool has an inference window, else none."""
        return (self.window_taint,) if any(pool.inference_window for pool in self.pools) else ()

    @property
    def serves_models(self) -> bool:
        """Whether the stack deploys model servers (and so the inference namespace)."""
        return self.inference is not None and self.inference.enabled and bool(self.inference.models)

    @property
    def slurm_pools(self) -> tuple[NodePool, ...]:
        return tuple(pool for pool in self.pools if pool.runs_slurmd)

    @property
    def runs_containers(self) -> bool:
        """Whether some pool runs Slurm job steps in containers (and so every slurmd loads Pyxis)."""
        return any(pool.containers for pool in self.slurm_pools)

    def slurm_image_field(self, role: str) -> str:
        """The field of ``images`` that ``role`` (a Slurm daemon or client) runs: once any pool runs containers,
        every slurmd and Slurm client loads the plugstack.conf slurmctld serves, which requires Pyxis, and one
        without the plugin stops ("Failed to initialize plugin stack"), so the roles that load it run the image
        that carries it."""
        variant = PYXIS_VARIANTS.get(role)
        return variant if variant and self.runs_containers else role

    @property
    def inference_pools(self) -> tuple[NodePool, ...]:
        return tuple(pool for pool in self.pools if pool.serves_inference)

