"""Slurm tokens: the HS256 key, the minter's decisions and HTTP face, the Jobs' token fetcher,
and who mounts the key. slurmctld's acceptance of these tokens is tests/slurm/test_jwt_auth.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from dualsched.components.programs import token_fetcher
from dualsched.components.programs.token_minter import POD_NAME, Minter, handler, mint, service_account_of
from dualsched.components.slurm_files import JWT_KEY_FILE, JWT_KEY_PATH
from dualsched.components.tokens import JWT_KEY_BYTES, identity_mapping
from rendering import container, pod_spec, render_stack, volume

KEY = b"k" * JWT_KEY_BYTES
TRAINER = "system:serviceaccount:slurm-jobs:trainer"


def _decode(token: str) -> tuple[dict, dict]:
    header, claims, signature = token.split(".")
    pad = lambda part: base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))  # noqa: E731
    expected = hmac.new(KEY, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    assert hmac.compare_digest(pad(signature), expected)
    return json.loads(pad(header)), json.loads(pad(claims))


def test_a_minted_token_is_what_scontrol_token_makes():
    header, claims = _decode(mint(KEY, "alice", 600, now=1_000_000))
    assert header == {"alg": "HS256", "typ": "JWT"}
    assert claims == {"iat": 1_000_000, "exp": 1_000_600, "sun": "alice"}


@pytest.mark.parametrize("user", ["root", "slurm"])
def test_no_token_is_ever_minted_for_root_or_slurm_user(user):
    """auth/jwt lets root's and SlurmUser's tokens act as anyone (auth_jwt.c, auth_p_verify)."""
    with pytest.raises(ValueError, match=user):
        mint(KEY, user, 60)


@pytest.mark.parametrize(
    "username, expected",
    [(TRAINER, "slurm-jobs/trainer"), ("system:serviceaccount:a:b:c", None), ("alice", None), ("system:node:n1", None), ("", None)],
)
def test_only_service_account_user_names_map(username, expected):
    assert service_account_of(username) == expected


def _user(username: str, pod: str | None = "train-x7k2p") -> dict:
    """TokenReview's status.user: a pod-bound token carries the pod's name in ``extra``."""
    return {"username": username, "extra": {POD_NAME: [pod]} if pod else {}}


def _minter(review=lambda token: _user(TRAINER) if token == "good" else None) -> Minter:
    return Minter(KEY, {"slurm-jobs/trainer": "alice"}, 300, review)


def test_a_mapped_service_account_gets_a_token_for_its_user():
    status, body = _minter().answer("Bearer good")
    assert status == 200 and body["user"] == "alice" and body["expires_in"] == 300
    assert _decode(body["token"])[1]["sun"] == "alice"


@pytest.mark.parametrize(
    "authorization, review, status, reason",
    [
        ("", None, 401, "Bearer"),
        ("Basic abc", None, 401, "Bearer"),
        ("Bearer bad", None, 403, "not a ServiceAccount token"),
        ("Bearer other", lambda t: _user("system:serviceaccount:slurm-jobs:intruder"), 403, "slurm-jobs/intruder is not mapped"),
        ("Bearer user", lambda t: _user("kubernetes-admin"), 403, "not a ServiceAccount token"),
        # `kubectl create token trainer --audience dualsched-slurm`: the mapped account, but no pod
        ("Bearer unbound", lambda t: _user(TRAINER, pod=None), 403, "bound to no pod"),
        ("Bearer good", lambda t: (_ for _ in ()).throw(OSError("connection refused")), 503, "TokenReview failed"),
    ],
)
def test_everyone_else_gets_no_token(authorization, review, status, reason):
    minter = _minter() if review is None else _minter(review)
    answered, body = minter.answer(authorization)
    assert answered == status and reason in body["error"] and "token" not in body


@pytest.fixture
def minter_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(_minter()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()


def _post(url: str, bearer: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=b"", headers={"Authorization": f"Bearer {bearer}"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_the_minter_answers_over_http_and_never_logs_a_token(minter_url, capfd):
    status, body = _post(minter_url, "good")
    assert status == 200 and body["user"] == "alice"
    assert _post(minter_url, "bad")[0] == 403
    assert _post(minter_url.replace("/token", "/other"), "good")[0] == 404
    logged = capfd.readouterr().err
    assert "-> 200 alice" in logged and "-> 403" in logged
    assert body["token"] not in logged and "good" not in logged.split("->")[0]


def _raw(url: str, request: bytes, timeout: float = 30) -> bytes:
    """What the server sends for ``request`` until it closes the connection."""
    host, port = url.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
        return answer


def test_a_malformed_content_length_is_a_bad_request_not_a_crash(minter_url):
    answer = _raw(minter_url, b"POST /token HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 400 ") and b"Content-Length must be a number" in answer, answer
    assert _post(minter_url, "good")[0] == 200  # and it still serves


def test_a_silent_client_is_dropped_after_the_request_timeout():
    """A connection that never sends its request is closed by the minter (it would hold a thread forever)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(_minter(), request_seconds=1))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        assert _raw(f"http://127.0.0.1:{server.server_address[1]}/token", b"", timeout=20) == b""  # closed by the minter
        assert 1 <= time.monotonic() - started < 20
    finally:
        server.shutdown()


def test_the_fetcher_writes_the_token_for_the_sbatch_container(minter_url, tmp_path):
    (tmp_path / "sa").write_text("good\n")
    answer = token_fetcher.fetch(minter_url, str(tmp_path / "sa"))
    token_fetcher.write_atomically(str(tmp_path / "token"), answer["token"])
    assert _decode((tmp_path / "token").read_text())[1]["sun"] == "alice"
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "token.new").exists()


def test_the_fetcher_stops_when_refused(minter_url, tmp_path):
    """An unmapped ServiceAccount: the sidecar exits, so the pod never starts sbatch."""
    (tmp_path / "sa").write_text("bad")
    env = {**os.environ, "FETCHER_MINTER_URL": minter_url, "FETCHER_SA_TOKEN_FILE": str(tmp_path / "sa"),
           "FETCHER_TOKEN_FILE": str(tmp_path / "token")}  # fmt: skip
    fetcher = Path(token_fetcher.__file__)
    result = subprocess.run([sys.executable, str(fetcher)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "refused (403)" in result.stderr
    assert not (tmp_path / "token").exists()


# ------------------------------------------------------------------- the deployed parts


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_mapping_is_the_configs_identities(stack):
    rendered = render_stack(stack)
    [programs] = [c for c in rendered.by_kind("ConfigMap") if "mapping.json" in c.manifest["data"]]
    mapping = json.loads(programs.manifest["data"]["mapping.json"])
    assert mapping == identity_mapping(rendered.config)
    assert mapping == {f"slurm-jobs/{i.service_account}": i.user for i in rendered.config.submission.identities}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_only_slurmctld_and_the_minter_mount_the_jwt_key(stack):
    rendered = render_stack(stack)
    [secret] = [s for s in rendered.by_kind("Secret") if JWT_KEY_FILE in (s.manifest.get("data") or {})]
    assert secret.namespace == "slurm"
    assert len(base64.b64decode(secret.manifest["data"][JWT_KEY_FILE])) == JWT_KEY_BYTES
    mounting = set()
    for workload in [*rendered.by_kind("Deployment"), *rendered.by_kind("StatefulSet"), *rendered.by_kind("DaemonSet")]:
        for vol in pod_spec(workload)["volumes"]:
            if vol.get("secret", {}).get("secretName") == secret.name:
                assert vol["secret"]["defaultMode"] == 0o440, workload.name
                mounting.add(workload.name.split("-")[1] if workload.kind == "Deployment" else workload.name)
    assert mounting == {"slurmctld", "token"}
    # users get tokens from the minter only, never from slurmctld (tests/slurm/test_jwt_auth.py)
    assert f"AuthAltParameters=jwt_key={JWT_KEY_PATH},disable_token_creation" in rendered.slurm_files["slurm.conf"].splitlines()


def test_the_minter_may_create_token_reviews_and_nothing_else():
    rendered = render_stack("dev")
    [role] = [r for r in rendered.by_kind("ClusterRole") if "token-minter" in r.name]
    assert role.manifest["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
    [binding] = [b for b in rendered.by_kind("ClusterRoleBinding") if b.manifest["roleRef"]["name"] == role.name]
    [account] = [a for a in rendered.in_namespace("slurm", "ServiceAccount") if "token-minter" in a.name]
    assert binding.manifest["roleRef"]["name"] == role.name
    assert binding.manifest["subjects"] == [{"kind": "ServiceAccount", "name": account.name, "namespace": "slurm"}]
    [minter] = [d for d in rendered.by_kind("Deployment") if "token-minter" in d.name]
    assert pod_spec(minter)["serviceAccountName"] == account.name
    assert container(minter, "minter")["securityContext"]["runAsUser"] == 65534


def test_slurmrestd_holds_no_key_and_runs_as_nobody():
    rendered = render_stack("dev")
    [restd] = [d for d in rendered.by_kind("Deployment") if "slurmrestd" in d.name]
    spec = pod_spec(restd)
    assert spec["automountServiceAccountToken"] is False
    assert not [v for v in spec["volumes"] if "secret" in v]
    server = container(restd, "slurmrestd")
    assert server["command"][-3:] == ["-a", "rest_auth/jwt", "0.0.0.0:6820"]
    assert {"name": "SLURM_JWT", "value": "daemon"} in server["env"]
    assert server["securityContext"]["runAsUser"] == 65534
    assert volume(restd, "slurm-config")["configMap"]["name"] == "slurm-config"

