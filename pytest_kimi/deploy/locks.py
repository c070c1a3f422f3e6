"""Nodes that are ours alone: a lock on every node for a deployment's lifetime.

Two runs (two engineers, or ``-n 2`` on one cluster file) can both pass the port and GPU
checks and then load onto the same GPUs. So before anything starts, every node is locked, and
a second run is refused at once, naming the node and who holds it.

The lock is ``flock -n`` on ``<dir>/<the node's own hostname>.lock``, held by a process started
over a dedicated SSH channel: ``flock`` runs ``cat``, which reads the channel's stdin. When we
release, we send EOF; when our connection closes for any reason (the harness SIGKILLed, a CI
time-out, a laptop lid) sshd closes that stdin, ``cat`` ends and the kernel drops the lock. No
stale lock can outlive us. Who holds it (user, host, run id, pid, since when) is written next
to the lock (``.owner``) by the holder, once it holds.

EOF can be slow: after a link outage, our connection's packets wait out TCP's retransmission
back-off, and the holder would linger long after the run. So a release that no holder confirms
within seconds ends the holder over a new connection (the holder said its pid when it took the
lock), and says which holder it could not confirm ended.

Local clusters take no lock: their "nodes" are this machine, and ``-n 2`` on the mock runs
layouts in parallel on them on purpose (each on its own ports).
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import os
import shlex
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

    from pytest_kimi.config import ClusterConfig, Node

LOCKED, BUSY = "KIMI-LOCKED", "KIMI-BUSY"
BUSY_CODE = 75  # flock's exit code when the lock is held by someone else (-E)


class NodeBusy(RuntimeError):
    """Another run holds a node's lock: the message names the node and the holder."""


class LockFailed(RuntimeError):
    """A node's lock could not be taken for another reason (no flock, no such directory)."""


def owner_line(run_id: str) -> str:
    """Who we are, as the lock's ``.owner`` file says it."""
    since = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return (
        f"user={getpass.getuser()} host={socket.gethostname()} run={run_id} "
        f"pid={os.getpid()} since={since}"
    )


def lock_script(lock_dir: str, owner: str) -> str:
    """The shell that takes the lock and holds it until its stdin ends.

    Prints ``KIMI-LOCKED <file> <pid>`` once held (``pid``: the holder, a ``cat``, child of
    ``flock``); if someone else holds it, ``KIMI-BUSY <file>`` and the holder's owner line,
    and exits 75."""
    holder = (
        'printf "%s\\n" "$1" >"$2.owner" && echo ' + LOCKED + ' "$2" "$$" && exec cat >/dev/null'
    )
    return (
        f'mkdir -p {shlex.quote(lock_dir)} && f={shlex.quote(lock_dir)}/"$(hostname)".lock'
        f' && {{ flock -n -E {BUSY_CODE} "$f" sh -c {shlex.quote(holder)} sh '
        f'{shlex.quote(owner)} "$f"; rc=$?; if [ $rc = {BUSY_CODE} ]; then '
        f'echo {BUSY} "$f"; cat "$f.owner" 2>/dev/null || echo "(no owner written yet)"; fi; '
        "exit $rc; }"
    )


def end_holder_script(path: str, pid: int, wait_s: float = 10.0) -> str:
    """The shell that ends holder ``pid`` of lock ``path``, if that pid is still our holder
    (a ``cat`` whose parent ``flock`` holds ``path``: never a stranger that took the pid).
    Exits 0 once no such holder is left, 1 if it outlives ``wait_s``."""
    tries = max(1, round(wait_s / 0.1))
    ours = (
        f"[ \"$(tr '\\0' ' ' 2>/dev/null </proc/{pid}/cmdline)\" = 'cat ' ] && "
        f"pp=$(cut -d' ' -f4 /proc/{pid}/stat 2>/dev/null) && "
        f"tr '\\0' '\\n' 2>/dev/null </proc/\"$pp\"/cmdline | grep -qxF -- {shlex.quote(path)}"
    )
    return (
        f"ours() {{ {ours}; }}; ours && kill {pid} 2>/dev/null; i=0; "
        f"while ours; do [ $i -ge {tries} ] && exit 1; sleep 0.1; i=$((i+1)); done; exit 0"
    )


@dataclass
class Held:
    """One node's lock, as we hold it."""

    node: Node
    channel: paramiko.Channel
    path: str  # the lock file on the node
    pid: int  # its holder


class NodeLocks:
    """The locks of ``nodes``, each held by a channel of a connection of its own."""

    def __init__(
        self,
        nodes: Sequence[Node],
        lock_dir: str,
        owner: str,
        *,
        timeout_s: float = 30.0,
        eof_s: float = 5.0,
        say: Callable[[str], None] = lambda message: None,
    ) -> None:
        from pytest_kimi.deploy.ssh import SSHExecutor

        self.nodes, self.lock_dir, self.owner, self.timeout_s = nodes, lock_dir, owner, timeout_s
        self.eof_s, self.say = eof_s, say
        # connections apart from the deployment's: its reconnects must not drop our locks
        self._ssh = SSHExecutor(lock_dir, "locks")
        self.held: dict[str, Held] = {}

    def acquire(self) -> None:
        """Lock every node, or none: :class:`NodeBusy` names the first node held by another."""
        try:
            for node in self.nodes:
                self.held[node.name] = self._lock(node)
        except BaseException:
            self.release()
            raise

    def _lock(self, node: Node) -> Held:
        transport = self._ssh.connection(node).transport
        channel = transport.open_session(timeout=self.timeout_s)
        channel.set_combine_stderr(True)
        channel.settimeout(self.timeout_s)
        channel.exec_command(lock_script(self.lock_dir, self.owner))
        out = b""
        while not _locked_line(out):
            data = channel.recv(4096)  # socket.timeout past timeout_s: nothing answers
            if not data:
                break
            out += data
        text = out.decode(errors="replace")
        line = _locked_line(out)
        if line is not None:
            channel.settimeout(None)
            path, _, pid = line.rpartition(" ")
            return Held(node, channel, path, int(pid))
        code = channel.recv_exit_status()
        channel.close()
        where = f"node {node.name} ({node.host})"
        if code == BUSY_CODE and BUSY in text:
            path, _, owner = text.split(BUSY, 1)[1].strip().partition("\n")
            raise NodeBusy(
                f"{where} is in use by another run: {owner.strip()} (lock {path} on the node); "
                "wait for that run to end, or stop it"
            )
        raise LockFailed(f"{where}: cannot take the lock in {self.lock_dir} (exit {code}): "
                         f"{text.strip()[-300:]}")  # fmt: skip

    def release(self) -> list[str]:
        """EOF to every holder (it exits, the lock goes); a holder that does not confirm it
        within ``eof_s`` is ended over a new connection. Returns the holders that could not
        be confirmed ended (none, normally), each named with its node and pid."""
        for held in self.held.values():
            with contextlib.suppress(Exception):
                held.channel.shutdown_write()
        deadline = time.monotonic() + self.eof_s
        slow = []
        for held in self.held.values():
            ended = held.channel.status_event.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(Exception):
                held.channel.close()
            if not ended:
                slow.append(held)
        self.held.clear()
        self._ssh.close()
        return self._end(slow) if slow else []

    def _end(self, slow: list[Held]) -> list[str]:
        """End the holders whose EOF is still on its way, each over a new connection (with
        teardown's patience for a node that is coming back)."""
        from pytest_kimi.deploy.ssh import SSHExecutor
        from pytest_kimi.deploy.sshconnections import NodeError

        ssh = SSHExecutor(self.lock_dir, "locks-end")
        ssh.begin_teardown()
        left = []
        try:
            for held in slow:
                node = held.node
                where = f"lock holder on {node.name} ({node.host}, pid {held.pid}, {held.path})"
                self.say(f"{where}: no answer to EOF in {self.eof_s:g}s; ending it over a new "
                         "connection")  # fmt: skip
                try:
                    code, out = ssh.run(node, end_holder_script(held.path, held.pid))
                except NodeError as exc:
                    left.append(f"{where}: unverifiable ({exc})")
                    continue
                if code != 0:
                    left.append(f"{where}: still running after kill ({out.strip()[-200:]})")
        finally:
            ssh.close()
        return left


def _locked_line(out: bytes) -> str | None:
    """``<file> <pid>`` from the holder's ``KIMI-LOCKED`` line, once it is whole."""
    text = out.decode(errors="replace")
    if LOCKED not in text:
        return None
    rest = text.split(LOCKED, 1)[1]
    if "\n" not in rest:
        return None
    line = rest.split("\n", 1)[0].strip()
    return line if line.rpartition(" ")[2].isdigit() else None


def lock_dir(cluster: ClusterConfig) -> str:
    """Where the lock files live on each node."""
    return cluster.locks.dir or f"{cluster.work_dir.rstrip('/')}/locks"


@contextlib.contextmanager
def holding(
    cluster: ClusterConfig,
    nodes: Sequence[Node],
    run_id: str,
    *,
    say: Callable[[str], None] = lambda message: None,
    on_left: Callable[[list[str]], None] = lambda left: None,
) -> Iterator[None]:
    """Every node of an SSH cluster locked while inside (none for local clusters or when the
    cluster file turns locks off). ``on_left`` gets the holders not confirmed ended."""
    if cluster.executor != "ssh" or not cluster.locks.enabled:
        yield
        return
    unique = list({node.name: node for node in nodes}.values())
    locks = NodeLocks(unique, lock_dir(cluster), owner_line(run_id), say=say)
    locks.acquire()
    try:
        yield
    finally:
        left = locks.release()
        if left:
            on_left(left)
