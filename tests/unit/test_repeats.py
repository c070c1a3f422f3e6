"""``--kimi-repeat``'s statistics: the between-run spread, the pooled summary, the gates' t
intervals, the report's table and the stored files. Reference values come from the standard
library's ``statistics`` and from scipy's own t tests, not from the code under test."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import math
import re
import statistics
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from scipy import stats

from pytest_kimi.config.inputs import UsageProblem, check_repeat
from pytest_kimi.config.options import Options
from pytest_kimi.judge.baseline import judge
from pytest_kimi.judge.history.gate import Tonight, judge_series
from pytest_kimi.judge.history.store import RunRecord, SeriesEntry
from pytest_kimi.report.betweenruns import between_rows, spread_lines
from pytest_kimi.report.comparison import build_comparison, render_markdown
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.repeats import WHOLE_RUN, change_interval, pooled, spread, spreads
from pytest_kimi.results.replicacounters import ReplicaCounters
from pytest_kimi.results.store import RunFolder
from pytest_kimi.run.deployed import Deployed
from pytest_kimi.run.measure import Target
from pytest_kimi.run.repeated import _ready, flush_caches
from pytest_kimi.workload.abort import Abort


def _records(ttft_s: float, start: float, repeat: int, n: int = 12) -> list[RequestRecord]:
    out = []
    for i in range(n):
        send = start + i * 0.5
        first = send + ttft_s * (1 + i / 40)
        chunks = [Chunk(first + k * 0.02, 1) for k in range(8)]
        out.append(RequestRecord(i, f"p{i}", 100, 8, send_time=send, first_token_time=first,
                                 end_time=chunks[-1].time, chunks=chunks, completion_tokens=8,
                                 success=True, repeat=repeat))  # fmt: skip
    return out


def _runs(ttfts: list[float]) -> tuple[list[RequestRecord], list]:
    """Each run's records (10 s apart) and summary."""
    records, summaries = [], []
    for r, ttft in enumerate(ttfts, 1):
        run = _records(ttft, start=100.0 * r, repeat=r)
        records += run
        summaries.append(summarize(run, percentiles=[50, 95]))
    return records, summaries


def test_a_spread_is_the_runs_mean_sd_cv_and_t_interval() -> None:
    values = [1210.0, 1290.0, 1260.0, 1330.0]
    s = spread(values, 0.95)
    assert s.mean == pytest.approx(statistics.mean(values))
    assert s.sd == pytest.approx(statistics.stdev(values))
    assert s.cv == pytest.approx(statistics.stdev(values) / statistics.mean(values))
    low, high = stats.t.interval(0.95, len(values) - 1, loc=statistics.mean(values),
                                 scale=stats.sem(values))  # fmt: skip
    assert (s.lower, s.upper) == (pytest.approx(low), pytest.approx(high))
    one = spread([5.0])
    assert one.mean == 5.0 and math.isnan(one.sd) and math.isnan(one.lower) and one.runs == 1


def test_the_t_interval_covers_the_true_mean_at_its_level() -> None:
    """3 runs a draw, 2,000 draws: the 95% interval holds the true mean ~95% of the time."""
    rng = np.random.default_rng(7)
    draws = (spread(list(rng.normal(100.0, 8.0, 3))) for _ in range(2000))
    covered = sum(s.lower <= 100.0 <= s.upper for s in draws)
    assert 0.935 <= covered / 2000 <= 0.965  # binomial sd at 95%: 0.5 points


def test_spreads_leave_out_a_metric_some_run_did_not_measure() -> None:
    _, summaries = _runs([0.8, 0.9, 1.0])
    got = spreads(summaries, ["ttft_p95", "output_throughput", "ttfat_mean", "nonsense"])
    assert set(got) == {"ttft_p95", "output_throughput"}  # no reasoning: TTFAT is NaN
    assert got["ttft_p95"].values == tuple(s.metric("ttft_p95") for s in summaries)


def test_the_pooled_summary_keeps_the_requests_and_averages_each_runs_own_figures() -> None:
    records, summaries = _runs([0.8, 0.9, 1.0])
    span = summarize(records, percentiles=[50, 95])  # runs 100 s apart: 200 s first to last
    assert span.duration_s == pytest.approx(sum(s.duration_s for s in summaries))  # no pauses
    pool = pooled(span, summaries)
    assert pool.completed == 36 and pool.ttft_ms == span.ttft_ms
    for attr in WHOLE_RUN[:5]:
        assert getattr(pool, attr) == pytest.approx(
            statistics.mean(getattr(s, attr) for s in summaries))


def test_welch_and_one_sample_intervals_agree_with_scipys_t_tests() -> None:
    ref, cur = [100.0, 104.0, 98.0], [110.0, 118.0, 113.0, 109.0]
    welch = stats.ttest_ind(cur, ref, equal_var=False).confidence_interval(0.9)
    low, high = change_interval(ref, cur, 0.9, worse_if_lower=False)
    base = statistics.mean(ref)
    assert (low, high) == (pytest.approx(welch.low / base), pytest.approx(welch.high / base))
    one = stats.ttest_1samp(cur, 100.0).confidence_interval(0.95)
    low, high = change_interval([100.0], cur, 0.95, worse_if_lower=False)
    assert (low, high) == (pytest.approx(one.low / 100 - 1), pytest.approx(one.high / 100 - 1))
    # a throughput: lower is worse, so the signs turn
    low, high = change_interval([100.0], cur, 0.95, worse_if_lower=True)
    assert (low, high) == (pytest.approx(1 - one.high / 100), pytest.approx(1 - one.low / 100))
    assert change_interval([1.0], [2.0], 0.95, False) is None  # no runs' spread on either side


def _entry(tput: list[float]) -> dict:
    return {"metrics": {"output_throughput": statistics.mean(tput)}, "samples": {},
            "runs": {"output_throughput": tput}}  # fmt: skip


def test_the_baseline_gate_judges_a_throughput_by_the_runs_spread() -> None:
    base = _entry([1000.0, 1010.0, 990.0])
    slower = _entry([850.0, 860.0, 845.0])  # 15% down, runs within 1%
    j = judge("tp32", "output_throughput", 0.05, base, slower, confidence=0.95)
    assert j.outcome == "failed" and j.interval[0] > 0.05 and j.runs == (3, 3)
    assert "between 3 and 3 runs" in j.message()
    same = judge("tp32", "output_throughput", 0.05, base, _entry([1005.0, 995.0, 1000.0]),
                 confidence=0.95)  # fmt: skip
    assert same.outcome == "passed"
    noisy = _entry([700.0, 1300.0, 880.0])  # 4% down on average, runs 30% apart
    j = judge("tp32", "output_throughput", 0.05, base, noisy, confidence=0.95)
    assert j.outcome == "undecided" and "more runs would decide it" in j.message()
    single = {"metrics": {"output_throughput": 850.0}, "samples": {}}
    assert judge("tp32", "output_throughput", 0.05, base, single).interval is not None


def _series(values: list[float]) -> list[SeriesEntry]:
    return [SeriesEntry(RunRecord(f"r{i}", "2026-12-01", "c", "sha", "mock", 1.0), v, (), {})
            for i, v in enumerate(values)]  # fmt: skip


def test_the_history_gate_judges_tonights_runs_by_their_spread() -> None:
    series = _series([1000.0, 1004.0, 996.0, 1002.0, 998.0, 1001.0])
    night = RunRecord("tonight", "2026-12-07", "c", "sha", "mock", 1.0)
    runs = (850.0, 858.0, 846.0)
    j = judge_series("tp32", "output_throughput", series,
                     Tonight(night, statistics.mean(runs), (), runs), 0.05,
                     confidence=0.95)  # fmt: skip
    assert j.outcome == "failed" and j.runs == 3 and j.ci is not None and j.ci[0] > 0.1
    assert "between 1 and 3 runs" in j.message()
    wide = (700.0, 1250.0, 1010.0)
    j = judge_series("tp32", "output_throughput", series,
                     Tonight(night, statistics.mean(wide), (), wide), 0.05,
                     confidence=0.95)  # fmt: skip
    assert j.outcome == "undecided"


def _repeated(name: str, ttfts: list[float]) -> LayoutResult:
    records, summaries = _runs(ttfts)
    result = LayoutResult(name, name.upper(), summarize(records, percentiles=[50, 95]),
                          records=records)  # fmt: skip
    result.repeats = summaries
    result.between_runs = spreads(summaries, result.summary.metric_names())
    result.summary = pooled(result.summary, summaries)
    return result


def test_the_report_pools_says_how_many_runs_and_shows_the_spread(tmp_path: Path) -> None:
    results = [_repeated("wide", [0.8, 0.9, 1.0]), _repeated("deep", [1.2, 1.1, 1.3])]
    model = build_comparison(results, run_id="r", backend="mock", time_scale=1.0)
    ttft = next(row for row in model["rows"] if row["metric"] == "ttft_p95")
    assert ttft["ci"]["deep"]["runs"] == [3, 3]
    rows = between_rows(model)
    [row] = [r for r in rows if r[:2] == ["ttft_p95", "wide"]]
    assert row[2] == "3" and row[3] == f"{results[0].between_runs['ttft_p95'].mean / 1000:.2f} s"
    text = render_markdown(model)
    assert "## Between runs" in text and "pooled over the runs: wide 3 runs, deep 3 runs" in text
    [line] = spread_lines("wide", results[0].between_runs, ["ttft_p95"])
    assert line.startswith("wide: ttft_p95 over 3 runs: mean ") and "CV " in line
    folder = RunFolder.create(tmp_path, "run")  # and it reads back as written
    for result in results:
        folder.write_records(result.name, result.records)
        folder.write_summary(result, "mock", 1.0)
    back = [folder.read_layout("wide"), folder.read_layout("deep")]
    assert back[0].runs == 3 and back[0].between_runs == results[0].between_runs
    live = build_comparison(results, run_id="r", backend="mock", time_scale=1.0)
    again = build_comparison(back, run_id="r", backend="mock", time_scale=1.0)
    assert json.dumps(again, sort_keys=True) == json.dumps(live, sort_keys=True)


def test_replica_counters_of_two_runs_add_up_and_an_unknown_stays_unknown() -> None:
    a = ReplicaCounters("http://r0", 20, 2000, 160, None, 0)
    b = dataclasses.replace(a, requests=21, router_requests=5)
    both = a.plus(b)
    assert (both.requests, both.prompt_tokens, both.router_requests) == (41, 4000, None)


# ----------------------------------------------------------------------------- between runs


class _Flush(http.server.BaseHTTPRequestHandler):
    """SGLang's /flush_cache as a busy server answers it: 400."""

    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        type(self).seen.append(self.path)
        self.send_response(400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_refused_cache_flush_is_a_note_and_the_run_goes_on() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flush)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        target = Target("http://127.0.0.1:9", replica_urls={"replica0": url, "replica1": url})
        notes = flush_caches(target, 2)
    finally:
        server.shutdown()
    assert _Flush.seen == ["/flush_cache", "/flush_cache"]  # each replica's rank 0
    assert len(notes) == 2 and notes[0].startswith(f"repeat 2: {url}/flush_cache answered HTTP 400")


def test_a_fresh_run_gets_a_deployment_that_served_no_run(tmp_path: Path) -> None:
    """The first run uses the deployment as it is; each later one, of this point or the next,
    brings it up again after the last one's files moved into the run it served; a failed
    bring-up trips the layout's abort, so no later point is sent to it."""
    folder = RunFolder.create(tmp_path, "run")
    deployed, notes, calls = Deployed(), ["bring-up note"], []
    deployed.aborts["deep"] = Abort()
    (folder.layout_dir("deep") / "logs" / "router.log").write_text("first deployment")

    def again(between) -> str:
        calls.append("down")
        notes.append("teardown note")
        between()
        return f"http://127.0.0.1:{len(calls)}"

    result = LayoutResult("deep", "DEEP", point="c8")
    ready = functools.partial(_ready, "deep", "c8", folder=folder, deployed=deployed,
                              redeploy=again, layout_notes=notes)  # fmt: skip
    assert ready(repeat=1, endpoint="http://first", result=result) == "http://first"
    assert calls == [] and deployed.served["deep"] == ("c8", 1)
    assert ready(repeat=2, endpoint="http://first", result=result) == "http://127.0.0.1:1"
    moved = tmp_path / "run" / "deep" / "c8" / "repeat-1" / "logs" / "router.log"
    assert moved.read_text() == "first deployment"
    assert notes == ["bring-up note", "deployment for repeat 2: teardown note"]

    def broken(between) -> str:
        raise RuntimeError("node n3 did not come up")

    with pytest.raises(RuntimeError):
        _ready("deep", "c8", 3, "http://x", result, folder, deployed, broken, notes)
    assert "repeat 3 failed: node n3 did not come up" in deployed.aborts["deep"].reason


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"repeat": 0}, "--kimi-repeat 0: give a number of runs"),
        ({"repeat_fresh": True}, "--kimi-repeat-fresh brings the layout up again"),
        ({"repeat": 2, "repeat_fresh": True, "endpoint": "http://127.0.0.1:9"},
         "an attached one (--kimi-endpoint) is not ours to restart"),
        ({"repeat": 2, "until_decided": 100}, "--kimi-repeat and --kimi-until-decided: choose"),
    ],
)  # fmt: skip
def test_repeat_options_that_cannot_work_are_usage_problems(given: dict, says: str) -> None:
    options = Options(Path("cluster.yaml"), ("deep",), Path("out"), **given)
    with pytest.raises(UsageProblem, match=re.escape(says)):
        check_repeat(options)
    check_repeat(Options(Path("cluster.yaml"), ("deep",), Path("out"), repeat=3))
