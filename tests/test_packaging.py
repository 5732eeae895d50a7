"""The library as pip installs it: a wheel built from pyproject.toml, its files and its requirements."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Iterator

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("components", "config")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    """A wheel built by pip, from a copy of the sources: a build leaves build/ and *.egg-info behind it."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--wheel-dir", str(out), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [built] = out.glob("dualsched-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def _requires_dist(wheel: zipfile.ZipFile) -> list[Requirement]:
    [metadata] = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    return [Requirement(line) for line in Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist")]


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {canonicalize_name(r.name): spec.version for r in requirements for spec in r.specifier if spec.operator == "=="}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_wheel_marks_each_package_typed(wheel, package):
    assert f"{package}/py.typed" in wheel.namelist()


def test_the_wheel_carries_every_source_file_of_the_packages(wheel):
    sources = {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    # the programs dualsched ships in ConfigMaps (components/programs) and the Slurm templates too
    assert sources - set(wheel.namelist()) == set()


def test_the_library_asks_for_version_ranges_not_pins(wheel):
    for requirement in _requires_dist(wheel):
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">=", "<"}, f"{requirement}: a lower bound and a major-version ceiling, no pin"


def test_the_app_pins_fall_inside_the_library_ranges(wheel):
    pins = _pins(ROOT / "requirements.txt")
    for requirement in _requires_dist(wheel):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"requirements.txt pins no version of {requirement.name}"
        assert requirement.specifier.contains(pins[name]), f"requirements.txt pins {name}=={pins[name]}, outside {requirement}"
