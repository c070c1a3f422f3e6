"""Data-quality notes from logs and records: what the seed's author checked by hand.

Scans every node log and the router log for OOM, NCCL errors, Python tracebacks and
EngineDeadError, and the router log for health-check failures and timeouts; counts how the
requests were split between replicas. Pure functions over text and records.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.workload.records import RequestRecord

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PATTERNS: dict[str, re.Pattern[str]] = {
    "OOM": re.compile(r"out of memory|OutOfMemoryError|\bOOM\b", re.I),
    "NCCL error": re.compile(r"NCCL (?:error|WARN .*failed)|ncclSystemError|ncclInternalError"),
    "Traceback": re.compile(r"^Traceback \(most recent call last\)", re.M),
    "EngineDeadError": re.compile(r"EngineDeadError"),
}
ROUTER_HEALTH = re.compile(
    r"health.?check.*(?:fail|timed? ?out|timeout|unhealthy|non-success)|marked.*unhealthy", re.I
)


@dataclass(frozen=True)
class Finding:
    """``count`` lines matching ``kind`` in ``log``; ``first`` is the first of them."""

    kind: str
    log: str
    count: int
    first: str


def scan_text(name: str, text: str, router: bool = False) -> list[Finding]:
    text = ANSI.sub("", text)
    findings = []
    kinds = dict(PATTERNS)
    if router:
        kinds["router health-check failure"] = ROUTER_HEALTH
    for kind, pattern in kinds.items():
        lines = [line for line in text.splitlines() if pattern.search(line)]
        if lines:
            findings.append(Finding(kind, name, len(lines), lines[0].strip()[:240]))
    return findings


def scan_logs(log_dir: Path, until: Mapping[str, int] | None = None) -> list[Finding]:
    """Every ``*.log`` in ``log_dir``; the router's is the one named ``router.log``.

    ``until`` maps a log's file name to the byte offset where teardown began: what follows
    is the harness stopping the processes (ranks losing rank 0), so it is not checked."""
    findings: list[Finding] = []
    for path in sorted(log_dir.glob("*.log")):
        data = path.read_bytes()
        if until and path.name in until:
            data = data[: until[path.name]]
        text = data.decode("utf-8", errors="replace")
        findings += scan_text(path.name, text, router=path.name == "router.log")
    return findings


def replica_split(records: Iterable[RequestRecord]) -> Counter[str]:
    """Measured requests per replica, as the responses named them (``?`` when they did not)."""
    return Counter(r.replica or "?" for r in records if not r.warmup)


def notes(
    findings: list[Finding], split: Mapping[str, int], replicas: int | None = None
) -> list[str]:
    """Readable notes for the report; says so explicitly when the logs are clean."""
    out = []
    if findings:
        for f in findings:
            out.append(f"log check: {f.count} x {f.kind} in {f.log} (first: {f.first!r})")
    else:
        kinds = ", ".join([*PATTERNS, "router health-check failures"])
        out.append(f"log check: no {kinds} found")
    if split:
        parts = ", ".join(f"{name}: {n}" for name, n in sorted(split.items()))
        out.append(f"requests per replica: {parts}")
        if replicas and len([k for k in split if k != "?"]) < replicas:
            out.append(f"only {len(split)} of {replicas} replicas served requests")
    return out
