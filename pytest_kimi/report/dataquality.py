"""Data-quality notes from logs and records: what the seed's author checked by hand.

Scans every node log and the router log for OOM, NCCL errors, Python tracebacks and
EngineDeadError, and the router log for health-check failures and timeouts; says how the
requests were split between replicas, by the replicas' own counters (real SGLang names no
replica per request, so the split is known in total, not per request). Pure functions over
text and counters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.results.replicacounters import ReplicaCounters

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


def _kinds(router: bool) -> dict[str, re.Pattern[str]]:
    kinds = dict(PATTERNS)
    if router:
        kinds["router health-check failure"] = ROUTER_HEALTH
    return kinds


def scan_lines(name: str, lines: Iterable[str], router: bool = False) -> list[Finding]:
    """Count each kind's matching lines, one line at a time (a log of any size, in constant
    memory); the first match of each kind is kept for the note."""
    kinds = _kinds(router)
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for raw in lines:
        line = ANSI.sub("", raw)
        for kind, pattern in kinds.items():
            if pattern.search(line):
                counts[kind] = counts.get(kind, 0) + 1
                first.setdefault(kind, line.strip()[:240])
    return [Finding(kind, name, counts[kind], first[kind]) for kind in kinds if kind in counts]


def scan_text(name: str, text: str, router: bool = False) -> list[Finding]:
    return scan_lines(name, text.splitlines(), router)


def _log_lines(path: Path, until: int | None) -> Iterator[str]:
    """The lines of ``path`` up to byte ``until`` (all of it when None), decoded leniently,
    read one at a time."""
    left = until
    with path.open("rb") as fh:
        for raw in fh:
            if left is not None:
                if left <= 0:
                    return
                raw = raw[:left]
                left -= len(raw)
            yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


def scan_logs(log_dir: Path, until: Mapping[str, int] | None = None) -> list[Finding]:
    """Every ``*.log`` in ``log_dir``, streamed line by line (a multi-gigabyte
    ``NCCL_DEBUG=INFO`` log is never held in memory); the router's is ``router.log``.

    ``until`` maps a log's file name to the byte offset where teardown began: what follows
    is the harness stopping the processes (ranks losing rank 0), so it is not checked."""
    findings: list[Finding] = []
    for path in sorted(log_dir.glob("*.log")):
        stop = until.get(path.name) if until else None
        lines = _log_lines(path, stop)
        findings += scan_lines(path.name, lines, router=path.name == "router.log")
    return findings


def replica_split(counters: Mapping[str, ReplicaCounters]) -> dict[str, int]:
    """Requests each replica finished during the measured run, by its ``/metrics`` counters
    (replicas whose counters could not be read are left out)."""
    return {name: c.requests for name, c in counters.items() if c.requests is not None}


BY_COUNTERS = (
    "by each replica's /metrics counters over the measured run: attribution is by counters, "
    "not per request"
)


def notes(
    findings: list[Finding],
    counters: Mapping[str, ReplicaCounters],
    replicas: int | None = None,
    succeeded: int | None = None,
    cached: int | None = None,
) -> list[str]:
    """Readable notes for the report; says so explicitly when the logs are clean.

    ``counters``: each replica's counters over the run (``LayoutResult.replica_counters``);
    ``succeeded``: requests the client saw succeed, to cross-check the counters' total;
    ``cached``: the measured records' cached prompt tokens (None: no server said), against
    the replicas' cache counters."""
    out = []
    if findings:
        for f in findings:
            out.append(f"log check: {f.count} x {f.kind} in {f.log} (first: {f.first!r})")
    else:
        kinds = ", ".join([*PATTERNS, "router health-check failures"])
        out.append(f"log check: no {kinds} found")
    return out + split_notes(counters, replicas, succeeded) + cache_notes(counters, cached)


def cache_notes(counters: Mapping[str, ReplicaCounters], cached: int | None) -> list[str]:
    """The replicas' prefix-cache hits over the run (``sglang:cached_tokens_total``), and
    whether they add up to what the responses said (``cached_tokens`` per request)."""
    known = {n: c.cached_tokens for n, c in counters.items() if c.cached_tokens is not None}
    if not known or (cached is None and not any(known.values())):
        return []
    parts = ", ".join(f"{name}: {n}" for name, n in sorted(known.items()))
    out = [f"prefix cache hits per replica (sglang:cached_tokens_total over the run): {parts}"]
    total = sum(known.values())
    if cached is None or len(known) < len(counters):
        return out
    if total == cached:
        out.append(f"the replicas' cache counters agree with the responses' cached_tokens "
                   f"({cached} tokens)")  # fmt: skip
    else:
        out.append(f"the replicas' cache counters total {total} cached tokens but the "
                   f"responses said {cached}: other traffic on these replicas, or requests "
                   "that finished after the client gave up")  # fmt: skip
    return out


def split_notes(
    counters: Mapping[str, ReplicaCounters], replicas: int | None, succeeded: int | None
) -> list[str]:
    """How the requests were split between replicas, by their counters, and whether that
    adds up to what the client saw."""
    if not counters:
        return []
    out = []
    split = replica_split(counters)
    unknown = sorted(name for name in counters if name not in split)
    if split:
        parts = ", ".join(f"{name}: {n}" for name, n in sorted(split.items()))
        out.append(f"requests per replica: {parts} ({BY_COUNTERS})")
        tokens = ", ".join(
            f"{name}: {c.prompt_tokens} prompt / {c.generation_tokens} generated"
            for name, c in sorted(counters.items())
            if c.prompt_tokens is not None and c.generation_tokens is not None
        )
        if tokens:
            out.append(f"tokens per replica (same counters): {tokens}")
        serving = sum(1 for n in split.values() if n > 0)
        if replicas and not unknown and serving < replicas:
            out.append(f"only {serving} of {replicas} replicas served requests")
        # a disaggregated layout's request finishes on a prefill server and on a decode one:
        # the decode servers' count is the requests served
        total = sum(n for name, n in split.items() if not name.startswith("prefill"))
        if succeeded is not None and not unknown and total != succeeded:
            out.append(
                f"the replicas' counters total {total} finished requests but the client saw "
                f"{succeeded} succeed: other traffic on these replicas, or requests that "
                "finished after the client gave up"
            )
    if unknown:
        out.append(
            "requests per replica unknown for " + ", ".join(unknown) + ": its /metrics "
            "counters could not be read (SGLang serves them with --enable-metrics)"
        )
    routed = {n: c.router_requests for n, c in counters.items() if c.router_requests is not None}
    if routed:
        parts = ", ".join(f"{name}: {n}" for name, n in sorted(routed.items()))
        out.append(f"router's attempts per worker (retries included, same run): {parts}")
    return out
