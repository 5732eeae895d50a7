"""Rules that relate several fields of a valid-looking config.

Each check yields :class:`Problem`s naming the config path to fix, so a stack
with five mistakes gets five lines in one message, not five deployments.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator, Optional

from pydantic.alias_generators import to_camel

from dualsched.config.models import (
    GPU_RESOURCE,
    MUNGED_CPUS,
    MUNGED_MEMORY_MB,
    NVIDIA_AUTODETECT_SINCE,
    AccessMode,
    DatabaseMode,
    Environment,
    GpuAutoDetect,
    HealthCheckNodeState,
    NodePool,
    PoolMode,
    StackConfig,
    StorageType,
    Taint,
    Toleration,
    SYSTEM_ACCOUNTS,
    PreemptMode,
    PreemptType,
    QosPreemptMode,
)
from dualsched.config.quantities import parse_quantity
from dualsched.config.types import image_follows_patch_releases, image_is_pinned, image_slurm_release, is_dns_label


@dataclass(frozen=True)
class Problem:
    """One config mistake: where, what, and the offending value."""

    path: str
    message: str
    value: Any

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (got {format_value(self.value)})"


class _Missing:
    def __repr__(self) -> str:
        return "nothing"


MISSING = _Missing()


def format_value(value: Any, limit: int = 80) -> str:
    """The value as one short line: repr escapes newlines and control characters; long text is cut."""
    try:
        text = repr(value.value if isinstance(value, Enum) else value)
    except (ValueError, RecursionError):  # an int past Python's digit limit, a deeply nested list
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


Check = Callable[[StackConfig], Iterator[Problem]]


def _with(section: str) -> Callable[[Check], Check]:
    """Run a check of one optional section only when the stack has that section: an absent section
    builds nothing, so there is nothing of it to check."""

    def wrap(check: Check) -> Check:
        @functools.wraps(check)
        def run(config: StackConfig) -> Iterator[Problem]:
            return check(config) if getattr(config, section) is not None else iter(())

        return run

    return wrap


def builds_something(config: StackConfig) -> Iterator[Problem]:
    if config.slurm is None and not config.serves_models:
        yield Problem("slurm", "a stack builds Slurm, model servers or both: give a slurm section, "
                      "inference.models, or both", MISSING)


def pools_without_slurm(config: StackConfig) -> Iterator[Problem]:
    """Without a slurm section there is no slurmd to give GPUs to, and no node keeper to set taints
    (it runs beside Slurm): an inference-only stack's pools are mode kubernetes, without taints."""
    if config.slurm is not None:
        return
    for index, pool in enumerate(config.pools):
        if pool.runs_slurmd:
            yield Problem(f"pools[{index}].mode", "runs slurmd, and the stack has no slurm section: an inference-only "
                          "stack's pools are mode 'kubernetes'", pool.mode)
        if pool.taints:
            yield Problem(f"pools[{index}].taints", "an inference-only stack sets no node taints (the node keeper that "
                          "keeps them runs beside Slurm): taint the nodes yourself and list the taints in "
                          "inference.tolerations", [t.key for t in pool.taints])


def _duplicates(names: list[str]) -> set[str]:
    return {name for name, count in Counter(names).items() if count > 1}


def unique_names(config: StackConfig) -> Iterator[Problem]:
    collections = {"pools": [pool.name for pool in config.pools]}
    if config.slurm is not None:
        collections["slurm.partitions"] = [partition.name for partition in config.slurm.partitions]
    if config.inference is not None:
        collections["inference.models"] = [model.name for model in config.inference.models]
    for path, names in collections.items():
        repeated = _duplicates(names)
        for index, name in enumerate(names):
            if name in repeated:
                yield Problem(f"{path}[{index}].name", "name is used more than once", name)


@_with("slurm")
def partitions_name_existing_slurm_pools(config: StackConfig) -> Iterator[Problem]:
    pools = {pool.name: pool for pool in config.pools}
    for p_index, partition in enumerate(config.slurm.partitions):
        for index, name in enumerate(partition.pools):
            path = f"slurm.partitions[{p_index}].pools[{index}]"
            if name not in pools:
                yield Problem(path, f"no pool of that name (pools: {', '.join(pools)})", name)
            elif not pools[name].runs_slurmd:
                yield Problem(path, "pool has mode 'kubernetes' and runs no slurmd", name)


@_with("slurm")
def one_default_partition(config: StackConfig) -> Iterator[Problem]:
    defaults = [i for i, partition in enumerate(config.slurm.partitions) if partition.default]
    for index in defaults[1:]:
        yield Problem(f"slurm.partitions[{index}].default", "only one partition may be the default", True)


def gres_matches_gpus(config: StackConfig) -> Iterator[Problem]:
    for index, pool in enumerate(config.pools):
        path = f"pools[{index}].slurmGpus"
        if pool.mode in (PoolMode.DEDICATED, PoolMode.TIME_SHARED) and pool.slurm_gpus not in (None, pool.gpus_per_node):
            yield Problem(
                path, f"a {pool.mode.value} pool gives Slurm all {pool.gpus_per_node} GPUs per node (gpusPerNode)", pool.slurm_gpus
            )
        elif pool.mode is PoolMode.PARTITIONED:
            if pool.slurm_gpus is None:
                yield Problem(path, "a partitioned pool must say how many GPUs per node Slurm gets", MISSING)
            elif not 0 < pool.slurm_gpus < pool.gpus_per_node:
                yield Problem(
                    path,
                    f"a partitioned pool gives Slurm between 1 and {pool.gpus_per_node - 1} of its "
                    f"{pool.gpus_per_node} GPUs per node",
                    pool.slurm_gpus,
                )
        elif pool.mode is PoolMode.KUBERNETES and pool.slurm_gpus:
            yield Problem(path, "a kubernetes pool gives Slurm no GPUs", pool.slurm_gpus)


def node_names_unique_across_pools(config: StackConfig) -> Iterator[Problem]:
    owner: dict[str, str] = {}
    for index, pool in enumerate(config.pools):
        clashes = sorted({name for name in pool.node_names if name in owner})
        for name in pool.node_names:
            owner.setdefault(name, pool.name)
        if clashes:
            first = clashes[0]
            yield Problem(
                f"pools[{index}].nodes",
                f"node {first} is already in pool {owner[first]}"
                + (f" ({len(clashes)} nodes overlap)" if len(clashes) > 1 else ""),
                pool.nodes,
            )


def node_names_are_dns_subdomains(config: StackConfig) -> Iterator[Problem]:
    for index, pool in enumerate(config.pools):
        # Node names are DNS subdomains: dot-separated DNS-1123 labels.
        bad = [name for name in pool.node_names if len(name) > 253 or not all(map(is_dns_label, name.split(".")))]
        if bad:
            yield Problem(f"pools[{index}].nodes", f"node name {format_value(bad[0])} is not a valid Kubernetes node name", pool.nodes)


def _tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    return any(
        t.key == taint.key
        and (t.value is None or t.value == taint.value)
        and (t.effect is None or t.effect == taint.effect)
        for t in tolerations
    )


def taints_are_tolerated(config: StackConfig) -> Iterator[Problem]:
    slurm_key = config.placement.slurm_taint_key
    for index, pool in enumerate(config.pools):
        taints = config.pool_taints(pool)
        if pool.mode is PoolMode.DEDICATED and not any(t.key == slurm_key for t in taints):
            yield Problem(
                f"pools[{index}].taints",
                f"a dedicated pool must carry the Slurm taint '{slurm_key}', or Kubernetes pods land on Slurm's GPUs",
                [t.key for t in taints],
            )
        if not (pool.serves_inference and config.serves_models):
            continue
        for t_index, taint in enumerate(taints):
            path = f"pools[{index}].taints[{t_index}]"
            if taint.key == slurm_key:
                yield Problem(path, f"pool mode '{pool.mode.value}' serves inference, which never tolerates the Slurm taint", taint.key)
            elif taint.effect.value != "PreferNoSchedule" and not _tolerates(config.inference.tolerations, taint):
                yield Problem(path, "no workload meant for this pool tolerates this taint (add it to inference.tolerations)", taint.key)


@_with("inference")
def inference_never_tolerates_slurm(config: StackConfig) -> Iterator[Problem]:
    for index, toleration in enumerate(config.inference.tolerations):
        if toleration.key == config.placement.slurm_taint_key:
            yield Problem(f"inference.tolerations[{index}].key", "inference must not tolerate the Slurm taint", toleration.key)


@_with("inference")
def inference_fits_on_pools(config: StackConfig) -> Iterator[Problem]:
    if not config.inference.enabled:
        return
    most = max((pool.kubernetes_gpu_count for pool in config.inference_pools), default=0)
    for index, model in enumerate(config.inference.models):
        if model.gpus > most:
            yield Problem(
                f"inference.models[{index}].gpus",
                f"no inference-eligible pool leaves that many GPUs per node to Kubernetes (most: {most})",
                model.gpus,
            )
        if model.replicas.min > model.replicas.max:
            yield Problem(f"inference.models[{index}].replicas.min", f"exceeds replicas.max ({model.replicas.max})", model.replicas.min)


def windows_match_modes(config: StackConfig) -> Iterator[Problem]:
    for index, pool in enumerate(config.pools):
        path = f"pools[{index}].inferenceWindow"
        if pool.mode is PoolMode.TIME_SHARED and pool.inference_window is None:
            yield Problem(path, "a time-shared pool must say when its inference window opens and for how long", MISSING)
        elif pool.mode is not PoolMode.TIME_SHARED and pool.inference_window is not None:
            yield Problem(path, f"only a time-shared pool has an inference window (mode is '{pool.mode.value}')",
                          pool.inference_window.start)


def joining_pools_are_watched(config: StackConfig) -> Iterator[Problem]:
    """A pool whose nodes join by label runs slurmd as dynamic Slurm nodes: the daily window's reservation names its
    nodes (time-shared), and a node that leaves is found by slurmctld's node watcher, which drainCordoned runs."""
    for index, pool in enumerate(config.pools):
        if not pool.join_by_label:
            continue
        path = f"pools[{index}].joinByLabel"
        if pool.mode not in (PoolMode.DEDICATED, PoolMode.PARTITIONED):
            yield Problem(path, f"only a dedicated or partitioned pool's nodes join by label (mode is '{pool.mode.value}')", True)
        elif config.slurm is not None and not config.slurm.health_check.drain_cordoned:
            yield Problem(path, "needs slurm.healthCheck.drainCordoned: true: the node watcher it runs beside slurmctld "
                          "drains a node that leaves the pool, and deletes it from Slurm once no job runs there", True)


def _nested(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def containers_fit_pools(config: StackConfig) -> Iterator[Problem]:
    """Enroot needs a privileged slurmd (user namespaces, mounting /proc in them): only where slurmd may
    see every GPU of the node, so not in a partitioned pool, whose other GPUs are Kubernetes'. Its
    directories are distinct, or one user's files would land in another's tree."""
    for index, pool in enumerate(config.pools):
        if pool.containers is None:
            continue
        path = f"pools[{index}].containers"
        if not pool.runs_slurmd:
            yield Problem(path, "runs Slurm job steps in containers, and a pool of mode 'kubernetes' runs no slurmd", pool.mode)
        elif pool.mode is PoolMode.PARTITIONED:
            yield Problem(path, "needs a privileged slurmd, which would see the GPUs a partitioned pool gives Kubernetes: "
                          "use a dedicated or time-shared pool", pool.mode)
        paths = list(pool.containers.paths.items())
        for position, (field, directory) in enumerate(paths):
            for other_field, other in paths[position + 1:]:
                if _nested(directory, other) or _nested(other, directory):
                    yield Problem(f"{path}.{field}", f"must not be, contain or lie inside {other_field} ({other})", directory)


def fabric_reaches_slurmd(config: StackConfig) -> Iterator[Problem]:
    """The fabric is slurmd's pod's: a pool without slurmd has no job to give it to, and the GPUs' resource
    is no RDMA device (slurmd would ask for both under one name)."""
    for index, pool in enumerate(config.pools):
        if pool.fabric is None:
            continue
        if not pool.runs_slurmd:
            yield Problem(f"pools[{index}].fabric", "is for Slurm jobs, and a pool of mode 'kubernetes' runs no slurmd", pool.mode)
        if pool.fabric.rdma_resource == GPU_RESOURCE:
            yield Problem(f"pools[{index}].fabric.rdmaResource", "names the GPUs' resource, not the RDMA device plugin's",
                          pool.fabric.rdma_resource)


def slurmd_pods_fit_their_nodes(config: StackConfig) -> Iterator[Problem]:
    """slurmd's Guaranteed pod (cpus, realMemoryMb, and its munged sidecar) and the node's other DaemonSets fit
    in the node's allocatable CPUs and memory; on a node both schedulers use, Slurm's share must leave some to
    Kubernetes too."""
    for index, pool in enumerate(config.pools):
        if not pool.runs_slurmd:
            continue
        if pool.allocatable is None:
            yield Problem(f"pools[{index}].allocatable", f"a {pool.mode.value} pool runs slurmd: give its nodes' allocatable cpus "
                          "and memoryMb, in which slurmd's pod and the node's other DaemonSets must fit", MISSING)
            continue
        shared = pool.mode in (PoolMode.PARTITIONED, PoolMode.TIME_SHARED)
        others = pool.other_daemon_sets
        for field, share, munged, other, total in (
            ("cpus", pool.cpus, MUNGED_CPUS, others.cpus, pool.allocatable.cpus),
            ("realMemoryMb", pool.real_memory_mb, MUNGED_MEMORY_MB, others.memory_mb, pool.allocatable.memory_mb),
        ):
            needed = share + munged + other
            if needed > total or (shared and needed >= total):
                leaves = ", which leaves Kubernetes nothing" if needed <= total else ""
                yield Problem(f"pools[{index}].{field}", f"slurmd's pod ({share} and {munged} for munged) and the node's other "
                              f"DaemonSets ({other}) need {_amount(needed)} of the node's allocatable {total}{leaves}", share)


def _amount(value: float) -> str:
    """A sum of CPUs or MiB as a person writes it: 192.55, 1960064."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _kubernetes_share(pools: tuple[NodePool, ...]) -> dict[str, Optional[float]]:
    """GPUs, CPUs and MiB Kubernetes has at every hour on these pools; None when a pool does not say."""
    share: dict[str, Optional[float]] = {"GPUs": 0.0, "CPUs": 0.0, "MiB of memory": 0.0}
    for pool in pools:
        nodes = len(pool.node_names)
        share["GPUs"] += nodes * pool.kubernetes_gpu_count
        for kind, total, slurm in (("CPUs", "cpus", pool.cpus), ("MiB of memory", "memory_mb", pool.real_memory_mb)):
            if share[kind] is None or pool.allocatable is None:
                share[kind] = None
            else:
                taken = slurm if pool.runs_slurmd else 0
                share[kind] += nodes * (getattr(pool.allocatable, total) - taken)
    return share


def inference_floors_fit(config: StackConfig) -> Iterator[Problem]:
    """Every model at its replica floor fits in the Kubernetes share of the pools inference may use
    (a time-shared pool's inside its window: outside it, replicas placed there wait)."""
    if not config.serves_models:
        return
    models = config.inference.models
    share = _kubernetes_share(config.inference_pools)
    floor = {
        "GPUs": sum(model.replicas.min * model.gpus for model in models),
        "CPUs": sum(model.replicas.min * parse_quantity(model.resources.requests.cpu or "0") for model in models),
        "MiB of memory": sum(model.replicas.min * parse_quantity(model.resources.requests.memory or "0") / 2**20
                             for model in models),
    }
    for kind, needed in floor.items():
        available = share[kind]
        if available is not None and needed > available:
            yield Problem(
                "inference.models",
                f"at their replicas.min the models request {needed:g} {kind}, more than the Kubernetes share of the "
                f"pools inference may use ({available:g})",
                [f"{model.name}: {model.replicas.min}" for model in models],
            )


@_with("slurm")
def ha_needs_shared_state(config: StackConfig) -> Iterator[Problem]:
    controller = config.slurm.controller
    if controller.ha and controller.state_storage.access_mode is not AccessMode.READ_WRITE_MANY:
        yield Problem(
            "slurm.controller.stateStorage.accessMode",
            "an HA controller shares StateSaveLocation between two pods and needs ReadWriteMany",
            controller.state_storage.access_mode.value,
        )


@_with("slurm")
def accounting_has_database(config: StackConfig) -> Iterator[Problem]:
    accounting = config.slurm.accounting
    if not accounting.enabled:
        return
    if accounting.database is None:
        yield Problem("slurm.accounting.database", "accounting is enabled but no database is configured", MISSING)
        return
    if accounting.database.mode is DatabaseMode.EXTERNAL:
        external = accounting.database.external
        if external is None:
            yield Problem(
                "slurm.accounting.database.external", "mode 'external' needs the database's host and password or passwordSecret", MISSING
            )
            return
        if not external.host:
            yield Problem("slurm.accounting.database.external.host", "an external database needs a host", external.host or MISSING)
        if external.password is not None and external.password_secret is not None:
            yield Problem("slurm.accounting.database.external.password", "give the password or passwordSecret, not both", external.password)
        elif external.password is None and external.password_secret is None:
            yield Problem(
                "slurm.accounting.database.external.passwordSecret",
                "an external database needs the Secret holding its password, or the password as a Pulumi secret (password)",
                MISSING,
            )


# Per storage type: its settings section, what the type is called, and the settings it cannot do without.
_STORAGE_NEEDS: dict[StorageType, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    StorageType.NFS: ("nfs", "NFS storage", (("server", "a server"), ("path", "a path"))),
    StorageType.LUSTRE: ("lustre", "Lustre storage", (("mgs_nodes", "the NIDs of its MGS node(s)"),
                                                      ("fs_name", "the file system name"))),
    StorageType.GPFS: ("gpfs", "IBM Storage Scale storage", (("cluster_id", "the owning cluster's ID"),
                                                             ("filesystem_uuid", "the file system's UUID"),
                                                             ("path", "the directory to share"))),
    StorageType.BEEGFS: ("beegfs", "BeeGFS storage", (("sys_mgmtd_host", "the management service's host"),
                                                      ("path", "the directory to share"))),
    StorageType.HOST_PATH: ("host_path", "hostPath storage", (("path", "a path"),)),
}


def storage_has_required_fields(config: StackConfig) -> Iterator[Problem]:
    """The chosen type's settings are complete; the other types' settings are ignored."""
    section, kind, needs = _STORAGE_NEEDS[config.storage.type]
    settings = getattr(config.storage, section)
    for field, what in needs:
        if settings is None or getattr(settings, field) is None:
            yield Problem(f"storage.{to_camel(section)}.{to_camel(field)}", f"{kind} needs {what}", MISSING)


def prod_storage_is_shared(config: StackConfig) -> Iterator[Problem]:
    if config.environment is Environment.PROD and config.storage.type is StorageType.HOST_PATH:
        *shared, last = [kind.value for kind in StorageType if kind is not StorageType.HOST_PATH]
        yield Problem("storage.type", f"hostPath shares nothing between nodes: prod needs {', '.join(shared)} or {last}",
                      config.storage.type)


def _image_path(field: str) -> str:
    return f"images.{to_camel(field)}"


def prod_images_are_pinned(config: StackConfig) -> Iterator[Problem]:
    if config.environment is not Environment.PROD:
        return
    for field, reference in config.images.model_dump().items():
        if not image_is_pinned(reference):
            yield Problem(_image_path(field), "prod images must be pinned to a tag other than 'latest' or a digest", reference)
        elif field in SLURM_IMAGES and image_follows_patch_releases(reference):
            yield Problem(_image_path(field), "this tag moves to each new Slurm patch release: prod names a patch "
                          f"release ('{image_slurm_release(reference)}.<patch>-<flavor>') or a digest", reference)


SLURM_IMAGES = ("slurmctld", "slurmd", "slurmd_pyxis", "slurmdbd", "slurmrestd", "login", "login_pyxis")
"""The images that run Slurm's daemons or client commands."""


def _slurm_images_deployed(config: StackConfig) -> Iterator[str]:
    """The fields of the Slurm images this stack runs."""
    slurm = config.slurm
    deployed = {"slurmdbd": slurm.accounting.enabled, "slurmrestd": config.submission.enabled, "login": slurm.login.enabled}
    roles = ("slurmctld", "slurmd", *(role for role, runs in deployed.items() if runs))
    # slurmd's own image also runs munged beside every Slurm pod, with containers too
    yield from dict.fromkeys(("slurmctld", "slurmd", *(config.slurm_image_field(role) for role in roles)))


def slurm_images_run_the_release(config: StackConfig) -> Iterator[Problem]:
    """slurm.conf and the other Slurm files are written for slurm.release; an image whose tag names another
    release would get options it rejects, or miss ones it needs."""
    if config.slurm is None:
        return
    for field in _slurm_images_deployed(config):
        reference = getattr(config.images, field)
        release = image_slurm_release(reference)
        if release is not None and release != config.slurm.release:
            yield Problem(_image_path(field), f"its tag names Slurm {release}, but slurm.release is {config.slurm.release} "
                          "(the Slurm files are written for that release): set both to the release the images run", reference)


IMAGES_WITHOUT_NVML = ("ghcr.io/slinkyproject/",)
"""Slurm images built without gpu/nvml: SchedMD's Slinky images (debuild of SchedMD's debian/, whose build
dependencies have no NVML, so BUILD_NVML is off)."""


def gpu_detection_confines_jobs(config: StackConfig) -> Iterator[Problem]:
    """gres.conf's AutoDetect names a plugin slurmd has: without it slurmd falls back to gpu/generic, its
    jobs get no device files, and ConstrainDevices confines nothing."""
    slurm = config.slurm
    if slurm is None or not any(pool.slurm_gpu_count for pool in config.pools):
        return
    detection = slurm.gpu_detection
    if detection is GpuAutoDetect.NVIDIA and slurm.release_version < NVIDIA_AUTODETECT_SINCE:
        yield Problem("slurm.gpuAutoDetect", f"AutoDetect=nvidia needs Slurm 24.11 or later, and slurm.release is "
                      f"{slurm.release}: use nvml (a Slurm built with NVML) or off", detection)
    if detection is GpuAutoDetect.NVML:
        for field in _slurm_images_deployed(config):
            reference = getattr(config.images, field)
            if field.startswith("slurmd") and reference.startswith(IMAGES_WITHOUT_NVML):
                yield Problem("slurm.gpuAutoDetect", f"{_image_path(field)} ({reference}) is built without NVML: slurmd "
                              "would fall back to gpu/generic and every job would see every GPU of its node; use nvidia "
                              "(Slurm 24.11 or later) or off", detection)


def requests_within_limits(config: StackConfig) -> Iterator[Problem]:
    def resources_at(path, resources) -> Iterator[Problem]:
        for kind in ("cpu", "memory"):
            request = getattr(resources.requests, kind)
            limit = getattr(resources.limits, kind)
            if request and limit and parse_quantity(request) > parse_quantity(limit):
                yield Problem(f"{path}.requests.{kind}", f"request exceeds the limit ({limit})", request)

    if config.slurm is not None:
        yield from resources_at("slurm.controller.resources", config.slurm.controller.resources)
        yield from resources_at("slurm.accounting.resources", config.slurm.accounting.resources)
    for index, model in enumerate(config.inference.models if config.inference is not None else ()):
        yield from resources_at(f"inference.models[{index}].resources", model.resources)


def slurmd_memory_adds_up(config: StackConfig) -> Iterator[Problem]:
    """slurmd's own reserve comes out of realMemoryMb, and must leave jobs some."""
    for index, pool in enumerate(config.pools):
        if pool.runs_slurmd and pool.mem_spec_limit_mb >= pool.real_memory_mb:
            yield Problem(
                f"pools[{index}].memSpecLimitMb", f"leaves jobs no memory of realMemoryMb ({pool.real_memory_mb})", pool.mem_spec_limit_mb
            )




@_with("slurm")
def users_are_distinct(config: StackConfig) -> Iterator[Problem]:
    users = config.slurm.users
    names, uids = _duplicates([user.name for user in users]), _duplicates([str(user.uid) for user in users])
    for index, user in enumerate(users):
        if user.name in SYSTEM_ACCOUNTS:
            yield Problem(f"slurm.users[{index}].name", f"is a system account ({', '.join(SYSTEM_ACCOUNTS)})", user.name)
        elif user.name in names:
            yield Problem(f"slurm.users[{index}].name", "name is used more than once", user.name)
        system_ids = SYSTEM_ACCOUNTS.values()
        if user.uid in system_ids or user.group_id in system_ids:
            which = "uid" if user.uid in system_ids else "gid"
            yield Problem(f"slurm.users[{index}].{which}", f"is a system account's id ({', '.join(map(str, system_ids))})",
                          user.uid if which == "uid" else user.group_id)
        elif str(user.uid) in uids:
            yield Problem(f"slurm.users[{index}].uid", "uid is used more than once", user.uid)


@_with("slurm")
def identities_map_known_users(config: StackConfig) -> Iterator[Problem]:
    users = {user.name for user in config.slurm.users}
    accounts = _duplicates([identity.service_account for identity in config.submission.identities])
    for index, identity in enumerate(config.submission.identities):
        if identity.user not in users:
            yield Problem(f"submission.identities[{index}].user", "is not one of slurm.users", identity.user)
        if identity.service_account in accounts:
            yield Problem(f"submission.identities[{index}].serviceAccount", "is mapped more than once", identity.service_account)


@_with("slurm")
def login_users_are_known(config: StackConfig) -> Iterator[Problem]:
    login = config.slurm.login
    if login.enabled and not login.users:
        yield Problem("slurm.login.users", "an enabled login needs at least one user with keys: nobody could log in", [])
    users, listed = {user.name for user in config.slurm.users}, _duplicates([user.name for user in login.users])
    for index, user in enumerate(login.users):
        if user.name not in users:
            yield Problem(f"slurm.login.users[{index}].name", "is not one of slurm.users", user.name)
        elif user.name in listed:
            yield Problem(f"slurm.login.users[{index}].name", "is listed more than once (give one entry all its keys)", user.name)


def slurm_needs_network(config: StackConfig) -> Iterator[Problem]:
    """slurmd runs on the host network: the Slurm namespace's NetworkPolicies admit it by address."""
    if config.slurm is not None and config.network is None:
        yield Problem("network", "a stack with a slurm section needs the nodes' addresses (network.nodeCidrs) for "
                      "the Slurm namespace's NetworkPolicies", MISSING)


@_with("slurm")
def metrics_parts_need_exporter(config: StackConfig) -> Iterator[Problem]:
    """A ServiceMonitor without the exporter's Service selects nothing, and labels without a
    ServiceMonitor label nothing: either is a setting that silently does nothing."""
    metrics = config.slurm.metrics
    if metrics.service_monitor and not metrics.enabled:
        yield Problem("slurm.metrics.serviceMonitor", "needs slurm.metrics.enabled: without the exporter there is "
                      "nothing to scrape", True)
    if metrics.service_monitor_labels and not metrics.service_monitor:
        yield Problem("slurm.metrics.serviceMonitorLabels", "label the ServiceMonitor, and slurm.metrics.serviceMonitor "
                      "is false", dict(metrics.service_monitor_labels))


def submission_needs_slurm(config: StackConfig) -> Iterator[Problem]:
    if config.slurm is None and config.submission.enabled:
        yield Problem("submission.enabled", "Jobs submit to Slurm, and the stack has no slurm section", True)


def namespaces_distinct(config: StackConfig) -> Iterator[Problem]:
    sections = (
        ("slurm.namespace", config.slurm),
        ("inference.namespace", config.inference if config.inference is not None and config.inference.enabled else None),
        ("submission.namespace", config.submission if config.submission.enabled else None),
    )
    used: dict[str, str] = {}
    for path, section in sections:
        if section is None:
            continue
        namespace = section.namespace
        if namespace in used:
            yield Problem(path, f"must differ from {used[namespace]}", namespace)
        used.setdefault(namespace, path)


# ------------------------------------------------------------------ QOS, preemption and accounts

SLURM_QOS = "normal"
"""The QOS slurmdbd creates with its database: accounts may name it without listing it in slurm.qos."""
SLURM_ROOT_ACCOUNT = "root"


def _preempt_cycle(edges: dict[str, tuple[str, ...]], start: str) -> Optional[list[str]]:
    """The first cycle through ``start`` along the preempt lists, as [start, ..., start], or None."""
    trail: list[str] = [start]

    def walk(name: str, seen: set[str]) -> Optional[list[str]]:
        for target in edges.get(name, ()):
            if target == start:
                return [*trail, start]
            if target not in seen:
                seen.add(target)
                trail.append(target)
                found = walk(target, seen)
                if found:
                    return found
                trail.pop()
        return None

    return walk(start, {start})


@_with("slurm")
def qos_are_consistent(config: StackConfig) -> Iterator[Problem]:
    """QOS names are unique; a preempt list names other QOS of the config, without a cycle, and only
    preempt/qos reads it."""
    slurm = config.slurm
    names = [qos.name for qos in slurm.qos]
    repeated = _duplicates(names)
    known = set(names) | {SLURM_QOS}
    by_qos = preempts(config)
    for index, qos in enumerate(slurm.qos):
        path = f"slurm.qos[{index}]"
        if qos.name in repeated:
            yield Problem(f"{path}.name", "name is used more than once", qos.name)
        for p_index, target in enumerate(qos.preempt):
            if target == qos.name:
                yield Problem(f"{path}.preempt[{p_index}]", "a QOS does not preempt its own jobs", target)
            elif target not in known:
                yield Problem(f"{path}.preempt[{p_index}]", f"no QOS of that name in slurm.qos (nor Slurm's '{SLURM_QOS}')",
                              target)
        cycle = _preempt_cycle(by_qos, qos.name) if qos.name not in repeated else None
        if cycle and len(cycle) > 2 and min(cycle[:-1]) == qos.name:  # each cycle once, at its first name
            yield Problem(f"{path}.preempt", f"preemption cycle {' -> '.join(cycle)}: jobs would preempt each other "
                          "back and forth", list(qos.preempt))
        if slurm.preemption.type is not PreemptType.QOS:
            if qos.preempt:
                yield Problem(f"{path}.preempt", "preempts nothing unless slurm.preemption.type is 'qos'", list(qos.preempt))
            if qos.preempt_mode is not QosPreemptMode.CLUSTER:
                yield Problem(f"{path}.preemptMode", "applies only when slurm.preemption.type is 'qos'", qos.preempt_mode)


def preempts(config: StackConfig) -> dict[str, tuple[str, ...]]:
    """QOS name -> the QOS it preempts (other than itself)."""
    return {qos.name: tuple(t for t in qos.preempt if t != qos.name) for qos in config.slurm.qos}


@_with("slurm")
def preemption_is_possible(config: StackConfig) -> Iterator[Problem]:
    """The preemption settings preempt something, and in a way Slurm does on GPUs."""
    slurm = config.slurm
    preemption = slurm.preemption
    if preemption.type is PreemptType.OFF:
        if preemption.exempt_time is not None:
            yield Problem("slurm.preemption.exemptTime", "has no effect while slurm.preemption.type is 'off'",
                          preemption.exempt_time)
        return
    if preemption.mode is PreemptMode.SUSPEND:
        yield Problem("slurm.preemption.mode", "a suspended job keeps its GPUs (slurm.conf(5): \"Suspended jobs will not "
                      "release GRES\"), so no GPU job could preempt it: use 'requeue' or 'cancel'", preemption.mode)
    if preemption.type is PreemptType.QOS:
        if not slurm.accounting.enabled:
            yield Problem("slurm.preemption.type", "preempt/qos reads the QOS from accounting: enable slurm.accounting",
                          preemption.type)
        if not any(preempts(config).values()):
            yield Problem("slurm.preemption.type", "no QOS in slurm.qos lists another in its preempt list, so no job "
                          "would preempt any", preemption.type)
    elif preemption.type is PreemptType.PARTITION_PRIO:
        tiers: dict[str, set[int]] = {}
        for partition in slurm.partitions:
            for pool in partition.pools:
                tiers.setdefault(pool, set()).add(partition.priority_tier)
        if not any(len(found) > 1 for found in tiers.values()):
            yield Problem("slurm.preemption.type", "no two partitions over the same pool have different priorityTier, "
                          "so no job would preempt any", preemption.type)


@_with("slurm")
def accounts_are_consistent(config: StackConfig) -> Iterator[Problem]:
    """Accounts form a tree under root, name known QOS and users, and need accounting; QOS are given
    through accounts."""
    slurm = config.slurm
    if (slurm.accounts or slurm.qos) and not slurm.accounting.enabled:
        what = "slurm.accounts" if slurm.accounts else "slurm.qos"
        yield Problem(what, "accounts and QOS live in slurmdbd: enable slurm.accounting",
                      [item.name for item in (slurm.accounts or slurm.qos)])
    if slurm.qos and not slurm.accounts:
        yield Problem("slurm.accounts", "jobs use a QOS through an account's association: list the accounts that may "
                      "use slurm.qos", MISSING)
    qos_names = {qos.name for qos in slurm.qos} | {SLURM_QOS}
    users = {user.name for user in slurm.users}
    repeated = _duplicates([account.name for account in slurm.accounts])
    earlier: set[str] = set()
    for index, account in enumerate(slurm.accounts):
        path = f"slurm.accounts[{index}]"
        if account.name == SLURM_ROOT_ACCOUNT:
            yield Problem(f"{path}.name", "is Slurm's own root account, the parent of all others", account.name)
        elif account.name in repeated:
            yield Problem(f"{path}.name", "name is used more than once", account.name)
        if account.parent != SLURM_ROOT_ACCOUNT and account.parent not in earlier:
            yield Problem(f"{path}.parent", "must be root or an account listed before this one", account.parent)
        for q_index, name in enumerate(account.qos):
            if name not in qos_names:
                yield Problem(f"{path}.qos[{q_index}]", f"no QOS of that name in slurm.qos (nor Slurm's '{SLURM_QOS}')", name)
        if account.default_qos is not None and account.default_qos not in account.qos:
            yield Problem(f"{path}.defaultQos", f"must be one of the account's qos ({', '.join(account.qos)})",
                          account.default_qos)
        twice = _duplicates(list(account.users))
        for u_index, name in enumerate(account.users):
            if name not in users:
                yield Problem(f"{path}.users[{u_index}]", "is not one of slurm.users", name)
            elif name in twice:
                yield Problem(f"{path}.users[{u_index}]", "is listed more than once", name)
        earlier.add(account.name)


def user_accounts(config: StackConfig) -> dict[str, list[str]]:
    """User -> the accounts listing them, in config order."""
    accounts: dict[str, list[str]] = {}
    for account in config.slurm.accounts:
        for user in account.users:
            if account.name not in accounts.setdefault(user, []):
                accounts[user].append(account.name)
    return accounts


@_with("slurm")
def users_have_accounts(config: StackConfig) -> Iterator[Problem]:
    """With accounts, slurm.conf enforces associations: every user, and every submission identity's
    account, is one of the user's accounts."""
    slurm = config.slurm
    member_of = user_accounts(config)
    for index, user in enumerate(slurm.users):
        if not slurm.accounts:
            if user.default_account is not None:
                yield Problem(f"slurm.users[{index}].defaultAccount", "there are no slurm.accounts", user.default_account)
            continue
        mine = member_of.get(user.name, [])
        if not mine:
            yield Problem(f"slurm.users[{index}].name", "is in no account of slurm.accounts, and with accounts Slurm refuses "
                          "the jobs of a user without one (AccountingStorageEnforce=associations)", user.name)
        elif user.default_account is not None and user.default_account not in mine:
            yield Problem(f"slurm.users[{index}].defaultAccount", f"must be an account listing the user ({', '.join(mine)})",
                          user.default_account)
    if not slurm.accounts:
        return
    for index, identity in enumerate(config.submission.identities):
        mine = member_of.get(identity.user, [])
        if identity.account is not None and mine and identity.account not in mine:
            yield Problem(f"submission.identities[{index}].account", f"is not an account of user {identity.user} "
                          f"({', '.join(mine)})", identity.account)


@_with("slurm")
def health_check_is_meaningful(config: StackConfig) -> Iterator[Problem]:
    """A health check that checks nothing, or node states slurmctld would read differently than written:
    "any" already holds alloc, mixed and idle (read_config.c _health_node_state ORs them)."""
    health = config.slurm.health_check
    path = "slurm.healthCheck"
    if health.enabled and not any(health.checks.model_dump().values()):
        yield Problem(f"{path}.checks", "the health check is enabled and every check is off", health.checks.model_dump(by_alias=True))
    states = [state.value for state in health.node_state]
    for index, state in enumerate(states):
        if state in states[:index]:
            yield Problem(f"{path}.nodeState[{index}]", "is listed more than once", state)
    if HealthCheckNodeState.ANY.value in states and set(states) - {HealthCheckNodeState.ANY.value, HealthCheckNodeState.CYCLE.value}:
        yield Problem(f"{path}.nodeState", "any already covers alloc, mixed and idle: give any or some of them", states)


CHECKS: tuple[Check, ...] = (
    builds_something,
    pools_without_slurm,
    unique_names,
    partitions_name_existing_slurm_pools,
    one_default_partition,
    gres_matches_gpus,
    node_names_unique_across_pools,
    node_names_are_dns_subdomains,
    taints_are_tolerated,
    inference_never_tolerates_slurm,
    inference_fits_on_pools,
    windows_match_modes,
    joining_pools_are_watched,
    containers_fit_pools,
    fabric_reaches_slurmd,
    slurmd_pods_fit_their_nodes,
    inference_floors_fit,
    ha_needs_shared_state,
    accounting_has_database,
    storage_has_required_fields,
    prod_storage_is_shared,
    prod_images_are_pinned,
    slurm_images_run_the_release,
    gpu_detection_confines_jobs,
    requests_within_limits,
    slurmd_memory_adds_up,
    identities_map_known_users,
    users_are_distinct,
    login_users_are_known,
    slurm_needs_network,
    metrics_parts_need_exporter,
    submission_needs_slurm,
    namespaces_distinct,
    qos_are_consistent,
    preemption_is_possible,
    accounts_are_consistent,
    users_have_accounts,
    health_check_is_meaningful,
)


def cross_field_problems(config: StackConfig) -> list[Problem]:
    return [problem for check in CHECKS for problem in check(config)]


class CrossFieldError(ValueError):
    """Every cross-field problem of a StackConfig at once. A ValueError, so pydantic reports it as
    one validation error at the top level, the Problems kept in the error's ``ctx["error"]``."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        count = len(problems)
        lines = "".join(f"\n  {problem}" for problem in problems)
        super().__init__(f"{count} cross-field problem{'s' if count != 1 else ''}:{lines}")


def trust_warnings(config: StackConfig) -> list[str]:
    """What the config allows that its author may not mean: valid, so not refused, but said at every preview."""
    submission = config.submission
    users = sorted({identity.user for identity in submission.identities})
    if not submission.enabled or len(users) < 2:
        return []
    return [
        f"submission.identities: the ServiceAccounts of Slurm users {', '.join(users)} share the namespace "
        f"{submission.namespace}, and a pod there may use any ServiceAccount of its namespace: whoever can create "
        "pods in it can submit jobs as any of these users (one trust boundary). Users who must not act as each "
        "other need stacks of their own (docs/security.md)"
    ]
