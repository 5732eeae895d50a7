"""Accounting: slurmdbd with an in-cluster MariaDB (dev) or an external database (prod)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from dualsched.components.accounting import (
    DATA_DIR,
    DB_PASSWORD_DIR,
    INIT_DIR,
    MARIADB_UID,
    PASSWORD_KEY,
    SOCKET_DIR,
    database_init_script,
    mariadb_command,
)
from rendering import container, mounts, pod_spec, render_raw, render_stack, variant, volume, walk


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
    """Only the init container reads the password file; it writes the init SQL to a memory emptyDir."""
    rendered = render_stack("dev")
    secret = _password_secret(rendered)
    statefulset = rendered.named("StatefulSet", "mariadb")
    init, mariadb = container(statefulset, "mariadb-init"), container(statefulset, "mariadb")
    assert volume(statefulset, "db-password")["secret"]["secretName"] == secret.name
    assert mounts(init)["/run/secrets/db"] == {"name": "db-password", "mountPath": "/run/secrets/db", "readOnly": True}
    assert f"{DB_PASSWORD_DIR}/{PASSWORD_KEY}" in init["command"][-1] == database_init_script("slurm_acct_db", "slurm")
    # The server never sees the Secret, only the init file the init container wrote.
    assert "/run/secrets/db" not in mounts(mariadb)
    assert volume(statefulset, "init")["emptyDir"] == {"medium": "Memory"}
    assert mounts(init)["/run/mysqld-init"]["name"] == mounts(mariadb)["/run/mysqld-init"]["name"] == "init"


def test_mariadb_depends_on_no_image_entrypoint_or_environment():
    statefulset = render_stack("dev").named("StatefulSet", "mariadb")
    spec = pod_spec(statefulset)
    for item in spec["containers"] + spec["initContainers"]:
        assert "env" not in item and "envFrom" not in item, item["name"]
        assert item.get("command"), f"{item['name']} runs the image's entrypoint"
        assert "healthcheck.sh" not in str(item)
    assert not [path for path, value in walk(statefulset.manifest) if isinstance(value, str) and "MARIADB_" in value]


def test_mariadb_init_container_then_mariadbd_with_the_init_file():
    rendered = render_stack("dev")
    statefulset = rendered.named("StatefulSet", "mariadb")
    spec = pod_spec(statefulset)
    assert [c["name"] for c in spec["initContainers"]] == ["mariadb-init"]
    init = container(statefulset, "mariadb-init")
    assert init["image"] == rendered.config.images.mariadb
    assert init["command"] == ["sh", "-c", database_init_script("slurm_acct_db", "slurm")]
    assert mounts(init)["/var/lib/mysql"]["name"] == "data"
    mariadb = container(statefulset, "mariadb")
    assert mariadb["command"] == mariadb_command()
    assert mariadb_command()[:2] == ["mariadbd", "--no-defaults"]
    assert f"--init-file={INIT_DIR}/init.sql" in mariadb_command()
    assert f"--datadir={DATA_DIR}" in mariadb_command() and f"--socket={SOCKET_DIR}/mysqld.sock" in mariadb_command()
    assert "--port=3306" in mariadb_command() and "--bind-address=0.0.0.0" in mariadb_command()
    for item in (init, mariadb):
        context = item["securityContext"]
        assert context["runAsUser"] == MARIADB_UID and context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True and context["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"] == {"fsGroup": MARIADB_UID}


def test_mariadb_init_has_a_writable_tmp():
    statefulset = render_stack("dev").named("StatefulSet", "mariadb")
    init = container(statefulset, "mariadb-init")
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert "emptyDir" in volume(statefulset, mounts(init)["/tmp"]["name"])


def test_mariadb_probes_ping_over_the_socket():
    mariadb = container(render_stack("dev").named("StatefulSet", "mariadb"), "mariadb")
    ping = ["mariadb-admin", "--socket=/run/mysqld/mysqld.sock", "ping"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert mariadb[probe]["exec"]["command"] == ping, probe
    assert mounts(mariadb)["/run/mysqld"]["name"] == "run"


# ------------------------------------------------------- the init script, run under sh


def _init_layout(tmp_path: Path, password: str = "S3cr3tPassw0rdFromTheSecret") -> tuple[str, dict[str, Path], Path]:
    """database_init_script with its paths in a temp dir, a password file as the Secret mounts
    it, and a `mariadb-install-db` that records its arguments and creates the system schema."""
    dirs = {name: tmp_path / name for name in ("data", "secret", "init", "bin")}
    for directory in dirs.values():
        directory.mkdir()
    (dirs["secret"] / PASSWORD_KEY).write_text(password)
    calls = tmp_path / "install-db.calls"
    fake = dirs["bin"] / "mariadb-install-db"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'for arg in "$@"; do case "$arg" in --datadir=*) mkdir "${arg#--datadir=}/mysql";; esac; done\n'
    )
    fake.chmod(0o755)
    script = database_init_script("slurm_acct_db", "slurm")
    # INIT_DIR first: SOCKET_DIR (/run/mysqld) is a prefix of it.
    for real, fake_dir in ((INIT_DIR, dirs["init"]), (DATA_DIR, dirs["data"]), (DB_PASSWORD_DIR, dirs["secret"])):
        assert real in script, real
        script = script.replace(real, str(fake_dir))
    return script, dirs, calls


def _run(script: str, dirs: dict[str, Path]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{dirs['bin']}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True)


EXPECTED_SQL = (
    "CREATE DATABASE IF NOT EXISTS slurm_acct_db;\n"
    "CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY '{password}';\n"
    "ALTER USER 'slurm'@'%' IDENTIFIED BY '{password}';\n"
    "GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'%';\n"
)


def test_init_script_writes_the_grants_with_the_secrets_password(tmp_path):
    script, dirs, calls = _init_layout(tmp_path)
    result = _run(script, dirs)
    init_sql = dirs["init"] / "init.sql"
    assert init_sql.read_text() == EXPECTED_SQL.format(password="S3cr3tPassw0rdFromTheSecret")
    assert stat.S_IMODE(init_sql.stat().st_mode) == 0o600  # umask 077: only mariadbd's user reads it
    assert "S3cr3tPassw0rdFromTheSecret" not in result.stdout + result.stderr


def test_init_script_installs_the_system_tables_only_into_an_empty_data_dir(tmp_path):
    script, dirs, calls = _init_layout(tmp_path)
    _run(script, dirs)
    assert calls.read_text().splitlines() == [
        f"--no-defaults --datadir={dirs['data']} --skip-test-db --auth-root-authentication-method=socket"
    ]
    # A restart finds the data: no second install, but the init file is written again.
    (dirs["init"] / "init.sql").unlink()
    _run(script, dirs)
    assert len(calls.read_text().splitlines()) == 1
    assert (dirs["init"] / "init.sql").exists()


def test_init_script_takes_a_rotated_password_at_the_next_start(tmp_path):
    script, dirs, _ = _init_layout(tmp_path)
    _run(script, dirs)
    (dirs["secret"] / PASSWORD_KEY).write_text("An0therPasswordAfterRotation")
    _run(script, dirs)
    assert (dirs["init"] / "init.sql").read_text() == EXPECTED_SQL.format(password="An0therPasswordAfterRotation")


@pytest.mark.parametrize("password", ["with space", "dollar$HOME", "back`tick`", 'quote"d', "semi;colon && echo x", "percent%s%n"])
def test_init_script_never_lets_the_shell_or_printf_read_the_password(tmp_path, password):
    """The password is a printf argument, not part of the format or of the shell text."""
    script, dirs, _ = _init_layout(tmp_path, password)
    _run(script, dirs)
    assert (dirs["init"] / "init.sql").read_text() == EXPECTED_SQL.format(password=password)


def test_init_script_fails_without_the_password_file(tmp_path):
    script, dirs, _ = _init_layout(tmp_path)
    (dirs["secret"] / PASSWORD_KEY).unlink()
    with pytest.raises(subprocess.CalledProcessError):
        _run(script, dirs)
    assert not (dirs["init"] / "init.sql").exists()


def test_init_script_quotes_names_for_the_shell():
    script = database_init_script("acct_db", "slurm")
    assert " acct_db slurm \"$password\" slurm \"$password\" acct_db slurm > " in script


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


def test_a_slurmdbd_conf_change_restarts_slurmdbd_and_with_accounts_users_see_only_their_own():
    """slurmdbd reads its file at start, and the Secret holding it is updated in place: the pod template
    carries the file's hash. Accounts give every user an association, through which slurmdbd tells whose
    jobs a user may see (PrivateData); without them it would hide a user's own jobs too."""

    def with_accounts(raw):
        raw["slurm"]["accounts"] = [{"name": "research", "users": ["alice"]}]

    def annotation(rendered):
        return _slurmdbd(rendered).manifest["spec"]["template"]["metadata"]["annotations"]["dualsched.io/slurmdbd-config-hash"]

    plain, accounts = render_stack("dev"), render_raw(variant("dev", with_accounts))
    assert "PrivateData" not in _slurmdbd_conf(plain)
    assert "PrivateData=accounts,jobs,usage,users" in _slurmdbd_conf(accounts).splitlines()
    assert annotation(plain) != annotation(accounts)
    assert annotation(plain) == annotation(render_stack("dev"))


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
    def disable(raw):
        raw["slurm"]["accounting"].update(enabled=False)
        for section in ("qos", "accounts", "preemption"):  # they live in slurmdbd (config.checks)
            raw["slurm"].pop(section, None)
        for user in raw["slurm"].get("users", ()):
            user.pop("defaultAccount", None)

    rendered = render_raw(variant(stack, disable))
    assert not rendered.components("dualsched:accounting:Accounting")
    assert not [d for d in rendered.by_kind("Deployment") if "slurmdbd" in d.name]
    assert {s.name for s in rendered.by_kind("Service")} & {"slurmdbd", "mariadb"} == set()
    assert not [s for s in rendered.by_kind("StatefulSet") if s.name == "mariadb"]
    assert not [s for s in rendered.by_kind("Secret") if "slurmdbd" in s.name or "db-password" in s.name]
    assert "accounting_storage/slurmdbd" not in rendered.slurm_files["slurm.conf"]
