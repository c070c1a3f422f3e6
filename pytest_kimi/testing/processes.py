"""Child processes for tests and benchmarks: mock servers, the router, peer tools.

Each runs in its own session (so its process group holds everything it starts), writes its
output to a log file, and is stopped as a group: TERM, then KILL, then a check that nothing
of the group is left (:mod:`pytest_kimi.deploy.procgroup`, as the local executor does). Only
loopback URLs are ever polled.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from pytest_kimi.deploy.procgroup import start_group, stop_groups
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR
from pytest_kimi.workload import http


class ProcessError(AssertionError):
    """A child exited early, never answered, or left part of its group running."""


NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""For a child pytest run: hypothesis's plugin imports all of hypothesis at configure (about
1.4 s of CPU per run, a tenth of a small mission on the mock) and no child run uses it."""


def pytest_argv(*args: str) -> list[str]:
    """``python -m pytest`` as a test starts a child run of the product (without
    :data:`NO_HYPOTHESIS`'s plugin), then ``args``."""
    return [sys.executable, "-m", "pytest", *NO_HYPOTHESIS, *args]


def mock_argv(port: int, *flags: str) -> list[str]:
    """A mock SGLang server on ``127.0.0.1:port`` with the shipped tokenizer."""
    return [
        sys.executable, "-m", "pytest_kimi.mock.launch_server",
        "--model-path", str(TOKENIZER_DIR), "--host", "127.0.0.1", "--port", str(port),
        *flags,
    ]  # fmt: skip


class Proc:
    """A started process with its log; :meth:`stop` ends its whole group."""

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        self.popen = start_group(argv, log, env=env, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def wait_http(self, url: str, timeout_s: float = 30.0) -> None:
        """Until ``url`` answers 2xx; fails at once, with the log, if the process exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise ProcessError(f"process exited {self.popen.returncode}:\n{self.text()}")
            try:
                if http.get(url, timeout=1.0).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise ProcessError(f"{url} not up after {timeout_s:g}s:\n{self.text()}")

    def stop(self, grace_s: float = 10.0) -> None:
        """TERM the group, KILL what is left of it after ``grace_s``; raise if any of it is
        still alive after that."""
        if stop_groups([self.popen], grace_s):
            raise ProcessError(f"process group {self.pid} left running")


def ctrl_c_as_at_a_terminal() -> None:
    """In a child about to exec: SIGINT back to its default. A harness started in the
    background of a non-interactive shell (``cmd &``) has SIGINT ignored, children inherit
    that across exec, and Python then never installs its Ctrl-C handler: the test's "Ctrl-C"
    would do nothing, which is not what a user's terminal does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_when(
    argv: Sequence[str],
    log: Path,
    ready: Callable[[str], bool],
    sig: signal.Signals,
    *,
    cwd: Path,
    timeout_s: float = 90.0,
) -> tuple[int, str]:
    """Run ``argv`` (output to ``log``), send ``sig`` once ``ready(output so far)``, wait for
    it to exit; return (exit code, output). Fails with the output if it exits or stalls first."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=ctrl_c_as_at_a_terminal)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout_s
            while not ready(log.read_text(errors="replace")):
                text = log.read_text(errors="replace")[-4000:]
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ProcessError(f"exited or stalled before the signal:\n{text}")
                time.sleep(0.02)
            proc.send_signal(sig)
            code = proc.wait(timeout=timeout_s)
        finally:
            _stop(proc, timeout_s)
    return code, log.read_text(errors="replace")


def _stop(proc: subprocess.Popen, timeout_s: float) -> None:
    """A run the test gave up on still tears down: SIGTERM first (the harness stops every
    node's processes on it), SIGKILL only if it does not exit. Killing it outright would leave
    its servers running on the nodes and fail every later test on "port in use"."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def shipped_mission(work: Path, *args: str, time_scale: int = 200) -> Path:
    """The user's benchmark file on the shipped ``clusters/local.yaml`` played at
    ``time_scale`` (5x the shipped 40: on the mock's one clock, cluster time does not depend
    on it), with ``args`` (``--layout=...``, ``--kimi-workload=...``), in ``work``; every test
    must pass. The run folder."""
    root = Path(__file__).parents[2]
    (work / "test_speedbench.py").write_text((root / "tests/perf/test_speedbench.py").read_text())
    shipped = (root / "clusters" / "local.yaml").read_text()
    assert "\n  time_scale: 40 " in shipped
    (work / "local.yaml").write_text(
        shipped.replace("\n  time_scale: 40 ", f"\n  time_scale: {time_scale} "))
    done = subprocess.run(
        [*pytest_argv(), "--cluster=local.yaml", *args, "--kimi-report-dir=out",
         "-p", "no:cacheprovider", "-q", "test_speedbench.py"],
        cwd=work, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    [run] = list((work / "out").iterdir())
    return run
