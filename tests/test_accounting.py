"""Accounting: slurmdbd with an in-cluster MariaDB (dev) or an external database (prod)."""

from __future__ import annotations

import pytest

from rendering import container, mounts, render_raw, render_stack, variant, volume, walk


def _slurmdbd(rendered):
    return rendered.one("Deployment", "slurmdbd")


def _slurmdbd_conf(rendered) -> str:
    return rendered.one("Secret", "slurmdbd-conf").manifest["stringData"]["slurmdbd.conf"]


def _password_secret(rendered):
    return rendered.one("Secret", "db-password")


# ------------------------------------------------------------------ in-cluster (dev)


def test_in_cluster_mariadb_statefulset_with_its_own_claim_and_service():
    rendered = render_stack("dev")
    mariadb = rendered.named("StatefulSet", "mariadb", "slurm")
    service = rendered.named("Service", "mariadb", "slurm").manifest
    claim = rendered.one("PersistentVolumeClaim", "db-data")
    assert mariadb.manifest["spec"]["replicas"] == 1
    assert mariadb.manifest["spec"]["serviceName"] == "mariadb"
    assert service["spec"]["ports"] == [{"name": "mysql", "port": 3306, "targetPort": 3306}]
    assert service["spec"]["selector"] == mariadb.manifest["spec"]["template"]["metadata"]["labels"]
    assert claim.namespace == "slurm"
    assert claim.manifest["spec"]["resources"]["requests"] == {"storage": "5Gi"}
    assert volume(mariadb, "data")["persistentVolumeClaim"] == {"claimName": claim.name}
    assert mounts(container(mariadb, "mariadb"))["/var/lib/mysql"]["name"] == "data"
    assert container(mariadb, "mariadb")["image"] == rendered.config.images.mariadb
    registration = rendered.registration(claim)
    assert registration.retain_on_delete is True


def test_mariadb_password_comes_from_the_secret_never_a_literal():
    rendered = render_stack("dev")
    secret = _password_secret(rendered)
    statefulset = rendered.named("StatefulSet", "mariadb")
    mariadb = container(statefulset, "mariadb")
    env = {e["name"]: e for e in mariadb["env"]}
    assert "MARIADB_PASSWORD" not in env
    assert env["MARIADB_PASSWORD_FILE"]["value"] == "/run/secrets/db/password"
    volumes = {v["name"]: v for v in statefulset.manifest["spec"]["template"]["spec"]["volumes"]}
    assert volumes["db-password"]["secret"]["secretName"] == secret.name
    assert {"name": "db-password", "mountPath": "/run/secrets/db", "readOnly": True} in mariadb["volumeMounts"]
    assert env["MARIADB_USER"]["value"] == "slurm" and env["MARIADB_DATABASE"]["value"] == "slurm_acct_db"
    assert "MARIADB_ROOT_PASSWORD" not in env


def test_password_is_generated_and_only_in_its_secret():
    rendered = render_stack("dev")
    password = _password_secret(rendered).manifest["stringData"]["password"]
    assert len(password) == 32 and password in rendered.generated_secrets
    holders = [o for o in rendered.objects if any(password in str(v) for _, v in walk(o.manifest))]
    assert holders == [_password_secret(rendered)]


def test_slurmdbd_reads_the_in_cluster_password_secret():
    rendered = render_stack("dev")
    source = volume(_slurmdbd(rendered), "db-password")["secret"]
    assert source == {
        "secretName": _password_secret(rendered).name,
        "items": [{"key": "password", "path": "password"}],
        "defaultMode": 0o440,
    }
    assert "StorageHost=mariadb.slurm.svc.cluster.local" in _slurmdbd_conf(rendered).splitlines()


# ------------------------------------------------------------------ both


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmdbd_deployment_recreates_and_has_a_service(stack):
    rendered = render_stack(stack)
    deployment = _slurmdbd(rendered).manifest
    service = rendered.named("Service", "slurmdbd", "slurm").manifest
    assert deployment["metadata"]["namespace"] == "slurm"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["spec"]["template"]["spec"]["hostname"] == "slurmdbd"  # DbdHost
    assert service["spec"]["ports"] == [{"name": "slurmdbd", "port": 6819, "targetPort": 6819}]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    slurmdbd = container(_slurmdbd(rendered), "slurmdbd")
    assert slurmdbd["command"] == ["slurmdbd", "-D"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert slurmdbd[probe]["tcpSocket"] == {"port": 6819}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_slurmdbd_conf_is_a_secret_without_storage_pass(stack):
    rendered = render_stack(stack)
    conf = _slurmdbd_conf(rendered)
    assert "DbdHost=slurmdbd" in conf.splitlines()
    assert not [line for line in conf.splitlines() if line.startswith("StoragePass")]
    assert not any(secret in conf for secret in rendered.generated_secrets)
    assert not [c for c in rendered.by_kind("ConfigMap") if "slurmdbd.conf" in c.manifest.get("data", {})]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_storage_pass_is_appended_at_start_up_from_the_password_volume(stack):
    rendered = render_stack(stack)
    deployment = _slurmdbd(rendered)
    init = container(deployment, "slurmdbd-conf")
    script = init["command"][-1]
    assert "StoragePass=" in script and "/db-password/password" in script
    assert mounts(init)["/db-password"] == {"name": "db-password", "mountPath": "/db-password", "readOnly": True}
    assert mounts(init)["/conf-template"]["name"] == "conf-template"
    assert volume(deployment, "conf-template")["secret"]["secretName"] == rendered.one("Secret", "slurmdbd-conf").name
    assert volume(deployment, "conf")["emptyDir"] == {"medium": "Memory"}
    assert mounts(container(deployment, "slurmdbd"))["/etc/slurm"]["name"] == "conf"
    assert not [e for e in container(deployment, "slurmdbd").get("env", []) if "PASS" in e["name"]]


def test_slurmdbd_resources_come_from_config():
    resources = container(_slurmdbd(render_stack("prod")), "slurmdbd")["resources"]
    assert resources == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}


# ------------------------------------------------------------------ external (prod)


def test_external_database_has_no_mariadb_and_no_generated_password():
    rendered = render_stack("prod")
    assert not [s for s in rendered.by_kind("StatefulSet") if s.name == "mariadb"]
    assert not [s for s in rendered.by_kind("Service") if s.name == "mariadb"]
    assert not [c for c in rendered.by_kind("PersistentVolumeClaim") if "db-data" in c.name]
    assert not [r for r in rendered.resources if r.type == "random:index/randomPassword:RandomPassword"]
    assert not [s for s in rendered.by_kind("Secret") if "db-password" in s.name]


def test_external_password_comes_from_the_secret_named_in_config():
    rendered = render_stack("prod")
    source = volume(_slurmdbd(rendered), "db-password")["secret"]
    assert source == {
        "secretName": "slurmdbd-database",
        "items": [{"key": "password", "path": "password"}],
        "defaultMode": 0o440,
    }
    conf = _slurmdbd_conf(rendered).splitlines()
    assert "StorageHost=slurm-acct.db.prod.internal" in conf
    assert "StoragePort=3306" in conf and "StorageUser=slurm" in conf and "StorageLoc=slurm_acct_db" in conf


def test_external_secret_key_is_honoured():
    def other_key(raw):
        raw["slurm"]["accounting"]["database"]["external"]["passwordSecret"] = {"name": "acct-db", "key": "mysql-pass"}

    rendered = render_raw(variant("prod", other_key))
    source = volume(_slurmdbd(rendered), "db-password")["secret"]
    assert source == {"secretName": "acct-db", "items": [{"key": "mysql-pass", "path": "mysql-pass"}], "defaultMode": 0o440}
    assert "/db-password/mysql-pass" in container(_slurmdbd(rendered), "slurmdbd-conf")["command"][-1]


# ------------------------------------------------------------------ disabled


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_accounting_disabled_creates_none_of_it(stack):
    rendered = render_raw(variant(stack, lambda raw: raw["slurm"]["accounting"].update(enabled=False)))
    assert not rendered.components("dualsched:accounting:Accounting")
    assert not [d for d in rendered.by_kind("Deployment") if "slurmdbd" in d.name]
    assert {s.name for s in rendered.by_kind("Service")} & {"slurmdbd", "mariadb"} == set()
    assert not [s for s in rendered.by_kind("StatefulSet") if s.name == "mariadb"]
    assert not [s for s in rendered.by_kind("Secret") if "slurmdbd" in s.name or "db-password" in s.name]
    assert "accounting_storage/slurmdbd" not in rendered.slurm_files["slurm.conf"]
