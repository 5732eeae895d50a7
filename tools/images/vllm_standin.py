#!/usr/bin/env python3
"""A STAND-IN for vLLM's OpenAI-compatible server, for the local "real node" test tier.

This is not vLLM and does no machine learning. It is installed as /usr/local/bin/vllm
in the image dualsched.local/vllm-standin:1 (built by tools/images.sh) because the test
machines have no GPU, no registry access and no model weights.

What it proves, when the project's inference Deployment runs it on a real kubelet:
  * the pod's command line is exactly what vLLM accepts for the options the project uses
    (``vllm serve MODEL_PATH --served-model-name NAME --tensor-parallel-size N --host H
    --port P [--max-model-len L]``; any other option is an argparse error, exit 2);
  * the startup/readiness/liveness probes (GET /health) reach the server on its port;
  * the read-only model mount is there and its bytes reach the server: at start every
    regular file under MODEL_PATH is read, the way a server loads a checkpoint, and the
    digest of those bytes is served at GET /standin/model and named in every completion;
  * the server runs as an arbitrary non-root uid on a read-only root file system
    (it writes nothing; only /tmp would be writable) and stops cleanly on SIGTERM.

What it does not prove: that real model weights load, that a GPU is visible or usable
(NVIDIA_VISIBLE_DEVICES is only reported), throughput, latency, or inference quality.
Production uses the real vLLM image.

Model digest (``sha256`` in /standin/model): for each regular file under MODEL_PATH,
sorted by its relative path ('/'-separated, compared as UTF-8 bytes), the line
``<hex sha256 of the content>  <relative path>\\n`` (the ``sha256sum`` format); the
digest is the sha256 of the concatenation of those lines. Symbolic links are followed
only when they resolve to a regular file inside MODEL_PATH; symlinked directories are
not descended into.

Endpoints: GET /health (200, empty body), GET /v1/models, GET /standin/model,
POST /v1/completions (deterministic text that says it is a stand-in); anything else 404.
One log line per request on stderr. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.dont_write_bytecode = True  # read-only root file system: never try to write .pyc

OWNED_BY = "dualsched-standin"
CHUNK = 1 << 20


def log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} vllm-standin: {msg}\n")
    sys.stderr.flush()


class ModelError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm",
        description="dualsched STAND-IN for vLLM's OpenAI-compatible server (no inference).",
    )
    sub = parser.add_subparsers(dest="command", metavar="{serve}")
    sub.required = True
    serve = sub.add_parser("serve", help="serve a model directory over HTTP (stand-in)")
    serve.add_argument("model", metavar="MODEL_PATH", help="model directory (read at start)")
    serve.add_argument("--served-model-name", dest="served_model_name", default=None,
                       help="model name in the API (default: MODEL_PATH)")
    serve.add_argument("--tensor-parallel-size", dest="tensor_parallel_size", type=int, default=1)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-model-len", dest="max_model_len", type=int, default=None)
    return parser


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def load_model(model_path: str) -> tuple[dict[str, int], str]:
    """Reads every regular file under model_path; returns ({relpath: size}, digest)."""
    if not os.path.exists(model_path):
        raise ModelError(f"model path {model_path!r} does not exist")
    if not os.path.isdir(model_path):
        raise ModelError(f"model path {model_path!r} is not a directory")
    root = os.path.realpath(model_path)
    entries: list[tuple[bytes, str, str]] = []  # (sort key, relpath, path to read)
    for dirpath, dirnames, filenames in os.walk(model_path, followlinks=False, onerror=_raise):
        dirnames.sort()
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, model_path).replace(os.sep, "/")
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not (_inside(target, root) and os.path.isfile(target)):
                    log(f"skipping {rel}: symbolic link to a directory or out of the model directory")
                    continue
            elif not os.path.isfile(path):
                continue  # fifo, socket, device: not checkpoint data
            entries.append((rel.encode("utf-8", "surrogateescape"), rel, path))
    if not entries:
        raise ModelError(f"model path {model_path!r} is empty (no regular files)")
    entries.sort()
    files: dict[str, int] = {}
    listing = hashlib.sha256()
    for _, rel, path in entries:
        digest = hashlib.sha256()
        size = 0
        try:
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise ModelError(f"cannot read {rel}: {exc}") from exc
        files[rel] = size
        listing.update(f"{digest.hexdigest()}  {rel}\n".encode("utf-8", "surrogateescape"))
    return files, listing.hexdigest()


def _raise(exc: OSError) -> None:
    raise ModelError(f"cannot list model directory: {exc}")


class State:
    def __init__(self, args: argparse.Namespace, files: dict[str, int], digest: str):
        self.model_path = args.model
        self.name = args.served_model_name or args.model
        self.tensor_parallel_size = args.tensor_parallel_size
        self.max_model_len = args.max_model_len
        self.files = files
        self.sha256 = digest
        self.created = int(time.time())


class Handler(BaseHTTPRequestHandler):
    server_version = "dualsched-vllm-standin/1"
    protocol_version = "HTTP/1.1"
    state: State  # set on the subclass in main()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib signature)
        log(f"{self.client_address[0]} {format % args}")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        if body:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj, sort_keys=True).encode())

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"object": "error", "message": message, "type": kind, "code": status})

    def do_GET(self) -> None:  # noqa: N802
        s = self.state
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, b"")
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": s.name, "object": "model", "created": s.created, "root": s.model_path,
                "max_model_len": s.max_model_len, "owned_by": OWNED_BY,
            }]})
        elif path == "/standin/model":
            self._json(200, {
                "path": s.model_path, "files": s.files, "sha256": s.sha256,
                "tensor_parallel_size": s.tensor_parallel_size,
                "visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"), "stand_in": True,
            })
        else:
            self._error(404, f"no route {path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > 16 << 20:
            self.close_connection = True
            self._error(400, "bad Content-Length", "BadRequestError")
            return
        raw = self.rfile.read(length) if length else b""
        if path != "/v1/completions":
            self._error(404, f"no route {path}", "NotFoundError")
            return
        try:
            req = json.loads(raw or b"{}")
            if not isinstance(req, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            self._error(400, f"invalid JSON body: {exc}", "BadRequestError")
            return
        self._completion(req)

    def _completion(self, req: dict) -> None:
        s = self.state
        model = req.get("model", s.name)
        if model != s.name:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
            return
        if req.get("stream"):
            self._error(400, "stream=true is not supported by the stand-in", "BadRequestError")
            return
        prompt = req.get("prompt", "")
        prompts = prompt if isinstance(prompt, list) else [prompt]
        if not all(isinstance(p, str) for p in prompts):
            self._error(400, "prompt must be a string or a list of strings", "BadRequestError")
            return
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for i, p in enumerate(prompts):
            n = len(p.split())
            if s.max_model_len is not None and n > s.max_model_len:
                self._error(400, f"prompt has {n} tokens, more than max_model_len {s.max_model_len}",
                            "BadRequestError")
                return
            text = (f" [dualsched stand-in, not a language model] model {s.name} "
                    f"sha256 {s.sha256} prompt_words {n}")
            prompt_tokens += n
            completion_tokens += len(text.split())
            choices.append({"index": i, "text": text, "logprobs": None,
                            "finish_reason": "stop", "stop_reason": None})
        key = hashlib.sha256(json.dumps([s.sha256, s.name, prompts]).encode()).hexdigest()[:24]
        self._json(200, {
            "id": f"cmpl-standin-{key}", "object": "text_completion", "created": s.created,
            "model": s.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tensor_parallel_size < 1:
        build_parser().error("--tensor-parallel-size must be >= 1")
    if args.max_model_len is not None and args.max_model_len < 1:
        build_parser().error("--max-model-len must be >= 1")
    if not 0 <= args.port <= 65535:
        build_parser().error("--port must be in 0..65535")
    started = time.monotonic()
    try:
        files, digest = load_model(args.model)
    except ModelError as exc:
        log(f"ERROR: {exc}")
        return 1
    log(f"loaded {len(files)} files, {sum(files.values())} bytes from {args.model} "
        f"in {time.monotonic() - started:.2f}s, sha256 {digest}")

    handler = type("BoundHandler", (Handler,), {"state": State(args, files, digest)})
    server_cls = ThreadingHTTPServer
    if ":" in args.host:
        server_cls = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    try:
        server = server_cls((args.host, args.port), handler)
    except OSError as exc:
        log(f"ERROR: cannot listen on {args.host}:{args.port}: {exc}")
        return 1

    def stop(signum, _frame):
        log(f"received {signal.Signals(signum).name}, shutting down")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    log(f"serving model {handler.state.name!r} on http://{host}:{port} (STAND-IN: no inference)")
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
