"""How this machine reaches a node's HTTP port: one place that maps a node URL to the one to use.

Health, readiness, warm-up, server versions, metrics, the watchdog's poll and the benchmark
client all talk HTTP to node addresses (``plan.py`` stays about those). Behind a bastion none
of that arrives, so every such URL goes through :meth:`Reach.url` first:

- ``network.client: direct``: the URL as it is;
- ``network.client: ssh_forward``: ``http://127.0.0.1:<free port>/...``, a local forward over
  the SSH connection of the node that serves the address (through ``ssh.jump_host`` when set).
  One forward per (address, port), opened on first use; each accepted local connection opens a
  paramiko ``direct-tcpip`` channel to ``addr:port`` (the node's sshd connects on its side) and
  a thread copies bytes both ways. The channel's transport is asked of the executor per
  connection, so a reconnected node is used as soon as it is back. :meth:`Reach.close` (at
  teardown, whatever happened: Deployment.stop) closes the listeners and every live channel.

sshtunnel (unmaintained) and fabric's ``forward_local`` (a context manager that blocks a
thread per forward) are not used: a listener and its threads are ours to close.

The network pre-flight's "this machine reaches the router" probe goes through the reach too:
direct mode connects; ssh_forward asks the router's node's sshd for a channel to the router's
address (nothing listens yet, so "connect failed" means the node answered; "administratively
prohibited" means that sshd forbids forwarding, which ssh_forward cannot work without).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import paramiko

    from pytest_kimi.config import Node
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.deploy.network import Probe
    from pytest_kimi.deploy.plan import DeploymentPlan

ADMIN_PROHIBITED = 1  # SSH_OPEN_ADMINISTRATIVELY_PROHIBITED (RFC 4254 5.1)


class Reach:
    """``network.client: direct``: this machine reaches the nodes' addresses itself."""

    mode = "direct"

    def url(self, url: str) -> str:
        return url

    def url_or_none(self, url: str | None) -> str | None:
        return None if url is None else self.url(url)

    def probe(self, probe: Probe, timeout_s: float) -> str:
        """'' when the target host answered the client's probe, else why not."""
        from pytest_kimi.deploy.network import from_here

        return from_here(probe, timeout_s)

    def listening(self) -> list[str]:
        """``127.0.0.1:<port> -> addr:port`` of each open local forward (none here)."""
        return []

    def close(self) -> list[str]:
        """Nothing to close; returns what is still listening (nothing)."""
        return []


DIRECT = Reach()


@dataclass
class _Forward:
    """One local listener and the connections it accepted, each copied by its own thread."""

    target: tuple[str, int]
    node: Node
    listener: socket.socket
    port: int  # the local port (kept: a closed listener has no name)
    threads: list[threading.Thread] = field(default_factory=list)
    open: set[object] = field(default_factory=set)  # sockets and channels still live


class ForwardReach(Reach):
    """``network.client: ssh_forward``: local forwards over the nodes' SSH connections."""

    mode = "ssh_forward"

    def __init__(self, executor: Executor, via: dict[str, Node], default: Node) -> None:
        """``via``: address -> the node whose SSH connection carries forwards to it; an
        address not there goes through ``default`` (the router's node)."""
        self.executor, self.via, self.default = executor, via, default
        self._forwards: dict[tuple[str, int], _Forward] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.closed: list[str] = []  # the forwards close() closed, for the teardown line

    @classmethod
    def for_plan(cls, plan: DeploymentPlan, executor: Executor) -> ForwardReach:
        via = {spec.bind_addr: spec.node for spec in plan.processes}
        return cls(executor, via, plan.router.node)

    # -- URLs ----------------------------------------------------------------------------
    def url(self, url: str) -> str:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        if host is None or port is None:
            raise ValueError(f"cannot forward {url!r}: no host and port")
        forward = self._forward(host, port)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{forward.port}"))

    def _forward(self, addr: str, port: int) -> _Forward:
        with self._lock:
            if self._closed:
                raise RuntimeError("the SSH forwards were closed (teardown)")
            found = self._forwards.get((addr, port))
            if found is not None:
                return found
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            node = self.via.get(addr, self.default)
            forward = self._forwards[(addr, port)] = _Forward(
                (addr, port), node, listener, int(listener.getsockname()[1])
            )
        thread = threading.Thread(
            target=self._accept, args=(forward,), name=f"kimi-forward-{addr}:{port}", daemon=True
        )
        forward.threads.append(thread)
        thread.start()
        return forward

    def listening(self) -> list[str]:
        with self._lock:
            return [f"127.0.0.1:{f.port} -> {a}:{p}" for (a, p), f in self._forwards.items()]

    # -- the threads -----------------------------------------------------------------------
    def _accept(self, forward: _Forward) -> None:
        while True:
            try:
                client, peer = forward.listener.accept()
            except OSError:  # the listener was closed: teardown
                return
            thread = threading.Thread(
                target=self._serve, args=(forward, client, peer), daemon=True,
                name=f"kimi-forward-conn-{forward.target[0]}:{forward.target[1]}",
            )  # fmt: skip
            with self._lock:
                if self._closed:
                    client.close()
                    return
                forward.open.add(client)
                forward.threads.append(thread)
            thread.start()

    def _serve(self, forward: _Forward, client: socket.socket, peer: tuple[str, int]) -> None:
        """One accepted connection: a channel to the target, bytes copied both ways until
        either side closes. A channel that cannot open closes the local connection (the HTTP
        client sees a reset and reports the target unreachable)."""
        channel = None
        try:
            channel = self._channel(forward.node, forward.target, peer)
            with self._lock:
                forward.open.add(channel)
            _pump(client, channel)
        except Exception:  # the local side sees the connection close
            pass
        finally:
            with self._lock:
                forward.open.discard(client)
                forward.open.discard(channel)
            with contextlib.suppress(Exception):
                client.close()
            if channel is not None:
                with contextlib.suppress(Exception):
                    channel.close()

    def _channel(
        self, node: Node, target: tuple[str, int], peer: tuple[str, int] = ("127.0.0.1", 0)
    ) -> paramiko.Channel:
        transport = self.executor.connection(node).transport  # type: ignore[attr-defined]
        timeout = node.ssh.connect_timeout_s
        return transport.open_channel("direct-tcpip", target, peer, timeout=timeout)

    # -- the client's pre-flight probe ---------------------------------------------------
    def probe(self, probe: Probe, timeout_s: float) -> str:
        """Through the SSH connection of the router's node: a channel to the router's address
        opens, or fails with "connect failed" (nothing listens yet: the node answered)."""
        import paramiko

        node = self.via.get(probe.addr, self.default)
        try:
            channel = self._channel(node, (probe.addr, probe.port))
        except paramiko.ChannelException as exc:
            if exc.code == ADMIN_PROHIBITED:
                return (
                    f"sshd on node {node.name} ({node.host}) refuses TCP forwarding "
                    "(AllowTcpForwarding no?): network.client: ssh_forward needs it"
                )
            return ""  # the node's sshd tried and was refused: nothing listens yet
        except Exception as exc:  # NodeError, SSHException: no SSH to that node
            return f"no SSH forward through node {node.name}: {exc}"
        channel.close()
        return ""

    # -- teardown ------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> list[str]:
        """Close every listener and live connection and wait for their threads (idempotent);
        returns each forward still accepting connections afterwards (none, if all went well)."""
        with self._lock:
            self._closed = True
            forwards = list(self._forwards.values())
            self._forwards.clear()
            live = [thing for f in forwards for thing in f.open]
        for forward in forwards:
            _close_listener(forward.listener)
        for thing in live:
            with contextlib.suppress(Exception):
                thing.close()  # type: ignore[attr-defined]
        for forward in forwards:
            for thread in forward.threads:
                thread.join(timeout_s)
        self.closed = [f"127.0.0.1:{f.port} -> {f.target[0]}:{f.target[1]}" for f in forwards]
        return [
            f"SSH forward {where} still open"
            for where, f in zip(self.closed, forwards, strict=True)
            if _accepts(f.port) or any(t.is_alive() for t in f.threads)
        ]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _close_listener(listener: socket.socket) -> None:
    """Wake ``accept`` (shutdown) and close: a closed socket alone may leave it blocked."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def _pump(client: socket.socket, channel: paramiko.Channel, chunk: int = 65536) -> None:
    """Copy bytes between ``client`` and ``channel`` until one of them closes."""
    while True:
        ready, _, _ = select.select([client, channel], [], [], 1.0)
        if client in ready:
            data = client.recv(chunk)
            if not data:
                return
            channel.sendall(data)
        if channel in ready:
            data = channel.recv(chunk)
            if not data:
                return
            client.sendall(data)
        if channel.closed and not channel.recv_ready():
            return


def reach_for(plan: DeploymentPlan, executor: Executor) -> Reach:
    """The reach the cluster file asks for (local clusters: always direct). ``on_node`` sends
    the benchmark from a node (:mod:`pytest_kimi.deploy.clientnode`); everything else this
    machine asks goes through the forwards, as with ``ssh_forward``."""
    cluster = plan.cluster
    if cluster.executor == "ssh" and cluster.network.client in ("ssh_forward", "on_node"):
        return ForwardReach.for_plan(plan, executor)
    return DIRECT
