"""The benchmark client as a process of its own, on a cluster node (``network.client: on_node``).

``python -m pytest_kimi.workload.onnode SPEC OUT`` reads the requests and client options from
``SPEC`` (JSON, written by :mod:`pytest_kimi.deploy.clientnode`), sends them with the same
client the harness uses (:func:`~pytest_kimi.workload.client.run_requests`), and appends one
JSON line per event to ``OUT``, flushed at once so the harness can follow it while it runs:

- ``{"event": "clock", "monotonic": T}`` first: this node's clock, for the harness's offset;
- ``{"event": "start", "index": I, "prompt_id": ..., "warmup": B, "t": T, ...}`` as one is
  sent (``T`` on this node's clock);
- ``{"event": "done", "record": {...}}`` once its record is filled in (a
  :class:`~pytest_kimi.results.records.RequestRecord`, times on this node's clock);
- ``{"event": "end"}`` when every request has finished.

Every line is ASCII (non-ASCII text escaped), so the harness's byte count of what it read is
exact whatever decoding the transport does.

SIGTERM (the harness stopping the run: an abort, Ctrl-C, teardown) cancels the requests in
flight, so their connections close and the servers drop them, and exits 143 without ``end``.
Only the standard library, httpx and orjson are needed (SGLang's environment has both): the
harness ships this package as a zip on ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_kimi.results.records import RequestRecord
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
from pytest_kimi.workload.prompts import ChatTemplate
from pytest_kimi.workload.sessions import Session, ThinkTime

Work = Sequence[RequestSpec] | Sequence[Session]


def read_spec(
    path: Path,
) -> tuple[str, ClientOptions, list[RequestSpec] | list[Session], list[RequestSpec]]:
    """(endpoint, options, measured requests or sessions, warm-up requests) from a spec file."""
    data = json.loads(path.read_text(encoding="utf-8"))
    fields = dict(data["options"])
    fields["think_time"] = ThinkTime(**fields.get("think_time", {}))
    if fields.get("chat_template"):
        template = fields["chat_template"]
        fields["chat_template"] = ChatTemplate(Path(template["source"]), template["text"],
                                               template["special_tokens"])  # fmt: skip
    options = ClientOptions(**fields)
    measured: list[RequestSpec] | list[Session] = [RequestSpec(*r) for r in data["requests"]]
    if data.get("sessions"):
        measured = [Session(i, tuple(turns), system, category, start)
                    for i, turns, system, category, start in data["sessions"]]  # fmt: skip
    warmup = [RequestSpec(*r) for r in data["warmup"]]
    return data["endpoint"], options, measured, warmup


def spec_json(
    endpoint: str,
    options: ClientOptions,
    requests: Work,
    warmup: list[RequestSpec],
) -> str:
    """The spec file's text (the inverse of :func:`read_spec`)."""
    from dataclasses import asdict

    rows = [[r.prompt_id, r.text, r.nominal_tokens, r.category, r.output_len, r.offset_s]
            for r in requests if isinstance(r, RequestSpec)]  # fmt: skip
    sessions = [[s.id, list(s.turns), s.system, s.category, s.start_s]
                for s in requests if isinstance(s, Session)]  # fmt: skip
    warm = [[r.prompt_id, r.text, r.nominal_tokens, r.category, r.output_len, r.offset_s]
            for r in warmup]  # fmt: skip
    spec = {"endpoint": endpoint, "options": asdict(options), "requests": rows,
            "sessions": sessions, "warmup": warm}  # fmt: skip
    return json.dumps(spec, default=str)  # a template's source path


class EventWriter:
    """The ``OUT`` file: one flushed JSON line per event."""

    def __init__(self, fh: TextIO) -> None:
        self.fh = fh

    def _line(self, text: str) -> None:
        self.fh.write(text + "\n")
        self.fh.flush()

    def event(self, name: str, **fields: Any) -> None:
        self._line(json.dumps({"event": name, **fields}))

    def started(self, record: RequestRecord) -> None:
        self.event("start", index=record.index, prompt_id=record.prompt_id,
                   nominal_input_tokens=record.nominal_input_tokens,
                   max_output_tokens=record.max_output_tokens, warmup=record.warmup,
                   t=time.perf_counter())  # fmt: skip

    def done(self, record: RequestRecord) -> None:
        text = record.to_json()
        if not text.isascii():  # orjson keeps UTF-8 (an error text): the harness counts bytes
            text = json.dumps(json.loads(text))  # of ASCII lines, "\n" the only line end
        self._line('{"event":"done","record":' + text + "}")


async def _run(endpoint: str, options: ClientOptions, measured, warmup, out: EventWriter) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await run_requests(endpoint, measured, options, warmup=warmup,
                       on_start=out.started, on_done=out.done)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m pytest_kimi.workload.onnode SPEC OUT", file=sys.stderr)
        return 2
    endpoint, options, measured, warmup = read_spec(Path(args[0]))
    with Path(args[1]).open("a", encoding="utf-8") as fh:
        out = EventWriter(fh)
        out.event("clock", monotonic=time.perf_counter())
        try:
            asyncio.run(_run(endpoint, options, measured, warmup, out))
        except asyncio.CancelledError:
            return 143  # stopped by SIGTERM: no "end"
        out.event("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
