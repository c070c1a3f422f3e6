"""SSH connections to the nodes (fabric / paramiko): opened with care, reopened with patience.

One connection per node (and one per jump host, shared by the nodes behind it), cached for the
deployment; a command runs over it (:meth:`Connections.run`) and files travel over SFTP
(:meth:`Connections.put_file`, :meth:`Connections.get_file`). A connection that drops is
reopened with back-off for the node's patience (:mod:`pytest_kimi.deploy.backoff`); a command
is repeated on the new one only if it is safe to repeat. Failures become :class:`NodeError`
(or :class:`NodeUnreachable`, worth another try), naming node and cause.

Care taken: host keys are checked against the cluster's known_hosts (``RejectPolicy``) unless
the YAML opts out; connect, banner, auth and channel timeouts are set so a dead host fails in
seconds, not hours; keepalives notice a host that dies mid-run; a key passphrase is read from
the environment variable the YAML names and goes nowhere else (:class:`KeyRing`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Mapping
from typing import TypeVar

import fabric
import invoke
import paramiko

from pytest_kimi.config import Node
from pytest_kimi.deploy.backoff import Patience
from pytest_kimi.deploy.executor import answer

T = TypeVar("T")


class NodeError(RuntimeError):
    """A node could not be reached or did not do what was asked; names node and cause."""


class NodeUnreachable(NodeError):
    """No connection, or one that dropped: worth another try after a pause (a refused key or
    a wrong host key is a plain :class:`NodeError`: waiting cannot fix it)."""


def _transient(exc: BaseException) -> bool:
    """Whether a failed connect may succeed later (network), not a refusal (keys, auth)."""
    if isinstance(exc, paramiko.BadHostKeyException | paramiko.AuthenticationException):
        return False
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return False
    return isinstance(exc, OSError | EOFError | paramiko.SSHException)


def _cause(exc: BaseException, node: Node, known_hosts: str) -> str:
    ssh = node.ssh
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"host key mismatch: the key offered is not the one in {known_hosts} "
            "(reinstalled host, or someone in the middle); refusing to connect"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        key = ssh.key or "default keys"
        return f"SSH authentication refused for user {ssh.user!r} with {key}"
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return f"host key not found in {known_hosts}; add it, or set check_host_keys: false"
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"unreachable: no answer on port {ssh.port} within {ssh.connect_timeout_s:g}s"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | OSError):
        return f"unreachable: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _host_key_policy(client: paramiko.SSHClient, check: bool, known_hosts: str) -> None:
    """Checked: only the cluster's known_hosts (not ~/.ssh), an unknown key refused."""
    if check:
        client._host_keys = paramiko.HostKeys()  # only the cluster's file, not ~/.ssh
        if os.path.exists(known_hosts):
            client.load_host_keys(known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())


class KeyRing:
    """The nodes' private keys, each decrypted once per deployment: handing paramiko a file
    name makes it run the passphrase KDF once per key type it tries, on every connection."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ  # where each key's passphrase variable is looked up
        self._keys: dict[str, paramiko.PKey] = {}

    def key(self, node: Node) -> paramiko.PKey:
        """``node``'s key (``ssh.key``), loaded and decrypted on first use; a key that cannot
        be loaded is a :class:`NodeError` naming node, key and cause, never the passphrase."""
        ssh = node.ssh
        assert ssh.key is not None
        path = os.path.expanduser(ssh.key)
        cache_key = f"{path}\0{ssh.passphrase_env or ''}"
        if cache_key in self._keys:
            return self._keys[cache_key]
        passphrase = None
        if ssh.passphrase_env:
            if ssh.passphrase_env not in self.environ:
                raise NodeError(
                    f"node {node.name} ({node.host}): the key passphrase variable "
                    f"{ssh.passphrase_env} is not set in the environment"
                )
            passphrase = self.environ[ssh.passphrase_env]
        where = f"node {node.name} ({node.host}): SSH key {path}"
        try:
            key = paramiko.PKey.from_path(path, None if passphrase is None else passphrase.encode())
        except (TypeError, paramiko.PasswordRequiredException):
            raise NodeError(
                f"{where} is encrypted and no passphrase was given (name the variable "
                "holding it in ssh.passphrase_env)"
            ) from None
        except OSError as exc:
            raise NodeError(f"{where} cannot be read: {exc.strerror}") from None
        except Exception as exc:  # paramiko / cryptography: bad format, unknown key type
            hint = "wrong passphrase, or not a private key" if passphrase else "not a private key"
            # the library's message names the problem, never the passphrase
            raise NodeError(f"{where} cannot be loaded ({hint}): {exc}") from None
        self._keys[cache_key] = key
        return key


class Connections:
    """Every node's open connection (and every jump host's), reconnected with patience."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.keys = KeyRing(environ)
        self._conns: dict[str, fabric.Connection] = {}
        self.patience = Patience(NodeUnreachable)  # reconnects: pytest_kimi.deploy.backoff
        self._gateways: dict[str, fabric.Connection] = {}  # jump_host -> its open connection

    def begin_teardown(self) -> None:
        """From now on a node that stops answering is retried for
        ``ssh.teardown_reconnect_s``: one lost during the run gets that chance again."""
        self.patience.begin_teardown()

    def _patiently(self, node: Node, attempt: Callable[[], T]) -> T:
        """``attempt()``, retried with back-off while it raises :class:`NodeUnreachable`."""
        ssh = node.ssh
        return self.patience.call(node.name, attempt, run_s=ssh.reconnect_s,
                                  teardown_s=ssh.teardown_reconnect_s)  # fmt: skip

    def _drop(self, node: Node) -> None:
        """Forget (and close) a connection that failed under a command."""
        conn = self._conns.pop(node.name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def connection(self, node: Node) -> fabric.Connection:
        """An open connection to ``node`` (reconnecting with back-off for the node's
        patience); :class:`NodeError` says why there is none."""
        return self._patiently(node, lambda: self._connect(node))

    def _connect(self, node: Node) -> fabric.Connection:
        """The cached connection, or one attempt at a new one (one thread at a time)."""
        with self.patience.lock(node.name):
            conn = self._conns.get(node.name)
            if conn is not None and conn.is_connected:
                return conn
            return self._open(node)

    def _open(self, node: Node) -> fabric.Connection:
        """One attempt to connect; :class:`NodeUnreachable` when it may work later."""
        ssh = node.ssh
        known_hosts = os.path.expanduser(ssh.known_hosts or "~/.ssh/known_hosts")
        kwargs: dict = {
            "banner_timeout": ssh.connect_timeout_s,
            "auth_timeout": ssh.connect_timeout_s,
            "allow_agent": False,
            "look_for_keys": ssh.key is None,
        }
        if ssh.key:
            kwargs["pkey"] = self.keys.key(node)
        gateway = self._gateway(node, kwargs, known_hosts) if ssh.jump_host else None
        conn = fabric.Connection(
            node.host,
            user=ssh.user,
            port=ssh.port,
            connect_timeout=ssh.connect_timeout_s,
            connect_kwargs=kwargs,
            gateway=gateway,
        )
        _host_key_policy(conn.client, ssh.check_host_keys, known_hosts)
        try:
            conn.open()
        except Exception as exc:
            conn.close()
            cause = _cause(exc, node, known_hosts)
            kind = NodeUnreachable if _transient(exc) else NodeError
            raise kind(f"node {node.name} ({node.host}): {cause}") from None
        transport = conn.transport
        transport.set_keepalive(5)
        # opening a channel is not covered by command timeouts (DESIGN.md, fabric trials)
        transport.channel_timeout = ssh.connect_timeout_s  # type: ignore[attr-defined]
        self._conns[node.name] = conn
        return conn

    def _gateway(self, node: Node, kwargs: dict, known_hosts: str) -> fabric.Connection:
        """The jump host's connection, open, shared by every node behind it: its host key
        checked like a node's (same known_hosts, ``RejectPolicy``), closed in :meth:`close`.
        A jump host that cannot be reached is named as such, not as the node."""
        ssh = node.ssh
        spec = ssh.jump_host
        assert spec is not None
        gateway = self._gateways.get(spec)
        if gateway is not None and gateway.is_connected:
            return gateway
        user, _, hostport = spec.rpartition("@")
        host, _, port = hostport.partition(":")
        gateway = fabric.Connection(
            host, user=user or ssh.user, port=int(port or 22),
            connect_timeout=ssh.connect_timeout_s, connect_kwargs=dict(kwargs),
        )  # fmt: skip
        _host_key_policy(gateway.client, ssh.check_host_keys, known_hosts)
        try:
            gateway.open()
        except Exception as exc:
            gateway.close()
            cause = _cause(exc, node, known_hosts).replace(f"port {ssh.port}", f"port {port or 22}")
            kind = NodeUnreachable if _transient(exc) else NodeError  # a blip is retried
            raise kind(f"node {node.name} ({node.host}): jump host {spec}: {cause}") from None
        gateway.transport.set_keepalive(5)
        self._gateways[spec] = gateway
        return gateway

    # -- commands and files over a connection --------------------------------------------
    def run(
        self, node: Node, command: str, timeout: float | None = None, *, repeat: bool = True
    ) -> tuple[int, str]:
        """Run a shell command on ``node``; returns (exit code, :func:`~.executor.answer`).
        A command safe to repeat (``repeat``: status, sizes, probes) is run again on a new
        connection if its connection dropped, for the node's patience; one that is not (a
        start) is not: its :class:`NodeUnreachable` says the caller must find out what
        happened."""
        if not repeat:
            conn = self.connection(node)  # connecting is always safe to retry
            return self._run_once(node, command, timeout, conn)
        return self._patiently(node, lambda: self._run_once(node, command, timeout))

    def _run_once(
        self,
        node: Node,
        command: str,
        timeout: float | None,
        conn: fabric.Connection | None = None,
    ) -> tuple[int, str]:
        conn = conn or self._connect(node)
        try:
            result = conn.run(
                command,
                hide=True,
                warn=True,
                pty=False,
                in_stream=False,
                timeout=timeout or node.ssh.command_timeout_s,
            )
        except invoke.exceptions.CommandTimedOut:
            if self._answers(node, conn):  # the command is slow, not the connection dead
                raise NodeError(f"node {node.name} ({node.host}): command timed out") from None
            self._drop(node)
            raise NodeUnreachable(
                f"node {node.name} ({node.host}): stopped answering (a command timed out and "
                "the connection no longer opens channels)"
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._drop(node)
            raise NodeUnreachable(
                f"node {node.name} ({node.host}): stopped answering: {type(exc).__name__}: {exc}"
            ) from None
        return result.exited, answer(result.exited, result.stdout, result.stderr)

    @staticmethod
    def _answers(node: Node, conn: fabric.Connection) -> bool:
        """Whether the connection still opens a channel within the connect time-out."""
        try:
            conn.transport.open_session(timeout=node.ssh.connect_timeout_s).close()
        except Exception:
            return False
        return True

    def put_file(self, node: Node, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` on ``node`` over SFTP, 0600 before a byte is written;
        the whole file each time, so it is safe to repeat after a reconnect. Its folder
        must exist (the run folder, made by ``start`` or :func:`remote.mkdir`)."""

        def write() -> None:
            try:
                # an SFTP channel of its own, closed at once: fabric's memoized one stays open
                # for the connection's life, and a link outage strands its sftp-server on the
                # node until sshd's keepalive notices, hours later
                conn = self._connect(node)
                with conn.client.open_sftp() as sftp, sftp.open(path, "w") as fh:
                    fh.chmod(0o600)
                    fh.write(data)
            except (EOFError, paramiko.SSHException, ConnectionError, TimeoutError) as exc:
                self._drop(node)
                raise NodeUnreachable(f"node {node.name}: cannot write {path}: {exc}") from None
            except OSError as exc:  # the node said no (permissions, disk full)
                raise NodeError(f"node {node.name}: cannot write {path} (sftp): {exc}") from None

        self._patiently(node, write)

    def get_file(self, node: Node, path: str, local: str) -> None:
        """Copy ``path`` on ``node`` to ``local`` over SFTP, on a channel of its own, closed
        (see :meth:`put_file`); raises what SFTP raises (``OSError``, ``SSHException``)."""
        with self.connection(node).client.open_sftp() as sftp:
            sftp.get(path, local)

    def close(self) -> None:
        """Every node's connection, then the jump hosts' (the nodes' channels run over them)."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        for gateway in self._gateways.values():
            gateway.close()
        self._gateways.clear()
