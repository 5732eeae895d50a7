"""dualsched CrossGuard policy pack: the rules of policy/rules.py as mandatory policies.

    pulumi preview --stack dev  --policy-pack policy
    pulumi preview --stack prod --policy-pack policy

Each rule is a ResourceValidationPolicy over Kubernetes resources; the manifest
it checks is the resource's inputs (apiVersion, kind, metadata, spec, ...), and
``protect`` comes from the engine's resource options. The settings (environment,
Slurm namespace, taint key, pool label, GPU pools) are the stack's own: the engine
hands the pack the stack's config (StackSettings), read as dualsched-policy reads
the stack file. A pack config (``--policy-pack-config``) may override any of them
per policy; the prod rules do nothing unless the environment is ``prod``. A program
that keeps the dualsched config elsewhere than the ``dualsched:`` keys says where in
DUALSCHED_CONFIG_KEY (``myproj:cluster``); a stack with nothing there fails the
``dualsched-config-found`` policy rather than being checked with the default settings.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import UnknownValueError

# The analyzer runs this file as a script: make the sibling rules module importable.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rules import CONFIG_SCHEMA, RULES, Resource, Rule, Settings, dualsched_config  # noqa: E402


CONFIG_KEY_ENV = "DUALSCHED_CONFIG_KEY"
"""Where the stack's config holds the dualsched config, as dualsched-policy's --config-key says it: '<namespace>'
(default 'dualsched') or '<namespace>:<key>'. The engine starts the pack with its own environment."""


class StackSettings:
    """The previewed stack's settings. The engine sends the stack's config (secrets decrypted) in its
    ConfigureStack call, before any resource (analyzer_plugin.go, NewPolicyAnalyzer); pulumi-policy 1.21's
    servicer keeps only the call's tags, so the pack wraps it to read the config too."""

    key = os.environ.get(CONFIG_KEY_ENV) or "dualsched"
    current = Settings()
    missing: Optional[list[str]] = None
    """After ConfigureStack: None when the stack's config has the dualsched config at ``key``, else its keys."""

    @classmethod
    def kept_by(cls, configure_stack):
        def configure(servicer, request, context):
            config = dict(request.config)
            found = dualsched_config(config, cls.key)
            cls.current = Settings.of(found or {})
            cls.missing = None if found is not None else sorted(config)
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


CONFIG_FOUND = "dualsched-config-found"


def config_found(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    """Without the dualsched config the rules would run with the default settings (dev) and pass a prod stack:
    fail instead, as dualsched-policy does."""
    if StackSettings.missing is not None:
        report_violation(
            f"the stack's config has no dualsched config at '{StackSettings.key}' (its keys: "
            f"{', '.join(StackSettings.missing) or 'none'}); the rules would check it with the default settings "
            f"(environment dev). Set {CONFIG_KEY_ENV} to where the program reads it, '<namespace>' or "
            "'<namespace>:<key>' as dualsched-policy's --config-key", None)


def policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One mandatory policy per rule, and the check that the rules had the stack's own settings."""
    found = StackValidationPolicy(
        name=CONFIG_FOUND,
        description="The stack's config has the dualsched config the rules take their settings from.",
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=config_found,
    )
    return [
        *(
            ResourceValidationPolicy(
                name=rule.name,
                description=rule.description,
                enforcement_level=EnforcementLevel.MANDATORY,
                config_schema=PolicyConfigSchema(properties=CONFIG_SCHEMA),
                validate=validation(rule),
            )
            for rule in RULES
        ),
        found,
    ]


if __name__ == "__main__":
    PolicyPack(name="dualsched", enforcement_level=EnforcementLevel.MANDATORY, policies=policies())
