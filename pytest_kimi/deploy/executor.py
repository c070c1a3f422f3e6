"""Executors start, watch and stop the processes of a plan on their nodes.

The deployment code is the same for every executor; only how a process is started differs.
``LocalExecutor`` runs each "node" as a local process group (the embedded mock backend,
through :mod:`pytest_kimi.deploy.procgroup`). Every process gets its own session (``setsid``), so
stopping its group stops everything it started, and the executor remembers every group it
made so teardown can check none is left. Every group also holds a watcher on the executor's
:class:`~pytest_kimi.deploy.procgroup.Lifeline`: if the harness dies (``kill -9`` included), the
kernel closes the lifeline and each group kills itself; :meth:`LocalExecutor.close` cuts it too, so
nothing outlives the deployment's teardown.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pytest_kimi.config import Node
from pytest_kimi.deploy.logs import Cut
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.procgroup import Lifeline, group_alive, signal_group


@dataclass
class Handle:
    """A started process: where it runs, its process group, and its log."""

    spec: ProcessSpec
    pgid: int
    log_path: Path  # on the node
    popen: subprocess.Popen | None = None


class Executor(Protocol):
    """What a deployment needs from a way of running processes."""

    def start(self, spec: ProcessSpec, log_path: Path) -> Handle: ...
    def adopt(self, spec: ProcessSpec, log_path: Path) -> Handle | None: ...
    def exit_code(self, handle: Handle) -> int | None: ...
    def signal(self, handle: Handle, name: str) -> None: ...
    def alive(self, handle: Handle) -> bool: ...
    def log_tail(self, handle: Handle, lines: int = 50) -> str: ...
    def log_size(self, handle: Handle) -> int | None: ...
    def fetch_log(self, handle: Handle, dest: Path, max_bytes: int | None = None) -> Cut | None: ...
    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]: ...
    def run_as(
        self, spec: ProcessSpec, command: str, timeout: float | None = None
    ) -> tuple[int, str]: ...
    def port_in_use(self, node: Node, port: int) -> bool: ...
    def put_file(self, node: Node, path: str, data: bytes) -> None: ...
    def cleanup(self, handles: list[Handle]) -> list[str]: ...
    def close(self) -> None: ...


def tail_file(path: Path, lines: int) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return f"(no log at {path})"


def answer(code: int, stdout: str, stderr: str) -> str:
    """What a command said, for its caller to read: its stdout alone when it succeeded, stdout
    and stderr when it failed. A node's login scripts write to stderr on every SSH command
    (``pyenv init`` racing itself, banners, locale warnings); that is not the answer to parse,
    but a failing command's own complaint is, so it is kept for the error message."""
    return stdout if code == 0 else stdout + stderr


def _shell(
    script: str, timeout: float | None, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """``sh -c script`` here: (exit code, :func:`answer`); 124 if it ran out of time."""
    try:
        done = subprocess.run(
            ["sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout or 60,
            stdin=subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out: {script}"
    return done.returncode, answer(done.returncode, done.stdout, done.stderr)


class LocalExecutor:
    """Runs each process on this machine, in its own session, output to its log file."""

    poll_s = 0.1

    def __init__(self) -> None:
        self._started: dict[str, subprocess.Popen] = {}
        self.lifeline = Lifeline()  # every group we start dies with us

    def port_in_use(self, node: Node, port: int) -> bool:
        """Whether something already listens on ``node.host:port`` (a bind test)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # as servers do: a port in TIME_WAIT is free, one with a listener is not
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((node.host, port))
            except OSError:
                return True
        return False

    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]:
        """A shell command on this machine (every local "node" is this machine)."""
        return _shell(command, timeout)

    def run_as(
        self, spec: ProcessSpec, command: str, timeout: float | None = None
    ) -> tuple[int, str]:
        """``command`` as ``spec``'s process would run: its environment (through
        ``subprocess``, never a command line) and its setup lines first."""
        from pytest_kimi.deploy.remote import probe_script

        return _shell(probe_script(spec, command, None), timeout, spec.launch_env)

    def put_file(self, node: Node, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (only its owner may read it), folders made as needed."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(mode=0o600)
        target.write_bytes(data)

    def start(self, spec: ProcessSpec, log_path: Path) -> Handle:
        """The environment goes through ``subprocess`` (never a command line); setup lines
        run in the lifeline's ``sh``, which then execs argv, so what they set reaches it."""
        from pytest_kimi.deploy.remote import setup_lines

        env = {**os.environ, **spec.launch_env, "PYTHONUNBUFFERED": "1"}
        setup = ""
        if spec.setup:
            where = "router.setup" if spec.role == "router" else "server.setup"
            setup = setup_lines(spec.setup, where)
        popen = self.lifeline.start(spec.argv, log_path, setup=setup, env=env, append=True)
        self._started[spec.name] = popen
        return Handle(spec, popen.pid, log_path, popen)

    def adopt(self, spec: ProcessSpec, log_path: Path) -> Handle | None:
        """The handle of a process whose ``start`` was interrupted after it began."""
        popen = self._started.get(spec.name)
        return None if popen is None else Handle(spec, popen.pid, log_path, popen)

    def exit_code(self, handle: Handle) -> int | None:
        assert handle.popen is not None
        return handle.popen.poll()

    def signal(self, handle: Handle, name: str) -> None:
        """Send ``SIG<name>`` (TERM, KILL) to the whole process group."""
        signal_group(handle.pgid, name)
        if handle.popen is not None:
            handle.popen.poll()  # reap the leader if it is gone

    def alive(self, handle: Handle) -> bool:
        """True while any process of the group exists (zombies of our own child excluded).
        The lifeline's watcher is a member: a group whose command exited on its own counts as
        alive until it is signalled or the lifeline is cut; :meth:`exit_code` says whether the
        command itself exited."""
        if handle.popen is not None:
            handle.popen.poll()  # reap the leader so it does not count as alive
        return group_alive(handle.pgid)

    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        return tail_file(handle.log_path, lines)

    def log_size(self, handle: Handle) -> int | None:
        try:
            return handle.log_path.stat().st_size
        except OSError:
            return None

    def fetch_log(self, handle: Handle, dest: Path, max_bytes: int | None = None) -> Cut | None:
        """Copy the log to ``dest`` (here it usually is ``dest`` already), then cap it in
        place (head, marker, tail: :mod:`pytest_kimi.deploy.logs`)."""
        import shutil

        from pytest_kimi.deploy.logs import cap_file

        if not handle.log_path.exists():
            return None
        if dest.resolve() != handle.log_path.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(handle.log_path, dest)
        return None if max_bytes is None else cap_file(dest, max_bytes)

    def cleanup(self, handles: list[Handle]) -> list[str]:
        """Nothing but process groups was made here: nothing more to remove."""
        return []

    def close(self) -> None:
        """Cut the lifeline: a group that survived teardown is killed by its watcher."""
        self.lifeline.close()
