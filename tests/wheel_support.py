"""The library as pip installs it, for the tests that use it from a fresh venv (tests/test_packaging.py, and the
e2e tier's tests/e2e/test_installed_package_engine.py): the sdist and wheel PyPA's build makes, and venvs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The source folders and where the wheel puts them: one top-level name, dualsched (pyproject.toml).
SOURCES = {"dualsched": "dualsched", "components": "dualsched/components", "config": "dualsched/config",
           "policy": "dualsched/policy", "examples": "dualsched/examples", "package": "dualsched/package"}
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")
STARTER = ROOT / "templates" / "gpu-cluster"
"""The `pulumi new` template a team starts from (docs/starter.md)."""


def build_dist(source: Path, out: Path, *, wheel_only: bool = False) -> Path:
    """`python -m build` of a copy of the sources in ``source`` (a build leaves build/ and *.egg-info behind it);
    the wheel from the sdist unless ``wheel_only``, so that the sdist holds all a build needs. Returns ``out``."""
    source.mkdir(parents=True, exist_ok=True)
    for name in BUILD_FILES:
        shutil.copy(ROOT / name, source / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "build", *(["--wheel"] if wheel_only else []), "--outdir", str(out),
                            str(source)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def fresh_venv(venv: Path, *requirements: str) -> Path:
    """A new venv with ``requirements`` (pip arguments: the wheel, ``-r``, ``-c``) installed; returns its bin/."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              *requirements], capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    return venv / "bin"


def starter_project(dest: Path, name: str = "gpu-starter") -> Path:
    """The template copied as `pulumi new --generate-only` writes it (${PROJECT} and ${DESCRIPTION} filled in)."""
    shutil.copytree(STARTER, dest, ignore=shutil.ignore_patterns("__pycache__", "venv", "build"))
    project = dest / "Pulumi.yaml"
    project.write_text(project.read_text().replace("${PROJECT}", name).replace("${DESCRIPTION}", "A GPU cluster"))
    return dest
