"""Offline render: what `pulumi up` would create, as YAML files, without a cluster.

    python -m components.render --stack dev --out build/dev
    python -m components.render --config path/to/Pulumi.x.yaml --out build/x

Runs the real program (components.program.build) under Pulumi mocks, writes
every Kubernetes object as YAML (one file per object, grouped by namespace),
the rendered Slurm files, and prints a summary. Secret values are redacted.
Exit 0 on success, 2 with the config problems on invalid config.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import secrets
import string
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc

from components.slurm_files import config_hash, kubernetes_site, render_slurm_files
from config import ConfigError, StackConfig, load_stack_file

REDACTED = "<redacted>"
CLUSTER_SCOPED = "_cluster"
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


def _file_name(obj: RenderedObject) -> str:
    return f"{obj.kind.lower()}-{obj.name}.yaml"


def write_render(render: Render, out: Path) -> list[Path]:
    """Write one YAML file per object under <out>/<namespace>/, and the Slurm files under <out>/slurm-files/."""
    written = []
    for obj in render.objects:
        folder = out / (obj.namespace or CLUSTER_SCOPED)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / _file_name(obj)
        path.write_text(yaml.safe_dump(redacted(obj.manifest), sort_keys=False, width=120))
        written.append(path)
    slurm_dir = out / "slurm-files"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    for name, text in render.slurm_files.items():
        (slurm_dir / name).write_text(text)
        written.append(slurm_dir / name)
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
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    render = render_config(config, stack)
    if args.out.exists():
        _clear(args.out)
    written = write_render(render, args.out)
    print(f"rendered stack '{stack}' into {args.out}: {len(written)} files")
    print(format_summary(render))
    print(f"  slurm.conf hash: {render.slurm_conf_hash[:16]}")
    return 0


def _clear(out: Path) -> None:
    """Remove a previous render's YAML files, so deleted objects do not linger."""
    for path in sorted(out.rglob("*"), reverse=True):
        if path.is_file() and (path.suffix == ".yaml" or path.parent.name == "slurm-files"):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


if __name__ == "__main__":
    sys.exit(main())
