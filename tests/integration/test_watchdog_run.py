"""The watchdog on the mock: a node process lost mid-run stops the run at once, naming it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_kimi.testing.processes import pytest_argv

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
CLUSTER = (Path(__file__).parent / "small_cluster.yaml").read_text()
PERF_TEST = (ROOT / "tests" / "perf" / "test_speedbench.py").read_text()
MARK = b"KIMI_TEST_VICTIM=replica1-rank1"


def _measured_in_journal(out: Path) -> int:
    """Measured requests finished so far (the flushed journal of layout ``wide``)."""
    partial = list(out.glob("*/wide/records.partial.jsonl"))
    if not partial:
        return 0
    lines = partial[0].read_text().splitlines()
    return sum(1 for x in lines if x.endswith("}") and json.loads(x)["index"] >= 0)


def _victim(mark: bytes = MARK) -> int | None:
    """The process whose environment carries ``mark``: node n4, replica 1's rank 1."""
    return next(iter(pids_where(lambda pid: mark in _proc(pid, "environ"))), None)


def pids_where(test: Callable[[str], bool]) -> list[int]:
    """Live processes (by /proc entry) for which ``test(pid)`` holds."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if test(entry):
                    out.append(int(entry))
            except OSError:  # exited meanwhile
                continue
    return out


def _proc(pid: str, name: str) -> list[bytes]:
    """``/proc/<pid>/<name>`` split at NULs (environ, cmdline)."""
    return Path(f"/proc/{pid}/{name}").read_bytes().split(b"\0")


def run_with_fault(
    argv: list[str], cwd: Path, log: Path, when: Callable[[], bool], fault: Callable[[], None]
) -> int:
    """Run ``argv``; call ``fault()`` once ``when()`` holds (it must, while the run lives);
    return the run's exit code."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not when():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(0.02)
            fault()
            return proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_rank1_process_killed_mid_run_fails_the_layout_at_once_naming_it(
    pytester: pytest.Pytester, leftovers
):
    pytester.makepyfile(test_speedbench=PERF_TEST)
    cluster = (
        CLUSTER.replace(
            "  - {name: n4, host: 127.0.0.1, gpus: 4}",
            "  - {name: n4, host: 127.0.0.1, gpus: 4, env: {KIMI_TEST_VICTIM: replica1-rank1}}",
        )
        .replace("time_scale: 400", "time_scale: 8")
        .replace("num_requests: 6", "num_requests: 24")
    ) + "watchdog: {interval_s: 0.3}\n"
    pytester.makefile(".yaml", cluster=cluster)
    out = pytester.path / "out"
    argv = [*pytest_argv(), "--cluster=cluster.yaml", "--layout=wide",
            "--kimi-report-dir=out", "-p", "no:cacheprovider", "-v"]  # fmt: skip
    log = pytester.path / "run.log"

    def kill_victim() -> None:
        victim = _victim()
        assert victim is not None
        os.killpg(os.getpgid(victim), signal.SIGKILL)

    # requests in flight: the run is measured
    code = run_with_fault(argv, pytester.path, log, lambda: _measured_in_journal(out) >= 1,
                          kill_victim)  # fmt: skip
    text = log.read_text()
    assert code == pytest.ExitCode.TESTS_FAILED, text[-4000:]
    [run] = list(out.iterdir())
    summary = json.loads((run / "wide" / "summary.json").read_text())
    assert summary["complete"] is False
    error = summary["error"]
    assert error.startswith("run interrupted after "), error
    assert (
        "RunAborted: watchdog: replica1-node1-n4 (replica 1, node n4, 127.0.0.1) exited " in error
    )
    assert "last lines of its log:" in error
    records = [json.loads(x) for x in (run / "wide" / "records.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) < 24  # stopped, not measured to the end on replica 0 alone
    assert any(r["success"] for r in measured)  # what finished before is kept
    assert not (run / "wide" / "records.partial.jsonl").exists()
    assert "torn down" in text
    assert leftovers(pytester.path) == []
