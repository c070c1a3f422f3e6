"""A real Slurm on the SSH test hosts: slurmctld in the hub, one slurmd per host, munged.

Built on a running :class:`testhosts.TestCluster` (its network namespaces, hostnames
``node60<i>``, addresses), with Debian's ``slurm-wlm`` 22.05 and ``munge``
(``scripts/ci_system_deps.sh``). Everything is the run's own, under its run folder:

- a munge key and a ``munged`` on its own socket (``AuthInfo=socket=...``), never the machine's;
- ``slurm.conf`` / ``gres.conf`` / ``cgroup.conf``: cluster ``kimitest``, the controller
  ``kimictl`` at the hub's address (its own UTS namespace gives it that hostname, which
  slurmctld checks), one node per host at its address with 8 CPUs and 8 GPUs (character
  devices made with ``mknod``: slurmd wants device files, not GPUs), partition ``gpu``,
  process tracking by process group and no task plugin (no cgroups are made);
- ``slurmctld`` in the hub namespace, and per host a ``slurmd`` entered into the namespaces of
  the host's sshd (network, UTS, mount, PID): it is ``node60<i>`` and its steps run there, as
  the product's SSH commands do. ``ip netns exec`` gives each host a fresh ``/sys``; the
  cgroup hierarchies that slurmd 22.05 insists on reading are mounted into the host's own
  mount namespace.

Clients (``salloc``, ``srun``, ``squeue``, ``scancel``) run in the hub with ``SLURM_CONF``
(:meth:`SlurmCluster.env`). :meth:`SlurmCluster.close` cancels every job, stops every daemon
and checks that none is left: no process anywhere whose command line names the run's
``slurm.conf`` or munge socket.

Standalone: ``python tests/ssh/slurmhosts.py up [N]`` (hosts and Slurm; Ctrl-C tears down).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from testhosts import TestCluster, TestHost, TestHostsUnavailable

CONTROLLER = "kimictl"
PARTITION = "gpu"
CPUS, GPUS = 8, 8
NVIDIA_MAJOR = 195  # the NVIDIA driver's character-device major number
DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
CLIENTS = ("salloc", "srun", "squeue", "scancel", "sinfo", "scontrol", "nsenter", "mknod")

# inside a host (its mount namespace): the cgroup hierarchies of the machine, then slurmd
_SLURMD_SCRIPT = """
set -e
if [ "$CGROUP" = v2 ]; then
    mount -t cgroup2 none /sys/fs/cgroup
else
    mount -t tmpfs kimi_cgroup_root /sys/fs/cgroup
    for c in cpu cpuacct cpuset memory devices freezer pids; do
        mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
    done
fi
exec /usr/sbin/slurmd -D -f "$SLURM_CONF"
"""


class SlurmUnavailable(TestHostsUnavailable):
    """This machine cannot run Slurm (tools missing, not root): callers skip or fail."""


def preflight() -> None:
    """Raise :class:`SlurmUnavailable` naming what is missing."""
    missing = [d for d in DAEMONS if not Path(d).exists()]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        raise SlurmUnavailable(
            f"missing {', '.join(missing)} (scripts/ci_system_deps.sh installs slurm-wlm and "
            "munge)"
        )


def _cgroup_version() -> str:
    """v2 where the machine's /sys/fs/cgroup is cgroup2 alone, else v1 (hybrid included)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == "/sys/fs/cgroup":
            return "v2" if fields[2] == "cgroup2" else "v1"
    return "v1"


class SlurmCluster:
    """slurmctld, slurmd on every host of ``hosts`` and a munged of its own."""

    __test__ = False

    def __init__(self, hosts: TestCluster, run_dir: Path) -> None:
        self.hosts = hosts
        self.dir = Path(run_dir)
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.closed = False

    # ----------------------------------------------------------------------------------- build

    @classmethod
    def create(cls, hosts: TestCluster, run_dir: Path, *, ready_timeout_s: float = 30.0):
        """Start munged, slurmctld and every slurmd; wait until every node is idle. Stops all
        of it again if that fails."""
        preflight()
        cluster = cls(hosts, run_dir)
        try:
            cluster._write_files()
            cluster._start_munged()
            cluster._start_controller()
            for host in hosts.hosts:
                cluster.start_slurmd(host)
            cluster.wait_idle([h.name for h in hosts.hosts], ready_timeout_s)
        except BaseException:
            cluster.close(check=False)
            raise
        return cluster

    def _write_files(self) -> None:
        for sub in ("state", "munge", "dev", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("munge",):
            os.chmod(self.dir / sub, 0o700)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for i in range(GPUS):
            device = self.dir / "dev" / f"nvidia{i}"
            if not device.exists():
                os.mknod(device, 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, i))  # S_IFCHR
        hub = self.hosts.hub_address
        lines = [
            "ClusterName=kimitest",
            f"SlurmctldHost={CONTROLLER}({hub})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "SlurmdParameters=config_overrides",
            "MessageTimeout=10",
            "KillWait=5",
            f"StateSaveLocation={self.dir / 'state'}",
            f"SlurmdSpoolDir={self.dir / 'spool'}/%n",
            f"SlurmctldPidFile={self.dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.dir / 'slurmd'}-%n.pid",
            f"SlurmctldLogFile={self.dir / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.dir / 'log' / 'slurmd'}-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "GresTypes=gpu",
        ]
        lines += [f"NodeName={h.name} NodeAddr={h.address} CPUs={CPUS} Gres=gpu:{GPUS} "
                  "State=UNKNOWN" for h in self.hosts.hosts]  # fmt: skip
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        gres = [f"NodeName={h.name} Name=gpu File={self.dir / 'dev'}/nvidia[0-{GPUS - 1}]"
                for h in self.hosts.hosts]  # fmt: skip
        (self.dir / "gres.conf").write_text("\n".join(gres) + "\n")
        cgroup = ["CgroupPlugin=cgroup/" + _cgroup_version(), "IgnoreSystemd=yes"]
        (self.dir / "cgroup.conf").write_text("\n".join(cgroup) + "\n")
        for host in self.hosts.hosts:
            (self.dir / "spool" / host.name).mkdir(parents=True, exist_ok=True)

    def _popen(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.dir / "log" / f"{name}.out", "ab")  # noqa: SIM115 (the process owns it)
        self.procs[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        log.close()

    def _start_munged(self) -> None:
        munge = self.dir / "munge"
        self._popen("munged", [
            "/usr/sbin/munged", "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}",
        ])  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._tail('munged.out')}")
            time.sleep(0.05)

    def _start_controller(self) -> None:
        script = f"hostname {CONTROLLER} && exec /usr/sbin/slurmctld -D -i -f {self.conf}"
        self._popen("slurmctld", self.hosts.in_hub(["unshare", "--uts", "sh", "-c", script]))

    def start_slurmd(self, host: TestHost) -> None:
        """slurmd in ``host``'s namespaces (again after the host was restarted)."""
        assert host.sshd_pid is not None, f"{host} is not running"
        argv = ["nsenter", "-t", str(host.sshd_pid), "-n", "-u", "-m", "-p", "sh", "-c",
                _SLURMD_SCRIPT]  # fmt: skip
        env = {"SLURM_CONF": str(self.conf), "CGROUP": _cgroup_version()}
        self._popen(f"slurmd-{host.name}", argv, env)

    # ------------------------------------------------------------------------------------- API

    def env(self) -> dict[str, str]:
        """What a Slurm client needs in its environment."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], *, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command in the hub; never raises on its exit code."""
        env = {**os.environ, **self.env()}
        return subprocess.run(self.hosts.in_hub(argv), capture_output=True, text=True,
                              timeout=timeout, check=False, env=env)  # fmt: skip

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, names: list[str], timeout_s: float) -> None:
        """Until every node in ``names`` is idle (resuming any that came up down or drained)."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: "
                                       f"{self._tail(name + '.out')}")  # fmt: skip
            states = self.node_states()
            if all(states.get(n) == "idle" for n in names):
                return
            stuck = [n for n in names if states.get(n, "").startswith(("down", "drain", "inval"))]
            if stuck:
                self.run(["scontrol", "update", f"nodename={','.join(stuck)}", "state=resume"])
            time.sleep(0.2)
        raise RuntimeError(f"Slurm nodes not idle within {timeout_s:.0f} s: {states}; "
                           f"slurmctld log: {self._tail('slurmctld.log')}")  # fmt: skip

    def jobs(self) -> list[str]:
        """Every job still in the queue, as ``squeue`` lists it (id, name, state)."""
        out = self.run(["squeue", "-h", "-o", "%i %j %T"]).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def ours(self) -> list[int]:
        """Root-namespace pids of every process whose command line names this run's Slurm
        config or munge socket (daemons, steps' slurmstepd, clients)."""
        marks = (str(self.conf).encode(), str(self.munge_socket).encode())
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                env = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if any(m in cmd for m in marks) or b"SLURM_CONF=" + marks[0] in env:
                found.append(int(entry))
        return found

    def _tail(self, name: str, lines: int = 15) -> str:
        path = self.dir / "log" / name
        if not path.exists():
            path = self.dir / name
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no {name})"

    # -------------------------------------------------------------------------------- teardown

    def close(self, *, check: bool = True) -> list[str]:
        """Cancel every job, stop every daemon, and (``check``) raise if anything is left."""
        if self.closed:
            return []
        self.closed = True
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user=root"], timeout=15)
            deadline = time.monotonic() + 15
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        left = [f"job {job}" for job in self.jobs()] if check else []
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            with_signal(proc, signal.SIGTERM)
        for name in order:
            proc = self.procs.get(name)
            if proc is not None:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    with_signal(proc, signal.SIGKILL)
                    proc.wait(5)
        for pid in self.ours():  # slurmstepd and steps that outlived their slurmd
            with_signal_pid(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.ours() and time.monotonic() < deadline:
            time.sleep(0.05)
        left += [f"process {pid}: {_cmdline(pid)}" for pid in self.ours()]
        if check and left:
            raise RuntimeError("Slurm test cluster left: " + "; ".join(left))
        return left


def with_signal(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """``sig`` to the process group of ``proc`` (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def with_signal_pid(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "(gone)"
    return shlex.join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def _main(argv: list[str]) -> int:
    import tempfile

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background
        signal.signal(sig, interrupt)
    n = int(argv[1]) if len(argv) > 1 else 2
    hosts = TestCluster.create(n)
    run_dir = Path(tempfile.mkdtemp(prefix="kimi-slurm-"))
    try:
        slurm = SlurmCluster.create(hosts, run_dir)
        print(f"SLURM_CONF={slurm.conf} ip netns exec {hosts.hub} sinfo")
        print(slurm.run(["sinfo"]).stdout)
        if "--once" not in argv:
            print("Ctrl-C to tear down")
            signal.pause()
        slurm.close()
    except KeyboardInterrupt:
        slurm.close()
    finally:
        hosts.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:] or ["up"]))
