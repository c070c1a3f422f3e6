"""SPEED-Bench 16K -> 512 at concurrency 8, once per layout, judged against the SLOs.

``pytest tests/perf --layout=tp32,pp8`` brings up each layout's DP2 deployment (the mock
backend unless ``--cluster`` names a real one), runs the 40-request workload once, and each
test below is one verdict on that run: ``test_slo`` becomes one test item per layout and SLO
(``test_slo[tp32-ttft_p95]``). SLOs come from the cluster YAML (per cluster and per layout),
``--kimi-slo [LAYOUT:]NAME=VALUE`` and ``@pytest.mark.slo(...)``.
"""

from __future__ import annotations

from pytest_kimi.slo import evaluate


def test_every_request_succeeded(speedbench):
    summary = speedbench.summary
    assert summary.failed == 0, (
        f"{summary.failed} of {summary.total} requests failed on {speedbench.name}; "
        f"see {speedbench.result_dir}/records.jsonl"
    )
    assert summary.completed == summary.total > 0


def test_slo(speedbench, kimi_slos, kimi_slo_name):
    verdict = evaluate(kimi_slos[kimi_slo_name], speedbench.summary)
    assert verdict.passed, verdict.message()


def test_no_regression(speedbench, kimi_regression, kimi_regression_metric):
    """With --kimi-baseline: each gated metric must not be worse than the baseline by more than
    its threshold and beyond its bootstrap interval (--kimi-fail sets thresholds)."""
    judgement = kimi_regression(kimi_regression_metric)
    assert not judgement.regressed, judgement.message()


def test_workload(kimi_benchmark):
    """The workload's one run, recorded by pytest-benchmark (``--benchmark-autosave``)."""
    assert kimi_benchmark.summary is not None, kimi_benchmark.error
