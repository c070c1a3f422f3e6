"""The SSH test hosts work: OpenSSH and fabric reach every host from the hub, host keys are
checked, unreachable addresses fail fast, nothing can leave the machine, teardown leaves nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testhosts import LOGIN_NOISE, TestCluster, sweep_stale

from pytest_kimi.testing.processes import ctrl_c_as_at_a_terminal


def _ssh(cluster: TestCluster, host, *command: str, timeout: float = 30, **kw):
    return cluster.run_in_hub(cluster.ssh_argv(host, *command, **kw), timeout=timeout)


def test_every_host_answers_with_its_hostname(ssh_hosts: TestCluster) -> None:
    assert [h.name for h in ssh_hosts.hosts] == [f"node60{i}" for i in range(1, 9)]
    procs = {
        h.name: subprocess.Popen(
            ssh_hosts.in_hub(ssh_hosts.ssh_argv(h, "hostname")),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for h in ssh_hosts.hosts
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"{name}: {err}"
        assert out.strip() == name


def test_the_machines_bashrc_is_masked_by_login_noise_on_stderr(ssh_hosts: TestCluster) -> None:
    # every SSH command runs the stand-in ~/.bashrc (noise on stderr, nothing on stdout), never
    # the machine's own (CI's runs pyenv init: ~0.2 s a command); the machine's file is untouched
    rc = Path.home() / ".bashrc"
    done = _ssh(ssh_hosts, ssh_hosts.hosts[1], "cat ~/.bashrc")
    if not rc.is_file():  # nothing to mask: bash runs nothing
        assert done.returncode != 0 and LOGIN_NOISE not in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert LOGIN_NOISE in done.stderr and LOGIN_NOISE in done.stdout  # the stand-in, run and read
    assert done.stdout != rc.read_text()
    mounts = subprocess.run(["findmnt", "-n", str(rc)], capture_output=True, text=True)
    assert mounts.stdout == ""  # masked inside the hosts' mount namespaces only


def test_layout_matches_the_brief(ssh_hosts: TestCluster) -> None:
    x = ssh_hosts.third_octet
    assert ssh_hosts.subnet == f"10.213.{x}.0/24"
    assert ssh_hosts.user == "root"
    assert ssh_hosts.hub.startswith("kimi-hub-")
    for h in ssh_hosts.hosts:
        assert h.netns == f"kimi-n{h.index}-{ssh_hosts.id}"
        assert h.address == f"10.213.{x}.{10 + h.index}"
        assert h.sshd_pid and h.running
        assert Path(f"/proc/{h.sshd_pid}/exe").resolve() == Path("/usr/sbin/sshd").resolve()
    for path in (
        ssh_hosts.key_path,
        ssh_hosts.passphrase_key_path,
        ssh_hosts.known_hosts_path,
        ssh_hosts.wrong_known_hosts_path,
        ssh_hosts.ssh_config_path,
    ):
        assert path.is_file()
    assert ssh_hosts.passphrase
    assert ssh_hosts.unreachable_address() not in {h.address for h in ssh_hosts.hosts}
    assert ssh_hosts.unreachable_address().startswith(f"10.213.{x}.")
    known = ssh_hosts.known_hosts_path.read_text().splitlines()
    assert f"{ssh_hosts.hosts[0].address} ssh-ed25519 AAAA" in "\n".join(known)
    netns = set(
        subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert {ssh_hosts.hub, *(h.netns for h in ssh_hosts.hosts)} <= netns


def test_no_default_route_anywhere_and_loopback_up(ssh_hosts: TestCluster) -> None:
    for netns in [ssh_hosts.hub, *(h.netns for h in ssh_hosts.hosts)]:
        routes = subprocess.run(
            ["ip", "-n", netns, "route", "show", "table", "all"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "default" not in routes, f"{netns}: {routes}"
        lo = subprocess.run(
            ["ip", "-n", netns, "-o", "link", "show", "lo"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert ",UP" in lo, f"{netns}: {lo}"
    hub_addrs = subprocess.run(
        ["ip", "-n", ssh_hosts.hub, "-4", "-o", "addr", "show", "br0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{ssh_hosts.hub_address}/24" in hub_addrs


def test_root_namespace_blackholes_the_subnet(ssh_hosts: TestCluster) -> None:
    routes = subprocess.run(
        ["ip", "route", "show", ssh_hosts.subnet], capture_output=True, text=True, check=True
    ).stdout
    assert routes.split()[:2] == ["blackhole", ssh_hosts.subnet]
    # A route lookup (no packet sent) from the root namespace finds no way out.
    lookup = subprocess.run(
        ["ip", "route", "get", ssh_hosts.hosts[0].address], capture_output=True, text=True
    )
    assert lookup.returncode != 0, lookup.stdout


def test_wrong_known_hosts_refuses_host_1_only(ssh_hosts: TestCluster) -> None:
    h1, h2 = ssh_hosts.hosts[:2]
    bad = _ssh(ssh_hosts, h1, "hostname", known_hosts=ssh_hosts.wrong_known_hosts_path)
    assert bad.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in bad.stderr
    assert "Host key verification failed" in bad.stderr
    ok = _ssh(ssh_hosts, h2, "hostname", known_hosts=ssh_hosts.wrong_known_hosts_path)
    assert ok.returncode == 0 and ok.stdout.strip() == h2.name, ok.stderr


def test_unreachable_address_fails_quickly(ssh_hosts: TestCluster) -> None:
    start = time.monotonic()
    proc = _ssh(ssh_hosts, ssh_hosts.unreachable_address(), "true", connect_timeout=2)
    elapsed = time.monotonic() - start
    assert proc.returncode == 255
    assert "timed out" in proc.stderr or "No route to host" in proc.stderr, proc.stderr
    assert elapsed < 4.0


def test_names_resolve_inside_the_hub_and_ssh_config_works(ssh_hosts: TestCluster) -> None:
    h3 = ssh_hosts.hosts[2]
    resolved = ssh_hosts.run_in_hub(["getent", "hosts", h3.name])
    assert resolved.stdout.split()[0] == h3.address
    proc = ssh_hosts.run_in_hub(["ssh", "-F", str(ssh_hosts.ssh_config_path), h3.name, "hostname"])
    assert proc.returncode == 0 and proc.stdout.strip() == h3.name, proc.stderr
    # Hosts resolve each other too (what --dist-init-addr node601:PORT needs).
    peer = _ssh(ssh_hosts, h3, "getent", "hosts", "node601")
    assert peer.stdout.split()[0] == ssh_hosts.hosts[0].address, peer.stderr


def test_processes_started_over_ssh_appear_in_pids(ssh_hosts: TestCluster) -> None:
    host = ssh_hosts.hosts[1]
    assert ssh_hosts.pids(host) == []
    started = _ssh(ssh_hosts, host, "setsid nohup sleep 4242 >/dev/null 2>&1 </dev/null & echo $!")
    assert started.returncode == 0, started.stderr
    remote_pid = int(started.stdout.strip())
    try:
        pids = ssh_hosts.pids(host)
        mine = [p for p in pids if TestCluster.ns_pid(p) == remote_pid]
        assert len(mine) == 1, (pids, remote_pid)
        cmdline = Path(f"/proc/{mine[0]}/cmdline").read_bytes().split(b"\0")
        assert cmdline[:2] == [b"sleep", b"4242"]
        # Other hosts do not see it.
        assert ssh_hosts.pids(ssh_hosts.hosts[2]) == []
    finally:
        _ssh(ssh_hosts, host, f"kill -KILL -- -{remote_pid}")
    deadline = time.monotonic() + 5
    while ssh_hosts.pids(host) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ssh_hosts.pids(host) == []


def test_stop_host_makes_it_unreachable_and_start_host_restores(ssh_hosts: TestCluster) -> None:
    host = ssh_hosts.hosts[-1]
    try:
        ssh_hosts.stop_host(host)
        assert not host.running
        assert (
            subprocess.run(
                ["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=True
            ).stdout.split()
            == []
        )
        start = time.monotonic()
        proc = _ssh(ssh_hosts, host, "true", connect_timeout=2)
        assert proc.returncode == 255
        assert "refused" not in proc.stderr, "a stopped host must not answer at all"
        assert time.monotonic() - start < 4.0
        # The others are unaffected.
        other = _ssh(ssh_hosts, ssh_hosts.hosts[0], "hostname")
        assert other.stdout.strip() == ssh_hosts.hosts[0].name
    finally:
        ssh_hosts.start_host(host)
    again = _ssh(ssh_hosts, host, "hostname")
    assert again.returncode == 0 and again.stdout.strip() == host.name, again.stderr


FABRIC_SCRIPT = r"""
import json, sys
from concurrent.futures import ThreadPoolExecutor

import paramiko
from fabric import Connection

args = json.loads(sys.argv[1])
plain = {"key_filename": args["key"], "look_for_keys": False, "allow_agent": False}


def hostname(addr):
    with Connection(addr, user="root", connect_timeout=5, connect_kwargs=plain) as c:
        return c.run("hostname", hide=True).stdout.strip()


with ThreadPoolExecutor(4) as pool:
    out = {"hostnames": dict(zip(args["addresses"], pool.map(hostname, args["addresses"])))}

first = args["addresses"][0]
protected = {"key_filename": args["passphrase_key"], "passphrase": args["passphrase"],
             "look_for_keys": False, "allow_agent": False}
with Connection(first, user="root", connect_timeout=5, connect_kwargs=protected) as c:
    out["passphrase_key"] = c.run("hostname", hide=True).stdout.strip()


def strict(known_hosts):
    c = Connection(first, user="root", connect_timeout=5, connect_kwargs=plain)
    c.client.load_host_keys(known_hosts)
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        return c.run("hostname", hide=True).stdout.strip()
    except paramiko.BadHostKeyException:
        return "BadHostKeyException"
    finally:
        c.close()


out["strict_good"] = strict(args["known_hosts"])
out["strict_wrong"] = strict(args["wrong_known_hosts"])
print(json.dumps(out))
"""


def test_fabric_from_the_hub(ssh_hosts: TestCluster) -> None:
    args = {
        "addresses": [h.address for h in ssh_hosts.hosts],
        "key": str(ssh_hosts.key_path),
        "passphrase_key": str(ssh_hosts.passphrase_key_path),
        "passphrase": ssh_hosts.passphrase,
        "known_hosts": str(ssh_hosts.known_hosts_path),
        "wrong_known_hosts": str(ssh_hosts.wrong_known_hosts_path),
    }
    proc = ssh_hosts.run_in_hub([sys.executable, "-c", FABRIC_SCRIPT, json.dumps(args)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["hostnames"] == {h.address: h.name for h in ssh_hosts.hosts}
    assert out["passphrase_key"] == "node601"
    assert out["strict_good"] == "node601"
    assert out["strict_wrong"] == "BadHostKeyException"


# --------------------------------------------------------------- own clusters: teardown paths


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_create_and_close_leave_nothing(testhosts_preflight, tmp_path: Path) -> None:
    cluster = TestCluster.create(2, tmp_path)
    try:
        procs = [h._proc for h in cluster.hosts]
        # 3 namespaces, their 3 /etc/netns/<ns> directories, the root-namespace route.
        assert len(cluster.leftovers()) == 7, cluster.leftovers()
    finally:
        cluster.close()
    assert cluster.leftovers() == []
    assert all(p is not None and p.poll() is not None for p in procs)
    assert not any(cluster.id in n for n in _netns_names())
    cluster.close()  # idempotent


class _Interrupt(TestCluster):
    stage = ""
    seen: list[TestCluster] = []  # noqa: RUF012 - set per test

    def _checkpoint(self, stage: str) -> None:
        type(self).seen.append(self)
        if stage == self.stage:
            raise KeyboardInterrupt(stage)


@pytest.mark.parametrize("stage", ["route", "netns", "network", "files", "sshd:1", "sshd:3"])
def test_interrupted_creation_cleans_up(testhosts_preflight, tmp_path: Path, stage: str) -> None:
    _Interrupt.stage, _Interrupt.seen = stage, []
    with pytest.raises(KeyboardInterrupt):
        _Interrupt.create(3, tmp_path)
    cluster = _Interrupt.seen[-1]
    assert cluster.leftovers() == []
    assert all(h._proc is None or h._proc.poll() is not None for h in cluster.hosts)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_run_is_cleaned(testhosts_preflight, sig: int) -> None:
    """Ctrl-C: the run cleans itself. SIGKILL: the next run's sweep_stale() cleans it."""
    script = Path(__file__).with_name("testhosts.py")
    before = _netns_names()
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script), "up", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C" in line:
                break
        created = _netns_names() - before
        assert len(created) == 2, "".join(lines)
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGINT:
        assert "left: []" in rest
    else:
        assert created <= _netns_names()  # SIGKILL: nothing ran, so everything is still there
        run_id = next(iter(created)).rsplit("-", 1)[1]
        assert run_id in sweep_stale()
    assert not created & _netns_names()
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    subnet = next(ln for ln in "".join(lines).splitlines() if "TestCluster" in ln).split()[2]
    assert subnet not in routes
