"""dualsched as a Pulumi component package (docs/component-package.md).

This directory is the plugin (PulumiPlugin.yaml, runtime python) that Pulumi YAML and other languages use:
``packages: {dualsched: <this directory>}`` in a Pulumi YAML project, ``pulumi package get-schema <this
directory>``. pip installs it as ``dualsched.package``, inside the virtual environment that runs it; find it with

    dualsched-package-dir                    # or: python -m dualsched.package.locate

The modules: cluster.py (the component and the provider), config_types.py (the input schema, generated from
config/models.py by gen_types.py), __main__.py (what the engine runs).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

DIRECTORY = Path(__file__).resolve().parent
"""The plugin directory: the one to give Pulumi (``packages:``, ``pulumi package get-schema``)."""


def runtime_environment(directory: Path = DIRECTORY) -> Optional[Path]:
    """The virtual environment the plugin runs in: PulumiPlugin.yaml's ``runtime.options.virtualenv``, resolved
    as Pulumi resolves it (relative to the plugin directory). Installed, that is the venv holding this file
    (``<venv>/lib/pythonX.Y/site-packages/dualsched/package`` -> ``../../../../..``); in a checkout, its ``.venv``."""
    import yaml

    plugin = yaml.safe_load((directory / "PulumiPlugin.yaml").read_text())
    venv = ((plugin.get("runtime") or {}).get("options") or {}).get("virtualenv")
    return (directory / venv).resolve() if venv else None


def main(argv: Optional[list[str]] = None) -> int:
    """``dualsched-package-dir``: print the plugin directory, after checking that Pulumi will run it in the
    Python that has dualsched installed (this one), so a mistake is found here, not as an engine error."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="dualsched-package-dir",
        description="Print the directory of dualsched's Pulumi component package (the plugin Pulumi YAML and "
        "`pulumi package get-schema` take), installed with dualsched in this virtual environment.",
    )
    parser.parse_args(argv)
    venv = runtime_environment()
    here = Path(sys.prefix).resolve()
    if venv != here or sys.prefix == sys.base_prefix:
        print(
            f"dualsched-package-dir: the component package in {DIRECTORY} runs in the virtual environment "
            f"{venv} (its PulumiPlugin.yaml), but dualsched is installed in {here}"
            + (", which is not a virtual environment" if sys.prefix == sys.base_prefix else "")
            + ": install dualsched into a virtual environment (python3 -m venv .venv; .venv/bin/pip install dualsched)",
            file=sys.stderr,
        )
        return 1
    print(DIRECTORY)
    return 0
