"""The SSH executor's shell (pytest_kimi.deploy.remote) run locally by bash and dash (a login
shell may be either): a process starts detached in its own group with values passed literally,
its environment from a file it removes (never on a command line), its setup lines in the same
shell, and the status commands read it back. (tests/ssh runs them over real SSH.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.deploy import remote
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.secrets import env_file_text


def _sh(command: str, shell: str = "bash") -> str:
    return subprocess.run([shell, "-c", command], capture_output=True, text=True, timeout=30,
                          check=False, stdin=subprocess.DEVNULL).stdout  # fmt: skip


def _write_env(spec: ProcessSpec, files: remote.RemoteFiles) -> str:
    """As the SSH executor does over SFTP: 0600 before the content."""
    path = Path(files.env)
    path.touch(mode=0o600)
    path.write_text(env_file_text(spec.launch_env))
    return files.env


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
    assert (tmp_path / "run dir").stat().st_mode & 0o777 == 0o700

    command = remote.start(spec, files, _write_env(spec, files))
    assert "V=" not in command  # the variable is in the file, not on the command line
    pgid = remote.parse_pid(_sh(command))
    assert pgid is not None and _sh(remote.read_pid_file(files)).strip() == str(pgid)
    assert _until_exited(files, pgid) == 3
    assert Path(files.log).read_text() == "True\n" and not canary.exists()
    assert not Path(files.env).exists()  # read, then removed by the process's shell
    assert int(_sh(remote.size(files.log))) == len("True\n")
    assert _sh(remote.tail(files.log, 1)) == "True\n"


@pytest.mark.parametrize("shell", ["dash", "bash"])
@pytest.mark.parametrize("name", ["TERM", "KILL"])
def test_a_group_is_alive_until_signalled(tmp_path: Path, shell: str, name: str):
    # dash (sh on Debian) reads `kill -TERM -- -PGID` as an illegal number: the group lived on
    spec = ProcessSpec("p1", Node("n0", "127.0.0.1", 1), ("sleep", "300"))
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    pgid = remote.parse_pid(_sh(remote.start(spec, files), shell))
    assert pgid is not None and remote.any_alive(_sh(remote.group_stats(pgid)))
    _sh(remote.signal_group(pgid, name), shell)
    deadline = time.monotonic() + 30
    while remote.any_alive(_sh(remote.group_stats(pgid))):
        assert time.monotonic() < deadline, "the group survived KILL"
        time.sleep(0.02)
    # KILL: the whole group, its shell too: no exit code written; TERM: the shell (which
    # catches it) writes the code the command died with
    assert _until_exited(files, pgid) == (-9 if name == "KILL" else 128 + 15)


def test_the_secret_is_in_the_process_environment_and_in_no_command_line(tmp_path: Path):
    secret = "hf_unit_secret_8734"
    node = Node("n0", "127.0.0.1", 1)
    spec = ProcessSpec("p2", node, ("sleep", "300"), env={"A": "1"},
                       secret_env={"HF_TOKEN": secret})  # fmt: skip
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    pgid = remote.parse_pid(_sh(remote.start(spec, files, _write_env(spec, files))))
    assert pgid is not None
    try:
        deadline = time.monotonic() + 30
        while not (pids := _group(pgid, "sleep")):
            assert time.monotonic() < deadline, "sleep did not start"
            time.sleep(0.02)
        environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
        assert f"HF_TOKEN={secret}".encode() in environ and b"A=1" in environ
        for pid in _group(pgid):
            assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        _sh(remote.signal_group(pgid, "KILL"))
    assert "HF_TOKEN='***'" in spec.command_line() and secret not in repr(spec)
    assert secret not in spec.command_line() and secret in spec.command_line(redact=False)


def _group(pgid: int, comm: str | None = None) -> list[int]:
    out = _sh(f"ps -o pid=,comm= -g {pgid}")
    rows = [line.split(None, 1) for line in out.splitlines() if line.strip()]
    return [int(pid) for pid, name in rows if comm is None or name.strip() == comm]


def test_setup_lines_run_in_the_same_shell_and_a_failing_one_stops_the_start(tmp_path: Path):
    node = Node("n0", "127.0.0.1", 1)
    code = "import os; print(os.environ['FROM_SETUP'])"
    setup = ("FROM_SETUP='set up # not a comment'; export FROM_SETUP  # a comment",)
    spec = ProcessSpec("p3", node, (sys.executable, "-c", code), setup=setup)
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    assert _until_exited(files, remote.parse_pid(_sh(remote.start(spec, files), "dash"))) == 0
    assert Path(files.log).read_text() == "set up # not a comment\n"

    failing = ProcessSpec("p4", node, (sys.executable, "-c", "print('ran')"),
                          setup=("true", "echo activating; exit 7", "echo never"))  # fmt: skip
    files = remote.RemoteFiles.of(str(tmp_path), failing)
    assert _until_exited(files, remote.parse_pid(_sh(remote.start(failing, files)))) == 7
    log = Path(files.log).read_text()
    assert "activating" in log and "ran" not in log and "never" not in log


def test_status_parsing_and_signal_names():
    assert remote.parse_exit_code("running\n") is None
    assert remote.parse_exit_code("gone\n") == -9
    assert remote.parse_exit_code("-2\n") == -2
    assert remote.any_alive("Z\nSs\n") and not remote.any_alive("Z+\n\n")
    assert remote.parse_pid("noise\n123\n") == 123 and remote.parse_pid("") is None
    with pytest.raises(ValueError):
        remote.signal_group(1, "HUP; rm -rf /")


def test_a_probe_runs_with_the_process_environment_and_setup_and_removes_the_file(tmp_path: Path):
    secret = "hf_probe_secret_4411"
    spec = ProcessSpec(
        "p2", Node("n0", "127.0.0.1", 1), ("true",), env={"A": "from-env"},
        secret_env={"HF_TOKEN": secret}, setup=("export B=from-setup",),
    )  # fmt: skip
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    script = remote.probe_script(spec, 'echo "$A $B ${#HF_TOKEN}"', _write_env(spec, files))
    assert secret not in script and "from-env" not in script
    assert _sh(script, "dash") == f"from-env from-setup {len(secret)}\n"
    assert not Path(files.env).exists()


def _until_gone(pgid: int) -> None:
    deadline = time.monotonic() + 30
    while remote.any_alive(_sh(remote.group_stats(pgid))):
        assert time.monotonic() < deadline, "the group outlived its maximum lifetime"
        time.sleep(0.02)


def test_every_process_runs_under_a_maximum_lifetime_in_our_own_group():
    spec = ProcessSpec("p5", Node("n0", "127.0.0.1", 1), ("sleep", "300"))
    command = remote.start(spec, remote.RemoteFiles.of("/w/run", spec))
    assert "timeout --foreground --kill-after=30s 43200s sh -c" in command
    assert "cat /proc/sys/kernel/random/boot_id" in command and ">/w/run/p5.id" in command
    short = remote.start(spec, remote.RemoteFiles.of("/w", spec), max_s=1.5, kill_after_s=2)
    assert "--kill-after=2s 1.5s" in short
    with pytest.raises(ValueError):
        remote.max_lifetime("true", 0)


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_the_maximum_lifetime_ends_the_group_and_the_exit_file_says_so(tmp_path: Path, shell):
    spec = ProcessSpec("p6", Node("n0", "127.0.0.1", 1), ("sleep", "300"))
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    pgid = remote.parse_pid(_sh(remote.start(spec, files, max_s=1, kill_after_s=1), shell))
    assert pgid is not None
    boot, start, host = Path(files.ident).read_text().split()  # the pid's identity, recorded
    assert host == os.uname().nodename
    assert boot == Path(remote.BOOT_ID).read_text().strip()
    assert start == Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert _until_exited(files, pgid) == 124  # timed out: TERM was enough
    _until_gone(pgid)
    assert "maximum lifetime of 1s reached (exit 124)" in Path(files.log).read_text()


def test_a_command_ignoring_term_is_killed_after_the_grace_with_its_children(tmp_path: Path):
    # sleep inherits the ignored TERM and outlives its shell: the group kill ends it
    stubborn = ("sh", "-c", "trap '' TERM; sleep 300 & sleep 300")
    spec = ProcessSpec("p7", Node("n0", "127.0.0.1", 1), stubborn)
    files = remote.RemoteFiles.of(str(tmp_path), spec)
    pgid = remote.parse_pid(_sh(remote.start(spec, files, max_s=1, kill_after_s=1), "dash"))
    assert pgid is not None
    assert _until_exited(files, pgid) == 137  # KILLed after the grace
    _until_gone(pgid)
