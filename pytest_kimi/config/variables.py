"""``${NAME}`` and ``${NAME:-default}`` in a cluster file's string values.

One file serves several machines when the parts that differ come from the environment: a
venv's path, a model directory, a host. Every string value (never a key) is expanded once,
when the file is read, before anything checks it; ``$${`` stands for a literal ``${``. A
value that is nothing but one reference is then read as YAML reads a plain value, so
``gpus: ${GPUS:-8}`` is the number 8 (quoted or not: inside a flow mapping ``{...}`` a
reference must be quoted, ``{host: "${HOST}"}``, or YAML reads its braces). A variable that
is not set and has no default is an error naming the file, the line, the field and the
variable.

Expanded values become part of the configuration like anything typed into the file: they show
in manifests and command lines. So a variable whose name looks secret (``HF_TOKEN``,
``*_PASSWORD``, ...) is refused here: secrets travel by ``env_from_local``, which never writes
them anywhere (docs/cluster-file.md). The values used are kept beside the file's SHA-256 in
each manifest, since the file alone no longer says what ran.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from pytest_kimi.yamlfile import Located

# ${NAME} or ${NAME:-default}; $${ is a literal ${ (matched first, so it is never a reference)
_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|CREDENTIAL|PRIVATE", re.I)


def expand(src: Located, environ: Mapping[str, str]) -> tuple[Located, dict[str, str]]:
    """``src`` with every reference in its string values replaced, and the variables used
    (name -> the value it had, or its default where it was not set)."""
    used: dict[str, str] = {}
    data = _expand(src, src.data, "", environ, used)
    return replace(src, data=data), used


def _expand(src: Located, value: Any, field: str, environ: Mapping[str, str],
            used: dict[str, str]) -> Any:  # fmt: skip
    if isinstance(value, dict):
        return {k: _expand(src, v, f"{field}.{k}" if field else str(k), environ, used)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_expand(src, v, f"{field}[{i}]", environ, used) for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        return _expand_text(src, value, field, environ, used)
    return value


def _expand_text(
    src: Located, text: str, field: str, environ: Mapping[str, str], used: dict[str, str]
) -> Any:
    def one(match: re.Match[str]) -> str:
        if match.group(1) is None:  # $${
            return "${"
        return _value(src, match.group(1), field, environ, used)

    out = _REFERENCE.sub(one, text)
    whole = _REFERENCE.fullmatch(text)
    if whole is not None and whole.group(1) is not None:
        return _plain(out)
    return out


def _value(
    src: Located, inner: str, field: str, environ: Mapping[str, str], used: dict[str, str]
) -> str:
    name, has_default, default = inner.partition(":-")
    if not _NAME.fullmatch(name):
        raise src.error(
            field,
            f"'${{{inner}}}' is not a variable reference: write ${{NAME}} or ${{NAME:-default}} "
            "(NAME: letters, digits and _), or $${ for a literal ${",
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


def _plain(text: str) -> Any:
    """``text`` as YAML reads a plain scalar: ``8`` a number, ``true`` a boolean; an empty
    value stays ``""``, and what YAML would read as a list or a mapping stays text."""
    if not text:
        return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, str | int | float | bool) else text
