"""The CrossGuard pack under the real engine: `pulumi preview --policy-pack policy`.

Pulumi v3.274 runs a Python policy pack through the language host's RunPlugin (our host,
tools/gosrc/pulumi-language-python, does `python -u -m pulumi.policy` in the pack directory). The
pack runs on python3 from PATH (PulumiPolicy.yaml has no virtualenv option): the world's PATH starts
with the project's .venv, which has policy/requirements.txt installed. Previews only: these tests
change nothing in the cluster and can run in any order with test_engine.py.
"""

from __future__ import annotations

import textwrap

import pytest
import yaml
from pulumi import automation as auto

from e2e_support import ROOT, VENV, World, raw_config

pytestmark = pytest.mark.e2e

PACK = ROOT / "policy"


def test_dev_stack_passes_the_pack(world: World):
    stack = world.stack("policy-dev", raw_config("dev"))
    result = stack.preview(policy_packs=[str(PACK)], color="never")
    assert "dualsched@v0.1.0" in result.stdout, result.stdout[-3000:]   # the pack really ran
    assert "mandatory" not in result.stdout and "violation" not in result.stdout.lower(), result.stdout[-3000:]


def test_prod_as_shipped_passes_the_pack_checked_as_prod(world: World):
    result = world.stack("policy-prod", raw_config("prod")).preview(policy_packs=[str(PACK)], color="never")
    assert "dualsched@v0.1.0" in result.stdout, result.stdout[-3000:]
    assert "mandatory" not in result.stdout and "violation" not in result.stdout.lower(), result.stdout[-3000:]


def test_prod_without_protect_fails_the_pack_from_its_own_stack_config(world: World):
    """No --policy-pack-config: the pack reads `environment: prod` from the stack the engine previews, as
    dualsched-policy does from the stack file; the prod rules then refuse what is not protected."""
    config = raw_config("prod")
    config["protect"] = False
    with pytest.raises(auto.CommandError) as error:
        world.stack("policy-prod-unprotected", config).preview(policy_packs=[str(PACK)], color="never")
    output = str(error.value)
    assert "prod-stateful-protected" in output and "mandatory" in output, output[-4000:]


def test_a_program_with_its_own_config_key_is_checked_as_the_stack_it_keeps_there(world: World, tmp_path):
    """A team's program reads the config at `gpu:cluster` (the README's): DUALSCHED_CONFIG_KEY tells the pack so, as
    --config-key tells dualsched-policy; prod kept there without protect is then refused as prod."""
    project = {"name": "own-key", "runtime": {"name": "python", "options": {"virtualenv": str(VENV)}}}
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump(project))
    (tmp_path / "__main__.py").write_text(
        "from dualsched.components.cluster import DualScheduledCluster\n"
        "from dualsched.config import ConfigKey, load_pulumi_config\n\n"
        "DualScheduledCluster('gpu', load_pulumi_config(ConfigKey.parse('gpu:cluster')))\n"
    )
    config = raw_config("prod")
    config["protect"] = False
    (tmp_path / "Pulumi.own-key-prod.yaml").write_text(yaml.safe_dump({"config": {"gpu:cluster": config}}))
    # the program imports dualsched from the checkout, as the world's project copy does
    stack = world.stack("own-key-prod", project=tmp_path, env={"DUALSCHED_CONFIG_KEY": "gpu:cluster", "PYTHONPATH": str(ROOT)})
    with pytest.raises(auto.CommandError) as error:
        stack.preview(policy_packs=[str(PACK)], color="never")
    output = str(error.value)
    assert "prod-stateful-protected" in output and "mandatory" in output, output[-4000:]
    assert "dualsched-config-found" not in output, output[-4000:]


def test_a_privileged_pod_outside_slurm_is_rejected(world: World, tmp_path):
    project = {"name": "policy-probe", "runtime": {"name": "python", "options": {"virtualenv": str(VENV)}}}
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump(project))
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
    stack = world.stack("probe", project=tmp_path)
    with pytest.raises(auto.CommandError) as error:
        stack.preview(policy_packs=[str(PACK)], color="never")
    output = str(error.value)
    assert "privileged-only-slurmd" in output and "container 'probe' is privileged" in output, output[-4000:]
    assert "dualsched-config-found" in output, output[-4000:]  # no dualsched config: not passed as dev
