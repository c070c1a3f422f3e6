"""The baseline file: a run's figures kept as the reference later runs are judged against, and
the regression thresholds a gate applies (``METRIC:PERCENT``), checked against the catalogue.

The file operations and the format only; judging is :mod:`pytest_kimi.judge.baseline`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_kimi.results import catalogue
from pytest_kimi.results.files import atomic_write_text

FORMAT = 1


class BaselineError(ValueError):
    """A baseline file or threshold that cannot be used; the message says which."""


def parse_thresholds(text: str, source: str) -> dict[str, float]:
    """``ttft_p95:10%,tpot_mean:5%`` (or fractions: ``0.1``) -> {metric: 0.10, ...}."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition(":")
        if not sep:
            raise BaselineError(f"{source}: expected METRIC:PERCENT, got {item!r}")
        name = name.strip()
        known = name in catalogue.AGGREGATES or bool(catalogue.latency_prefix(name))
        try:
            judgeable = catalogue.gateable(catalogue.metric(name))
        except catalogue.UnknownMetric:
            judgeable = False
        if not (known and judgeable):
            raise BaselineError(f"{source}: {name!r} is not a metric the gate can judge")
        value = value.strip()
        try:
            number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            raise BaselineError(f"{source}: {item!r}: threshold is not a number") from None
        if not 0 <= number < 10:
            raise BaselineError(f"{source}: {item!r}: threshold out of range")
        out[name] = number
    return out


def snapshot(layouts: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> dict:
    """A baseline document: per layout its summary dict and per-request samples (ms)."""
    return {
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **meta,
        "layouts": {name: dict(data) for name, data in layouts.items()},
    }


def save(path: Path, document: dict) -> None:
    atomic_write_text(path, json.dumps(document, indent=1, allow_nan=False) + "\n")


def load(path: Path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read baseline: {exc.strerror}") from None
    except ValueError as exc:
        raise BaselineError(f"{path}: not a baseline file: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise BaselineError(f"{path}: not a pytest-kimi baseline (format {FORMAT})")
    return document
