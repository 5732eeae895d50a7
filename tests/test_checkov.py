"""checkov on the rendered dev and prod manifests: every failure fixed or listed.

checkov lives in its own virtualenv (its pins conflict with ours), made by
``scripts/install-checkov.sh``; the test uses ``$CHECKOV_BIN`` if set, else the
binary that script installs. Every failed check must match an entry of
``checkov-skips.yaml`` (check id + resource pattern + one-line reason), and
every entry must still match a failure, so the list never hides a fix.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from dualsched.components.render import render_config, write_render
from dualsched.config import load_stack_file

ROOT = Path(__file__).resolve().parent.parent
SKIPS_FILE = ROOT / "checkov-skips.yaml"
INSTALLER = ROOT / "scripts" / "install-checkov.sh"
STACKS = ("dev", "prod")


def checkov_version() -> str:
    match = re.search(r'CHECKOV_VERSION="\$\{CHECKOV_VERSION:-([^}]+)\}"', INSTALLER.read_text())
    assert match, "scripts/install-checkov.sh pins CHECKOV_VERSION"
    return match.group(1)


def checkov_bin() -> Path:
    if os.environ.get("CHECKOV_BIN"):
        return Path(os.environ["CHECKOV_BIN"])
    cache = Path(os.environ.get("DUALSCHED_TOOLS_CACHE") or Path.home() / ".cache" / "dualsched-tools")
    return cache / f"checkov-{checkov_version()}" / "bin" / "checkov"


def load_skips() -> list[dict]:
    skips = yaml.safe_load(SKIPS_FILE.read_text())["skips"]
    for skip in skips:
        assert set(skip) == {"id", "resources", "reason"}, skip
        assert re.fullmatch(r"CKV2?_K8S_\d+", skip["id"]), skip
        assert isinstance(skip["resources"], list) and skip["resources"], skip
        assert skip["reason"].strip() and "\n" not in skip["reason"].strip(), f"{skip['id']}: one-line reason"
    return skips


@pytest.fixture(scope="module")
def failures(tmp_path_factory) -> list[dict]:
    binary = checkov_bin()
    if not binary.exists():
        pytest.fail(f"checkov not found at {binary}: run scripts/install-checkov.sh (or set CHECKOV_BIN)")
    out = tmp_path_factory.mktemp("checkov")
    for stack in STACKS:
        write_render(render_config(load_stack_file(ROOT / f"Pulumi.{stack}.yaml"), stack), out / stack)
    result = subprocess.run(
        [str(binary), "--directory", str(out), "--framework", "kubernetes", "--output", "json",
         "--quiet", "--compact", "--skip-download"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode in (0, 1), f"checkov crashed ({result.returncode}):\n{result.stderr[-3000:]}"
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    kubernetes = [r for r in reports if r.get("check_type") == "kubernetes"]
    assert kubernetes, f"checkov produced no kubernetes report:\n{result.stdout[:2000]}"
    summary = kubernetes[0]["summary"]
    assert summary["parsing_errors"] == 0, summary
    assert summary["resource_count"] > 0 and summary["passed"] > 0, summary
    return [
        {"id": f["check_id"], "resource": f["resource"], "file": f["file_path"], "name": f["check_name"]}
        for f in kubernetes[0]["results"]["failed_checks"]
    ]


def _matches(skip: dict, failure: dict) -> bool:
    return skip["id"] == failure["id"] and any(fnmatch.fnmatchcase(failure["resource"], p) for p in skip["resources"])


def test_skip_file_is_well_formed():
    assert load_skips()


def test_every_failed_check_is_fixed_or_listed(failures):
    skips = load_skips()
    unlisted = [f for f in failures if not any(_matches(s, f) for s in skips)]
    assert unlisted == [], "checkov failures not in checkov-skips.yaml (fix them, or list them with a reason):\n" + "\n".join(
        f"  {f['id']} {f['resource']} ({f['file']}): {f['name']}" for f in unlisted
    )


def test_no_skip_is_stale(failures):
    stale = [s for s in load_skips() if not any(_matches(s, f) for f in failures)]
    assert stale == [], "checkov-skips.yaml entries that match no failure any more (remove them):\n" + "\n".join(
        f"  {s['id']} {s['resources']}" for s in stale
    )


def test_posture_checks_pass_on_every_non_slurmd_workload(failures):
    """The locked-down settings checkov checks hold everywhere except slurmd, whatever the skip file says;
    the only ServiceAccount tokens mounted are the token minter's (its TokenReview credential) and the node
    keeper's (to get and patch the pool nodes); the only other root container is the login pods' sshd."""
    hardening = {"CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV_K8S_16",
                 "CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_31", "CKV_K8S_37", "CKV_K8S_38"}
    token_holders = ("dualsched-token-minter-", "dualsched-node-keeper-")
    offending = [f for f in failures if f["id"] in hardening and "slurmd-" not in f["resource"].split(".")[-1]
                 and not (f["id"] == "CKV_K8S_38" and f["resource"].split(".")[-1].startswith(token_holders))
                 and not (f["id"] == "CKV_K8S_23" and f["resource"].split(".")[-1].startswith("dualsched-login-"))]
    assert offending == [], offending
