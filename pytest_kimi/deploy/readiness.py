"""Readiness probes for a bring-up: does a server answer, does the router count every replica.

A probe asks once and says whether the thing is ready, and if not, why (the last reason is
what a bring-up error shows). :func:`wait_ready` repeats a probe until it passes or a deadline
passes, running a check between attempts (the deployment's "has any process exited?"), so a
crashed server fails the bring-up at once rather than at the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

Probe = Callable[[httpx.Client], tuple[bool, str]]  # -> (ready, why not)


def answers_200(url: str) -> Probe:
    """Ready when ``GET url`` answers 200 (a server's ``/health``, ``/get_model_info``)."""

    def probe(http: httpx.Client) -> tuple[bool, str]:
        try:
            response = http.get(url)
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        return response.status_code == 200, f"HTTP {response.status_code}"

    return probe


def router_counts(url: str, want: int) -> Probe:
    """Ready when the router's ``/readiness`` (``url``) answers 200 and counts at least
    ``want`` healthy workers."""

    def probe(http: httpx.Client) -> tuple[bool, str]:
        try:
            response = http.get(url)
            body = response.json() if response.content else {}
            healthy = int(body.get("healthy_workers", 0)) if isinstance(body, dict) else 0
        except (httpx.HTTPError, ValueError) as exc:
            return False, type(exc).__name__
        if response.status_code == 200 and healthy >= want:
            return True, ""
        return False, f"HTTP {response.status_code}, {healthy}/{want} workers healthy"

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
    ``time.monotonic()`` is past ``deadline`` (the probe's last reason)."""
    while True:
        between()
        ready, why = probe(http)
        if ready:
            return None
        if time.monotonic() > deadline:
            return why
        time.sleep(poll_s)
