"""Read the counters a measured run is checked against, over HTTP: the router's retry and
upstream counters (a failure the router hid by retrying is still seen), and each replica's
request and token counters (its rank 0's ``/metrics``) with the router's per-worker attempts.

Real SGLang names no replica per request, so these reads, after the warm-up and after the run,
are how the split between replicas is known (:mod:`pytest_kimi.results.replicacounters`). What
the text means is parsed there and in :mod:`pytest_kimi.report.routermetrics`; this module only
fetches it, and an endpoint that does not answer is read as unknown, never as an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections import Counter

    from pytest_kimi.results.replicacounters import Snapshot


def router_counters(url: str | None) -> Counter[tuple[str, str]] | None:
    """The router's retry and upstream counters now (None: not ours, or unreachable)."""
    if url is None:
        return None
    import httpx

    from pytest_kimi.report.routermetrics import counters
    from pytest_kimi.workload import http

    try:
        response = http.get(url, timeout=5.0)
        response.raise_for_status()
        return counters(response.text)
    except (httpx.HTTPError, ValueError):
        return None


def router_notes(url: str | None, before: Counter[tuple[str, str]] | None) -> list[str]:
    """What the router's counters say happened during the run (retries), from ``before`` and
    a read now; or why that could not be checked."""
    from pytest_kimi.report.routermetrics import notes

    if url is None:  # no router metrics to read (attached without --kimi-router-metrics)
        return []
    if before is None:
        return ["router metrics unavailable before the run: retries were not checked"]
    after = router_counters(url)
    if after is None:
        return ["router metrics unavailable after the run: retries were not checked"]
    return notes(before, after)


def _metrics_text(url: str) -> str | None:
    import httpx

    from pytest_kimi.workload import http

    try:
        response = http.get(url, timeout=5.0)
        response.raise_for_status()
        return response.text
    except httpx.HTTPError:
        return None


def snapshot(
    urls: Mapping[str, str], router_metrics_url: str | None, disaggregated: bool = False
) -> Snapshot:
    """Every replica's request/token counters and the router's per-worker attempts, now; a
    disaggregated layout's per-stage latencies and KV gauges too (only there do they exist)."""
    from pytest_kimi.results.pdstages import kv_gauges, stage_totals
    from pytest_kimi.results.replicacounters import (
        Snapshot,
        router_worker_totals,
        server_totals,
    )

    servers: dict[str, dict[str, float] | None] = {}
    stages: dict[str, dict[str, tuple[float, float]] | None] = {}
    kv: dict[str, dict[str, float] | None] = {}
    for name, url in urls.items():
        text = _metrics_text(url.rstrip("/") + "/metrics")
        try:
            servers[name] = None if text is None else server_totals(text)
            if disaggregated:
                stages[name] = None if text is None else stage_totals(text)
                kv[name] = None if text is None else kv_gauges(text)
        except ValueError:  # not Prometheus text
            servers[name] = stages[name] = kv[name] = None
    router_text = _metrics_text(router_metrics_url) if router_metrics_url and urls else None
    try:
        router = None if router_text is None else router_worker_totals(router_text)
    except ValueError:
        router_text, router = None, None
    return Snapshot(servers, router, router_read=router_text is not None, stages=stages, kv=kv)
