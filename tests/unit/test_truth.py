"""Splitting a client's error against the scripted server's truth, on made-up stamps."""

from __future__ import annotations

import pytest

from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.testing.truth import PHASES, match, split


def _record(**times: float) -> RequestRecord:
    record = RequestRecord(0, "p", 10, 3, success=True, request_id="0", clock_start="request")
    record.start_time = record.connect_time = times["start"]
    record.connected_time = times["connected"]
    record.send_time = times["connected"]
    record.chunks = [Chunk(t, 1) for t in times["chunks"]]
    record.first_token_time = record.chunks[0].time
    record.end_time = times["end"]
    record.completion_tokens = len(record.chunks)
    return record


def _entry(**times) -> dict:
    return {
        "index": 0, "kernel_first": times["kernel"], "first_byte": times["first_byte"],
        "head": times["head"], "end_before": times["end"][0], "end": times["end"][1],
        "chunks": [[after, 1, before, "answer", 0.0] for before, after in times["chunks"]],
    }  # fmt: skip


ENTRY = _entry(kernel=10.0001, first_byte=10.0031, head=10.0032,
               chunks=[(10.1, 10.1002), (10.2, 10.2001), (10.3, 10.3001)],
               end=(10.3002, 10.3003))  # fmt: skip


def test_the_phases_add_up_to_the_error_and_the_server_keeps_its_lateness():
    record = _record(start=10.0, connected=10.00009, chunks=[10.1005, 10.2003, 10.3004],
                     end=10.3008)  # fmt: skip
    s = split(record, ENTRY)
    assert s.prepare == 0.0
    assert s.connect == pytest.approx(0.09)
    assert s.send == pytest.approx(0.01)
    assert s.server == pytest.approx(3.1)  # kernel -> handler: the server's own lateness
    assert s.back_first == pytest.approx(0.3)  # after the write ended at 10.1002
    assert s.back_end == pytest.approx(0.5)
    phases = sum(getattr(s, p) for p in PHASES if p != "back")
    assert s.ttft == pytest.approx(phases + s.back_first)
    assert s.e2e == pytest.approx(phases + s.back_end)
    assert s.client_ttft == pytest.approx(s.ttft - 3.1)
    # TPOT: the last chunk came back 0.3 ms late, the first 0.3 ms: no TPOT error
    assert s.tpot == pytest.approx(0.0, abs=1e-9)


def test_a_client_time_inside_the_servers_write_is_no_error():
    # the client saw the first chunk while the server was still in its send call
    record = _record(start=10.0, connected=10.0, chunks=[10.1001, 10.2001, 10.3001],
                     end=10.3002)  # fmt: skip
    s = split(record, ENTRY)
    assert s.back_first == 0.0 and s.back_end == 0.0


def test_a_client_that_stamps_before_the_server_wrote_shows_a_negative_trip_back():
    record = _record(start=10.0, connected=10.0, chunks=[10.09, 10.2001, 10.3001], end=10.31)
    assert split(record, ENTRY).back_first == pytest.approx(-10.0)


def test_without_the_kernels_stamp_the_servers_read_stands_in():
    entry = {**ENTRY, "kernel_first": None}
    record = _record(start=10.0, connected=10.0, chunks=[10.1002, 10.2001, 10.3001],
                     end=10.3003)  # fmt: skip
    assert split(record, entry).server == pytest.approx(0.1)  # first_byte -> head


def test_records_are_matched_by_the_servers_ids_and_a_failure_is_named():
    gen = _record(start=10.0, connected=10.0, chunks=[10.1002, 10.2001, 10.3001], end=10.3003)
    chat = _record(start=10.0, connected=10.0, chunks=[10.1002, 10.2001, 10.3001], end=10.3003)
    chat.request_id, chat.index = "chatcmpl-1", 1
    warm = RequestRecord(-1, "w", 1, 1, warmup=True)
    assert len(match([warm, gen, chat], [ENTRY, {**ENTRY, "index": 1}])) == 2
    lost = RequestRecord(2, "p", 1, 1, success=False, error="HTTP 500: boom")
    with pytest.raises(ValueError, match="request 2 failed or unknown to the server: HTTP 500"):
        match([lost], [ENTRY])


def test_building_the_request_is_reported_but_is_no_part_of_the_latency():
    record = _record(start=10.0, connected=10.00009, chunks=[10.1005, 10.2003, 10.3004],
                     end=10.3008)  # fmt: skip
    built = _record(start=10.0, connected=10.00009, chunks=[10.1005, 10.2003, 10.3004],
                    end=10.3008)  # fmt: skip
    built.start_time = 9.9995  # issued 0.5 ms before it began to connect
    a, b = split(record, ENTRY), split(built, ENTRY)
    assert b.prepare == pytest.approx(0.5) and a.prepare == 0.0
    assert (b.ttft, b.e2e, b.connect) == (a.ttft, a.e2e, a.connect)


def test_timed_from_the_send_connecting_is_outside_the_latency():
    record = _record(start=10.0, connected=10.00009, chunks=[10.1005, 10.2003, 10.3004],
                     end=10.3008)  # fmt: skip
    record.clock_start, record.send_time = "send", 10.00009
    s = split(record, ENTRY)
    assert s.connect == 0.0 and s.send == pytest.approx(0.01)
    assert s.ttft == pytest.approx(s.send + s.server + s.back_first)
