"""What the cluster file's server settings become on a command line: ``args`` mappings as
flags, and model paths (``builtin:mock-tokenizer`` is the mock's shipped tokenizer, named here
as a path so that planning a mock run imports nothing of the mock). Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

BUILTIN_TOKENIZER = "builtin:mock-tokenizer"
MOCK_TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "mock" / "tokenizer"
"""The tiny tokenizer shipped with the mock, which ``builtin:mock-tokenizer`` names."""


def flags(values: Mapping[str, str | int | float | bool]) -> list[str]:
    """A YAML args mapping as command-line flags: `true` a bare flag, `false` left out."""
    out: list[str] = []
    for name, value in values.items():
        if value is True:
            out.append(f"--{name}")
        elif value is False:
            continue
        else:
            out.extend([f"--{name}", str(value)])
    return out


def resolve_model_path(value: str) -> str:
    """``builtin:mock-tokenizer`` is the tiny tokenizer directory shipped with the package."""
    if value == BUILTIN_TOKENIZER:
        return str(MOCK_TOKENIZER_DIR)
    return value
