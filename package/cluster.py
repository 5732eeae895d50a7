"""The component other languages use: `dualsched:index:Cluster`, the whole DualScheduledCluster.

Its inputs are the dualsched config itself (package/config_types.py, generated from config/models.py),
so a YAML or TypeScript program writes the same keys as a stack file's ``dualsched:`` section:

    resources:
      gpu:
        type: dualsched:index:Cluster
        properties:
          slurm: {clusterName: demo, partitions: [{name: gpu, pools: [gpu]}]}
          pools: [{name: gpu, nodes: "gpu-[001-002]", mode: partitioned, slurmGpus: 4}]
          storage: {type: nfs, nfs: {server: nfs.example.org, path: /export}}

The parts a team uses alone are the same component with sections left out (what DualScheduledCluster
already builds): no ``inference`` = Slurm only, no ``slurm`` = model servers only.

The config is validated once, by config.loader.parse_stack_config, before anything is registered; a
mistake is refused as the engine's invalid-input error carrying the usual ``<config path>: <problem>
(got <value>)`` lines. The config decides which objects exist, so every value must be known when the
component is constructed: an unknown value (another resource's output during a preview) is refused with
its path, never guessed. A known Output is accepted; its dependencies become the cluster's.
"""

# No `from __future__ import annotations`: the schema inference reads these annotations as objects.
import re
import typing
from typing import Any, Iterable, Mapping, Optional

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.runtime import rpc
from pydantic import BaseModel

from dualsched.components.cluster import DualScheduledCluster
from dualsched.package.config_types import ClusterConfig
from dualsched.config.checks import Problem
from dualsched.config.loader import HIDDEN, SECRET_FIELDS, ConfigError, parse_stack_config
from dualsched.config.models import StackConfig

PACKAGE = "dualsched"
SOURCE = "dualsched:index:Cluster '{name}'"


def _peek(value: pulumi.Output[Any]) -> tuple[Any, bool, bool, set[pulumi.Resource]]:
    """(value, known, secret, resources) of an Output whose value is already there, without awaiting.

    The provider hands construct() its inputs as settled Outputs (known values with dependencies or a
    secret flag); an Output still waiting on something cannot be read synchronously and counts as unknown.
    """
    data = getattr(value, "_data", None)
    if data is None or not data.done() or data.cancelled() or data.exception() is not None:
        return None, False, False, set()
    settled = data.result()
    return settled.value, bool(settled.is_known), bool(settled.is_secret), set(settled.resources or ())


class _Resolved:
    def __init__(self) -> None:
        self.secret_paths: list[str] = []
        self.unknown_paths: list[str] = []
        self.resources: set[pulumi.Resource] = set()


def _resolve(value: Any, path: str, found: _Resolved) -> Any:
    """``value`` with every Output replaced by its (known) value; unknowns and secrets are recorded by path."""
    if isinstance(value, pulumi.Output):
        inner, known, secret, resources = _peek(value)
        found.resources |= resources
        if secret:
            found.secret_paths.append(path)
        if not known:
            found.unknown_paths.append(path)
            return None
        value = inner
    if isinstance(value, str) and value == rpc.UNKNOWN:
        found.unknown_paths.append(path)
        return None
    if isinstance(value, Mapping):
        return {k: _resolve(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_resolve(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def _model_of(annotation: Any) -> Optional[type[BaseModel]]:
    """The config model a field holds (itself, in a list or Optional), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def to_config_keys(value: Any, model: type[BaseModel] = StackConfig) -> Any:
    """Python field names (what the schema inference hands over) -> the config's camelCase keys."""
    if isinstance(value, list):
        return [to_config_keys(v, model) for v in value]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        field = model.model_fields.get(key)
        if field is None:  # already a config key (or unknown: the loader names it)
            out[key] = item
            continue
        sub = _model_of(field.annotation)
        out[field.alias or key] = to_config_keys(item, sub) if sub is not None else item
    return out


def _secret_field_path(path: str) -> bool:
    """Whether ``path`` (``a.b[0].c``) is a field that takes a secret (config.loader.SECRET_FIELDS)."""
    return re.sub(r"\[\d+\]", "[]", path) in SECRET_FIELDS


def config_from_inputs(inputs: Mapping[str, Any], name: str) -> tuple[StackConfig, set[pulumi.Resource]]:
    """Validate the component's inputs as a dualsched config; raise ConfigError with every problem."""
    found = _Resolved()
    # keys first, so a problem names the config path; again after, for the inside of a resolved Output
    raw = to_config_keys(_resolve(to_config_keys(dict(inputs)), "", found))
    raw = {k: v for k, v in raw.items() if v is not None}
    source = SOURCE.format(name=name)
    problems = [
        Problem(path, "must be known when the component is constructed: the config decides which objects exist "
                "(an output of another resource is only known after it is created)", "unknown")
        for path in found.unknown_paths
    ]
    problems += [
        Problem(path, "is a Pulumi secret, but dualsched writes this value into manifests and the state in plain text; "
                f"only {', '.join(SECRET_FIELDS)} take secrets", HIDDEN)
        for path in found.secret_paths
        if not _secret_field_path(path)
    ]
    if problems:
        raise ConfigError(problems, source, cross_field_checked=False)
    secret_keys = {path.split(".")[0].split("[")[0] for path in found.secret_paths}
    return parse_stack_config(raw, source, secret_keys), found.resources


def invalid_inputs(error: ConfigError) -> InputPropertiesError:
    """The engine's invalid-input error: the whole message, and one entry per problem (the engine adds the
    property's value to each entry, so a problem whose value may be a secret gets none)."""
    return InputPropertiesError(
        str(error),
        [{"property_path": p.path, "reason": p.message} for p in error.problems if p.value is not HIDDEN],
    )


class Cluster(pulumi.ComponentResource):
    """A dualsched cluster: Slurm and Kubernetes side by side on one GPU fleet (DualScheduledCluster).

    Inputs are the keys of a stack's `dualsched:` config (the README's Configuration reference); leave out `slurm` for
    model servers only, or `inference` for Slurm only. Every value must be known at construction.
    """

    namespaces: pulumi.Output[dict[str, str]]
    """Namespace of each part: slurm, inference, jobs (only those the config builds)."""
    controller_address: pulumi.Output[Optional[str]]
    """slurmctld's in-cluster address (host:port); absent without Slurm."""
    slurm_conf_hash: pulumi.Output[Optional[str]]
    """Hash of the rendered Slurm configuration; absent without Slurm."""
    inference_endpoints: pulumi.Output[dict[str, str]]
    """Model name -> its in-cluster URL."""

    def __init__(self, name: str, args: ClusterConfig, opts: Optional[pulumi.ResourceOptions] = None):
        # Validated before anything is registered (the package's provider does it first, see serve()):
        # a Python program constructing this class directly gets the same ConfigError.
        config, depends = config_from_inputs(args, name)
        super().__init__(f"{PACKAGE}:index:Cluster", name, {}, opts)
        inner_opts = pulumi.ResourceOptions(parent=self, depends_on=sorted(depends, key=id) or None)
        cluster = DualScheduledCluster(name, config, inner_opts)
        self.namespaces = pulumi.Output.from_input(cluster.namespaces)
        self.controller_address = pulumi.Output.from_input(cluster.controller_address)
        self.slurm_conf_hash = pulumi.Output.from_input(cluster.slurm_conf_hash)
        self.inference_endpoints = pulumi.Output.from_input(cluster.inference_endpoints)
        self.register_outputs(
            {
                "namespaces": self.namespaces,
                "controllerAddress": self.controller_address,
                "slurmConfHash": self.slurm_conf_hash,
                "inferenceEndpoints": self.inference_endpoints,
            }
        )


COMPONENTS: list[type[pulumi.ComponentResource]] = [Cluster]
VERSION = "0.1.0"


def schema() -> dict[str, Any]:
    """The package schema, inferred from the type hints as the provider does (package/schema.json)."""
    from pulumi.provider.experimental.analyzer import Analyzer
    from pulumi.provider.experimental.schema import generate_schema

    found = Analyzer(PACKAGE).analyze(COMPONENTS)
    return generate_schema(
        PACKAGE, VERSION, None, found["component_definitions"], found["type_definitions"], found["dependencies"]
    ).to_json()


def serve(args: Iterable[str]) -> None:
    """Run the component provider (dualsched/package/__main__.py): schema inferred from the type hints above."""
    from pulumi.provider import main
    from pulumi.provider.experimental.component import ComponentProvider

    class Provider(ComponentProvider):
        def construct(self, name, resource_type, inputs, options=None):  # type: ignore[override]
            # A config mistake is the user's to fix: the engine's invalid-input error with every problem,
            # not the component-init error (which appends a Python traceback).
            try:
                config_from_inputs(self.map_inputs(inputs, self._component_defs[resource_type.rsplit(":", 1)[-1]]), name)
            except ConfigError as error:
                raise invalid_inputs(error) from None
            return super().construct(name, resource_type, inputs, options)

    main(Provider(COMPONENTS, PACKAGE, None, VERSION), list(args))
