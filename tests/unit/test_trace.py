"""Mooncake-format traces: rows checked where they are, blocks turned into shared text, and
arrivals at the trace's own times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.workload.rows import DatasetError
from pytest_kimi.workload.specs import ClientOptions, due_offsets
from pytest_kimi.workload.trace import (
    BLOCK_TOKENS,
    load_trace,
    read_arrivals,
    read_trace,
    trace_requests,
)

ROWS = [
    {"timestamp": 1000, "input_length": 1200, "output_length": 16, "hash_ids": [1, 2, 3]},
    {"timestamp": 1500, "input_length": 700, "output_length": 8, "hash_ids": [1, 4]},
    {"timestamp": 1500, "input_length": 512, "output_length": 4, "hash_ids": [5]},
    {"timestamp": 4000, "input_length": 1100, "output_length": 32, "hash_ids": [1, 2, 6]},
]


def _trace(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_equal_block_ids_become_equal_text_and_lengths_are_the_rows(tmp_path: Path):
    requests = trace_requests(read_trace(_trace(tmp_path, ROWS)))
    words = [r.text.split() for r in requests]
    assert [len(w) for w in words] == [r["input_length"] for r in ROWS]
    assert words[0][:BLOCK_TOKENS] == words[1][:BLOCK_TOKENS] == words[3][:BLOCK_TOKENS]
    assert words[0][: 2 * BLOCK_TOKENS] == words[3][: 2 * BLOCK_TOKENS]  # blocks 1, 2
    assert words[0][BLOCK_TOKENS:600] != words[1][BLOCK_TOKENS:600]  # block 2 vs block 4
    assert words[2][:50] != words[0][:50]  # block 5 shares nothing
    assert [r.output_len for r in requests] == [16, 8, 4, 32]
    assert [r.nominal_tokens for r in requests] == [1200, 700, 512, 1100]
    assert trace_requests(read_trace(_trace(tmp_path, ROWS))) == requests  # the same text


def test_arrivals_are_the_timestamps_from_the_first_divided_by_the_speed(tmp_path: Path):
    rows = read_trace(_trace(tmp_path, ROWS))
    assert [r.offset_s for r in trace_requests(rows)] == [0.0, 0.5, 0.5, 3.0]
    fast = trace_requests(rows, speed=2.0)
    assert [r.offset_s for r in fast] == [0.0, 0.25, 0.25, 1.5]
    assert due_offsets(fast[1:], ClientOptions()) == [0.0, 0.0, 1.25]  # from the first sent
    with pytest.raises(ValueError, match="trace speed must be > 0"):
        trace_requests(rows, speed=0)


def test_a_trace_workload_takes_its_first_rows_and_names_its_file(tmp_path: Path):
    loaded = load_trace(_trace(tmp_path, ROWS), count=3, speed=4.0)
    assert len(loaded) == 3 and loaded.trace_speed == 4.0
    assert loaded.manifest()["trace_requests"] == 3
    with pytest.raises(DatasetError, match="has 4 requests, 5 asked for"):
        load_trace(_trace(tmp_path, ROWS), count=5)


@pytest.mark.parametrize(("row", "message"), [
    ({"timestamp": 5, "input_length": 10, "output_length": 1},
     "trace.jsonl:2 field 'hash_ids': missing"),
    ({"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]},
     "trace.jsonl:2 field 'timestamp': expected milliseconds >= 0"),
    ({"timestamp": 5, "input_length": 0, "output_length": 1, "hash_ids": [1]},
     "trace.jsonl:2 field 'input_length': expected an integer >= 1, got 0"),
    ({"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1]},
     "trace.jsonl:2 field 'hash_ids': 1 blocks of 512 tokens cannot hold input_length 600"),
    ({"timestamp": 5, "input_length": 6, "output_length": 1, "hash_ids": ["a"]},
     "trace.jsonl:2 field 'hash_ids': expected an array of integers"),
    ({"timestamp": 0.5, "input_length": 6, "output_length": 1, "hash_ids": [2]},
     "trace.jsonl:2 field 'timestamp': timestamp 0.5 before the previous row's 1"),
])  # fmt: skip
def test_a_bad_trace_row_is_refused_where_it_is(tmp_path: Path, row, message):
    first = {"timestamp": 1, "input_length": 6, "output_length": 1, "hash_ids": [1]}
    with pytest.raises(DatasetError) as caught:
        read_trace(_trace(tmp_path, [first, row]))
    assert message in str(caught.value)


def test_a_schedule_is_a_traces_offsets_or_the_rates_never_both():
    from pytest_kimi.workload.specs import RequestSpec

    mixed = [RequestSpec("a", "x", 1, offset_s=0.0), RequestSpec("b", "y", 1)]
    with pytest.raises(ValueError, match="all keep their arrival offsets, or none does"):
        due_offsets(mixed, ClientOptions())
    assert due_offsets([RequestSpec("a", "x", 1)], ClientOptions()) is None  # closed loop


def test_an_arrival_list_is_any_jsonl_with_timestamps(tmp_path: Path):
    """A Mooncake trace's rows time a SPEED-Bench or ShareGPT set: only ``timestamp`` is
    read, the first ``count`` rows, from the first one, divided by the speed."""
    path = _trace(tmp_path, ROWS)
    assert read_arrivals(path, count=3, speed=2) == (0.0, 0.25, 0.25)
    with pytest.raises(DatasetError, match="has 4 arrivals, 5 asked for"):
        read_arrivals(path, count=5)
    bad = _trace(tmp_path, [{"timestamp": 10}, {"timestamp": 5}])
    with pytest.raises(DatasetError, match=r"trace.jsonl:2.*timestamp.*before the previous"):
        read_arrivals(bad, count=2)
    missing = _trace(tmp_path, [{"time": 10}])
    with pytest.raises(DatasetError, match=r"trace.jsonl:1.*timestamp.*expected milliseconds"):
        read_arrivals(missing, count=1)
