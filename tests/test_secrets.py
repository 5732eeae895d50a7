"""No generated secret leaves the program in the render: not in a file, not on stdout.

The render's mocks generate the munge key (RandomBytes) and the in-cluster
database password (RandomPassword) as real random values and remember them
(``Render.generated_secrets``: the key's base64 and hex, the password). The
test renders dev and prod through the CLI's own ``main`` (so files AND the
printed summary are what a user gets) and scans every output file and the
captured stdout/stderr for each value, its base64, and any 24-character piece
of either (a truncated or re-wrapped copy is still a leak): zero hits.
"""

from __future__ import annotations

import base64
import contextlib
import io

import pytest

import components.render as render_module
from components.render import REDACTED

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
    """Run `python -m components.render --stack <s> --out <dir>` in-process; keep the Render it made."""
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
    # munge and JWT keys (base64 + hex each), and dev's in-cluster DB password
    expected = 5 if stack == "dev" else 4
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
