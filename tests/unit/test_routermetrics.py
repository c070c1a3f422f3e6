"""Router retries and upstream errors, read from the router's own Prometheus counters."""

from __future__ import annotations

from pytest_kimi.report.routermetrics import counters, notes

# as sglang-router 0.3.x exports them (trimmed), after 6 requests, 6 of them retried
AFTER = """\
# HELP smg_worker_retries_total Total retries
# TYPE smg_worker_retries_total counter
smg_worker_retries_total{worker_type="regular",endpoint="generate"} 6
smg_router_upstream_responses_total{router_type="http",status_code="200",error_code=""} 6
smg_router_upstream_responses_total{router_type="http",status_code="500",error_code=""} 6
smg_worker_errors_total{worker_type="regular",connection_mode="http",error_type="backend_error"} 6
smg_http_responses_total{status_code="200",error_code=""} 7
smg_worker_retry_backoff_seconds_sum{attempt="1"} 0.236
"""
BEFORE = """\
smg_router_upstream_responses_total{router_type="http",status_code="200",error_code=""} 2
"""


def test_counters_read_retries_statuses_and_errors_only():
    got = counters(AFTER)
    assert got == {
        ("smg_worker_retries_total", ""): 6,
        ("smg_router_upstream_responses_total", "200"): 6,
        ("smg_router_upstream_responses_total", "500"): 6,
        ("smg_worker_errors_total", "backend_error"): 6,
    }


def test_retries_during_the_run_become_one_note_with_the_statuses():
    [note] = notes(counters(BEFORE), counters(AFTER))
    assert note.startswith(
        "router retried 6 request(s) on another worker; workers answered HTTP 500 x6; "
        "worker errors backend_error x6 during the run"
    )
    assert "latency includes the failed attempt" in note


def test_a_clean_run_has_no_note_even_with_earlier_failures():
    # failures before the run (e.g. during bring-up) are in both scrapes: no delta, no note
    assert notes(counters(AFTER), counters(AFTER)) == []
    assert notes(counters(BEFORE), counters(BEFORE.replace("} 2", "} 42"))) == []  # only 200s
