"""The offline render: `python -m components.render` writes what `pulumi up` would create."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from components import render as render_module
from components.render import CLUSTER_SCOPED, MANIFEST, REDACTED, main, write_render
from rendering import ROOT, raw_stack, render_stack

SUMMARY_LINE = re.compile(r"^\s+([A-Za-z]+)\s+(\d+)$")


@pytest.fixture
def captured(monkeypatch):
    """Run main() while keeping the Render it wrote (its secrets are generated per run)."""
    renders = []
    original = render_module.render_config

    def capture(config, stack="render"):
        renders.append(original(config, stack))
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
    assert {p.name for p in out.iterdir()} == expected_dirs | {MANIFEST}
    for path in files:
        manifest = yaml.safe_load(path.read_text())
        assert path.parent.name == manifest["metadata"].get("namespace", CLUSTER_SCOPED)
        assert path.name == f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
    cluster_scoped = {yaml.safe_load(p.read_text())["kind"] for p in (out / CLUSTER_SCOPED).iterdir()}
    # ClusterRole and binding: the token minter may create TokenReviews (components/tokens.py)
    assert cluster_scoped == {"Namespace", "PersistentVolume", "Node", "ClusterRole", "ClusterRoleBinding"}


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
    assert render_stack("prod").render.summary()["Node"] == 80
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
    assert list(out.rglob("node-gpu-a-*.yaml"))
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    assert len(_yaml_files(out)) == len(render_stack("dev").objects)
    assert not list(out.rglob("node-gpu-a-*.yaml"))


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
    return subprocess.run([sys.executable, "-m", "components.render", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


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
