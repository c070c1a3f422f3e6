"""A client's timings against the scripted server's truth, split by phase.

The truth is the server's alone (``pytest_kimi.testing.scripted``): its handler's entry
(``head``), its writes, and the kernel's arrival stamp of the request's first segment. The
client's stamps are on the same clock (CLOCK_MONOTONIC, system-wide on Linux). Per request,
client - truth is split where it arises, in order along the request's path:

======================  ====================================================  ============
phase                   from -> to                                            whose
======================  ====================================================  ============
``connect``             connecting began (the latency's start) -> open        client
``send``                open -> first segment in the server's kernel          client
``server``              in the server's kernel -> server's handler entry      server
``back``                server wrote the chunk -> client stamped it           client
======================  ====================================================  ============

``back`` is the chunk's trip over loopback (microseconds) plus the client's lateness in
reading and parsing it. The server's part, how late its own loop read the request, is
measured by the kernel's stamp, never by the client. A client time inside the window of the
server's write (just before the ``send`` call to just after it) counts as no error: a
preemption inside that call is the server's.

TTFT error = connect + send + server + back(first token); E2E error likewise with back(end);
TPOT error = (back(last token) - back(first token)) / (tokens - 1). The client's own share is
the error less ``server``. ``prepare`` (issued -> connecting began: building the request) is
the client's work before the clock starts: reported, not part of any error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.results.records import RequestRecord

PHASES = ("connect", "send", "server", "back")


@dataclass(frozen=True)
class Split:
    """One request: client - truth in ms for TTFT, TPOT and E2E, and TTFT's and E2E's phases."""

    ttft: float
    tpot: float
    e2e: float
    prepare: float  # before the clock: not part of the error
    connect: float
    send: float
    server: float
    back_first: float
    back_end: float
    back_last: float

    @property
    def client_ttft(self) -> float:
        """The client's own share of the TTFT error (all but the server's lateness)."""
        return self.ttft - self.server

    @property
    def client_e2e(self) -> float:
        return self.e2e - self.server


def _written(chunk: Sequence[Any]) -> tuple[float, float]:
    """When the server wrote a chunk: (just before the write, just after it)."""
    return (chunk[2], chunk[0])


def _seen(client_time: float, window: tuple[float, float]) -> float:
    """The server's write instant as the client saw it: inside the write's window, no error."""
    return min(max(client_time, window[0]), window[1])


def arrived(entry: dict[str, Any]) -> float:
    """When the request's first segment reached the server: the kernel's stamp, or the
    server's read where there is none."""
    return entry.get("kernel_first") or entry["first_byte"]


def server_ms(entry: dict[str, Any]) -> float:
    """The server's share: how late its own loop read the request (arrival -> handler)."""
    return (entry["head"] - arrived(entry)) * 1000.0


def split(record: RequestRecord, entry: dict[str, Any]) -> Split:
    """Where ``record``'s error against ``entry`` (the server's truth) arose, in ms."""
    if record.first_token_time is None or record.end_time is None or not record.chunks:
        raise ValueError(f"request {record.index} has no stream to compare: {record.error}")
    start = record.latency_start
    chunks = entry["chunks"]
    first = _seen(record.first_token_time, _written(chunks[0]))
    last = _seen(record.chunks[-1].time, _written(chunks[-1]))
    end = _seen(record.end_time, (entry["end_before"], entry["end"]))
    tokens = sum(c[1] for c in chunks)
    issued = record.start_time if record.start_time is not None else start
    # inside the latency only: with clock_start "send" connecting precedes its start
    connecting = max(start, record.connect_time if record.connect_time is not None else start)
    connected = max(
        connecting, connecting if record.connected_time is None else record.connected_time
    )
    ms = 1000.0
    client_tpot = (record.chunks[-1].time - record.first_token_time) / (record.output_tokens - 1)
    true_tpot = (last - first) / (tokens - 1)
    return Split(
        ttft=((record.first_token_time - start) - (first - entry["head"])) * ms,
        tpot=(client_tpot - true_tpot) * ms,
        e2e=((record.end_time - start) - (end - entry["head"])) * ms,
        prepare=((record.connect_time or issued) - issued) * ms,
        connect=(connected - connecting) * ms,
        send=(arrived(entry) - connected) * ms,
        server=server_ms(entry),
        back_first=(record.first_token_time - first) * ms,
        back_end=(record.end_time - end) * ms,
        back_last=(record.chunks[-1].time - last) * ms,
    )


def match(records: Sequence[RequestRecord], truth: Sequence[dict[str, Any]]) -> list[Split]:
    """Every measured record against the truth entry the server keyed by its request id
    (``/generate``: ``meta_info.id`` is the entry's index; OpenAI APIs: ``cmpl-N`` or
    ``chatcmpl-N``)."""
    by_id = {}
    for entry in truth:
        for form in ("{}", "cmpl-{}", "chatcmpl-{}"):
            by_id[form.format(entry["index"])] = entry
    out = []
    for record in records:
        if record.warmup:
            continue
        if not record.success or record.request_id not in by_id:
            raise ValueError(f"request {record.index} failed or unknown to the server: "
                             f"{record.error or record.request_id}")  # fmt: skip
        out.append(split(record, by_id[record.request_id]))
    return out
