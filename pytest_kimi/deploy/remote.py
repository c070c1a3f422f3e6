"""The shell the SSH executor runs on a node, and how it reads the answers.

Pure string building, so every command can be read (and tested) without a node. Every value
that reaches a shell is quoted with :func:`shlex.quote` or is an ``int``. A process starts as
``setsid nohup sh -c '<cmd> >LOG 2>&1; echo $? >EXIT' & echo $! >PID; cat PID``: the pid is its
process-group id, and the node writes it down itself, so teardown can find a process whose
start was interrupted before we read it (``adopt``). ``ps -o stat= -g PGID`` with zombies
excluded says whether a group is alive.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pytest_kimi.deploy.plan import ProcessSpec

SIGNALS = ("TERM", "KILL", "INT")


@dataclass(frozen=True)
class RemoteFiles:
    """Where a process's output, exit code and group id live on its node."""

    log: str
    exit: str
    pid: str

    @classmethod
    def of(cls, remote_dir: str, spec: ProcessSpec) -> RemoteFiles:
        base = f"{remote_dir}/{spec.name}"
        return cls(base + ".log", base + ".exit", base + ".pid")


def mkdir(path: str) -> str:
    return f"mkdir -p {shlex.quote(path)}"


def start(spec: ProcessSpec, files: RemoteFiles) -> str:
    """Start ``spec`` detached in its own session; prints (and records) its group id."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items())
    inner = (
        f"{env + ' ' if env else ''}{shlex.join(spec.argv)} "
        f">{shlex.quote(files.log)} 2>&1 </dev/null; echo $? >{shlex.quote(files.exit)}"
    )
    pid_file = shlex.quote(files.pid)
    return (
        f"setsid nohup sh -c {shlex.quote(inner)} >/dev/null 2>&1 </dev/null & "
        f"echo $! >{pid_file}; cat {pid_file}"
    )


def read_pid_file(files: RemoteFiles) -> str:
    """The recorded group id; the start command may still be running, so wait up to ~3 s."""
    q = shlex.quote(files.pid)
    return (
        f"for i in $(seq 30); do [ -s {q} ] && break; sleep 0.1; done; cat {q} 2>/dev/null || true"
    )


def parse_pid(out: str) -> int | None:
    """The group id from a command's output (its last line), or None."""
    lines = out.strip().splitlines()
    return int(lines[-1]) if lines and lines[-1].isdigit() else None


def exit_code(files: RemoteFiles, pgid: int) -> str:
    """Prints the exit code if written, else ``running`` or ``gone`` (killed before writing).
    The file is read again once the group is seen gone: the wrapper may have written it and
    exited between the first look and ``ps``."""
    q = shlex.quote(files.exit)
    return (
        f"if [ -s {q} ]; then cat {q}; "
        f"elif ps -o stat= -g {int(pgid)} | grep -qv '^Z'; then echo running; "
        f"elif [ -s {q} ]; then cat {q}; "
        "else echo gone; fi"
    )


def parse_exit_code(out: str) -> int | None:
    word = out.strip()
    if word == "running":
        return None
    if word == "gone":
        return -9  # the group vanished without writing an exit code: killed
    return int(word) if word.lstrip("-").isdigit() else None


def group_stats(pgid: int) -> str:
    return f"ps -o stat= -g {int(pgid)} || true"


def any_alive(out: str) -> bool:
    """Whether ``group_stats`` output lists a process that is not a zombie."""
    return any(line.strip() and not line.strip().startswith("Z") for line in out.splitlines())


def signal_group(pgid: int, name: str) -> str:
    if name not in SIGNALS:
        raise ValueError(f"signal {name!r}")
    return f"kill -{name} -- -{int(pgid)} 2>/dev/null; true"


def port_listening(port: int) -> str:
    """Succeeds with output if something listens on ``port`` (needs ``ss``, iproute2)."""
    return f"command -v ss >/dev/null && ss -Htln 'sport = :{int(port)}'"


def tail(path: str, lines: int) -> str:
    return f"tail -n {int(lines)} {shlex.quote(path)}"


def size(path: str) -> str:
    return f"stat -c %s {shlex.quote(path)} 2>/dev/null"
