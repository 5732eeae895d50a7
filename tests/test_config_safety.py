"""Validation that cannot be bypassed: config/types.py, config/loader.py, policy/rules.py.

Text reaching a Slurm file or a manifest is one ASCII line; every pattern runs in
linear time; stack files cannot hold YAML bombs, deep nesting or repeated keys;
Kubernetes' own namespaces and label/taint prefixes are refused by the models and
by the policy pack; every problem is one ``<path>: <what> (got <value>)`` line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from typing import Annotated

from dualsched.config import ConfigError, load_stack_file, parse_stack_config
from dualsched.config import types
from dualsched.config.loader import MAX_DEPTH, MAX_STACK_FILE_BYTES, read_stack_document
from dualsched.policy import offline
from dualsched.policy import rules
from tests.conftest import ROOT, raw_stack

PROBLEM_LINE = re.compile(r"^  \S.*: .+ \(got .*\)$")


def set_at(raw: Any, where: tuple, value: Any) -> None:
    """Set raw[where...] = value, creating missing mappings on the way; a callable gets the old value."""
    parent = raw
    for part in where[:-1]:
        parent = parent[part] if isinstance(parent, list) else parent.setdefault(part, {})
    old = parent[where[-1]] if isinstance(parent, list) else parent.get(where[-1])
    parent[where[-1]] = value(old) if callable(value) else value


def problems_of(raw: dict[str, Any]) -> list[str]:
    try:
        parse_stack_config(raw)
    except ConfigError as error:
        lines = str(error).split("\n")[1:]
        assert all(PROBLEM_LINE.match(line) for line in lines), lines
        return lines
    return []


def rejected_at(raw: dict[str, Any], path: str) -> str:
    lines = problems_of(raw)
    found = [line for line in lines if line.startswith(f"  {path}: ")]
    assert found, f"{path} not rejected: {lines}"
    return found[0]


# ------------------------------------------------------------- single-line ASCII text


@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\r", "\x00", "\u2028"], ids=repr)
@pytest.mark.parametrize(
    "where, path",
    [
        (("slurm", "clusterName"), "slurm.clusterName"),
        (("slurm", "partitions", 0, "maxTime"), "slurm.partitions[0].maxTime"),
        (("slurm", "partitions", 0, "name"), "slurm.partitions[0].name"),
        (("pools", 0, "name"), "pools[0].name"),
        (("pools", 0, "nodes"), "pools[0].nodes"),
        (("kubernetesVersion",), "kubernetesVersion"),
        (("storage", "nfs", "path"), "storage.nfs.path"),
        (("storage", "nfs", "server"), "storage.nfs.server"),
        (("storage", "modelsPath"), "storage.modelsPath"),
        (("slurm", "controller", "stateStorage", "size"), "slurm.controller.stateStorage.size"),
    ],
)
def test_a_line_break_or_control_character_is_never_accepted(where, path, suffix):
    raw = raw_stack("dev")
    set_at(raw, where, lambda old: str(old or "models") + suffix)
    line = rejected_at(raw, path)
    assert "\n" not in line and "\r" not in line and "\x00" not in line


@pytest.mark.parametrize(
    "where, value",
    [
        (("slurm", "partitions", 0, "maxTime"), "\u0664\u0668:00:00"),  # Arabic-Indic digits match \d
        (("slurm", "partitions", 0, "maxTime"), "\uff14\uff18:00:00"),  # full-width digits
        (("kubernetesVersion",), "1.\u0663\u0664"),
        (("images", "vllm"), "docker.io/vllm/vllm-openai:v\u00e9"),  # \w takes letters of any script
        (("pools", 0, "nodes"), "gp\u00fc-[1-2]"),
    ],
    ids=repr,
)
def test_non_ascii_digits_and_letters_are_refused(where, value):
    raw = raw_stack("dev")
    set_at(raw, where, value)
    assert problems_of(raw)


@pytest.mark.parametrize(
    "value, ok",
    [("INFINITE", True), ("7-00:00:00", True), ("48:00:00", True), ("30", True), ("2-12", True),
     ("9999999", False), ("1234567-00:00:00", False), ("1:2", False), ("", False)],
)
def test_slurm_times_stay_inside_slurms_uint32_minutes(value, ok):
    raw = raw_stack("dev")
    raw["slurm"]["partitions"][0]["maxTime"] = value
    assert (problems_of(raw) == []) is ok


def test_quantities_beyond_kubernetes_range_are_refused_without_a_hang():
    for size in ("9223372036854775808", "8Ei", "1e999", "1" * 60 + "Gi"):
        raw = raw_stack("dev")
        raw["slurm"]["controller"]["stateStorage"]["size"] = size
        rejected_at(raw, "slurm.controller.stateStorage.size")


def test_secret_key_and_lustre_fs_name_are_single_words():
    raw = raw_stack("prod")
    raw["slurm"]["accounting"]["database"]["external"]["passwordSecret"]["key"] = "pass\nword"
    rejected_at(raw, "slurm.accounting.database.external.passwordSecret.key")
    raw = raw_stack("prod")
    raw["storage"]["lustre"]["fsName"] = "fs\x1b[2J"
    rejected_at(raw, "storage.lustre.fsName")


# ------------------------------------------------------------------------ linear time


# With the old `/([A-Za-z0-9._-]+/?)*$` this backtracks 2**1000 ways; it must answer at once.
ADVERSARIAL = {
    "AbsolutePath": "/" + "a" * 1000 + "!",
    "RelativePath": "a" * 1000 + "!",
    "DnsSubdomain": "a-" * 120 + "!",
    "HostName": "a" * 240 + "!",
    "LabelKey": "a." * 120 + "a/" + "a" * 60 + "!",
    "ImageRef": "a" * 500 + "!",
    "SlurmTime": "1" * 15 + "!",
}


def test_every_pattern_answers_adversarial_input_at_once():
    # A subprocess with a timeout: an exponential pattern would hang, not just be slow.
    script = textwrap.dedent(
        f"""
        from pydantic import TypeAdapter, ValidationError
        from dualsched.config import types
        for name, value in {ADVERSARIAL!r}.items():
            try:
                TypeAdapter(getattr(types, name)).validate_python(value)
                raise SystemExit(name + " accepted " + repr(value[:20]))
            except ValidationError:
                pass
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr


def test_a_long_nfs_path_with_a_trailing_newline_fails_clearly():
    raw = raw_stack("dev")
    raw["storage"]["nfs"]["path"] = "/" + "a/" * 500 + "\n"
    line = rejected_at(raw, "storage.nfs.path")
    assert len(line) < 400


@pytest.mark.parametrize("path, ok", [("/", True), ("/export/shared", True), ("/export/shared/", True),
                                      ("/export//shared", False), ("/export/../etc", False), ("/./x", False),
                                      ("relative", False), ("", False)])
def test_absolute_paths_split_on_slashes(path, ok):
    raw = raw_stack("dev")
    raw["storage"]["nfs"]["path"] = path
    assert (problems_of(raw) == []) is ok


# ----------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    "where, value",
    [
        (("pools", 0, "gpusPerNode"), 65),
        (("pools", 0, "cpus"), 4097),
        (("pools", 0, "realMemoryMb"), 2**31 + 1),
        (("pools", 0, "nodes"), "gpu-[1-5001]"),
        (("slurm", "partitions", 0, "priorityTier"), 65534),
        (("inference", "models", 0, "maxModelLen"), 2**24 + 1),
        (("inference", "models", 0, "replicas", "max"), 1001),
        (("pools", 0, "cpus"), 10**5000),  # past Python's int-to-text limit: still one clean line
    ],
    ids=lambda v: type(v).__name__,
)
def test_numbers_and_sizes_have_upper_bounds(where, value):
    raw = raw_stack("dev")
    set_at(raw, where, value)
    assert problems_of(raw)


def test_lists_have_upper_bounds():
    raw = raw_stack("dev")
    raw["inference"]["models"] = raw["inference"]["models"] * 257
    assert any(line.startswith("  inference.models: ") for line in problems_of(raw))


def _models_and_fields(model, seen):
    for name, field in model.model_fields.items():
        yield model, name, field
        for arg in _args(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in seen:
                seen.add(arg)
                yield from _models_and_fields(arg, seen)


def _args(annotation) -> list:
    found = [annotation]
    for arg in getattr(annotation, "__args__", ()):
        found += _args(arg)
    return found


def test_every_text_field_refuses_a_huge_value():
    from dualsched.config.models import StackConfig

    text_fields = [(m, n, f) for m, n, f in _models_and_fields(StackConfig, set()) if str in _args(f.annotation)]
    assert len(text_fields) > 20
    for model, name, field in text_fields:
        annotation = field.annotation if not field.metadata else Annotated[(field.annotation, *field.metadata)]
        with pytest.raises(ValidationError):
            TypeAdapter(annotation).validate_python("a" * 5000)


# ----------------------------------------------------------- reserved names and keys


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kube-public", "kube-node-lease", "kube-anything"])
@pytest.mark.parametrize("path", ["slurm.namespace", "inference.namespace", "submission.namespace"])
def test_kubernetes_system_namespaces_are_refused(path, namespace):
    raw = raw_stack("dev")
    section, key = path.split(".")
    raw.setdefault(section, {})[key] = namespace
    assert "system namespace" in rejected_at(raw, path)


@pytest.mark.parametrize(
    "key", ["kubernetes.io/os", "k8s.io/x", "node.kubernetes.io/not-ready", "node-role.kubernetes.io/worker",
            "topology.kubernetes.io/zone", "foo.k8s.io/bar"]
)
@pytest.mark.parametrize("path", ["placement.poolLabel", "placement.slurmTaintKey", "pools[0].taints[0].key"])
def test_reserved_label_and_taint_prefixes_are_refused(path, key):
    raw = raw_stack("dev")
    if path.startswith("placement"):
        raw.setdefault("placement", {})[path.split(".")[1]] = key
    else:
        raw["pools"][0]["taints"] = [{"key": key, "effect": "PreferNoSchedule"}]
    assert "reserves for itself" in rejected_at(raw, path)


@pytest.mark.parametrize("key", ["dualsched.io/pool", "example.com/kubernetes.io", "notkubernetes.io/x", "pool"])
def test_own_prefixes_are_accepted(key):
    raw = raw_stack("dev")
    raw.setdefault("placement", {})["poolLabel"] = key
    assert problems_of(raw) == []


@pytest.mark.parametrize(
    "value", ["default", "kube-system", "kube-x", "slurm", "kubernetes.io/os", "node.kubernetes.io/a", "k8s.io/a",
              "a.k8s.io/b", "dualsched.io/pool", "xk8s.io/a", "pool"]
)
def test_the_pack_and_the_models_agree_on_what_is_reserved(value):
    assert rules.is_reserved_namespace(value) == types.is_reserved_namespace(value)
    assert rules.is_reserved_key(value) == types.is_reserved_key(value)
    assert rules.RESERVED_NAMESPACES == types.RESERVED_NAMESPACES
    assert rules.RESERVED_KEY_DOMAINS == types.RESERVED_KEY_DOMAINS


@pytest.fixture(scope="module")
def dev_render():
    config = parse_stack_config(raw_stack("dev"))
    return config, offline.rendered_resources(config)


def _pack(resources, **settings):
    return [(v.rule, v.message) for v in rules.violations(resources, rules.Settings(**settings))]


def test_the_pack_refuses_objects_in_a_system_namespace(dev_render):
    config, resources = dev_render
    moved = []
    for resource in resources:
        manifest = dict(resource.manifest, metadata=dict(resource.manifest.get("metadata") or {}))
        if manifest["metadata"].get("namespace") == config.slurm.namespace:
            manifest["metadata"]["namespace"] = "kube-system"
        elif resource.kind == "Namespace" and manifest["metadata"].get("name") == config.slurm.namespace:
            manifest["metadata"]["name"] = "kube-system"
        moved.append(rules.Resource(manifest, resource.protect, resource.pulumi_name))
    # The pack is configured with the same (bad) namespace the stack used: it must still refuse.
    found = _pack(moved, slurm_namespace="kube-system", pool_label=config.placement.pool_label)
    names = {rule for rule, _ in found}
    assert "no-system-namespaces-or-keys" in names
    assert "privileged-only-slurmd" in names, "slurmd in kube-system is not exempt from the privileged rule"
    assert any("Namespace kube-system" in message for _, message in found)


@pytest.mark.parametrize("namespace", ["default", "kube-public", "kube-node-lease", "kube-foo"])
def test_the_pack_refuses_each_system_namespace(namespace):
    resource = rules.Resource({"kind": "ConfigMap", "metadata": {"name": "x", "namespace": namespace}})
    assert [rule for rule, _ in _pack([resource])] == ["no-system-namespaces-or-keys"]


@pytest.mark.parametrize("label, taint", [("kubernetes.io/os", None), (None, "node.kubernetes.io/not-ready"),
                                          ("node-role.kubernetes.io/gpu", None), (None, "k8s.io/x")])
def test_the_pack_refuses_reserved_node_labels_and_taints(dev_render, label, taint):
    """What reaches the nodes is the node keeper's desired state (no Pulumi resource per node)."""
    _, resources = dev_render
    keeper = next(r for r in resources if r.kind == "ConfigMap" and rules.kept_pools(r.manifest))
    state = json.loads(keeper.manifest["data"][rules.NODE_KEEPER_STATE])
    if label:
        state["pools"][0]["labels"][label] = "gpu"
    if taint:
        state["pools"][0]["taints"] = [{"key": taint, "value": "true", "effect": "NoSchedule"}]
    manifest = {**keeper.manifest, "data": {**keeper.manifest["data"], rules.NODE_KEEPER_STATE: json.dumps(state)}}
    found = _pack([rules.Resource(manifest)])
    assert found and {rule for rule, _ in found} == {"no-system-namespaces-or-keys"}
    assert repr(label or taint) in found[0][1]


def test_the_rendered_stacks_use_no_system_namespace_or_key(dev_render):
    _, resources = dev_render
    assert not [v for v in rules.violations(resources, rules.Settings()) if v.rule == "no-system-namespaces-or-keys"]


# ----------------------------------------------------------------------- YAML files


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(text)
    return path


def _refusal(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path)
    lines = str(caught.value).split("\n")[1:]
    assert all(PROBLEM_LINE.match(line) for line in lines), lines
    return lines


BILLION_LAUGHS = "config:\n" + textwrap.indent("\n".join(
    ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"a{i}: &a{i} [{','.join(['*a' + str(i - 1)] * 9)}]" for i in range(1, 10)]), "  ") + "\n  dualsched:slurm: *a9\n"  # fmt: skip


def test_a_billion_laughs_is_refused_before_it_is_expanded(tmp_path):
    (line,) = _refusal(_write(tmp_path, BILLION_LAUGHS))
    assert re.match(r"  \(aliases\): YAML aliases expand the file to more than 100000 values \(got '[0-9]{10} values'\)$", line), line


def test_an_alias_inside_the_value_it_names_is_refused(tmp_path):
    for loop in ("config:\n  dualsched:pools: &a [1, *a]\n", "config:\n  dualsched:slurm: &a {users: *a}\n"):
        (line,) = _refusal(_write(tmp_path, loop))
        assert "a YAML alias inside the value it names makes a loop" in line, line


def test_anchors_aliases_and_merge_keys_read_as_pulumi_reads_them(tmp_path):
    """The Pulumi CLI (Go's yaml.v3) reads anchors, aliases and `<<` merge keys: a team may keep a pool's
    settings once and take them into the stack's config by a merge key."""
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    pools = document["config"]["dualsched:pools"]
    document["config"]["dualsched:pools"] = "@POOLS@"
    merged = "[" + ", ".join(["{<<: *first}"] + [json.dumps(pool) for pool in pools[1:]]) + "]"
    text = f"x-first-pool: &first {json.dumps(pools[0])}\n" + yaml.safe_dump(document).replace("'@POOLS@'", merged)
    assert "<<: *first" in text
    assert load_stack_file(_write(tmp_path, text)) == load_stack_file(ROOT / "Pulumi.dev.yaml")


def test_deep_nesting_is_refused(tmp_path):
    for deep in ("[" * 100_000 + "]" * 100_000, "config:\n  dualsched:slurm: " + "{a: " * (MAX_DEPTH + 5) + "1" + "}" * (MAX_DEPTH + 5)):
        assert "levels deep" in _refusal(_write(tmp_path, deep))[0]


def test_a_huge_file_is_refused_before_parsing(tmp_path):
    path = _write(tmp_path, "config:\n  x: '" + "a" * MAX_STACK_FILE_BYTES + "'\n")
    assert "at most" in _refusal(path)[0]


def test_every_duplicate_key_is_reported_with_its_lines(tmp_path):
    text = (ROOT / "Pulumi.dev.yaml").read_text()
    text = text.replace("    clusterName: dev\n", "    clusterName: dev\n    clusterName: other\n", 1)
    text = text.replace("config:\n", "config:\n  dualsched:environment: prod\n", 1)
    assert "clusterName: dev\n    clusterName: other" in text
    lines = _refusal(_write(tmp_path, text))
    assert len(lines) == 2
    assert any("(got 'clusterName')" in line and "first on line" in line for line in lines)
    assert any("(got 'dualsched:environment')" in line for line in lines)


def test_the_real_stack_files_pass_the_strict_reader():
    for stack in ("dev", "prod", "local"):
        assert yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text()) == read_stack_document(ROOT / f"Pulumi.{stack}.yaml")


def test_the_render_cli_refuses_a_bomb_without_a_traceback(tmp_path):
    bad = _write(tmp_path, BILLION_LAUGHS)
    result = subprocess.run(
        [sys.executable, "-m", "dualsched.components.render", "--config", str(bad), "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "aliases" in result.stderr


def test_the_program_holds_the_stack_file_to_the_same_rules(tmp_path, monkeypatch):
    """`pulumi up` runs the program in the project directory: a duplicate key there is refused
    even though the values the engine hands over look fine."""
    import pulumi

    from dualsched.config import load_pulumi_config

    text = (ROOT / "Pulumi.dev.yaml").read_text().replace("    clusterName: dev\n", "    clusterName: dev\n    clusterName: dev\n", 1)
    (tmp_path / "Pulumi.dupes.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "dupes")
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert "key repeated in one mapping" in str(caught.value)


def test_deeply_nested_engine_values_are_a_clear_message(monkeypatch):
    """yaml.v3 allows 10000 levels; Python's json would raise RecursionError on them."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    from dualsched.config import load_pulumi_config

    monkeypatch.setattr(pulumi, "get_stack", lambda: "no-such-stack")
    monkeypatch.setattr(runtime_config, "get_config_env", lambda: {"dualsched:slurm": "[" * 50_000 + "]" * 50_000})
    with pytest.raises(ConfigError) as caught:
        load_pulumi_config()
    assert all(len(line) < 300 for line in str(caught.value).split("\n"))
