"""Run the workload once against a layout's endpoint and turn its records into a summary.

Every record is kept: finished ones go to a flushed journal at once (a killed harness keeps
them), and an interrupted run (Ctrl-C, SIGTERM, a client crash) keeps the in-flight ones too,
marked, with an error saying how far it got. The router's retry counters are read before and
after, so a failure the router hid by retrying is still seen. Each replica's request and token
counters (its rank 0's ``/metrics``) and the router's per-worker counters are read after the
warmup and after the run: real SGLang names no replica per request, so this is how the split
between replicas is known (:mod:`pytest_kimi.results.replicacounters`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pytest_kimi.config.points import Point
from pytest_kimi.results.records import RequestRecord

if TYPE_CHECKING:
    from collections import Counter

    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.results.events import Progress
    from pytest_kimi.results.layout import LayoutResult
    from pytest_kimi.results.replicacounters import Snapshot
    from pytest_kimi.results.store import RunFolder
    from pytest_kimi.workload.abort import Abort
    from pytest_kimi.workload.clocks import RunClock
    from pytest_kimi.workload.sharedclock import SharedClock, Stats

Say = Callable[[str], None]


def measure(
    inputs: Inputs,
    layout: Layout,
    endpoint: str,
    folder: RunFolder,
    result: LayoutResult,
    say: Say,
    router_metrics_url: str | None = None,
    replica_urls: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    abort: Abort | None = None,
    client: NodeClient | None = None,
    clock: SharedClock | None = None,
    point: Point | None = None,
) -> None:
    """Fill ``result`` with the run's records, summary and notes; write ``records.jsonl``.

    ``point``: the workload point measured (its settings over the cluster file's workload,
    its records in its own folder); None: the cluster file's workload.

    ``replica_urls`` (replica name -> rank-0 base URL, :func:`replica_endpoints`): whose
    counters give ``result.replica_counters``; none in attach mode. ``progress`` sees the
    measured requests start and finish (the caller reports the layout done). ``abort`` (the
    watchdog's, :mod:`pytest_kimi.deploy.watchdog`) stops the run part-way: its requests are
    cancelled and kept as an interrupted run, and :class:`RunAborted` is raised. ``client``
    (``network.client: on_node``) sends and times the requests on a node instead of here.
    ``clock``: the mock's shared cluster clock on a local run
    (:mod:`pytest_kimi.workload.sharedclock`), else wall time."""
    from pytest_kimi.results.events import NoProgress
    from pytest_kimi.results.metrics import summarize, unplaced_token_notes
    from pytest_kimi.results.records import RecordJournal
    from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
    from pytest_kimi.workload.clocks import WALL

    run_clock = clock or WALL

    point = point or Point()
    wl = inputs.workload_of(point)
    prompts = [RequestSpec(p.id, p.text, wl.input_len, p.category)
               for p in inputs.prompts_of(point).prompts]  # fmt: skip
    warmup, measured = prompts[: wl.warmup_requests], prompts[wl.warmup_requests :]
    options = ClientOptions(
        api=wl.api,
        output_len=wl.output_len,
        concurrency=wl.concurrency,
        request_rate=wl.request_rate * inputs.time_scale,
        timeout_s=wl.request_timeout_s / inputs.time_scale,
        model=inputs.cluster.server.model_path,
        seed=wl.seed,
        clock_start=wl.clock_start,
    )
    started: list[RequestRecord] = []
    completed: set[int] = set()  # id() of records whose request ran to its end
    journal = RecordJournal(folder.journal_path(layout.name, point.id))
    events = _RequestEvents(result.case, progress or NoProgress(), started, run_clock)

    def finished(record: RequestRecord) -> None:
        completed.add(id(record))
        journal.add(record)
        events.finished(record)

    def send(requests: list[RequestSpec], warm: list[RequestSpec]) -> list[RequestRecord]:
        """Here, or on a node (``network.client: on_node``): the same hooks either way."""
        if client is not None:
            try:
                return client.run(requests, options, warmup=warm, on_start=events.started,
                                  on_done=finished, abort=abort)  # fmt: skip
            finally:
                if requests:  # the measured run: say where it was timed (once)
                    result.notes.append(client.note())
        return asyncio.run(
            run_requests(endpoint, requests, options, warmup=warm, on_start=events.started,
                         on_done=finished, abort=abort, clock=run_clock)
        )  # fmt: skip

    router_before = _router_counters(router_metrics_url)
    urls = dict(replica_urls or {})
    try:
        records = []
        if warmup:  # apart, so the counters' first read comes after it
            records = send([], warmup)
        _stop_on_failed_warmup(records)
        counted_from = _snapshot(urls, router_metrics_url, layout.disaggregated)
        events.measuring(len(measured), inputs.time_scale)
        shared_before = clock.stats() if clock is not None else None
        records += send(measured, [])
        server_accept = None
        if urls:
            from pytest_kimi.results.replicacounters import deltas, server_accept_length

            after = _snapshot(urls, router_metrics_url, layout.disaggregated)
            result.replica_counters = deltas(urls, counted_from, after)
            server_accept = server_accept_length(after)
            if layout.disaggregated:
                from pytest_kimi.results.pdstages import stage_times

                result.stage_times = stage_times(counted_from.stages, after.stages, after.kv,
                                                 counted_from.kv)  # fmt: skip
                if result.stage_times is not None:
                    result.notes.extend(result.stage_times.notes)
        folder.write_records(layout.name, records, point.id)
        result.records = records
        result.notes.extend(prompt_length_notes(records, wl.input_len))
        result.notes.extend(unplaced_token_notes(records))
        if clock is not None and shared_before is not None:
            result.notes.extend(clock_notes(shared_before, clock.stats(), inputs.time_scale))
        elif wl.request_rate == float("inf"):  # closed loop: a freed slot sends the next one
            result.notes.extend(turnaround_notes(records, wl.concurrency, inputs.time_scale))
        result.summary = summarize(
            records,
            time_scale=inputs.time_scale,
            percentiles=inputs.percentiles(layout.name),
            goodput_limits_ms=dict(wl.goodput_ms),
            server_accept_length=server_accept,
        )
    except WarmupFailed as exc:
        folder.write_records(layout.name, started, point.id)
        result.records, result.summary, result.error = started, None, str(exc)
        journal.discard()
        raise
    except BaseException as exc:
        _keep_interrupted_run(folder, layout.name, point.id, result, started, completed, exc,
                              len(measured), run_clock)  # fmt: skip
        journal.discard()  # records.jsonl now holds everything it had
        raise
    journal.discard()
    result.notes.extend(_router_notes(router_metrics_url, router_before))


class _RequestEvents:
    """The client's on_start/on_done as progress events (warm-up requests are not shown)."""

    def __init__(
        self, layout: str, progress: Progress, started: list[RequestRecord], clock: RunClock
    ) -> None:
        self.layout, self.progress, self.records, self.clock = layout, progress, started, clock

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
    started: list[RequestRecord],
    completed: set[int],
    exc: BaseException,
    wanted: int,
    clock: RunClock,
) -> None:
    """A run stopped part-way: keep every record, the unfinished ones marked, and say in the
    result how far it got."""
    from pytest_kimi.workload.client import close_unfinished

    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    unfinished = [r for r in started if id(r) not in completed]
    close_unfinished(unfinished, f"interrupted before completion ({why})", clock)
    folder.write_records(layout, started, point)
    result.records, result.summary, result.verdicts = started, None, []
    measured = [r for r in started if not r.warmup]
    finished = sum(1 for r in measured if id(r) in completed)
    result.error = (
        f"run interrupted after {finished} of {wanted} requests finished "
        f"({len(measured) - finished} in flight, kept as failed records): {why}"
    )


def _router_counters(url: str | None) -> Counter[tuple[str, str]] | None:
    """The router's retry and upstream counters now (None: not ours, or unreachable)."""
    if url is None:
        return None
    import httpx

    from pytest_kimi.report.routermetrics import counters

    try:
        response = httpx.get(url, timeout=5.0, trust_env=False)
        response.raise_for_status()
        return counters(response.text)
    except (httpx.HTTPError, ValueError):
        return None


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


def _metrics_text(url: str) -> str | None:
    import httpx

    try:
        response = httpx.get(url, timeout=5.0, trust_env=False)
        response.raise_for_status()
        return response.text
    except httpx.HTTPError:
        return None


def _snapshot(
    urls: Mapping[str, str], router_metrics_url: str | None, disaggregated: bool = False
) -> Snapshot:
    """Every replica's request/token counters and the router's per-worker attempts, now; a
    disaggregated layout's per-stage latencies and KV gauges too (only there do they exist)."""
    from pytest_kimi.results.pdstages import kv_gauges, stage_totals
    from pytest_kimi.results.replicacounters import (
        Snapshot,
        router_worker_totals,
        server_totals,
    )

    servers: dict[str, dict[str, float] | None] = {}
    stages: dict[str, dict[str, tuple[float, float]] | None] = {}
    kv: dict[str, dict[str, float] | None] = {}
    for name, url in urls.items():
        text = _metrics_text(url.rstrip("/") + "/metrics")
        try:
            servers[name] = None if text is None else server_totals(text)
            if disaggregated:
                stages[name] = None if text is None else stage_totals(text)
                kv[name] = None if text is None else kv_gauges(text)
        except ValueError:  # not Prometheus text
            servers[name] = stages[name] = kv[name] = None
    router_text = _metrics_text(router_metrics_url) if router_metrics_url and urls else None
    try:
        router = None if router_text is None else router_worker_totals(router_text)
    except ValueError:
        router_text, router = None, None
    return Snapshot(servers, router, router_read=router_text is not None, stages=stages, kv=kv)


def _router_notes(url: str | None, before: Counter[tuple[str, str]] | None) -> list[str]:
    from pytest_kimi.report.routermetrics import notes

    if url is None:  # no router metrics to read (attached without --kimi-router-metrics)
        return []
    if before is None:
        return ["router metrics unavailable before the run: retries were not checked"]
    after = _router_counters(url)
    if after is None:
        return ["router metrics unavailable after the run: retries were not checked"]
    return notes(before, after)


def prompt_length_notes(
    records: list[RequestRecord], nominal: int, tolerance: float = 0.10
) -> list[str]:
    """Warn where the server counted a prompt more than ``tolerance`` off its nominal length.

    SPEED-Bench pads prompts with tiktoken's o200k_base, so "16K" is nominal for the served
    model's tokenizer; a large gap means the workload is not the one the table claims.
    """
    off = [
        r
        for r in records
        if not r.warmup
        and r.prompt_tokens is not None
        and abs(r.prompt_tokens - nominal) > tolerance * nominal
    ]
    if not off:
        return []
    worst = max(off, key=lambda r: abs(r.prompt_tokens - nominal))
    return [
        f"{len(off)} of {sum(not r.warmup for r in records)} prompts differ from the nominal "
        f"{nominal} input tokens by more than {tolerance:.0%} as counted by the server "
        f"(worst: {worst.prompt_id} with {worst.prompt_tokens})"
    ]


def client_turnaround(records: list[RequestRecord], concurrency: int) -> list[float]:
    """Wall seconds from each freed slot (a measured request's last token) to the next
    request's send, in a closed loop at ``concurrency``: the ``k``-th send after the first
    ``concurrency`` is the one the ``k``-th end made room for. Failed requests count (their
    end frees the slot too); a record without an end or a send ends the pairing."""
    measured = [r for r in records if not r.warmup]
    sends = sorted(r.latency_start for r in measured)
    ends = sorted(r.end_time for r in measured if r.end_time is not None)
    follow = sends[concurrency:]
    return [max(0.0, s - e) for s, e in zip(follow, ends, strict=False)]


def clock_notes(before: Stats, after: Stats, time_scale: float) -> list[str]:
    """What the shared cluster clock kept out of cluster time during the measured run, from
    its own counters: the wall time it stood still for messages on their way (client,
    router, HTTP) and at an engine's next event (a mock process waking late). Holds nobody
    let go are counted: each cost wall time, not accuracy, but a run that has them lost a
    request on its way or a process died."""
    held = after.held_wall_s - before.held_wall_s
    caught_up = after.bound_wall_s - before.bound_wall_s
    notes = [
        f"one clock: the mock and the client shared one cluster clock (time scale "
        f"1:{time_scale:g}); during the measured run it stood still for {held:.2f} s of wall "
        f"time while requests and first/last tokens were on their way (client, router, HTTP) "
        f"and {caught_up:.2f} s while a mock process caught up: none of it is in the figures "
        f"(longest single hold {after.longest_hold_s * 1e3:.1f} ms)"
    ]
    if after.stalls > before.stalls:
        from pytest_kimi.workload.sharedclock import HOLD_STALL_S

        notes.append(
            f"one clock: {after.stalls - before.stalls} hold(s) nobody let go were dropped "
            f"after {HOLD_STALL_S:g} s of wall time each (a request lost on its way, or a "
            "process that died): the figures around them may be off"
        )
    return notes


def turnaround_notes(
    records: list[RequestRecord], concurrency: int, time_scale: float
) -> list[str]:
    """The client's own turnaround, measured, in wall time and (on the mock) in cluster time:
    the mock's model takes a request's arrival when it reaches the server, so every wall
    millisecond the client spends between a last token and the next send is ``time_scale``
    milliseconds of cluster time in which no request arrives (docs/mock.md, "One clock")."""
    gaps = sorted(client_turnaround(records, concurrency))
    if not gaps:
        return []
    median, p95 = gaps[len(gaps) // 2], gaps[min(len(gaps) - 1, math.ceil(0.95 * len(gaps)) - 1)]
    text = (
        f"client turnaround (a request's last token to the next request sent, closed loop): "
        f"median {median * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms wall over {len(gaps)} sends"
    )
    if time_scale != 1:
        text += (
            f"; at time scale 1:{time_scale:g} that is {median * time_scale:.2f} s of cluster "
            "time before each follow-up is even sent"
        )
    return [text]
