"""Typed, validated stack configuration for dualsched."""

from config.checks import CrossFieldError, Problem
from config.loader import ConfigError, ConfigKey, load_pulumi_config, load_stack_file, parse_stack_config
from config.models import StackConfig

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
