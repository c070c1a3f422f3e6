"""The shell the SSH executor runs on a node, and how it reads the answers.

Pure string building, so every command can be read (and tested) without a node. Every value
that reaches a shell is quoted with :func:`shlex.quote` or is an ``int``. A process starts as
``setsid nohup sh -c '<script>' & echo $! >PID; cat PID`` (:func:`process_script`: output to
LOG, exit code to EXIT): the pid is its process-group id, and the node writes it down itself,
so teardown can find a process whose start was interrupted before we read it (``adopt``).
Beside it the node records the pid's identity (ID: boot id, start time, host name), so a later run
can tell one of our processes left running from a stranger that got the same pid after a
reboot (:mod:`pytest_kimi.deploy.leftovers`).
``ps -o stat= -g PGID`` with zombies excluded says whether a group is alive.

A dead man's switch bounds every process: the script runs the command under coreutils
``timeout`` (:func:`max_lifetime`), so a harness that was killed, or lost its network, cannot
leave a cluster busy for ever: after ``deployment_max_s`` (cluster file) the command gets TERM,
and KILL 30 s later; the exit file then says 124 (timed out) or 137 (killed after the grace).

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
    ident: str = ""  # the pid's identity: the node's boot id, the pid's start time, hostname

    @classmethod
    def of(cls, remote_dir: str, spec: ProcessSpec) -> RemoteFiles:
        base = f"{remote_dir}/{spec.name}"
        return cls(base + ".log", base + ".exit", base + ".pid", base + ".env", base + ".id")


DEFAULT_MAX_S = 12 * 3600.0  # a deployment's maximum lifetime unless the cluster file says
KILL_AFTER_S = 30.0  # after the maximum lifetime's TERM: KILL for what is still there
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def start_time(pid: str) -> str:
    """Shell printing ``pid``'s start time (clock ticks since boot, /proc/PID/stat field 22;
    the fields after the command name, which may hold spaces); empty if there is no such
    process or it is a zombie. ``pid`` is a shell word: an int, or a ``$var`` of digits."""
    return f'awk \'{{sub(/.*\\) /, ""); if ($1 != "Z") print $20}}\' /proc/{pid}/stat 2>/dev/null'


def max_lifetime(command: str, max_s: float, kill_after_s: float = KILL_AFTER_S) -> str:
    """``command`` (a shell word list) under coreutils ``timeout``: TERM after ``max_s``, KILL
    ``kill_after_s`` later. ``--foreground`` keeps ``timeout`` in our process group (without it
    ``timeout`` makes a group of its own, which ``kill -- -PGID`` and our pid file would miss);
    it then signals only its child, so :func:`process_script` ends the rest of the group."""
    return f"timeout --foreground --kill-after={_secs(kill_after_s)}s {_secs(max_s)}s {command}"


def _secs(value: float) -> str:
    if value <= 0:
        raise ValueError(f"a duration must be positive, not {value}")
    return f"{value:.3f}".rstrip("0").rstrip(".")


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


def process_script(
    spec: ProcessSpec,
    files: RemoteFiles,
    env_file: str | None,
    max_s: float = DEFAULT_MAX_S,
    kill_after_s: float = KILL_AFTER_S,
) -> str:
    """What the detached shell (the group leader) runs: output to LOG; the command under
    :func:`max_lifetime` (an inner shell: the environment from ``env_file``, the setup lines,
    then ``exec`` argv, so ``timeout``'s TERM reaches the command itself); its exit code to
    EXIT (a failing setup line's too). The leader catches TERM, so a teardown's TERM to the
    group lets it write the command's code (143 when TERM killed it); only KILL leaves no
    exit file. When the maximum lifetime ran out (124, or 137 after the grace) it stops the
    rest of the group the same way (TERM, the grace, KILL), itself included."""
    inner = []
    if env_file:
        inner.append(source_env(env_file))
    if spec.setup:
        where = "router.setup" if spec.role == "router" else "server.setup"
        inner.append(setup_lines(spec.setup, where))
    inner.append("exec " + shlex.join(spec.argv))
    grace = _secs(kill_after_s)
    said = shlex.quote(f"pytest-kimi: maximum lifetime of {_secs(max_s)}s reached (exit ")
    return "\n".join(
        [
            f"exec >{shlex.quote(files.log)} 2>&1 </dev/null",
            "trap : TERM",
            max_lifetime(f"sh -c {shlex.quote(chr(10).join(inner))}", max_s, kill_after_s),
            f"c=$?; echo $c >{shlex.quote(files.exit)}",
            f'case $c in 124|137) echo {said}"$c); stopping its process group"; '
            f"kill -s TERM 0; sleep {grace}; kill -s KILL 0;; esac",
            "exit $c",
        ]
    )


def probe_script(spec: ProcessSpec, command: str, env_file: str | None) -> str:
    """A short ``command`` in the process's own shell set-up: the environment from
    ``env_file`` (sourced and removed), the setup lines, then ``command``."""
    parts = [source_env(env_file)] if env_file else []
    if spec.setup:
        where = "router.setup" if spec.role == "router" else "server.setup"
        parts.append(setup_lines(spec.setup, where))
    parts.append(command)
    return "\n".join(parts)


def start(
    spec: ProcessSpec,
    files: RemoteFiles,
    env_file: str | None = None,
    max_s: float = DEFAULT_MAX_S,
    kill_after_s: float = KILL_AFTER_S,
) -> str:
    """Start ``spec`` detached in its own session, for at most ``max_s`` seconds; prints (and
    records) its group id, and records the pid's identity (boot id, start time, host name)
    beside it."""
    script = process_script(spec, files, env_file, max_s, kill_after_s)
    pid_file = shlex.quote(files.pid)
    ident = ""
    if files.ident:
        facts = f"cat {BOOT_ID}; {start_time('$p')}; uname -n"
        ident = f"{{ {facts}; }} >{shlex.quote(files.ident)} 2>/dev/null; "
    return (
        f"setsid nohup sh -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null & "
        f"p=$!; echo $p >{pid_file}; {ident}cat {pid_file}"
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
