"""Offline render: what `pulumi up` would create, as YAML files, without a cluster.

    python -m dualsched.components.render --stack dev --out build/dev              # ./Pulumi.dev.yaml
    python -m dualsched.components.render --stack-file path/to/Pulumi.x.yaml --out build/x
    python -m dualsched.components.render --stack prod --config-key myproj:cluster --program infra.cluster:build --out build/prod

Runs a program under Pulumi mocks (by default dualsched's own, components.program:build;
``--program module:function`` runs yours, imported from the working directory), writes
every Kubernetes object as YAML (one file per object, grouped by namespace),
the Slurm files of the program's Slurm config ConfigMap, and prints a summary. The
program gets the validated config at ``--config-key`` (default: the stack's
``dualsched:*`` keys) when it takes one argument, or nothing when it takes none and
reads config itself: either way ``pulumi.Config`` sees the stack file's whole config.
Secret values are redacted. A secret encrypted in the stack file (``secure:``) is
rendered from a placeholder: only the Pulumi CLI can decrypt it. ESC environments the
stack imports are not opened: a note says so, and a value set only there is missing
(see config.loader.environment_note). Pulumi ``transforms`` (ResourceOptions(transforms=...),
pulumi.runtime.register_resource_transform) are refused: the engine runs them, and
Pulumi's mocks do not (see render_config). ``transformations`` run in the SDK and render.
A manifest (.dualsched-render.json) lists what the render wrote: the next render
into that directory removes only those files, and a render refuses a non-empty
directory without one, so it never deletes what it did not write.
Exit 0 on success, 2 with the problems on bad input (config, options, program, directory).
"""

from __future__ import annotations

import argparse
import base64
import contextvars
import hashlib
import importlib
import inspect
import json
import os
import re
import secrets
import string
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import pulumi
import yaml
from pulumi.runtime import config as runtime_config
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc

from dualsched.components.slurm_files import config_hash
from dualsched.config import ConfigError, ConfigKey, Problem, StackConfig, load_stack_file
from dualsched.config.loader import engine_settings, environment_note, read_stack_document

REDACTED = "<redacted>"
CLUSTER_SCOPED = "_cluster"
MANIFEST = ".dualsched-render.json"
"""What a render wrote, by path relative to its directory; JSON, so no reader of the render's *.yaml sees it."""
PROJECT = "dualsched"
DEFAULT_PROGRAM = "dualsched.components.program:build"
SLURM_CONFIG_LABEL = ("app.kubernetes.io/name", "slurm-config")
"""The label of the ConfigMap holding the Slurm files (components/slurm_config.py)."""


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
    generated: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """The values the Random resources generated, by (type, name) and output attribute."""
    slurm_files: dict[str, str] = field(default_factory=dict)
    """The files of the program's one Slurm config ConfigMap; empty without one (or with several)."""
    transforms: list[str] = field(default_factory=list)
    """Transforms the program registered, which the engine would run and the render does not."""

    @property
    def generated_secrets(self) -> list[str]:
        return [value for outputs in self.generated.values() for value in outputs.values()]

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
_CLUSTER_KINDS = {
    "Namespace", "PersistentVolume", "Node", "ClusterRole", "ClusterRoleBinding", "StorageClass", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


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


def _digest(urn: str) -> str:
    return hashlib.sha256(urn.encode()).hexdigest()


def _auto_name(name: str, urn: str) -> str:
    # The provider appends a random suffix; a digest of the URN keeps renders comparable.
    return f"{name}-{_digest(urn)[:8]}"


class RenderMocks(pulumi.runtime.Mocks):
    """Mocks that behave like the providers where the program can observe them."""

    def __init__(self, render: Render):
        self.render = render

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = plain(dict(args.inputs))
        if args.typ == "random:index/randomBytes:RandomBytes":
            raw = secrets.token_bytes(int(state["length"]))
            self._generated(args, state, base64=base64.b64encode(raw).decode(), hex=raw.hex())
        elif args.typ == "random:index/randomPassword:RandomPassword":
            alphabet = string.ascii_letters + string.digits
            self._generated(args, state, result="".join(secrets.choice(alphabet) for _ in range(int(state["length"]))))
        elif args.typ == "random:index/randomString:RandomString":
            # lower-case letters and digits, as the program asks; from the URN, like names, so renders compare.
            # Names, not secrets: they appear in every object that mounts a claim.
            state["result"] = _digest(f"{args.typ}::{args.name}")[: int(state["length"])]
        elif args.typ.startswith("kubernetes:"):
            self._kubernetes(args, state)
        return f"{args.name}-id", state

    def _generated(self, args: pulumi.runtime.MockResourceArgs, state: dict[str, Any], **outputs: str) -> None:
        state.update(outputs)
        self.render.generated[(args.typ, args.name)] = outputs

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
    which the engine (and a CrossGuard pack) sees but no manifest carries, and every transform."""

    def __init__(self, mocks: pulumi.runtime.Mocks, render: Render):
        super().__init__(mocks)
        self.render = render

    def RegisterResource(self, request):
        if request.transforms:
            self.render.transforms.append(f"ResourceOptions(transforms=...) of {request.type} {request.name!r}")
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

    def RegisterStackTransform(self, request):
        self.render.transforms.append("a stack transform (pulumi.runtime.register_resource_transform)")
        return super().RegisterStackTransform(request)

    def RegisterStackInvokeTransform(self, request):
        self.render.transforms.append("an invoke transform (pulumi.runtime.register_invoke_transform)")
        return super().RegisterStackInvokeTransform(request)


class InputError(Exception):
    """Input the tool cannot use (an option's value, the program): one ``<what>: <problem> (got <value>)``."""

    def __init__(self, problem: Problem):
        self.problem = problem
        super().__init__(str(problem))


class TransformsRefused(InputError):
    """The program registers transforms, which the engine would run on its registrations (see render_config)."""

    def __init__(self, found: list[str]):
        super().__init__(Problem(
            "transforms",
            "the program registers Pulumi transforms, which the engine runs on each registration and an offline render "
            "cannot reproduce (Pulumi's mocks never run them), so its render would differ from what `pulumi up` creates "
            "and none was made; check the program with `pulumi preview --json` and `python -m dualsched.components.report "
            "--preview` (`transformations`, which the SDK itself runs, do render)",
            list(dict.fromkeys(found)),
        ))


@dataclass(frozen=True)
class Program:
    """A Pulumi program as the render runs it: a function of the validated StackConfig, or of nothing
    (it reads its config itself with ``pulumi.Config``)."""

    function: Callable[..., Any]
    reference: str
    takes_config: bool

    @classmethod
    def of(cls, function: Callable[..., Any], reference: str) -> Program:
        """InputError unless ``function`` takes one argument (the config) or none."""
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a callable Python cannot describe (a builtin)
            raise InputError(Problem("--program", "is not a function the render can call", reference)) from None
        required = [p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(required) > 1:
            raise InputError(Problem("--program", "must take the validated config (one argument) or nothing "
                                     f"(it reads its config itself), not {len(required)} arguments", reference))
        return cls(function, reference, len(required) == 1)

    def run(self, config: Optional[StackConfig]) -> Any:
        return self.function(config) if self.takes_config else self.function()


@dataclass(frozen=True)
class EngineConfig:
    """What the engine would give the program besides the StackConfig: the stack's whole config as text
    (for ``pulumi.Config``), the keys it marks secret, and the project name (``pulumi.Config()``'s namespace)."""

    values: Mapping[str, str] = field(default_factory=dict)
    secret_keys: tuple[str, ...] = ()
    project: str = PROJECT


def _run_in_config(engine: EngineConfig, run: Callable[[], Any]) -> None:
    """Run with ``engine``'s config as the runtime's. The runtime keeps its config in context variables:
    set in a copy of the context, it is gone afterwards and the caller's config is as it was."""

    def configured() -> None:
        runtime_config.set_all_config(dict(engine.values), list(engine.secret_keys))
        run()

    contextvars.copy_context().run(configured)


def render_config(
    config: Optional[StackConfig],
    stack: str = "render",
    program: Union[Program, Callable[..., Any], None] = None,
    engine: EngineConfig = EngineConfig(),
) -> Render:
    """Run ``program`` (default: the dualsched program) for ``config`` under mocks and collect what it registers.

    Refuses (TransformsRefused) a program that registers transforms. The engine runs them on each
    registration: the resource's own, then each ancestor's, then the stack's, on inputs it has turned
    into output values, mapping options both ways (pkg/resource/deploy/source_eval.go). Pulumi's mock
    monitor does not (``MockResourceArgs.transforms``: "The mock monitor does not run them"), and
    reproducing the engine's part offline would mean re-implementing it against the SDK's private
    callback server: a render that silently differs from `pulumi up` is worse than none.
    ``transformations`` run in the SDK before registration, exactly as in `pulumi up`: they render.
    """
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from dualsched.components.program import build

    runnable = program if isinstance(program, Program) else Program.of(program or build, getattr(program, "__qualname__", DEFAULT_PROGRAM))
    render = Render()
    mocks = RenderMocks(render)
    pulumi.runtime.set_mocks(mocks, project=engine.project, stack=stack, preview=False, monitor=RenderMonitor(mocks, render))
    _run_in_config(engine, lambda: _sync_await(run_pulumi_func(lambda: runnable.run(config))))
    if render.transforms:
        raise TransformsRefused(render.transforms)
    render.slurm_files = slurm_files(obj.manifest for obj in render.objects)
    return render


def slurm_files(manifests: Iterable[Optional[Mapping[str, Any]]]) -> dict[str, str]:
    """The Slurm files as the cluster gets them: the data of the Slurm config ConfigMap. None without
    one, nor with several that differ (two clusters in one program), which slurm-files/ could not tell apart."""
    found = {json.dumps(m.get("data") or {}, sort_keys=True) for m in manifests if m and is_slurm_config(m)}
    if len(found) != 1:
        return {}
    return {name: text for name, text in json.loads(found.pop()).items() if isinstance(text, str)}


def is_slurm_config(manifest: Mapping[str, Any]) -> bool:
    key, value = SLURM_CONFIG_LABEL
    return manifest.get("kind") == "ConfigMap" and ((manifest.get("metadata") or {}).get("labels") or {}).get(key) == value


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
    files[OPTIONS_FILE] = json.dumps(resource_options(render), indent=1, sort_keys=True) + "\n"
    return files


OPTIONS_FILE = "resource-options.json"
"""Beside the objects: the Pulumi options no manifest shows, which the change report reads."""


def resource_options(render: Render) -> dict[str, dict[str, Any]]:
    """``protect``, ``retainOnDelete`` and ``ignoreChanges`` by object file, for the objects that have any."""
    registrations: dict[tuple[str, str], list[Registration]] = {}
    for registration in filter(lambda r: r.custom, render.registrations):
        registrations.setdefault((registration.type, registration.name), []).append(registration)
    options = {}
    for obj in render.objects:
        # One object per (type, name) in dualsched's program; a user's program may reuse a name under
        # two parents, and then which options belong to which object is unknown: none are claimed.
        [registration, *others] = registrations.get((obj.pulumi_type, obj.pulumi_name)) or [None]
        if registration is None or others:
            continue
        flags = {"protect": registration.protect, "retainOnDelete": registration.retain_on_delete}
        ignored = {"ignoreChanges": list(registration.ignore_changes)} if registration.ignore_changes else {}
        if any(flags.values()) or ignored:
            options[_object_path(obj)] = {**{name: True for name, on in flags.items() if on}, **ignored}
    return options


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
    text = json.dumps({"writtenBy": "python -m dualsched.components.render", "files": sorted(files)}, indent=1) + "\n"
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
    if not counts:
        return "  (no Kubernetes objects)"
    width = max(len(kind) for kind in counts)
    lines = [f"  {kind:<{width}}  {count:>5}" for kind, count in sorted(counts.items())]
    lines.append(f"  {'total':<{width}}  {sum(counts.values()):>5}")
    return "\n".join(lines)


# ------------------------------------------------------------- the stack file and the program to render

_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}", re.ASCII)
_PROGRAM_REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)
SOURCE_HELP = """\
The stack file is ./Pulumi.<stack>.yaml of the working directory (--stack) or any file (--stack-file).
--config-key says where in its config the dualsched config is: a namespace whose keys are its
top-level fields (default 'dualsched': dualsched:slurm, dualsched:pools, ...), or one key holding
the whole config as an object ('myproj:cluster', read with pulumi.Config("myproj").require_object("cluster")).
--program runs your program instead of dualsched's: a function imported from the working directory,
taking the validated config (StackConfig) or nothing (it reads its config with pulumi.Config, which
sees the stack file's whole config). Pulumi transforms are refused; transformations render."""


def add_source_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--stack / --stack-file, --config-key and --program: a stack file, and how to render it."""
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument("--stack", help="stack name: reads ./Pulumi.<stack>.yaml from the working directory")
    source.add_argument("--stack-file", "--config", dest="stack_file", type=Path, metavar="PATH",
                        help="a stack file at any path (--config is its older name)")
    parser.add_argument("--config-key", metavar="KEY",
                        help="where the stack's config holds the dualsched config: NAMESPACE or NAMESPACE:KEY "
                        f"(default: {ConfigKey()}); refused for a program that reads its config itself")
    parser.add_argument("--program", default=DEFAULT_PROGRAM, metavar="MODULE:FUNCTION",
                        help="the program to render, importable from the working directory (default: %(default)s)")


class ProgramFailed(Exception):
    """The program stopped with a pulumi.RunError: its own message, as `pulumi up` prints it."""

    def __init__(self, program: Program, error: pulumi.RunError):
        super().__init__(f"program {program.reference} stopped:\n{error}")


def stack_path(stack: Optional[str], stack_file: Optional[Path]) -> Path:
    """--stack-file as given, or --stack's Pulumi.<stack>.yaml in the working directory (never this package's)."""
    if stack_file is not None:
        return stack_file
    if not _STACK_NAME.fullmatch(stack or ""):
        raise InputError(Problem("--stack", "must be a stack name: letters, digits, '-', '_' and '.'", stack))
    path = Path(f"Pulumi.{stack}.yaml")
    if not path.is_file():
        raise InputError(Problem("--stack", f"there is no {path} in the working directory {Path.cwd()} "
                                 "(--stack-file PATH reads one elsewhere)", stack))
    return path


def load_program(reference: str) -> Program:
    """The function ``module:function`` names, imported with the working directory first on the path."""
    if not _PROGRAM_REFERENCE.fullmatch(reference):
        raise InputError(Problem("--program", "must be '<module>:<function>', e.g. 'infra.cluster:build'", reference))
    module_name, function_name = reference.split(":")
    if module_name == "__main__":  # would name the running tool, not the project's program
        raise InputError(Problem("--program", "cannot be a __main__.py: move the program into a module of its own "
                                 "(infra.py) that __main__.py calls, and name that", reference))
    # As `python -m` has it: the consumer's project, wherever this package is installed.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # whatever the consumer's module raises on import
        raise InputError(Problem("--program", f"cannot import {module_name}: {type(error).__name__}: {error}", reference)) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InputError(Problem("--program", f"module {module_name} has no function {function_name}", reference))
    return Program.of(function, reference)


def _config_key(text: str) -> ConfigKey:
    try:
        return ConfigKey.parse(text)
    except ValueError as error:
        raise InputError(Problem("--config-key", str(error), text)) from None


def project_name(stack_file: Path) -> str:
    """The name in the Pulumi.yaml beside the stack file: the namespace of ``pulumi.Config()``."""
    project = stack_file.parent / "Pulumi.yaml"
    document = read_stack_document(project) if project.is_file() else None
    name = document.get("name") if isinstance(document, dict) else None
    return name if isinstance(name, str) and name else PROJECT


@dataclass(frozen=True)
class Source:
    """A stack file, the program that renders it, and what the program is given."""

    path: Path
    program: Program
    engine: EngineConfig
    config: Optional[StackConfig]
    """The validated config at the config key; None when the program reads config itself."""
    note: str
    """What an offline read of the stack leaves out (config.loader.environment_note); empty when nothing."""

    @property
    def stack(self) -> str:
        return self.path.name.removeprefix("Pulumi.").removesuffix(".yaml").removesuffix(".yml")


def load_source(path: Path, config_key: Optional[str] = None, program: str = DEFAULT_PROGRAM, need_config: bool = False) -> Source:
    """Read and check everything a render needs: ConfigError or InputError, before anything is registered.
    ``config_key`` None is the default key; a key given for a program that takes no config, and so would never
    read it, is refused rather than ignored (unless ``need_config``: the caller reads the config itself)."""
    key, runnable = _config_key(str(ConfigKey()) if config_key is None else config_key), load_program(program)
    reads_config = runnable.takes_config or need_config
    if config_key is not None and not reads_config:
        raise InputError(Problem("--config-key", f"is never read: the program {runnable.reference} takes no config "
                                 "(it reads its own with pulumi.Config); leave --config-key out", config_key))
    document = read_stack_document(path) or {}
    values, secret_keys = engine_settings(document, path)
    config = load_stack_file(path, key) if reads_config else None
    engine = EngineConfig(values, tuple(secret_keys), project_name(path))
    return Source(path, runnable, engine, config, environment_note(document, path))


def _where(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{os.path.relpath(frame.filename)}:{frame.lineno}"


def render_source(source: Source) -> Render:
    """render_config of a Source; what the program raises becomes one line (ProgramFailed, InputError)."""
    try:
        return render_config(source.config, source.stack, source.program, source.engine)
    except (InputError, ConfigError):
        raise
    except pulumi.RunError as error:
        raise ProgramFailed(source.program, error) from None
    except Exception as error:  # mostly the program's own: one line saying where, not a traceback
        raise InputError(Problem("--program", f"stopped the render with {type(error).__name__}: {error} (at {_where(error)})",
                                 source.program.reference)) from None


BAD_INPUT = (ConfigError, InputError, ProgramFailed, RenderRefused)
"""What main() reports in one message and exit code 2."""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dualsched-render", description=__doc__.split("\n\n")[0], epilog=SOURCE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the manifests into")
    args = parser.parse_args(argv)

    try:
        source = load_source(stack_path(args.stack, args.stack_file), args.config_key, args.program)
        previous = previous_render_files(args.out)
        render = render_source(source)
        written = replace_render(render, args.out, previous)
    except BAD_INPUT as error:
        print(error, file=sys.stderr)
        return 2
    program = "" if args.program == DEFAULT_PROGRAM else f" with program {args.program}"
    print(f"rendered stack '{source.stack}'{program} into {args.out}: {len(written)} files")
    print(format_summary(render))
    if render.slurm_files:
        print(f"  slurm.conf hash: {render.slurm_conf_hash[:16]}")
    else:
        print("  slurm.conf: none (the program registers no Slurm config ConfigMap)")
    if source.note:
        print(source.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
