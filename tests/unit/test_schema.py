"""The published JSON Schema accepts the shipped cluster files and rejects what load_cluster does.

``jsonschema`` is not a dependency, so a small validator for exactly the keywords the schema
uses lives here; ``test_schema_uses_only_checked_keywords`` fails if the schema grows a keyword
it does not understand, so nothing is silently skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_kimi.config.schema import DIALECT, cluster_schema, main
from pytest_kimi.config.yamlfile import read_yaml

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [
    ROOT / "clusters" / "local.yaml",
    ROOT / "clusters" / "pro6000.yaml",
    ROOT / "tests" / "integration" / "small_cluster.yaml",
]
ANNOTATIONS = {"$schema", "$defs", "title", "description", "default"}
CHECKED = {
    "type", "properties", "required", "additionalProperties", "patternProperties", "$ref",
    "anyOf", "oneOf", "enum", "const", "items", "minimum", "maximum", "exclusiveMinimum",
    "minItems", "minProperties", "minLength", "pattern",
}  # fmt: skip
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def problems(value: Any, schema: dict[str, Any], root: dict[str, Any], at: str = "") -> list[str]:
    """Where ``value`` breaks ``schema`` (empty: valid), for the keywords in CHECKED."""
    if "$ref" in schema:
        return problems(value, root["$defs"][schema["$ref"].rpartition("/")[2]], root, at)
    if "oneOf" in schema:  # a workload setting: one value or a list, never both
        found = [problems(value, option, root, at) for option in schema["oneOf"]]
        fitting = sum(1 for f in found if not f)
        if fitting > 1:
            return [f"{at}: matches {fitting} options of oneOf"]
        if fitting == 1:
            return []
        typed = [f for f in found if f != [f"{at}: wrong type"]]
        return typed[0] if len(typed) == 1 else [f"{at}: matches no option"]
    if "anyOf" in schema:
        found = [problems(value, option, root, at) for option in schema["anyOf"]]
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if set(rest) - ANNOTATIONS:  # a layout: tp, or prefill and decode; and its properties
            failed = [f"{at}: matches no option of anyOf"] if all(found) else []
            return failed + problems(value, rest, root, at)
        if not all(found):
            return []
        typed = [f for f in found if f != [f"{at}: wrong type"]]  # why the fitting option failed
        return typed[0] if len(typed) == 1 else [f"{at}: matches no option"]
    types = schema.get("type")
    if types and not any(TYPES[t](value) for t in ([types] if isinstance(types, str) else types)):
        return [f"{at}: wrong type"]
    out = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{at}: not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        out.append(f"{at}: not {schema['const']!r}")
    if "minimum" in schema and value < schema["minimum"]:
        out.append(f"{at}: below minimum")
    if "maximum" in schema and value > schema["maximum"]:
        out.append(f"{at}: above maximum")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        out.append(f"{at}: not above exclusiveMinimum")
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.append(f"{at}: too short")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        out.append(f"{at}: does not match {schema['pattern']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{at}: too few items")
        for i, item in enumerate(value):
            out += problems(item, schema.get("items", {}), root, f"{at}[{i}]")
    if isinstance(value, dict):
        out += object_problems(value, schema, root, at)
    return out


def object_problems(
    value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], at: str
) -> list[str]:
    out = [f"{at}.{key}: required" for key in schema.get("required", []) if key not in value]
    if len(value) < schema.get("minProperties", 0):
        out.append(f"{at}: too few properties")
    for key, item in value.items():
        where = f"{at}.{key}"
        if key in schema.get("properties", {}):
            out += problems(item, schema["properties"][key], root, where)
            continue
        patterns = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, key)]
        for sub in patterns:
            out += problems(item, sub, root, where)
        extra = schema.get("additionalProperties", True)
        if not patterns and extra is False:
            out.append(f"{where}: unknown key")
        elif not patterns and isinstance(extra, dict):
            out += problems(item, extra, root, where)
    return out


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return cluster_schema()


def keywords(node: Any, out: set[str]) -> set[str]:
    """Every keyword used anywhere in a schema (names of properties excluded)."""
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(key)
            named = key in ("properties", "patternProperties", "$defs")
            for sub in value.values() if named else [value]:
                keywords(sub, out)
    elif isinstance(node, list):
        for item in node:
            keywords(item, out)
    return out


def test_schema_uses_only_checked_keywords(schema: dict[str, Any]) -> None:
    assert keywords(schema, set()) - CHECKED - ANNOTATIONS == set()


def test_schema_is_draft_2020_12_and_closed(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == DIALECT == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {
        "name", "nodes", "deployment", "layouts", "server", "router", "workload"
    }  # fmt: skip
    for name, definition in schema["$defs"].items():
        if definition.get("type") == "object" and "properties" in definition:
            assert definition["additionalProperties"] is False, name


def test_layouts_need_tp_and_know_pp_ep(schema: dict[str, Any]) -> None:
    layouts = schema["properties"]["layouts"]
    [(_pattern, item)] = layouts["patternProperties"].items()
    layout = schema["$defs"][item["$ref"].rpartition("/")[2]]
    assert "required" not in layout  # tp, or a disaggregated layout's prefill and decode
    assert layout["anyOf"] == [{"required": ["tp"]}, {"required": ["prefill", "decode"]}]
    assert {"tp", "pp", "ep", "slo", "prefill", "decode"} <= set(layout["properties"])
    assert layouts["additionalProperties"] is False and layouts["minProperties"] == 1


def test_every_field_is_described(schema: dict[str, Any]) -> None:
    """Editors show these on hover: the schema documents every field it defines."""

    def described(sub: dict[str, Any]) -> bool:  # pydantic leaves it on the $ref's target
        ref = sub.get("$ref", "").rpartition("/")[2]
        return bool(sub.get("description") or (ref and schema["$defs"][ref]["description"]))

    undocumented = [
        f"{name}.{field}"
        for name, definition in [("(top)", schema), *schema["$defs"].items()]
        for field, sub in definition.get("properties", {}).items()
        if not described(sub)
    ]
    assert undocumented == []
    assert "tensor" in schema["$defs"]["LayoutModel"]["properties"]["tp"]["description"].lower()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_are_valid(schema: dict[str, Any], path: Path) -> None:
    assert problems(read_yaml(path).data, schema, schema) == []


def local_data() -> dict[str, Any]:
    return read_yaml(SHIPPED[0]).data


def test_schema_accepts_a_swept_workload(schema: dict[str, Any]) -> None:
    data = local_data()
    data["workload"].update(concurrency=[1, 8, 32], request_rate=[2.5, "inf"], api=["chat"])
    assert problems(data, schema, schema) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(slos={}), ".slos: unknown key"),
        (lambda d: d["router"].update(nodee="x"), ".router.nodee: unknown key"),
        (lambda d: d["layouts"]["tp32"].update(dp=2), ".layouts.tp32.dp: unknown key"),
        (lambda d: d["layouts"]["tp32"].pop("tp"), ".layouts.tp32: matches no option of anyOf"),
        (lambda d: d["layouts"].update({"bad name": {"tp": 1}}), ".layouts.bad name: unknown"),
        (
            lambda d: d["server"].setdefault("env", {}).update({"1A": "x"}),
            ".server.env.1A: unknown key",
        ),
        (lambda d: d["server"]["args"].update({"--flag": 1}), ".server.args.--flag: unknown"),
        (lambda d: d["server"].update(port="8080"), ".server.port: not 'auto'"),
        (lambda d: d["deployment"].update(replicas=True), ".deployment.replicas: wrong type"),
        (lambda d: d["workload"].update(api="grpc"), ".workload.api: not one of"),
        (lambda d: d["workload"].update(api=["chat", "grpc"]), ".workload.api[1]: not one of"),
        (lambda d: d["workload"].update(concurrency=[]), ".workload.concurrency: too few items"),
        (lambda d: d["workload"].update(concurrency=[8, "16"]), ".workload.concurrency[1]: wrong"),
        (lambda d: d["mock"]["profile"].update(layerz=3), ".mock.profile.layerz: unknown key"),
        (lambda d: d.update(nodes=[]), ".nodes: too few items"),
    ],
)
def test_schema_rejects(schema: dict[str, Any], change: Any, expected: str) -> None:
    data = local_data()
    assert problems(data, schema, schema) == []
    change(data)
    found = problems(data, schema, schema)
    assert any(p.startswith(expected) for p in found), found


def test_main_prints_and_writes_the_same_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / "cluster.schema.json"
    assert main(["--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads(out.read_text(encoding="utf-8")) == printed == cluster_schema()


def test_runs_as_module(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    subprocess.run(
        [sys.executable, "-m", "pytest_kimi.config.schema", "--out", str(out)],
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert json.loads(out.read_text(encoding="utf-8"))["title"] == "pytest-kimi cluster file"
