"""GPU telemetry: the sampler thread (with a fake executor), the figures, the file format."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.deploy.telemetry import Sampler, sampling
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.results.telemetry_stats import (
    GpuSample,
    TelemetrySeries,
    TelemetrySummary,
    integrate,
    node_curves,
    read_telemetry,
    summarize_telemetry,
)

NODES = [Node("a", "127.0.0.1", 2), Node("b", "127.0.0.1", 2)]


def _smi(util: float, power: str = "100.0") -> str:
    return "".join(
        f"{i}, GPU-{i}, Fake GPU, {util}, 1000, 80000, {power}, 1500, 580.1\n" for i in range(2)
    )


class FakeExecutor:
    """Answers each node's query from ``answer(node, call)``; ``rounds_done`` is set once
    every node has been asked ``wanted`` times."""

    def __init__(self, answer, wanted: int = 3) -> None:
        self.answer, self.wanted = answer, wanted
        self.calls: dict[str, int] = {}
        self.rounds_done = threading.Event()
        self._lock = threading.Lock()

    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]:
        with self._lock:
            call = self.calls[node.name] = self.calls.get(node.name, 0) + 1
            if min(self.calls.get(n.name, 0) for n in NODES) >= self.wanted:
                self.rounds_done.set()
        return self.answer(node, call)


def _sampler(executor, path: Path, **kw) -> Sampler:
    commands = {n.name: f"nvidia-smi --node {n.name}" for n in NODES}
    return Sampler(executor, NODES, commands, path, interval_s=0.01, **kw)


def test_sampler_writes_one_line_per_gpu_per_round_and_stops(tmp_path):
    executor = FakeExecutor(lambda node, call: (0, _smi(50.0)))
    sampler = _sampler(executor, tmp_path / "telemetry.jsonl", time_scale=40.0)
    sampler.start()
    assert executor.rounds_done.wait(10)
    sampler.stop()
    assert not sampler.alive
    rounds_written = sampler.rounds
    series = read_telemetry(tmp_path / "telemetry.jsonl")
    assert series.time_scale == 40.0 and series.nodes == ("a", "b")
    assert len(series.samples) == 4 * rounds_written  # 2 nodes x 2 GPUs
    assert {(s.node, s.gpu) for s in series.samples} == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    first = series.samples[0]
    assert (first.util_pct, first.power_w, first.mem_total_mib, first.sm_clock_mhz) == (
        50.0, 100.0, 80000.0, 1500.0,
    )  # fmt: skip
    times = sorted({s.t for s in series.samples})
    assert times[0] >= 0 and times == sorted(times)
    assert sampler.notes() == []
    assert sum(executor.calls.values()) == 2 * rounds_written  # nothing after stop


def test_a_failing_node_is_written_once_and_noted_and_sampling_goes_on(tmp_path):
    def answer(node, call):
        if node.name == "b":
            raise OSError("node b stopped answering")
        return 0, _smi(10.0)

    executor = FakeExecutor(answer)
    sampler = _sampler(executor, tmp_path / "t.jsonl")
    sampler.start()
    assert executor.rounds_done.wait(10)
    sampler.stop()
    series = read_telemetry(tmp_path / "t.jsonl")
    assert series.errors == {"b": "OSError: node b stopped answering"}
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert sum("error" in json.loads(x) for x in lines) == 1  # once, not every round
    assert {s.node for s in series.samples} == {"a"}
    [note] = sampler.notes()
    rounds = sampler.rounds
    assert note == (
        f"telemetry: node b failed {rounds} of {rounds} samples: OSError: node b stopped answering"
    )


def test_unreadable_answers_and_exit_codes_count_as_failures(tmp_path):
    answers = {"a": (0, "not, csv\n"), "b": (9, "nvidia-smi: command not found")}
    executor = FakeExecutor(lambda node, call: answers[node.name])
    sampler = _sampler(executor, tmp_path / "t.jsonl")
    sampler.start()
    assert executor.rounds_done.wait(10)
    sampler.stop()
    notes = sampler.notes()
    assert len(notes) == 2
    assert "node a failed" in notes[0] and "fields, expected 9" in notes[0]
    assert "node b failed" in notes[1] and "exit 9: nvidia-smi: command not found" in notes[1]


def test_sampling_stops_the_thread_when_the_run_raises(tmp_path):
    executor = FakeExecutor(lambda node, call: (0, _smi(70.0)), wanted=1)
    sampler = _sampler(executor, tmp_path / "t.jsonl")
    result = LayoutResult("x", "X")
    before = set(threading.enumerate())  # other tests of this worker may have their own
    with pytest.raises(KeyboardInterrupt), sampling(sampler, result):
        assert executor.rounds_done.wait(10)
        raise KeyboardInterrupt
    assert not sampler.alive
    assert not [t for t in set(threading.enumerate()) - before if t.name == "kimi-telemetry"]
    assert result.telemetry is None  # no measured request: no figures, and no crash


def test_sampling_puts_the_figures_of_the_measured_span_on_the_result(tmp_path):
    clock = iter(float(x) for x in range(10_000))  # every reading one second later
    executor = FakeExecutor(lambda node, call: (0, _smi(20.0 * call)), wanted=4)
    sampler = _sampler(executor, tmp_path / "t.jsonl", clock=lambda: next(clock))
    result = LayoutResult("x", "X")
    with sampling(sampler, result):
        assert executor.rounds_done.wait(10)
        origin = sampler.origin
        result.records = [
            RequestRecord(0, "w", 1, 1, send_time=origin, end_time=origin + 0.5, warmup=True,
                          success=True, completion_tokens=1),
            RequestRecord(1, "m", 1, 8, send_time=origin + 1.0, end_time=origin + 1000.0,
                          success=True, completion_tokens=8),
        ]  # fmt: skip
    summary = result.telemetry
    assert summary is not None and summary.rounds >= 2 and summary.gpus == 4
    assert summary.power_mean_w == 400.0 and summary.power_peak_w == 400.0  # 4 GPUs x 100 W
    assert summary.energy_j is not None and summary.energy_per_output_token_j is not None
    assert summary.energy_per_output_token_j == pytest.approx(summary.energy_j / 8)
    series = read_telemetry(tmp_path / "t.jsonl")
    assert series.measured is not None and series.measured[0] == 1.0  # warm-up excluded


def _series(rounds: dict[float, dict[str, list[tuple[float, float | None]]]]) -> TelemetrySeries:
    """{t: {node: [(util, power) per GPU]}} as a series."""
    samples = [
        GpuSample(t, node, i, util_pct=u, power_w=p)
        for t, nodes in rounds.items()
        for node, gpus in nodes.items()
        for i, (u, p) in enumerate(gpus)
    ]
    return TelemetrySeries(0.0, 1.0, 1.0, ("a", "b"), samples)


def test_integration_is_trapezoidal_over_uneven_intervals_and_holds_the_ends():
    assert integrate([0, 1, 3], [10, 20, 20], 0, 3) == 15 + 40
    # from 0.5 (interpolated 15) to 4 (held at 20 after the last sample)
    assert integrate([0, 1, 3], [10, 20, 20], 0.5, 4) == pytest.approx(8.75 + 40 + 20)
    assert integrate([5], [100], 0, 2) == 200  # one sample: held flat
    assert integrate([], [], 0, 2) == 0


def test_figures_over_the_measured_span():
    series = _series({
        0.0: {"a": [(0, 50), (0, 50)], "b": [(0, 50), (0, 50)]},  # warm-up: outside the span
        2.0: {"a": [(100, 300), (50, 200)], "b": [(50, 200), (0, 100)]},
        5.0: {"a": [(100, 300), (100, 300)], "b": [(100, 300), (100, 300)]},
        9.0: {"a": [(0, 50), (0, 50)], "b": [(0, 50), (0, 50)]},  # after the run
    })  # fmt: skip
    summary = summarize_telemetry(series, (1.0, 6.0), output_tokens=100)
    assert summary.rounds == 2 and summary.gpus == 4
    assert summary.gpu_util_mean == pytest.approx((200 + 400) / 8)
    assert summary.gpu_util_peak == 100.0  # round at 5.0: every GPU at 100
    assert summary.power_mean_w == (800 + 1200) / 2 and summary.power_peak_w == 1200
    # total power: 200 W at 0, 800 at 2, 1200 at 5, 200 at 9; integrate over [1, 6]
    expected = integrate([0, 2, 5, 9], [200, 800, 1200, 200], 1.0, 6.0)
    assert summary.energy_j == pytest.approx(expected)
    assert summary.energy_per_output_token_j == pytest.approx(expected / 100)


def test_no_energy_unless_power_is_known_in_every_round():
    no_power = _series({
        2.0: {"a": [(10, 100), (10, None)], "b": [(10, 100), (10, 100)]},
        4.0: {"a": [(10, 100), (10, 100)], "b": [(10, 100), (10, 100)]},
    })  # fmt: skip
    summary = summarize_telemetry(no_power, (1.0, 5.0), output_tokens=10)
    assert summary.energy_j is None and summary.energy_per_output_token_j is None
    assert summary.power_mean_w == 400  # the complete round still counts for mean and peak
    missing_node = _series({3.0: {"a": [(10, 100), (10, 100)]}})  # b did not answer
    summary = summarize_telemetry(missing_node, (1.0, 5.0), output_tokens=10)
    assert summary.energy_j is None and summary.power_mean_w is None
    assert summary.gpu_util_mean == 10.0


def test_summary_round_trips_and_node_curves_shift_to_the_timeline():
    summary = TelemetrySummary(41.5, 99.0, 1234.5, 2000.0, 1e6, 3.25, rounds=7, gpus=64)
    assert TelemetrySummary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary
    series = _series({3.0: {"a": [(20, 100), (60, 150)], "b": [(0, 10), (0, None)]}})
    curves = node_curves(series, shift=1.0)
    assert curves["a"].t == [2.0] and curves["a"].util_mean == [40.0]
    assert (curves["a"].util_min, curves["a"].util_max, curves["a"].power_w) == (
        [20], [60], [250.0],
    )  # fmt: skip
    assert curves["b"].power_w[0] != curves["b"].power_w[0]  # NaN: a GPU gave no power


def test_a_telemetry_file_that_cannot_be_written_is_a_note_not_a_failure(tmp_path):
    executor = FakeExecutor(lambda node, call: (0, _smi(1.0)))
    sampler = _sampler(executor, tmp_path / "missing" / "t.jsonl")
    result = LayoutResult("x", "X")
    with sampling(sampler, result) as running:
        assert running is None
    assert not sampler.alive and executor.calls == {}
    [note] = result.notes
    assert note.startswith("telemetry: not sampled: FileNotFoundError")
