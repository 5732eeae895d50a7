"""Render stacks for the tests: the real program under the render's Pulumi mocks.

``render_stack("dev")`` renders ``Pulumi.dev.yaml`` once per test session;
``render_raw(raw)`` renders a config dict (the ``dualsched:`` keys without the
prefix), cached by its content. Both return a :class:`Rendered`: the
:class:`components.render.Render` (``objects``, ``by_kind``, ``one``,
``generated_secrets``, ``slurm_files``) plus what the engine would have been
told but the manifests do not show:

* ``resources``: every resource registration, components included, with its
  parent, ``protect`` and ``retain_on_delete`` options;
* ``component_outputs``: what each component passed to ``register_outputs``.

The render's own mock monitor records them (:class:`components.render.RenderMonitor`).
``render_with_registrations(config, program=...)`` swaps in another program
(e.g. one that adds a Job or passes providers) for one render.
Pulumi's mock state is process-global, so each config is rendered fresh and
then cached; never hold two renders open at once.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml
from pydantic.alias_generators import to_camel

from dualsched.components.render import Registration, Render, RenderedObject, render_config
from dualsched.config import StackConfig, load_stack_file, parse_stack_config
from dualsched.config.checks import SLURM_IMAGES
from dualsched.config.models import NVIDIA_AUTODETECT_SINCE

ROOT = Path(__file__).resolve().parent.parent
STACKS = ("dev", "prod")


@dataclass
class Rendered:
    """A render plus the registrations and component outputs the mocks saw."""

    config: StackConfig
    render: Render

    # ---- the Render's own API, for brevity in tests
    @property
    def objects(self) -> list[RenderedObject]:
        return self.render.objects

    @property
    def generated_secrets(self) -> list[str]:
        return self.render.generated_secrets

    @property
    def slurm_files(self) -> dict[str, str]:
        return self.render.slurm_files

    def by_kind(self, kind: str) -> list[RenderedObject]:
        return self.render.by_kind(kind)

    def one(self, kind: str, name_part: str = "") -> RenderedObject:
        return self.render.one(kind, name_part)

    def named(self, kind: str, name: str, namespace: Optional[str] = None) -> RenderedObject:
        """The one object of ``kind`` with exactly this name (and namespace, when given)."""
        matches = [o for o in self.by_kind(kind) if o.name == name and (namespace is None or o.namespace == namespace)]
        assert len(matches) == 1, f"{len(matches)} {kind} objects named {name!r}"
        return matches[0]

    def in_namespace(self, namespace: str, kind: Optional[str] = None) -> list[RenderedObject]:
        return [obj for obj in self.objects if obj.namespace == namespace and (kind is None or obj.kind == kind)]

    # ---- registrations
    @property
    def resources(self) -> list[Registration]:
        return self.render.registrations

    @property
    def component_outputs(self) -> dict[str, dict[str, Any]]:
        return self.render.component_outputs

    def components(self, type_token: Optional[str] = None) -> list[Registration]:
        return [r for r in self.resources if not r.custom and (type_token is None or r.type == type_token)]

    def registration(self, obj: RenderedObject) -> Registration:
        return self.render.registration(obj)

    def outputs_of(self, type_token: str) -> dict[str, Any]:
        """register_outputs of the one component of this type."""
        urns = [r.urn for r in self.components(type_token)]
        assert len(urns) == 1, f"{len(urns)} components of type {type_token}"
        return self.component_outputs[urns[0]]


def render_with_registrations(
    config: StackConfig, stack: str = "render", program: Optional[Callable[[StackConfig], Any]] = None
) -> Rendered:
    """:func:`render_config` of ``config``; ``program`` replaces the dualsched program for this render."""
    return Rendered(config=config, render=render_config(config, stack, program))


def stack_file(name: str) -> Path:
    return ROOT / f"Pulumi.{name}.yaml"


def raw_stack(name: str) -> dict[str, Any]:
    """A stack file's ``dualsched:`` keys without the prefix, as a fresh mutable dict."""
    document = yaml.safe_load(stack_file(name).read_text())
    return {key.split(":", 1)[1]: copy.deepcopy(value) for key, value in document["config"].items() if key.startswith("dualsched:")}


@lru_cache(maxsize=None)
def render_stack(name: str) -> Rendered:
    """The render of ``Pulumi.<name>.yaml``, once per session."""
    return render_with_registrations(load_stack_file(stack_file(name)), name)


@lru_cache(maxsize=64)
def _render_json(text: str) -> Rendered:
    return render_with_registrations(parse_stack_config(json.loads(text), "test config"), "test")


def render_raw(raw: Mapping[str, Any]) -> Rendered:
    """The render of a config dict; equal dicts share one render."""
    return _render_json(json.dumps(raw, sort_keys=True))


SLINKY_IMAGES = {to_camel(field): field.replace("_", "-") for field in SLURM_IMAGES}
"""The config's Slurm image keys, and SchedMD's name for each image."""


def at_release(raw: dict[str, Any], release: str, patch: int = 1) -> dict[str, Any]:
    """The stack on another Slurm release, switched as a user switches it: slurm.release and SchedMD's images
    of one patch release of it together."""
    raw["slurm"]["release"] = release
    if tuple(map(int, release.split("."))) < NVIDIA_AUTODETECT_SINCE:
        raw["slurm"]["gpuAutoDetect"] = "off"  # their builds have neither gpu/nvml nor gpu/nvidia
    images = raw.setdefault("images", {})
    images.update({key: f"ghcr.io/slinkyproject/{name}:{release}.{patch}-ubuntu24.04" for key, name in SLINKY_IMAGES.items()})
    return raw


def own_images(release: str) -> dict[str, str]:
    """A site's own Slurm images of ``release`` (built as the site chooses, NVML included), by config key."""
    return {to_camel(key): f"registry.example/hpc/{key}:{release}.8" for key in SLURM_IMAGES}


def without_containers(raw: dict[str, Any]) -> None:
    """No pool runs job steps in containers (prod's training pools do)."""
    for pool in raw["pools"]:
        pool.pop("containers", None)


def with_joining_pool(raw: dict[str, Any], name: str = "burst", nodes: str = "burst-[001-064]", like: str = "gpu") -> dict[str, Any]:
    """``raw`` with a pool whose nodes join by label, like pool ``like`` but named ``name`` and bounded by ``nodes``,
    in every partition of ``like`` (and the node watcher it needs)."""
    pool = copy.deepcopy(next(pool for pool in raw["pools"] if pool["name"] == like))
    pool.update(name=name, nodes=nodes, joinByLabel=True)
    raw["pools"].append(pool)
    for partition in raw["slurm"]["partitions"]:
        if like in partition["pools"]:
            partition["pools"].append(name)
    raw["slurm"].setdefault("healthCheck", {})["drainCordoned"] = True
    return raw


def variant(name: str, edit) -> dict[str, Any]:
    """A stack's raw config after ``edit(raw)`` (which mutates it in place)."""
    raw = raw_stack(name)
    edit(raw)
    return raw


# ------------------------------------------------------------------ manifest helpers


def pod_spec(obj: RenderedObject) -> dict[str, Any]:
    return obj.manifest["spec"]["template"]["spec"]


def container(obj: RenderedObject, name: str) -> dict[str, Any]:
    spec = pod_spec(obj)
    found = [c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name]
    assert len(found) == 1, f"{obj.kind}/{obj.name} has {len(found)} containers named {name}"
    return found[0]


def volume(obj: RenderedObject, name: str) -> dict[str, Any]:
    found = [v for v in pod_spec(obj).get("volumes", []) if v["name"] == name]
    assert len(found) == 1, f"{obj.kind}/{obj.name} has {len(found)} volumes named {name}"
    return found[0]


def mounts(container_spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> volumeMount."""
    return {m["mountPath"]: m for m in container_spec.get("volumeMounts", [])}


def walk(value: Any, path: str = ""):
    """Yield (path, leaf) for every scalar in a manifest."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk(item, f"{path}[{index}]")
    else:
        yield path, value
