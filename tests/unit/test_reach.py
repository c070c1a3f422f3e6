"""network.client: node URLs as this machine uses them (pytest_kimi.deploy.reach).

The SSH side is played by a fake transport whose ``direct-tcpip`` channel is a plain TCP
connection to the target (what the node's sshd would make): the forward's own work (a local
listener per target, bytes both ways, everything closed at teardown) is what is tested; the
SSH path itself is tested on the namespace hosts (tests/ssh/test_ssh_bastion.py)."""

from __future__ import annotations

import http.server
import socket
import threading

import httpx
import paramiko
import pytest

from pytest_kimi.config import Node, SSHConfig
from pytest_kimi.deploy.network import Probe
from pytest_kimi.deploy.reach import DIRECT, ForwardReach


class _Channel:
    """A socket standing in for a paramiko channel (selectable, recv/sendall/close)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.sock = socket.create_connection(target, timeout=5)
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_ready(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class _Transport:
    def __init__(self, fail: paramiko.ChannelException | None = None) -> None:
        self.opened: list[tuple[str, int]] = []
        self.fail = fail

    def open_channel(self, kind, dest, src, timeout=None):
        assert kind == "direct-tcpip"
        if self.fail is not None:
            raise self.fail
        self.opened.append(dest)
        return _Channel(dest)


class _Executor:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport
        self.asked: list[str] = []

    def connection(self, node: Node):
        self.asked.append(node.name)
        return self


NODE = Node("node602", "10.0.0.2", 8, ssh=SSHConfig(connect_timeout_s=2))
ROUTER = Node("node601", "10.0.0.1", 8, ssh=SSHConfig(connect_timeout_s=2))


@pytest.fixture
def server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"path={self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_direct_returns_urls_as_they_are():
    assert DIRECT.url("http://10.0.0.1:30000/health") == "http://10.0.0.1:30000/health"
    assert DIRECT.url_or_none(None) is None and DIRECT.close() == []


def test_a_forward_carries_http_over_the_nodes_connection_and_closes_at_teardown(server):
    executor = _Executor(_Transport())
    reach = ForwardReach(executor, {"127.0.0.1": NODE}, ROUTER)
    local = reach.url(f"http://127.0.0.1:{server}/get_model_info?x=1")
    assert local.startswith("http://127.0.0.1:") and local.endswith("/get_model_info?x=1")
    assert local != f"http://127.0.0.1:{server}/get_model_info?x=1"
    assert (
        reach.url(f"http://127.0.0.1:{server}/health").rsplit("/", 1)[0] == local.rsplit("/", 1)[0]
    )  # one forward per (address, port)
    with httpx.Client(trust_env=False, timeout=5) as http:
        for _ in range(3):  # kept-alive and fresh connections alike
            assert http.get(local).text == "path=/get_model_info?x=1"
    with httpx.Client(trust_env=False, timeout=5) as http:
        assert http.get(local).status_code == 200
    assert set(executor.asked) == {"node602"}  # the node that serves the address
    assert executor.transport.opened[0] == ("127.0.0.1", server)
    port = int(local.split(":")[2].split("/")[0])
    assert reach.close() == []
    assert reach.closed == [f"127.0.0.1:{port} -> 127.0.0.1:{server}"]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with pytest.raises(RuntimeError, match="closed"):
        reach.url(f"http://127.0.0.1:{server}/health")


def test_an_address_no_process_binds_goes_through_the_routers_node(server):
    executor = _Executor(_Transport())
    reach = ForwardReach(executor, {}, ROUTER)
    with httpx.Client(trust_env=False, timeout=5) as http:
        assert http.get(reach.url(f"http://127.0.0.1:{server}/x")).status_code == 200
    assert executor.asked == ["node601"]
    reach.close()


def test_a_channel_that_cannot_open_resets_the_local_connection():
    reach = ForwardReach(_Executor(_Transport(paramiko.ChannelException(2, "x"))), {}, ROUTER)
    with httpx.Client(trust_env=False, timeout=5) as http, pytest.raises(httpx.TransportError):
        http.get(reach.url("http://10.0.0.9:30000/health"))
    assert reach.close() == []


@pytest.mark.parametrize(
    ("code", "expected"),
    [(2, ""), (1, "sshd on node node601 (10.0.0.1) refuses TCP forwarding")],
    ids=["refused-node-answered", "forwarding-prohibited"],
)
def test_the_clients_preflight_probe_goes_through_the_forward(code, expected):
    exc = paramiko.ChannelException(code, "Connect failed")
    reach = ForwardReach(_Executor(_Transport(exc)), {}, ROUTER)
    probe = Probe(None, ROUTER, "10.0.0.1", 30000, "the router's port")
    found = reach.probe(probe, 3.0)
    assert (found == "") if not expected else found.startswith(expected)
