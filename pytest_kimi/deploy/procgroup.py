"""Process groups: start a command in its own session, watch it, and stop many at once.

Everything a test, a benchmark or the local executor starts runs in its own session
(``setsid``), so its process group holds every process it starts in turn and stopping the
group stops all of them. Stopping is one sequence for any number of groups: TERM to every
group at once, one shared grace period, KILL for the rest, and a report of what survived.

A :class:`Lifeline` ties groups to this process's life: each group holds a tiny watcher that
kills the group when this process dies, however it dies (``kill -9`` included).

Signals for the process that owns the groups live here too: :func:`sigterm_as_interrupt`
lets SIGTERM unwind like Ctrl-C (so ``finally`` blocks stop the groups), :class:`Interrupts`
remembers a Ctrl-C that a library swallowed so a wait loop still acts on it, and
:func:`hold_signals` keeps Ctrl-C / SIGTERM from interrupting a teardown half-way.

Standard library only: the plugin imports this at start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

KILL_WAIT_S = 5.0  # after KILL: how long to wait for the kernel to take a group down


# The group's first shell: fd 0 is the lifeline's read end. It moves it to fd 3, gives itself
# /dev/null as stdin, starts the watcher in the background (stdin: the lifeline), closes fd 3,
# runs the caller's setup (``$1``) and execs the command: the command keeps the group leader's
# pid, so exit codes and pgid are as without a lifeline. The watcher's ``cat`` returns only at
# end-of-file: when every write end is closed, i.e. when the owner has died or closed it.
# ``kill -s KILL 0`` then kills the watcher's own process group: the command and everything it
# started (no pgid to look up, so no chance to hit a stranger's group).
_WATCHER = (
    "exec 3<&0 </dev/null\n"
    "{ cat >/dev/null; kill -s KILL 0; } <&3 >/dev/null 2>&1 &\n"
    "exec 3<&-\n"
    'eval "$1"; shift\n'
    'exec "$@"'
)


class Lifeline:
    """A pipe that ties process groups to this process's life.

    This process keeps the write end (close-on-exec, so no child inherits it; ``subprocess``
    closes every other descriptor in its children too). Every group started with it holds a
    watcher (``cat`` on the read end, then ``kill -s KILL 0``): when this process dies, even
    by SIGKILL, the kernel closes the write end, the watcher reads end-of-file and kills its
    whole group, the command's children included.

    Why a pipe and not ``prctl(PR_SET_PDEATHSIG)``: the parent-death signal fires when the
    *thread* that forked the child exits, not the process (our threads and pytest-xdist's
    start processes), it is lost across a set-uid exec, and it reaches only the direct child,
    not the grandchildren the command starts. A pipe closes only when the last holder of the
    write end is gone, and the watcher sits in the group it kills. A watcher per group (and
    not one per harness, sent pgids) never signals a group id that was reused. The watcher is
    ``sh`` and ``cat``: a few hundred kilobytes per group.

    :meth:`close` closes the write end: every group still alive is then killed (a safety net
    after a teardown that left something behind). A forked child of this process that does
    not exec (``multiprocessing`` with fork) would keep the write end open: we start none."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # both close-on-exec (PEP 446)

    @property
    def closed(self) -> bool:
        return self._write < 0

    def wrap(self, argv: Sequence[str], setup: str = "") -> list[str]:
        """``argv`` behind the watcher's shell; ``setup`` (shell lines) runs first, in the
        shell that then execs ``argv``, so what it sets reaches it."""
        return ["sh", "-c", _WATCHER, "sh", setup, *argv]

    def start(
        self,
        argv: Sequence[str],
        log: Path,
        *,
        setup: str = "",
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        append: bool = False,
    ) -> subprocess.Popen[bytes]:
        """:func:`start_group` with this lifeline: the group dies with this process."""
        if self.closed:
            raise RuntimeError("lifeline closed: its groups are being killed")
        return start_group(
            self.wrap(argv, setup), log, env=env, cwd=cwd, append=append, stdin=self._read
        )

    def start_reaper(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A process (its own session, output discarded) whose stdin is the lifeline: ``argv``
        reads it to end-of-file, i.e. until this process dies or closes the lifeline, and
        then acts (``sh -c 'cat >/dev/null; exec scancel JOB'``): for what a process group
        cannot take down, such as a Slurm job on other machines."""
        if self.closed:
            raise RuntimeError("lifeline closed: its groups are being killed")
        return subprocess.Popen(list(argv), stdin=self._read, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env=None if env is None else dict(env))  # fmt: skip

    def close(self) -> None:
        """Cut the lifeline: every group started with it that is still alive is killed."""
        for fd in (self._write, self._read):
            if fd >= 0:
                os.close(fd)
        self._read = self._write = -1


def start_group(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    append: bool = False,
    stdin: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its pid is its process-group id), stdin from
    /dev/null (or the descriptor ``stdin``), stdout and stderr to ``log`` (created with its
    folder; appended to if ``append``). ``env=None`` inherits this process's environment."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab" if append else "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )


def signal_group(pgid: int, sig: signal.Signals | str) -> None:
    """Send ``sig`` (a signal, or a name such as ``"TERM"``) to every process of a group; a
    group that is already gone is not an error."""
    if isinstance(sig, str):
        sig = signal.Signals[f"SIG{sig}"]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether a process group still has a live (non-zombie) member, from /proc. The group's
    leader is asked first: while it lives (most of a teardown's polls) one file answers, not
    a read of every process on the machine."""
    if _live_in_group(str(pgid), pgid):
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: fall back to a signal probe
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return any(entry.isdigit() and _live_in_group(entry, pgid) for entry in entries)


def _live_in_group(pid: str, pgid: int) -> bool:
    """Whether process ``pid`` exists, is no zombie, and belongs to group ``pgid``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid


def popen_alive(popen: subprocess.Popen) -> bool:
    """Whether the group led by our child ``popen`` has a live member. The leader is reaped
    after the check, so one that exited does not linger as a zombie and keeps its exit code:
    reaping first would race a leader that exits between the reap and the check."""
    alive = group_alive(popen.pid)  # zombies do not count
    popen.poll()  # when nothing was alive, the leader had exited: this reaps it
    return alive


def stop_all(
    items: Sequence[T],
    send: Callable[[T, str], None],
    alive: Callable[[T], bool],
    *,
    grace_s: float,
    kill_wait_s: float = KILL_WAIT_S,
    poll_s: float = 0.05,
    on_kill: Callable[[T], None] = lambda item: None,
) -> list[T]:
    """Stop many things at once, the one way: ``send(item, "TERM")`` to every item, poll
    ``alive`` until all are gone or ``grace_s`` passed (one grace period for all of them,
    not one each), ``send(item, "KILL")`` to the rest (``on_kill`` hears of each), poll
    again up to ``kill_wait_s``. Returns the items still alive. A ``send`` that raises is
    skipped (whether the item is gone is for ``alive`` to say); ``alive`` decides what an
    item it cannot ask counts as."""
    remaining = list(items)
    for sig, wait_s in (("TERM", grace_s), ("KILL", kill_wait_s)):
        for item in remaining:
            if sig == "KILL":
                on_kill(item)
            try:
                send(item, sig)
            except Exception:
                continue
        remaining = _wait_gone(remaining, alive, wait_s, poll_s)
        if not remaining:
            break
    return remaining


def _wait_gone(
    items: list[T], alive: Callable[[T], bool], timeout_s: float, poll_s: float
) -> list[T]:
    """Poll (at least once) until no item is alive or ``timeout_s`` passed; those alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        items = [item for item in items if alive(item)]
        if not items or time.monotonic() >= deadline:
            return items
        time.sleep(poll_s)


def stop_groups(
    popens: Sequence[subprocess.Popen],
    grace_s: float = 10.0,
    *,
    kill_wait_s: float = KILL_WAIT_S,
    poll_s: float = 0.02,
) -> list[subprocess.Popen]:
    """:func:`stop_all` for groups this process started (:func:`start_group`): TERM every
    group, KILL what is left after ``grace_s``; returns those with a member still alive."""

    def send(popen: subprocess.Popen, name: str) -> None:
        signal_group(popen.pid, name)

    alive = stop_all(
        popens, send, popen_alive, grace_s=grace_s, kill_wait_s=kill_wait_s, poll_s=poll_s
    )
    for popen in popens:  # a leader can die between its reap and the group check: reap it
        popen.poll()
    return alive


def interrupt(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt that stands for signal ``signum`` ("signal SIGTERM")."""
    return KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def handling(
    signals: Sequence[signal.Signals], handler: Callable[[int, object], None]
) -> Iterator[None]:
    """While inside: ``handler`` for each of ``signals``; the previous handlers restored on
    exit. Only the main thread can set handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def sigterm_as_interrupt() -> contextlib.AbstractContextManager[None]:
    """Let SIGTERM unwind like Ctrl-C (KeyboardInterrupt), so ``finally`` blocks and context
    managers stop what they started and nothing is orphaned (:func:`handling`)."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise interrupt(signum)

    return handling((signal.SIGTERM,), raise_interrupt)


class Interrupts:
    """Ctrl-C and SIGTERM while a deployment comes up: raised where they land, and remembered.

    Python raises a signal's KeyboardInterrupt wherever the main thread happens to be, and
    a library may swallow it there: paramiko's ``Channel.__del__`` wraps its close in a bare
    ``except:``, and a finalizer runs wherever the garbage collector does; an exception in any
    other finalizer is printed and dropped. A bring-up polls for many minutes, so a Ctrl-C lost
    that way would be ignored until the start-up timeout. Inside :meth:`raised`, every wait
    loop calls :meth:`check` each round: a signal that did not unwind is raised again there,
    naming where it first landed."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal that arrived, if any
        self.where = ""  # file:line of the code it interrupted

    def note(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum, self.where = signum, _place(frame)

    def check(self) -> None:
        """Raise the signal that arrived, if one did. Called where a KeyboardInterrupt that
        unwound would never arrive, so one that did arrive was swallowed on its way."""
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            self.signum = None  # raised from our own code now: it unwinds from here
            raise KeyboardInterrupt(
                f"signal {name} (it first landed in {self.where}, where it was swallowed)"
            )

    @contextlib.contextmanager
    def raised(
        self, signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM)
    ) -> Iterator[None]:
        """While inside: each of ``signals`` raises :func:`interrupt` and is noted. Leaving,
        a noted signal that did not unwind the block is raised, over a failure it may have
        caused: the user asked to stop, and the next layout must not start."""

        def note_and_raise(signum: int, frame: object) -> None:
            self.note(signum, frame)
            raise interrupt(signum)

        with handling(signals, note_and_raise):
            try:
                yield
            except KeyboardInterrupt:
                raise
            except BaseException:
                self.check()
                raise
        self.check()


def _place(frame: object) -> str:
    """``file:line in function`` of a signal handler's frame (the code it interrupted)."""
    code = getattr(frame, "f_code", None)
    if code is None:
        return "an unknown place"
    return f"{code.co_filename}:{getattr(frame, 'f_lineno', '?')} in {code.co_name}"


def hold_signals(
    on_signal: Callable[[int], None],
    signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> contextlib.AbstractContextManager[None]:
    """While inside (a teardown): Ctrl-C / SIGTERM call ``on_signal(signum)`` instead of
    unwinding, because giving up half-way would leave processes running; the caller delivers
    the signal afterwards (``raise interrupt(signum)``)."""
    return handling(signals, lambda signum, frame: on_signal(signum))
