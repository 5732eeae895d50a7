"""The policy rules (policy/rules.py): each one rejects a program that breaks it, and the
dev and prod stacks pass them all.

The programs are the real ones: the stack's render (policy.offline, which also records
each resource's ``protect`` option from the mock monitor, as the engine would hand it
to the pack) with one object changed, or a stack config that breaks a rule. The same
rule functions run inside the CrossGuard pack (policy/__main__.py); the real-engine
run (`pulumi preview --policy-pack policy`) is in tests/e2e/test_policy_pack_engine.py.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from dualsched.components.node_keeper import KEEPER, STATE_FILE
from dualsched.config import StackConfig, load_stack_file, parse_stack_config
from dualsched.policy import offline
from dualsched.policy.rules import NODE_KEEPER, NODE_KEEPER_STATE, RULES, Resource, Settings, dualsched_config, violations
from rendering import raw_stack

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "policy"
MUNGE_LIKE_KEY = base64.b64encode(os.urandom(1024)).decode()


# ------------------------------------------------------------------------- programs


class Program:
    """A stack's rendered resources and the pack settings for it."""

    def __init__(self, config: StackConfig, resources: list[Resource]):
        self.config = config
        self.resources = resources

    def settings(self, **overrides: Any) -> Settings:
        base = offline.settings_for(self.config)
        return Settings(**{**base.__dict__, **overrides})

    def find(self, kind: str, name_part: str = "") -> Resource:
        matches = [r for r in self.resources if r.kind == kind and name_part in r.manifest["metadata"].get("name", "")]
        assert len(matches) == 1, f"{len(matches)} {kind} objects match {name_part!r}"
        return matches[0]

    def mutated(self, kind: str, name_part: str, edit: Callable[[dict], None], protect: Optional[bool] = None) -> "Program":
        """The same program with one object edited (a deep copy; the fixture stays intact)."""
        target = self.find(kind, name_part)
        manifest = copy.deepcopy(dict(target.manifest))
        edit(manifest)
        changed = Resource(manifest, target.protect if protect is None else protect, target.pulumi_name)
        return Program(self.config, [changed if r is target else r for r in self.resources])

    def added(self, manifest: dict, protect: bool = False) -> "Program":
        return Program(self.config, [*self.resources, Resource(manifest, protect, "extra")])

    def violations(self, **overrides: Any) -> list[tuple[str, str]]:
        return [(v.rule, v.message) for v in violations(self.resources, self.settings(**overrides))]


def rejected(program: Program, rule: str, fragment: str, **overrides: Any) -> list[str]:
    """Assert ``rule`` (and only it) rejects the program with a message containing ``fragment``."""
    found = program.violations(**overrides)
    assert found, f"{rule} did not reject the program"
    assert {name for name, _ in found} == {rule}, found
    messages = [message for _, message in found]
    assert any(fragment in message for message in messages), messages
    return messages


@pytest.fixture(scope="module")
def dev() -> Program:
    config = parse_stack_config(raw_stack("dev"), "Pulumi.dev.yaml")
    return Program(config, offline.rendered_resources(config))


@pytest.fixture(scope="module")
def prod() -> Program:
    config = parse_stack_config(raw_stack("prod"), "Pulumi.prod.yaml")
    return Program(config, offline.rendered_resources(config))


def pod_spec(manifest: dict) -> dict:
    return manifest["spec"]["template"]["spec"]


def first_container(manifest: dict) -> dict:
    return pod_spec(manifest)["containers"][0]


# ------------------------------------------------------------------- the stacks pass


def test_dev_stack_passes_every_rule(dev):
    assert dev.violations() == []


def test_prod_stack_passes_every_rule_in_prod(prod):
    assert prod.settings().environment == "prod"
    assert prod.violations() == []
    # protect comes from the program's resource options, recorded at registration
    claims = [r for r in prod.resources if r.kind in ("PersistentVolumeClaim", "PersistentVolume")]
    assert claims and all(r.protect for r in claims)


# -------------------------------------------------------------- privileged / hostNetwork


def test_privileged_inference_container_is_rejected(dev):
    program = dev.mutated("Deployment", "qwen-small", lambda m: first_container(m)["securityContext"].update(privileged=True))
    rejected(program, "privileged-only-slurmd", "container 'server' is privileged")


def test_sys_admin_outside_slurmd_is_rejected_like_privileged(dev):
    def add_sys_admin(manifest):
        first_container(manifest)["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["CAP_SYS_ADMIN"]}

    rejected(dev.mutated("Deployment", "qwen-small", add_sys_admin), "privileged-only-slurmd", "container 'server' adds SYS_ADMIN")


def test_host_network_outside_slurmd_is_rejected(dev):
    program = dev.mutated("Deployment", "slurmdbd", lambda m: pod_spec(m).update(hostNetwork=True))
    rejected(program, "privileged-only-slurmd", "hostNetwork is allowed only for slurmd pods")


def test_slurmd_outside_the_slurm_namespace_is_rejected(dev):
    program = dev.mutated("DaemonSet", "slurmd", lambda m: m["metadata"].update(namespace="batch"))
    messages = rejected(program, "privileged-only-slurmd", "Slurm namespace 'slurm'")
    assert len(messages) == 2  # hostNetwork, and slurmd's CAP_SYS_ADMIN


def test_privileged_pod_in_the_slurm_namespace_without_the_slurmd_label_is_rejected(dev):
    def relabel(manifest):
        manifest["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "slurmd-debug"

    rejected(dev.mutated("DaemonSet", "slurmd", relabel), "privileged-only-slurmd", "label app.kubernetes.io/name=slurmd")


def test_the_slurm_namespace_comes_from_pack_config(dev):
    rejected(dev, "privileged-only-slurmd", "Slurm namespace 'hpc'", slurm_namespace="hpc")


# ------------------------------------------------------------------ Slurm taint tolerations


def test_inference_tolerating_the_slurm_taint_is_rejected(dev):
    toleration = {"key": "dualsched.io/slurm", "operator": "Exists", "effect": "NoSchedule"}
    program = dev.mutated("Deployment", "qwen-small", lambda m: pod_spec(m).update(tolerations=[toleration]))
    rejected(program, "no-slurm-toleration-outside-slurm", "tolerates the Slurm taint 'dualsched.io/slurm'")


def test_a_wildcard_toleration_outside_slurm_is_rejected(dev):
    program = dev.mutated("Deployment", "qwen-small", lambda m: pod_spec(m).update(tolerations=[{"operator": "Exists"}]))
    rejected(program, "no-slurm-toleration-outside-slurm", "inference/")


def test_other_tolerations_and_slurmd_tolerations_pass(dev, prod):
    program = dev.mutated(
        "Deployment", "qwen-small", lambda m: pod_spec(m).update(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    )
    assert program.violations() == []
    slurmd = prod.find("DaemonSet", "h100-a")
    assert any(t["key"] == "dualsched.io/slurm" for t in pod_spec(dict(slurmd.manifest))["tolerations"])


def test_the_taint_key_comes_from_pack_config(dev):
    toleration = {"key": "example.com/hpc", "operator": "Exists"}
    program = dev.mutated("Deployment", "qwen-small", lambda m: pod_spec(m).update(tolerations=[toleration]))
    assert program.violations() == []
    rejected(program, "no-slurm-toleration-outside-slurm", "'example.com/hpc'", slurm_taint_key="example.com/hpc")


# ------------------------------------------------------------------ node labels and taints


def _keeper_state(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    """An edit of the node keeper's desired state, inside its ConfigMap."""

    def edit_config_map(manifest: dict) -> None:
        state = json.loads(manifest["data"][STATE_FILE])
        edit(state)
        manifest["data"][STATE_FILE] = json.dumps(state)

    return edit_config_map


def test_the_pack_finds_the_node_keepers_state_by_the_components_names():
    """The pack runs without the project's packages: its copies of the names must not drift."""
    assert (NODE_KEEPER, NODE_KEEPER_STATE) == (KEEPER, STATE_FILE)


def test_a_reserved_taint_key_in_the_node_keepers_state_is_rejected(prod):
    """Taints reach the nodes through the keeper: the rule reads them there."""
    reserved = _keeper_state(lambda state: state["pools"][0]["taints"][0].update(key="node.kubernetes.io/unschedulable"))
    rejected(prod.mutated("ConfigMap", "node-keeper", reserved), "no-system-namespaces-or-keys", "taint 'node.kubernetes.io/unschedulable'")


def test_a_reserved_label_key_in_the_node_keepers_state_is_rejected(dev):
    """Labels reach the nodes through the keeper too: no Pulumi resource per node."""
    reserved = _keeper_state(lambda state: state["pools"][0]["labels"].update({"node-role.kubernetes.io/gpu": ""}))
    rejected(dev.mutated("ConfigMap", "node-keeper", reserved), "no-system-namespaces-or-keys", "label 'node-role.kubernetes.io/gpu'")


def test_the_keepers_guarded_pool_label_is_under_the_one_prefix_kept_for_node_isolation(dev):
    """node-restriction.kubernetes.io/ is reserved for the cluster admin's isolation labels, which kubelets may
    not set: the keeper's copy of the pool label is there, and the rule lets it be."""
    [keeper] = [r for r in dev.resources if r.kind == "ConfigMap" and NODE_KEEPER_STATE in (r.manifest.get("data") or {})]
    labels = json.loads(keeper.manifest["data"][NODE_KEEPER_STATE])["pools"][0]["labels"]
    assert labels["node-restriction.kubernetes.io/dualsched-pool"] == "gpu"
    assert dev.violations() == []


def test_a_reserved_window_taint_key_is_rejected(dev):
    window = {"startMinute": 540, "durationMinutes": 480, "taint": {"key": "k8s.io/window", "value": "closed", "effect": "NoExecute"}}
    program = dev.mutated("ConfigMap", "node-keeper", _keeper_state(lambda state: state["pools"][0].update(window=window)))
    rejected(program, "no-system-namespaces-or-keys", "taint 'k8s.io/window'")


# ------------------------------------------------------------------------------ GPUs


def test_gpu_request_without_limit_is_rejected(dev):
    program = dev.mutated("Deployment", "qwen-small", lambda m: first_container(m)["resources"]["limits"].pop("nvidia.com/gpu"))
    rejected(program, "gpu-limits-and-pools", "requests nvidia.com/gpu=1 without a limit")


def test_gpu_request_different_from_limit_is_rejected(dev):
    program = dev.mutated("Deployment", "qwen-small", lambda m: first_container(m)["resources"]["limits"].update({"nvidia.com/gpu": "2"}))
    rejected(program, "gpu-limits-and-pools", "request and limit must be equal")


def test_gpu_pod_without_pool_placement_is_rejected(dev):
    program = dev.mutated("Deployment", "qwen-small", lambda m: pod_spec(m).pop("affinity"))
    rejected(program, "gpu-limits-and-pools", "not confined to a GPU pool")


def test_gpu_pod_with_an_unpinned_affinity_term_is_rejected(dev):
    def add_term(manifest):
        terms = pod_spec(manifest)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        terms.append({"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]})

    rejected(dev.mutated("Deployment", "qwen-small", add_term), "gpu-limits-and-pools", "not confined to a GPU pool")


def test_gpu_pod_on_a_pool_without_gpus_is_rejected(dev):
    def cpu_pool(manifest):
        pod_spec(manifest).pop("affinity")
        pod_spec(manifest)["nodeSelector"] = {"dualsched.io/pool": "cpu"}

    rejected(dev.mutated("Deployment", "qwen-small", cpu_pool), "gpu-limits-and-pools", "['cpu'] which are not GPU pools ['gpu']")


# -------------------------------------------------------------------- secret material


def test_munge_key_in_a_configmap_is_rejected(dev):
    program = dev.mutated("ConfigMap", "submission", lambda m: m["data"].update({"munge.key": MUNGE_LIKE_KEY}))
    messages = rejected(program, "no-secret-material", "data key 'munge.key'")
    assert all(MUNGE_LIKE_KEY not in message for message in messages)


def test_key_like_blob_under_an_innocent_name_is_rejected(dev):
    program = dev.mutated("ConfigMap", "submission", lambda m: m["data"].update({"bootstrap": MUNGE_LIKE_KEY[:64]}))
    rejected(program, "no-secret-material", "key-like base64 blob")


def test_slurm_password_option_in_a_configmap_is_rejected(dev):
    def storage_pass(manifest):
        manifest["data"]["slurm.conf"] += "AccountingStoragePass=hunter2-but-longer\n"

    rejected(dev.mutated("ConfigMap", "slurm-config", storage_pass), "no-secret-material", "sets 'AccountingStoragePass'")


def test_private_key_in_a_configmap_is_rejected(dev):
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----\n"
    program = dev.mutated("ConfigMap", "submission", lambda m: m["data"].update({"tls.pem": pem}))
    rejected(program, "no-secret-material", "PEM private key")


def test_password_env_literal_is_rejected(dev):
    def literal(manifest):
        first_container(manifest).setdefault("env", []).append({"name": "MARIADB_PASSWORD", "value": "correct-horse-battery"})

    rejected(dev.mutated("StatefulSet", "mariadb", literal), "no-secret-material", "env MARIADB_PASSWORD")


def test_password_env_literal_in_an_init_container_is_rejected(dev):
    def literal(manifest):
        pod_spec(manifest)["initContainers"][0].setdefault("env", []).append({"name": "DB_PASSWORD", "value": "correct-horse-battery"})

    rejected(dev.mutated("StatefulSet", "mariadb", literal), "no-secret-material", "env DB_PASSWORD of container 'mariadb-init'")


def test_the_database_password_reaches_mariadb_through_files_only(dev):
    """No env at all: the init container reads the Secret's file, mariadbd an init file in memory."""
    spec = pod_spec(dict(dev.find("StatefulSet", "mariadb").manifest))
    assert [c["name"] for c in spec["initContainers"] + spec["containers"]] == ["mariadb-init", "mariadb"]
    assert not [c["name"] for c in spec["initContainers"] + spec["containers"] if c.get("env")]
    assert "/run/secrets/db/password" in spec["initContainers"][0]["command"][-1]
    assert "--init-file=/run/mysqld-init/init.sql" in spec["containers"][0]["command"]
    assert dev.violations() == []


def test_flags_paths_and_secret_refs_are_not_secret_material(dev):
    """Under secret-sounding names: a flag, a file path and a secretKeyRef are all fine."""
    def harmless(manifest):
        first_container(manifest)["env"] = [
            {"name": "MARIADB_RANDOM_ROOT_PASSWORD", "value": "1"},
            {"name": "MARIADB_PASSWORD_FILE", "value": "/run/secrets/db/password"},
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
            {"name": "API_TOKEN", "value": "$(TOKEN_FROM_ELSEWHERE)"},
        ]

    assert dev.mutated("StatefulSet", "mariadb", harmless).violations() == []
    assert dev.violations() == []


def test_user_directory_is_not_secret_material(dev):
    """passwd and group lines (`name:x:uid:...`) hold no password: the ConfigMap keys avoid 'passwd' too."""
    config_maps = [
        r for r in dev.resources
        if r.kind == "ConfigMap" and r.manifest["metadata"]["labels"].get("app.kubernetes.io/name") == "identity"
    ]
    assert len(config_maps) == 2
    for config_map in config_maps:
        assert set(config_map.manifest["data"]) == {"users", "groups"}
    assert dev.violations() == []


def test_a_user_named_like_a_secret_is_not_secret_material():
    raw = raw_stack("dev")
    raw["slurm"]["users"] = [{"name": "compass", "uid": 3000}]
    raw["submission"]["identities"] = [{"serviceAccount": "trainer", "user": "compass"}]
    raw["slurm"]["login"]["users"][0]["name"] = "compass"
    config = parse_stack_config(raw, "test")
    assert offline.check(config) == []


# ------------------------------------------------------------------------- prod rules


def test_latest_and_untagged_images_are_rejected_in_prod(prod):
    program = prod.mutated("Deployment", "llama", lambda m: first_container(m).update(image="docker.io/vllm/vllm-openai:latest"))
    rejected(program, "prod-images-pinned", "uses the tag 'latest'")
    program = prod.mutated("Deployment", "llama", lambda m: first_container(m).update(image="docker.io/vllm/vllm-openai"))
    rejected(program, "prod-images-pinned", "has no tag")


def test_digests_pass_and_dev_may_use_latest(prod, dev):
    digest = "docker.io/vllm/vllm-openai@sha256:" + "0" * 64
    assert prod.mutated("Deployment", "llama", lambda m: first_container(m).update(image=digest)).violations() == []
    latest = dev.mutated("Deployment", "qwen", lambda m: first_container(m).update(image="vllm/vllm-openai:latest"))
    assert latest.violations() == []
    server_only = Program(dev.config, [latest.find("Deployment", "qwen")])
    rejected(server_only, "prod-images-pinned", "uses the tag 'latest'", environment="prod")


def test_unprotected_state_is_rejected_in_prod(prod):
    rejected(prod.mutated("PersistentVolumeClaim", "slurmctld-state", lambda m: None, protect=False), "prod-stateful-protected",
             "PersistentVolumeClaim slurm/dualsched-slurmctld-state")


def test_a_prod_program_without_protect_is_rejected(tmp_path, capsys):
    """The whole program: prod with `protect: false` leaves every claim and volume unprotected."""
    raw = raw_stack("prod")
    raw["protect"] = False
    stack_file = tmp_path / "Pulumi.unprotected.yaml"
    stack_file.write_text(yaml.safe_dump({"config": {f"dualsched:{key}": value for key, value in raw.items()}}))
    assert offline.main(["--config", str(stack_file)]) == 1
    out = capsys.readouterr().out
    assert "5 violations" in out  # 2 PVs + 3 PVCs (state, slurm and inference shares)
    assert out.count("[prod-stateful-protected]") == 5


def test_an_unprotected_database_statefulset_is_rejected_in_prod(dev):
    program = Program(dev.config, [r for r in dev.resources if r.kind == "StatefulSet"])
    rejected(program, "prod-stateful-protected", "StatefulSet slurm/mariadb", environment="prod")


def test_pv_reclaim_policy_must_be_retain_in_prod(prod):
    program = prod.mutated("PersistentVolume", "shared-slurm", lambda m: m["spec"].update(persistentVolumeReclaimPolicy="Delete"))
    rejected(program, "prod-pv-reclaim-retain", "is 'Delete'")
    program = prod.mutated("PersistentVolume", "shared-slurm", lambda m: m["spec"].pop("persistentVolumeReclaimPolicy"))
    rejected(program, "prod-pv-reclaim-retain", "is None")


def test_offline_check_of_the_stacks(capsys):
    assert offline.main(["--stack", "dev"]) == 0
    assert "every rule passes" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--stack-file", "examples/Pulumi.slurm-only.yaml"],
    ["--stack-file", "examples/Pulumi.inference-only.yaml"],
    ["--stack-file", "examples/Pulumi.own-program.yaml", "--config-key", "training:cluster", "--program", "dualsched.examples.own_program:main"],
], ids=["slurm-only", "inference-only", "own-program"])
def test_offline_check_of_the_examples_reads_their_key_and_runs_their_program(argv, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert offline.main(argv) == 0
    assert "every rule passes" in capsys.readouterr().out


def test_an_inference_only_stack_runs_no_slurmd_so_any_slurm_namespace_will_do():
    config = load_stack_file(ROOT / "examples" / "Pulumi.inference-only.yaml")
    assert config.slurm is None
    assert offline.settings_for(config).slurm_namespace == Settings.slurm_namespace


def test_the_offline_check_judges_the_programs_resources(tmp_path, monkeypatch, capsys):
    """--program is what is checked: a program adding a privileged pod fails, where dualsched's passes."""
    (tmp_path / "privileged_extra.py").write_text(
        "import pulumi_kubernetes as k8s\nfrom dualsched.components.program import build\n\n"
        "def main(config):\n    build(config)\n"
        "    k8s.core.v1.Pod('debug', metadata={'name': 'debug', 'namespace': 'inference'}, spec={'containers': [\n"
        "        {'name': 'x', 'image': 'busybox:1.36', 'securityContext': {'privileged': True}}]})\n")
    (tmp_path / "Pulumi.dev.yaml").write_text((ROOT / "Pulumi.dev.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert offline.main(["--stack", "dev"]) == 0
    assert offline.main(["--stack", "dev", "--program", "privileged_extra:main"]) == 1
    assert "[privileged-only-slurmd] Pod inference/debug" in capsys.readouterr().out


@pytest.mark.parametrize("argv, line", [
    (["--stack", "nope"], "--stack: there is no Pulumi.nope.yaml in the working directory {cwd} (--stack-file PATH reads one "
                          "elsewhere) (got 'nope')"),
    (["--stack", "dev", "--program", "nope"], "--program: must be '<module>:<function>', e.g. 'infra.cluster:build' (got 'nope')"),
    (["--stack", "dev", "--config-key", "gpu:cluster"],
     "gpu:cluster: is not set in the stack's config (its keys: dualsched:environment, dualsched:inference, "
     "dualsched:kubernetesVersion, dualsched:network, dualsched:pools, dualsched:slurm, dualsched:storage, "
     "dualsched:submission) (got nothing)"),
], ids=["no-such-stack", "bad-program", "no-such-key"])
def test_offline_bad_input_is_exit_2(argv, line, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert offline.main(argv) == 2
    err = capsys.readouterr().err
    assert line.format(cwd=ROOT) in err.splitlines()[-1] and "Traceback" not in err


# ------------------------------------------------------------------------------- pack


@pytest.mark.parametrize("stack", ["dev", "prod", "local"])
def test_the_pack_takes_the_settings_of_the_stack_the_engine_previews_as_the_offline_check_does(stack):
    """The engine hands a pack the stack's config as text (PULUMI_CONFIG); prod's stack file alone makes it prod."""
    from dualsched.config.loader import engine_settings, read_stack_document

    path = ROOT / f"Pulumi.{stack}.yaml"
    handed, _ = engine_settings(read_stack_document(path), path)
    settings = Settings.from_stack(handed)
    assert settings == offline.settings_for(load_stack_file(path))
    assert settings.prod == (stack == "prod") and settings.gpu_pools


def test_the_stack_settings_read_snake_case_names_and_plain_strings_too():
    handed = {"dualsched:environment": "prod", "dualsched:placement": json.dumps({"pool_label": "example.com/pool"}),
              "dualsched:pools": json.dumps([{"name": "a", "gpus_per_node": 8}, {"name": "cpu", "gpusPerNode": 0}])}
    assert Settings.from_stack(handed) == Settings(environment="prod", pool_label="example.com/pool", gpu_pools=("a",))
    assert Settings.from_stack({}) == Settings()


def test_the_stack_settings_read_the_config_at_the_key_the_program_reads_it_from():
    """'myproj:cluster' (one object, as README's program keeps it) reads as 'dualsched' (a namespace) does."""
    from dualsched.config.loader import engine_settings, read_stack_document

    path = ROOT / "Pulumi.prod.yaml"
    handed, _ = engine_settings(read_stack_document(path), path)
    one_key = {"gpu:cluster": json.dumps(dualsched_config(handed)), "gpu:kubeconfig": "elsewhere"}
    assert Settings.from_stack(one_key, "gpu:cluster") == Settings.from_stack(handed) == offline.settings_for(load_stack_file(path))
    assert Settings.from_stack(one_key, "gpu:cluster").prod
    assert dualsched_config(one_key) is None and dualsched_config(handed, "gpu:cluster") is None
    assert dualsched_config({"gpu:cluster": "a string"}, "gpu:cluster") is None


def test_a_pack_config_overrides_what_it_names_and_keeps_the_stacks_other_settings():
    stack = Settings(environment="prod", slurm_namespace="hpc", gpu_pools=("h100",))
    assert Settings.from_config({"environment": "dev"}, stack) == Settings(environment="dev", slurm_namespace="hpc", gpu_pools=("h100",))
    assert Settings.from_config(None, stack) == stack


def test_the_pack_runs_on_python_with_its_own_pinned_requirements():
    assert yaml.safe_load((PACK / "PulumiPolicy.yaml").read_text())["runtime"] == "python"
    assert "pulumi-policy==1.21.0" in (PACK / "requirements.txt").read_text().split()


def test_pack_wires_every_rule_as_a_mandatory_policy():
    import pulumi_policy as policy  # requirements-dev.txt installs the pack's own dependencies
    from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResourceOptions, ResourceValidationArgs
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

    pack = runpy.run_path(str(PACK / "__main__.py"), run_name="dualsched_pack")
    policies = pack["policies"]()
    assert [p.name for p in policies] == [rule.name for rule in RULES] + ["dualsched-config-found"]
    assert all(p.enforcement_level is policy.EnforcementLevel.MANDATORY for p in policies)
    policies = [p for p in policies if isinstance(p, policy.ResourceValidationPolicy)]

    # props as the engine hands them during preview: an auto-name still unknown
    props = unknown_checking_proxy(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": UNKNOWN_STRING_VALUE, "namespace": "inference"},
            "spec": {"template": {"spec": {"hostNetwork": True, "containers": [{"name": "x", "image": "busybox"}]}}},
        }
    )
    options = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    reported: list[tuple[str, str]] = []
    for item in policies:
        args = ResourceValidationArgs("kubernetes:apps/v1:Deployment", props, "urn", "bad-server", options, None, {"environment": "prod"})
        item.validate(args, lambda message, urn, name=item.name: reported.append((name, message)))
    assert sorted(name for name, _ in reported) == ["privileged-only-slurmd", "prod-images-pinned"]
    assert all("Deployment inference/bad-server" in message for _, message in reported)


def test_the_pack_checks_the_stack_the_engine_configures_it_for():
    """The engine's ConfigureStack call carries the stack's config (analyzer_plugin.go): prod's alone makes the pack
    check prod, with no pack config; an unprotected claim of prod is then refused."""
    from dualsched.config.loader import engine_settings, read_stack_document
    from pulumi.runtime.proto import analyzer_pb2
    from pulumi_policy import EnforcementLevel
    from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResourceOptions, ResourceValidationArgs, _PolicyAnalyzerServicer
    from pulumi_policy.proxy import unknown_checking_proxy

    pack = runpy.run_path(str(PACK / "__main__.py"), run_name="dualsched_pack")
    policies = pack["policies"]()
    [protected] = [p for p in policies if p.name == "prod-stateful-protected"]
    claim = unknown_checking_proxy({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "state", "namespace": "slurm"}})
    unprotected = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])

    def refused() -> list[str]:
        reported: list[str] = []
        args = ResourceValidationArgs("kubernetes:core/v1:PersistentVolumeClaim", claim, "urn", "state", unprotected, None, {})
        protected.validate(args, lambda message, urn: reported.append(message))
        return reported

    servicer = _PolicyAnalyzerServicer("dualsched", "0.1.0", policies, EnforcementLevel.MANDATORY)
    for stack, refuses in (("dev", False), ("prod", True)):
        path = ROOT / f"Pulumi.{stack}.yaml"
        handed, _ = engine_settings(read_stack_document(path), path)
        servicer.ConfigureStack(analyzer_pb2.AnalyzerStackConfigureRequest(stack=stack, config=handed), None)
        assert bool(refused()) == refuses, stack


def _configured_pack(monkeypatch, handed: dict[str, str], key: Optional[str] = None) -> tuple[dict, list[str]]:
    """The pack loaded as the engine starts it (DUALSCHED_CONFIG_KEY set or not), configured for ``handed``;
    returns the pack's globals and what its config-found policy reports."""
    from pulumi.runtime.proto import analyzer_pb2
    from pulumi_policy import EnforcementLevel, StackValidationArgs
    from pulumi_policy.policy import _PolicyAnalyzerServicer

    if key is None:
        monkeypatch.delenv("DUALSCHED_CONFIG_KEY", raising=False)
    else:
        monkeypatch.setenv("DUALSCHED_CONFIG_KEY", key)
    monkeypatch.setattr(_PolicyAnalyzerServicer, "ConfigureStack", _PolicyAnalyzerServicer.ConfigureStack)  # the pack wraps it
    pack = runpy.run_path(str(PACK / "__main__.py"), run_name="dualsched_pack")
    policies = pack["policies"]()
    servicer = _PolicyAnalyzerServicer("dualsched", "0.1.0", policies, EnforcementLevel.MANDATORY)
    servicer.ConfigureStack(analyzer_pb2.AnalyzerStackConfigureRequest(stack="prod", config=handed), None)
    [found] = [p for p in policies if p.name == "dualsched-config-found"]
    reported: list[str] = []
    found.validate(StackValidationArgs([], {}), lambda message, urn: reported.append(message))
    return pack, reported


def test_a_stack_without_the_dualsched_config_at_the_packs_key_fails_the_pack_instead_of_passing_as_dev(monkeypatch):
    from dualsched.config.loader import engine_settings, read_stack_document

    path = ROOT / "Pulumi.prod.yaml"
    handed, _ = engine_settings(read_stack_document(path), path)
    one_key = {"gpu:cluster": json.dumps(dualsched_config(handed)), "gpu:kubeconfig": "elsewhere"}

    pack, reported = _configured_pack(monkeypatch, handed)
    assert reported == [] and pack["StackSettings"].current.prod
    pack, reported = _configured_pack(monkeypatch, one_key)  # the key not said: nothing at 'dualsched'
    assert reported == ["the stack's config has no dualsched config at 'dualsched' (its keys: gpu:cluster, gpu:kubeconfig); "
                        "the rules would check it with the default settings (environment dev). Set DUALSCHED_CONFIG_KEY to "
                        "where the program reads it, '<namespace>' or '<namespace>:<key>' as dualsched-policy's --config-key"]
    pack, reported = _configured_pack(monkeypatch, one_key, "gpu:cluster")
    assert reported == [] and repr(pack["StackSettings"].current) == repr(Settings.from_stack(handed))  # the pack's own rules module
