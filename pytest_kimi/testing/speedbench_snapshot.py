"""Build a small local snapshot of ``nvidia/SPEED-Bench`` in the real schema, for tests.

Why: the real snapshot is ~100 MB, licensed, and partly placeholders; tests need the same
shape (a dataset card whose YAML front matter lists ``configs:`` with ``data_files`` globs, and
parquet files with SPEED-Bench's columns) at a size that is written in milliseconds. The layout
is the one ``datasets``' ``push_to_hub(config_name=...)`` writes: ``<config>/<split>-00000-of-
00001.parquet``, matched by ``<config>/<split>-*``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

FIELDS: tuple[str, ...] = (
    "question_id", "category", "sub_category", "turns", "source", "src_id", "difficulty",
    "multiturn",
)  # fmt: skip
"""SPEED-Bench's columns, in the card's order."""


def speedbench_row(
    question_id: str, category: str, turn: str, *, turns: Sequence[str] | None = None
) -> dict[str, Any]:
    """One row with every SPEED-Bench field; ``turns`` overrides the single ``turn``."""
    return {
        "question_id": question_id,
        "category": category,
        "sub_category": f"{category}_sub",
        "turns": list(turns) if turns is not None else [turn],
        "source": "synthetic",
        "src_id": f"src-{question_id}",
        "difficulty": "medium",
        "multiturn": False,
    }


def write_parquet(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Rows as a parquet file with SPEED-Bench's column types (``turns``: list of strings)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    columns = list(rows[0]) if rows else list(FIELDS)
    types = {"turns": pa.list_(pa.string()), "multiturn": pa.bool_()}
    schema = pa.schema([(c, types.get(c, pa.string())) for c in columns])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def card_text(configs: Mapping[str, str]) -> str:
    """A dataset card: YAML front matter with ``configs:`` (config -> glob of its test split)."""
    front = {
        "license": "other",
        "configs": [
            {"config_name": name, "data_files": [{"split": "test", "path": glob}]}
            for name, glob in configs.items()
        ],
    }
    return f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n\n# SPEED-Bench (test snapshot)\n"


def write_snapshot(root: Path, configs: Mapping[str, Sequence[Mapping[str, Any]]]) -> Path:
    """A snapshot directory: ``README.md`` plus ``<config>/test-00000-of-00001.parquet`` per
    config, holding the given rows."""
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in configs.items():
        write_parquet(root / name / "test-00000-of-00001.parquet", rows)
    (root / "README.md").write_text(
        card_text({name: f"{name}/test-*" for name in configs}), encoding="utf-8"
    )
    return root
