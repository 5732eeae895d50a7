"""Every rendered manifest validates against the Kubernetes OpenAPI schema (kubernetes-validate, strict).

Strict mode rejects unknown fields, so a misspelt or misplaced field fails here
rather than at `pulumi up`. The schema version is the stack's kubernetesVersion.
No Node objects: the node keeper writes the pools' labels and taints (its merge patches meet the real API
server in the node tier, tests/node/test_node_taints.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from dualsched.components.render import write_render
from rendering import render_raw, render_stack, variant


@pytest.fixture(scope="module", autouse=True)
def _schemas_read_once():
    """kubernetes_validate re-reads its JSON schema files on every call; read each once (25x faster)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            kubernetes_validate.utils, "schema_contents", functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)
        )
        yield


def _kubernetes_pool(raw):
    raw["pools"].append({"name": "serve", "nodes": "inf-[01-02]", "mode": "kubernetes", "gpusPerNode": 4})


def _tainted_shared_pool(raw):
    raw["pools"][0]["taints"] = [{"key": "example.com/serving", "value": "yes", "effect": "NoSchedule"}]
    raw["inference"]["tolerations"] = [{"key": "example.com/serving"}, {"key": "example.com/other", "value": "x", "effect": "NoExecute"}]


VARIANTS = {
    "dev-triton": ("dev", lambda raw: raw["inference"].update(server="triton")),
    "dev-no-accounting": ("dev", lambda raw: raw["slurm"]["accounting"].update(enabled=False)),
    "dev-quota": ("dev", lambda raw: raw["slurm"].update(resourceQuota={"cpu": "100", "memory": "512Gi"})),
    "dev-kubernetes-pool": ("dev", _kubernetes_pool),
    "dev-tainted-shared-pool": ("dev", _tainted_shared_pool),
    "dev-k8s-1.33": ("dev", lambda raw: raw.update(kubernetesVersion="1.33")),
    "prod-baseline-inference": ("prod", lambda raw: raw["inference"].update(podSecurity="baseline")),
}


def _problems(rendered) -> list[str]:
    version = rendered.config.kubernetes_version
    problems = []
    for obj in rendered.objects:
        try:
            kubernetes_validate.validate(obj.manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{obj.kind}/{obj.namespace}/{obj.name}: {str(error).splitlines()[0]}")
    return problems


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_manifest_of_the_stack_validates_strictly(stack):
    rendered = render_stack(stack)
    assert rendered.config.kubernetes_version == "1.34"
    assert _problems(rendered) == []


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_manifest_of_config_variants_validates_strictly(name):
    stack, edit = VARIANTS[name]
    assert _problems(render_raw(variant(stack, edit))) == []


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_written_files_validate_too(stack, tmp_path: Path):
    """What a reviewer reads (Secrets redacted) is still valid YAML for kubectl."""
    rendered = render_stack(stack)
    written = [p for p in write_render(rendered.render, tmp_path) if p.suffix == ".yaml"]
    assert len(written) == len(rendered.objects)
    for path in written:
        kubernetes_validate.validate(yaml.safe_load(path.read_text()), rendered.config.kubernetes_version, strict=True)


def test_strict_validation_does_reject_unknown_fields():
    """Guard against a silently permissive validator."""
    manifest = dict(render_stack("dev").one("DaemonSet").manifest)
    manifest["spec"] = {**manifest["spec"], "updateStrategey": {"type": "OnDelete"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, "1.34", strict=True)
