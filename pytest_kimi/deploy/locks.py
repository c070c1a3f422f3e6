"""Nodes that are ours alone: a lock on every node for a deployment's lifetime.

Two runs (two engineers, or ``-n 2`` on one cluster file) can both pass the port and GPU
checks and then load onto the same GPUs. So before anything starts, every node is locked, and
a second run is refused at once, naming the node and who holds it.

The lock is ``flock -n`` on ``<dir>/<the node's own hostname>.lock``, held by a process started
over a dedicated SSH channel: ``flock`` runs ``cat``, which reads the channel's stdin. When we
release, we send EOF; when our connection closes for any reason (the harness SIGKILLed, a CI
time-out, a laptop lid) sshd closes that stdin, ``cat`` ends and the kernel drops the lock. No
stale lock can outlive us, and a holder's pid never needs checking. Who holds it (user, host,
run id, pid, since when) is written next to the lock (``.owner``) by the holder, once it holds.

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
from collections.abc import Iterator, Sequence
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

    Prints ``KIMI-LOCKED <file>`` once held; if someone else holds it, ``KIMI-BUSY <file>``
    and the holder's owner line, and exits 75."""
    holder = 'printf "%s\\n" "$1" >"$2.owner" && echo ' + LOCKED + ' "$2" && exec cat >/dev/null'
    return (
        f'mkdir -p {shlex.quote(lock_dir)} && f={shlex.quote(lock_dir)}/"$(hostname)".lock'
        f' && {{ flock -n -E {BUSY_CODE} "$f" sh -c {shlex.quote(holder)} sh '
        f'{shlex.quote(owner)} "$f"; rc=$?; if [ $rc = {BUSY_CODE} ]; then '
        f'echo {BUSY} "$f"; cat "$f.owner" 2>/dev/null || echo "(no owner written yet)"; fi; '
        "exit $rc; }"
    )


class NodeLocks:
    """The locks of ``nodes``, each held by a channel of a connection of its own."""

    def __init__(
        self, nodes: Sequence[Node], lock_dir: str, owner: str, *, timeout_s: float = 30.0
    ) -> None:
        from pytest_kimi.deploy.ssh import SSHExecutor

        self.nodes, self.lock_dir, self.owner, self.timeout_s = nodes, lock_dir, owner, timeout_s
        # connections apart from the deployment's: its reconnects must not drop our locks
        self._ssh = SSHExecutor(lock_dir, "locks")
        self.held: dict[str, paramiko.Channel] = {}

    def acquire(self) -> None:
        """Lock every node, or none: :class:`NodeBusy` names the first node held by another."""
        try:
            for node in self.nodes:
                self.held[node.name] = self._lock(node)
        except BaseException:
            self.release()
            raise

    def _lock(self, node: Node) -> paramiko.Channel:
        transport = self._ssh.connection(node).transport
        channel = transport.open_session(timeout=self.timeout_s)
        channel.set_combine_stderr(True)
        channel.settimeout(self.timeout_s)
        channel.exec_command(lock_script(self.lock_dir, self.owner))
        out = b""
        while LOCKED.encode() not in out:
            data = channel.recv(4096)  # socket.timeout past timeout_s: nothing answers
            if not data:
                break
            out += data
        text = out.decode(errors="replace")
        if LOCKED in text:
            channel.settimeout(None)
            return channel
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

    def release(self) -> None:
        """EOF to every holder (it exits, the lock goes), then close our connections."""
        for channel in self.held.values():
            with contextlib.suppress(Exception):
                channel.shutdown_write()
                if channel.status_event.wait(5.0):
                    channel.recv_exit_status()
                channel.close()
        self.held.clear()
        self._ssh.close()


def lock_dir(cluster: ClusterConfig) -> str:
    """Where the lock files live on each node."""
    return cluster.locks.dir or f"{cluster.work_dir.rstrip('/')}/locks"


@contextlib.contextmanager
def holding(cluster: ClusterConfig, nodes: Sequence[Node], run_id: str) -> Iterator[None]:
    """Every node of an SSH cluster locked while inside (none for local clusters or when the
    cluster file turns locks off)."""
    if cluster.executor != "ssh" or not cluster.locks.enabled:
        yield
        return
    unique = list({node.name: node for node in nodes}.values())
    locks = NodeLocks(unique, lock_dir(cluster), owner_line(run_id))
    locks.acquire()
    try:
        yield
    finally:
        locks.release()
