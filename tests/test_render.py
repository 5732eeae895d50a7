"""The offline render: `python -m dualsched.components.render` writes what `pulumi up` would create."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pulumi
import pytest
import yaml

from dualsched.components import render as render_module
from dualsched.components.program import build
from dualsched.components.render import CLUSTER_SCOPED, MANIFEST, OPTIONS_FILE, REDACTED, TransformsRefused, main, render_config, write_render
from rendering import ROOT, raw_stack, render_stack

SUMMARY_LINE = re.compile(r"^\s+([A-Za-z]+)\s+(\d+)$")


@pytest.fixture
def captured(monkeypatch):
    """Run main() while keeping the Render it wrote (its secrets are generated per run)."""
    renders = []
    original = render_module.render_config

    def capture(*args, **kwargs):
        renders.append(original(*args, **kwargs))
        return renders[-1]

    monkeypatch.setattr(render_module, "render_config", capture)
    return renders


def _yaml_files(out: Path) -> list[Path]:
    return sorted(out.rglob("*.yaml"))


def _summary(stdout: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for line in stdout.splitlines() if (m := SUMMARY_LINE.match(line))}


def _forms(secrets: list[str]) -> set[str]:
    return {form for value in secrets for form in (value, base64.b64encode(value.encode()).decode())}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_stack_render_writes_one_file_per_object_grouped_by_namespace(stack, tmp_path, captured):
    out = tmp_path / "out"
    assert main(["--stack", stack, "--out", str(out)]) == 0
    [render] = captured
    files = _yaml_files(out)
    assert len(files) == len(render.objects)
    expected_dirs = {obj.namespace or CLUSTER_SCOPED for obj in render.objects} | {"slurm-files"}
    assert {p.name for p in out.iterdir()} == expected_dirs | {MANIFEST, OPTIONS_FILE}
    for path in files:
        manifest = yaml.safe_load(path.read_text())
        assert path.parent.name == manifest["metadata"].get("namespace", CLUSTER_SCOPED)
        assert path.name == f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
    cluster_scoped = {yaml.safe_load(p.read_text())["kind"] for p in (out / CLUSTER_SCOPED).iterdir()}
    # ClusterRole and binding: the token minter may create TokenReviews (components/tokens.py)
    # no Node: the node keeper writes the pools' labels and taints (components/node_keeper.py)
    assert cluster_scoped == {"Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                              "ValidatingAdmissionPolicyBinding"}  # fmt: skip


def test_the_options_no_manifest_shows_are_written_beside_the_objects(tmp_path, captured):
    """protect and retainOnDelete: what `pulumi destroy` keeps or refuses; ignoreChanges: what `pulumi up` leaves
    as an existing stack has it. For the change report."""
    out = tmp_path / "out"
    assert main(["--stack", "prod", "--out", str(out)]) == 0
    options = json.loads((out / OPTIONS_FILE).read_text())
    state = [flags for path, flags in options.items() if path.startswith("slurm/persistentvolumeclaim-dualsched-slurmctld-state")]
    assert state == [{"protect": True, "retainOnDelete": True}]  # prod protects the controller's state
    volumes = [flags for path, flags in options.items() if path.startswith("_cluster/persistentvolume-")]
    assert volumes and all(flags == {"protect": True, "retainOnDelete": True, "ignoreChanges": ["spec.claimRef"]} for flags in volumes)
    claims = [flags for path, flags in options.items() if "/persistentvolumeclaim-dualsched-shared-" in path]
    assert claims and all(flags["ignoreChanges"] == ["metadata.name"] for flags in claims)
    workloads = {path: flags for path, flags in options.items() if path.split("/")[1].startswith(("deployment-", "daemonset-"))}
    # no workload is kept or protected; the model servers leave their replicas to the HPA
    assert workloads and all(flags == {"ignoreChanges": ["spec.replicas"]} for flags in workloads.values()), workloads
    assert all((out / path).is_file() for path in options)


def test_slurm_files_are_written(tmp_path, captured):
    out = tmp_path / "out"
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    [render] = captured
    written = {p.name: p.read_text() for p in (out / "slurm-files").iterdir()}
    assert written == render.slurm_files
    assert "SlurmctldParameters=enable_configless" in written["slurm.conf"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_summary_prints_kinds_with_counts(stack, tmp_path, capsys, captured):
    assert main(["--stack", stack, "--out", str(tmp_path)]) == 0
    [render] = captured
    stdout = capsys.readouterr().out
    summary = _summary(stdout)
    total = summary.pop("total")
    assert summary == dict(Counter(obj.kind for obj in render.objects))
    assert total == len(render.objects)
    assert f"rendered stack '{stack}'" in stdout
    assert render.slurm_conf_hash[:16] in stdout


def test_prod_summary_counts():
    assert "Node" not in render_stack("prod").render.summary()  # nothing per node: the keeper labels them
    assert render_stack("prod").render.summary()["DaemonSet"] == 3


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_written_files_hold_no_secret_value(stack, tmp_path, captured):
    out = tmp_path / "out"
    assert main(["--stack", stack, "--out", str(out)]) == 0
    [render] = captured
    forms = _forms(render.generated_secrets)
    assert forms
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not any(form in text for form in forms), path


def test_written_secrets_are_redacted(tmp_path):
    written = write_render(render_stack("dev").render, tmp_path)
    secrets = [yaml.safe_load(p.read_text()) for p in written if p.name.startswith("secret-")]
    assert len(secrets) == len(render_stack("dev").by_kind("Secret"))
    for secret in secrets:
        values = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
        assert values and set(values.values()) == {REDACTED}


def test_rendering_twice_gives_the_same_files(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["--stack", "dev", "--out", str(first)]) == 0
    assert main(["--stack", "dev", "--out", str(second)]) == 0
    read = lambda root: {p.relative_to(root): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert read(first) == read(second)


def test_a_rerender_removes_files_of_deleted_objects(tmp_path):
    out = tmp_path / "out"
    assert main(["--stack", "prod", "--out", str(out)]) == 0
    assert list(out.rglob("daemonset-dualsched-slurmd-h100-a-*.yaml"))
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    assert len(_yaml_files(out)) == len(render_stack("dev").objects)
    assert not list(out.rglob("daemonset-dualsched-slurmd-h100-a-*.yaml"))


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_manifest_lists_exactly_what_the_render_wrote_and_is_no_yaml_file(tmp_path):
    out = tmp_path / "out"
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    written = set(_files(out)) - {MANIFEST}
    assert set(json.loads((out / MANIFEST).read_text())["files"]) == written
    # the change report reads a render directory with rglob("*.yaml")
    assert not MANIFEST.endswith((".yaml", ".yml"))


def _hand_written_project(root: Path) -> dict[str, bytes]:
    (root / "nested").mkdir(parents=True)
    (root / "Pulumi.yaml").write_text("name: my-platform\nruntime: python\n")
    (root / "nested" / "manifest.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: mine}\n")
    return _files(root)


def test_a_render_refuses_a_directory_it_did_not_write_and_touches_nothing(tmp_path):
    project = tmp_path / "project"
    before = _hand_written_project(project)
    result = _run("--stack", "dev", "--out", str(project))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    problem = result.stderr.strip().splitlines()[-1].strip()
    assert re.fullmatch(rf"{re.escape(str(project))}: .*{re.escape(MANIFEST)}.* \(got \['Pulumi\.yaml', 'nested'\]\)", problem), problem
    assert _files(project) == before
    assert {p.name for p in project.rglob("*")} == {"Pulumi.yaml", "nested", "manifest.yaml"}


def test_a_rerender_keeps_files_it_did_not_write_inside_its_own_directory(tmp_path):
    out = tmp_path / "out"
    assert main(["--stack", "prod", "--out", str(out)]) == 0
    (out / "NOTES.yaml").write_text("mine\n")
    (out / "slurm" / "extra.yaml").write_text("mine too\n")
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    assert (out / "NOTES.yaml").read_text() == "mine\n"
    assert (out / "slurm" / "extra.yaml").read_text() == "mine too\n"


@pytest.mark.parametrize("existing", [True, False], ids=["empty", "new"])
def test_an_empty_or_new_directory_is_rendered_into(tmp_path, existing):
    out = tmp_path / "a" / "b"
    if existing:
        out.mkdir(parents=True)
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    assert len(_yaml_files(out)) == len(render_stack("dev").objects)


def test_a_render_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "slurm-files").mkdir(parents=True)
    (out / MANIFEST).write_text(json.dumps({"files": []}))
    (out / "slurm-files" / "slurm.conf").write_text("# mine\n")
    assert main(["--stack", "dev", "--out", str(out)]) == 2
    assert "would overwrite files no render wrote (got ['slurm-files/slurm.conf'])" in capsys.readouterr().err
    assert _files(out) == {MANIFEST: b'{"files": []}', "slurm-files/slurm.conf": b"# mine\n"}


@pytest.mark.parametrize("listed", ["../victim.yaml", "/etc/hostname", "a/../../victim.yaml", 7], ids=repr)
def test_a_manifest_cannot_name_a_file_outside_the_render(tmp_path, capsys, listed):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "victim.yaml").write_text("keep\n")
    (out / MANIFEST).write_text(json.dumps({"files": [listed]}))
    assert main(["--stack", "dev", "--out", str(out)]) == 2
    assert f"{MANIFEST}: lists a path no render writes (got {listed!r})" in capsys.readouterr().err
    assert (tmp_path / "victim.yaml").read_text() == "keep\n"
    assert [p.name for p in out.iterdir()] == [MANIFEST]


def test_a_broken_manifest_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text("{not json")
    assert main(["--stack", "dev", "--out", str(out)]) == 2
    assert f"{MANIFEST}: is not a render manifest" in capsys.readouterr().err


def test_config_reads_a_stack_file_from_any_path(tmp_path, capsys):
    source = tmp_path / "elsewhere" / "Pulumi.dev.yaml"
    source.parent.mkdir()
    source.write_text((ROOT / "Pulumi.dev.yaml").read_text())
    assert main(["--config", str(source), "--out", str(tmp_path / "out")]) == 0
    assert "rendered stack 'dev'" in capsys.readouterr().out
    assert len(_yaml_files(tmp_path / "out")) == len(render_stack("dev").objects)


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dualsched.components.render", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_invalid_config_exits_2_with_every_problem_and_no_traceback(tmp_path):
    raw = raw_stack("dev")
    raw["pools"][0]["cpus"] = 0
    raw["storage"]["capacity"] = "lots"
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump({"config": {f"dualsched:{key}": value for key, value in raw.items()}}))
    out = tmp_path / "out"
    result = _run("--config", str(bad), "--out", str(out))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line.strip() for line in result.stderr.splitlines()]
    assert any(re.fullmatch(r"pools\[0\]\.cpus: .+ \(got 0\)", line) for line in lines), result.stderr
    assert any(re.fullmatch(r"storage\.capacity: .+ \(got 'lots'\)", line) for line in lines), result.stderr
    assert str(bad) in result.stderr
    assert not out.exists()


def test_unreadable_config_exits_2_without_traceback(tmp_path):
    result = _run("--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot read the stack file" in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_runs_as_a_module(tmp_path):
    result = _run("--stack", "dev", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert _summary(result.stdout)["total"] == len(render_stack("dev").objects)


# ------------------------------------------------------ from a consumer's project: stack, key, program


def _project(root: Path, config: dict, name: str = "consumer") -> Path:
    """A consumer's Pulumi project: Pulumi.yaml and Pulumi.prod.yaml with ``config``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "Pulumi.yaml").write_text(f"name: {name}\nruntime: python\n")
    (root / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": config}))
    return root


def _dualsched_keys(raw: dict) -> dict:
    return {f"dualsched:{key}": value for key, value in raw.items()}


def _texts(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST}


def _problem_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if re.fullmatch(r"\s*\S+: .+ \(got .+\)", line)]


@pytest.fixture
def in_repository(monkeypatch):
    """main() in the repository root; sys.path as it was afterwards (--program puts the working directory on it)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_stack_reads_the_working_directorys_stack_file_not_the_packages(tmp_path):
    raw = raw_stack("dev")
    raw["slurm"]["clusterName"] = "consumer"
    project = _project(tmp_path / "project", _dualsched_keys(raw))
    # dualsched importable from anywhere, as `pip install` makes it; the repository has a Pulumi.prod.yaml too
    result = subprocess.run([sys.executable, "-m", "dualsched.components.render", "--stack", "prod", "--out", "build"], cwd=project,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert "ClusterName=consumer\n" in (project / "build" / "slurm-files" / "slurm.conf").read_text()


def test_a_stack_missing_from_the_working_directory_is_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--stack", "dev", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert _problem_lines(err) == [f"--stack: there is no Pulumi.dev.yaml in the working directory {tmp_path} "
                                   "(--stack-file PATH reads one elsewhere) (got 'dev')"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spelling", ["--stack-file", "--config"])
def test_stack_file_and_its_older_name_read_any_path(spelling, tmp_path, in_repository):
    assert main([spelling, "Pulumi.dev.yaml", "--out", str(tmp_path / "out")]) == 0
    assert len(_yaml_files(tmp_path / "out")) == len(render_stack("dev").objects)


@pytest.mark.parametrize("key, config", [
    ("gpu:cluster", lambda raw: {"gpu:cluster": raw, "gpu:kubeconfig": "elsewhere"}),
    ("gpu", lambda raw: {f"gpu:{key}": value for key, value in raw.items()}),
], ids=["one key holding the config", "a namespace of its own"])
def test_a_config_key_renders_the_config_stored_there(key, config, tmp_path, in_repository):
    assert main(["--stack", "dev", "--out", str(tmp_path / "dev")]) == 0
    project = _project(tmp_path / "project", {**config(raw_stack("dev")), "dualsched:slurm": {"clusterName": "ignored"}})
    assert main(["--stack-file", str(project / "Pulumi.prod.yaml"), "--config-key", key, "--out", str(tmp_path / "keyed")]) == 0
    assert _texts(tmp_path / "keyed") == _texts(tmp_path / "dev") != {}


@pytest.mark.parametrize("key, line", [
    ("a:b:c", "--config-key: must be a config namespace or one key, '<namespace>' or '<namespace>:<key>' such as "
              "'myproj:cluster' (got 'a:b:c')"),
    ("gpu:nope", "gpu:nope: is not set in the stack's config (its keys: gpu:cluster) (got nothing)"),
    ("dualsched", "dualsched: has no keys in the stack's config (its keys: gpu:cluster) (got nothing)"),
])
def test_a_bad_config_key_is_exit_2_with_one_line(key, line, tmp_path, capsys):
    project = _project(tmp_path / "project", {"gpu:cluster": raw_stack("dev")})
    assert main(["--stack-file", str(project / "Pulumi.prod.yaml"), "--config-key", key, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert _problem_lines(err) == [line] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _module(project: Path, name: str, text: str) -> None:
    (project / f"{name}.py").write_text(text)


def test_the_readme_consumer_program_renders_from_its_project(tmp_path, monkeypatch, captured):
    """The README's own program (infra.py): it reads gpu:cluster itself and passes its provider."""
    [snippet] = re.findall(r"```python\n(# infra\.py.*?)```", (ROOT / "README.md").read_text(), re.S)
    ciphertext = "v1:Zm9yIHRoZSBlbmdpbmUgb25seQ=="
    project = _project(tmp_path / "project", {"gpu:cluster": raw_stack("dev"), "gpu:kubeconfig": {"secure": ciphertext}})
    _module(project, "infra", snippet)
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", "infra:main", "--out", "build"]) == 0
    [render] = captured
    assert render.summary() == render_stack("dev").render.summary()
    [provider] = [r for r in render.registrations if r.type == "pulumi:providers:kubernetes"]
    kubernetes = [r for r in render.registrations if r.custom and r.type.startswith("kubernetes:")]
    assert kubernetes and {r.provider.rsplit("::", 1)[0] for r in kubernetes} == {provider.urn}
    assert not [p for p, text in _texts(project / "build").items() if ciphertext in text]


def test_a_program_given_the_config_renders_what_it_builds(tmp_path, monkeypatch, captured):
    project = _project(tmp_path / "project", _dualsched_keys(raw_stack("dev")))
    _module(project, "given_config", "from dualsched.components.cluster import DualScheduledCluster\n\n"
                                     "def build(config):\n    DualScheduledCluster('mine', config)\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", "given_config:build", "--out", "build"]) == 0
    [render] = captured
    assert render.summary() == render_stack("dev").render.summary()
    assert render.slurm_files == render_stack("dev").slurm_files


def test_pulumi_config_sees_the_stack_files_config_under_its_project_name(tmp_path, monkeypatch):
    """A program that reads config itself needs no dualsched config at all."""
    project = _project(tmp_path / "project", {"consumer:greeting": "hello", "consumer:sizes": [1, 2]}, name="consumer")
    _module(project, "greeter", "import json\nimport pulumi\nimport pulumi_kubernetes as k8s\n\n"
                                "def main():\n    config = pulumi.Config()\n"
                                "    k8s.core.v1.ConfigMap('greeting', metadata={'name': 'greeting', 'namespace': 'apps'},\n"
                                "        data={'greeting': config.require('greeting'), 'sizes': json.dumps(config.require_object('sizes'))})\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", "greeter:main", "--out", "build"]) == 0
    assert yaml.safe_load((project / "build" / "apps" / "configmap-greeting.yaml").read_text())["data"] == {
        "greeting": "hello", "sizes": "[1, 2]"}
    assert not (project / "build" / "slurm-files").exists()


def test_a_config_key_for_a_program_that_reads_its_own_config_is_refused(tmp_path, monkeypatch, capsys):
    """The program would never read it: a key given there is a mistake to report, not to ignore."""
    project = _project(tmp_path / "project", {"consumer:greeting": "hello"}, name="consumer")
    _module(project, "reads_its_own", "def main():\n    pass\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", "reads_its_own:main", "--config-key", "consumer:cluster", "--out", "build"]) == 2
    err = capsys.readouterr().err
    assert _problem_lines(err) == ["--config-key: is never read: the program reads_its_own:main takes no config (it reads its "
                                   "own with pulumi.Config); leave --config-key out (got 'consumer:cluster')"]
    assert "Traceback" not in err and not (project / "build").exists()
    assert main(["--stack", "prod", "--program", "reads_its_own:main", "--out", "build"]) == 0


BAD_PROGRAMS = {
    "no-function": ("greetings", None, "--program: must be '<module>:<function>', e.g. 'infra.cluster:build' (got 'greetings')"),
    "no-module": ("no_such_module_here:main", None,
                  "--program: cannot import no_such_module_here: ModuleNotFoundError: No module named 'no_such_module_here' "
                  "(got 'no_such_module_here:main')"),
    "missing-function": ("bad_missing:main", "def other():\n    pass\n",
                         "--program: module bad_missing has no function main (got 'bad_missing:main')"),
    "two-arguments": ("bad_arity:main", "def main(config, more):\n    pass\n",
                      "--program: must take the validated config (one argument) or nothing (it reads its config itself), "
                      "not 2 arguments (got 'bad_arity:main')"),
    "raises": ("bad_raises:main", "def main():\n    raise ValueError('no such pool')\n",
               "--program: stopped the render with ValueError: no such pool (at bad_raises.py:2) (got 'bad_raises:main')"),
    "no-signature": ("builtins:ValueError", None, "--program: is not a function the render can call (got 'builtins:ValueError')"),
    "main-module": ("__main__:main", None, "--program: cannot be a __main__.py: move the program into a module of its own "
                                           "(infra.py) that __main__.py calls, and name that (got '__main__:main')"),
}


@pytest.mark.parametrize("case", BAD_PROGRAMS, ids=list(BAD_PROGRAMS))
def test_a_bad_program_is_exit_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    reference, text, line = BAD_PROGRAMS[case]
    project = _project(tmp_path / "project", _dualsched_keys(raw_stack("dev")))
    if text is not None:
        _module(project, reference.split(":")[0], text)
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", reference, "--out", "build"]) == 2
    err = capsys.readouterr().err
    assert _problem_lines(err) == [line] and "Traceback" not in err
    assert not (project / "build").exists()


def test_a_program_stopping_with_a_run_error_prints_its_message(tmp_path, monkeypatch, capsys):
    project = _project(tmp_path / "project", _dualsched_keys(raw_stack("dev")))
    _module(project, "stops", "import pulumi\n\ndef main():\n    raise pulumi.RunError('gpu:cluster: is not set (got nothing)')\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", "stops:main", "--out", "build"]) == 2
    assert capsys.readouterr().err == "program stops:main stopped:\ngpu:cluster: is not set (got nothing)\n"


# ------------------------------------------------------------------------------ transforms

TRANSFORMING = """\
import pulumi
import pulumi_kubernetes as k8s


def label(args):
    props = dict(args.props)
    props["metadata"] = {**props.get("metadata", {}), "labels": {"team": "ml"}}
    return pulumi.ResourceTransformResult(props, args.opts)


def legacy_label(args):
    props = dict(args.props)
    props["metadata"] = {**(props.get("metadata") or {}), "labels": {"team": "ml"}}
    return pulumi.ResourceTransformationResult(props, args.opts)


def config_map(opts=None):
    return k8s.core.v1.ConfigMap("settings", metadata={"name": "settings", "namespace": "apps"}, data={"a": "b"}, opts=opts)


def option():
    config_map(pulumi.ResourceOptions(transforms=[label]))


def stack():
    pulumi.runtime.register_resource_transform(label)
    config_map()


def invoke():
    pulumi.runtime.register_invoke_transform(lambda args: None)
    config_map()


def transformation():
    config_map(pulumi.ResourceOptions(transformations=[legacy_label]))
"""


@pytest.mark.parametrize("function, named", [
    ("option", "ResourceOptions(transforms=...) of kubernetes:core/v1:ConfigMap 'settings'"),
    ("stack", "a stack transform (pulumi.runtime.register_resource_transform)"),
    ("invoke", "an invoke transform (pulumi.runtime.register_invoke_transform)"),
])
def test_transforms_are_refused_naming_each(function, named, tmp_path, monkeypatch, capsys):
    project = _project(tmp_path / "project", {})
    _module(project, "transforming", TRANSFORMING)
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", f"transforming:{function}", "--out", "build"]) == 2
    err = capsys.readouterr().err
    [line] = _problem_lines(err)
    assert line.startswith("transforms: the program registers Pulumi transforms, which the engine runs") and "Traceback" not in err
    assert line.endswith(f"(got [{named!r}])")
    assert not (project / "build").exists()


def test_transformations_run_by_the_sdk_render_as_they_deploy(tmp_path, monkeypatch):
    project = _project(tmp_path / "project", {})
    _module(project, "transforming_sdk", TRANSFORMING)
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["--stack", "prod", "--program", "transforming_sdk:transformation", "--out", "build"]) == 0
    manifest = yaml.safe_load((project / "build" / "apps" / "configmap-settings.yaml").read_text())
    assert manifest["metadata"]["labels"] == {"team": "ml"}


def test_render_config_refuses_transforms_too():
    def program(config):
        build(config)
        pulumi.runtime.register_resource_transform(lambda args: None)

    with pytest.raises(TransformsRefused, match="registers Pulumi transforms"):
        render_config(render_stack("dev").config, "dev", program)


def test_a_render_without_slurm_writes_no_slurm_files_and_says_so(tmp_path, in_repository, capsys):
    assert main(["--stack-file", "examples/Pulumi.inference-only.yaml", "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "slurm-files").exists()
    assert "slurm.conf: none (the program registers no Slurm config ConfigMap)" in capsys.readouterr().out
