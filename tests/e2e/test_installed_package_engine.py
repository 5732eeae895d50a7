"""dualsched from pip, through the real engine: no checkout on any path (docs/component-package.md, docs/starter.md).

One fresh venv, outside the checkout, holds the wheel built from this tree and the starter template's
requirements.txt; the project in it is the template as `pulumi new <templates/gpu-cluster> --generate-only`
writes it. With that venv's bin (and the tools) on PATH, never the checkout's .venv:

- `pulumi package get-schema $(dualsched-package-dir)` serves the schema from the installed package;
- a Pulumi YAML program with ``packages: {dualsched: <installed dir>}`` previews the cluster;
- `pulumi package add` of that directory in a YAML project fails as docs/component-package.md says;
- the template's project previews through the engine (its __main__.py, its Pulumi.dev.yaml).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from e2e_support import ROOT, TIMINGS, VENV, World, tail
from test_component_package_engine import CONFIG, shape

sys.path.insert(0, str(ROOT / "tests"))
from wheel_support import STARTER, build_dist, fresh_venv  # noqa: E402

pytestmark = pytest.mark.e2e


class Installed:
    def __init__(self, world: World, project: Path, venv: Path):
        self.world, self.project, self.venv = world, project, venv
        path = [p for p in world.env["PATH"].split(os.pathsep) if Path(p) != VENV / "bin"]
        # the fresh venv's python3 is the one Pulumi's toolchain finds on PATH; the checkout's is gone
        self.env = {**world.env, "PATH": os.pathsep.join([str(venv / "bin"), *path])}

    def run(self, *args: str, cwd: Path, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(list(args), cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(f"`{' '.join(args)}` failed ({result.returncode}):\n{tail(result.stdout)}\n{tail(result.stderr)}")
        return result

    def pulumi(self, directory: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("pulumi", *args, "--non-interactive", "--color", "never", cwd=directory, check=check)


@pytest.fixture(scope="module")
def installed(world: World) -> Installed:
    """`pulumi new` from the template, then the project's venv: the wheel of this tree and requirements.txt."""
    start = time.monotonic()
    dist = build_dist(world.tmp / "wheel-source", world.tmp / "wheel-dist", wheel_only=True)
    [wheel] = dist.glob("dualsched-*.whl")
    project = world.tmp / "starter" / "gpu-starter"
    new = world.run(["pulumi", "new", str(STARTER), "--generate-only", "--yes", "--force", "--name", "gpu-starter",
                     "--description", "A GPU cluster", "--dir", str(project), "--non-interactive"], cwd=world.tmp, check=False)
    assert new.returncode == 0, tail(new.stdout + new.stderr)
    fresh_venv(project / "venv", str(wheel), "-r", str(project / "requirements.txt"), "-c", str(ROOT / "requirements.txt"))
    TIMINGS.append(("installed: wheel, pulumi new, venv", time.monotonic() - start))
    return Installed(world, project, project / "venv")


@pytest.fixture(scope="module")
def package_dir(installed: Installed) -> Path:
    found = installed.run("dualsched-package-dir", cwd=installed.project)
    directory = Path(found.stdout.strip())
    assert directory.is_relative_to(installed.venv) and not directory.is_relative_to(ROOT), directory
    return directory


def test_pulumi_new_writes_the_template_project(installed: Installed):
    project = yaml.safe_load((installed.project / "Pulumi.yaml").read_text())
    assert project["name"] == "gpu-starter" and project["description"] == "A GPU cluster"
    names = {p.name for p in installed.project.iterdir()}
    assert {"__main__.py", "infra.py", "Pulumi.dev.yaml", "requirements.txt", "tests", ".github"} <= names


def test_get_schema_from_the_installed_package(installed: Installed, package_dir: Path):
    start = time.monotonic()
    result = installed.run("pulumi", "package", "get-schema", str(package_dir), cwd=installed.world.tmp)
    TIMINGS.append(("installed: package get-schema", time.monotonic() - start))
    schema = json.loads(result.stdout)
    cluster = schema["resources"]["dualsched:index:Cluster"]
    assert cluster["isComponent"] is True and sorted(cluster["requiredInputs"]) == ["pools", "storage"]
    assert shape(schema) == shape(json.loads((ROOT / "package" / "schema.json").read_text()))


def yaml_project(directory: Path, package: Path, properties) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Pulumi.yaml").write_text(yaml.safe_dump({
        "name": "installed-yaml-consumer", "runtime": "yaml",
        "packages": {"dualsched": str(package)},
        "resources": {"gpu": {"type": "dualsched:index:Cluster", "properties": properties}},
        "outputs": {"controllerAddress": "${gpu.controllerAddress}"},
    }, sort_keys=False))
    return directory


def test_a_yaml_program_previews_the_installed_package(installed: Installed, package_dir: Path):
    directory = yaml_project(installed.world.tmp / "installed-yaml", package_dir, CONFIG)
    installed.pulumi(directory, "stack", "init", "installed")
    start = time.monotonic()
    preview = installed.pulumi(directory, "preview", "--stack", "installed")
    TIMINGS.append(("installed: YAML preview", time.monotonic() - start))
    assert "dualsched:index:Cluster" in preview.stdout, tail(preview.stdout)
    assert "kubernetes:apps/v1:StatefulSet" in preview.stdout and "kubernetes:apps/v1:DaemonSet" in preview.stdout
    installed.pulumi(directory, "stack", "rm", "installed", "--yes", "--force", check=False)


def test_package_add_for_yaml_stops_at_the_yaml_hosts_missing_link(installed: Installed, package_dir: Path):
    """What docs/component-package.md says `pulumi package add` does for YAML (pulumi-language-yaml v1.25.0):
    when this fails, the YAML host links packages and the docs should say `package add` instead."""
    directory = installed.world.tmp / "installed-yaml-add"
    directory.mkdir()
    (directory / "Pulumi.yaml").write_text("name: add-consumer\nruntime: yaml\n")
    result = installed.pulumi(directory, "package", "add", str(package_dir), check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "linking package: method Link not implemented" in output, tail(output)
    assert "Successfully generated an SDK for the dualsched package" in output, tail(output)
    assert (directory / "sdks/dualsched/dualsched-0.1.0.yaml").is_file()
    assert "packages" not in yaml.safe_load((directory / "Pulumi.yaml").read_text())


def test_the_template_project_previews(installed: Installed):
    installed.pulumi(installed.project, "stack", "init", "dev")
    start = time.monotonic()
    preview = installed.pulumi(installed.project, "preview", "--stack", "dev")
    TIMINGS.append(("installed: template preview", time.monotonic() - start))
    out = preview.stdout
    assert "pulumi:pulumi:Stack" in out and "gpu-starter-dev" in out, tail(out)
    assert "kubernetes:apps/v1:StatefulSet" in out and "kubernetes:apps/v1:Deployment" in out, tail(out)
    installed.pulumi(installed.project, "stack", "rm", "dev", "--yes", "--force", check=False)
