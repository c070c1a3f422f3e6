"""``${NAME}`` and ``${NAME:-default}`` in a cluster file's string values.

One file serves several machines when the parts that differ come from the environment: a
venv's path, a model directory, a host. Every string value (never a key) is expanded once,
when the file is read, before anything checks it; ``$${`` stands for a literal ``${``. A
variable that is not set and has no default is an error naming the file, the line, the field
and the variable; so is a reference that is not one (``${1X}``, ``${A`` without its ``}``, a
default holding another reference).

A value that is nothing but one reference takes the type its field expects: where the field
takes text (a flag's value, an environment variable, a path) it stays the text it was, so
``--revision ${R}`` with ``R=0123`` passes ``0123`` and ``1.10`` stays ``1.10``; where it takes
a number or a boolean (``gpus: ${GPUS:-8}``, a port, ``time_scale``) a decimal number,
``true`` or ``false`` becomes one. Inside a flow mapping ``{...}`` quote the reference, or YAML
reads its braces: ``{host: "${HOST}", gpus: "${GPUS}"}``.

Expanded values become part of the configuration like anything typed into the file: they show
in manifests and command lines. So a variable whose name is a secret's (``HF_TOKEN``,
``*_PASSWORD``, ``*_API_KEY``, ...) is refused here: secrets travel by ``env_from_local``,
which never writes them anywhere (docs/cluster-file.md). The values used are kept beside the
file's SHA-256 in each manifest, since the file alone no longer says what ran.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from pytest_kimi.config.yamlfile import Located

Loc = tuple[str | int, ...]

# ${...} up to the first }, or $${ (matched first, so it is never a reference)
_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a secret's name, word by word (HF_TOKEN, DB_PASSWORD, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY),
# not every name with such letters in it (TOKENIZER_PATH, MAX_TOTAL_TOKENS, PRIVATE_REGISTRY)
_SECRET_NAME = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|APIKEY|API_KEY|PRIVATE_KEY)"
    r"(_|$)",
    re.I,
)
_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)?\.[0-9]+([eE][-+]?[0-9]+)?")


def expand(
    src: Located, environ: Mapping[str, str], schema: type[BaseModel] | None = None
) -> tuple[Located, dict[str, str]]:
    """``src`` with every reference in its string values replaced, and the variables used
    (name -> the value it had, or its default where it was not set). ``schema`` (the file's
    model) says which whole references become numbers or booleans; without it they stay text."""
    used: dict[str, str] = {}
    data = _expand(src, src.data, (), environ, used, schema)
    return replace(src, data=data), used


def field_name(loc: Loc) -> str:
    """``("nodes", 1, "gpus")`` -> ``nodes[1].gpus``, the spelling of :class:`Located`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _expand(src: Located, value: Any, loc: Loc, environ: Mapping[str, str],
            used: dict[str, str], schema: type[BaseModel] | None) -> Any:  # fmt: skip
    if isinstance(value, dict):
        return {k: _expand(src, v, (*loc, k), environ, used, schema) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(src, v, (*loc, i), environ, used, schema) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value
    text, whole = _expand_text(src, value, field_name(loc), environ, used)
    if whole and schema is not None and not _takes_text(_annotation_at(schema, loc)):
        return _typed(text)
    return text


def _expand_text(
    src: Located, text: str, field: str, environ: Mapping[str, str], used: dict[str, str]
) -> tuple[str, bool]:
    """The text with its references replaced, and whether it was one reference and nothing
    else. An opening ``${`` without its ``}`` is an error, not text passed on."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) is None:  # $${
            return "\x00"  # a placeholder: a literal "${" no later check may take for a reference
        return _value(src, match.group(1), field, environ, used)

    out = _REFERENCE.sub(one, text)
    if "${" in out:  # what is left is a ${ that never closed
        raise src.error(field, f"an unclosed reference in {text!r}: write ${{NAME}}, or $${{ "
                               "for a literal ${")  # fmt: skip
    whole = _REFERENCE.fullmatch(text)
    return out.replace("\x00", "${"), whole is not None and whole.group(1) is not None


def _value(
    src: Located, inner: str, field: str, environ: Mapping[str, str], used: dict[str, str]
) -> str:
    name, has_default, default = inner.partition(":-")
    if not _NAME.fullmatch(name) or "${" in default or "$" in name:
        raise src.error(
            field,
            f"'${{{inner}}}' is not a variable reference: write ${{NAME}} or ${{NAME:-default}} "
            "(NAME: letters, digits and _; a default is plain text), or $${ for a literal ${",
        )
    if _SECRET_NAME.search(name):
        raise src.error(
            field,
            f"${{{name}}} looks like a secret, and expanded values are written into manifests "
            f"and command lines; pass it with env_from_local: [{name}] instead",
        )
    if name in environ:
        used[name] = environ[name]
        return environ[name]
    if not has_default:
        raise src.error(
            field,
            f"${{{name}}} is not set in the environment (export it, or give a default: "
            f"${{{name}:-VALUE}})",
        )
    used[name] = default
    return default


def _typed(text: str) -> Any:
    """A decimal integer, a decimal number, ``true`` or ``false`` as one; anything else (a
    leading zero, ``on``, a word) stays text, for the field's own check to name."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def _annotation_at(schema: type[BaseModel], loc: Loc) -> Any:
    """The type the file's model gives the value at ``loc``; ``None`` where it cannot say."""
    current: Any = schema
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        elif get_origin(current) in (list, tuple) or _members(current):
            current = _item(current) if isinstance(part, int) else None
        else:
            return None
        if current is None:
            return None
    return current


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> tuple[Any, ...]:
    """A union's members (each unwrapped), else ``()``."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(_unwrap(a) for a in get_args(annotation))
    return ()


def _item(annotation: Any) -> Any:
    """A list's element type, or the list member's of a union (a sweep: one value or a list)."""
    for member in _members(annotation) or (annotation,):
        if get_origin(member) in (list, tuple):
            return get_args(member)[0]
    return None


def _takes_text(annotation: Any) -> bool:
    """Whether a field of this type takes free text (then a reference stays text); a type we
    cannot read counts as text, which leaves the value as written."""
    annotation = _unwrap(annotation)
    if annotation is None or annotation is str or annotation is typing.Any:
        return True
    members = _members(annotation)
    if members:
        return any(_takes_text(m) for m in members if m is not type(None))
    if get_origin(annotation) is Literal:
        return False  # a few words: a number or a boolean may be among them, text is not free
    return False
