"""Per-request records: what the client saw, one line of ``records.jsonl`` each.

Times are seconds on the client's monotonic clock (``time.perf_counter``), in wall time.
Metrics convert them to cluster time with the run's time scale (1 on a real cluster).
A failed request keeps its record with ``success=False`` and the error text: failures are
counted, never dropped.

Reasoning models stream their thinking before the answer (SGLang's chat API with a reasoning
parser: ``delta.reasoning_content``, then ``delta.content``). ``first_token_time`` is the first
token of either kind (TTFT, as the server's own clock sees it); ``first_answer_time`` the first
answer token; ``reasoning_tokens`` how many of ``output_tokens`` were thinking. Files written
before these fields existed read back with the defaults below: their client counted only
answer text, so their first token was also their first answer token.

Where latencies start (``clock_start``, docs/metrics.md): "request", the instant the client
begins to connect for the request (``sglang.bench_serving``'s ``st = time.perf_counter()``
before ``session.post``: connecting included), or "send", when the request's first byte is
written. Every instant is kept in every record (issued, connecting, connected, first and last
byte sent), so either definition can be computed from any record.

An open-loop run (a request rate, a trace) also keeps each request's ``intended_time``, the
instant its schedule meant it to leave: latencies from there count the client's own lateness
too (``dispatch_delay``), as a user arriving on schedule would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import orjson

from pytest_kimi.results.files import atomic_write


@dataclass
class Chunk:
    """One streamed chunk that carried generated text (reasoning or answer)."""

    time: float
    tokens: int


@dataclass
class RequestRecord:
    """Everything measured about one request."""

    index: int
    prompt_id: str
    nominal_input_tokens: int
    max_output_tokens: int
    send_time: float = 0.0  # the request's first byte is about to be written (connected)
    start_time: float | None = None  # issued: before the request is built
    first_token_time: float | None = None  # first token of any kind (reasoning or answer)
    end_time: float | None = None
    chunks: list[Chunk] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    replica: str | None = None
    request_id: str | None = None  # the server's id for it (meta_info.id / OpenAI id)
    status: int | None = None
    success: bool = False
    error: str = ""
    warmup: bool = False
    first_answer_time: float | None = None  # first answer token (after any reasoning)
    reasoning_tokens: int = 0  # of output_tokens, how many were reasoning
    connect_time: float | None = None  # connecting began: where "request" latencies start
    connected_time: float | None = None  # its connection was open
    sent_time: float | None = None  # its last byte was in the kernel (on its way)
    clock_start: str = "send"  # where TTFT and E2E start: "request" (start_time) or "send"
    category: str | None = None  # the prompt's SPEED-Bench category
    # speculative decoding, from the final meta_info where the server sends it (SGLang's
    # /generate): verify steps, and completion_tokens / spec_verify_ct as SGLang computes it
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    # open-loop runs (a request rate, a trace): the instant the schedule meant it to leave;
    # None in a closed loop, where a request leaves when a slot frees (docs/metrics.md)
    intended_time: float | None = None
    # multi-turn sessions (docs/metrics.md, "Sessions"): which session and which of its turns
    # (0-based); None for a single-turn workload
    session_id: str | None = None
    turn: int | None = None
    # prompt tokens the server found in its prefix cache (SGLang: /generate's
    # meta_info.cached_tokens, OpenAI usage.prompt_tokens_details.cached_tokens); None where
    # the server did not say
    cached_tokens: int | None = None
    # --kimi-until-decided: the batch the request was sent in (0: the planned requests; 1, 2,
    # ...: the batches sent until every SLO was decided); None when not sent so
    batch: int | None = None
    # --kimi-repeat: the run of the point the request was sent in (1, 2, ...); None when the
    # point was measured once
    repeat: int | None = None

    @property
    def latency_start(self) -> float:
        """The instant TTFT, E2E and the run's duration count from. "request": when the
        client began to connect for it (``connect_time``; bench_serving's definition, which
        holds connecting; where no transport stamped it, ``start_time``); "send": when its
        first byte was about to be written. Files written before the choice existed were
        timed from ``send_time`` and read back so."""
        if self.clock_start == "request":
            for time in (self.connect_time, self.start_time):
                if time is not None:
                    return time
        return self.send_time

    @property
    def dispatch_delay(self) -> float | None:
        """Seconds the request left after its schedule meant it to (:attr:`latency_start` -
        :attr:`intended_time`); None in a closed loop. A late client (busy, or all its
        slots taken) makes it grow, a late server does not: the coordinated omission that
        latencies counted from the send hide."""
        if self.intended_time is None:
            return None
        return self.latency_start - self.intended_time

    @property
    def output_tokens(self) -> int:
        """Server-reported completion tokens, else the count streamed."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(c.tokens for c in self.chunks)

    @property
    def answer_tokens(self) -> int:
        """Output tokens that were not reasoning. Tokens the server spent but streamed as
        neither (a reasoning parser's end-of-thinking marker) count here."""
        return max(0, self.output_tokens - self.reasoning_tokens)

    @property
    def input_tokens(self) -> int:
        """Server-reported prompt tokens, else the nominal input length."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return self.nominal_input_tokens

    def to_json(self) -> str:
        """One compact JSON line. orjson serialises the dataclass directly: ~0.1 ms for a
        512-chunk record against ~4 ms for ``json.dumps(asdict(...))``, which matters because
        the journal writes each record on the event loop while other streams are timed."""
        return orjson.dumps(self).decode()

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        data = dict(data)
        if "first_answer_time" not in data:  # written before reasoning was told apart
            data["first_answer_time"] = data.get("first_token_time")
        data["chunks"] = [Chunk(**c) for c in data.get("chunks", [])]
        return cls(**data)


def write_records(path: Path, records: Iterable[RequestRecord]) -> None:
    """Write records as JSON lines, atomically (write then rename)."""
    with atomic_write(path) as fh:
        for record in records:
            fh.write(record.to_json() + "\n")


class RecordJournal:
    """Append each finished record at once, flushed: if the harness itself is killed
    (SIGKILL, OOM killer, a CI job's hard timeout) the records measured so far survive in
    ``path``; a clean or interrupted run replaces it with the complete ``records.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: TextIO | None = path.open("a", encoding="utf-8")

    def add(self, record: RequestRecord) -> None:
        if self._fh is not None:
            self._fh.write(record.to_json() + "\n")
            self._fh.flush()

    def discard(self) -> None:
        """The full records file is written: the journal is no longer needed."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.path.unlink(missing_ok=True)


def read_records(path: Path) -> list[RequestRecord]:
    """Read a ``records.jsonl`` file written by :func:`write_records`."""
    with path.open(encoding="utf-8") as fh:
        return [RequestRecord.from_dict(json.loads(line)) for line in fh if line.strip()]
