"""The house rules on size (docs/architecture.md): no module over 400 lines, no class over 200,
no function over 80. Read from the source, so a change that grows past a limit fails here with
the name and its size, before review has to say it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_kimi"
LIMITS = {"module": 400, "class": 200, "function": 80}
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _sizes(path: Path) -> list[tuple[str, str, int]]:
    """(kind, name, lines) of the module and of every class and function in it."""
    text = path.read_text(encoding="utf-8")
    out = [("module", str(path.relative_to(PACKAGE.parent)), text.count("\n"))]
    for node in ast.walk(ast.parse(text)):
        kind = {ast.ClassDef: "class", ast.FunctionDef: "function",
                ast.AsyncFunctionDef: "function"}.get(type(node))  # fmt: skip
        if kind is not None:
            lines = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined,operator]
            out.append((kind, f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}",
                        lines))  # fmt: skip
    return out


def test_the_package_is_read() -> None:
    assert len(SOURCES) > 100


@pytest.mark.parametrize("kind", list(LIMITS))
def test_nothing_is_over_its_size_limit(kind: str) -> None:
    over = [f"{name}: {lines} lines" for path in SOURCES for k, name, lines in _sizes(path)
            if k == kind and lines > LIMITS[kind]]  # fmt: skip
    assert not over, f"over {LIMITS[kind]} lines ({kind}):\n" + "\n".join(over)


def test_the_measure_counts_lines_as_the_limits_mean() -> None:
    """A 3-line function and a 2-line module body are measured as such."""
    sample = PACKAGE.parent / "tests" / "unit" / "test_sizes.py"
    sizes = {name.rsplit(" ", 1)[-1]: n for kind, name, n in _sizes(sample) if kind != "module"}
    assert sizes["test_the_package_is_read"] == 2
