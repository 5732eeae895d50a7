"""Run the policy rules over the rendered program, without the Pulumi engine.

    python -m policy.offline --stack dev
    python -m policy.offline --stack prod            # environment taken from the stack (prod)
    python -m policy.offline --config path/to/Pulumi.x.yaml --environment prod

The program runs under the offline render's mocks (components.render.render_config),
whose monitor also records each resource's ``protect`` option: the engine hands it
to the CrossGuard pack, but no manifest carries it. Exit 0 when every
rule passes, 1 with one line per violation, 2 on invalid config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional


from components.render import ROOT, render_config
from config import ConfigError, StackConfig, load_stack_file
from policy.rules import Resource, Settings, Violation, violations


def rendered_resources(config: StackConfig, stack: str = "policy") -> list[Resource]:
    """Every Kubernetes object the program registers, with its protect option."""
    render = render_config(config, stack)
    return [Resource(obj.manifest, render.registration(obj).protect, obj.pulumi_name) for obj in render.objects]


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
