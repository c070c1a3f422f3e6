"""The history gate and its change points, on series whose truth is built in: a step at a
known run, a slow drift, one bad night, a change of versions. Each series is made here from
a seeded generator, so where a change is, and how large, is known before the gate looks."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from pytest_kimi.judge.history import History, RunRecord
from pytest_kimi.judge.history.__main__ import main
from pytest_kimi.judge.history.changes import K_NOISE, change_points, noise
from pytest_kimi.judge.history.gate import SeriesJudgement, Tonight, judge_series
from pytest_kimi.judge.history.store import ResultRecord, SeriesEntry, SeriesKey
from pytest_kimi.judge.history.trend import THROUGHPUT_FLOOR, Trend, limit_of

TPOT_THRESHOLD = 0.05


def run(n: int, **changed: str) -> RunRecord:
    base = RunRecord(
        run_id=f"night-{n:03d}", finished_at=f"2026-11-{1 + n % 28:02d}T01:00:00+00:00",
        cluster="c1", cluster_sha256="ab" * 32, backend="sglang", time_scale=1.0,
        git_commit="c0ffee", sglang="0.5.9", router="0.3.2", pytest_kimi="0.1.0",
        complete=True, incomplete=(), uid=f"uid-{n}",
    )  # fmt: skip
    return replace(base, **changed)


def nights(levels: list[float], spread: float, seed: int = 1) -> list[float]:
    """One figure per night: each night's level times run-to-run noise."""
    rng = np.random.default_rng(seed)
    return [level * (1 + spread * rng.standard_normal()) for level in levels]


def entries(values: list[float], **at: dict[str, str]) -> list[SeriesEntry]:
    """A history series; ``at`` maps ``n<index>`` to what changed from that run on."""
    out, changed = [], {}
    for n, value in enumerate(values):
        changed.update(at.get(f"n{n}", {}))
        out.append(SeriesEntry(run(n, **changed), value, _requests(value, n), {}))
    return out


def _requests(level: float, seed: int) -> list[float]:
    """40 requests around a night's level (5% spread)."""
    return list(np.random.default_rng(1000 + seed).normal(level, 0.05 * level, 40))


def tonight(value: float | None, n: int = 999, **changed: str) -> Tonight:
    samples = _requests(value, n) if value is not None else []
    return Tonight(run(n, **changed), value, samples)


def gate(values: list[float], now: float | None, **kwargs) -> SeriesJudgement:
    at = kwargs.pop("at", {})
    return judge_series("tp32", "tpot_mean", entries(values, **at), tonight(now, **kwargs),
                        TPOT_THRESHOLD)  # fmt: skip


def test_a_step_is_one_change_point_at_the_run_where_it_starts() -> None:
    values = nights([60.0] * 12 + [72.0] * 8, spread=0.01)
    [change] = change_points(values, higher_is_better=False, threshold=TPOT_THRESHOLD)
    assert change.index == 12 and change.direction == "worse"
    assert change.worse == pytest.approx(0.20, abs=0.03)


def test_one_bad_night_is_not_a_change_and_the_next_night_passes() -> None:
    values = nights([60.0] * 10, spread=0.01)
    values.insert(6, 90.0)  # a neighbour took the network for a night
    assert change_points(values, higher_is_better=False, threshold=TPOT_THRESHOLD) == []
    judgement = gate(values, nights([60.0], 0.01, seed=9)[0])
    assert not judgement.regressed, judgement.message()
    assert judgement.reference == pytest.approx(60.0, rel=0.02)  # the median ignores it


def test_a_step_tonight_fails_naming_tonight_and_what_changed() -> None:
    history = nights([60.0] * 10, spread=0.01)
    judgement = gate(history, 72.0, sglang="0.5.10")
    assert judgement.regressed and judgement.worse == pytest.approx(0.2, abs=0.02)
    assert judgement.start is not None and judgement.start.run_id == "night-999"
    message = judgement.message()
    assert message.startswith("REGRESSION: tp32 tpot_mean 72")
    assert "the change starts at this run (night-999)" in message
    assert "against run night-009 before it: SGLang 0.5.9 -> 0.5.10" in message


def test_a_held_regression_keeps_failing_naming_its_first_run_until_it_is_fixed() -> None:
    history = nights([60.0] * 10 + [72.0] * 3, spread=0.01)
    at = {"n10": {"git_commit": "bad1dea"}}
    still = gate(history, 72.5, at=at, git_commit="bad1dea")
    assert still.regressed and still.ongoing
    assert still.reference == pytest.approx(60.0, rel=0.02)  # the level before the change
    assert "starts at run night-010" in still.message()
    assert "commit c0ffee -> bad1dea" in still.message()
    fixed = gate(history, 60.3, at=at, git_commit="f1xed")
    assert not fixed.regressed, fixed.message()


def test_the_second_bad_night_names_the_first() -> None:
    history = [*nights([60.0] * 10, spread=0.01), 72.0]  # one bad night: no level yet
    judgement = gate(history, 72.4)
    assert judgement.regressed and not judgement.ongoing
    assert judgement.start is not None and judgement.start.run_id == "night-010"


def test_a_slow_drift_is_caught_once_it_adds_up_and_not_before() -> None:
    # 0.8% worse every night with 0.5% noise: no night is far from the one before it
    levels = [60.0 * 1.008**n for n in range(40)]
    values = nights(levels, spread=0.005, seed=4)
    first_fail = None
    for n in range(3, len(values)):
        judgement = gate(values[:n], values[n])
        if judgement.regressed:
            first_fail = (n, judgement)
            break
    assert first_fail is not None, "a 37% drift over 40 nights was never caught"
    n, judgement = first_fail
    drift = values[n] / values[0] - 1
    assert TPOT_THRESHOLD < drift < 3 * TPOT_THRESHOLD  # once it adds up, and not much later
    # no single night's step was as large as the threshold: a pair of nights never shows it
    steps = [b / a - 1 for a, b in pairwise(values[: n + 1])]
    assert max(steps) < TPOT_THRESHOLD


def test_quiet_nights_pass() -> None:
    values = nights([60.0] * 30, spread=0.02, seed=5)
    failed = [n for n in range(2, 30) if gate(values[:n], values[n]).regressed]
    assert failed == []


def test_the_throughput_limit_comes_from_the_spread() -> None:
    steady = [1000.0, 1004.0] * 6  # every night 0.4% from the one before
    sigma = 1.4826 * math.log(1004 / 1000) / math.sqrt(2)
    assert noise(steady) == pytest.approx(sigma)
    trend = Trend.of("tp32", "output_throughput", entries(steady), threshold=0.05)
    assert trend.limit == pytest.approx(max(THROUGHPUT_FLOOR, math.expm1(K_NOISE * sigma)))
    assert trend.limit < 0.05  # not the fixed threshold
    noisy = nights([1000.0] * 12, spread=0.04, seed=2)

    def judged(series: list[float]) -> SeriesJudgement:
        return judge_series("tp32", "output_throughput", entries(series), tonight(955.0),
                            threshold=0.05)  # fmt: skip

    # a 4.5% drop: beyond the steady history's spread, within the noisy one's
    assert judged(steady).regressed
    assert not judged(noisy).regressed, judged(noisy).message()
    assert judged(noisy).limit > 0.05


def test_a_latency_is_held_to_its_threshold_on_a_quiet_cluster() -> None:
    quiet = [60.0, 60.06] * 6  # 0.1% apart: K x the spread is far below the threshold
    assert limit_of("tpot_mean", TPOT_THRESHOLD, noise(quiet)) == TPOT_THRESHOLD
    assert not gate(quiet, 62.5).regressed  # 4% worse: under the 5% threshold
    assert gate(quiet, 63.5).regressed


def test_a_latency_change_inside_its_requests_noise_is_not_a_regression() -> None:
    history = [60.0, 60.06] * 6
    night = Tonight(run(999), 66.0, list(np.random.default_rng(0).normal(66.0, 60.0, 40)))
    judgement = judge_series("tp32", "tpot_mean", entries(history), night, TPOT_THRESHOLD)
    assert judgement.worse > judgement.limit  # 10% worse, but 40 requests spread +-100%
    assert judgement.ci is not None and judgement.ci[0] < 0
    assert not judgement.regressed


def test_the_first_night_and_a_night_without_the_metric() -> None:
    first = gate([], 60.0)
    assert not first.regressed and "first run of this experiment" in first.message()
    lost = gate([60.0, 61.0], None)
    assert lost.regressed and "was not measured tonight" in lost.message()


def _store(tmp_path: Path) -> History:
    store = History(tmp_path / "h.sqlite")
    values = nights([60.0] * 8 + [75.0] * 6, spread=0.01, seed=3)
    for n, value in enumerate(values):
        changed = {"sglang": "0.5.10"} if n >= 8 else {}
        metrics = {"tpot_mean": value, "ttft_p95": 9000.0 + n % 2, "output_throughput": None}
        store.append(run(n, **changed),
                     [ResultRecord("tp32", "c8", "exp1", {}, metrics,
                                   {"tpot": _requests(value, n)})])  # fmt: skip
    return store


def test_the_command_line_lists_every_change_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(tmp_path)
    assert main([str(store.path), "changes"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("c1  tp32-c8  tpot_mean: at run night-008 (")
    assert "worse" in line and "SGLang 0.5.9 -> 0.5.10" in line
    assert main([str(store.path), "changes", "--json"]) == 0
    [change] = json.loads(capsys.readouterr().out)
    assert (change["run_id"], change["previous_run_id"]) == ("night-008", "night-007")
    assert change["change"] == pytest.approx(0.25, abs=0.03)
    assert main([str(store.path), "changes", "--cluster", "other"]) == 2
    assert "no runs on cluster 'other'" in capsys.readouterr().err
    quiet = History(tmp_path / "quiet.sqlite")
    quiet.append(run(1), [ResultRecord("tp32", "", "exp1", {}, {"tpot_mean": 60.0}, {})])
    assert main([str(quiet.path), "changes"]) == 0
    assert capsys.readouterr().out.startswith("no change points")


def test_the_reports_trend_marks_the_change_and_the_noise_band(tmp_path: Path) -> None:
    from pytest_kimi.judge.history.trend import report_trends
    from pytest_kimi.report.plots import svg
    from pytest_kimi.report.trendplot import trend_caption, trend_figure

    store = _store(tmp_path)
    trends = report_trends(store, [SeriesKey("c1", "exp1", "tp32", "c8")],
                           {"tpot_mean": 0.05, "output_throughput": 0.05})  # fmt: skip
    [tpot] = trends  # no throughput was measured: no plot for it
    data = tpot["cases"]["tp32-c8"]
    assert len(data["values"]) == 14 and [c["index"] for c in data["changes"]] == [8]
    before, after = data["levels"]
    assert (before["start"], before["end"], after["start"], after["end"]) == (0, 8, 8, 14)
    low, high = after["band"]
    assert low < after["level"] < high  # the noise band around the level
    assert high / after["level"] == pytest.approx(math.exp(K_NOISE * data["noise"]))
    caption = trend_caption(tpot)
    assert "tp32-c8: 14 runs" in caption and "at run night-008" in caption
    assert "<svg" in svg(trend_figure(tpot))


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"gate": "history"}, "--kimi-gate history needs a history: --kimi-history PATH"),
        ({"gate": "baseline"}, "--kimi-gate baseline needs --kimi-baseline PATH"),
        ({"gate": "history", "history": Path("h.sqlite"), "baseline": Path("b.json")},
         "choose one gate"),
        ({"gate_since": "night-1"}, "--kimi-gate-since .* needs --kimi-gate history"),
    ],
)  # fmt: skip
def test_the_gate_options_are_checked_before_anything_starts(
    tmp_path: Path, given: dict, problem: str
) -> None:
    from pytest_kimi.config.inputs import UsageProblem, load_inputs
    from pytest_kimi.config.options import DEFAULT_CLUSTER, Options

    if "baseline" in given:
        (tmp_path / "b.json").write_text('{"format": 1, "layouts": {}}')
        given = {**given, "baseline": tmp_path / "b.json"}
    options = Options(DEFAULT_CLUSTER, (), tmp_path, **given)
    with pytest.raises(UsageProblem, match=problem):
        load_inputs(options, dry_run=True)


def test_a_history_gate_reads_its_history_from_the_cluster_file_too(tmp_path: Path) -> None:
    from pytest_kimi.config.inputs import load_inputs
    from pytest_kimi.config.options import DEFAULT_CLUSTER, Options

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(DEFAULT_CLUSTER.read_text() + "\nhistory: nightly.sqlite\n")
    inputs = load_inputs(Options(cluster, (), tmp_path, gate="history"), dry_run=True)
    assert inputs.gate == "history" and inputs.history_path == tmp_path / "nightly.sqlite"


def test_a_smaller_step_fails_on_its_second_night_naming_the_first() -> None:
    history = [58.8, 60.0, 61.2] * 6  # nights 2% apart: one night's limit 6.4%, two nights' 5%
    sigma = noise(history)
    assert limit_of("tpot_mean", TPOT_THRESHOLD, sigma) == pytest.approx(
        math.expm1(K_NOISE * sigma)) and math.expm1(K_NOISE * sigma) > 0.06  # fmt: skip
    assert limit_of("tpot_mean", TPOT_THRESHOLD, sigma, nights=2) == TPOT_THRESHOLD
    first = gate(history, 63.3)  # 5.5% worse than the level 60: within one night's limit
    assert not first.regressed, first.message()
    second = gate([*history, 63.3], 63.3)
    assert second.regressed and second.nights == 2, second.message()
    assert second.limit == TPOT_THRESHOLD
    assert "tonight and the night before" in second.message()
    assert second.start is not None and second.start.run_id == "night-018"
    # one such night, then a normal one: nothing
    assert not gate([*history, 63.3], 60.3).regressed


def test_a_regression_stays_failing_when_another_change_follows_it() -> None:
    quiet = nights([60.0] * 10, spread=0.01, seed=6)
    worse_again = [*quiet, *nights([72.0] * 6, 0.01, 7), *nights([85.0] * 6, 0.01, 8)]
    judgement = gate(worse_again, 72.3)  # back from 85 to 72: still 20% above 60
    assert judgement.regressed and judgement.ongoing, judgement.message()
    assert judgement.reference == pytest.approx(60.0, rel=0.02)
    assert judgement.start is not None and judgement.start.run_id == "night-010"
    partly_fixed = [*quiet, *nights([80.0] * 6, 0.01, 7), *nights([70.0] * 6, 0.01, 8)]
    assert gate(partly_fixed, 70.2).regressed  # 17% above 60 is not fixed
    assert not gate(partly_fixed, 60.4).regressed  # back at 60 is


def test_an_accepted_run_starts_every_later_series(tmp_path: Path) -> None:
    store = _store(tmp_path)  # tpot 60 for runs 0-7, 75 from run 8 on (SGLang 0.5.10)
    assert store.accepted("c1") is None

    def series() -> list[float | None]:
        since = store.accepted("c1")
        return [e.value for e in store.series("exp1", "tp32", "c8", "tpot_mean", cluster="c1",
                                              since=since.uid if since else None)]  # fmt: skip

    assert len(series()) == 14
    assert store.accept("night-008", note="SGLang 0.5.10 is slower, known").run_id == "night-008"
    accepted = series()
    assert len(accepted) == 6 and min(accepted) > 70  # the new level only
    assert main([str(store.path), "accept", "night-404"]) == 2  # no such run: said, exit 2


def test_the_noise_is_not_guessed_from_a_few_runs() -> None:
    assert noise([60.0, 60.5, 60.2, 60.9, 60.1]) is None  # four differences
    assert noise([60.0, 60.5, 60.2, 60.9, 60.1, 60.4]) is not None
    three = gate([60.0, 60.1, 59.9], 62.5)  # 4% worse, no spread known: the 5% threshold
    assert not three.regressed and three.noise is None and three.limit == TPOT_THRESHOLD


def test_at_a_confidence_tonight_is_passed_failed_or_undecided_against_its_level() -> None:
    history = [60.0, 60.06] * 6  # a quiet series: the 5% threshold is the limit

    def at(level: float, spread: float, seed: int) -> SeriesJudgement:
        requests = list(np.random.default_rng(seed).normal(level, spread * level, 40))
        return judge_series("tp32", "tpot_mean", entries(history), Tonight(run(999), level,
                            requests), TPOT_THRESHOLD, confidence=0.95)  # fmt: skip

    assert at(60.0, 0.05, 1).outcome == "passed"  # bounds within +-2%: under the limit
    slower = at(70.0, 0.05, 2)  # +17%: all of the bounds over 5%
    assert slower.outcome == "failed" and slower.regressed and slower.ci[0] > slower.limit
    near = at(63.0, 0.10, 3)  # +5%: the bounds straddle the limit
    assert near.ci[0] < near.limit < near.ci[1] and near.outcome == "undecided"
    assert near.message().startswith("UNDECIDED: tp32 tpot_mean") and "straddle" in near.message()
    assert not near.regressed
