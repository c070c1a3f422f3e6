"""What of an answer is the wire and not a value: keys, types, the kinds of chunks in a stream
and their order, metric families and label sets. Used to hold the mock against a real server
(``tests/conformance/test_mock_vs_sglang.py``).

* a JSON value's **skeleton**: an object's keys with their values' skeletons, a list's
  element skeleton, a scalar's type (``null``, ``bool``, ``int``, ``float``, ``str``); ``int``
  and ``float`` differ, as they do to a client that type-checks;
* a stream's **pattern**: its chunks' skeletons with runs of equal ones collapsed, so that
  three content chunks and twelve are the same pattern. Real SGLang merges tokens into one
  chunk when its HTTP side falls behind; :func:`merged_away` says when a real pattern is the
  mock's with runs of chunks missing, the only difference merging can make;
* a ``/metrics`` text's **families**: name, type, help text, label names and label sets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )


# keys whose values are the protocol's own words, not data: compared as values too
ENUMS = frozenset({"object", "role", "finish_reason", "type", "code", "status_code", "status"})


def _scalar(value: Any, enum: bool) -> str:
    name = type_name(value)
    return f"{name}={value}" if enum and name in ("str", "int") else name


def skeleton(value: Any, enums: frozenset[str] = ENUMS, enum: bool = False) -> Any:
    """See the module docstring; lists by their first element (``[]`` when empty); the values
    of keys in ``enums`` are part of it."""
    if isinstance(value, dict):
        return {k: skeleton(v, enums, k in enums) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [skeleton(value[0], enums)] if value else []
    return _scalar(value, enum)


def excerpt(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Difference:
    """Where two answers differ in shape, and what each has there."""

    path: str
    real: str
    mock: str

    def __str__(self) -> str:
        return f"{self.path}: real {self.real} | mock {self.mock}"


def _describe(value: Any) -> str:
    if isinstance(value, dict | list):
        return f"{type_name(value)} {excerpt(skeleton(value), 120)}"
    return f"{type_name(value)} {excerpt(value, 60)}"


def differences(real: Any, mock: Any, path: str = "$", enums: frozenset[str] = ENUMS,
                enum: bool = False) -> list[Difference]:  # fmt: skip
    """Every place where ``real`` and ``mock`` differ in keys or types (recursively), or in
    the value of a key in ``enums``; a list is compared by its elements' shapes, each list
    holding one shape."""
    if _scalar(real, enum) != _scalar(mock, enum):
        return [Difference(path, _describe(real), _describe(mock))]
    if isinstance(real, dict):
        out = []
        for key in sorted(set(real) | set(mock)):
            where = f"{path}.{key}"
            if key not in mock:
                out.append(Difference(where, _describe(real[key]), "(no such key)"))
            elif key not in real:
                out.append(Difference(where, "(no such key)", _describe(mock[key])))
            else:
                out += differences(real[key], mock[key], where, enums, key in enums)
        return out
    if isinstance(real, list):
        return _list_differences(real, mock, path, enums)
    return []


def _list_differences(real: list, mock: list, path: str, enums: frozenset[str]) -> list:
    if not real or not mock:
        if bool(real) != bool(mock):
            return [Difference(f"{path}[]", _describe(real), _describe(mock))]
        return []
    out = differences(real[0], mock[0], f"{path}[0]", enums)
    for name, items in (("real", real), ("mock", mock)):
        kinds = {json.dumps(skeleton(x, enums), sort_keys=True) for x in items}
        if len(kinds) > 1:
            mixed = f"elements of {len(kinds)} shapes: {sorted(kinds)[:3]}"
            other = "(one shape)"
            pair = (mixed, other) if name == "real" else (other, mixed)
            out.append(Difference(f"{path}[*]", *pair))
    return out


def pattern(events: list[Any], enums: frozenset[str] = ENUMS) -> list[Any]:
    """A stream's pattern (see the module docstring)."""
    out: list[Any] = []
    for event in events:
        shape = event if event == "[DONE]" else skeleton(event, enums)
        if not out or out[-1] != shape:
            out.append(shape)
    return out


def merged_away(real: list[Any], mock: list[Any]) -> bool:
    """Whether ``real`` is ``mock`` with some runs left out, keeping its last one (the end
    of a stream is never merged away): what tokens merged into fewer chunks give."""
    if not real or not mock or real[-1] != mock[-1]:
        return False
    i = 0
    for shape in mock:
        if i < len(real) and real[i] == shape:
            i += 1
    return i == len(real)


@dataclass(frozen=True)
class MetricFamily:
    """One family of a ``/metrics`` text: its label sets as sorted ``(name, value)`` tuples
    with their sample suffix (``_bucket``, ``_sum``, ...) first."""

    name: str
    type: str
    help: str
    label_names: frozenset[str]
    sets: frozenset[tuple[tuple[str, str], ...]]


def metric_families(text: str, hide: frozenset[str] = frozenset()) -> dict[str, MetricFamily]:
    """The families of ``text`` by exposition name; label values of ``hide`` as ``*``."""
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        names: set[str] = set()
        sets = set()
        for sample in fam.samples:
            names |= set(sample.labels)
            labels = tuple(sorted((k, "*" if k in hide else v) for k, v in sample.labels.items()))
            sets.add((("", sample.name[len(fam.name):]), *labels))
        out[name] = MetricFamily(name, fam.type, fam.documentation, frozenset(names),
                                 frozenset(sets))  # fmt: skip
    return out
