"""The shell the SSH executor runs on a node, and how it reads the answers.

Pure string building, so every command can be read (and tested) without a node. Every value
that reaches a shell is quoted with :func:`shlex.quote` or is an ``int``. A process starts as
``setsid nohup sh -c '<script>' & echo $! >PID; cat PID`` (:func:`process_script`: output to
LOG, exit code to EXIT): the pid is its process-group id, and the node writes it down itself,
so teardown can find a process whose start was interrupted before we read it (``adopt``).
``ps -o stat= -g PGID`` with zombies excluded says whether a group is alive.

No environment value is ever on a command line (every user of a node can read those in
``ps``): the executor writes the process's environment to a 0600 file, and the script sources
it and removes it before it runs anything (``set -a; . FILE; set +a; rm -f FILE``). The setup
lines (``server.setup``) are shell written by the user: they run as they are, in the same
shell, but inside the single-quoted script, so they cannot reach the outer command line.
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
    env: str = ""  # the environment file, removed by the process's shell once read

    @classmethod
    def of(cls, remote_dir: str, spec: ProcessSpec) -> RemoteFiles:
        base = f"{remote_dir}/{spec.name}"
        return cls(base + ".log", base + ".exit", base + ".pid", base + ".env")


def mkdir(path: str) -> str:
    """The run's folder, readable by its owner only (logs may quote the environment)."""
    q = shlex.quote(path)
    return f"mkdir -p {q} && chmod 700 {q}"


def source_env(env_file: str) -> str:
    """Export every variable of ``env_file`` into this shell, then remove the file."""
    q = shlex.quote(env_file)
    return f"set -a; . {q}; set +a; rm -f {q}"


def setup_lines(lines: tuple[str, ...] | list[str], where: str = "setup") -> str:
    """The user's setup lines, each run as written in this shell; the first that fails stops
    the script with its exit code and a line saying which one (the log shows its output).
    Each sits in ``{ ...\n}`` so a trailing ``# comment`` cannot swallow what follows."""
    out = []
    for i, line in enumerate(lines, 1):
        failed = shlex.quote(f"pytest-kimi: {where} line {i} failed with exit ")
        out.append(
            f"{{ {line}\n}} || {{ c=$?; printf '%s\\n' {failed}\"$c:\" {shlex.quote(line)} >&2;"
            " exit $c; }"
        )
    return "\n".join(out)


def process_script(spec: ProcessSpec, files: RemoteFiles, env_file: str | None) -> str:
    """What the detached shell runs: output to LOG, the exit code to EXIT whatever way the
    shell ends (an EXIT trap: a failing setup line too; not a kill), the environment from
    ``env_file``, the setup lines, then argv."""
    parts = [
        f"exec >{shlex.quote(files.log)} 2>&1 </dev/null",
        f"trap {shlex.quote('echo $? >' + shlex.quote(files.exit))} EXIT",
    ]
    if env_file:
        parts.append(source_env(env_file))
    if spec.setup:
        where = "router.setup" if spec.role == "router" else "server.setup"
        parts.append(setup_lines(spec.setup, where))
    parts.append(shlex.join(spec.argv))
    return "\n".join(parts)


def probe_script(spec: ProcessSpec, command: str, env_file: str | None) -> str:
    """A short ``command`` in the process's own shell set-up: the environment from
    ``env_file`` (sourced and removed), the setup lines, then ``command``."""
    parts = [source_env(env_file)] if env_file else []
    if spec.setup:
        where = "router.setup" if spec.role == "router" else "server.setup"
        parts.append(setup_lines(spec.setup, where))
    parts.append(command)
    return "\n".join(parts)


def start(spec: ProcessSpec, files: RemoteFiles, env_file: str | None = None) -> str:
    """Start ``spec`` detached in its own session; prints (and records) its group id."""
    script = process_script(spec, files, env_file)
    pid_file = shlex.quote(files.pid)
    return (
        f"setsid nohup sh -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null & "
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
    """``kill -s NAME -- -PGID``: the POSIX spelling; dash (``sh`` on Debian) reads
    ``kill -TERM -- -PGID`` as an illegal number and signals nothing."""
    if name not in SIGNALS:
        raise ValueError(f"signal {name!r}")
    return f"kill -s {name} -- -{int(pgid)} 2>/dev/null; true"


def remove_files(paths: list[str]) -> str:
    return "rm -f -- " + " ".join(shlex.quote(p) for p in paths)


def cat(path: str) -> str:
    return f"cat {shlex.quote(path)}"


def port_listening(port: int) -> str:
    """Succeeds with output if something listens on ``port`` (needs ``ss``, iproute2)."""
    return f"command -v ss >/dev/null && ss -Htln 'sport = :{int(port)}'"


def tail(path: str, lines: int) -> str:
    return f"tail -n {int(lines)} {shlex.quote(path)}"


def size(path: str) -> str:
    return f"stat -c %s {shlex.quote(path)} 2>/dev/null"
