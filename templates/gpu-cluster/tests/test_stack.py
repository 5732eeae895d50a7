"""Every stack of this project renders as intended: dualsched's public mocks (dualsched.testing), no cluster and
no Pulumi CLI. Run `pytest` in the project directory; CI runs it first (.github/workflows/preview.yml)."""

from pathlib import Path

import pytest

from dualsched.testing import ConfigError, render_stack

PROJECT = Path(__file__).resolve().parent.parent
STACKS = sorted(PROJECT.glob("Pulumi.*.yaml"))
PROGRAM = "infra:build"  # the project's own program, as __main__.py runs it


@pytest.fixture(params=STACKS, ids=lambda path: path.name)
def render(request, monkeypatch):
    monkeypatch.chdir(PROJECT)  # the program is imported from the project directory
    return render_stack(request.param, program=PROGRAM)


def test_there_is_a_stack():
    assert STACKS, "no Pulumi.<stack>.yaml beside Pulumi.yaml"


def test_slurm_runs_one_controller_and_the_partitions_asked_for(render):
    controller = render.one("StatefulSet", "slurmctld")
    assert controller.manifest["spec"]["replicas"] == 1
    assert "PartitionName=gpu" in render.slurm_files["slurm.conf"]


def test_each_model_is_served_by_a_deployment(render):
    served = {d.name for d in render.by_kind("Deployment") if d.namespace == "inference"}
    assert any("qwen-small" in name for name in served), served


def test_a_config_mistake_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT)
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(STACKS[0].read_text().replace("slurmGpus: 6", "slurmGpus: 9"))
    with pytest.raises(ConfigError) as refused:
        render_stack(bad, program=PROGRAM)
    assert "slurmGpus" in str(refused.value)
