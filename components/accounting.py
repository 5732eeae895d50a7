"""slurmdbd and its database: an in-cluster MariaDB (dev) or an external host (prod)."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from components.common import (
    child,
    claim_volume,
    empty_dir,
    exec_probe,
    labels,
    locked_down,
    meta,
    mount,
    off_gpu_pools,
    requirements,
    stateful,
    tcp_probe,
)
from components.controller import SLURM_UID
from components.munge import munge_socket_mount, munge_volumes, munged_sidecar
from components.namespace import MYSQL_PORT, SLURMDBD_PORT
from components.slurm_files import ACCOUNTING_SERVICE, DATABASE_SERVICE, Site, render_slurmdbd_conf
from config.models import DatabaseMode, StackConfig

MARIADB_UID = 999
"""The mysql user of the official MariaDB image."""
PASSWORD_KEY = "password"
DB_PASSWORD_DIR = "/run/secrets/db"


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


class Accounting(pulumi.ComponentResource):
    """slurmdbd behind the Service ``slurmdbd``, and the database it records jobs in.

    slurmdbd.conf is kept in a Secret without its password; an init container
    appends StoragePass from the database password Secret at start-up, so the
    password is never part of a rendered file, the Pulumi state or a ConfigMap.
    """

    def __init__(self, name: str, args: AccountingArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("dualsched:accounting:Accounting", name, None, opts)
        config = args.config
        database = config.slurm.accounting.database
        if database.mode is DatabaseMode.IN_CLUSTER:
            password_secret, password_key = self._in_cluster_database(name, args)
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
        service = k8s.core.v1.Service(
            f"{name}-db",
            metadata=meta(name=DATABASE_SERVICE, namespace=args.namespace, labels=db_labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=db_labels, ports=[k8s.core.v1.ServicePortArgs(name="mysql", port=MYSQL_PORT, target_port=MYSQL_PORT)]
            ),
            opts=child(self),
        )
        env = [
            k8s.core.v1.EnvVarArgs(name="MARIADB_DATABASE", value=site.database.name),
            k8s.core.v1.EnvVarArgs(name="MARIADB_USER", value=site.database.user),
            # The entrypoint reads the password from the mounted Secret, never from the environment.
            k8s.core.v1.EnvVarArgs(name="MARIADB_PASSWORD_FILE", value=f"{DB_PASSWORD_DIR}/{PASSWORD_KEY}"),
            k8s.core.v1.EnvVarArgs(name="MARIADB_RANDOM_ROOT_PASSWORD", value="1"),
        ]
        health = ["healthcheck.sh", "--connect", "--innodb_initialized"]
        k8s.apps.v1.StatefulSet(
            f"{name}-db",
            metadata=meta(name=DATABASE_SERVICE, namespace=args.namespace, labels=db_labels),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                service_name=service.metadata.name,
                replicas=1,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=db_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=db_labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        automount_service_account_token=False,
                        affinity=off_gpu_pools(config.placement.pool_label),
                        security_context=k8s.core.v1.PodSecurityContextArgs(fs_group=MARIADB_UID),
                        containers=[
                            k8s.core.v1.ContainerArgs(
                                name="mariadb",
                                image=config.images.mariadb,
                                env=env,
                                ports=[k8s.core.v1.ContainerPortArgs(name="mysql", container_port=MYSQL_PORT)],
                                resources=requirements(settings.resources),
                                startup_probe=exec_probe(health, period=5, failures=60),
                                liveness_probe=exec_probe(health, period=20),
                                readiness_probe=exec_probe(health, period=10),
                                volume_mounts=[
                                    mount("data", "/var/lib/mysql"),
                                    mount("db-password", DB_PASSWORD_DIR, read_only=True),
                                    mount("run", "/run/mysqld"),
                                    mount("tmp", "/tmp"),
                                ],
                                security_context=locked_down(run_as_user=MARIADB_UID),
                            )
                        ],
                        volumes=[
                            claim_volume("data", claim.metadata.name),
                            password_volume(secret.metadata.name, PASSWORD_KEY),
                            empty_dir("run"),
                            empty_dir("tmp"),
                        ],
                    ),
                ),
            ),
            opts=child(self, protect=config.protect_state),
        )
        return secret.metadata.name, PASSWORD_KEY

    def _slurmdbd(self, name: str, args: AccountingArgs, password_secret: pulumi.Input[str], password_key: str) -> None:
        config, site = args.config, args.site
        dbd_labels = labels(ACCOUNTING_SERVICE, config.slurm.cluster_name)
        conf = k8s.core.v1.Secret(
            f"{name}-slurmdbd-conf",
            metadata=meta(namespace=args.namespace, labels=dbd_labels),
            type="Opaque",
            string_data={"slurmdbd.conf": render_slurmdbd_conf(config, site)},
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
                    metadata=meta(labels=dbd_labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        hostname=site.dbd_host,
                        automount_service_account_token=False,
                        affinity=off_gpu_pools(config.placement.pool_label),
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
                                volume_mounts=[mount("conf", CONF_DIR), mount("run", site.run_dir), munge_socket_mount()],
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
                            *munge_volumes(args.munge_secret_name),
                        ],
                    ),
                ),
            ),
            opts=child(self),
        )
