"""Change report: what a change does to Slurm and serving, as Markdown for a pull request.

    python -m dualsched.components.report --base build/base --head build/head [--out report.md]
    python -m dualsched.components.report --base main/Pulumi.prod.yaml --stack prod [--config-key myproj:cluster] [--program infra.cluster:build]
    python -m dualsched.components.report --preview preview.json [--out report.md]

Input is either two offline renders (``python -m dualsched.components.render``) or the
output of ``pulumi preview --json``. A side given as a stack file (``--base FILE``,
``--head FILE``, or ``--stack``/``--stack-file`` for the head) is rendered here first,
with this checkout's program, as ``components.render`` would (same ``--config-key``
and ``--program``): right for a change of config; for a change of the program itself,
render each checkout with its own code and compare the directories. Each changed object is classified by its
impact on the running cluster (see :class:`Impact`): a refused ClusterName change,
storage replace/delete (DATA RISK), a replaced workload (every pod deleted at once),
config reload, slurmctld restart, slurmd pool roll (with the GPU nodes to drain),
slurmdbd restart, inference rollout, node label/taint change. The first three list
each object under the headline, with what it does to running jobs and data.

Secrets never reach the report: renders are already redacted; from a preview,
Secret data/stringData and every secret envelope are replaced on load by opaque
tokens (so a changed secret still shows as changed), and as a last guard every
such value is scrubbed from the final text. The pull-request workflow prefixes
the comment with :data:`MARKER` to find and edit it on later pushes.

Between two renders, whether an update is a replace follows pulumi-kubernetes'
rules (its force-new fields, with ConfigMaps and Secrets immutable by default).
Auto-named objects keep their name across renders (the render derives the
suffix from the Pulumi name), where the real engine would give a replacement a
new suffix.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import difflib
import json
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Optional

import hostlist
import yaml

from dualsched.components.controller import CONFIG_HASH_ANNOTATION
from dualsched.components.node_keeper import KEEPER, STATE_FILE
from dualsched.components.namespace import ROLLOUT
from dualsched.components.nodepools import MODE_LABEL
from dualsched.components.programs.node_keeper import MINUTES_PER_DAY, describe
from dualsched.components.render import (
    BAD_INPUT,
    OPTIONS_FILE,
    SECRET_SIGNATURE,
    SOURCE_HELP,
    InputError,
    add_source_arguments,
    is_slurm_config,
    load_source,
    render_source,
    slurm_files,
    stack_path,
    write_render,
)
from dualsched.components.slurm_files import SLURM_FILES
from dualsched.config import Problem
from dualsched.config.models import GPU_RESOURCE

MARKER = "<!-- dualsched-report -->"
REDACTED = "[redacted]"
NAME_LABEL = "app.kubernetes.io/name"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
OPS = ("create", "update", "replace", "delete")
INFERENCE_SERVERS = ("vllm", "triton")
MISSING = object()
# Shorter remembered values are not scrubbed from the text (they would mangle ordinary words);
# they are still never shown, since every secret position is replaced by a token on load.
MIN_SCRUB = 6


# ------------------------------------------------------------------------------ model


class Impact(Enum):
    """Impact classes, most severe first."""

    CLUSTER_RENAME = "ClusterName change — refused by `pulumi up`"
    DATA_RISK = "Storage replace or delete — DATA RISK"
    WORKLOAD_REPLACE = "Workload replaced — all its pods deleted at once"
    PARTITION_REMOVED = "Partition removed — its queued and running jobs fail"
    SLURMD_ROLL = "slurmd pool roll"
    SLURMCTLD_RESTART = "slurmctld restart"
    SLURMDBD_RESTART = "slurmdbd restart"
    INFERENCE_ROLLOUT = "Inference rollout"
    NODE_CHANGE = "Node label/taint change"
    CONFIG_RELOAD = "Config reload (`scontrol reconfigure`)"
    OTHER = "No pod restart"

    @property
    def icon(self) -> str:
        if self in HEADLINED:
            return "🛑"
        return {Impact.SLURMD_ROLL: "🔥", Impact.OTHER: "·"}.get(self, "⚠️")


HEADLINED = (Impact.CLUSTER_RENAME, Impact.DATA_RISK, Impact.WORKLOAD_REPLACE, Impact.PARTITION_REMOVED)
"""Impacts whose every finding is listed under the headline: they lose running jobs or data."""


@dataclass(frozen=True)
class Delta:
    """One changed leaf (or list) between two manifests."""

    path: str
    old: Any
    new: Any


@dataclass
class Change:
    """One object that the change creates, updates, replaces or deletes."""

    op: str
    kind: str
    namespace: Optional[str]
    name: str
    old: Optional[dict]
    new: Optional[dict]
    deltas: list[Delta] = field(default_factory=list)
    protected: bool = False
    """Protected now: the engine refuses to delete or replace it."""
    protect_after: Optional[bool] = None
    """Protected after the change, where known."""

    @property
    def manifest(self) -> dict:
        return self.new if self.new is not None else (self.old or {})

    @property
    def title(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"

    @property
    def paths(self) -> list[str]:
        return [delta.path for delta in self.deltas]

    def changed(self, prefix: str) -> bool:
        return any(_under(path, prefix) for path in self.paths)


@dataclass
class Plan:
    """Every change, plus the cluster context needed to judge them."""

    source: str
    changes: list[Change]
    nodes_before: dict[str, dict] = field(default_factory=dict)
    nodes_after: dict[str, dict] = field(default_factory=dict)
    files_before: dict[str, str] = field(default_factory=dict)
    files_after: dict[str, str] = field(default_factory=dict)
    redactor: Redactor = field(default_factory=lambda: Redactor())
    taints_before: dict[str, set[NodeTaint]] = field(default_factory=dict)
    taints_after: dict[str, set[NodeTaint]] = field(default_factory=dict)
    """Node -> the taints the program puts there: a Node patch's own, and the node keeper's."""
    rollout_controller_after: bool = True
    """The head runs the slurmd rollout controller (a program may build ComputePool without it)."""


class NodeTaint(NamedTuple):
    """A taint the program sets on a node; a window taint is on only outside its window."""

    taint: str
    """key=value:Effect"""
    window: str = ""
    """The hours of the window ("09:00–17:00 UTC"), for a time-shared pool's window taint."""

    def __str__(self) -> str:
        return f"`{self.taint}`" + (f" (outside {self.window})" if self.window else "")

    @property
    def evicts(self) -> bool:
        return self.taint.endswith(":NoExecute")


@dataclass
class Finding:
    impact: Impact
    change: Change
    summary: str
    details: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- diffing


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")


def _item_key(item: Any) -> Optional[str]:
    if isinstance(item, Mapping):
        for key in ("name", "mountPath", "key"):
            if isinstance(item.get(key), str):
                return item[key]
    return None


def diff(old: Any, new: Any, path: str = "") -> list[Delta]:
    """Leaf-level differences; list items are matched by name (containers[slurmd]) where they have one."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        deltas = []
        for key in list(old) + [k for k in new if k not in old]:
            sub = f"{path}.{key}" if path else str(key)
            deltas += diff(old.get(key, MISSING), new.get(key, MISSING), sub)
        return deltas
    if isinstance(old, list) and isinstance(new, list) and old != new:
        old_keys, new_keys = [_item_key(i) for i in old], [_item_key(i) for i in new]
        if None not in old_keys + new_keys and len(set(old_keys)) == len(old) and len(set(new_keys)) == len(new):
            by_old, by_new = dict(zip(old_keys, old)), dict(zip(new_keys, new))
            deltas = []
            for key in old_keys + [k for k in new_keys if k not in by_old]:
                deltas += diff(by_old.get(key, MISSING), by_new.get(key, MISSING), f"{path}[{key}]")
            return deltas
        if len(old) == len(new) and all(isinstance(i, (Mapping, list)) for i in old + new):
            return [d for index, (a, b) in enumerate(zip(old, new)) for d in diff(a, b, f"{path}[{index}]")]
    return [] if old == new else [Delta(path, old, new)]


# pulumi-kubernetes force-new fields (provider/pkg/provider/diff.go), the subset our kinds use.
# ConfigMap and Secret data are replaced too: the provider treats them as immutable by default.
_PV_SOURCES = ("csi", "nfs", "hostPath", "local", "iscsi", "cephfs", "rbd", "fc", "glusterfs", "azureFile", "azureDisk")
FORCE_NEW: dict[str, tuple[str, ...]] = {
    "ConfigMap": ("data", "binaryData"),
    "Secret": ("type", "data", "stringData"),
    "PersistentVolume": tuple(f"spec.{source}" for source in _PV_SOURCES),
    "PersistentVolumeClaim": ("spec.accessModes", "spec.selector", "spec.storageClassName", "spec.volumeName"),
    "Deployment": ("spec.selector",),
    "DaemonSet": ("spec.selector",),
    "StatefulSet": (
        "spec.podManagementPolicy",
        "spec.revisionHistoryLimit",
        "spec.selector",
        "spec.serviceName",
        "spec.volumeClaimTemplates",
    ),
    "Job": ("spec.completions", "spec.parallelism", "spec.selector", "spec.template"),
    "Service": ("spec.clusterIP",),
    "ResourceQuota": ("spec.scopes",),
    "StorageClass": ("parameters", "provisioner"),
}


def replace_paths(kind: str, deltas: Iterable[Delta]) -> list[str]:
    prefixes = ("metadata.name", "metadata.namespace") + FORCE_NEW.get(kind, ())
    return [d.path for d in deltas if any(_under(d.path, p) for p in prefixes)]


# ------------------------------------------------------------------------- redaction


class Redactor:
    """Replaces secret values by opaque tokens and remembers them, so none reaches the report.

    The same value always gets the same token (``[secret 1]``), so a changed secret still
    shows up as a changed field; its value never does. :meth:`scrub` is the last guard
    over the final text: every remembered value, and its base64 and decoded forms.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.values: set[str] = set()

    def token(self, value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        self.remember(text)
        return self.tokens.setdefault(text, f"[secret {len(self.tokens) + 1}]")

    def remember(self, value: Any) -> None:
        if isinstance(value, Mapping):
            for item in value.values():
                self.remember(item)
        elif isinstance(value, list):
            for item in value:
                self.remember(item)
        elif isinstance(value, str) and len(value) >= MIN_SCRUB and value != REDACTED and not value.startswith("<redacted"):
            if value in self.values:
                return
            self.values.add(value)
            self.values.add(base64.b64encode(value.encode()).decode())
            try:  # an envelope's "plaintext" is JSON text
                decoded = json.loads(value)
                self.remember(decoded)
            except ValueError:
                pass
            try:
                decoded = base64.b64decode(value, validate=True).decode()
                if len(decoded) >= MIN_SCRUB:
                    self.values.add(decoded)
            except (binascii.Error, UnicodeDecodeError, ValueError):
                pass

    def value(self, value: Any) -> Any:
        """``value`` with every secret envelope replaced by its token."""
        if isinstance(value, Mapping):
            if SECRET_SIGNATURE in value:
                return self.token({k: v for k, v in value.items() if k != SECRET_SIGNATURE})
            return {key: self.value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.value(item) for item in value]
        return value

    def manifest(self, manifest: Optional[Mapping[str, Any]]) -> Optional[dict]:
        """A manifest safe to show: envelopes and Secret values tokenised, last-applied annotation dropped."""
        if manifest is None:
            return None
        clean = self.value(dict(manifest))
        annotations = (clean.get("metadata") or {}).get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            if clean.get("kind") == "Secret":
                self.remember(annotations[LAST_APPLIED])
            clean["metadata"] = {**clean["metadata"], "annotations": {k: v for k, v in annotations.items() if k != LAST_APPLIED}}
        if clean.get("kind") == "Secret":
            for key in ("data", "stringData"):
                if isinstance(clean.get(key), Mapping):
                    clean[key] = {name: self.token(item) if item != REDACTED else item for name, item in clean[key].items()}
        return clean

    def scrub(self, text: str) -> str:
        for secret in sorted(self.values, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text


# ---------------------------------------------------------------------------- loading


def _identity(manifest: Mapping[str, Any]) -> tuple[str, str, str]:
    metadata = manifest.get("metadata") or {}
    return manifest.get("kind", ""), metadata.get("namespace") or "", metadata.get("name", "")


Identity = tuple[str, str, str]
"""An object's kind, namespace and name."""


@dataclass
class RenderDirectory:
    """One render directory as the report reads it."""

    objects: dict[Identity, dict]
    files: dict[str, str]
    """The Slurm files."""
    protected: set[Identity]
    ignored: dict[Identity, tuple[str, ...]]
    """The properties whose changes an object's Pulumi options ignore (ignoreChanges), as dotted paths."""


def read_render(directory: Path) -> RenderDirectory:
    options_file = directory / OPTIONS_FILE
    options = json.loads(options_file.read_text()) if options_file.is_file() else {}
    render = RenderDirectory({}, {}, set(), {})
    for path in sorted(directory.rglob("*.yaml")):
        relative = path.relative_to(directory)
        if "slurm-files" in relative.parts:
            continue
        manifest = yaml.safe_load(path.read_text())
        if isinstance(manifest, dict) and manifest.get("kind"):
            identity, flags = _identity(manifest), options.get(relative.as_posix()) or {}
            render.objects[identity] = manifest
            if flags.get("protect"):
                render.protected.add(identity)
            if flags.get("ignoreChanges"):
                render.ignored[identity] = tuple(flags["ignoreChanges"])
    render.files = {name: (directory / "slurm-files" / name).read_text() for name in SLURM_FILES if (directory / "slurm-files" / name).is_file()}
    if not render.files:
        render.files = slurm_files(render.objects.values())
    return render


def _auto_name_prefix(name: str) -> str:
    """A name less what Pulumi's auto-naming adds to a resource's name: a dash and a random suffix."""
    return name.rsplit("-", 1)[0]


def _renamed(value: Any, names: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {key: _renamed(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_renamed(item, names) for item in value]
    return names.get(value, value) if isinstance(value, str) else value


def _earlier_names(base: RenderDirectory, head: RenderDirectory) -> dict[str, str]:
    """Head's name -> base's, for the objects that ignore changes to their name and are new by name: the base
    object of the same kind and namespace, gone from head, whose name less the auto-name suffix is the same
    (the same resource, which Pulumi had named)."""
    names = {}
    for (kind, namespace, name), paths in head.ignored.items():
        if "metadata.name" not in paths or (kind, namespace, name) in base.objects:
            continue
        earlier = [k for k in base.objects if k[:2] == (kind, namespace) and k not in head.objects
                   and _auto_name_prefix(k[2]) == _auto_name_prefix(name)]  # fmt: skip
        if len(earlier) == 1:
            names[name] = earlier[0][2]
    return names


def _kept(new: dict, old: Mapping[str, Any], path: str) -> None:
    """``new`` with ``old``'s value at a dotted path (absent where old has none)."""
    *parents, leaf = path.split(".")
    source: Any = old
    for key in parents:
        source = source.get(key, {}) if isinstance(source, Mapping) else {}
        new = new.setdefault(key, {})
    if isinstance(source, Mapping) and leaf in source:
        new[leaf] = source[leaf]
    else:
        new.pop(leaf, None)


def as_applied_over(base: RenderDirectory, head: RenderDirectory) -> RenderDirectory:
    """``head`` as the engine applies it over ``base``'s stack: what a resource's ignoreChanges names keeps the
    base's value, its name included (and so does every reference to that name)."""
    names = _earlier_names(base, head)

    def renamed(identity: Identity) -> Identity:
        kind, namespace, name = identity
        return kind, namespace, names.get(name, name)

    objects = {_identity(manifest): manifest for manifest in (_renamed(m, names) for m in head.objects.values())}
    ignored = {renamed(identity): paths for identity, paths in head.ignored.items()}
    for identity, paths in ignored.items():
        if identity in base.objects and identity in objects:
            for path in paths:
                _kept(objects[identity], base.objects[identity], path)
    return RenderDirectory(objects, head.files, set(map(renamed, head.protected)), ignored)


def _nodes(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict]:
    """Node -> the Node as the program labels it: the node keeper's desired labels, or a Node patch
    (rendered by an earlier version, which labelled nodes with one NodePatch each)."""
    objects = [m for m in objects if m]
    nodes = {(m.get("metadata") or {}).get("name", ""): dict(m) for m in objects if m.get("kind") == "Node"}
    for keeper in filter(is_node_keeper, objects):
        for pool in json.loads(keeper["data"][STATE_FILE])["pools"]:
            for name in pool["nodes"]:
                # an earlier version's keeper kept taints only
                nodes.setdefault(name, {"kind": "Node", "metadata": {"name": name, "labels": pool.get("labels", {})}})
    return nodes


def is_node_keeper(manifest: Mapping[str, Any]) -> bool:
    return manifest.get("kind") == "ConfigMap" and _labels(manifest).get(NAME_LABEL) == KEEPER and STATE_FILE in (manifest.get("data") or {})


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _kept_taints(keeper: Mapping[str, Any]) -> dict[str, set[NodeTaint]]:
    """Node -> the taints the node keeper's desired state puts there (none before it is created or after it is
    deleted)."""
    kept: dict[str, set[NodeTaint]] = {}
    if not is_node_keeper(keeper):
        return kept
    for pool in json.loads(keeper["data"][STATE_FILE])["pools"]:
        taints = {NodeTaint(describe(taint)) for taint in pool["taints"]}
        window = pool["window"]
        if window:
            end = (window["startMinute"] + window["durationMinutes"]) % MINUTES_PER_DAY
            taints.add(NodeTaint(describe(window["taint"]), f"{_clock(window['startMinute'])}–{_clock(end)} UTC"))
        kept.update({node: taints for node in pool["nodes"]})
    return kept


def _node_taints(objects: Iterable[Mapping[str, Any]]) -> dict[str, set[NodeTaint]]:
    taints: dict[str, set[NodeTaint]] = defaultdict(set)
    for manifest in objects:
        if manifest and manifest.get("kind") == "Node":
            taints[(manifest.get("metadata") or {}).get("name", "")] |= _taints(manifest)
        elif manifest and is_node_keeper(manifest):
            for node, kept in _kept_taints(manifest).items():
                taints[node] |= kept
    return dict(taints)


def _runs_rollout_controller(objects: Iterable[Mapping[str, Any]]) -> bool:
    return any(m and m.get("kind") == "Deployment" and _labels(m).get(NAME_LABEL) == ROLLOUT for m in objects)


def _change(op: str, old: Optional[dict], new: Optional[dict], name: str = "", protected: bool = False) -> Change:
    """A change between two (already redacted) manifests; an update of a force-new field is a replace."""
    kind, namespace, object_name = _identity(new if new is not None else old)
    deltas = diff(old, new) if old is not None and new is not None else []
    if op == "update" and replace_paths(kind, deltas):
        op = "replace"
    return Change(op, kind, namespace or None, object_name or name, old, new, deltas, protected)


def plan_from_renders(base: Path, head: Path) -> Plan:
    """Compare two offline renders."""
    base_render = read_render(base)
    head_render = as_applied_over(base_render, read_render(head))
    before, protected_before = base_render.objects, base_render.protected
    after, protected_after = head_render.objects, head_render.protected
    plan = Plan(f"offline render `{base}` → `{head}`", [], _nodes(before.values()), _nodes(after.values()), base_render.files, head_render.files)
    plan.taints_before, plan.taints_after = _node_taints(before.values()), _node_taints(after.values())
    plan.rollout_controller_after = _runs_rollout_controller(after.values())
    for key in list(before) + [k for k in after if k not in before]:
        old, new = before.get(key), after.get(key)
        was, now = key in protected_before, key in protected_after
        if old == new and was == now:
            continue
        op = "create" if old is None else "delete" if new is None else "update"
        change = _change(op, plan.redactor.manifest(old), plan.redactor.manifest(new), protected=was if old is not None else now)
        change.protect_after = now if new is not None else None
        plan.changes.append(change)
    return plan


# Preview JSON ------------------------------------------------------------------------------

_STEP_OPS = {
    "create": "create",
    "import": "create",
    "update": "update",
    "replace": "replace",
    "create-replacement": "replace",
    "delete-replaced": "replace",
    "delete": "delete",
}


def _state_manifest(state: Optional[Mapping[str, Any]]) -> Optional[dict]:
    if not state:
        return None
    manifest = state.get("inputs") or state.get("outputs")
    if not isinstance(manifest, Mapping):
        return None
    manifest = {k: v for k, v in manifest.items() if k != "__inputs"}
    if not manifest.get("kind"):
        manifest["kind"] = str(state.get("type", "")).rsplit(":", 1)[-1].removesuffix("Patch")
    return manifest


def _detailed_deltas(step: Mapping[str, Any]) -> list[Delta]:
    """Changed paths from the engine's detailedDiff (or diffReasons), when states are incomplete."""
    paths = list((step.get("detailedDiff") or {}).keys()) or list(step.get("diffReasons") or [])
    return [Delta(re.sub(r'\["([^"]+)"\]', r".\1", str(path)), MISSING, MISSING) for path in paths]


def _step_type(step: Mapping[str, Any]) -> str:
    state = step.get("newState") or step.get("oldState") or {}
    return str(state.get("type") or step.get("urn", "::::").split("::")[-2].split("$")[-1])


def plan_from_preview(document: Mapping[str, Any]) -> Plan:
    """Read ``pulumi preview --json``: its steps, with oldState/newState per resource.

    "same" steps only feed the context (which nodes are in which pool); a replace's
    create-replacement / replace / delete-replaced steps become one change.
    """
    plan = Plan("`pulumi preview --json`", [])
    by_urn: dict[str, Change] = {}
    before_all, after_all = [], []
    for step in document.get("steps") or []:
        if not _step_type(step).startswith("kubernetes:"):
            continue
        step_op, urn = step.get("op", ""), step.get("urn", "")
        old = plan.redactor.manifest(_state_manifest(step.get("oldState")))
        new = plan.redactor.manifest(_state_manifest(step.get("newState")))
        if step_op in ("delete", "delete-replaced"):
            new = None
        before_all += [old] if old is not None else []
        after_all += [new] if new is not None else []
        op = _STEP_OPS.get(step_op)
        if op is None:
            continue
        if urn in by_urn:  # the other steps of a replace
            change = by_urn[urn]
            if change.new is None and new is not None:
                change.new, change.deltas = new, diff(change.old, new) if change.old is not None else []
            continue
        now, after = step.get("oldState") or step.get("newState") or {}, step.get("newState") or {}
        change = _change(op, old, new, urn.split("::")[-1], bool(now.get("protect")))
        change.protect_after = bool(after.get("protect")) if after and step_op not in ("delete", "delete-replaced") else None
        change.op = "replace" if op == "replace" else change.op
        if change.op in ("update", "replace") and not change.deltas:
            change.deltas = _detailed_deltas(step)
        by_urn[urn] = change
        plan.changes.append(change)
    plan.nodes_before, plan.nodes_after = _nodes(before_all), _nodes(after_all)
    plan.taints_before, plan.taints_after = _node_taints(before_all), _node_taints(after_all)
    plan.rollout_controller_after = _runs_rollout_controller(after_all)
    plan.files_before, plan.files_after = slurm_files(before_all), slurm_files(after_all)
    return plan


# ---------------------------------------------------------------------- classification


def _labels(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    return (manifest.get("metadata") or {}).get("labels") or {}


def _role(manifest: Mapping[str, Any]) -> str:
    """What a workload is, from its app.kubernetes.io/name label."""
    template_labels = ((((manifest.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")) or {}
    return template_labels.get(NAME_LABEL) or _labels(manifest).get(NAME_LABEL) or ""


def template_changed(change: Change) -> bool:
    """A replace, or a change at or under spec.template (a coarse engine reason like "spec" counts)."""
    return change.op == "replace" or any(_under(path, "spec.template") or _under("spec.template", path) for path in change.paths)


def pool_nodes(daemonset: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Nodes whose labels (the node keeper's) match the DaemonSet's nodeSelector."""
    selector = (((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    if not selector:
        return []
    return sorted(name for name, node in nodes.items() if all(_labels(node).get(k) == v for k, v in selector.items()))


def _slurmd_gpus(daemonset: Mapping[str, Any]) -> int:
    pod = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    total = 0
    for container in pod.get("containers") or []:
        try:
            total += int(((container.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE, 0))
        except (TypeError, ValueError):
            pass
    return total


def compact(names: Iterable[str]) -> str:
    """Node names as a Slurm hostlist (gpu-a-[001-032])."""
    names = sorted(set(names))
    return hostlist.collect_hostlist(names) if names else "(none)"


# What replacing a state claim does, by the app.kubernetes.io/name label of the claim. A replacement
# is a new, empty claim; the old one is kept (retain_on_delete) but nothing mounts it any more.
STATE_CLAIM_LOSS = {
    "slurmctld": "slurmctld restarts on a new, empty state claim: its saved jobs, reservations and node state are gone",
    "mariadb": "slurmdbd starts on a new, empty database: the accounting history is gone",
}


def _forced_by(change: Change) -> list[str]:
    reasons = replace_paths(change.kind, change.deltas)
    return [f"forces replacement: {', '.join(f'`{p}`' for p in reasons)}"] if reasons else []


def storage_findings(change: Change, plan: Plan) -> list[Finding]:
    if change.kind not in ("PersistentVolume", "PersistentVolumeClaim"):
        return []
    if change.op in ("replace", "delete"):
        details = _forced_by(change) if change.op == "replace" else []
        claim_of = _labels(change.manifest).get(NAME_LABEL, "") if change.kind == "PersistentVolumeClaim" else ""
        loss = STATE_CLAIM_LOSS.get(claim_of)
        details.append(
            "the object is deleted and recreated: pods mounting it keep the old volume until restarted, and the "
            "claim/volume binding must be re-established; verify that reclaimPolicy Retain keeps the data"
            if change.op == "replace"
            else "the object is removed: check that nothing still mounts it and that the data is kept (Retain)"
        )
        if change.protected:
            details.append("the resource is protected: the engine refuses until `protect` is lifted")
        summary = f"**{change.op}** of {change.title}" + (f": {loss}" if loss and change.op == "replace" else "")
        return [Finding(Impact.DATA_RISK, change, summary, details)]
    if change.kind == "PersistentVolumeClaim" and change.changed("spec.resources"):
        note = "in-place expansion: the StorageClass must allow it, and a claim never shrinks"
        return [Finding(Impact.OTHER, change, f"{change.op} of {change.title}: {note}")]
    return []


def _cluster_name(files: Mapping[str, str]) -> Optional[str]:
    found = re.search(r"^ClusterName=(\S+)", files.get("slurm.conf", ""), re.M)
    return found.group(1) if found else None


def _cluster_rename(change: Change, plan: Plan) -> list[Finding]:
    """slurmctld refuses state saved under another ClusterName, so the program refuses the rename."""
    before, after = _cluster_name(plan.files_before), _cluster_name(plan.files_after)
    if not before or not after or before == after:
        return []
    summary = (
        f"ClusterName `{before}` → `{after}` is refused: `pulumi up` stops at the protected ClusterName lock before "
        "anything changes; applied, slurmctld would exit on CLUSTER NAME MISMATCH with its saved state"
    )
    details = [
        "a new ClusterName is a new cluster to slurmdbd (the old name's job history stays under the old name)",
        "to rename on purpose, follow docs/architecture.md, \"Renaming a cluster\"",
    ]
    return [Finding(Impact.CLUSTER_RENAME, change, summary, details)]


def _partition_names(files: Mapping[str, str]) -> list[str]:
    return [name for name in re.findall(r"^PartitionName=(\S+)", files.get("slurm.conf", ""), re.M) if name != "DEFAULT"]


def _removed_partitions(change: Change, plan: Plan) -> list[Finding]:
    """At the reconfigure slurmctld fails every job, queued or running, none of whose partitions slurm.conf still
    has (read_config.c, _sync_jobs_to_conf): a renamed partition is a removed one to it."""
    kept = set(_partition_names(plan.files_after))
    removed = [name for name in _partition_names(plan.files_before) if name not in kept]
    if not removed:
        return []
    summary = (
        f"partition {', '.join(f'`{name}`' for name in removed)} removed from slurm.conf: at the reconfigure slurmctld "
        "fails every job, queued or running, that has no other partition"
    )
    details = [
        "a renamed partition is a removed one: let its jobs finish first (`scontrol update PartitionName=<name> "
        "State=DRAIN` stops new ones), or keep the old partition beside the new one until they have",
    ]
    return [Finding(Impact.PARTITION_REMOVED, change, summary, details)]


def slurm_config_findings(change: Change, plan: Plan) -> list[Finding]:
    if change.kind == "ConfigMap" and _labels(change.manifest).get(NAME_LABEL) == "slurm-client":
        return [Finding(Impact.OTHER, change, f"{change.op} of {change.title}: sbatch client config, used by Jobs started after the apply")]
    if not is_slurm_config(change.manifest) or change.op not in ("update", "replace"):
        return []
    renamed = _cluster_rename(change, plan)
    files = sorted({d.path.split(".", 1)[1].split("[")[0] for d in change.deltas if d.path.startswith("data.")})
    details = [f"changed: {', '.join(f'`{f}`' for f in files) or 'data'} (diff below)"]
    details.append(
        "applied without a restart: the kubelet refreshes slurmctld's mounted copy and its reconfigure sidecar "
        "runs `scontrol reconfigure`; configless slurmd get the new files from slurmctld"
    )
    if change.op == "replace":
        details.append("pulumi-kubernetes replaces a ConfigMap whose data changes; slurmctld mounts it by its fixed name")
    removed = _removed_partitions(change, plan)
    return [*renamed, *removed, Finding(Impact.CONFIG_RELOAD, change, f"Slurm configuration changed ({change.title})", details)]


def _slurmd_finding(change: Change, plan: Plan) -> Finding:
    nodes_map = plan.nodes_before if change.op == "delete" else plan.nodes_after
    nodes = pool_nodes(change.manifest, nodes_map)
    pool = ", ".join(f"{k}={v}" for k, v in (((change.manifest.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector", {}).items())
    gpus = _slurmd_gpus(change.manifest)
    count = f"{len(nodes)} GPU node{'s' if len(nodes) != 1 else ''}" + (f" ({len(nodes) * gpus} Slurm GPUs)" if gpus else "")
    strategy = ((change.manifest.get("spec") or {}).get("updateStrategy") or {}).get("type", "RollingUpdate")
    if change.op == "delete":
        summary = f"slurmd pool removed: {count}, pool `{pool}`"
        details = ["slurmd pods are deleted on every node of the pool: drain the nodes in Slurm first, or running jobs die"]
    elif strategy == "OnDelete" and not plan.rollout_controller_after:
        summary = f"slurmd pool roll: {count} to drain **by hand**, pool `{pool}` (no slurmd rollout controller)"
        details = [
            "the DaemonSet uses `updateStrategy: OnDelete` and this program builds no `SlurmdRolloutController` "
            "(DualScheduledCluster does): no pod changes until someone drains each node in Slurm, deletes its slurmd "
            "pod once its jobs have ended and resumes it (docs/upgrades.md)"
        ]
    elif strategy == "OnDelete":
        summary = f"slurmd pool roll: {count} to drain, pool `{pool}`"
        details = [
            "the DaemonSet uses `updateStrategy: OnDelete`; the slurmd rollout controller drains each node in Slurm "
            "(`slurm.slurmdRollout.maxUnavailable` at a time), replaces its slurmd pod once its jobs have ended, then "
            "resumes it (docs/upgrades.md)"
        ]
    else:
        summary = f"slurmd pool roll: {count}, pool `{pool}` (automatic, {strategy})"
        details = ["pods restart without a drain: jobs running on a node die when its slurmd restarts"]
    details.append(f"nodes: `{compact(nodes)}`")
    return Finding(Impact.SLURMD_ROLL, change, summary, details, nodes)


def _inference_finding(change: Change) -> Finding:
    spec = change.manifest.get("spec") or {}
    strategy = spec.get("strategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    kind = strategy.get("type", "RollingUpdate")
    how = (
        f"{kind}, maxSurge {rolling.get('maxSurge', '25%')}, maxUnavailable {rolling.get('maxUnavailable', '25%')}"
        if kind == "RollingUpdate"
        else kind
    )
    details = [f"strategy: {how}; replicas: {spec.get('replicas', 1)}"]
    if str(rolling.get("maxSurge", "0")) not in ("0", "0%"):
        details.append("a surge pod needs free GPUs on an inference-eligible node while the old pods still run")
    before, after = _served_model(change.old), _served_model(change.new)
    summary = f"rollout of {change.title}"
    if before and after and before != after:
        summary += f": serves `{after}` instead of `{before}` (a checkpoint promoted, or rolled back)"
    return Finding(Impact.INFERENCE_ROLLOUT, change, summary, details)


def _served_model(manifest: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The model directory a server's command names (vllm serve <dir>, tritonserver --model-repository=<dir>)."""
    containers = (((manifest or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    command = next((c.get("command") or [] for c in containers if c.get("name") == "server"), [])
    if command[:2] == ["vllm", "serve"] and len(command) > 2:
        return command[2]
    return next((arg.split("=", 1)[1] for arg in command if arg.startswith("--model-repository=")), None)


def _replace_finding(change: Change, plan: Plan) -> Finding:
    """An immutable field changed: the engine deletes the workload and creates it again. No rolling
    update and no OnDelete protect the pods: all of them are deleted with the old object."""
    role, nodes = _role(change.manifest), []
    if role == "slurmd":
        nodes = pool_nodes(change.manifest, plan.nodes_after)
        what = f"every slurmd pod on `{compact(nodes)}` is deleted: the jobs running there die (drain the nodes first)"
    elif role == "slurmctld":
        what = "slurmctld is down until the new pods run; running jobs continue (state is on its claim)"
    elif role in ("slurmdbd", "mariadb"):
        what = "accounting is down until the new pod runs; slurmctld queues records meanwhile"
    elif role in INFERENCE_SERVERS:
        what = "every replica is deleted at once: the endpoint stops serving until new pods are Ready"
    else:
        what = "its pods are deleted and created again"
    if change.changed("spec.volumeClaimTemplates"):
        what += "; new pods get new claims, and the data on the old ones is no longer mounted"
    return Finding(Impact.WORKLOAD_REPLACE, change, f"**replace** of {change.title}: {what}", _forced_by(change), nodes)


def workload_findings(change: Change, plan: Plan) -> list[Finding]:
    if change.kind not in ("Deployment", "StatefulSet", "DaemonSet"):
        return []
    if change.op == "replace":
        return [_replace_finding(change, plan)]
    role = _role(change.manifest)
    if change.op == "create":
        if role == "slurmd":
            nodes = pool_nodes(change.manifest, plan.nodes_after)
            return [Finding(Impact.OTHER, change, f"new slurmd pool: slurmd starts on `{compact(nodes)}`", [], nodes)]
        return [Finding(Impact.OTHER, change, f"new workload {change.title}")]
    if change.op != "delete" and not template_changed(change):
        return []
    if role == "slurmd" and change.kind == "DaemonSet":
        return [_slurmd_finding(change, plan)]
    if role == "slurmctld":
        details = []
        if change.changed(f"spec.template.metadata.annotations.{CONFIG_HASH_ANNOTATION}"):
            details.append(f"slurm.conf settings that only a restart applies changed (pod annotation `{CONFIG_HASH_ANNOTATION}`)")
        details.append("running jobs continue (state is saved in StateSaveLocation); scheduling pauses while it restarts")
        return [Finding(Impact.SLURMCTLD_RESTART, change, f"{change.op} of {change.title}", details)]
    if role in ("slurmdbd", "mariadb"):
        what = "accounting database" if role == "mariadb" else "slurmdbd"
        details = [f"{what} restarts: slurmctld queues accounting records meanwhile; sacct/sacctmgr are unavailable"]
        return [Finding(Impact.SLURMDBD_RESTART, change, f"{change.op} of {change.title}", details)]
    if change.kind == "Deployment" and role in INFERENCE_SERVERS:
        if change.op == "delete":
            return [Finding(Impact.INFERENCE_ROLLOUT, change, f"model server removed: {change.title}", ["its endpoint stops serving"])]
        return [_inference_finding(change)]
    if change.op == "delete":
        return [Finding(Impact.OTHER, change, f"delete of {change.title}: its pods are deleted")]
    return [Finding(Impact.OTHER, change, f"{change.op} of {change.title}: its pods restart")]


def _taints(node: Mapping[str, Any]) -> set[NodeTaint]:
    return {NodeTaint(describe(taint)) for taint in (node.get("spec") or {}).get("taints") or []}


def _taint_changes(node: str, plan: Plan) -> tuple[list[str], set[NodeTaint], set[NodeTaint]]:
    """What the change does to a node's taints: lines, and the taints added and removed."""
    before, after = plan.taints_before.get(node, set()), plan.taints_after.get(node, set())
    added, removed = after - before, before - after
    return [f"taint {t} added" for t in sorted(added)] + [f"taint {t} removed" for t in sorted(removed)], added, removed


def node_findings(change: Change, plan: Plan) -> list[Finding]:
    if change.kind == "Node":
        return _node_patch_findings(change, plan)
    if is_node_keeper(change.manifest):
        return _node_keeper_findings(change, plan)
    return []


def _node_patch_findings(change: Change, plan: Plan) -> list[Finding]:
    """A Node patch: rendered by an earlier version, which labelled each node with one. Once it is
    removed, a node the keeper keeps is compared with the keeper's labels and taints."""
    old_labels = _labels(change.old or {})
    if change.op == "delete" and change.name not in plan.nodes_after:
        summary = "node patch removed (its labels stay: retain_on_delete)"
        return [Finding(Impact.NODE_CHANGE, change, summary, [], [change.name])]
    new_labels = _labels(plan.nodes_after.get(change.name, {}))
    lines, added, removed = _taint_changes(change.name, plan)
    parts = _label_changes(old_labels, new_labels) + lines
    if not parts:
        return []
    return [Finding(Impact.NODE_CHANGE, change, "; ".join(parts) + _node_consequences(old_labels, new_labels, added, removed), [], [change.name])]


def _label_changes(old_labels: Mapping[str, Any], new_labels: Mapping[str, Any]) -> list[str]:
    return [
        f"label `{key}`: `{old_labels.get(key, '-')}` → `{new_labels.get(key, '-')}`"
        for key in sorted(set(old_labels) | set(new_labels))
        if old_labels.get(key) != new_labels.get(key)
    ]


def _node_keeper_findings(change: Change, plan: Plan) -> list[Finding]:
    """The keeper's labels and taints, per node it keeps after the change; a node whose patch (of an
    earlier version) changes too is reported with that patch, and the nodes that left every pool, which the
    keeper releases."""
    if change.op == "delete":
        nodes = sorted(_kept_taints(change.old or {}))
        summary = "node keeper removed: the nodes keep their labels and taints as they are, and window taints no longer switch"
        return [Finding(Impact.NODE_CHANGE, change, summary, [], nodes)]
    patched = {c.name for c in plan.changes if c.kind == "Node"}
    kept_before, kept_after = set(_kept_taints(change.old or {})), set(_kept_taints(change.new or {}))
    findings = []
    left = sorted(kept_before - kept_after - patched)
    if left:
        summary = ("the nodes leave every pool: the node keeper releases them (removes the labels and taints it set there), "
                   "so their slurmd pods are removed and the jobs running there die with them: drain them in Slurm first; "
                   "Kubernetes pods may then schedule onto them")
        findings.append(Finding(Impact.NODE_CHANGE, change, summary, [], left))
    for node in sorted(kept_after - patched):
        old_labels, new_labels = _labels(plan.nodes_before.get(node, {})), _labels(plan.nodes_after.get(node, {}))
        taint_lines, added, removed = _taint_changes(node, plan)
        lines = _label_changes(old_labels, new_labels) + taint_lines
        if lines:
            consequences = _node_consequences(old_labels, new_labels, added, removed)
            findings.append(Finding(Impact.NODE_CHANGE, change, "; ".join(lines) + consequences, [], [node]))
    return findings


# What switching a pool to each mode does to the jobs and pods running on its nodes.
MODE_SWITCH_EFFECTS = {
    "dedicated": "slurmd's new pod asks for every GPU and stays Pending until the inference pods on the node are gone "
    "(the Slurm taint keeps new ones off but evicts none); drain each node in Slurm, delete its slurmd pod, then its "
    "inference pods",
    "partitioned": "Slurm's GPUs per node become slurmGpus when each slurmd pod is replaced (OnDelete: drain the node "
    "first); until then the new gres.conf and the old pod disagree and slurmd may refuse to start; jobs asking for "
    "more GPUs per node than the new share never start",
    "time-shared": "a daily reservation keeps Slurm jobs out of the window (a job whose time limit reaches into it "
    "waits); inference pods are evicted whenever the window is closed; slurmd gives its GPUs back to the device plugin "
    "only when its pod is replaced (OnDelete: drain the node first, as the new gres.conf lists every GPU)",
    "kubernetes": "slurmd leaves the nodes and the jobs running there die with it: drain them in Slurm first",
}


def _node_consequences(old_labels: Mapping, new_labels: Mapping, added: set[NodeTaint], removed: set[NodeTaint]) -> str:
    """What the scheduler does about a node's new labels or taints."""
    notes = []
    for key in sorted(k for k in set(old_labels) | set(new_labels) if k.endswith("/pool")):
        before, after = old_labels.get(key), new_labels.get(key)
        if before == after:
            continue
        if before is None:
            notes.append(f"the nodes join pool `{after}`: its slurmd (and inference, if eligible) start there")
        else:
            notes.append(f"the nodes leave pool `{before}`: its slurmd pods are removed from them, drain them in Slurm first")
    switched = old_labels.get(MODE_LABEL), new_labels.get(MODE_LABEL)
    if None not in switched and switched[0] != switched[1]:
        notes.append(f"mode `{switched[0]}` → `{switched[1]}`: {MODE_SWITCH_EFFECTS[switched[1]]}")
    if any(t.evicts and not t.window for t in added):
        notes.append("running pods that do not tolerate a NoExecute taint are evicted")
    if any(t.evicts and t.window for t in added):
        notes.append("pods that do not tolerate the window taint are evicted each day when the window closes")
    if added:
        notes.append(_gpu_stack_tolerations(added))
    if removed:
        notes.append("Kubernetes pods may now schedule onto these nodes")
    return " — " + "; ".join(notes) if notes else ""


def _gpu_stack_tolerations(added: set[NodeTaint]) -> str:
    # Kubernetes gives DaemonSet pods tolerations only for its own node.kubernetes.io taints.
    needed = ", ".join(f"`{t.taint}`" for t in sorted(added))
    return (f"the GPU stack's DaemonSets on these nodes (device plugin, DCGM exporter, CNI) must tolerate {needed} "
            "or they stay off the nodes after their next restart (docs/gpu-sharing.md)")


def protection_findings(change: Change, plan: Plan) -> list[Finding]:
    """`protect` set or lifted: no object changes, but what `pulumi destroy` or a replace may delete does."""
    if change.op == "create" or change.protect_after is None or change.protect_after == change.protected:
        return []
    if change.protect_after:
        return [Finding(Impact.OTHER, change, f"`protect` set on {change.title}: the engine refuses to delete or replace it")]
    return [Finding(Impact.DATA_RISK, change, f"`protect` lifted from {change.title}",
                    ["from the next `pulumi up` on, a replace or `pulumi destroy` deletes it without asking"])]


CLASSIFIERS = (storage_findings, slurm_config_findings, workload_findings, node_findings, protection_findings)


def classify(change: Change, plan: Plan) -> list[Finding]:
    """Every impact of one change; a change no classifier claims restarts nothing."""
    findings = [finding for classifier in CLASSIFIERS for finding in classifier(change, plan)]
    return findings or [Finding(Impact.OTHER, change, f"{change.op} of {change.title}")]


# --------------------------------------------------------------------------- rendering


LONG_VALUE = 100
"""Longer values (a command line, a script) show only where they differ."""
CONTEXT = 30
"""Characters kept on each side of a long value's change."""


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


def _code(text: str) -> str:
    """Inline code of one line: newlines shown as ⏎, a backtick inside fenced by two."""
    text = text.replace("\n", "⏎")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _value(value: Any) -> str:
    if value is MISSING:
        return "∅"
    text = _text(value)
    if "\n" in text or len(text) > LONG_VALUE:
        return f"({len(text)} characters)"
    return _code(text)


def _changed_parts(old: str, new: str) -> tuple[str, str]:
    """The part of each text that differs, with CONTEXT characters around it and … where cut."""
    prefix = len(os.path.commonprefix([old, new]))
    suffix = len(os.path.commonprefix([old[prefix:][::-1], new[prefix:][::-1]]))
    start = max(prefix - CONTEXT, 0)

    def part(text: str) -> str:
        end = min(len(text) - suffix + CONTEXT, len(text))
        return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")

    return part(old), part(new)


def _delta_values(old: Any, new: Any) -> str:
    """old → new; two long values as the part where they differ, and their lengths."""
    if old is MISSING or new is MISSING:
        return f"{_value(old)} → {_value(new)}"
    before, after = _text(old), _text(new)
    if max(len(before), len(after)) <= LONG_VALUE and "\n" not in before + after:
        return f"{_code(before)} → {_code(after)}"
    shown_before, shown_after = _changed_parts(before, after)
    return f"{_code(shown_before)} → {_code(shown_after)} ({len(before)} → {len(after)} characters)"


_SECRETISH = re.compile(r"(pass(word|wd)?|secret|token|credential|(^|[_.-])key)(\]|$)", re.I)


def delta_lines(change: Change, limit: int = 8) -> list[str]:
    """Changed fields with old → new values (never for Secrets or secret-sounding names)."""
    if change.op not in ("update", "replace") or not change.deltas or change.kind == "Node":
        return []
    lines = []
    for delta in change.deltas[:limit]:
        if delta.old is MISSING and delta.new is MISSING:
            lines.append(f"`{delta.path}`")
        elif change.kind == "Secret" or _SECRETISH.search(delta.path):
            lines.append(f"`{delta.path}`: value changed (not shown)")
        else:
            lines.append(f"`{delta.path}`: {_delta_values(delta.old, delta.new)}")
    if len(change.deltas) > limit:
        lines.append(f"… and {len(change.deltas) - limit} more")
    return lines


def summary_table(changes: list[Change]) -> list[str]:
    counts: dict[str, Counter] = defaultdict(Counter)
    for change in changes:
        counts[change.kind][change.op] += 1
    lines = ["| Kind | create | update | replace | delete |", "|---|---:|---:|---:|---:|"]
    for kind in sorted(counts):
        lines.append(f"| {kind} | " + " | ".join(str(counts[kind][op] or "") for op in OPS) + " |")
    totals = Counter(change.op for change in changes)
    lines.append("| **total** | " + " | ".join(f"**{totals[op]}**" for op in OPS) + " |")
    return lines


def _headline(findings: list[Finding]) -> list[str]:
    """One line of impacts, then every finding that loses running jobs or data, each on its own line."""
    present = sorted({f.impact for f in findings if f.impact is not Impact.OTHER}, key=list(Impact).index)
    if not present:
        return ["**Impact:** no pod restarts, no storage or node changes."]
    if present == [Impact.CONFIG_RELOAD]:
        return ["**Impact:** config reload only — `scontrol reconfigure`, nothing restarts."]
    parts = []
    for impact in present:
        group = [f for f in findings if f.impact is impact]
        if impact is Impact.SLURMD_ROLL:
            nodes = {n for f in group for n in f.nodes}
            parts.append(f"{impact.icon} **{impact.value}** ({len(nodes)} GPU nodes)")
        elif impact is Impact.NODE_CHANGE:
            parts.append(f"{impact.icon} **{impact.value}** ({len({n for f in group for n in f.nodes})} nodes)")
        else:
            parts.append(f"{impact.icon} **{impact.value}**")
    listed = [f"- {f.impact.icon} {f.summary}" for impact in HEADLINED for f in findings if f.impact is impact]
    return ["**Impact:** " + " · ".join(parts), *listed]


def _impact_section(impact: Impact, findings: list[Finding]) -> list[str]:
    lines = [f"### {impact.icon} {impact.value}", ""]
    if impact is Impact.NODE_CHANGE:
        grouped: dict[str, list[str]] = defaultdict(list)
        for finding in findings:
            grouped[finding.summary].extend(finding.nodes)
        for summary, nodes in grouped.items():
            lines.append(f"- `{compact(nodes)}` ({len(set(nodes))} node{'s' if len(set(nodes)) != 1 else ''}): {summary}")
        return lines + [""]
    for finding in findings:
        lines.append(f"- {finding.summary}")
        lines += [f"  - {detail}" for detail in finding.details]
        if impact not in (Impact.OTHER, Impact.CONFIG_RELOAD):  # config changes: see the file diffs
            lines += [f"  - {line}" for line in delta_lines(finding.change)]
    return lines + [""]


def file_diffs(plan: Plan) -> list[str]:
    lines = []
    for name in SLURM_FILES:
        old, new = plan.files_before.get(name), plan.files_after.get(name)
        if old == new or (old is None and new is None):
            continue
        body = difflib.unified_diff(
            (old or "").splitlines(), (new or "").splitlines(), f"base/{name}", f"head/{name}", lineterm="", n=2
        )
        lines += [f"<details open><summary><code>{name}</code></summary>", "", "```diff", *body, "```", "", "</details>", ""]
    return ["### Slurm files", "", *lines] if lines else []


def render_markdown(plan: Plan, title: str = "dualsched change report") -> str:
    findings = [finding for change in plan.changes for finding in classify(change, plan)]
    lines = [f"## {title}", "", f"Source: {plan.source}", ""]
    if not plan.changes:
        lines.append("No changes.")
        return plan.redactor.scrub("\n".join(lines) + "\n")
    lines += [*_headline(findings), "", *summary_table(plan.changes), ""]
    for impact in Impact:
        group = [f for f in findings if f.impact is impact]
        if group and impact is not Impact.OTHER:
            lines += _impact_section(impact, group)
    lines += file_diffs(plan)
    other = [f for f in findings if f.impact is Impact.OTHER]
    if other:
        lines += ["<details><summary>Changes that restart nothing</summary>", "", *_impact_section(Impact.OTHER, other)[2:], "</details>", ""]
    return plan.redactor.scrub("\n".join(lines).rstrip() + "\n")


# --------------------------------------------------------------------------------- CLI


SIDES_HELP = """\
Compare --base with --head, each a render directory or a stack file; --stack / --stack-file give the
head as a stack file. A stack file is rendered first, with this checkout's program, as
components.render would: right for a change of config; for a change of the program, render each
checkout with its own code and compare the directories. Or read --preview.

"""


def _preview(path: Path) -> Mapping[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InputError(Problem("--preview", f"cannot read it as JSON: {error}", str(path))) from None
    if not isinstance(document, dict):
        raise InputError(Problem("--preview", "is not the output of `pulumi preview --json` (a JSON object)", str(path)))
    return document


def _render_directory(option: str, path: Path, args: argparse.Namespace, scratch: Path) -> Path:
    """A side of the comparison as a render directory: as given, or a stack file rendered into ``scratch``."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise InputError(Problem(option, "is neither a render directory nor a stack file", str(path)))
    out = scratch / option.strip("-")
    write_render(render_source(load_source(path, args.config_key, args.program)), out)
    return out


def _plan_from_sides(args: argparse.Namespace, head: Path) -> Plan:
    with tempfile.TemporaryDirectory(prefix="dualsched-report-") as scratch:
        base_dir = _render_directory("--base", args.base, args, Path(scratch))
        head_dir = _render_directory("--head", head, args, Path(scratch))
        try:
            plan = plan_from_renders(base_dir, head_dir)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise InputError(Problem("--base/--head", f"cannot read a render: {error}", f"{args.base} → {head}")) from None
    plan.source = f"offline render `{args.base}` → `{head}`"
    return plan


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dualsched-report", description=__doc__.split("\n\n")[0], epilog=SIDES_HELP + SOURCE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", type=Path, help="the base: a render directory, or a stack file to render")
    parser.add_argument("--head", type=Path, help="the head: a render directory, or a stack file to render")
    add_source_arguments(parser, required=False)
    parser.add_argument("--preview", type=Path, help="output of `pulumi preview --json`")
    parser.add_argument("--title", default="dualsched change report", help="heading of the report")
    parser.add_argument("--out", type=Path, help="write the Markdown here instead of stdout")
    args = parser.parse_args(argv)

    head_stack = args.stack is not None or args.stack_file is not None
    if args.preview and (args.base or args.head or head_stack):
        parser.error("use either --preview or --base with --head (or --stack / --stack-file)")
    if args.head and head_stack:
        parser.error("give the head once: --head, --stack or --stack-file")
    try:
        if args.preview:
            plan = plan_from_preview(_preview(args.preview))
        elif args.base and (args.head or head_stack):
            plan = _plan_from_sides(args, args.head or stack_path(args.stack, args.stack_file))
        else:
            parser.error("give --base and --head (or --stack / --stack-file), or --preview")
    except BAD_INPUT as error:
        print(error, file=sys.stderr)
        return 2
    text = render_markdown(plan, args.title)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
