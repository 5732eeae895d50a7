"""The CrossGuard pack under the real engine: `pulumi preview --policy-pack policy`.

Needs the Pulumi CLI, the Python language host, the Kubernetes provider and the
Python policy analyzer (``pulumi-analyzer-policy-python``, a script shipped in the
Pulumi SDK's sdk/python/dist; the engine uses it for every Python policy pack),
plus a backend and a cluster. All of that comes from the shell env file named by
``DUALSCHED_PULUMI_ENV`` (set by ``make test-e2e``); a missing file or tool is a
failure with a message, never a skip.

The workspace is the project directory itself (stack ``dev``, selected or created
in the env file's backend), and for the rejection test a throw-away project in a
temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "policy"
ENV_VAR = "DUALSCHED_PULUMI_ENV"
TOOLS = ("pulumi", "pulumi-language-python", "pulumi-analyzer-policy-python", "pulumi-resource-kubernetes")


def engine_env() -> dict[str, str]:
    """The environment after sourcing the env file, with this test's Python first on PATH."""
    env_file = os.environ.get(ENV_VAR)
    if not env_file:
        pytest.fail(f"{ENV_VAR} is not set: it names the shell env file with the Pulumi tools, backend and cluster (make test-e2e)")
    if not Path(env_file).is_file():
        pytest.fail(f"{ENV_VAR}={env_file}: no such file")
    dump = subprocess.run(
        ["bash", "-c", 'set -a; source "$1" >&2; env -0', "env", env_file], capture_output=True, check=False
    )
    if dump.returncode != 0:
        pytest.fail(f"sourcing {env_file} failed: {dump.stderr.decode(errors='replace')[-2000:]}")
    env = dict(item.split("=", 1) for item in dump.stdout.decode().split("\0") if "=" in item)
    # The pack and the programs run on python3 from PATH: make it the interpreter running the tests.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PULUMI_CONFIG_PASSPHRASE", "")
    missing = [tool for tool in TOOLS if not shutil.which(tool, path=env["PATH"])]
    if missing:
        pytest.fail(f"not on PATH after sourcing {env_file}: {', '.join(missing)}")
    return env


def pulumi(args: list[str], workspace: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["pulumi", *args, "--non-interactive"], cwd=workspace, env=env, capture_output=True, text=True, timeout=1200
    )


def policy_preview(
    workspace: Path, stack: str, env: dict[str, str], pack_config: Optional[Path] = None
) -> subprocess.CompletedProcess:
    """`pulumi preview --policy-pack policy --stack <stack>` in a prepared workspace."""
    selected = pulumi(["stack", "select", "--create", stack], workspace, env)
    assert selected.returncode == 0, selected.stderr
    args = ["preview", "--stack", stack, "--policy-pack", str(PACK), "--color", "never"]
    if pack_config is not None:
        args += ["--policy-pack-config", str(pack_config)]
    return pulumi(args, workspace, env)


def test_dev_stack_passes_the_pack():
    result = policy_preview(ROOT, "dev", engine_env())
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]


def test_a_privileged_pod_outside_slurm_is_rejected(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: policy-probe\nruntime: python\n")
    (tmp_path / "__main__.py").write_text(
        textwrap.dedent(
            """
            import pulumi_kubernetes as k8s

            labels = {"app.kubernetes.io/name": "probe"}
            k8s.apps.v1.Deployment(
                "probe",
                metadata={"namespace": "default", "labels": labels},
                spec={
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "probe", "image": "busybox:1.36",
                                                 "securityContext": {"privileged": True}}]},
                    },
                },
            )
            """
        )
    )
    result = policy_preview(tmp_path, "probe", engine_env())
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "privileged-only-slurmd" in output and "container 'probe' is privileged" in output, output[-4000:]
