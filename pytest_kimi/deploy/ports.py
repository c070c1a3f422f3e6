"""``port: auto`` on this machine: a port free now, that no other run takes before our
server binds it.

A port found free by binding port 0 is free only at that instant: the kernel hands the same
port to the next ``bind(0)`` of any process, and to outgoing connections. Two layouts planned
at once (``-n 2``) drew the same port, and one layout's server died at start-up with "address
already in use". So a port is drawn from below the kernel's ephemeral range (where neither
``bind(0)`` nor an outgoing connection ever lands), checked by binding it, and booked with
``flock`` on a file named for it, in a directory every run of this user shares. The booking
lasts until the deployment is torn down; a run that dies drops its bookings with its file
descriptors, so none outlives its owner.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: well-known and registered services; never drawn
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default range, where /proc does not say


class NoFreePort(RuntimeError):
    """No port could be booked: the message says which range was tried and on which host."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's ephemeral port range (``bind(0)`` and outgoing connections draw there)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def drawing_range(ephemeral: tuple[int, int]) -> range:
    """Where ``auto`` ports are drawn: below the ephemeral range, or above it where the range
    was moved so low that too little room is left below it."""
    low, high = ephemeral
    if low - LOWEST >= 2000:
        return range(LOWEST, low)
    if 65535 - high >= 2000:
        return range(high + 1, 65536)
    raise NoFreePort(f"the ephemeral port range {low}-{high} ({EPHEMERAL_RANGE}) leaves no "
                     "room for ports of our own: set the ports in the cluster file")  # fmt: skip


def default_directory() -> Path:
    """One directory per user on this machine, shared by every run."""
    return Path(tempfile.gettempdir()) / f"pytest-kimi-ports-{os.getuid()}"


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (as the servers do: SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick(host: str = "127.0.0.1", ports: range | None = None, attempts: int = 200) -> int:
    """A port bindable on ``host`` now, drawn from ``ports`` (below the ephemeral range by
    default), not booked."""
    ports = ports if ports is not None else drawing_range(ephemeral_range())
    rng = random.Random()
    for _ in range(attempts):
        port = rng.choice(ports)
        if bindable(host, port):
            return port
    raise NoFreePort(f"no free port on {host} in {ports.start}-{ports.stop - 1} after "
                     f"{attempts} tries")  # fmt: skip


class PortBook:
    """Ports booked for one deployment; :meth:`close` gives them back."""

    attempts = 200

    def __init__(
        self,
        directory: Path | None = None,
        *,
        ports: range | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.directory = directory or default_directory()
        self.ports = ports if ports is not None else drawing_range(ephemeral_range())
        self.rng = rng or random.Random()
        self.held: dict[int, int] = {}  # port -> the descriptor holding its booking

    def take(self, host: str = "127.0.0.1") -> int:
        """A port bindable on ``host`` now and booked for us until :meth:`close`."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for _ in range(self.attempts):
            port = self.rng.choice(self.ports)
            if port in self.held or not self._book(port):
                continue
            if bindable(host, port):
                return port
            self._give_back(port)  # something that is not ours listens there
        raise NoFreePort(
            f"no free port on {host} in {self.ports.start}-{self.ports.stop - 1} after "
            f"{self.attempts} tries (bookings in {self.directory}): set the ports in the "
            "cluster file"
        )

    def _book(self, port: int) -> bool:
        fd = os.open(self.directory / str(port), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # booked by another run
            raise
        self.held[port] = fd
        return True

    def _give_back(self, port: int) -> None:
        fd = self.held.pop(port)
        with contextlib.suppress(OSError):
            os.close(fd)  # closing the descriptor drops the flock

    def close(self) -> None:
        """Give every booking back (the servers that bound the ports are gone)."""
        for port in list(self.held):
            self._give_back(port)

    def __enter__(self) -> PortBook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, not booked (a dry run; tests that start their own
    server). Drawn below the kernel's ephemeral range, as :class:`PortBook` draws: a port from
    ``bind(0)`` would be handed to the next outgoing connection too, and a server started on it
    a moment later could find it taken."""
    return pick(host)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now (:func:`free_port`'s, none drawn twice:
    two draws from the range can coincide, and two listeners on one port cannot both start)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports
