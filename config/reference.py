"""The config reference, generated from the models so it cannot drift from them.

    python -m dualsched.config.reference                         # prints the Markdown table
    python -m dualsched.config.reference docs/configuration.md   # rewrites the table between that page's markers

Each row is one key as written in a stack file (``dualsched:<key>`` at the top
level, then the ``--path`` below it), its type, its default and its description.
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from dualsched.config.models import StackConfig

BEGIN = "<!-- config-reference:begin -->"
END = "<!-- config-reference:end -->"


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(inner type, is a list) for Optional[...] and tuple[X, ...]."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _unwrap(inner[0])
    if origin is tuple:
        return _unwrap(typing.get_args(annotation)[0])[0], True
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return annotation, False


def _type_name(annotation: Any) -> str:
    inner, is_list = _unwrap(annotation)
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        name = " \\| ".join(f"`{member.value}`" for member in inner)
    elif isinstance(inner, type) and issubclass(inner, BaseModel):
        name = "object"
    elif typing.get_origin(inner) is dict:
        name = "map"
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"list of {name}" if is_list else name


def _default(field: Any, inherited: Any = PydanticUndefined) -> str:
    if field.is_required() and inherited is PydanticUndefined:
        return "**required**"
    default = field.default if inherited is PydanticUndefined else inherited
    if default is PydanticUndefined or default is None:
        return ""
    if isinstance(default, BaseModel) or default in ((), {}):
        return ""
    if isinstance(default, enum.Enum):
        default = default.value
    if isinstance(default, tuple):
        default = tuple(item.value if isinstance(item, enum.Enum) else item for item in default)
    return f"`{default}`"


def rows(
    model: type[BaseModel] = StackConfig, prefix: str = "", defaults: BaseModel | None = None
) -> Iterator[tuple[str, str, str, str]]:
    """One row per key; ``defaults`` is the parent's default object, whose values its keys inherit."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        inner, is_list = _unwrap(field.annotation)
        inherited = getattr(defaults, name) if defaults is not None else PydanticUndefined
        yield path, _type_name(field.annotation), _default(field, inherited), (field.description or "").replace("\n", " ")
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            if is_list:
                yield from rows(inner, f"{path}[].")
            else:
                nested = inherited if inherited is not PydanticUndefined else field.default
                yield from rows(inner, f"{path}.", nested if isinstance(nested, BaseModel) else None)


def markdown() -> str:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    lines += [f"| `{path}` | {kind} | {default} | {description} |" for path, kind, default, description in rows()]
    return "\n".join(lines)


def update(path: Path) -> None:
    text = path.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(f"{text[:start]}\n{markdown()}\n{text[end:]}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        update(Path(sys.argv[1]))
    else:
        print(markdown())
