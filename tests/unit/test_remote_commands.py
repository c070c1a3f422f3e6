"""The SSH executor's shell (pytest_kimi.deploy.remote) run locally by bash, as sshd runs it in
a login shell that is bash: a process starts detached in its own group with values passed
literally, and the status commands read it back. (tests/ssh runs them over real SSH.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.deploy import remote
from pytest_kimi.deploy.plan import ProcessSpec


def _sh(command: str) -> str:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30,
                          check=False, stdin=subprocess.DEVNULL).stdout  # fmt: skip


def _until_exited(files: remote.RemoteFiles, pgid: int) -> int:
    deadline = time.monotonic() + 30
    while (code := remote.parse_exit_code(_sh(remote.exit_code(files, pgid)))) is None:
        assert time.monotonic() < deadline, "the process did not exit"
        time.sleep(0.02)
    return code


def test_start_passes_values_literally_and_the_status_commands_read_it(tmp_path: Path):
    canary = tmp_path / "pwned"
    value = f"$(touch {canary}) `touch {canary}` ; touch {canary} 'q\" \\ \n"
    node = Node("n0", "127.0.0.1", 1)
    code = "import os, sys; print(sys.argv[1] == os.environ['V']); sys.exit(3)"
    spec = ProcessSpec("p0", node, (sys.executable, "-c", code, value), env={"V": value})
    files = remote.RemoteFiles.of(str(tmp_path / "run dir"), spec)
    _sh(remote.mkdir(str(tmp_path / "run dir")))

    pgid = remote.parse_pid(_sh(remote.start(spec, files)))
    assert pgid is not None and _sh(remote.read_pid_file(files)).strip() == str(pgid)
    assert _until_exited(files, pgid) == 3
    assert Path(files.log).read_text() == "True\n" and not canary.exists()
    assert int(_sh(remote.size(files.log))) == len("True\n")
    assert _sh(remote.tail(files.log, 1)) == "True\n"


def test_a_group_is_alive_until_signalled(tmp_path: Path):
    spec = ProcessSpec("p1", Node("n0", "127.0.0.1", 1), ("sleep", "300"))
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    pgid = remote.parse_pid(_sh(remote.start(spec, files)))
    assert pgid is not None and remote.any_alive(_sh(remote.group_stats(pgid)))
    _sh(remote.signal_group(pgid, "KILL"))
    deadline = time.monotonic() + 30
    while remote.any_alive(_sh(remote.group_stats(pgid))):
        assert time.monotonic() < deadline, "the group survived KILL"
        time.sleep(0.02)
    assert _until_exited(files, pgid) == -9  # the whole group, sh too: no exit code written


def test_status_parsing_and_signal_names():
    assert remote.parse_exit_code("running\n") is None
    assert remote.parse_exit_code("gone\n") == -9
    assert remote.parse_exit_code("-2\n") == -2
    assert remote.any_alive("Z\nSs\n") and not remote.any_alive("Z+\n\n")
    assert remote.parse_pid("noise\n123\n") == 123 and remote.parse_pid("") is None
    with pytest.raises(ValueError):
        remote.signal_group(1, "HUP; rm -rf /")
