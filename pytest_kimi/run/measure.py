"""Run the workload once against a layout's endpoint and turn its records into a summary.

Every record is kept: finished ones go to a flushed journal at once (a killed harness keeps
them), and an interrupted run (Ctrl-C, SIGTERM, a client crash) keeps the in-flight ones too,
marked, with an error saying how far it got. The router's retry counters are read before and
after, so a failure the router hid by retrying is still seen. Each replica's request and token
counters (its rank 0's ``/metrics``) and the router's per-worker counters are read after the
warmup and after the run: real SGLang names no replica per request, so this is how the split
between replicas is known (:mod:`pytest_kimi.results.replicacounters`). The reads are in
:mod:`pytest_kimi.run.counters`, the notes the records give in :mod:`pytest_kimi.run.notes`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pytest_kimi.config.points import Point
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.run.counters import router_counters, router_notes, snapshot
from pytest_kimi.run.notes import prefix_cache_notes, unsent_turn_notes

# On a time-scaled mock a request's timeout is the workload's, in cluster time, but never
# under this many wall seconds: the shared clock stands still while a loaded machine catches
# up (seconds at a time at a load of 19 on 2 cores), so a cluster half hour at 1:200 (9 wall
# seconds) timed out requests the cluster clock had given a minute
MOCK_TIMEOUT_FLOOR_S = 120.0

if TYPE_CHECKING:
    from pytest_kimi.config import Layout, WorkloadConfig
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.results.events import Progress
    from pytest_kimi.results.layout import LayoutResult
    from pytest_kimi.results.records import RecordJournal
    from pytest_kimi.results.replicacounters import Snapshot
    from pytest_kimi.results.store import RunFolder
    from pytest_kimi.workload.abort import Abort
    from pytest_kimi.workload.client import ClientOptions, RequestSpec
    from pytest_kimi.workload.clocks import RunClock
    from pytest_kimi.workload.dataset import Workload
    from pytest_kimi.workload.prompts import ChatTemplate
    from pytest_kimi.workload.sessions import Session
    from pytest_kimi.workload.sharedclock import SharedClock, Stats


@dataclass(frozen=True)
class Target:
    """Where a run's requests go and whose counters it reads.

    ``endpoint``: the router's URL. ``router_metrics_url``: its ``/metrics`` (None: not ours,
    or attached without ``--kimi-router-metrics``). ``replica_urls`` (replica name -> rank-0
    base URL, :func:`replica_endpoints`): whose counters give ``result.replica_counters``; none
    in attach mode. ``client`` (``network.client: on_node``) sends and times the requests on a
    node instead of here."""

    endpoint: str
    router_metrics_url: str | None = None
    replica_urls: Mapping[str, str] = field(default_factory=dict)
    client: NodeClient | None = None


def measure(
    inputs: Inputs,
    layout: Layout,
    target: Target,
    folder: RunFolder,
    result: LayoutResult,
    progress: Progress | None = None,
    abort: Abort | None = None,
    clock: SharedClock | None = None,
    point: Point | None = None,
    records_at: str | None = None,
) -> None:
    """Fill ``result`` with the run's records, summary and notes; write ``records.jsonl``.

    ``point``: the workload point measured (its settings over the cluster file's workload,
    its records in its own folder, or ``records_at``'s: a repeat's); None: the file's workload.

    ``target``: the endpoint, whose counters to read, and the client on a node if any
    (:class:`Target`). ``progress`` sees the measured requests start and finish (the caller
    reports the layout done). ``abort`` (the watchdog's, :mod:`pytest_kimi.deploy.watchdog`)
    stops the run part-way: its requests are cancelled and kept as an interrupted run, and
    :class:`RunAborted` is raised. ``clock``: the mock's shared cluster clock on a local run
    (:mod:`pytest_kimi.workload.sharedclock`), else wall time."""
    from pytest_kimi.results.events import NoProgress
    from pytest_kimi.results.metrics import summarize
    from pytest_kimi.results.records import RecordJournal
    from pytest_kimi.workload.clocks import WALL

    point = point or Point()
    at, wl = point.id if records_at is None else records_at, inputs.workload_of(point)
    options = _client_options(inputs, wl, inputs.prompts_of(point).chat_template)
    warmup, measured = _work(inputs.prompts_of(point), wl, options, inputs.time_scale)
    log = _RequestLog(result.case, progress or NoProgress(), clock or WALL,
                      RecordJournal(folder.journal_path(layout.name, at)))  # fmt: skip
    router_before = router_counters(target.router_metrics_url)
    try:
        records = []
        if warmup:  # apart, so the counters' first read comes after it
            records = _send(target, options, log, abort, [], warmup)
        _stop_on_failed_warmup(records)
        counted_from = snapshot(target.replica_urls, target.router_metrics_url,
                                layout.disaggregated)  # fmt: skip
        log.measuring(_request_count(measured), inputs.time_scale)
        shared_before = clock.stats() if clock is not None else None
        try:
            records += _send(target, options, log, abort, measured, [])
            if inputs.batches_of(point):  # --kimi-until-decided
                more = functools.partial(_send, target, options, log, abort, warm=[])
                records = _until_decided(inputs, layout.name, point, records, result, more)
        finally:
            if target.client is not None and measured:  # say where it was timed (once)
                result.notes.append(target.client.note())
        server_accept = _read_counters(target, layout.disaggregated, counted_from, result)
        folder.write_records(layout.name, records, at)
        result.records = records
        result.notes.extend(_record_notes(records, inputs, wl, clock, shared_before))
        if wl.sessions:
            result.notes.extend(unsent_turn_notes(_request_count(measured), records))
        if inputs.options.endpoint is None:  # an endpoint's flags are its own, not the file's
            args = inputs.cluster.server_args(layout)
            result.notes.extend(prefix_cache_notes(args, wl.sessions))
        result.summary = summarize(
            records,
            time_scale=inputs.time_scale,
            percentiles=inputs.percentiles(layout.name),
            goodput_limits_ms=dict(wl.goodput_ms),
            server_accept_length=server_accept,
        )
    except WarmupFailed as exc:
        folder.write_records(layout.name, log.records, at)
        result.records, result.summary, result.error = log.records, None, str(exc)
        log.journal.discard()
        raise
    except BaseException as exc:
        _keep_interrupted_run(folder, layout.name, at, result, log, exc,
                              _request_count(measured))  # fmt: skip
        log.journal.discard()  # records.jsonl now holds everything it had
        raise
    log.journal.discard()
    result.notes.extend(router_notes(target.router_metrics_url, router_before))


def _until_decided(
    inputs: Inputs, layout: str, point: Point, records: list[RequestRecord],
    result: LayoutResult, send: Callable[[list[RequestSpec]], list[RequestRecord]],
) -> list[RequestRecord]:  # fmt: skip
    """The batches ``--kimi-until-decided`` sends after the planned requests; the look the
    run stopped at and how it ended go into ``result``."""
    from pytest_kimi.run.untildecided import send_until_decided

    records, result.looks, note = send_until_decided(inputs, layout, point, records, send)
    result.notes.append(note)
    return records


def _request_count(measured: list[RequestSpec] | list[Session]) -> int:
    """The requests a run means to send: a session's every turn counts."""
    from pytest_kimi.workload.sessions import Session

    return sum(len(w.turns) if isinstance(w, Session) else 1 for w in measured)


def _work(
    loaded: Workload, wl: WorkloadConfig, options: ClientOptions, time_scale: float
) -> tuple[list[RequestSpec], list[RequestSpec] | list[Session]]:
    """The warm-up requests and the measured requests or sessions. A session workload's
    warm-up is the first turns of its first ``warmup_requests`` sessions, a trace's its
    first requests, sent alone; a trace's arrivals, or an arrival list's, (cluster seconds)
    on the client's clock."""
    from pytest_kimi.workload.client import RequestSpec
    from pytest_kimi.workload.sessions import words

    n = wl.warmup_requests
    if loaded.requests:  # a trace: due at its offsets, in the client clock's seconds
        warm = [replace(r, offset_s=None) for r in loaded.requests[:n]]
        return warm, [replace(r, offset_s=(r.offset_s or 0.0) / time_scale)
                      for r in loaded.requests[n:]]  # fmt: skip
    due = [t / time_scale for t in loaded.arrivals_s[n:]] or None  # an arrival list's
    if not wl.sessions:
        prompts = [RequestSpec(p.id, p.text, wl.input_len, p.category) for p in loaded.prompts]
        timed = [replace(r, offset_s=t) for r, t in zip(prompts[n:], due, strict=True)] if (
            due) else prompts[n:]  # fmt: skip
        return prompts[:n], timed
    warm = [options.render(s.messages(0, [])) for s in loaded.sessions[:n]]
    warmup = [RequestSpec(f"{s.id}/warmup", text, words(text), s.category)
              for s, text in zip(loaded.sessions[:n], warm, strict=True)]  # fmt: skip
    sessions = list(loaded.sessions[n:])
    if due:  # each session starts at its instant
        sessions = [replace(s, start_s=t) for s, t in zip(sessions, due, strict=True)]
    return warmup, sessions


def request_timeout(timeout_s: float, time_scale: float) -> float:
    """The client's wall-clock timeout for a workload's ``request_timeout_s``: itself on a
    real cluster (time scale 1); scaled on the mock, but not under ``MOCK_TIMEOUT_FLOOR_S``
    (nor over the workload's own)."""
    if time_scale == 1:
        return timeout_s
    return max(timeout_s / time_scale, min(timeout_s, MOCK_TIMEOUT_FLOOR_S))


def _client_options(
    inputs: Inputs, wl: WorkloadConfig, template: ChatTemplate | None = None
) -> ClientOptions:
    """How the client sends the point's requests: rate, timeout and think time scaled to
    cluster time, the served model's name, the seed, where latencies are timed from, and a
    session's chat template."""
    from pytest_kimi.workload.client import ClientOptions
    from pytest_kimi.workload.sessions import ThinkTime

    return ClientOptions(
        api=wl.api,
        output_len=wl.output_len,
        concurrency=wl.concurrency,
        request_rate=wl.request_rate * inputs.time_scale,
        timeout_s=request_timeout(wl.request_timeout_s, inputs.time_scale),
        model=inputs.cluster.server.model_path,
        seed=wl.seed,
        clock_start=wl.clock_start,
        think_time=ThinkTime(wl.think_time_s / inputs.time_scale, wl.think_time_kind),
        chat_template=template,
    )


def _send(
    target: Target,
    options: ClientOptions,
    log: _RequestLog,
    abort: Abort | None,
    requests: list[RequestSpec] | list[Session],
    warm: list[RequestSpec],
) -> list[RequestRecord]:
    """Here, or on a node (``network.client: on_node``): the same hooks either way."""
    if target.client is not None:
        return target.client.run(requests, options, warmup=warm, on_start=log.started,
                                 on_done=log.finished, abort=abort)  # fmt: skip
    from pytest_kimi.workload.client import run_requests

    return asyncio.run(
        run_requests(target.endpoint, requests, options, warmup=warm, on_start=log.started,
                     on_done=log.finished, abort=abort, clock=log.clock)
    )  # fmt: skip


def _read_counters(
    target: Target, disaggregated: bool, counted_from: Snapshot, result: LayoutResult
) -> float | None:
    """The replicas' counters after the run against ``counted_from`` (read after the warm-up):
    each replica's share in ``result.replica_counters``, a disaggregated layout's stage times;
    returns the servers' speculative accept length (None: no replicas of ours to read)."""
    if not target.replica_urls:
        return None
    from pytest_kimi.results.replicacounters import deltas, server_accept_length

    urls = dict(target.replica_urls)
    after = snapshot(urls, target.router_metrics_url, disaggregated)
    result.replica_counters = deltas(urls, counted_from, after)
    server_accept = server_accept_length(after)
    if disaggregated:
        from pytest_kimi.results.pdstages import stage_times

        result.stage_times = stage_times(counted_from.stages, after.stages, after.kv,
                                         counted_from.kv)  # fmt: skip
        if result.stage_times is not None:
            result.notes.extend(result.stage_times.notes)
    return server_accept


def _record_notes(
    records: list[RequestRecord],
    inputs: Inputs,
    wl: WorkloadConfig,
    clock: SharedClock | None,
    shared_before: Stats | None,
) -> list[str]:
    """What the records say about how they were measured (:mod:`pytest_kimi.run.notes`)."""
    from pytest_kimi.results.metrics import unplaced_token_notes
    from pytest_kimi.run.notes import (
        clock_notes,
        dispatch_notes,
        prompt_length_notes,
        turnaround_notes,
    )

    nominal = wl.kind == "requests"  # sessions grow, a trace has its own lengths
    out = prompt_length_notes(records, wl.input_len) if nominal else []
    out += unplaced_token_notes(records)
    out += dispatch_notes(records, wl.concurrency, inputs.time_scale)
    if clock is not None and shared_before is not None:
        out += clock_notes(shared_before, clock.stats(), inputs.time_scale)
    elif wl.kind == "requests" and wl.request_rate == float("inf"):  # closed loop: a freed
        # slot sends the next one (a session's next turn waits its think time, a trace its time)
        out += turnaround_notes(records, wl.concurrency, inputs.time_scale)
    return out


class _RequestLog:
    """The client's on_start/on_done: every started record kept, in order; a finished one
    remembered as run to its end and added at once to the flushed journal (a killed harness
    keeps it); both as progress events (warm-up requests are not shown)."""

    def __init__(
        self, layout: str, progress: Progress, clock: RunClock, journal: RecordJournal
    ) -> None:
        self.layout, self.progress, self.clock, self.journal = layout, progress, clock, journal
        self.records: list[RequestRecord] = []  # every started one, in order
        self.completed: set[int] = set()  # id() of records whose request ran to its end

    def measuring(self, total: int, time_scale: float) -> None:
        from pytest_kimi.results.events import MeasureStarted

        self.progress.emit(MeasureStarted(self.layout, total, time_scale, at=self.clock.now()))

    def started(self, record: RequestRecord) -> None:
        from pytest_kimi.results.events import RequestStarted

        self.records.append(record)
        if not record.warmup:
            self.progress.emit(RequestStarted(self.layout, at=self.clock.now()))

    def finished(self, record: RequestRecord) -> None:
        from pytest_kimi.results.events import RequestFinished

        self.completed.add(id(record))
        self.journal.add(record)
        if not record.warmup:
            at = record.end_time if record.end_time is not None else self.clock.now()
            self.progress.emit(
                RequestFinished(self.layout, record.output_tokens, record.success, at)
            )


def _keep_interrupted_run(
    folder: RunFolder,
    layout: str,
    point: str,
    result: LayoutResult,
    log: _RequestLog,
    exc: BaseException,
    wanted: int,
) -> None:
    """A run stopped part-way: keep every record, the unfinished ones marked, and say in the
    result how far it got."""
    from pytest_kimi.workload.client import close_unfinished

    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    started, completed = log.records, log.completed
    unfinished = [r for r in started if id(r) not in completed]
    close_unfinished(unfinished, f"interrupted before completion ({why})", log.clock)
    folder.write_records(layout, started, point)
    result.records, result.summary, result.verdicts = started, None, []
    measured = [r for r in started if not r.warmup]
    finished = sum(1 for r in measured if id(r) in completed)
    result.error = (
        f"run interrupted after {finished} of {wanted} requests finished "
        f"({len(measured) - finished} in flight, kept as failed records): {why}"
    )


class WarmupFailed(RuntimeError):
    """A warm-up request failed: measuring a deployment that cannot serve would only time
    errors, so the run stops before its first measured request."""


def _stop_on_failed_warmup(records: list[RequestRecord]) -> None:
    failed = [r for r in records if r.warmup and not r.success]
    if failed:
        first = failed[0]
        raise WarmupFailed(
            f"warm-up request failed before measuring ({len(failed)} of "
            f"{sum(r.warmup for r in records)}): {first.error}"
        )


def replica_endpoints(plan: DeploymentPlan | None) -> dict[str, str]:
    """``replica<i>`` (``prefill<i>``, ``decode<i>``) -> rank-0 base URL for a deployment we
    started (none when attached)."""
    if plan is None:
        return {}
    return {spec.replica_name or f"replica{spec.replica}": spec.url for spec in plan.rank0()}
