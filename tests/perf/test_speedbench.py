"""SPEED-Bench 16K -> 512 at concurrency 8, once per layout, judged against the SLOs.

``pytest tests/perf --layout=tp32,pp8`` brings up each layout's DP2 deployment (the mock
backend unless ``--cluster`` names a real one), runs the 40-request workload once, and each
test below is one verdict on that run: ``test_slo`` becomes one test item per layout and SLO
(``test_slo[tp32-ttft_p95]``). SLOs come from the cluster YAML (per cluster and per layout),
``--kimi-slo [LAYOUT:]NAME=VALUE`` and ``@pytest.mark.slo(...)``.
"""

from __future__ import annotations

import pytest

# Failures are one readable line (what was measured, the limit, where to look), never a repr.


def _measured(result):
    """The layout's summary, or a one-line failure saying why there is none."""
    if result.summary is None:
        first = (result.error or "no summary").splitlines()[0]
        pytest.fail(f"{result.name} was not measured: {first}; see {result.result_dir}",
                    pytrace=False)  # fmt: skip
    return result.summary


def test_every_request_succeeded(speedbench):
    summary = _measured(speedbench)
    if summary.failed or summary.completed == 0:
        pytest.fail(
            f"{summary.failed} of {summary.total} requests failed on {speedbench.name}; "
            f"see {speedbench.result_dir}/records.jsonl",
            pytrace=False,
        )


def test_slo(speedbench, kimi_verdict, kimi_slo_name, kimi_undecided):
    """One SLO on the layout's run. With ``--kimi-confidence`` its bounds decide: an undecided
    verdict fails the test unless ``--kimi-undecided`` says pass or xfail."""
    _measured(speedbench)
    verdict = kimi_verdict(kimi_slo_name)
    message = f"{speedbench.name}: {verdict.message()}; see {speedbench.result_dir}"
    if verdict.outcome == "failed" or (verdict.outcome, kimi_undecided) == ("undecided", "fail"):
        pytest.fail(message, pytrace=False)
    if verdict.outcome == "undecided" and kimi_undecided == "xfail":
        pytest.xfail(message)


def test_no_regression(speedbench, kimi_regression, kimi_regression_metric, kimi_undecided):
    """With --kimi-baseline: each gated metric must not be worse than the baseline by more than
    its threshold and beyond its bootstrap interval (--kimi-fail sets thresholds). With
    ``--kimi-confidence`` an undecided change fails unless ``--kimi-undecided`` says otherwise."""
    judgement = kimi_regression(kimi_regression_metric)
    message = f"{judgement.message()}; see {speedbench.result_dir}"
    outcome = judgement.outcome
    if outcome == "failed" or (outcome, kimi_undecided) == ("undecided", "fail"):
        pytest.fail(message, pytrace=False)
    if outcome == "undecided" and kimi_undecided == "xfail":
        pytest.xfail(message)


def test_workload(kimi_benchmark):
    """The workload's one run, recorded by pytest-benchmark (``--benchmark-autosave``). A run
    in which no request succeeded measured nothing: its figures are not a benchmark."""
    summary = _measured(kimi_benchmark)
    if summary.completed == 0:
        pytest.fail(
            f"{kimi_benchmark.name}: no request succeeded ({summary.failed} failed), so the "
            f"workload measured nothing; see {kimi_benchmark.result_dir}/records.jsonl",
            pytrace=False,
        )


def test_max_concurrency(kimi_max_concurrency, kimi_layout, record_property):
    """With --kimi-find-max-concurrency: the layout meets every SLO at some concurrency of the
    searched range; the highest such level is in the report's verdict table."""
    search = kimi_max_concurrency
    record_property("max_concurrency", search.max_concurrency)
    if search.incomplete:
        pytest.fail(f"{kimi_layout.name}: the search has no answer: {search.incomplete}",
                    pytrace=False)  # fmt: skip
    if search.max_concurrency is None:
        pytest.fail(
            f"{kimi_layout.name}: no concurrency in {search.low}..{search.high} meets every SLO; "
            f"at {search.low} it fails {', '.join(search.failed_slos)}",
            pytrace=False,
        )
