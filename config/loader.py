"""Read a stack's ``dualsched:`` config and turn it into one validated StackConfig.

Every mistake is reported together as ``<config path>: <what is wrong> (got <value>)``
through :class:`ConfigError`: field-level and cross-field ones in one round, unless a
field error leaves the cross-field checks nothing sound to judge (the message then says so).
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from config.checks import MISSING, CrossFieldError, Problem, format_value
from config.models import StackConfig

NAMESPACE = "dualsched"


class ConfigError(Exception):
    """The stack config is invalid; ``problems`` lists every mistake found.

    ``cross_field_checked`` is False when field errors left no config to run the cross-field
    checks on: more problems may follow once these are fixed, and the message says so.
    """

    def __init__(self, problems: Iterable[Problem], source: str, cross_field_checked: bool = True):
        self.problems = list(problems)
        self.source = source
        self.cross_field_checked = cross_field_checked
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        pending = "" if self.cross_field_checked else f"; cross-field checks run once {'it is' if count == 1 else 'they are'} fixed"
        return f"invalid dualsched config in {self.source} ({count} problem{'s' if count != 1 else ''}){pending}:\n{lines}"


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.:/-]{1,64}", re.ASCII)


def _path(location: tuple[Any, ...]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
            continue
        # Odd keys are shown escaped and cut short, so the path stays one readable line.
        key = str(part) if _PLAIN_KEY.fullmatch(str(part)) else format_value(part, 40)
        path += f".{key}" if path else key
    return path or "(top level)"


def _model_at(location: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the key at ``location``, for 'did you mean' hints."""
    model: Any = StackConfig
    for part in location[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        field = fields.get(part)
        if field is None:
            return None
        model = next(
            (arg for arg in _type_args(field.annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)),
            None,
        )
        if model is None:
            return None
    return model


def _type_args(annotation: Any) -> list[Any]:
    args = [annotation]
    for arg in getattr(annotation, "__args__", ()):
        args.extend(_type_args(arg))
    return args


def _unknown_key_message(location: tuple[Any, ...]) -> str:
    model = _model_at(location)
    if model is None:
        return "unknown key"
    keys = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(location[-1]), keys, n=1)
    if close:
        return f"unknown key; did you mean '{close[0]}'?"
    return f"unknown key (known keys: {', '.join(keys)})"


def _problem_from_error(error: Mapping[str, Any]) -> Problem:
    location = tuple(error["loc"])
    kind = error["type"]
    if kind == "missing":
        return Problem(_path(location), "required key is missing", MISSING)
    if kind == "extra_forbidden":
        return Problem(_path(location), _unknown_key_message(location), error["input"])
    message = error["msg"].removeprefix("Value error, ")
    return Problem(_path(location), message, error["input"])


def _masked(error: Mapping[str, Any], errors: list[Any]) -> bool:
    """pydantic also reports a tuple with a bad item as too short (its valid items are
    counted); that echo of the item's own error would only mislead."""
    location = tuple(error["loc"])
    return error["type"] == "too_short" and any(
        len(other["loc"]) > len(location) and tuple(other["loc"][: len(location)]) == location for other in errors
    )


def _cross_field_problems(error: ValidationError) -> list[Problem] | None:
    """The cross-field problems StackConfig's validation found, or None when it stopped at field errors."""
    for detail in error.errors():
        if isinstance(detail.get("ctx", {}).get("error"), CrossFieldError):
            return detail["ctx"]["error"].problems
    return None


def _without_key(tree: Any, location: tuple[Any, ...]) -> Any:
    """``tree`` without the mapping key at ``location``, copying only the containers on the way."""
    head, *rest = location
    if not rest:
        return {key: value for key, value in tree.items() if key != head}
    copy = dict(tree) if isinstance(tree, Mapping) else list(tree)
    copy[head] = _without_key(tree[head], tuple(rest))
    return copy


def _checked_without_unknown_keys(raw: Mapping[str, Any], unknown: list[tuple[Any, ...]]) -> list[Problem] | None:
    """The cross-field problems of ``raw`` less its unknown keys; None when that is no config
    the checks can run on."""
    try:
        for location in unknown:
            raw = _without_key(raw, location)
    except (AttributeError, IndexError, KeyError, TypeError):  # a location inside no plain mapping or list
        return None
    try:
        StackConfig.model_validate(raw)
    except ValidationError as error:
        return _cross_field_problems(error)
    return []


def _config_error(raw: Mapping[str, Any], error: ValidationError, source: str) -> ConfigError:
    """One ConfigError with every problem: the cross-field ones too, whenever the field errors allow."""
    cross_field = _cross_field_problems(error)
    if cross_field is not None:
        return ConfigError(cross_field, source)
    details = error.errors()
    errors = [e for e in details if not _masked(e, details)]
    unknown = [tuple(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    # An unknown key changes no value the checks read; any other field error would have them
    # judge a value the user did not write (a default, or nothing).
    checked = _checked_without_unknown_keys(raw, unknown) if len(unknown) == len(errors) else None
    problems = [_problem_from_error(e) for e in errors] + (checked or [])
    return ConfigError(problems, source, cross_field_checked=checked is not None)


def parse_stack_config(raw: Mapping[str, Any], source: str = "stack config") -> StackConfig:
    """Validate the ``dualsched:`` keys (without the namespace prefix) or raise ConfigError."""
    if not isinstance(raw, Mapping):
        raise ConfigError([Problem("(top level)", "config must be a mapping of keys to values", raw)], source)
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as error:
        raise _config_error(raw, error, source) from None


def _namespaced(config: Mapping[str, Any]) -> dict[str, Any]:
    prefix = f"{NAMESPACE}:"
    return {key[len(prefix):]: value for key, value in config.items() if key.startswith(prefix)}


MAX_STACK_FILE_BYTES = 1 << 20
"""A stack file is a few kilobytes; a megabyte leaves room for many encrypted secrets."""
MAX_DEPTH = 32
"""The deepest config key is about eight levels down."""


class _Refused(yaml.YAMLError):
    """Something no stack file needs, found while reading one."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


class StackFileLoader(yaml.SafeLoader):
    """SafeLoader for stack files: no aliases, no duplicate keys, nesting at most MAX_DEPTH deep.

    Aliases make billion-laughs bombs possible, a repeated key silently overrides the first,
    and deep nesting exhausts Python's recursion; a stack file needs none of them.
    Duplicate keys are collected in ``duplicates`` so all of them are reported at once.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0
        self.duplicates: list[Problem] = []

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            raise _Refused(Problem(f"line {mark.line + 1}", "YAML aliases (*name) are not allowed in a stack file", self.peek_event().anchor))
        if self.depth >= MAX_DEPTH:
            raise _Refused(Problem(f"line {mark.line + 1}", f"nested more than {MAX_DEPTH} levels deep", MISSING))
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # an unhashable key fails in the base class; merged keys may be overridden
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in first_line:
                self.duplicates.append(
                    Problem(f"line {line}", f"key repeated in one mapping (first on line {first_line[key]}); YAML would keep only the last", key)
                )
            first_line.setdefault(key, line)
        return super().construct_mapping(node, deep)


def read_stack_document(path: str | Path) -> Any:
    """Parse a stack file with StackFileLoader's limits, or raise ConfigError."""
    path = Path(path)

    def refuse(problem: Problem) -> ConfigError:
        return ConfigError([problem], str(path))

    try:
        data = path.read_bytes()
        if len(data) > MAX_STACK_FILE_BYTES:
            raise refuse(Problem(str(path), f"a stack file is at most {MAX_STACK_FILE_BYTES} bytes", f"{len(data)} bytes"))
        loader = StackFileLoader(data.decode("utf-8"))
        try:
            document = loader.get_single_data()
        finally:
            loader.dispose()
    except _Refused as refused:
        raise refuse(refused.problem) from None
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise refuse(Problem(str(path), "cannot read the stack file", str(error).splitlines()[0])) from None
    if loader.duplicates:
        raise ConfigError(loader.duplicates, str(path))
    return document


def load_stack_file(path: str | Path) -> StackConfig:
    """Read a ``Pulumi.<stack>.yaml`` file (see read_stack_document) and validate it."""
    path = Path(path)
    document = read_stack_document(path) or {}
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise ConfigError([Problem("config", "a stack file holds a 'config' mapping", document)], str(path))
    return parse_stack_config(_namespaced(document.get("config") or {}), str(path))


def _decode(value: Any) -> Any:
    # The engine hands structured values over as JSON text and scalars as plain text.
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # left as text, which the models reject
            return value
    return value


def load_pulumi_config() -> StackConfig:
    """Validate the running stack's config (inside ``pulumi up`` / ``preview``)."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    # The engine parsed the stack file with Go's yaml.v3, which refuses duplicate keys and heavy
    # aliasing but allows some aliases and 10000 levels of nesting: when the file is here (the
    # program runs in the project directory), hold it to the offline render's rules too.
    stack_file = Path(f"Pulumi.{pulumi.get_stack()}.yaml")
    if stack_file.is_file():
        read_stack_document(stack_file)
    settings = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw = {key: _decode(value) for key, value in _namespaced(settings).items()}
    return parse_stack_config(raw, f"stack '{pulumi.get_stack()}'")
