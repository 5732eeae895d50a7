"""Slurm JWT minter: exchanges a Kubernetes ServiceAccount token for a short-lived Slurm token.

A pod presents its projected ServiceAccount token (audience ``AUDIENCE``); the minter asks the
API server who it is (TokenReview; only a token bound to a pod counts), looks the ServiceAccount up in the mapping from the stack
config, and answers with an HS256 JWT for the mapped Slurm user, signed with the key slurmctld
verifies (Slurm's auth/jwt: claims ``iat``, ``exp`` and ``sun``, src/plugins/auth/jwt/auth_jwt.c).
An unmapped or unauthenticated caller gets 403 and no token. Only this pod and slurmctld
mount the key; nothing here ever mints for root or Slurm's own account.

Run: ``python3 token_minter.py`` with MINTER_KEY_FILE, MINTER_MAPPING_FILE, MINTER_LIFETIME, MINTER_PORT.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping, Optional

AUDIENCE = "dualsched-slurm"
"""The audience a submitting pod's projected token must carry: a token for the API server is refused."""
TOKEN_PATH = "/token"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_BODY = 16 * 1024
REQUEST_SECONDS = 10
"""How long a client may take to send its request: a silent connection does not hold a thread forever."""
NEVER_MINTED_FOR = frozenset({"root", "slurm"})


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def encode(key: bytes, claims: dict) -> str:
    """An HS256 JWT (RFC 7519) of ``claims``."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key, f"{header}.{body}".encode("ascii"), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


def mint(key: bytes, user: str, lifetime: int, now: Optional[float] = None) -> str:
    """A token as ``scontrol token`` makes it: iat, exp and sun (Slurm user name). Never for root or
    SlurmUser: auth/jwt lets their tokens act as any other user."""
    if user in NEVER_MINTED_FOR:
        raise ValueError(f"refusing to mint a Slurm token for {user}")
    issued = int(time.time() if now is None else now)
    return encode(key, {"iat": issued, "exp": issued + lifetime, "sun": user})


def service_account_of(username: str) -> Optional[str]:
    """``system:serviceaccount:<namespace>:<name>`` -> ``<namespace>/<name>``; None for anything else."""
    parts = username.split(":")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
        return None
    return f"{parts[2]}/{parts[3]}"


POD_NAME = "authentication.kubernetes.io/pod-name"
"""What the API server adds to a TokenReview's user for a token bound to a pod (a kubelet's projected token;
k8s.io/kubernetes pkg/serviceaccount/claims.go). `kubectl create token` makes tokens without it, which
outlive any pod and would outlive the caller's access to the namespace."""

Review = Callable[[str], Optional[dict]]
"""A bearer token -> the authenticated Kubernetes user (TokenReview's ``status.user``: username, extra), or None."""


def token_review(api_server: str, own_token_file: str, ca_file: str) -> Review:
    """Ask the API server who a token belongs to, for ``AUDIENCE`` only."""
    context = ssl.create_default_context(cafile=ca_file)

    def review(token: str) -> Optional[dict]:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [AUDIENCE]}}  # fmt: skip
        with open(own_token_file) as own:  # the kubelet rotates it: read it each time
            own_bearer = own.read().strip()
        request = urllib.request.Request(
            f"{api_server}/apis/authentication.k8s.io/v1/tokenreviews",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {own_bearer}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            status = json.load(response).get("status", {})
        if not status.get("authenticated") or AUDIENCE not in status.get("audiences", []):
            return None
        return status.get("user", {})

    return review


class Minter:
    """The decision, apart from HTTP: who may have a token, and for which Slurm user."""

    def __init__(self, key: bytes, mapping: Mapping[str, str], lifetime: int, review: Review):
        self.key, self.mapping, self.lifetime, self.review = key, mapping, lifetime, review

    def answer(self, authorization: str) -> tuple[int, dict]:
        if not authorization.startswith("Bearer "):
            return 401, {"error": "a projected ServiceAccount token is required (Authorization: Bearer)"}
        try:
            reviewed = self.review(authorization[len("Bearer "):].strip()) or {}
        except (OSError, urllib.error.URLError, ValueError) as error:
            return 503, {"error": f"TokenReview failed: {error}"}
        account = service_account_of(reviewed.get("username", ""))
        if account is None:
            return 403, {"error": f"not a ServiceAccount token for audience {AUDIENCE}"}
        if not (reviewed.get("extra") or {}).get(POD_NAME):
            return 403, {"error": f"the token of {account} is bound to no pod (only a pod's projected token is taken)"}
        user = self.mapping.get(account)
        if user is None:
            return 403, {"error": f"ServiceAccount {account} is not mapped to a Slurm user"}
        token = mint(self.key, user, self.lifetime)
        return 200, {"user": user, "token": token, "expires_in": self.lifetime}


def handler(minter: Minter, request_seconds: float = REQUEST_SECONDS) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = request_seconds  # StreamRequestHandler: the connection's socket timeout

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit():
                self._send(400, {"error": "Content-Length must be a number of bytes"})
                return
            if self.path != TOKEN_PATH or int(length) > MAX_BODY:
                self._send(404, {"error": "POST /token"})
                return
            status, body = minter.answer(self.headers.get("Authorization", ""))
            # who asked and what they got, never the token
            self.log_message("%s -> %d %s", self.address_string(), status, body.get("user") or body.get("error"))
            self._send(status, body)

        def do_GET(self) -> None:  # noqa: N802
            self._send(200 if self.path == "/healthz" else 404, {})

        def _send(self, status: int, body: dict) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_request(self, code="-", size="-") -> None:
            pass  # do_POST logs the outcome; the request line adds nothing

    return Handler


def main() -> None:
    env = os.environ
    with open(env["MINTER_KEY_FILE"], "rb") as key_file:
        key = key_file.read()
    with open(env["MINTER_MAPPING_FILE"]) as mapping_file:
        mapping = json.load(mapping_file)
    api_server = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}"
    review = token_review(api_server, f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    minter = Minter(key, mapping, int(env["MINTER_LIFETIME"]), review)
    server = ThreadingHTTPServer(("", int(env["MINTER_PORT"])), handler(minter))
    print(f"token minter: {len(mapping)} ServiceAccounts mapped, tokens for {minter.lifetime}s", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
