"""The library as pip installs it: a wheel built from pyproject.toml, its files and its requirements."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from wheel_support import ROOT, SOURCES, STARTER, build_dist, fresh_venv, starter_project


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel PyPA's build makes (`make dist`), the wheel from the sdist, so that the sdist
    holds all a build needs; from a copy of the sources: a build leaves build/ and *.egg-info behind it."""
    return build_dist(tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Iterator[zipfile.ZipFile]:
    [built] = dist.glob("dualsched-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_the_sdist_and_the_wheel_pass_twine_check(dist):
    """What an index would refuse or show broken (metadata, the README as the long description) fails here first."""
    built = sorted(dist.iterdir())
    assert sorted(path.suffix for path in built) == [".gz", ".whl"]
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, built)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert check.returncode == 0 and check.stdout.count("PASSED") == 2, check.stdout + check.stderr


def _requires_dist(wheel: zipfile.ZipFile, extra: str = "") -> list[Requirement]:
    """The wheel's requirements: without ``extra``, what every install gets; with it, what that extra adds."""
    [metadata] = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    requirements = [Requirement(line) for line in Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist")]
    if not extra:
        return [r for r in requirements if r.marker is None]
    return [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})]


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {canonicalize_name(r.name): spec.version for r in requirements for spec in r.specifier if spec.operator == "=="}


def test_the_wheel_installs_one_top_level_name(wheel):
    """No generic `config` or `components` in site-packages to collide with a project's own."""
    top = {name.split("/")[0] for name in wheel_files(wheel)}
    assert {name for name in top if not name.endswith(".dist-info")} == {"dualsched"}


def test_every_file_that_states_the_version_states_pyprojects():
    """project.version is the one version; the plugin, its schema and the policy pack repeat it for Pulumi."""
    from dualsched.package.cluster import VERSION

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert VERSION == version
    assert json.loads((ROOT / "package" / "schema.json").read_text())["version"] == version
    assert yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text())["version"] == version


def test_the_wheel_carries_its_license_and_says_which(wheel):
    [metadata] = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    fields = Parser().parsestr(wheel.read(metadata).decode())
    assert fields["License-Expression"] == "Apache-2.0"
    [license_file] = [name for name in wheel.namelist() if name.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file).decode() == (ROOT / "LICENSE").read_text()


@pytest.mark.parametrize("package", ["dualsched/components", "dualsched/config"])
def test_the_wheel_marks_each_package_typed(wheel, package):
    assert f"{package}/py.typed" in wheel.namelist()


def test_the_wheel_carries_every_source_file_of_the_packages(wheel):
    sources = {
        f"{installed}/{path.relative_to(ROOT / folder).as_posix()}"
        for folder, installed in SOURCES.items()
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    # the programs dualsched ships in ConfigMaps (components/programs), the Slurm templates, the policy
    # pack's PulumiPolicy.yaml and the examples' stack files too
    assert sources - set(wheel_files(wheel)) == set()


def wheel_files(wheel: zipfile.ZipFile) -> list[str]:
    return [name for name in wheel.namelist() if not name.endswith("/")]


def test_the_library_asks_for_version_ranges_not_pins(wheel):
    for requirement in _requires_dist(wheel) + _requires_dist(wheel, "policy"):
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">=", "<"}, f"{requirement}: a lower bound and a major-version ceiling, no pin"


def test_the_app_pins_fall_inside_the_library_ranges(wheel):
    pins = _pins(ROOT / "requirements.txt")
    for requirement in _requires_dist(wheel):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"requirements.txt pins no version of {requirement.name}"
        assert requirement.specifier.contains(pins[name]), f"requirements.txt pins {name}=={pins[name]}, outside {requirement}"


def test_the_policy_extra_brings_the_policy_packs_dependency_in_the_range_its_tests_pin(wheel):
    """`pip install 'dualsched[policy]'` is what the pack needs on the python3 that `pulumi preview` runs it on."""
    pins = _pins(ROOT / "policy" / "requirements.txt")
    [policy] = _requires_dist(wheel, "policy")
    assert canonicalize_name(policy.name) == "pulumi-policy" and policy.specifier.contains(pins["pulumi-policy"])


# ------------------------------------------------------------------ both ends of the dependency ranges


def _lower_bounds(wheel: zipfile.ZipFile) -> list[str]:
    return [f"{r.name}=={spec.version}" for r in _requires_dist(wheel) for spec in r.specifier if spec.operator == ">="]


@pytest.fixture(scope="module", params=["oldest", "newest"])
def ranged(request, wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its dependencies at one end of its ranges: every lower bound exactly, or
    what pip resolves from the ranges today (what a new project gets). Returns its bin directory."""
    venv = tmp_path_factory.mktemp(request.param) / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    ends = _lower_bounds(wheel) if request.param == "oldest" else []
    install = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              wheel.filename, *ends], capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    return venv / "bin"


def _objects(render: list[str], stack: str, out: Path) -> dict[str, list]:
    """Every file the renderer writes for ``stack``, YAML read back (key order is the SDK's, not the object's)."""
    result = subprocess.run([*render, "--stack", stack, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return {str(path.relative_to(out)): list(yaml.safe_load_all(path.read_text())) for path in sorted(out.rglob("*.yaml"))}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_at_either_end_of_its_dependency_ranges_the_library_builds_the_same_objects(ranged, stack, tmp_path):
    """The pins are what the tiers run; a project may resolve anything in the ranges. The oldest and the newest
    build every object of dev and prod exactly as the pins do."""
    pinned = _objects([sys.executable, "-m", "dualsched.components.render"], stack, tmp_path / "pinned")
    assert pinned and _objects([str(ranged / "dualsched-render")], stack, tmp_path / "ranged") == pinned


# A platform team's project: its own config.py and components/ beside __main__.py, dualsched from pip.
CONSUMER_FILES = {
    "config.py": 'SETTING = "the project\'s own"\n',
    "components/__init__.py": "OWN = True\n",
    "infra.py": (
        "import config\n"
        "from components import OWN\n"
        "from dualsched.components.cluster import DualScheduledCluster\n\n\n"
        "def build(cluster_config):\n"
        "    assert config.SETTING == \"the project's own\" and OWN  # its own modules, not dualsched's\n"
        "    DualScheduledCluster(\"cluster\", cluster_config)\n"
    ),
}


@pytest.fixture(scope="module")
def consumer(wheel, tmp_path_factory) -> tuple[Path, Path]:
    """A fresh venv with the wheel and its policy extra installed (dependencies at the app's pins), and the project
    beside it."""
    root = tmp_path_factory.mktemp("consumer")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{wheel.filename}[policy]",
         "-c", str(ROOT / "requirements.txt"), "-c", str(ROOT / "policy" / "requirements.txt")],
        capture_output=True, text=True, timeout=1200,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    project = root / "project"
    for name, text in CONSUMER_FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "Pulumi.yaml").write_text("name: training\nruntime: python\n")
    (project / "Pulumi.dev.yaml").write_text((ROOT / "Pulumi.dev.yaml").read_text())
    return venv / "bin", project


def _run(consumer: tuple[Path, Path], *argv: str) -> subprocess.CompletedProcess:
    bin_dir, project = consumer
    command = [str(bin_dir / argv[0]), *argv[1:]]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=600)


def test_a_project_with_its_own_config_and_components_imports_dualsched(consumer):
    result = _run(consumer, "python", "-c", "import config, components, infra, dualsched.config; "
                                            "print(config.SETTING, components.OWN, dualsched.config.StackConfig.__name__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "the project's own True StackConfig\n"


def test_the_installed_tools_render_report_and_check_the_projects_program(consumer):
    _, project = consumer
    render = _run(consumer, "dualsched-render", "--stack", "dev", "--program", "infra:build", "--out", "build/dev")
    assert render.returncode == 0, render.stderr
    assert (project / "build/dev/.dualsched-render.json").is_file()
    assert any(path.name.startswith("statefulset-") for path in (project / "build/dev").rglob("*.yaml"))
    report = _run(consumer, "dualsched-report", "--base", "build/dev", "--head", "build/dev")
    assert report.returncode == 0, report.stderr
    policy = _run(consumer, "dualsched-policy", "--stack", "dev", "--program", "infra:build")
    assert policy.returncode == 0, policy.stdout + policy.stderr


@pytest.mark.parametrize("command", ["dualsched-render", "dualsched-report", "dualsched-policy"])
def test_each_installed_tools_help_names_the_command_a_user_types(consumer, command):
    result = _run(consumer, command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {command} "), result.stdout


def test_the_installed_policy_pack_and_examples_are_where_pulumi_can_use_them(consumer):
    result = _run(consumer, "python", "-c",
                  "from pathlib import Path; import dualsched.policy, dualsched.examples.own_program as example; "
                  "pack = Path(dualsched.policy.__file__).parent; "
                  "print(sorted(p.name for p in pack.iterdir() if p.suffix in ('.yaml', '.json', '.txt')), callable(example.main))")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['PulumiPolicy.yaml', 'requirements.txt'] True\n"


def test_the_policy_extra_is_all_the_installed_pack_needs_to_load(consumer):
    """As `pulumi preview --policy-pack` starts it: the pack directory's __main__.py, on the venv's python."""
    result = _run(consumer, "python", "-c",
                  "import os, runpy, dualsched.policy; "
                  "pack = runpy.run_path(os.path.join(os.path.dirname(dualsched.policy.__file__), '__main__.py'), run_name='pack'); "
                  "names = {p.name for p in pack['policies']()}; "
                  "print(len(names), names == {r.name for r in pack['RULES']} | {'dualsched-config-found'})")
    assert result.returncode == 0, result.stderr
    count, same = result.stdout.split()
    assert int(count) > 1 and same == "True", result.stdout


# ------------------------------------------------------------------ the component package, installed


def test_the_wheels_component_package_runs_in_the_venv_it_is_installed_in(wheel):
    """The checkout's package/ runs in the checkout's .venv; the wheel's, five directories up from
    <venv>/lib/pythonX.Y/site-packages/dualsched/package: the venv itself (setup.py writes it)."""
    assert yaml.safe_load((ROOT / "package/PulumiPlugin.yaml").read_text())["runtime"]["options"] == {"virtualenv": "../.venv"}
    plugin = yaml.safe_load(wheel.read("dualsched/package/PulumiPlugin.yaml"))
    assert plugin["runtime"] == {"name": "python", "options": {"virtualenv": "../../../../.."}}
    assert {"dualsched/package/__main__.py", "dualsched/package/schema.json"} <= set(wheel.namelist())


def test_dualsched_package_dir_prints_the_installed_plugin_that_runs_in_this_venv(consumer, tmp_path):
    bin_dir, _ = consumer
    found = _run(consumer, "dualsched-package-dir")
    assert found.returncode == 0, found.stderr
    directory = Path(found.stdout.strip())
    venv = bin_dir.parent.resolve()
    assert directory.is_relative_to(venv / "lib") and directory.parts[-2:] == ("dualsched", "package")
    assert (directory / "PulumiPlugin.yaml").is_file() and (directory / "__main__.py").is_file()
    assert (directory / "../../../../..").resolve() == venv  # what Pulumi resolves `virtualenv` to
    # the provider's modules import in that venv, from outside any checkout
    provider = _run(consumer, "python", "-c", "import dualsched.package.cluster as c; print(sorted(c.schema()['resources']))")
    assert provider.returncode == 0 and provider.stdout == "['dualsched:index:Cluster']\n", provider.stderr
    # another Python with the same files on its path is not the one Pulumi would run: refused, with the fix
    other = subprocess.run([sys.executable, "-m", "dualsched.package.locate"], cwd=tmp_path, capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(directory.parent.parent)}, timeout=120)  # fmt: skip
    assert other.returncode == 1 and other.stdout == "", other.stdout + other.stderr
    assert f"runs in the virtual environment {venv}" in other.stderr and "install dualsched into a virtual environment" in other.stderr


# ------------------------------------------------------------------ the starter template (templates/gpu-cluster)


def test_the_starter_is_a_pulumi_template_with_one_stack_and_dualsched_by_range():
    project = yaml.safe_load((STARTER / "Pulumi.yaml").read_text())
    assert project["name"] == "${PROJECT}" and project["runtime"]["name"] == "python"
    prompts = project["template"]["config"]
    assert set(prompts) == {"dualsched:environment", "dualsched:kubernetesVersion"}
    assert all(p["description"] and "default" in p for p in prompts.values())
    assert sorted(p.name for p in STARTER.glob("Pulumi.*.yaml")) == ["Pulumi.dev.yaml"]
    lines = [line.split("#")[0].strip() for line in (STARTER / "requirements.txt").read_text().splitlines()]
    [dualsched] = [Requirement(line) for line in lines if line.startswith("dualsched")]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert {s.operator for s in dualsched.specifier} == {">=", "<"} and dualsched.specifier.contains(version)
    # its CI holds no secret and runs actions by commit, as dualsched's own (tests/test_ci.py)
    workflow = yaml.safe_load((STARTER / ".github/workflows/preview.yml").read_text())
    assert workflow["permissions"] == {"contents": "read"} and "secrets." not in str(workflow)
    uses = [step["uses"] for job in workflow["jobs"].values() for step in job["steps"] if "uses" in step]
    assert uses and all(re.fullmatch(r"[\w./-]+@[0-9a-f]{40}", u) for u in uses), uses


@pytest.fixture(scope="module")
def starter(wheel, tmp_path_factory) -> Path:
    """A project from the template, outside the checkout, with its own fresh venv (Pulumi.yaml: virtualenv venv):
    the wheel and the template's requirements.txt, dependencies at the app's pins."""
    project = starter_project(tmp_path_factory.mktemp("starter") / "gpu-starter")
    fresh_venv(project / "venv", wheel.filename, "-r", str(project / "requirements.txt"), "-c", str(ROOT / "requirements.txt"))
    return project


def test_the_starters_own_tests_pass_with_the_public_mocks(starter):
    result = subprocess.run([str(starter / "venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                            cwd=starter, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout, result.stdout


def _starters_ci_step(project: Path, venv_bin: Path, base: str, home: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """The starter workflow's own script (.github/workflows/preview.yml) in ``project``, with ``base`` as BASE."""
    workflow = yaml.safe_load((STARTER / ".github/workflows/preview.yml").read_text())
    [step] = [s for s in workflow["jobs"]["stacks"]["steps"] if s.get("name") == "Render, report and policy, each stack"]
    summary = home / "summary.md"
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "GITHUB_STEP_SUMMARY": str(summary),
           "GITHUB_WORKSPACE": str(project), "BASE": base, "HOME": str(home)}
    return subprocess.run(["bash", "-c", step["run"]], cwd=project, env=env, capture_output=True, text=True, timeout=600), summary


_TOTAL = re.compile(r"\| \*\*total\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|")


def _created_only(report: str) -> bool:
    """The report's totals: objects created, none updated, replaced or deleted."""
    create, *others = map(int, _TOTAL.search(report).groups())
    return create > 0 and others == [0, 0, 0]


def test_the_starters_ci_step_renders_reports_and_checks_each_stack(starter, tmp_path):
    """As a push to a new branch runs it (no commit before): every stack compared with nothing."""
    result, summary = _starters_ci_step(starter, starter / "venv/bin", "", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(p.name.startswith("statefulset-") for p in (starter / "build/head/dev").rglob("*.yaml"))
    assert (starter / "build/head/dev/.dualsched-render.json").is_file()
    report = (starter / "build/report-dev.md").read_text()
    assert "Stack dev (new)" in report and _created_only(report) and summary.read_text() == report
    assert "policy: Pulumi.dev.yaml (environment dev): every rule passes" in result.stdout, result.stdout + result.stderr


def _git(project: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(project.parent), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    return subprocess.run(["git", *args], cwd=project, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_a_new_stacks_first_pull_request_gets_a_report_of_all_it_creates_and_a_policy_result(starter, tmp_path):
    """The pull request path: the base branch has dev; the PR adds a staging stack and changes dev."""
    project = tmp_path / "repo" / "gpu-starter"
    shutil.copytree(starter, project, ignore=shutil.ignore_patterns("venv", "build", "__pycache__"))
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "base")
    base = _git(project, "rev-parse", "HEAD")
    dev = (project / "Pulumi.dev.yaml").read_text()
    (project / "Pulumi.staging.yaml").write_text(dev.replace("clusterName: gpu-dev", "clusterName: gpu-staging"))
    (project / "Pulumi.dev.yaml").write_text(dev.replace('maxTime: "1-00:00:00"', 'maxTime: "2-00:00:00"'))
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "a staging stack")
    result, summary = _starters_ci_step(project, starter / "venv/bin", base, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    staging = (project / "build/report-staging.md").read_text()
    assert "## Stack staging (new)" in staging and _created_only(staging)
    assert "label `dualsched.io/pool`: `-` → `gpu`" in staging  # the nodes it would label
    changed = (project / "build/report-dev.md").read_text()
    assert "## Stack dev\n" in changed and "+PartitionName=gpu" in changed and "MaxTime=2-00:00:00" in changed
    assert not _created_only(changed)
    assert summary.read_text() == changed + staging
    for stack in ("dev", "staging"):
        assert f"policy: Pulumi.{stack}.yaml (environment dev): every rule passes" in result.stdout, result.stdout


# ------------------------------------------------------------------ the checkout's own folders


def _in_checkout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_in_the_checkout_components_and_config_are_the_dualsched_modules_not_copies():
    probe = ("import components.controller, config.models, dualsched.components.controller as c, dualsched.config.models as m;"
             "print(components.controller is c, config.models is m)")
    run = _in_checkout("-c", probe)
    assert run.stdout.split() == ["True", "True"], run.stdout + run.stderr


def test_in_the_checkout_python_m_components_render_writes_what_the_dualsched_name_writes(tmp_path):
    for module, out in (("components.render", "short"), ("dualsched.components.render", "full")):
        run = _in_checkout("-m", module, "--stack", "dev", "--out", str(tmp_path / out))
        assert run.returncode == 0, run.stdout + run.stderr
    short, full = (sorted(p.relative_to(tmp_path / d) for p in (tmp_path / d).rglob("*") if p.is_file()) for d in ("short", "full"))
    assert short == full and short
    assert all((tmp_path / "short" / f).read_bytes() == (tmp_path / "full" / f).read_bytes() for f in short)
