"""Watch a deployment while it is measured: a lost worker stops the run at once.

Without a watchdog, a rank >= 1 node that dies mid-run leaves its rank 0 hanging in NCCL until
SGLang's own watchdog (300 s), the router moves every request to the other replicas, and the
layout is silently measured as one replica fewer (DP1 reported as DP2). So a background thread
asks, every ``interval_s`` wall seconds:

- every node process's exit status (the executor's ``exit_code``): one that exited is lost at
  once, named with its node and the end of its log;
- the router's ``/readiness`` (smg and sglang-router: ``healthy_workers``): fewer workers than
  replicas, or no answer, on ``misses`` polls in a row is a loss too (the router drops and
  re-admits workers on its own health checks, so one low count is not yet proof);
- a node that cannot be asked (SSH down) on ``misses`` polls in a row is lost.

A loss trips the run's :class:`~pytest_kimi.workload.abort.Abort`: the client's requests are
cancelled, the layout fails with the reason, and teardown proceeds as usual. The thread waits
on an :class:`threading.Event`, never a bare sleep, as :mod:`pytest_kimi.deploy.telemetry` does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kimi.deploy.executor import Executor, Handle
    from pytest_kimi.results.layout import LayoutResult
    from pytest_kimi.workload.abort import Abort

Fetch = Callable[[str], tuple[int, bytes]]  # GET url -> (status, body); raises when no answer


class Watchdog:
    """Polls ``handles`` and the router until stopped or until the first loss."""

    def __init__(
        self,
        executor: Executor,
        handles: Sequence[Handle],
        on_lost: Callable[[str], None],
        *,
        interval_s: float,
        readiness_url: str | None = None,
        replicas: int = 0,
        misses: int = 2,
        fetch: Fetch | None = None,
        log_lines: int = 30,
    ) -> None:
        self.executor, self.handles, self.on_lost = executor, list(handles), on_lost
        self.interval_s, self.readiness_url, self.replicas = interval_s, readiness_url, replicas
        self.misses, self.log_lines = max(1, misses), log_lines
        self.fetch = fetch or _http_get
        self.rounds = 0
        self.lost = ""  # why the deployment was declared lost (empty: never)
        self.crashed = ""  # why the thread itself stopped early
        self._missed: dict[str, int] = {}  # node or "router" -> polls in a row without answer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kimi-watchdog", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ask the thread to stop and wait for its round to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def notes(self) -> list[str]:
        if self.crashed:
            return [f"watchdog: stopped early, the deployment was not watched: {self.crashed}"]
        return []

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                problem = self.check()
                if problem:
                    self.lost = problem
                    self.on_lost(problem)
                    return
        except Exception as exc:  # the run goes on unwatched; the notes say so
            self.crashed = f"{type(exc).__name__}: {exc}"

    def check(self) -> str:
        """One round: what is lost ("" when everything is there). Every process is asked, so
        when one death takes others with it (rank 0 exits on "connection to node rank 1
        lost"), the cause is named first: a process killed by a signal (kill -9, the OOM
        killer, a reboot) before one that exited on its own, and the others after it."""
        self.rounds += 1
        asked = self._ask(self.handles)
        if asked is None:
            return ""
        exited, unanswered = asked
        if exited and not any(killed(code) for _, code in exited):
            # a process that exited by itself is often reacting to one that died after we
            # asked it, earlier in this round: ask the others once more before naming a cause
            gone = {id(h) for h, _ in exited}
            again = self._ask([h for h in self.handles if id(h) not in gone])
            exited += again[0] if again else []
        if exited:
            return self._exited(exited)
        if unanswered:
            return unanswered
        return self._router() if self.readiness_url else ""

    def _ask(self, handles: list[Handle]) -> tuple[list[tuple[Handle, int]], str] | None:
        """The processes among ``handles`` that exited, with their codes, and the first missed
        poll's problem ("" when none); None when the watch was stopped while asking."""
        exited: list[tuple[Handle, int]] = []
        unanswered = ""
        for handle in handles:
            if self._stop.is_set():
                return None
            code, problem = self._process(handle)
            if code is not None:
                exited.append((handle, code))
            unanswered = unanswered or problem
        return exited, unanswered

    def _process(self, handle: Handle) -> tuple[int | None, str]:
        """(its exit code or None, a missed poll's problem or "")."""
        spec = handle.spec
        try:
            code = self.executor.exit_code(handle)
        except Exception as exc:  # an SSH node that stopped answering
            return None, self._missed_poll(
                spec.node.name,
                f"node {spec.node.name} ({spec.node.host}) cannot be asked about {spec.name}: "
                f"{exc}",
            )
        self._missed.pop(spec.node.name, None)
        return code, ""

    def _exited(self, exited: list[tuple[Handle, int]]) -> str:
        ordered = sorted(exited, key=lambda pair: not killed(pair[1]))  # stable: then in order
        first, code = ordered[0]
        tail = self.executor.log_tail(first, self.log_lines)
        also = "; ".join(f"{_where(h)} (exit code {c})" for h, c in ordered[1:])
        return (
            f"{_where(first)} exited with code {code} during the run; the layout is no longer "
            f"what is measured" + (f"; also gone: {also}" if also else "")
            + f"; last lines of its log:\n{tail}"
        )  # fmt: skip

    def _router(self) -> str:
        from pytest_kimi.deploy.readiness import FormatError, readiness_count

        url = self.readiness_url
        assert url is not None
        try:
            status, body = self.fetch(url)
            healthy = readiness_count(status, body)
        except FormatError as exc:
            return self._missed_poll("router", f"the router's {url} cannot be read: {exc}")
        except Exception as exc:
            return self._missed_poll("router", f"the router ({url}) does not answer: {exc}")
        if healthy is not None and healthy >= self.replicas:
            self._missed.pop("router", None)
            return ""
        return self._missed_poll(
            "router",
            f"the router counts {healthy or 0} of {self.replicas} replicas healthy ({url}, "
            f"HTTP {status}): a replica was dropped during the run",
        )

    def _missed_poll(self, key: str, problem: str) -> str:
        self._missed[key] = self._missed.get(key, 0) + 1
        if self._missed[key] < self.misses:
            return ""
        return f"{problem} ({self._missed[key]} polls in a row, {self.interval_s:g}s apart)"


def _http_get(url: str) -> tuple[int, bytes]:
    from pytest_kimi.workload import http

    response = http.get(url, timeout=10.0)
    return response.status_code, response.content


@contextlib.contextmanager
def watching(watchdog: Watchdog | None, result: LayoutResult) -> Iterator[Watchdog | None]:
    """Watch while inside; on the way out stop the thread, and say on ``result`` what it saw
    that no measured run reported (a loss after the run was measured, a crash of its own)."""
    if watchdog is None:
        yield None
        return
    watchdog.start()
    try:
        yield watchdog
    finally:
        watchdog.stop()
        result.notes.extend(watchdog.notes())
        if watchdog.lost and watchdog.lost.split("\n")[0] not in result.error:
            result.notes.append("watchdog: " + watchdog.lost.split("\n")[0])


def abort_on_loss(abort: Abort) -> Callable[[str], None]:
    """The watchdog's ``on_lost`` that stops the measured run through ``abort``."""

    def on_lost(problem: str) -> None:
        abort.trip(f"watchdog: {problem}")

    return on_lost


def killed(code: int) -> bool:
    """An exit code that says a signal ended the process: negative (Popen), 128 + N (a
    shell), or a group that vanished without writing one (-9, ``remote.parse_exit_code``)."""
    return code < 0 or code > 128


def _where(handle: Handle) -> str:
    spec = handle.spec
    replica = f"replica {spec.replica}, " if spec.replica is not None else ""
    return f"{spec.name} ({replica}node {spec.node.name}, {spec.node.host})"
