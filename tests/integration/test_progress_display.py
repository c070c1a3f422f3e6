"""Progress on the real plugin: plain lines when output is not a terminal; the live (rich)
display under a pseudo-terminal, with the run still passing and nothing left running."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from pytest_kimi.testing.processes import pytest_argv

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
SMALL_CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()
ARGS = [
    "--cluster=cluster.yaml",
    "--layout=wide",
    "--kimi-report-dir=out",
    "-p",
    "no:cacheprovider",
]
CURSOR_HIDE = "\x1b[?25l"  # rich's Live hides the cursor while it draws


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    return pytester


def test_not_a_terminal_prints_plain_lines(project: pytest.Pytester, leftovers):
    result = project.runpytest_subprocess(*ARGS)  # stdout is a pipe
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "[[]kimi wide[]] bringing up TP8/PP1/EP2 x2",
            "[[]kimi wide[]] replica0-node0-n1 on n1 healthy after *s",
            "[[]kimi wide[]] router ready at http://127.0.0.1:* after *s",
            "[[]kimi wide[]] measuring 6 requests",
            "[[]kimi wide[]] 1/6 requests done (17%), * in flight, * output tok/s, *s cluster "
            "time, 0 failed",
            "[[]kimi wide[]] 6/6 requests done (100%), 0 in flight, * output tok/s, *s cluster "
            "time, 0 failed",
            "[[]kimi wide[]] measured 6/6 requests in *s cluster time (*s wall), * output tok/s, "
            "0 failed",
        ]
    )
    text = result.stdout.str()
    assert text.count(" healthy after ") == 4  # one line per node (2 replicas x 2 nodes)
    assert CURSOR_HIDE not in text and "\x1b[2K" not in text  # no cursor control
    assert not leftovers(project.path)


def test_off_prints_no_progress(project: pytest.Pytester):
    result = project.runpytest_subprocess(*ARGS, "--kimi-progress=off")
    result.assert_outcomes(passed=5)
    text = result.stdout.str()
    assert "] bringing up " in text  # what the run says is still said
    assert "healthy after" not in text and "requests done" not in text


def run_in_pty(argv: list[str], cwd: Path, columns: int = 120) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin/stdout/stderr; its exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while select.select([master], [], [], 600)[0]:  # a hung run fails, not hangs
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        code = proc.wait(timeout=60)
    return code, b"".join(chunks).decode(errors="replace")


def test_terminal_gets_the_live_display(project: pytest.Pytester, leftovers):
    code, text = run_in_pty([*pytest_argv(), *ARGS], project.path)
    assert code == 0, text[-3000:]
    assert "5 passed" in text
    assert CURSOR_HIDE in text  # rich drew a live area
    assert "[kimi wide] bring-up: 5/5 ready" in text  # the table's final frame
    assert "│ n4   │ replica1-node1-n4 │ server replica 1 rank 1 │" in text
    assert "6/6 done · 0 in flight · " in text  # the bar's final frame
    assert "requests done (" not in text  # not the plain lines
    assert "Traceback" not in text
    assert not leftovers(project.path)
