"""dualsched as a component package, used from Pulumi YAML through the real engine (docs/component-package.md).

The package (``package/``: PulumiPlugin.yaml, runtime python) is served by the checkout's own code; the
consumer is a Pulumi YAML program run by ``pulumi-language-yaml`` (built by tools/build-tools.sh), which
loads the package's schema from the plugin directory and asks it to construct ``dualsched:index:Cluster``.

The stack is small and keeps out of test_engine.py's way in the same private cluster: its own namespaces,
cluster name and placement keys; the static PVs its claims take are topped up afterwards.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_support import ROOT, TIMINGS, World, tail
from dualsched.package.cluster import schema as package_schema

pytestmark = pytest.mark.e2e

PACKAGE_DIR = ROOT / "package"
STACK = "pkg"

# A small stack in the config's own keys (the package's input schema is the dualsched config).
CONFIG: dict[str, Any] = {
    "environment": "dev",
    "kubernetesVersion": "1.34",
    "placement": {
        "poolLabel": "pkg.dualsched.io/pool",
        "slurmTaintKey": "pkg.dualsched.io/slurm",
        "windowTaintKey": "pkg.dualsched.io/inference-window",
    },
    "slurm": {
        "clusterName": "pkg",
        "namespace": "pkg-slurm",
        "controller": {"stateStorage": {"size": "1Gi"}},
        "partitions": [{"name": "gpu", "pools": ["gpu"], "default": True, "maxTime": "1:00:00"}],
        "accounting": {"enabled": False},
    },
    "pools": [
        {
            "name": "gpu",
            "nodes": "gpu-[001-002]",
            "mode": "partitioned",
            "gpusPerNode": 8,
            "slurmGpus": 6,
            "cpus": 8,
            "realMemoryMb": 16000,
            "allocatable": {"cpus": 62, "memoryMb": 250000},
        }
    ],
    "storage": {"type": "nfs", "capacity": "10Gi", "nfs": {"server": "nfs.pkg.internal", "path": "/export/pkg"}},
    "network": {"nodeCidrs": ["10.0.0.0/24"]},
    "inference": {
        "namespace": "pkg-inference",
        "server": "vllm",
        "models": [
            {
                "name": "tiny",
                "path": "qwen2.5-0.5b-instruct",
                "gpus": 1,
                "replicas": {"min": 1, "max": 1},
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
            }
        ],
    },
    "submission": {"enabled": False},
}


@pytest.fixture(autouse=True)
def yaml_host(world: World) -> None:
    """The YAML language host is part of the toolchain (tools/build-tools.sh links it next to pulumi)."""
    if not shutil.which("pulumi-language-yaml", path=world.env["PATH"]):
        pytest.fail("pulumi-language-yaml missing: run `make tools` (tools/build-tools.sh pulumi-language-yaml)")


def shape(schema: dict[str, Any]) -> dict[str, Any]:
    """What a consumer's type checker sees of a schema: names, types, references and required keys
    (the CLI drops the descriptions the inference repeats on list items and map values)."""

    def prop(p: dict[str, Any]) -> Any:
        return {
            "type": p.get("type"),
            "$ref": p.get("$ref"),
            "items": prop(p["items"]) if "items" in p else None,
            "additionalProperties": prop(p["additionalProperties"]) if "additionalProperties" in p else None,
        }

    def props(d: dict[str, Any]) -> dict[str, Any]:
        return {name: prop(p) for name, p in (d or {}).items()}

    return {
        "name": schema["name"],
        "types": {t: (props(d.get("properties")), sorted(d.get("required") or []), d.get("enum")) for t, d in schema["types"].items()},
        "resources": {
            r: (props(d.get("inputProperties")), sorted(d.get("requiredInputs") or []), props(d.get("properties")), d.get("isComponent"))
            for r, d in schema["resources"].items()
        },
    }


def yaml_program(directory: Path, properties: dict[str, Any]) -> Path:
    """A Pulumi YAML project using the dualsched package from the checkout (Pulumi.yaml ``packages:``)."""
    directory.mkdir(parents=True, exist_ok=True)
    project = {
        "name": "dualsched-yaml-consumer",
        "runtime": "yaml",
        "packages": {"dualsched": str(PACKAGE_DIR)},
        "resources": {"gpu": {"type": "dualsched:index:Cluster", "properties": properties}},
        "outputs": {
            "namespaces": "${gpu.namespaces}",
            "controllerAddress": "${gpu.controllerAddress}",
            "inferenceEndpoints": "${gpu.inferenceEndpoints}",
        },
    }
    (directory / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    return directory


def pulumi(world: World, directory: Path, *args: str, check: bool = True, timeout: int = 600):
    return world.run(["pulumi", *args, "--cwd", str(directory), "--non-interactive", "--color", "never"],
                     check=check, timeout=timeout)


def timed(what: str, fn, *args, **kwargs):
    start = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMINGS.append((what, time.monotonic() - start))


def test_schema_is_inferred_from_the_typed_args(world: World, tmp_path: Path):
    """`pulumi package get-schema` runs the package (python) and returns the schema checked in."""
    result = timed("package get-schema", world.run, ["pulumi", "package", "get-schema", str(PACKAGE_DIR)], cwd=tmp_path)
    schema = json.loads(result.stdout)
    assert schema["name"] == "dualsched"
    cluster = schema["resources"]["dualsched:index:Cluster"]
    assert cluster["isComponent"] is True
    assert sorted(cluster["requiredInputs"]) == ["pools", "storage"]
    assert cluster["inputProperties"]["pools"]["items"]["$ref"] == "#/types/dualsched:index:NodePool"
    assert {"namespaces", "controllerAddress", "slurmConfHash", "inferenceEndpoints"} <= set(cluster["properties"])
    pool = schema["types"]["dualsched:index:NodePool"]
    assert pool["required"] == ["name", "nodes"] and pool["properties"]["gpusPerNode"]["type"] == "integer"
    # The same shape as the schema inferred in this process (package.cluster.schema(), written to
    # package/schema.json, kept fresh by the unit tier): every type, property, reference and requirement.
    assert shape(schema) == shape(package_schema())
    assert shape(schema) == shape(json.loads((PACKAGE_DIR / "schema.json").read_text()))


def test_bad_config_is_refused_with_the_config_message(world: World):
    bad = json.loads(json.dumps(CONFIG))
    bad["slurm"]["namespace"] = "Pkg_Slurm"
    directory = yaml_program(world.tmp / "yaml-bad", bad)
    pulumi(world, directory, "stack", "init", "bad")
    result = pulumi(world, directory, "preview", "--stack", "bad", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "invalid dualsched config in dualsched:index:Cluster 'gpu'" in output, tail(output)
    assert "slurm.namespace: must be a DNS-1123 label" in output and "(got 'Pkg_Slurm')" in output, tail(output)
    assert "Traceback" not in output, tail(output)
    # The YAML host checks the schema itself: a misspelt key never reaches the package.
    typo = json.loads(json.dumps(CONFIG))
    typo["pools"][0]["gpusPerNod"] = 8
    directory = yaml_program(world.tmp / "yaml-typo", typo)
    pulumi(world, directory, "stack", "init", "typo")
    result = pulumi(world, directory, "preview", "--stack", "typo", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Existing properties are: gpusPerNode" in output, tail(output)
    for name, d in (("bad", world.tmp / "yaml-bad"), ("typo", world.tmp / "yaml-typo")):
        pulumi(world, d, "stack", "rm", name, "--yes", "--force", check=False)


@pytest.fixture(scope="module")
def deployed(world: World):
    directory = yaml_program(world.tmp / "yaml-consumer", CONFIG)
    pulumi(world, directory, "stack", "init", STACK)
    preview = timed("package: preview (YAML consumer)", pulumi, world, directory, "preview", "--stack", STACK)
    up = timed("package: up (YAML consumer)", pulumi, world, directory, "up", "--yes", "--stack", STACK, "--skip-preview")
    outputs = json.loads(pulumi(world, directory, "stack", "output", "--json", "--stack", STACK).stdout)
    try:
        yield directory, preview, up, outputs
    finally:
        # The ClusterName lock is protected on purpose (components/slurm_config.py): lift it, then destroy.
        pulumi(world, directory, "state", "unprotect", "--all", "--yes", "--stack", STACK, check=False)
        destroyed = timed("package: destroy (YAML consumer)", pulumi, world, directory, "destroy", "--yes",
                          "--stack", STACK, check=False)
        pulumi(world, directory, "stack", "rm", STACK, "--yes", "--force", check=False)
        world.cluster("pvs", check=False)  # the state claim took a static PV (Retain): top the pool up
        assert destroyed.returncode == 0, tail(destroyed.stdout + destroyed.stderr)


def test_yaml_program_deploys_the_component(world: World, deployed):
    _, preview, up, outputs = deployed
    assert "dualsched:index:Cluster" in preview.stdout
    assert outputs["namespaces"] == {"slurm": "pkg-slurm", "inference": "pkg-inference"}
    assert outputs["controllerAddress"].startswith("slurmctld-0.slurmctld.pkg-slurm.svc")
    assert set(outputs["inferenceEndpoints"]) == {"tiny"}
    statefulsets = world.kget("statefulsets", "-n", "pkg-slurm")["items"]
    assert "slurmctld" in [s["metadata"]["name"] for s in statefulsets]
    daemonsets = world.kget("daemonsets", "-n", "pkg-slurm", "-l", "app.kubernetes.io/name=slurmd")["items"]
    assert len(daemonsets) == 1 and daemonsets[0]["status"]["numberReady"] == 2, daemonsets
    deployments = world.kget("deployments", "-n", "pkg-inference")["items"]
    assert len(deployments) == 1 and deployments[0]["status"].get("readyReplicas") == 1, deployments
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in world.kget("nodes")["items"]}
    assert labels["gpu-001"]["pkg.dualsched.io/pool"] == "gpu" and labels["gpu-002"]["pkg.dualsched.io/pool"] == "gpu"


def test_second_preview_changes_nothing(world: World, deployed):
    directory = deployed[0]
    result = pulumi(world, directory, "preview", "--stack", STACK, "--expect-no-changes")
    assert result.returncode == 0
