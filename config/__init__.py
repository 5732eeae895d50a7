"""Typed, validated stack configuration for dualsched."""

# The checkout's config/ is the source of dualsched.config. Imported top-level (`python -m config.<tool>` in a
# checkout), it and its modules are the dualsched.config ones under a second name, never a second copy.
if __name__ != "dualsched.config":
    import dualsched

    dualsched.alias_source_folder(__name__)

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
