"""The result directory: ``reports/<run-id>/`` with one folder per layout.

Layout folders hold ``records.jsonl``, ``summary.json``, ``manifest.json`` and ``logs/``;
the run folder holds ``comparison.md`` and ``comparison.json``. Every file is written to a
temporary name and renamed, so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_kimi.files import atomic_write_text


def new_run_id(cluster: str, replicas: int, now: datetime | None = None) -> str:
    """``20260902-123051-pro6000-dp2``: sortable by time, says where and how wide."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cluster}-dp{replicas}"


def make_run_dir(base: Path, run_id: str) -> Path:
    """Create ``base/run_id``; a second run in the same second gets a numbered suffix."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = base / (run_id if n == 0 else f"{run_id}.{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run directory under {base}")


def write_text(path: Path, text: str) -> None:
    """Write atomically: a temporary file in the same folder, then rename."""
    atomic_write_text(path, text)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, allow_nan=False, default=str) + "\n")


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def client_environment() -> dict[str, Any]:
    """Where the client ran: host, Python, and the versions that shape the numbers."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(
            ("pytest-kimi", "pytest", "httpx", "numpy", "sglang-router", "sglang", "fabric")
        ),
    }
