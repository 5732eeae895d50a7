"""Offline render: what `pulumi up` would create, as YAML files, without a cluster.

    python -m components.render --stack dev --out build/dev
    python -m components.render --config path/to/Pulumi.x.yaml --out build/x

Runs the real program (components.program.build) under Pulumi mocks, writes
every Kubernetes object as YAML (one file per object, grouped by namespace),
the rendered Slurm files, and prints a summary. Secret values are redacted.
A manifest (.dualsched-render.json) lists what the render wrote: the next render
into that directory removes only those files, and a render refuses a non-empty
directory without one, so it never deletes what it did not write.
Exit 0 on success, 2 with the problems on invalid config or a refused directory.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import secrets
import string
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc

from components.slurm_files import config_hash, kubernetes_site, render_slurm_files
from config import ConfigError, Problem, StackConfig, load_stack_file

REDACTED = "<redacted>"
CLUSTER_SCOPED = "_cluster"
MANIFEST = ".dualsched-render.json"
"""What a render wrote, by path relative to its directory; JSON, so no reader of the render's *.yaml sees it."""
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RenderedObject:
    """One registered Kubernetes object: its Pulumi identity and the manifest it would apply."""

    pulumi_type: str
    pulumi_name: str
    manifest: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.manifest.get("kind", self.pulumi_type.rsplit(":", 1)[-1])

    @property
    def namespace(self) -> Optional[str]:
        return self.manifest.get("metadata", {}).get("namespace")

    @property
    def name(self) -> str:
        return self.manifest.get("metadata", {}).get("name", self.pulumi_name)


@dataclass(frozen=True)
class Registration:
    """One RegisterResource call as the engine would receive it: what no manifest shows."""

    type: str
    name: str
    urn: str
    parent: str
    custom: bool
    protect: bool
    retain_on_delete: bool
    ignore_changes: tuple[str, ...]
    dependencies: tuple[str, ...]
    provider: str
    inputs: dict[str, Any] = field(default_factory=dict, compare=False)
    """As the program passed them (a lock's keepers, say); for Kubernetes objects see ``Render.objects``."""

    @property
    def parent_type(self) -> str:
        """The type token of the parent (last segment of its URN's type chain)."""
        if not self.parent:
            return ""
        return self.parent.split("::")[2].split("$")[-1]


@dataclass
class Render:
    """Everything the program registered, plus the values of generated secrets."""

    objects: list[RenderedObject] = field(default_factory=list)
    registrations: list[Registration] = field(default_factory=list)
    component_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    generated_secrets: list[str] = field(default_factory=list)
    slurm_files: dict[str, str] = field(default_factory=dict)

    @property
    def slurm_conf_hash(self) -> str:
        return config_hash(self.slurm_files)

    def registration(self, obj: RenderedObject) -> Registration:
        """The registration that produced a rendered object (matched by type and Pulumi name)."""
        matches = [r for r in self.registrations if r.custom and r.type == obj.pulumi_type and r.name == obj.pulumi_name]
        if len(matches) != 1:
            raise LookupError(f"{len(matches)} registrations for {obj.pulumi_type} {obj.pulumi_name}")
        return matches[0]

    def by_kind(self, kind: str) -> list[RenderedObject]:
        return [obj for obj in self.objects if obj.kind == kind]

    def one(self, kind: str, name_part: str = "") -> RenderedObject:
        matches = [obj for obj in self.by_kind(kind) if name_part in obj.name]
        if len(matches) != 1:
            raise LookupError(f"{len(matches)} {kind} objects match {name_part!r}: {[m.name for m in matches]}")
        return matches[0]

    def summary(self) -> Counter:
        return Counter(obj.kind for obj in self.objects)


# Kinds whose objects live in no namespace; the provider does not default them to "default".
_CLUSTER_KINDS = {"Namespace", "PersistentVolume", "Node", "ClusterRole", "ClusterRoleBinding", "StorageClass"}


SECRET_SIGNATURE = "4dabf18193072939515e22adb298388d"


def plain(value: Any) -> Any:
    """Unwrap the engine's secret envelopes and give whole numbers back their int type."""
    if isinstance(value, dict):
        if SECRET_SIGNATURE in value:
            return plain(value.get("value"))
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _auto_name(name: str, urn: str) -> str:
    # The provider appends a random suffix; a digest of the URN keeps renders comparable.
    return f"{name}-{hashlib.sha256(urn.encode()).hexdigest()[:8]}"


class RenderMocks(pulumi.runtime.Mocks):
    """Mocks that behave like the providers where the program can observe them."""

    def __init__(self, render: Render):
        self.render = render

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = plain(dict(args.inputs))
        if args.typ == "random:index/randomBytes:RandomBytes":
            raw = secrets.token_bytes(int(state["length"]))
            state.update(base64=base64.b64encode(raw).decode(), hex=raw.hex())
            self.render.generated_secrets += [state["base64"], state["hex"]]
        elif args.typ == "random:index/randomPassword:RandomPassword":
            alphabet = string.ascii_letters + string.digits
            state["result"] = "".join(secrets.choice(alphabet) for _ in range(int(state["length"])))
            self.render.generated_secrets.append(state["result"])
        elif args.typ.startswith("kubernetes:"):
            self._kubernetes(args, state)
        return f"{args.name}-id", state

    def _kubernetes(self, args: pulumi.runtime.MockResourceArgs, state: dict[str, Any]) -> None:
        metadata = dict(state.get("metadata") or {})
        metadata.setdefault("name", _auto_name(args.name, f"{args.typ}::{args.name}"))
        kind = state.get("kind", "")
        if kind not in _CLUSTER_KINDS and not args.typ.endswith("Patch"):
            metadata.setdefault("namespace", "default")
        state["metadata"] = metadata
        manifest = {key: value for key, value in state.items() if key not in ("apiVersion", "kind", "metadata")}
        ordered = {"apiVersion": state.get("apiVersion"), "kind": kind or args.typ.rsplit(":", 1)[-1].removesuffix("Patch"), "metadata": metadata}
        self.render.objects.append(RenderedObject(args.typ, args.name, {**ordered, **manifest}))

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class RenderMonitor(pulumi_mocks.MockMonitor):
    """The stock mock monitor, also recording each registration's options and component outputs,
    which the engine (and a CrossGuard pack) sees but no manifest carries."""

    def __init__(self, mocks: pulumi.runtime.Mocks, render: Render):
        super().__init__(mocks)
        self.render = render

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.render.registrations.append(
                Registration(
                    type=request.type,
                    name=request.name,
                    urn=response.urn,
                    parent=request.parent,
                    custom=bool(request.custom),
                    protect=request.HasField("protect") and bool(request.protect),
                    retain_on_delete=request.HasField("retainOnDelete") and bool(request.retainOnDelete),
                    ignore_changes=tuple(request.ignoreChanges),
                    dependencies=tuple(request.dependencies),
                    provider=request.provider,
                    inputs=plain(rpc.deserialize_properties(request.object)),
                )
            )
        return response

    def RegisterResourceOutputs(self, request):
        pulumi_mocks._ensure_event_loop()
        self.render.component_outputs[request.urn] = plain(rpc.deserialize_properties(request.outputs))
        return super().RegisterResourceOutputs(request)


def render_config(
    config: StackConfig, stack: str = "render", program: Optional[Callable[[StackConfig], Any]] = None
) -> Render:
    """Run ``program`` (default: the dualsched program) for ``config`` under mocks and collect what it registers."""
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from components.program import build

    render = Render()
    mocks = RenderMocks(render)
    pulumi.runtime.set_mocks(mocks, project="dualsched", stack=stack, preview=False, monitor=RenderMonitor(mocks, render))
    _sync_await(run_pulumi_func(lambda: (program or build)(config)))
    render.slurm_files = render_slurm_files(config, kubernetes_site(config))
    return render


def redacted(manifest: dict[str, Any]) -> dict[str, Any]:
    """A Secret with every value replaced; other objects unchanged."""
    if manifest.get("kind") != "Secret":
        return manifest
    clean = dict(manifest)
    for key in ("data", "stringData"):
        if key in clean and clean[key]:
            clean[key] = {name: REDACTED for name in clean[key]}
    return clean


def _object_path(obj: RenderedObject) -> str:
    return f"{obj.namespace or CLUSTER_SCOPED}/{obj.kind.lower()}-{obj.name}.yaml"


def rendered_files(render: Render) -> dict[str, str]:
    """Every file of the render by its POSIX path relative to the output directory: one YAML file per
    object under <namespace>/ (cluster-scoped ones under _cluster/), the Slurm files under slurm-files/."""
    files = {_object_path(obj): yaml.safe_dump(redacted(obj.manifest), sort_keys=False, width=120) for obj in render.objects}
    files.update({f"slurm-files/{name}": text for name, text in render.slurm_files.items()})
    return files


def _write_files(files: dict[str, str], out: Path) -> list[Path]:
    written = []
    for relative, text in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def write_render(render: Render, out: Path) -> list[Path]:
    """Write the render's files (see rendered_files) under ``out``; nothing else is touched."""
    return _write_files(rendered_files(render), out)


class RenderRefused(Exception):
    """The output directory holds files a render did not write (or an unreadable manifest)."""

    def __init__(self, out: Path, problem: Problem):
        self.problem = problem
        super().__init__(f"refused to render into {out}; nothing was changed:\n  {problem}")


def _is_render_path(out: Path, relative: Any) -> bool:
    """A path as a render writes it: relative, plain, and (past any symlink) inside ``out``."""
    if not isinstance(relative, str):
        return False
    path = PurePosixPath(relative)
    plain_form = str(path) == relative and not path.is_absolute() and ".." not in path.parts and relative != MANIFEST
    return plain_form and (out / relative).parent.resolve().is_relative_to(out.resolve())


def previous_render_files(out: Path) -> set[str]:
    """The files the previous render into ``out`` wrote, from its manifest; empty for an empty or
    new directory. Refuses (RenderRefused) any other directory: its files are someone else's."""
    if not out.exists():
        return set()
    if not out.is_dir():
        raise RenderRefused(out, Problem(str(out), "is not a directory", "a file"))
    if (out / MANIFEST).is_file():
        return _listed_files(out)
    entries = sorted(path.name for path in out.iterdir())
    if entries:
        raise RenderRefused(out, Problem(str(out), f"holds files no render wrote (there is no {MANIFEST}): "
                                         "give an empty or new directory", entries))
    return set()


def _listed_files(out: Path) -> set[str]:
    manifest = out / MANIFEST
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RenderRefused(out, Problem(str(manifest), "is not a render manifest", str(error))) from None
    if not isinstance(files, list):
        raise RenderRefused(out, Problem(str(manifest), "is not a render manifest: 'files' is not a list", files))
    # A manifest is a file anyone can edit: never let it name a file outside the render.
    strays = [relative for relative in files if not _is_render_path(out, relative)]
    if strays:
        raise RenderRefused(out, Problem(str(manifest), "lists a path no render writes", strays[0]))
    return set(files)


def _write_manifest(out: Path, files: set[str]) -> None:
    text = json.dumps({"writtenBy": "python -m components.render", "files": sorted(files)}, indent=1) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    # An interrupted write fails safe: the next render refuses a directory with half a manifest.
    (out / MANIFEST).write_text(text)


def _remove(out: Path, files: set[str]) -> None:
    """Remove these files, and the directories they leave empty (never ``out`` itself)."""
    for relative in sorted(files):
        path = out / relative
        if path.is_file() or path.is_symlink():
            path.unlink()
        for folder in path.parents:
            if folder == out or not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()


def replace_render(render: Render, out: Path, previous: set[str]) -> list[Path]:
    """Write the render into ``out`` in place of the previous one (``previous_render_files(out)``):
    remove the files it wrote that this render does not, write this render's files and a new manifest."""
    files = rendered_files(render)
    foreign = sorted(relative for relative in files if relative not in previous and os.path.lexists(out / relative))
    if foreign:
        raise RenderRefused(out, Problem(str(out), "the render would overwrite files no render wrote", foreign))
    # Listed before anything changes, so an interrupted render leaves no file of its own unlisted.
    _write_manifest(out, previous | set(files))
    _remove(out, previous - set(files))
    written = _write_files(files, out)
    _write_manifest(out, set(files))
    return written


def format_summary(render: Render) -> str:
    counts = render.summary()
    width = max(len(kind) for kind in counts)
    lines = [f"  {kind:<{width}}  {count:>5}" for kind, count in sorted(counts.items())]
    lines.append(f"  {'total':<{width}}  {sum(counts.values()):>5}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.render", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="stack name: reads Pulumi.<stack>.yaml from the project directory")
    source.add_argument("--config", type=Path, help="a stack YAML file at any path")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the manifests into")
    args = parser.parse_args(argv)

    path = args.config or ROOT / f"Pulumi.{args.stack}.yaml"
    stack = args.stack or path.stem.removeprefix("Pulumi.")
    try:
        config = load_stack_file(path)
        previous = previous_render_files(args.out)
        render = render_config(config, stack)
        written = replace_render(render, args.out, previous)
    except (ConfigError, RenderRefused) as error:
        print(error, file=sys.stderr)
        return 2
    print(f"rendered stack '{stack}' into {args.out}: {len(written)} files")
    print(format_summary(render))
    print(f"  slurm.conf hash: {render.slurm_conf_hash[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
