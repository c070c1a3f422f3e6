"""The benchmark client run on a cluster node, followed from here (``network.client: on_node``).

Through SSH forwards (or a bastion) every request's bytes cross one more hop that production
traffic never takes; on a node of the cluster the client reaches the router over the data
network, as real clients in the same data centre do. So with ``on_node`` the control plane
(health, warm-up checks, metrics, the watchdog) still goes through the forwards of
:mod:`pytest_kimi.deploy.reach`, while the requests are sent and timed on the node:

1. this package goes to the node as a zip (``PYTHONPATH``; nothing to install there beyond the
   httpx and orjson SGLang's own environment has), the run's requests as a JSON spec;
2. ``python -m pytest_kimi.workload.onnode SPEC EVENTS`` is started like every other process
   of the deployment (executor ``start``: environment file, dead-man's switch, pid file; the
   handle joins the deployment's, so teardown stops it and fetches its log whatever happened);
3. its events file is read here as it grows (``tail -c +N``); each record is handed to the
   same hooks the local client feeds (journal, progress), with its times moved onto this
   machine's clock by the offset measured before the run;
4. an abort (the watchdog) or Ctrl-C stops the client (TERM, then KILL) and keeps every record.

Clocks: records are timed on the node; durations (TTFT, TPOT, E2E) are node-clock differences
and need no correction. Only where the run sits among this machine's telemetry samples needs
the offset, measured with one round trip and stated with its uncertainty.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import pytest_kimi
from pytest_kimi.deploy import remote
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.workload.abort import RunAborted
from pytest_kimi.workload.onnode import spec_json

if TYPE_CHECKING:
    from pytest_kimi.config import Node
    from pytest_kimi.deploy.executor import Executor, Handle
    from pytest_kimi.workload.abort import Abort
    from pytest_kimi.workload.client import ClientOptions, RequestSpec
    from pytest_kimi.workload.sessions import Session

CLIENT_MODULE = "pytest_kimi.workload.onnode"
Hook = Callable[[RequestRecord], None]


class ClientNodeError(RuntimeError):
    """The client on the node failed (it exited before finishing, or could not start)."""


def package_zip() -> bytes:
    """This package's Python files as a zip Python can import from (``PYTHONPATH=zip``)."""
    root = Path(pytest_kimi.__file__).parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                zf.write(path, str(Path("pytest_kimi") / path.relative_to(root)))
    return buf.getvalue()


@dataclass(frozen=True)
class ClockOffset:
    """The node's monotonic clock minus this machine's, within ``± uncertainty_s``."""

    seconds: float = 0.0
    uncertainty_s: float = 0.0


def measure_offset(
    executor: Executor, node: Node, python: Sequence[str], clock: Callable[[], float]
) -> ClockOffset:
    """One round trip: the node's ``time.perf_counter()`` against the middle of the trip
    here (both are CLOCK_MONOTONIC on Linux); the error is at most half the trip."""
    check = (  # the client needs 3.11 (asyncio.timeout); an older one is named here
        "import sys, time; v = sys.version_info; "
        "sys.exit('Python %d.%d: the client needs 3.11 or later' % v[:2]) if v < (3, 11) "
        "else print(repr(time.perf_counter()))"
    )
    command = shlex.join([*python, "-c", check])
    before = clock()
    code, out = executor.run(node, command, 60)
    after = clock()
    try:
        there = float(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ClientNodeError(
            f"node {node.name}: the client's Python ({shlex.join(python)}) did not run: "
            f"exit {code}: {out.strip()[-500:]}"
        ) from None
    return ClockOffset(there - (before + after) / 2, (after - before) / 2)


def shifted(record: RequestRecord, by: float) -> RequestRecord:
    """``record`` with every time moved by ``-by`` (node clock -> this machine's)."""

    def move(value: float | None) -> float | None:
        return None if value is None else value - by

    record.send_time -= by
    record.start_time = move(record.start_time)
    record.connect_time = move(record.connect_time)
    record.connected_time = move(record.connected_time)
    record.sent_time = move(record.sent_time)
    record.first_token_time = move(record.first_token_time)
    record.first_answer_time = move(record.first_answer_time)
    record.end_time = move(record.end_time)
    record.intended_time = move(record.intended_time)
    record.chunks = [Chunk(c.time - by, c.tokens) for c in record.chunks]
    return record


def complete_lines(text: str) -> tuple[list[str], int]:
    """The whole lines of ``text`` and how many bytes (UTF-8) they take; a line still being
    written (no newline yet) is left for the next read."""
    end = text.rfind("\n")
    if end < 0:
        return [], 0
    whole = text[: end + 1]  # only "\n" ends an event (splitlines would split on U+2028)
    return [line for line in whole.split("\n") if line.strip()], len(whole.encode())


@dataclass
class Stream:
    """The client's events, turned into the records the hooks see (one object per request:
    ``start`` makes it, ``done`` fills it in, as the local client does)."""

    on_start: Hook
    on_done: Hook
    offset: float = 0.0
    records: dict[int, RequestRecord] = field(default_factory=dict)
    ended: bool = False
    node_clock: float | None = None

    def feed(self, lines: Sequence[str]) -> None:
        for line in lines:
            event = json.loads(line)
            kind = event.get("event")
            if kind == "clock":
                self.node_clock = event["monotonic"]
            elif kind == "start":
                record = RequestRecord(event["index"], event["prompt_id"],
                                       event["nominal_input_tokens"], event["max_output_tokens"],
                                       warmup=event["warmup"])  # fmt: skip
                if "t" in event:  # an unfinished record still sits where it was sent
                    record.send_time = record.start_time = event["t"] - self.offset
                self.records[record.index] = record
                self.on_start(record)
            elif kind == "done":
                done = shifted(RequestRecord.from_dict(event["record"]), self.offset)
                record = self.records.setdefault(done.index, done)
                for f in fields(RequestRecord):
                    setattr(record, f.name, getattr(done, f.name))
                self.on_done(record)
            elif kind == "end":
                self.ended = True

    def in_order(self) -> list[RequestRecord]:
        """Warm-up first (in the order sent), then the measured ones by index."""
        warm = sorted((r for r in self.records.values() if r.warmup), key=lambda r: -r.index)
        return warm + sorted((r for r in self.records.values() if not r.warmup),
                             key=lambda r: r.index)  # fmt: skip


class NodeClient:
    """Runs the benchmark client on ``node`` against ``endpoint`` (the router's address on
    the data network), one process per :meth:`run`."""

    def __init__(
        self,
        executor: Executor,
        node: Node,
        python: Sequence[str],
        folder: str,
        endpoint: str,
        start: Callable[[ProcessSpec, Path], Handle],
        *,
        same_clock: bool = False,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.executor, self.node, self.python = executor, node, tuple(python)
        self.folder, self.endpoint, self.start = folder.rstrip("/"), endpoint, start
        self.same_clock, self.poll_s, self.clock = same_clock, poll_s, clock
        self.offset: ClockOffset | None = None
        self.runs = 0
        self._shipped = ""

    def note(self) -> str:
        """What the report says about where the requests were timed."""
        if self.same_clock:  # a local cluster: the "node" is this machine
            return (
                f"network.client: on_node: requests sent and timed by a client process of "
                f"their own (node {self.node.name}, this machine), to the router at "
                f"{self.endpoint}"
            )
        clock = (
            f"node clock offset {self.offset.seconds:+.3f} s ± "
            f"{self.offset.uncertainty_s * 1e3:.0f} ms"
            if self.offset
            else "node clock offset not measured"
        )
        return (
            f"network.client: on_node: requests sent and timed on node {self.node.name}, to the "
            f"router at {self.endpoint} over the cluster network: latencies exclude the path "
            f"to this machine (SSH forwards, jump host), as clients in the data centre see "
            f"them; {clock} (it only places the run among the telemetry samples)"
        )

    def run(
        self,
        requests: Sequence[RequestSpec] | Sequence[Session],
        options: ClientOptions,
        *,
        warmup: Sequence[RequestSpec] = (),
        on_start: Hook = lambda record: None,
        on_done: Hook = lambda record: None,
        abort: Abort | None = None,
    ) -> list[RequestRecord]:
        """Like :func:`~pytest_kimi.workload.client.run_requests`, on the node."""
        if abort is not None and abort.tripped:  # tripped before: nothing is sent
            raise RunAborted(abort.reason)
        self.runs += 1
        tag = f"client{self.runs}-{self.node.name}"
        zip_path = self._ship()
        if self.offset is None:
            self.offset = self._offset()
        spec_path, events = f"{self.folder}/{tag}.spec.json", f"{self.folder}/{tag}.events.jsonl"
        text = spec_json(self.endpoint, options, requests, list(warmup))
        self.executor.put_file(self.node, spec_path, text.encode())
        spec = ProcessSpec(name=tag, node=self.node, role="client",
                           argv=(*self.python, "-m", CLIENT_MODULE, spec_path, events),
                           env={"PYTHONPATH": zip_path})  # fmt: skip
        # a process of the deployment: teardown stops it and fetches its log, whatever
        # happens here, and a Ctrl-C during its start still finds it
        handle = self.start(spec, Path(self.folder) / f"{tag}.log")
        stream, read = Stream(on_start, on_done, self.offset.seconds), [0]
        try:
            self._follow(handle, events, stream, read, abort)
        finally:
            self._stop(handle)
            with contextlib.suppress(Exception):  # what finished while it was stopped
                self._read(events, stream, read)
        return stream.in_order()

    def _offset(self) -> ClockOffset:
        if self.same_clock:
            return ClockOffset()
        return measure_offset(self.executor, self.node, self.python, self.clock)

    def _ship(self) -> str:
        if not self._shipped:
            # the client's node may run nothing else: its run folder may not exist yet
            code, out = self.executor.run(self.node, remote.mkdir(self.folder))
            if code != 0:
                raise ClientNodeError(f"node {self.node.name}: cannot create {self.folder}: {out}")
            path = f"{self.folder}/pytest_kimi-client.zip"
            self.executor.put_file(self.node, path, package_zip())
            self._shipped = path
        return self._shipped

    def _read(self, events: str, stream: Stream, read: list[int]) -> None:
        """Hand on the events written since ``read[0]`` bytes (advanced)."""
        _, text = self.executor.run(
            self.node, f"tail -c +{read[0] + 1} {shlex.quote(events)} 2>/dev/null || true"
        )
        lines, used = complete_lines(text)
        read[0] += used
        stream.feed(lines)

    def _follow(
        self, handle: Handle, events: str, stream: Stream, read: list[int], abort: Abort | None
    ) -> None:
        while True:
            tripped = abort is not None and abort.tripped
            exited = self.executor.exit_code(handle)  # before reading: nothing written after
            self._read(events, stream, read)  # what finished before an abort is noticed: kept
            if stream.ended:
                return
            if tripped:
                raise RunAborted(abort.reason)  # type: ignore[union-attr]
            if exited is not None:
                tail = self.executor.log_tail(handle, 30).rstrip()
                raise ClientNodeError(
                    f"the benchmark client on node {self.node.name} exited with code {exited} "
                    f"before finishing; last lines of its log:\n{tail}"
                )
            time.sleep(self.poll_s)  # the cadence of following the file, not a wait for it

    def _stop(self, handle: Handle, grace_s: float = 10.0) -> None:
        """TERM, then KILL after ``grace_s``: the client ends its requests on TERM."""
        try:
            if self.executor.exit_code(handle) is not None:
                return
            self.executor.signal(handle, "TERM")
            deadline = self.clock() + grace_s
            while self.executor.alive(handle) and self.clock() < deadline:
                time.sleep(0.1)
            if self.executor.alive(handle):
                self.executor.signal(handle, "KILL")
        except Exception:  # a lost node: teardown tries again with the longest patience
            pass
