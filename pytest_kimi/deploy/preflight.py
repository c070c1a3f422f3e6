"""GPU pre-flight: before anything starts, every node has the GPUs the cluster file says, idle.

A benchmark on a GPU someone else is using measures their job as much as ours, and a count
that differs from ``gpus:`` means the layout will not fit as planned. So before launch each
node is asked, in one round trip (nodes in parallel), for its GPUs, the compute processes on
them and its driver / CUDA versions (``nvidia-smi``, or the mock's stand-in). Every problem on
every node is collected into ONE error, so a busy cluster is fixed in one go, not one node per
attempt. ``preflight: {enabled: false}`` in the cluster file turns the check off.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_kimi.deploy.gpus import (
    GpuProcess,
    GpuQueryError,
    GpuState,
    parse_apps,
    parse_gpus,
    query_apps,
    query_gpus,
    smi_command,
)

if TYPE_CHECKING:
    from pytest_kimi.config import ClusterConfig, Node
    from pytest_kimi.deploy.executor import Executor

MARK = "@@kimi-preflight"
SECTIONS = ("gpus", "apps", "info")
DISABLE_HINT = "or turn the check off with `preflight: {enabled: false}` in the cluster file"


class PreflightError(RuntimeError):
    """Some node's GPUs are busy, missing, or could not be asked: nothing was started."""


@dataclass
class NodeGpus:
    """What one node's ``nvidia-smi`` said, and what is wrong with it."""

    node: Node
    gpus: list[GpuState] = field(default_factory=list)
    apps: list[GpuProcess] = field(default_factory=list)
    driver: str | None = None
    cuda: str | None = None
    error: str | None = None  # nvidia-smi missing, failed, unreadable, node unreachable
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"node {self.node.name} ({self.node.host})"

    def manifest(self) -> dict[str, Any]:
        """The manifest's record of this node's GPUs at pre-flight."""
        return {
            "driver": self.driver,
            "cuda": self.cuda,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "memory_used_mib": g.mem_used_mib,
                    "memory_total_mib": g.mem_total_mib,
                }
                for g in self.gpus
            ],
            "processes": [
                {"gpu_uuid": a.gpu_uuid, "pid": a.pid, "name": a.name, "used_mib": a.used_mib}
                for a in self.apps
            ],
            "error": self.error,
            "problems": list(self.problems),
        }


def probe_command(smi: Sequence[str]) -> str:
    """One shell command for one round trip: the GPU query, the compute-apps query and
    ``-q -d COMPUTE`` (whose header names the driver and CUDA versions), each followed by a
    marker line with its exit status (stderr kept in place, so a failure is shown)."""
    parts = [query_gpus(smi), query_apps(smi), shlex.join([*smi, "-q", "-d", "COMPUTE"])]
    return "; ".join(
        f'{cmd} 2>&1; echo "{MARK} {name} $?"' for cmd, name in zip(parts, SECTIONS, strict=True)
    )


def split_sections(text: str) -> dict[str, tuple[int, str]]:
    """``{section: (exit status, output)}`` from :func:`probe_command`'s output."""
    out: dict[str, tuple[int, str]] = {}
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(MARK + " "):
            _, name, code = line.split()
            out[name] = (int(code) if code.lstrip("-").isdigit() else -1, "\n".join(lines))
            lines = []
        else:
            lines.append(line)
    return out


def _version(text: str, label: str) -> str | None:
    found = re.search(rf"^\s*{label}\s*:\s*(\S+)", text, re.MULTILINE)
    return found.group(1) if found else None


def read_probe(report: NodeGpus, code: int, text: str) -> None:
    """Fill ``report`` from one node's answer (``error`` says why it could not be read)."""
    sections = split_sections(text)
    if "gpus" not in sections:
        report.error = f"nvidia-smi could not be run (exit {code}): {_tail(text)}"
        return
    status, out = sections["gpus"]
    if status != 0:
        report.error = f"nvidia-smi failed (exit {status}): {_tail(out)}"
        return
    try:
        report.gpus = parse_gpus(out)
        apps_status, apps = sections.get("apps", (1, "no answer"))
        if apps_status != 0:
            report.error = (
                f"nvidia-smi --query-compute-apps failed (exit {apps_status}): {_tail(apps)}"
            )
            return
        report.apps = parse_apps(apps)
    except GpuQueryError as exc:
        report.error = f"nvidia-smi answered something unreadable: {exc}"
        return
    info = sections.get("info", (1, ""))[1]
    drivers = {g.driver for g in report.gpus if g.driver}
    report.driver = ", ".join(sorted(drivers)) or _version(info, "Driver Version")
    report.cuda = _version(info, "CUDA Version")


def _tail(text: str, chars: int = 400) -> str:
    text = text.strip()
    return (text[-chars:] if text else "(no output)").replace("\n", " | ")


def judge(report: NodeGpus, busy_memory_mib: float) -> list[str]:
    """Every problem of one node, each a line naming node, GPU and what holds it."""
    where = report.where
    if report.error:
        return [f"{where}: {report.error}"]
    problems = []
    if len(report.gpus) != report.node.gpus:
        problems.append(
            f"{where}: nvidia-smi lists {len(report.gpus)} GPUs, the cluster file says "
            f"gpus: {report.node.gpus}"
        )
    for gpu in report.gpus:
        holders = [a for a in report.apps if a.gpu_uuid == gpu.uuid]
        if holders:
            held = "; ".join(
                f"pid {a.pid} ({a.name}) holds "
                + (f"{a.used_mib:.0f} MiB" if a.used_mib is not None else "memory")
                for a in holders
            )
            problems.append(f"{where}: GPU {gpu.index} busy: {held}")
        elif gpu.mem_used_mib is not None and gpu.mem_used_mib > busy_memory_mib:
            problems.append(
                f"{where}: GPU {gpu.index} busy: {gpu.mem_used_mib:.0f} MiB used by no listed "
                f"process (over busy_memory_mib: {busy_memory_mib:g})"
            )
    return problems


def check_node(executor: Executor, node: Node, smi: Sequence[str], busy_mib: float) -> NodeGpus:
    """Ask one node; never raises (an unreachable node is a problem like any other)."""
    report = NodeGpus(node)
    try:
        code, text = executor.run(node, probe_command(smi), 60)
    except Exception as exc:  # NodeError: unreachable, timed out
        why = str(exc).removeprefix(f"{report.where}: ")  # NodeError names the node already
        report.error = f"could not be asked: {why}"
    else:
        read_probe(report, code, text)
    report.problems = judge(report, busy_mib)
    return report


def check_nodes(
    cluster: ClusterConfig, nodes: Sequence[Node], executor: Executor, scope: str
) -> list[NodeGpus]:
    """Every node at once (one thread per node: SSH round trips in sequence add up)."""
    unique = list({n.name: n for n in nodes}.values())
    busy = cluster.preflight.busy_memory_mib

    def one(node: Node) -> NodeGpus:
        return check_node(executor, node, smi_command(cluster, node, scope), busy)

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(unique)))) as pool:
        return list(pool.map(one, unique))


def whole_cluster(cluster: ClusterConfig) -> list[NodeGpus]:
    """Every node of the cluster (``--kimi-preflight-only``), through the cluster's executor."""
    from pytest_kimi.deploy.executor import LocalExecutor
    from pytest_kimi.deploy.ssh import SSHExecutor

    executor: Executor
    if cluster.executor == "slurm":  # the nodes are reached inside an allocation of them all
        from pytest_kimi.deploy.slurm import SlurmExecutor

        slurm = SlurmExecutor(cluster, "preflight")
        try:
            slurm.allocate(cluster.nodes)
            return check_nodes(cluster, cluster.nodes, slurm, "preflight")
        finally:
            slurm.cleanup([])
            slurm.close()
    if cluster.executor == "ssh":
        executor = SSHExecutor(cluster.work_dir, "preflight")
    else:
        executor = LocalExecutor()
    try:
        return check_nodes(cluster, cluster.nodes, executor, "preflight")
    finally:
        executor.close()


def require_clean(reports: Sequence[NodeGpus]) -> None:
    """Raise one :class:`PreflightError` listing every problem of every node."""
    problems = [p for r in reports for p in r.problems]
    if not problems:
        return
    count = len(problems)
    raise PreflightError(
        f"GPU pre-flight found {count} problem{'s' if count > 1 else ''}; nothing was started:\n"
        + "\n".join(f"  {p}" for p in problems)
        + f"\nStop what holds the GPUs, or fix gpus: in the cluster file, {DISABLE_HINT}."
    )


def summary(reports: Sequence[NodeGpus]) -> str:
    """One progress line: how many nodes and GPUs were checked."""
    gpus = sum(len(r.gpus) for r in reports)
    return f"GPU pre-flight: {len(reports)} node(s), {gpus} GPU(s) idle"


def table(reports: Sequence[NodeGpus]) -> str:
    """The per-node table ``--kimi-preflight-only`` prints."""
    rows = [("node", "host", "GPUs", "name", "driver", "CUDA", "memory used MiB", "processes")]
    for r in reports:
        names = sorted({g.name for g in r.gpus}) or ["-"]
        used = ",".join(f"{g.mem_used_mib:.0f}" if g.mem_used_mib is not None else "?"
                        for g in r.gpus) or "-"  # fmt: skip
        procs = ",".join(f"{a.pid}({a.name})" for a in r.apps) or "-"
        count = f"{len(r.gpus)}/{r.node.gpus}" if not r.error else f"?/{r.node.gpus}"
        rows.append((r.node.name, r.node.host, count, "; ".join(names), r.driver or "-",
                     r.cuda or "-", used, procs))  # fmt: skip
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    problems = [p for r in reports for p in r.problems]
    lines.append("")
    lines += [f"PROBLEM {p}" for p in problems] or ["all GPUs present and idle"]
    return "\n".join(lines)
