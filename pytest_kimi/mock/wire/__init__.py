"""The wire versions the mock speaks: what each SGLang version sends, recorded from the real
server (``scripts/capture_sglang_wire.py``) into ``sglang-<version>.json`` beside this file.

A recording holds the long lists the mock must not copy by hand: ``/get_server_info`` (every
``ServerArgs`` key with the value a real server reported, and ``internal_states``),
``/get_model_info``, every ``/metrics`` family (type, help text, label names, the label
sets a real server shows once ready, histogram buckets, a gauge's value at start-up), and
every flag the version's command-line parser takes (the mock refuses others as SGLang does),
and (``declared``, read from the version's collector source) the scheduler's families a live
unified server never showed: a histogram appears at its first observation, so the KV-transfer
histograms of a disaggregated prefill are only there; they start with no series. The
mock serves from it and computes what it models; ``tests/conformance/test_mock_vs_sglang.py``
holds both against the live server of the same version, which keeps the recording honest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pytest_kimi.config.versions import MOCK_SGLANG_VERSIONS, NEWEST_SGLANG

VERSIONS: tuple[str, ...] = MOCK_SGLANG_VERSIONS
DEFAULT_VERSION = NEWEST_SGLANG
WIRE_DIR = Path(__file__).resolve().parent


def wire_file(version: str) -> Path:
    return WIRE_DIR / f"sglang-{version}.json"


@dataclass(frozen=True)
class Family:
    """One ``/metrics`` family as a real server exports it. ``ready``: the label sets it shows
    once ready (after its warm-up request), with run-specific values as ``{placeholders}``;
    ``seen``: the label sets it showed by the end of the capture's traffic (a template for
    those the mock adds later); ``values``: a gauge's value per ``ready`` label set."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    ready: tuple[dict[str, str], ...]
    seen: tuple[dict[str, str], ...]
    buckets: tuple[str, ...] = ()
    values: tuple[float, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Family:
        return cls(
            name=data["name"],
            type=data["type"],
            help=data["help"],
            labels=tuple(data["labels"]),
            ready=tuple(dict(x) for x in data["ready"]),
            seen=tuple(dict(x) for x in data["seen"]),
            buckets=tuple(data.get("buckets", ())),
            values=tuple(float(v) for v in data.get("values", ())),
        )


@dataclass(frozen=True)
class Recording:
    """What one SGLang version answered: see the module's docstring."""

    version: str
    captured_with: dict[str, Any]
    server_info: dict[str, Any]
    model_info: dict[str, Any]
    families: tuple[Family, ...]
    server_flags: frozenset[str] = frozenset()

    def family(self, name: str) -> Family | None:
        return next((f for f in self.families if f.name == name), None)


@cache
def recording(version: str) -> Recording:
    """The recording of ``version`` (one of :data:`VERSIONS`), read once per process."""
    if version not in VERSIONS:
        raise ValueError(f"no wire recording for SGLang {version}; known: {', '.join(VERSIONS)}")
    data = json.loads(wire_file(version).read_text(encoding="utf-8"))
    return Recording(
        version=data["version"],
        captured_with=data["captured_with"],
        server_info=data["server_info"],
        model_info=data["model_info"],
        families=tuple(Family.from_dict(f) for f in [*data["metrics"], *data.get("declared", ())]),
        server_flags=frozenset(data.get("server_flags", ())),
    )
