"""Readiness probes for a bring-up: does a server answer, does the router count every replica.

A probe asks once and says whether the thing is ready, and if not, why (the last reason is
what a bring-up error shows). :func:`wait_ready` repeats a probe until it passes or a deadline
passes, running a check between attempts (the deployment's "has any process exited?"), so a
crashed server fails the bring-up at once rather than at the deadline.

A router that answers in a shape we do not understand is a different thing from one that is
not ready yet: waiting cannot fix it, so the probe raises :class:`FormatError` and the
bring-up fails at once, naming the router's version.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

Probe = Callable[[httpx.Client], tuple[bool, str]]  # -> (ready, why not)

# The router releases whose /readiness answer ({"status", "healthy_workers", "total_workers"})
# and Prometheus names (``smg_*``: report/routermetrics.py) we have read against a live router:
# pytest_kimi.config.versions.ROUTER_PACKAGES (smg 1.x, sglang-router 0.3.x; our tests bring the
# real routers up in front of the mock servers, so mock and real runs use the same router). Older
# routers (0.1/0.2) named their metrics ``sgl_router_*``.

# Prefix of every metric family smg and sglang-router 0.3.x export ("sglang model gateway").
ROUTER_METRIC_PREFIX = "smg_"


class FormatError(RuntimeError):
    """The server answered, but not in a shape we understand (a version we do not support)."""


def answers_200(url: str) -> Probe:
    """Ready when ``GET url`` answers 200 (a server's ``/health``, ``/get_model_info``)."""

    def probe(http: httpx.Client) -> tuple[bool, str]:
        try:
            response = http.get(url)
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        return response.status_code == 200, f"HTTP {response.status_code}"

    return probe


def readiness_count(status: int, body: bytes) -> int | None:
    """Healthy workers in a router ``/readiness`` answer, None when it says "not ready".

    smg 1.x and sglang-router 0.3.x answer 200 ``{"status": "ready", "healthy_workers": N,
    "total_workers": N}`` and, until enough workers are healthy, 503 ``{"status": "not ready",
    "reason": "..."}`` (seen on smg 1.13 and 0.3.2). Raises :class:`FormatError` for anything
    we cannot read that way: no such endpoint (404/405), a 200 without an integer
    ``healthy_workers``, a 503 JSON answer without ``status``. Other answers that are not JSON
    (a proxy's error page while the router starts) are "not ready yet"."""
    import json

    if status in (404, 405):
        raise FormatError(f"/readiness answered HTTP {status}: the router has no such endpoint")
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if status == 200:
        healthy = doc.get("healthy_workers") if isinstance(doc, dict) else None
        if isinstance(healthy, int) and not isinstance(healthy, bool):
            return healthy
        raise FormatError(
            f"/readiness answered HTTP 200 with {_short(doc, body)}; expected a JSON object with "
            'an integer "healthy_workers" (smg 1.x and sglang-router 0.3.x: '
            '{"status": "ready", "healthy_workers": N, "total_workers": N})'
        )
    if doc is not None and not (isinstance(doc, dict) and isinstance(doc.get("status"), str)):
        raise FormatError(
            f"/readiness answered HTTP {status} with {_short(doc, body)}; expected a JSON object "
            'with a "status" (smg and sglang-router: {"status": "not ready", "reason": "..."})'
        )
    return None


def router_counts(url: str, want: int) -> Probe:
    """Ready when the router's ``/readiness`` (``url``) answers 200 and counts at least
    ``want`` healthy workers; an answer in another shape raises :class:`FormatError`."""

    def probe(http: httpx.Client) -> tuple[bool, str]:
        try:
            response = http.get(url)
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        healthy = readiness_count(response.status_code, response.content)
        if healthy is not None and healthy >= want:
            return True, ""
        return False, f"HTTP {response.status_code}, {healthy or 0}/{want} workers healthy"

    return probe


def metric_families(text: str) -> list[str]:
    """The family names in a Prometheus text answer; :class:`FormatError` if it does not parse
    as Prometheus text, or holds no family named the way smg and sglang-router 0.3.x name them."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        names = sorted({family.name for family in text_string_to_metric_families(text)})
    except (ValueError, TypeError, IndexError) as exc:
        raise FormatError(f"/metrics is not Prometheus text ({exc}): {text[:200]!r}") from None
    if not any(name.startswith(ROUTER_METRIC_PREFIX) for name in names):
        seen = ", ".join(names[:8]) or "no metrics at all"
        raise FormatError(
            f"/metrics has no {ROUTER_METRIC_PREFIX}* metric (smg and sglang-router 0.3.x name "
            f"them smg_worker_health, smg_http_requests_total, ...); it has: {seen}"
        )
    return names


def router_metrics_known(url: str) -> Probe:
    """Ready when the router's Prometheus endpoint answers 200 with metrics we can read (the
    retry counters after the run come from there); another shape raises :class:`FormatError`."""

    def probe(http: httpx.Client) -> tuple[bool, str]:
        try:
            response = http.get(url)
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        if response.status_code != 200:
            return False, f"HTTP {response.status_code}"
        metric_families(response.text)
        return True, ""

    return probe


def wait_ready(
    http: httpx.Client,
    probe: Probe,
    *,
    deadline: float,
    poll_s: float,
    between: Callable[[], None],
) -> str | None:
    """Run ``between()`` then ``probe`` every ``poll_s`` until the probe passes (None) or
    ``time.monotonic()`` is past ``deadline`` (the probe's last reason). A probe's
    :class:`FormatError` propagates at once."""
    while True:
        between()
        ready, why = probe(http)
        if ready:
            return None
        if time.monotonic() > deadline:
            return why
        time.sleep(poll_s)


def _short(doc: object, body: bytes) -> str:
    """At most 200 characters of what was answered, for an error message."""
    import json

    text = json.dumps(doc) if doc is not None else f"a body that is not JSON: {body[:200]!r}"
    return text if len(text) <= 200 else text[:200] + "..."
