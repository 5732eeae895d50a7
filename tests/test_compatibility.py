"""docs/compatibility.md states what the tiers run: each pinned version (and range) is read back from the file
its row names as its source, so the matrix fails here the day a pin moves without it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
MATRIX = (ROOT / "docs" / "compatibility.md").read_text()


def _rows() -> list[dict[str, str]]:
    rows = []
    for line in MATRIX.splitlines():
        if not line.startswith("| ") or line.startswith(("| component ", "| --- ")):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]  # no cell holds a "|"
        rows.append(dict(zip(("component", "pinned", "range", "source", "where"), cells)))
    return rows


ROWS = _rows()


def _row(component: str) -> dict[str, str]:
    [row] = [r for r in ROWS if r["component"] == component]
    return row


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            [spec] = requirement.specifier
            pins[requirement.name] = spec.version
    return pins


def _versions_env() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z0-9_]+)=(\S+)", (ROOT / "tools" / "versions.env").read_text(), re.M))


def _ranges() -> dict[str, SpecifierSet]:
    """pyproject.toml's ranges: the dependencies, and the extras' (the policy pack's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    return {Requirement(d).name: Requirement(d).specifier for d in dependencies}


def test_the_matrix_has_its_rows():
    assert len(ROWS) >= 20 and all(len(row) == 5 for row in ROWS), ROWS
    for component in ("Pulumi CLI", "`pulumi` (Python SDK)", "`pulumi-kubernetes` (Python SDK)", "`pulumi-random` (Python SDK)",
                      "`pydantic`", "Python", "Slurm, Debian 12", "Slurm, Debian forky", "Slurm, the default images"):
        assert _row(component)["where"], component


@pytest.mark.parametrize("row", [r for r in ROWS if r["source"] in ("`requirements.txt`", "`policy/requirements.txt`")],
                         ids=lambda r: r["component"])
def test_python_packages_are_the_pins_and_the_ranges(row):
    name = re.fullmatch(r"`([\w.-]+)`( \(Python SDK\))?", row["component"])[1]
    pins = _pins(ROOT / row["source"].strip("`"))
    assert row["pinned"] == pins[name], f"{name}: the matrix says {row['pinned']}, {row['source']} pins {pins[name]}"
    if row["range"]:
        assert SpecifierSet(row["range"]) == _ranges()[name], f"{name}: the matrix says {row['range']}, pyproject.toml {_ranges()[name]}"


@pytest.mark.parametrize("row", [r for r in ROWS if r["source"].startswith("`tools/versions.env`")], ids=lambda r: r["component"])
def test_tools_are_the_versions_the_toolchain_builds(row):
    [key] = re.findall(r"`([A-Z0-9_]+)`$", row["source"])
    assert row["pinned"] == _versions_env()[key].removeprefix("v"), f"{row['component']}: tools/versions.env {key}"


def test_the_python_sdk_and_the_built_tools_agree():
    env, pins = _versions_env(), _pins(ROOT / "requirements.txt")
    assert env["PULUMI_SDK_PY_VERSION"] == pins["pulumi"]
    assert env["PULUMI_K8S_SDK_PY_VERSION"] == env["PULUMI_K8S_PROVIDER_VERSION"] == pins["pulumi-kubernetes"]
    assert env["PULUMI_RANDOM_SDK_PY_VERSION"] == env["PULUMI_RANDOM_PROVIDER_VERSION"] == pins["pulumi-random"]


def test_slurm_releases_are_the_images_the_tiers_build_and_the_default():
    tags = dict(re.findall(r"\[(\w+)\]=([\d.]+)", re.search(r"SLURM_TAGS=\((.*)\)", (ROOT / "tools" / "images.sh").read_text())[1]))
    for component, suite in (("Slurm, Debian 12", "bookworm"), ("Slurm, Debian forky", "forky"), ("Slurm, Debian trixie", "trixie")):
        assert _row(component)["pinned"].split()[0] == tags[suite], component
    assert "22.05.8" in (ROOT / "docs" / "real-node.md").read_text()
    assert 'version="26.05.5"' in (ROOT / "tests" / "node" / "test_newer_slurm_node.py").read_text()

    from dualsched.config.models import Images, Slurm, StackConfig

    default = _row("Slurm, the default images")
    release, tag = re.fullmatch(r"([\d.]+) \(`([^`]+)`, SchedMD's Slinky images\)", default["pinned"]).groups()
    assert Slurm.model_fields["release"].default == release
    assert Images().slurmctld.endswith(f":{tag}") and tag.startswith(release)
    assert _row("Kubernetes manifest schemas")["pinned"] == StackConfig.model_fields["kubernetes_version"].default


def test_python_is_the_one_the_package_and_the_workflow_ask_for():
    row = _row("Python")
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == row["range"]
    workflow = (ROOT / ".github" / "workflows" / "preview.yml").read_text()
    assert set(re.findall(r'python-version: "([\d.]+)"', workflow)) == {row["pinned"]}


def test_the_node_runtime_is_the_one_the_real_node_tier_documents():
    text = (ROOT / "docs" / "real-node.md").read_text()
    containerd, runc = _row("containerd, runc")["pinned"].split(" (")[0].split(", ")
    assert f"containerd {containerd} + runc {runc}" in text
