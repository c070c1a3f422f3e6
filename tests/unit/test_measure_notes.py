"""Data-quality notes computed from records (no processes)."""

from __future__ import annotations

from pytest_kimi.measure import prompt_length_notes
from pytest_kimi.workload.records import RequestRecord


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
