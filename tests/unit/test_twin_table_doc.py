"""docs/mock.md's twin table is what scripts/twin_table.py produces now: a change to the model,
the profile or the prompts that moves a figure makes this fail until the table is rewritten
(``python scripts/twin_table.py --write``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("twin_table", ROOT / "scripts/twin_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_twin_table_is_the_twins_table_now():
    script = _script()
    assert script.doc_table() == script.twin_table(), (
        "docs/mock.md's twin table is stale: run python scripts/twin_table.py --write"
    )


def test_a_changed_figure_is_seen(tmp_path):
    script = _script()
    doc = tmp_path / "mock.md"
    doc.write_text(f"x\n{script.BEGIN}\nold\n{script.END}\ny\n")
    script.write_doc("| a | 1.00 |", doc)
    assert script.doc_table(doc) == "| a | 1.00 |"
    assert doc.read_text().startswith("x\n") and doc.read_text().endswith("\ny\n")
    assert script.doc_table(doc) != script.twin_table()
