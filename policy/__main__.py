"""dualsched CrossGuard policy pack: the rules of policy/rules.py as mandatory policies.

    pulumi preview --stack dev  --policy-pack policy
    pulumi preview --stack prod --policy-pack policy

Each rule is a ResourceValidationPolicy over Kubernetes resources; the manifest
it checks is the resource's inputs (apiVersion, kind, metadata, spec, ...), and
``protect`` comes from the engine's resource options. The settings (environment,
Slurm namespace, taint key, pool label, GPU pools) are the stack's own: the engine
hands the pack the stack's config (StackSettings), read as dualsched-policy reads
the stack file. A pack config (``--policy-pack-config``) may override any of them
per policy; the prod rules do nothing unless the environment is ``prod``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import UnknownValueError

# The analyzer runs this file as a script: make the sibling rules module importable.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rules import CONFIG_SCHEMA, RULES, Resource, Rule, Settings  # noqa: E402


class StackSettings:
    """The previewed stack's settings. The engine sends the stack's config (secrets decrypted) in its
    ConfigureStack call, before any resource (analyzer_plugin.go, NewPolicyAnalyzer); pulumi-policy 1.21's
    servicer keeps only the call's tags, so the pack wraps it to read the config too."""

    current = Settings()

    @classmethod
    def kept_by(cls, configure_stack):
        def configure(servicer, request, context):
            cls.current = Settings.from_stack(dict(request.config))
            return configure_stack(servicer, request, context)

        return configure


_PolicyAnalyzerServicer.ConfigureStack = StackSettings.kept_by(_PolicyAnalyzerServicer.ConfigureStack)


def plain(value: Any) -> Any:
    """The props proxy as plain data; values unknown during preview become None.

    Walking key by key keeps one unknown field (an auto-name not yet assigned) from
    hiding the rest of the manifest from the rules.
    """
    if hasattr(value, "keys"):
        result = {}
        for key in value.keys():
            try:
                result[key] = plain(value[key])
            except UnknownValueError:
                result[key] = None
        return result
    if isinstance(value, (list, tuple)) or (hasattr(value, "__getitem__") and hasattr(value, "__len__") and not isinstance(value, str)):
        items = []
        for index in range(len(value)):
            try:
                items.append(plain(value[index]))
            except UnknownValueError:
                items.append(None)
        return items
    return value


def validation(rule: Rule):
    """A CrossGuard validate callback for one rule."""

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if not args.resource_type.startswith("kubernetes:"):
            return
        resource = Resource(manifest=plain(args.props), protect=bool(args.opts.protect), pulumi_name=args.name)
        for message in rule.check(resource, Settings.from_config(args.get_config(), StackSettings.current)):
            report_violation(message, None)

    return validate


def policies() -> list[ResourceValidationPolicy]:
    return [
        ResourceValidationPolicy(
            name=rule.name,
            description=rule.description,
            enforcement_level=EnforcementLevel.MANDATORY,
            config_schema=PolicyConfigSchema(properties=CONFIG_SCHEMA),
            validate=validation(rule),
        )
        for rule in RULES
    ]


if __name__ == "__main__":
    PolicyPack(name="dualsched", enforcement_level=EnforcementLevel.MANDATORY, policies=policies())
