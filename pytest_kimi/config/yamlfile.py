"""YAML reading that remembers where each value came from.

Config errors must name the file, the line and the field; plain ``yaml.safe_load`` forgets
lines, so this module composes the node tree and keeps a map from field path to line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A problem in a YAML file, reported as ``file:line: field 'a.b': problem``."""


@dataclass(frozen=True)
class Located:
    """Parsed YAML data plus the line of every field, for error messages."""

    path: Path
    data: Any
    lines: dict[str, int]
    sha256: str = ""  # of the bytes read: what this run was configured by, edits later aside

    def error(self, field: str, problem: str) -> ConfigError:
        line = self.line_of(field)
        where = f"{self.path}:{line}" if line else str(self.path)
        return ConfigError(f"{where}: field '{field}': {problem}")

    def line_of(self, field: str) -> int | None:
        """Line of ``field``, or of its nearest parent that has one."""
        while field:
            if field in self.lines:
                return self.lines[field]
            field = field.rpartition(".")[0]
        return None


def read_yaml(path: Path) -> Located:
    """Load ``path``; syntax errors become :class:`ConfigError` with the line."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    if node is None:
        return Located(path, {}, {}, digest)
    lines: dict[str, int] = {}
    data = _build(node, "", lines, path)
    return Located(path, data, lines, digest)


def _build(node: yaml.Node, prefix: str, lines: dict[str, int], path: Path) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise ConfigError(
                    f"{path}:{key_node.start_mark.line + 1}: field '{prefix or '(top level)'}': "
                    "YAML merge keys (<<) are not supported; write the fields out"
                )
            key = str(_scalar(key_node, path, prefix or "(top level)"))
            field = f"{prefix}.{key}" if prefix else key
            if key in out:
                raise ConfigError(
                    f"{path}:{key_node.start_mark.line + 1}: field '{field}': duplicate key"
                )
            lines[field] = key_node.start_mark.line + 1
            out[key] = _build(value_node, field, lines, path)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            field = f"{prefix}[{i}]"
            lines[field] = item.start_mark.line + 1
            items.append(_build(item, field, lines, path))
        return items
    return _scalar(node, path, prefix)


def _scalar(node: yaml.Node, path: Path, field: str) -> Any:
    try:
        return yaml.SafeLoader("").construct_object(node)
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{path}:{node.start_mark.line + 1}: field '{field}': cannot read value: {problem}"
        ) from None
