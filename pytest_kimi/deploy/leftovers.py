"""Processes earlier runs left on the nodes: found before bring-up, refused, or reaped.

A harness that was SIGKILLed (or lost its nodes) leaves its processes running until their
maximum lifetime (:func:`pytest_kimi.deploy.remote.max_lifetime`); their GPUs and ports are
then taken, and the next run would fail on "port in use" or load onto busy GPUs. Every process
we start leaves ``<work_dir>/<run>/<layout>/<process>.pid`` and, beside it, ``.id``: the node's
boot id, the pid's start time and the node's host name, recorded at start (a ``work_dir`` on a
shared file system holds every node's files: each node looks only at its own). A pid counts
as ours and alive only when the node's boot id and the pid's current start time both match
what was recorded: a pid reused after a reboot, or by a stranger later, is never touched.
Such pid files are *stale*: ignored (neither listed nor removed; they belong to their run's
folder).

Found processes fail bring-up with a list (node, run, process, pid, age) unless ``--kimi-reap``
is given; then they are stopped as a teardown stops them (TERM to every group, one grace,
KILL), each signal sent only while the leader still has the recorded start time.

SSH clusters only: a local cluster's processes die with the harness (the executor's lifeline,
:class:`pytest_kimi.deploy.procgroup.Lifeline`), so there is nothing to find. Processes started
inside a container have pids of the container's namespace: they are not found here (a container of
run mode left behind is named ``kimi-<run>-<process>``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pytest_kimi.config import Node
from pytest_kimi.deploy import remote
from pytest_kimi.deploy.executor import Executor
from pytest_kimi.deploy.procgroup import stop_all


class LeftoverError(RuntimeError):
    """Processes of earlier runs are running on the nodes; the message lists them."""


@dataclass(frozen=True)
class Leftover:
    """One process group an earlier run left running on a node."""

    node: Node
    run: str  # <run>/<layout>, as the folder under work_dir says
    process: str
    pid: int  # its process-group id
    start: str  # the leader's start time (clock ticks since boot): our proof it is ours
    age_s: int | None

    def describe(self) -> str:
        age = "age unknown" if self.age_s is None else f"running for {_age(self.age_s)}"
        return (
            f"node {self.node.name} ({self.node.host}): run {self.run}, {self.process}, "
            f"pgid {self.pid}, {age}"
        )


@dataclass(frozen=True)
class Stale:
    """A pid file whose process is not ours any more (or cannot be proved to be)."""

    node: str
    path: str
    why: str  # "rebooted", "pid reused", "no identity recorded"


def _age(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def scan_command(work_dir: str) -> str:
    """Shell printing one tab-separated line per pid file under ``work_dir/*/*/`` (path, pid,
    recorded boot id and start time, the pid's start time now, its age, the recorded host
    name), then the node's boot id and host name."""
    glob = shlex.quote(work_dir.rstrip("/")) + "/*/*/*.pid"
    fields = "\\t".join(["pid"] + ["%s"] * 7)
    return (
        f"for f in {glob}; do "
        '[ -f "$f" ] || continue; pid=$(cat "$f" 2>/dev/null); '
        'case "$pid" in ""|*[!0-9]*) continue;; esac; '
        'id="${f%.pid}.id"; rb=$(sed -n 1p "$id" 2>/dev/null); rs=$(sed -n 2p "$id" 2>/dev/null); '
        'rh=$(sed -n 3p "$id" 2>/dev/null); '
        f"now=$({remote.start_time('$pid')}); "
        'age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d " "); '
        f'printf \'{fields}\\n\' "$f" "$pid" "$rb" "$rs" "$now" "$age" "$rh"; '
        "done; "
        f'printf \'boot\\t%s\\nhost\\t%s\\n\' "$(cat {remote.BOOT_ID} 2>/dev/null)" "$(uname -n)"'
    )


def parse_scan(node: Node, work_dir: str, out: str) -> tuple[list[Leftover], list[Stale]]:
    """Our live processes, and the pid files that are stale, from :func:`scan_command`."""
    rows = [line.split("\t") for line in out.splitlines()]
    boot = next((r[1] for r in rows if r[0] == "boot" and len(r) > 1), "")
    host = next((r[1] for r in rows if r[0] == "host" and len(r) > 1), "")
    found: list[Leftover] = []
    stale: list[Stale] = []
    prefix = work_dir.rstrip("/") + "/"
    for row in rows:
        if row[0] != "pid" or len(row) < 7:
            continue
        path, pid, rec_boot, rec_start, now, age = row[1:7]
        rec_host = row[7] if len(row) > 7 else ""
        if rec_host and host and rec_host != host:
            continue  # another node's file (a shared work_dir): its own scan looks at it
        if not now:  # no such process: it ended; nothing to say
            continue
        why = ""
        if not rec_boot or not rec_start or not boot:
            why = "no identity recorded"
        elif rec_boot != boot:
            why = "rebooted since"
        elif rec_start != now:
            why = "pid reused"
        if why:
            stale.append(Stale(node.name, path, why))
            continue
        rel = path[len(prefix) :] if path.startswith(prefix) else path
        run, _, name = rel.rpartition("/")
        found.append(Leftover(node, run, name.removesuffix(".pid"), int(pid), now,
                              int(age) if age.isdigit() else None))  # fmt: skip
    return found, stale


def find(
    executor: Executor, nodes: Sequence[Node], work_dir: str
) -> tuple[list[Leftover], list[Stale]]:
    """Scan every node (in parallel, one command each) for our processes left running."""
    unique = list({n.name: n for n in nodes}.values())

    def one(node: Node) -> tuple[list[Leftover], list[Stale]]:
        code, out = executor.run(node, scan_command(work_dir))
        if code != 0:
            raise LeftoverError(f"node {node.name}: could not list earlier runs' processes: {out}")
        return parse_scan(node, work_dir, out)

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(unique)))) as pool:
        results = list(pool.map(one, unique))
    return [f for r in results for f in r[0]], [s for r in results for s in r[1]]


def signal_if_ours(leftover: Leftover, name: str) -> str:
    """``kill -s NAME -- -PGID`` only while the leader still has its recorded start time (or is
    gone, when only members of its group, which hold the id, can be reached)."""
    now = remote.start_time(str(int(leftover.pid)))
    return (
        f's=$({now}); if [ -z "$s" ] || [ "$s" = {shlex.quote(leftover.start)} ]; then '
        f"{remote.signal_group(leftover.pid, name)}; fi; true"
    )


def reap(executor: Executor, leftovers: Sequence[Leftover], grace_s: float) -> list[Leftover]:
    """Stop them all at once (TERM, one grace, KILL); returns those still alive."""

    def send(item: Leftover, name: str) -> None:
        executor.run(item.node, signal_if_ours(item, name))

    def alive(item: Leftover) -> bool:
        _, out = executor.run(item.node, remote.group_stats(item.pid))
        return remote.any_alive(out)

    return stop_all(list(leftovers), send, alive, grace_s=grace_s, poll_s=0.5)


def check(
    executor: Executor,
    nodes: Sequence[Node],
    work_dir: str,
    *,
    reap_them: bool,
    say: Callable[[str], None],
    grace_s: float = 10.0,
) -> list[Leftover]:
    """Before bring-up: refuse (:class:`LeftoverError`) when earlier runs left processes on
    ``nodes``; with ``reap_them``, stop them and say what was stopped. Returns those found."""
    found, _stale = find(executor, nodes, work_dir)
    if not found:
        return []
    listing = "\n".join("  " + f.describe() for f in found)
    if not reap_them:
        raise LeftoverError(
            f"{len(found)} process group(s) of earlier runs (or of a run still in progress) are "
            f"running on the nodes, holding their GPUs and ports:\n{listing}\n"
            "stop them, or pass --kimi-reap to have them stopped (TERM, then KILL)"
        )
    survivors = reap(executor, found, grace_s)
    if survivors:
        left = "\n".join("  " + f.describe() for f in survivors)
        raise LeftoverError(f"--kimi-reap could not stop:\n{left}")
    say(f"--kimi-reap stopped {len(found)} process group(s) of earlier runs:\n{listing}")
    return found
