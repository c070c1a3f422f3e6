"""The cluster file's JSON Schema, for editors and other tools.

``python -m pytest_kimi.config.schema`` prints it; ``--out FILE`` writes it. It is generated from
the pydantic models that validate cluster files (:mod:`pytest_kimi.config.models`), so it cannot
drift from what ``load_cluster`` accepts field by field. Rules between fields (TP x PP fills a
replica, distinct ports, ...) are beyond JSON Schema; ``load_cluster`` still checks those.
See docs/cluster-file.md for pointing an editor at it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

from pytest_kimi.config.models import ClusterFile

DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _ClosedMaps(GenerateJsonSchema):
    """Mappings whose keys follow a pattern (env names, flag names, layout names) reject keys
    that do not: pydantic emits ``patternProperties`` alone, which lets any other key pass."""

    def dict_schema(self, schema: core_schema.DictSchema) -> dict[str, Any]:
        out = super().dict_schema(schema)
        if "patternProperties" in out:
            out["additionalProperties"] = False
        return out


def cluster_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a cluster file."""
    schema = ClusterFile.model_json_schema(schema_generator=_ClosedMaps)
    return {"$schema": DIALECT, **schema}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_kimi.config.schema",
        description="Print the JSON Schema of pytest-kimi cluster files (clusters/*.yaml).",
    )
    parser.add_argument("--out", type=Path, help="write the schema to this file instead")
    args = parser.parse_args(argv)
    text = json.dumps(cluster_schema(), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
