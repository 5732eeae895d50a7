"""Run the policy rules over the rendered program, without the Pulumi engine.

    python -m policy.offline --stack dev
    python -m policy.offline --stack prod            # environment taken from the stack (prod)
    python -m policy.offline --config path/to/Pulumi.x.yaml --environment prod

The program runs under the offline render's mocks (components.render.render_config);
a mock monitor also records each resource's ``protect`` option, which the engine
would hand to the CrossGuard pack but which no manifest carries. Exit 0 when every
rule passes, 1 with one line per violation, 2 on invalid config.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import pulumi
from pulumi.runtime import mocks as pulumi_mocks

from components.render import ROOT, render_config
from config import ConfigError, StackConfig, load_stack_file
from policy.rules import Resource, Settings, Violation, violations


class _ProtectRecorder(pulumi_mocks.MockMonitor):
    """The stock mock monitor, also noting which (type, name) registrations ask for protect."""

    def __init__(self, mocks: pulumi.runtime.Mocks, protected: dict[tuple[str, str], bool]):
        super().__init__(mocks)
        self.protected = protected

    def RegisterResource(self, request):
        self.protected[(request.type, request.name)] = bool(request.protect) if request.HasField("protect") else False
        return super().RegisterResource(request)


@contextmanager
def _recording(protected: dict[tuple[str, str], bool]) -> Iterator[None]:
    # render_config installs its mocks with pulumi.runtime.set_mocks; hand it our monitor.
    original = pulumi.runtime.set_mocks

    def set_mocks(mocks, *args, **kwargs):
        kwargs["monitor"] = _ProtectRecorder(mocks, protected)
        return original(mocks, *args, **kwargs)

    pulumi.runtime.set_mocks = set_mocks
    try:
        yield
    finally:
        pulumi.runtime.set_mocks = original


def rendered_resources(config: StackConfig, stack: str = "policy") -> list[Resource]:
    """Every Kubernetes object the program registers, with its protect option."""
    protected: dict[tuple[str, str], bool] = {}
    with _recording(protected):
        render = render_config(config, stack)
    return [
        Resource(obj.manifest, protected.get((obj.pulumi_type, obj.pulumi_name), False), obj.pulumi_name)
        for obj in render.objects
    ]


def settings_for(config: StackConfig, environment: Optional[str] = None) -> Settings:
    """Pack settings matching a stack config: its namespace, taint key, pool label, GPU pools."""
    return Settings(
        slurm_namespace=config.slurm.namespace,
        slurm_taint_key=config.placement.slurm_taint_key,
        pool_label=config.placement.pool_label,
        gpu_pools=tuple(pool.name for pool in config.pools if pool.gpus_per_node > 0),
        environment=environment or config.environment.value,
    )


def check(config: StackConfig, environment: Optional[str] = None) -> list[Violation]:
    return violations(rendered_resources(config), settings_for(config, environment))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.offline", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="stack name: reads Pulumi.<stack>.yaml from the project directory")
    source.add_argument("--config", type=Path, help="a stack YAML file at any path")
    parser.add_argument("--environment", choices=["dev", "prod"], help="override the stack's environment")
    args = parser.parse_args(argv)

    path = args.config or ROOT / f"Pulumi.{args.stack}.yaml"
    try:
        config = load_stack_file(path)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    found = check(config, args.environment)
    label = f"{path.name} (environment {args.environment or config.environment.value})"
    if not found:
        print(f"policy: {label}: every rule passes")
        return 0
    print(f"policy: {label}: {len(found)} violation{'s' if len(found) != 1 else ''}")
    for violation in found:
        print(f"  [{violation.rule}] {violation.message}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
