"""Typed, validated stack configuration for dualsched."""

# The checkout's config/ is the source of dualsched.config; imported top-level too, its modules would load
# twice (two StackConfig classes, two registries of components), so that import is refused.
if __name__ != "dualsched.config":
    raise ImportError(f"import dualsched.config, not {__name__}: config/ is its source folder")

from dualsched.config.checks import CrossFieldError, Problem
from dualsched.config.loader import ConfigError, ConfigKey, load_pulumi_config, load_stack_file, parse_stack_config
from dualsched.config.models import StackConfig

__all__ = [
    "ConfigError",
    "ConfigKey",
    "CrossFieldError",
    "Problem",
    "StackConfig",
    "load_pulumi_config",
    "load_stack_file",
    "parse_stack_config",
]
