"""What the SGLang Router did during the run, from its Prometheus counters.

The router retries a worker's 5xx (and connection errors) on another worker, up to
``--retry-max-retries`` times. The client then sees a success whose latency includes the failed
attempt and the back-off: nothing in the response says so. Reading the router's counters before
and after the measured run tells the reader how many requests were retried and what the
workers answered. Pure functions over the metrics text; the session does the scraping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

RETRIES = "smg_worker_retries_total"
UPSTREAM = "smg_router_upstream_responses_total"
WORKER_ERRORS = "smg_worker_errors_total"
KNOWN = (RETRIES, UPSTREAM, WORKER_ERRORS)


def counters(text: str) -> Counter[tuple[str, str]]:
    """``(sample name, detail) -> value`` for the counters this module reads; ``detail`` is the
    upstream status code or the worker error type, empty for retries."""
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == RETRIES:
                out[(RETRIES, "")] += sample.value
            elif sample.name == UPSTREAM:
                out[(UPSTREAM, sample.labels.get("status_code", "?"))] += sample.value
            elif sample.name == WORKER_ERRORS:
                out[(WORKER_ERRORS, sample.labels.get("error_type", "?"))] += sample.value
    return out


def notes(
    before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]
) -> list[str]:
    """Data-quality notes for the run between two scrapes; none when nothing went wrong.
    When ``after`` holds none of the counters we read (another router's names, an export
    turned off), that is said plainly: "no retries counted" would be a guess."""
    if not any(name in KNOWN for name, _ in after):
        return [
            "router metrics unavailable: its /metrics has none of the counters we read ("
            + ", ".join(KNOWN)
            + "): retries and worker errors during the run are unknown"
        ]
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    retries = int(delta.get((RETRIES, ""), 0))
    bad = {
        status: int(n)
        for (name, status), n in sorted(delta.items())
        if name == UPSTREAM and n > 0 and not status.startswith("2")
    }
    errors = {
        kind: int(n) for (name, kind), n in sorted(delta.items()) if name == WORKER_ERRORS and n > 0
    }
    if not retries and not bad and not errors:
        return []
    parts = [f"router retried {retries} request(s) on another worker"]
    if bad:
        parts.append("workers answered " + ", ".join(f"HTTP {s} x{n}" for s, n in bad.items()))
    if errors:
        parts.append("worker errors " + ", ".join(f"{k} x{n}" for k, n in errors.items()))
    return [
        "; ".join(parts)
        + " during the run: a retried request counts as a success but its latency includes "
        "the failed attempt and the back-off"
    ]
