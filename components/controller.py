"""slurmctld: a StatefulSet with stable DNS names, its state on a claim, optional backup."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from dualsched.components.common import (
    bind_role,
    child,
    claim_volume,
    config_map_volume,
    control_daemon_placement,
    empty_dir,
    exec_probe,
    labels,
    locked_down,
    meta,
    mount,
    requirements,
    stateful,
    tcp_probe,
)
from dualsched.components.identity import SLURM_UID, identity_mounts, identity_volume, users_annotation
from dualsched.components.metrics import COLLECTOR_PROGRAM, EXPORTER_PROGRAM, STATE_DIR, STATE_VOLUME, collector_command, exporter_container
from dualsched.components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from dualsched.components.programs import source
from dualsched.components.tokens import jwt_key_mount, jwt_key_volume
from dualsched.components.namespace import SLURMCTLD_PORT
from dualsched.components.nodepools import GUARDED_POOL_LABEL, KEPT_BY_LABEL, pool_labels
from dualsched.components.slurm_config import CONFIG_DIR, SLURM_CONF, SLURM_CONF_ENV
from dualsched.components.slurm_files import (
    ACCOUNTING_STATE_FILE, CONTROLLER_SERVICE, NODES_BY_RECONFIGURE_SINCE, WINDOW_RESERVATIONS_FILE, Site,
)
from dualsched.components.submission import PROGRAM_DIR
from dualsched.config.models import StackConfig

CONFIG_HASH_ANNOTATION = "dualsched.io/slurm-restart-hash"
"""On slurmctld's pod template: the hash of the slurm.conf settings only a restart applies."""
RECONFIGURE_INTERVAL = 10
WINDOW_RESERVATIONS = "window_reservations.sh"
ACCOUNTING_STATE = "accounting_state.sh"
CORDON_DRAIN = "cordon_drain.sh"
RESUME_REGISTERED = "resume_registered.sh"
ACCOUNTING_BEFORE_STOP = "accounting_before_stop.sh"
"""slurmctld's preStop hook: it stops once slurmdbd has every job's record as slurmctld knows it (why: in the file)."""
ACCOUNTING_WAIT_LIMIT = 20
"""The most seconds that hook waits (slurmdbd down, say): slurmctld then stops anyway."""
STOP_GRACE = ACCOUNTING_WAIT_LIMIT + 30
"""slurmctld's pod's termination grace: the hook's wait, then slurmctld's own state save after SIGTERM."""
CORDON_WATCH = "cordon_watch.py"
CORDON_WATCH_NODES = "cordon-watch-nodes"
"""In the programs ConfigMap: the Slurm pool nodes cordon_watch.py reads, one a line."""
CORDON_DIR = "/run/dualsched-cordon"
CORDONED_FILE = f"{CORDON_DIR}/cordoned"
"""cordon_watch.py's list of cordoned pool nodes; cordon_drain.sh drains them. Absent without the watcher."""
LEFT_FILE = f"{CORDON_DIR}/left"
"""cordon_watch.py's list of the nodes that left a pool they joined by label; cordon_drain.sh drains them, then
deletes them from Slurm."""
PROGRAMS_CONFIG_MAP = "slurmctld-programs"

# The kubelet swaps a changed ConfigMap into the mounted directory atomically; when the files
# differ from what slurmctld last read, tell it to re-read them. Configless slurmd follow.
# Every round also makes the inference windows' reservations match their file (it prints nothing
# when they do): at start, within a round of a change, and back within a round when one was
# deleted by hand or slurmctld moved a window that began inside its hours. Likewise slurmdbd's QOS,
# accounts and associations are made to match theirs (accounting_state.sh; nothing without accounting),
# and cordoned Kubernetes nodes are drained in Slurm (cordon_drain.sh; nothing without the watcher's list),
# and nodes Slurm drained for registering short of a slurm.conf line they now match are resumed
# (resume_registered.sh: a pool change's new slurmd pod can register before slurmctld reads the new files).
# Before Slurm 23.11 (a node change restarts slurmctld there: components/slurm_files.py, restart_keys) the first
# reconfigure comes once slurmctld answers after the pod starts: a slurmctld started anew pushes no files to the
# configless slurmd, whose cached slurm.conf would then lack a node added by that restart, and steps fanned out
# through them, and clients that read it, could not reach it. 22.05 reconfigures in place. From 23.11 a node change
# alone is a reconfigure, which pushes the files, and a reconfigure starts slurmctld anew in place: one sent as
# slurmctld starts, while the slurmd register, left a node registered by its name rather than its address in 2 of 3
# full multi-node runs on 24.11 (its NodeAddr its name, which nothing resolves: slurmctld could not reach it, and a
# later slurm.conf change never got there), and once crash-looped both controllers. So from 23.11 the loop starts
# from the files as they are. What that leaves: one change that alters both a restart key and node lines restarts
# slurmctld, and the slurmd caches lack the new nodes until the next reconfigure (docs/architecture.md).
# Only the sidecar beside the controller in charge runs a round; the other pod's would ask the same slurmctld (and
# slurmdbd) the same again, a reservation or QOS made twice at once failing one of them.
# Two at once, as both pods start, stalled 24.11's primary while the first restarted it in place, and the two
# controllers then took control from each other until `pulumi up` timed out (the multi-node tier). The primary's pod
# is in charge while its slurmctld answers. A backup's pod is in charge only once no controller before it has
# answered for longer than SlurmctldTimeout, when the backup takes control (src/slurmctld/backup.c): a primary
# restarting itself in place for a reconfigure (from 23.11) is down for seconds, and a backup that asked then
# would have its request wait for the primary (a standby backup answers ESLURM_IN_STANDBY_MODE and the client
# tries the primary again) and restart it a second time. A backup that takes over reconfigures once.


def in_charge(slurmctld_timeout: int) -> str:
    """A shell function, `in_charge`: true in the pod whose slurmctld clients, `scontrol reconfigure` among them, now
    reach. ``alone_since`` is when this backup was first seen up with every controller before it down."""
    return (
        "in_charge() { "
        'first=$(scontrol ping | grep -m1 " is UP"); '
        'case "$first" in '
        '*"(primary) at $(uname -n) is UP") return 0;; '
        '*" at $(uname -n) is UP") ;; '
        '*) alone_since=""; return 1;; '
        "esac; "
        't=$(date +%s); alone_since=${alone_since:-$t}; '
        f'[ $((t - alone_since)) -gt {slurmctld_timeout} ]; '
        "}; "
    )


def reconfigure_loop(slurmctld_timeout: int, release: tuple[int, int]) -> str:
    """The reconfigure sidecar's shell loop for a Slurm release."""
    first = 'seen=""; ' if release < NODES_BY_RECONFIGURE_SINCE else f"seen=$(cat {CONFIG_DIR}/*.conf | cksum); "
    return (
        in_charge(slurmctld_timeout)
        + first
        + 'alone_since=""; '
        "while :; do "
        "if in_charge; then "
        f"sh {PROGRAM_DIR}/{WINDOW_RESERVATIONS} {CONFIG_DIR}/{WINDOW_RESERVATIONS_FILE}; "
        f"sh {PROGRAM_DIR}/{ACCOUNTING_STATE} {CONFIG_DIR}/{ACCOUNTING_STATE_FILE}; "
        f"sh {PROGRAM_DIR}/{CORDON_DRAIN} {CORDONED_FILE} {LEFT_FILE}; "
        f"sh {PROGRAM_DIR}/{RESUME_REGISTERED}; "
        f"now=$(cat {CONFIG_DIR}/*.conf | cksum); "
        'if [ "$now" != "$seen" ]; then '
        'echo "slurmctld started or the slurm files changed: scontrol reconfigure"; '
        'scontrol reconfigure && seen="$now"; '
        "fi; "
        "fi; "
        f"sleep {RECONFIGURE_INTERVAL}; "
        "done"
    )


def accounting_before_stop() -> k8s.core.v1.LifecycleArgs:
    """slurmctld's preStop hook: the kubelet runs it, and sends SIGTERM once it ends."""
    command = ["sh", f"{PROGRAM_DIR}/{ACCOUNTING_BEFORE_STOP}", str(ACCOUNTING_WAIT_LIMIT)]
    return k8s.core.v1.LifecycleArgs(pre_stop=k8s.core.v1.LifecycleHandlerArgs(exec_=k8s.core.v1.ExecActionArgs(command=command)))


def slurm_client(
    name: str,
    image: str,
    command: list[str],
    probe: Optional[k8s.core.v1.ProbeArgs] = None,
    extra_mounts: tuple[k8s.core.v1.VolumeMountArgs, ...] = (),
) -> k8s.core.v1.ContainerArgs:
    """A small container of Slurm client commands beside slurmctld, as SlurmUser with its munge socket."""
    return k8s.core.v1.ContainerArgs(
        name=name,
        image=image,
        command=command,
        env=[SLURM_CONF_ENV],
        liveness_probe=probe,
        readiness_probe=probe,
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
        ),
        volume_mounts=[
            mount("slurm-config", CONFIG_DIR, read_only=True),
            *extra_mounts,
            munge_socket_mount(),
            *identity_mounts(),
        ],
        security_context=locked_down(run_as_user=SLURM_UID),
    )


CORDON_VOLUME = "cordon"
NODE_READER_TOKEN = "node-reader-token"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def cordon_watch(image: str) -> k8s.core.v1.ContainerArgs:
    """cordon_watch.py beside slurmctld: the only container of the pod with a ServiceAccount token,
    which may get the pool nodes by name and nothing else."""
    return k8s.core.v1.ContainerArgs(
        name="cordon-watch",
        image=image,
        command=["python3", f"{PROGRAM_DIR}/{CORDON_WATCH}"],
        env=[
            k8s.core.v1.EnvVarArgs(name="WATCH_NODES_FILE", value=f"{PROGRAM_DIR}/{CORDON_WATCH_NODES}"),
            k8s.core.v1.EnvVarArgs(name="WATCH_OUT_FILE", value=CORDONED_FILE),
            k8s.core.v1.EnvVarArgs(name="WATCH_LEFT_FILE", value=LEFT_FILE),
            k8s.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"),
        ],
        # ready once a round has read every pool node; alive while it can read the nodes it watches
        readiness_probe=exec_probe(["test", "-r", CORDONED_FILE], period=10),
        liveness_probe=exec_probe(["test", "-r", f"{PROGRAM_DIR}/{CORDON_WATCH_NODES}"], period=30),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
        ),
        volume_mounts=[
            mount("programs", PROGRAM_DIR, read_only=True),
            mount(CORDON_VOLUME, CORDON_DIR),
            mount(NODE_READER_TOKEN, SERVICE_ACCOUNT_DIR, read_only=True),
        ],
        security_context=locked_down(run_as_user=SLURM_UID),
    )


def node_reader_token_volume() -> k8s.core.v1.VolumeArgs:
    """The pod's ServiceAccount token and the API server's CA, as the kubelet would automount them,
    but mounted into the watcher alone: slurmctld and the Slurm clients get no token."""
    return k8s.core.v1.VolumeArgs(
        name=NODE_READER_TOKEN,
        projected=k8s.core.v1.ProjectedVolumeSourceArgs(
            sources=[
                k8s.core.v1.VolumeProjectionArgs(
                    service_account_token=k8s.core.v1.ServiceAccountTokenProjectionArgs(path="token", expiration_seconds=3600)
                ),
                k8s.core.v1.VolumeProjectionArgs(
                    config_map=k8s.core.v1.ConfigMapProjectionArgs(
                        name="kube-root-ca.crt", items=[k8s.core.v1.KeyToPathArgs(key="ca.crt", path="ca.crt")]
                    )
                ),
            ]
        ),
    )


def own_state_directory(image: str, site: Site) -> k8s.core.v1.ContainerArgs:
    """The state directory SlurmUser's, only it (0700): slurmctld stops at start on a directory it cannot
    write ("Incorrect permissions on state save loc"). The pod's fsGroup does that on volumes whose CSI
    driver applies it, but the default fsGroupPolicy skips ReadWriteMany volumes (the HA claim), and some
    drivers (HPE's Lustre) apply none. Root with CHOWN and FOWNER, on the directory alone: what is in it
    is already slurmctld's."""
    directory = site.state_save_location
    return k8s.core.v1.ContainerArgs(
        name="state-owner",
        image=image,
        command=["sh", "-c", f"chown {SLURM_UID}:{SLURM_UID} {directory} && chmod 0700 {directory}"],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "100m", "memory": "32Mi"}
        ),
        volume_mounts=[mount("state", directory)],
        security_context=locked_down(add_capabilities=("CHOWN", "FOWNER")),
    )


def wait_for_accounting(image: str, site: Site) -> k8s.core.v1.ContainerArgs:
    """With no saved state, slurmctld exits unless slurmdbd answers ("no TRES from the database"): on
    a fresh cluster, wait for it here instead of crash-looping. With saved state slurmctld starts
    at once and queues accounting records while slurmdbd is away, so this waits for nothing."""
    script = (
        f"[ -e {site.state_save_location}/node_state ] && exit 0; "
        "until sacctmgr --noheader --immediate show cluster format=cluster >/dev/null 2>&1; do "
        'echo "waiting for slurmdbd"; sleep 3; done'
    )
    return slurm_client(
        "wait-for-accounting", image, ["sh", "-c", script], extra_mounts=(mount("state", site.state_save_location),)
    )


def controller_programs(config: StackConfig) -> tuple[str, ...]:
    """The programs slurmctld's sidecars and its stop hook run, by file name."""
    metrics = (COLLECTOR_PROGRAM, EXPORTER_PROGRAM) if config.slurm.metrics.enabled else ()
    cordon = (CORDON_WATCH,) if config.slurm.health_check.drain_cordoned else ()
    before_stop = (ACCOUNTING_BEFORE_STOP,) if config.slurm.accounting.enabled else ()
    return (WINDOW_RESERVATIONS, ACCOUNTING_STATE, CORDON_DRAIN, RESUME_REGISTERED, *before_stop, *cordon, *metrics)


def metrics_containers(config: StackConfig) -> list[k8s.core.v1.ContainerArgs]:
    """The Slurm exporter (components/metrics.py): a collector of Slurm's output, an exporter serving it."""
    if not config.slurm.metrics.enabled:
        return []
    collector = slurm_client(
        "metrics-collector",
        config.images.slurmctld,
        collector_command(config.slurm.metrics),
        # alive while it can read its program (a failed round shows in slurm_up, not in the pod)
        probe=exec_probe(["test", "-r", f"{PROGRAM_DIR}/{COLLECTOR_PROGRAM}"], period=30),
        extra_mounts=(mount("programs", PROGRAM_DIR, read_only=True), mount(STATE_VOLUME, STATE_DIR)),
    )
    return [collector, exporter_container(config)]


@dataclass(frozen=True)
class SlurmControllerArgs:
    config: StackConfig
    site: Site
    namespace: pulumi.Input[str]
    config_map_name: str
    restart_hash: str
    munge_secret_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]
    jwt_key_secret_name: pulumi.Input[str]


class SlurmController(pulumi.ComponentResource):
    """slurmctld-0 (and slurmctld-1 as backup when HA) behind the headless Service ``slurmctld``.

    Both replicas mount the one state claim: the backup takes over from the
    state the primary saved, and a restart or rescheduling loses no job.
    """

    address: pulumi.Output[str]

    def __init__(self, name: str, args: SlurmControllerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:controller:SlurmController", name, None, opts)
        config, site = args.config, args.site
        controller = config.slurm.controller
        pod_labels = labels(CONTROLLER_SERVICE, config.slurm.cluster_name)

        state = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-state",
            metadata=meta(namespace=args.namespace, labels=pod_labels),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=[controller.state_storage.access_mode.value],
                storage_class_name=controller.state_storage.storage_class,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": controller.state_storage.size}),
            ),
            opts=stateful(self, config.protect_state),
        )
        k8s.core.v1.Service(
            f"{name}-headless",
            metadata=meta(name=CONTROLLER_SERVICE, namespace=args.namespace, labels=pod_labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None",
                # The backup must resolve before it is Ready, or it cannot take over.
                publish_not_ready_addresses=True,
                selector=pod_labels,
                ports=[k8s.core.v1.ServicePortArgs(name="slurmctld", port=SLURMCTLD_PORT, target_port=SLURMCTLD_PORT)],
            ),
            opts=child(self),
        )
        # A fixed name, mounted as a directory: a new script reaches the sidecar in place, as the
        # Slurm files do, and never rolls slurmctld.
        programs = k8s.core.v1.ConfigMap(
            f"{name}-programs",
            metadata=meta(name=PROGRAMS_CONFIG_MAP, namespace=args.namespace, labels=pod_labels),
            data=self._programs(config),
            opts=child(self),
        )
        account = self._node_reader(name, config, args.namespace, pod_labels) if config.slurm.health_check.drain_cordoned else None
        statefulset = k8s.apps.v1.StatefulSet(
            name,
            metadata=meta(name=CONTROLLER_SERVICE, namespace=args.namespace, labels=pod_labels),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                # The name, not the Service's output: the engine waits for a Service to have ready
                # endpoints, which only this StatefulSet's pods can give it.
                service_name=CONTROLLER_SERVICE,
                replicas=len(site.controller_hosts),
                pod_management_policy="Parallel",
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pod_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(
                        labels=pod_labels,
                        annotations={CONFIG_HASH_ANNOTATION: args.restart_hash, **users_annotation(config)},
                    ),
                    spec=self._pod_spec(args, state.metadata.name, account),
                ),
            ),
            opts=child(self, depends_on=[programs]),
        )
        self.address = pulumi.Output.concat(
            site.controller_hosts[0].address or site.controller_hosts[0].name, ":", str(site.slurmctld_port)
        )
        self.statefulset_name = statefulset.metadata.name
        self.register_outputs({"address": self.address, "statefulset_name": self.statefulset_name})

    @staticmethod
    def _programs(config: StackConfig) -> dict[str, str]:
        programs = {name: source(name) for name in controller_programs(config)}
        if config.slurm.health_check.drain_cordoned:
            programs[CORDON_WATCH_NODES] = watch_list(config)
        return programs

    def _node_reader(
        self, name: str, config: StackConfig, namespace: pulumi.Input[str], pod_labels: dict[str, str]
    ) -> pulumi.Output[str]:
        """A ServiceAccount that may get the Slurm pool nodes, by name (Nodes are cluster-scoped: a ClusterRole)."""
        account = k8s.core.v1.ServiceAccount(f"{name}-node-reader", metadata=meta(namespace=namespace, labels=pod_labels), opts=child(self))
        rule = k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], resource_names=slurm_nodes(config), verbs=["get"])
        bind_role(self, f"{name}-node-reader", account, namespace, pod_labels, rule, cluster_wide=True)
        return account.metadata.name

    @staticmethod
    def _pod_spec(
        args: SlurmControllerArgs, state_claim: pulumi.Input[str], node_reader: Optional[pulumi.Input[str]]
    ) -> k8s.core.v1.PodSpecArgs:
        config, site = args.config, args.site
        watch = node_reader is not None
        return k8s.core.v1.PodSpecArgs(
            # named even without the watcher: the API server copies the deprecated serviceAccount it defaulted
            # back into an omitted serviceAccountName, so dropping the field would keep a deleted account
            service_account_name=node_reader if watch else "default",
            automount_service_account_token=False,
            **control_daemon_placement(config, spread=labels(CONTROLLER_SERVICE, config.slurm.cluster_name) if config.slurm.controller.ha else None),
            security_context=k8s.core.v1.PodSecurityContextArgs(fs_group=SLURM_UID),
            termination_grace_period_seconds=STOP_GRACE,
            init_containers=[
                own_state_directory(config.images.slurmctld, site),
                munged_sidecar(config.images.slurmd),
                *([wait_for_accounting(config.images.slurmctld, site)] if config.slurm.accounting.enabled else []),
            ],
            containers=[
                k8s.core.v1.ContainerArgs(
                    name="slurmctld",
                    image=config.images.slurmctld,
                    command=["slurmctld", "-D", "-f", SLURM_CONF],
                    env=[SLURM_CONF_ENV],
                    ports=[k8s.core.v1.ContainerPortArgs(name="slurmctld", container_port=site.slurmctld_port)],
                    resources=requirements(config.slurm.controller.resources),
                    startup_probe=tcp_probe(site.slurmctld_port, period=5, failures=60),
                    liveness_probe=tcp_probe(site.slurmctld_port, period=15),
                    readiness_probe=exec_probe(["scontrol", "ping"], period=15),
                    lifecycle=accounting_before_stop() if config.slurm.accounting.enabled else None,
                    volume_mounts=[
                        mount("slurm-config", CONFIG_DIR, read_only=True),
                        *([mount("programs", PROGRAM_DIR, read_only=True)] if config.slurm.accounting.enabled else []),
                        mount("state", site.state_save_location),
                        mount("run", site.run_dir),
                        mount("tmp", "/tmp"),
                        munge_socket_mount(),
                        jwt_key_mount(),
                        *identity_mounts(),
                    ],
                    security_context=locked_down(run_as_user=SLURM_UID),
                ),
                slurm_client(
                    "reconfigure",
                    config.images.slurmctld,
                    ["sh", "-c", reconfigure_loop(config.slurm.controller.slurmctld_timeout, config.slurm.release_version)],
                    # alive while it can read what it watches
                    probe=exec_probe(["test", "-r", SLURM_CONF], period=30),
                    extra_mounts=(
                        mount("programs", PROGRAM_DIR, read_only=True),
                        *([mount(CORDON_VOLUME, CORDON_DIR, read_only=True)] if watch else []),
                    ),
                ),
                *metrics_containers(config),
                *([cordon_watch(config.images.python)] if watch else []),
            ],
            volumes=[
                config_map_volume("slurm-config", args.config_map_name),
                config_map_volume("programs", PROGRAMS_CONFIG_MAP),
                claim_volume("state", state_claim),
                empty_dir("run"),
                empty_dir("tmp"),
                *munge_volumes(args.munge_secret_name),
                jwt_key_volume(args.jwt_key_secret_name),
                identity_volume(args.identity_config_map_name),
                *([empty_dir(STATE_VOLUME)] if config.slurm.metrics.enabled else []),
                *([empty_dir(CORDON_VOLUME, medium="Memory"), node_reader_token_volume()] if watch else []),
            ],
        )


def watch_list(config: StackConfig) -> str:
    """cordon_watch.py's nodes, a line each: every Slurm pool node, and after a node of a pool whose nodes join by label
    the labels the node keeper sets on its members (the guarded pool label, which no kubelet can set, and this stack's
    kept-by): without them the node left."""
    lines = {}
    for pool in config.slurm_pools:
        member = {key: value for key, value in pool_labels(config, pool).items() if key in (GUARDED_POOL_LABEL, KEPT_BY_LABEL)}
        suffix = " " + ",".join(f"{key}={value}" for key, value in member.items()) if pool.join_by_label else ""
        lines.update({node: f"{node}{suffix}\n" for node in pool.node_names})
    return "".join(lines[node] for node in sorted(lines))


def slurm_nodes(config: StackConfig) -> list[str]:
    """Every node of the pools that run slurmd: the Kubernetes node names slurmd registers as (-N)."""
    return sorted({node for pool in config.slurm_pools for node in pool.node_names})
