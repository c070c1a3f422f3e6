"""Sample every node's GPUs while a layout is measured, into ``<layout>/telemetry.jsonl``.

A background thread queries all nodes at once (a small thread pool, ``nvidia-smi`` through the
deployment's own executor) every ``interval_s`` wall seconds and appends one line per GPU
(:mod:`pytest_kimi.results.telemetry_stats` has the format). Telemetry observes; it never decides a
run: a node whose query fails is written down once (an ``error`` line) and counted, and the
layout's notes say how many rounds it missed. The thread waits on an :class:`threading.Event`,
never a bare sleep, so :meth:`Sampler.stop` returns within one query's timeout on success,
failure and Ctrl-C alike.

:func:`sampling` is the whole use: bring-up wraps the measured part of a layout in it, and on
the way out it stops the thread, marks the measured span and puts the figures on the result.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pytest_kimi.deploy.gpus import GpuQueryError, parse_gpus
from pytest_kimi.results.telemetry_stats import (
    GpuSample,
    error_line,
    measured_line,
    measured_span,
    read_telemetry,
    start_line,
    summarize_telemetry,
)

if TYPE_CHECKING:
    from pytest_kimi.config import Node
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.results.layout import LayoutResult
    from pytest_kimi.results.records import RequestRecord
    from pytest_kimi.results.telemetry_stats import TelemetrySeries, TelemetrySummary

ATTACHED_NOTE = "telemetry: none: attached to an endpoint (--kimi-endpoint), no nodes to sample"


class Sampler:
    """Queries ``commands[node.name]`` on every node each round, in a thread of its own."""

    def __init__(
        self,
        executor: Executor,
        nodes: Sequence[Node],
        commands: Mapping[str, str],
        path: Path,
        *,
        interval_s: float,
        time_scale: float = 1.0,
        query_timeout_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        stamp: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` paces the rounds (wall time); ``stamp`` dates the samples, on the clock the
        client's records are stamped with (the mock's shared clock on a local run)."""
        self.executor, self.nodes, self.commands, self.path = executor, nodes, commands, path
        self.interval_s, self.time_scale, self.clock = interval_s, time_scale, clock
        self.stamp = stamp or clock
        self.query_timeout_s = query_timeout_s or min(30.0, max(5.0, 2 * interval_s))
        self.origin = 0.0
        self.rounds = 0
        self.failures = {node.name: 0 for node in nodes}
        self.first_error: dict[str, str] = {}
        self.crashed = ""  # why the thread itself stopped early (the file cannot be written)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------------
    def start(self) -> None:
        self.origin = self.stamp()
        names = [node.name for node in self.nodes]
        self.path.write_text(
            start_line(self.origin, self.time_scale, self.interval_s, names) + "\n",
            encoding="utf-8",
        )
        self._thread = threading.Thread(target=self._run, name="kimi-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop and wait for its round to end (bounded by the timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.query_timeout_s + 5.0)
            if self._thread.is_alive():
                self.crashed = self.crashed or "sampler thread did not stop in time"

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def mark_measured(self, start: float, end: float) -> None:
        """Write the measured requests' span (in ``t``) after the samples."""
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(measured_line(start, end) + "\n")

    def notes(self) -> list[str]:
        """One note per node that missed rounds, and one if sampling itself stopped."""
        out = [
            f"telemetry: node {name} failed {missed} of {self.rounds} samples: "
            f"{self.first_error[name]}"
            for name, missed in self.failures.items()
            if missed
        ]
        if self.crashed:
            out.append(f"telemetry: sampling stopped early: {self.crashed}")
        return out

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        pool = cf.ThreadPoolExecutor(len(self.nodes), thread_name_prefix="kimi-telemetry-q")
        try:
            with self.path.open("a", encoding="utf-8") as fh:
                due = self.clock()
                while not self._stop.is_set():
                    self._round(pool, fh)
                    due = max(due + self.interval_s, self.clock())  # no burst after a slow round
                    if self._stop.wait(due - self.clock()):
                        break
        except Exception as exc:  # a full disk: the run goes on, the notes say so
            self.crashed = f"{type(exc).__name__}: {exc}"
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _round(self, pool: cf.ThreadPoolExecutor, fh: TextIO) -> None:
        t = (self.stamp() - self.origin) * self.time_scale
        futures = {pool.submit(self._query, node): node for node in self.nodes}
        done, _ = cf.wait(futures, timeout=self.query_timeout_s + 5.0)
        self.rounds += 1
        lines = []
        for future, node in futures.items():
            if future not in done:
                problem = f"no answer within {self.query_timeout_s:g}s"
            else:
                problem, states = future.result()
            if problem:
                self.failures[node.name] += 1
                if node.name not in self.first_error:
                    self.first_error[node.name] = problem
                    lines.append(error_line(t, node.name, problem))
                continue
            for gpu in states:
                sample = GpuSample(t, node.name, gpu.index, gpu.util_pct, gpu.mem_used_mib,
                                   gpu.mem_total_mib, gpu.power_w, gpu.sm_clock_mhz)  # fmt: skip
                lines.append(sample.to_json())
        fh.write("".join(line + "\n" for line in lines))
        fh.flush()

    def _query(self, node: Node) -> tuple[str, list]:
        """("", GPUs) or (what went wrong, [])."""
        try:
            code, out = self.executor.run(node, self.commands[node.name], self.query_timeout_s)
        except Exception as exc:  # an SSH node that stopped answering
            return f"{type(exc).__name__}: {exc}", []
        if code != 0:
            return f"exit {code}: {out.strip()[-300:]}", []
        try:
            states = parse_gpus(out)
        except GpuQueryError as exc:
            return str(exc), []
        return ("", states) if states else ("nvidia-smi listed no GPU", [])


@contextlib.contextmanager
def sampling(sampler: Sampler | None, result: LayoutResult) -> Iterator[Sampler | None]:
    """Sample while inside; on the way out (whatever happened) stop, mark the measured span
    in the file, and put the figures (``result.telemetry``) and notes on ``result``."""
    if sampler is None:
        yield None
        return
    try:
        sampler.start()
    except OSError as exc:  # the layout folder cannot be written: the run goes on without
        result.notes.append(f"telemetry: not sampled: {type(exc).__name__}: {exc}")
        yield None
        return
    try:
        yield sampler
    finally:
        sampler.stop()
        result.notes.extend(sampler.notes())
        with contextlib.suppress(OSError, ValueError):
            span, result.telemetry = _measured(read_telemetry(sampler.path), result.records)
            if span is not None:
                sampler.mark_measured(*span)


def point_telemetry(path: Path, records: list[RequestRecord]) -> TelemetrySummary | None:
    """The GPU figures over one workload point's measured requests, from the samples so far:
    a layout serving several points is sampled throughout, each point judged on its span."""
    with contextlib.suppress(OSError, ValueError):
        return _measured(read_telemetry(path), records)[1]
    return None


def _measured(
    series: TelemetrySeries, records: list[RequestRecord]
) -> tuple[tuple[float, float] | None, TelemetrySummary | None]:
    """The measured span of ``records`` in the samples, and the figures over it. A point
    measured in several runs (``--kimi-repeat``): its last run's (a fresh deployment's samples
    hold that run alone; the pauses between runs on a kept one are no run's)."""
    last = max((r.repeat for r in records if r.repeat is not None), default=None)
    if last is not None:
        records = [r for r in records if r.repeat == last]
    span = measured_span(records, series)
    if span is None:
        return None, None
    tokens = sum(r.output_tokens for r in records if r.success and not r.warmup)
    return span, summarize_telemetry(series, span, tokens)
