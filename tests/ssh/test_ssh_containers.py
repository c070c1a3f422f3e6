"""Containers, setup lines and secrets over real SSH on the 8 test hosts (issue 14, items 1, 5).

The container runtime is ``standin_runtime.py``: like ``docker exec``, the process it starts is
not in the client's process group and gets no signal sent to the client, so a teardown that
signalled the client would leave the server running, and ``ssh_hosts.pids`` would show it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml
from test_ssh_deploy import _assert_no_processes, _cluster_yaml, _run_in_hub

STANDIN = Path(__file__).with_name("standin_runtime.py")
SECRET = "hf_by_name_secret_5521"

# Loaded into the child pytest with -p: at the first test, while the deployment is up, it reads
# every process's command line (the child is in the root PID namespace: it sees the hosts'),
# finds the mock servers, and reads what reached their environment.
SPY = textwrap.dedent(
    """
    import json, os
    from pathlib import Path
    import pytest

    DONE = []

    def _read(path):
        try:
            return Path(path).read_bytes()
        except OSError:
            return b""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(item):
        if DONE:
            return
        DONE.append(1)
        secret = os.environ["KIMI_SPY_SECRET"].encode()
        hosts = os.environ["KIMI_SPY_HOSTS"].encode().split(b",")  # other runs may share /proc
        found, servers = [], {}
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            argv = _read(f"/proc/{pid}/cmdline").split(b"\\0")
            if secret in b" ".join(argv):
                found.append([int(pid), b" ".join(argv).decode(errors="replace")])
            ours = b"--host" in argv and argv[argv.index(b"--host") + 1] in hosts
            if argv[1:3] == [b"-m", b"pytest_kimi.mock.launch_server"] and ours:
                environ = _read(f"/proc/{pid}/environ").split(b"\\0")
                servers[pid] = b"HF_TOKEN=" + secret in environ
        Path(os.environ["KIMI_SPY_OUT"]).write_text(json.dumps({"found": found,
                                                                 "servers": servers}))
    """
)


def _standin(tmp_path: Path) -> Path:
    """The runtime CLI the nodes run: per host its own containers (the hosts share a disk)."""
    exe = tmp_path / "docker-standin"
    exe.write_text(
        f'#!/bin/sh\nexec {sys.executable} {STANDIN} {tmp_path}/state/"$(hostname)" "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def _on(ssh_hosts, host, *command: str) -> subprocess.CompletedProcess:
    return ssh_hosts.run_in_hub(ssh_hosts.ssh_argv(host, *command), timeout=60)


def _edit(cluster: Path, **server) -> None:
    data = yaml.safe_load(cluster.read_text())
    data["server"]["env"].pop("HF_TOKEN")
    data["server"].update(server)
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))


def _files_hold(root: Path, value: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and value in p.read_text(errors="replace")]


def test_a_secret_passed_by_name_reaches_every_server_and_no_command_line_or_file(
    ssh_hosts, tmp_path
):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    _edit(cluster, env_from_local=["HF_TOKEN"])
    spy_dir = tmp_path / "spy"
    spy_dir.mkdir()
    (spy_dir / "kimi_spy.py").write_text(SPY)
    out = tmp_path / "spy.json"
    env = {**os.environ, "HF_TOKEN": SECRET, "KIMI_SPY_SECRET": SECRET,
           "KIMI_SPY_OUT": str(out), "PYTHONPATH": str(spy_dir),
           "KIMI_SPY_HOSTS": ",".join(h.address for h in ssh_hosts.hosts)}  # fmt: skip
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32", "-p", "kimi_spy", env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    _assert_no_processes(ssh_hosts)
    seen = json.loads(out.read_text())
    assert seen["found"] == []  # in no process's command line, on any host or here
    assert len(seen["servers"]) == 8 and all(seen["servers"].values())  # up, and it got there
    assert SECRET not in cluster.read_text() and SECRET not in done.stdout + done.stderr
    assert _files_hold(tmp_path / "out", SECRET) == []
    assert _files_hold(tmp_path / "remote", SECRET) == []
    assert not list((tmp_path / "remote").rglob("*.env"))  # read and removed
    [run] = list((tmp_path / "out").iterdir())
    manifest = json.loads((run / "tp32" / "manifest.json").read_text())
    assert all("HF_TOKEN='***'" in p["command"] for p in manifest["processes"][:8])


def test_exec_into_running_containers_stops_the_servers_inside_and_runs_setup(ssh_hosts, tmp_path):
    exe = _standin(tmp_path)
    for host in ssh_hosts.hosts:
        started = _on(ssh_hosts, host, str(exe), "run", "-d", "--name", "sgl", "img", "sleep")
        assert started.returncode == 0, started.stderr
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    container = {"runtime": "docker", "mode": "exec", "name": "sgl", "executable": str(exe)}
    setup = ['KIMI_MARK="$(hostname)"  # a comment', f'touch {marks}/"$KIMI_MARK"']
    _edit(cluster, container=container, setup=setup, env_from_local=["HF_TOKEN"])
    env = {**os.environ, "HF_TOKEN": SECRET}
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=pp8", env=env)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert sorted(p.name for p in marks.iterdir()) == [h.name for h in ssh_hosts.hosts]
        for host in ssh_hosts.hosts:  # nothing of ours left inside the containers
            inside = _on(ssh_hosts, host, str(exe), "top", "sgl")
            assert inside.returncode == 0 and inside.stdout.split() == [], (host.name, inside)
        [run] = list((tmp_path / "out").iterdir())
        log = (run / "pp8" / "logs" / "replica1-node0-node605.log").read_text()
        assert "ready to roll" in log  # fetched from inside the container
        assert _files_hold(tmp_path / "out", SECRET) == []
    finally:
        for host in ssh_hosts.hosts:  # the containers are the user's: we leave them; the test not
            _on(ssh_hosts, host, str(exe), "rm", "-f", "sgl")
    _assert_no_processes(ssh_hosts)


def test_run_mode_starts_a_container_per_server_and_removes_it(ssh_hosts, tmp_path):
    exe = _standin(tmp_path)
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    container = {"runtime": "docker", "mode": "run", "image": "lmsysorg/sglang:test",
                 "gpus": [0, 1], "mounts": ["/models:/models:ro"],
                 "executable": str(exe)}  # fmt: skip
    _edit(cluster, container=container)
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "processes left running" not in done.stdout
    _assert_no_processes(ssh_hosts)  # every container's init, daemon and server: gone
    states = [p for p in (tmp_path / "state").iterdir()]
    assert len(states) == 8 and all(not list(p.glob("*.json")) for p in states)


def test_a_failing_setup_line_fails_bring_up_naming_the_node_with_its_output(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    _edit(cluster, setup=['[ "$(hostname)" != node606 ] || { echo no conda here; (exit 3); }'])
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=pp8")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "replica1-node1-node606 (replica 1 node node606" in done.stdout
    assert "exited with code 3" in done.stdout and "no conda here" in done.stdout
    assert "server.setup line 1 failed with exit 3" in done.stdout
    _assert_no_processes(ssh_hosts)


def test_the_standin_is_faithful_killing_the_exec_clients_group_leaves_the_process(
    ssh_hosts, tmp_path
):
    """What a naive teardown (signal the ``docker exec`` client's group) leaves behind."""
    exe = _standin(tmp_path)
    host = ssh_hosts.hosts[0]
    assert _on(ssh_hosts, host, str(exe), "run", "-d", "--name", "c", "img").returncode == 0
    try:
        argv = ssh_hosts.ssh_argv(host, "setsid", str(exe), "exec", "c", "sleep", "300")
        client = subprocess.Popen(ssh_hosts.in_hub(argv), start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 30
        while not (pids := _on(ssh_hosts, host, str(exe), "top", "c").stdout.split()):
            assert time.monotonic() < deadline, "the exec'd process did not appear"
            time.sleep(0.05)
        exec_clients = [
            p
            for p in ssh_hosts.pids(host)
            if b"exec\0c\0" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        assert exec_clients
        for pid in exec_clients:  # the whole group of the client, as the old teardown did
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        client.wait(timeout=30)
        assert _on(ssh_hosts, host, str(exe), "top", "c").stdout.split() == pids  # still there
    finally:
        _on(ssh_hosts, host, str(exe), "rm", "-f", "c")
    gone = _on(ssh_hosts, host, str(exe), "top", "c")
    assert gone.returncode == 1 and "No such container: c" in gone.stderr
    _assert_no_processes(ssh_hosts)
