"""Run the policy rules over the rendered program, without the Pulumi engine.

    python -m dualsched.policy.offline --stack dev                  # ./Pulumi.dev.yaml
    python -m dualsched.policy.offline --stack prod                 # environment taken from the stack (prod)
    python -m dualsched.policy.offline --stack-file path/to/Pulumi.x.yaml --environment prod
    python -m dualsched.policy.offline --stack prod --config-key myproj:cluster --program infra.cluster:build

The program runs under the offline render's mocks (components.render.render_config),
whose monitor also records each resource's ``protect`` option: the engine hands it
to the CrossGuard pack, but no manifest carries it. The stack file, the config key and
the program are given as to the render (see its --help). Exit 0 when every
rule passes, 1 with one line per violation, 2 on bad input (config, options, program).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from dualsched.components.render import BAD_INPUT, SOURCE_HELP, Render, add_source_arguments, load_source, render_config, render_source, stack_path
from dualsched.config import StackConfig
from dualsched.policy.rules import Resource, Settings, Violation, violations


def resources(render: Render) -> list[Resource]:
    """Every Kubernetes object the program registered, with its protect option."""
    return [Resource(obj.manifest, render.registration(obj).protect, obj.pulumi_name) for obj in render.objects]


def rendered_resources(config: StackConfig, stack: str = "policy") -> list[Resource]:
    """Every Kubernetes object dualsched's program registers for ``config``."""
    return resources(render_config(config, stack))


def settings_for(config: StackConfig, environment: Optional[str] = None) -> Settings:
    """Pack settings matching a stack config: its namespace, taint key, pool label, GPU pools. A stack
    without Slurm runs no slurmd anywhere, so the pack's default Slurm namespace is as good as any."""
    return Settings(
        slurm_namespace=config.slurm.namespace if config.slurm is not None else Settings.slurm_namespace,
        slurm_taint_key=config.placement.slurm_taint_key,
        pool_label=config.placement.pool_label,
        gpu_pools=tuple(pool.name for pool in config.pools if pool.gpus_per_node > 0),
        environment=environment or config.environment.value,
    )


def check(config: StackConfig, environment: Optional[str] = None) -> list[Violation]:
    return violations(rendered_resources(config), settings_for(config, environment))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dualsched-policy", description=__doc__.split("\n\n")[0], epilog=SOURCE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_arguments(parser)
    parser.add_argument("--environment", choices=["dev", "prod"], help="override the stack's environment")
    args = parser.parse_args(argv)

    try:
        # The rules' settings come from the config, whatever the program takes.
        source = load_source(stack_path(args.stack, args.stack_file), args.config_key, args.program, need_config=True)
        found = violations(resources(render_source(source)), settings_for(source.config, args.environment))
    except BAD_INPUT as error:
        print(error, file=sys.stderr)
        return 2
    label = f"{source.path.name} (environment {args.environment or source.config.environment.value})"
    if not found:
        print(f"policy: {label}: every rule passes")
        return 0
    print(f"policy: {label}: {len(found)} violation{'s' if len(found) != 1 else ''}")
    for violation in found:
        print(f"  [{violation.rule}] {violation.message}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
