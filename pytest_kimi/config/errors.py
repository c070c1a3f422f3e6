"""pydantic's validation errors as :class:`ConfigError`: ``file:line: field 'a.b': problem``.

pydantic reports a ``loc`` tuple and a terse English message; a cluster file's reader wants
the YAML line, the dotted field and the problem in the file's terms ("expected an integer,
got str '8'"). The first problem leads the message; a few more follow, one per line.
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from pytest_kimi.config.fields import ONE_VALUE, VALUES, kind
from pytest_kimi.config.yamlfile import ConfigError, Located

MAX_SHOWN = 5

_TYPE_PROBLEMS = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "string_type": "expected a non-empty string",
    "string_too_short": "expected a non-empty string",
    "bool_type": "expected true or false",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "too_short": "expected at least one value",
}
_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
}
_BOUND_KEYS = {">=": "ge", ">": "gt", "<=": "le", "<": "lt"}


def field_path(loc: tuple[str | int, ...]) -> str:
    """``('nodes', 1, 'name')`` -> ``nodes[1].name``, the spelling of :class:`Located`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in (ONE_VALUE, VALUES):  # a Sweep's shape: the field itself
            continue
        elif part != "[key]":  # a dict key that failed its own check: the key is the field
            out = f"{out}.{part}" if out else part
    return out or "(top level)"


def config_error(src: Located, exc: ValidationError, model: type[BaseModel]) -> ConfigError:
    """One :class:`ConfigError` for every problem pydantic found, the most useful first.

    Problems with a value that is in the file come first, in file order; missing fields after
    (their line is only their section's). One problem per field."""
    seen: dict[str, tuple[bool, int, str]] = {}
    for order, err in enumerate(exc.errors(include_url=False)):
        field = field_path(err["loc"])
        if field not in seen:
            missing = err["type"] == "missing"
            rank = order if missing else (src.line_of(field) or 0)
            seen[field] = (missing, rank, problem(err, model))
    ranked = sorted(seen.items(), key=lambda item: item[1][:2])
    errors = [str(src.error(field, text)) for field, (_, _, text) in ranked]
    message = errors[0]
    if len(errors) > 1:
        more = [f"\n  also {e}" for e in errors[1:MAX_SHOWN]]
        rest = len(errors) - MAX_SHOWN
        message += "".join(more) + (f"\n  ... and {rest} more" if rest > 0 else "")
    return ConfigError(message)


def problem(err: ErrorDetails, model: type[BaseModel]) -> str:
    """The problem part of a message, in the wording the hand-written checks always used."""
    kind_of, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind_of == "missing":
        return "required field is missing"
    if kind_of == "extra_forbidden":
        owner = model_at(model, err["loc"][:-1])
        known = ", ".join(sorted(owner.model_fields)) if owner else ""
        return f"unknown field (known fields here: {known})"
    if kind_of in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    if kind_of in _TYPE_PROBLEMS:
        return f"{_TYPE_PROBLEMS[kind_of]}, got {kind(value)}"
    if kind_of in _BOUNDS:
        op = _BOUNDS[kind_of]
        return f"must be {op} {_number(ctx.get(_BOUND_KEYS[op]))}, got {value!r}"
    if kind_of == "literal_error":
        return f"{value!r} is not one of {ctx.get('expected')}"
    return f"{err['msg']}, got {kind(value)}"


def _number(value: Any) -> Any:
    """A bound as the file would write it: ``0``, not pydantic's ``0.0``."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def model_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc`` (to list its known fields)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if _is_model(current):
            if not isinstance(part, str) or part not in current.model_fields:
                return None
            current = current.model_fields[part].annotation
        elif get_origin(current) in (dict, list):
            current = get_args(current)[-1]  # the part is a key or an index
        else:
            return None
    current = _unwrap(current)
    return current if _is_model(current) else None


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` -> ``X``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
