"""Throwaway SSH test hosts: one network namespace per host, each running its own OpenSSH sshd.

A run (``TestCluster.create()``) builds, all unique to the run (random ``<id>`` and ``X``):

- a blackhole route for ``10.213.X.0/24`` in the ROOT namespace, added first and removed last, so
  no packet for the test subnet can leave the machine even if a bridge disappears;
- a hub namespace ``kimi-hub-<id>`` holding bridge ``br0`` with ``10.213.X.1/24``;
- host namespaces ``kimi-n<i>-<id>`` (i = 1..n) with ``eth0`` = ``10.213.X.(10+i)/24``, joined to
  the bridge by a veth pair created directly between the hub and the host namespace (nothing is
  ever created in the root namespace except the blackhole route);
- per host an ``sshd`` in its own UTS + PID + mount namespace (hostname ``node60<i>``, its own
  ``/dev/shm``), listening only on the host's address, port 22;
- per run a host key per host, a user key, a second user key with a passphrase, ``known_hosts``,
  a ``known_hosts`` with a wrong key for host 1, an ``ssh_config`` mapping ``node60<i>`` to its
  address, and ``/etc/netns/<ns>/hosts`` so ``node60<i>`` resolves inside every namespace.

Clients must run inside the hub namespace: ``cluster.in_hub(argv)``. No namespace has a default
route. Teardown kills everything in the namespaces, deletes them, and verifies nothing is left.
A run killed without teardown (SIGKILL) is cleaned by ``sweep_stale()`` on the next run, which only
touches runs recorded under ``/run/kimi-testhosts/`` whose owning process is gone.

Standalone: ``python tests/ssh/testhosts.py up`` (create, print, wait for Ctrl-C) or ``... sweep``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "TestCluster",
    "TestHost",
    "TestHostsUnavailable",
    "sweep_stale",
]

SUBNET_BASE = "10.213"
NAME_PREFIX = "kimi-"
STATE_DIR = Path("/run/kimi-testhosts")
ETC_NETNS = Path("/etc/netns")
SSHD = "/usr/sbin/sshd"
SFTP_SERVER_CANDIDATES = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
DEFAULT_PASSPHRASE = "kimi-test-passphrase"
LOGIN_NOISE = "kimi test host: login noise on stderr"
# bash runs the user's ~/.bashrc for every command sshd hands it. The machine's own is not run
# on the test hosts (CI's runs `pyenv init`: ~0.2 s of CPU per SSH command, most of each round
# trip, minutes per suite); this one, bind-mounted over it in each host's mount namespace, gives
# every command what real nodes' login scripts give it (banners, locale warnings): stderr noise.
HOST_BASHRC = f"""# pytest-kimi test host: stands in for the ~/.bashrc of its user (testhosts.py)
echo '{LOGIN_NOISE}' >&2
"""

_READY_PROBE = r"""
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[1])
pending = set(sys.argv[2:])
while pending and time.monotonic() < deadline:
    for addr in sorted(pending):
        try:
            with socket.create_connection((addr, 22), timeout=0.5) as s:
                s.settimeout(1.0)
                if s.recv(64).startswith(b"SSH-"):
                    pending.discard(addr)
        except OSError:
            pass
    if pending:
        time.sleep(0.02)
print(" ".join(sorted(pending)))
"""


class TestHostsUnavailable(RuntimeError):
    """This machine cannot host namespace test hosts (not root, tools missing, no netns)."""

    __test__ = False


@dataclass
class TestHost:
    """One test host: a network namespace with an sshd in its own UTS/PID namespace."""

    __test__ = False

    index: int  # 1-based
    name: str  # node60<i>: the host's hostname, also resolvable in every namespace of the run
    netns: str  # kimi-n<i>-<id>
    address: str  # 10.213.X.(10+i)
    hub_veth: str  # the hub-side end of the host's veth pair (the host side is eth0)
    log_path: Path  # sshd stderr (-e), appended across restarts
    config_path: Path
    sshd_pid: int | None = None  # root-namespace pid of the listening sshd (pid 1 in its pid ns)
    unshare_pid: int | None = None  # root-namespace pid of the unshare process above it
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __str__(self) -> str:
        return f"{self.name} ({self.address}, netns {self.netns})"


def _run(argv: list[str], *, input: str | None = None, check: bool = True, timeout: float = 20):
    proc = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"command failed ({proc.returncode}): {' '.join(argv)}\n"
            f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}"
        )
    return proc


def _ip() -> str:
    return shutil.which("ip") or "/usr/sbin/ip"


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


def _netns_list() -> set[str]:
    out = _run([_ip(), "netns", "list"], check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _netns_pids(netns: str) -> list[int]:
    proc = _run([_ip(), "netns", "pids", netns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _kill_netns(*namespaces: str, deadline_s: float = 5.0) -> list[int]:
    """SIGKILL every process in the namespaces until none is left; return survivors."""
    end = time.monotonic() + deadline_s
    while True:
        pids = [pid for netns in namespaces for pid in _netns_pids(netns)]
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > end:
            return [pid for netns in namespaces for pid in _netns_pids(netns)]
        time.sleep(0.02)


def _route_exists(subnet: str) -> bool:
    out = _run([_ip(), "-4", "route", "show", "table", "all", subnet], check=False).stdout
    return bool(out.strip())


def _delete_etc_dir(path: Path) -> None:
    if path.is_dir() and path.parent == ETC_NETNS:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only if empty: other users of /etc/netns keep theirs


def _teardown_names(hub: str, hosts: list[str], subnet: str | None, route_added: bool) -> list[str]:
    """Remove a run's namespaces, links, /etc/netns entries and route; return problems found."""
    problems: list[str] = []
    existing = _netns_list()
    left = _kill_netns(*[n for n in [*hosts, hub] if n in existing])
    if left:
        problems.append(f"processes survive SIGKILL: {left}")
    if hub in existing:
        # Deleting the hub-side ends removes the veth pairs; then the bridge.
        cmds = [f"link del v{i}" for i in range(1, len(hosts) + 1)] + ["link del br0"]
        _run([_ip(), "-n", hub, "-force", "-batch", "-"], input="\n".join(cmds) + "\n", check=False)
    doomed = [n for n in [*hosts, hub] if n in existing]
    if doomed:
        _run(
            [_ip(), "-force", "-batch", "-"],
            input="".join(f"netns del {n}\n" for n in doomed),
            check=False,
        )
    for netns in [*hosts, hub]:
        _delete_etc_dir(ETC_NETNS / netns)
    if subnet and route_added:
        _run([_ip(), "route", "del", "blackhole", subnet], check=False)
    # Verify.
    left = sorted(_netns_list() & {*hosts, hub})
    if left:
        problems.append(f"namespaces left: {left}")
    left_etc = [str(ETC_NETNS / n) for n in [*hosts, hub] if (ETC_NETNS / n).exists()]
    if left_etc:
        problems.append(f"/etc/netns entries left: {left_etc}")
    if subnet and route_added and _route_exists(subnet):
        problems.append(f"route left in root namespace: {subnet}")
    return problems


def sweep_stale() -> list[str]:
    """Tear down runs recorded in STATE_DIR whose owning process is gone; return their ids."""
    swept: list[str] = []
    if not STATE_DIR.is_dir():
        return swept
    live, dead = [], []
    for state_file in sorted(STATE_DIR.glob("*.json")):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        pid, start = state.get("owner_pid"), state.get("owner_start")
        alive = pid is not None and _proc_start_time(int(pid)) == start
        (live if alive else dead).append((state_file, state))
    live_subnets = {state.get("subnet") for _, state in live}
    for state_file, state in dead:
        subnet = state.get("subnet")
        own_route = subnet not in live_subnets  # never remove a live run's route
        _teardown_names(state["hub"], state["hosts"], subnet, route_added=own_route)
        if state.get("owns_run_dir") and Path(state["run_dir"]).name.startswith("kimi-ssh-"):
            shutil.rmtree(state["run_dir"], ignore_errors=True)
        state_file.unlink(missing_ok=True)
        swept.append(state["id"])
    return swept


class TestCluster:
    """A run of n SSH test hosts behind a hub namespace. Build with ``TestCluster.create()``."""

    __test__ = False

    user = "root"

    def __init__(self, n_hosts: int, run_dir: Path, *, passphrase: str = DEFAULT_PASSPHRASE):
        self.id = secrets.token_hex(3)
        self.run_dir = Path(run_dir)
        self.hub = f"{NAME_PREFIX}hub-{self.id}"
        self.third_octet: int | None = None
        self.subnet: str = ""
        self.hub_address: str = ""
        self.passphrase = passphrase
        self.key_path = self.run_dir / "id_ed25519"
        self.passphrase_key_path = self.run_dir / "id_ed25519_passphrase"
        self.known_hosts_path = self.run_dir / "known_hosts"
        self.wrong_known_hosts_path = self.run_dir / "known_hosts.wrong"
        self.authorized_keys_path = self.run_dir / "authorized_keys"
        self.ssh_config_path = self.run_dir / "ssh_config"
        self.hosts: list[TestHost] = []
        self.timings: dict[str, float] = {}
        self._n_hosts = n_hosts
        self._host_netns = [f"{NAME_PREFIX}n{i}-{self.id}" for i in range(1, n_hosts + 1)]
        self._route_added = False
        self._state_file = STATE_DIR / f"{self.id}.json"
        self._closed = False
        self._owns_run_dir = False

    # ----------------------------------------------------------------------------------- build

    @classmethod
    def create(
        cls,
        n_hosts: int = 8,
        run_dir: str | os.PathLike | None = None,
        *,
        ready_timeout_s: float = 15.0,
        passphrase: str = DEFAULT_PASSPHRASE,
    ) -> TestCluster:
        """Build the hosts and wait until every sshd answers; clean up on any failure.

        Raises ``TestHostsUnavailable`` when the machine cannot do it at all (callers skip),
        anything else when it should have worked (callers fail).
        """
        if not 1 <= n_hosts <= 89:
            raise ValueError("n_hosts must be 1..89 (addresses .11 .. .99)")
        cls.preflight()
        owns_run_dir = run_dir is None
        if run_dir is None:  # removed again by a clean close(); a given run_dir is kept
            import tempfile

            run_dir = tempfile.mkdtemp(prefix="kimi-ssh-")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        os.chmod(run_dir, 0o700)
        cluster = cls(n_hosts, Path(run_dir), passphrase=passphrase)
        cluster._owns_run_dir = owns_run_dir
        start = time.perf_counter()
        try:
            cluster._build(ready_timeout_s)
        except BaseException:
            cluster.close(check=False)
            raise
        cluster.timings["create_s"] = time.perf_counter() - start
        return cluster

    @staticmethod
    def preflight() -> None:
        """Raise TestHostsUnavailable with the reason if this machine cannot run test hosts."""
        if sys.platform != "linux":
            raise TestHostsUnavailable(f"needs Linux network namespaces (platform {sys.platform})")
        if os.geteuid() != 0:
            raise TestHostsUnavailable(
                "needs root to create network namespaces (run as root, as CI does)"
            )
        missing = [
            tool
            for tool in ("ip", "unshare", "ssh", "ssh-keygen")
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()
        ]
        if not Path(SSHD).exists():
            missing.append(SSHD)
        if missing:
            raise TestHostsUnavailable(
                f"missing tools: {', '.join(missing)} (run scripts/ci_system_deps.sh: "
                "apt-get install -y openssh-server openssh-client iproute2 iptables)"
            )

    def _checkpoint(self, stage: str) -> None:
        """Hook between build stages (tests override it to simulate an interrupt)."""

    def _build(self, ready_timeout_s: float) -> None:
        t0 = time.perf_counter()
        sweep_stale()
        self._pick_subnet_and_blackhole()  # first: before anything could route the subnet
        self._checkpoint("route")
        keygen = self._start_keygen()
        self._create_namespaces()
        self._checkpoint("netns")
        self._wire_network()
        self._checkpoint("network")
        self._finish_keys(keygen)
        self._write_etc_hosts()
        self._checkpoint("files")
        t1 = time.perf_counter()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for host in self.hosts:
            self._spawn_sshd(host)
            self._checkpoint(f"sshd:{host.index}")
        self._wait_ready(self.hosts, ready_timeout_s)
        for host in self.hosts:
            self._resolve_sshd_pid(host)
        t2 = time.perf_counter()
        self.timings.update(network_and_keys_s=t1 - t0, sshd_ready_s=t2 - t1)

    def _pick_subnet_and_blackhole(self) -> None:
        routes = _run([_ip(), "-4", "route", "show", "table", "all"], check=False).stdout
        addrs = _run([_ip(), "-4", "addr", "show"], check=False).stdout
        taken = routes + addrs
        candidates = list(range(256))
        random.SystemRandom().shuffle(candidates)
        for x in candidates:
            if f"{SUBNET_BASE}.{x}." in taken:
                continue
            subnet = f"{SUBNET_BASE}.{x}.0/24"
            self._write_state(subnet)  # record before adding, so a crash right after is swept
            proc = _run([_ip(), "route", "add", "blackhole", subnet], check=False)
            if proc.returncode == 0:
                self.third_octet, self.subnet = x, subnet
                self._route_added = True
                self.hub_address = f"{SUBNET_BASE}.{x}.1"
                self._write_state(subnet)
                return
            if "File exists" in proc.stderr:
                continue  # a concurrent run took it
            self._state_file.unlink(missing_ok=True)
            raise TestHostsUnavailable(
                f"cannot add a blackhole route in the root namespace: {proc.stderr.strip()}"
            )
        raise RuntimeError(f"no free {SUBNET_BASE}.X.0/24 subnet on this machine")

    def _write_state(self, subnet: str) -> None:
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        state = {
            "id": self.id,
            "owner_pid": os.getpid(),
            "owner_start": _proc_start_time(os.getpid()),
            "subnet": subnet,
            "hub": self.hub,
            "hosts": self._host_netns,
            "run_dir": str(self.run_dir),
            "owns_run_dir": self._owns_run_dir,
        }
        self._state_file.write_text(json.dumps(state, indent=1) + "\n")

    def _create_namespaces(self) -> None:
        proc = _run(
            [_ip(), "-batch", "-"],
            input="".join(f"netns add {n}\n" for n in [self.hub, *self._host_netns]),
            check=False,
        )
        if proc.returncode != 0:
            raise TestHostsUnavailable(
                f"cannot create network namespaces: {proc.stderr.strip() or proc.stdout.strip()}"
            )

    def _wire_network(self) -> None:
        x = self.third_octet
        hub_cmds = [
            "link set lo up",
            "link add br0 type bridge",
            f"addr add {self.hub_address}/24 dev br0",
            "link set br0 up",
        ]
        for i, netns in enumerate(self._host_netns, start=1):
            hub_cmds += [
                f"link add v{i} type veth peer name eth0 netns {netns}",
                f"link set v{i} master br0",
                f"link set v{i} up",
            ]
            self.hosts.append(
                TestHost(
                    index=i,
                    name=f"node{600 + i}",
                    netns=netns,
                    address=f"{SUBNET_BASE}.{x}.{10 + i}",
                    hub_veth=f"v{i}",
                    log_path=self.run_dir / f"sshd-node{600 + i}.log",
                    config_path=self.run_dir / f"sshd-node{600 + i}.conf",
                )
            )
        _run([_ip(), "-n", self.hub, "-batch", "-"], input="\n".join(hub_cmds) + "\n")
        procs = []
        for host in self.hosts:
            cmds = f"link set lo up\naddr add {host.address}/24 dev eth0\nlink set eth0 up\n"
            p = subprocess.Popen(
                [_ip(), "-n", host.netns, "-batch", "-"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append((host, p, cmds))
        for host, p, cmds in procs:
            out, _ = p.communicate(cmds, timeout=20)
            if p.returncode != 0:
                raise RuntimeError(f"configuring {host.netns} failed: {out.strip()}")

    def _start_keygen(self) -> list[tuple[subprocess.Popen, str]]:
        def keygen(path: Path, passphrase: str, comment: str) -> tuple[subprocess.Popen, str]:
            argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", comment]
            argv += ["-f", str(path)]
            return (
                subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                ),
                str(path),
            )

        jobs = [
            keygen(self.key_path, "", f"kimi-test-user-{self.id}"),
            keygen(self.passphrase_key_path, self.passphrase, f"kimi-test-pass-{self.id}"),
            keygen(self.run_dir / "wrong_host_key", "", "kimi-wrong-host-key"),
        ]
        for i in range(1, self._n_hosts + 1):
            jobs.append(keygen(self.run_dir / f"host_key_node{600 + i}", "", f"node{600 + i}"))
        return jobs

    def _finish_keys(self, jobs: list[tuple[subprocess.Popen, str]]) -> None:
        for proc, path in jobs:
            out, _ = proc.communicate(timeout=20)
            if proc.returncode != 0:
                raise RuntimeError(f"ssh-keygen for {path} failed: {out.decode(errors='replace')}")

        def pub(path: Path) -> str:
            kind, blob = Path(f"{path}.pub").read_text().split()[:2]
            return f"{kind} {blob}"

        self.authorized_keys_path.write_text(
            pub(self.key_path) + "\n" + pub(self.passphrase_key_path) + "\n"
        )
        good, wrong = [], []
        for host in self.hosts:
            key = pub(self.run_dir / f"host_key_{host.name}")
            bad = pub(self.run_dir / "wrong_host_key") if host.index == 1 else key
            for alias in (host.address, host.name):
                good.append(f"{alias} {key}")
                wrong.append(f"{alias} {bad}")
        self.known_hosts_path.write_text("\n".join(good) + "\n")
        self.wrong_known_hosts_path.write_text("\n".join(wrong) + "\n")
        sftp = next((p for p in SFTP_SERVER_CANDIDATES if Path(p).exists()), None)
        for host in self.hosts:
            lines = [
                f"ListenAddress {host.address}",
                "Port 22",
                "AddressFamily inet",
                f"HostKey {self.run_dir / f'host_key_{host.name}'}",
                f"PidFile {self.run_dir / f'sshd-{host.name}.pid'}",
                f"AuthorizedKeysFile {self.authorized_keys_path}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UseDNS no",
                "PrintMotd no",
                "X11Forwarding no",
                "MaxStartups 200",
                "MaxSessions 100",
                "LogLevel INFO",
            ]
            if sftp:
                lines.append(f"Subsystem sftp {sftp}")
            host.config_path.write_text("\n".join(lines) + "\n")
        ssh_config = []
        for host in self.hosts:
            ssh_config += [
                f"Host {host.name}",
                f"    HostName {host.address}",
                f"    User {self.user}",
                f"    IdentityFile {self.key_path}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self.known_hosts_path}",
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    ConnectTimeout 5",
                "",
            ]
        self.ssh_config_path.write_text("\n".join(ssh_config))

    def _write_etc_hosts(self) -> None:
        # `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts: names resolve inside.
        lines = [
            "127.0.0.1 localhost",
            "::1 localhost ip6-localhost ip6-loopback",
            f"{self.hub_address} kimi-hub",
        ]
        lines += [f"{h.address} {h.name}" for h in self.hosts]
        for netns in [self.hub, *self._host_netns]:
            d = ETC_NETNS / netns
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text("\n".join(lines) + "\n")

    def _spawn_sshd(self, host: TestHost) -> None:
        # its own /dev/shm, as a separate machine has: SGLang tells ranks on one node from
        # ranks on another by whether a shared-memory segment one creates is visible to the
        # other, and ranks it takes for one node talk over 127.0.0.1 (another namespace here)
        script = (
            f"hostname {host.name}; mount -t tmpfs -o mode=1777 tmpfs /dev/shm; "
            f"{self._mask_bashrc()}exec {SSHD} -D -e -f {host.config_path}"
        )
        argv = [_ip(), "netns", "exec", host.netns, "unshare", "--uts", "--pid", "--fork"]
        argv += ["--mount-proc", "--kill-child", "sh", "-c", script]
        with open(host.log_path, "ab") as log:
            host._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C to pytest's group does not race our teardown
            )
        host.unshare_pid = host._proc.pid  # `ip netns exec` execs unshare: same pid
        host.sshd_pid = None

    def _mask_bashrc(self) -> str:
        """Shell that bind-mounts :data:`HOST_BASHRC` over the user's ``~/.bashrc`` (the
        host's own mount namespace: the machine's file is untouched); nothing when there is
        none to mask (bash then runs nothing either)."""
        real = Path(os.path.expanduser(f"~{self.user}")) / ".bashrc"
        if not real.is_file():
            return ""
        ours = self.run_dir / "host-bashrc"
        ours.write_text(HOST_BASHRC)
        mount = shlex.join(["mount", "--bind", str(ours), str(real)])
        return f"{mount} || echo 'testhosts: could not mask {real}' >&2; "

    def _resolve_sshd_pid(self, host: TestHost, timeout_s: float = 5.0) -> None:
        assert host.unshare_pid is not None
        children_file = Path(f"/proc/{host.unshare_pid}/task/{host.unshare_pid}/children")
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                children = children_file.read_text().split()
                if children:
                    host.sshd_pid = int(children[0])
                    return
            time.sleep(0.005)
        raise RuntimeError(f"no sshd process under unshare pid {host.unshare_pid} for {host}")

    def _wait_ready(self, hosts: list[TestHost], timeout_s: float) -> None:
        proc = _run(
            self.in_hub([sys.executable, "-c", _READY_PROBE, str(timeout_s)])
            + [h.address for h in hosts],
            check=False,
            timeout=timeout_s + 20,
        )
        pending = set(proc.stdout.split())
        if proc.returncode != 0:
            pending = {h.address for h in hosts}
        failed = [h for h in hosts if h.address in pending]
        if failed:
            parts = [f"readiness probe stderr: {proc.stderr.strip()}"] if proc.stderr else []
            for h in failed:
                state = "running" if h.running else f"exited with {h._proc and h._proc.poll()}"
                log = h.log_path.read_text(errors="replace")[-4000:] if h.log_path.exists() else ""
                parts.append(f"--- {h} sshd {state}; log {h.log_path}:\n{log}")
            raise RuntimeError(
                f"sshd did not accept SSH on port 22 within {timeout_s:.0f} s on "
                f"{', '.join(h.name for h in failed)}\n" + "\n".join(parts)
            )

    # ------------------------------------------------------------------------------------- API

    def in_hub(self, argv: list[str]) -> list[str]:
        """Prefix ``argv`` so it runs inside the hub namespace (where clients belong)."""
        return [_ip(), "netns", "exec", self.hub, *argv]

    def run_in_hub(self, argv: list[str], *, timeout: float = 30, **kwargs):
        """``subprocess.run(in_hub(argv))`` with captured text output; never raises on exit code."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.in_hub(argv), timeout=timeout, check=False, **kwargs)

    def ssh_argv(
        self,
        host: TestHost | str,
        *command: str,
        known_hosts: str | os.PathLike | None = None,
        key: str | os.PathLike | None = None,
        connect_timeout: float = 5,
    ) -> list[str]:
        """OpenSSH client argv for ``host`` (a TestHost or an address); run it via in_hub()."""
        address = host.address if isinstance(host, TestHost) else host
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(key or self.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts_path}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={connect_timeout:g}",
            f"{self.user}@{address}",
            *command,
        ]

    def host(self, key: int | str) -> TestHost:
        """A host by 1-based index, name (node601) or address."""
        for h in self.hosts:
            if key in (h.index, h.name, h.address):
                return h
        raise KeyError(key)

    def pids(self, host: TestHost) -> list[int]:
        """Root-namespace pids of processes in the host's namespace, except its unshare and sshd
        (the listener and its per-connection ``sshd: user@...`` session processes)."""
        sshd_real = os.path.realpath(SSHD)
        result = []
        for pid in _netns_pids(host.netns):
            if pid in (host.unshare_pid, host.sshd_pid):
                continue
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                if not Path(f"/proc/{pid}").exists():
                    continue  # exited meanwhile
                exe = ""
            if exe == sshd_real:
                continue
            result.append(pid)
        return result

    @staticmethod
    def ns_pid(pid: int) -> int | None:
        """The pid a root-namespace process has inside its host (as ``echo $!`` there reports)."""
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
        except OSError:
            return None
        return None

    @staticmethod
    def _kill_pid_namespaces(hosts: list[TestHost], timeout_s: float = 2.0) -> None:
        """SIGKILL each host's pid-namespace init (its sshd: the kernel then kills everything in
        that pid namespace) and let unshare reap it, so no zombie is left for the machine's init.
        """
        live = [h for h in hosts if h._proc is not None and h._proc.poll() is None]
        for host in live:
            pid = host.sshd_pid
            if pid is None:  # interrupted before it was looked up
                with contextlib.suppress(OSError, ValueError, IndexError):
                    children = f"/proc/{host._proc.pid}/task/{host._proc.pid}/children"
                    pid = int(Path(children).read_text().split()[0])
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + timeout_s
        for host in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                host._proc.wait(timeout=max(0.0, end - time.monotonic()))

    def stop_host(self, host: TestHost) -> None:
        """Kill everything in the host's namespace and take its link down: the address then
        neither answers nor refuses (connects time out / fail with EHOSTUNREACH)."""
        self._kill_pid_namespaces([host])
        left = _kill_netns(host.netns)
        if left:
            raise RuntimeError(f"processes survive SIGKILL in {host.netns}: {left}")
        if host._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                host._proc.wait(timeout=5)
        _run([_ip(), "-n", host.netns, "link", "set", "eth0", "down"])
        _run([_ip(), "-n", self.hub, "link", "set", host.hub_veth, "down"])
        host.sshd_pid = None

    def set_link(self, host: TestHost, up: bool) -> None:
        """Take the host's link down (or up) and nothing else: its processes run on, its
        address neither answers nor refuses, TCP connections survive a short outage."""
        _run([_ip(), "-n", host.netns, "link", "set", "eth0", "up" if up else "down"])

    def start_host(self, host: TestHost, *, ready_timeout_s: float = 15.0) -> None:
        """Undo ``stop_host``: link up, fresh sshd, wait until it answers."""
        if host.running:
            return
        _run([_ip(), "-n", self.hub, "link", "set", host.hub_veth, "up"])
        _run([_ip(), "-n", host.netns, "link", "set", "eth0", "up"])
        self._spawn_sshd(host)
        self._wait_ready([host], ready_timeout_s)
        self._resolve_sshd_pid(host)

    def unreachable_address(self) -> str:
        """An address inside the test /24 that no host or hub holds."""
        assert self.third_octet is not None
        return f"{SUBNET_BASE}.{self.third_octet}.200"

    # ---------------------------------------------------------------------------------- teardown

    def close(self, *, check: bool = True) -> None:
        """Kill, delete and verify; idempotent. With ``check`` raise if anything is left."""
        if self._closed:
            return
        start = time.perf_counter()
        self._kill_pid_namespaces(self.hosts)
        problems = _teardown_names(self.hub, self._host_netns, self.subnet, self._route_added)
        for host in self.hosts:
            if host._proc is not None:
                try:
                    host._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    problems.append(f"{host}: unshare pid {host._proc.pid} did not exit")
            host.sshd_pid = None
        if not problems:
            self._state_file.unlink(missing_ok=True)
            if self._owns_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        self._closed = True
        self.timings["teardown_s"] = time.perf_counter() - start
        if problems and check:
            raise RuntimeError("test host teardown left things behind: " + "; ".join(problems))

    def leftovers(self) -> list[str]:
        """Anything of this run that still exists (empty after a clean close())."""
        left = [n for n in sorted(_netns_list()) if self.id in n]
        left += [str(p) for p in ETC_NETNS.glob(f"*{self.id}*")] if ETC_NETNS.is_dir() else []
        if self.subnet and _route_exists(self.subnet):
            left.append(f"route {self.subnet}")
        return left

    def __enter__(self) -> TestCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close(check=exc[0] is None)

    def __repr__(self) -> str:
        return f"<TestCluster {self.id} {self.subnet} hub={self.hub} hosts={len(self.hosts)}>"

    def describe(self) -> str:
        lines = [repr(self), f"run_dir {self.run_dir}", f"key {self.key_path}"]
        lines += [f"  {h.name} {h.address} netns={h.netns} sshd={h.sshd_pid}" for h in self.hosts]
        return "\n".join(lines)


def _main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "up"
    if cmd == "sweep":
        print("swept:", sweep_stale() or "nothing")
        return 0
    if cmd == "up":
        n = int(argv[1]) if len(argv) > 1 else 8
        cluster = TestCluster.create(n)
        try:
            print(cluster.describe())
            print({k: round(v, 3) for k, v in cluster.timings.items()})
            if "--once" not in argv:
                hub, cfg = cluster.hub, cluster.ssh_config_path
                print(f"clients: ip netns exec {hub} ssh -F {cfg} node601")
                print("Ctrl-C to tear down")
                signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            cluster.close()
            print(f"teardown {cluster.timings['teardown_s']:.3f} s, left: {cluster.leftovers()}")
        return 0
    print("usage: testhosts.py [up [N] [--once] | sweep]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
