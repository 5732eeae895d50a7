"""Read a stack's ``dualsched:`` config and turn it into one validated StackConfig.

Every mistake is reported together as ``<config path>: <what is wrong> (got <value>)``
through :class:`ConfigError`: field-level and cross-field ones in one round, unless a
field error leaves the cross-field checks nothing sound to judge (the message then says so).

Secrets: a secret field (``SECRET_FIELDS``, typed :class:`config.types.SecretText`) takes a
Pulumi secret. Inside ``pulumi up`` the engine hands it over decrypted and marks its top-level
key secret; offline, a stack file's ``secure:`` value stays encrypted and becomes a placeholder.
A problem shows ``[secret]`` for the value of a secret field, of an encrypted value and of
anything under a key the engine marks secret. A Pulumi secret anywhere else is refused:
dualsched would write it into manifests and the state in plain text.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from dualsched.config.checks import MISSING, CrossFieldError, Problem, format_value, trust_warnings
from dualsched.config.models import WITHDRAWN_KEYS, StackConfig
from dualsched.config.types import SHOWN_SECRET, SecretText, is_encrypted

NAMESPACE = "dualsched"


class ConfigError(Exception):
    """The stack config is invalid; ``problems`` lists every mistake found.

    ``cross_field_checked`` is False when field errors left no config to run the cross-field
    checks on: more problems may follow once these are fixed, and the message says so.
    """

    def __init__(self, problems: Iterable[Problem], source: str, cross_field_checked: bool = True, note: str = ""):
        self.problems = list(problems)
        self.source = source
        self.cross_field_checked = cross_field_checked
        self.note = note
        """What the reader should know beyond the problems (an offline read of a stack with ESC environments)."""
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        pending = "" if self.cross_field_checked else f"; cross-field checks run once {'it is' if count == 1 else 'they are'} fixed"
        note = f"\n{self.note}" if self.note else ""
        return f"invalid dualsched config in {self.source} ({count} problem{'s' if count != 1 else ''}){pending}:\n{lines}{note}"


class _Hidden:
    def __repr__(self) -> str:
        return SHOWN_SECRET


HIDDEN = _Hidden()
"""A problem's value when it is, or may be, a secret: shown as ``[secret]``."""


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


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by every key they may be written as: camelCase, and the snake_case name."""
    return {key: field for name, field in model.model_fields.items() for key in (field.alias or name, name)}


def _model_at(location: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the key at ``location``, for 'did you mean' hints."""
    model: Any = StackConfig
    for part in location[:-1]:
        if isinstance(part, int):
            continue
        field = _fields(model).get(part)
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


def _field_at(location: tuple[Any, ...]) -> FieldInfo | None:
    """The model field a value at ``location`` belongs to (an item of a list belongs to the list's field)."""
    while location and isinstance(location[-1], int):
        location = location[:-1]
    model = _model_at(location) if location else None
    return _fields(model).get(location[-1]) if model is not None else None


def _is_secret_field(location: tuple[Any, ...]) -> bool:
    field = _field_at(location)
    return field is not None and SecretText in _type_args(field.annotation)


def _is_unknown_key(location: tuple[Any, ...]) -> bool:
    model = _model_at(location) if location else None
    return model is not None and not isinstance(location[-1], int) and location[-1] not in _fields(model)


def _secret_fields(model: type[BaseModel] = StackConfig, prefix: str = "") -> Iterable[str]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        args = _type_args(field.annotation)
        if SecretText in args:
            yield path
        listed = any(getattr(arg, "__origin__", None) is tuple for arg in args)
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _secret_fields(arg, f"{path}[]." if listed else f"{path}.")


SECRET_FIELDS = tuple(_secret_fields())
"""The config paths that take a Pulumi secret, as the reference writes them."""


def _unknown_key_message(location: tuple[Any, ...]) -> str:
    model = _model_at(location)
    if model is None:
        return "unknown key"
    if (model.__name__, location[-1]) in WITHDRAWN_KEYS:
        return WITHDRAWN_KEYS[model.__name__, location[-1]]
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
    return Problem(_path(location), message, HIDDEN if _is_secret_field(location) else error["input"])


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


def _encrypted_locations(tree: Any) -> list[tuple[Any, ...]]:
    """Where ``tree`` holds a ``secure:`` value, in document order (a loop: engine config may nest deep)."""
    found, pending = [], [((), tree)]
    while pending:
        location, node = pending.pop()
        if is_encrypted(node):
            found.append(location)
        elif isinstance(node, Mapping):
            pending += reversed([(location + (key,), item) for key, item in node.items()])
        elif isinstance(node, list):
            pending += reversed([(location + (index,), item) for index, item in enumerate(node)])
    return found


def _misplaced_secrets(tree: Any) -> list[Problem]:
    """A ``secure:`` value at a known key that is no secret field (an unknown key is reported as one)."""
    message = (
        f"is a Pulumi secret, but dualsched keeps only {', '.join(SECRET_FIELDS)} secret and would write this "
        "value into manifests and the Pulumi state in plain text: set it without --secret, and a secret field "
        "alone with `pulumi config set --secret --path`"
    )
    return [
        Problem(_path(location), message, HIDDEN)
        for location in _encrypted_locations(tree)
        if not _is_secret_field(location) and not _is_unknown_key(location)
    ]


def _under(path: str, keys: Iterable[str]) -> bool:
    return any(path == key or path.startswith((f"{key}.", f"{key}[")) for key in keys)


def _hide_secrets(problems: list[Problem], secret_keys: Iterable[str | tuple[Any, ...]]) -> list[Problem]:
    """``problems`` with every value that is or may be a secret shown as [secret]."""
    # A key the engine marks secret may be written either way, and every value under it may be secret.
    hidden_keys = {_path((form,)) for key in secret_keys if isinstance(key, str) for form in (key, to_camel(key))}
    hidden_keys |= {_path(location) for location in secret_keys if isinstance(location, tuple)}

    def secret(problem: Problem) -> bool:
        value = problem.value
        return value is not MISSING and (
            isinstance(value, SecretText) or is_encrypted(value) or _under(problem.path, hidden_keys)
        )

    return [Problem(p.path, p.message, HIDDEN) if secret(p) else p for p in problems]


def parse_stack_config(
    raw: Mapping[str, Any], source: str = "stack config", secret_keys: Iterable[str | tuple[Any, ...]] = ()
) -> StackConfig:
    """Validate the ``dualsched:`` keys (without the namespace prefix) or raise ConfigError.

    ``secret_keys``: the keys (without the prefix), or locations in ``raw`` (tuples of keys and list
    indexes), whose values are secrets, which no problem shows.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError([Problem("(top level)", "config must be a mapping of keys to values", raw)], source)
    misplaced = _misplaced_secrets(raw)
    if misplaced:
        raise ConfigError(misplaced, source, cross_field_checked=False)
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as error:
        found = _config_error(raw, error, source)
        raise ConfigError(_hide_secrets(found.problems, secret_keys), source, found.cross_field_checked) from None


def _namespaced(config: Mapping[str, Any], namespace: str = NAMESPACE) -> dict[str, Any]:
    prefix = f"{namespace}:"
    return {key[len(prefix):]: value for key, value in config.items() if key.startswith(prefix)}


# Pulumi's config keys: '<namespace>:<name>', neither part holding ':'.
_CONFIG_KEY = re.compile(r"[A-Za-z0-9_.-]{1,100}(:[A-Za-z0-9_.-]{1,100})?", re.ASCII)


@dataclass(frozen=True)
class ConfigKey:
    """Where a stack's config holds the dualsched config: every key of a namespace, one top-level field
    each (``dualsched``, this project's own: ``dualsched:pools``), or one key whose value is the whole
    config (``myproj:cluster``, as a consumer's program reads it with
    ``pulumi.Config("myproj").require_object("cluster")``)."""

    namespace: str = NAMESPACE
    key: Optional[str] = None

    @classmethod
    def parse(cls, text: str) -> ConfigKey:
        """``<namespace>`` or ``<namespace>:<key>``; ValueError says what is wrong."""
        if not _CONFIG_KEY.fullmatch(text):
            raise ValueError("must be a config namespace or one key, '<namespace>' or '<namespace>:<key>' such as "
                             "'myproj:cluster'")
        namespace, _, key = text.partition(":")
        return cls(namespace, key or None)

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key}" if self.key else self.namespace

    def select(self, config: Mapping[str, Any], source: str, missing: Any = MISSING) -> Any:
        """The dualsched config out of a stack's whole config (``ns:key`` → value); when it is not there,
        ``missing`` if one is given, else a ConfigError naming the keys there are."""
        selected = _namespaced(config, self.namespace) if self.key is None else config.get(str(self), MISSING)
        absent = selected is MISSING or (self.key is None and not selected)
        if absent and missing is not MISSING:
            return missing
        if absent:
            what = "has no keys in the stack's config" if self.key is None else "is not set in the stack's config"
            raise ConfigError([Problem(str(self), f"{what} (its keys: {', '.join(sorted(config)) or 'none'})", MISSING)], source)
        return selected


MAX_STACK_FILE_BYTES = 1 << 20
"""A stack file is a few kilobytes; a megabyte leaves room for many encrypted secrets."""
MAX_DEPTH = 32
"""The deepest config key is about eight levels down."""
MAX_EXPANDED_VALUES = 100_000
"""Values in a stack file with its aliases expanded: prod's is about 400 without any; a billion laughs is
a billion."""


class _Refused(yaml.YAMLError):
    """Something no stack file needs, found while reading one."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


class StackFileLoader(yaml.SafeLoader):
    """SafeLoader for stack files: anchors, aliases and merge keys as the Pulumi CLI reads them (Go's
    yaml.v3), but at most MAX_EXPANDED_VALUES values once expanded and no alias inside the value it names;
    no duplicate keys; nesting at most MAX_DEPTH deep.

    Expanded aliases make billion-laughs bombs possible (yaml.v3 refuses "excessive aliasing" by a ratio),
    a repeated key silently overrides the first, and deep nesting exhausts Python's recursion.
    Duplicate keys are collected in ``duplicates`` so all of them are reported at once.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0
        self.duplicates: list[Problem] = []

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise _Refused(Problem(f"line {mark.line + 1}", f"nested more than {MAX_DEPTH} levels deep", MISSING))
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        expanded = _expanded_values(node)
        if expanded is None:
            raise _Refused(Problem("(aliases)", "a YAML alias inside the value it names makes a loop", MISSING))
        if expanded > MAX_EXPANDED_VALUES:
            raise _Refused(Problem("(aliases)", f"YAML aliases expand the file to more than {MAX_EXPANDED_VALUES} values",
                                   f"{expanded} values"))  # fmt: skip
        return super().construct_document(node)

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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _expanded_values(root: yaml.Node) -> Optional[int]:
    """How many values the document holds with every alias expanded; None when an alias is inside the value
    it names. A composed alias is the anchored node itself, so the graph is walked once per node (a loop:
    expanded, aliases nest deeper than MAX_DEPTH)."""
    sizes: dict[int, int] = {}
    expanding: set[int] = set()
    pending: list[tuple[yaml.Node, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        if children_done:
            expanding.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
        elif id(node) in expanding:
            return None
        elif id(node) not in sizes:
            expanding.add(id(node))
            pending.append((node, True))
            pending += [(child, False) for child in _children(node)]
    return sizes[id(root)]


def _yaml_problem(path: Path, error: yaml.MarkedYAMLError) -> Problem:
    """PyYAML's problem, placed by line and column (1-based, as editors count) and by what it was parsing
    from where: PyYAML's own text names the string it was given, not the file."""
    def at(mark: Optional[yaml.Mark]) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown place"

    where = f"cannot read the stack file at {at(error.problem_mark)}"
    if error.context:
        where += f" ({error.context} from {at(error.context_mark)})"
    return Problem(str(path), where, error.problem or "not YAML")


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
    except yaml.MarkedYAMLError as error:
        raise refuse(_yaml_problem(path, error)) from None
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise refuse(Problem(str(path), "cannot read the stack file", str(error).splitlines()[0])) from None
    if loader.duplicates:
        raise ConfigError(loader.duplicates, str(path))
    return document


def _environments(document: Any) -> list[str]:
    """The ESC environments a stack file's ``environment:`` imports: a list of names, or a definition
    with ``imports`` (an item is a name or ``{name: options}``) and maybe ``values`` of its own."""
    value = document.get("environment") if isinstance(document, dict) else None
    if isinstance(value, dict):
        imports = value.get("imports") if isinstance(value.get("imports"), list) else []
        names = [next(iter(item), "?") if isinstance(item, dict) else item for item in imports]
        return [str(name) for name in names] + (["the stack's own environment values"] if value.get("values") else [])
    return [str(name) for name in value] if isinstance(value, list) else []


def environment_note(document: Any, path: Path) -> str:
    """What an offline tool does with a stack whose config may also come from ESC environments; empty without any."""
    environments = _environments(document)
    if not environments:
        return ""
    return (
        f"note: {path.name} imports ESC environments ({', '.join(environments)}). Offline tools read only its "
        "'config:'; the Pulumi CLI merges the environments' pulumiConfig into it (stack values win), so a value "
        "set only in an environment is missing here. `pulumi preview` opens them; `pulumi config` lists the merged config."
    )


def _document_config(document: Any, path: Path) -> dict[str, Any]:
    """The ``config:`` mapping of a parsed stack file, every namespace's keys, over the project's own
    config in the Pulumi.yaml beside it (as the CLI merges them: a key the stack sets wins whole)."""
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise ConfigError([Problem("config", "a stack file holds a 'config' mapping", document)], str(path))
    return {**_project_config(path.parent), **(document.get("config") or {})}


def _project_config(directory: Path) -> dict[str, Any]:
    """The values a project file (``Pulumi.yaml``) gives its stacks: a key without a namespace is the
    project's own; a value is either the value itself or a declaration (``value:``, or ``default:``
    of a typed key)."""
    found = [directory / name for name in ("Pulumi.yaml", "Pulumi.yml") if (directory / name).is_file()]
    if not found:
        return {}
    project = read_stack_document(found[0])
    config = project.get("config") if isinstance(project, dict) else None
    if not isinstance(config, dict):
        return {}
    values = {}
    for key, declared in config.items():
        name = key if ":" in str(key) else f"{project.get('name')}:{key}"
        if not isinstance(declared, dict):
            values[name] = declared
        elif "value" in declared or "default" in declared:
            values[name] = declared.get("value", declared.get("default"))
    return values


def _stack_config(document: Any, path: Path, key: ConfigKey = ConfigKey()) -> Any:
    """The dualsched config of a parsed stack file, at ``key``: the ``dualsched:`` keys without the prefix by default."""
    return key.select(_document_config(document, path), str(path))


def engine_settings(document: Any, path: Path) -> tuple[dict[str, str], list[str]]:
    """A parsed stack file's whole config as the engine hands it to a program (``pulumi.Config``): each value
    as text, a structured one as JSON; and the keys that hold a secret. Offline a ``secure:`` value stays
    encrypted: the program gets its envelope, which a dualsched secret field takes as a placeholder."""
    config = _document_config(document, path)
    values = {key: value if isinstance(value, str) else json.dumps(value, default=str) for key, value in config.items()}
    return values, [key for key, value in config.items() if _encrypted_locations(value)]


def load_stack_file(path: str | Path, key: ConfigKey = ConfigKey()) -> StackConfig:
    """Read a ``Pulumi.<stack>.yaml`` file (see read_stack_document) and validate the config at ``key``.

    A ``secure:`` value of a secret field stays encrypted (only the Pulumi CLI can decrypt it):
    it validates as a placeholder. Values from ESC environments are not read (see environment_note).
    """
    path = Path(path)
    document = read_stack_document(path) or {}
    source = str(path) if key == ConfigKey() else f"{path}, key {key}"
    try:
        return parse_stack_config(_stack_config(document, path, key), source)
    except ConfigError as error:
        note = environment_note(document, path)
        if not note:
            raise
        raise ConfigError(error.problems, error.source, error.cross_field_checked, note) from None


def _decode(value: Any) -> Any:
    # The engine hands structured values over as JSON text and scalars as plain text; a key set to null in the
    # stack file is a structured value too: JSON's null, which the models read as the key left out.
    if value == "null":
        return None
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # left as text, which the models reject
            return value
    return value


def _engine_secret_keys(keys: Iterable[str], key: ConfigKey) -> set[str]:
    """The keys at ``key`` the engine marks secret: a namespace's keys without the prefix, or ``{key}``
    itself. A secret anywhere inside a structured key (``pulumi config set --secret --path``, or an ESC
    ``fn::secret``) marks the whole key."""
    from pulumi.runtime import config as runtime_config

    # The language host passes the list to set_all_config; PULUMI_CONFIG_SECRET_KEYS is its source.
    listed = set(runtime_config.get_config_secret_keys_env())
    secret = [name for name in keys if runtime_config.is_config_secret(name) or name in listed]
    if key.key is not None:
        return {key.key} if str(key) in secret else set()
    return set(_namespaced({name: None for name in secret}, key.namespace))


def _holds_secret(value: Any) -> bool:
    if isinstance(value, SecretText):
        return True
    if isinstance(value, BaseModel):
        return any(_holds_secret(getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, (tuple, list)):
        return any(map(_holds_secret, value))
    return isinstance(value, dict) and any(map(_holds_secret, value.values()))


def _plain_secret_keys(config: StackConfig, secret_keys: Iterable[str]) -> list[str]:
    """Keys marked secret that hold no secret field: their values reach manifests in plain text."""
    names = {key: name for name, field in StackConfig.model_fields.items() for key in (field.alias or name, name)}
    return [key for key in sorted(secret_keys) if key in names and not _holds_secret(getattr(config, names[key]))]


def load_pulumi_config(key: ConfigKey = ConfigKey()) -> StackConfig:
    """Validate the running stack's config (inside ``pulumi up`` / ``preview``) at ``key``: by default
    the ``dualsched:`` keys, or e.g. ``ConfigKey.parse("gpu:cluster")`` for a program that keeps the
    whole config under a key of its own.

    The engine hands every value over decrypted; the keys it marks secret are shown as [secret]
    in problems, and a secret field's value reaches Kubernetes only through pulumi.Output.secret.
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    source = f"stack '{pulumi.get_stack()}'" + ("" if key == ConfigKey() else f", key {key}")
    # The engine parsed the stack file with Go's yaml.v3, which refuses duplicate keys and heavy
    # aliasing but allows some aliases and 10000 levels of nesting: when the file is here (the
    # program runs in the project directory), hold it to the offline render's rules too.
    stack_file = Path(f"Pulumi.{pulumi.get_stack()}.yaml")
    in_file = None
    if stack_file.is_file():
        document = read_stack_document(stack_file)
        # Only the file tells which values were encrypted: the engine hands them over decrypted.
        # The key may be set elsewhere (an ESC environment): the engine's config below is what counts.
        in_file = key.select(_document_config(document, stack_file), str(stack_file), missing=None)
        misplaced = _misplaced_secrets(in_file) if in_file is not None else []
        if misplaced:
            raise ConfigError(misplaced, source, cross_field_checked=False)
    settings = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret_keys = _engine_secret_keys(settings, key)
    if key.key is None:
        raw = {name: _decode(value) for name, value in key.select(settings, source).items()}
    else:
        raw = _decode(key.select(settings, source))
        # One key holds the whole config, and one secret value in it has the engine mark all of it secret:
        # the stack file says which values were encrypted; without it (an ESC environment), every one may be.
        if not (secret_keys and isinstance(raw, dict)):
            secret_keys = set()
        elif isinstance(in_file, dict):
            secret_keys = set(_encrypted_locations(in_file))
        else:
            secret_keys = set(raw)
    config = parse_stack_config(raw, source, secret_keys)
    for name in _plain_secret_keys(config, secret_keys) if key.key is None else ():
        pulumi.log.warn(
            f"{key.namespace}:{name} is a secret in the stack config, but dualsched keeps only {', '.join(SECRET_FIELDS)} "
            "secret: its values are written into manifests and the Pulumi state in plain text"
        )
    for warning in trust_warnings(config):
        pulumi.log.warn(warning)
    return config
