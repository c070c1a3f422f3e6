"""The SSH key is decrypted once per run, and every way it can fail names node, key and cause
without ever showing the passphrase."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pytest_kimi.config import Node, SSHConfig
from pytest_kimi.deploy.ssh import SSHExecutor
from pytest_kimi.deploy.sshconnections import NodeError

SECRET = "correct horse battery staple"


def _key_file(path: Path, passphrase: str | None) -> Path:
    encryption = (
        serialization.BestAvailableEncryption(passphrase.encode())
        if passphrase
        else serialization.NoEncryption()
    )
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption
        )
    )
    return path


def _node(key: Path, passphrase_env: str | None = None) -> Node:
    ssh = SSHConfig(key=str(key), passphrase_env=passphrase_env)
    return Node("node603", "192.0.2.3", 8, ssh=ssh)


def test_encrypted_key_is_loaded_once_with_the_passphrase_from_the_named_variable(tmp_path):
    key = _key_file(tmp_path / "id", SECRET)
    executor = SSHExecutor("/tmp/w", "run", environ={"KEY_PASS": SECRET})
    first = executor.connections.keys.key(_node(key, "KEY_PASS"))
    assert isinstance(first, paramiko.Ed25519Key)
    assert executor.connections.keys.key(_node(key, "KEY_PASS")) is first  # no second KDF run


def test_plain_key_needs_no_passphrase(tmp_path):
    key = _key_file(tmp_path / "id", None)
    keys = SSHExecutor("/tmp/w", "run", environ={}).connections.keys
    assert isinstance(keys.key(_node(key)), paramiko.PKey)


@pytest.mark.parametrize(
    ("passphrase_env", "environ", "expected"),
    [
        (None, {}, "is encrypted and no passphrase was given"),
        ("KEY_PASS", {}, "the key passphrase variable KEY_PASS is not set"),
        ("KEY_PASS", {"KEY_PASS": "not " + SECRET}, "wrong passphrase, or not a private key"),
    ],
    ids=["no-passphrase", "variable-unset", "wrong-passphrase"],
)
def test_key_problems_name_node_and_cause_never_the_passphrase(
    tmp_path, passphrase_env, environ, expected
):
    key = _key_file(tmp_path / "id", SECRET)
    executor = SSHExecutor("/tmp/w", "run", environ=environ)
    with pytest.raises(NodeError) as info:
        executor.connections.keys.key(_node(key, passphrase_env))
    message = str(info.value)
    assert message.startswith("node node603 (192.0.2.3): ") and expected in message
    assert SECRET not in message


def test_missing_key_file_is_named(tmp_path):
    executor = SSHExecutor("/tmp/w", "run", environ={})
    with pytest.raises(NodeError, match=r"SSH key .*/absent cannot be read: No such file"):
        executor.connections.keys.key(_node(tmp_path / "absent"))


def test_a_node_that_failed_to_connect_fails_fast_afterwards(tmp_path):
    from pytest_kimi.deploy.ports import free_port

    port = free_port("127.0.0.1")  # nothing listens there: refused at once, on loopback
    ssh = SSHConfig(port=port, connect_timeout_s=2, reconnect_s=0.2, teardown_reconnect_s=0.2)
    node = Node("node604", "127.0.0.1", 8, ssh=ssh)
    executor = SSHExecutor("/tmp/w", "run", environ={})
    executor.begin_teardown()  # its patience is spent once, then every question fails fast
    with pytest.raises(NodeError, match=r"node node604 .*unreachable") as first:
        executor.connection(node)
    # teardown asks a dead node several things (log size, TERM, alive, log): one timeout only
    with pytest.raises(NodeError) as again:
        executor.run(node, "true")
    assert again.value is first.value
