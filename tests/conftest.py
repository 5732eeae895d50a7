"""Shared fixtures: the dev and prod stacks as raw dicts and as validated configs.

``dev_raw`` / ``prod_raw`` are the ``dualsched:`` keys of ``Pulumi.<stack>.yaml``
without the namespace prefix, deep-copied per test so a test may mutate them.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# A bare `pytest` (not `python -m pytest`) from a clone that was not `pip install`ed
# still finds the project's packages.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dualsched.config import StackConfig, parse_stack_config  # noqa: E402
STACKS = ("dev", "prod")
_PREFIX = "dualsched:"
SHARD_VARIABLE = "DUALSCHED_TEST_SHARD"
"""K/N: run every N-th test from the K-th on. `make test` runs the unit tier's two halves in its two lanes
(tools/test-tiers.sh); each half is as long as the other within seconds, whichever files grow."""


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get(SHARD_VARIABLE)
    if not shard:
        return
    number, count = (int(part) for part in shard.split("/"))
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % count != number - 1])
    items[:] = items[number - 1::count]


def stack_file(stack: str) -> Path:
    return ROOT / f"Pulumi.{stack}.yaml"


def _read_raw(stack: str) -> dict[str, Any]:
    document = yaml.safe_load(stack_file(stack).read_text())
    return {key[len(_PREFIX):]: value for key, value in document["config"].items() if key.startswith(_PREFIX)}


_RAW = {stack: _read_raw(stack) for stack in STACKS}


def raw_stack(stack: str) -> dict[str, Any]:
    """A fresh deep copy of a stack's ``dualsched:`` keys."""
    return copy.deepcopy(_RAW[stack])


@pytest.fixture
def dev_raw() -> dict[str, Any]:
    return raw_stack("dev")


@pytest.fixture
def prod_raw() -> dict[str, Any]:
    return raw_stack("prod")


@pytest.fixture
def dev_config() -> StackConfig:
    return parse_stack_config(raw_stack("dev"), "Pulumi.dev.yaml")


@pytest.fixture
def prod_config() -> StackConfig:
    return parse_stack_config(raw_stack("prod"), "Pulumi.prod.yaml")


@pytest.fixture(params=STACKS)
def stack(request) -> str:
    """Each stack name in turn."""
    return request.param
