"""Bad input never becomes a traceback, a half-registered cluster or a silent typo.

A hypothesis property test mutates the dev and prod stack configs (wrong
types, missing keys, out-of-range numbers, unknown keys, bad names, empty
lists, huge values, unicode) and runs each mutant down the path ``pulumi up``
takes: ``__main__.py`` (load the stack config, then build) under Pulumi mocks
that record every registration. Each mutant must be either

* accepted: the program builds without an exception, or
* rejected: ``pulumi.RunError`` carrying the ConfigError message, every
  problem one ``<path>: <what> (got <value>)`` line, and NOTHING registered.

The examples are derandomized and no example database is written, so CI runs
the same examples every time; the example count keeps the file well under a
minute on the project's 2-core machine.
"""

from __future__ import annotations

import copy
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await
from pydantic import ValidationError

from dualsched.config import ConfigError, StackConfig, parse_stack_config

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "__main__.py"
STACKS = ("dev", "prod")
PROBLEM_LINE = re.compile(r"^\S.*: .+ \(got .*\)$")

# Deterministic and database-less: the same examples on every run and machine.
settings.register_profile(
    "bad-input",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _raw(stack: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    return {key.split(":", 1)[1]: value for key, value in document["config"].items() if key.startswith("dualsched:")}


RAW = {stack: _raw(stack) for stack in STACKS}


# ----------------------------------------------------------------- running the program


class CountingMonitor(pulumi_mocks.MockMonitor):
    """The stock mock monitor, counting every resource registration (components too)."""

    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.registered: list[str] = []

    def RegisterResource(self, request):
        if request.type != "pulumi:pulumi:Stack":
            self.registered.append(f"{request.type}::{request.name}")
        return super().RegisterResource(request)


class EchoMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ == "random:index/randomBytes:RandomBytes":
            state.update(base64="a2V5", hex="00")
        elif args.typ == "random:index/randomPassword:RandomPassword":
            state["result"] = "password"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def engine_config(raw: dict[str, Any]) -> dict[str, str]:
    """The stack config as the engine hands it to the program: structured values as JSON text."""
    encoded = {}
    for key, value in raw.items():
        encoded[f"dualsched:{key}"] = value if isinstance(value, str) else json.dumps(value)
    return encoded


def run_main(raw: dict[str, Any]) -> tuple[BaseException | None, list[str]]:
    """Run ``__main__.py`` (what ``pulumi up`` runs) under mocks; return its exception and registrations."""
    monitor = CountingMonitor(EchoMocks())
    pulumi.runtime.set_mocks(EchoMocks(), project="dualsched", stack="bad-input", preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(engine_config(raw))
    error: BaseException | None = None
    try:
        _sync_await(run_pulumi_func(lambda: runpy.run_path(str(MAIN), run_name="__main__")))
    except BaseException as caught:  # noqa: BLE001 - the property is about which exceptions escape
        error = caught
    finally:
        pulumi.runtime.set_all_config({})
    return error, monitor.registered


def assert_clear_message(text: str, problem_count: int) -> None:
    header, *lines = text.split("\n")
    assert header.startswith("invalid dualsched config in "), text
    assert len(lines) == problem_count, text
    for line in lines:
        assert line.startswith("  "), text
        assert PROBLEM_LINE.match(line[2:]), f"not '<path>: <what> (got <value>)': {line!r}"


def model_accepts(raw: dict[str, Any]) -> bool:
    """Whether StackConfig itself accepts the config: a ValidationError and nothing else otherwise."""
    try:
        StackConfig.model_validate(copy.deepcopy(raw))
    except ValidationError:
        return False
    return True


def check(raw: dict[str, Any]) -> str:
    """The property, for one config dict. Returns 'accepted' or 'rejected'."""
    # The library entry point: accepted, or a ConfigError and nothing else.
    try:
        parse_stack_config(copy.deepcopy(raw), "mutant")
        accepted = True
    except ConfigError as error:
        accepted = False
        assert error.problems, "a ConfigError lists at least one problem"
        for problem in error.problems:
            assert PROBLEM_LINE.match(str(problem)), f"not '<path>: <what> (got <value>)': {str(problem)!r}"
        assert_clear_message(str(error), len(error.problems))
    # No way around the cross-field checks: the model itself draws the same line.
    assert model_accepts(raw) == accepted, "StackConfig.model_validate and parse_stack_config disagree"

    # The program `pulumi up` runs: reject before registering anything, or build.
    error, registered = run_main(raw)
    if error is None:
        assert registered, "an accepted config builds the cluster"
        return "accepted"
    assert isinstance(error, pulumi.RunError), f"{type(error).__name__} escaped __main__.py: {error!r}"
    assert registered == [], f"registered before rejecting: {registered[:5]}"
    assert_clear_message(str(error), str(error).count("\n"))
    # Scalars reach the program as text (the engine's encoding), so a mutant the library
    # rejects for its type may pass the program's lax parse; never the other way round.
    assert not accepted, "__main__.py rejected a config the library accepts"
    return "rejected"


# ----------------------------------------------------------------- mutation strategies


def _locations(value: Any, path: tuple = ()) -> list[tuple]:
    """Every key path in a config tree (dict keys and list indices)."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.append(path + (key,))
            found.extend(_locations(item, path + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.append(path + (index,))
            found.extend(_locations(item, path + (index,)))
    return found


def _containers(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every mapping in the tree (the root included)."""
    found = [path] if isinstance(value, dict) else []
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_containers(item, path + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_containers(item, path + (index,)))
    return found


def _at(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


unicode_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
# Keys: any printable unicode. Keys with control characters or leading blanks are
# test_unprintable_keys_* below (a known gap in config/loader.py's path rendering).
unicode_keys = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=20
).filter(lambda key: not key[0].isspace())
bad_names = st.sampled_from(
    ["Upper", "under_score", "-lead", "trail-", "a" * 64, "", " ", "dot.ted", "gpu-[1-2]", "名前", "ünïcode", "tab\there",
     "new\nline", "a/b", "0" * 300, "$(reboot)", "x;y", "NaN"]
)
out_of_range = st.sampled_from([-1, 0, 65, 4097, 65536, 65535 * 2, 2**31, 2**63, -(2**63), 10**40, 10**4000, 1.5, -0.0])
wrong_types = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    unicode_text,
    st.lists(st.integers(), max_size=3),
    st.dictionaries(unicode_text, st.integers(), max_size=2),
)
# Fresh objects per draw: a drawn list must never be shared (and so end up inside itself).
huge_values = st.sampled_from(
    ["x" * 100_000, "a" * 1000, "gpu-[0000001-9999999]", "gpu-[1-100000]", "1" * 1000 + "Gi", 10**4000, [0] * 2_000]
).map(copy.deepcopy)


@st.composite
def mutants(draw) -> dict[str, Any]:
    raw = copy.deepcopy(RAW[draw(st.sampled_from(STACKS))])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(
            ["wrong_type", "delete", "out_of_range", "unknown_key", "bad_name", "empty_list", "huge", "unicode", "repeat"]
        ))
        locations = _locations(raw)
        if kind == "unknown_key":
            container = _at(raw, draw(st.sampled_from(_containers(raw))))
            existing = list(container)
            key = draw(st.one_of(
                unicode_keys,
                st.sampled_from(existing).map(lambda k: k + "s") if existing else unicode_keys,
                st.sampled_from(existing).map(str.lower) if existing else unicode_keys,
            ))
            container[key] = draw(wrong_types)
            continue
        if not locations:
            break
        path = draw(st.sampled_from(locations))
        parent, key = _at(raw, path[:-1]), path[-1]
        if kind == "delete":
            del parent[key]
        elif kind == "wrong_type":
            parent[key] = draw(wrong_types)
        elif kind == "out_of_range":
            parent[key] = draw(out_of_range)
        elif kind == "bad_name":
            parent[key] = draw(bad_names)
        elif kind == "empty_list":
            parent[key] = draw(st.sampled_from([[], {}, ""]))
        elif kind == "huge":
            parent[key] = draw(huge_values)
        elif kind == "unicode":
            parent[key] = draw(unicode_text)
        elif kind == "repeat" and isinstance(parent[key], list) and parent[key]:
            parent[key] = parent[key] * draw(st.integers(2, 50))
        else:
            parent[key] = draw(wrong_types)
    return raw


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("stack", STACKS)
def test_the_stacks_themselves_are_accepted_and_build(stack):
    assert check(copy.deepcopy(RAW[stack])) == "accepted"


@settings(settings.get_profile("bad-input"), max_examples=200)
@given(mutants())
def test_mutated_configs_are_accepted_or_rejected_clearly(raw):
    event(check(raw))


@pytest.mark.parametrize(
    "path, value",
    [
        (("pools", 0, "gpusPerNode"), "eight"),
        (("pools", 0, "nodes"), "gpu-[001-"),
        (("pools", 0, "nodes"), "gpu-[1-99999999]"),
        (("slurm", "partitions"), []),
        (("pools",), []),
        (("slurm", "clusterName"), "Prod_Cluster"),
        (("slurm", "controller", "stateStorage", "size"), "5 GB"),
        (("storage", "nfsServer"), "nfs.internal"),
        (("inference", "models", 0, "gpus"), 10**4000),
        (("inference", "models", 0, "name"), "qwen\u00e9"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_known_mistakes_are_rejected_before_anything_is_registered(path, value):
    raw = copy.deepcopy(RAW["dev"])
    _at(raw, path[:-1])[path[-1]] = value
    assert check(raw) == "rejected"


def test_a_misspelt_key_is_rejected_with_a_suggestion():
    raw = copy.deepcopy(RAW["prod"])
    raw["pools"][0]["gpusPerNod"] = 8
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(raw)
    assert "pools[0].gpusPerNod: unknown key; did you mean 'gpusPerNode'? (got 8)" in str(caught.value)
    assert check(raw) == "rejected"


@pytest.mark.parametrize("key", ["a\nb", " x", "\t"], ids=repr)
def test_unprintable_keys_are_reported_on_one_clear_line(key):
    raw = copy.deepcopy(RAW["dev"])
    raw[key] = 1
    assert check(raw) == "rejected"


@pytest.mark.parametrize("field", ["host", "user", "name"])
def test_text_that_lands_in_slurm_files_cannot_inject_lines(field):
    raw = copy.deepcopy(RAW["prod"])
    raw["slurm"]["accounting"]["database"]["external"][field] = "x\nDebugLevel=debug5"
    assert check(raw) == "rejected"


# ----------------------------------------------------------------------- the render CLI

BAD_FILES = {
    "unknown-and-wrong": {"config": {"dualsched:slurm": {"clusterName": "Bad Name", "partitons": []}, "dualsched:pools": "gpu"}},
    "not-a-mapping": ["config", "dualsched:pools"],
    "broken-yaml": "config: {dualsched:slurm: [unclosed\n",
}


# Files whose reading fails inside YAML or Python rather than in the models: Python's
# int() digit limit (ValueError) and a non-UTF-8 file (UnicodeDecodeError).
UNREADABLE_FILES = {
    "huge-integer": "config:\n  dualsched:pools:\n    - name: a\n      nodes: a-1\n      cpus: " + "9" * 5000 + "\n",
    "not-utf8": b"config:\n  dualsched:slurm: \xff\xfe\n",
}


def _render_bad_file(tmp_path: Path, content: Any) -> subprocess.CompletedProcess:
    bad = tmp_path / "bad.yaml"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return subprocess.run(
        [sys.executable, "-m", "dualsched.components.render", "--config", str(bad), "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("name", sorted(UNREADABLE_FILES))
def test_unreadable_stack_files_are_a_clear_message(tmp_path, name):
    from dualsched.config import load_stack_file

    bad = tmp_path / "bad.yaml"
    content = UNREADABLE_FILES[name]
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError):
        load_stack_file(bad)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_render_cli_exits_2_without_a_traceback(tmp_path, name):
    result = _render_bad_file(tmp_path, BAD_FILES[name])
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "invalid dualsched config" in result.stderr
    lines = result.stderr.strip().split("\n")
    for line in lines[1:]:
        assert PROBLEM_LINE.match(line.strip()), line
    assert not (tmp_path / "out").exists(), "nothing is written for an invalid config"
