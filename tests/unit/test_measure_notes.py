"""Data-quality notes computed from records (no processes)."""

from __future__ import annotations

import pytest

from pytest_kimi.results.records import RequestRecord
from pytest_kimi.run.notes import client_turnaround, prompt_length_notes, turnaround_notes


def _rec(i: int, prompt_tokens: int | None, warmup: bool = False) -> RequestRecord:
    return RequestRecord(i, f"p{i}", 16384, 512, prompt_tokens=prompt_tokens, warmup=warmup)


def test_prompts_within_ten_percent_give_no_note():
    records = [_rec(0, 16384), _rec(1, 16384 + 1638), _rec(2, None)]
    assert prompt_length_notes(records, 16384) == []


def test_prompts_beyond_ten_percent_are_counted_and_the_worst_named():
    records = [_rec(0, 16384), _rec(1, 14000), _rec(2, 20000), _rec(3, 9000, warmup=True)]
    [note] = prompt_length_notes(records, 16384)
    assert note.startswith("2 of 3 prompts differ from the nominal 16384")
    assert "worst: p2 with 20000" in note


def _timed(i: int, send: float, end: float | None, warmup: bool = False) -> RequestRecord:
    return RequestRecord(i, f"p{i}", 16384, 512, send_time=send, end_time=end, warmup=warmup)


def test_turnaround_pairs_each_freed_slot_with_the_next_send():
    # concurrency 2: sends at 0 and 0; ends at 10 and 12 free the slots of sends at 10.004
    # and 12.010; a warm-up is not part of the loop
    records = [_timed(-1, -5.0, -4.0, warmup=True), _timed(0, 0.0, 10.0), _timed(1, 0.0, 12.0),
               _timed(2, 10.004, 20.0), _timed(3, 12.010, 21.0)]  # fmt: skip
    assert client_turnaround(records, 2) == pytest.approx([0.004, 0.010])


def test_turnaround_note_gives_wall_and_cluster_time_on_the_mock():
    records = [_timed(0, 0.0, 10.0), _timed(1, 10.012, 20.0)]
    [note] = turnaround_notes(records, 1, time_scale=40)
    assert "median 12.0 ms, p95 12.0 ms wall over 1 sends" in note
    assert "at time scale 1:40 that is 0.48 s of cluster time" in note
    [real] = turnaround_notes(records, 1, time_scale=1)
    assert "cluster time" not in real
    assert turnaround_notes(records[:1], 1, time_scale=40) == []  # nothing followed


def test_a_mock_requests_timeout_is_scaled_but_never_under_two_wall_minutes():
    from pytest_kimi.run.measure import request_timeout

    assert request_timeout(1800, 1) == 1800  # a real cluster: as written
    assert request_timeout(1800, 200) == 120  # not 9 s: the clock may stand still that long
    assert request_timeout(36000, 20) == 1800  # scaled where that is longer
    assert request_timeout(30, 40) == 30  # never longer than the workload's own
