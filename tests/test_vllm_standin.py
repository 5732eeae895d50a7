"""The vLLM stand-in (tools/images/vllm_standin.py) run as a real process on loopback.

The expected model digest is computed here independently (``sha256sum``-style listing,
see the stand-in's docstring) rather than by importing the stand-in.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parent.parent / "tools" / "images" / "vllm_standin.py"
NAME = "tiny-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expected_digest(root: Path) -> tuple[dict[str, int], str]:
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    listing = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {rel}\n" for rel, p in files)
    return {rel: p.stat().st_size for rel, p in files}, hashlib.sha256(listing.encode()).hexdigest()


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STANDIN), *args], capture_output=True, text=True, timeout=30, **kw)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url: str, obj) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["Stand"]}\n')
    (root / "model-00001.safetensors").write_bytes(bytes(range(256)) * 40)
    (root / "sub" / "tokenizer.json").write_text("{}")
    (root / "empty.bin").write_bytes(b"")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not part of the model")
    (root / "escape.bin").symlink_to(outside)  # must not be followed out of the model dir
    return root


@pytest.fixture
def server(model_dir: Path):
    port = free_port()
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "0,1"}
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", str(model_dir), "--served-model-name", NAME,
         "--tensor-parallel-size", "2", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "64"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if get(base + "/health")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"stand-in did not come up: {proc.communicate()[1]}")
        time.sleep(0.1)
    yield base, proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_health_models_and_model_digest(server, model_dir: Path):
    base, _ = server
    status, body = get(base + "/health")
    assert (status, body) == (200, b"")

    status, body = get(base + "/v1/models")
    assert status == 200
    models = json.loads(body)
    assert models["object"] == "list"
    [entry] = models["data"]
    assert {k: entry[k] for k in ("id", "object", "root", "max_model_len", "owned_by")} == {
        "id": NAME, "object": "model", "root": str(model_dir), "max_model_len": 64, "owned_by": "dualsched-standin",
    }

    status, body = get(base + "/standin/model")
    assert status == 200
    info = json.loads(body)
    files, digest = expected_digest(model_dir)
    assert "escape.bin" not in files and set(files) == {"config.json", "model-00001.safetensors", "sub/tokenizer.json", "empty.bin"}
    assert info == {
        "path": str(model_dir), "files": files, "sha256": digest,
        "tensor_parallel_size": 2, "visible_devices": "0,1", "stand_in": True,
    }

    assert get(base + "/nope")[0] == 404
    assert post(base + "/v1/chat/nope", {})[0] == 404


def test_completion_is_deterministic_and_names_the_digest(server, model_dir: Path):
    base, _ = server
    _, digest = expected_digest(model_dir)
    status, first = post(base + "/v1/completions", {"model": NAME, "prompt": "hello there", "max_tokens": 8})
    assert status == 200
    assert first["object"] == "text_completion" and first["model"] == NAME and first["id"].startswith("cmpl-")
    [choice] = first["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert "stand-in" in choice["text"] and digest in choice["text"]
    usage = first["usage"]
    assert usage["prompt_tokens"] == 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 2
    assert post(base + "/v1/completions", {"model": NAME, "prompt": "hello there"})[1] == first

    assert post(base + "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    assert post(base + "/v1/completions", {"model": NAME, "prompt": "w " * 65})[0] == 400  # > max_model_len


def test_sigterm_exits_zero_and_logs_requests(server):
    base, proc = server
    get(base + "/v1/models")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "GET /v1/models" in stderr and "sha256" in stderr


def test_missing_or_empty_model_dir_fails(tmp_path: Path):
    common = ["--served-model-name", NAME, "--tensor-parallel-size", "1", "--host", "127.0.0.1", "--port", str(free_port())]
    missing = run(["serve", str(tmp_path / "absent"), *common])
    assert missing.returncode == 1 and "does not exist" in missing.stderr

    empty = tmp_path / "empty"
    (empty / "only-dirs").mkdir(parents=True)
    result = run(["serve", str(empty), *common])
    assert result.returncode == 1 and "empty" in result.stderr


def test_unknown_option_is_an_argparse_error(model_dir: Path):
    result = run(["serve", str(model_dir), "--served-model-name", NAME, "--gpu-memory-utilization", "0.9"])
    assert result.returncode == 2
    assert "unrecognized arguments: --gpu-memory-utilization" in result.stderr
