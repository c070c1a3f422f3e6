"""The jump host is an SSH server like any node: its host key is checked against the cluster's
known_hosts (refused when unknown, naming the jump host), and its connection is closed with
the nodes'. A paramiko server on 127.0.0.1 plays the jump host."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pytest_kimi.config import Node, SSHConfig
from pytest_kimi.deploy.ssh import SSHExecutor
from pytest_kimi.deploy.sshconnections import NodeError


class _Accept(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL


@pytest.fixture
def jump_host() -> Iterator[tuple[int, paramiko.PKey]]:
    """An SSH server on 127.0.0.1 (port, its host key) accepting any public key."""
    host_key = paramiko.Ed25519Key.from_private_key(_pem_stream())
    listener = socket.create_server(("127.0.0.1", 0))
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(host_key)
            transports.append(transport)
            with contextlib.suppress(paramiko.SSHException, EOFError):
                transport.start_server(server=_Accept())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], host_key
    listener.close()
    for transport in transports:
        transport.close()
    thread.join(5)


def _pem_stream():
    import io

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    return io.StringIO(pem.decode())


def _setup(tmp_path: Path, port: int, known: paramiko.PKey | None) -> tuple[Node, dict, str]:
    key_path = tmp_path / "id"
    key_path.write_text(_pem_stream().getvalue())
    known_hosts = tmp_path / "known_hosts"
    hosts = paramiko.HostKeys()
    if known is not None:
        hosts.add(f"[127.0.0.1]:{port}", known.get_name(), known)
    hosts.save(str(known_hosts))
    ssh = SSHConfig(
        key=str(key_path), known_hosts=str(known_hosts), jump_host=f"kimi@127.0.0.1:{port}",
        connect_timeout_s=5,
    )  # fmt: skip
    node = Node("node602", "10.213.0.12", 8, ssh=ssh)
    return node, {"pkey": paramiko.Ed25519Key.from_path(str(key_path))}, str(known_hosts)


def test_a_jump_host_whose_key_is_not_in_known_hosts_is_refused_naming_it(tmp_path, jump_host):
    port, _ = jump_host
    node, _, _ = _setup(tmp_path, port, known=None)
    executor = SSHExecutor("/tmp/w", "run", environ={})
    with pytest.raises(NodeError) as info:
        executor.connection(node)
    message = str(info.value)
    assert message.startswith(f"node node602 (10.213.0.12): jump host kimi@127.0.0.1:{port}: ")
    assert "host key not found in" in message and str(tmp_path / "known_hosts") in message
    assert executor.connections._gateways == {}  # nothing kept open


def test_a_jump_host_with_another_key_is_a_mismatch_naming_it(tmp_path, jump_host):
    port, _ = jump_host
    other = paramiko.Ed25519Key.from_private_key(_pem_stream())
    node, _, _ = _setup(tmp_path, port, known=other)
    with pytest.raises(NodeError, match=r"jump host kimi@127\.0\.0\.1:\d+: host key mismatch"):
        SSHExecutor("/tmp/w", "run", environ={}).connection(node)


def test_a_known_jump_host_is_opened_once_and_closed_with_the_executor(tmp_path, jump_host):
    port, host_key = jump_host
    node, kwargs, known_hosts = _setup(tmp_path, port, known=host_key)
    executor = SSHExecutor("/tmp/w", "run", environ={})
    connections = executor.connections
    gateway = connections._gateway(node, kwargs, known_hosts)
    assert gateway.is_connected
    assert connections._gateway(node, kwargs, known_hosts) is gateway  # shared by its nodes
    executor.close()
    assert not gateway.is_connected and connections._gateways == {}
