"""Watching a start-up that takes half an hour: every process's log, its state, stalls.

Loading a ~1T model, JIT and CUDA-graph capture can take 20-40 minutes, and a node that hangs
(a stuck NCCL init, a full disk, a dead NFS mount) looks the same as a slow one from outside.
What tells them apart is the log: a loading node writes, a hung one does not. So while a
deployment comes up, :class:`StartupWatch` samples each process's log size; a process that is
alive (the deployment checks exits separately) but whose log has not grown for ``stall_s`` is
stalled, and the bring-up fails naming it, well before the hard cap (``startup_timeout_s``).
Every ``report_s`` it reports each process still coming up with the last line of its log, so
an engineer sees which node is where ("Load weight end", "Capture cuda graph").

A process that is healthy (its ``/health`` answers) is waiting for the others: quiet is normal
there, so only processes still starting are checked for stalls. The clock is injectable so
tests drive time rather than wait for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_kimi.deploy.executor import Executor, Handle

Report = Callable[[Handle, str, str], None]  # (handle, state, last log line)


class StallError(RuntimeError):
    """A live process wrote nothing to its log for ``stall_s``; names it (``process``)."""

    def __init__(self, message: str, process: str) -> None:
        super().__init__(message)
        self.process = process


@dataclass
class _Watched:
    handle: Handle
    state: str  # "starting" until its health answers, then "healthy"
    grew_at: float  # when its log last changed size (or when watching began)
    size: int | None = None


class StartupWatch:
    """Log sizes sampled every ``sample_s``, reports every ``report_s``, stalls after
    ``stall_s`` of silence from a process still starting."""

    def __init__(
        self,
        executor: Executor,
        *,
        stall_s: float,
        report_s: float,
        report: Report = lambda handle, state, line: None,
        clock: Callable[[], float] = time.monotonic,
        sample_s: float | None = None,
    ) -> None:
        self.executor, self.stall_s, self.report_s = executor, stall_s, report_s
        self.report, self.clock = report, clock
        # often enough to notice a stall within a quarter of stall_s; never more than every
        # 5 s (on SSH each sample is a round trip per process)
        self.sample_s = sample_s if sample_s is not None else min(5.0, stall_s / 4, report_s)
        self.watched: dict[str, _Watched] = {}
        self._next_sample = self._next_report = clock()
        self._next_report += report_s

    def add(self, handle: Handle) -> None:
        """Watch ``handle`` from now (its silence counts from now)."""
        self.watched[handle.spec.name] = _Watched(handle, "starting", self.clock())

    def healthy(self, name: str) -> None:
        """``name`` answers its health check: no longer checked for stalls."""
        if name in self.watched:
            self.watched[name].state = "healthy"

    def check(self) -> None:
        """Sample log sizes and report when due; :class:`StallError` if one stalled."""
        now = self.clock()
        if now >= self._next_sample:
            self._next_sample = now + self.sample_s
            self._sample(now)
        if now >= self._next_report:
            self._next_report = now + self.report_s
            for item in self.watched.values():
                if item.state != "ready":
                    self.report(item.handle, item.state, self.last_line(item.handle))

    def _sample(self, now: float) -> None:
        for item in self.watched.values():
            if item.state != "starting":
                continue
            size = self._size(item.handle)
            if size is None:  # cannot tell (node not answering): not evidence of a stall
                continue
            if size != item.size:
                item.size, item.grew_at = size, now
            elif now - item.grew_at >= self.stall_s:
                spec = item.handle.spec
                where = f"replica {spec.replica} " if spec.replica is not None else ""
                raise StallError(
                    f"{spec.name} ({where}node {spec.node.name}, {spec.node.host}) stalled: "
                    f"its log has not grown for {now - item.grew_at:.0f}s (startup_stall_s: "
                    f"{self.stall_s:g}) while the process is alive",
                    spec.name,
                )

    def _size(self, handle: Handle) -> int | None:
        try:
            return self.executor.log_size(handle)
        except Exception:
            return None

    def last_line(self, handle: Handle) -> str:
        """The last non-empty line of the log, at most 160 characters."""
        try:
            tail = self.executor.log_tail(handle, 3)
        except Exception as exc:
            return f"(log unavailable: {exc})"
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        return last if len(last) <= 160 else last[:157] + "..."


def all_tails(executor: Executor, handles: list[Handle], lines: int) -> str:
    """Each process's last ``lines`` log lines under a header naming it and its node."""
    out = []
    for handle in handles:
        spec = handle.spec
        try:
            tail = executor.log_tail(handle, lines)
        except Exception as exc:
            tail = f"(log unavailable: {exc})"
        out.append(f"--- {spec.name} on {spec.node.name} ({spec.node.host}) ---\n{tail.rstrip()}")
    return "\n".join(out)
