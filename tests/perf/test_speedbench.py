"""SPEED-Bench 16K -> 512 at concurrency 8, once per layout, judged against the SLOs.

``pytest tests/perf --layout=tp32,pp8`` brings up each layout's DP2 deployment (the mock
backend unless ``--cluster`` names a real one), runs the 40-request workload once, and
each test below is one verdict on that run. SLO limits come from the cluster YAML and
``--kimi-slo NAME=VALUE``.
"""

from __future__ import annotations

from pytest_kimi.slo import evaluate


def test_every_request_succeeded(speedbench):
    summary = speedbench.summary
    failed = summary.failed
    assert failed == 0, (
        f"{failed} of {summary.total} requests failed on {speedbench.name}; "
        f"see {speedbench.result_dir}/records.jsonl"
    )
    assert summary.completed == summary.total > 0


def test_ttft_p95_within_slo(speedbench, kimi_slo):
    verdict = evaluate(kimi_slo("ttft_p95"), speedbench.summary)
    assert verdict.passed, verdict.message()


def test_tpot_p95_within_slo(speedbench, kimi_slo):
    verdict = evaluate(kimi_slo("tpot_p95"), speedbench.summary)
    assert verdict.passed, verdict.message()


def test_tpot_mean_within_slo(speedbench, kimi_slo):
    verdict = evaluate(kimi_slo("tpot_mean"), speedbench.summary)
    assert verdict.passed, verdict.message()
