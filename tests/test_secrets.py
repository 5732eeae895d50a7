"""No generated secret leaves the program in the render: not in a file, not on stdout.

The render's mocks generate the munge key (RandomBytes) and the in-cluster
database password (RandomPassword) as real random values and remember them
(``Render.generated_secrets``: the key's base64 and hex, the password). The
test renders dev and prod through the CLI's own ``main`` (so files AND the
printed summary are what a user gets) and scans every output file and the
captured stdout/stderr for each value, its base64, and any 24-character piece
of either (a truncated or re-wrapped copy is still a leak): zero hits.

Secrets in the config (the external database's ``password``, a Pulumi secret): offline, a
stack file's encrypted ``secure:`` value validates as a placeholder and neither it nor the
ciphertext reaches a rendered file or the CLI's output; no repr, dump or problem shows a
secret's text; inside the program (``__main__.py`` under mocks, config handed over as the
engine does) a secret reaches Kubernetes only as a secret Output of a Secret.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import runpy
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

import dualsched.components.render as render_module
from dualsched.components.render import REDACTED, SECRET_SIGNATURE, plain
from dualsched.config import ConfigError, load_pulumi_config, load_stack_file, parse_stack_config
from dualsched.config.types import ENCRYPTED_PLACEHOLDER, SecretText
from rendering import render_raw, walk
from tests.conftest import ROOT, raw_stack

STACKS = ("dev", "prod")
PIECE = 24


def needles(secrets: list[str]) -> set[str]:
    """Each secret, its base64, and every PIECE-long window of both, stepping by PIECE // 2."""
    found: set[str] = set()
    for secret in secrets:
        for text in (secret, base64.b64encode(secret.encode()).decode()):
            found.add(text)
            found.update(text[i : i + PIECE] for i in range(0, max(len(text) - PIECE, 0) + 1, PIECE // 2))
    return found


@pytest.fixture(scope="module", params=STACKS)
def cli_render(request, tmp_path_factory):
    """Run `python -m dualsched.components.render --stack <s> --out <dir>` in-process; keep the Render it made."""
    stack = request.param
    out = tmp_path_factory.mktemp(f"render-{stack}")
    captured = {}
    original = render_module.render_config

    def recording_render_config(*args, **kwargs):
        captured["render"] = original(*args, **kwargs)
        return captured["render"]

    capture = pytest.MonkeyPatch()
    capture.setattr(render_module, "render_config", recording_render_config)
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = render_module.main(["--stack", stack, "--out", str(out)])
    finally:
        capture.undo()
    assert code == 0, stderr.getvalue()
    return stack, captured["render"], out, stdout.getvalue() + stderr.getvalue()


def test_the_program_generated_secrets_and_used_them(cli_render):
    """Guards against a vacuous scan: the values exist and reached the Secret objects in memory."""
    stack, render, _, _ = cli_render
    # munge and JWT keys (base64 + hex each), and dev's in-cluster DB password and login host key seed (base64 + hex)
    expected = 7 if stack == "dev" else 4
    assert len(render.generated_secrets) == expected
    secret_values = " ".join(
        str(value) for obj in render.by_kind("Secret") for key in ("data", "stringData") for value in (obj.manifest.get(key) or {}).values()
    )
    # Registration order is not fixed: tell the values apart by shape, not position.
    keys_base64 = [value for value in render.generated_secrets if value.endswith("=")]
    assert len(keys_base64) == 2 and all(key in secret_values for key in keys_base64)
    if stack == "dev":
        password = next(value for value in render.generated_secrets if len(value) == 32)
        assert password in secret_values


def test_no_output_file_contains_a_generated_secret(cli_render):
    stack, render, out, _ = cli_render
    files = [path for path in out.rglob("*") if path.is_file()]
    assert len(files) >= len(render.objects)
    search = needles(render.generated_secrets)
    hits = []
    for path in files:
        text = path.read_text()
        hits += [f"{path.relative_to(out)}: {needle[:12]}..." for needle in search if needle in text]
    assert hits == [], f"{stack}: generated secrets in the render output:\n" + "\n".join(hits[:20])


def test_secrets_are_written_redacted(cli_render):
    import yaml

    _, render, out, _ = cli_render
    written = [yaml.safe_load(p.read_text()) for p in out.rglob("secret-*.yaml")]
    assert len(written) == len(render.by_kind("Secret"))
    for manifest in written:
        values = {**(manifest.get("data") or {}), **(manifest.get("stringData") or {})}
        assert values and set(values.values()) == {REDACTED}, manifest["metadata"]


def test_cli_output_contains_no_generated_secret(cli_render):
    stack, render, _, printed = cli_render
    assert "rendered stack" in printed
    leaks = [needle[:12] for needle in needles(render.generated_secrets) if needle in printed]
    assert leaks == [], f"{stack}: the CLI printed generated secrets"


# --------------------------------------------------------------------------- secrets in the config

PASSWORD = "Hunter2-plaintext-Zq9"
CIPHERTEXT = "v1:3Kq0bXh2bWxpY2lvdXMtY2lwaGVydGV4dA==:Zm9vYmFy"
PASSWORD_PATH = "slurm.accounting.database.external.password"
SECRET_ENVELOPE = "1b47061264138c4ac30d75fd1eb44270"  # the value of SECRET_SIGNATURE in a secret
SECRET_TYPE = "kubernetes:core/v1:Secret"


def with_password(value: Any) -> dict[str, Any]:
    """The prod stack with its external database's password given in the config instead of a Secret."""
    raw = raw_stack("prod")
    external = raw["slurm"]["accounting"]["database"]["external"]
    del external["passwordSecret"]
    external["password"] = value
    return raw


def write_stack_file(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"config": {f"dualsched:{key}": value for key, value in raw.items()}}))
    return path


def problems_text(raw: dict[str, Any], secret_keys: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw, "test", secret_keys)
    return str(caught.value)


# ---- offline: an encrypted value is a placeholder


def test_an_encrypted_password_validates_offline_as_a_placeholder(tmp_path):
    path = write_stack_file(tmp_path / "Pulumi.sec.yaml", with_password({"secure": CIPHERTEXT}))
    password = load_stack_file(path).slurm.accounting.database.external.password
    assert password.encrypted and password.reveal() == ENCRYPTED_PLACEHOLDER


def test_the_ciphertext_never_reaches_a_rendered_file_or_the_output(tmp_path):
    path = write_stack_file(tmp_path / "Pulumi.sec.yaml", with_password({"secure": CIPHERTEXT}))
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
        assert render_module.main(["--config", str(path), "--out", str(out)]) == 0, stdout.getvalue()
    files = {file: file.read_text() for file in out.rglob("*") if file.is_file()}
    # Not vacuous: the password Secret was rendered (redacted) from the placeholder.
    [secret] = [text for file, text in files.items() if file.name.startswith("secret-") and "db-password" in file.name]
    assert yaml.safe_load(secret)["stringData"] == {"password": REDACTED}
    search = needles([CIPHERTEXT, ENCRYPTED_PLACEHOLDER])
    leaks = [needle[:12] for text in [*files.values(), stdout.getvalue()] for needle in search if needle in text]
    assert leaks == []


def test_the_placeholder_goes_into_the_secret_and_nowhere_else():
    rendered = render_raw(with_password({"secure": CIPHERTEXT}))
    holders = [obj for obj in rendered.objects if any(value == ENCRYPTED_PLACEHOLDER for _, value in walk(obj.manifest))]
    assert [(obj.kind, obj.manifest["stringData"]) for obj in holders] == [("Secret", {"password": ENCRYPTED_PLACEHOLDER})]
    deployment = rendered.one("Deployment", "slurmdbd").manifest
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "db-password")
    assert volume["secret"]["secretName"] == holders[0].name


def test_a_secure_value_where_no_secret_belongs_is_refused_without_showing_it(tmp_path):
    raw = raw_stack("prod")
    raw["slurm"]["clusterName"] = {"secure": CIPHERTEXT}
    with pytest.raises(ConfigError) as caught:
        load_stack_file(write_stack_file(tmp_path / "Pulumi.sec.yaml", raw))
    [problem] = caught.value.problems
    assert problem.path == "slurm.clusterName"
    assert "is a Pulumi secret, but dualsched keeps only slurm.accounting.database.external.password secret" in str(problem)
    assert str(problem).endswith("(got [secret])") and "v1:" not in str(caught.value)


def test_a_key_encrypted_as_a_whole_is_refused_naming_the_key():
    raw = raw_stack("prod")
    raw["slurm"] = {"secure": CIPHERTEXT}
    assert "  slurm: is a Pulumi secret" in problems_text(raw)


# ---- no repr, dump or problem shows a secret


def test_a_secret_never_shows_in_repr_str_or_dumps():
    config = parse_stack_config(with_password(PASSWORD))
    external = config.slurm.accounting.database.external
    assert external.password.reveal() == PASSWORD  # what the component hands Output.secret
    shown = [repr(config), str(config), repr(external), str(external.password), f"{external.password}",
             str(config.model_dump()), config.model_dump_json(), json.dumps(external.model_dump(mode="json"))]
    leaks = [text[:60] for text in shown if PASSWORD in text]
    assert leaks == []
    assert "password=[secret]" in repr(external)


def test_an_invalid_password_is_reported_without_its_value():
    bad = "two words#" + PASSWORD
    text = problems_text(with_password(bad))
    [line] = [line for line in text.splitlines() if PASSWORD_PATH in line]
    assert line.startswith(f"  {PASSWORD_PATH}: must be 1 to 256 characters of printable ASCII")
    assert line.endswith("(got [secret])") and PASSWORD not in text


def test_a_model_built_directly_quotes_no_secret_in_pydantic_errors():
    from pydantic import ValidationError

    from dualsched.config.models import StackConfig

    bad = "two words " + PASSWORD
    with pytest.raises(ValidationError) as caught:
        StackConfig(**with_password(bad))
    assert PASSWORD_PATH in str(caught.value) and PASSWORD not in str(caught.value)


def test_a_password_and_a_password_secret_together_are_refused_without_the_value():
    raw = with_password(PASSWORD)
    raw["slurm"]["accounting"]["database"]["external"]["passwordSecret"] = {"name": "acct-db"}
    text = problems_text(raw)
    assert f"  {PASSWORD_PATH}: give the password or passwordSecret, not both (got [secret])" in text
    assert PASSWORD not in text


def test_under_a_key_marked_secret_every_value_in_a_problem_is_hidden():
    """A misspelt key takes the secret's value with it: the engine marks the whole key secret."""
    raw = raw_stack("prod")
    raw["slurm"]["accounting"]["database"]["external"]["pasword"] = PASSWORD
    raw["slurm"]["clusterName"] = "Bad_Name"
    shown = problems_text(raw)  # the same config, nothing marked secret: values are shown
    assert PASSWORD in shown and "Bad_Name" in shown
    hidden = problems_text(raw, secret_keys=("slurm",))
    assert PASSWORD not in hidden and "Bad_Name" not in hidden
    assert "slurm.accounting.database.external.pasword: unknown key; did you mean 'password'? (got [secret])" in hidden
    assert hidden.count("(got [secret])") == 2


# ---- inside the program: the engine's config, under mocks


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that keep every resource's inputs as the program registered them, secret envelopes included."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[str, dict[str, Any]]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.inputs[args.name] = (args.typ, dict(args.inputs))
        state = dict(args.inputs)
        if args.typ.startswith("kubernetes:"):  # the provider names an object its Pulumi name when the program does not
            state["metadata"] = {"name": args.name, **(state.get("metadata") or {})}
        elif args.typ == "random:index/randomBytes:RandomBytes":
            state.update(base64="a2V5", hex="00")
        elif args.typ == "random:index/randomPassword:RandomPassword":
            state["result"] = "generated"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def engine_settings(raw: dict[str, Any]) -> dict[str, str]:
    """The config as the engine hands it to the program: structured values as JSON text, secrets decrypted."""
    return {f"dualsched:{key}": value if isinstance(value, str) else json.dumps(value) for key, value in raw.items()}


def run_program(raw: dict[str, Any], secret_keys: list[str]) -> RecordingMocks:
    """Run ``__main__.py`` (what ``pulumi up`` runs) with this config and these keys marked secret."""
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="dualsched", stack="secrets", preview=False,
                             monitor=pulumi_mocks.MockMonitor(mocks))
    pulumi.runtime.set_all_config(engine_settings(raw), secret_keys)
    try:
        _sync_await(run_pulumi_func(lambda: runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")))
    finally:
        pulumi.runtime.set_all_config({}, [])
    return mocks


@pytest.mark.parametrize("secret_keys", [["dualsched:slurm"], []], ids=["marked-secret", "set-in-plain-text"])
def test_a_config_password_reaches_kubernetes_only_as_a_secret_output(secret_keys):
    """`pulumi config set --secret --path dualsched:slurm.accounting.database.external.password` marks
    the whole dualsched:slurm key secret and hands the program its plain text; set without --secret,
    the password is no less secret."""
    mocks = run_program(with_password(PASSWORD), secret_keys)
    holders = [name for name, (_, inputs) in mocks.inputs.items() if PASSWORD in str(inputs)]
    assert holders == ["dualsched-accounting-db-password"]
    typ, inputs = mocks.inputs["dualsched-accounting-db-password"]
    assert typ == SECRET_TYPE
    # The engine marks a secret property as a whole: here stringData, the one holding the password.
    assert inputs["stringData"] == {SECRET_SIGNATURE: SECRET_ENVELOPE, "value": {"password": PASSWORD}}
    # slurmdbd reads it from that Secret (its slurmdbd.conf Secret never holds it: only one holder above)
    _, deployment = mocks.inputs["dualsched-accounting-slurmdbd"]
    volumes = {v["name"]: v for v in plain(deployment)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["db-password"]["secret"]["secretName"] == "dualsched-accounting-db-password"


@pytest.fixture
def engine(monkeypatch):
    """Hand load_pulumi_config a config as the engine does; nothing left set afterwards."""
    from pulumi.runtime import config as runtime_config

    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_SECRET_KEYS", raising=False)
    yield lambda raw, secret_keys=(): runtime_config.set_all_config(engine_settings(raw), list(secret_keys))
    runtime_config.set_all_config({}, [])


def test_an_engine_secret_key_validates(engine):
    engine(with_password(PASSWORD), ["dualsched:slurm"])
    assert load_pulumi_config().slurm.accounting.database.external.password == SecretText(PASSWORD)


def test_secret_keys_from_the_language_hosts_environment_hide_problem_values(monkeypatch, engine):
    """The language host hands the program its config and secret keys in PULUMI_CONFIG and
    PULUMI_CONFIG_SECRET_KEYS; they count even where nothing copied them into the runtime's config."""
    raw = with_password(PASSWORD)
    raw["slurm"]["accounting"]["database"]["external"]["pasword"] = raw["slurm"]["accounting"]["database"]["external"].pop("password")
    engine({})
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(engine_settings(raw)))
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", json.dumps(["dualsched:slurm"]))
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert "external.pasword: unknown key; did you mean 'password'? (got [secret])" in str(caught.value)
    assert PASSWORD not in str(caught.value)


def test_a_secret_key_that_holds_no_secret_field_is_warned_about(engine, monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    engine(with_password(PASSWORD), ["dualsched:slurm", "dualsched:network"])
    load_pulumi_config()
    assert warnings[0] == (
        "dualsched:network is a secret in the stack config, but dualsched keeps only "
        "slurm.accounting.database.external.password secret: its values are written into manifests and the "
        "Pulumi state in plain text"
    )
    assert len(warnings) == 2 and warnings[1].startswith("submission.identities: ")  # prod's two teams


def test_the_stack_file_shows_the_engine_which_values_were_encrypted(engine, monkeypatch, tmp_path):
    """The engine hands the program clusterName decrypted; only the stack file says it was a secret."""
    raw = raw_stack("prod")
    encrypted = {**raw, "slurm": {**raw["slurm"], "clusterName": {"secure": CIPHERTEXT}}}
    write_stack_file(tmp_path / "Pulumi.sec.yaml", encrypted)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "sec")
    engine(raw, ["dualsched:slurm"])
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert [problem.path for problem in caught.value.problems] == ["slurm.clusterName"]
    (tmp_path / "Pulumi.sec.yaml").unlink()
    assert load_pulumi_config().slurm.cluster_name == "prod"
