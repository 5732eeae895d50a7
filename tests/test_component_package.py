"""The component package layer (package/): generated input types, inferred schema, config from inputs.

The real CLI and engine run it in tests/e2e/test_component_package_engine.py (schema from `pulumi package
get-schema`, a Pulumi YAML program deploying it); here: what needs no engine.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pulumi
import pytest
import yaml
from pulumi.errors import InputPropertiesError
from pulumi.output import _OutputData
from pulumi.runtime import rpc

from dualsched.config import ConfigError, StackConfig
from dualsched.config.loader import HIDDEN
from dualsched.package import gen_types
from dualsched.package.cluster import SOURCE, config_from_inputs, invalid_inputs, schema, to_config_keys

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "dualsched:"


def dev_config() -> dict:
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    return {k[len(PREFIX):]: v for k, v in document["config"].items() if k.startswith(PREFIX)}


def snake(config):
    """What the provider hands Cluster: the inferred Python names (the schema's camelCase, un-camelled)."""
    from pulumi.provider.experimental.util import camel_case

    from dualsched.package.cluster import _model_of

    def walk(value, model):
        if isinstance(value, list):
            return [walk(v, model) for v in value]
        if not isinstance(value, dict):
            return value
        by_schema = {camel_case(name): name for name in model.model_fields}
        out = {}
        for key, item in value.items():
            name = by_schema[key]
            sub = _model_of(model.model_fields[name].annotation)
            out[name] = walk(item, sub) if sub else item
        return out

    return walk(config, StackConfig)


def settled(value, *, known=True, secret=False):
    """An Output as the provider's construct() receives one: already settled."""
    future = asyncio.get_event_loop_policy().new_event_loop().create_future()
    future.set_result(_OutputData(set(), value, known, secret))
    out = object.__new__(pulumi.Output)
    out._data = future
    return out


def test_generated_types_and_schema_are_fresh():
    assert gen_types.main(["--check"]) == 0, "run: python -m dualsched.package.gen_types"


def test_schema_is_the_config_with_its_keys_types_and_docs():
    found = schema()
    cluster = found["resources"]["dualsched:index:Cluster"]
    assert cluster["isComponent"] is True
    # the component's inputs are the top-level config keys, required as the config requires them
    assert set(cluster["inputProperties"]) == {field.alias for field in StackConfig.model_fields.values()}
    assert sorted(cluster["requiredInputs"]) == ["pools", "storage"]
    pool = found["types"]["dualsched:index:NodePool"]
    assert pool["properties"]["gpusPerNode"]["type"] == "integer"
    assert "One of: 'dedicated', 'partitioned', 'kubernetes', 'time-shared'." in pool["properties"]["mode"]["description"]
    assert set(cluster["properties"]) == {"namespaces", "controllerAddress", "slurmConfHash", "inferenceEndpoints"}
    assert json.loads((ROOT / "package" / "schema.json").read_text()) == json.loads(gen_types.schema_text())


def test_inputs_become_the_same_config_as_the_stack_file():
    raw = dev_config()
    assert to_config_keys(snake(raw)) == raw
    config, depends = config_from_inputs(snake(raw), "gpu")
    assert config == StackConfig.model_validate(raw) and depends == set()


def test_the_docs_yaml_program_is_a_config_the_component_takes():
    """docs/component-package.md's example is what a team copies first: its properties pass validation."""
    [block] = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "component-package.md").read_text(), re.S)
    properties = yaml.safe_load(block)["resources"]["gpu"]["properties"]
    config, _ = config_from_inputs(snake(properties), "gpu")
    assert [pool.name for pool in config.pools] == ["gpu"] and config.slurm.cluster_name == "demo"


def test_a_config_mistake_is_the_loader_message_as_invalid_inputs():
    raw = dev_config()
    raw["slurm"]["namespace"] = "Slurm_NS"
    with pytest.raises(ConfigError) as failed:
        config_from_inputs(snake(raw), "gpu")
    message = str(failed.value)
    assert message.startswith(f"invalid dualsched config in {SOURCE.format(name='gpu')}")
    assert "slurm.namespace: must be a DNS-1123 label" in message and "(got 'Slurm_NS')" in message
    error = invalid_inputs(failed.value)
    assert isinstance(error, InputPropertiesError) and error.message == message
    assert error.errors == [{"property_path": "slurm.namespace", "reason": failed.value.problems[0].message}]


def test_known_outputs_are_read_unknown_ones_refused_by_path():
    raw = snake(dev_config())
    raw["slurm"]["cluster_name"] = settled("dev")
    config, _ = config_from_inputs(raw, "gpu")
    assert config.slurm.cluster_name == "dev"
    raw["slurm"]["cluster_name"] = settled(None, known=False)
    raw["pools"][0]["nodes"] = rpc.UNKNOWN
    with pytest.raises(ConfigError) as failed:
        config_from_inputs(raw, "gpu")
    assert [p.path for p in failed.value.problems] == ["slurm.clusterName", "pools[0].nodes"]
    assert all("must be known when the component is constructed" in p.message for p in failed.value.problems)


def test_a_secret_is_refused_where_it_would_be_written_in_plain_text():
    raw = snake(dev_config())
    raw["storage"]["nfs"]["server"] = settled("nfs.secret.internal", secret=True)
    with pytest.raises(ConfigError) as failed:
        config_from_inputs(raw, "gpu")
    (problem,) = failed.value.problems
    assert "is a Pulumi secret" in problem.message and problem.value is HIDDEN
    assert "nfs.secret.internal" not in str(failed.value)
    assert invalid_inputs(failed.value).errors == []  # the engine would print the value beside the path


def test_the_component_builds_what_the_dualsched_program_builds():
    """Under mocks: Cluster from inputs registers the same Kubernetes objects as the stack's own program."""
    from dualsched.package.cluster import Cluster
    from rendering import render_stack, render_with_registrations

    raw = dev_config()
    own = render_stack("dev")
    packaged = render_with_registrations(own.config, "dev", program=lambda _config: Cluster("dualsched", snake(raw)))
    key = lambda o: (o.pulumi_type, o.pulumi_name)  # noqa: E731
    assert sorted(map(key, packaged.objects)) == sorted(map(key, own.objects))
    mine = {key(o): o.manifest for o in packaged.objects}
    # generated key material differs between any two renders: a Secret is compared without its data
    same = lambda m: {k: v for k, v in m.items() if not (m.get("kind") == "Secret" and k in ("data", "stringData"))}  # noqa: E731
    assert [key(o) for o in own.objects if same(mine[key(o)]) != same(o.manifest)] == []
    assert [c.type for c in packaged.components("dualsched:index:Cluster")] == ["dualsched:index:Cluster"]
