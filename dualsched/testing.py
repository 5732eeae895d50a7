"""The public testing API: a project's program rendered under dualsched's mocks, with no cluster and no Pulumi CLI.

What a project's tests import (docs/starter.md, "Testing API"); kept stable across the 0.x releases:

    from dualsched.testing import render_stack

    render = render_stack("Pulumi.dev.yaml", program="infra:build")
    slurmctld = render.one("StatefulSet", "slurmctld")           # a RenderedObject: .manifest, .kind, .name, .namespace
    assert render.summary()["Deployment"] == 1                   # objects by kind
    assert "PartitionName=gpu" in render.slurm_files["slurm.conf"]

- ``render_stack(stack_file, program=..., config_key=...)``: load and validate the stack file (``ConfigError`` with
  every problem), run ``program`` (``module:function``, imported from the working directory; default dualsched's
  own program) under the mocks, and return the ``Render``: what ``dualsched-render`` writes, as objects.
- ``render_config(config, stack, program)``: the same for a ``StackConfig`` already in hand (or None, for a program
  that reads its config itself), and a program given as a function.
- ``Render``: ``objects`` (``RenderedObject``: ``pulumi_type``, ``pulumi_name``, ``manifest``, ``kind``, ``name``,
  ``namespace``), ``registrations`` (``Registration``: ``type``, ``name``, ``urn``, ``parent``, ``protect``,
  ``retain_on_delete``, ``dependencies``, ...), ``one(kind, name_part)``, ``by_kind(kind)``, ``summary()``,
  ``slurm_files`` (file name -> text), ``slurm_conf_hash``, ``component_outputs``.
- ``RenderMocks``: the ``pulumi.runtime.Mocks`` behind it (Kubernetes objects named and namespaced as the provider
  would, Random resources generating values), for a test that calls ``pulumi.runtime.set_mocks`` itself.

Generated secrets (munge key, passwords) differ between two renders; everything else is deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from dualsched.components.render import (
    DEFAULT_PROGRAM,
    Registration,
    Render,
    RenderedObject,
    RenderMocks,
    load_source,
    render_config,
    render_source,
)
from dualsched.config import ConfigError, StackConfig

__all__ = [
    "ConfigError",
    "Registration",
    "Render",
    "RenderMocks",
    "RenderedObject",
    "StackConfig",
    "render_config",
    "render_stack",
]


def render_stack(stack_file: Union[str, Path], program: str = DEFAULT_PROGRAM, config_key: Optional[str] = None) -> Render:
    """Render ``stack_file`` (a ``Pulumi.<stack>.yaml``) with ``program`` (``module:function``) under the mocks.
    ``config_key`` (default ``dualsched``) is where the stack's config holds the dualsched config, for a program
    that takes the config; one that reads its own config takes none."""
    return render_source(load_source(Path(stack_file), config_key, program))
