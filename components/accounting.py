"""slurmdbd and its database: an in-cluster MariaDB (dev) or an external host (prod)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dualsched.components.common import (
    child,
    claim_volume,
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
from dualsched.components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from dualsched.components.namespace import MYSQL_PORT, SLURMDBD_PORT
from dualsched.components.slurm_files import ACCOUNTING_SERVICE, DATABASE_SERVICE, Site, config_hash, render_slurmdbd_conf
from dualsched.config.models import DatabaseMode, ExternalDatabase, StackConfig

MARIADB_UID = 999
"""The mysql user of the official MariaDB image; the pod needs no account of that name."""
PASSWORD_KEY = "password"
DB_PASSWORD_DIR = "/run/secrets/db"
CONFIG_HASH_ANNOTATION = "dualsched.io/slurmdbd-config-hash"
"""slurmdbd reads slurmdbd.conf when it starts, and its Secret is updated in place: the hash restarts the pod."""
DATA_DIR = "/var/lib/mysql"
SOCKET_DIR = "/run/mysqld"
INIT_DIR = "/run/mysqld-init"


def database_init_script(database: str, user: str) -> str:
    """Shell for the init container: a data directory on first start, and an --init-file that
    (re)creates slurmdbd's database and user with the password in the Secret at every start.

    No image entrypoint is involved, so the official image and a Debian one behave alike; root
    is only ever ``root@localhost`` over the socket (mariadb-install-db's default), with no password
    to print or to leak.
    """
    # printf's format in single quotes, \047 for SQL's quotes, every value an argument: nothing
    # in a name or the password is ever read by the shell.
    grants = (
        "CREATE DATABASE IF NOT EXISTS %s;\\n"
        "CREATE USER IF NOT EXISTS \\047%s\\047@\\047%%\\047 IDENTIFIED BY \\047%s\\047;\\n"
        "ALTER USER \\047%s\\047@\\047%%\\047 IDENTIFIED BY \\047%s\\047;\\n"
        "GRANT ALL PRIVILEGES ON %s.* TO \\047%s\\047@\\047%%\\047;\\n"
    )
    values = " ".join(shlex.quote(value) for value in (database, user))
    return " && ".join(
        [
            "umask 077",
            # a failed first install leaves a partial mysql/ behind: remove it, or the next start skips the install
            f"if [ ! -d {DATA_DIR}/mysql ]; then mariadb-install-db --no-defaults --datadir={DATA_DIR} --skip-test-db"
            f" --auth-root-authentication-method=socket || {{ rm -rf {DATA_DIR}/mysql; exit 1; }}; fi",
            f'password="$(cat {DB_PASSWORD_DIR}/{PASSWORD_KEY})"',
            f"printf '{grants}' {values} \"$password\" {shlex.quote(user)} \"$password\" {values} > {INIT_DIR}/init.sql",
        ]
    )


def mariadb_command() -> list[str]:
    return [
        "mariadbd", "--no-defaults",
        f"--datadir={DATA_DIR}", f"--socket={SOCKET_DIR}/mysqld.sock", f"--port={MYSQL_PORT}",
        "--bind-address=0.0.0.0", "--skip-name-resolve", f"--init-file={INIT_DIR}/init.sql",
        # slurmdbd's recommended settings (slurmdbd.conf(5), "innodb_lock_wait_timeout").
        "--innodb-lock-wait-timeout=900", "--innodb-buffer-pool-size=256M",
    ]  # fmt: skip


def password_volume(secret_name: pulumi.Input[str], key: str) -> k8s.core.v1.VolumeArgs:
    """The database password Secret as a read-only file, ``key`` inside the volume."""
    return k8s.core.v1.VolumeArgs(
        name="db-password",
        secret=k8s.core.v1.SecretVolumeSourceArgs(
            secret_name=secret_name, items=[k8s.core.v1.KeyToPathArgs(key=key, path=key)], default_mode=0o440
        ),
    )
CONF_DIR = "/etc/slurm"


@dataclass(frozen=True)
class AccountingArgs:
    config: StackConfig
    site: Site
    namespace: pulumi.Input[str]
    munge_secret_name: pulumi.Input[str]
    identity_config_map_name: pulumi.Input[str]


class Accounting(pulumi.ComponentResource):
    """slurmdbd behind the Service ``slurmdbd``, and the database it records jobs in.

    slurmdbd.conf is kept in a Secret without its password; an init container
    appends StoragePass from the database password Secret at start-up, so the
    password is never part of a rendered file or a ConfigMap, and is in the
    Pulumi state only encrypted: generated (in-cluster), given as a Pulumi
    secret (external ``password``) or never seen (external ``passwordSecret``).
    """

    def __init__(self, name: str, args: AccountingArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:accounting:Accounting", name, None, opts)
        config = args.config
        database = config.slurm.accounting.database
        if database.mode is DatabaseMode.IN_CLUSTER:
            password_secret, password_key = self._in_cluster_database(name, args)
        elif database.external.password is not None:
            password_secret, password_key = self._external_password(name, args, database.external), PASSWORD_KEY
        else:
            password_secret, password_key = database.external.password_secret.name, database.external.password_secret.key
        self._slurmdbd(name, args, password_secret, password_key)
        self.register_outputs({"host": args.site.accounting_host})

    def _in_cluster_database(self, name: str, args: AccountingArgs) -> tuple[pulumi.Output[str], str]:
        config, site = args.config, args.site
        settings = config.slurm.accounting.database.in_cluster
        db_labels = labels(DATABASE_SERVICE, config.slurm.cluster_name)
        password = random.RandomPassword(f"{name}-db-password", length=32, special=False, opts=child(self))
        secret = k8s.core.v1.Secret(
            f"{name}-db-password",
            metadata=meta(namespace=args.namespace, labels=db_labels),
            type="Opaque",
            string_data={PASSWORD_KEY: password.result},
            opts=child(self),
        )
        claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-db-data",
            metadata=meta(namespace=args.namespace, labels=db_labels),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=["ReadWriteOnce"],
                storage_class_name=settings.storage_class,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": settings.size}),
            ),
            opts=stateful(self, config.protect_state),
        )
        k8s.core.v1.Service(
            f"{name}-db",
            metadata=meta(name=DATABASE_SERVICE, namespace=args.namespace, labels=db_labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=db_labels, ports=[k8s.core.v1.ServicePortArgs(name="mysql", port=MYSQL_PORT, target_port=MYSQL_PORT)]
            ),
            opts=child(self),
        )
        health = ["mariadb-admin", f"--socket={SOCKET_DIR}/mysqld.sock", "ping"]
        data_mount = mount("data", DATA_DIR)
        init_mount = mount("init", INIT_DIR)
        k8s.apps.v1.StatefulSet(
            f"{name}-db",
            metadata=meta(name=DATABASE_SERVICE, namespace=args.namespace, labels=db_labels),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                # The name, not the Service's output: the engine waits for a Service to have ready
                # endpoints, which only this StatefulSet's pods can give it.
                service_name=DATABASE_SERVICE,
                replicas=1,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=db_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=db_labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        automount_service_account_token=False,
                        **control_daemon_placement(config),
                        security_context=k8s.core.v1.PodSecurityContextArgs(fs_group=MARIADB_UID),
                        init_containers=[
                            k8s.core.v1.ContainerArgs(
                                name="mariadb-init",
                                image=config.images.mariadb,
                                command=["sh", "-c", database_init_script(site.database.name, site.database.user)],
                                resources=requirements(settings.resources),
                                volume_mounts=[
                                    data_mount,
                                    init_mount,
                                    mount("db-password", DB_PASSWORD_DIR, read_only=True),
                                    mount("tmp", "/tmp"),
                                ],
                                security_context=locked_down(run_as_user=MARIADB_UID),
                            )
                        ],
                        containers=[
                            k8s.core.v1.ContainerArgs(
                                name="mariadb",
                                image=config.images.mariadb,
                                command=mariadb_command(),
                                ports=[k8s.core.v1.ContainerPortArgs(name="mysql", container_port=MYSQL_PORT)],
                                resources=requirements(settings.resources),
                                startup_probe=exec_probe(health, period=5, failures=60),
                                liveness_probe=exec_probe(health, period=20),
                                readiness_probe=exec_probe(health, period=10),
                                volume_mounts=[data_mount, init_mount, mount("run", SOCKET_DIR), mount("tmp", "/tmp")],
                                security_context=locked_down(run_as_user=MARIADB_UID),
                            )
                        ],
                        volumes=[
                            claim_volume("data", claim.metadata.name),
                            password_volume(secret.metadata.name, PASSWORD_KEY),
                            # The init file holds the password: memory only, never on the claim.
                            empty_dir("init", medium="Memory"),
                            empty_dir("run"),
                            empty_dir("tmp"),
                        ],
                    ),
                ),
            ),
            opts=child(self, protect=config.protect_state),
        )
        return secret.metadata.name, PASSWORD_KEY

    def _external_password(self, name: str, args: AccountingArgs, external: ExternalDatabase) -> pulumi.Output[str]:
        """A Secret holding the external database's password from the config; its name."""
        secret = k8s.core.v1.Secret(
            f"{name}-db-password",
            metadata=meta(namespace=args.namespace, labels=labels(ACCOUNTING_SERVICE, args.config.slurm.cluster_name)),
            type="Opaque",
            # Encrypted in the state, [secret] in previews. pulumi-kubernetes marks a Secret's stringData
            # secret as well; Output.secret says so here, where the value leaves the config.
            string_data={PASSWORD_KEY: pulumi.Output.secret(external.password.reveal())},
            opts=child(self),
        )
        return secret.metadata.name

    def _slurmdbd(self, name: str, args: AccountingArgs, password_secret: pulumi.Input[str], password_key: str) -> None:
        config, site = args.config, args.site
        dbd_labels = labels(ACCOUNTING_SERVICE, config.slurm.cluster_name)
        conf_files = {"slurmdbd.conf": render_slurmdbd_conf(config, site)}
        conf = k8s.core.v1.Secret(
            f"{name}-slurmdbd-conf",
            metadata=meta(namespace=args.namespace, labels=dbd_labels),
            type="Opaque",
            string_data=conf_files,
            opts=child(self),
        )
        k8s.core.v1.Service(
            f"{name}-slurmdbd",
            metadata=meta(name=ACCOUNTING_SERVICE, namespace=args.namespace, labels=dbd_labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=dbd_labels,
                ports=[k8s.core.v1.ServicePortArgs(name="slurmdbd", port=SLURMDBD_PORT, target_port=site.slurmdbd_port)],
            ),
            opts=child(self),
        )
        # slurmdbd refuses a slurmdbd.conf that is not 0600 and owned by SlurmUser.
        assemble = (
            f"umask 077 && cp /conf-template/slurmdbd.conf {CONF_DIR}/slurmdbd.conf && "
            f'printf "StoragePass=%s\\n" "$(cat /db-password/{password_key})" >> {CONF_DIR}/slurmdbd.conf'
        )
        k8s.apps.v1.Deployment(
            f"{name}-slurmdbd",
            metadata=meta(namespace=args.namespace, labels=dbd_labels),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                # Two slurmdbd against one database would race on its rollups.
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dbd_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=dbd_labels, annotations={
                        CONFIG_HASH_ANNOTATION: config_hash(conf_files),
                        **users_annotation(config),
                    }),
                    spec=k8s.core.v1.PodSpecArgs(
                        hostname=site.dbd_host,
                        automount_service_account_token=False,
                        **control_daemon_placement(config),
                        security_context=k8s.core.v1.PodSecurityContextArgs(fs_group=SLURM_UID),
                        init_containers=[
                            munged_sidecar(config.images.slurmd),
                            k8s.core.v1.ContainerArgs(
                                name="slurmdbd-conf",
                                image=config.images.slurmdbd,
                                command=["sh", "-c", assemble],
                                resources=k8s.core.v1.ResourceRequirementsArgs(
                                    requests={"cpu": "50m", "memory": "32Mi"}, limits={"cpu": "100m", "memory": "64Mi"}
                                ),
                                volume_mounts=[
                                    mount("conf-template", "/conf-template", read_only=True),
                                    mount("db-password", "/db-password", read_only=True),
                                    mount("conf", CONF_DIR),
                                ],
                                security_context=locked_down(run_as_user=SLURM_UID),
                            ),
                        ],
                        containers=[
                            k8s.core.v1.ContainerArgs(
                                name="slurmdbd",
                                image=config.images.slurmdbd,
                                command=["slurmdbd", "-D"],
                                env=[k8s.core.v1.EnvVarArgs(name="SLURM_CONF", value=f"{CONF_DIR}/slurm.conf")],
                                ports=[k8s.core.v1.ContainerPortArgs(name="slurmdbd", container_port=site.slurmdbd_port)],
                                resources=requirements(config.slurm.accounting.resources),
                                startup_probe=tcp_probe(site.slurmdbd_port, period=5, failures=60),
                                liveness_probe=tcp_probe(site.slurmdbd_port, period=20),
                                readiness_probe=tcp_probe(site.slurmdbd_port, period=10),
                                volume_mounts=[
                                    mount("conf", CONF_DIR),
                                    mount("run", site.run_dir),
                                    # ArchiveDir's default: slurmdbd exits when it cannot write there
                                    mount("tmp", "/tmp"),
                                    munge_socket_mount(),
                                    *identity_mounts(),
                                ],
                                security_context=locked_down(run_as_user=SLURM_UID),
                            )
                        ],
                        volumes=[
                            k8s.core.v1.VolumeArgs(
                                name="conf-template", secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=conf.metadata.name)
                            ),
                            password_volume(password_secret, password_key),
                            empty_dir("conf", medium="Memory"),
                            empty_dir("run"),
                            empty_dir("tmp"),
                            *munge_volumes(args.munge_secret_name),
                            identity_volume(args.identity_config_map_name),
                        ],
                    ),
                ),
            ),
            opts=child(self),
        )
