"""pytest_kimi.deploy.procgroup with real child processes: groups are stopped whole, TERM-ignoring
members are KILLed after the grace period, and the signal context managers do what they say."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_kimi.deploy.procgroup import (
    Interrupts,
    Lifeline,
    group_alive,
    hold_signals,
    popen_alive,
    sigterm_as_interrupt,
    start_group,
    stop_all,
    stop_groups,
)

# the leader starts a grandchild (same group), prints its pid, and both wait
WITH_GRANDCHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    "print('grandchild', child.pid, flush=True)\n"
    "time.sleep(300)\n"
)
# ignores TERM: only KILL ends it
IGNORES_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('up', flush=True)\n"
    "time.sleep(300)\n"
)
UP = "import time; print('up', flush=True); time.sleep(300)"


def _until(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _started(argv: list[str], log: Path, marker: str = "up") -> subprocess.Popen:
    popen = start_group(argv, log)
    _until(lambda: marker in log.read_text(), f"{marker!r} in {log.name}")
    return popen


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a killed grandchild is reaped by init, not by us)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_a_group_with_a_grandchild_is_stopped_whole(tmp_path: Path):
    log = tmp_path / "tree.log"
    leader = _started([sys.executable, "-c", WITH_GRANDCHILD], log, "grandchild")
    grandchild = int(log.read_text().split()[1])
    assert os.getsid(leader.pid) == leader.pid  # its own session ...
    assert os.getpgid(grandchild) == leader.pid  # ... and the grandchild is in its group
    assert popen_alive(leader)

    assert stop_groups([leader], grace_s=10.0) == []
    assert not _pid_alive(grandchild) and not group_alive(leader.pid)
    assert leader.returncode == -signal.SIGTERM  # reaped; TERM was enough


def _ignores_term(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def test_a_term_ignoring_member_is_killed_after_the_shared_grace(tmp_path: Path):
    polite = _started([sys.executable, "-c", UP], tmp_path / "polite.log")
    stubborn = _started([sys.executable, "-c", IGNORES_TERM], tmp_path / "stubborn.log")
    assert _ignores_term(stubborn.pid) and not _ignores_term(polite.pid)

    assert stop_groups([polite, stubborn], grace_s=0.5) == []
    assert stubborn.returncode == -signal.SIGKILL  # TERM could not end it; KILL did
    assert polite.returncode == -signal.SIGTERM  # the other group was never KILLed
    assert not group_alive(polite.pid) and not group_alive(stubborn.pid)


def test_stop_all_terms_everything_first_and_kills_only_survivors():
    sent: list[tuple[str, str]] = []
    gone: set[str] = set()

    def send(item: str, name: str) -> None:
        sent.append((item, name))
        if item == "unreachable":
            raise OSError("node down")
        if (name == "TERM" and item == "polite") or (name == "KILL" and item != "immortal"):
            gone.add(item)

    items = ["polite", "stubborn", "unreachable", "immortal"]
    alive = stop_all(items, send, lambda item: item not in gone and item != "unreachable",
                     grace_s=0.0, kill_wait_s=0.0)  # fmt: skip
    assert sent[:4] == [(item, "TERM") for item in items]  # all TERMed before any KILL
    assert sent[4:] == [("stubborn", "KILL"), ("immortal", "KILL")]
    assert alive == ["immortal"]


def test_start_group_logs_output_with_env_cwd_and_no_stdin(tmp_path: Path):
    log = tmp_path / "logs" / "child.log"  # the folder is created
    code = "import os, sys; print(os.environ['X'], os.getcwd(), repr(sys.stdin.read()))"
    popen = start_group([sys.executable, "-c", code], log, env={**os.environ, "X": "yes"},
                        cwd=tmp_path)  # fmt: skip
    assert popen.wait(timeout=30) == 0
    assert log.read_text().split() == ["yes", str(tmp_path), "''"]
    again = start_group([sys.executable, "-c", "print('again')"], log, append=True)
    assert again.wait(timeout=30) == 0
    assert log.read_text().splitlines()[-1] == "again" and "yes" in log.read_text()


def test_a_finished_leader_does_not_count_as_alive(tmp_path: Path):
    popen = start_group([sys.executable, "-c", "pass"], tmp_path / "quick.log")
    _until(lambda: not popen_alive(popen), "the group to end")
    assert popen.returncode == 0  # popen_alive reaped it
    assert stop_groups([popen]) == []  # stopping a finished group is fine


def _real_sigterm_to_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    _until(lambda: False, "the SIGTERM handler", timeout_s=10.0)  # it raises before this ends


def test_sigterm_as_interrupt_turns_a_real_sigterm_into_keyboard_interrupt():
    def marker(signum, frame):
        raise AssertionError("the previous handler ran")

    original = signal.signal(signal.SIGTERM, marker)
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_as_interrupt():
            _real_sigterm_to_self()
        assert signal.getsignal(signal.SIGTERM) is marker  # restored
    finally:
        signal.signal(signal.SIGTERM, original)


def test_sigterm_as_interrupt_is_a_no_op_off_the_main_thread():
    seen: list[object] = []

    def in_thread() -> None:
        with sigterm_as_interrupt():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen == [before]


def test_hold_signals_notes_ctrl_c_and_sigterm_and_restores_the_handlers():
    held: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with hold_signals(held.append):
        for sig in (signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), sig)
            _until(lambda sig=sig: sig in held, f"{sig.name} to be held")
    assert held == [signal.SIGINT, signal.SIGTERM]  # neither unwound the block
    assert {sig: signal.getsignal(sig) for sig in before} == before


def _swallowed(sig: signal.Signals) -> None:
    """A signal that lands in a library's bare ``except:`` (paramiko's Channel.__del__)."""
    with contextlib.suppress(BaseException):  # the library's bare except, on purpose
        signal.raise_signal(sig)  # its Python handler runs before this returns


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_swallowed_signal_is_raised_again_at_the_next_check_naming_where_it_landed(sig):
    interrupts = Interrupts()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with interrupts.raised():
        interrupts.check()  # nothing arrived: nothing to raise
        _swallowed(sig)
        landed = rf"{sig.name} \(it first landed in .*test_procgroup.py:\d+ in _swallowed"
        with pytest.raises(KeyboardInterrupt, match=landed):
            interrupts.check()
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_swallowed_signal_is_raised_on_leaving_even_over_another_failure():
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt, match="SIGINT"), interrupts.raised():
        _swallowed(signal.SIGINT)  # nothing polls after this
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt, match="SIGINT") as info, interrupts.raised():
        _swallowed(signal.SIGINT)
        raise RuntimeError("bring-up failed for another reason meanwhile")
    assert isinstance(info.value.__context__, RuntimeError)  # kept, as the cause's context
    with Interrupts().raised():  # no signal: leaves quietly
        pass


def test_a_signal_inside_raised_unwinds_where_it_lands():
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt, match="SIGINT"), interrupts.raised():
        signal.raise_signal(signal.SIGINT)
    assert interrupts.signum == signal.SIGINT


# a harness in miniature: starts a group on a lifeline, says the group id, then waits to die
HARNESS = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from pytest_kimi.deploy.procgroup import Lifeline\n"
    "line = Lifeline()\n"
    "child = {tree!r}\n"
    "popen = line.start([sys.executable, '-c', child], Path(sys.argv[1]))\n"
    "print(popen.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def test_a_lifeline_group_dies_with_its_harness_even_by_sigkill(tmp_path: Path):
    log = tmp_path / "tree.log"
    script = HARNESS.format(tree=WITH_GRANDCHILD)
    harness = subprocess.Popen(
        [sys.executable, "-c", script, str(log)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    try:
        assert harness.stdout is not None
        pgid = int(harness.stdout.readline())
        _until(lambda: "grandchild" in log.read_text(), "the grandchild")
        grandchild = int(log.read_text().split()[1])
        assert os.getpgid(grandchild) == pgid and group_alive(pgid)
        harness.kill()  # SIGKILL: no finally, no atexit, only the kernel closes the pipe
        harness.wait()
        _until(lambda: not group_alive(pgid), "the group to die with its harness")
    finally:
        if harness.poll() is None:
            harness.kill()
    assert not _pid_alive(grandchild)


def test_closing_a_lifeline_kills_its_groups_and_keeps_exit_codes_and_setup(tmp_path: Path):
    line = Lifeline()
    try:
        done = line.start(["sh", "-c", 'echo "x=$X"; exit 7'], tmp_path / "done.log",
                          setup="X=5; export X")  # fmt: skip
        assert done.wait(timeout=30) == 7  # the command is the leader: its own exit code
        assert (tmp_path / "done.log").read_text() == "x=5\n"
        log = tmp_path / "tree.log"
        tree = line.start([sys.executable, "-c", WITH_GRANDCHILD], log)
        _until(lambda: "grandchild" in log.read_text(), "the grandchild")
        assert os.getsid(tree.pid) == tree.pid and group_alive(tree.pid)
    finally:
        line.close()
    _until(lambda: not popen_alive(tree), "the group to die when the lifeline is cut")
    assert tree.returncode == -signal.SIGKILL
    with pytest.raises(RuntimeError, match="lifeline closed"):
        line.start(["true"], tmp_path / "late.log")
